// The fragmented-heap eviction measurement; see fragmented_heap_eviction.h.
#include "tests/allocator/fragmented_heap_eviction.h"

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/fake_backend.h"

namespace dtr::alloc::testing {

namespace {
constexpr size_t kMiB = size_t{1} << 20;
}  // namespace

EvictionMeasurement& EvictionMeasurement::operator+=(const EvictionMeasurement& o) {
  requests += o.requests;
  requested_bytes += o.requested_bytes;
  evicted_bytes += o.evicted_bytes;
  beyond_request += o.beyond_request;
  evicted_blocks += o.evicted_blocks;
  failures += o.failures;
  errors += o.errors;
  return *this;
}

std::string EvictionMeasurement::ToString(const std::string& name) const {
  return absl::StrFormat(
      "eviction %-20s %d requests needing eviction, requested %.1f MiB, evicted %.1f MiB (%.2fx) "
      "in %d blocks, evicted beyond request %.1f MiB (%.2f MiB/request), failures %d",
      name, requests, requested_bytes / double(kMiB), evicted_bytes / double(kMiB),
      requested_bytes ? double(evicted_bytes) / double(requested_bytes) : 0.0, evicted_blocks,
      beyond_request / double(kMiB), beyond_request / double(kMiB) / double(std::max<size_t>(requests, 1)),
      failures);
}

EvictionMeasurement MeasureOnFragmentedHeap(std::unique_ptr<EvictionStrategy> strategy, uint64_t seed) {
  FakeBackend backend;
  AllocatorConfig config;
  config.budget_bytes = 400 * kMiB;
  config.shrink_segment_to_fit_budget = false;
  auto allocator = std::move(*CachingAllocator::Create(config, &backend));
  EvictionMeasurement m;
  std::mt19937_64 rng(seed);
  std::map<void*, double> scores;  // the evictable "tensors"
  std::vector<void*> blocks;
  while (true) {
    absl::StatusOr<void*> p = allocator->Allocate((1 + rng() % 8) * kMiB / 2 + kMiB / 2);
    if (!p.ok()) break;
    blocks.push_back(*p);
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i < blocks.size() * 2 / 5) {
      if (!allocator->Free(blocks[i]).ok()) ++m.errors;
    } else {
      scores[blocks[i]] = double(rng() % 1000000);
    }
  }
  size_t evicted_blocks = 0;
  CandidateEvictionHandler::Callbacks callbacks;
  callbacks.list_candidates = [&](const EvictionRequest&) {
    std::vector<EvictionCandidate> candidates;
    for (const auto& [ptr, score] : scores) candidates.push_back({ptr, score});
    return candidates;
  };
  callbacks.evict = [&](const EvictionCandidate& c) {
    if (scores.erase(c.ptr) == 0) return false;
    ++evicted_blocks;
    // Freeing and checking from inside MakeRoom would deadlock if the allocator held its lock.
    bool ok = allocator->Free(c.ptr).ok() && allocator->CheckInvariants().ok();
    if (!ok) ++m.errors;
    return ok;
  };
  CandidateEvictionHandler handler(allocator.get(), std::move(strategy), callbacks);
  allocator->SetEvictionHandler(&handler);
  for (int i = 0; i < 40; ++i) {
    const size_t request = 6 * kMiB;
    const int64_t freed_before = allocator->GetStats().eviction_bytes_freed;
    const size_t blocks_before = evicted_blocks;
    if (!allocator->Allocate(request).ok()) {
      ++m.failures;
      continue;
    }
    const size_t freed = size_t(allocator->GetStats().eviction_bytes_freed - freed_before);
    if (freed > 0) {
      ++m.requests;
      m.requested_bytes += request;
      m.evicted_bytes += freed;
      m.beyond_request += freed > request ? freed - request : 0;
      m.evicted_blocks += evicted_blocks - blocks_before;
    }
    if (!allocator->CheckInvariants().ok()) ++m.errors;
  }
  allocator->SetEvictionHandler(nullptr);
  return m;
}

}  // namespace dtr::alloc::testing
