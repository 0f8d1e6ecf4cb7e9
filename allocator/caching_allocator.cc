// The caching allocator (see caching_allocator.h). Invariants are written as Notes below and
// checked by CheckInvariants().
#include "allocator/caching_allocator.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/bytes.h"

namespace dtr::alloc {

// Note [Budget is a hard cap]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// stats_.reserved_bytes.current (the sum of segment sizes, i.e. what the backend gave us) never
// exceeds budget_bytes_. The only place that obtains memory, GrowLocked, checks the
// budget before calling the backend, so the cap holds at every instant, not just eventually. A
// request that does not fit climbs the retry ladder (Note [Retry ladder]) and, failing that, is
// refused; the budget is never "temporarily" exceeded.
//
// Note [Budget-constrained segment size]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch grows large-pool requests below 10 MiB by a 20 MiB segment. Under a hard budget that
// could refuse a 3 MiB request while 10 MiB of budget remain. With
// config.shrink_segment_to_fit_budget, when the usual segment exceeds the remaining budget (or the
// backend refuses it) GrowLocked tries the smallest segment that holds the request
// (SizeClasses::MinimalSegmentSize). CanSatisfy reasons with that smallest size.
//
// Note [Segment tiling]
// ~~~~~~~~~~~~~~~~~~~~~
// The blocks of a segment, linked by prev/next starting at segment->head, tile it exactly: the
// first starts at the segment base, each starts where the previous ends, the last ends at the
// segment end, each has size > 0 and a multiple of min_block_size, and each records that segment,
// its pool and its stream (a segment belongs to the stream and pool it was allocated for).
//
// Note [Eager coalescing]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Two neighbouring blocks are never both free: FreeBlockLocked merges a newly free block with its
// free neighbours before inserting it in a free set, and a split only carves a free remainder off a
// block whose neighbours are, by this invariant, not free. Hence the size of the free block that
// freeing X would produce is X plus its immediate free neighbours (CoalescedFreeSizeIfFreed).
//
// Note [Free set mirrors free blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// free_blocks_[pool] contains exactly the free blocks (not allocated, no pending events) of that
// pool; allocated_blocks_ maps exactly the allocated blocks' addresses to them; pending_events_
// holds, for each block in state kPendingEvents, as many entries as its pending_events count.
//
// Note [Stream-ordered reuse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block belongs to the stream it was allocated on, and free sets are keyed by stream first, so
// a block is only reused by the same stream (whose work is ordered after the caller's). Uses on
// other streams are declared with RecordStream; when such a block is freed, one event per use
// stream is recorded and the block enters kPendingEvents: no longer allocated, still active, not
// reusable and not coalescable. ProcessEventsLocked (at every Allocate, EmptyCache and eviction
// query) polls the events without ever waiting and frees the block when all have completed. This
// mirrors PyTorch's recordStream / insert_events / process_events.
//
// Note [Releasable bytes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// releasable_bytes_ is the total size of the segments that are one free block (what rung 4 and
// EmptyCache could give back), and Segment::releasable says which are counted. CanSatisfy and
// WouldSatisfyIfFreed need it for every candidate an eviction weighs; summing it over the
// segments each time cost O(segments) per candidate, and with the CPU allocator's segment per
// tensor that was 10% of a CPU TreeLSTM's step under a tight budget (perf). A segment changes
// between the two states only when a block of it is handed out or freed, or the segment goes,
// and each of those recounts it (NoteReleasableLocked). CheckInvariants recomputes the total.
//
// Note [Releasable segments by size]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under a budget that binds, every miss goes to rung 4, which picks cached segments by size: the
// one to resize (Note [Recycling a cached segment]) and the ones to release or whose pages to take
// (Note [Releasing what a request needs]). Both used to walk every segment (a std::map node each:
// the CPU allocator has a segment per tensor) and sort the releasable ones: DenseNet at half its
// activations (CPU) misses about 140 times a step over about 500 segments; under perf the walks
// took about 6 ms of its 110 ms step, and the step took 97 ms without them (84 under a budget that
// never binds). releasable_by_size_ indexes the releasable segments by size, then base, so rung 4
// looks at the few it takes. It makes the same choices as the walks did, ties included (a walk by
// address kept the lowest address of equal sizes; the sort's reverse order, the highest), which
// CanResize's monotonicity in the old size (device_memory_backend.h) allows: a differential run of
// both over 3,000 random seeds (a review's) gave byte-identical snapshots after every step.
// The index is built when rung 4 first needs it and kept with releasable_bytes_ from then
// on (NoteReleasableLocked, ForgetSegmentLocked), so a run whose budget never binds does not pay
// for it at every hand-out and free (kept from the start, it took about 0.15 ms of a CPU LSTM's
// 20 ms step under such a budget, perf); CheckInvariants checks it.
//
// Note [Stats match snapshot]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The current values of the gauges in stats_ equal the totals over the segments and blocks:
// reserved = sum of segment sizes, allocated = sum of allocated block sizes, active = allocated +
// pending block sizes, requested = sum of allocated blocks' requested sizes, and the matching
// counts.
//
// Note [No lock across eviction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The EvictionHandler evicts by calling Free on this allocator, and may query it, so MakeRoom is
// called with mu_ released. Everything learned before the call is stale afterwards (this and other
// threads freed and allocated meanwhile), so Allocate re-runs the ladder from rung 1 after it. An
// Allocate issued from inside MakeRoom on the same thread skips rung 3 (no recursive eviction).
//
// Note [Exact reuse]
// ~~~~~~~~~~~~~~~~~~
// With config.exact_reuse, rung 1 hands out a cached free segment only to a request of exactly
// its rounded size. A larger block would be split, and the remnant cannot go back to the backend
// while its neighbour lives: under a tight budget remnants add up to requests that fit nowhere
// (an MLP at 0.9 of its peak failed with 78 KiB free in them). The cache is kept otherwise:
// training repeats its shapes, so most requests find a block of their size; a miss resizes a
// cached segment of a nearby size (Note [Resizing a nearby cached segment]), and what is still
// not served is released by rung 4 (CanSatisfy counts it, so no eviction is asked for bytes the
// cache holds). Host memory used this way for dtr's CPU allocator
// (hooks/cpu_allocator_adapter.cc) replaced releasing every block as it was freed, whose mmap and
// page faults on the next allocation doubled the step time under a budget that never binds.
// The rule holds with no budget too, because one may be set later (dtr.set_budget, as the
// distributed tests' ranks do after measuring their peak). Until stop 62 it held only under a
// budget: the unbudgeted steps' backward placed gradients and momentum buffers in the freed
// activations' segments, and the remnants beside them were still reserved when the budget came.
// An MLP of 1 MiB activations then used 5.96 MiB of a 6.9 MiB budget (6.89 MiB when recording
// from the start), needed 108 evictions a step instead of 68 and 1.7x the time a step; a 2-rank
// DDP job at half its peak ran 12.86x slower than plain, 1.56x now (1.38x budgeted from the
// start; bench/results/ddp.md).
// Two limits keep it honest: a free remnant inside a segment still in use may be split as usual
// (splitting it ties up nothing new), and a miss while the cache holds more bytes than the peak
// allocated that no resize serves releases the cached segments before growing, so reserved bytes
// stay within about twice that peak. (Bounding the cache by the bytes allocated now flushed it
// after every backward pass: +17% a step.) CanSatisfy and WouldSatisfyIfFreed apply the same rule
// as rung 1.
//
// Note [Retry ladder]
// ~~~~~~~~~~~~~~~~~~~
// Allocate tries, in order: (1) the best-fitting cached free block of the pool on the stream;
// (2) a new segment within the budget; (3) the EvictionHandler, then (1)-(2) again; (4) releasing
// fully free cached segments, under a budget first only what the request needs (Note [Releasing
// what a request needs]), then all of them (EmptyCache-style), each followed by (1)-(2) again;
// (5) ResourceExhausted.
// A failing backend (a real device OOM) in (2) is handled the same way: the ladder continues, and
// its error is quoted in the final report. Rung 3 comes before rung 4 as specified; an eviction
// policy that wants to avoid needless evictions checks CanSatisfy first, which already counts the
// bytes rung 4 could release (the strategies in eviction_strategy.h do).

namespace {

// Allocators whose EvictionHandler::MakeRoom is running on this thread (Note [No lock across
// eviction]).
thread_local std::vector<const CachingAllocator*> t_evicting;

bool InMakeRoom(const CachingAllocator* allocator) {
  return std::find(t_evicting.begin(), t_evicting.end(), allocator) != t_evicting.end();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(
    const AllocatorConfig& config, DeviceMemoryBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("CachingAllocator: null backend");
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  // Note [Block alignment]: a block starts at its segment's base plus a multiple of
  // min_block_size, so it is aligned to min(backend alignment, min_block_size). cudaMalloc
  // promises 256 bytes, the alignment CUDA kernels and PyTorch's own allocator rely on; a
  // backend's alignment only has to be a power of two.
  const size_t align = backend->MinAlignment();
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend ", backend->Name(), " aligns to ", align, " bytes, not a power of two"));
  }
  return std::unique_ptr<CachingAllocator>(new CachingAllocator(config, backend));
}

CachingAllocator::CachingAllocator(const AllocatorConfig& config, DeviceMemoryBackend* backend)
    : config_(config),
      budget_bytes_(config.budget_bytes),
      sizes_(config),
      backend_(backend),
      free_blocks_{FreeBlocks(config.min_block_size), FreeBlocks(config.min_block_size)} {}

absl::Status CachingAllocator::SetBudget(size_t budget_bytes) {
  if (budget_bytes == 0) return absl::InvalidArgumentError("the budget must be positive");
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  if (static_cast<size_t>(stats_.reserved_bytes.current) > budget_bytes) ReleaseCachedSegmentsLocked();
  size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
  if (reserved > budget_bytes)
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot lower the budget to ", FormatBytes(budget_bytes), ": ", FormatBytes(reserved),
        " are reserved by blocks in use; free or evict tensors first (budget stays ",
        budget_bytes_ == AllocatorConfig::kUnlimited ? std::string("unlimited") : FormatBytes(budget_bytes_), ")"));
  budget_bytes_ = budget_bytes;
  return absl::OkStatus();
}

