// A device-agnostic caching allocator modelled on PyTorch's CUDACachingAllocator: segments come
// from a DeviceMemoryBackend, are split into blocks and coalesced again on free; requests are
// rounded and served best-fit from per-pool free sets indexed by stream and size (free_set.h); blocks
// used on other streams are reused only after those streams' events complete. Unlike PyTorch, the
// budget is a hard cap on reserved bytes, and requests that do not fit climb a retry ladder that
// includes asking an EvictionHandler (the DTR runtime) to free tensors:
//   (1) cached free block  (2) grow within budget  (3) evict, retry 1-2
//   (4) release cached free segments, retry 1-2    (5) ResourceExhausted with a full report.
#ifndef DTR_ALLOCATOR_CACHING_ALLOCATOR_H_
#define DTR_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <mutex>  // std::mutex: visible to ThreadSanitizer even with a prebuilt abseil
#include "allocator/allocator_config.h"
#include "allocator/allocator_stats.h"
#include "allocator/device_memory_backend.h"
#include "allocator/eviction_handler.h"
#include "allocator/free_set.h"
#include "allocator/memory_snapshot.h"
#include "allocator/resize_gate.h"
#include "allocator/size_classes.h"
#include "allocator/stream.h"

namespace dtr::alloc {

class CachingAllocator {
 public:
  // `backend` is not owned and must outlive the allocator. Fails on an invalid config or a
  // backend whose alignment is not a power of two (Note [Block alignment]).
  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(const AllocatorConfig& config,
                                                                  DeviceMemoryBackend* backend);
  // Returns every segment to the backend. Blocks still allocated are released with their segment
  // (the caller's pointers dangle); pending events are destroyed without waiting.
  ~CachingAllocator();

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // fork(): the parent takes the allocator's lock before forking and releases it after, in both
  // processes, so the child never inherits it held by a thread it does not have.
  void LockForFork() { mu_.lock(); }
  void UnlockAfterFork() { mu_.unlock(); }

  // Allocates at least `bytes` (0 is served as one minimal block) for use on `stream`.
  // ResourceExhausted when the retry ladder fails; the message states the request, budget,
  // reserved, allocated, largest free block and pinned bytes.
  absl::StatusOr<void*> Allocate(size_t bytes, Stream stream = Stream());
  // Returns a block. InvalidArgument for a pointer that is not an allocated block (double free);
  // the backend's error if recording a stream event fails (the block then stays allocated).
  absl::Status Free(void* ptr);
  // Marks `ptr` as used on `stream` (PyTorch recordStream): when freed, the block is reused only
  // after the work queued on `stream` up to the free has completed.
  absl::Status RecordStream(void* ptr, Stream stream);
  // Releases every fully free segment to the backend (after polling pending events, never
  // waiting on them).
  void EmptyCache();

  // Changes the budget. Lowering it below what is reserved first releases cached free segments;
  // if reserved bytes still exceed the new budget, fails with FailedPrecondition and keeps the old
  // one (free or evict tensors first). AllocatorConfig::kUnlimited removes the cap.
  absl::Status SetBudget(size_t budget_bytes);
  size_t budget() const;

  // Installs (or, with nullptr, removes) the handler used by rung 3. Not owned.
  void SetEvictionHandler(EvictionHandler* handler);

  // --- Queries for eviction policies (each takes the mutex; results may be stale by the time the
  // caller acts when other threads run) ---
  // Size of the allocated block at `ptr` (its rounded size).
  absl::StatusOr<size_t> BlockSize(void* ptr) const;
  // Size of the free block that freeing `ptr` would produce right now, merged with free
  // neighbours in its segment; 0 if freeing would not produce a free block immediately (it has
  // uses recorded on other streams). NotFound for a pointer that is not an allocated block.
  absl::StatusOr<size_t> CoalescedFreeSizeIfFreed(void* ptr) const;
  // Whether Allocate(request.rounded_bytes, request.stream) would succeed now without evicting:
  // a cached block fits, or growth fits the budget once fully free segments are released.
  // Backend capacity (a real device OOM) is not foreseen.
  bool CanSatisfy(const EvictionRequest& request);
  // Whether CanSatisfy(request) would hold after freeing the allocated block at `ptr`.
  bool WouldSatisfyIfFreed(void* ptr, const EvictionRequest& request);
  // Builds the EvictionRequest an Allocate(bytes, stream) would issue now.
  EvictionRequest MakeRequest(size_t bytes, Stream stream) const;

