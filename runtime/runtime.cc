// The DTR runtime's core: creating it, the op entry points (recording computed and constant
// storages; access, references and pins), the clock, the peak and the memory floor, and the
// invariant check. The rest of class Runtime (runtime.h) is split by concept: record lifetime
// and collection (lifetime.cc), neighborhoods and evicted components (neighborhoods.cc), the
// evictable pool, victim search, eviction and the budget (eviction_search.cc), the
// rematerialization stack (remat.cc), and the rules for in-place ops (mutation.cc).
#include "runtime/runtime.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "runtime/heuristic.h"
#include "runtime/runtime_internal.h"

namespace dtr {

// Note [Recipes]
// A storage's recipe is the list of ops that produce its current contents: the op that created
// it, then every in-place op applied to it since (Note [Mutation]). deps(S) are the inputs of the
// recipe's ops other than S; the dependents of S are the outputs T != S of S's readers whose
// recipe contains that reader. A storage with an empty recipe is a constant: never evicted.
// Every op in a live recipe is listed in the `readers` of each of its inputs, and its
// `recipe_users` counts the storages whose recipe contains it.
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

using runtime_internal::ContainsValue;
using runtime_internal::IdString;

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeConfig& config,
                                                         ReplayBackend* backend) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (backend == nullptr) return absl::InvalidArgumentError("Runtime needs a ReplayBackend");
  return std::unique_ptr<Runtime>(new Runtime(config, backend));
}

Runtime::Runtime(const RuntimeConfig& config, ReplayBackend* backend)
    : config_(config), backend_(backend), neighborhood_(InfoFor(config.heuristic).neighborhood),
      window_decay_(std::exp2(-1.0 / double(config.recompute_half_life_ops))), rng_(config.seed) {}

const RuntimeStats& Runtime::stats() const {
  stats_.memory_bytes = memory_;
  return stats_;
}

absl::StatusOr<StorageRecord*> Runtime::Lookup(StorageId id, absl::string_view what) {
  StorageRecord* r = storages_.Find(id);
  if (r == nullptr) return UnknownStorage(id, what);
  return r;
}

