// Runtime: the DTR brain. It records every computed storage's recipe (the ops that produce it),
// keeps the resident bytes under a budget by evicting the storage the heuristic scores lowest,
// and rematerializes evicted storages by replaying their recipes through an injected
// ReplayBackend. It knows nothing about torch or devices; the torch layer and the trace
// simulator drive the same code.
//
// Not thread-safe: the caller serializes calls (the torch layer holds one mutex around it).
//
// Implemented in one file per concept: runtime.cc (creation, the op entry points, the clock,
// CheckInvariants), lifetime.cc (record lifetime and collection), neighborhoods.cc (deps,
// dependents, neighborhood cost), eviction_search.cc (pool, victim search, eviction, budget),
// remat.cc (the rematerialization stack) and mutation.cc (in-place ops). Each holds its Notes.
#ifndef DTR_RUNTIME_RUNTIME_H_
#define DTR_RUNTIME_RUNTIME_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/container/node_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/config.h"
#include "runtime/evicted_components.h"
#include "runtime/ids.h"
#include "runtime/records.h"
#include "runtime/replay_backend.h"
#include "runtime/slot_map.h"
#include "runtime/split_mix.h"
#include "runtime/stats.h"

namespace dtr {

class Runtime {
 public:
  // Validates `config`; `backend` must outlive the runtime.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const RuntimeConfig& config,
                                                         ReplayBackend* backend);

  // ---- Recording --------------------------------------------------------------------------
  // A storage that cannot be recomputed (parameter, input, output of an unreplayable op). It is
  // resident, holds one external reference and is never evicted; banishing may free it.
  absl::StatusOr<StorageId> AddConstant(uint64_t size, uint64_t handle = 0);

  struct OpCall {
    absl::string_view name;
    absl::Span<const StorageId> inputs;      // storages the op reads (duplicates allowed)
    absl::Span<const uint64_t> output_sizes; // one per new output storage
    bool replayable = true;                  // false: outputs become constants
    uint64_t handle = 0;                     // the backend's replay handle
    // Note [Scratch memory]: workspace the op allocates and frees while it runs, when known
    // beforehand (a trace); a backend that measures it reports it with ReportScratch.
    uint64_t scratch_bytes = 0;
    // The op ran in a backward pass (the autograd engine's, in torch): Note [Results of the
    // backward pass], eviction_search.cc.
    bool backward = false;
    bool name_interned = false;  // `name` came from InternName: no lookup
    // The caller holds every input (HoldOperand) until Compute returns: resident and locked, so
    // Compute need not lock them again (an error if one is not held).
    bool inputs_held = false;
    // Its one output is a byte-for-byte copy of its one input storage, laid out alike (a clone of
    // a whole dense storage): Note [Copies of overwritten contents], mutation.cc.
    bool copies_input = false;
  };
  // The runtime's one copy of an op name (op records keep it), for the runtime's life. A caller
  // that passes it back as a call's name with name_interned set saves a hash lookup an op.
  absl::string_view InternName(absl::string_view name);
  // Runs one op that creates new storages: rematerializes and locks its inputs, makes room for
  // its outputs, calls `execute` with the new output ids (it returns the measured cost), then
  // records the outputs, each holding one external reference.
  using ExecuteFn = absl::FunctionRef<absl::StatusOr<double>(absl::Span<const StorageId> outputs)>;
  // Inline: most ops have one or two outputs, and recording one then allocates nothing for them.
  using OutputIds = absl::InlinedVector<StorageId, 2>;
  absl::StatusOr<OutputIds> Compute(const OpCall& call, ExecuteFn execute);

