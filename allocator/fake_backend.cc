// Simulated backend for tests (see fake_backend.h).
#include "allocator/fake_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dtr::alloc {

absl::StatusOr<void*> FakeBackend::Allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.allocate_calls;
  bool inject = false;
  if (fail_next_ > 0) {
    --fail_next_;
    inject = true;
  }
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) inject = true;
  if (inject) {
    ++counters_.failed_allocations;
    return absl::ResourceExhaustedError(
        absl::StrCat("FakeBackend: injected failure allocating ", bytes, " bytes"));
  }
  if (bytes == 0 || bytes > capacity_ || counters_.live_bytes > capacity_ - bytes) {
    ++counters_.failed_allocations;
    return absl::ResourceExhaustedError(absl::StrCat("FakeBackend: out of capacity allocating ",
                                                     bytes, " bytes (live ", counters_.live_bytes,
                                                     ", capacity ", capacity_, ")"));
  }
  const uintptr_t address = next_address_;
  // Leave a gap after each segment so that neighbouring segments are never contiguous.
  next_address_ += (bytes + alignment_ - 1) / alignment_ * alignment_ + alignment_;
  live_[address] = bytes;
  counters_.live_bytes += bytes;
  counters_.peak_live_bytes = std::max(counters_.peak_live_bytes, counters_.live_bytes);
  ++counters_.live_segments;
  return reinterpret_cast<void*>(address);
}

void FakeBackend::Free(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.free_calls;
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end() || it->second != bytes) {
    ++counters_.bad_frees;
    return;
  }
  counters_.live_bytes -= bytes;
  --counters_.live_segments;
  live_.erase(it);
}

bool FakeBackend::CanResize(size_t old_bytes, size_t new_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return resizable_ && old_bytes >= resizable_from_ && new_bytes >= resizable_from_;
}

absl::StatusOr<void*> FakeBackend::Resize(void* ptr, size_t old_bytes, size_t new_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resizable_) return absl::UnimplementedError("FakeBackend: resizing is off");
  if (resizable_from_ > 1 && (old_bytes < resizable_from_ || new_bytes < resizable_from_))
    return absl::UnimplementedError("FakeBackend: resizing only from and to set_resizable_from's size");
  if (fail_resizes_) return absl::ResourceExhaustedError("FakeBackend: resizes fail (set_fail_resizes)");
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end() || it->second != old_bytes) {
    ++counters_.bad_frees;
    return absl::InvalidArgumentError("FakeBackend: Resize of memory it did not hand out");
  }
  const size_t others = counters_.live_bytes - old_bytes;
  if (new_bytes == 0 || new_bytes > capacity_ || others > capacity_ - new_bytes)
    return absl::ResourceExhaustedError(absl::StrCat("FakeBackend: out of capacity resizing to ", new_bytes, " bytes"));
  uintptr_t address = it->first;
  live_.erase(it);
  if (new_bytes > old_bytes) {
    address = next_address_;
    next_address_ += (new_bytes + alignment_ - 1) / alignment_ * alignment_ + alignment_;
  }
  live_[address] = new_bytes;
  counters_.live_bytes = others + new_bytes;
  counters_.peak_live_bytes = std::max(counters_.peak_live_bytes, counters_.live_bytes);
  ++counters_.resize_calls;
  return reinterpret_cast<void*>(address);
}

absl::StatusOr<size_t> FakeBackend::Split(void* ptr, size_t bytes, size_t head_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (page_bytes_ == 0) return absl::UnimplementedError("FakeBackend: splitting is off");
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end() || it->second != bytes) {
    ++counters_.bad_frees;
    return absl::InvalidArgumentError("FakeBackend: Split of memory it did not hand out");
  }
  const size_t offset = (head_bytes + page_bytes_ - 1) / page_bytes_ * page_bytes_;
  if (head_bytes < page_bytes_ || offset >= bytes || bytes - offset < page_bytes_)
    return absl::UnimplementedError("FakeBackend: a piece would be smaller than a page");
  it->second = head_bytes;
  live_[it->first + offset] = bytes - offset;
  counters_.live_bytes -= offset - head_bytes;
  ++counters_.live_segments;
  ++counters_.split_calls;
  return offset;
}

absl::StatusOr<void*> FakeBackend::ResizeWithPagesOf(void* ptr, size_t old_bytes, size_t new_bytes,
                                                     absl::Span<const Piece> donors) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.donors += static_cast<int64_t>(donors.size());
  }
  return DeviceMemoryBackend::ResizeWithPagesOf(ptr, old_bytes, new_bytes, donors);
}

absl::StatusOr<EventHandle> FakeBackend::RecordEvent(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_record_event_) return absl::InternalError("FakeBackend: injected RecordEvent failure");
  const uint64_t id = next_event_++;
  events_[id] = EventState{stream, auto_complete_};
  ++counters_.events_recorded;
  ++counters_.live_events;
  return EventHandle{id};
}

bool FakeBackend::EventDone(EventHandle event) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.event_queries;
  auto it = events_.find(event.id);
  return it != events_.end() && it->second.done;
}

void FakeBackend::DestroyEvent(EventHandle event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(event.id) == 1) {
    ++counters_.events_destroyed;
    --counters_.live_events;
  }
}

void FakeBackend::set_page_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  page_bytes_ = bytes;
}

void FakeBackend::set_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
}

void FakeBackend::set_resizable(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  resizable_ = on;
}

void FakeBackend::set_fail_resizes(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_resizes_ = on;
}

void FakeBackend::set_resizable_from(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  resizable_from_ = bytes > 0 ? bytes : 1;
}

void FakeBackend::FailNthAllocation(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_countdown_ = n;
}

void FakeBackend::FailNextAllocations(int64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = count;
}

void FakeBackend::set_fail_record_event(bool fail) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_record_event_ = fail;
}

void FakeBackend::CompleteEvents(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, state] : events_) {
    if (state.stream == stream) state.done = true;
  }
}

void FakeBackend::CompleteAllEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, state] : events_) state.done = true;
}

void FakeBackend::set_auto_complete_events(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  auto_complete_ = on;
}

std::vector<Stream> FakeBackend::StreamsWithPendingEvents() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Stream> streams;
  for (const auto& [id, state] : events_) {
    if (!state.done &&
        std::find(streams.begin(), streams.end(), state.stream) == streams.end()) {
      streams.push_back(state.stream);
    }
  }
  std::sort(streams.begin(), streams.end());
  return streams;
}

FakeBackend::Counters FakeBackend::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace dtr::alloc
