// Fuzz-style test: thousands of random allocate / free / record-stream / event-completion /
// EmptyCache / eviction sequences under random budgets, configs and backend capacities (fixed
// seeds), with CheckInvariants() after every step, the budget never exceeded and the stats equal
// to the snapshot's sums.
#include <algorithm>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/fake_backend.h"
#include "gtest/gtest.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

using ::dtr::alloc::testing::kKiB;
using ::dtr::alloc::testing::kMiB;
using ::dtr::alloc::testing::MakeAllocator;

size_t RandomSize(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double pick = unit(rng);
  double lo, hi;
  if (pick < 0.55) {
    lo = 1, hi = double(kMiB);  // small pool
  } else if (pick < 0.93) {
    lo = double(kMiB), hi = 10.0 * kMiB;  // large pool, shared 20 MiB segments
  } else {
    lo = 10.0 * kMiB, hi = 40.0 * kMiB;  // own segments
  }
  return static_cast<size_t>(std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo))));
}

// Evicts random live blocks of the fuzz loop from inside MakeRoom, via Allocator::Free.
class RandomEvictor : public EvictionHandler {
 public:
  RandomEvictor(CachingAllocator* allocator, std::vector<void*>* live, std::mt19937_64* rng)
      : allocator_(allocator), live_(live), rng_(rng) {}
  EvictionResult MakeRoom(const EvictionRequest& request) override {
    EvictionResult result;
    const int max_victims = int((*rng_)() % 6);
    for (int i = 0; i < max_victims && !live_->empty(); ++i) {
      if (allocator_->CanSatisfy(request)) break;
      const size_t index = (*rng_)() % live_->size();
      void* victim = (*live_)[index];
      const size_t size = *allocator_->BlockSize(victim);
      EXPECT_TRUE(allocator_->Free(victim).ok());
      EXPECT_TRUE(allocator_->CheckInvariants().ok());
      (*live_)[index] = live_->back();
      live_->pop_back();
      result.bytes_freed += size;
      ++result.blocks_freed;
    }
    result.satisfied = allocator_->CanSatisfy(request);
    ++calls;
    return result;
  }
  size_t PinnedBytes() const override { return 0; }
  int calls = 0;

 private:
  CachingAllocator* allocator_;
  std::vector<void*>* live_;
  std::mt19937_64* rng_;
};

struct FuzzTotals {
  int64_t allocs = 0, ooms = 0, evictions = 0, flushes = 0, pending = 0, backend_failures = 0, resizes = 0, splits = 0, donors = 0;
};