  struct MutateCall {
    absl::string_view name;
    absl::Span<const StorageId> inputs;   // everything the op reads, mutated storages included
    absl::Span<const StorageId> mutated;  // storages written in place
    bool replayable = true;
    uint64_t handle = 0;
    // Debug only, for tests that show Note [Mutation] is needed (design rule 2): false skips
    // detaching the readers of the mutated storages, so their replays read the new contents.
    bool invalidate_readers = true;
    // The op writes every byte of its single mutated storage and reads none of them (fill_,
    // bernoulli_ on a whole storage): the storage's recipe restarts from this op, which a replay
    // runs on fresh memory, so even a constant becomes rematerializable (Note [Mutation]).
    bool overwrites = false;
    // Set to whether the runtime recorded the op, taking over `handle` (ReplayBackend::
    // OnOpDropped is called for it, perhaps before Mutate returns).
    bool* recorded = nullptr;
    uint64_t scratch_bytes = 0;  // as OpCall::scratch_bytes
    bool backward = false;        // as OpCall::backward
    bool name_interned = false;   // as OpCall::name_interned
  };
  // Runs one in-place op. See Note [Mutation]: readers of a mutated storage are rematerialized
  // and detached first; a single mutated storage keeps its recipe (the op is appended to it).
  absl::Status Mutate(const MutateCall& call, absl::FunctionRef<absl::StatusOr<double>()> execute);
  // Whether Mutate may record a replayable in-place op that writes `mutated` (Note [Mutation]):
  // one storage, which has a recipe to extend or which the op overwrites whole. False is final:
  // only an op creating a storage and Mutate's own recording give a storage a recipe, so nothing
  // Mutate does first (bringing inputs back, invalidating readers, draining deaths) can make it
  // true, and the caller need not make a record. True may still end with the record dropped (the
  // storage frozen meanwhile).
  bool RecordsWrite(absl::Span<const StorageId> mutated, bool overwrites) const;

  // Makes `id` resident (rematerializing it if needed) and marks it used now. For views (an op
  // that reads a storage without creating one; `cost` is added to the base cost) and for
  // tensors whose memory is about to be read outside the runtime's view.
  absl::Status Access(StorageId id, double cost = 0);
  // Access(id, 0) of a storage the caller holds (HoldOperand: resident and locked), without the
  // lock round trip and the residency check it needs no more (Note [Views on a short path],
  // hooks/fallback.cc). An unknown id is ignored.
  void AccessHeld(StorageId id);
  absl::Status AddRef(StorageId id);
  // Drops one external reference; at zero the deallocation policy applies.
  absl::Status DropRef(StorageId id);
  // Pinned storages are resident and never evicted until unpinned.
  absl::Status Pin(StorageId id);
  absl::Status Unpin(StorageId id);
  // Note [Operands held for an op] (runtime.cc): makes `id` resident and keeps it so, as a pin
  // would, until ReleaseOperand; for the operands of an op the driver runs before recording it.
  absl::Status HoldOperand(StorageId id);
  void ReleaseOperand(StorageId id);
  absl::Status SetHandle(StorageId id, uint64_t handle);
  // Corrects an op's recorded cost by `delta` once its true cost is known (a GPU kernel's time,
  // read after the op was recorded: Note [Deferred op costs], deferred_costs.h). Every storage
  // whose recipe holds the op, and their evicted components, see the change. NotFound for an op
  // that was dropped meanwhile.
  absl::Status AddOpCost(OpId id, double delta);
  // Called from inside an op's `execute` (Compute, Mutate): the op held `bytes` of scratch
  // memory beyond its inputs and outputs (Note [Scratch memory]). The op's record keeps the
  // larger of this and the call's scratch_bytes, so its replays make room for it.
  void ReportScratch(uint64_t bytes) { reported_scratch_ = std::max(reported_scratch_, bytes); }

