// CpuAllocatorAdapter: the c10::Allocator dtr installs as torch's CPU allocator. Every tensor's
// memory comes from dtr's caching allocator (which enforces DTR_BUDGET and asks the engine to
// evict when a request does not fit), behind a Slot header (Note [Slots and tombstones]).
// CpuAllocatorConfig sizes that allocator for host memory (Note [CPU allocator granularity]).
#ifndef DTR_HOOKS_CPU_ALLOCATOR_ADAPTER_H_
#define DTR_HOOKS_CPU_ALLOCATOR_ADAPTER_H_

#include <cstddef>

#include <c10/core/Allocator.h>
#include <c10/core/alignment.h>

#include "allocator/allocator_config.h"
#include "allocator/caching_allocator.h"
#include "allocator/host_backend.h"
#include "hooks/env_config.h"
#include "hooks/storage_slots.h"

namespace dtr::hooks {

class CpuAllocatorAdapter final : public c10::Allocator {
 public:
  explicit CpuAllocatorAdapter(alloc::CachingAllocator* a) : alloc_(a) {}
  // Raises torch's OutOfMemoryError, with g_engine's accounting, when the allocator cannot serve.
  c10::DataPtr allocate(size_t n) override;  // non-const since 2.x
  c10::DeleterFnPtr raw_deleter() const override { return &DataDeleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  alloc::CachingAllocator* alloc_;
};

// Every host segment (a tensor's memory with its Slot header) is a multiple of
// alloc::kHostBlockBytes and aligned to it (Note [CPU allocator granularity]).
static_assert(alloc::kHostBlockBytes % c10::gAlignment == 0, "torch's CPU kernels expect c10::gAlignment");
static_assert(kHeader % alloc::kHostBlockBytes == 0, "the data after a slot header keeps the segment's alignment");

// The caching allocator's configuration for host memory under `cfg`'s budget.
alloc::AllocatorConfig CpuAllocatorConfig(const DtrEnvConfig& cfg);

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_CPU_ALLOCATOR_ADAPTER_H_
