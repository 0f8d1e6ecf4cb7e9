// Snapshot totals and printing (see memory_snapshot.h).
#include "allocator/memory_snapshot.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/bytes.h"

namespace dtr::alloc {

absl::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kAllocated:
      return "allocated";
    case BlockState::kPendingEvents:
      return "pending";
    case BlockState::kFree:
      return "free";
  }
  return "?";
}

MemorySnapshot::Totals MemorySnapshot::ComputeTotals() const {
  Totals t;
  for (const SegmentSnapshot& seg : segments) {
    t.reserved_bytes += seg.size;
    ++t.segments;
    for (const BlockSnapshot& b : seg.blocks) {
      switch (b.state) {
        case BlockState::kAllocated:
          t.allocated_bytes += b.size;
          t.requested_bytes += b.requested_size;
          ++t.allocated_blocks;
          t.active_bytes += b.size;
          ++t.active_blocks;
          break;
        case BlockState::kPendingEvents:
          t.active_bytes += b.size;
          ++t.active_blocks;
          break;
        case BlockState::kFree:
          t.free_bytes += b.size;
          ++t.free_blocks;
          t.largest_free_block = std::max(t.largest_free_block, b.size);
          break;
      }
    }
  }
  return t;
}

std::string MemorySnapshot::ToString() const {
  std::string out = absl::StrCat("MemorySnapshot: ", stats.ToString(), "\n");
  for (const SegmentSnapshot& seg : segments) {
    absl::StrAppendFormat(&out, "  segment 0x%x %s pool=%s %s:", seg.address,
                          FormatBytesShort(seg.size), PoolName(seg.pool), StreamName(seg.stream));
    for (const BlockSnapshot& b : seg.blocks) {
      absl::StrAppendFormat(&out, " [+0x%x %s %s]", b.address - seg.address,
                            FormatBytesShort(b.size), BlockStateName(b.state));
    }
    out += "\n";
  }
  return out;
}

}  // namespace dtr::alloc
