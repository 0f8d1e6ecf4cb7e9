// The DTR runtime: recording, eviction, rematerialization and deallocation. See runtime.h.
#include "runtime/runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/bytes.h"

namespace dtr {

// Note [Recipes]
// A storage's recipe is the list of ops that produce its current contents: the op that created
// it, then every in-place op applied to it since (Note [Mutation]). deps(S) are the inputs of the
// recipe's ops other than S; the dependents of S are the outputs T != S of S's readers whose
// recipe contains that reader. A storage with an empty recipe is a constant: never evicted.
// Every op in a live recipe is listed in the `readers` of each of its inputs, and its
// `recipe_users` counts the storages whose recipe contains it.
//
// Note [Mutation]
// An in-place op changes a storage that earlier ops read, so (design rules 1 and 2) before it
// runs, no live recipe may read the old contents any more. Walking downstream from the mutated
// storage: a resident reader the program holds (or an op in progress uses) is detached (frozen
// as a constant, its contents are right); an evicted reader the program holds is brought back
// first and then detached; a reader nobody holds is abandoned, resident or evicted, and the
// walk continues into its own readers, since they can no longer bring it back. Abandoned
// storages end up with no readers and are collected, so an optimizer step that updates
// parameters in place drops the previous step's graph instead of recomputing it. (Freezing a
// dead resident reader instead kept it as a constant for as long as some dependent's recipe
// read it: 22 dead 64 KiB activations of the 64-layer chain at its optimizer step.) The held
// evicted readers are brought back one at a time, shallowest replay depth first (a gradient
// near the loss before the ones behind it), and each is frozen as soon as it is back, so
// bringing back the next cannot evict it again; since that may evict a resident reader, the
// walk repeats until nothing is left to bring back. Afterwards the mutated storage keeps its
// recipe with the in-place op appended (replaying the recipe rebuilds the new contents) if the
// op is replayable and mutates exactly one storage; otherwise it becomes a constant. An op that
// overwrites all of its storage without reading it (MutateCall::overwrites: a dropout mask's
// bernoulli_) starts the recipe afresh instead, so a constant it fills becomes rematerializable.
//
// Note [Evictable pool]
// pool_ holds exactly the storages that are resident, rematerializable, unpinned and of nonzero
// size; pool_index is each one's position. Locks are transient (held during one op), so locked
// storages stay in the pool and the search skips them.
//
// Note [Victim search]
// Sampled mode scores max(min_samples, ceil(sample_factor * sqrt(n))) uniformly drawn pool
// entries plus the kCarriedCandidates best runners-up of the previous search (re-scored: scores
// move with the clock), evicts the lowest, and carries the new runners-up forward. Carrying
// good candidates across searches (as Redis's approximate LRU does with its eviction pool) keeps
// sampling from settling on a poor victim when a small sample misses every good one, which
// made sampled search thrash on TreeLSTM traces. Exact mode scores all n. Storages smaller than
// small_storage_fraction of the pool's mean size are skipped unless nothing else is evictable.
// Scores are multiplied by (1 + thrash_damping * decayed recent remats), Note [Thrashing].
// The sample stops growing at max_samples (64): the best of K uniform draws lies in the best
// q of the pool with probability 1 - (1 - q)^K whatever n is, and the carried runners-up add
// to it. On a generated TreeLSTM of 680k events (50k storages in the pool) the cap cost 0.2%
// of compute at r = 0.3 (1.2447x against 1.2422x with sqrt(n), about 150 a search; 128 gave
// 1.2428x, 32 gave 1.2496x) and made each decision a fixed price, not one that grows with n
// (bench/results/runtime.md).
//
// Note [Rematerialization]
// Materialize runs on an explicit stack of frames, one per storage being brought back. A frame
// replays its storage's recipe one op at a time: it locks that op's inputs (resident or not: a
// locked evicted storage cannot be evicted again once it is back), pushes the first non-resident
// one, and when all are resident replays the op and unlocks them. Between recipe ops the storage
// itself is locked, so the memory needed is the largest single step, not the whole recipe. The
// graph is acyclic, so the stack is bounded by the number of storages; there is no recursion. Replaying a multi-output op computes all of
// its outputs: evicted siblings whose recipe is exactly that op are kept, the rest (resident
// siblings, or siblings mutated since) are discarded again, with their bytes reserved for the
// duration of the replay.
//
// Note [Record lifetime]
// A record is collected (dropped, memory released) when it has no external references, no locks,
// no pins and no readers: nothing can ever need its contents again. Dropping it empties its
// recipe, which may drop ops, which removes them from their inputs' readers, which may collect
// those inputs in turn; a worklist makes this cascade iterative. When the last external reference
// goes, eager eviction evicts the storage (if it is rematerializable and still needed by a
// dependent); banishing frees it for good once no evicted dependent needs it and detaches its
// resident dependents.
//
// Note [Bounded replay chains]
// A value carried across training steps and updated from itself (an exponential moving average
// acc = acc * 0.9 + x, an RNN state carried through truncated backpropagation) builds a recipe
// chain as long as the run: each step's record reads the previous step's, which is dead and
// evicted but kept for replay. Records, and everything they keep, grow every step, and bringing
// the value back replays the whole history. So each record carries its replay depth (1 + the
// largest depth among its rematerializable inputs; constants count 0), and a storage recorded
// deeper than max_replay_depth is made a constant at once, which cuts the chain: its ancestors'
// records lose their last reader and are collected. An in-place op appended to a recipe adds one
// to its storage's depth, which bounds recipes too (a buffer updated in place every step). The depth is fixed at recording and not
// lowered when an ancestor later becomes a constant, so the cut may come early, never late.
// Within a training step chains are as long as the model is deep; the default limit (1000)
// freezes about one storage in a thousand along the longest path.
//
// Note [Results awaiting their reader]
// A storage the program holds that no live recipe reads yet is a result waiting for the
// program: a parameter's gradient between the backward pass and the optimizer step, a loss, an
// output kept for later. Evicting one saves its bytes only until that read, and bringing it back
// replays the whole chain behind it (a gradient's is the backward pass up to its layer, whose
// intermediates are long dead) with that chain's inputs locked; an in-place parameter update
// must bring every evicted gradient back first (Note [Mutation]). In traces of the benchmark
// models this was the cliff: the 64-layer chain went from 1.53x at 0.5 of its activations to out
// of memory at 0.4, and trained down to 0.1 at 3x once gradients were kept. So such storages
// are victims of last resort: chosen only when nothing else is evictable (they stay in the pool,
// so a budget that needs them still trains).
//
// Note [Thrashing]
// Each rematerialization adds one to the storage's recent_remats, which halves every
// thrash_half_life_ops ops. The victim search multiplies the score by
// (1 + thrash_damping * recent_remats), so a storage that keeps coming back is kept longer;
// reaching thrash_report_threshold counts a thrash event in the stats.

namespace {

template <typename Vec, typename T>
bool ContainsValue(const Vec& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

template <typename Vec, typename T>
void EraseValue(Vec& v, const T& x) {
  auto it = std::find(v.begin(), v.end(), x);
  if (it != v.end()) v.erase(it);
}

std::string IdString(StorageId id) { return absl::StrCat("storage#", id.index, ".", id.generation); }

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeConfig& config,
                                                         ReplayBackend* backend) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (backend == nullptr) return absl::InvalidArgumentError("Runtime needs a ReplayBackend");
  return std::unique_ptr<Runtime>(new Runtime(config, backend));
}

Runtime::Runtime(const RuntimeConfig& config, ReplayBackend* backend)
    : config_(config), backend_(backend), neighborhood_(InfoFor(config.heuristic).neighborhood),
      rng_(config.seed) {}

const RuntimeStats& Runtime::stats() const {
  stats_.memory_bytes = memory_;
  return stats_;
}

absl::StatusOr<StorageRecord*> Runtime::Lookup(StorageId id, absl::string_view what) {
  StorageRecord* r = storages_.Find(id);
  if (r == nullptr)
    return absl::NotFoundError(absl::StrCat(what, ": unknown or already collected ", IdString(id)));
  return r;
}

absl::string_view Runtime::InternName(absl::string_view name) {
  // Op names repeat (a few hundred distinct ones in a training step): one copy each, no
  // allocation per recorded op. node_hash_set keeps the strings in place when it rehashes.
  auto it = op_names_.find(name);
  if (it == op_names_.end()) it = op_names_.emplace(name).first;
  return *it;
}

void Runtime::AdvanceClock(double cost) {
  // Staleness is now - last_access + 1 clock unit (Note [Heuristics]), so zero-cost ops are fine.
  now_ += std::max(cost, 0.0);
  ++op_counter_;
}

void Runtime::UpdatePeak(uint64_t transient) {
  stats_.peak_memory_bytes = std::max(stats_.peak_memory_bytes, memory_ + transient);
}

// Note [Memory floor]
// While an op runs, its inputs and outputs must be resident, and so must everything no eviction
// can free (constants, pins). Their sum at the worst op is a budget below which this run cannot
// go whatever the heuristic does (given which storages the program made constants): dtr-sim
// reports it next to the smallest budget that trained, to tell a weak policy from a hard limit.
void Runtime::NoteFloor(const InputList& inputs, uint64_t out_bytes) {
  uint64_t floor = memory_ - pool_bytes_ + out_bytes;  // memory_ - pool_bytes_: unevictable bytes
  for (StorageId in : inputs) {
    const StorageRecord& r = rec(in);
    if (r.pool_index != UINT32_MAX) floor += r.size;
  }
  stats_.floor_bytes = std::max(stats_.floor_bytes, floor);
}

// ---- Recording ------------------------------------------------------------------------------

absl::StatusOr<StorageId> Runtime::AddConstant(uint64_t size, uint64_t handle) {
  if (absl::Status s = Reserve(size, "a constant"); !s.ok()) return s;
  StorageRecord r;
  r.size = size;
  r.external_refs = 1;
  r.handle = handle;
  r.last_access = now_;
  StorageId id = storages_.Insert(std::move(r));
  memory_ += size;
  UpdatePeak(0);
  ++stats_.constants;
  return id;
}

absl::Status Runtime::LockAndMaterialize(absl::string_view op_name, absl::Span<const StorageId> ids,
                                         InputList* distinct) {
  for (StorageId in : ids)
    if (!storages_.Contains(in)) return Lookup(in, absl::StrCat("input of ", op_name)).status();
  // Locked before any is brought back, so that bringing one back cannot evict another.
  for (StorageId in : ids)
    if (!ContainsValue(*distinct, in)) distinct->push_back(in);
  for (StorageId in : *distinct) Lock(in);
  for (StorageId in : *distinct) {
    if (absl::Status s = Materialize(in); !s.ok()) {
      UnlockAll(*distinct);
      return s;
    }
  }
  return absl::OkStatus();
}

void Runtime::UnlockAll(const InputList& ids) {
  for (StorageId in : ids) Unlock(in);
  DrainCollection();
}

absl::StatusOr<std::vector<StorageId>> Runtime::Compute(const OpCall& call, ExecuteFn execute) {
  InputList inputs;
  if (absl::Status s = LockAndMaterialize(call.name, call.inputs, &inputs); !s.ok()) return s;
  auto unlock_inputs = [&] { UnlockAll(inputs); };
  uint64_t out_bytes = 0;
  for (uint64_t size : call.output_sizes) out_bytes += size;
  uint64_t op_bytes = out_bytes;
  for (StorageId in : inputs) op_bytes += rec(in).size;
  stats_.largest_op_bytes = std::max(stats_.largest_op_bytes, op_bytes);
  NoteFloor(inputs, out_bytes);
  if (absl::Status s = Reserve(out_bytes, "outputs of ", call.name); !s.ok()) {
    unlock_inputs();
    return s;
  }

  std::vector<StorageId> outputs;
  outputs.reserve(call.output_sizes.size());
  for (uint64_t size : call.output_sizes) {
    StorageRecord r;
    r.size = size;
    r.external_refs = 1;
    outputs.push_back(storages_.Insert(std::move(r)));
  }
  memory_ += out_bytes;
  UpdatePeak(0);

  absl::StatusOr<double> cost = execute(absl::MakeConstSpan(outputs));
  if (!cost.ok()) {
    for (StorageId out : outputs) storages_.Erase(out);
    memory_ -= out_bytes;
    unlock_inputs();
    return cost.status();
  }
  AdvanceClock(*cost);
  ++stats_.ops_recorded;
  stats_.base_cost += *cost;

  if (call.replayable && !outputs.empty()) {
    OpRecord op;
    op.name = InternName(call.name);
    op.inputs.assign(inputs.begin(), inputs.end());
    op.outputs.assign(outputs.begin(), outputs.end());
    op.output_sizes.assign(call.output_sizes.begin(), call.output_sizes.end());
    op.cost = *cost;
    op.handle = call.handle;
    op.recipe_users = uint32_t(outputs.size());
    OpId op_id = ops_.Insert(std::move(op));
    uint32_t depth = 1;
    for (StorageId in : inputs) {
      StorageRecord& in_rec = rec(in);
      in_rec.readers.push_back(op_id);
      if (in_rec.rematerializable()) depth = std::max(depth, in_rec.replay_depth + 1);
    }
    for (StorageId out : outputs) {
      StorageRecord& r = rec(out);
      r.recipe.push_back(op_id);
      r.cost = *cost;
      r.replay_depth = depth;
    }
    if (depth > config_.max_replay_depth) {
      // Note [Bounded replay chains]
      for (StorageId out : outputs) Detach(out);
      stats_.depth_limited += outputs.size();
    }
  } else {
    stats_.constants += outputs.size();
  }
  for (StorageId out : outputs) {
    Touch(out);
    SyncPool(out);
  }
  for (StorageId in : inputs) Touch(in);
  unlock_inputs();
  return outputs;
}

absl::Status Runtime::Mutate(const MutateCall& call,
                             absl::FunctionRef<absl::StatusOr<double>()> execute) {
  std::vector<StorageId> reads(call.inputs.begin(), call.inputs.end());
  reads.insert(reads.end(), call.mutated.begin(), call.mutated.end());
  InputList inputs;
  if (absl::Status s = LockAndMaterialize(call.name, reads, &inputs); !s.ok()) return s;
  auto unlock_inputs = [&] { UnlockAll(inputs); };
  NoteFloor(inputs, 0);
  absl::InlinedVector<StorageId, 2> mutated;
  for (StorageId m : call.mutated)
    if (!ContainsValue(mutated, m)) mutated.push_back(m);
  // Note [Mutation]: nothing may replay against the old contents any more.
  if (absl::Status s = call.invalidate_readers ? InvalidateReaders(mutated) : absl::OkStatus(); !s.ok()) {
    unlock_inputs();
    return s;
  }
  absl::StatusOr<double> cost = execute();
  if (!cost.ok()) {
    // The contents of the mutated storages are unknown now: they cannot be replayed.
    for (StorageId m : mutated) Detach(m);
    unlock_inputs();
    return cost.status();
  }
  AdvanceClock(*cost);
  ++stats_.ops_recorded;
  stats_.base_cost += *cost;
  const bool overwrites = call.overwrites && mutated.size() == 1;
  if (call.replayable && mutated.size() == 1 && (rec(mutated[0]).rematerializable() || overwrites)) {
    StorageId m = mutated[0];
    // The old contents are gone and nothing reads them any more (InvalidateReaders): the recipe
    // restarts here.
    if (overwrites) ClearRecipe(m);
    OpRecord op;
    op.name = InternName(call.name);
    for (StorageId in : inputs)
      if (in != m) op.inputs.push_back(in);
    op.outputs.push_back(m);
    op.output_sizes.push_back(rec(m).size);
    op.cost = *cost;
    op.handle = call.handle;
    op.in_place = true;
    op.overwrites = overwrites;
    op.recipe_users = 1;
    OpId op_id = ops_.Insert(std::move(op));
    if (call.recorded != nullptr) *call.recorded = true;
    uint32_t depth = overwrites ? 1 : rec(m).replay_depth + 1;  // the recipe grows by one op
    for (StorageId in : ops_[op_id].inputs) {
      StorageRecord& in_rec = rec(in);
      in_rec.readers.push_back(op_id);
      if (in_rec.rematerializable()) depth = std::max(depth, in_rec.replay_depth + 1);
    }
    rec(m).recipe.push_back(op_id);
    rec(m).cost += *cost;
    rec(m).replay_depth = depth;
    if (depth > config_.max_replay_depth) {
      Detach(m);  // Note [Bounded replay chains]
      ++stats_.depth_limited;
    }
    SyncPool(m);  // a constant it overwrote is evictable now
  } else {
    for (StorageId m : mutated) Detach(m);
  }
  for (StorageId in : inputs) Touch(in);
  unlock_inputs();
  return absl::OkStatus();
}

absl::Status Runtime::InvalidateReaders(absl::Span<const StorageId> mutated) {
  // Note [Mutation]: walk downstream from the mutated storages through the unreferenced ones.
  std::vector<StorageId> freeze, bring_back, abandon, frontier, next;
  absl::flat_hash_set<uint64_t> seen;
  auto walk = [&] {
    freeze.clear();
    bring_back.clear();
    abandon.clear();
    frontier.clear();
    seen.clear();
    for (StorageId m : mutated) {
      Dependents(m, &next);
      frontier.insert(frontier.end(), next.begin(), next.end());
    }
    while (!frontier.empty()) {
      StorageId t = frontier.back();
      frontier.pop_back();
      if (!seen.insert(t.packed()).second) continue;
      const StorageRecord& r = rec(t);
      if (!r.rematerializable()) continue;
      const bool held = r.external_refs > 0 || r.pins > 0;
      if (r.resident() && (held || r.locks > 0)) {
        freeze.push_back(t);
      } else if (!r.resident() && held) {
        bring_back.push_back(t);
      } else {
        // Dead, resident or not: frozen, a resident one would stay as a constant for as long as
        // a dependent's recipe reads it.
        abandon.push_back(t);
        Dependents(t, &next);
        frontier.insert(frontier.end(), next.begin(), next.end());
      }
    }
  };
  for (walk(); !bring_back.empty(); walk()) {
    std::sort(bring_back.begin(), bring_back.end(), [&](StorageId a, StorageId b) {
      return rec(a).replay_depth < rec(b).replay_depth;
    });
    for (StorageId t : bring_back) {
      if (!rec(t).rematerializable()) continue;  // frozen meanwhile (a sibling's replay)
      Lock(t);
      absl::Status status = Materialize(t);
      Unlock(t);
      if (!status.ok()) return status;
      Detach(t);
    }
  }
  for (StorageId t : freeze) Detach(t);
  // Nothing reads the abandoned storages any more: collecting them drops the old graph.
  for (StorageId t : abandon) {
    ++stats_.detached;
    MaybeCollect(t);
  }
  DrainCollection();
  return absl::OkStatus();
}

absl::Status Runtime::Access(StorageId id, double cost) {
  if (auto r = Lookup(id, "access"); !r.ok()) return r.status();
  Lock(id);
  absl::Status s = Materialize(id);
  if (s.ok()) {
    AdvanceClock(cost);
    stats_.base_cost += cost;
    Touch(id);
  }
  Unlock(id);
  DrainCollection();
  return s;
}

absl::Status Runtime::AddRef(StorageId id) {
  auto r = Lookup(id, "add reference");
  if (!r.ok()) return r.status();
  ++(*r)->external_refs;
  return absl::OkStatus();
}

absl::Status Runtime::DropRef(StorageId id) {
  auto r = Lookup(id, "drop reference");
  if (!r.ok()) return r.status();
  if ((*r)->external_refs == 0)
    return absl::FailedPreconditionError(absl::StrCat("drop reference: ", IdString(id), " has none"));
  if (--(*r)->external_refs == 0) OnUnreferenced(id);
  DrainCollection();
  return absl::OkStatus();
}

absl::Status Runtime::Pin(StorageId id) {
  if (auto r = Lookup(id, "pin"); !r.ok()) return r.status();
  Lock(id);
  absl::Status s = Materialize(id);
  Unlock(id);
  if (s.ok()) {
    ++rec(id).pins;
    SyncPool(id);
  }
  DrainCollection();
  return s;
}

absl::Status Runtime::Unpin(StorageId id) {
  auto r = Lookup(id, "unpin");
  if (!r.ok()) return r.status();
  if ((*r)->pins == 0) return absl::FailedPreconditionError(absl::StrCat("unpin: ", IdString(id), " is not pinned"));
  --(*r)->pins;
  SyncPool(id);
  if ((*r)->pins == 0 && (*r)->external_refs == 0 && (*r)->locks == 0) {
    (*r)->release_pending = false;
    OnUnreferenced(id);
  }
  DrainCollection();
  return absl::OkStatus();
}

absl::Status Runtime::SetHandle(StorageId id, uint64_t handle) {
  auto r = Lookup(id, "set handle");
  if (!r.ok()) return r.status();
  (*r)->handle = handle;
  return absl::OkStatus();
}

absl::Status Runtime::AddOpCost(OpId id, double delta) {
  OpRecord* op = ops_.Find(id);
  if (op == nullptr) return absl::NotFoundError(absl::StrCat("op ", id.packed(), " is no longer recorded"));
  op->cost = std::max(0.0, op->cost + delta);
  for (StorageId out : op->outputs) {
    StorageRecord* r = storages_.Find(out);
    if (r == nullptr || std::find(r->recipe.begin(), r->recipe.end(), id) == r->recipe.end()) continue;
    const double before = r->cost;
    r->cost = std::max(0.0, r->cost + delta);
    if (r->state == StorageState::kEvicted && r->component != EvictedComponents::kNone)
      components_.AddCost(r->component, r->cost - before);
  }
  stats_.base_cost += delta;
  return absl::OkStatus();
}

void Runtime::Lock(StorageId id) { ++rec(id).locks; }

void Runtime::Unlock(StorageId id) {
  StorageRecord& r = rec(id);
  // Only a release that was deferred while locked applies now: a storage brought back for a
  // dependent stays resident like any other (evicting it on unlock made replays cascade).
  if (--r.locks == 0 && r.external_refs == 0 && r.pins == 0 && (r.release_pending || r.banish_pending)) {
    r.release_pending = false;
    OnUnreferenced(id);
  }
}

// ---- Graph ----------------------------------------------------------------------------------

void Runtime::Deps(StorageId id, std::vector<StorageId>* out) {
  out->clear();
  for (OpId op : rec(id).recipe)
    for (StorageId in : ops_[op].inputs)
      if (in != id && !ContainsValue(*out, in)) out->push_back(in);
}

void Runtime::Dependents(StorageId id, std::vector<StorageId>* out) {
  out->clear();
  for (OpId op_id : rec(id).readers) {
    for (StorageId o : ops_[op_id].outputs) {
      if (o == id) continue;
      const StorageRecord* r = storages_.Find(o);
      if (r != nullptr && ContainsValue(r->recipe, op_id) && !ContainsValue(*out, o)) out->push_back(o);
    }
  }
}

bool Runtime::HasEvictedDependent(StorageId id) {
  std::vector<StorageId> dependents;
  Dependents(id, &dependents);
  for (StorageId d : dependents)
    if (!rec(d).resident() || rec(d).rebuilding) return true;
  return false;
}

// ---- Pool -----------------------------------------------------------------------------------

bool Runtime::Eligible(const StorageRecord& r) const {
  return r.resident() && r.rematerializable() && r.pins == 0 && r.size > 0;
}

void Runtime::SyncPool(StorageId id) {
  StorageRecord& r = rec(id);
  bool in_pool = r.pool_index != UINT32_MAX;
  bool eligible = Eligible(r);
  if (eligible == in_pool) return;
  if (eligible) {
    r.pool_index = uint32_t(pool_.size());
    pool_.push_back(id);
    pool_bytes_ += r.size;
  } else {
    StorageId last = pool_.back();
    pool_[r.pool_index] = last;
    rec(last).pool_index = r.pool_index;
    pool_.pop_back();
    r.pool_index = UINT32_MAX;
    pool_bytes_ -= r.size;
  }
}

// ---- Victim search --------------------------------------------------------------------------

// Note [Evicted-neighbor hint]
// Most candidates have no evicted neighbor, and finding that out walks the recipe and reader
// ops: a cache miss per hop, ~0.8 us a candidate once the records outgrow the cache. So each
// storage carries `neighbor_evicted`, set on all its neighbors when one is evicted
// (EvictUnchecked is the only way a storage leaves residence; an evicted neighbor gets it too,
// for when it comes back) and cleared when a walk finds no evicted neighbor. It is sticky, never
// wrong when false: a storage only gains a neighbor by an op that reads or writes both, and that
// op makes both resident first. So a false flag means a neighborhood cost of 0 without a walk.
// CheckInvariants verifies it.
double Runtime::NeighborhoodCost(StorageId id) {
  const NeighborhoodKind kind = neighborhood_;
  if (kind == NeighborhoodKind::kNone) return 0;
  StorageRecord& self = rec(id);
  if (!self.neighbor_evicted) return 0;
  bool any_evicted = false;
  if (kind == NeighborhoodKind::kUnionFind) {
    absl::InlinedVector<EvictedComponents::Node, 8> roots;
    double cost = 0;
    auto visit = [&](StorageId n) {
      const StorageRecord& r = rec(n);
      ++stats_.neighborhood_visits;
      if (r.resident()) return;
      any_evicted = true;
      EvictedComponents::Node root = components_.Find(r.component);
      if (ContainsValue(roots, root)) return;
      roots.push_back(root);
      cost += components_.Cost(root);
    };
    ForEachNeighbor(id, visit);
    if (!any_evicted) self.neighbor_evicted = false;
    return cost;
  }
  // Exact e* (both directions) or evicted ancestors only: graph walks over evicted storages.
  double cost = 0;
  absl::flat_hash_set<uint64_t> seen;
  std::vector<StorageId> frontier, next;
  auto walk = [&](bool upward) {
    frontier.clear();
    if (upward) Deps(id, &frontier); else Dependents(id, &frontier);
    while (!frontier.empty()) {
      StorageId n = frontier.back();
      frontier.pop_back();
      ++stats_.neighborhood_visits;
      const StorageRecord& r = rec(n);
      if (r.resident() || !seen.insert(n.packed()).second) continue;
      any_evicted = true;
      cost += r.cost;
      if (upward) Deps(n, &next); else Dependents(n, &next);
      frontier.insert(frontier.end(), next.begin(), next.end());
    }
  };
  walk(/*upward=*/true);
  if (kind == NeighborhoodKind::kExact) {
    walk(/*upward=*/false);
    if (!any_evicted) self.neighbor_evicted = false;  // both directions were looked at
  }
  return cost;
}

double Runtime::ScoreUnchecked(StorageId id) {
  StorageRecord& r = rec(id);
  ++stats_.candidates_scored;
  ScoreInputs in;
  in.cost = r.cost;
  in.size = double(r.size);
  in.staleness = std::max(now_ - r.last_access, 0.0) + 1.0;
  in.neighborhood_cost = NeighborhoodCost(id);
  in.random = config_.heuristic == HeuristicKind::kRandom
                  ? std::uniform_real_distribution<double>(0, 1)(rng_)
                  : 0;
  double score = Score(config_.heuristic, in);
  if (config_.thrash_damping > 0 && r.recent_remats > 0) {
    double age = double(op_counter_ - r.last_remat_op) / double(config_.thrash_half_life_ops);
    score *= 1 + config_.thrash_damping * r.recent_remats * std::exp2(-age);
  }
  return score;
}

double Runtime::ScoreOf(StorageId id) { return ScoreUnchecked(id); }

bool Runtime::ChooseVictim(StorageId* victim) {
  size_t n = pool_.size();
  if (n == 0) return false;
  ++stats_.eviction_searches;
  double small = config_.small_storage_fraction * double(pool_bytes_) / double(n);
  double best = 0, best_small = 0;
  uint64_t best_unread_size = 0;
  StorageId best_id, best_small_id, best_unread_id;
  scored_.clear();
  auto consider = [&](StorageId id) {
    const StorageRecord& r = rec(id);
    if (r.locks > 0) return;
    if (AwaitsReader(r)) {  // Note [Results awaiting their reader]: last resort
      if (!best_unread_id.valid() || r.size > best_unread_size) best_unread_size = r.size, best_unread_id = id;
      return;
    }
    double score = ScoreUnchecked(id);
    if (double(r.size) < small) {
      if (!best_small_id.valid() || score < best_small) best_small = score, best_small_id = id;
      return;
    }
    scored_.push_back({score, id});
    if (!best_id.valid() || score < best) best = score, best_id = id;
  };
  size_t samples = std::max<size_t>(config_.min_samples,
                                    size_t(std::ceil(config_.sample_factor * std::sqrt(double(n)))));
  if (config_.max_samples > 0)
    samples = std::min<size_t>(samples, std::max(config_.max_samples, config_.min_samples));
  if (config_.search == SearchMode::kSampled && samples < n) {
    // The best candidates of earlier searches compete again (Note [Victim search]).
    for (StorageId id : carried_)
      if (storages_.Contains(id) && rec(id).pool_index != UINT32_MAX) consider(id);
    // Draw the whole sample first and prefetch its records: the scoring loop then finds them in
    // cache instead of taking a miss per candidate (the pool is in no useful memory order).
    std::uniform_int_distribution<size_t> pick(0, n - 1);
    sample_.clear();
    for (size_t i = 0; i < samples; ++i) {
      StorageId id = pool_[pick(rng_)];
      storages_.Prefetch(id);
      sample_.push_back(id);
    }
    for (StorageId id : sample_) consider(id);
    // Carry the runners-up (distinct, best first) into the next search. Only the head needs
    // sorting: a sample may hold a storage more than once, so the head is twice the carried
    // count, and all of it is sorted in the rare case that is still too few.
    auto carry = [&](size_t head) {
      carried_.clear();
      for (size_t i = 0; i < head && carried_.size() < kCarriedCandidates; ++i) {
        StorageId id = scored_[i].second;
        if (id != best_id && (carried_.empty() || carried_.back() != id)) carried_.push_back(id);
      }
    };
    const size_t head = std::min(scored_.size(), 2 * kCarriedCandidates + 1);
    if (head < scored_.size()) std::nth_element(scored_.begin(), scored_.begin() + head, scored_.end());
    std::sort(scored_.begin(), scored_.begin() + head);
    carry(head);
    if (carried_.size() < kCarriedCandidates && head < scored_.size()) {
      std::sort(scored_.begin(), scored_.end());
      carry(scored_.size());
    }
  }
  if (!best_id.valid()) {
    best_small_id = best_unread_id = StorageId{};
    for (size_t i = 0; i < n; ++i) consider(pool_[i]);
  }
  if (best_id.valid()) *victim = best_id;
  else if (best_small_id.valid()) *victim = best_small_id;
  else if (best_unread_id.valid()) *victim = best_unread_id;
  else return false;
  return true;
}

void Runtime::EvictUnchecked(StorageId id, bool eager) {
  StorageRecord& r = rec(id);
  r.state = StorageState::kEvicted;
  memory_ -= r.size;
  SyncPool(id);
  backend_->Release(id, r, /*permanently=*/false);
  EvictedComponents::Node node = components_.MakeSet(r.cost);
  r.component = node;
  ++evicted_count_;
  std::vector<StorageId>& neighbours = scratch_;
  auto join = [&] {
    for (StorageId n : neighbours) {
      StorageRecord& nr = rec(n);
      nr.neighbor_evicted = true;  // Note [Evicted-neighbor hint]: an evicted one may come back
      if (!nr.resident()) components_.Union(node, nr.component);
    }
  };
  Deps(id, &neighbours);
  join();
  Dependents(id, &neighbours);
  join();
  ++stats_.evictions;
  if (eager) ++stats_.eager_evictions;
  MaybeCompactComponents();
}

void Runtime::MaybeCompactComponents() {
  if (components_.node_count() < 2 * evicted_count_ + 4096) return;
  std::vector<StorageId> evicted;
  std::vector<EvictedComponents::Node> nodes;
  storages_.ForEach([&](StorageId id, const StorageRecord& r) {
    if (r.state == StorageState::kEvicted) {
      evicted.push_back(id);
      nodes.push_back(r.component);
    }
  });
  std::vector<EvictedComponents::Node> fresh = components_.Compact(nodes);
  for (size_t i = 0; i < evicted.size(); ++i) rec(evicted[i]).component = fresh[i];
}

absl::Status Runtime::Reserve(uint64_t bytes, absl::string_view what, absl::string_view subject) {
  if (config_.budget_bytes == kUnlimitedBudget) return absl::OkStatus();
  while (memory_ + bytes > config_.budget_bytes) {
    StorageId victim;
    if (!ChooseVictim(&victim)) return InfeasibleError(bytes, absl::StrCat(what, subject));
    EvictUnchecked(victim, /*eager=*/false);
  }
  return absl::OkStatus();
}

uint64_t Runtime::EvictAtLeast(uint64_t bytes) {
  uint64_t freed = 0;
  StorageId victim;
  while (freed < bytes && ChooseVictim(&victim)) {
    freed += rec(victim).size;
    EvictUnchecked(victim, /*eager=*/false);
  }
  return freed;
}

absl::Status Runtime::SetBudget(uint64_t budget_bytes) {
  if (budget_bytes == 0) return absl::InvalidArgumentError("budget must be positive");
  uint64_t old = config_.budget_bytes;
  config_.budget_bytes = budget_bytes;
  if (absl::Status s = Reserve(0, "the new budget"); !s.ok()) {
    config_.budget_bytes = old;
    return s;
  }
  return absl::OkStatus();
}

std::vector<Runtime::Candidate> Runtime::RankedCandidates(size_t max_count) {
  std::vector<Candidate> all;
  all.reserve(pool_.size());
  for (StorageId id : pool_) {
    const StorageRecord& r = rec(id);
    if (r.locks > 0) continue;
    // Note [Results awaiting their reader]: ranked after every other candidate.
    const double score = AwaitsReader(r) ? std::numeric_limits<double>::infinity() : ScoreUnchecked(id);
    all.push_back({id, score, r.size, r.handle});
  }
  size_t keep = std::min(max_count, all.size());
  std::partial_sort(all.begin(), all.begin() + keep, all.end(),
                    [](const Candidate& a, const Candidate& b) { return a.score < b.score; });
  all.resize(keep);
  return all;
}

absl::Status Runtime::Evict(StorageId id) {
  auto r = Lookup(id, "evict");
  if (!r.ok()) return r.status();
  if (!Eligible(**r) || (*r)->locks > 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "evict: ", IdString(id), " is not evictable (resident=", (*r)->resident(),
        " rematerializable=", (*r)->rematerializable(), " pins=", (*r)->pins, " locks=", (*r)->locks, ")"));
  EvictUnchecked(id, /*eager=*/false);
  return absl::OkStatus();
}

