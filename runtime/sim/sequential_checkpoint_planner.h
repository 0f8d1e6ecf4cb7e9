// PyTorch's checkpoint_sequential (Chen et al.'s sqrt(N) checkpointing) as a schedule in Rotor's
// operation set, so that it can be measured by the same executor as the Rotor optimum: with k =
// ceil(sqrt(L)) segments ("sqrt"), and with the cheapest k that fits a budget ("best k").
//
// Note [Sequential checkpoint schedule]
//   The stages are cut into k consecutive segments; the last one always ends with the loss stage
//   L+1 (Note [Loss stage]). Forward: each segment but the last runs under checkpoint(), i.e.
//   without grad keeping only its input: F_ck^b F_none^{b+1} .. F_none^e for segment [b, e]; the
//   last runs recorded: F_all^b .. F_all^{L+1}, then B^{L+1} .. B^b. Backward: every earlier
//   segment, last to first, is recomputed recorded from its kept input and backpropagated:
//   F_all^b .. F_all^e, B^e .. B^b. So every stage outside the last segment is computed twice.
//
// Note [Segmentations]
//   kPyTorch is torch.utils.checkpoint.checkpoint_sequential over the chain's L stages (the loss
//   is computed outside the nn.Sequential): every segment but the last has floor(L / k) stages
//   and the last takes the rest. kBalanced cuts the L+1 stages, loss included, at
//   round(i (L+1) / k), i = 1..k-1 (halves rounded up): segment lengths differ by at most one.
//   The numbers quoted for checkpoint_sequential in shared/design/baselines.md (Rotor's toy
//   chain: 2 segments 46.13 ms / 102.32 MB, 3: 48.23 / 97.45, 4: 48.23 / 92.78) are kBalanced's;
//   kPyTorch gives 43.62 / 91.66, 46.13 / 92.78 and 43.62 / 106.97 there (segments 1-3|4-6,
//   1-2|3-4|5-6 and 1|2|3|4-6).
#ifndef DTR_RUNTIME_SIM_SEQUENTIAL_CHECKPOINT_PLANNER_H_
#define DTR_RUNTIME_SIM_SEQUENTIAL_CHECKPOINT_PLANNER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/sim/chain.h"
#include "runtime/sim/chain_schedule.h"

namespace dtr::sim {

enum class Segmentation { kPyTorch, kBalanced };

absl::StatusOr<Segmentation> ParseSegmentation(absl::string_view name);  // "pytorch", "balanced"
absl::string_view SegmentationName(Segmentation segmentation);

// The k segments as inclusive stage ranges [first, last]; the last range ends at L+1 (the loss).
// InvalidArgument unless 1 <= segments <= L.
absl::StatusOr<std::vector<std::pair<int, int>>> CheckpointSegments(const Chain& chain, int segments,
                                                                    Segmentation segmentation);

// Note [Sequential checkpoint schedule] for those segments.
absl::StatusOr<ChainSchedule> SequentialCheckpointSchedule(const Chain& chain, int segments, Segmentation segmentation);

struct SequentialPlan {
  int segments = 0;
  ChainSchedule schedule;
  ScheduleRun run;  // makespan and exact peak
};

// checkpoint_sequential with `segments` segments, whatever its peak.
absl::StatusOr<SequentialPlan> PlanSequential(const Chain& chain, int segments, Segmentation segmentation);

// ceil(sqrt(L)), the classic choice.
int SqrtSegments(const Chain& chain);

// The k in 1..L with the least makespan among those whose peak fits in budget_bytes (ties: the
// smaller peak, then fewer segments). ResourceExhausted, naming the smallest peak of any k, when
// none fits.
absl::StatusOr<SequentialPlan> PlanBestSequential(const Chain& chain, uint64_t budget_bytes, Segmentation segmentation);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_SEQUENTIAL_CHECKPOINT_PLANNER_H_
