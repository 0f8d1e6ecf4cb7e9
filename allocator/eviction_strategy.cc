// Victim-selection policies and the callback-based EvictionHandler (see eviction_strategy.h).
#include "allocator/eviction_strategy.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dtr::alloc {
namespace {

// Evicts `candidate` if it is still an allocated block; adds its size to `result`.
bool EvictOne(CachingAllocator& allocator, const EvictionCandidate& candidate,
              const EvictFn& evict, EvictionResult& result) {
  absl::StatusOr<size_t> size = allocator.BlockSize(candidate.ptr);
  if (!size.ok()) return false;  // already gone (freed by another thread)
  if (!evict(candidate)) return false;
  result.bytes_freed += *size;
  ++result.blocks_freed;
  return true;
}

void SortByScore(std::vector<EvictionCandidate>& candidates) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const EvictionCandidate& a, const EvictionCandidate& b) {
                     return a.score < b.score;
                   });
}

}  // namespace

EvictionResult ScoreOrderEvictionStrategy::Evict(CachingAllocator& allocator,
                                                 const EvictionRequest& request,
                                                 std::vector<EvictionCandidate> candidates,
                                                 const EvictFn& evict) const {
  EvictionResult result;
  if (allocator.CanSatisfy(request)) {
    result.satisfied = true;
    return result;
  }
  SortByScore(candidates);
  for (const EvictionCandidate& candidate : candidates) {
    if (!EvictOne(allocator, candidate, evict, result)) continue;
    if (allocator.CanSatisfy(request)) {
      result.satisfied = true;
      break;
    }
  }
  return result;
}

const EvictionCandidate* FragmentationAwareEvictionStrategy::ChooseFirst(
    CachingAllocator& allocator, const EvictionRequest& request, const std::vector<EvictionCandidate>& by_score,
    bool* fits_alone) {
  if (fits_alone != nullptr) *fits_alone = false;
  for (const EvictionCandidate& c : by_score) {
    // An infinite score marks a victim of last resort (Note [Results awaiting their reader],
    // runtime/eviction_search.cc): never chosen for its fit, only by score order once the others
    // are gone.
    if (std::isinf(c.score)) break;
    if (!allocator.WouldSatisfyIfFreed(c.ptr, request)) continue;
    if (fits_alone != nullptr) *fits_alone = true;
    return &c;
  }
  return by_score.empty() ? nullptr : &by_score.front();
}

EvictionResult FragmentationAwareEvictionStrategy::Evict(
    CachingAllocator& allocator, const EvictionRequest& request,
    std::vector<EvictionCandidate> candidates, const EvictFn& evict) const {
  EvictionResult result;
  if (allocator.CanSatisfy(request)) {
    result.satisfied = true;
    return result;
  }
  SortByScore(candidates);
  // One victim that is enough on its own, merged with the free space around it: the first such in
  // score order has the lowest score.
  bool fits_alone;
  const EvictionCandidate* first = ChooseFirst(allocator, request, candidates, &fits_alone);
  if (fits_alone) {
    const EvictionCandidate chosen = *first;
    candidates.erase(candidates.begin() + (first - candidates.data()));
    if (EvictOne(allocator, chosen, evict, result) && allocator.CanSatisfy(request)) {
      result.satisfied = true;
      return result;
    }
    // raced with another thread or the evict callback declined: fall back
  }
  EvictionResult rest = ScoreOrderEvictionStrategy().Evict(allocator, request,
                                                           std::move(candidates), evict);
  result.bytes_freed += rest.bytes_freed;
  result.blocks_freed += rest.blocks_freed;
  result.satisfied = rest.satisfied;
  return result;
}

CandidateEvictionHandler::CandidateEvictionHandler(CachingAllocator* allocator,
                                                   std::unique_ptr<EvictionStrategy> strategy,
                                                   Callbacks callbacks)
    : allocator_(allocator), strategy_(std::move(strategy)), callbacks_(std::move(callbacks)) {}

EvictionResult CandidateEvictionHandler::MakeRoom(const EvictionRequest& request) {
  std::vector<EvictionCandidate> candidates;
  if (callbacks_.list_candidates) candidates = callbacks_.list_candidates(request);
  EvictionResult result;
  if (callbacks_.evict) {
    result = strategy_->Evict(*allocator_, request, std::move(candidates), callbacks_.evict);
  }
  result.pinned_bytes = PinnedBytes();
  return result;
}

size_t CandidateEvictionHandler::PinnedBytes() const {
  return callbacks_.pinned_bytes ? callbacks_.pinned_bytes() : 0;
}

}  // namespace dtr::alloc