  // ---- Memory (eviction_search.cc) ---------------------------------------------------------
  // Evicts until memory() + bytes <= budget, or fails with ResourceExhausted explaining what
  // was needed and pinned and what budget would have worked. `what` and `subject` name the
  // request (joined only for the error, so the common path builds no string).
  absl::Status Reserve(uint64_t bytes, absl::string_view what, absl::string_view subject = {});
  // Evicts storages (lowest score first) until at least `bytes` were freed or none is
  // evictable; returns the bytes freed. For an allocator that enforces the budget itself.
  uint64_t EvictAtLeast(uint64_t bytes);
  // Changes the budget, evicting down to it (fails, leaving the old budget, if impossible).
  absl::Status SetBudget(uint64_t budget_bytes);
  // Note [Recomputation limit] (remat.cc): forgets the recent replays, for a caller whose budget
  // is enforced elsewhere (the torch layer's allocators) when that budget changes.
  void RestartRecomputationWindow() {
    window_overhead_cost_ = 0;
    replays_for_op_ = 0;  // Note [Thrashing rematerializations]
  }
  // Note [Recomputation limit]: time a caller spent choosing and evicting victims outside the
  // runtime's own searches (the torch layer's allocators), counted like replays.
  void AddSearchCost(double cost) { window_overhead_cost_ += std::max(cost, 0.0); }
  // The cost of an op the caller ran without recording it (a view, an op that cannot be
  // replayed): the program's own work, which the limit weighs the overhead against.
  void AddUnrecordedOpCost(double cost) { NoteBaseCost(std::max(cost, 0.0)); }
  // Note [Program time between ops] (remat.cc): time the program spent between two of its ops
  // (Python, dispatch, work dtr does not see), weighed with its ops' costs. Not an op: it moves
  // neither the window's decay nor the thrash count.
  void AddProgramTime(double time) { window_base_cost_ += std::max(time, 0.0); }

  struct Candidate {
    StorageId id;
    double score;
    uint64_t size;
    uint64_t handle;
  };
  // The best-scored evictable storages, lowest score first, at most `max_count` of them, drawn
  // per the search mode (Note [Ranked candidates]): lets an allocator pick victims by score and
  // by where their memory sits.
  std::vector<Candidate> RankedCandidates(size_t max_count);
  // The storage Reserve would evict next (Note [Victim search]), left resident; nullopt when
  // nothing is evictable. Lets an allocator that enforces the budget itself evict exactly what
  // the runtime, and dtr-sim replaying it, would (Note [One victim at a time], hooks/engine.cc).
  std::optional<Candidate> NextVictim();
  absl::Status Evict(StorageId id);

  // ---- Introspection -----------------------------------------------------------------------
  const StorageRecord* storage(StorageId id) const { return storages_.Find(id); }
  const OpRecord* op(OpId id) const { return ops_.Find(id); }
  size_t storage_count() const { return storages_.size(); }
  size_t op_count() const { return ops_.size(); }
  // Note [Joins at the next search]: entries of the queue (some may have been collected since).
  size_t queued_joins() const { return joins_pending_.size(); }
  const RuntimeConfig& config() const { return config_; }
  uint64_t budget() const { return config_.budget_bytes; }
  uint64_t memory() const { return memory_; }
  // Resident bytes that no eviction can free now (constants, pins, locks).
  uint64_t UnevictableBytes() const;
  double now() const { return now_; }
  const RuntimeStats& stats() const;
  // The heuristic's score of a resident storage now (for tests and tools).
  double ScoreOf(StorageId id);

  // Checks every invariant listed in the Notes of the runtime's .cc files. Call between
  // operations.
  absl::Status CheckInvariants() const;

 private:
  Runtime(const RuntimeConfig& config, ReplayBackend* backend);

  using InputList = absl::InlinedVector<StorageId, 4>;