size_t CachingAllocator::budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_bytes_;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const PendingEvent& pending : pending_events_) backend_->DestroyEvent(pending.event);
  pending_events_.clear();
  for (auto& [base, segment] : segments_) {
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    backend_->Free(reinterpret_cast<void*>(segment->base), segment->size);
  }
  segments_.clear();
  releasable_by_size_.clear();
}

void CachingAllocator::SetEvictionHandler(EvictionHandler* handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handler_ = handler;
}

// ---------------------------------------------------------------------------------------------
// Allocation
// ---------------------------------------------------------------------------------------------

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, Stream stream) {
  if (bytes > SizeClasses::kMaxRequest) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.num_ooms;
    return absl::ResourceExhaustedError(absl::StrCat(
        "dtr allocator out of memory: tried to allocate ", FormatBytes(bytes),
        ", more than the largest supported request ", FormatBytes(SizeClasses::kMaxRequest)));
  }
  const size_t rounded = sizes_.RoundSize(bytes);
  const Pool pool = sizes_.PoolFor(rounded);
  absl::Status backend_error;
  EvictionHandler* handler = nullptr;
  EvictionRequest request;
  const bool nested = InMakeRoom(this);

  // Rungs 1 and 2.
  {
    std::lock_guard<std::mutex> lock(mu_);
    ProcessEventsLocked();
    Attempt attempt = TryAllocateLocked(rounded, bytes, pool, stream);
    if (attempt.ptr != nullptr) return attempt.ptr;
    if (!attempt.backend_error.ok()) backend_error = attempt.backend_error;
    ++stats_.num_alloc_retries;
    if (config_.enable_eviction && !nested) handler = handler_;
    if (handler != nullptr) {
      request = MakeRequestLocked(bytes, rounded, pool, stream);
      ++stats_.num_eviction_calls;
      stats_.eviction_bytes_requested += static_cast<int64_t>(rounded);
    }
  }

  // Rung 3, without the lock (Note [No lock across eviction]).
  EvictionResult eviction;
  if (handler != nullptr) {
    t_evicting.push_back(this);
    eviction = handler->MakeRoom(request);
    t_evicting.pop_back();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.eviction_bytes_freed += static_cast<int64_t>(eviction.bytes_freed);
    ProcessEventsLocked();
    Attempt attempt = TryAllocateLocked(rounded, bytes, pool, stream);
    if (attempt.ptr != nullptr) return attempt.ptr;
    if (!attempt.backend_error.ok()) backend_error = attempt.backend_error;
  }

  // Rung 4, then the report (rung 5).
  size_t budget, reserved, allocated, largest_free, released;
  EvictionHandler* pinned_source = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ProcessEventsLocked();
    ++stats_.num_cache_flushes;
    released = 0;
    if (budget_bytes_ != AllocatorConfig::kUnlimited && backend_error.ok()) {
      // Note [Releasing what a request needs]
      const size_t segment = config_.shrink_segment_to_fit_budget ? sizes_.MinimalSegmentSize(rounded)
                                                                  : sizes_.SegmentSize(rounded);
      const size_t reserved_now = static_cast<size_t>(stats_.reserved_bytes.current);
      if (reserved_now + segment > budget_bytes_) {
        // Note [Recycling a cached segment]
        if (void* p = RecycleCachedSegmentLocked(rounded, bytes, segment, pool, stream)) return p;
        // A growth that failed gave its donors back all the same (Note [Growing into cached
        // pages]): they count as released, and only what is still short is released now.
        const size_t reserved_after = static_cast<size_t>(stats_.reserved_bytes.current);
        released = reserved_now - reserved_after;
        if (reserved_after + segment > budget_bytes_) {
          // Note [Small requests keep resizable segments]
          const bool request_resizable = backend_->CanResize(segment, segment);
          released += ReleaseCachedSegmentsLocked(reserved_after + segment - budget_bytes_, nullptr,
                                                  /*prefer_unresizable=*/!request_resizable);
        }
        Attempt attempt = TryAllocateLocked(rounded, bytes, pool, stream);
        if (attempt.ptr != nullptr) return attempt.ptr;
      }
    }
    released += ReleaseCachedSegmentsLocked();
    Attempt attempt = TryAllocateLocked(rounded, bytes, pool, stream);
    if (attempt.ptr != nullptr) return attempt.ptr;
    if (!attempt.backend_error.ok()) backend_error = attempt.backend_error;
    ++stats_.num_ooms;
    budget = budget_bytes_;
    reserved = static_cast<size_t>(stats_.reserved_bytes.current);
    allocated = static_cast<size_t>(stats_.allocated_bytes.current);
    largest_free = LargestFreeBlockLocked();
    if (handler == nullptr && !nested) pinned_source = handler_;
  }
  std::string pinned;
  if (handler != nullptr) {
    // A handler that believed it had made room need not have counted what it could not evict.
    pinned = FormatBytes(eviction.satisfied ? handler->PinnedBytes() : eviction.pinned_bytes);
  } else if (pinned_source != nullptr) {
    pinned = FormatBytes(pinned_source->PinnedBytes());
  } else {
    pinned = "unknown (no eviction handler consulted)";
  }
  std::string eviction_text;
  if (handler != nullptr) {
    eviction_text = absl::StrCat("eviction freed ", FormatBytes(eviction.bytes_freed), " in ",
                                 eviction.blocks_freed, " blocks");
  } else if (nested) {
    eviction_text = "eviction skipped (request made from inside the eviction handler)";
  } else if (!config_.enable_eviction) {
    eviction_text = "eviction disabled";
  } else {
    eviction_text = "no eviction handler";
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "dtr allocator out of memory: tried to allocate ", FormatBytes(bytes), " (block ",
      FormatBytes(rounded), ", ", PoolName(pool), " pool, ", StreamName(stream),
      "); budget ", budget == AllocatorConfig::kUnlimited ? "unlimited" : FormatBytes(budget),
      "; reserved ", FormatBytes(reserved), "; allocated ", FormatBytes(allocated),
      "; largest free block ", FormatBytes(largest_free), "; pinned (unevictable) ", pinned,
      "; ", eviction_text, "; released cached ", FormatBytes(released), "; backend ",
      backend_->Name(), backend_error.ok() ? "" : ": ", backend_error.message()));
}

