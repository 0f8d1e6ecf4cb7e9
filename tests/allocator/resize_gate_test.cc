// Tests for ResizeGate (Note [Undone resizes], allocator/resize_gate.h): a resize is undone only
// when its old size is asked for again within the segment's idle time, resizing stops once more
// than half of the recent ones were undone, the counts decay, and only a reset starts afresh.
#include "allocator/resize_gate.h"

#include "gtest/gtest.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

TEST(ResizeGateTest, AResizeIsUndoneOnlyWhenItsSizeComesBackWithinTheIdleTime) {
  ResizeGate gate;
  gate.OnResize(/*old_size=*/4096, /*within=*/10, /*now=*/100);
  gate.OnMiss(4096, 110);                                                // 10 later: undone
  EXPECT_EQ(gate.undone(), 1);
  gate.OnResize(4096, 20, 120);
  gate.OnMiss(4096, 141);         // 21 later: a new need, not an undone resize
  EXPECT_EQ(gate.undone(), 1);
  gate.OnMiss(4096, 142);  // already accounted for
  gate.OnMiss(8192, 142);  // never resized away
  EXPECT_EQ(gate.resized(), 2);
  EXPECT_EQ(gate.undone(), 1);
  DTR_EXPECT_OK(gate.CheckInvariants(142));
}

// One resize of `size`, after the segment had gone `idle` hand-outs unused, and the next miss of
// that size `later` hand-outs after it (undone when later <= idle).
void ResizeThenMiss(ResizeGate& gate, uint64_t& now, size_t size, uint64_t idle, uint64_t later) {
  gate.OnResize(size, idle, now);
  now += later;
  gate.OnMiss(size, now);
  ++now;
}

TEST(ResizeGateTest, StopsOnceMoreThanHalfAreUndoneUntilReset) {
  ResizeGate gate;
  uint64_t now = 1000;
  ResizeThenMiss(gate, now, 1536, 10, 50);  // kept
  ResizeThenMiss(gate, now, 512, 10, 5);    // undone
  EXPECT_TRUE(gate.Allowed()) << "half undone";
  ResizeThenMiss(gate, now, 1024, 10, 5);
  EXPECT_EQ(gate.resized(), 3);
  EXPECT_EQ(gate.undone(), 2);
  EXPECT_FALSE(gate.Allowed()) << "2 of 3 undone";
  DTR_EXPECT_OK(gate.CheckInvariants(now));
  // Stopped, misses change nothing.
  for (int i = 0; i < 4 * ResizeGate::kWindow; ++i) gate.OnMiss(4096 + 512 * static_cast<size_t>(i), now++);
  EXPECT_FALSE(gate.Allowed());
  gate.Reset();
  EXPECT_EQ(gate.resized(), 0);
  EXPECT_TRUE(gate.Allowed());
  ResizeThenMiss(gate, now, 512, 10, 5);
  EXPECT_FALSE(gate.Allowed()) << "the first resize undone";
}

TEST(ResizeGateTest, CountsAreHalvedEveryWindow) {
  ResizeGate gate;
  uint64_t now = 1000;
  for (int i = 0; i < ResizeGate::kWindow; ++i) {
    ResizeThenMiss(gate, now, 512 * static_cast<size_t>(1 + i), 10, i % 4 == 0 ? 5 : 50);  // a quarter undone
  }
  EXPECT_EQ(gate.resized(), ResizeGate::kWindow / 2);
  EXPECT_EQ(gate.undone(), ResizeGate::kWindow / 4 / 2);
  EXPECT_TRUE(gate.Allowed());
  DTR_EXPECT_OK(gate.CheckInvariants(now));
}

TEST(ResizeGateTest, SizesThatChangeFromBatchToBatchKeepItOpen) {
  // Last batch's sizes are resized into this batch's, and come back only batches later.
  ResizeGate gate;
  uint64_t now = 1000;
  for (int batch = 0; batch < 500; ++batch) {
    const size_t size = 512 * (1 + batch % 17);
    gate.OnMiss(size, now);
    ASSERT_TRUE(gate.Allowed()) << "batch " << batch;
    gate.OnResize(512 * (1 + (batch + 16) % 17), 40, now);
    now += 50;
    DTR_ASSERT_OK(gate.CheckInvariants(now));
  }
  EXPECT_EQ(gate.undone(), 0);
}

}  // namespace
}  // namespace dtr::alloc
