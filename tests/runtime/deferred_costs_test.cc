// DeferredCosts against fake events: corrections arrive in order, only for completed events,
// never by waiting; overflow and discards release every event.
#include "runtime/deferred_costs.h"

#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace dtr {
namespace {

class FakeEvents : public CostEventSource {
 public:
  uint64_t next = 1;
  double clock = 0;
  std::map<uint64_t, double> time;  // live events: when they were recorded
  std::map<uint64_t, bool> done;
  uint64_t Record() override {
    time[next] = clock;
    done[next] = false;
    return next++;
  }
  bool Done(uint64_t e) override { return done.at(e); }
  double ElapsedNs(uint64_t a, uint64_t b) override { return time.at(b) - time.at(a); }
  void Release(uint64_t e) override {
    ASSERT_EQ(time.erase(e), 1u) << "event released twice or unknown";
    done.erase(e);
  }
  void CompleteUpTo(uint64_t e) {
    for (auto& [id, d] : done)
      if (id <= e) d = true;
  }
};

OpId Op(uint32_t i) { return OpId{i, 1}; }

TEST(DeferredCostsTest, CorrectionsArriveInOrderOnlyForCompletedOps) {
  FakeEvents ev;
  DeferredCosts dc(&ev);
  std::vector<std::pair<OpId, double>> applied;
  auto apply = [&](OpId op, double d) { applied.emplace_back(op, d); };
  for (uint32_t i = 0; i < 3; ++i) {
    DeferredCosts::Span s = dc.Begin();
    ev.clock += 10.0 * (i + 1);  // kernel times 10, 20, 30
    dc.End(s);
    dc.Submit(Op(i), s, /*provisional_ns=*/1);
  }
  EXPECT_EQ(dc.Poll(apply), 0u);  // nothing completed: nothing waits, nothing applied
  ev.CompleteUpTo(4);             // ops 0 and 1 (events 1-4)
  EXPECT_EQ(dc.Poll(apply), 2u);
  ASSERT_EQ(applied.size(), 2u);
  EXPECT_EQ(applied[0].first, Op(0));
  EXPECT_DOUBLE_EQ(applied[0].second, 9);
  EXPECT_DOUBLE_EQ(applied[1].second, 19);
  ev.CompleteUpTo(6);
  EXPECT_EQ(dc.Poll(apply), 1u);
  EXPECT_DOUBLE_EQ(applied[2].second, 29);
  EXPECT_EQ(dc.pending(), 0u);
  EXPECT_TRUE(ev.time.empty());  // every event released
  EXPECT_EQ(dc.stats().resolved, 3u);
  EXPECT_DOUBLE_EQ(dc.stats().corrected_ns, 57);
}

TEST(DeferredCostsTest, AnIncompleteOldOpHoldsBackLaterOnes) {
  FakeEvents ev;
  DeferredCosts dc(&ev);
  int applied = 0;
  for (uint32_t i = 0; i < 2; ++i) {
    DeferredCosts::Span s = dc.Begin();
    dc.End(s);
    dc.Submit(Op(i), s, 0);
  }
  ev.done[4] = true;  // the second op's end, not the first's
  EXPECT_EQ(dc.Poll([&](OpId, double) { ++applied; }), 0u);
  EXPECT_EQ(applied, 0);
}

TEST(DeferredCostsTest, OverflowAndDiscardReleaseEvents) {
  FakeEvents ev;
  {
    DeferredCosts dc(&ev, /*max_pending=*/2);
    for (uint32_t i = 0; i < 5; ++i) {
      DeferredCosts::Span s = dc.Begin();
      dc.End(s);
      if (i == 4) dc.Discard(s);
      else dc.Submit(Op(i), s, 0);
    }
    EXPECT_EQ(dc.pending(), 2u);
    EXPECT_EQ(dc.stats().overflowed, 2u);
    EXPECT_EQ(ev.time.size(), 4u);  // two pending ops' pairs
  }
  EXPECT_TRUE(ev.time.empty());  // the destructor released the rest
}

TEST(DeferredCostsTest, NoEventsMeansProvisionalCostsStay) {
  class NoEvents : public CostEventSource {
    uint64_t Record() override { return 0; }
    bool Done(uint64_t) override { return true; }
    double ElapsedNs(uint64_t, uint64_t) override { return 0; }
    void Release(uint64_t) override { ADD_FAILURE(); }
  } none;
  DeferredCosts dc(&none);
  DeferredCosts::Span s = dc.Begin();
  dc.End(s);
  dc.Submit(Op(0), s, 5);
  EXPECT_EQ(dc.pending(), 0u);
  EXPECT_EQ(dc.Poll([](OpId, double) { ADD_FAILURE(); }), 0u);
}

}  // namespace
}  // namespace dtr
