// Unit tests for CachingAllocator on the fake backend: rounding, pools, split/coalesce, best fit,
// stream-ordered reuse, EmptyCache, each rung of the retry ladder, the OOM report, stats and
// fault injection.
#include "allocator/caching_allocator.h"

#include <functional>
#include <vector>

#include "allocator/fake_backend.h"
#include "allocator/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

using ::dtr::alloc::testing::Addr;
using ::dtr::alloc::testing::BudgetConfig;
using ::dtr::alloc::testing::kKiB;
using ::dtr::alloc::testing::kMiB;
using ::dtr::alloc::testing::MakeAllocator;
using ::testing::HasSubstr;

// States of the blocks of segment `i` of the snapshot.
std::vector<std::pair<size_t, BlockState>> Blocks(const CachingAllocator& allocator, size_t i) {
  MemorySnapshot snapshot = allocator.Snapshot();
  std::vector<std::pair<size_t, BlockState>> blocks;
  if (i >= snapshot.segments.size()) return blocks;
  for (const BlockSnapshot& b : snapshot.segments[i].blocks) blocks.emplace_back(b.size, b.state);
  return blocks;
}

constexpr BlockState kA = BlockState::kAllocated;
constexpr BlockState kF = BlockState::kFree;
constexpr BlockState kP = BlockState::kPendingEvents;

// An EvictionHandler driven by a lambda, recording its requests.
class LambdaHandler : public EvictionHandler {
 public:
  explicit LambdaHandler(std::function<EvictionResult(const EvictionRequest&)> fn,
                         size_t pinned = 0)
      : fn_(std::move(fn)), pinned_(pinned) {}
  EvictionResult MakeRoom(const EvictionRequest& request) override {
    requests.push_back(request);
    return fn_(request);
  }
  size_t PinnedBytes() const override { return pinned_; }
  std::vector<EvictionRequest> requests;

 private:
  std::function<EvictionResult(const EvictionRequest&)> fn_;
  size_t pinned_;
};

TEST(CachingAllocatorTest, CreateRejectsBadConfigAndBackend) {
  FakeBackend backend;
  AllocatorConfig bad;
  bad.min_block_size = 300;
  EXPECT_FALSE(CachingAllocator::Create(bad, &backend).ok());
  EXPECT_FALSE(CachingAllocator::Create(AllocatorConfig{}, nullptr).ok());
  FakeBackend odd(SIZE_MAX, /*alignment=*/384);
  EXPECT_FALSE(CachingAllocator::Create(AllocatorConfig{}, &odd).ok());
}

// Note [Block alignment]: cudaMalloc's 256-byte promise is below min_block_size (512); every
// block is then 256-aligned, and sizes still round to min_block_size.
TEST(CachingAllocatorTest, BackendAlignedBelowMinBlockSizeGivesBlocksItsAlignment) {
  FakeBackend cuda_like(SIZE_MAX, /*alignment=*/256, /*base=*/FakeBackend::kBaseAddress + 256);
  auto allocator = MakeAllocator(AllocatorConfig{}, &cuda_like);
  std::vector<void*> blocks;
  for (size_t bytes : {1, 700, 5000, 1 << 20, 3 << 20}) {
    void* p = *allocator->Allocate(bytes);
    EXPECT_EQ(Addr(p) % 256, 0u) << bytes;
    EXPECT_EQ(*allocator->BlockSize(p) % 512, 0u) << bytes;
    blocks.push_back(p);
  }
  for (void* p : blocks) ASSERT_TRUE(allocator->Free(p).ok());
  EXPECT_TRUE(allocator->CheckInvariants().ok());
}

TEST(CachingAllocatorTest, SmallRequestsAreRoundedAndShareASmallSegment) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(1);
  void* b = *allocator->Allocate(1000);
  void* c = *allocator->Allocate(0);
  EXPECT_EQ(Addr(b), Addr(a) + 512);
  EXPECT_EQ(Addr(c), Addr(b) + 1024);
  EXPECT_EQ(*allocator->BlockSize(a), 512u);
  EXPECT_EQ(*allocator->BlockSize(b), 1024u);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(2 * kMiB));
  EXPECT_EQ(stats.allocated_bytes.current, 2048);
  EXPECT_EQ(stats.requested_bytes.current, 1001);
  EXPECT_EQ(stats.segment_count.current, 1);
  EXPECT_EQ(backend.counters().allocate_calls, 1);
  MemorySnapshot snapshot = allocator->Snapshot();
  ASSERT_EQ(snapshot.segments.size(), 1u);
  EXPECT_EQ(snapshot.segments[0].pool, Pool::kSmall);
  EXPECT_EQ(Blocks(*allocator, 0),
            (std::vector<std::pair<size_t, BlockState>>{
                {512, kA}, {1024, kA}, {512, kA}, {2 * kMiB - 2048, kF}}));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Scratch memory] (runtime/runtime.cc): an op's workspace is the high-water mark above
// what it started and ended with; measuring it leaves the reported peak alone.
TEST(CachingAllocatorTest, HighWaterMarkMeasuresAWorkspaceWithoutTouchingThePeak) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* big = *allocator->Allocate(8192);
  DTR_EXPECT_OK(allocator->Free(big));  // peak 8 KiB
  void* input = *allocator->Allocate(1024);
  EXPECT_EQ(allocator->MarkHighWater(), 1024u);
  void* out = *allocator->Allocate(2048);
  void* workspace = *allocator->Allocate(4096);
  DTR_EXPECT_OK(allocator->Free(workspace));
  EXPECT_EQ(allocator->HighWaterSinceMark(), (std::pair<size_t, size_t>{1024 + 2048 + 4096, 1024 + 2048}));
  EXPECT_EQ(allocator->GetStats().allocated_bytes.peak, 8192);
  EXPECT_EQ(allocator->MarkHighWater(), 1024u + 2048);
  DTR_EXPECT_OK(allocator->Free(out));
  EXPECT_EQ(allocator->HighWaterSinceMark(), (std::pair<size_t, size_t>{1024 + 2048, 1024}));
  DTR_EXPECT_OK(allocator->Free(input));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, LargeRequestsUseTwentyMiBSegmentsOrRoundToTwoMiB) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(3 * kMiB);
  void* b = *allocator->Allocate(3 * kMiB);
  EXPECT_EQ(Addr(b), Addr(a) + 3 * kMiB);  // same 20 MiB segment
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(20 * kMiB));
  void* big = *allocator->Allocate(15 * kMiB);  // > 14 MiB tail: own 16 MiB segment
  EXPECT_EQ(*allocator->BlockSize(big), 16 * kMiB);  // 1 MiB rest is not split off
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(36 * kMiB));
  void* mid = *allocator->Allocate(11 * kMiB);  // >= 10 MiB but fits the cached 14 MiB tail
  EXPECT_EQ(Addr(mid), Addr(a) + 6 * kMiB);
  EXPECT_EQ(*allocator->BlockSize(mid), 11 * kMiB);  // 3 MiB rest split off
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(36 * kMiB));
  EXPECT_EQ(allocator->GetStats().requested_bytes.current, int64_t(32 * kMiB));
  EXPECT_EQ(backend.counters().allocate_calls, 2);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, SmallAndLargePoolsDoNotShareBlocks) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* large = *allocator->Allocate(2 * kMiB);
  DTR_ASSERT_OK(allocator->Free(large));
  void* small = *allocator->Allocate(4 * kKiB);  // 20 MiB free in the large pool, unused
  EXPECT_EQ(allocator->GetStats().segment_count.current, 2);
  EXPECT_EQ(allocator->Snapshot().segments[1].pool, Pool::kSmall);
  void* large2 = *allocator->Allocate(2 * kMiB);  // reuses the large segment
  EXPECT_EQ(large2, large);
  EXPECT_NE(small, nullptr);
  EXPECT_EQ(backend.counters().allocate_calls, 2);
}

