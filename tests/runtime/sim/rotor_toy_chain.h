// Test fixture: Rotor's toy chain (Beaumont et al., "Optimal checkpointing for heterogeneous
// chains", Table 2: six fully connected layers, batch 1000, fp32, V100), transcribed from the
// paper, plus the reference numbers of shared/design/baselines.md. The paper's MB are 2^20 bytes
// (its a^0 = 8e6 bytes = 7.63 MB) given to two decimals; sizes become round(MB * 2^20) bytes,
// exactly as in testdata/rotor_toy_chain.chain. Costs are in ms.
#ifndef DTR_TESTS_RUNTIME_SIM_ROTOR_TOY_CHAIN_H_
#define DTR_TESTS_RUNTIME_SIM_ROTOR_TOY_CHAIN_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/sim/chain.h"

namespace dtr::sim::testing {

inline uint64_t MiB(double megabytes) { return uint64_t(std::llround(megabytes * 1024 * 1024)); }
inline double ToMiB(uint64_t bytes) { return double(bytes) / (1024 * 1024); }
// The paper quotes MB to two decimals; the fixture's sizes are rounded to bytes.
inline constexpr double kMiBTolerance = 0.005 + 1e-6;

inline Chain RotorToyChain() {
  struct Row {
    double a, abar, o_f, o_b, u_f, u_b;
  };
  // Table 2, rows 1..6 (row 0 is the input, row 7 the loss, which dtr makes implicit).
  const Row rows[] = {
      {9.54, 9.54, 0.00, 20.01, 1.60, 3.05},   {10.68, 10.68, 0.00, 27.64, 2.20, 4.48},
      {11.06, 11.08, 0.00, 30.99, 2.44, 5.09}, {10.68, 10.66, 0.00, 30.99, 2.51, 4.93},
      {9.54, 9.54, 0.00, 27.64, 2.10, 4.21},   {7.63, 7.63, 0.00, 19.08, 1.43, 3.34},
  };
  Chain chain;
  chain.input_bytes = MiB(7.63);
  int index = 1;
  for (const Row& row : rows) {
    ChainStage stage;
    stage.name = "fc" + std::to_string(index++);
    stage.forward_cost = row.u_f;
    stage.backward_cost = row.u_b;
    stage.activation_bytes = MiB(row.a);
    stage.saved_for_backward_bytes = MiB(row.abar);
    stage.forward_overhead_bytes = MiB(row.o_f);
    stage.backward_overhead_bytes = MiB(row.o_b);
    chain.stages.push_back(stage);
  }
  return chain;
}

// baselines.md: Rotor's optimum (persistent schedules) by budget, in MB and ms.
struct RotorReference {
  double budget_mib;
  double makespan_ms;
};
inline constexpr RotorReference kRotorReferences[] = {
    {100, 41.18},
    {95, 43.62},
    {90, 47.42},
    {85, 56.17},
};
inline constexpr double kStoreAllPeakMiB = 106.99;  // and 37.38 ms, no recomputation
inline constexpr double kStoreAllMakespanMs = 37.38;
inline constexpr double kMinimumBudgetMiB = 82.12;  // infeasible below
inline constexpr double kPeakAt90MiB = 86.75;       // the paper's peak for its 90 MB schedule

}  // namespace dtr::sim::testing

#endif  // DTR_TESTS_RUNTIME_SIM_ROTOR_TOY_CHAIN_H_
