// A DeviceMemoryBackend over host RAM: real, aligned memory from the C library; streams are
// trivially complete, so events are done as soon as they are recorded. Used for CPU runs of the
// runtime, the multi-threaded stress test and the benchmark.
#ifndef DTR_ALLOCATOR_HOST_BACKEND_H_
#define DTR_ALLOCATOR_HOST_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "allocator/device_memory_backend.h"

namespace dtr::alloc {

// The granularity and alignment of dtr's CPU allocator's segments, one a tensor: torch's CPU
// alignment, c10::gAlignment (Note [CPU allocator granularity], hooks/cpu_allocator_adapter.cc).
inline constexpr size_t kHostBlockBytes = 64;

class HostBackend : public DeviceMemoryBackend {
 public:
  // `alignment` must be a power of two >= sizeof(void*).
  explicit HostBackend(size_t alignment = 4096) : alignment_(alignment) {}

  std::string Name() const override { return "host"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  // mremap for segments mapped on their own (Note [Large host segments are mapped]) before and
  // after; Unimplemented for the others.
  absl::StatusOr<void*> Resize(void* ptr, size_t old_bytes, size_t new_bytes) override;
  bool CanResize(size_t old_bytes, size_t new_bytes) const override;
  // At a page boundary, where both pieces are mapped on their own; nothing is mapped or unmapped.
  absl::StatusOr<size_t> Split(void* ptr, size_t bytes, size_t head_bytes) override;
  // Donors mapped on their own give their pages (mremap); the others are freed.
  absl::StatusOr<void*> ResizeWithPagesOf(void* ptr, size_t old_bytes, size_t new_bytes,
                                          absl::Span<const Piece> donors) override;
  size_t MinAlignment() const override { return alignment_; }
  absl::StatusOr<EventHandle> RecordEvent(Stream stream) override;
  bool EventDone(EventHandle event) override { return true; }
  void DestroyEvent(EventHandle event) override {}

  // Bytes currently obtained from the C library.
  size_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

 private:
  size_t Padded(size_t bytes) const { return (bytes + alignment_ - 1) / alignment_ * alignment_; }
  bool Mapped(size_t padded) const;  // Note [Large host segments are mapped]
  // Note [Seams]: moves the pages of [from, from + bytes) to `to`, mapping by mapping.
  void MovePagesLocked(uintptr_t from, size_t bytes, uintptr_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmapLocked(uintptr_t begin, uintptr_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Seams]: after a segment [begin, end) was made of moved mappings.
  void ForgetSeamsAtEndsLocked(uintptr_t begin, uintptr_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasSeamInsideLocked(uintptr_t begin, uintptr_t end) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t alignment_;
  std::atomic<size_t> live_bytes_{0};
  std::atomic<uint64_t> next_event_{1};
  std::mutex mu_;
  // Note [Seams]: addresses inside a mapped segment where one kernel mapping ends and another begins.
  absl::btree_set<uintptr_t> seams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_HOST_BACKEND_H_