TEST(CachingAllocatorTest, FreeCoalescesWithBothNeighbours) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(256 * kKiB);
  void* b = *allocator->Allocate(256 * kKiB);
  void* c = *allocator->Allocate(256 * kKiB);
  const size_t tail = 2 * kMiB - 768 * kKiB;
  DTR_ASSERT_OK(allocator->Free(b));
  EXPECT_EQ(Blocks(*allocator, 0), (std::vector<std::pair<size_t, BlockState>>{
                                       {256 * kKiB, kA}, {256 * kKiB, kF}, {256 * kKiB, kA},
                                       {tail, kF}}));
  EXPECT_EQ(*allocator->CoalescedFreeSizeIfFreed(a), 512 * kKiB);
  EXPECT_EQ(*allocator->CoalescedFreeSizeIfFreed(c), 512 * kKiB + tail);
  DTR_ASSERT_OK(allocator->Free(a));
  EXPECT_EQ(Blocks(*allocator, 0), (std::vector<std::pair<size_t, BlockState>>{
                                       {512 * kKiB, kF}, {256 * kKiB, kA}, {tail, kF}}));
  EXPECT_EQ(*allocator->CoalescedFreeSizeIfFreed(c), 2 * kMiB);
  DTR_ASSERT_OK(allocator->Free(c));
  EXPECT_EQ(Blocks(*allocator, 0),
            (std::vector<std::pair<size_t, BlockState>>{{2 * kMiB, kF}}));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, BestFitPicksTheSmallestSufficientBlock) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  std::vector<void*> p;
  for (size_t size : {64 * kKiB, 4 * kKiB, 32 * kKiB, 4 * kKiB, 48 * kKiB, 4 * kKiB}) {
    p.push_back(*allocator->Allocate(size));
  }
  DTR_ASSERT_OK(allocator->Free(p[0]));  // 64 KiB hole
  DTR_ASSERT_OK(allocator->Free(p[2]));  // 32 KiB hole
  DTR_ASSERT_OK(allocator->Free(p[4]));  // 48 KiB hole
  const int64_t hits_before = allocator->GetStats().num_cache_hits;
  EXPECT_EQ(*allocator->Allocate(40 * kKiB), p[4]);
  EXPECT_EQ(*allocator->Allocate(20 * kKiB), p[2]);
  // The 32 KiB hole was split: its 12 KiB remainder serves a 10 KiB request.
  EXPECT_EQ(Addr(*allocator->Allocate(10 * kKiB)), Addr(p[2]) + 20 * kKiB);
  EXPECT_EQ(allocator->GetStats().num_cache_hits - hits_before, 3);
  EXPECT_EQ(backend.counters().allocate_calls, 1);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, FreeRejectsUnknownAndDoubleFree) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(1000);
  DTR_ASSERT_OK(allocator->Free(a));
  EXPECT_EQ(allocator->Free(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator->Free(reinterpret_cast<void*>(0x1234)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator->RecordStream(a, Stream{1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator->CoalescedFreeSizeIfFreed(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(allocator->GetStats().num_frees, 1);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, BlocksAreReusedOnlyByTheirStream) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(4 * kKiB, Stream{1});
  DTR_ASSERT_OK(allocator->Free(a));
  void* b = *allocator->Allocate(4 * kKiB, Stream{2});
  EXPECT_NE(b, a);
  EXPECT_EQ(allocator->GetStats().segment_count.current, 2);
  EXPECT_EQ(*allocator->Allocate(4 * kKiB, Stream{1}), a);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, RecordStreamDelaysReuseUntilEventsComplete) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(4 * kKiB, Stream{0});
  void* keep = *allocator->Allocate(4 * kKiB, Stream{0});
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{5}));
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{6}));
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{5}));  // deduplicated
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{0}));  // own stream: no event needed
  EXPECT_EQ(*allocator->CoalescedFreeSizeIfFreed(a), 0u);  // would not be reusable at once
  DTR_ASSERT_OK(allocator->Free(a));
  EXPECT_EQ(backend.counters().events_recorded, 2);
  EXPECT_EQ(Blocks(*allocator, 0)[0], std::make_pair(4 * kKiB, kP));
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.allocated_bytes.current, int64_t(4 * kKiB));
  EXPECT_EQ(stats.active_bytes.current, int64_t(8 * kKiB));
  DTR_ASSERT_OK(allocator->CheckInvariants());

  void* b = *allocator->Allocate(4 * kKiB, Stream{0});
  EXPECT_NE(b, a);  // pending block is not reused
  backend.CompleteEvents(Stream{5});
  void* c = *allocator->Allocate(4 * kKiB, Stream{0});
  EXPECT_NE(c, a);  // stream 6 still pending
  EXPECT_EQ(Blocks(*allocator, 0)[0].second, kP);
  backend.CompleteEvents(Stream{6});
  EXPECT_EQ(*allocator->Allocate(4 * kKiB, Stream{0}), a);
  EXPECT_EQ(backend.counters().live_events, 0);
  EXPECT_NE(keep, nullptr);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, FreeKeepsTheBlockWhenRecordingAnEventFails) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(4 * kKiB);
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{3}));
  backend.set_fail_record_event(true);
  EXPECT_EQ(allocator->Free(a).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(allocator->GetStats().allocated_bytes.current, int64_t(4 * kKiB));
  DTR_ASSERT_OK(allocator->CheckInvariants());
  backend.set_fail_record_event(false);
  DTR_ASSERT_OK(allocator->Free(a));
  EXPECT_EQ(Blocks(*allocator, 0)[0].second, kP);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, EmptyCacheReleasesOnlyFullyFreeSegments) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(3 * kMiB);       // large segment 1
  void* b = *allocator->Allocate(18 * kMiB);      // large segment 2 (own: > 17 MiB tail)
  void* c = *allocator->Allocate(4 * kKiB);       // small segment
  DTR_ASSERT_OK(allocator->RecordStream(c, Stream{9}));
  DTR_ASSERT_OK(allocator->Free(b));
  DTR_ASSERT_OK(allocator->Free(c));  // pending on stream 9
  allocator->EmptyCache();
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.segment_count.current, 2);  // a's segment is in use, c's is pending
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(22 * kMiB));
  EXPECT_EQ(backend.counters().live_bytes, 22 * kMiB);
  backend.CompleteAllEvents();
  allocator->EmptyCache();
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(20 * kMiB));
  DTR_ASSERT_OK(allocator->Free(a));
  allocator->EmptyCache();
  stats = allocator->GetStats();
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_EQ(stats.num_segment_frees, 3);
  EXPECT_EQ(stats.reserved_bytes.peak, int64_t(40 * kMiB));
  EXPECT_EQ(backend.counters().live_bytes, 0u);
  EXPECT_EQ(backend.counters().bad_frees, 0);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(CachingAllocatorTest, PeakStatsResetToCurrent) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(3 * kMiB);
  void* b = *allocator->Allocate(5 * kMiB);
  DTR_ASSERT_OK(allocator->Free(b));
  EXPECT_EQ(allocator->GetStats().allocated_bytes.peak, int64_t(8 * kMiB));
  allocator->ResetPeakStats();
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.allocated_bytes.peak, int64_t(3 * kMiB));
  EXPECT_EQ(stats.allocation_count.peak, 1);
  EXPECT_EQ(stats.num_allocs, 2);
  EXPECT_EQ(stats.allocated_bytes.allocated, int64_t(8 * kMiB));
  EXPECT_EQ(stats.allocated_bytes.freed, int64_t(5 * kMiB));
  EXPECT_NE(a, nullptr);
}

