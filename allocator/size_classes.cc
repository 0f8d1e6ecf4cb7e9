// Size rounding and pool selection (see size_classes.h).
#include "allocator/size_classes.h"

namespace dtr::alloc {
namespace {

size_t RoundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

absl::string_view PoolName(Pool pool) { return pool == Pool::kSmall ? "small" : "large"; }

size_t SizeClasses::RoundSize(size_t requested) const {
  if (requested < config_.min_block_size) return config_.min_block_size;
  return RoundUp(requested, config_.min_block_size);
}

Pool SizeClasses::PoolFor(size_t rounded) const {
  return rounded <= config_.small_size ? Pool::kSmall : Pool::kLarge;
}

size_t SizeClasses::SegmentSize(size_t rounded) const {
  if (rounded <= config_.small_size) return config_.small_segment_size;
  if (rounded < config_.min_large_alloc) return config_.large_segment_size;
  return RoundUp(rounded, config_.large_round);
}

size_t SizeClasses::MinimalSegmentSize(size_t rounded) const {
  if (rounded <= config_.small_size) return config_.small_segment_size;
  return RoundUp(rounded, config_.large_round);
}

bool SizeClasses::ShouldSplit(Pool pool, size_t remaining) const {
  if (pool == Pool::kSmall) return remaining >= config_.min_block_size;
  return remaining > config_.small_size;
}

}  // namespace dtr::alloc