CachingAllocator::Attempt CachingAllocator::TryAllocateLocked(size_t rounded, size_t requested,
                                                              Pool pool, Stream stream) {
  Attempt attempt;
  if (Block* block = FindFreeBlockLocked(rounded, pool, stream)) {
    ++stats_.num_cache_hits;
    free_blocks_[static_cast<int>(pool)].erase(block);
    attempt.ptr = HandOutLocked(block, rounded, requested);
    return attempt;
  }
  if (config_.exact_reuse) {
    // Note [Exact reuse]: a miss resizes a cached segment of a nearby size, while resizing is not
    // being undone (Note [Undone resizes]) or the cache holds more than the peak in use; in that
    // case, failing to, it empties the cache, so sizes no longer asked for cannot pile up (with
    // no budget, or one that never binds).
    resize_gate_.OnMiss(sizes_.MinimalSegmentSize(rounded), hand_out_clock_);
    const bool over = stats_.reserved_bytes.current - stats_.allocated_bytes.current > stats_.allocated_bytes.peak;
    if (over || resize_gate_.Allowed()) {
      attempt.ptr = ResizeNearbyCachedSegmentLocked(rounded, requested, pool, stream);
      if (attempt.ptr != nullptr) return attempt;
    }
    if (over) {
      ++stats_.num_cache_flushes;
      ReleaseCachedSegmentsLocked();
      resize_gate_.Reset();  // another phase of the run, maybe
    }
  }
  if (Block* block = GrowLocked(rounded, pool, stream, &attempt.backend_error)) {
    attempt.ptr = HandOutLocked(block, rounded, requested);
  }
  return attempt;
}

CachingAllocator::Block* CachingAllocator::FindFreeBlockLocked(size_t rounded, Pool pool,
                                                               Stream stream) const {
  // Best fit: the smallest block of this stream that is large enough.
  Block* b = free_blocks_[static_cast<int>(pool)].SmallestFitting(stream, rounded);
  if (b == nullptr) return nullptr;
  if (ExactReuseRefusesLocked(b->size, b->prev == nullptr && b->next == nullptr, rounded)) return nullptr;
  return b;
}

bool CachingAllocator::ExactReuseRefusesLocked(size_t block_size, bool whole_segment, size_t rounded) const {
  // Note [Exact reuse]: a remnant inside a used segment may still be split (it ties
  // up nothing more than it does already); a whole cached segment serves its own size only.
  return config_.exact_reuse && whole_segment && block_size != rounded;
}

CachingAllocator::Block* CachingAllocator::GrowLocked(size_t rounded, Pool pool, Stream stream,
                                                      absl::Status* backend_error) {
  // Note [Budget is a hard cap], Note [Budget-constrained segment size].
  const size_t normal = sizes_.SegmentSize(rounded);
  const size_t minimal = sizes_.MinimalSegmentSize(rounded);
  const size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
  auto fits_budget = [&](size_t size) {
    return size <= budget_bytes_ && reserved <= budget_bytes_ - size;
  };
  size_t sizes[2];
  int num_sizes = 0;
  if (fits_budget(normal)) sizes[num_sizes++] = normal;
  if (config_.shrink_segment_to_fit_budget && minimal < normal && fits_budget(minimal)) {
    sizes[num_sizes++] = minimal;
  }
  for (int i = 0; i < num_sizes; ++i) {
    absl::StatusOr<void*> memory = backend_->Allocate(sizes[i]);
    if (!memory.ok()) {
      ++stats_.num_backend_failures;
      *backend_error = memory.status();
      continue;
    }
    ++stats_.num_segment_allocs;
    return AddSegmentLocked(*memory, sizes[i], pool, stream);
  }
  return nullptr;
}

CachingAllocator::Block* CachingAllocator::AddSegmentLocked(void* memory, size_t size, Pool pool, Stream stream) {
  auto segment = std::make_unique<Segment>();
  segment->base = reinterpret_cast<uintptr_t>(memory);
  segment->size = size;
  segment->pool = pool;
  segment->stream = stream;
  Block* block = new Block;
  block->ptr = segment->base;
  block->size = size;
  block->stream = stream;
  block->pool = pool;
  block->segment = segment.get();
  segment->head = block;
  segments_.emplace(segment->base, std::move(segment));
  stats_.reserved_bytes.Increase(static_cast<int64_t>(size));
  stats_.segment_count.Increase(1);
  return block;  // free, not in any free set; HandOutLocked takes it
}

void CachingAllocator::AddCachedSegmentLocked(void* memory, size_t size, Pool pool, Stream stream,
                                              uint64_t last_hand_out) {
  Block* block = AddSegmentLocked(memory, size, pool, stream);
  block->segment->last_hand_out = last_hand_out;
  free_blocks_[static_cast<int>(pool)].insert(block);
  NoteReleasableLocked(block->segment);
}

