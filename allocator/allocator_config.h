// The caching allocator's configuration as a plain value type: the hard budget on reserved bytes,
// the size-rounding knobs (defaults mirror PyTorch's CUDACachingAllocator) and the eviction switch.
#ifndef DTR_ALLOCATOR_ALLOCATOR_CONFIG_H_
#define DTR_ALLOCATOR_ALLOCATOR_CONFIG_H_

#include <cstddef>
#include <limits>
#include <string>

#include "absl/status/status.h"

namespace dtr::alloc {

struct AllocatorConfig {
  static constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();
  static constexpr size_t kMiB = size_t{1} << 20;

  // Hard cap on reserved bytes (bytes taken from the backend). See Note [Budget is a hard cap].
  size_t budget_bytes = kUnlimited;

  // Every block size is a multiple of this (PyTorch kMinBlockSize). Power of two.
  size_t min_block_size = 512;
  // Requests up to this size are served from the small pool (PyTorch kSmallSize).
  size_t small_size = 1 * kMiB;
  // Segment size for small-pool growth (PyTorch kSmallBuffer).
  size_t small_segment_size = 2 * kMiB;
  // Segment size for large requests below `min_large_alloc` (PyTorch kLargeBuffer).
  size_t large_segment_size = 20 * kMiB;
  // Large requests at or above this get their own segment, rounded to `large_round`
  // (PyTorch kMinLargeAlloc / kRoundLarge).
  size_t min_large_alloc = 10 * kMiB;
  size_t large_round = 2 * kMiB;

  // Whether the allocator asks its EvictionHandler (rung 3 of the retry ladder) for room.
  bool enable_eviction = true;
  // When the usual segment size would exceed the budget (or the backend refuses it), try the
  // smallest segment that holds the request. See Note [Budget-constrained segment size].
  bool shrink_segment_to_fit_budget = true;
  // A cached free segment serves only a request of its own rounded size, with a budget or
  // without (one may be set later), so no remnant keeps a segment reserved (meant for one
  // segment per block, as the CPU allocator configures it). See Note [Exact reuse].
  bool exact_reuse = false;

  bool unlimited_budget() const { return budget_bytes == kUnlimited; }

  // A segment of its own for every block, each a multiple of `granularity` (a power of two), with
  // exact reuse: dtr's CPU allocator (Note [CPU allocator granularity],
  // hooks/cpu_allocator_adapter.cc).
  static AllocatorConfig SegmentPerBlock(size_t granularity) {
    AllocatorConfig ac;
    ac.min_block_size = granularity;
    ac.small_size = granularity;
    ac.small_segment_size = granularity;
    ac.min_large_alloc = 2 * granularity;
    ac.large_segment_size = 2 * granularity;
    ac.large_round = granularity;
    ac.exact_reuse = true;
    return ac;
  }

  // OK, or InvalidArgument naming the first inconsistent knob.
  absl::Status Validate() const;
  // One line, e.g. "AllocatorConfig{budget=1.00 GiB (1073741824 bytes), min_block=512 B, ...}".
  std::string ToString() const;

  friend bool operator==(const AllocatorConfig& a, const AllocatorConfig& b);
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_ALLOCATOR_CONFIG_H_
