// Synthetic traces for tests, benchmarks and heuristic comparisons. Each generator builds a
// forward graph and emits a training step: forward, then an autograd-style backward with one
// backward op per forward op (multi-output when the forward op has several inputs needing
// gradients), releasing every tensor when the real framework would.
#ifndef DTR_RUNTIME_SIM_GENERATORS_H_
#define DTR_RUNTIME_SIM_GENERATORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/config.h"
#include "runtime/sim/trace.h"

namespace dtr::sim {

struct GeneratorOptions {
  int n = 0;          // size parameter; 0 picks each generator's default
  uint64_t seed = 1;
  // adversarial only: the budget (in unit tensors) the adversary plays against, and the
  // runtime configuration whose decisions it observes.
  int budget = 0;
  RuntimeConfig adversary_config;
};

// "chain": N-layer linear feedforward net, forward + backward, unit sizes and costs (Thm 3.1).
// "adversarial": Theorem 3.2's construction, revealed against a live runtime.
// "unet": encoder/decoder with long skip connections and parameters.
// "treelstm": TreeLSTM cells over random binary trees (multi-output cells).
// "random-dag": seeded random DAG with views and in-place ops.
absl::StatusOr<Trace> GenerateTrace(absl::string_view kind, const GeneratorOptions& options);
std::vector<std::string> GeneratorKinds();

// Builds a forward graph and emits it as a training step. Public for tests.
class TrainingStepBuilder {
 public:
  // A value (tensor) in the forward graph.
  using Value = int;
  // Data inputs need no gradient; parameters do (their gradients are kept to the end).
  Value Input(uint64_t size);
  Value Param(uint64_t size);
  // An op producing one output per entry of `output_sizes`.
  std::vector<Value> Op(absl::string_view name, double cost, const std::vector<Value>& inputs,
                        const std::vector<uint64_t>& output_sizes);
  Value Op1(absl::string_view name, double cost, const std::vector<Value>& inputs, uint64_t size) {
    return Op(name, cost, inputs, {size})[0];
  }
  // Emits forward, loss gradient seed, backward and releases, with `loss` the value whose
  // gradient seeds backward. Parameter gradients stay live at the end.
  Trace Build(Value loss);

 private:
  struct ValueInfo {
    uint64_t size;
    int producer;    // op index, or -1 for inputs/params
    bool is_param;
  };
  struct OpInfo {
    std::string name;
    double cost;
    std::vector<Value> inputs;
    std::vector<Value> outputs;
  };
  std::vector<ValueInfo> values_;
  std::vector<OpInfo> ops_;
};

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_GENERATORS_H_
