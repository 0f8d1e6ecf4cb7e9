// The process-wide boxed fallback on DispatchKey::Fake through which dtr sees every op (its body
// is Engine::Fallback, fallback.cc).
#ifndef DTR_HOOKS_FALLBACK_H_
#define DTR_HOOKS_FALLBACK_H_

#include "absl/status/status.h"

namespace dtr::hooks {

// Registers the fallback, forwarding every op to g_engine (which must be set). Once per process.
// FailedPrecondition, changing nothing, when something else already owns DispatchKey::Fake.
absl::Status RegisterFallback();

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_FALLBACK_H_
