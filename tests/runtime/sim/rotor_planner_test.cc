// Tests for Rotor's persistent DP: the paper's toy chain reproduces shared/design/baselines.md,
// the slot discretization stays within Note [Rotor discretization]'s bounds, and on small random
// chains the DP equals an exhaustive search over persistent schedules (and is never below the
// exhaustive optimum over all schedules).
#include "runtime/sim/rotor_planner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/sim/chain_schedule.h"
#include "tests/runtime/sim/rotor_toy_chain.h"

namespace dtr::sim {
namespace {

using ::testing::HasSubstr;
using testing::kMiBTolerance;
using testing::MiB;
using testing::RotorToyChain;
using testing::ToMiB;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

RotorOptions Exact() {
  RotorOptions options;
  options.slots = 0;
  return options;
}

double RotorMakespan(const Chain& chain, uint64_t budget, const RotorOptions& options) {
  auto plan = PlanRotor(chain, budget, options);
  if (!plan.ok()) {
    EXPECT_TRUE(absl::IsResourceExhausted(plan.status())) << plan.status();
    return kInfinity;
  }
  EXPECT_LE(plan->run.peak_bytes, budget);
  EXPECT_NEAR(plan->run.makespan, plan->makespan, 1e-9);
  return plan->makespan;
}

// Dijkstra over memory states, stepping with the executor's ChainMemory: the least makespan of
// any valid schedule within `budget`, or among persistent ones only (Definition 4.1: after
// F_ck^i or F_all^i and until B^i, no operation of a stage below i and no F_none^i).
double ExhaustiveOptimum(const Chain& chain, uint64_t budget, bool persistent_only) {
  const int n = chain.loss_stage();
  struct Node {
    ChainMemory memory;
    uint32_t pinned;  // bit i: stage i is pinned
  };
  std::vector<Node> nodes;
  absl::flat_hash_map<uint64_t, double> best;
  using Item = std::pair<double, size_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  auto key = [](const Node& node) { return node.memory.StateKey() | (uint64_t(node.pinned) << 40); };
  nodes.push_back({ChainMemory(chain), 0});
  if (nodes[0].memory.held_bytes() > budget) return kInfinity;
  best[key(nodes[0])] = 0;
  queue.push({0, 0});
  while (!queue.empty()) {
    auto [cost, index] = queue.top();
    queue.pop();
    const Node node = nodes[index];
    if (cost > best[key(node)]) continue;
    if (node.memory.done()) return cost;
    const int lowest_allowed = node.pinned == 0 ? 1 : 31 - __builtin_clz(node.pinned);
    for (int l = 1; l <= n; ++l) {
      for (ChainOpKind kind : {ChainOpKind::kForwardAll, ChainOpKind::kForwardCheckpoint, ChainOpKind::kForwardNoSave,
                               ChainOpKind::kBackward}) {
        uint32_t pinned = node.pinned;
        if (persistent_only) {
          if (l < lowest_allowed) continue;
          if (kind == ChainOpKind::kForwardNoSave && (pinned >> l & 1)) continue;
          if (kind == ChainOpKind::kForwardAll || kind == ChainOpKind::kForwardCheckpoint) pinned |= 1u << l;
          if (kind == ChainOpKind::kBackward) pinned &= ~(1u << l);
        }
        if (!node.memory.CanApply({kind, l})) continue;
        Node next{node.memory, pinned};
        auto during = next.memory.Apply({kind, l});
        if (!during.ok() || *during > budget) continue;
        const double next_cost =
            cost + (kind == ChainOpKind::kBackward ? chain.backward_cost(l) : chain.forward_cost(l));
        auto [it, inserted] = best.try_emplace(key(next), next_cost);
        if (!inserted && it->second <= next_cost) continue;
        it->second = next_cost;
        nodes.push_back(std::move(next));
        queue.push({next_cost, nodes.size() - 1});
      }
    }
  }
  return kInfinity;
}

TEST(RotorPlanner, ToyChainExactOptimaMatchBaselines) {
  const Chain chain = RotorToyChain();
  // No recomputation at the store-all peak (106.99 MB; the byte-rounded fixture's is 1 byte over).
  const uint64_t store_all = StoreAllPeakBytes(chain);
  EXPECT_NEAR(ToMiB(store_all), testing::kStoreAllPeakMiB, kMiBTolerance);
  auto plan = PlanRotor(chain, store_all, Exact());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->makespan, testing::kStoreAllMakespanMs, 1e-9);
  EXPECT_EQ(plan->schedule, StoreAllSchedule(chain));
  // One byte less forces a recomputation.
  EXPECT_GT(RotorMakespan(chain, store_all - 1, Exact()), testing::kStoreAllMakespanMs + 0.1);
  for (const auto& reference : testing::kRotorReferences) {
    EXPECT_NEAR(RotorMakespan(chain, MiB(reference.budget_mib), Exact()), reference.makespan_ms, 1e-9)
        << reference.budget_mib << " MB";
  }
}

TEST(RotorPlanner, ToyChainAtNinetyMegabytesIsThePapersSequence) {
  const Chain chain = RotorToyChain();
  auto plan = PlanRotor(chain, MiB(90), Exact());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(ScheduleToString(plan->schedule),
            "F_ck^1 F_none^2 F_none^3 F_all^4 F_all^5 F_all^6 F_all^7 B^7 B^6 B^5 B^4 "
            "F_ck^1 F_none^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1");
  EXPECT_NEAR(ToMiB(plan->run.peak_bytes), testing::kPeakAt90MiB, kMiBTolerance);
}

TEST(RotorPlanner, ToyChainIsInfeasibleBelowItsMinimum) {
  const Chain chain = RotorToyChain();
  const uint64_t minimum = MinimumPersistentPeakBytes(chain);
  EXPECT_NEAR(ToMiB(minimum), testing::kMinimumBudgetMiB, kMiBTolerance);
  auto plan = PlanRotor(chain, minimum, Exact());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->run.peak_bytes, minimum);
  auto below = PlanRotor(chain, minimum - 1, Exact());
  ASSERT_TRUE(absl::IsResourceExhausted(below.status())) << below.status();
  EXPECT_THAT(std::string(below.status().message()),
              HasSubstr("the smallest possible peak is " + std::to_string(minimum) + " bytes"));
  // With slots, a budget just above the exact minimum is lost to rounding, and the message says so.
  auto rounded = PlanRotor(chain, minimum + 1);
  ASSERT_TRUE(absl::IsResourceExhausted(rounded.status())) << rounded.status();
  EXPECT_THAT(std::string(rounded.status().message()), HasSubstr("rounded up"));
}

