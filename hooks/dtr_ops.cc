// The custom ops torch.ops.dtr.* (see dtr_ops.h).
#include "hooks/dtr_ops.h"

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "hooks/engine.h"

namespace dtr::hooks {
namespace {

std::string OpStats() { return g_engine ? g_engine->StatsJson() : std::string("{}"); }
void OpResetPeak() {
  if (g_engine) g_engine->ResetPeak();
}
bool OpActive() { return g_engine != nullptr; }
void OpSetBudget(int64_t bytes) {
  TORCH_CHECK(g_engine != nullptr, "dtr is not active");
  g_engine->SetBudget(bytes);
}
int64_t OpBudget() { return g_engine ? g_engine->Budget() : -1; }
void OpPin(const at::Tensor& t) {
  if (g_engine) g_engine->PinTensor(t, true);
}
void OpUnpin(const at::Tensor& t) {
  if (g_engine) g_engine->PinTensor(t, false);
}
std::string OpUnevictableAtPeak(at::TensorList exclude) {
  if (!g_engine) return "{}";
  // Note [Recording starts with a budget] (fallback.cc): zeros here would read as "everything
  // is evictable".
  TORCH_CHECK(g_engine->recording(),
              "dtr: unevictable_at_peak: dtr has had no budget in this process, so it has recorded nothing and "
              "cannot tell what it could evict. Set a budget before building the model and running it (one "
              "that never binds will do: DTR_BUDGET=1TiB, or a fraction such as 1.0 of the GPU), then ask again");
  return g_engine->UnevictableAtPeakJson(exclude);
}
void OpTraceMark(c10::string_view label) {
  if (g_engine) g_engine->TraceMark(std::string(label));
}
void OpExpose(const at::Tensor& t, bool writable) {
  if (g_engine) g_engine->ExposeTensor(t, writable);
}

torch::Library* g_def_lib = nullptr;

}  // namespace

void RegisterDtrOps() {
  g_def_lib = new torch::Library(torch::Library::DEF, "dtr", c10::nullopt, __FILE__, __LINE__);
  g_def_lib->def("stats() -> str", &OpStats);
  g_def_lib->def("reset_peak() -> ()", &OpResetPeak);
  g_def_lib->def("is_active() -> bool", &OpActive);
  g_def_lib->def("pin(Tensor self) -> ()", &OpPin);
  g_def_lib->def("set_budget(int bytes) -> ()", &OpSetBudget);
  g_def_lib->def("budget() -> int", &OpBudget);
  g_def_lib->def("unpin(Tensor self) -> ()", &OpUnpin);
  g_def_lib->def("expose(Tensor self, bool writable) -> ()", &OpExpose);
  g_def_lib->def("unevictable_at_peak(Tensor[] exclude) -> str", &OpUnevictableAtPeak);
  g_def_lib->def("trace_mark(str label) -> ()", &OpTraceMark);
}

}  // namespace dtr::hooks