// --- The retry ladder, rung by rung ---

TEST(RetryLadderTest, Rung1ServesFromCacheWithoutTheBackend) {
  FakeBackend backend;
  auto allocator = MakeAllocator(BudgetConfig(20 * kMiB), &backend);
  void* a = *allocator->Allocate(5 * kMiB);
  DTR_ASSERT_OK(allocator->Free(a));
  EXPECT_EQ(*allocator->Allocate(4 * kMiB), a);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_cache_hits, 1);
  EXPECT_EQ(stats.num_segment_allocs, 1);
  EXPECT_EQ(stats.num_alloc_retries, 0);
  EXPECT_EQ(backend.counters().allocate_calls, 1);
}

TEST(RetryLadderTest, Rung2GrowsOnlyWithinTheBudget) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(24 * kMiB);
  config.shrink_segment_to_fit_budget = false;
  auto allocator = MakeAllocator(config, &backend);
  ASSERT_TRUE(allocator->Allocate(3 * kMiB).ok());  // 20 MiB segment
  ASSERT_TRUE(allocator->Allocate(4 * kKiB).ok());  // 2 MiB small segment: 22 MiB
  absl::StatusOr<void*> over = allocator->Allocate(18 * kMiB);  // 18 MiB segment: over budget
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.counters().allocate_calls, 2);  // the backend was never asked
  EXPECT_EQ(allocator->GetStats().reserved_bytes.peak, int64_t(22 * kMiB));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(RetryLadderTest, Rung2ShrinksTheSegmentToFitTheBudget) {
  FakeBackend backend;
  auto allocator = MakeAllocator(BudgetConfig(10 * kMiB), &backend);
  void* a = *allocator->Allocate(3 * kMiB + 100);  // 20 MiB would not fit: 4 MiB segment
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(4 * kMiB));
  EXPECT_EQ(*allocator->BlockSize(a), 4 * kMiB);  // 512 KiB rest is not split in the large pool
  EXPECT_TRUE(allocator->Allocate(5 * kMiB).ok());  // 6 MiB segment, exactly at the budget
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(10 * kMiB));
  EXPECT_FALSE(allocator->Allocate(512).ok());
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(RetryLadderTest, Rung3AsksTheHandlerThenRetries) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(20 * kMiB);
  auto allocator = MakeAllocator(config, &backend);
  void* victim = *allocator->Allocate(6 * kMiB);
  void* keep = *allocator->Allocate(12 * kMiB);
  LambdaHandler handler([&](const EvictionRequest&) {
    EXPECT_TRUE(allocator->Free(victim).ok());  // re-entrant: the allocator lock is not held
    EvictionResult result;
    result.bytes_freed = 6 * kMiB;
    result.blocks_freed = 1;
    return result;
  });
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = allocator->Allocate(5 * kMiB, Stream{0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, victim);
  ASSERT_EQ(handler.requests.size(), 1u);
  const EvictionRequest& request = handler.requests[0];
  EXPECT_EQ(request.requested_bytes, 5 * kMiB);
  EXPECT_EQ(request.rounded_bytes, 5 * kMiB);
  EXPECT_EQ(request.pool, Pool::kLarge);
  EXPECT_EQ(request.budget_bytes, 20 * kMiB);
  EXPECT_EQ(request.reserved_bytes, 20 * kMiB);
  EXPECT_EQ(request.allocated_bytes, 18 * kMiB);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_eviction_calls, 1);
  EXPECT_EQ(stats.eviction_bytes_requested, int64_t(5 * kMiB));
  EXPECT_EQ(stats.eviction_bytes_freed, int64_t(6 * kMiB));
  EXPECT_EQ(stats.num_cache_flushes, 0);
  EXPECT_NE(keep, nullptr);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(RetryLadderTest, Rung3IsSkippedWhenEvictionIsDisabled) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(4 * kMiB);
  config.enable_eviction = false;
  auto allocator = MakeAllocator(config, &backend);
  LambdaHandler handler([](const EvictionRequest&) { return EvictionResult{}; });
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = allocator->Allocate(5 * kMiB);
  EXPECT_FALSE(p.ok());
  EXPECT_TRUE(handler.requests.empty());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("eviction disabled"));
}

// One segment per block with exact reuse, as dtr's CPU allocator configures it
// (hooks/cpu_allocator_adapter.cc, kHostBlockBytes), keeping `config`'s budget and eviction.
void OneSegmentPerBlock(AllocatorConfig& config) {
  AllocatorConfig per_block = AllocatorConfig::SegmentPerBlock(kHostBlockBytes);
  per_block.budget_bytes = config.budget_bytes;
  per_block.enable_eviction = config.enable_eviction;
  per_block.shrink_segment_to_fit_budget = config.shrink_segment_to_fit_budget;
  config = per_block;
}

// Note [Exact reuse]: a cached block is reused only at its own size, with a budget or without,
// and what the cache holds is released (not evicted for) when a request does not fit.
TEST(RetryLadderTest, ExactReuseNeverSplitsACachedBlock) {
  for (bool budgeted : {false, true}) {
    FakeBackend backend;
    AllocatorConfig config = budgeted ? BudgetConfig(64 * kKiB) : AllocatorConfig{};
    OneSegmentPerBlock(config);
    auto allocator = MakeAllocator(config, &backend);
    void* keep = *allocator->Allocate(16 * kKiB);  // in use: the cache may hold as much
    void* big = *allocator->Allocate(8 * kKiB);
    DTR_ASSERT_OK(allocator->Free(big));
    void* small = *allocator->Allocate(2 * kKiB);
    EXPECT_NE(small, big) << "budgeted " << budgeted;
    EXPECT_EQ(allocator->GetStats().num_segment_allocs, 3);
    EXPECT_EQ(*allocator->Allocate(8 * kKiB), big);  // its own size: reused
    // Once the cache holds more than the peak in use, a miss releases it before growing.
    DTR_ASSERT_OK(allocator->Free(keep));  // cached 16 KiB, allocated 10 KiB, peak 26 KiB
    allocator->ResetPeakStats();           // peak 10 KiB
    ASSERT_TRUE(allocator->Allocate(4 * kKiB).ok());
    AllocatorStats stats = allocator->GetStats();
    EXPECT_EQ(stats.reserved_bytes.current, stats.allocated_bytes.current) << "budgeted " << budgeted;
    DTR_EXPECT_OK(allocator->CheckInvariants());
  }
  // When the cache holds what a request needs, rung 4 releases it and nothing is evicted.
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(16 * kKiB);
  OneSegmentPerBlock(config);
  auto allocator = MakeAllocator(config, &backend);
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(12 * kKiB)));
  int evictions = 0;
  LambdaHandler handler([&](const EvictionRequest& request) {
    if (!allocator->CanSatisfy(request)) ++evictions;  // what MakeRoom does before evicting
    return EvictionResult{};
  });
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = allocator->Allocate(8 * kKiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(evictions, 0);
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(8 * kKiB));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// OneSegmentPerBlock over a backend that can resize segments (HostBackend's mremap).
std::unique_ptr<CachingAllocator> ResizableSegmentPerBlock(FakeBackend& backend) {
  backend.set_resizable(true);
  AllocatorConfig config;
  OneSegmentPerBlock(config);
  return MakeAllocator(config, &backend);
}

