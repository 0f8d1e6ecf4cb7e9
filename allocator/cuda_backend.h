// A DeviceMemoryBackend over the CUDA runtime: cudaMalloc/cudaFree for segments and
// cudaEventRecord/cudaEventQuery for stream-ordered reuse. Built only when the CUDA toolkit is
// found (target dtr_allocator_cuda). It never synchronizes the device explicitly (note that
// cudaFree itself may, exactly as in PyTorch's allocator, which is why the caching allocator
// frees segments only on EmptyCache or under memory pressure).
#ifndef DTR_ALLOCATOR_CUDA_BACKEND_H_
#define DTR_ALLOCATOR_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include <mutex>  // std::mutex: visible to ThreadSanitizer even with a prebuilt abseil
#include "allocator/device_memory_backend.h"

namespace dtr::alloc {

class CudaBackend : public DeviceMemoryBackend {
 public:
  // Number of visible CUDA devices, or an error when there is no driver/device.
  static absl::StatusOr<int> DeviceCount();
  // Checks that `device` exists before returning a backend for it.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);

  ~CudaBackend() override;

  std::string Name() const override;
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  size_t MinAlignment() const override { return 256; }
  // `stream.id` holds a cudaStream_t (0 = legacy default stream).
  absl::StatusOr<EventHandle> RecordEvent(Stream stream) override;
  bool EventDone(EventHandle event) override;
  void DestroyEvent(EventHandle event) override;

  int device() const { return device_; }

 private:
  explicit CudaBackend(int device) : device_(device) {}

  const int device_;
  std::mutex mu_;
  // Destroyed events are kept for reuse; cudaEventCreate is comparatively expensive.
  std::vector<uintptr_t> spare_events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_CUDA_BACKEND_H_
