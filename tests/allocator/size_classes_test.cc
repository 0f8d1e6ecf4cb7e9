// Tests for size rounding, pool selection, segment sizes and split decisions.
#include "allocator/size_classes.h"

#include "gtest/gtest.h"

namespace dtr::alloc {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(SizeClassesTest, RoundsTo512ByteGranularity) {
  SizeClasses sizes{AllocatorConfig{}};
  EXPECT_EQ(sizes.RoundSize(0), 512u);
  EXPECT_EQ(sizes.RoundSize(1), 512u);
  EXPECT_EQ(sizes.RoundSize(512), 512u);
  EXPECT_EQ(sizes.RoundSize(513), 1024u);
  EXPECT_EQ(sizes.RoundSize(3 * kMiB + 1), 3 * kMiB + 512);
}

TEST(SizeClassesTest, PoolsSplitAtOneMiB) {
  SizeClasses sizes{AllocatorConfig{}};
  EXPECT_EQ(sizes.PoolFor(512), Pool::kSmall);
  EXPECT_EQ(sizes.PoolFor(kMiB), Pool::kSmall);
  EXPECT_EQ(sizes.PoolFor(kMiB + 512), Pool::kLarge);
  EXPECT_EQ(PoolName(Pool::kSmall), "small");
}

TEST(SizeClassesTest, SegmentSizesFollowPyTorch) {
  SizeClasses sizes{AllocatorConfig{}};
  EXPECT_EQ(sizes.SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(sizes.SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(sizes.SegmentSize(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(sizes.SegmentSize(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(sizes.SegmentSize(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(sizes.SegmentSize(11 * kMiB), 12 * kMiB);
  EXPECT_EQ(sizes.MinimalSegmentSize(3 * kMiB + 512), 4 * kMiB);
  EXPECT_EQ(sizes.MinimalSegmentSize(4096), 2 * kMiB);
}

TEST(SizeClassesTest, SplitThresholdsDifferByPool) {
  SizeClasses sizes{AllocatorConfig{}};
  EXPECT_TRUE(sizes.ShouldSplit(Pool::kSmall, 512));
  EXPECT_FALSE(sizes.ShouldSplit(Pool::kSmall, 0));
  EXPECT_FALSE(sizes.ShouldSplit(Pool::kLarge, kMiB));
  EXPECT_TRUE(sizes.ShouldSplit(Pool::kLarge, kMiB + 512));
}

}  // namespace
}  // namespace dtr::alloc
