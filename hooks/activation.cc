// libdtr_torch.so's entry points: the C API of include/dtr/dtr.h plus what the preload shim and
// the Python package call by name. Three ways in:
//   - the preload shim (shim.c, libdtr.so) dlopens this library once libtorch is in the process
//     and calls dtr_activate / dtr_thread_init;
//   - a C++ program linked against it (find_package(dtr)) activates from the load-time
//     constructor below, from the DTR_* environment;
//   - the Python package (python/dtr/_library.py) loads it with ctypes while
//     _DTR_PYTHON_LOADER=1 is set, which makes the constructor stand aside: Python validates the
//     configuration first (dtr_config_error) so a mistake is a Python exception, not an exit.
// Activation parses DTR_* (env_config.h), creates g_engine, registers the fallback and
// torch.ops.dtr.*, installs the CPU allocator, includes DispatchKey::Fake in this thread's
// dispatch TLS, and writes DTR_STATS_FILE at exit. Only these C functions are exported.
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#if DTR_WITH_CUDA
#include "hooks/cuda_cost_events.h"
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/bytes.h"
#include "hooks/dtr_ops.h"
#include "hooks/engine.h"
#include "hooks/env_config.h"
#include "hooks/fallback.h"
#include "hooks/include/dtr/dtr.h"

namespace dtr::hooks {
namespace {

std::atomic<bool> g_active{false};
std::string g_activation_error;  // why the last dtr_activate returned 1

// Whether the machine has an NVIDIA GPU this process may see, asked without initializing CUDA:
// cuInit at import would fix CUDA_VISIBLE_DEVICES before the script sets it and break CUDA in
// processes forked later. The driver lists its GPUs under /proc/driver/nvidia/gpus.
bool GpuVisibleWithoutInitializingCuda() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && (v[0] == '\0' || v[0] == '-'))
    return false;  // "" or "-1": every GPU hidden
  DIR* dir = opendir("/proc/driver/nvidia/gpus");
  if (dir == nullptr) return false;
  bool any = false;
  while (dirent* e = readdir(dir)) any = any || e->d_name[0] != '.';
  closedir(dir);
  return any;
}

// DTR_DEVICE=auto picks CUDA when this build has the CUDA adapter and a GPU is visible.
absl::StatusOr<ManagedDevice> ResolveDevice(const DtrEnvConfig& cfg) {
#if DTR_WITH_CUDA
  const bool gpu = GpuVisibleWithoutInitializingCuda();
  if (cfg.device == DeviceChoice::kCuda && !gpu)
    return absl::InvalidArgumentError(
        "dtr: DTR_DEVICE=cuda but no NVIDIA GPU is visible (none under /proc/driver/nvidia/gpus, or "
        "CUDA_VISIBLE_DEVICES hides them all)");
  if (cfg.device == DeviceChoice::kCuda || (cfg.device == DeviceChoice::kAuto && gpu)) return ManagedDevice::kCuda;
#else
  if (cfg.device == DeviceChoice::kCuda)
    return absl::InvalidArgumentError(
        "dtr: DTR_DEVICE=cuda but this dtr was built without its CUDA adapter (built against a CPU-only torch?)");
#endif
  if (cfg.budget_fraction > 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "dtr: DTR_BUDGET=", cfg.budget_fraction,
        " is a fraction of GPU memory, but dtr manages CPU memory here (no CUDA device or DTR_DEVICE=cpu): give bytes, "
        "e.g. DTR_BUDGET=4GiB"));
  return ManagedDevice::kCpu;
}

absl::Status InstallCuda(const DtrEnvConfig& cfg, Engine* e) {
#if DTR_WITH_CUDA
  CudaAllocatorAdapter::Options o;
  auto backend = ParseCudaBackend(cfg.cuda_allocator);
  if (!backend.ok()) return backend.status();
  o.backend = *backend;
  o.evict = cfg.evict;
  if (cfg.budget_fraction > 0) {
    o.budget.unlimited = false;
    o.budget.fraction = cfg.budget_fraction;
  } else if (!cfg.unlimited()) {
    o.budget.unlimited = false;
    o.budget.bytes = cfg.budget_bytes;
  }
  absl::StatusOr<CudaAllocatorAdapter*> a = InstallCudaAllocator(o);
  if (!a.ok()) return a.status();
  g_cuda_slot_ops.deleter = &CudaDataDeleter;
  g_cuda_slot_ops.find = [](const void* data) { return g_cuda_adapter.load()->FindSlot(data); };
  g_cuda_slot_ops.free = [](Slot* s) { g_cuda_adapter.load()->FreeSlot(s); };
  g_cuda_slot_ops.allocator = *a;
  e->AttachCuda(*a, std::make_unique<CudaCostEvents>());
  (*a)->set_evictor(e);
  return absl::OkStatus();
#else
  (void)cfg;
  (void)e;
  return absl::FailedPreconditionError("dtr was built without its CUDA adapter");
#endif
}