  StorageRecord& rec(StorageId id) { return storages_[id]; }
  // Appends the distinct `ids` to `distinct`, brings them back and locks them (Note [Lazy input
  // locks], remat.cc: in which order); on failure everything is unlocked again. UnlockAll undoes
  // it once the op is done.
  absl::Status LockAndMaterialize(absl::string_view op_name, absl::Span<const StorageId> ids,
                                  InputList* distinct);
  void UnlockAll(const InputList& ids);
  // Appends the distinct `ids` to `distinct`, calling each(id, record) on each first (its error
  // stops the pass); an error naming `op_name` if one is unknown. LockAndMaterialize's and
  // DistinctHeld's pass over an op's inputs (defined in runtime.cc, their one file).
  template <typename Each>
  absl::Status AppendDistinct(absl::string_view op_name, absl::Span<const StorageId> ids, InputList* distinct,
                              Each&& each);
  // AppendDistinct for ids the caller holds (OpCall::inputs_held); an error if one is not resident
  // and locked.
  absl::Status DistinctHeld(absl::string_view op_name, absl::Span<const StorageId> ids, InputList* distinct);
  absl::StatusOr<StorageRecord*> Lookup(StorageId id, absl::string_view what);
  // Lookup's error, out of line: the per-op calls (Access, HoldOperand, AddRef, DropRef,
  // SetHandle) find the record themselves and build no StatusOr.
  absl::Status UnknownStorage(StorageId id, absl::string_view what) const;
  void Lock(StorageId id);
  void Unlock(StorageId id);
  void Touch(StorageId id) {
    StorageRecord& r = rec(id);
    r.last_access = now_;
    if (r.pool_index != UINT32_MAX) pool_[r.pool_index].last_access = now_;  // Note [Candidate table]
  }
  void AdvanceClock(double cost);
  // What Access and AccessHeld do once `id` is resident: the view's `cost` is the program's work,
  // and the storage is used now.
  void NoteAccess(StorageId id, double cost);
  // Note [Next use in a backward pass] (eviction_search.cc): a program op starts (moves the
  // mirror back to what a backward op reads), and a backward op has read or written `accessed`
  // (clears their flag; a forward op's outputs get theirs when Compute makes their records).
  void NoteOpStart(bool backward, absl::Span<const StorageId> inputs);
  void NoteBackwardAccesses(absl::Span<const StorageId> accessed);
  // The staleness a candidate that awaits the backward pass scores with, while one is under way.
  double BackwardStaleness(double last_access, double staleness) const;
  void UpdatePeak(uint64_t transient);
  // Note [Scratch memory]: the largest op and the floor, counting the op's workspace; and the
  // scratch an op reported while it ran, if more than it was known to need.
  void NoteOpBytes(const InputList& inputs, uint64_t out_bytes, uint64_t scratch_bytes);
  void NoteLargestOp(const InputList& inputs, uint64_t other_bytes);  // inputs plus other_bytes
  uint64_t MeasuredScratch(const InputList& inputs, uint64_t out_bytes, uint64_t known);
  void NoteFloor(const InputList& inputs, uint64_t out_bytes);

  // Dependencies and dependents over live recipes (Note [Recipes]); neighborhoods.cc.
  // Calls fn(n) for each neighbor n of `id`: inputs of its recipe ops, and outputs of its
  // reader ops whose recipe holds that op (either may repeat). The relation Deps, Dependents
  // and Note [Evicted-neighbor hint] are about. Ops no longer recorded are skipped.
  template <typename Fn>
  void ForEachNeighbor(StorageId id, Fn&& fn) const {
    const StorageRecord& r = storages_[id];
    for (OpId op : r.recipe)
      if (const OpRecord* o = ops_.Find(op))
        for (StorageId in : o->inputs)
          if (in != id) fn(in);
    for (OpId op : r.readers)
      if (const OpRecord* o = ops_.Find(op))
        for (StorageId out : o->outputs) {
          if (out == id) continue;
          const StorageRecord* orec = storages_.Find(out);
          if (orec != nullptr && std::find(orec->recipe.begin(), orec->recipe.end(), op) != orec->recipe.end())
            fn(out);
        }
  }
  void Deps(StorageId id, std::vector<StorageId>* out);
  void Dependents(StorageId id, std::vector<StorageId>* out);
  bool HasEvictedDependent(StorageId id);

