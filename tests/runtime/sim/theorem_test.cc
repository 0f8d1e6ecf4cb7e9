// Theorem 3.1 of the DTR paper as a test: an N-layer linear feedforward net (forward + backward,
// unit sizes and costs) trains under a budget of c * ceil(sqrt(N)) with O(N) operations.
// We use c = 2 (stated in the README; c = 1 also passes) and exact victim search so the run is deterministic.
#include <cmath>

#include "gtest/gtest.h"
#include "runtime/sim/generators.h"
#include "runtime/sim/simulator.h"

namespace dtr::sim {
namespace {

constexpr int kBudgetConstant = 2;

double CostPerLayer(int n, HeuristicKind heuristic) {
  GeneratorOptions gen;
  gen.n = n;
  auto trace = GenerateTrace("chain", gen);
  EXPECT_TRUE(trace.ok());
  SimOptions options;
  options.runtime.heuristic = heuristic;
  options.runtime.search = SearchMode::kExact;
  options.runtime.budget_bytes = uint64_t(kBudgetConstant * std::ceil(std::sqrt(double(n))));
  auto result = Simulate(*trace, options);
  EXPECT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->ok) << "N=" << n << " " << HeuristicName(heuristic) << ": " << result->error;
  EXPECT_LE(result->peak_bytes, options.runtime.budget_bytes);
  double per_layer = result->total_cost / n;
  std::printf("theorem 3.1: %-7s N=%-6d budget=%-4llu total_cost=%-9.0f total_cost/N=%.3f remats=%llu\n",
              HeuristicName(heuristic).c_str(), n, (unsigned long long)options.runtime.budget_bytes,
              result->total_cost, per_layer, (unsigned long long)result->stats.rematerializations);
  return per_layer;
}

class Theorem31 : public ::testing::TestWithParam<HeuristicKind> {};

TEST_P(Theorem31, CostPerLayerDoesNotGrowWithN) {
  double n100 = CostPerLayer(100, GetParam());
  double n1000 = CostPerLayer(1000, GetParam());
  double n10000 = CostPerLayer(10000, GetParam());
  std::printf("theorem 3.1: %s ratio (N=10000)/(N=1000) = %.3f, (N=1000)/(N=100) = %.3f\n",
              HeuristicName(GetParam()).c_str(), n10000 / n1000, n1000 / n100);
  EXPECT_LE(n10000, 1.25 * n1000);
  EXPECT_LT(n100, 10);  // forward + backward alone is 2 per layer
}

INSTANTIATE_TEST_SUITE_P(DtrHeuristics, Theorem31, ::testing::Values(HeuristicKind::kDtrEq, HeuristicKind::kDtr),
                         [](const auto& info) { return info.param == HeuristicKind::kDtr ? "dtr" : "dtr_eq"; });

}  // namespace
}  // namespace dtr::sim