// Note [Recycling a cached segment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under a budget that binds, a request no cached segment serves (Note [Exact reuse]) releases
// cached segments and maps a new one, whose pages its kernel then faults in again: ResNet at a
// budget equal to its peak (CPU) faulted about 2,100 pages (8 MiB) a step, as if every activation
// were new, against 4 under a budget that never binds. A backend that can resize a segment
// (HostBackend: mremap) turns one cached segment into the new one instead: the smallest at least as
// large as the request, shrunk (its tail goes back to the system; no page is faulted), else the
// largest, grown (only the added pages are new) once enough of the others are released (Note
// [Releasing what a request needs]) for it to fit. Reserved bytes end where releasing and growing
// would have put them, and nothing of the old segment stays behind (unlike a split, Note [Exact
// reuse]). Real CPU runs (torch 2.14.1, old and new library interleaved, 3 rounds, CPU time a
// step): ResNet at its peak 1,100 pages faulted a step instead of 2,100 and 28.6-29.4 ms instead of
// 28.9-29.4; DenseNet at its peak 70 ms instead of 75-87, at 0.6 of it 71-83 instead of 96-98; UNet
// at its peak 33-34 ms instead of 34-36.
void* CachingAllocator::RecycleCachedSegmentLocked(size_t rounded, size_t requested, size_t segment_size,
                                                   Pool pool, Stream stream) {
  if (segment_size > budget_bytes_) return nullptr;
  IndexReleasableLocked();
  if (releasable_by_size_.empty()) return nullptr;
  // Note [Releasable segments by size]: the smallest releasable segment at least segment_size
  // that the backend can resize, else the largest below it (of equal sizes, the lowest address).
  // CanResize is monotone in the old size: if the largest cannot be resized, none can.
  if (!backend_->CanResize(releasable_by_size_.rbegin()->first.first, segment_size)) return nullptr;
  const auto at_least = releasable_by_size_.lower_bound({segment_size, 0});
  Segment* shrink = nullptr;
  for (auto it = at_least; it != releasable_by_size_.end() && shrink == nullptr; ++it)
    if (backend_->CanResize(it->first.first, segment_size)) shrink = it->second;
  Segment* largest = nullptr;
  if (shrink == nullptr && at_least != releasable_by_size_.begin()) {
    const size_t below = std::prev(at_least)->first.first;
    if (backend_->CanResize(below, segment_size)) largest = releasable_by_size_.lower_bound({below, 0})->second;
  }
  Segment* chosen = shrink;
  if (chosen == nullptr && largest != nullptr) {
    const size_t others = static_cast<size_t>(stats_.reserved_bytes.current) - largest->size;
    if (others + segment_size > budget_bytes_) {
      const size_t need = others + segment_size - budget_bytes_;
      if (ReleasableBytesLocked() - largest->size < need) return nullptr;
      // Note [Growing into cached pages]
      const std::vector<Segment*> donors = CachedSegmentsToReleaseLocked(need, /*keep=*/largest);
      return ResizeSegmentIntoBlockLocked(largest, segment_size, rounded, requested, pool, stream, donors);
    }
    chosen = largest;
  }
  if (chosen == nullptr) return nullptr;
  return ResizeSegmentIntoBlockLocked(chosen, segment_size, rounded, requested, pool, stream);
}

// Note [Growing into cached pages]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// When rung 4 grows the largest cached segment (Note [Recycling a cached segment]) past what the
// budget leaves, it used to release other cached segments first and let the grown segment's new
// tail be faulted in afresh: the pages released were the ones the tail needed. It hands those
// segments to the backend with the resize instead (the same ones Note [Releasing what a request
// needs] picks), whose pages fill the tail (HostBackend: mremap moves them, Note [Seams]); what of
// them the tail does not need goes back. Reserved bytes end where releasing and growing would have
// put them. A backend that cannot move pages frees them and resizes, as before. Real CPU runs
// (torch 2.14.1, one thread, 3 rounds side by side with the library before this Note and Note
// [Splitting a cached segment], medians; runtime/README.md, "Pages kept under a binding budget"):
// pages faulted a step at half the activations ResNet 1,680 -> 570 (323 under a budget that never
// binds), DenseNet 7,173 -> 1,947, UNet 4,444 -> 769 (961); UNet's step 1.53x -> 1.37x the plain one.

// Note [Splitting a cached segment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Shrinking a cached segment for a smaller request (Note [Recycling a cached segment], Note
// [Resizing a nearby cached segment]) gave its tail back to the system, and under a budget that
// binds the next larger request mapped fresh pages in the room that made, which its kernel then
// faulted in: ResNet at half its activations (CPU) faulted about 1,350 more pages a step than under
// a budget that never binds, and its ops ran 15% slower, though they were the same ops. Where the
// backend can cut the segment without touching its pages (HostBackend: at a page boundary, both
// pieces mapped on their own), it is split instead: the head serves the request and the tail stays
// cached as a segment of its own, one free block, which a later request of about its size grows
// (its pages kept) and rung 4 releases if the budget needs it. Unlike a block split off inside a
// segment (Note [Exact reuse]), the tail ties up nothing: it can be released on its own. Reserved
// bytes fall by less than a page (the rest of the head's last page, still the head's).
// Only while the budget binds, that is, while it would not let the request map a segment of its
// own: then pages given back are pages the next growth faults in again. With no budget, or room
// under it, nothing takes such tails but a request of about their size, and they piled up: DenseNet
// under a budget that never binds reserved 2.6 MB more every step (50 MB at step 8, 108 MB at step
// 30) and faulted 830 pages a step, where shrinking holds 50 MB and faults none.
void* CachingAllocator::ResizeSegmentIntoBlockLocked(Segment* segment, size_t segment_size, size_t rounded,
                                                     size_t requested, Pool pool, Stream stream,
                                                     absl::Span<Segment* const> donors) {
  void* const old_base = reinterpret_cast<void*>(segment->base);
  if (!donors.empty()) {  // Note [Growing into cached pages]
    std::vector<DeviceMemoryBackend::Piece> pieces;
    pieces.reserve(donors.size());
    for (Segment* donor : donors) {
      pieces.push_back({reinterpret_cast<void*>(donor->base), donor->size});
      ForgetSegmentLocked(donor);
    }
    stats_.num_segment_donors += static_cast<int64_t>(donors.size());
    // On failure the segment is still there, as it was; the donors are gone.
    return ResizedIntoBlockLocked(backend_->ResizeWithPagesOf(old_base, segment->size, segment_size, pieces),
                                  segment, segment_size, rounded, requested, pool, stream);
  }
  // Note [Splitting a cached segment]: only where the budget would not map the request afresh.
  const bool budget_binds = budget_bytes_ != AllocatorConfig::kUnlimited &&
                            static_cast<size_t>(stats_.reserved_bytes.current) + segment_size > budget_bytes_;
  if (segment_size < segment->size && budget_binds) {
    const uintptr_t base = segment->base;
    const size_t size = segment->size;
    if (absl::StatusOr<size_t> tail = backend_->Split(reinterpret_cast<void*>(base), size, segment_size); tail.ok()) {
      const Pool tail_pool = segment->pool;
      const Stream tail_stream = segment->stream;
      const uint64_t last_hand_out = segment->last_hand_out;
      ForgetSegmentLocked(segment);
      ++stats_.num_segment_splits;
      AddCachedSegmentLocked(reinterpret_cast<void*>(base + *tail), size - *tail, tail_pool, tail_stream,
                             last_hand_out);
      return HandOutLocked(AddSegmentLocked(reinterpret_cast<void*>(base), segment_size, pool, stream), rounded,
                           requested);
    }
  }
  return ResizedIntoBlockLocked(backend_->Resize(old_base, segment->size, segment_size), segment, segment_size,
                                rounded, requested, pool, stream);
}

