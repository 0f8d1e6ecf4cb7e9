// GeneratorSnapshots (Note [Generator snapshots], generator_snapshots.h).
#include "hooks/generator_snapshots.h"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>

namespace dtr::hooks {

at::Generator GeneratorSnapshots::Take(const at::Generator& source) {
  // Not const: CPUGeneratorImpl's readers are not (the caller holds the source's mutex).
  auto* src =
      source.device().is_cpu() ? dynamic_cast<at::CPUGeneratorImpl*>(source.unsafeGetGeneratorImpl()) : nullptr;
  if (src == nullptr) return source.clone();
  const size_t probes = std::min(pool_.size(), kMaxProbes);
  for (size_t i = 0; i < probes; ++i) {
    const size_t at = (next_ + i) % pool_.size();
    at::Generator& pooled = pool_[at];
    if (pooled.getIntrusivePtr().use_count() != 1) continue;  // a record still holds it
    auto* dst = static_cast<at::CPUGeneratorImpl*>(pooled.unsafeGetGeneratorImpl());
    dst->set_engine(src->engine());
    dst->set_next_float_normal_sample(src->next_float_normal_sample());
    dst->set_next_double_normal_sample(src->next_double_normal_sample());
    next_ = (at + 1) % pool_.size();
    return pooled;
  }
  // Every probed one is held: the next search starts past them, so records that live long (a
  // model's initialization under a budget) cannot make every later one probe them again.
  if (!pool_.empty()) next_ = (next_ + probes) % pool_.size();
  at::Generator fresh = source.clone();
  if (pool_.size() < kMaxPooled) pool_.push_back(fresh);
  return fresh;
}

}  // namespace dtr::hooks