// Note [Exact reuse]: a long-lived block allocated with no budget (a gradient, made after the
// forward's activations were freed) gets a segment of its own, so the budget set afterwards can
// hold the activation again without evicting anything. Splitting the activation's segment left
// it reserved with a remnant no activation fits in.
TEST(RetryLadderTest, ABudgetSetLaterIsNotLostToRemnants) {
  FakeBackend backend;
  AllocatorConfig config;
  OneSegmentPerBlock(config);
  auto allocator = MakeAllocator(config, &backend);
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(8 * kKiB)));  // an activation
  void* gradient = *allocator->Allocate(2 * kKiB);
  DTR_ASSERT_OK(allocator->SetBudget(10 * kKiB));
  LambdaHandler handler([](const EvictionRequest&) { return EvictionResult{}; });
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> activation = allocator->Allocate(8 * kKiB);
  ASSERT_TRUE(activation.ok()) << activation.status();
  EXPECT_TRUE(handler.requests.empty()) << "the budget holds both without evicting";
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, int64_t(10 * kKiB));
  DTR_ASSERT_OK(allocator->Free(gradient));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Resizing a nearby cached segment]: a miss turns a whole cached segment of at most twice
// or at least half the request into the requested block, and maps a new one otherwise.
TEST(RetryLadderTest, AMissResizesACachedSegmentOfANearbySize) {
  FakeBackend backend;
  auto allocator = ResizableSegmentPerBlock(backend);
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(8 * kKiB)));
  void* shrunk = *allocator->Allocate(6 * kKiB);  // 8 KiB <= 2 x 6 KiB: shrunk in place
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_allocs, 1);
  EXPECT_EQ(stats.num_segment_resizes, 1);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(6 * kKiB));
  DTR_ASSERT_OK(allocator->Free(shrunk));
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(10 * kKiB)));  // 6 KiB >= 10 KiB / 2: grown
  stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_allocs, 1);
  EXPECT_EQ(stats.num_segment_resizes, 2);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(10 * kKiB));
  void* small = *allocator->Allocate(2 * kKiB);  // 10 KiB is more than twice 2 KiB: left alone
  stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_allocs, 2);
  EXPECT_EQ(stats.num_segment_resizes, 2);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(12 * kKiB));
  DTR_EXPECT_OK(allocator->CheckInvariants());
  // Growing stays within the budget: 2 KiB in use and the 10 KiB cached segment grown to 11 KiB
  // would be 13 KiB.
  DTR_ASSERT_OK(allocator->SetBudget(12 * kKiB));
  absl::StatusOr<void*> p = allocator->Allocate(11 * kKiB);
  EXPECT_FALSE(p.ok());
  stats = allocator->GetStats();
  EXPECT_LE(stats.reserved_bytes.peak, int64_t(12 * kKiB));
  EXPECT_EQ(stats.num_segment_resizes, 2);
  DTR_ASSERT_OK(allocator->Free(small));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Undone resizes]: resizes whose old sizes are asked for again sooner than their segments
// had gone unused stop resizing, but for a cache holding more than the peak in use.
TEST(RetryLadderTest, ResizingStopsWhenTheSizesTakenAreAskedForAgainSoon) {
  FakeBackend backend;
  auto allocator = ResizableSegmentPerBlock(backend);
  std::vector<void*> held;
  // Frees a segment of kib + 2 KiB, asks for kib KiB (served by resizing it, if the gate lets it),
  // then for kib + 2 KiB again one hand-out later.
  auto take_and_ask_again = [&](size_t kib) {
    void* taken = *allocator->Allocate((kib + 2) * kKiB);
    held.push_back(*allocator->Allocate(1 * kKiB));
    ASSERT_TRUE(allocator->Free(taken).ok());
    held.push_back(*allocator->Allocate(kib * kKiB));
    held.push_back(*allocator->Allocate((kib + 2) * kKiB));
  };
  take_and_ask_again(6);
  EXPECT_EQ(allocator->GetStats().num_segment_resizes, 1);
  take_and_ask_again(30);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 1) << "the resize was undone: stopped";
  DTR_EXPECT_OK(allocator->CheckInvariants());
  // With more cached than the peak in use, a nearby segment is resized all the same.
  for (void* p : held) DTR_ASSERT_OK(allocator->Free(p));
  allocator->ResetPeakStats();
  void* p = *allocator->Allocate(31 * kKiB);  // a cached 32 KiB segment, shrunk
  stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 2);
  EXPECT_EQ(stats.num_cache_flushes, 0);
  DTR_ASSERT_OK(allocator->Free(p));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Resizing a nearby cached segment] holds only where a segment is one block: with the
// default size classes a small request's segment is 2 MiB, which a resize would hand out split.
TEST(RetryLadderTest, NoResizeWhereASegmentHoldsManyBlocks) {
  FakeBackend backend;
  backend.set_resizable(true);
  AllocatorConfig config;
  config.exact_reuse = true;
  auto allocator = MakeAllocator(config, &backend);
  void* large = *allocator->Allocate(12 * kMiB);  // a segment of its own; the peak stays above the cache
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(1 * kKiB)));  // a 2 MiB small segment, cached
  void* other = *allocator->Allocate(2 * kKiB);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 0);
  EXPECT_EQ(stats.segment_count.current, 3) << "the cached segment was split";
  DTR_ASSERT_OK(allocator->Free(other));
  DTR_ASSERT_OK(allocator->Free(large));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(RetryLadderTest, Rung4ReleasesCachedSegmentsAfterEviction) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(21 * kMiB);
  config.shrink_segment_to_fit_budget = false;
  auto allocator = MakeAllocator(config, &backend);
  DTR_ASSERT_OK(allocator->Free(*allocator->Allocate(4 * kKiB)));  // cached 2 MiB small segment
  std::vector<std::string> order;
  LambdaHandler handler([&](const EvictionRequest&) {
    order.push_back("evict");
    EXPECT_EQ(allocator->GetStats().segment_count.current, 1);  // cache not yet released
    return EvictionResult{};
  });
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = allocator->Allocate(3 * kMiB);  // needs a 20 MiB segment
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(order, std::vector<std::string>{"evict"});
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_eviction_calls, 1);
  EXPECT_EQ(stats.num_cache_flushes, 1);
  EXPECT_EQ(stats.num_segment_frees, 1);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(20 * kMiB));
  EXPECT_EQ(stats.reserved_bytes.peak, int64_t(20 * kMiB));  // never 22 MiB
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Releasing what a request needs]: under a budget, rung 4 releases the smallest cached
// segment that covers the shortfall (else the largest first), and the rest stays cached.
TEST(RetryLadderTest, Rung4ReleasesOnlyWhatTheRequestNeeds) {
  for (bool covered_by_one : {true, false}) {
    FakeBackend backend;
    AllocatorConfig config = BudgetConfig(32 * kKiB);
    OneSegmentPerBlock(config);
    config.shrink_segment_to_fit_budget = false;
    auto allocator = MakeAllocator(config, &backend);
    void* keep = *allocator->Allocate(8 * kKiB);  // in use, so the cache stays under the peak
    void* a = *allocator->Allocate(4 * kKiB);
    void* b = *allocator->Allocate(6 * kKiB);
    void* c = *allocator->Allocate(10 * kKiB);
    for (void* p : {a, b, c}) DTR_ASSERT_OK(allocator->Free(p));  // cached 20 KiB; reserved 28 KiB
    // 5 KiB needs 1 KiB more than the 4 free under the cap: the 4 KiB segment covers it alone.
    // 16 KiB needs 12: no single segment does, so the largest go first (10, then 6).
    const size_t request = covered_by_one ? 5 * kKiB : 16 * kKiB;
    ASSERT_TRUE(allocator->Allocate(request).ok());
    AllocatorStats stats = allocator->GetStats();
    EXPECT_EQ(stats.num_cache_flushes, 1);
    EXPECT_EQ(stats.num_segment_frees, covered_by_one ? 1 : 2);
    EXPECT_EQ(stats.reserved_bytes.current, int64_t(covered_by_one ? 29 * kKiB : 28 * kKiB));
    // What was not released is still there to be reused at its size.
    void* again = *allocator->Allocate(covered_by_one ? 10 * kKiB : 4 * kKiB);
    EXPECT_EQ(again, covered_by_one ? c : a);
    (void)keep;
    DTR_EXPECT_OK(allocator->CheckInvariants());
  }
}

