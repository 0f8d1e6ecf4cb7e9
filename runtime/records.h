// The runtime's records: a StorageRecord per buffer the program computed (or was given), and an
// OpRecord per recorded operator call that some live storage may need to replay.
// See Note [Recipes] (runtime.cc) and Note [Record lifetime] (lifetime.cc) for how they relate.
#ifndef DTR_RUNTIME_RECORDS_H_
#define DTR_RUNTIME_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "runtime/evicted_components.h"
#include "runtime/ids.h"

namespace dtr {

enum class StorageState { kResident, kEvicted, kBanished };

// Note [Constants by reason]
// Why a storage cannot be recomputed, kept so that the statistics can say where unevictable
// memory comes from (issue 16: memory that is never evictable must be found, then made
// replayable). kNone exactly when the storage has a recipe (CheckInvariants).
enum class ConstantReason : uint8_t {
  kNone,               // rematerializable
  kAdded,              // AddConstant: given to the runtime (parameters, inputs); the caller knows more
  kUnreplayableOp,     // output of an op recorded as not replayable
  kUnreplayableWrite,  // written in place by an op that is not replayable, or that failed
  kReplayDepth,        // recorded deeper than max_replay_depth (Note [Bounded replay chains])
  kMutatedAncestor,    // its recipe read contents a later in-place op changed (Note [Mutation])
  kBanishedAncestor,   // its recipe read a banished storage (DeallocPolicy::kBanish)
  kAccumulator,        // frozen to release a dead input (Note [Dead constants in accumulating recipes], [Accumulators of dead gradients])
  kHeldResult,         // frozen to release a dead input's recipes (Note [Held results of dead inputs])
  kKeptInput,          // a dead input kept so that a larger held result stays evictable (Note [Kept inputs of held results])
};
inline constexpr size_t kConstantReasonCount = size_t(ConstantReason::kKeptInput) + 1;
// Constants this runtime made by its own choice, which another schedule could evict (Note
// [Memory floor] counts them as evictable).
inline bool FrozenByChoice(ConstantReason reason) {
  return reason == ConstantReason::kHeldResult || reason == ConstantReason::kKeptInput;
}
inline const char* ConstantReasonName(ConstantReason reason) {
  switch (reason) {
    case ConstantReason::kNone: return "rematerializable";
    case ConstantReason::kAdded: return "given to the runtime";
    case ConstantReason::kUnreplayableOp: return "output of an op that is not replayable";
    case ConstantReason::kUnreplayableWrite: return "written in place by an op that is not replayable";
    case ConstantReason::kReplayDepth: return "replay chain deeper than max_replay_depth";
    case ConstantReason::kMutatedAncestor: return "computed from contents a later in-place op changed";
    case ConstantReason::kBanishedAncestor: return "computed from a banished storage";
    case ConstantReason::kAccumulator: return "accumulator frozen to free a dead input";
    case ConstantReason::kHeldResult: return "held result frozen to free the recipes behind it";
    case ConstantReason::kKeptInput: return "dead input kept so that a larger held result stays evictable";
  }
  return "unknown";
}

// Field order matters: what a victim search reads of a candidate that it walks or damps (Note
// [Candidate table]: the others cost only their pool entry) comes first, within the two cache
// lines SlotMap::Prefetch loads.
struct StorageRecord {
  // ---- read for a candidate whose record the search needs ----
  uint64_t size = 0;
  double cost = 0;           // sum of the recipe ops' costs (c0 in the paper)
  double last_access = 0;    // runtime clock at the last op that read or wrote it
  uint32_t locks = 0;        // transient: held while an op that needs it is being computed
  // transient: ops being brought back that wait for it, while it is not locked (Note [Lazy
  // input locks], remat.cc): it is then a victim of last resort
  uint32_t waits = 0;
  uint32_t external_refs = 0;
  // Note [Inputs a rematerialization will read] (remat.cc): ops of the rematerializations under
  // way, not yet replayed, that read it (mirrored as PoolEntry::kPending; here it fills padding).
  uint32_t pending_reads = 0;
  // Note [Thrashing]
  double recent_remats = 0;
  uint64_t last_remat_op = 0;
  // Note [Rebuilt segments] (remat.cc): the rematerialization that last brought it back (read
  // while one is under way).
  uint64_t rebuild_epoch = 0;
  // Ops that read this storage and that some live storage's recipe still contains.
  absl::InlinedVector<OpId, 4> readers;
  StorageState state = StorageState::kResident;
  // Note [Evicted-neighbor hint] (neighborhoods.cc): false means no neighbor is evicted.
  bool neighbor_evicted = false;
  // Note [Results of the backward pass] (eviction_search.cc): an op of the recipe ran in a
  // backward pass (OpRecord::backward).
  bool backward_recipe = false;
  // Note [Next use in a backward pass] (eviction_search.cc): computed by a forward op and not
  // read or written by a backward op since (mirrored as PoolEntry::kAwaitsBackward).
  bool awaits_backward = false;
  // ---- the rest ----
  // Banishing waits for evicted dependents; it is retried whenever the storage is unlocked,
  // which happens after every rematerialization of a dependent (they lock their deps).
  bool banish_pending = false;
  bool deletion_pending = false;     // guards the collection worklist
  bool release_pending = false;      // refs reached 0 while locked or pinned
  // Resident but only part of its recipe replayed (Note [Rematerialization]): its contents are
  // not final, so it counts as evicted for banishing.
  bool rebuilding = false;
  // Note [Joins at the next search] (eviction_search.cc): evicted at its death, its neighbors not
  // yet told (Runtime::joins_pending_).
  bool join_pending = false;
  uint32_t pins = 0;                 // user pins: never evicted while > 0
  uint32_t pool_index = UINT32_MAX;  // position in the evictable pool, if there
  // The ops that (re)compute this storage, in order: the op that created it, then any in-place
  // ops applied since. Empty for constants (parameters, inputs, unreplayable outputs).
  absl::InlinedVector<OpId, 2> recipe;
  EvictedComponents::Node component = EvictedComponents::kNone;  // valid while evicted
  uint64_t handle = 0;               // opaque to the runtime: the backend's buffer handle
  uint64_t remat_count = 0;
  // Note [Bounded replay chains] (runtime.cc): recipe ops on the longest chain of
  // rematerializable storages behind this one when it was recorded.
  uint32_t replay_depth = 0;
  // The last neighborhood walk, or walk of a mutated storage's readers (Note [Mutation]), that
  // visited it, or that listed it as a rematerialization's input (Note [Inputs a rematerialization
  // will read]) (Runtime::NextWalkEpoch): a visited mark without a hash set per walk.
  uint32_t walk_epoch = 0;
  ConstantReason constant_reason = ConstantReason::kNone;  // Note [Constants by reason]
  // Note [Neighborhood cost cache] (neighborhoods.cc): the last full walk's cost, and the
  // runtime's residency-change count when it was walked (kNotCached: none to reuse).
  static constexpr uint64_t kNotCached = UINT64_MAX;
  uint64_t neighborhood_walked_at = kNotCached;
  double neighborhood_cost = 0;
  // Note [Exact neighborhood cost cache] (neighborhoods.cc): the evicted sets (EvictedComponents
  // root and version) around it when it was walked; a walk beside more sets is not cached.
  static constexpr int kCachedRegions = 2;
  uint8_t cached_regions = 0;
  // Note [Cut walks leave a bound]: the cached cost is a cut walk's partial sum, a lower bound.
  bool neighborhood_cost_is_bound = false;
  uint32_t cached_region_root[kCachedRegions] = {};
  uint32_t cached_region_version[kCachedRegions] = {};

