// Fuzz-style test: thousands of random traces (a third of their ops marked as a backward pass's)
// under random budgets, heuristics, policies, search modes and replay-depth limits, with Runtime::CheckInvariants after every event and the simulator's value and
// byte checks throughout.
#include <random>

#include "gtest/gtest.h"
#include "runtime/sim/generators.h"
#include "runtime/sim/simulator.h"

namespace dtr::sim {
namespace {

TEST(SimulatorFuzz, RandomTracesKeepEveryInvariant) {
  std::mt19937_64 rng(20261121);
  constexpr int kTraces = 5000;
  int completed = 0, oom = 0;
  uint64_t evictions = 0, remats = 0, awaited_evictions = 0;
  for (int i = 0; i < kTraces; ++i) {
    GeneratorOptions gen;
    gen.n = 20 + int(rng() % 80);
    gen.seed = rng();
    auto trace = GenerateTrace("random-dag", gen);
    ASSERT_TRUE(trace.ok()) << trace.status();
    // Note [Results of the backward pass]: a third of the ops marked as a backward pass's.
    for (TraceEvent& e : trace->events)
      if (e.kind == EventKind::kCall || e.kind == EventKind::kMutate) e.backward = rng() % 3 == 0;
    auto peak = UnconstrainedPeak(*trace);
    ASSERT_TRUE(peak.ok()) << "seed " << gen.seed << ": " << peak.status();
    SimOptions options;
    options.check_invariants = true;
    const auto& heuristics = AllHeuristics();
    options.runtime.heuristic = heuristics[rng() % heuristics.size()].kind;
    options.runtime.dealloc = rng() % 2 ? DeallocPolicy::kBanish : DeallocPolicy::kEagerEvict;
    options.runtime.search = rng() % 2 ? SearchMode::kExact : SearchMode::kSampled;
    options.runtime.min_samples = 1 + uint32_t(rng() % 4);
    options.runtime.exhaustive_pool = rng() % 2 ? 0 : 256;  // Note [Small pools are searched whole]
    options.runtime.thrash_damping = double(rng() % 3);
    options.runtime.replays_refresh_staleness = rng() % 2 == 0;
    options.runtime.freeze_held_results = rng() % 2 == 0;  // Note [Held results of dead inputs]
    options.runtime.freeze_backward_results = rng() % 2 == 0;  // Note [Frozen results pass it on]
    options.runtime.input_locking = rng() % 2 ? InputLocking::kLazy : InputLocking::kEager;
    options.runtime.backward_protection = rng() % 2 ? 1 : 100;
    options.runtime.backward_next_use = (rng() % 4) / 3.0;  // Note [Next use in a backward pass]: 0 to 1
    options.runtime.pending_protection = rng() % 2 ? 1 : 1000;  // Note [Inputs a rematerialization will read]
    options.runtime.max_replay_depth = rng() % 4 ? 1000 : 3;  // Note [Bounded replay chains]: detaches
    options.runtime.seed = rng();
    double ratio = 0.2 + 0.8 * std::uniform_real_distribution<double>(0, 1)(rng);
    options.runtime.budget_bytes = std::max<uint64_t>(1, uint64_t(ratio * double(*peak)));
    auto result = Simulate(*trace, options);
    ASSERT_TRUE(result.ok()) << "dtr-sim --generate random-dag --n " << gen.n << " --seed " << gen.seed << " | dtr-sim " << options.runtime.ToString() << ": " << result.status();
    if (result->ok) {
      ++completed;
      ASSERT_LE(result->peak_bytes, options.runtime.budget_bytes);
    } else {
      ++oom;
    }
    evictions += result->stats.evictions;
    remats += result->stats.rematerializations;
    awaited_evictions += result->stats.awaited_evictions;
  }
  // The budgets span feasible and infeasible; both outcomes and real rematerialization occur.
  EXPECT_GT(completed, kTraces / 4);
  EXPECT_GT(oom, 0);
  EXPECT_GT(remats, 1000u);
  EXPECT_GT(awaited_evictions, 0u);  // Note [Lazy input locks]' last resort was taken
  std::printf("fuzz: %d traces, %d completed, %d oom, %llu evictions (%llu of awaited inputs), %llu rematerializations\n",
              kTraces, completed, oom, (unsigned long long)evictions, (unsigned long long)awaited_evictions,
              (unsigned long long)remats);
}

}  // namespace
}  // namespace dtr::sim
