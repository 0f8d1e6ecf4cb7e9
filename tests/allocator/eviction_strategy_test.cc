// Tests for the eviction strategies and CandidateEvictionHandler: score order, the
// fragmentation-aware single-victim preference, re-entrant eviction through Allocator::Free,
// pinned bytes in OOM reports, and a measured comparison of bytes evicted beyond the request on a
// fragmented heap.
#include "allocator/eviction_strategy.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "allocator/fake_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/fragmented_heap_eviction.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

using ::dtr::alloc::testing::BudgetConfig;
using ::dtr::alloc::testing::kMiB;
using ::dtr::alloc::testing::MakeAllocator;
using ::testing::HasSubstr;

// A toy runtime: live "tensors" (blocks) with scores, some pinned; evicting one frees its block
// through Allocator::Free from inside MakeRoom.
struct ToyRuntime {
  explicit ToyRuntime(CachingAllocator* a) : allocator(a) {}
  CachingAllocator* allocator;
  std::map<void*, double> scores;  // evictable blocks
  std::map<void*, size_t> pinned;
  std::vector<void*> eviction_order;

  CandidateEvictionHandler::Callbacks Callbacks() {
    CandidateEvictionHandler::Callbacks callbacks;
    callbacks.list_candidates = [this](const EvictionRequest&) {
      std::vector<EvictionCandidate> candidates;
      for (const auto& [ptr, score] : scores) candidates.push_back({ptr, score});
      return candidates;
    };
    callbacks.evict = [this](const EvictionCandidate& c) {
      if (scores.erase(c.ptr) == 0) return false;
      EXPECT_TRUE(allocator->Free(c.ptr).ok());
      EXPECT_TRUE(allocator->CheckInvariants().ok());  // would deadlock if the lock were held
      eviction_order.push_back(c.ptr);
      return true;
    };
    callbacks.pinned_bytes = [this] {
      size_t total = 0;
      for (const auto& [ptr, size] : pinned) total += size;
      return total;
    };
    return callbacks;
  }
};

// Six 3 MiB blocks in one 20 MiB segment (budget = that segment), then 2 MiB tail:
//   [b0 3][b1 3][b2 3][b3 3][b4 3][b5 3][tail 2 free]
struct SixBlocks {
  FakeBackend backend;
  std::unique_ptr<CachingAllocator> allocator;
  std::vector<void*> b;
  SixBlocks() {
    AllocatorConfig config = BudgetConfig(20 * kMiB);
    allocator = MakeAllocator(config, &backend);
    for (int i = 0; i < 6; ++i) b.push_back(*allocator->Allocate(3 * kMiB));
  }
};

