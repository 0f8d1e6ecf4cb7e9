// Counters of the caching allocator, in the spirit of PyTorch's DeviceStats: current/peak gauges
// for allocated, reserved, active and requested bytes and block/segment counts, plus event counters
// for every rung of the retry ladder (cache hits, backend growth, eviction, cache flushes, OOMs).
#ifndef DTR_ALLOCATOR_ALLOCATOR_STATS_H_
#define DTR_ALLOCATOR_ALLOCATOR_STATS_H_

#include <cstdint>
#include <string>

namespace dtr::alloc {

// A gauge with its peak and the running totals of increases and decreases.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // sum of increases
  int64_t freed = 0;      // sum of decreases

  void Increase(int64_t amount);
  void Decrease(int64_t amount);
  void ResetPeak() { peak = current; }
};

struct AllocatorStats {
  // Gauges. "Allocated" blocks are handed out to callers; "active" adds blocks already freed by
  // the caller but still awaiting stream events (Note [Stream-ordered reuse]); "reserved" is what
  // the backend gave us (segments), capped by the budget; "requested" is the unrounded bytes.
  Stat allocated_bytes;
  Stat active_bytes;
  Stat reserved_bytes;
  Stat requested_bytes;
  Stat allocation_count;  // allocated blocks
  Stat active_count;      // active blocks
  Stat segment_count;

  // Events.
  int64_t num_allocs = 0;          // successful Allocate calls
  int64_t num_frees = 0;           // successful Free calls
  int64_t num_cache_hits = 0;      // rung 1: served from a cached free block
  int64_t num_segment_allocs = 0;  // rung 2: successful backend Allocate calls
  int64_t num_segment_frees = 0;   // backend Free calls (EmptyCache or rung 4)
  // rung 4: cached segments resized for a request (Note [Recycling a cached segment]) or shrunk to
  // make room for one (Note [Small requests keep resizable segments])
  int64_t num_segment_resizes = 0;
  int64_t num_segment_splits = 0;  // cached segments split instead of shrunk (Note [Splitting a cached segment])
  int64_t num_segment_donors = 0;  // cached segments whose pages a growing one took (Note [Growing into cached pages])
  int64_t num_backend_failures = 0;  // backend Allocate calls that failed (real OOM)
  int64_t num_alloc_retries = 0;   // requests that missed rungs 1 and 2 on the first try
  int64_t num_eviction_calls = 0;  // rung 3: EvictionHandler::MakeRoom invocations
  int64_t eviction_bytes_requested = 0;  // sum of rounded sizes asked of the handler
  int64_t eviction_bytes_freed = 0;      // sum of bytes the handler reported freeing
  int64_t num_cache_flushes = 0;   // rung 4 reached: fully free cached segments released
  int64_t num_ooms = 0;            // rung 5: requests refused with ResourceExhausted

  void ResetPeaks();
  std::string ToString() const;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_ALLOCATOR_STATS_H_
