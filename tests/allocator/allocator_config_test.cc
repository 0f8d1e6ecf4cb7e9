// Tests for AllocatorConfig validation and printing.
#include "allocator/allocator_config.h"

#include "gtest/gtest.h"

namespace dtr::alloc {
namespace {

TEST(AllocatorConfigTest, DefaultsMirrorPyTorchAndValidate) {
  AllocatorConfig config;
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.min_block_size, 512u);
  EXPECT_EQ(config.small_size, 1u << 20);
  EXPECT_EQ(config.small_segment_size, 2u << 20);
  EXPECT_EQ(config.large_segment_size, 20u << 20);
  EXPECT_EQ(config.min_large_alloc, 10u << 20);
  EXPECT_EQ(config.large_round, 2u << 20);
  EXPECT_TRUE(config.unlimited_budget());
}

TEST(AllocatorConfigTest, SegmentPerBlockGivesEveryBlockItsOwnSegment) {
  for (size_t granularity : {64, 512}) {  // dtr's CPU allocator, CUDA's kMinBlockSize
    const AllocatorConfig ac = AllocatorConfig::SegmentPerBlock(granularity);
    EXPECT_TRUE(ac.Validate().ok()) << ac.Validate();
    EXPECT_EQ(ac.min_block_size, granularity);
    EXPECT_EQ(ac.small_segment_size, ac.small_size);  // a small block fills its segment
    EXPECT_EQ(ac.large_round, granularity);           // a large one is its segment, to the granularity
    EXPECT_TRUE(ac.exact_reuse);
    EXPECT_TRUE(ac.unlimited_budget());
  }
}

TEST(AllocatorConfigTest, RejectsInconsistentKnobs) {
  auto invalid = [](auto mutate) {
    AllocatorConfig config;
    mutate(config);
    absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << config.ToString();
    return status;
  };
  (void)invalid([](AllocatorConfig& c) { c.budget_bytes = 0; });
  (void)invalid([](AllocatorConfig& c) { c.min_block_size = 500; });
  (void)invalid([](AllocatorConfig& c) { c.small_size = 1000; });
  (void)invalid([](AllocatorConfig& c) { c.small_segment_size = c.small_size / 2; });
  (void)invalid([](AllocatorConfig& c) { c.min_large_alloc = c.small_size; });
  (void)invalid([](AllocatorConfig& c) { c.large_segment_size = c.min_large_alloc - 512; });
  absl::Status status = invalid([](AllocatorConfig& c) { c.large_round = 0; });
  EXPECT_NE(status.message().find("large_round"), std::string::npos);
}

TEST(AllocatorConfigTest, ToStringNamesBudgetAndKnobs) {
  AllocatorConfig config;
  config.budget_bytes = 3u << 30;
  config.enable_eviction = false;
  const std::string text = config.ToString();
  EXPECT_NE(text.find("budget=3.00 GiB (3221225472 bytes)"), std::string::npos) << text;
  EXPECT_NE(text.find("large_segment=20.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("eviction=off"), std::string::npos) << text;
  EXPECT_NE(AllocatorConfig().ToString().find("budget=unlimited"), std::string::npos);
}

TEST(AllocatorConfigTest, EqualityComparesEveryKnob) {
  AllocatorConfig a, b;
  EXPECT_EQ(a, b);
  b.shrink_segment_to_fit_budget = false;
  EXPECT_FALSE(a == b);
}

}  // namespace
}  // namespace dtr::alloc