void* CachingAllocator::ResizedIntoBlockLocked(const absl::StatusOr<void*>& memory, Segment* segment,
                                               size_t segment_size, size_t rounded, size_t requested, Pool pool,
                                               Stream stream) {
  if (!memory.ok()) return nullptr;  // the segment is still there, as it was
  ForgetSegmentLocked(segment);
  ++stats_.num_segment_resizes;
  return HandOutLocked(AddSegmentLocked(*memory, segment_size, pool, stream), rounded, requested);
}

// Note [Resizing a nearby cached segment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With exact reuse (Note [Exact reuse]) a request of a size the cache does not hold would map a
// new segment, whose pages its kernel then faults in, while a cached segment of a neighbouring
// size sits idle. Sizes that change a little from step to step are common: a language model's
// sequence length, hence its logits, varies per batch. So before growing, a miss resizes a whole
// cached segment of a nearby size in place, when the backend can (HostBackend: mremap): the
// smallest free block at least as large, if at most twice the request (shrunk: its tail goes
// back, no page faults), else the smallest at least half of it (grown: only the added pages are
// new). A larger one is left for a request of its own size: shrinking a 30 MiB segment for a
// 1 MiB request would fault the 30 MiB in again when the next long batch comes. Nothing of the
// old segment stays behind, as in Note [Recycling a cached segment], and growing respects the
// budget. A workload whose sizes repeat step after step loses by it: the segment taken was
// wanted later in the step, whose request then took another one, and so on every step; so a
// miss resizes only while resizing is not being undone (Note [Undone resizes], resize_gate.h), or
// when the cache holds more than the peak in use (resizing instead of emptying it).
// Splitting a cached segment, as the allocator did with no budget until stop 62, served such
// requests too, but left remnants that a budget set later could not use (Note [Exact reuse]).
// Measured side by side (stop 62, torch 2.14.1 on the CPU, one thread, 3 rounds, CPU time a step
// over the plain run's, whose own step varied 33-62 ms between processes): the word-level LM with
// no budget 0.56-0.64 splitting (stop 61's library), 0.76-0.81 resizing only in place of a flush
// (about exact reuse alone), 0.59-0.66 gated as above, with 154, 143 and 81 MiB reserved; under a
// budget that never binds 0.91-1.02 with stop 61's library, 0.59-0.66 gated. DenseNet, whose
// sizes repeat: resizing at every miss 0.92-1.15 with no budget and 0.99-1.37 under 1 TiB,
// against 0.73-0.80 and 0.82-0.89 with stop 61's library; gated 0.72-0.92 and 0.83-1.01.
void* CachingAllocator::ResizeNearbyCachedSegmentLocked(size_t rounded, size_t requested, Pool pool,
                                                        Stream stream) {
  const size_t segment_size = sizes_.MinimalSegmentSize(rounded);
  // Only where a segment holds one block (AllocatorConfig::SegmentPerBlock): a larger segment
  // would be split by the hand-out, leaving the remnant Note [Exact reuse] rules out.
  if (segment_size != rounded) return nullptr;
  const FreeBlocks& free = free_blocks_[static_cast<int>(pool)];
  auto resizable = [&](const Block* b) {
    return b != nullptr && b->segment->releasable && b->size != segment_size &&
           backend_->CanResize(b->size, segment_size);
  };
  Block* chosen = free.SmallestFitting(stream, segment_size);
  if (!resizable(chosen) || chosen->size / 2 > segment_size) {
    const size_t half = sizes_.RoundSize(segment_size / 2);
    chosen = free.SmallestFitting(stream, half);
    if (!resizable(chosen) || chosen->size >= segment_size) return nullptr;
    const size_t others = static_cast<size_t>(stats_.reserved_bytes.current) - chosen->size;
    if (segment_size > budget_bytes_ || others > budget_bytes_ - segment_size) return nullptr;
  }
  const size_t old_size = chosen->size;
  const uint64_t now = hand_out_clock_;
  const uint64_t unused_for = now - chosen->segment->last_hand_out;
  void* ptr = ResizeSegmentIntoBlockLocked(chosen->segment, segment_size, rounded, requested, pool, stream);
  // Note [Undone resizes]: its size was still wanted if asked for again within the time the
  // segment had gone without a hand-out.
  if (ptr != nullptr) resize_gate_.OnResize(old_size, unused_for, now);
  return ptr;
}

void* CachingAllocator::HandOutLocked(Block* block, size_t rounded, size_t requested) {
  const size_t remaining = block->size - rounded;
  if (sizes_.ShouldSplit(block->pool, remaining)) {
    // Note [Eager coalescing]: block->next is not free, so the remainder needs no merging.
    Block* rest = new Block;
    rest->ptr = block->ptr + rounded;
    rest->size = remaining;
    rest->stream = block->stream;
    rest->pool = block->pool;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = rounded;
    free_blocks_[static_cast<int>(rest->pool)].insert(rest);
  }
  block->allocated = true;
  block->requested_size = requested;
  block->segment->last_hand_out = ++hand_out_clock_;
  allocated_blocks_[block->ptr] = block;
  NoteReleasableLocked(block->segment);
  const auto size = static_cast<int64_t>(block->size);
  stats_.allocated_bytes.Increase(size);
  allocated_now_.store(stats_.allocated_bytes.current, std::memory_order_relaxed);
  if (stats_.allocated_bytes.current > high_water_.load(std::memory_order_relaxed))
    high_water_.store(stats_.allocated_bytes.current, std::memory_order_relaxed);
  stats_.active_bytes.Increase(size);
  stats_.requested_bytes.Increase(static_cast<int64_t>(requested));
  stats_.allocation_count.Increase(1);
  stats_.active_count.Increase(1);
  ++stats_.num_allocs;
  return reinterpret_cast<void*>(block->ptr);
}

// ---------------------------------------------------------------------------------------------
// Freeing
// ---------------------------------------------------------------------------------------------

absl::Status CachingAllocator::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  Block* block = FindAllocatedLocked(ptr);
  if (block == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CachingAllocator::Free: %p is not an allocated block (double free or foreign pointer)",
        ptr));
  }
  // Note [Stream-ordered reuse]: one event per other stream that used the block.
  std::vector<EventHandle> events;
  events.reserve(block->stream_uses.size());
  for (Stream use : block->stream_uses) {
    absl::StatusOr<EventHandle> event = backend_->RecordEvent(use);
    if (!event.ok()) {
      for (EventHandle recorded : events) backend_->DestroyEvent(recorded);
      return absl::Status(event.status().code(),
                          absl::StrCat("CachingAllocator::Free: recording an event on ",
                                       StreamName(use), " failed, block kept allocated: ",
                                       event.status().message()));
    }
    events.push_back(*event);
  }
  allocated_blocks_.erase(block->ptr);
  block->allocated = false;
  stats_.allocated_bytes.Decrease(static_cast<int64_t>(block->size));
  allocated_now_.store(stats_.allocated_bytes.current, std::memory_order_relaxed);
  stats_.requested_bytes.Decrease(static_cast<int64_t>(block->requested_size));
  stats_.allocation_count.Decrease(1);
  block->requested_size = 0;
  block->stream_uses.clear();
  ++stats_.num_frees;
  if (events.empty()) {
    FreeBlockLocked(block);
  } else {
    block->pending_events = static_cast<int>(events.size());
    for (EventHandle event : events) pending_events_.push_back(PendingEvent{event, block});
  }
  return absl::OkStatus();
}

