// Device-agnostic names for a stream and for an event recorded on it. The caching allocator keys
// its free sets by stream and tracks cross-stream uses through events; what a stream or event
// really is (a cudaStream_t, nothing at all on the host) is up to the DeviceMemoryBackend.
#ifndef DTR_ALLOCATOR_STREAM_H_
#define DTR_ALLOCATOR_STREAM_H_

#include <cstdint>
#include <string>

namespace dtr::alloc {

// An execution stream. `id` is opaque to the allocator; id 0 is the default stream. The CUDA
// backend stores the cudaStream_t value here (reinterpret_cast to uintptr_t).
struct Stream {
  uint64_t id = 0;

  friend bool operator==(Stream a, Stream b) { return a.id == b.id; }
  friend bool operator!=(Stream a, Stream b) { return a.id != b.id; }
  friend bool operator<(Stream a, Stream b) { return a.id < b.id; }
  template <typename H>
  friend H AbslHashValue(H h, Stream s) {
    return H::combine(std::move(h), s.id);
  }
};

inline std::string StreamName(Stream s) { return "stream " + std::to_string(s.id); }

// An event recorded on a stream by a backend; opaque to the allocator, which only asks the
// backend whether it completed and destroys it afterwards.
struct EventHandle {
  uint64_t id = 0;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_STREAM_H_