TEST(RotorPlanner, ToyChainWithDefaultSlotsStaysWithinTheDiscretizationBound) {
  const Chain chain = RotorToyChain();
  for (const auto& reference : testing::kRotorReferences) {
    const uint64_t budget = MiB(reference.budget_mib);
    auto plan = PlanRotor(chain, budget);
    ASSERT_TRUE(plan.ok()) << reference.budget_mib << ": " << plan.status();
    EXPECT_EQ(plan->slot_bytes, (budget + kDefaultRotorSlots - 1) / kDefaultRotorSlots);
    EXPECT_LE(plan->run.peak_bytes, budget);
    // At these budgets 500 slots lose nothing on this chain.
    EXPECT_NEAR(plan->makespan, reference.makespan_ms, 1e-9) << reference.budget_mib << " MB";
  }
  // At the store-all peak itself rounding would cost a recomputation; the store-all schedule is
  // taken directly instead.
  auto store_all = PlanRotor(chain, StoreAllPeakBytes(chain));
  ASSERT_TRUE(store_all.ok()) << store_all.status();
  EXPECT_EQ(store_all->schedule, StoreAllSchedule(chain));
  // Note [Rotor discretization]: OPT(M) <= DP(M, S) <= OPT(M - (L+6) slot), over a sweep of M.
  for (double mib = 82; mib <= 108; mib += 0.25) {
    for (int slots : {50, 500}) {
      const uint64_t budget = MiB(mib);
      RotorOptions options;
      options.slots = slots;
      const double discretized = RotorMakespan(chain, budget, options);
      const uint64_t slot = (budget + slots - 1) / slots;
      const uint64_t tolerance = uint64_t(chain.length() + 6) * slot;
      EXPECT_GE(discretized, RotorMakespan(chain, budget, Exact()) - 1e-9) << mib << " MiB, " << slots;
      if (budget > tolerance) {
        EXPECT_LE(discretized, RotorMakespan(chain, budget - tolerance, Exact()) + 1e-9) << mib << " MiB, " << slots;
      }
    }
  }
}

