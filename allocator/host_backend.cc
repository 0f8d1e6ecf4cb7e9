// Host-RAM backend (see host_backend.h).
#include "allocator/host_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

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

bool HostBackend::Mapped(size_t padded) const {
  static const size_t page_size = size_t(sysconf(_SC_PAGESIZE));  // asked once: CanResize runs per cached segment
  return padded >= kMapThreshold && alignment_ <= page_size;
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
  if (Mapped(padded)) munmap(ptr, padded);
  else std::free(ptr);
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
  // Shrinking unmaps the tail in place; growing may move the mapping, its pages with it.
  void* p = mremap(ptr, old_padded, new_padded, MREMAP_MAYMOVE);
  if (p == MAP_FAILED)
    return absl::ResourceExhaustedError(absl::StrCat("HostBackend: mremap(", old_padded, " -> ", new_padded, ") failed"));
  live_bytes_.fetch_add(new_bytes, std::memory_order_relaxed);
  live_bytes_.fetch_sub(old_bytes, std::memory_order_relaxed);
  return p;
}

absl::StatusOr<EventHandle> HostBackend::RecordEvent(Stream stream) {
  return EventHandle{next_event_.fetch_add(1, std::memory_order_relaxed)};
}

}  // namespace dtr::alloc