absl::Status CachingAllocator::RecordStream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Block* block = FindAllocatedLocked(ptr);
  if (block == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CachingAllocator::RecordStream: %p is not an allocated block", ptr));
  }
  if (stream == block->stream) return absl::OkStatus();  // ordered by construction
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
  return absl::OkStatus();
}

void CachingAllocator::FreeBlockLocked(Block* block) {
  // The block just stopped being active (freed with no pending events, or its last event done).
  stats_.active_bytes.Decrease(static_cast<int64_t>(block->size));
  stats_.active_count.Decrease(1);
  FreeBlocks& set = free_blocks_[static_cast<int>(block->pool)];
  // Note [Eager coalescing].
  if (Block* prev = block->prev; prev != nullptr && prev->is_free()) {
    set.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && next->is_free()) {
    set.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  set.insert(block);
  NoteReleasableLocked(block->segment);
}

void CachingAllocator::NoteReleasableLocked(Segment* segment) {
  const bool releasable = segment->OneFreeBlock();
  if (releasable == segment->releasable) return;
  segment->releasable = releasable;
  if (releasable) {
    releasable_bytes_ += segment->size;
    if (releasable_indexed_) releasable_by_size_.emplace(std::make_pair(segment->size, segment->base), segment);
  } else {
    releasable_bytes_ -= segment->size;
    if (releasable_indexed_) releasable_by_size_.erase({segment->size, segment->base});
  }
}

void CachingAllocator::IndexReleasableLocked() {
  if (releasable_indexed_) return;
  for (auto& [base, segment] : segments_)
    if (segment->releasable) releasable_by_size_.emplace(std::make_pair(segment->size, base), segment.get());
  releasable_indexed_ = true;
}

void CachingAllocator::ProcessEventsLocked() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_events_.size(); ++i) {
    PendingEvent pending = pending_events_[i];
    if (!backend_->EventDone(pending.event)) {
      pending_events_[kept++] = pending;
      continue;
    }
    backend_->DestroyEvent(pending.event);
    if (--pending.block->pending_events == 0) FreeBlockLocked(pending.block);
  }
  pending_events_.resize(kept);
}

void CachingAllocator::ReleaseSegmentLocked(Segment* segment) {
  backend_->Free(reinterpret_cast<void*>(segment->base), segment->size);
  ++stats_.num_segment_frees;
  ForgetSegmentLocked(segment);
}

void CachingAllocator::ForgetSegmentLocked(Segment* segment) {
  Block* block = segment->head;
  if (segment->releasable) {
    releasable_bytes_ -= segment->size;
    if (releasable_indexed_) releasable_by_size_.erase({segment->size, segment->base});
  }
  free_blocks_[static_cast<int>(block->pool)].erase(block);
  delete block;
  stats_.reserved_bytes.Decrease(static_cast<int64_t>(segment->size));
  stats_.segment_count.Decrease(1);
  segments_.erase(segment->base);  // destroys *segment
}

// Note [Releasing what a request needs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Rung 4 under a budget used to release every cached segment. Under a budget that binds, with
// Note [Exact reuse], every miss then emptied the cache, so the sizes the next ops
// asked for were mapped again and their pages faulted in again by the kernels: DenseNet at a
// budget equal to its peak ran its ops 19% slower than under a budget that never binds
// (runtime/README.md). So it first releases only what the request needs: the smallest cached
// segment that covers the shortfall alone, else the largest ones until they do (for a request the
// backend cannot resize, Note [Small requests keep resizable segments] below). Everything is
// released only if that was not enough (or the backend itself failed).
//
// Note [Small requests keep resizable segments]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A request for a segment the backend cannot resize (HostBackend: below its map threshold, from
// malloc) gains nothing from the pages of a resizable one (mapped): released, that one is unmapped
// and its pages are lost, while the next large request, which could have recycled it (Note
// [Recycling a cached segment]) or taken its pages (Note [Growing into cached pages]), maps and
// faults in a fresh one. The smallest segment that covers the shortfall alone was often such a
// one, so small requests under a binding budget emptied the cache of its large segments: the
// CPU LSTM at half its activations unmapped and mapped again about 3.6 large segments a step and
// faulted 270-316 pages a step (two runs) against 33 under a budget that never binds; the
// Transformer unmapped about 10 large segments a step.
// So for such a request, when the smallest segment covering the shortfall is resizable, the
// segments that are not (the largest first) are released instead if they cover it; else that
// resizable segment is shrunk by the shortfall (rounded up to the block size) and stays cached,
// giving up only the pages of its tail, and is released whole only where the backend cannot
// shrink it that far (below its map threshold). The memory the small ones give back is where
// malloc finds the new small segment's.
// Pages faulted a step, one real run each way (torch 2.14.1, CPU, r of the activations), before
// and with both rules: the LSTM 340 -> 236 at r = 0.5 and 894 -> 531 at 0.3, ResNet 526 -> 326
// (its level under a budget that never binds: 318) and 644 -> 393, DenseNet 2,179 -> 1,821 and
// 2,779 -> 2,715, UNet 868 -> 817 and 2,162 -> 1,384, the Transformer 422 -> 422 and 644 -> 487;
// the TreeLSTM and the chain, whose tensors are all small, as before. With a backend that resizes
// nothing (CUDA) the choice is as before.
size_t CachingAllocator::ReleaseCachedSegmentsLocked(size_t at_least, const Segment* keep, bool prefer_unresizable) {
  const std::vector<Segment*> chosen = CachedSegmentsToReleaseLocked(at_least, keep, prefer_unresizable);
  // Note [Small requests keep resizable segments]: a resizable one chosen alone gives up what
  // is needed, not all of itself.
  if (prefer_unresizable && chosen.size() == 1) {
    if (const size_t given_back = ShrinkCachedSegmentLocked(chosen[0], at_least)) return given_back;
  }
  size_t released = 0;
  for (Segment* segment : chosen) {
    released += segment->size;
    ReleaseSegmentLocked(segment);
  }
  return released;
}

size_t CachingAllocator::ShrinkCachedSegmentLocked(Segment* segment, size_t by) {
  const size_t old_size = segment->size;
  if (by == 0 || by >= old_size) return 0;  // nothing to give up, or all of it: not a shrink
  const size_t new_size = (old_size - by) / config_.min_block_size * config_.min_block_size;
  if (new_size == 0 || !backend_->CanResize(old_size, new_size)) return 0;  // below old_size: by > 0
  absl::StatusOr<void*> memory = backend_->Resize(reinterpret_cast<void*>(segment->base), old_size, new_size);
  if (!memory.ok()) return 0;  // the segment is still there, as it was
  const Pool pool = segment->pool;
  const Stream stream = segment->stream;
  const uint64_t last_hand_out = segment->last_hand_out;
  ForgetSegmentLocked(segment);
  ++stats_.num_segment_resizes;
  AddCachedSegmentLocked(*memory, new_size, pool, stream, last_hand_out);
  return old_size - new_size;
}