// A FakeBackend resizing from `resizable_from` bytes (kNeverResizable: not at all) under `budget`,
// one segment per block: `in_use` bytes allocated, then segments of `sizes` allocated in that order
// (rising addresses) and freed, so they are cached.
constexpr size_t kNeverResizable = SIZE_MAX;
struct CachedSegments {
  FakeBackend backend;
  std::unique_ptr<CachingAllocator> allocator;
  std::vector<void*> cached;
  CachedSegments(size_t budget, size_t in_use, std::initializer_list<size_t> sizes, size_t resizable_from = 1) {
    backend.set_resizable(true);
    backend.set_resizable_from(resizable_from);
    AllocatorConfig config = BudgetConfig(budget);
    OneSegmentPerBlock(config);
    allocator = MakeAllocator(config, &backend);
    (void)*allocator->Allocate(in_use);
    for (size_t bytes : sizes) cached.push_back(*allocator->Allocate(bytes));
    for (size_t i = 1; i < cached.size(); ++i) EXPECT_LT(cached[i - 1], cached[i]);
    for (void* p : cached) EXPECT_TRUE(allocator->Free(p).ok());
  }
};

// Note [Releasable segments by size]: rung 4 finds the segments it releases in an index by size
// and takes the ones a walk by address took: when one segment covers the shortfall alone, the
// smallest such, of equal sizes the highest address; else the largest first, of equal sizes the
// lowest address first. (Which segment it grows: the test after this one.)
TEST(RetryLadderTest, Rung4ReleasesEqualSizedSegmentsAsAWalkByAddressDid) {
  for (bool covered_by_one : {true, false}) {
    // 8 KiB in use; 4, 6, 6 and 4 KiB cached in address order: 20 KiB cached, 28 reserved.
    CachedSegments heap(32 * kKiB, 8 * kKiB, {4 * kKiB, 6 * kKiB, 6 * kKiB, 4 * kKiB}, kNeverResizable);
    // 5 KiB is 1 KiB short, which either 4 KiB segment covers: the higher goes. 17 KiB is 13 short:
    // both 6 KiB, then the lower 4 KiB.
    ASSERT_TRUE(heap.allocator->Allocate(covered_by_one ? 5 * kKiB : 17 * kKiB).ok());
    EXPECT_EQ(heap.allocator->GetStats().num_segment_frees, covered_by_one ? 1 : 3);
    EXPECT_EQ(*heap.allocator->Allocate(4 * kKiB), covered_by_one ? heap.cached[0] : heap.cached[3]);
    DTR_EXPECT_OK(heap.allocator->CheckInvariants());
  }
}

// Note [Releasable segments by size]: of equal sizes, rung 4 grows the cached segment at the
// lowest address, as a walk by address did; and it looks for the largest it can resize by size
// (CanResize is monotone in the old size), passing over smaller ones it cannot.
TEST(RetryLadderTest, Rung4GrowsTheLowerOfEqualSizedSegmentsAndOnlyOnesItCanResize) {
  {
    // 8 KiB in use, 6, 6 and 4 KiB cached: 24 reserved under 26. 9 KiB: none cached holds it,
    // and growing a 6 KiB one leaves 27 reserved, so the 4 KiB segment gives its pages to the
    // growth of the lower 6 KiB one; the higher stays cached at its size.
    CachedSegments heap(26 * kKiB, 8 * kKiB, {6 * kKiB, 6 * kKiB, 4 * kKiB});
    ASSERT_TRUE(heap.allocator->Allocate(9 * kKiB).ok());
    AllocatorStats stats = heap.allocator->GetStats();
    EXPECT_EQ(stats.num_segment_resizes, 1);
    EXPECT_EQ(stats.num_segment_donors, 1);
    EXPECT_EQ(*heap.allocator->Allocate(6 * kKiB), heap.cached[1]);
    DTR_EXPECT_OK(heap.allocator->CheckInvariants());
  }
  // Resizing only from 8 KiB, 8 KiB in use. 10 and 4 KiB cached, 22 reserved under 23, 12 KiB
  // asked: the 10 KiB segment grows, taking the 4 KiB one's pages. 6 and 4 KiB cached (none
  // resizable), 20 under 20, 9 KiB asked: rung 4 releases what it needs.
  struct Case {
    size_t budget, larger, smaller, request;
    int64_t resizes, donors, frees;
  };
  for (const Case& c : {Case{23 * kKiB, 10 * kKiB, 4 * kKiB, 12 * kKiB, 1, 1, 0},
                        Case{20 * kKiB, 6 * kKiB, 4 * kKiB, 9 * kKiB, 0, 0, 2}}) {
    SCOPED_TRACE(::testing::Message() << c.request << " bytes");
    CachedSegments heap(c.budget, 8 * kKiB, {c.larger, c.smaller}, /*resizable_from=*/8 * kKiB);
    ASSERT_TRUE(heap.allocator->Allocate(c.request).ok());
    AllocatorStats stats = heap.allocator->GetStats();
    EXPECT_EQ(stats.num_segment_resizes, c.resizes);
    EXPECT_EQ(stats.num_segment_donors, c.donors);
    EXPECT_EQ(stats.num_segment_frees, c.frees);
    EXPECT_EQ(heap.backend.counters().resize_calls, c.resizes);
    DTR_EXPECT_OK(heap.allocator->CheckInvariants());
  }
}

