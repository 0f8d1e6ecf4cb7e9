// CudaCostEvents: the CostEventSource (runtime/deferred_costs.h) of CUDA: timing events recorded
// on the current stream, queried without blocking (Note [Deferred op costs]). CUDA builds only.
#ifndef DTR_HOOKS_CUDA_COST_EVENTS_H_
#define DTR_HOOKS_CUDA_COST_EVENTS_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "runtime/deferred_costs.h"

namespace dtr::hooks {

class CudaCostEvents final : public CostEventSource {
 public:
  ~CudaCostEvents() override;
  uint64_t Record() override;
  bool Done(uint64_t event) override;
  double ElapsedNs(uint64_t start, uint64_t end) override;
  void Release(uint64_t event) override;

 private:
  // Released events by device, reused: cudaEventCreate costs more than a record, and an event
  // can only be recorded on its own device. Guarded by the engine's lock, like every call here.
  std::vector<std::vector<uint64_t>> spare_;
  absl::flat_hash_map<uint64_t, int> device_of_;
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_CUDA_COST_EVENTS_H_
