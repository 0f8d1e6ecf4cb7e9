// A simulated DeviceMemoryBackend for tests: hands out fake, never-dereferenced addresses from a
// bump pointer, enforces a configurable capacity, injects failures (fail the Nth Allocate call),
// lets the test decide when events complete, checks that frees match allocations, and counts
// every call.
#ifndef DTR_ALLOCATOR_FAKE_BACKEND_H_
#define DTR_ALLOCATOR_FAKE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include <mutex>  // std::mutex: visible to ThreadSanitizer even with a prebuilt abseil
#include "allocator/device_memory_backend.h"

namespace dtr::alloc {

class FakeBackend : public DeviceMemoryBackend {
 public:
  struct Counters {
    int64_t allocate_calls = 0;
    int64_t failed_allocations = 0;  // injected or over capacity
    int64_t free_calls = 0;
    int64_t resize_calls = 0;  // successful ones
    int64_t split_calls = 0;  // successful ones
    int64_t donors = 0;  // pieces given to ResizeWithPagesOf
    int64_t bad_frees = 0;  // unknown pointer or wrong size: always a bug in the caller
    int64_t events_recorded = 0;
    int64_t event_queries = 0;
    int64_t events_destroyed = 0;
    size_t live_bytes = 0;
    size_t peak_live_bytes = 0;
    int64_t live_segments = 0;
    int64_t live_events = 0;
  };

  static constexpr uintptr_t kBaseAddress = uintptr_t{1} << 40;

  // `base`: the first address handed out (fakes of several devices in one test must not overlap,
  // as real devices' addresses do not under CUDA's unified addressing).
  explicit FakeBackend(size_t capacity_bytes = SIZE_MAX, size_t alignment = 512, uintptr_t base = kBaseAddress)
      : capacity_(capacity_bytes), alignment_(alignment), next_address_(base) {}

  std::string Name() const override { return "fake"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  // Unimplemented unless set_resizable(true), and below set_resizable_from's size (old or new).
  // Shrinking keeps the address; growing moves the segment to a new one (the capacity counts the
  // new size only).
  absl::StatusOr<void*> Resize(void* ptr, size_t old_bytes, size_t new_bytes) override;
  bool CanResize(size_t old_bytes, size_t new_bytes) const override;
  // Unimplemented unless set_page_bytes(P) with P > 0: cuts at head_bytes rounded up to P, where
  // both pieces are at least P bytes.
  absl::StatusOr<size_t> Split(void* ptr, size_t bytes, size_t head_bytes) override;
  // Counts the donors, then frees them and resizes (the default).
  absl::StatusOr<void*> ResizeWithPagesOf(void* ptr, size_t old_bytes, size_t new_bytes,
                                          absl::Span<const Piece> donors) override;
  size_t MinAlignment() const override { return alignment_; }
  absl::StatusOr<EventHandle> RecordEvent(Stream stream) override;
  bool EventDone(EventHandle event) override;
  void DestroyEvent(EventHandle event) override;

  // --- Test controls ---
  void set_capacity(size_t bytes);
  void set_resizable(bool on);
  // Resizes only from and to at least `bytes` (as HostBackend resizes only the segments it maps).
  void set_resizable_from(size_t bytes);
  // Resize fails (ResourceExhausted) while on, as a host resize may (mremap, vm.max_map_count).
  void set_fail_resizes(bool on);
  void set_page_bytes(size_t bytes);
  // The `n`th Allocate call from now (1 = the next one) fails with ResourceExhausted.
  void FailNthAllocation(int64_t n);
  // The next `count` Allocate calls fail.
  void FailNextAllocations(int64_t count);
  // RecordEvent itself fails (for Free rollback tests) while set.
  void set_fail_record_event(bool fail);
  // Events recorded on `stream` so far become complete.
  void CompleteEvents(Stream stream);
  void CompleteAllEvents();
  // When set, every event is complete as soon as it is recorded.
  void set_auto_complete_events(bool on);
  // Streams with at least one pending (recorded, not completed, not destroyed) event.
  std::vector<Stream> StreamsWithPendingEvents() const;

  Counters counters() const;

 private:
  struct EventState {
    Stream stream;
    bool done = false;
  };

  mutable std::mutex mu_;
  bool resizable_ ABSL_GUARDED_BY(mu_) = false;
  size_t resizable_from_ ABSL_GUARDED_BY(mu_) = 1;
  bool fail_resizes_ ABSL_GUARDED_BY(mu_) = false;
  size_t page_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t capacity_ ABSL_GUARDED_BY(mu_);
  const size_t alignment_;
  uintptr_t next_address_ ABSL_GUARDED_BY(mu_);
  std::map<uintptr_t, size_t> live_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, EventState> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_event_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t fail_countdown_ ABSL_GUARDED_BY(mu_) = 0;  // >0: the call that brings it to 0 fails
  int64_t fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_record_event_ ABSL_GUARDED_BY(mu_) = false;
  bool auto_complete_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_FAKE_BACKEND_H_