// Note [Small requests keep resizable segments]: a request the backend cannot resize releases
// the cached segments it cannot resize either, the largest first, where they cover the shortfall,
// though a resizable one would cover it alone; where they do not, the resizable one is shrunk by
// the shortfall and stays cached, and is released whole only where it cannot be shrunk that far.
TEST(RetryLadderTest, Rung4KeepsResizableSegmentsForRequestsThatCannotUseTheirPages) {
  struct Case {
    size_t budget;
    std::initializer_list<size_t> cached;  // the last one resizable
    int64_t frees, resizes;
    size_t resizable_after;  // the resizable segment's size afterwards, 0: released
  };
  // Resizing from and to 8 KiB or more, 8 KiB in use, a 6 KiB request (not resizable).
  for (const Case& c : {Case{32 * kKiB, {4 * kKiB, 4 * kKiB, 16 * kKiB}, 2, 0, 16 * kKiB},  // 6 short: 4 + 4 cover it
                        Case{28 * kKiB, {2 * kKiB, 16 * kKiB}, 0, 1, 12 * kKiB},             // 4 short: 16 -> 12
                        Case{20 * kKiB, {2 * kKiB, 10 * kKiB}, 1, 0, 0}}) {                  // 6 short: 10 -> 4 cannot
    SCOPED_TRACE(::testing::Message() << "budget " << c.budget);
    CachedSegments heap(c.budget, 8 * kKiB, c.cached, /*resizable_from=*/8 * kKiB);
    void* resizable = heap.cached.back();
    ASSERT_TRUE(heap.allocator->Allocate(6 * kKiB).ok());
    AllocatorStats stats = heap.allocator->GetStats();
    EXPECT_EQ(stats.num_segment_frees, c.frees);
    EXPECT_EQ(stats.num_segment_resizes, c.resizes);
    EXPECT_LE(stats.reserved_bytes.peak, int64_t(c.budget));
    EXPECT_EQ(heap.backend.counters().live_bytes, size_t(stats.reserved_bytes.current));
    DTR_EXPECT_OK(heap.allocator->CheckInvariants());
    // The resizable segment, if kept, serves its size again (at its address) without a new segment.
    if (c.resizable_after != 0) {
      const int64_t allocs = stats.num_segment_allocs;
      absl::StatusOr<void*> again = heap.allocator->Allocate(c.resizable_after);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(*again, resizable);
      EXPECT_EQ(heap.allocator->GetStats().num_segment_allocs, allocs);
    }
    DTR_EXPECT_OK(heap.allocator->CheckInvariants());
    heap.allocator->EmptyCache();
    EXPECT_EQ(heap.backend.counters().bad_frees, 0);
  }
}

// Note [Recycling a cached segment]: with a backend that can resize, rung 4 turns a cached
// segment into the one a request needs instead of releasing and allocating: the smallest at
// least as large, shrunk, else the largest whose release makes room, grown.
// A 32 KiB budget over a resizable backend, one segment per block: 8 KiB in use (so the cache
// stays under the peak) and three segments of the given sizes cached.
struct ThreeCachedSegments : CachedSegments {
  ThreeCachedSegments(size_t a_bytes, size_t b_bytes, size_t c_bytes)
      : CachedSegments(32 * kKiB, 8 * kKiB, {a_bytes, b_bytes, c_bytes}), a(cached[0]), b(cached[1]), c(cached[2]) {}
  void* a;
  void* b;
  void* c;
};

TEST(RetryLadderTest, Rung4RecyclesACachedSegmentWhenTheBackendCanResize) {
  ThreeCachedSegments heap(4 * kKiB, 6 * kKiB, 10 * kKiB);  // cached 20 KiB; reserved 28 KiB
  FakeBackend& backend = heap.backend;
  CachingAllocator* allocator = heap.allocator.get();
  void* a = heap.a;
  void* b = heap.b;
  // 5 KiB does not fit the 4 KiB left under the cap: b (6 KiB, the smallest that holds it) shrinks.
  absl::StatusOr<void*> five = allocator->Allocate(5 * kKiB);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(*five, b);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 1);
  EXPECT_EQ(stats.num_segment_frees, 0);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(27 * kKiB));
  DTR_EXPECT_OK(allocator->CheckInvariants());
  // 13 KiB: none cached holds it; the largest, c (10 KiB), grows to 13 KiB, which fits as it is.
  absl::StatusOr<void*> thirteen = allocator->Allocate(13 * kKiB);
  ASSERT_TRUE(thirteen.ok()) << thirteen.status();
  stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 2);
  EXPECT_EQ(stats.num_segment_frees, 0);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(30 * kKiB));
  EXPECT_LE(stats.reserved_bytes.peak, int64_t(32 * kKiB));
  EXPECT_EQ(backend.counters().resize_calls, 2);
  EXPECT_EQ(backend.counters().live_bytes, size_t(30 * kKiB));
  // a (4 KiB) is still cached at its size.
  EXPECT_EQ(*allocator->Allocate(4 * kKiB), a);
  DTR_EXPECT_OK(allocator->CheckInvariants());
  allocator->EmptyCache();
  EXPECT_EQ(backend.counters().bad_frees, 0);
}

// Note [Recycling a cached segment]: when the largest cached segment cannot grow within the
// budget by itself, enough of the others go first (Note [Releasing what a request needs]: the
// smallest that covers the rest alone), their pages given to the growth (Note [Growing into
// cached pages]).
TEST(RetryLadderTest, Rung4GivesOthersPagesSoTheLargestCachedSegmentCanGrow) {
  ThreeCachedSegments heap(6 * kKiB, 7 * kKiB, 9 * kKiB);  // cached 22 KiB; reserved 30 KiB
  CachingAllocator* allocator = heap.allocator.get();
  // 14 KiB: c grown to 14 KiB needs 3 KiB more than the cap leaves; a (6 KiB) covers that alone.
  ASSERT_TRUE(allocator->Allocate(14 * kKiB).ok());
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_resizes, 1);
  EXPECT_EQ(stats.num_segment_donors, 1);
  EXPECT_EQ(heap.backend.counters().donors, 1);
  EXPECT_EQ(heap.backend.counters().bad_frees, 0);
  EXPECT_EQ(stats.num_segment_frees, 0);
  EXPECT_EQ(stats.num_segment_allocs, 4);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(29 * kKiB));
  EXPECT_LE(stats.reserved_bytes.peak, int64_t(32 * kKiB));
  EXPECT_EQ(*allocator->Allocate(7 * kKiB), heap.b);  // still cached at its size
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

// Note [Growing into cached pages]: when the growth fails after its donors went back, rung 4
// releases only what is still short, not what it would have released with the donors there.
TEST(RetryLadderTest, AFailedGrowthCountsItsDonorsAsReleased) {
  ThreeCachedSegments heap(6 * kKiB, 7 * kKiB, 9 * kKiB);  // cached 22 KiB; reserved 30 KiB
  heap.backend.set_fail_resizes(true);
  // 14 KiB: c (9 KiB) grown with a's pages fails; a is gone (24 KiB reserved), 6 KiB short, which
  // b (7 KiB) covers alone; c stays cached (releasing 12 KiB, as before, took b and c).
  ASSERT_TRUE(heap.allocator->Allocate(14 * kKiB).ok());
  AllocatorStats stats = heap.allocator->GetStats();
  EXPECT_EQ(stats.num_segment_donors, 1);
  EXPECT_EQ(stats.num_segment_resizes, 0);
  EXPECT_EQ(stats.num_segment_frees, 1);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(31 * kKiB));
  EXPECT_EQ(*heap.allocator->Allocate(9 * kKiB), heap.c);
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

