// Tests for ResizeGate (Note [Undone resizes], allocator/resize_gate.h): a resize is undone only
// when its old size is asked for again within the segment's idle time, resizing stops once more
// than half of the recent ones were undone, the counts decay, and a reset starts afresh.
#include "allocator/resize_gate.h"

#include "gtest/gtest.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

TEST(ResizeGateTest, AResizeIsUndoneOnlyWhenItsSizeComesBackWithinTheIdleTime) {
  ResizeGate gate;
  gate.OnResize(/*old_size=*/4096, /*last_hand_out=*/90, /*now=*/100);  // idle 10 hand-outs
  gate.OnMiss(4096, 110);                                                // 10 later: undone
  EXPECT_EQ(gate.undone(), 1);
  gate.OnResize(4096, 100, 120);  // idle 20
  gate.OnMiss(4096, 141);         // 21 later: a new need, not an undone resize
  EXPECT_EQ(gate.undone(), 1);
  gate.OnMiss(4096, 142);  // already accounted for
  gate.OnMiss(8192, 142);  // never resized away
  EXPECT_EQ(gate.resized(), 2);
  EXPECT_EQ(gate.undone(), 1);
  DTR_EXPECT_OK(gate.CheckInvariants(142));
}

TEST(ResizeGateTest, StopsWhenMostResizesAreUndoneAndStartsAgainAfterAReset) {
  ResizeGate gate;
  uint64_t now = 1;
  EXPECT_TRUE(gate.Allowed());
  // A step whose sizes repeat: every size taken is asked for again soon after.
  for (size_t size = 1; size <= 4 && gate.Allowed(); ++size) {
    gate.OnResize(size * 512, now - 1, now + 100);
    now += 101;
    gate.OnMiss(size * 512, now + 5);
    now += 5;
  }
  EXPECT_FALSE(gate.Allowed());
  EXPECT_GT(gate.undone() * 2, gate.resized());
  DTR_EXPECT_OK(gate.CheckInvariants(now));
  gate.Reset();
  EXPECT_TRUE(gate.Allowed());
  EXPECT_EQ(gate.resized(), 0);
}

TEST(ResizeGateTest, SizesThatChangeFromBatchToBatchKeepItOpen) {
  // Last batch's sizes are resized into this batch's, and come back only batches later.
  ResizeGate gate;
  uint64_t now = 1000;
  for (int batch = 0; batch < 500; ++batch) {
    const size_t size = 512 * (1 + batch % 17);
    gate.OnMiss(size, now);
    ASSERT_TRUE(gate.Allowed()) << "batch " << batch;
    gate.OnResize(512 * (1 + (batch + 16) % 17), now - 40, now);
    now += 50;
    DTR_ASSERT_OK(gate.CheckInvariants(now));
  }
  EXPECT_LT(gate.resized(), ResizeGate::kWindow) << "the counts decay";
  EXPECT_EQ(gate.undone(), 0);
}

}  // namespace
}  // namespace dtr::alloc
