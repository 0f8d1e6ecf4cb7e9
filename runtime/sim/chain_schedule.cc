// The chain schedule executor; see Note [Chain operation semantics] in chain_schedule.h.
#include "runtime/sim/chain_schedule.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtr::sim {
namespace {

constexpr absl::string_view kForwardAllPrefix = "F_all^";
constexpr absl::string_view kForwardCheckpointPrefix = "F_ck^";
constexpr absl::string_view kForwardNoSavePrefix = "F_none^";
constexpr absl::string_view kForwardNoSavePaperPrefix = "F_∅^";
constexpr absl::string_view kBackwardPrefix = "B^";

}  // namespace

std::string ChainOpToString(const ChainOp& op) {
  switch (op.kind) {
    case ChainOpKind::kForwardAll:
      return absl::StrCat(kForwardAllPrefix, op.stage);
    case ChainOpKind::kForwardCheckpoint:
      return absl::StrCat(kForwardCheckpointPrefix, op.stage);
    case ChainOpKind::kForwardNoSave:
      return absl::StrCat(kForwardNoSavePrefix, op.stage);
    case ChainOpKind::kBackward:
      return absl::StrCat(kBackwardPrefix, op.stage);
  }
  return "?";
}

std::string ScheduleToString(const ChainSchedule& schedule) {
  return absl::StrJoin(schedule, " ", [](std::string* out, const ChainOp& op) { out->append(ChainOpToString(op)); });
}

absl::StatusOr<ChainSchedule> ParseSchedule(absl::string_view text) {
  ChainSchedule schedule;
  for (absl::string_view token : absl::StrSplit(text, absl::ByAnyChar(" \t\r\n,"), absl::SkipEmpty())) {
    ChainOp op{ChainOpKind::kBackward, 0};
    absl::string_view rest = token;
    if (absl::ConsumePrefix(&rest, kForwardAllPrefix))
      op.kind = ChainOpKind::kForwardAll;
    else if (absl::ConsumePrefix(&rest, kForwardCheckpointPrefix))
      op.kind = ChainOpKind::kForwardCheckpoint;
    else if (absl::ConsumePrefix(&rest, kForwardNoSavePrefix) || absl::ConsumePrefix(&rest, kForwardNoSavePaperPrefix))
      op.kind = ChainOpKind::kForwardNoSave;
    else if (absl::ConsumePrefix(&rest, kBackwardPrefix))
      op.kind = ChainOpKind::kBackward;
    else
      return absl::InvalidArgumentError(absl::StrCat("schedule: unknown operation '", token, "'"));
    if (!absl::SimpleAtoi(rest, &op.stage) || op.stage < 1)
      return absl::InvalidArgumentError(absl::StrCat("schedule: bad stage in '", token, "'"));
    schedule.push_back(op);
  }
  return schedule;
}

ChainMemory::ChainMemory(const Chain& chain) : chain_(&chain), flags_(chain.length() + 2, 0) {
  flags_[0] = kActivation;
  flags_[chain.loss_stage()] = kGradient;
  held_bytes_ = chain.activation_bytes(0) + chain.gradient_bytes(chain.loss_stage());
}

ChainMemory::Refusal ChainMemory::Check(const ChainOp& op) const {
  const int l = op.stage;
  if (l < 1 || l > chain_->loss_stage()) return Refusal::kNoSuchStage;
  switch (op.kind) {
    case ChainOpKind::kForwardAll:
      if (!activation_available(l - 1)) return Refusal::kNeedsInput;
      if (holds_saved_for_backward(l)) return Refusal::kHoldsOutput;
      break;
    case ChainOpKind::kForwardCheckpoint:
      if (!activation_available(l - 1)) return Refusal::kNeedsInput;
      if (holds_activation(l)) return Refusal::kHoldsOutput;
      break;
    case ChainOpKind::kForwardNoSave:
      if (!holds_activation(l - 1)) return Refusal::kNeedsInputOnItsOwn;
      if (holds_activation(l)) return Refusal::kHoldsOutput;
      break;
    case ChainOpKind::kBackward:
      if (!holds_gradient(l)) return Refusal::kNeedsGradient;
      if (!holds_saved_for_backward(l)) return Refusal::kNeedsSaved;
      if (!activation_available(l - 1)) return Refusal::kNeedsInput;
      if (holds_gradient(l - 1)) return Refusal::kHoldsOutput;
      break;
  }
  return Refusal::kNone;
}

