// Reusable victim-selection policies for an EvictionHandler, and a ready-made handler that wires a
// policy to the runtime. The runtime supplies scored candidates (lower score = evict first, e.g.
// DTR's h(t) = cost / (size * staleness)) and a function that evicts one (frees its tensor, which
// ends in CachingAllocator::Free); the strategy decides which to evict, re-checking after each
// eviction whether the request now fits.
//  * ScoreOrderEvictionStrategy: evict by ascending score until the request fits.
//  * FragmentationAwareEvictionStrategy: first look for a single candidate whose freeing, merged
//    with the free space around it, produces a fitting block (lowest score among those); fall back
//    to score order. It evicts less on a fragmented heap.
#ifndef DTR_ALLOCATOR_EVICTION_STRATEGY_H_
#define DTR_ALLOCATOR_EVICTION_STRATEGY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/eviction_handler.h"

namespace dtr::alloc {

struct EvictionCandidate {
  void* ptr = nullptr;  // the allocated block the runtime would free (a tensor's storage)
  double score = 0.0;   // lower = evict first
};

// Evicts one candidate: the runtime frees the tensor (eventually CachingAllocator::Free(ptr)).
// Returns false if it could not (then the strategy moves on).
using EvictFn = std::function<bool(const EvictionCandidate&)>;

class EvictionStrategy {
 public:
  virtual ~EvictionStrategy() = default;
  virtual std::string Name() const = 0;
  // Evicts candidates until allocator.CanSatisfy(request) holds or none is left. Called without
  // the allocator's mutex; returns what it freed (pinned_bytes left 0 for the caller to fill).
  virtual EvictionResult Evict(CachingAllocator& allocator, const EvictionRequest& request,
                               std::vector<EvictionCandidate> candidates,
                               const EvictFn& evict) const = 0;
};

class ScoreOrderEvictionStrategy : public EvictionStrategy {
 public:
  std::string Name() const override { return "score-order"; }
  EvictionResult Evict(CachingAllocator& allocator, const EvictionRequest& request,
                       std::vector<EvictionCandidate> candidates,
                       const EvictFn& evict) const override;
};

class FragmentationAwareEvictionStrategy : public EvictionStrategy {
 public:
  std::string Name() const override { return "fragmentation-aware"; }
  EvictionResult Evict(CachingAllocator& allocator, const EvictionRequest& request,
                       std::vector<EvictionCandidate> candidates,
                       const EvictFn& evict) const override;
  // The victim this strategy evicts first among candidates sorted by score (lowest first): the
  // lowest-scored whose freeing alone satisfies the request (*fits_alone = true), else the
  // lowest-scored; nullptr for none. For a caller that evicts one victim and ranks again (Note
  // [One victim at a time], hooks/engine.cc).
  static const EvictionCandidate* ChooseFirst(CachingAllocator& allocator, const EvictionRequest& request,
                                              const std::vector<EvictionCandidate>& by_score,
                                              bool* fits_alone = nullptr);
};

// An EvictionHandler built from runtime callbacks and a strategy. This is how the DTR runtime
// plugs into the allocator:
//
//   CandidateEvictionHandler::Callbacks callbacks;
//   callbacks.list_candidates = [&](const EvictionRequest& r) { return runtime.Candidates(r); };
//   callbacks.evict = [&](const EvictionCandidate& c) { return runtime.Evict(c.ptr); };
//   callbacks.pinned_bytes = [&] { return runtime.PinnedBytes(); };
//   CandidateEvictionHandler handler(allocator.get(),
//       std::make_unique<FragmentationAwareEvictionStrategy>(), std::move(callbacks));
//   allocator->SetEvictionHandler(&handler);
//
// The callbacks run without the allocator's mutex (see eviction_handler.h), possibly on several
// threads at once; they must not hold a runtime lock that Allocate callers may also hold.
class CandidateEvictionHandler : public EvictionHandler {
 public:
  struct Callbacks {
    // Evictable allocated blocks with their scores (any order).
    std::function<std::vector<EvictionCandidate>(const EvictionRequest&)> list_candidates;
    EvictFn evict;
    // Allocated bytes that cannot be evicted; may be empty (reports 0).
    std::function<size_t()> pinned_bytes;
  };

  CandidateEvictionHandler(CachingAllocator* allocator, std::unique_ptr<EvictionStrategy> strategy,
                           Callbacks callbacks);

  EvictionResult MakeRoom(const EvictionRequest& request) override;
  size_t PinnedBytes() const override;
  const EvictionStrategy& strategy() const { return *strategy_; }

 private:
  CachingAllocator* const allocator_;
  const std::unique_ptr<EvictionStrategy> strategy_;
  const Callbacks callbacks_;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_EVICTION_STRATEGY_H_