// Note [Splitting a cached segment]: where the backend can cut a segment without touching its
// pages, a cached segment larger than the request is split instead of shrunk, and the tail stays
// cached as a segment of its own (the budget's shrink in rung 4, here).
TEST(RetryLadderTest, Rung4SplitsTheCachedSegmentItWouldShrink) {
  ThreeCachedSegments heap(4 * kKiB, 6 * kKiB, 10 * kKiB);  // cached 20 KiB; reserved 28 KiB
  FakeBackend& backend = heap.backend;
  backend.set_page_bytes(kKiB);
  CachingAllocator* allocator = heap.allocator.get();
  // 5 KiB does not fit the 4 KiB left under the cap: b (6 KiB) is cut into 5 KiB and 1 KiB.
  absl::StatusOr<void*> five = allocator->Allocate(5 * kKiB);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(*five, heap.b);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_segment_splits, 1);
  EXPECT_EQ(stats.num_segment_resizes, 0);
  EXPECT_EQ(stats.num_segment_frees, 0);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(28 * kKiB)) << "no page went back";
  EXPECT_EQ(stats.segment_count.current, 5);
  DTR_EXPECT_OK(allocator->CheckInvariants());
  // The tail is a cached segment of its own: a 1 KiB request is served by it, nothing mapped.
  absl::StatusOr<void*> one = allocator->Allocate(1 * kKiB);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, static_cast<void*>(static_cast<char*>(heap.b) + 5 * kKiB));
  EXPECT_EQ(allocator->GetStats().num_segment_allocs, 4);
  // Each piece goes back to the backend on its own.
  DTR_ASSERT_OK(allocator->Free(*five));
  DTR_ASSERT_OK(allocator->Free(*one));
  DTR_EXPECT_OK(allocator->CheckInvariants());
  allocator->EmptyCache();
  EXPECT_EQ(backend.counters().split_calls, 1);
  EXPECT_EQ(backend.counters().bad_frees, 0);
  EXPECT_EQ(backend.counters().live_bytes, size_t(8 * kKiB));
}

// Note [Splitting a cached segment]: a miss splits a nearby cached segment too (Note [Resizing a
// nearby cached segment]) while the budget binds; where the tail would be less than a page, or the
// budget leaves room for the request's own segment, it is shrunk as before.
TEST(RetryLadderTest, AMissSplitsANearbyCachedSegmentWhileTheBudgetBinds) {
  struct Case {
    size_t page;
    size_t budget;
    bool split;
  };
  // 8 KiB cached and a 6 KiB request: 14 KiB would pass a 12 KiB budget.
  for (const Case& c : {Case{2 * kKiB, 12 * kKiB, true}, Case{4 * kKiB, 12 * kKiB, false},
                        Case{2 * kKiB, AllocatorConfig::kUnlimited, false}, Case{2 * kKiB, 14 * kKiB, false}}) {
    SCOPED_TRACE(::testing::Message() << "page " << c.page << ", budget " << c.budget);
    FakeBackend backend;
    backend.set_page_bytes(c.page);
    auto allocator = ResizableSegmentPerBlock(backend);
    void* eight = *allocator->Allocate(8 * kKiB);
    DTR_ASSERT_OK(allocator->Free(eight));
    DTR_ASSERT_OK(allocator->SetBudget(c.budget));
    void* six = *allocator->Allocate(6 * kKiB);
    EXPECT_EQ(six, eight);
    AllocatorStats stats = allocator->GetStats();
    EXPECT_EQ(stats.num_segment_splits, c.split ? 1 : 0);
    EXPECT_EQ(stats.num_segment_resizes, c.split ? 0 : 1);
    EXPECT_EQ(stats.reserved_bytes.current, int64_t(c.split ? 8 * kKiB : 6 * kKiB));
    void* two = *allocator->Allocate(2 * kKiB);
    EXPECT_EQ(two == static_cast<void*>(static_cast<char*>(eight) + 6 * kKiB), c.split);
    EXPECT_EQ(allocator->GetStats().num_segment_allocs, c.split ? 1 : 2);
    DTR_ASSERT_OK(allocator->Free(six));
    DTR_ASSERT_OK(allocator->Free(two));
    DTR_EXPECT_OK(allocator->CheckInvariants());
    allocator->EmptyCache();
    EXPECT_EQ(backend.counters().bad_frees, 0);
    EXPECT_EQ(backend.counters().live_bytes, 0u);
  }
}

