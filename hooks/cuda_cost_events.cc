// CUDA timing events for deferred op costs (see cuda_cost_events.h).
#include "hooks/cuda_cost_events.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

namespace dtr::hooks {
namespace {

cudaEvent_t AsEvent(uint64_t e) { return reinterpret_cast<cudaEvent_t>(uintptr_t(e)); }

}  // namespace

CudaCostEvents::~CudaCostEvents() {
  for (const auto& spares : spare_)
    for (uint64_t e : spares) (void)cudaEventDestroy(AsEvent(e));
}

uint64_t CudaCostEvents::Record() {
  const int device = c10::cuda::current_device();
  if (spare_.size() <= size_t(device)) spare_.resize(size_t(device) + 1);
  std::vector<uint64_t>& spares = spare_[size_t(device)];
  uint64_t e = 0;
  if (!spares.empty()) {
    e = spares.back();
    spares.pop_back();
  } else {
    cudaEvent_t ev = nullptr;
    if (cudaEventCreate(&ev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    e = uint64_t(reinterpret_cast<uintptr_t>(ev));
    device_of_[e] = device;
  }
  if (cudaEventRecord(AsEvent(e), c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device)).stream()) != cudaSuccess) {
    (void)cudaGetLastError();
    spares.push_back(e);
    return 0;
  }
  return e;
}

bool CudaCostEvents::Done(uint64_t event) {
  const cudaError_t err = cudaEventQuery(AsEvent(event));  // never blocks
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();  // cudaErrorNotReady is not sticky; clear it either way
  return false;
}

double CudaCostEvents::ElapsedNs(uint64_t start, uint64_t end) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, AsEvent(start), AsEvent(end)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return double(ms) * 1e6;
}

void CudaCostEvents::Release(uint64_t event) { spare_[size_t(device_of_.at(event))].push_back(event); }

}  // namespace dtr::hooks