  // Evictable pool (Note [Evictable pool]); eviction_search.cc.
  bool Eligible(const StorageRecord& r) const;
  // Enters or leaves the pool as the record's eligibility says, and refreshes its pool entry
  // (Note [Candidate table]): called after anything a PoolEntry mirrors changes.
  void SyncPool(StorageId id);
  void RefreshPoolEntry(const StorageRecord& r) {
    if (r.pool_index != UINT32_MAX) FillPoolEntry(r, &pool_[r.pool_index]);
  }
  // Note [One flag, one write]: where a change can move only one flag of the entry (locks,
  // waits, pending_reads, program references, readers, awaits_backward), that flag is written alone.
  void SetPoolFlag(const StorageRecord& r, PoolEntry::Flag flag, bool on) {
    if (r.pool_index == UINT32_MAX) return;
    PoolEntry& e = pool_[r.pool_index];
    e.flags = on ? (e.flags | flag) : (e.flags & ~uint64_t(flag));
  }
  // After a change of a program reference or a reader (Note [Results awaiting their reader]).
  void SyncAwaitsReaderFlag(const StorageRecord& r) {
    SetPoolFlag(r, PoolEntry::kAwaitsReader, AwaitsReader(r));
  }
  // Inline: it refreshed the entry at every lock, unlock and touch (about eight an op) until
  // stop 68, which cost some 360 instructions an op as a call; the other refreshes remain.
  static void FillPoolEntry(const StorageRecord& r, PoolEntry* e) {
    e->cost = r.cost;
    e->last_access = r.last_access;
    e->size = r.size;
    e->flags = (r.locks > 0 ? PoolEntry::kLocked : 0) | (AwaitsReader(r) ? PoolEntry::kAwaitsReader : 0) |
               (r.neighbor_evicted ? PoolEntry::kNeighborEvicted : 0) |
               (r.recent_remats > 0 ? PoolEntry::kRemats : 0) | (r.rebuild_epoch > 0 ? PoolEntry::kRebuilt : 0) |
               (r.waits > 0 ? PoolEntry::kAwaited : 0) | (r.backward_recipe ? PoolEntry::kBackward : 0) |
               (r.pending_reads > 0 ? PoolEntry::kPending : 0) |
               (r.awaits_backward ? PoolEntry::kAwaitsBackward : 0);
  }