absl::StatusOr<uint64_t> ChainMemory::Apply(const ChainOp& op) {
  const int l = op.stage;
  const Chain& c = *chain_;
  switch (Check(op)) {
    case Refusal::kNone:
      break;
    case Refusal::kNoSuchStage:
      return absl::InvalidArgumentError(absl::StrCat(ChainOpToString(op), ": no such stage (stages are 1..",
                                                     c.loss_stage(), ", the last is the loss)"));
    case Refusal::kNeedsInput:
      return absl::InvalidArgumentError(
          absl::StrCat(ChainOpToString(op), " needs a^", l - 1, ", which is not in memory"));
    case Refusal::kNeedsInputOnItsOwn:
      return absl::InvalidArgumentError(absl::StrCat(ChainOpToString(op), " needs a^", l - 1,
                                                     " on its own (F_none cannot consume it from abar^", l - 1,
                                                     "), which is not in memory"));
    case Refusal::kNeedsGradient:
      return absl::InvalidArgumentError(
          absl::StrCat(ChainOpToString(op), " needs delta^", l, ", which is not in memory"));
    case Refusal::kNeedsSaved:
      return absl::InvalidArgumentError(
          absl::StrCat(ChainOpToString(op), " needs abar^", l, ", which is not in memory"));
    case Refusal::kHoldsOutput: {
      const std::string output = op.kind == ChainOpKind::kForwardAll ? absl::StrCat("abar^", l)
                                 : op.kind == ChainOpKind::kBackward ? absl::StrCat("delta^", l - 1)
                                                                     : absl::StrCat("a^", l);
      return absl::InvalidArgumentError(
          absl::StrCat(ChainOpToString(op), " produces ", output, ", which is already in memory"));
    }
  }
  uint64_t during = 0;
  switch (op.kind) {
    case ChainOpKind::kForwardAll:
      during = held_bytes_ + c.saved_for_backward_bytes(l) + c.forward_overhead_bytes(l);
      flags_[l] |= kSavedForBackward;
      held_bytes_ += c.saved_for_backward_bytes(l);
      break;
    case ChainOpKind::kForwardCheckpoint:
      during = held_bytes_ + c.activation_bytes(l) + c.forward_overhead_bytes(l);
      flags_[l] |= kActivation;
      held_bytes_ += c.activation_bytes(l);
      break;
    case ChainOpKind::kForwardNoSave:
      during = held_bytes_ + c.activation_bytes(l) + c.forward_overhead_bytes(l);
      flags_[l - 1] &= ~kActivation;
      flags_[l] |= kActivation;
      held_bytes_ = held_bytes_ - c.activation_bytes(l - 1) + c.activation_bytes(l);
      break;
    case ChainOpKind::kBackward:
      during = held_bytes_ + c.gradient_bytes(l - 1) + c.backward_overhead_bytes(l);
      flags_[l] &= ~(kGradient | kSavedForBackward);
      held_bytes_ -= c.gradient_bytes(l) + c.saved_for_backward_bytes(l);
      if (holds_activation(l - 1)) {  // Table 1's first line: a^{l-1} on its own is consumed
        flags_[l - 1] &= ~kActivation;
        held_bytes_ -= c.activation_bytes(l - 1);
      }
      flags_[l - 1] |= kGradient;
      held_bytes_ += c.gradient_bytes(l - 1);
      break;
  }
  return during;
}

uint64_t ChainMemory::StateKey() const {
  uint64_t key = 0;
  for (size_t i = 0; i < flags_.size() && 3 * i < 64; ++i) key |= uint64_t(flags_[i]) << (3 * i);
  return key;
}

absl::StatusOr<ScheduleRun> ExecuteSchedule(const Chain& chain, const ChainSchedule& schedule) {
  ChainMemory memory(chain);
  ScheduleRun run;
  run.peak_bytes = memory.held_bytes();
  size_t forwards = 0;
  for (size_t i = 0; i < schedule.size(); ++i) {
    const ChainOp& op = schedule[i];
    auto during = memory.Apply(op);
    if (!during.ok())
      return absl::InvalidArgumentError(absl::StrCat("schedule operation ", i, ": ", during.status().message()));
    if (i == 0 || *during > run.peak_bytes) {
      run.peak_bytes = *during;
      run.peak_op = i;
    }
    if (op.kind == ChainOpKind::kBackward) {
      run.makespan += chain.backward_cost(op.stage);
    } else {
      run.makespan += chain.forward_cost(op.stage);
      ++forwards;
    }
  }
  if (!memory.done())
    return absl::InvalidArgumentError(
        absl::StrCat("schedule of ", schedule.size(), " operations ends without computing delta^0"));
  run.recomputed_forwards = forwards - std::min<size_t>(forwards, size_t(chain.loss_stage()));
  return run;
}

ChainSchedule StoreAllSchedule(const Chain& chain) {
  ChainSchedule schedule;
  for (int l = 1; l <= chain.loss_stage(); ++l) schedule.push_back(ChainOp::ForwardAll(l));
  for (int l = chain.loss_stage(); l >= 1; --l) schedule.push_back(ChainOp::Backward(l));
  return schedule;
}

uint64_t StoreAllPeakBytes(const Chain& chain) {
  auto run = ExecuteSchedule(chain, StoreAllSchedule(chain));
  return run.ok() ? run->peak_bytes : 0;  // the store-all schedule is always valid
}

}  // namespace dtr::sim