uint64_t Runtime::UnevictableBytes() const {
  uint64_t evictable = 0;
  for (StorageId id : pool_)
    if (storages_[id].locks == 0) evictable += storages_[id].size;
  return memory_ - evictable;
}

absl::Status Runtime::InfeasibleError(uint64_t bytes, absl::string_view what) const {
  uint64_t constant = 0, pinned = 0, locked = 0, tiny = 0;
  storages_.ForEach([&](StorageId, const StorageRecord& r) {
    if (!r.resident()) return;
    if (r.locks > 0) locked += r.size;
    else if (r.pins > 0) pinned += r.size;
    else if (!r.rematerializable()) constant += r.size;
    else if (r.size == 0) tiny += r.size;
  });
  uint64_t needed = memory_ + bytes;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "dtr: budget of %s is infeasible: %s need %s more, with %s resident of which nothing more "
      "can be evicted: %s locked by the operation in progress, %s pinned, %s constants "
      "(parameters, inputs, unreplayable results). A budget of at least %s would be needed at this "
      "point (more may be needed later).",
      FormatBytes(config_.budget_bytes), what, FormatBytes(bytes), FormatBytes(memory_),
      FormatBytes(locked), FormatBytes(pinned), FormatBytes(constant), FormatBytes(needed)));
}

