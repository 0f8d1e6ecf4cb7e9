// RuntimeStats: counters the runtime keeps for users (DTR_STATS_FILE, torch.ops.dtr.stats(),
// dtr-sim's JSON line) and for benchmarks.
#ifndef DTR_RUNTIME_STATS_H_
#define DTR_RUNTIME_STATS_H_

#include <cstdint>
#include <string>

namespace dtr {

struct RuntimeStats {
  uint64_t ops_recorded = 0;          // op calls computed through the runtime
  uint64_t constants = 0;             // storages registered as constants
  uint64_t evictions = 0;
  uint64_t eager_evictions = 0;       // evictions because the program dropped its last reference
  // evictions of an input an op being brought back waited for (Note [Lazy input locks]: last
  // resort, when nothing else could be evicted)
  uint64_t awaited_evictions = 0;
  uint64_t banishments = 0;
  uint64_t rematerializations = 0;    // storages brought back
  uint64_t replays = 0;               // op replays (a recipe may replay several ops)
  uint64_t detached = 0;              // storages made constant by a mutation of an input
  // copies of a storage being overwritten given its recipe instead (Note [Copies of overwritten
  // contents], mutation.cc)
  uint64_t copies_given_recipes = 0;
  uint64_t depth_limited = 0;         // storages made constant at max_replay_depth
  uint64_t collected = 0;             // records dropped because nothing could need them
  uint64_t thrash_events = 0;         // see Note [Thrashing]
  uint64_t eviction_searches = 0;
  uint64_t candidates_scored = 0;     // heuristic evaluations
  uint64_t neighborhood_visits = 0;   // storages visited computing neighborhood costs
  uint64_t neighborhood_cache_hits = 0;  // walks saved by Note [Neighborhood cost cache]
  double base_cost = 0;               // cost of first executions
  double remat_cost = 0;              // cost of replays
  uint64_t memory_bytes = 0;          // resident bytes now
  uint64_t peak_memory_bytes = 0;
  uint64_t largest_op_bytes = 0;      // most bytes one op read and wrote (inputs + outputs)
  // The lower bound of this run (Note [Memory floor], runtime.cc): the most bytes that had to be
  // resident at one op, whatever was evicted: the unevictable bytes then plus the op's own
  // evictable inputs and its outputs.
  uint64_t floor_bytes = 0;

  double total_cost() const { return base_cost + remat_cost; }
  // One JSON object (no trailing newline) with every field.
  std::string ToJson() const;
};

}  // namespace dtr

#endif  // DTR_RUNTIME_STATS_H_
