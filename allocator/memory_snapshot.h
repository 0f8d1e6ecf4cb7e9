// A point-in-time copy of the allocator's segments and blocks (address, size, state, stream,
// pool), like torch.cuda.memory_snapshot(), plus helpers that total it up so tests and tools can
// compare it with AllocatorStats.
#ifndef DTR_ALLOCATOR_MEMORY_SNAPSHOT_H_
#define DTR_ALLOCATOR_MEMORY_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "allocator/allocator_stats.h"
#include "allocator/size_classes.h"
#include "allocator/stream.h"

namespace dtr::alloc {

enum class BlockState {
  kAllocated,      // handed out to a caller
  kPendingEvents,  // freed by the caller, waiting for other streams (Note [Stream-ordered reuse])
  kFree,           // cached, reusable
};
absl::string_view BlockStateName(BlockState state);

struct BlockSnapshot {
  uintptr_t address = 0;
  size_t size = 0;            // rounded size
  size_t requested_size = 0;  // 0 unless allocated
  BlockState state = BlockState::kFree;
};

struct SegmentSnapshot {
  uintptr_t address = 0;
  size_t size = 0;
  Pool pool = Pool::kLarge;
  Stream stream;
  std::vector<BlockSnapshot> blocks;  // in address order, tiling the segment
};

struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;  // in address order
  AllocatorStats stats;                   // taken under the same lock as the segments

  // Totals over the blocks and segments.
  struct Totals {
    size_t reserved_bytes = 0;
    size_t allocated_bytes = 0;
    size_t active_bytes = 0;
    size_t requested_bytes = 0;
    size_t free_bytes = 0;
    int64_t segments = 0;
    int64_t allocated_blocks = 0;
    int64_t active_blocks = 0;
    int64_t free_blocks = 0;
    size_t largest_free_block = 0;
  };
  Totals ComputeTotals() const;
  // Multi-line dump, one line per segment with its blocks, for debugging.
  std::string ToString() const;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_MEMORY_SNAPSHOT_H_
