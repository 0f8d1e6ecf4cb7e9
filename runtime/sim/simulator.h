// The trace simulator: replays a Trace through the real Runtime under a budget, with a backend
// whose "memory" holds a hash of each storage's value. Every rematerialized storage is checked
// to reproduce the value it had when first computed (Note [Simulated values]), and the backend's
// own count of resident bytes is checked against the runtime's after every event.
#ifndef DTR_RUNTIME_SIM_SIMULATOR_H_
#define DTR_RUNTIME_SIM_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/config.h"
#include "runtime/sim/trace.h"
#include "runtime/stats.h"

namespace dtr::sim {

struct SimOptions {
  RuntimeConfig runtime;
  // Run Runtime::CheckInvariants after every event (slow: O(records) per event).
  bool check_invariants = false;
  // Keep a RematEvent for every trace event that rematerialized something (SimResult::remat_events).
  bool log_remats = false;
};

// A trace event whose replay rematerialized storages (its inputs, or, for an in-place op, the
// held readers of what it overwrites: Note [Mutation]): where the recomputation of a run goes.
struct RematEvent {
  size_t event = 0;   // index in the trace's events
  std::string op;     // the trace event's op name
  bool backward = false;  // pass=backward in the trace
  bool mutate = false;    // an in-place op (a `mutate` event)
  size_t rematerializations = 0;
  double remat_cost = 0;
};

// Note [Steady-state steps]: a training run's first step is not like the others. Before it the
// gradients and the optimizer state do not exist yet, so under a budget sized for the steps that
// hold them (static + r x activations) it has that much more room and rematerializes little. A
// driver measures the steps after a warm-up instead: it marks each step in the trace
// (torch.ops.dtr.trace_mark) and takes the costs between two marks, or from one to the end.
struct MarkCosts {
  std::string label;
  size_t event = 0;         // events replayed before the mark
  double base_cost = 0;     // cumulative, as in SimResult
  double total_cost = 0;
  size_t evictions = 0;
  size_t rematerializations = 0;
};

struct SimResult {
  bool ok = false;       // false: the budget was infeasible ("oom")
  std::string error;     // the runtime's explanation when !ok
  uint64_t budget_bytes = 0;
  uint64_t peak_bytes = 0;
  double base_cost = 0;
  double total_cost = 0;
  size_t events_replayed = 0;
  RuntimeStats stats;
  std::vector<MarkCosts> marks;  // each `mark` replayed, in order (an out-of-memory run: those reached)
  std::vector<RematEvent> remat_events;  // SimOptions::log_remats: in trace order

  double compute_ratio() const { return base_cost > 0 ? total_cost / base_cost : 1.0; }
  // One JSON object: status, budget_bytes, peak_bytes, base_cost, total_cost, compute_ratio,
  // evictions, rematerializations, the rest of the stats, the marks and, when logged, the
  // remat_events.
  std::string ToJson(const RuntimeConfig& config) const;
};

// Replays `trace`. Returns an error status for a broken trace or a failed value check (a
// runtime bug); an infeasible budget is a result with ok == false.
absl::StatusOr<SimResult> Simulate(const Trace& trace, const SimOptions& options);

// The trace's peak resident bytes with no budget (what --ratio is relative to).
absl::StatusOr<uint64_t> UnconstrainedPeak(const Trace& trace);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_SIMULATOR_H_
