// The CPU c10::Allocator over dtr's caching allocator (see cpu_allocator_adapter.h).
#include "hooks/cpu_allocator_adapter.h"

#include <new>
#include <string>

#include <c10/util/Exception.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "hooks/engine.h"
#include "runtime/bytes.h"

namespace dtr::hooks {

c10::DataPtr CpuAllocatorAdapter::allocate(size_t n) {
  absl::StatusOr<void*> p = alloc_->Allocate(n + kHeader);
  if (!p.ok()) {
    std::string pinned;
    if (g_engine && !g_engine->cfg().evict)
      pinned = absl::StrCat(" Eviction is off (DTR_EVICT=0), so the budget is a plain cap (",
                            g_engine->Breakdown(), ").");
    else if (g_engine && g_engine->idle()) {
      g_engine->EndIdleAtNextOp();
      pinned = absl::StrCat(" ", Engine::kIdleNothingEvicted, " (", g_engine->Breakdown(), ").");
    }
    else if (g_engine)
      pinned = absl::StrCat(" dtr could not evict enough: ", FormatBytes(g_engine->PinnedBytes()),
                            " are pinned/constant/in use by the running op (", g_engine->BreakdownFor(n), ").");
    TORCH_CHECK_WITH(OutOfMemoryError, false, "dtr: out of memory under DTR_BUDGET: cannot allocate ",
                     FormatBytes(n), ".", pinned, " Allocator report: ", std::string(p.status().message()));
  }
  Slot* s = new (*p) Slot{*p, n, nullptr, NextSlotSerial()};
  void* data = DataOf(s);
  return c10::DataPtr(data, data, &DataDeleter, c10::Device(c10::DeviceType::CPU));
}

alloc::AllocatorConfig CpuAllocatorConfig(const DtrEnvConfig& cfg) {
  alloc::AllocatorConfig ac = alloc::AllocatorConfig::SegmentPerBlock(alloc::kHostBlockBytes);
  ac.budget_bytes = cfg.unlimited() ? alloc::AllocatorConfig::kUnlimited : size_t(cfg.budget_bytes);
  ac.enable_eviction = cfg.evict;
  // Note [CPU allocator granularity]
  // Host memory has no expensive segment allocation, and a budget only helps if freed bytes can
  // be reused by the next request. Segments shared by several tensors fragment under a tight
  // budget: one long-lived tensor (a parameter, a gradient) keeps its whole segment reserved,
  // and a 256 KiB small-pool segment could not grow inside a 460 KiB budget that already held
  // one. So every tensor gets its own segment. Freed segments are cached for reuse; a cached
  // segment serves only a request of its own size, or is resized for one of a nearby size (Note
  // [Exact reuse], allocator/caching_allocator.cc), since splitting it would leave a remnant that
  // cannot be released while its neighbour lives.
  // Segments are rounded to alloc::kHostBlockBytes (64 B, the header included), the alignment torch's
  // own CPU allocator gives. They were rounded to 512 B, CUDA's granularity (PyTorch's
  // kMinBlockSize), until stop 67: a model of many small tensors then lost a large part of a
  // tight budget to rounding (the 64-layer chain's 390 tensors of a few hundred bytes, about
  // 176 KiB of its 1.24 MB smallest working budget), which torch's own allocator never reserves
  // and dtr-sim's exact bytes never counted.
  return ac;
}

}  // namespace dtr::hooks
