// Host-RAM backend (see host_backend.h).
#include "allocator/host_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtr::alloc {

// Note [Large host segments are mapped]
// Segments of kMapThreshold bytes or more are mmap'ed and munmap'ed directly instead of coming
// from malloc. glibc raises its own mmap threshold to the size of each mapped chunk it frees, so
// after the first free, large segments come from the heap; a small long-lived malloc (a replay
// record) placed in a freed large chunk then splits it, the next segment no longer fits and the
// heap grows: when segments were released as soon as they were freed (under a budget, before
// Note [Exact reuse]), an EMA carried across steps grew the process by 0.75 MB a
// step while dtr's accounting stayed flat. Rung 4 of the retry ladder still releases them.
// Mapped segments return to the OS when freed and never mix with small allocations.
constexpr size_t kMapThreshold = 128 << 10;

namespace {
size_t PageSize() {
  static const size_t page_size = size_t(sysconf(_SC_PAGESIZE));  // asked once: CanResize runs per cached segment
  return page_size;
}

size_t PageAligned(size_t bytes) {
  const size_t page = PageSize();
  return (bytes + page - 1) / page * page;
}

}  // namespace

bool HostBackend::Mapped(size_t padded) const {
  return padded >= kMapThreshold && alignment_ <= PageSize();
}

// Note [Seams]
// ~~~~~~~~~~~~
// A segment that took another's pages (Note [Growing into cached pages], caching_allocator.cc) is
// made of several kernel mappings: anonymous mappings of different origins do not merge. munmap
// spans mappings, but mremap moves or resizes within one only (EFAULT otherwise). So the backend
// keeps the seams, the addresses inside a live mapped segment where one mapping ends and the next
// begins, and resizes or moves such a segment mapping by mapping. A seam the kernel merged away, or
// one left behind, costs one mremap more. A move that fails (too many mappings: vm.max_map_count)
// may already have unmapped its destination (Linux unmaps it before checking the source), so the
// destination is mapped afresh (the pages moved are lost, never the memory's validity); should that
// fail too, the process stops with a message rather than hand out memory that is not there.
bool HostBackend::HasSeamInsideLocked(uintptr_t begin, uintptr_t end) const {
  auto it = seams_.upper_bound(begin);
  return it != seams_.end() && *it < end;
}

namespace {

// munmap of part of a mapping needs a new one, and fails at vm.max_map_count: the pages then stay
// mapped while no longer counted, which is said once.
void Unmap(uintptr_t begin, size_t bytes) {
  if (munmap(reinterpret_cast<void*>(begin), bytes) == 0) return;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr, "dtr: HostBackend: munmap(%#zx, %zu) failed: %s; those pages stay mapped "
                 "(raise vm.max_map_count?)\n", size_t(begin), bytes, std::strerror(errno));
  }
}

}  // namespace

void HostBackend::ForgetSeamsAtEndsLocked(uintptr_t begin, uintptr_t end) {
  // A segment's start and end are no seams: MovePagesLocked records both ends of what it moves.
  seams_.erase(begin);
  seams_.erase(end);
}

void HostBackend::UnmapLocked(uintptr_t begin, uintptr_t end) {
  if (begin >= end) return;
  Unmap(begin, end - begin);
  seams_.erase(seams_.lower_bound(begin), seams_.lower_bound(end));
}

void HostBackend::MovePagesLocked(uintptr_t from, size_t bytes, uintptr_t to) {
  // The mappings of [from, from + bytes), in order; each lands at the same offset from `to`.
  std::vector<uintptr_t> starts{from};
  for (auto it = seams_.upper_bound(from); it != seams_.end() && *it < from + bytes; ++it) starts.push_back(*it);
  seams_.erase(seams_.lower_bound(from), seams_.lower_bound(from + bytes));
  for (size_t i = 0; i < starts.size(); ++i) {
    const uintptr_t begin = starts[i], end = i + 1 < starts.size() ? starts[i + 1] : from + bytes;
    const uintptr_t at = to + (begin - from);
    void* moved = mremap(reinterpret_cast<void*>(begin), end - begin, end - begin, MREMAP_MAYMOVE | MREMAP_FIXED,
                         reinterpret_cast<void*>(at));
    if (moved == MAP_FAILED) {  // Note [Seams]: the pages go back, `at` is mapped afresh
      const int error = errno;
      Unmap(begin, end - begin);
      if (mmap(reinterpret_cast<void*>(at), end - begin, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        std::fprintf(stderr, "dtr: HostBackend: moving %zu bytes of pages to %#zx failed (%s) and so did mapping "
                     "them afresh (%s); cannot continue\n", size_t(end - begin), size_t(at), std::strerror(error),
                     std::strerror(errno));
        std::abort();
      }
    }
    seams_.insert(at);
    seams_.insert(at + (end - begin));
  }
}

absl::StatusOr<void*> HostBackend::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("HostBackend::Allocate of 0 bytes");
  const size_t padded = Padded(bytes);
  if (padded < bytes) return absl::ResourceExhaustedError("HostBackend: size overflow");
  if (Mapped(padded)) {
    void* p = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return absl::ResourceExhaustedError(absl::StrCat("HostBackend: mmap(", padded, ") failed"));
    live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return p;
  }
  void* ptr = std::aligned_alloc(alignment_, padded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("HostBackend: aligned_alloc(", alignment_,
                                                     ", ", padded, ") failed"));
  }
  live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return ptr;
}