  // Victim search (Note [Victim search]); eviction_search.cc, but NeighborhoodCost is in
  // neighborhoods.cc.
  // Note [Results awaiting their reader]: held, read by no recipe, and not a single op of
  // constants (replay depth 1, scored like any storage).
  static bool AwaitsReader(const StorageRecord& r) {
    return r.external_refs > 0 && r.readers.empty() && r.replay_depth > 1;
  }
  // A candidate's score short of its neighborhood cost: the heuristic's inputs and the thrash
  // factor (Note [Thrashing]). Final(nc) is the score; it never falls as nc grows.
  struct PartialScore {
    HeuristicKind kind;
    ScoreInputs in;     // neighborhood_cost left 0
    double damping = 1;
    double Final(double neighborhood_cost) const {
      ScoreInputs full = in;
      full.neighborhood_cost = neighborhood_cost;
      return Score(kind, full) * damping;
    }
    double FinalInline(double neighborhood_cost) const {  // Final, for the search's own pass
      ScoreInputs full = in;
      full.neighborhood_cost = neighborhood_cost;
      return ScoreInline(kind, full) * damping;
    }
    // About the neighborhood cost above which Final exceeds `above`: a cheap test that a walk
    // checks before Final itself (Note [Bounded victim search]). Either side of rounding is
    // safe, since Final decides; -infinity for heuristics without a neighborhood term.
    double CostLimit(double above) const;
  };
  // From the candidate's pool entry; reads its record only for a damping factor (Note
  // [Candidate table]).
  PartialScore StartScore(const PoolEntry& e, HeuristicKind kind, double now);
  double EntryDamping(const PoolEntry& e);
  // The thrash and rebuild factors, from the record (Note [Thrashing], Note [Rebuilt segments]).
  double Damping(StorageId id, bool thrash, bool rebuilt);
  // The neighborhood cost of `id` per neighborhood_. Given `bound`, a walk stops as soon as
  // bound->Final(cost so far) exceeds `above`, returning the partial cost with *stopped set
  // (Note [Bounded victim search]).
  double NeighborhoodCost(StorageId id, const PartialScore* bound = nullptr, double above = 0,
                          bool* stopped = nullptr);
  // NeighborhoodCost from a candidate's pool entry where it can (Note [Candidate table]).
  double EntryNeighborhoodCost(const PoolEntry& e, const PartialScore* bound = nullptr, double above = 0,
                               bool* stopped = nullptr);
  bool Reusable(uint64_t walked_at) const;  // Note [Neighborhood cost cache]
  bool ExactNeighborhoodCache() const { return config_.neighborhood_cache_events == kExactNeighborhoodCache; }
  // The walk behind NeighborhoodCost for kExact and kAncestors: the cost of the evicted storages
  // it reaches, *cut set if `bound` stopped it, *any_evicted if it found one.
  double WalkNeighborhood(StorageId id, const PartialScore* bound, double above, bool* cut, bool* any_evicted);
  // Note [Exact neighborhood cost cache]: an evicted storage is about to change in a way walks
  // through it sum (brought back, collected, its cost corrected): its set's version moves on.
  void NoteEvictedRegionChanged(const StorageRecord& r) {
    if (r.state == StorageState::kEvicted && r.component != EvictedComponents::kNone) components_.Touch(r.component);
  }
  // Whether r's cached neighborhood cost may be reused: Reusable, and under the exact cache the
  // sets its walk was beside are as they were.
  bool CachedCostValid(const StorageRecord& r) const;
  bool RecordCachedRegions(StorageId id);  // records those sets (false: too many to cache)
  void ForgetNeighborhoodCost(StorageRecord& r) { r.neighborhood_walked_at = StorageRecord::kNotCached; }
  // dtr's exact e* and msps's evicted ancestors: neighborhood costs that are graph walks (Note
  // [Bounded neighborhood walks]), which only they cut and cache.
  bool NeighborhoodWalks() const {
    return neighborhood_ == NeighborhoodKind::kExact || neighborhood_ == NeighborhoodKind::kAncestors;
  }
  double ScoreUnchecked(const PoolEntry& e);
  // Scores candidates_[i] into candidate_scores_[i], or kUnscored where it is skipped (locked,
  // awaiting its reader, awaited) or its walk was cut: it cannot beat the `keep` best distinct
  // scores (Note [Bounded victim search]). For keep <= 64 (kMaxKeptForCutting), best_ holds those
  // that are not small, best first.
  void ScoreCandidates(size_t keep, double small);
  // Starts loading what the union-find neighborhood costs of the sampled candidates will read
  // (Note [Prefetched neighborhoods]).
  void PrefetchNeighborhoods() const;
  // Fills candidates_ for one search: the whole pool, or in sampled mode (when the sample is
  // smaller than the pool) the carried runners-up and a fresh sample; returns whether sampled.
  bool DrawCandidates();
  void DrawWholePool();  // candidates_ = the whole pool
  size_t SampleSize(size_t pool_size) const;  // how many a sampled search draws
  bool ChooseVictim(StorageId* victim, double* score = nullptr);  // score: the victim's
  void EvictUnchecked(StorageId id, bool eager);
  // Note [Joins at the next search]: tells an evicted storage's neighbors (the evicted-neighbor
  // hint, their cached costs, the evicted sets); JoinPendingEvictions does it for every storage
  // evicted at its death since the last search.
  void JoinEvicted(StorageId id);
  void JoinPendingEvictions() {
    if (!joins_pending_.empty()) JoinPendingEvictionsSlow();
  }
  void JoinPendingEvictionsSlow();
  void DropCollectedJoins();  // from joins_pending_
  // The record of a queue entry still awaiting its join, or null (collected, or joined since).
  const StorageRecord* QueuedJoin(StorageId id) const {
    const StorageRecord* r = storages_.Find(id);
    return r != nullptr && r->join_pending ? r : nullptr;
  }
  absl::Status InfeasibleError(uint64_t bytes, absl::string_view what) const;

