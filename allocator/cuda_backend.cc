// CUDA runtime backend (see cuda_backend.h).
#include "allocator/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dtr::alloc {
namespace {

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

// Makes `device` current for the scope and restores the previous device afterwards, like
// c10::cuda::CUDAGuard.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~ScopedDevice() {
    int current = -1;
    if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess && current != previous_) {
      cudaSetDevice(previous_);
    }
  }

 private:
  int previous_ = -1;
};

cudaEvent_t AsEvent(uintptr_t raw) { return reinterpret_cast<cudaEvent_t>(raw); }

}  // namespace

absl::StatusOr<int> CudaBackend::DeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", CudaErrorText(err)));
  }
  return count;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", *count, " visible)"));
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(device));
}

CudaBackend::~CudaBackend() {
  std::lock_guard<std::mutex> lock(mu_);
  ScopedDevice guard(device_);
  for (uintptr_t raw : spare_events_) cudaEventDestroy(AsEvent(raw));
}

std::string CudaBackend::Name() const { return absl::StrCat("cuda:", device_); }

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  ScopedDevice guard(device_);
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaSuccess) return ptr;
  cudaGetLastError();  // an OOM is not sticky; clear it so later calls do not see it
  std::string text = absl::StrCat("cudaMalloc(", bytes, ") on ", Name(), ": ", CudaErrorText(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(text);
  return absl::InternalError(text);
}

void CudaBackend::Free(void* ptr, size_t bytes) {
  ScopedDevice guard(device_);
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "dtr CudaBackend: cudaFree(%p, %zu) failed: %s\n", ptr, bytes,
                 CudaErrorText(err).c_str());
  }
}

absl::StatusOr<EventHandle> CudaBackend::RecordEvent(Stream stream) {
  ScopedDevice guard(device_);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!spare_events_.empty()) {
      event = AsEvent(spare_events_.back());
      spare_events_.pop_back();
    }
  }
  if (event == nullptr) {
    cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaEventCreateWithFlags: ", CudaErrorText(err)));
    }
  }
  cudaError_t err = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream.id));
  if (err != cudaSuccess) {
    cudaEventDestroy(event);
    return absl::InternalError(absl::StrCat("cudaEventRecord: ", CudaErrorText(err)));
  }
  return EventHandle{reinterpret_cast<uintptr_t>(event)};
}

bool CudaBackend::EventDone(EventHandle event) {
  cudaError_t err = cudaEventQuery(AsEvent(event.id));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // cudaErrorNotReady is reported, not an error state; clear it
    return false;
  }
  std::fprintf(stderr, "dtr CudaBackend: cudaEventQuery failed: %s\n", CudaErrorText(err).c_str());
  return false;
}

void CudaBackend::DestroyEvent(EventHandle event) {
  std::lock_guard<std::mutex> lock(mu_);
  spare_events_.push_back(event.id);
}

}  // namespace dtr::alloc
