// Allocator counters (see allocator_stats.h).
#include "allocator/allocator_stats.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/bytes.h"

namespace dtr::alloc {

void Stat::Increase(int64_t amount) {
  current += amount;
  allocated += amount;
  peak = std::max(peak, current);
}

void Stat::Decrease(int64_t amount) {
  current -= amount;
  freed += amount;
}

void AllocatorStats::ResetPeaks() {
  for (Stat* s : {&allocated_bytes, &active_bytes, &reserved_bytes, &requested_bytes,
                  &allocation_count, &active_count, &segment_count}) {
    s->ResetPeak();
  }
}

std::string AllocatorStats::ToString() const {
  auto bytes = [](const Stat& s) {
    return absl::StrCat(FormatBytesShort(s.current), " (peak ", FormatBytesShort(s.peak), ")");
  };
  auto count = [](const Stat& s) { return absl::StrCat(s.current, " (peak ", s.peak, ")"); };
  return absl::StrCat(
      "allocated=", bytes(allocated_bytes), " active=", bytes(active_bytes),
      " reserved=", bytes(reserved_bytes), " requested=", bytes(requested_bytes),
      " blocks=", count(allocation_count), " active_blocks=", count(active_count),
      " segments=", count(segment_count), " allocs=", num_allocs, " frees=", num_frees,
      " cache_hits=", num_cache_hits, " segment_allocs=", num_segment_allocs,
      " segment_frees=", num_segment_frees, " segment_resizes=", num_segment_resizes,
      " segment_splits=", num_segment_splits, " segment_donors=", num_segment_donors, " backend_failures=", num_backend_failures,
      " retries=", num_alloc_retries, " eviction_calls=", num_eviction_calls,
      " eviction_requested=", FormatBytesShort(eviction_bytes_requested),
      " eviction_freed=", FormatBytesShort(eviction_bytes_freed),
      " cache_flushes=", num_cache_flushes, " ooms=", num_ooms);
}

}  // namespace dtr::alloc
