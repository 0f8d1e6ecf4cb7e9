// libdtr_torch.so's entry points. The preload shim (shim.c, libdtr.so) loads this library into
// processes that load libtorch and calls the exported C functions by name (dlsym); a library
// loaded directly (a .pth file, ctypes, linking) activates from its load-time constructor.
// Activation parses DTR_* (env_config.h), creates g_engine, registers the fallback and
// torch.ops.dtr.*, installs the CPU allocator, includes DispatchKey::Fake in this thread's
// dispatch TLS, and writes DTR_STATS_FILE at exit. Only these C functions are exported.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "absl/status/status.h"
#include "hooks/dtr_ops.h"
#include "hooks/engine.h"
#include "hooks/env_config.h"
#include "hooks/fallback.h"

namespace dtr::hooks {
namespace {

std::atomic<bool> g_active{false};

void AtExit() {
  if (g_engine) g_engine->WriteStatsFile();
}

}  // namespace
}  // namespace dtr::hooks

extern "C" {

// Includes DispatchKey::Fake in this thread's TLS (called by the shim's pthread_create wrapper).
__attribute__((visibility("default"))) void dtr_thread_init() {
  if (dtr::hooks::g_active.load(std::memory_order_acquire))
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
}

__attribute__((visibility("default"))) int dtr_is_active() { return dtr::hooks::g_active.load() ? 1 : 0; }

// Idempotent. Returns 0 when active (or disabled by DTR_ENABLE=0), exits on a configuration error.
__attribute__((visibility("default"))) int dtr_activate() {
  using namespace dtr::hooks;
  static std::once_flag once;
  static int result = 0;
  std::call_once(once, [] {
    auto cfg = ParseProcessEnv();
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s\n", std::string(cfg.status().message()).c_str());
      std::fflush(stderr);
      _exit(2);
    }
    if (!cfg->enable) return;
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::Fake)) {
      std::fprintf(stderr,
                   "dtr: NOT activating: another library already registered a backend fallback for "
                   "DispatchKey::Fake (this PyTorch may use it for FakeTensor); dtr needs that key.\n");
      result = 1;
      return;
    }
    auto* e = new Engine(*cfg);
    if (absl::Status s = e->Init(); !s.ok()) {
      std::fprintf(stderr, "dtr: initialization failed: %s\n", std::string(s.message()).c_str());
      _exit(2);
    }
    g_engine = e;
    RegisterFallback();
    RegisterDtrOps();
    c10::SetCPUAllocator(e->adapter(), /*priority=*/100);
    g_active.store(true, std::memory_order_release);
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
    std::atexit(&AtExit);
    if (cfg->verbose) std::fprintf(stderr, "dtr: active: %s\n", cfg->ToString().c_str());
  });
  return result;
}

}  // extern "C"

namespace {
// Loaded directly (a .pth file, ctypes, or linking): activate at load time.
__attribute__((constructor)) void DtrTorchCtor() { dtr_activate(); }
}  // namespace
