// DtrEnvConfig: the torch layer's configuration, parsed once from the environment (DTR_*) into a
// validated, printable value type. Torch-free so it can be unit-tested and reused.
//
// Variables (all optional):
//   DTR_BUDGET      budget on reserved memory of the managed device, in bytes (dtr::ParseBytes
//                   forms: 6GiB, 6000MB) or, on CUDA, as a fraction of each device's memory (a
//                   decimal in (0, 1] such as 0.6); unset: unlimited (dtr then only tracks and
//                   reports peaks)
//   DTR_DEVICE      auto | cpu | cuda (default auto: cuda when dtr was built with its CUDA adapter
//                   and a GPU is visible, else cpu): whose tensors dtr manages and budgets
//   DTR_CUDA_ALLOCATOR  native | dtr (default native): Note [Two CUDA backends]
//   DTR_HEURISTIC   eviction heuristic name (dtr::ParseHeuristic), default dtr
//   DTR_DEALLOC     eager-evict | banish (dtr::ParseDeallocPolicy)
//   DTR_SEARCH      sampled | exact (dtr::ParseSearchMode)
//   DTR_STATS_FILE  path: JSON statistics written at process exit
//   DTR_TRACE_FILE  path: the trace (Note [Trace format], runtime/sim/trace.h) written as the program runs
//                   (both may hold {rank} and {pid}: Note [Per-process file names])
//   DTR_VERBOSE     0 | 1 | 2
//   DTR_ENABLE      0 | 1 (default 1): 0 leaves the process untouched even when preloaded
//   DTR_EVICT       0 | 1 (default 1): 0 keeps the budget but never evicts (the budget is then a
//                   plain cap: shows what happens without rematerialization)
//   DTR_NEIGHBORHOOD_CACHE  exact (default): a walked neighborhood cost is reused until something
//                   it summed changes (Note [Exact neighborhood cost cache]); N: reused for N
//                   evictions and rematerializations; 0: walk every time
//   DTR_EXHAUSTIVE_POOL  the most evictable storages a sampled search scores all of (default 256;
//                   0: always sample): Note [Small pools are searched whole]
//   DTR_NEIGHBORHOOD_WALK_LIMIT  the most evicted storages a dtr or msps neighborhood walk sums on
//                   each side of a candidate (default 64; 0: no limit): Note [Bounded
//                   neighborhood walks], runtime/neighborhoods.cc
//   DTR_BACKWARD_PROTECTION  a number >= 1 (default 100; 1: none): Note [Results of the backward
//                   pass], runtime/eviction_search.cc
//   DTR_BACKWARD_NEXT_USE  a number from 0 to 1 (default 0.75; 0: staleness alone, the DTR
//                   paper's): Note [Next use in a backward pass], runtime/eviction_search.cc
//   DTR_FREEZE_GRADIENTS  0 | 1: freeze what every op of a backward pass computed once its input
//                   dies, not only what its in-place ops accumulated and its much smaller
//                   results (default: RuntimeConfig's):
//                   Note [Frozen results pass it on], runtime/lifetime.cc
//   DTR_IDLE_BELOW  a fraction from 0 to 0.9 (default 0.5; 0: never idle): Note [Idle far below
//                   the budget], hooks/fallback.cc
//   DTR_DEBUG_DISABLE_RULES  comma list of rule numbers to switch OFF, for tests that show each
//                   rule is needed. Never use in production. Rules (design note numbering):
//                     1  writes (in-place, out=, Tensor(a!)[]) go through Runtime::Mutate
//                     2  before a mutation, readers of the mutated storage are brought back and
//                        detached (Runtime::MutateCall::invalidate_readers)
//                     4  empty* outputs, outputs aliasing an input or a pre-existing storage are
//                        never recorded
//                     5  a replay must reproduce sizes/strides/offset/dtype before swapping in
//                        (a different layout is copied into the recorded one)
//                     6  global state a replay depends on: random ops replay from a cloned
//                        generator / saved default state, ops that consume the default generator
//                        unexpectedly are not recorded, the default dtype is the recorded one
//                   (3 is structural: only storages our allocator produced ever get a recipe.)
// Any other DTR_* variable is an error (typos must not silently run without a budget).
#ifndef DTR_HOOKS_ENV_CONFIG_H_
#define DTR_HOOKS_ENV_CONFIG_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/config.h"