  // --- Introspection ---
  AllocatorStats GetStats() const;
  void ResetPeakStats();
  // A second peak of allocated bytes, restarted by its caller without touching the reported
  // peak (ResetPeakStats serves torch.cuda.reset_peak_memory_stats): the torch layer measures
  // each op's workspace with it (Note [Scratch memory], runtime/runtime.cc). MarkHighWater
  // restarts it at the bytes allocated now and returns them; HighWaterSinceMark returns the
  // most allocated at once since then and the bytes allocated now. Neither takes the lock (two
  // per op cost the torch layer 3% on small ops): an allocation racing a mark may be missed.
  size_t MarkHighWater();
  std::pair<size_t, size_t> HighWaterSinceMark() const;
  // stats_.allocated_bytes.current, read without the lock (Note [Idle far below the budget],
  // hooks/fallback.cc, asks on every op while idle): a block handed out or freed meanwhile may be
  // missed.
  size_t AllocatedNow() const { return static_cast<size_t>(allocated_now_.load(std::memory_order_relaxed)); }
  MemorySnapshot Snapshot() const;
  // Verifies every Note'd invariant; FailedPrecondition describing the first violation.
  absl::Status CheckInvariants() const;
  const AllocatorConfig& config() const { return config_; }
  const SizeClasses& size_classes() const { return sizes_; }
  DeviceMemoryBackend* backend() const { return backend_; }

 private:
  struct Segment;
  struct Block {
    uintptr_t ptr = 0;
    size_t size = 0;
    size_t requested_size = 0;
    Stream stream;
    Pool pool = Pool::kLarge;
    Segment* segment = nullptr;
    Block* prev = nullptr;  // neighbours within the segment, in address order
    Block* next = nullptr;
    Block* free_prev = nullptr;  // the free set's links (FreeSet)
    Block* free_next = nullptr;
    bool allocated = false;
    int pending_events = 0;
    std::vector<Stream> stream_uses;  // streams other than `stream` recorded via RecordStream
    bool is_free() const { return !allocated && pending_events == 0; }
  };
  struct Segment {
    uintptr_t base = 0;
    size_t size = 0;
    Pool pool = Pool::kLarge;
    Stream stream;
    Block* head = nullptr;
    bool releasable = false;  // counted in releasable_bytes_ (Note [Releasable bytes])
    uint64_t last_hand_out = 0;  // hand_out_clock_ when a block of it was last handed out
    bool OneFreeBlock() const { return head->is_free() && head->next == nullptr; }
  };
  // A pool's free blocks, indexed for best fit (Note [Binned free blocks], free_set.h).
  using FreeBlocks = FreeSet<Block>;
  struct PendingEvent {
    EventHandle event;
    Block* block;
  };
  // Why rungs 1-2 failed, for the OOM report.
  struct Attempt {
    void* ptr = nullptr;
    absl::Status backend_error;  // last backend failure, if any
  };

  CachingAllocator(const AllocatorConfig& config, DeviceMemoryBackend* backend);

