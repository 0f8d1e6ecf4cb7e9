// Tests for heuristic names and score formulas, and RuntimeConfig validation.
#include "runtime/heuristic.h"

#include "gtest/gtest.h"
#include "runtime/config.h"

namespace dtr {
namespace {

TEST(Heuristic, EveryNameRoundTripsAndIsDocumented) {
  ASSERT_EQ(AllHeuristics().size(), 7u);
  for (const auto& info : AllHeuristics()) {
    auto parsed = ParseHeuristic(info.name);
    ASSERT_TRUE(parsed.ok()) << info.name;
    EXPECT_EQ(*parsed, info.kind);
    EXPECT_FALSE(info.description.empty());
  }
  auto bad = ParseHeuristic("dtr-fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dtr-eq"), std::string::npos);
}

TEST(Heuristic, ScoresFollowTheirDefinitions) {
  ScoreInputs in{/*cost=*/6, /*neighborhood_cost=*/4, /*size=*/2, /*staleness=*/5, /*random=*/0.25};
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kDtrEq, in), 10.0 / 10);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kDtr, in), 10.0 / 10);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kDtrLocal, in), 6.0 / 10);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kLru, in), 1.0 / 5);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kSize, in), 1.0 / 2);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kMsps, in), 10.0 / 2);
  EXPECT_DOUBLE_EQ(Score(HeuristicKind::kRandom, in), 0.25);
}

TEST(RuntimeConfig, ValidatesAndPrints) {
  RuntimeConfig config;
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_NE(config.ToString().find("heuristic=dtr "), std::string::npos);
  EXPECT_NE(config.ToString().find("budget=unlimited"), std::string::npos);
  config.budget_bytes = 0;
  EXPECT_FALSE(config.Validate().ok());
  config = RuntimeConfig{};
  config.small_storage_fraction = 1.5;
  EXPECT_FALSE(config.Validate().ok());
  config = RuntimeConfig{};
  config.sample_factor = 0;
  EXPECT_FALSE(config.Validate().ok());
  config = RuntimeConfig{};
  EXPECT_NE(config.ToString().find("max_samples=64"), std::string::npos);
  EXPECT_NE(config.ToString().find("exhaustive_pool=256"), std::string::npos);
  EXPECT_NE(config.ToString().find("neighborhood_walk_limit=64"), std::string::npos);
  config.max_samples = config.min_samples - 1;  // a cap below the floor: the floor wins
  EXPECT_TRUE(config.Validate().ok());
  config.max_samples = 0;  // no cap
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_NE(config.ToString().find("rebuild_protection=30 "), std::string::npos);  // Note [Rebuilt segments]
  config.rebuild_protection = 0.5;  // would make rebuilt storages the first taken
  EXPECT_FALSE(config.Validate().ok());
  config = RuntimeConfig{};
  // Note [Results of the backward pass]
  EXPECT_NE(config.ToString().find("backward_protection=100 "), std::string::npos);
  config.backward_protection = 0.5;
  EXPECT_FALSE(config.Validate().ok());
  config.backward_protection = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(config.Validate().ok());
  config.backward_protection = 1;  // none
  EXPECT_TRUE(config.Validate().ok());
  // Note [Next use in a backward pass]
  EXPECT_NE(config.ToString().find("backward_next_use=0.75 "), std::string::npos);
  for (double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    config.backward_next_use = bad;
    EXPECT_FALSE(config.Validate().ok()) << bad;
  }
  for (double good : {0.0, 0.5, 1.0}) {
    config.backward_next_use = good;
    EXPECT_TRUE(config.Validate().ok()) << good;
  }
  config = RuntimeConfig{};
  // Note [Inputs a rematerialization will read]: off by default
  EXPECT_NE(config.ToString().find("pending_protection=1 "), std::string::npos);
  config.pending_protection = 0.5;
  EXPECT_FALSE(config.Validate().ok());
  config.pending_protection = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(config.Validate().ok());
  config.pending_protection = 1000;
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_FALSE(ParseDeallocPolicy("lazy").ok());
  EXPECT_EQ(*ParseDeallocPolicy("banish"), DeallocPolicy::kBanish);
  EXPECT_EQ(*ParseSearchMode("exact"), SearchMode::kExact);
  EXPECT_FALSE(ParseSearchMode("fast").ok());
}

}  // namespace
}  // namespace dtr
