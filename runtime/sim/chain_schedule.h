// Schedules for a Chain (chain.h) in Rotor's operation set, and the executor that checks one:
// it runs the operations under the paper's Table 1 semantics, rejects any that lacks its inputs,
// and returns the makespan and the exact peak memory in bytes. Every planner's output goes
// through it (Note [Chain operation semantics]).
//
// Note [Chain operation semantics]
//   Memory holds values a^l (l = 0..L+1), abar^l and delta^l (l = 1..L+1, delta also 0); abar^l
//   contains a^l, so "a^l is available" means a^l or abar^l is held. It starts as {a^0,
//   delta^{L+1}} (delta^{L+1} has the loss's zero size, Note [Loss stage]) and a schedule is valid
//   when every operation finds its inputs and delta^0 is held at the end. Values disappear only
//   as the table says; there is no separate free.
//     F_all^l   needs a^{l-1} available; adds abar^l.                 time u_f^l, overhead o_f^l
//     F_ck^l    needs a^{l-1} available; adds a^l.                    time u_f^l, overhead o_f^l
//     F_none^l  needs a^{l-1} itself (not inside abar^{l-1}); replaces it by a^l (F_∅ in the
//               paper).                                               time u_f^l, overhead o_f^l
//     B^l       needs delta^l, abar^l and a^{l-1} available; replaces delta^l and abar^l by
//               delta^{l-1}, and consumes a^{l-1} when it is held on its own (Table 1's first
//               line), keeping it when it is only inside abar^{l-1} (second line).
//                                                                     time u_b^l, overhead o_b^l
//   An operation's memory is everything held before it plus its new output plus its overhead
//   (Definition 3.3: inputs, outputs and overhead, with the inputs already held); the peak is
//   the largest such value, and also covers the initial memory. Producing a value that is
//   already held (e.g. F_ck^l twice with no consumer between) is rejected as invalid: the model
//   has no notion of two copies.
#ifndef DTR_RUNTIME_SIM_CHAIN_SCHEDULE_H_
#define DTR_RUNTIME_SIM_CHAIN_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/sim/chain.h"

namespace dtr::sim {

enum class ChainOpKind { kForwardAll, kForwardCheckpoint, kForwardNoSave, kBackward };

struct ChainOp {
  ChainOpKind kind;
  int stage;  // 1..L+1

  static ChainOp ForwardAll(int l) { return {ChainOpKind::kForwardAll, l}; }
  static ChainOp ForwardCheckpoint(int l) { return {ChainOpKind::kForwardCheckpoint, l}; }
  static ChainOp ForwardNoSave(int l) { return {ChainOpKind::kForwardNoSave, l}; }
  static ChainOp Backward(int l) { return {ChainOpKind::kBackward, l}; }
  bool operator==(const ChainOp& other) const { return kind == other.kind && stage == other.stage; }
};

using ChainSchedule = std::vector<ChainOp>;

// "F_all^3", "F_ck^1", "F_none^2", "B^4".
std::string ChainOpToString(const ChainOp& op);
// Space-separated ChainOpToString forms.
std::string ScheduleToString(const ChainSchedule& schedule);
// Reads ScheduleToString's form (whitespace-separated; "F_∅^l" is accepted for F_none^l).
absl::StatusOr<ChainSchedule> ParseSchedule(absl::string_view text);

// The memory state between operations (Note [Chain operation semantics]); exposed so that
// exhaustive searches can step through schedules one operation at a time.
class ChainMemory {
 public:
  explicit ChainMemory(const Chain& chain);

  // Applies `op` if its inputs are held, returning the memory it needed while it ran (held bytes
  // plus its output plus its overhead); leaves the state unchanged and returns an error otherwise.
  absl::StatusOr<uint64_t> Apply(const ChainOp& op);
  // Whether Apply(op) would succeed, without building an error (for exhaustive searches).
  bool CanApply(const ChainOp& op) const { return Check(op) == Refusal::kNone; }

  uint64_t held_bytes() const { return held_bytes_; }
  bool holds_activation(int l) const { return flags_[l] & kActivation; }
  bool holds_saved_for_backward(int l) const { return flags_[l] & kSavedForBackward; }
  bool holds_gradient(int l) const { return flags_[l] & kGradient; }
  bool activation_available(int l) const { return flags_[l] & (kActivation | kSavedForBackward); }
  // True once delta^0 has been computed.
  bool done() const { return holds_gradient(0); }
  // A compact key of which values are held (for exhaustive searches; chains of up to 19 stages).
  uint64_t StateKey() const;

 private:
  static constexpr uint8_t kActivation = 1, kSavedForBackward = 2, kGradient = 4;
  enum class Refusal {
    kNone,
    kNoSuchStage,
    kNeedsInput,
    kNeedsInputOnItsOwn,
    kNeedsGradient,
    kNeedsSaved,
    kHoldsOutput
  };
  // Why `op` cannot run now, if it cannot.
  Refusal Check(const ChainOp& op) const;

  const Chain* chain_;
  // Per stage 0..L+1: which of a^l, abar^l, delta^l are held (inline: searches copy states).
  absl::InlinedVector<uint8_t, 24> flags_;
  uint64_t held_bytes_ = 0;
};

struct ScheduleRun {
  double makespan = 0;             // sum of the operations' costs
  uint64_t peak_bytes = 0;         // exact, Note [Chain operation semantics]
  size_t peak_op = 0;              // index of the first operation reaching the peak
  size_t recomputed_forwards = 0;  // forward operations beyond one per stage
};

// Runs `schedule` on `chain`. InvalidArgument naming the operation's index when an operation
// lacks an input, a stage is out of range, or the schedule ends without delta^0.
absl::StatusOr<ScheduleRun> ExecuteSchedule(const Chain& chain, const ChainSchedule& schedule);

// F_all^1 .. F_all^{L+1}, B^{L+1} .. B^1: the schedule that recomputes nothing.
ChainSchedule StoreAllSchedule(const Chain& chain);
// Its peak: what --ratio budgets are relative to.
uint64_t StoreAllPeakBytes(const Chain& chain);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_CHAIN_SCHEDULE_H_