namespace dtr::hooks {

constexpr int kMaxRule = 6;
// DTR_IDLE_BELOW's largest value: idle, nothing is evicted, so what the budget has above it must
// hold what the ops between two checks allocate (Note [Idle far below the budget], fallback.cc).
constexpr double kMostIdleBelow = 0.9;

enum class DeviceChoice { kAuto, kCpu, kCuda };

struct DtrEnvConfig {
  bool enable = true;
  bool evict = true;
  uint64_t budget_bytes = kUnlimitedBudget;
  double budget_fraction = 0;  // > 0: DTR_BUDGET given as a fraction of device memory (CUDA)
  DeviceChoice device = DeviceChoice::kAuto;
  std::string cuda_allocator = "native";
  HeuristicKind heuristic = HeuristicKind::kDtr;
  DeallocPolicy dealloc = DeallocPolicy::kEagerEvict;
  SearchMode search = SearchMode::kSampled;
  std::string stats_file;
  std::string trace_file;
  int verbose = 0;
  uint32_t max_replay_depth = 1000;  // Note [Bounded replay chains] (runtime/runtime.cc)
  double max_recompute_ratio = 10;   // Note [Recomputation limit] (runtime/remat.cc); 0: none
  // Note [Results of the backward pass] (runtime/eviction_search.cc); 1: none.
  double backward_protection = RuntimeConfig{}.backward_protection;
  // Note [Next use in a backward pass] (runtime/eviction_search.cc); 0: staleness alone.
  double backward_next_use = RuntimeConfig{}.backward_next_use;
  // Note [Frozen results pass it on] (runtime/lifetime.cc).
  bool freeze_gradients = RuntimeConfig{}.freeze_backward_results;
  uint32_t neighborhood_cache_events = RuntimeConfig{}.neighborhood_cache_events;  // exact; 0: none
  uint32_t exhaustive_pool = RuntimeConfig{}.exhaustive_pool;  // 0: always sample
  // Note [Bounded neighborhood walks] (runtime/neighborhoods.cc); 0: unbounded.
  uint32_t neighborhood_walk_limit = RuntimeConfig{}.neighborhood_walk_limit;
  // Note [Idle far below the budget] (fallback.cc); 0: never idle.
  double idle_below = 0.5;
  uint32_t disabled_rules = 0;  // bit r set: design rule r switched off (debug only)

  bool unlimited() const { return budget_bytes == kUnlimitedBudget && budget_fraction == 0; }
  bool rule_enabled(int r) const { return (disabled_rules & (1u << r)) == 0; }
  std::string ToString() const;
};

// `getenv` returns nullptr for unset variables; `environ_names` enumerates every variable name
// in the environment (to reject unknown DTR_* ones).
absl::StatusOr<DtrEnvConfig> ParseEnvConfig(
    const std::function<const char*(const char*)>& getenv_fn,
    const std::function<void(const std::function<void(const std::string&)>&)>& for_each_name);

// Whether this process could write the file `pattern` names (placeholders expanded now): the
// file, if it exists, else its directory. Checked at start-up so that a stats file the run
// cannot write is an error then, not a message after hours of training.
absl::Status CheckOutputFile(const char* var, const std::string& pattern);

// From the real process environment.
absl::StatusOr<DtrEnvConfig> ParseProcessEnv();

// Note [Per-process file names]
// Under torchrun every rank inherits the same DTR_STATS_FILE, and a forked worker inherits its
// parent's configuration: one path would be overwritten by every process. A file path may hold
// {rank} (the RANK variable that torchrun and torch.distributed's launchers set; 0 when unset, as
// for a single process) and {pid} (the id of the process that writes the file). They are
// expanded when the file is opened, not when the configuration is parsed, so a forked child gets
// its own {pid}. ParseEnvConfig rejects any other {placeholder}, an unmatched brace, and a RANK
// that is not a non-negative integer, at start-up.
absl::StatusOr<std::string> ExpandFileName(const char* var, const std::string& pattern,
                                           const std::function<const char*(const char*)>& getenv_fn,
                                           long pid);

// ExpandFileName against this process's environment and pid.
absl::StatusOr<std::string> ExpandFileNameNow(const char* var, const std::string& pattern);

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_ENV_CONFIG_H_