  bool rematerializable() const { return !recipe.empty(); }
  bool resident() const { return state == StorageState::kResident; }
};

// Note [Candidate table] (eviction_search.cc): what a victim search reads of an evictable
// storage, mirrored from its record into the pool so that scoring a candidate reads one
// aligned 32-byte entry, half a cache line, instead of its record.
struct alignas(32) PoolEntry {
  enum Flag : uint16_t {
    kLocked = 1,           // locks > 0: skipped
    kAwaitsReader = 2,     // Note [Results awaiting their reader]: skipped, a last resort
    kNeighborEvicted = 4,  // Note [Evicted-neighbor hint]: its neighborhood cost needs a walk
    kRemats = 8,           // recent_remats > 0: Note [Thrashing]'s factor needs the record
    kRebuilt = 16,         // rebuild_epoch > 0: Note [Rebuilt segments]' factor may apply
    kAwaited = 32,         // waits > 0: Note [Lazy input locks]: skipped, a last resort
    kBackward = 64,        // backward_recipe: Note [Results of the backward pass]
    kPending = 128,        // pending_reads > 0: Note [Inputs a rematerialization will read]
    kAwaitsBackward = 256,  // awaits_backward: Note [Next use in a backward pass]
  };
  StorageId id;
  double cost = 0;
  double last_access = 0;
  uint64_t size : 55;  // 32 PiB
  uint64_t flags : 9;
};
static_assert(sizeof(PoolEntry) == 32, "what a search reads of a candidate: within one cache line");

struct OpRecord {
  absl::string_view name;  // interned by the runtime (Runtime::InternName): lives as long as it
  absl::InlinedVector<StorageId, 4> inputs;   // distinct storages read
  absl::InlinedVector<StorageId, 2> outputs;  // storages written (created or mutated in place)
  absl::InlinedVector<uint64_t, 2> output_sizes;  // bytes each output occupies while replaying
  double cost = 0;
  // Note [Scratch memory]: bytes the op held beyond its inputs and outputs while it ran.
  uint64_t scratch_bytes = 0;
  uint64_t handle = 0;      // opaque to the runtime: the backend's replay handle
  bool in_place = false;    // mutates outputs[0] (a recipe continuation) instead of creating it
  // In place, but writes all of outputs[0] without reading it: first in its recipe, and its replay
  // starts from fresh memory (Runtime::MutateCall::overwrites).
  bool overwrites = false;
  bool backward = false;      // Runtime::OpCall::backward
  // Its one output is a byte-for-byte copy of its one input storage (Runtime::OpCall::copies_input;
  // Note [Copies of overwritten contents], mutation.cc).
  bool copies_input = false;
  uint32_t recipe_users = 0;  // live storages whose recipe contains this op
};

}  // namespace dtr

#endif  // DTR_RUNTIME_RECORDS_H_