void HostBackend::Free(void* ptr, size_t bytes) {
  const size_t padded = Padded(bytes);
  if (Mapped(padded)) {
    const auto begin = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    UnmapLocked(begin, begin + PageAligned(padded));
  } else {
    std::free(ptr);
  }
  live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

bool HostBackend::CanResize(size_t old_bytes, size_t new_bytes) const {
  const size_t new_padded = Padded(new_bytes);
  return new_bytes > 0 && new_padded >= new_bytes && Mapped(Padded(old_bytes)) && Mapped(new_padded);
}

absl::StatusOr<void*> HostBackend::Resize(void* ptr, size_t old_bytes, size_t new_bytes) {
  if (!CanResize(old_bytes, new_bytes))
    return absl::UnimplementedError("HostBackend resizes only segments mapped on their own");
  const size_t old_padded = Padded(old_bytes), new_padded = Padded(new_bytes);
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  void* p;
  std::lock_guard<std::mutex> lock(mu_);
  if (!HasSeamInsideLocked(begin, begin + PageAligned(old_padded))) {
    // Shrinking unmaps the tail in place; growing may move the mapping, its pages with it.
    p = mremap(ptr, old_padded, new_padded, MREMAP_MAYMOVE);
  } else if (new_padded <= old_padded) {  // Note [Seams]
    UnmapLocked(begin + PageAligned(new_padded), begin + PageAligned(old_padded));
    p = ptr;
  } else {
    p = mmap(nullptr, new_padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      MovePagesLocked(begin, PageAligned(old_padded), reinterpret_cast<uintptr_t>(p));
      ForgetSeamsAtEndsLocked(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + PageAligned(new_padded));
    }
  }
  if (p == MAP_FAILED)
    return absl::ResourceExhaustedError(absl::StrCat("HostBackend: mremap(", old_padded, " -> ", new_padded, ") failed"));
  live_bytes_.fetch_add(new_bytes, std::memory_order_relaxed);
  live_bytes_.fetch_sub(old_bytes, std::memory_order_relaxed);
  return p;
}

absl::StatusOr<size_t> HostBackend::Split(void* ptr, size_t bytes, size_t head_bytes) {
  // A mapping's pages are unmapped or remapped by range: nothing to do but count.
  const size_t offset = PageAligned(head_bytes);
  if (head_bytes == 0 || offset >= bytes || !Mapped(Padded(bytes)) || !Mapped(Padded(head_bytes)) ||
      !Mapped(Padded(bytes - offset))) {
    return absl::UnimplementedError("HostBackend splits only into segments mapped on their own");
  }
  // The head's last page is still the head's (freed with it), but no longer counted.
  live_bytes_.fetch_sub(offset - head_bytes, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  seams_.erase(reinterpret_cast<uintptr_t>(ptr) + offset);  // a segment's start is no seam
  return offset;
}

absl::StatusOr<void*> HostBackend::ResizeWithPagesOf(void* ptr, size_t old_bytes, size_t new_bytes,
                                                     absl::Span<const Piece> donors) {
  absl::StatusOr<void*> grown = new_bytes > old_bytes ? Resize(ptr, old_bytes, new_bytes)
                                                      : absl::InvalidArgumentError("HostBackend: not a growth");
  std::lock_guard<std::mutex> lock(mu_);
  const auto base = grown.ok() ? reinterpret_cast<uintptr_t>(*grown) : 0;
  uintptr_t at = base + PageAligned(Padded(old_bytes));
  const uintptr_t end = base + PageAligned(Padded(new_bytes));
  for (const Piece& donor : donors) {
    live_bytes_.fetch_sub(donor.bytes, std::memory_order_relaxed);
    if (!Mapped(Padded(donor.bytes))) {
      std::free(donor.ptr);
      continue;
    }
    const auto from = reinterpret_cast<uintptr_t>(donor.ptr);
    const size_t pages = PageAligned(Padded(donor.bytes));
    const size_t taken = grown.ok() && at < end ? std::min<size_t>(pages, end - at) : 0;
    if (taken > 0) MovePagesLocked(from, taken, at);
    UnmapLocked(from + taken, from + pages);
    at += taken;
  }
  if (grown.ok()) ForgetSeamsAtEndsLocked(base, end);
  return grown;
}

absl::StatusOr<EventHandle> HostBackend::RecordEvent(Stream stream) {
  return EventHandle{next_event_.fetch_add(1, std::memory_order_relaxed)};
}

}  // namespace dtr::alloc
