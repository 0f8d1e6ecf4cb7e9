// The narrow interface between the caching allocator and whatever really owns device memory and
// streams (CUDA, host RAM, or a simulation for tests). The allocator calls it with its own mutex
// held, so implementations must not call back into the allocator.
#ifndef DTR_ALLOCATOR_DEVICE_MEMORY_BACKEND_H_
#define DTR_ALLOCATOR_DEVICE_MEMORY_BACKEND_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/stream.h"

namespace dtr::alloc {

class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;

  // Short name for messages ("cuda:0", "host", "fake").
  virtual std::string Name() const = 0;

  // Obtains `bytes` of memory aligned to at least `MinAlignment()`. Returns ResourceExhausted when
  // the device is out of memory (the allocator then frees its cache and retries) and any other
  // error for unexpected failures.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Returns memory obtained from Allocate with the same size. Must not fail.
  virtual void Free(void* ptr, size_t bytes) = 0;
  // Turns memory obtained from Allocate(old_bytes) (or an earlier Resize) into new_bytes of
  // memory, keeping what it can of the pages already backing it (mremap on the host), and
  // returns its address; `ptr` is then invalid. Contents are not preserved in any defined way.
  // On failure `ptr` stays valid. Unimplemented (the default) where the backend cannot; the
  // allocator then frees and allocates (Note [Recycling a cached segment], caching_allocator.cc).
  virtual absl::StatusOr<void*> Resize(void* ptr, size_t old_bytes, size_t new_bytes) {
    (void)ptr, (void)old_bytes, (void)new_bytes;
    return absl::UnimplementedError("this backend cannot resize memory");
  }
  // Memory obtained from Allocate, Resize or Split, with its size.
  struct Piece {
    void* ptr;
    size_t bytes;
  };
  // Resize to a larger new_bytes that fills the added bytes with the pages backing `donors`, in
  // order, before any new page (HostBackend: mremap moves them; none is faulted in again). The
  // donors are gone afterwards whatever the outcome: their pages moved, or returned (Note [Growing
  // into cached pages], caching_allocator.cc). By default they are freed, then Resize.
  virtual absl::StatusOr<void*> ResizeWithPagesOf(void* ptr, size_t old_bytes, size_t new_bytes,
                                                  absl::Span<const Piece> donors) {
    for (const Piece& donor : donors) Free(donor.ptr, donor.bytes);
    return Resize(ptr, old_bytes, new_bytes);
  }
  // Whether Resize from old_bytes to new_bytes is implemented (it may still fail). Monotone in
  // old_bytes: true for some old_bytes stays true for every larger one, so the allocator looks
  // only at the segments it may take (Note [Releasable segments by size], caching_allocator.cc).
  virtual bool CanResize(size_t old_bytes, size_t new_bytes) const {
    (void)old_bytes, (void)new_bytes;
    return false;
  }
  // Cuts memory obtained from Allocate(bytes) (or a Resize or Split since) in two without touching
  // the pages backing it: [ptr, ptr + head_bytes) and [ptr + offset, ptr + bytes), where the
  // returned offset >= head_bytes is where the second piece starts (HostBackend: head_bytes
  // rounded up to a page). Each piece is then memory of its own size to Free, Resize or Split.
  // Unimplemented (the default) where the backend cannot cut that memory there; `ptr` is then
  // unchanged (Note [Splitting a cached segment], caching_allocator.cc).
  virtual absl::StatusOr<size_t> Split(void* ptr, size_t bytes, size_t head_bytes) {
    (void)ptr, (void)bytes, (void)head_bytes;
    return absl::UnimplementedError("this backend cannot split memory");
  }
  // Alignment guaranteed by Allocate, a power of two; blocks are aligned to the smaller of it
  // and min_block_size (Note [Block alignment]).
  virtual size_t MinAlignment() const = 0;

  // Records an event on `stream` capturing all work queued on it so far (cudaEventRecord).
  virtual absl::StatusOr<EventHandle> RecordEvent(Stream stream) = 0;
  // Non-blocking completion query (cudaEventQuery). Must never synchronize. Should an
  // implementation hit an error it cannot report it returns false: memory guarded by an event in
  // an unknown state is never reused.
  virtual bool EventDone(EventHandle event) = 0;
  // Releases an event returned by RecordEvent (after EventDone returned true, or on rollback).
  virtual void DestroyEvent(EventHandle event) = 0;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_DEVICE_MEMORY_BACKEND_H_