TEST(RotorPlanner, RejectsBadOptions) {
  const Chain chain = RotorToyChain();
  RotorOptions negative;
  negative.slots = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanRotor(chain, MiB(100), negative).status()));
  RotorOptions tiny_table;
  tiny_table.max_table_bytes = 1000;
  EXPECT_TRUE(absl::IsFailedPrecondition(PlanRotor(chain, MiB(100), tiny_table).status()));
  tiny_table.slots = 0;
  EXPECT_TRUE(absl::IsFailedPrecondition(PlanRotor(chain, MiB(100), tiny_table).status()));
}

Chain RandomChain(std::mt19937& rng, int stages) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Chain chain;
  chain.input_bytes = uint64_t(uniform(0, 8));
  for (int l = 1; l <= stages; ++l) {
    ChainStage s;
    s.name = "s" + std::to_string(l);
    // Integral costs keep sums exact whatever the order of addition.
    s.forward_cost = uniform(0, 9);
    s.backward_cost = uniform(0, 9);
    s.activation_bytes = uint64_t(uniform(0, 8));
    // Mostly abar >= a, as the paper assumes; sometimes not, as measured chains do.
    s.saved_for_backward_bytes = uniform(0, 4) == 0 ? uint64_t(uniform(0, int(s.activation_bytes)))
                                                    : s.activation_bytes + uint64_t(uniform(0, 6));
    s.forward_overhead_bytes = uint64_t(uniform(0, 1) ? 0 : uniform(0, 5));
    s.backward_overhead_bytes = uint64_t(uniform(0, 8));
    chain.stages.push_back(s);
  }
  return chain;
}

TEST(RotorPlanner, EqualsExhaustiveSearchOnSmallRandomChains) {
  std::mt19937 rng(20240611);
  int cases = 0, nonpersistent_wins = 0, infeasible = 0;
  // Chains of L stages, count: the search's cost grows steeply with L.
  std::vector<int> lengths;
  for (auto [length, count] : {std::pair{1, 20}, {2, 32}, {3, 32}, {4, 20}, {5, 5}})
    lengths.insert(lengths.end(), count, length);
  for (int length : lengths) {
    const Chain chain = RandomChain(rng, length);
    const uint64_t minimum = MinimumPersistentPeakBytes(chain);
    const uint64_t store_all = StoreAllPeakBytes(chain);
    ASSERT_LE(minimum, store_all);
    std::vector<uint64_t> budgets = {minimum, store_all, minimum + (store_all - minimum) / 3,
                                     minimum + 2 * (store_all - minimum) / 3};
    if (minimum > 0) budgets.push_back(minimum - 1);
    for (uint64_t budget : budgets) {
      SCOPED_TRACE(ChainToString(chain) + "budget " + std::to_string(budget));
      ++cases;
      const double persistent = ExhaustiveOptimum(chain, budget, /*persistent_only=*/true);
      const double any = ExhaustiveOptimum(chain, budget, /*persistent_only=*/false);
      EXPECT_EQ(persistent < kInfinity, budget >= minimum);
      // Exact DP, and slots of exactly one byte (S = budget), equal the persistent optimum.
      EXPECT_EQ(RotorMakespan(chain, budget, Exact()), persistent);
      if (budget > 0) {
        RotorOptions one_byte_slots;
        one_byte_slots.slots = int(budget);
        EXPECT_EQ(RotorMakespan(chain, budget, one_byte_slots), persistent);
      }
      // Coarse slots: never better than the optimum, and always within the budget.
      RotorOptions coarse;
      coarse.slots = 3;
      EXPECT_GE(RotorMakespan(chain, budget, coarse), persistent);
      EXPECT_LE(any, persistent);
      nonpersistent_wins += any < persistent;
      infeasible += persistent == kInfinity;
    }
  }
  // The search must have exercised the interesting cases.
  EXPECT_GT(cases, 500);
  EXPECT_GT(infeasible, 50);
  RecordProperty("nonpersistent_wins", nonpersistent_wins);
}

