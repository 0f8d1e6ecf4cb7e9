// The callback through which the caching allocator asks the runtime (DTR) to evict tensors when a
// request cannot be served within the budget (rung 3 of the retry ladder).
//
// Contract, see Note [No lock across eviction] in caching_allocator.cc:
//  * MakeRoom is called WITHOUT the allocator's mutex held. The handler evicts by freeing tensors,
//    i.e. by calling CachingAllocator::Free (directly or through torch) on the same allocator, and
//    may query it (CanSatisfy, CoalescedFreeSizeIfFreed, WouldSatisfyIfFreed, ...).
//  * Several threads may be in MakeRoom at once (one per allocating thread); the handler guards
//    its own state. It may hold its own locks while calling into the allocator (lock order
//    handler -> allocator), so nobody may call Allocate while holding a lock that MakeRoom or
//    PinnedBytes takes.
//  * Allocations made from inside MakeRoom on the same thread never re-enter the handler.
//  * The handler must outlive the allocator (or be detached with SetEvictionHandler(nullptr)
//    while no allocation is in flight).
#ifndef DTR_ALLOCATOR_EVICTION_HANDLER_H_
#define DTR_ALLOCATOR_EVICTION_HANDLER_H_

#include <cstddef>
#include <string>

#include "allocator/size_classes.h"
#include "allocator/stream.h"

namespace dtr::alloc {

// What the allocator needs: room for one block of `rounded_bytes` in `pool` on `stream`.
// The byte counts describe the allocator's state when the request was made (informational: the
// handler should re-query the allocator, other threads run concurrently).
struct EvictionRequest {
  size_t requested_bytes = 0;  // what the caller asked for
  size_t rounded_bytes = 0;    // the block size that must fit
  Pool pool = Pool::kLarge;
  Stream stream;
  size_t budget_bytes = 0;
  size_t reserved_bytes = 0;
  size_t allocated_bytes = 0;
};

struct EvictionResult {
  size_t bytes_freed = 0;     // sum of the sizes of the blocks the handler freed
  size_t blocks_freed = 0;
  size_t pinned_bytes = 0;    // allocated bytes the handler could not evict (reported in OOMs);
                              // may be left 0 when satisfied (the report then asks PinnedBytes)
  bool satisfied = false;     // the handler believes the request now fits
};

class EvictionHandler {
 public:
  virtual ~EvictionHandler() = default;
  // Frees blocks (via CachingAllocator::Free) until `request` fits or nothing evictable is left.
  virtual EvictionResult MakeRoom(const EvictionRequest& request) = 0;
  // Bytes currently held by blocks the handler will not evict (pinned, in use by the running op).
  // Queried without the allocator's mutex when building an out-of-memory report.
  virtual size_t PinnedBytes() const { return 0; }
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_EVICTION_HANDLER_H_