  // Rematerialization (Note [Rematerialization]); remat.cc.
  // Note [Lazy input locks]: an input some op being brought back waits for, evicted only as a
  // last resort until it is locked; Unawait when the op is done.
  void Await(StorageId id);
  void Unawait(StorageId id);
  absl::Status Materialize(StorageId target);
  // Pin's and HoldOperand's first step: locks `id`, then brings it back if it is evicted (under
  // the lock); *brought_back says whether it was. The lock is the caller's to keep or drop.
  absl::Status LockAndBringBack(StorageId id, bool* brought_back);
  absl::Status ReplayFirstOp(StorageId id);
  absl::Status ReplayInPlaceOp(StorageId id, size_t stage);
  // Checks the limit, makes room for output_bytes and the op's workspace, replays, counts.
  absl::Status RunReplay(OpId id, const OpRecord& op, uint64_t output_bytes, absl::Span<const bool> keep);
  absl::Status FinishRemat(StorageId id);
  void NoteRemat(StorageId id);

  // Deallocation and record lifetime (Note [Record lifetime]); lifetime.cc.
  void OnUnreferenced(StorageId id);
  // Note [Dead constants in accumulating recipes] (lifetime.cc).
  void ReleaseDeadConstant(StorageId id);
  // Note [Held results of dead inputs] (lifetime.cc): whether it froze any, or kept `dying`
  // (Note [Kept inputs of held results]). pass_on: `dying` is a frozen result, whose backward
  // readers' held results are frozen too if together at most kPassOnRatio times its size (Note
  // [Frozen results pass it on]).
  bool FreezeHeldResultsOf(StorageId dying, bool pass_on = false);
  void FreezeGradientsKeepingDeadConstants(absl::Span<const StorageId> inputs);
  bool KeepsDeadConstant(StorageId gradient);
  void Banish(StorageId id);
  void Detach(StorageId id, ConstantReason why);
  void ClearRecipe(StorageId id);
  void MaybeCollect(StorageId id);
  void DrainCollection();

  // Note [Mutation]; mutation.cc.
  absl::Status InvalidateReaders(absl::Span<const StorageId> mutated);
  // `status`, or where bringing back the evicted gradient `target` ran out of memory, the same
  // error naming DTR_FREEZE_GRADIENTS.
  absl::Status WithFrozenGradientsHint(const absl::Status& status, StorageId target) const;
  // Note [Copies of overwritten contents]: gives `copy`, a held resident copy of a storage in
  // `mutated`, its original's recipe instead of freezing it; false (nothing changed) if it cannot.
  bool RecipeFromOriginal(StorageId copy, absl::Span<const StorageId> mutated);

  // Note [Evicted components] (evicted_components.h); neighborhoods.cc.
  void MaybeCompactComponents();
  // A fresh mark for one walk's visited storages (StorageRecord::walk_epoch): a neighborhood walk,
  // Note [Mutation]'s walk of readers, or a rematerialization's listing (ListPendingReplays).
  uint32_t NextWalkEpoch();

