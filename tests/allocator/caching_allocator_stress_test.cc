// Multi-threaded stress test on the host backend: threads allocate, fill each block with a pattern
// derived from its address, check it before freeing, record streams and empty the cache
// concurrently; a second test evicts across threads through a re-entrant eviction handler. Meant
// to be run under ThreadSanitizer as well.
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <mutex>  // std::mutex: visible to ThreadSanitizer even with a prebuilt abseil
#include "allocator/caching_allocator.h"
#include "allocator/eviction_strategy.h"
#include "allocator/host_backend.h"
#include "gtest/gtest.h"
#include "tests/allocator/test_util.h"

namespace dtr::alloc {
namespace {

using ::dtr::alloc::testing::kKiB;
using ::dtr::alloc::testing::kMiB;
using ::dtr::alloc::testing::MakeAllocator;

uint64_t PatternWord(uintptr_t base, size_t word) {
  return (uint64_t(base) * 0x9E3779B97F4A7C15ull) ^ (word * 0xD1B54A32D192ED03ull);
}

// Writes the pattern to a bounded sample of the block's words (all of small blocks; the first and
// last 512 words and one word per 4 KiB of large ones) so that the test stays fast under TSan.
template <typename Fn>
void ForSampledWords(size_t bytes, Fn fn) {
  const size_t words = bytes / 8;
  if (words <= 2048) {
    for (size_t w = 0; w < words; ++w) fn(w);
    return;
  }
  for (size_t w = 0; w < 512; ++w) fn(w);
  for (size_t w = 512; w < words - 512; w += 512) fn(w);
  for (size_t w = words - 512; w < words; ++w) fn(w);
}

void Fill(void* p, size_t bytes) {
  auto* words = static_cast<uint64_t*>(p);
  const auto base = reinterpret_cast<uintptr_t>(p);
  ForSampledWords(bytes, [&](size_t w) { words[w] = PatternWord(base, w); });
}

bool Check(void* p, size_t bytes) {
  const auto* words = static_cast<const uint64_t*>(p);
  const auto base = reinterpret_cast<uintptr_t>(p);
  bool ok = true;
  ForSampledWords(bytes, [&](size_t w) { ok = ok && words[w] == PatternWord(base, w); });
  return ok;
}

size_t StressSize(std::mt19937_64& rng) {
  const int pick = int(rng() % 100);
  if (pick < 70) return 8 + rng() % (256 * kKiB);
  if (pick < 97) return kMiB + rng() % (3 * kMiB);
  return 10 * kMiB + rng() % (6 * kMiB);
}

TEST(CachingAllocatorStressTest, ConcurrentAllocateFreeKeepsBlocksDisjoint) {
  HostBackend backend;
  AllocatorConfig config;
  config.budget_bytes = 512 * kMiB;
  auto allocator = MakeAllocator(config, &backend);
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 3000;
  std::atomic<int64_t> corrupted{0}, ooms{0}, allocations{0};
  std::atomic<bool> done{false};

  auto worker = [&](int id) {
    std::mt19937_64 rng(1000 + id);
    struct Live {
      void* ptr;
      size_t size;
    };
    std::vector<Live> live;
    for (int op = 0; op < kOpsPerThread; ++op) {
      if (live.size() < 24 && (live.empty() || rng() % 100 < 55)) {
        const size_t size = StressSize(rng);
        absl::StatusOr<void*> p = allocator->Allocate(size, Stream{uint64_t(id)});
        if (!p.ok()) {
          ++ooms;
          continue;
        }
        ++allocations;
        Fill(*p, size);
        if (rng() % 10 == 0) {
          EXPECT_TRUE(allocator->RecordStream(*p, Stream{99}).ok());
        }
        live.push_back({*p, size});
      } else {
        const size_t index = rng() % live.size();
        if (!Check(live[index].ptr, live[index].size)) ++corrupted;
        EXPECT_TRUE(allocator->Free(live[index].ptr).ok());
        live[index] = live.back();
        live.pop_back();
      }
    }
    for (const Live& l : live) {
      if (!Check(l.ptr, l.size)) ++corrupted;
      EXPECT_TRUE(allocator->Free(l.ptr).ok());
    }
  };
  // A janitor thread empties the cache and inspects the allocator concurrently.
  std::thread janitor([&] {
    while (!done.load()) {
      allocator->EmptyCache();
      EXPECT_TRUE(allocator->CheckInvariants().ok());
      EXPECT_LE(allocator->GetStats().reserved_bytes.current, int64_t(config.budget_bytes));
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (std::thread& t : threads) t.join();
  done = true;
  janitor.join();

  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(ooms.load(), 0);
  EXPECT_GT(allocations.load(), kThreads * kOpsPerThread / 3);
  DTR_EXPECT_OK(allocator->CheckInvariants());
  AllocatorStats stats = allocator->GetStats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.num_allocs, allocations.load());
  EXPECT_LE(stats.reserved_bytes.peak, int64_t(config.budget_bytes));
  allocator->EmptyCache();
  EXPECT_EQ(allocator->GetStats().reserved_bytes.current, 0);
  EXPECT_EQ(backend.live_bytes(), 0u);
}

// Threads allocate under a tight budget and publish their blocks as evictable; the eviction
// handler, run by whichever thread runs out of room, frees other threads' blocks through
// Allocator::Free from inside MakeRoom.
TEST(CachingAllocatorStressTest, ConcurrentEvictionThroughReentrantHandler) {
  HostBackend backend;
  AllocatorConfig config;
  config.budget_bytes = 48 * kMiB;
  auto allocator = MakeAllocator(config, &backend);

  std::mutex registry_mu;
  struct Entry {
    size_t size;
    double score;
  };
  std::unordered_map<void*, Entry> evictable;  // guarded by registry_mu
  std::atomic<int64_t> corrupted{0}, evicted{0}, ooms{0};

  CandidateEvictionHandler::Callbacks callbacks;
  callbacks.list_candidates = [&](const EvictionRequest&) {
             std::lock_guard<std::mutex> lock(registry_mu);
             std::vector<EvictionCandidate> candidates;
             for (const auto& [ptr, entry] : evictable) candidates.push_back({ptr, entry.score});
             return candidates;
  };
  callbacks.evict = [&](const EvictionCandidate& c) {
             std::lock_guard<std::mutex> lock(registry_mu);  // lock order: registry -> allocator
             auto it = evictable.find(c.ptr);
             if (it == evictable.end()) return false;  // reclaimed or evicted meanwhile
             if (!Check(c.ptr, it->second.size)) ++corrupted;
             evictable.erase(it);
             EXPECT_TRUE(allocator->Free(c.ptr).ok());
             ++evicted;
             return true;
  };
  CandidateEvictionHandler handler(
      allocator.get(), std::make_unique<FragmentationAwareEvictionStrategy>(), callbacks);
  allocator->SetEvictionHandler(&handler);

  auto worker = [&](int id) {
    std::mt19937_64 rng(7 + id);
    std::vector<void*> mine;
    for (int op = 0; op < 1500; ++op) {
      if (mine.size() < 16 && rng() % 100 < 60) {
        const size_t size = rng() % 2 ? 4 * kKiB + rng() % (512 * kKiB) : kMiB + rng() % (4 * kMiB);
        absl::StatusOr<void*> p = allocator->Allocate(size);  // may evict others' blocks
        if (!p.ok()) {
          ++ooms;
          continue;
        }
        Fill(*p, size);
        std::lock_guard<std::mutex> lock(registry_mu);
        evictable[*p] = Entry{size, double(rng() % 1000)};
        mine.push_back(*p);
      } else if (!mine.empty()) {
        const size_t index = rng() % mine.size();
        void* p = mine[index];
        mine[index] = mine.back();
        mine.pop_back();
        std::lock_guard<std::mutex> lock(registry_mu);
        auto it = evictable.find(p);
        if (it == evictable.end()) continue;  // evicted by someone
        if (!Check(p, it->second.size)) ++corrupted;
        evictable.erase(it);
        EXPECT_TRUE(allocator->Free(p).ok());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(worker, i);
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_GT(evicted.load(), 0);
  AllocatorStats stats = allocator->GetStats();
  EXPECT_LE(stats.reserved_bytes.peak, int64_t(config.budget_bytes));
  EXPECT_GT(stats.num_eviction_calls, 0);
  DTR_EXPECT_OK(allocator->CheckInvariants());
  std::printf("eviction stress: %lld evictions, %lld OOMs, %lld eviction calls, peak reserved "
              "%lld MiB of %zu MiB\n",
              (long long)evicted.load(), (long long)ooms.load(),
              (long long)stats.num_eviction_calls, (long long)(stats.reserved_bytes.peak >> 20),
              config.budget_bytes >> 20);
  for (auto& [ptr, entry] : evictable) EXPECT_TRUE(allocator->Free(ptr).ok());
  EXPECT_EQ(allocator->GetStats().allocated_bytes.current, 0);
}

}  // namespace
}  // namespace dtr::alloc