  Attempt TryAllocateLocked(size_t rounded, size_t requested, Pool pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* FindFreeBlockLocked(size_t rounded, Pool pool, Stream stream) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* GrowLocked(size_t rounded, Pool pool, Stream stream, absl::Status* backend_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `block` is free and in no free set (a caller takes a cached one out first).
  void* HandOutLocked(Block* block, size_t rounded, size_t requested)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeBlockLocked(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProcessEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSegmentLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A whole free segment leaves the books, its memory not returned (ReleaseSegmentLocked does).
  void ForgetSegmentLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new segment of `size` bytes at `memory` on the books, one free block not yet in a free set.
  Block* AddSegmentLocked(void* memory, size_t size, Pool pool, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for memory that stays cached: its one free block in the free set, the segment counted
  // releasable, with the hand-out time of the segment it came from (a split's tail, a shrink).
  void AddCachedSegmentLocked(void* memory, size_t size, Pool pool, Stream stream, uint64_t last_hand_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Recycling a cached segment]: a block of `rounded` bytes in a cached segment resized to
  // `segment_size`, handed out; nullptr when no cached segment fits the rule or the backend
  // cannot resize.
  void* RecycleCachedSegmentLocked(size_t rounded, size_t requested, size_t segment_size, Pool pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Resizing a nearby cached segment]: on a miss under exact reuse, a cached segment of a
  // nearby size resized in place into the requested block; null if none qualifies or the backend
  // cannot resize.
  void* ResizeNearbyCachedSegmentLocked(size_t rounded, size_t requested, Pool pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resizes a fully free cached segment (backend Resize) into a segment of `segment_size` holding
  // the requested block, handed out; null, with the segment left as it was, if the backend fails.
  // With `donors` (fully free cached segments), a growth that takes their pages (Note [Growing
  // into cached pages]); they are gone afterwards whatever the outcome.
  void* ResizeSegmentIntoBlockLocked(Segment* segment, size_t segment_size, size_t rounded, size_t requested,
                                     Pool pool, Stream stream, absl::Span<Segment* const> donors = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases fully free segments but `keep`, all of them or (Note [Releasing what a request
  // needs]) enough for at least `at_least` bytes; returns the bytes released. With
  // `prefer_unresizable`, where the smallest segment that covers `at_least` alone is one the
  // backend can resize, the smaller ones it cannot resize go instead if they cover it, else that
  // one is shrunk where it can be (Note [Small requests keep resizable segments]).
  size_t ReleaseCachedSegmentsLocked(size_t at_least = SIZE_MAX, const Segment* keep = nullptr,
                                     bool prefer_unresizable = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the backend resized `segment` into `memory` (of `segment_size` bytes): the segment
  // replaced on the books and the requested block handed out; null if the resize failed.
  void* ResizedIntoBlockLocked(const absl::StatusOr<void*>& memory, Segment* segment, size_t segment_size,
                               size_t rounded, size_t requested, Pool pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shrinks a fully free cached segment by at least `by` bytes (to a multiple of the block size)
  // with the backend's Resize, keeping it cached; returns the bytes it gave up, 0 (the segment as
  // it was) where the backend cannot (Note [Small requests keep resizable segments]).
  size_t ShrinkCachedSegmentLocked(Segment* segment, size_t by) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The segments ReleaseCachedSegmentsLocked(at_least, keep, prefer_unresizable) releases, before
  // any shrink.
  std::vector<Segment*> CachedSegmentsToReleaseLocked(size_t at_least, const Segment* keep,
                                                      bool prefer_unresizable = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Releasable segments by size]: builds releasable_by_size_ at its first use.
  void IndexReleasableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Exact reuse]: whether rung 1 must not hand out a free block of
  // `block_size` (a whole segment when `whole_segment`) for a request of `rounded` bytes.
  bool ExactReuseRefusesLocked(size_t block_size, bool whole_segment, size_t rounded) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t ReleasableBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return releasable_bytes_; }
  // Note [Releasable bytes]: recounts `segment` after its blocks changed.
  void NoteReleasableLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanSatisfyLocked(size_t rounded, Pool pool, Stream stream, size_t extra_releasable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t LargestFreeBlockLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* FindAllocatedLocked(void* ptr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MemorySnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EvictionRequest MakeRequestLocked(size_t requested, size_t rounded, Pool pool,
                                    Stream stream) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AllocatorConfig config_;  // as created; the budget lives in budget_bytes_
  size_t budget_bytes_ ABSL_GUARDED_BY(mu_);
  const SizeClasses sizes_;
  DeviceMemoryBackend* const backend_;

  mutable std::mutex mu_;
  EvictionHandler* handler_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<uintptr_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  FreeBlocks free_blocks_[kNumPools] ABSL_GUARDED_BY(mu_);
  // Open addressing: an allocation adds no node to the heap (the unordered_map it replaced did).
  absl::flat_hash_map<uintptr_t, Block*> allocated_blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingEvent> pending_events_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  size_t releasable_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Note [Releasable bytes]
  // The segments counted in releasable_bytes_, by size, then base (Note [Releasable segments by size]).
  using ReleasableIndex = absl::btree_map<std::pair<size_t, uintptr_t>, Segment*>;
  ReleasableIndex releasable_by_size_ ABSL_GUARDED_BY(mu_);
  bool releasable_indexed_ ABSL_GUARDED_BY(mu_) = false;  // releasable_by_size_ built and kept
  uint64_t hand_out_clock_ ABSL_GUARDED_BY(mu_) = 0;  // blocks handed out so far
  ResizeGate resize_gate_ ABSL_GUARDED_BY(mu_);       // Note [Undone resizes]
  // MarkHighWater's peak and a copy of stats_.allocated_bytes.current: written under mu_, read
  // (and high_water_ restarted) without it.
  std::atomic<int64_t> high_water_{0}, allocated_now_{0};
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_CACHING_ALLOCATOR_H_
