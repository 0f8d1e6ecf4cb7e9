// checkpoint_sequential as a chain schedule; see Note [Sequential checkpoint schedule] and
// Note [Segmentations] in sequential_checkpoint_planner.h.
#include "runtime/sim/sequential_checkpoint_planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/bytes.h"

namespace dtr::sim {

absl::StatusOr<Segmentation> ParseSegmentation(absl::string_view name) {
  if (name == "pytorch") return Segmentation::kPyTorch;
  if (name == "balanced") return Segmentation::kBalanced;
  return absl::InvalidArgumentError(absl::StrCat("unknown segmentation '", name, "' (pytorch, balanced)"));
}

absl::string_view SegmentationName(Segmentation segmentation) {
  return segmentation == Segmentation::kPyTorch ? "pytorch" : "balanced";
}

absl::StatusOr<std::vector<std::pair<int, int>>> CheckpointSegments(const Chain& chain, int segments,
                                                                    Segmentation segmentation) {
  const int stages = chain.length();
  if (segments < 1 || segments > stages)
    return absl::InvalidArgumentError(
        absl::StrCat("segments must be in 1..", stages, " for a chain of ", stages, " stages, got ", segments));
  // cuts[i] = the last stage of segment i; the last segment ends with the loss.
  std::vector<int> cuts;
  if (segmentation == Segmentation::kPyTorch) {
    const int size = stages / segments;
    for (int i = 1; i < segments; ++i) cuts.push_back(i * size);
  } else {
    const int64_t n = chain.loss_stage();
    for (int64_t i = 1; i < segments; ++i) cuts.push_back(int((2 * i * n + segments) / (2 * int64_t(segments))));
  }
  cuts.push_back(chain.loss_stage());
  std::vector<std::pair<int, int>> ranges;
  int first = 1;
  for (int last : cuts) {
    ranges.emplace_back(first, last);
    first = last + 1;
  }
  return ranges;
}

absl::StatusOr<ChainSchedule> SequentialCheckpointSchedule(const Chain& chain, int segments,
                                                           Segmentation segmentation) {
  auto ranges = CheckpointSegments(chain, segments, segmentation);
  if (!ranges.ok()) return ranges.status();
  ChainSchedule schedule;
  auto recorded_forward_and_backward = [&](int first, int last) {
    for (int l = first; l <= last; ++l) schedule.push_back(ChainOp::ForwardAll(l));
    for (int l = last; l >= first; --l) schedule.push_back(ChainOp::Backward(l));
  };
  for (size_t i = 0; i + 1 < ranges->size(); ++i) {
    const auto [first, last] = (*ranges)[i];
    schedule.push_back(ChainOp::ForwardCheckpoint(first));
    for (int l = first + 1; l <= last; ++l) schedule.push_back(ChainOp::ForwardNoSave(l));
  }
  recorded_forward_and_backward(ranges->back().first, ranges->back().second);
  for (size_t i = ranges->size() - 1; i-- > 0;) recorded_forward_and_backward((*ranges)[i].first, (*ranges)[i].second);
  return schedule;
}

absl::StatusOr<SequentialPlan> PlanSequential(const Chain& chain, int segments, Segmentation segmentation) {
  SequentialPlan plan;
  plan.segments = segments;
  auto schedule = SequentialCheckpointSchedule(chain, segments, segmentation);
  if (!schedule.ok()) return schedule.status();
  plan.schedule = *std::move(schedule);
  auto run = ExecuteSchedule(chain, plan.schedule);
  if (!run.ok())
    return absl::InternalError(absl::StrCat("checkpoint_sequential schedule is invalid: ", run.status().message()));
  plan.run = *run;
  return plan;
}

int SqrtSegments(const Chain& chain) {
  int k = 1;
  while (k * k < chain.length()) ++k;
  return k;
}

absl::StatusOr<SequentialPlan> PlanBestSequential(const Chain& chain, uint64_t budget_bytes,
                                                  Segmentation segmentation) {
  bool found = false;
  SequentialPlan best;
  uint64_t smallest_peak = std::numeric_limits<uint64_t>::max();
  int smallest_peak_segments = 0;
  for (int k = 1; k <= chain.length(); ++k) {
    auto plan = PlanSequential(chain, k, segmentation);
    if (!plan.ok()) return plan.status();
    if (plan->run.peak_bytes < smallest_peak) {
      smallest_peak = plan->run.peak_bytes;
      smallest_peak_segments = k;
    }
    if (plan->run.peak_bytes > budget_bytes) continue;
    // Makespans equal up to float summation order count as ties.
    const double tolerance = 1e-12 * std::max(1.0, best.run.makespan);
    const bool better =
        !found || plan->run.makespan < best.run.makespan - tolerance ||
        (plan->run.makespan <= best.run.makespan + tolerance && plan->run.peak_bytes < best.run.peak_bytes);
    if (better) {
      best = *std::move(plan);
      found = true;
    }
  }
  if (!found)
    return absl::ResourceExhaustedError(absl::StrCat(
        "no checkpoint_sequential segment count fits in ", budget_bytes, " bytes: the smallest peak is ", smallest_peak,
        " bytes (", FormatBytesShort(smallest_peak), ") with ", smallest_peak_segments, " segments"));
  return best;
}

}  // namespace dtr::sim
