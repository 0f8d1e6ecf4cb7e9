// RuntimeConfig: every knob of the DTR runtime as one validated, printable value type. Parsed
// once (from dtr-sim flags or the torch layer's environment) and never mutated behind the
// runtime's back; Runtime::SetBudget is the only live change.
#ifndef DTR_RUNTIME_CONFIG_H_
#define DTR_RUNTIME_CONFIG_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/heuristic.h"

namespace dtr {

inline constexpr uint64_t kUnlimitedBudget = std::numeric_limits<uint64_t>::max();
// RuntimeConfig::neighborhood_cache_events: a walked neighborhood cost is reused until something
// it summed changes (Note [Exact neighborhood cost cache], neighborhoods.cc).
inline constexpr uint32_t kExactNeighborhoodCache = std::numeric_limits<uint32_t>::max();
// RuntimeConfig::backward_next_use's default, which the search computes without pow (Note [Next
// use in a backward pass], eviction_search.cc).
inline constexpr double kDefaultBackwardNextUse = 0.75;

// What to do when the program drops its last reference to a storage (paper, Appendix C.5).
enum class DeallocPolicy {
  kEagerEvict,  // evict it (it stays rematerializable for its dependents); default
  kBanish,      // free it for good once no evicted dependent needs it; dependents become constants
};

// How the victim is found (Note [Victim search] in eviction_search.cc).
enum class SearchMode {
  kSampled,  // score a sample and the carried runners-up (Note [Victim search]); default
  kExact,    // score every evictable storage
};

// Note [Lazy input locks] (remat.cc).
enum class InputLocking {
  kEager,  // lock every input of an op before bringing any back
  kLazy,   // lock an input once it is back; until then a victim of last resort (default)
};

struct RuntimeConfig {
  uint64_t budget_bytes = kUnlimitedBudget;
  HeuristicKind heuristic = HeuristicKind::kDtr;  // Note [Default heuristic] (heuristic.cc)
  DeallocPolicy dealloc = DeallocPolicy::kEagerEvict;
  SearchMode search = SearchMode::kSampled;
  // Sampled search scores max(min_samples, ceil(sample_factor * sqrt(n))) candidates, at most
  // max(max_samples, min_samples) (max_samples 0: no limit): Note [Victim search]
  // (eviction_search.cc) says why 64.
  double sample_factor = 1.0;
  uint32_t min_samples = 32;
  uint32_t max_samples = 64;
  // A pool of at most this many entries is scored whole, sampled mode or not: Note [Small pools
  // are searched whole] (eviction_search.cc). 0: always sample.
  uint32_t exhaustive_pool = 256;
  // dtr's and msps's neighborhood walks stop after this many evicted storages (0: no limit):
  // Note [Bounded neighborhood walks] (neighborhoods.cc).
  uint32_t neighborhood_walk_limit = 64;
  // A victim search stops a candidate's walk once its score cannot win (Note [Bounded victim
  // search], eviction_search.cc): the same decisions for fewer visits. false walks every
  // candidate in full, for the tests and experiments that compare the two.
  bool cut_losing_walks = true;
  // Note [Neighborhood cost cache] (neighborhoods.cc): kExactNeighborhoodCache (the default since
  // stop 41) reuses a walked neighborhood cost until an eviction, rematerialization, collection,
  // recipe change or cost correction reaches it (Note [Exact neighborhood cost cache]); N >= 1
  // reuses it while fewer than N evictions and rematerializations have happened since (and no
  // neighbor of the storage was evicted: the approximation until stop 41); 0 walks every time.
  // Both 0 and kExactNeighborhoodCache score exact e*.
  uint32_t neighborhood_cache_events = kExactNeighborhoodCache;
  // Storages smaller than this fraction of the mean evictable size are skipped by the search
  // (the prototype used 1%); they are still chosen when nothing larger is evictable.
  double small_storage_fraction = 0.01;
  // Note [Thrashing]: a storage rematerialized repeatedly in a short span has its score
  // multiplied by (1 + thrash_damping * recent remats), so it is kept resident longer.
  // 0 (the default since stop 32) turns damping off. recent remats halve every
  // thrash_half_life_ops computed ops.
  double thrash_damping = 0.0;
  uint64_t thrash_half_life_ops = 1024;
  // A storage rematerialized this many times within a half-life counts as a thrash event.
  double thrash_report_threshold = 8;
  // Note [Staleness of replayed storages] (remat.cc): a storage a rematerialization brings back
  // keeps the last access it had; only the program's ops touch. true makes a replay touch what it
  // brings back (the behaviour until stop 33), for the simulator's comparisons.
  bool replays_refresh_staleness = false;
  // Note [Held results of dead inputs] (lifetime.cc): the held results of the ops that read a
  // dying storage (what a backward pass accumulated into in place, the loss once the backward
  // pass has gone past it, a backward op's much smaller results) are frozen, so it is collected
  // instead of evicted, and a frozen result that dies passes this on (or, where a forward op's
  // held results are much larger, the dying storage is kept: Note [Kept inputs of held
  // results]). false keeps their recipes, for the simulator's comparisons.
  bool freeze_held_results = true;
  // Note [Frozen results pass it on] (lifetime.cc): with freeze_held_results, the results of every
  // op of a backward pass are frozen, not only of its in-place ops and its much smaller ones.
  // Faster at most budgets, but a gradient can no longer be evicted, so the smallest budget that
  // trains rises where gradients must make room; off by default.
  bool freeze_backward_results = false;
  // Note [Rebuilt segments] (remat.cc): while a rematerialization is under way, the storages it
  // has already brought back have their scores multiplied by this, so the search takes them
  // last. 1: no protection.
  double rebuild_protection = 30;
  // Note [Results of the backward pass] (eviction_search.cc): the scores of storages whose
  // recipe holds an op of a backward pass are multiplied by this, so the search evicts
  // activations scoring up to this many times worse first. 1: no protection. 100 since stop 54
  // (10 before): Note [Next use in a backward pass] makes activations score up to about ten
  // times higher.
  double backward_protection = 100;
  // Note [Next use in a backward pass] (eviction_search.cc): w in staleness^(1-w) * d^w, where d
  // estimates how soon the backward pass under way reads a forward activation it has not read
  // yet. 0: staleness alone (the DTR paper's); 1: the estimate alone.
  double backward_next_use = kDefaultBackwardNextUse;
  // Note [Inputs a rematerialization will read] (remat.cc): while a rematerialization is under
  // way, the scores of the storages that ops it has still to replay read are multiplied by this.
  // 1 (the default): no protection, and nothing is listed; dtr-sim --pending-protection.
  double pending_protection = 1;
  // Note [Lazy input locks] (remat.cc): how an op, run or replayed, holds the inputs it waits
  // for while the missing ones are brought back. kEager locks every input before any is brought
  // back (the behaviour until stop 38); kLazy locks one once it is back, or when the op runs,
  // and until then it is evicted only as a last resort.
  InputLocking input_locking = InputLocking::kLazy;
  uint64_t seed = 0x5eed;
  // Note [Bounded replay chains] (runtime.cc): a storage recorded deeper than this many recipe
  // ops behind the nearest constants becomes a constant itself.
  uint32_t max_replay_depth = 1000;
  // Note [Recomputation limit] (remat.cc): a replay fails with ResourceExhausted once
  // rematerialization has cost more than this many times the program's own time over the recent
  // ops (a window whose weights halve every recompute_half_life_ops ops): its ops' costs and the
  // time between them (Note [Program time between ops]). 0: no limit.
  double max_recompute_ratio = 10;
  uint64_t recompute_half_life_ops = 4096;

  absl::Status Validate() const;
  std::string ToString() const;
};

absl::StatusOr<DeallocPolicy> ParseDeallocPolicy(absl::string_view name);
absl::StatusOr<SearchMode> ParseSearchMode(absl::string_view name);
absl::StatusOr<InputLocking> ParseInputLocking(absl::string_view name);
std::string DeallocPolicyName(DeallocPolicy policy);
std::string SearchModeName(SearchMode mode);
std::string InputLockingName(InputLocking locking);
// "exact", or an event count (0: no cache): what DTR_NEIGHBORHOOD_CACHE and dtr-sim's
// --neighborhood-cache take, and what ToString prints.
absl::StatusOr<uint32_t> ParseNeighborhoodCache(absl::string_view text);
std::string NeighborhoodCacheName(uint32_t events);

}  // namespace dtr

#endif  // DTR_RUNTIME_CONFIG_H_