  RuntimeConfig config_;
  ReplayBackend* backend_;
  NeighborhoodKind neighborhood_;  // of config_.heuristic
  SlotMap<StorageId, StorageRecord> storages_;
  SlotMap<OpId, OpRecord> ops_;
  absl::node_hash_set<std::string> op_names_;  // OpRecord::name points into it
  EvictedComponents components_;
  std::vector<PoolEntry> pool_;  // Note [Evictable pool], Note [Candidate table]
  uint64_t memory_ = 0;
  uint64_t pool_bytes_ = 0;
  // Resident constants frozen by Note [Held results of dead inputs]: evictable for Note [Memory
  // floor], which bounds every schedule, not this runtime's choices.
  uint64_t held_result_bytes_ = 0;
  uint64_t evicted_count_ = 0;
  double now_ = 0;
  // Note [Next use in a backward pass] (eviction_search.cc): a backward pass is under way (the
  // last program op was a backward op; also read by Note [Held results of dead inputs]), and how
  // far back in the forward pass it has read.
  bool in_backward_pass_ = false;
  double backward_mirror_ = 0;
  // Note [Held results of dead inputs]: the mirror, but moved by evicted inputs too.
  double backward_reach_ = 0;
  // Note [Rebuilt segments] (remat.cc): the rematerialization under way (Materialize calls
  // nest: the outermost one numbers them), and how deep.
  uint64_t rebuild_epoch_ = 0;
  uint32_t rebuilds_underway_ = 0;
  // Note [Inputs a rematerialization will read] (remat.cc): the ops each Materialize under way
  // expects to replay (innermost last), and the storages each reads.
  struct PendingReplays {
    struct Op {
      OpId id;
      absl::InlinedVector<StorageId, 4> reads;
      bool replayed = false;
    };
    std::vector<Op> ops;
    absl::flat_hash_map<OpId, uint32_t> index;  // into ops
  };
  std::vector<PendingReplays*> pending_replays_;
  void ListPendingReplays(StorageId target, PendingReplays* pending);
  void ReleasePendingReads(PendingReplays::Op& op);
  void NotePendingReplayed(OpId id);
  // Note [Recomputation limit] (remat.cc): decayed sums over the recent ops.
  double window_base_cost_ = 0, window_overhead_cost_ = 0;  // the program's ops; replays and searches
  uint64_t replays_for_op_ = 0;  // replays since the program's last op: Note [Thrashing rematerializations]
  double window_decay_ = 1;  // per recorded op: 2^(-1 / recompute_half_life_ops)
  void NoteBaseCost(double cost);
  absl::Status CheckRecomputation(absl::string_view op_name);
  uint64_t reported_scratch_ = 0;  // ReportScratch during the op being executed
  uint64_t op_counter_ = 0;  // ops computed or replayed: the thrash-decay clock
  static constexpr size_t kCarriedCandidates = 16;
  // A search's scored candidate; ordered by (score, id) as in Note [Bounded victim search].
  struct Scored {
    double score;
    StorageId id;
    uint32_t pool_index;
    uint32_t candidate = 0;  // its index in candidates_, where ScoreCandidates made it
    bool operator<(const Scored& o) const { return score != o.score ? score < o.score : id < o.id; }
  };
  // Offers a scored candidate to *best, the keep best distinct (score, id) pairs so far, sorted.
  // Once the list is full most offers are turned away, so that test is inline.
  static void KeepIfAmongBest(const Scored& entry, size_t keep, std::vector<Scored>* best) {
    if (best->size() == keep && !(entry < best->back())) return;
    // Most kept pairs come in order (a search's carried runners-up first): they join at the end.
    if (best->size() < keep && (best->empty() || (best->back() < entry && best->back().id != entry.id)))
      best->push_back(entry);
    else
      InsertAmongBest(entry, keep, best);
  }
  static void InsertAmongBest(const Scored& entry, size_t keep, std::vector<Scored>* best);
  std::vector<std::pair<StorageId, uint32_t>> carried_;  // Note [Victim search]: id, pool index hint
  std::vector<Scored> scored_;                         // scratch for one ranking
  std::vector<Scored> best_;                           // ScoreCandidates' best, for one search
  std::vector<uint32_t> candidates_;                   // scratch for one search: pool indices
  std::vector<double> candidate_scores_;               // scratch for one search
  std::vector<PartialScore> partial_scores_;           // scratch for one search
  std::vector<std::pair<double, uint32_t>> search_order_;  // scratch for one search
  std::vector<StorageId> collect_worklist_;
  std::vector<StorageId> scratch_;
  std::vector<StorageId> joins_pending_;  // Note [Joins at the next search]
  std::vector<StorageId> walk_frontier_;  // scratch for one neighborhood walk
  uint32_t walk_epoch_ = 0;
  uint64_t residency_changes_ = 0;  // evictions and rematerializations: Note [Neighborhood cost cache]
  // Note [Exact neighborhood cost cache]: a cached cost is valid only with the current
  // generation, which moves on when the evicted sets are compacted (their names change).
  uint64_t cache_generation_ = 0;
  SplitMix64 rng_;  // the samples' draws, and kRandom's scores
  mutable RuntimeStats stats_;
};

}  // namespace dtr

#endif  // DTR_RUNTIME_RUNTIME_H_