void AtExit() {
  if (g_engine) g_engine->WriteStatsFile();
}

// Returns 0 when active or disabled by DTR_ENABLE=0; 1 (with g_activation_error) when dtr cannot
// take this process. A malformed configuration is returned as 2 without side effects.
int ActivateOnce(bool exit_on_bad_config) {
  static std::once_flag once;
  static int result = 0;
  std::call_once(once, [exit_on_bad_config] {
    // A configuration error: exits 2 from the preload, or returns 2 for Python to raise.
    auto bad_config = [&](const absl::Status& st) {
      g_activation_error = std::string(st.message());
      if (exit_on_bad_config) {
        std::fprintf(stderr, "%s\n", g_activation_error.c_str());
        std::fflush(stderr);
        _exit(2);
      }
      result = 2;
    };
    auto cfg = ParseProcessEnv();
    if (!cfg.ok()) return bad_config(cfg.status());
    if (!cfg->enable) return;
    for (auto [var, file] : {std::pair<const char*, const std::string*>{"DTR_STATS_FILE", &cfg->stats_file},
                             std::pair<const char*, const std::string*>{"DTR_TRACE_FILE", &cfg->trace_file}})
      if (!file->empty())
        if (absl::Status st = CheckOutputFile(var, *file); !st.ok()) return bad_config(st);
    absl::StatusOr<ManagedDevice> managed = ResolveDevice(*cfg);
    if (!managed.ok()) return bad_config(managed.status());
    auto* e = new Engine(*cfg, *managed);
    if (absl::Status s = e->Init(); !s.ok()) {
      g_activation_error = "dtr: initialization failed: " + std::string(s.message());
      delete e;
      result = 1;
      return;
    }
    g_engine = e;
    if (absl::Status s = RegisterFallback(); !s.ok()) {
      // Nothing else was installed yet: the process runs on without dtr.
      g_engine = nullptr;
      g_activation_error = "dtr: NOT activating: " + std::string(s.message());
      result = 1;
      return;
    }
    RegisterDtrOps();
    if (*managed == ManagedDevice::kCpu) {
      c10::SetCPUAllocator(e->adapter(), /*priority=*/100);
    } else if (absl::Status s = InstallCuda(*cfg, e); !s.ok()) {
      // The fallback is registered but nothing is managed: pass every op through.
      e->SetPaused(true);
      g_activation_error = "dtr: NOT activating: " + std::string(s.message());
      result = 1;
      return;
    }
    // Note [fork] (engine.cc).
    pthread_atfork([] { if (g_engine) g_engine->PrepareFork(); }, [] { if (g_engine) g_engine->ParentAfterFork(); },
                   [] { if (g_engine) g_engine->ChildAfterFork(); });
    g_active.store(true, std::memory_order_release);
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
    std::atexit(&AtExit);
    if (cfg->verbose) std::fprintf(stderr, "dtr: active: %s\n", cfg->ToString().c_str());
  });
  return result;
}

}  // namespace
}  // namespace dtr::hooks