TEST(RotorPlanner, ForwardSweepCountsTheGradientHeldDuringIt) {
  // Note [Persistent DP]'s m_sweep includes w_delta^t. Here the only schedule that fits B^3 in 12
  // bytes, F_ck^1 F_none^2 F_all^3 F_all^4 B^4 B^3 ..., must then redo F^1 (o_f^1 = 10) while
  // delta^2 (5 bytes) is held: 16 bytes. Without that term the DP would accept it.
  Chain chain;
  chain.input_bytes = 0;
  for (auto [a, o_f] : {std::pair{1, 10}, {5, 0}, {1, 0}}) {
    ChainStage s;
    s.name = "s" + std::to_string(chain.length() + 1);
    s.forward_cost = s.backward_cost = 1;
    s.activation_bytes = s.saved_for_backward_bytes = uint64_t(a);
    s.forward_overhead_bytes = uint64_t(o_f);
    chain.stages.push_back(s);
  }
  EXPECT_EQ(ExhaustiveOptimum(chain, 12, /*persistent_only=*/true), kInfinity);
  EXPECT_EQ(MinimumPersistentPeakBytes(chain), 13u);
  for (int slots : {0, 12}) {  // exact, and slots of one byte (S = M)
    RotorOptions options;
    options.slots = slots;
    EXPECT_TRUE(absl::IsResourceExhausted(PlanRotor(chain, 12, options).status())) << slots;
  }
  const double optimum = ExhaustiveOptimum(chain, 13, /*persistent_only=*/true);
  EXPECT_EQ(RotorMakespan(chain, 13, Exact()), optimum);
  RotorOptions one_byte_slots;
  one_byte_slots.slots = 13;
  EXPECT_EQ(RotorMakespan(chain, 13, one_byte_slots), optimum);
}

TEST(RotorPlanner, PapersFigure4CounterexampleIsNotPersistent) {
  // Section 4.1: with n = 5, L = n + 2 = 7, u_f^1 = k = n - 2, u_f^2 = 2, other costs 0; sizes 3
  // except a^0 = 0, a^1 = 1, a^L = 4; abar = a; M = 15. Persistent optimum 3n - 2 = 13, while a
  // schedule that drops a^1 for a^2 midway takes 2n + 2 = 12.
  const int n = 5, length = n + 2;
  Chain chain;
  chain.input_bytes = 0;
  for (int l = 1; l <= length; ++l) {
    ChainStage s;
    s.name = "s" + std::to_string(l);
    s.forward_cost = l == 1 ? n - 2 : l == 2 ? 2 : 0;
    s.activation_bytes = s.saved_for_backward_bytes = l == 1 ? 1 : l == length ? 4 : 3;
    chain.stages.push_back(s);
  }
  EXPECT_EQ(RotorMakespan(chain, 15, Exact()), 3 * n - 2);
  EXPECT_EQ(ExhaustiveOptimum(chain, 15, /*persistent_only=*/true), 3 * n - 2);
  EXPECT_EQ(ExhaustiveOptimum(chain, 15, /*persistent_only=*/false), 2 * n + 2);
}

}  // namespace
}  // namespace dtr::sim