// ---- Rematerialization ----------------------------------------------------------------------

absl::Status Runtime::Materialize(StorageId target) {
  if (rec(target).resident()) return absl::OkStatus();
  // One frame per storage being brought back; `stage` is the recipe op being replayed.
  struct Frame {
    StorageId id;
    size_t stage = 0;
    bool deps_locked = false;
    bool self_locked = false;
    std::vector<StorageId> deps;  // inputs of recipe[stage], locked while deps_locked
  };
  std::vector<Frame> stack;
  stack.push_back(Frame{target});
  auto unwind = [&](absl::Status status) {
    for (Frame& f : stack) {
      if (f.deps_locked)
        for (StorageId d : f.deps) Unlock(d);
      if (f.self_locked) {
        // A half-replayed recipe leaves no usable contents: drop them again.
        StorageRecord& r = rec(f.id);
        --r.locks;
        r.rebuilding = false;
        if (r.resident()) EvictUnchecked(f.id, /*eager=*/false);
      }
    }
    return status;
  };
  const size_t max_depth = storages_.size() + 1;
  while (!stack.empty()) {
    size_t top = stack.size() - 1;
    StorageId id = stack[top].id;
    if (!stack[top].deps_locked) {
      StorageRecord& r = rec(id);
      if (stack[top].stage == 0) {
        if (r.resident()) {
          stack.pop_back();
          continue;
        }
        if (!r.rematerializable())
          return unwind(absl::InternalError(
              absl::StrCat("dtr: ", IdString(id), " is evicted but has no recipe to replay")));
      }
      Frame& f = stack[top];
      f.deps.clear();
      for (StorageId in : ops_[r.recipe[f.stage]].inputs)
        if (in != id && !ContainsValue(f.deps, in)) f.deps.push_back(in);
      for (StorageId d : f.deps) Lock(d);
      f.deps_locked = true;
    }
    StorageId missing;
    for (StorageId d : stack[top].deps)
      if (!rec(d).resident()) {
        missing = d;
        break;
      }
    if (missing.valid()) {
      if (stack.size() > max_depth)
        return unwind(absl::InternalError("dtr: dependency cycle while rematerializing"));
      stack.push_back(Frame{missing});
      continue;
    }
    // Note [Rematerialization]: the inputs of this recipe op are resident and locked.
    Frame& f = stack[top];
    absl::Status s = f.stage == 0 ? ReplayFirstOp(id) : ReplayInPlaceOp(id, f.stage);
    if (!s.ok()) return unwind(s);
    ++f.stage;
    bool more = f.stage < rec(id).recipe.size();
    if (more && !f.self_locked) {
      // Keep the partly rebuilt contents, and mark them not final, before anything is unlocked
      // (unlocking may banish an input, which must not freeze a half-built storage).
      Lock(id);
      f.self_locked = true;
      rec(id).rebuilding = true;
    }
    for (StorageId d : f.deps) Unlock(d);
    f.deps_locked = false;
    if (more) continue;
    if (f.self_locked) {
      rec(id).rebuilding = false;
      Unlock(id);
    }
    stack.pop_back();
    if (absl::Status done = FinishRemat(id); !done.ok()) return unwind(done);
  }
  return absl::OkStatus();
}