std::vector<CachingAllocator::Segment*> CachingAllocator::CachedSegmentsToReleaseLocked(size_t at_least,
                                                                                        const Segment* keep,
                                                                                        bool prefer_unresizable) {
  std::vector<Segment*> releasable;
  if (at_least == SIZE_MAX) {
    for (auto& [base, segment] : segments_) {
      if (segment->releasable && segment.get() != keep) releasable.push_back(segment.get());  // Note [Releasable bytes]
    }
    return releasable;
  }
  IndexReleasableLocked();
  // The segments below `end` but `keep`, and with `unresizable_only` those the backend cannot
  // resize, the largest first (of equal sizes, the lowest address first), until they cover
  // at_least; whether they do. (In rung 4 the check skips nothing on the host: a request the
  // backend cannot resize has a shortfall no larger than its own segment, and HostBackend resizes
  // nothing smaller than that.)
  auto largest_first = [&](ReleasableIndex::iterator end, bool unresizable_only) {
    size_t sum = 0;
    for (auto group_end = end; sum < at_least && group_end != releasable_by_size_.begin();) {
      const size_t size = std::prev(group_end)->first.first;
      const auto group = releasable_by_size_.lower_bound({size, 0});
      const bool skip = unresizable_only && backend_->CanResize(size, size);
      for (auto it = group; !skip && it != group_end && sum < at_least; ++it) {
        if (it->second == keep) continue;
        releasable.push_back(it->second);
        sum += size;
      }
      group_end = group;
    }
    return sum >= at_least;
  };
  // Note [Releasable segments by size]. The smallest that covers the shortfall alone (of equal
  // sizes, the highest address)...
  auto one = releasable_by_size_.lower_bound({at_least, 0});
  while (one != releasable_by_size_.end() && one->second == keep) ++one;
  // Note [Small requests keep resizable segments]: rather the smaller ones the backend cannot
  // resize, if they cover it, than a resizable one alone.
  if (prefer_unresizable && one != releasable_by_size_.end() && backend_->CanResize(one->first.first, one->first.first)) {
    if (largest_first(one, /*unresizable_only=*/true)) return releasable;
    releasable.clear();
  }
  if (one != releasable_by_size_.end()) {
    auto last = std::prev(releasable_by_size_.upper_bound({one->first.first, UINTPTR_MAX}));
    while (last->second == keep) --last;  // stops at `one` at the latest
    return {last->second};
  }
  // ... else the largest first until they do.
  largest_first(releasable_by_size_.end(), /*unresizable_only=*/false);
  return releasable;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  ReleaseCachedSegmentsLocked();
  resize_gate_.Reset();  // Note [Undone resizes]: maybe another phase of the run
}

// ---------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------

CachingAllocator::Block* CachingAllocator::FindAllocatedLocked(void* ptr) const {
  auto it = allocated_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  return it == allocated_blocks_.end() ? nullptr : it->second;
}

absl::StatusOr<size_t> CachingAllocator::BlockSize(void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Block* block = FindAllocatedLocked(ptr);
  if (block == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%p is not an allocated block", ptr));
  }
  return block->size;
}

absl::StatusOr<size_t> CachingAllocator::CoalescedFreeSizeIfFreed(void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Block* block = FindAllocatedLocked(ptr);
  if (block == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%p is not an allocated block", ptr));
  }
  if (!block->stream_uses.empty()) return size_t{0};
  size_t size = block->size;
  if (block->prev != nullptr && block->prev->is_free()) size += block->prev->size;
  if (block->next != nullptr && block->next->is_free()) size += block->next->size;
  return size;
}

bool CachingAllocator::CanSatisfyLocked(size_t rounded, Pool pool, Stream stream,
                                        size_t extra_releasable) const {
  if (FindFreeBlockLocked(rounded, pool, stream) != nullptr) return true;
  const size_t needed = config_.shrink_segment_to_fit_budget ? sizes_.MinimalSegmentSize(rounded)
                                                             : sizes_.SegmentSize(rounded);
  const size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
  const size_t releasable = std::min(reserved, ReleasableBytesLocked() + extra_releasable);
  return needed <= budget_bytes_ && reserved - releasable <= budget_bytes_ - needed;
}

bool CachingAllocator::CanSatisfy(const EvictionRequest& request) {
  const size_t rounded =
      sizes_.RoundSize(std::max(request.rounded_bytes, request.requested_bytes));
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  return CanSatisfyLocked(rounded, sizes_.PoolFor(rounded), request.stream, 0);
}

bool CachingAllocator::WouldSatisfyIfFreed(void* ptr, const EvictionRequest& request) {
  const size_t rounded =
      sizes_.RoundSize(std::max(request.rounded_bytes, request.requested_bytes));
  const Pool pool = sizes_.PoolFor(rounded);
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  const Block* block = FindAllocatedLocked(ptr);
  if (block == nullptr || !block->stream_uses.empty()) {
    return CanSatisfyLocked(rounded, pool, request.stream, 0);
  }
  size_t coalesced = block->size;
  if (block->prev != nullptr && block->prev->is_free()) coalesced += block->prev->size;
  if (block->next != nullptr && block->next->is_free()) coalesced += block->next->size;
  const bool whole_segment = coalesced == block->segment->size;
  if (block->pool == pool && block->stream == request.stream && coalesced >= rounded &&
      !ExactReuseRefusesLocked(coalesced, whole_segment, rounded))
    return true;
  const size_t extra = whole_segment ? block->segment->size : 0;
  return CanSatisfyLocked(rounded, pool, request.stream, extra);
}

EvictionRequest CachingAllocator::MakeRequestLocked(size_t requested, size_t rounded, Pool pool,
                                                    Stream stream) const {
  EvictionRequest request;
  request.requested_bytes = requested;
  request.rounded_bytes = rounded;
  request.pool = pool;
  request.stream = stream;
  request.budget_bytes = budget_bytes_;
  request.reserved_bytes = static_cast<size_t>(stats_.reserved_bytes.current);
  request.allocated_bytes = static_cast<size_t>(stats_.allocated_bytes.current);
  return request;
}

EvictionRequest CachingAllocator::MakeRequest(size_t bytes, Stream stream) const {
  const size_t rounded = sizes_.RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  return MakeRequestLocked(bytes, rounded, sizes_.PoolFor(rounded), stream);
}

size_t CachingAllocator::LargestFreeBlockLocked() const {
  size_t largest = 0;
  for (const FreeBlocks& set : free_blocks_) {
    set.ForEach([&](const Block* block) { largest = std::max(largest, block->size); });
  }
  return largest;
}

AllocatorStats CachingAllocator::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

size_t CachingAllocator::MarkHighWater() {
  const int64_t now = allocated_now_.load(std::memory_order_relaxed);
  high_water_.store(now, std::memory_order_relaxed);
  return static_cast<size_t>(now);
}

std::pair<size_t, size_t> CachingAllocator::HighWaterSinceMark() const {
  const int64_t now = allocated_now_.load(std::memory_order_relaxed);
  return {static_cast<size_t>(std::max(high_water_.load(std::memory_order_relaxed), now)), static_cast<size_t>(now)};
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.ResetPeaks();
}

MemorySnapshot CachingAllocator::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return SnapshotLocked();
}