TEST(ScoreOrderEvictionStrategyTest, EvictsLowestScoresUntilTheRequestFits) {
  SixBlocks heap;
  ToyRuntime runtime(heap.allocator.get());
  // Scores make b1 and b3 cheapest: evicting b1 gives 3 MiB, b3 another separate 3 MiB, then b4
  // (next cheapest) merges with b3 into 6 MiB.
  const double scores[] = {9, 1, 8, 2, 3, 7};
  for (int i = 0; i < 6; ++i) runtime.scores[heap.b[i]] = scores[i];
  CandidateEvictionHandler handler(heap.allocator.get(),
                                   std::make_unique<ScoreOrderEvictionStrategy>(),
                                   runtime.Callbacks());
  heap.allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = heap.allocator->Allocate(5 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(runtime.eviction_order, (std::vector<void*>{heap.b[1], heap.b[3], heap.b[4]}));
  EXPECT_EQ(*p, heap.b[3]);
  AllocatorStats stats = heap.allocator->GetStats();
  EXPECT_EQ(stats.eviction_bytes_freed, int64_t(9 * kMiB));
  EXPECT_EQ(stats.num_eviction_calls, 1);
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

TEST(FragmentationAwareEvictionStrategyTest, PrefersOneVictimNextToFreeSpace) {
  SixBlocks heap;
  ToyRuntime runtime(heap.allocator.get());
  DTR_ASSERT_OK(heap.allocator->Free(heap.b[2]));  // hole of 3 MiB between b1 and b3
  const double scores[] = {1, 5, 0, 4, 2, 3};  // b0 is cheapest, but alone gives only 3 MiB
  for (int i : {0, 1, 3, 4, 5}) runtime.scores[heap.b[i]] = scores[i];
  CandidateEvictionHandler handler(heap.allocator.get(),
                                   std::make_unique<FragmentationAwareEvictionStrategy>(),
                                   runtime.Callbacks());
  heap.allocator->SetEvictionHandler(&handler);
  EvictionRequest request = heap.allocator->MakeRequest(5 * kMiB, Stream{});
  EXPECT_FALSE(heap.allocator->CanSatisfy(request));
  EXPECT_FALSE(heap.allocator->WouldSatisfyIfFreed(heap.b[0], request));
  EXPECT_TRUE(heap.allocator->WouldSatisfyIfFreed(heap.b[1], request));
  EXPECT_TRUE(heap.allocator->WouldSatisfyIfFreed(heap.b[3], request));
  EXPECT_TRUE(heap.allocator->WouldSatisfyIfFreed(heap.b[5], request));  // merges with the tail
  absl::StatusOr<void*> p = heap.allocator->Allocate(5 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  // Among b1 (5), b3 (4), b5 (3) the lowest score that suffices alone is b5.
  EXPECT_EQ(runtime.eviction_order, (std::vector<void*>{heap.b[5]}));
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

// Note [Results awaiting their reader] (runtime/eviction_search.cc): the runtime ranks victims of last resort
// with an infinite score. One that would suffice alone is not taken before the finite ones.
TEST(FragmentationAwareEvictionStrategyTest, NeverPicksAVictimOfLastResortAlone) {
  SixBlocks heap;
  ToyRuntime runtime(heap.allocator.get());
  DTR_ASSERT_OK(heap.allocator->Free(heap.b[2]));  // hole of 3 MiB between b1 and b3
  const double inf = std::numeric_limits<double>::infinity();
  const double scores[] = {1, inf, 0, inf, 2, inf};  // b1, b3, b5 would each suffice alone
  for (int i : {0, 1, 3, 4, 5}) runtime.scores[heap.b[i]] = scores[i];
  CandidateEvictionHandler handler(heap.allocator.get(),
                                   std::make_unique<FragmentationAwareEvictionStrategy>(),
                                   runtime.Callbacks());
  heap.allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = heap.allocator->Allocate(5 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  // Score order instead: b0 and b4 first (neither makes 5 MiB next to the hole), and only then
  // the first last resort, b1, which joins b0 and the hole.
  EXPECT_EQ(runtime.eviction_order, (std::vector<void*>{heap.b[0], heap.b[4], heap.b[1]}));
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

// ChooseFirst is the strategy's first pick, for a caller that evicts one victim and ranks again
// (Note [One victim at a time], hooks/engine.cc): the best that fits alone, else the best, and
// never a victim of last resort for its fit.
TEST(FragmentationAwareEvictionStrategyTest, ChooseFirstPicksTheBestThatFitsAloneElseTheBest) {
  SixBlocks heap;
  DTR_ASSERT_OK(heap.allocator->Free(heap.b[2]));  // hole of 3 MiB between b1 and b3
  const EvictionRequest request = heap.allocator->MakeRequest(5 * kMiB, Stream{});
  const double inf = std::numeric_limits<double>::infinity();
  bool fits_alone = true;
  // b0 alone gives 3 MiB; b5 merges with the 2 MiB tail.
  std::vector<EvictionCandidate> by_score = {{heap.b[0], 1}, {heap.b[4], 2}, {heap.b[5], 3}, {heap.b[3], 4}};
  const EvictionCandidate* first =
      FragmentationAwareEvictionStrategy::ChooseFirst(*heap.allocator, request, by_score, &fits_alone);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->ptr, heap.b[5]);
  EXPECT_TRUE(fits_alone);
  // None fits alone: the best.
  by_score = {{heap.b[0], 1}, {heap.b[4], 2}};
  first = FragmentationAwareEvictionStrategy::ChooseFirst(*heap.allocator, request, by_score, &fits_alone);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->ptr, heap.b[0]);
  EXPECT_FALSE(fits_alone);
  // b3 would fit alone but is a last resort: the best finite one comes first.
  by_score = {{heap.b[0], 1}, {heap.b[3], inf}};
  first = FragmentationAwareEvictionStrategy::ChooseFirst(*heap.allocator, request, by_score, &fits_alone);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->ptr, heap.b[0]);
  EXPECT_FALSE(fits_alone);
  EXPECT_EQ(FragmentationAwareEvictionStrategy::ChooseFirst(*heap.allocator, request, {}, &fits_alone), nullptr);
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

TEST(FragmentationAwareEvictionStrategyTest, FallsBackToScoreOrder) {
  SixBlocks heap;
  ToyRuntime runtime(heap.allocator.get());
  for (int i = 0; i < 6; ++i) runtime.scores[heap.b[i]] = 10 - i;
  CandidateEvictionHandler handler(heap.allocator.get(),
                                   std::make_unique<FragmentationAwareEvictionStrategy>(),
                                   runtime.Callbacks());
  heap.allocator->SetEvictionHandler(&handler);
  // 8 MiB: no single 3 MiB block suffices (b5 + tail = 5 MiB); score order is b5, b4.
  absl::StatusOr<void*> p = heap.allocator->Allocate(8 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(runtime.eviction_order, (std::vector<void*>{heap.b[5], heap.b[4]}));
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

TEST(FragmentationAwareEvictionStrategyTest, FreeingAWholeSegmentCountsAsRoomToGrow) {
  FakeBackend backend;
  AllocatorConfig config = BudgetConfig(22 * kMiB);
  config.shrink_segment_to_fit_budget = false;
  auto allocator = MakeAllocator(config, &backend);
  void* small = *allocator->Allocate(kMiB);   // alone in a 2 MiB small segment
  void* large = *allocator->Allocate(15 * kMiB);  // 20 MiB large segment, 5 MiB free tail
  EvictionRequest request = allocator->MakeRequest(12 * kMiB, Stream{});  // needs a 12 MiB segment
  EXPECT_FALSE(allocator->CanSatisfy(request));
  // Freeing `small` empties its segment, but 2 MiB released is not enough room for 12 MiB.
  EXPECT_FALSE(allocator->WouldSatisfyIfFreed(small, request));
  // Freeing `large` empties a 20 MiB segment: releasing it leaves room to grow.
  EXPECT_TRUE(allocator->WouldSatisfyIfFreed(large, request));
}

TEST(CandidateEvictionHandlerTest, PinnedBytesAppearInTheOutOfMemoryReport) {
  SixBlocks heap;
  ToyRuntime runtime(heap.allocator.get());
  runtime.scores[heap.b[0]] = 1;
  for (int i = 1; i < 6; ++i) runtime.pinned[heap.b[i]] = 3 * kMiB;
  CandidateEvictionHandler handler(heap.allocator.get(),
                                   std::make_unique<FragmentationAwareEvictionStrategy>(),
                                   runtime.Callbacks());
  heap.allocator->SetEvictionHandler(&handler);
  absl::StatusOr<void*> p = heap.allocator->Allocate(7 * kMiB);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("pinned (unevictable) 15.00 MiB (15728640 bytes)"));
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("eviction freed 3.00 MiB (3145728 bytes) in 1 blocks"));
  EXPECT_EQ(runtime.eviction_order, (std::vector<void*>{heap.b[0]}));
  DTR_EXPECT_OK(heap.allocator->CheckInvariants());
}

// --- Measured comparison on a fragmented heap (shared with bench/allocator_bench) ---

TEST(EvictionComparisonTest, FragmentationAwareEvictsLessBeyondTheRequest) {
  using ::dtr::alloc::testing::EvictionMeasurement;
  using ::dtr::alloc::testing::MeasureOnFragmentedHeap;
  EvictionMeasurement simple_total, aware_total;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    simple_total += MeasureOnFragmentedHeap(std::make_unique<ScoreOrderEvictionStrategy>(), seed);
    aware_total += MeasureOnFragmentedHeap(std::make_unique<FragmentationAwareEvictionStrategy>(), seed);
  }
  std::printf("%s\n%s\n", simple_total.ToString("score-order").c_str(),
              aware_total.ToString("fragmentation-aware").c_str());
  ASSERT_GT(simple_total.requests, 0u);
  ASSERT_GT(aware_total.requests, 0u);
  EXPECT_EQ(simple_total.errors + aware_total.errors, 0u);
  EXPECT_EQ(simple_total.failures, 0u);
  EXPECT_EQ(aware_total.failures, 0u);
  EXPECT_LT(aware_total.evicted_bytes, simple_total.evicted_bytes);
  EXPECT_LE(aware_total.beyond_request, simple_total.beyond_request);
}

}  // namespace
}  // namespace dtr::alloc
