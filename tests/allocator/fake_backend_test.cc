// Tests for the simulated backend used by the allocator tests.
#include "allocator/fake_backend.h"

#include "gtest/gtest.h"

namespace dtr::alloc {
namespace {

TEST(FakeBackendTest, HandsOutDisjointAlignedAddressesAndCounts) {
  FakeBackend backend(/*capacity_bytes=*/10000, /*alignment=*/512);
  absl::StatusOr<void*> a = backend.Allocate(1000);
  absl::StatusOr<void*> b = backend.Allocate(4000);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto pa = reinterpret_cast<uintptr_t>(*a), pb = reinterpret_cast<uintptr_t>(*b);
  EXPECT_EQ(pa % 512, 0u);
  EXPECT_EQ(pb % 512, 0u);
  EXPECT_GT(pb, pa + 1000);  // not contiguous either
  EXPECT_EQ(backend.counters().live_bytes, 5000u);
  EXPECT_EQ(backend.Allocate(6000).status().code(), absl::StatusCode::kResourceExhausted);
  backend.Free(*a, 1000);
  backend.Free(*b, 999);  // wrong size: flagged
  FakeBackend::Counters c = backend.counters();
  EXPECT_EQ(c.allocate_calls, 3);
  EXPECT_EQ(c.failed_allocations, 1);
  EXPECT_EQ(c.bad_frees, 1);
  EXPECT_EQ(c.live_bytes, 4000u);
  EXPECT_EQ(c.peak_live_bytes, 5000u);
}

TEST(FakeBackendTest, FailsTheNthAllocation) {
  FakeBackend backend;
  backend.FailNthAllocation(2);
  EXPECT_TRUE(backend.Allocate(512).ok());
  EXPECT_EQ(backend.Allocate(512).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(backend.Allocate(512).ok());
  backend.FailNextAllocations(2);
  EXPECT_FALSE(backend.Allocate(512).ok());
  EXPECT_FALSE(backend.Allocate(512).ok());
  EXPECT_TRUE(backend.Allocate(512).ok());
}

TEST(FakeBackendTest, EventsCompleteOnlyWhenTold) {
  FakeBackend backend;
  EventHandle e1 = *backend.RecordEvent(Stream{1});
  EventHandle e2 = *backend.RecordEvent(Stream{2});
  EXPECT_FALSE(backend.EventDone(e1));
  EXPECT_EQ(backend.StreamsWithPendingEvents(), (std::vector<Stream>{Stream{1}, Stream{2}}));
  backend.CompleteEvents(Stream{1});
  EXPECT_TRUE(backend.EventDone(e1));
  EXPECT_FALSE(backend.EventDone(e2));
  backend.DestroyEvent(e1);
  backend.DestroyEvent(e2);
  EXPECT_EQ(backend.counters().live_events, 0);
  backend.set_auto_complete_events(true);
  EXPECT_TRUE(backend.EventDone(*backend.RecordEvent(Stream{3})));
  backend.set_fail_record_event(true);
  EXPECT_FALSE(backend.RecordEvent(Stream{3}).ok());
}

}  // namespace
}  // namespace dtr::alloc