TEST(RetryLadderTest, Rung5ReportsEverythingInTheOutOfMemoryMessage) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(24 * kMiB);
  config.shrink_segment_to_fit_budget = false;
  auto allocator = MakeAllocator(config, &backend);
  void* a = *allocator->Allocate(3 * kMiB);
  void* b = *allocator->Allocate(9 * kMiB);
  (void)b;
  DTR_ASSERT_OK(allocator->Free(a));  // 3 MiB hole + 8 MiB tail free in the segment
  LambdaHandler handler(
      [](const EvictionRequest&) {
        EvictionResult r;
        r.pinned_bytes = 9 * kMiB;
        return r;
      },
      /*pinned=*/1);
  allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = allocator->Allocate(10 * kMiB);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(p.status().message());
  EXPECT_THAT(message, HasSubstr("out of memory"));
  EXPECT_THAT(message, HasSubstr("tried to allocate 10.00 MiB (10485760 bytes)"));
  EXPECT_THAT(message, HasSubstr("large pool"));
  EXPECT_THAT(message, HasSubstr("budget 24.00 MiB (25165824 bytes)"));
  EXPECT_THAT(message, HasSubstr("reserved 20.00 MiB (20971520 bytes)"));
  EXPECT_THAT(message, HasSubstr("allocated 9.00 MiB (9437184 bytes)"));
  EXPECT_THAT(message, HasSubstr("largest free block 8.00 MiB (8388608 bytes)"));
  EXPECT_THAT(message, HasSubstr("pinned (unevictable) 9.00 MiB (9437184 bytes)"));
  EXPECT_THAT(message, HasSubstr("eviction freed 0 B in 0 blocks"));
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.num_cache_flushes, 1);
  EXPECT_EQ(stats.reserved_bytes.current, int64_t(20 * kMiB));
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(RetryLadderTest, OutOfMemoryWithoutHandlerAsksNobodyForPinnedBytes) {
  FakeBackend backend;
  auto allocator = MakeAllocator(BudgetConfig(2 * kMiB), &backend);
  absl::StatusOr<void*> p = allocator->Allocate(3 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no eviction handler"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("pinned (unevictable) unknown"));
  EXPECT_EQ(allocator->Allocate(SIZE_MAX).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(RetryLadderTest, AllocationsInsideTheHandlerDoNotRecurse) {
  FakeBackend backend;
  auto allocator = MakeAllocator(BudgetConfig(2 * kMiB), &backend);
  ASSERT_TRUE(allocator->Allocate(kMiB).ok());
  absl::Status inner;
  LambdaHandler handler([&](const EvictionRequest&) {
    inner = allocator->Allocate(3 * kMiB).status();  // cannot fit either
    return EvictionResult{};
  });
  allocator->SetEvictionHandler(&handler);
  EXPECT_FALSE(allocator->Allocate(3 * kMiB).ok());
  EXPECT_EQ(handler.requests.size(), 1u);
  EXPECT_THAT(std::string(inner.message()), HasSubstr("eviction skipped"));
  EXPECT_EQ(allocator->GetStats().num_ooms, 2);
}

// --- The backend failing (a real device OOM) ---

TEST(BackendFailureTest, CachedSegmentsAreReleasedAndTheRequestRetried) {
  FakeBackend backend(/*capacity_bytes=*/22 * kMiB);
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);  // unlimited budget
  void* small = *allocator->Allocate(4 * kKiB);
  DTR_ASSERT_OK(allocator->Free(small));  // 2 MiB cached
  void* big = *allocator->Allocate(20 * kMiB);  // 2 + 20 fits the device exactly
  DTR_ASSERT_OK(allocator->Free(big));
  absl::StatusOr<void*> p = allocator->Allocate(21 * kMiB);  // 22 MiB: only after a flush
  ASSERT_TRUE(p.ok()) << p.status();
  AllocatorStats stats = allocator->GetStats();
  EXPECT_GE(stats.num_backend_failures, 1);
  EXPECT_EQ(stats.num_cache_flushes, 1);
  EXPECT_EQ(stats.num_segment_frees, 2);
  EXPECT_EQ(backend.counters().live_bytes, 22 * kMiB);
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(BackendFailureTest, ReportsTheBackendErrorWhenNothingHelps) {
  FakeBackend backend(/*capacity_bytes=*/8 * kMiB);
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  absl::StatusOr<void*> p = allocator->Allocate(9 * kMiB);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("backend fake: FakeBackend: out of"));
  EXPECT_TRUE(allocator->Allocate(7 * kMiB).ok());
  DTR_EXPECT_OK(allocator->CheckInvariants());
}

TEST(BackendFailureTest, FailingTheNthRequestNeverCorruptsState) {
  // For every N, the Nth backend request fails during a fixed workload; each operation either
  // succeeds or reports ResourceExhausted, and the state stays consistent throughout.
  for (int n = 1; n <= 12; ++n) {
    SCOPED_TRACE(n);
    FakeBackend backend;
    AllocatorConfig config = BudgetConfig(64 * kMiB);
    auto allocator = MakeAllocator(config, &backend);
    backend.FailNthAllocation(n);
    std::vector<void*> live;
    int failures = 0;
    const size_t sizes[] = {4 * kKiB, 3 * kMiB, 12 * kMiB, 700 * kKiB, 9 * kMiB, 2 * kMiB,
                            30 * kMiB, 100, 15 * kMiB, 5 * kMiB};
    for (int round = 0; round < 3; ++round) {
      for (size_t size : sizes) {
        absl::StatusOr<void*> p = allocator->Allocate(size, Stream{uint64_t(round % 2)});
        if (p.ok()) {
          live.push_back(*p);
        } else {
          ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          ++failures;
        }
        DTR_ASSERT_OK(allocator->CheckInvariants());
        if (live.size() > 4) {
          DTR_ASSERT_OK(allocator->Free(live.front()));
          live.erase(live.begin());
        }
      }
      if (round == 1) allocator->EmptyCache();
    }
    for (void* p : live) DTR_ASSERT_OK(allocator->Free(p));
    allocator->EmptyCache();
    DTR_ASSERT_OK(allocator->CheckInvariants());
    EXPECT_EQ(allocator->GetStats().reserved_bytes.current, 0);
    EXPECT_EQ(backend.counters().live_bytes, 0u);
    EXPECT_EQ(backend.counters().bad_frees, 0);
    EXPECT_EQ(allocator->GetStats().num_backend_failures, backend.counters().failed_allocations);
    // A single injected failure is absorbed by the ladder (flush and retry) or the later retry.
    EXPECT_EQ(backend.counters().failed_allocations, n <= backend.counters().allocate_calls ? 1 : 0);
    EXPECT_EQ(failures, allocator->GetStats().num_ooms);
  }
}

TEST(CachingAllocatorTest, DestructorReturnsEverythingToTheBackend) {
  FakeBackend backend;
  {
    auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
    void* a = *allocator->Allocate(4 * kKiB);
    ASSERT_TRUE(allocator->Allocate(30 * kMiB).ok());
    DTR_ASSERT_OK(allocator->RecordStream(a, Stream{2}));
    DTR_ASSERT_OK(allocator->Free(a));  // pending event
  }
  EXPECT_EQ(backend.counters().live_bytes, 0u);
  EXPECT_EQ(backend.counters().live_events, 0);
  EXPECT_EQ(backend.counters().bad_frees, 0);
}

TEST(CachingAllocatorTest, SnapshotTotalsMatchStatsAndPrint) {
  FakeBackend backend;
  auto allocator = MakeAllocator(AllocatorConfig{}, &backend);
  void* a = *allocator->Allocate(3000);
  ASSERT_TRUE(allocator->Allocate(3 * kMiB).ok());
  DTR_ASSERT_OK(allocator->RecordStream(a, Stream{4}));
  DTR_ASSERT_OK(allocator->Free(a));
  MemorySnapshot snapshot = allocator->Snapshot();
  MemorySnapshot::Totals totals = snapshot.ComputeTotals();
  EXPECT_EQ(int64_t(totals.reserved_bytes), snapshot.stats.reserved_bytes.current);
  EXPECT_EQ(int64_t(totals.allocated_bytes), snapshot.stats.allocated_bytes.current);
  EXPECT_EQ(int64_t(totals.active_bytes), snapshot.stats.active_bytes.current);
  EXPECT_EQ(totals.active_blocks, 2);
  EXPECT_EQ(totals.largest_free_block, 17 * kMiB);
  const std::string text = snapshot.ToString();
  EXPECT_THAT(text, HasSubstr("pool=small"));
  EXPECT_THAT(text, HasSubstr("pending"));
  EXPECT_THAT(text, HasSubstr("[+0x0 3.00 MiB allocated]"));
}

TEST(CachingAllocatorTest, SetBudgetReleasesCacheAndRefusesToGoBelowWhatIsInUse) {
  FakeBackend backend;
  auto allocator = MakeAllocator(BudgetConfig(64 * kMiB), &backend);
  void* a = *allocator->Allocate(12 * kMiB);
  void* b = *allocator->Allocate(12 * kMiB);
  ASSERT_TRUE(allocator->Free(b).ok());
  size_t reserved = size_t(allocator->GetStats().reserved_bytes.current);
  // b's cached segment is released to make room; a stays.
  ASSERT_TRUE(allocator->SetBudget(reserved - 1).ok()) << reserved;
  EXPECT_EQ(allocator->budget(), reserved - 1);
  EXPECT_LE(size_t(allocator->GetStats().reserved_bytes.current), reserved - 1);
  absl::Status too_low = allocator->SetBudget(1 * kMiB);
  ASSERT_FALSE(too_low.ok());
  EXPECT_THAT(std::string(too_low.message()), HasSubstr("free or evict tensors first"));
  EXPECT_EQ(allocator->budget(), reserved - 1);
  EXPECT_FALSE(allocator->Allocate(40 * kMiB).ok());  // the new, lower cap holds
  ASSERT_TRUE(allocator->SetBudget(AllocatorConfig::kUnlimited).ok());
  EXPECT_TRUE(allocator->Allocate(40 * kMiB).ok());
  ASSERT_TRUE(allocator->Free(a).ok());
  EXPECT_TRUE(allocator->CheckInvariants().ok());
}

}  // namespace
}  // namespace dtr::alloc