extern "C" {

// Includes DispatchKey::Fake in this thread's TLS (the shim's pthread_create wrapper, Python's
// thread start hook, or a C++ program's own threads).
__attribute__((visibility("default"))) void dtr_thread_init(void) {
  if (dtr::hooks::g_active.load(std::memory_order_acquire))
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
}

// Note [Statistics before the interpreter's teardown]: DTR_STATS_FILE, written now. The Python
// package calls it from an atexit handler, which runs before the interpreter's teardown; the C
// atexit handler (AtExit) runs after it, too late for a process that aborts there (gloo and NCCL
// process groups destroyed at teardown do, now and then). Writing again later is harmless.
__attribute__((visibility("default"))) void dtr_write_stats_file(void) {
  if (dtr::hooks::g_engine) dtr::hooks::g_engine->WriteStatsFile();
}

__attribute__((visibility("default"))) int dtr_is_active(void) {
  return dtr::hooks::g_active.load() && dtr::hooks::g_engine != nullptr && (!dtr::hooks::g_engine->paused() || dtr::hooks::g_engine->idle()) ? 1 : 0;
}

// Idempotent. 0: active (or disabled by DTR_ENABLE=0); 1: cannot activate (reason on stderr).
// Exits with status 2 on a malformed DTR_* variable (the preload and linked-program paths: the
// program must not run on silently without the budget it asked for).
__attribute__((visibility("default"))) int dtr_activate(void) {
  int r = dtr::hooks::ActivateOnce(/*exit_on_bad_config=*/true);
  if (r == 1) std::fprintf(stderr, "%s\n", dtr::hooks::g_activation_error.c_str());
  return r;
}

// For the Python package: like dtr_activate, but a malformed configuration returns 2 and the
// message is left for dtr_last_error (Python raises ValueError with it).
__attribute__((visibility("default"))) int dtr_activate_checked(void) {
  return dtr::hooks::ActivateOnce(/*exit_on_bad_config=*/false);
}

__attribute__((visibility("default"))) const char* dtr_last_error(void) {
  return dtr::hooks::g_activation_error.c_str();
}

// Validates the DTR_* environment without activating: "" when valid, else the message.
__attribute__((visibility("default"))) const char* dtr_config_error(void) {
  static thread_local std::string msg;
  auto cfg = dtr::hooks::ParseProcessEnv();
  msg = cfg.ok() ? std::string() : std::string(cfg.status().message());
  return msg.c_str();
}

// The parsed configuration, printable (python -m dtr --info).
__attribute__((visibility("default"))) const char* dtr_config_string(void) {
  static thread_local std::string msg;
  auto cfg = dtr::hooks::ParseProcessEnv();
  msg = cfg.ok() ? cfg->ToString() : std::string(cfg.status().message());
  return msg.c_str();
}

// For the Python package: 1 once dtr was activated in this process, paused or not (what
// dtr_stats_json() != "{}" tells, without building the statistics: dtr.pin() asks on every call).
__attribute__((visibility("default"))) int dtr_has_engine(void) { return dtr::hooks::g_engine != nullptr ? 1 : 0; }

__attribute__((visibility("default"))) const char* dtr_stats_json(void) {
  static thread_local std::string json;
  json = dtr::hooks::g_engine ? dtr::hooks::g_engine->StatsJson() : std::string("{}");
  return json.c_str();
}

__attribute__((visibility("default"))) int dtr_set_budget(int64_t bytes) {
  if (!dtr::hooks::g_engine) return 2;
  try {
    dtr::hooks::g_engine->SetBudget(bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

// dtr.disable() (1) / dtr.enable() after it (0). See Engine::SetPaused.
// 0, or 1 when bringing back an evicted storage failed (the message on stderr; Python raises).
__attribute__((visibility("default"))) int dtr_set_paused(int paused) {
  if (!dtr::hooks::g_engine) return 0;
  try {
    dtr::hooks::g_engine->SetPaused(paused != 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

// Note [fork] (engine.cc): Python's os.register_at_fork hooks, called through ctypes (which
// releases the GIL while they run).
__attribute__((visibility("default"))) void dtr_fork_hold(void) {
  if (dtr::hooks::g_engine) dtr::hooks::g_engine->HoldForFork();
}
__attribute__((visibility("default"))) void dtr_fork_release(void) {
  if (dtr::hooks::g_engine) dtr::hooks::g_engine->ReleaseForkHold();
}

// The value of DispatchKey::Fake in this torch, for the Python side (torch._C.DispatchKey(value)):
// Python's enum does not list Fake, and its value is not fixed across releases.
__attribute__((visibility("default"))) int dtr_dispatch_key(void) {
  return static_cast<int>(c10::DispatchKey::Fake);
}

// Parses a byte quantity the way DTR_BUDGET is parsed ("6GiB", "512M", "unlimited"): the bytes,
// -1 for unlimited, or -2 on error (message in dtr_last_error). For dtr.set_budget("6GiB").
__attribute__((visibility("default"))) int64_t dtr_parse_bytes(const char* text) {
  if (std::string(text) == "unlimited" || std::string(text) == "none") return -1;
  auto b = dtr::ParseBytes(text);
  if (!b.ok()) {
    dtr::hooks::g_activation_error = std::string(b.status().message());
    return -2;
  }
  return *b == dtr::kUnlimitedBudget ? -1 : int64_t(*b);
}

__attribute__((visibility("default"))) const char* dtr_built_torch_version(void) { return DTR_BUILT_TORCH_VERSION; }

}  // extern "C"

namespace {
// Loaded directly (linked into a C++ program, or dlopened by the shim): activate at load time.
// The Python package loads with _DTR_PYTHON_LOADER=1 and activates itself, checked.
__attribute__((constructor)) void DtrTorchCtor() {
  const char* py = std::getenv("_DTR_PYTHON_LOADER");
  if (py != nullptr && py[0] == '1') return;
  dtr_activate();
}
}  // namespace
