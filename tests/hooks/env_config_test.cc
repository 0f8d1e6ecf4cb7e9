// DtrEnvConfig: the file-name placeholders (Note [Per-process file names]), what {rank} and {pid}
// expand to and which patterns are start-up errors; output files that cannot be written; the
// replay-depth limit and budgets out of range.
#include "hooks/env_config.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace dtr::hooks {
namespace {

using ::testing::HasSubstr;

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> getenv() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
  absl::StatusOr<DtrEnvConfig> Parse() const {
    return ParseEnvConfig(getenv(), [this](const std::function<void(const std::string&)>& f) {
      for (const auto& [k, v] : vars) f(k);
    });
  }
};

TEST(ExpandFileName, RankAndPidAreSubstituted) {
  FakeEnv env{{{"RANK", "3"}}};
  auto p = ExpandFileName("DTR_STATS_FILE", "/tmp/s-{rank}-{pid}.json", env.getenv(), 4242);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, "/tmp/s-3-4242.json");
}

TEST(ExpandFileName, RankDefaultsToZeroOutsideALauncher) {
  FakeEnv env;
  auto p = ExpandFileName("DTR_STATS_FILE", "r{rank}.json", env.getenv(), 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, "r0.json");
}

TEST(ExpandFileName, PathsWithoutPlaceholdersAreKept) {
  FakeEnv env{{{"RANK", "1"}}};
  auto p = ExpandFileName("DTR_TRACE_FILE", "/a/b.trace", env.getenv(), 7);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/a/b.trace");
}

TEST(ExpandFileName, BadPatternsNameTheVariableAndThePlaceholders) {
  FakeEnv env;
  for (const char* bad : {"s-{rnak}.json", "s-{rank.json", "s-rank}.json", "s-{}.json"}) {
    auto p = ExpandFileName("DTR_STATS_FILE", bad, env.getenv(), 1);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("DTR_STATS_FILE")) << bad;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("{rank}, {pid}")) << bad;
  }
}

TEST(ExpandFileName, NonNumericRankIsAnError) {
  FakeEnv env{{{"RANK", "two"}}};
  auto p = ExpandFileName("DTR_STATS_FILE", "s{rank}", env.getenv(), 1);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("RANK='two'"));
}

TEST(ParseEnvConfig, FileNamePlaceholdersAreCheckedAtStartUp) {
  FakeEnv good{{{"DTR_STATS_FILE", "s-{rank}.json"}, {"DTR_TRACE_FILE", "t-{pid}"}, {"RANK", "0"}}};
  auto c = good.Parse();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->stats_file, "s-{rank}.json");  // kept as a pattern: expanded when opened
  EXPECT_EQ(c->trace_file, "t-{pid}");
  FakeEnv bad{{{"DTR_TRACE_FILE", "t-{host}"}}};
  auto b = bad.Parse();
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("unknown placeholder {host}"));
}

TEST(ParseEnvConfig, MaxReplayDepth) {
  EXPECT_EQ(FakeEnv{}.Parse()->max_replay_depth, 1000u);
  auto c = FakeEnv{{{"DTR_MAX_REPLAY_DEPTH", "64"}}}.Parse();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_replay_depth, 64u);
  for (const char* bad : {"0", "-3", "x", "99999999999"}) {
    auto b = FakeEnv{{{"DTR_MAX_REPLAY_DEPTH", bad}}}.Parse();
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("DTR_MAX_REPLAY_DEPTH"));
  }
}

// Factors, a number with a least (and maybe a most) value: Note [Recomputation limit]
// (runtime/remat.cc), Note [Results of the backward pass] and Note [Next use in a backward pass]
// (runtime/eviction_search.cc).
TEST(ParseEnvConfig, Factors) {
  struct Factor {
    const char* var;
    const char* printed;
    double DtrEnvConfig::*field;
    double default_value;
    std::vector<std::pair<const char*, double>> good;
    std::vector<const char*> bad;
  };
  for (const Factor& k : {Factor{"DTR_MAX_RECOMPUTE", "max_recompute=", &DtrEnvConfig::max_recompute_ratio, RuntimeConfig{}.max_recompute_ratio,
                                 {{"20", 20}, {"0", 0}, {"7.5", 7.5}}, {"-1", "x", "inf", "nan", ""}},
                          Factor{"DTR_BACKWARD_PROTECTION", "backward_protection=", &DtrEnvConfig::backward_protection,
                                 RuntimeConfig{}.backward_protection, {{"1", 1}, {"30", 30}, {"2.5", 2.5}},
                                 {"0.5", "0", "-1", "x", "inf", "nan", ""}},
                          Factor{"DTR_BACKWARD_NEXT_USE", "backward_next_use=", &DtrEnvConfig::backward_next_use,
                                 RuntimeConfig{}.backward_next_use, {{"0", 0}, {"1", 1}, {"0.5", 0.5}},
                                 {"1.5", "-0.1", "x", "inf", "nan", ""}},
                          // Note [Idle far below the budget] (hooks/fallback.cc).
                          Factor{"DTR_IDLE_BELOW", "idle_below=", &DtrEnvConfig::idle_below, 0.5,
                                 {{"0", 0}, {"0.25", 0.25}, {"0.9", 0.9}}, {"0.95", "1", "-0.1", "x", "nan", ""}}}) {
    EXPECT_EQ((*FakeEnv{}.Parse()).*k.field, k.default_value) << k.var;
    for (auto [text, value] : k.good) {
      auto c = FakeEnv{{{k.var, text}}}.Parse();
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ((*c).*k.field, value) << k.var;
      EXPECT_THAT(c->ToString(), HasSubstr(absl::StrCat(k.printed, value)));
    }
    for (const char* bad : k.bad) {
      auto b = FakeEnv{{{k.var, bad}}}.Parse();
      ASSERT_FALSE(b.ok()) << k.var << "=" << bad;
      EXPECT_THAT(std::string(b.status().message()), HasSubstr(k.var));
    }
  }
  EXPECT_EQ(RuntimeConfig{}.backward_protection, 100);
  EXPECT_EQ(RuntimeConfig{}.backward_next_use, 0.75);
}

