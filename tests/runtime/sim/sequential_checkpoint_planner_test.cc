// Tests for checkpoint_sequential as a chain schedule: the balanced segmentation reproduces
// shared/design/baselines.md on Rotor's toy chain, the PyTorch one matches
// torch.utils.checkpoint.checkpoint_sequential's cuts, and no segmentation beats Rotor's optimum.
#include "runtime/sim/sequential_checkpoint_planner.h"

#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/sim/rotor_planner.h"
#include "tests/runtime/sim/rotor_toy_chain.h"

namespace dtr::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kMiBTolerance;
using testing::MiB;
using ::testing::Pair;
using testing::RotorToyChain;
using testing::ToMiB;

Chain UniformChain(int stages) {
  Chain chain;
  chain.input_bytes = 10;
  for (int l = 1; l <= stages; ++l) {
    ChainStage s;
    s.name = "s" + std::to_string(l);
    s.forward_cost = 1;
    s.backward_cost = 2;
    s.activation_bytes = 10;
    s.saved_for_backward_bytes = 30;
    s.backward_overhead_bytes = 5;
    chain.stages.push_back(s);
  }
  return chain;
}

struct SequentialReference {
  int segments;
  double makespan_ms, peak_mib;
};

void ExpectPlansMatch(const Chain& chain, Segmentation segmentation,
                      std::initializer_list<SequentialReference> references) {
  for (const SequentialReference& reference : references) {
    auto plan = PlanSequential(chain, reference.segments, segmentation);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NEAR(plan->run.makespan, reference.makespan_ms, 1e-9) << reference.segments;
    EXPECT_NEAR(ToMiB(plan->run.peak_bytes), reference.peak_mib, kMiBTolerance) << reference.segments;
  }
}

TEST(SequentialCheckpoint, BalancedSegmentsReproduceBaselines) {
  // baselines.md: 2 segments 46.13 ms / 102.32 MB; 3: 48.23 / 97.45; 4: 48.23 / 92.78.
  const Chain chain = RotorToyChain();
  ExpectPlansMatch(chain, Segmentation::kBalanced, {{2, 46.13, 102.32}, {3, 48.23, 97.45}, {4, 48.23, 92.78}});
  // The cuts behind them: round(i * 7 / k) over the 7 stages, loss included.
  EXPECT_THAT(*CheckpointSegments(chain, 2, Segmentation::kBalanced), ElementsAre(Pair(1, 4), Pair(5, 7)));
  EXPECT_THAT(*CheckpointSegments(chain, 3, Segmentation::kBalanced), ElementsAre(Pair(1, 2), Pair(3, 5), Pair(6, 7)));
  EXPECT_THAT(*CheckpointSegments(chain, 4, Segmentation::kBalanced),
              ElementsAre(Pair(1, 2), Pair(3, 4), Pair(5, 5), Pair(6, 7)));
}

TEST(SequentialCheckpoint, PyTorchSegmentsOnTheToyChain) {
  const Chain chain = RotorToyChain();
  EXPECT_THAT(*CheckpointSegments(chain, 2, Segmentation::kPyTorch), ElementsAre(Pair(1, 3), Pair(4, 7)));
  EXPECT_THAT(*CheckpointSegments(chain, 3, Segmentation::kPyTorch), ElementsAre(Pair(1, 2), Pair(3, 4), Pair(5, 7)));
  EXPECT_THAT(*CheckpointSegments(chain, 4, Segmentation::kPyTorch),
              ElementsAre(Pair(1, 1), Pair(2, 2), Pair(3, 3), Pair(4, 7)));
  ExpectPlansMatch(chain, Segmentation::kPyTorch, {{2, 43.62, 91.66}, {3, 46.13, 92.78}, {4, 43.62, 106.97}});
}

TEST(SequentialCheckpoint, ScheduleShape) {
  const Chain chain = UniformChain(5);
  auto schedule = SequentialCheckpointSchedule(chain, 2, Segmentation::kPyTorch);  // 1-2 | 3-6
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(ScheduleToString(*schedule),
            "F_ck^1 F_none^2 F_all^3 F_all^4 F_all^5 F_all^6 B^6 B^5 B^4 B^3 F_all^1 F_all^2 B^2 B^1");
  // One segment is the store-all schedule.
  auto one = SequentialCheckpointSchedule(chain, 1, Segmentation::kPyTorch);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, StoreAllSchedule(chain));
}

