// Host-RAM backend (see host_backend.h).
#include "allocator/host_backend.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace dtr::alloc {

absl::StatusOr<void*> HostBackend::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("HostBackend::Allocate of 0 bytes");
  const size_t padded = (bytes + alignment_ - 1) / alignment_ * alignment_;
  if (padded < bytes) return absl::ResourceExhaustedError("HostBackend: size overflow");
  void* ptr = std::aligned_alloc(alignment_, padded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("HostBackend: aligned_alloc(", alignment_,
                                                     ", ", padded, ") failed"));
  }
  live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return ptr;
}

void HostBackend::Free(void* ptr, size_t bytes) {
  std::free(ptr);
  live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

absl::StatusOr<EventHandle> HostBackend::RecordEvent(Stream stream) {
  return EventHandle{next_event_.fetch_add(1, std::memory_order_relaxed)};
}

}  // namespace dtr::alloc