void RunOneSeed(uint64_t seed, int steps, FuzzTotals& totals) {
  std::mt19937_64 rng(seed);
  static const size_t kBudgets[] = {4 * kMiB, 8 * kMiB, 24 * kMiB, 40 * kMiB, 64 * kMiB,
                                    128 * kMiB, AllocatorConfig::kUnlimited};
  AllocatorConfig config;
  config.budget_bytes = kBudgets[rng() % std::size(kBudgets)];
  config.shrink_segment_to_fit_budget = rng() % 4 != 0;
  config.enable_eviction = rng() % 3 != 0;
  config.exact_reuse = rng() % 3 == 0;
  // Sometimes the device itself is smaller than the budget: real OOMs from the backend.
  const size_t capacity = rng() % 4 == 0 ? (16 + rng() % 64) * kMiB : SIZE_MAX;
  FakeBackend backend(capacity);
  backend.set_resizable(rng() % 2 == 0);  // Note [Recycling a cached segment]
  // Sometimes resizable only from a size drawn from 64 KiB to 32 MiB, as HostBackend from its map
  // threshold: requests below it prefer to release the segments it cannot resize (Note [Small
  // requests keep resizable segments]). (Matters where set_resizable(true) was drawn.)
  if (rng() % 2 == 0) backend.set_resizable_from(size_t{1} << (16 + rng() % 10));
  if (rng() % 2 == 0) backend.set_page_bytes(size_t{4} << (rng() % 10));  // Note [Splitting a cached segment]
  auto allocator = MakeAllocator(config, &backend);
  ASSERT_NE(allocator, nullptr);
  std::vector<void*> live;
  RandomEvictor evictor(allocator.get(), &live, &rng);
  if (rng() % 2 == 0) allocator->SetEvictionHandler(&evictor);
  if (rng() % 5 == 0) backend.FailNthAllocation(1 + int64_t(rng() % 50));

  for (int step = 0; step < steps; ++step) {
    const int op = int(rng() % 100);
    if (op < 45) {
      const Stream stream{rng() % 3};
      absl::StatusOr<void*> p = allocator->Allocate(RandomSize(rng), stream);
      if (p.ok()) {
        ASSERT_TRUE(std::find(live.begin(), live.end(), *p) == live.end());
        live.push_back(*p);
      } else {
        ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
        ++totals.ooms;
      }
    } else if (op < 80) {
      if (!live.empty()) {
        const size_t index = rng() % live.size();
        DTR_ASSERT_OK(allocator->Free(live[index]));
        live[index] = live.back();
        live.pop_back();
      }
    } else if (op < 88) {
      if (!live.empty()) {
        DTR_ASSERT_OK(allocator->RecordStream(live[rng() % live.size()], Stream{rng() % 4}));
      }
    } else if (op < 94) {
      backend.CompleteEvents(Stream{rng() % 4});
    } else if (op < 97) {
      allocator->EmptyCache();
    } else if (!live.empty()) {
      // CoalescedFreeSizeIfFreed agrees with what freeing produces (when no stream uses).
      void* p = live[rng() % live.size()];
      const size_t predicted = *allocator->CoalescedFreeSizeIfFreed(p);
      DTR_ASSERT_OK(allocator->Free(p));
      live.erase(std::find(live.begin(), live.end(), p));
      if (predicted > 0) {
        bool found = false;
        for (const SegmentSnapshot& seg : allocator->Snapshot().segments) {
          for (const BlockSnapshot& b : seg.blocks) {
            if (b.address <= reinterpret_cast<uintptr_t>(p) &&
                reinterpret_cast<uintptr_t>(p) < b.address + b.size) {
              found = true;
              ASSERT_EQ(b.state, BlockState::kFree);
              ASSERT_EQ(b.size, predicted);
            }
          }
        }
        ASSERT_TRUE(found);
      }
    }
    DTR_ASSERT_OK(allocator->CheckInvariants());
    const MemorySnapshot snapshot = allocator->Snapshot();
    const MemorySnapshot::Totals sums = snapshot.ComputeTotals();
    ASSERT_LE(sums.reserved_bytes, config.budget_bytes);
    ASSERT_EQ(int64_t(sums.reserved_bytes), snapshot.stats.reserved_bytes.current);
    ASSERT_EQ(int64_t(sums.allocated_bytes), snapshot.stats.allocated_bytes.current);
    ASSERT_EQ(int64_t(sums.active_bytes), snapshot.stats.active_bytes.current);
    ASSERT_EQ(sums.allocated_blocks, int64_t(live.size()));
    ASSERT_EQ(backend.counters().live_bytes, sums.reserved_bytes);
    ASSERT_LE(size_t(snapshot.stats.reserved_bytes.peak), config.budget_bytes);
    totals.pending += sums.active_blocks - sums.allocated_blocks;
  }
  for (void* p : live) DTR_ASSERT_OK(allocator->Free(p));
  backend.CompleteAllEvents();
  allocator->EmptyCache();
  DTR_ASSERT_OK(allocator->CheckInvariants());
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, 0);
  EXPECT_EQ(backend.counters().live_bytes, 0u);
  EXPECT_EQ(backend.counters().bad_frees, 0);
  const AllocatorStats stats = allocator->GetStats();
  totals.allocs += stats.num_allocs;
  totals.evictions += evictor.calls;
  totals.flushes += stats.num_cache_flushes;
  totals.resizes += stats.num_segment_resizes;
  totals.splits += stats.num_segment_splits;
  totals.donors += stats.num_segment_donors;
  totals.backend_failures += stats.num_backend_failures;
}

TEST(CachingAllocatorFuzzTest, RandomSequencesKeepEveryInvariant) {
  FuzzTotals totals;
  // Many short sequences (fresh allocator, config and budget each) and a few long ones.
  constexpr int kShort = 1000, kLong = 30;
  constexpr int kSeeds = kShort + kLong;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RunOneSeed(seed, seed <= kShort ? 150 : 2500, totals);
    if (HasFatalFailure()) return;
  }
  std::printf("fuzz: %d seeds, %lld allocations, %lld OOMs, %lld eviction calls, %lld cache "
              "flushes, %lld segment resizes, %lld splits, %lld donors, %lld backend failures, %lld pending-block observations\n",
              kSeeds, (long long)totals.allocs, (long long)totals.ooms,
              (long long)totals.evictions, (long long)totals.flushes, (long long)totals.resizes, (long long)totals.splits, (long long)totals.donors,
              (long long)totals.backend_failures, (long long)totals.pending);
  // The workload must actually reach the interesting paths, or the test proves little.
  EXPECT_GT(totals.ooms, 0);
  EXPECT_GT(totals.evictions, 0);
  EXPECT_GT(totals.flushes, 0);
  EXPECT_GT(totals.resizes, 0);  // Note [Recycling a cached segment] was exercised
  EXPECT_GT(totals.splits, 0);  // Note [Splitting a cached segment] too
  EXPECT_GT(totals.donors, 0);  // and Note [Growing into cached pages]
  EXPECT_GT(totals.backend_failures, 0);
  EXPECT_GT(totals.pending, 0);
}

}  // namespace
}  // namespace dtr::alloc