absl::Status Runtime::UnknownStorage(StorageId id, absl::string_view what) const {
  return absl::NotFoundError(absl::StrCat(what, ": unknown or already collected ", IdString(id)));
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

// Note [Next use in a backward pass] (eviction_search.cc)
void Runtime::NoteOpStart(bool backward, absl::Span<const StorageId> inputs) {
  if (!backward) {
    in_backward_pass_ = false;
    // Note [Gradients that keep dead constants] (lifetime.cc)
    if (config_.freeze_held_results) FreezeGradientsKeepingDeadConstants(inputs);
    return;
  }
  if (!in_backward_pass_) {
    in_backward_pass_ = true;
    backward_mirror_ = now_;
    backward_reach_ = now_;
  }
  // The pass is followed either way; the mirror moves only for Note [Next use in a backward pass],
  // and so does the reach (Note [Held results of dead inputs]).
  if (config_.backward_next_use <= 0) return;
  double latest = -1, latest_resident = -1;
  for (StorageId in : inputs) {
    const StorageRecord* r = storages_.Find(in);
    if (r == nullptr || !r->awaits_backward) continue;
    latest = std::max(latest, r->last_access);
    if (r->resident()) latest_resident = std::max(latest_resident, r->last_access);
  }
  if (latest_resident >= 0) backward_mirror_ = std::min(backward_mirror_, latest_resident);
  if (latest >= 0) backward_reach_ = std::min(backward_reach_, latest);
}

void Runtime::NoteBackwardAccesses(absl::Span<const StorageId> accessed) {
  for (StorageId id : accessed) {
    StorageRecord& r = rec(id);
    if (!r.awaits_backward) continue;
    r.awaits_backward = false;
    SetPoolFlag(r, PoolEntry::kAwaitsBackward, false);  // Note [One flag, one write]
  }
}

void Runtime::UpdatePeak(uint64_t transient) {
  stats_.peak_memory_bytes = std::max(stats_.peak_memory_bytes, memory_ + transient);
}

// Note [Memory floor]
// While an op runs, its inputs and outputs must be resident, and so must everything no eviction
// can free (constants, pins). Their sum at the worst op is a budget below which this run cannot
// go whatever the heuristic does (given which storages the program made constants): dtr-sim
// reports it next to the smallest budget that trained, to tell a weak policy from a hard limit.
// Results this runtime froze by its own choice (Note [Held results of dead inputs]) count as
// evictable: a schedule that kept their recipes could evict them; so do the dying inputs it kept
// instead (Note [Kept inputs of held results]).
void Runtime::NoteFloor(const InputList& inputs, uint64_t out_bytes) {
  // memory_ - pool_bytes_: unevictable bytes
  uint64_t floor = memory_ - pool_bytes_ - held_result_bytes_ + out_bytes;
  for (StorageId in : inputs) {
    const StorageRecord& r = rec(in);
    if (r.pool_index != UINT32_MAX || FrozenByChoice(r.constant_reason)) floor += r.size;
  }
  stats_.floor_bytes = std::max(stats_.floor_bytes, floor);
}

// Note [Scratch memory]
// Many kernels allocate a workspace and free it before they return: CPU convolution's unfolded
// columns, cuDNN's and cuBLAS's workspaces, a reduction's partial sums. While the op runs the
// budget must hold it beside the op's inputs and outputs, so it is part of the op's working set
// (the largest op, the memory floor, the peak), but afterwards there is nothing to evict. The
// torch layer measures it for every op (the allocator's high-water mark during the op above
// what the op started and ended with, Engine::ScratchMeter) and writes it into traces
// (`scratch=BYTES`, Note [Trace format]); a call that knows it beforehand (dtr-sim replaying a
// trace) makes room for it with the outputs, and an op that learns it while running reports it
// (ReportScratch). Either way the op's record keeps it and a replay makes room for it first.
// In real runs the allocator enforces the budget, so a workspace is made room for when it is
// allocated; what this changes there is the statistics. In dtr-sim it is the difference between
// a budget that holds the workspaces and one that does not: see the measurements in
// runtime/README.md ("Scratch memory").
void Runtime::NoteOpBytes(const InputList& inputs, uint64_t out_bytes, uint64_t scratch_bytes) {
  NoteLargestOp(inputs, out_bytes + scratch_bytes);
  NoteFloor(inputs, out_bytes + scratch_bytes);
}

void Runtime::NoteLargestOp(const InputList& inputs, uint64_t other_bytes) {
  for (StorageId in : inputs) other_bytes += rec(in).size;
  stats_.largest_op_bytes = std::max(stats_.largest_op_bytes, other_bytes);
}

uint64_t Runtime::MeasuredScratch(const InputList& inputs, uint64_t out_bytes, uint64_t known) {
  const uint64_t reported = std::exchange(reported_scratch_, 0);
  if (reported <= known) return known;
  // Learned while the op ran. Its outputs are in memory_ already and not in the pool yet, so the
  // floor counts them without being told, as NoteOpBytes did before the op ran.
  UpdatePeak(reported);
  NoteFloor(inputs, reported);
  NoteLargestOp(inputs, out_bytes + reported);
  return reported;
}

// ---- Recording ------------------------------------------------------------------------------

absl::StatusOr<StorageId> Runtime::AddConstant(uint64_t size, uint64_t handle) {
  if (absl::Status s = Reserve(size, "a constant"); !s.ok()) return s;
  StorageRecord* r;
  StorageId id = storages_.Emplace(&r);
  r->size = size;
  r->external_refs = 1;
  r->handle = handle;
  r->last_access = now_;
  r->constant_reason = ConstantReason::kAdded;
  memory_ += size;
  UpdatePeak(0);
  ++stats_.constants;
  return id;
}

template <typename Each>
absl::Status Runtime::AppendDistinct(absl::string_view op_name, absl::Span<const StorageId> ids, InputList* distinct,
                                     Each&& each) {
  for (StorageId in : ids) {
    const StorageRecord* r = storages_.Find(in);  // each record found once
    if (ABSL_PREDICT_FALSE(r == nullptr)) return Lookup(in, absl::StrCat("input of ", op_name)).status();
    if (ContainsValue(*distinct, in)) continue;
    if (absl::Status s = each(in, *r); ABSL_PREDICT_FALSE(!s.ok())) return s;
    distinct->push_back(in);
  }
  return absl::OkStatus();
}

absl::Status Runtime::LockAndMaterialize(absl::string_view op_name, absl::Span<const StorageId> ids,
                                         InputList* distinct) {
  // An unknown id fails before anything is locked.
  bool all_resident = true;
  if (absl::Status s = AppendDistinct(op_name, ids, distinct,
                                      [&](StorageId, const StorageRecord& r) {
                                        all_resident = all_resident && r.resident();
                                        return absl::OkStatus();
                                      });
      !s.ok())
    return s;
  const auto missing = [&](StorageId in) { return !rec(in).resident(); };
  if (all_resident || config_.input_locking == InputLocking::kEager) {
    // Locked before any is brought back, so that bringing one back cannot evict another.
    for (StorageId in : *distinct) Lock(in);
    if (all_resident) return absl::OkStatus();  // nearly every op
    for (StorageId in : *distinct) {
      if (rec(in).resident()) continue;  // cheaper than Materialize's call
      if (absl::Status s = Materialize(in); !s.ok()) {
        UnlockAll(*distinct);
        return s;
      }
    }
    return absl::OkStatus();
  }
  // Note [Lazy input locks]: each input is locked once it is back; until then it is a victim of
  // last resort, and brought back again if a replay had to evict it meanwhile.
  for (StorageId in : *distinct) Await(in);
  absl::InlinedVector<bool, 4> held(distinct->size(), false);
  auto done = [&](absl::Status status) {
    for (size_t i = 0; i < distinct->size(); ++i) {
      if (status.ok() && !held[i]) Lock((*distinct)[i]);
      if (!status.ok() && held[i]) Unlock((*distinct)[i]);
      Unawait((*distinct)[i]);
    }
    if (!status.ok()) DrainCollection();
    return status;
  };
  for (;;) {
    auto next = std::find_if(distinct->begin(), distinct->end(), missing);
    if (next == distinct->end()) return done(absl::OkStatus());
    if (absl::Status s = Materialize(*next); !s.ok()) return done(s);
    Lock(*next);
    held[next - distinct->begin()] = true;
  }
}

void Runtime::UnlockAll(const InputList& ids) {
  for (StorageId in : ids) Unlock(in);
  DrainCollection();
}

absl::Status Runtime::DistinctHeld(absl::string_view op_name, absl::Span<const StorageId> ids, InputList* distinct) {
  return AppendDistinct(op_name, ids, distinct, [&](StorageId in, const StorageRecord& r) {
    if (ABSL_PREDICT_TRUE(r.resident() && r.locks > 0)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("input ", IdString(in), " of ", op_name, " is not held (resident and locked) as the call says"));
  });
}

absl::StatusOr<Runtime::OutputIds> Runtime::Compute(const OpCall& call, ExecuteFn execute) {
  NoteOpStart(call.backward, call.inputs);
  InputList inputs;
  if (absl::Status s = call.inputs_held ? DistinctHeld(call.name, call.inputs, &inputs)
                                        : LockAndMaterialize(call.name, call.inputs, &inputs);
      !s.ok())
    return s;
  // Held inputs stay locked by the caller.
  auto unlock_inputs = [&] {
    if (call.inputs_held) DrainCollection();
    else UnlockAll(inputs);
  };
  uint64_t out_bytes = 0;
  for (uint64_t size : call.output_sizes) out_bytes += size;
  NoteOpBytes(inputs, out_bytes, call.scratch_bytes);
  // Note [Scratch memory]: room for the workspace too, while the inputs are locked.
  if (absl::Status s = Reserve(out_bytes + call.scratch_bytes,
                               call.scratch_bytes > 0 ? "outputs and workspace of " : "outputs of ", call.name);
      !s.ok()) {
    unlock_inputs();
    return s;
  }

  OutputIds outputs;
  for (uint64_t size : call.output_sizes) {
    StorageRecord* r;
    outputs.push_back(storages_.Emplace(&r));
    r->size = size;
    r->external_refs = 1;
    // Note [Next use in a backward pass]: set here, so the pool entry SyncPool makes carries it.
    r->awaits_backward = !call.backward && config_.backward_next_use > 0;
  }
  memory_ += out_bytes;
  UpdatePeak(call.scratch_bytes);

  reported_scratch_ = 0;
  absl::StatusOr<double> cost = execute(absl::MakeConstSpan(outputs));
  if (!cost.ok()) {
    for (StorageId out : outputs) storages_.Erase(out);
    memory_ -= out_bytes;
    unlock_inputs();
    return cost.status();
  }
  const uint64_t scratch = MeasuredScratch(inputs, out_bytes, call.scratch_bytes);
  AdvanceClock(*cost);
  ++stats_.ops_recorded;
  stats_.base_cost += *cost;
  NoteBaseCost(*cost);

  if (call.replayable && !outputs.empty()) {
    const absl::string_view name = call.name_interned ? call.name : InternName(call.name);
    OpRecord* op;
    const OpId op_id = ops_.Emplace(&op);
    op->name = name;
    op->inputs.assign(inputs.begin(), inputs.end());
    op->outputs.assign(outputs.begin(), outputs.end());
    op->output_sizes.assign(call.output_sizes.begin(), call.output_sizes.end());
    op->cost = *cost;
    op->scratch_bytes = scratch;
    op->handle = call.handle;
    op->recipe_users = uint32_t(outputs.size());
    op->backward = call.backward;
    op->copies_input = call.copies_input && inputs.size() == 1 && outputs.size() == 1;
    uint32_t depth = 1;
    for (StorageId in : inputs) {
      StorageRecord& in_rec = rec(in);
      in_rec.readers.push_back(op_id);
      SyncAwaitsReaderFlag(in_rec);  // read now
      if (in_rec.rematerializable()) depth = std::max(depth, in_rec.replay_depth + 1);
    }
    for (StorageId out : outputs) {
      StorageRecord& r = rec(out);
      r.recipe.push_back(op_id);
      r.cost = *cost;
      r.replay_depth = depth;
      r.backward_recipe = call.backward;  // Note [Results of the backward pass]
    }
    if (depth > config_.max_replay_depth) {
      // Note [Bounded replay chains]
      for (StorageId out : outputs) Detach(out, ConstantReason::kReplayDepth);
      stats_.depth_limited += outputs.size();
    }
  } else {
    stats_.constants += outputs.size();
    for (StorageId out : outputs) rec(out).constant_reason = ConstantReason::kUnreplayableOp;
  }
  for (StorageId out : outputs) {
    Touch(out);
    SyncPool(out);
  }
  for (StorageId in : inputs) Touch(in);
  if (call.backward && config_.backward_next_use > 0) NoteBackwardAccesses(inputs);
  unlock_inputs();
  return outputs;
}

absl::Status Runtime::Access(StorageId id, double cost) {
  if (ABSL_PREDICT_FALSE(!storages_.Contains(id))) return UnknownStorage(id, "access");
  Lock(id);
  absl::Status s = Materialize(id);
  if (s.ok()) NoteAccess(id, cost);
  Unlock(id);
  DrainCollection();
  return s;
}

void Runtime::AccessHeld(StorageId id) {
  if (ABSL_PREDICT_FALSE(!storages_.Contains(id))) return;
  NoteAccess(id, 0);
  DrainCollection();
}

void Runtime::NoteAccess(StorageId id, double cost) {
  AdvanceClock(cost);
  stats_.base_cost += cost;
  window_base_cost_ += cost;
  replays_for_op_ = 0;  // Note [Thrashing rematerializations]
  Touch(id);
}

absl::Status Runtime::AddRef(StorageId id) {
  StorageRecord* r = storages_.Find(id);
  if (ABSL_PREDICT_FALSE(r == nullptr)) return UnknownStorage(id, "add reference");
  ++r->external_refs;
  SyncAwaitsReaderFlag(*r);
  return absl::OkStatus();
}

absl::Status Runtime::DropRef(StorageId id) {
  StorageRecord* r = storages_.Find(id);
  if (ABSL_PREDICT_FALSE(r == nullptr)) return UnknownStorage(id, "drop reference");
  if (r->external_refs == 0)
    return absl::FailedPreconditionError(absl::StrCat("drop reference: ", IdString(id), " has none"));
  if (--r->external_refs == 0) {
    SyncAwaitsReaderFlag(*r);
    OnUnreferenced(id);
  }
  DrainCollection();
  return absl::OkStatus();
}

absl::Status Runtime::LockAndBringBack(StorageId id, bool* brought_back) {
  Lock(id);
  *brought_back = !rec(id).resident();
  return Materialize(id);
}

absl::Status Runtime::Pin(StorageId id) {
  if (auto r = Lookup(id, "pin"); !r.ok()) return r.status();
  bool brought_back;
  absl::Status s = LockAndBringBack(id, &brought_back);
  Unlock(id);
  if (s.ok()) {
    // Pinning is the program's use (its data is handed out), so a storage it brings back is
    // touched, as the op that needed it would (Note [Staleness of replayed storages]).
    if (brought_back) Touch(id);
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

// Note [Operands held for an op]
// The torch layer runs an op before it records it (Note [Recording without knowing the
// outputs], hooks/fallback.cc), so its operands must be resident and unevictable while it runs,
// and the op's allocations may evict anything else. A pin did that, but a pinned storage leaves
// the evictable pool and comes back at its end (Note [Evictable pool]), two moves per operand of
// every op, and the pool's order then differed from the simulator's, where an op's inputs are
// only locked. An operand is held by a lock instead, as Compute then locks it: it stays in the
// pool, skipped while locked (Note [Candidate table]). The rest is Pin's: it is brought back if
// evicted, under the lock, and touched then (Note [Staleness of replayed storages]); a release
// deferred while it was held applies once the last lock goes (Unlock). Measured (callgrind, the
// small-op loop of bench/op_overhead.py): about 0.8k instructions an op less than pins
// (bench/results/runtime.md, "Per-op bookkeeping"). Compute then reads held inputs as they are
// (OpCall::inputs_held: checked, not locked and unlocked a second time).
absl::Status Runtime::HoldOperand(StorageId id) {
  if (ABSL_PREDICT_FALSE(!storages_.Contains(id))) return UnknownStorage(id, "hold");
  bool brought_back;
  absl::Status s = LockAndBringBack(id, &brought_back);
  if (!s.ok()) Unlock(id);
  else if (brought_back) Touch(id);
  DrainCollection();
  return s;
}

void Runtime::ReleaseOperand(StorageId id) {
  if (!storages_.Contains(id)) return;
  Unlock(id);
  DrainCollection();
}

absl::Status Runtime::SetHandle(StorageId id, uint64_t handle) {
  StorageRecord* r = storages_.Find(id);
  if (ABSL_PREDICT_FALSE(r == nullptr)) return UnknownStorage(id, "set handle");
  r->handle = handle;
  return absl::OkStatus();
}

absl::Status Runtime::AddOpCost(OpId id, double delta) {
  OpRecord* op = ops_.Find(id);
  if (op == nullptr) return absl::NotFoundError(absl::StrCat("op ", id.packed(), " is no longer recorded"));
  // An op's cost never goes below 0; what its storages, the statistics and the window gain is
  // what the op gained, so a storage whose recipe has other ops keeps the sum of their costs
  // (CheckInvariants) when a correction is larger than this op's cost.
  const double old_cost = op->cost;
  op->cost = std::max(0.0, op->cost + delta);
  delta = op->cost - old_cost;
  for (StorageId out : op->outputs) {
    StorageRecord* r = storages_.Find(out);
    if (r == nullptr || std::find(r->recipe.begin(), r->recipe.end(), id) == r->recipe.end()) continue;
    const double before = r->cost;
    r->cost = std::max(0.0, r->cost + delta);
    RefreshPoolEntry(*r);
    if (r->state == StorageState::kEvicted && r->component != EvictedComponents::kNone && r->cost != before) {
      components_.AddCost(r->component, r->cost - before);
      NoteEvictedRegionChanged(*r);  // Note [Exact neighborhood cost cache]
    }
  }
  stats_.base_cost += delta;
  window_base_cost_ = std::max(0.0, window_base_cost_ + delta);
  return absl::OkStatus();
}

void Runtime::Lock(StorageId id) {
  StorageRecord& r = rec(id);
  if (r.locks++ == 0) SetPoolFlag(r, PoolEntry::kLocked, true);  // Note [One flag, one write]
}

void Runtime::Unlock(StorageId id) {
  StorageRecord& r = rec(id);
  if (--r.locks == 0) SetPoolFlag(r, PoolEntry::kLocked, false);
  // Only a release that was deferred while locked applies now: a storage brought back for a
  // dependent stays resident like any other (evicting it on unlock made replays cascade).
  if (r.locks == 0 && r.external_refs == 0 && r.pins == 0 && (r.release_pending || r.banish_pending)) {
    r.release_pending = false;
    OnUnreferenced(id);
  }
}

// ---- Invariants -----------------------------------------------------------------------------

absl::Status Runtime::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat("invariant: ", parts...)); };
  uint64_t resident_sum = 0, pool_sum = 0, evicted = 0, held_result_sum = 0;
  size_t eligible = 0;
  absl::flat_hash_map<uint64_t, uint32_t> recipe_users;
  absl::flat_hash_map<uint32_t, double> component_cost;
  absl::flat_hash_set<uint64_t> queued_joins;  // Note [Joins at the next search]
  for (StorageId id : joins_pending_) queued_joins.insert(id.packed());
  absl::Status status;
  storages_.ForEach([&](StorageId id, const StorageRecord& r) {
    if (!status.ok()) return;
    if (r.locks != 0) status = fail(IdString(id), " holds ", r.locks, " locks between operations");
    if (r.waits != 0) status = fail(IdString(id), " is awaited by ", r.waits, " ops between operations");
    if (r.pending_reads != 0)  // Note [Inputs a rematerialization will read]
      status = fail(IdString(id), " is read by ", r.pending_reads, " pending replays between operations");
    if (r.state == StorageState::kBanished) status = fail(IdString(id), " is banished but still recorded");
    if (r.resident()) {
      resident_sum += r.size;
      if (FrozenByChoice(r.constant_reason)) held_result_sum += r.size;
      if (r.component != EvictedComponents::kNone) status = fail(IdString(id), " resident with a component");
      if (r.join_pending) status = fail(IdString(id), " resident but awaiting the join of an eviction");
      if (!r.neighbor_evicted) {  // Note [Evicted-neighbor hint]
        // Dropped ops are skipped here and reported by the recipe and reader checks below.
        ForEachNeighbor(id, [&](StorageId n) {
          const StorageRecord* nr = storages_.Find(n);
          // Note [Joins at the next search]: a neighbor evicted at its death tells it later.
          if (nr != nullptr && !nr->resident() && !nr->join_pending)
            status = fail(IdString(id), " has evicted neighbor ", IdString(n), " but no hint");
        });
      }
    } else {
      ++evicted;
      if (!r.rematerializable()) status = fail(IdString(id), " evicted without a recipe");
      if (r.join_pending && !queued_joins.contains(id.packed()))  // Note [Joins at the next search]
        status = fail(IdString(id), " awaits its join but is not queued");
      if (r.pins > 0) status = fail(IdString(id), " evicted while pinned");
      if (r.component == EvictedComponents::kNone) status = fail(IdString(id), " evicted without a component");
      else component_cost[components_.Find(r.component)] += r.cost;
    }
    if (r.rematerializable() != (r.constant_reason == ConstantReason::kNone))  // Note [Constants by reason]
      status = fail(IdString(id), r.rematerializable() ? " has a recipe and a constant reason "
                                                       : " is a constant without a reason");
    bool eligible_now = r.resident() && r.rematerializable() && r.pins == 0 && r.size > 0;
    if (eligible_now) {
      ++eligible;
      pool_sum += r.size;
      if (r.pool_index >= pool_.size() || pool_[r.pool_index].id != id) {
        status = fail(IdString(id), " evictable but not in the pool at its index");
      } else {  // Note [Candidate table]: the entry mirrors the record
        // (Locks are 0 between operations, so kLocked is checked clear; the size against the
        // record's, so a size the entry cannot hold is caught too.)
        const PoolEntry& have = pool_[r.pool_index];
        PoolEntry want;
        FillPoolEntry(r, &want);
        if (have.cost != want.cost || have.last_access != want.last_access || have.size != r.size ||
            have.flags != want.flags)
          status = fail(IdString(id), " pool entry is stale: cost ", have.cost, "/", want.cost, " last access ",
                        have.last_access, "/", want.last_access, " size ", uint64_t(have.size), "/", r.size,
                        " flags ", int(have.flags), "/", int(want.flags));
      }
    } else if (r.pool_index != UINT32_MAX) {
      status = fail(IdString(id), " in the pool but not evictable");
    }
    double cost = 0;
    bool backward = false;
    for (OpId op_id : r.recipe) {
      const OpRecord* op = ops_.Find(op_id);
      if (op == nullptr) {
        status = fail(IdString(id), " recipe names a dropped op");
        return;
      }
      cost += op->cost;
      backward |= op->backward;
      ++recipe_users[op_id.packed()];
      if (!ContainsValue(op->outputs, id)) status = fail(IdString(id), " recipe op does not write it");
      for (StorageId in : op->inputs) {
        const StorageRecord* in_rec = storages_.Find(in);
        if (in_rec == nullptr) status = fail(IdString(id), " depends on collected ", IdString(in));
        else if (!ContainsValue(in_rec->readers, op_id)) status = fail(IdString(in), " misses reader ", op->name);
      }
    }
    if (std::abs(cost - r.cost) > 1e-9 * std::max(1.0, cost)) status = fail(IdString(id), " cost is stale");
    if (backward != r.backward_recipe)  // Note [Results of the backward pass]
      status = fail(IdString(id), " backward_recipe is ", r.backward_recipe, " for a recipe ",
                    backward ? "with" : "without", " an op of a backward pass");
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
  if (held_result_sum != held_result_bytes_)  // Note [Memory floor]
    return fail("frozen held results ", held_result_bytes_, " != their resident sum ", held_result_sum);
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
  // Note [Exact neighborhood cost cache]: a cost still valid is what walking again finds.
  if (ExactNeighborhoodCache() && NeighborhoodWalks()) {
    // Note [Joins at the next search]: a queued storage's join has still to invalidate the costs
    // of its neighbors and of the storages beside its evicted neighbors' sets.
    absl::flat_hash_set<uint64_t> beside_queued;
    absl::flat_hash_set<uint32_t> sets_beside_queued;
    for (StorageId q : joins_pending_) {
      if (QueuedJoin(q) == nullptr) continue;
      ForEachNeighbor(q, [&](StorageId n) {
        const StorageRecord* nr = storages_.Find(n);
        if (nr == nullptr) return;
        beside_queued.insert(n.packed());
        if (!nr->resident()) sets_beside_queued.insert(components_.Find(nr->component));
      });
    }
    auto awaits_join = [&](StorageId id, const StorageRecord& r) {
      if (beside_queued.contains(id.packed())) return true;
      for (int i = 0; i < r.cached_regions; ++i)
        if (sets_beside_queued.contains(r.cached_region_root[i])) return true;
      return false;
    };
    std::vector<StorageId> cached;
    storages_.ForEach([&](StorageId id, const StorageRecord& r) {
      if (r.resident() && CachedCostValid(r) && !awaits_join(id, r)) cached.push_back(id);
    });
    // A walk marks the records it visits (scratch, never read across walks) and counts visits,
    // which the check gives back.
    Runtime* walker = const_cast<Runtime*>(this);
    const uint64_t visits = stats_.neighborhood_visits;
    for (StorageId id : cached) {
      bool cut = false, any_evicted = false;
      const double walked = walker->WalkNeighborhood(id, nullptr, 0, &cut, &any_evicted);
      const double have = storages_[id].neighborhood_cost;
      // Note [Cut walks leave a bound]: a bound is a prefix of the same sum, so at most it.
      if (storages_[id].neighborhood_cost_is_bound ? !(have <= walked) : walked != have) {
        status = fail(IdString(id), " cached neighborhood cost ", have,
                      storages_[id].neighborhood_cost_is_bound ? " (a bound)" : "", " but a walk now finds ", walked);
        break;
      }
    }
    stats_.neighborhood_visits = visits;
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace dtr
