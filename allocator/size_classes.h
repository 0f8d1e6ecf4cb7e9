// Size rounding and pool selection: how a request becomes a block size, which pool serves it,
// how big a segment to ask the backend for, and when a found block is split (PyTorch's
// round_size / get_pool / get_allocation_size / should_split).
#ifndef DTR_ALLOCATOR_SIZE_CLASSES_H_
#define DTR_ALLOCATOR_SIZE_CLASSES_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "allocator/allocator_config.h"

namespace dtr::alloc {

enum class Pool { kSmall = 0, kLarge = 1 };
inline constexpr int kNumPools = 2;
absl::string_view PoolName(Pool pool);

class SizeClasses {
 public:
  // Largest request the rounding arithmetic accepts without overflow; larger ones are refused.
  static constexpr size_t kMaxRequest = size_t{1} << 62;

  explicit SizeClasses(const AllocatorConfig& config) : config_(config) {}

  // Request bytes -> block bytes: at least min_block_size, rounded up to a multiple of it.
  size_t RoundSize(size_t requested) const;
  // Pool serving a rounded size.
  Pool PoolFor(size_t rounded) const;
  // Segment size requested from the backend when growing for a rounded size.
  size_t SegmentSize(size_t rounded) const;
  // Smallest segment that can hold a rounded size (used only when the normal one does not fit the
  // budget; see Note [Budget-constrained segment size]).
  size_t MinimalSegmentSize(size_t rounded) const;
  // Whether a block of `pool` with `remaining` bytes left over after carving a request should be
  // split (small pool: remaining >= min_block_size; large pool: remaining > small_size).
  bool ShouldSplit(Pool pool, size_t remaining) const;

 private:
  AllocatorConfig config_;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_SIZE_CLASSES_H_