MemorySnapshot CachingAllocator::SnapshotLocked() const {
  MemorySnapshot snapshot;
  snapshot.stats = stats_;
  snapshot.segments.reserve(segments_.size());
  for (const auto& [base, segment] : segments_) {
    SegmentSnapshot& seg = snapshot.segments.emplace_back();
    seg.address = segment->base;
    seg.size = segment->size;
    seg.pool = segment->pool;
    seg.stream = segment->stream;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      BlockSnapshot& block = seg.blocks.emplace_back();
      block.address = b->ptr;
      block.size = b->size;
      block.requested_size = b->requested_size;
      block.state = b->allocated            ? BlockState::kAllocated
                    : b->pending_events > 0 ? BlockState::kPendingEvents
                                            : BlockState::kFree;
    }
  }
  return snapshot;
}

absl::Status CachingAllocator::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto fail = [](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat("CachingAllocator invariant: ", parts...));
  };
  // Note [Budget is a hard cap].
  if (stats_.reserved_bytes.current < 0 ||
      static_cast<size_t>(stats_.reserved_bytes.current) > budget_bytes_) {
    return fail("reserved ", stats_.reserved_bytes.current, " exceeds budget ",
                budget_bytes_);
  }
  if (absl::Status gate = resize_gate_.CheckInvariants(hand_out_clock_); !gate.ok()) return gate;
  std::unordered_map<const Block*, int> pending_entries;
  for (const PendingEvent& pending : pending_events_) ++pending_entries[pending.block];

  size_t free_blocks_seen[kNumPools] = {0, 0};
  size_t allocated_seen = 0;
  size_t releasable = 0, releasable_count = 0;
  uintptr_t previous_end = 0;
  for (const auto& [base, segment] : segments_) {
    // Note [Releasable bytes].
    if (segment->head != nullptr) {
      const bool whole_and_free = segment->OneFreeBlock();
      if (whole_and_free != segment->releasable)
        return fail("segment ", base,
                    whole_and_free ? " is one free block but not counted" : " is counted but not one free block",
                    " in releasable_bytes_");
      if (whole_and_free) {
        releasable += segment->size;
        ++releasable_count;
        // Note [Releasable segments by size].
        if (releasable_indexed_) {
          auto indexed = releasable_by_size_.find({segment->size, segment->base});
          if (indexed == releasable_by_size_.end() || indexed->second != segment.get())
            return fail("releasable segment ", base, " of ", segment->size, " bytes is not in releasable_by_size_");
        }
      }
    }
    // Note [Segment tiling].
    if (base != segment->base) return fail("segment map key mismatch at ", base);
    if (segment->base < previous_end) return fail("segments overlap at ", base);
    previous_end = segment->base + segment->size;
    if (segment->head == nullptr || segment->head->prev != nullptr) {
      return fail("segment ", base, " has a bad head block");
    }
    uintptr_t cursor = segment->base;
    const Block* prev = nullptr;
    for (const Block* b = segment->head; b != nullptr; prev = b, b = b->next) {
      if (b->prev != prev) return fail("broken prev link at block ", b->ptr);
      if (b->ptr != cursor) return fail("gap or overlap at block ", b->ptr, ", expected ", cursor);
      if (b->size == 0 || b->size % config_.min_block_size != 0) {
        return fail("block ", b->ptr, " has size ", b->size);
      }
      if (b->segment != segment.get() || b->pool != segment->pool ||
          b->stream != segment->stream) {
        return fail("block ", b->ptr, " disagrees with its segment");
      }
      cursor += b->size;
      // Note [Eager coalescing].
      if (prev != nullptr && prev->is_free() && b->is_free()) {
        return fail("adjacent free blocks ", prev->ptr, " and ", b->ptr, " not coalesced");
      }
      // Note [Free set mirrors free blocks].
      const FreeBlocks& set = free_blocks_[static_cast<int>(b->pool)];
      const bool in_free_set = set.Contains(b);
      if (b->allocated) {
        if (b->pending_events != 0) return fail("allocated block ", b->ptr, " has events");
        auto it = allocated_blocks_.find(b->ptr);
        if (it == allocated_blocks_.end() || it->second != b) {
          return fail("allocated block ", b->ptr, " missing from allocated_blocks_");
        }
        ++allocated_seen;
      } else if (!b->stream_uses.empty()) {
        return fail("non-allocated block ", b->ptr, " keeps stream uses");
      }
      if (b->is_free() != in_free_set) {
        return fail("block ", b->ptr, b->is_free() ? " is free but not" : " is not free but",
                    " in the free set");
      }
      if (b->is_free()) ++free_blocks_seen[static_cast<int>(b->pool)];
      auto pe = pending_entries.find(b);
      const int entries = pe == pending_entries.end() ? 0 : pe->second;
      if (entries != b->pending_events) {
        return fail("block ", b->ptr, " counts ", b->pending_events, " events but ", entries,
                    " are queued");
      }
    }
    if (cursor != segment->base + segment->size) {
      return fail("blocks of segment ", base, " do not end at its end");
    }
  }
  for (int p = 0; p < kNumPools; ++p) {
    if (absl::Status s = free_blocks_[p].CheckInvariants(); !s.ok()) return s;
    if (free_blocks_[p].size() != free_blocks_seen[p]) {
      return fail("free set of pool ", p, " holds ", free_blocks_[p].size(), " blocks, segments ",
                  free_blocks_seen[p]);
    }
  }
  if (releasable != releasable_bytes_)
    return fail("releasable_bytes_ = ", releasable_bytes_, " but free segments sum to ", releasable);
  if (releasable_by_size_.size() != (releasable_indexed_ ? releasable_count : 0))
    return fail("releasable_by_size_ holds ", releasable_by_size_.size(), " segments but ", releasable_count,
                " are releasable");
  if (allocated_blocks_.size() != allocated_seen) {
    return fail("allocated_blocks_ holds ", allocated_blocks_.size(), " blocks, segments ",
                allocated_seen);
  }
  // Note [Stats match snapshot].
  const MemorySnapshot::Totals totals = SnapshotLocked().ComputeTotals();
  auto check = [&](const char* name, int64_t stat, int64_t total) -> absl::Status {
    if (stat != total) return fail("stat ", name, " = ", stat, " but blocks sum to ", total);
    return absl::OkStatus();
  };
  for (absl::Status s :
       {check("reserved_bytes", stats_.reserved_bytes.current, totals.reserved_bytes),
        check("allocated_bytes", stats_.allocated_bytes.current, totals.allocated_bytes),
        check("active_bytes", stats_.active_bytes.current, totals.active_bytes),
        check("requested_bytes", stats_.requested_bytes.current, totals.requested_bytes),
        check("segment_count", stats_.segment_count.current, totals.segments),
        check("allocation_count", stats_.allocation_count.current, totals.allocated_blocks),
        check("active_count", stats_.active_count.current, totals.active_blocks)}) {
    if (!s.ok()) return s;
  }
  for (const Stat* s : {&stats_.allocated_bytes, &stats_.active_bytes, &stats_.reserved_bytes,
                        &stats_.requested_bytes}) {
    if (s->peak < s->current) return fail("a peak is below its current value");
  }
  return absl::OkStatus();
}

}  // namespace dtr::alloc