// Count variables taking 0: Note [Neighborhood cost cache] (runtime/neighborhoods.cc), Note
// [Small pools are searched whole] (runtime/eviction_search.cc) and Note [Bounded neighborhood
// walks] (runtime/neighborhoods.cc).
TEST(ParseEnvConfig, CountsThatMayBeZero) {
  struct Count {
    const char* var;
    const char* printed;
    uint32_t DtrEnvConfig::*field;
    uint32_t default_value;
  };
  for (const Count& k : {Count{"DTR_NEIGHBORHOOD_CACHE", "neighborhood_cache=", &DtrEnvConfig::neighborhood_cache_events,
                               RuntimeConfig{}.neighborhood_cache_events},
                         Count{"DTR_EXHAUSTIVE_POOL", "exhaustive_pool=", &DtrEnvConfig::exhaustive_pool,
                               RuntimeConfig{}.exhaustive_pool},
                         Count{"DTR_NEIGHBORHOOD_WALK_LIMIT", "neighborhood_walk_limit=",
                               &DtrEnvConfig::neighborhood_walk_limit, RuntimeConfig{}.neighborhood_walk_limit}}) {
    EXPECT_EQ((*FakeEnv{}.Parse()).*k.field, k.default_value) << k.var;
    for (auto [text, value] : {std::pair<const char*, uint32_t>{"0", 0}, {"16", 16}, {"1024", 1024}}) {
      auto c = FakeEnv{{{k.var, text}}}.Parse();
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ((*c).*k.field, value) << k.var;
      EXPECT_THAT(c->ToString(), HasSubstr(absl::StrCat(k.printed, value)));
    }
    for (const char* bad : {"-1", "x", "1.5", "", "9999999999"}) {
      auto b = FakeEnv{{{k.var, bad}}}.Parse();
      ASSERT_FALSE(b.ok()) << k.var << "=" << bad;
      EXPECT_THAT(std::string(b.status().message()), HasSubstr(k.var));
    }
  }
}

// Note [Exact neighborhood cost cache]: the default, also by name.
TEST(ParseEnvConfig, NeighborhoodCacheIsExactByDefault) {
  EXPECT_EQ(FakeEnv{}.Parse()->neighborhood_cache_events, kExactNeighborhoodCache);
  EXPECT_THAT(FakeEnv{}.Parse()->ToString(), HasSubstr("neighborhood_cache=exact"));
  auto c = FakeEnv{{{"DTR_NEIGHBORHOOD_CACHE", "8"}}}.Parse();
  ASSERT_TRUE(c.ok()) << c.status();
  c = FakeEnv{{{"DTR_NEIGHBORHOOD_CACHE", "exact"}}}.Parse();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->neighborhood_cache_events, kExactNeighborhoodCache);
  for (const char* bad : {"Exact", "4294967295"}) {
    auto b = FakeEnv{{{"DTR_NEIGHBORHOOD_CACHE", bad}}}.Parse();
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("exact"));
  }
}

// Note [Frozen results pass it on]: DTR_FREEZE_GRADIENTS is 0 or 1, printed, RuntimeConfig's
// default when unset.
TEST(ParseEnvConfig, FreezeGradientsIsZeroOrOne) {
  EXPECT_EQ(FakeEnv{}.Parse()->freeze_gradients, RuntimeConfig{}.freeze_backward_results);
  for (auto [text, value] : {std::pair<const char*, bool>{"0", false}, {"1", true}}) {
    auto c = FakeEnv{{{"DTR_FREEZE_GRADIENTS", text}}}.Parse();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->freeze_gradients, value);
    EXPECT_THAT(c->ToString(), HasSubstr(absl::StrCat("freeze_gradients=", value)));
  }
  for (const char* bad : {"yes", "2", ""}) {
    auto b = FakeEnv{{{"DTR_FREEZE_GRADIENTS", bad}}}.Parse();
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("DTR_FREEZE_GRADIENTS"));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("0 | 1"));
  }
}

TEST(ParseEnvConfig, BudgetsNoMachineHasAreRefused) {
  auto b = FakeEnv{{{"DTR_BUDGET", "9223372036854775807"}}}.Parse();
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("DTR_BUDGET"));
}

TEST(CheckOutputFile, UnwritableDirectoriesAreStartUpErrors) {
  EXPECT_TRUE(CheckOutputFile("DTR_STATS_FILE", "/tmp/dtr-check-{pid}.json").ok());
  absl::Status s = CheckOutputFile("DTR_STATS_FILE", "/nonexistent-dir/stats.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot write into directory /nonexistent-dir"));
}

}  // namespace
}  // namespace dtr::hooks
