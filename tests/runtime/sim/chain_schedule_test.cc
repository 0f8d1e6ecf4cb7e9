// Tests for the chain schedule executor (Note [Chain operation semantics]): the paper's own
// sequences reproduce its makespans and peaks, and invalid schedules are rejected.
#include "runtime/sim/chain_schedule.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/sim/rotor_toy_chain.h"

namespace dtr::sim {
namespace {

using ::testing::HasSubstr;
using testing::kMiBTolerance;
using testing::MiB;
using testing::RotorToyChain;
using testing::ToMiB;

ChainSchedule MustParse(const std::string& text) {
  auto schedule = ParseSchedule(text);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? *schedule : ChainSchedule{};
}

// A chain whose sizes are distinct powers of two, so peaks identify exactly what was held.
Chain TinyChain(int stages) {
  Chain chain;
  chain.input_bytes = 1;
  for (int l = 1; l <= stages; ++l) {
    ChainStage s;
    s.name = "s" + std::to_string(l);
    s.forward_cost = l;
    s.backward_cost = 10 * l;
    s.activation_bytes = uint64_t(1) << (4 * l - 2);
    s.saved_for_backward_bytes = uint64_t(3) << (4 * l - 2);
    s.forward_overhead_bytes = 0;
    s.backward_overhead_bytes = 0;
    chain.stages.push_back(s);
  }
  return chain;
}

TEST(ChainSchedule, StoreAllOnToyChainMatchesThePaper) {
  const Chain chain = RotorToyChain();
  auto run = ExecuteSchedule(chain, StoreAllSchedule(chain));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->makespan, testing::kStoreAllMakespanMs, 1e-9);
  EXPECT_NEAR(ToMiB(run->peak_bytes), testing::kStoreAllPeakMiB, kMiBTolerance);
  EXPECT_EQ(run->peak_bytes, StoreAllPeakBytes(chain));
  // "The peak memory is reached when computing B^5": F_all^1..7 are operations 0..6, B^7 is 7.
  EXPECT_EQ(run->peak_op, 9u);
  EXPECT_EQ(run->recomputed_forwards, 0u);
}

TEST(ChainSchedule, PapersNinetyMegabyteSequenceMatchesItsFigure2) {
  // Section 3.2's optimal sequence for M = 90 MB: makespan 47.4 ms, peak 86.8 MB at B^5.
  const Chain chain = RotorToyChain();
  const ChainSchedule schedule = MustParse(
      "F_ck^1 F_∅^2 F_∅^3 F_all^4 F_all^5 F_all^6 F_all^7 B^7 B^6 B^5 B^4 "
      "F_ck^1 F_∅^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1");
  auto run = ExecuteSchedule(chain, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->makespan, 47.42, 1e-9);
  EXPECT_NEAR(ToMiB(run->peak_bytes), testing::kPeakAt90MiB, kMiBTolerance);
  EXPECT_EQ(ChainOpToString(schedule[run->peak_op]), "B^5");
  EXPECT_EQ(run->recomputed_forwards, 5u);  // F^1 twice, F^2 twice, F^3 once
}

TEST(ChainSchedule, Section33SequencesAreValid) {
  // The three valid L = 4 sequences of the paper's Section 3.3 (stage 5 is the loss).
  const Chain chain = TinyChain(4);
  for (const char* text : {
           "F_ck^1 F_none^2 F_ck^3 F_all^4 F_all^5 B^5 B^4 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1",
           "F_ck^1 F_none^2 F_ck^3 F_ck^4 F_all^5 B^5 F_all^4 B^4 F_all^3 B^3 F_ck^1 F_all^2 B^2 F_all^1 B^1",
           "F_ck^1 F_none^2 F_all^3 F_ck^4 F_all^5 B^5 F_all^4 B^4 B^3 F_all^1 F_all^2 B^2 B^1",
       }) {
    auto run = ExecuteSchedule(chain, MustParse(text));
    EXPECT_TRUE(run.ok()) << text << ": " << run.status();
  }
}

TEST(ChainSchedule, MemoryFollowsTableOne) {
  const Chain chain = TinyChain(2);  // a^0 = 1, a^1 = 4, abar^1 = 12, a^2 = 64, abar^2 = 192
  ChainMemory memory(chain);
  EXPECT_EQ(memory.held_bytes(), 1u);
  // F_ck^1 keeps a^0 and adds a^1.
  auto during = memory.Apply(ChainOp::ForwardCheckpoint(1));
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(*during, 1u + 4);
  // F_none^2 replaces a^1 by a^2; while it runs both are held.
  during = memory.Apply(ChainOp::ForwardNoSave(2));
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(*during, 1u + 4 + 64);
  EXPECT_EQ(memory.held_bytes(), 1u + 64);
  EXPECT_FALSE(memory.holds_activation(1));
  // F_all^3 is the loss: zero size. B^3 needs a^2 (held on its own) and consumes it.
  ASSERT_TRUE(memory.Apply(ChainOp::ForwardAll(3)).ok());
  during = memory.Apply(ChainOp::Backward(3));
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(*during, 1u + 64 + 64);  // held + delta^2 (the size of a^2)
  EXPECT_FALSE(memory.holds_activation(2));
  EXPECT_TRUE(memory.holds_gradient(2));
  EXPECT_EQ(memory.held_bytes(), 1u + 64);
  // Recompute with F_all^1 F_all^2: B^2 uses a^1 inside abar^1 and keeps abar^1.
  ASSERT_TRUE(memory.Apply(ChainOp::ForwardAll(1)).ok());
  ASSERT_TRUE(memory.Apply(ChainOp::ForwardAll(2)).ok());
  during = memory.Apply(ChainOp::Backward(2));
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(*during, 1u + 12 + 192 + 64 + 4);
  EXPECT_TRUE(memory.holds_saved_for_backward(1));
  EXPECT_FALSE(memory.holds_saved_for_backward(2));
  EXPECT_EQ(memory.held_bytes(), 1u + 12 + 4);
  // B^1 consumes a^0 (on its own) and abar^1, leaving delta^0.
  ASSERT_TRUE(memory.Apply(ChainOp::Backward(1)).ok());
  EXPECT_TRUE(memory.done());
  EXPECT_EQ(memory.held_bytes(), 1u);
}

struct InvalidSchedule {
  const char* schedule;
  const char* message;
};

TEST(ChainSchedule, RejectsInvalidSchedules) {
  const Chain chain = TinyChain(3);  // stages 1..3, loss 4
  const InvalidSchedule cases[] = {
      {"B^4", "schedule operation 0: B^4 needs abar^4"},
      {"F_all^1 F_none^2", "operation 1: F_none^2 needs a^1 on its own"},
      {"F_all^2", "F_all^2 needs a^1"},
      {"F_ck^1 F_ck^1", "operation 1: F_ck^1 produces a^1, which is already in memory"},
      {"F_all^1 F_all^1", "produces abar^1"},
      {"F_all^1 F_all^2 F_all^3 F_all^4 B^4 B^2", "operation 5: B^2 needs delta^2"},
      {"F_none^1 F_all^2 F_all^3 F_all^4 B^4 B^3 B^2 F_all^1", "operation 7: F_all^1 needs a^0"},
      {"F_none^1 F_all^2 F_all^3 F_all^4 B^4 B^3 B^2 B^1", "operation 7: B^1 needs abar^1"},
      {"F_all^5", "F_all^5: no such stage"},
      {"F_all^1 F_all^2 F_all^3 F_all^4 B^4 B^3 B^2", "ends without computing delta^0"},
      {"", "ends without computing delta^0"},
  };
  for (const InvalidSchedule& c : cases) {
    auto run = ExecuteSchedule(chain, MustParse(c.schedule));
    ASSERT_FALSE(run.ok()) << "accepted: " << c.schedule;
    EXPECT_TRUE(absl::IsInvalidArgument(run.status()));
    EXPECT_THAT(std::string(run.status().message()), HasSubstr(c.message)) << c.schedule;
  }
}

TEST(ChainSchedule, FailedOperationLeavesMemoryUnchanged) {
  const Chain chain = TinyChain(2);
  ChainMemory memory(chain);
  const uint64_t key = memory.StateKey();
  EXPECT_FALSE(memory.Apply(ChainOp::Backward(1)).ok());
  EXPECT_FALSE(memory.Apply(ChainOp::ForwardNoSave(2)).ok());
  EXPECT_EQ(memory.StateKey(), key);
  EXPECT_EQ(memory.held_bytes(), 1u);
}

TEST(ChainSchedule, ParsePrintRoundTripsAndRejectsJunk) {
  const std::string text = "F_ck^1 F_none^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1";
  EXPECT_EQ(ScheduleToString(MustParse(text)), text);
  EXPECT_EQ(ScheduleToString(MustParse("F_∅^2,B^1\n")), "F_none^2 B^1");
  for (const char* junk : {"X^1", "F_all^0", "F_all^", "B^x", "F_ck"}) {
    EXPECT_FALSE(ParseSchedule(junk).ok()) << junk;
  }
}

}  // namespace
}  // namespace dtr::sim