absl::Status Runtime::ReplayFirstOp(StorageId id) {
  OpId first = rec(id).recipe[0];
  const OpRecord& op = ops_[first];
  // Evicted siblings produced by exactly this op come back too; the others are discarded again.
  absl::InlinedVector<bool, 4> keep(op.outputs.size(), false);
  uint64_t replay_bytes = 0;
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    StorageId o = op.outputs[i];
    const StorageRecord* r = storages_.Find(o);
    keep[i] = o == id || (r != nullptr && !r->resident() && r->recipe.size() == 1 && r->recipe[0] == first);
    replay_bytes += op.output_sizes[i];
  }
  if (absl::Status s = Reserve(replay_bytes, "rematerializing ", op.name); !s.ok()) return s;
  UpdatePeak(replay_bytes);
  absl::StatusOr<double> cost = backend_->Replay(first, op, absl::MakeConstSpan(keep));
  if (!cost.ok()) return cost.status();
  ++stats_.replays;
  stats_.remat_cost += *cost;
  AdvanceClock(*cost);
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    if (!keep[i]) continue;
    StorageId o = op.outputs[i];
    StorageRecord& r = rec(o);
    components_.AddCost(r.component, -r.cost);
    r.component = EvictedComponents::kNone;
    --evicted_count_;
    r.state = StorageState::kResident;
    memory_ += r.size;
    if (o != id) {
      if (absl::Status s = FinishRemat(o); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::ReplayInPlaceOp(StorageId id, size_t stage) {
  OpId op_id = rec(id).recipe[stage];
  bool keep_one[1] = {true};
  absl::StatusOr<double> cost = backend_->Replay(op_id, ops_[op_id], absl::MakeConstSpan(keep_one, 1));
  if (!cost.ok()) return cost.status();
  ++stats_.replays;
  stats_.remat_cost += *cost;
  AdvanceClock(*cost);
  return absl::OkStatus();
}

absl::Status Runtime::FinishRemat(StorageId id) {
  Touch(id);
  SyncPool(id);
  NoteRemat(id);
  return backend_->OnRematerialized(id, rec(id));
}

void Runtime::NoteRemat(StorageId id) {
  StorageRecord& r = rec(id);
  double age = double(op_counter_ - r.last_remat_op) / double(config_.thrash_half_life_ops);
  r.recent_remats = r.recent_remats * std::exp2(-age) + 1;
  r.last_remat_op = op_counter_;
  ++r.remat_count;
  ++stats_.rematerializations;
  if (r.recent_remats >= config_.thrash_report_threshold &&
      r.recent_remats - 1 < config_.thrash_report_threshold)
    ++stats_.thrash_events;
}

// ---- Deallocation ---------------------------------------------------------------------------

void Runtime::OnUnreferenced(StorageId id) {
  StorageRecord& r = rec(id);
  if (r.external_refs > 0) return;
  if (r.locks > 0 || r.pins > 0) {
    r.release_pending = true;  // applied when the last lock goes (Unlock / Unpin)
    return;
  }
  if (r.readers.empty()) {
    MaybeCollect(id);
    return;
  }
  if (!r.rematerializable()) {
    r.banish_pending = false;  // a frozen storage waiting to be banished is released here
    ReleaseDeadConstant(id);
    return;
  }
  if (config_.dealloc == DeallocPolicy::kBanish) {
    if (HasEvictedDependent(id)) {
      r.banish_pending = true;
    } else {
      Banish(id);
    }
    return;
  }
  if (Eligible(r)) EvictUnchecked(id, /*eager=*/true);
}

void Runtime::Banish(StorageId id) {
  // Every resident dependent loses the ability to be recomputed: it becomes a constant.
  std::vector<StorageId> dependents;
  Dependents(id, &dependents);
  for (StorageId d : dependents) Detach(d);
  StorageRecord& r = rec(id);
  r.banish_pending = false;
  ++stats_.banishments;
  // With no readers left it is collected right away (memory released permanently).
  MaybeCollect(id);
}

void Runtime::Detach(StorageId id) {
  StorageRecord& r = rec(id);
  if (!r.rematerializable()) return;
  ClearRecipe(id);
  ++stats_.detached;
  // Frozen with nobody holding it: Note [Dead constants in accumulating recipes].
  const StorageRecord* now = storages_.Find(id);
  if (now != nullptr && now->external_refs == 0 && now->locks == 0 && now->pins == 0 && now->resident())
    ReleaseDeadConstant(id);
}

constexpr uint64_t kDeadConstantRatio = 4;

// Note [Dead constants in accumulating recipes]
// A storage updated in place step after step keeps every in-place op in its recipe (Note
// [Mutation]): an SGD momentum buffer's recipe is clone(g0), mul_, add_(g1), mul_, add_(g2), ...
// Each step's gradient dies, but the buffer's recipe still reads it, and a dead storage that
// cannot be recomputed (a constant, or one frozen by a later mutation) stays resident as long
// as some recipe reads it. So memory grew by one set of gradients per step, forever. A dead
// constant read by in-place recipe ops is therefore released: each storage accumulating through
// such an op that is resident is frozen instead (it becomes a constant, as its contents are
// right), which drops its recipe and with it the last readers of the dead constant. An evicted
// accumulator keeps its recipe (bringing it back only to freeze it costs memory now), and
// functional readers (activations) keep theirs: they die with their step. Dead constants much
// smaller than the accumulator (under 1/kDeadConstantRatio of it) are kept: freezing a momentum
// buffer for an 8-byte scalar made two training threads run out of their budget.
void Runtime::ReleaseDeadConstant(StorageId id) {
  const uint64_t size = rec(id).size;
  std::vector<StorageId> accumulators;
  for (OpId op_id : rec(id).readers) {
    const OpRecord& op = ops_[op_id];
    if (!op.in_place) continue;
    for (StorageId o : op.outputs) {
      const StorageRecord* out = storages_.Find(o);
      // Freezing trades the accumulator's evictability for the dead bytes: worth it for a
      // gradient, not for a Python scalar (buf.mul_(0.9) reads an 8-byte constant).
      // Never one being rebuilt or used right now (a replay frame holds it).
      if (out != nullptr && out->resident() && out->locks == 0 && !out->rebuilding &&
          size * kDeadConstantRatio >= out->size &&
          !ContainsValue(accumulators, o))
        accumulators.push_back(o);
    }
  }
  for (StorageId o : accumulators) Detach(o);
  MaybeCollect(id);
}

void Runtime::ClearRecipe(StorageId id) {
  StorageRecord& r = rec(id);
  absl::InlinedVector<OpId, 2> recipe;
  recipe.swap(r.recipe);
  r.cost = 0;
  SyncPool(id);
  for (OpId op_id : recipe) {
    OpRecord& op = ops_[op_id];
    if (--op.recipe_users > 0) continue;
    for (StorageId in : op.inputs) {
      StorageRecord* in_rec = storages_.Find(in);
      if (in_rec == nullptr) continue;
      EraseValue(in_rec->readers, op_id);
      if (in_rec->readers.empty()) MaybeCollect(in);
    }
    backend_->OnOpDropped(op_id, op);
    ops_.Erase(op_id);
  }
}

void Runtime::MaybeCollect(StorageId id) {
  StorageRecord* r = storages_.Find(id);
  if (r == nullptr || r->deletion_pending) return;
  if (r->external_refs > 0 || r->locks > 0 || r->pins > 0 || !r->readers.empty()) return;
  r->deletion_pending = true;
  collect_worklist_.push_back(id);
}

void Runtime::DrainCollection() {
  while (!collect_worklist_.empty()) {
    StorageId id = collect_worklist_.back();
    collect_worklist_.pop_back();
    StorageRecord& r = rec(id);
    if (r.external_refs > 0 || r.locks > 0 || r.pins > 0 || !r.readers.empty()) {
      r.deletion_pending = false;
      continue;
    }
    if (r.state == StorageState::kEvicted) {
      components_.AddCost(r.component, -r.cost);
      --evicted_count_;
    } else {
      memory_ -= r.size;
      backend_->Release(id, r, /*permanently=*/true);
    }
    r.state = StorageState::kBanished;
    ClearRecipe(id);  // may queue inputs
    ++stats_.collected;
    storages_.Erase(id);
  }
}

// ---- Invariants -----------------------------------------------------------------------------

absl::Status Runtime::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat("invariant: ", parts...)); };
  uint64_t resident_sum = 0, pool_sum = 0, evicted = 0;
  size_t eligible = 0;
  absl::flat_hash_map<uint64_t, uint32_t> recipe_users;
  absl::flat_hash_map<uint32_t, double> component_cost;
  absl::Status status;
  storages_.ForEach([&](StorageId id, const StorageRecord& r) {
    if (!status.ok()) return;
    if (r.locks != 0) status = fail(IdString(id), " holds ", r.locks, " locks between operations");
    if (r.state == StorageState::kBanished) status = fail(IdString(id), " is banished but still recorded");
    if (r.resident()) {
      resident_sum += r.size;
      if (r.component != EvictedComponents::kNone) status = fail(IdString(id), " resident with a component");
      if (!r.neighbor_evicted) {  // Note [Evicted-neighbor hint]
        // Dropped ops are skipped here and reported by the recipe and reader checks below.
        ForEachNeighbor(id, [&](StorageId n) {
          const StorageRecord* nr = storages_.Find(n);
          if (nr != nullptr && !nr->resident())
            status = fail(IdString(id), " has evicted neighbor ", IdString(n), " but no hint");
        });
      }
    } else {
      ++evicted;
      if (!r.rematerializable()) status = fail(IdString(id), " evicted without a recipe");
      if (r.pins > 0) status = fail(IdString(id), " evicted while pinned");
      if (r.component == EvictedComponents::kNone) status = fail(IdString(id), " evicted without a component");
      else component_cost[components_.Find(r.component)] += r.cost;
    }
    bool eligible_now = r.resident() && r.rematerializable() && r.pins == 0 && r.size > 0;
    if (eligible_now) {
      ++eligible;
      pool_sum += r.size;
      if (r.pool_index >= pool_.size() || pool_[r.pool_index] != id)
        status = fail(IdString(id), " evictable but not in the pool at its index");
    } else if (r.pool_index != UINT32_MAX) {
      status = fail(IdString(id), " in the pool but not evictable");
    }
    double cost = 0;
    for (OpId op_id : r.recipe) {
      const OpRecord* op = ops_.Find(op_id);
      if (op == nullptr) {
        status = fail(IdString(id), " recipe names a dropped op");
        return;
      }
      cost += op->cost;
      ++recipe_users[op_id.packed()];
      if (!ContainsValue(op->outputs, id)) status = fail(IdString(id), " recipe op does not write it");
      for (StorageId in : op->inputs) {
        const StorageRecord* in_rec = storages_.Find(in);
        if (in_rec == nullptr) status = fail(IdString(id), " depends on collected ", IdString(in));
        else if (!ContainsValue(in_rec->readers, op_id)) status = fail(IdString(in), " misses reader ", op->name);
      }
    }
    if (std::abs(cost - r.cost) > 1e-9 * std::max(1.0, cost)) status = fail(IdString(id), " cost is stale");
    for (OpId reader : r.readers) {
      const OpRecord* op = ops_.Find(reader);
      if (op == nullptr || !ContainsValue(op->inputs, id)) status = fail(IdString(id), " has a stale reader");
    }
  });
  if (!status.ok()) return status;
  ops_.ForEach([&](OpId id, const OpRecord& op) {
    auto it = recipe_users.find(id.packed());
    uint32_t users = it == recipe_users.end() ? 0 : it->second;
    if (users == 0 || users != op.recipe_users)
      status = fail("op ", op.name, " recipe_users=", op.recipe_users, " but used by ", users);
  });
  if (!status.ok()) return status;
  if (resident_sum != memory_) return fail("memory ", memory_, " != resident sum ", resident_sum);
  if (config_.budget_bytes != kUnlimitedBudget && memory_ > config_.budget_bytes)
    return fail("memory ", memory_, " over budget ", config_.budget_bytes);
  if (eligible != pool_.size() || pool_sum != pool_bytes_)
    return fail("pool has ", pool_.size(), " entries / ", pool_bytes_, " bytes, expected ", eligible, " / ", pool_sum);
  if (evicted != evicted_count_) return fail("evicted count ", evicted_count_, " != ", evicted);
  // Note [Evicted components]: each set's cost is the sum over its evicted members.
  for (const auto& [root, cost] : component_cost) {
    double have = components_.Cost(root);
    if (std::abs(have - cost) > 1e-6 * std::max(1.0, std::abs(cost)))
      return fail("component ", root, " cost ", have, " != members' sum ", cost);
  }
  if (!collect_worklist_.empty()) return fail("collection worklist not drained");
  return absl::OkStatus();
}

}  // namespace dtr