TEST(SequentialCheckpoint, SqrtSegments) {
  EXPECT_EQ(SqrtSegments(UniformChain(1)), 1);
  EXPECT_EQ(SqrtSegments(UniformChain(4)), 2);
  EXPECT_EQ(SqrtSegments(UniformChain(5)), 3);
  EXPECT_EQ(SqrtSegments(RotorToyChain()), 3);
  EXPECT_EQ(SqrtSegments(UniformChain(9)), 3);
  EXPECT_EQ(SqrtSegments(UniformChain(10)), 4);
}

TEST(SequentialCheckpoint, BestSegmentCountIsTheCheapestThatFits) {
  const Chain chain = RotorToyChain();
  // At 93 MiB (balanced: k = 2 and 3 peak above it, k = 4 at 92.78 MB) the winner fits and no
  // fitting k is cheaper.
  auto best = PlanBestSequential(chain, MiB(93), Segmentation::kBalanced);
  ASSERT_TRUE(best.ok()) << best.status();
  for (int k = 1; k <= chain.length(); ++k) {
    auto plan = PlanSequential(chain, k, Segmentation::kBalanced);
    ASSERT_TRUE(plan.ok());
    if (plan->run.peak_bytes <= MiB(93)) {
      EXPECT_LE(best->run.makespan, plan->run.makespan + 1e-9) << k;
    }
  }
  EXPECT_LE(best->run.peak_bytes, MiB(93));
  // With room for everything, one segment (no recomputation) wins.
  auto roomy = PlanBestSequential(chain, MiB(200), Segmentation::kPyTorch);
  ASSERT_TRUE(roomy.ok());
  EXPECT_EQ(roomy->segments, 1);
  EXPECT_NEAR(roomy->run.makespan, 37.38, 1e-9);
  // Below every segment count's peak: ResourceExhausted naming the smallest.
  auto none = PlanBestSequential(chain, MiB(50), Segmentation::kPyTorch);
  ASSERT_TRUE(absl::IsResourceExhausted(none.status())) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("the smallest peak is"));
}

TEST(SequentialCheckpoint, RejectsBadSegmentCounts) {
  const Chain chain = UniformChain(3);
  for (int k : {0, -1, 4}) {
    EXPECT_TRUE(absl::IsInvalidArgument(PlanSequential(chain, k, Segmentation::kPyTorch).status())) << k;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseSegmentation("even").status()));
  EXPECT_EQ(*ParseSegmentation("balanced"), Segmentation::kBalanced);
  EXPECT_EQ(SegmentationName(Segmentation::kPyTorch), "pytorch");
}

TEST(SequentialCheckpoint, NeverBeatsRotorAtItsOwnPeak) {
  // checkpoint_sequential's schedules are persistent, so Rotor's exact optimum within the same
  // peak is at least as fast.
  std::mt19937 rng(7);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  RotorOptions exact;
  exact.slots = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Chain chain;
    chain.input_bytes = uint64_t(uniform(1, 50));
    for (int l = 1, n = uniform(1, 12); l <= n; ++l) {
      ChainStage s;
      s.name = "s" + std::to_string(l);
      s.forward_cost = uniform(1, 20);
      s.backward_cost = uniform(1, 40);
      s.activation_bytes = uint64_t(uniform(1, 50));
      s.saved_for_backward_bytes = s.activation_bytes + uint64_t(uniform(0, 100));
      s.forward_overhead_bytes = uint64_t(uniform(0, 20));
      s.backward_overhead_bytes = uint64_t(uniform(0, 60));
      chain.stages.push_back(s);
    }
    for (Segmentation segmentation : {Segmentation::kPyTorch, Segmentation::kBalanced}) {
      for (int k = 1; k <= chain.length(); ++k) {
        auto plan = PlanSequential(chain, k, segmentation);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->run.recomputed_forwards, size_t(CheckpointSegments(chain, k, segmentation)->back().first - 1));
        auto rotor = PlanRotor(chain, plan->run.peak_bytes, exact);
        ASSERT_TRUE(rotor.ok()) << rotor.status();
        EXPECT_LE(rotor->makespan, plan->run.makespan + 1e-9) << ChainToString(chain) << k;
      }
    }
  }
}

}  // namespace
}  // namespace dtr::sim
