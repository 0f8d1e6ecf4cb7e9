// Rematerialization: bringing an evicted storage back by replaying its recipe on an explicit
// stack of frames (no recursion), keeping evicted siblings a replay recomputes, leaving their
// staleness as it was, and counting rematerializations for thrash damping (Note [Thrashing],
// eviction_search.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace dtr {

// Note [Rematerialization]
// Materialize runs on an explicit stack of frames, one per storage being brought back. A frame
// replays its storage's recipe one op at a time: it lists that op's inputs and holds them (Note
// [Lazy input locks] says how), pushes the first non-resident one, and when all are resident
// locks them, replays the op and unlocks them. Between recipe ops the storage itself is locked,
// so the memory needed is the largest single step, not the whole recipe. The graph is acyclic,
// so the stack is bounded by the number of storages; there is no recursion. Replaying a
// multi-output op computes all of its outputs: evicted siblings whose recipe is exactly that op
// are kept, the rest (resident siblings, or siblings mutated since) are discarded again, with
// their bytes reserved for the duration of the replay.

// Note [Lazy input locks]
// An op that runs (Compute, Mutate) or replays (a frame of Note [Rematerialization]) needs all
// of its inputs resident at once, and brings the missing ones back one at a time. Until stop 38
// every input was locked before the first was brought back, resident or not (InputLocking::
// kEager): bringing one back could never evict another, so each came back once. But the locks
// of every frame on the stack add up: the floor of Note [Memory floor] counts one op's inputs
// and outputs, the stack held the inputs of every op under it, and near the floor that was what
// ran out (a replayed convolution_backward with 5.12 MiB locked on DenseNet, 657-930 KiB of the
// Transformer's activations locked at r = 0.15; bench/results/activations.md, stop 37).
// So now (kLazy, the default) an input is locked only once it is back (the frame below a
// finished frame locks what that frame rebuilt), or when its op replays; until then it is
// awaited (StorageRecord::waits, PoolEntry::kAwaited): a victim of last resort, taken only when
// nothing else can be evicted, results awaiting their reader included. An awaited input that had
// to go is brought back again when its op is next on the stack, then locked. Each push locks one
// more input of the frame below, so a frame brings each input back at most once more than eager
// locks would, and the stack still ends. Since the awaited inputs come after everything eager
// locks could evict, every search eager locks would answer gets their answer: where eager locks
// train, lazy ones make the same decisions (dtr-sim: the same ratios in every such cell), and
// they only add a victim where eager locks had none. Stats count awaited_evictions.
// Measured in dtr-sim (3 traces x seeds 1-3 of each benchmark model, medians, budgets on the
// activations, eager -> lazy; bench/results/activations.md, stop 38): DenseNet trains at r = 0.3
// and 0.25 (oom -> 4.77x, 5.90x; its floor is 0.18), UNet at 0.35 and 0.3 (oom -> 3.55x, 4.47x;
// floor 0.26); the LSTM and the TreeLSTM at 0.15 train in more of the runs. Taking awaited inputs
// before the results awaiting their reader trained ResNet at 0.3 too (3.13x, at its floor of
// 0.28), but changed decisions where eager locks trained (ResNet at 0.35 2.27x -> 2.78x), and a
// real program that trained under eager locks (tests/python/test_activation.py,
// test_disable_and_enable_again) ran out of memory. InputLocking::kEager (dtr-sim --input-locks
// eager) is kept for comparisons.

// Note [Staleness of replayed storages]
// Staleness measures how long ago the program used a storage (Note [Heuristics]); a replay is
// not a use. So a storage a rematerialization brings back, the target and every evicted input
// and sibling rebuilt on the way, keeps the last access it had before it was evicted; the target
// is then touched by the op of the program that needed it, as any input is (or by Pin, which
// hands its data to the program). Until stop 33 every
// brought-back storage was touched when it came back (issue 16: "replays refresh staleness"),
// which made a rebuilt segment the freshest memory there was: in a backward pass the storages
// rebuilt to bring one activation back are needed in the reverse of their forward order, and the
// checkpoint the replay started from is needed after all of them, but the touch made the
// heuristic evict older, still-needed storages (that checkpoint, other segments' activations)
// before the rebuilt ones. In dtr-sim on the activation-budget traces (medians of 3 traces x 3
// seeds, bench/results/activations.md) dropping the touch took the LSTM at r = 0.5 from 1.37x to
// 1.28x, ResNet from 1.29x to 1.22x, DenseNet 1.29x to 1.23x, UNet at 0.4 1.72x to 1.60x (and
// trains it at 0.3), the chain at 0.3 1.49x to 1.39x, the TreeLSTM at 0.3 2.05x to 1.89x; it
// costs more near the smallest budgets, where a rebuilt input is soon needed by the next replay
// (the Transformer at r = 0.1 2.42x to 2.70x, the TreeLSTM at 0.25 3.19x to 3.92x). Keeping the
// staleness the storage had when it was evicted (eviction time not counted), or moving its last
// access part of the way to now, was worse on most cells (runtime/README.md, issue 16 item 2).
// RuntimeConfig::replays_refresh_staleness (dtr-sim --replays-refresh-staleness) restores the
// touch for comparisons.

// Note [Rebuilt segments]
// To bring back one evicted activation, a rematerialization often replays a segment: from the
// nearest resident storage (a checkpoint) through each evicted storage in between. The rebuilt
// storages keep their forward-pass last access (Note [Staleness of replayed storages]), hundreds
// of ops stale against a backward pass's fresh gradients, so while the replays make room for
// the next storage of the segment, the search evicted the one just used: the rebuild ran in a
// window of one or two storages and left only its target. The next backward op needs the storage
// before that target, and the whole segment was replayed again from the checkpoint: about L^2/2
// replays for a segment of L layers where keeping part of it costs about L (seen in a replay log
// of the chain at r = 0.34: early layers replayed 2-3 times a step, up to 9 times under exact
// search; bench/results/activations.md, stop 35). So while a rematerialization is under way, the
// storages it has brought back have their scores multiplied by RuntimeConfig::rebuild_protection
// (default 30): the search takes them last, but still takes them when the rest scores over 30
// times worse, so a rebuild that does not fit is not made to fail. Once the rematerialization
// ends, they are ordinary candidates again, and their forward-order staleness makes the search
// evict the segment from its start, which the backward pass needs last. Materialize calls nest
// (an in-place mutation may bring a storage back inside another's replay): the outermost one
// numbers the rebuild (Runtime::rebuild_epoch_), and a storage carries the number of the rebuild
// that last brought it back. On the activation-budget traces (steady-state steps, 3 traces x 3
// seeds, r = 0.5/0.4/0.3/0.25/0.2), 1 (none) -> 30: the chain 1.21/1.34/1.50/1.58/1.70x ->
// 1.20/1.29/1.41/1.49/1.63x, the LSTM 1.33/1.65/2.08/2.31/2.97x -> 1.29/1.55/1.95/2.18/2.61x, the
// TreeLSTM 1.28/1.45/1.84/2.19/3.97x -> 1.27/1.43/1.72/2.08/3.42x, the Transformer
// 1.29/1.41/1.65/1.91/2.45x -> 1.28/1.38/1.56/1.86/2.49x, DenseNet 1.25/1.44x -> 1.25/1.42x, UNet
// at 0.4 1.98x -> 1.88x; ResNet 1.27/1.84x -> 1.31/1.87x, and UNet at 0.3, at its floor (0.29),
// 2.33x -> out of memory in most runs. 10 kept UNet's 0.3 and gained less elsewhere; 100 gained
// more on the LSTM (1.25x at 0.5) and cost more on ResNet and DenseNet (1.96x and 1.55x at 0.4).

// Note [Inputs a rematerialization will read]
// A rematerialization replays what it lists: the target's recipe and, recursively, the recipes
// of the evicted storages those ops read. Rebuilt on demand (Note [Rematerialization]), a storage
// one op needs is brought back, read, and unlocked, and when memory is short the search could
// take it before a later op of the same rebuild reads it: that op then brings it back again, and
// everything behind it. In a tree (the TreeLSTM) a node's c is read by its h and again by its
// parent's c, so each level could double the work: at r = 0.15 of its activations one
// rematerialization early in the backward pass replayed 4,006 ops to rebuild 527 storages, the
// forward pass of the whole tree 7.6 times over (bench/results/activations.md, stop 49). So
// Materialize lists, before it replays anything, the ops it expects to replay, and counts on each
// storage they read (resident or not) how many of them have not run yet
// (StorageRecord::pending_reads, mirrored as PoolEntry::kPending). The search multiplies such a
// storage's score by pending_protection (1000 below): it takes first what no op of the rebuild
// still needs, and a pending input only when everything else scores that many times worse, so a
// rebuild that does not fit is not made to fail. A replay of a listed op releases its reads; what is left is released when
// Materialize returns, done or unwound. The list is what a rebuild from the current residency
// would replay; an input evicted during the rebuild is rebuilt as before, without a list of its
// own, and Materialize calls that nest each list their own. An op listed once is released at its
// first replay, so an op replayed twice (a multi-output op whose sibling, written in place since,
// is brought back on its own) has its reads unprotected the second time.
// It is off (pending_protection 1). On bench/activation_budgets.py's traces (3 a model x seeds
// 1-3, stop 49) 1000 took the TreeLSTM at r = 0.15 from 10.86x to 7.36x (30: 9.05x), trained it
// at 0.125 (11.5x; out of memory before), and moved every other cell by at most 0.06x; but real
// TreeLSTM runs gained less (rematerializations a step 3-13% fewer near the cliff, which stays),
// and tests/python/test_activation.py's test_disable_and_enable_again, whose 2,000,000-byte
// budget is within 3% of where it fails either way, ran out of memory with it (a library built
// with 30 or 1000 as the default; the torch layer has no setting for it): its victims came in
// another order, and a 256 KiB weight gradient awaiting its reader had to go and did not fit
// back. dtr-sim --pending-protection K turns it on.

// Note [Recomputation limit]
// Below the smallest budget a program can train at, dtr does not always run out of memory: it
// may keep finding something to evict, and recompute it, for ever longer (a TreeLSTM trained at
// 250x its plain step time in an early sweep; issue 16 asks for a clear error instead). So the
// runtime keeps two sums over the recent ops, whose weights halve every
// recompute_half_life_ops recorded ops: the cost of the ops the program ran (Compute, Mutate,
// views' Access, and ops the caller ran unrecorded: AddUnrecordedOpCost) with the time it spent
// between them (AddProgramTime, Note [Program time between ops]), and dtr's overhead,
// the cost of replays plus, in real runs, the time the allocators spent choosing and evicting
// victims (AddSearchCost; on the CPU TreeLSTM near its smallest budget the searches cost more
// than the replays, and a budget whose searches alone cost the limit is as useless as one that
// thrashes). Before a replay, if the overhead is more than max_recompute_ratio times the
// program's own work, it fails with ResourceExhausted (torch's OutOfMemoryError at the torch
// boundary), saying how to lift the limit; nothing is lost (the stack unwinds, Note
// [Rematerialization]). The overhead sum restarts then, and when the budget changes, so a
// program that catches the error or raises its budget starts afresh; with no work of the
// program's own in the window (a deferred cost correction may bring it to 0) it never fires.
// Early in a run the window holds everything run so far, and a first cascade replays each op at
// most once, so replays alone do not reach the limit before the program thrashes.
// The default is 10: a budget that makes the recent ops take roughly eleven times their time
// fails. Until stop 69 it was 50, since the window weighed the ops' own time alone and a lower
// limit fired on programs whose wall time had not moved (stop 52, below); with the time between
// ops weighed too (Note [Program time between ops]) the ratio is close to the slowdown a user
// sees on the CPU, and the chain at 0.1925 of its peak, which trained at about 35 times its
// plain step (9.8k replays a step), now stops in its first thrashing step. The budgets the
// benchmark sweep trains at cost at most 7.3x a step (lru on the chain at 0.2; dtr 5.9x, the
// LSTM at 0.35; bench/results/cpu.md), which leave dtr's overhead at most about 6 times the
// program's time, and no model's smallest working budget moved (stop 69's sweeps). On CUDA the
// ratio is looser than the slowdown (not measured on a GPU): replays count their launch time,
// not their kernels', and host gaps overlap the kernels the ops' costs count. Stop 52's
// measurement of the old window: on the sweep's traces (dtr-sim, op costs only) a limit of 8
// failed the TreeLSTM at r = 0.15 (7.11x, 18.50x, 8.63x) on two traces of three and changed no
// other run, but real CPU runs of the tests' small LSTM and TreeLSTM, whose steps are mostly
// Python and dispatch, passed 8x where the wall time did not move (the TreeLSTM at 0.8 of its
// peak: 7.0 s against 7.7 s plain, 12 ms recomputing). bench/results/runtime.md, stops 52, 69.

// Note [Program time between ops]
// What a user feels is the step's wall time, and a program's ops are only part of it: between
// them run Python, the dispatcher above dtr and work dtr does not see. On the CPU models with
// small ops that is most of a step, so a window of op costs alone made the limit both too strict
// (stop 52: the tests' small LSTM and TreeLSTM tripped a limit of 8 while their wall time did
// not move) and too loose in the units a user reads (the chain at 0.203 of its peak took 27
// times its plain step under the old default of 50). So the torch layer also tells the runtime
// the time between the end of one managed op and the start of the next, less the searches and
// replays that ran in between (AddProgramTime; one gap at most 10 ms, Engine::
// kMostProgramTimeNs), and the window weighs the overhead against ops and gaps together: the
// limit is a bound on the slowdown, over the recent ops, of the program as run. The trace
// carries the gaps (`wait`, Note [Trace format]), so dtr-sim weighs the same; traces without
// them (older ones, generated ones) weigh op costs alone, now against the lower default, so
// dtr-sim is stricter on them than before (a generated TreeLSTM at 0.3 of its peak stops at
// 10.3x instead of at the thrash count below). A gap is not an op: it neither decays the window
// nor resets the thrash count below. dtr's own work between ops (a storage's death, the
// fallback's walk before it takes the engine lock, draining deaths after an op) counts as the
// program's, a small part of a gap on the CPU models.

// Note [Thrashing rematerializations]
// The window above weighs costs over thousands of ops, so one op whose inputs take a runaway
// rematerialization passes it: in dtr-sim a TreeLSTM at r = 0.175 of its activations (one trace
// of three) took a step 135x its own cost and the run 37.6x, its worst op replaying 60,109 ops
// while about 1,070 op records were alive, and at r = 0.15 a trace "trained" at 34x. A
// rematerialization that does not thrash replays each recorded op at most once, again only when
// what it rebuilt is evicted before it is read; over issue 16's activation budgets on every
// benchmark trace (3 traces x 3 seeds, r = 0.5 down to 0.1) the most one program op replayed
// was 4.7 times the live op records in runs that trained (the LSTM at r = 0.175, 6.4x), and 35 to
// 62 times in those that thrashed; of 792 runs (r = 0.9 to 0.1) only those TreeLSTM runs changed
// (activations.md, "A runaway rematerialization stops"). So, besides the window, the replays made for one
// program op (counted from the last op the program ran: Compute, Mutate, Access or an
// unrecorded op's cost) may not exceed kThrashReplaysPerRecord times the live op records, and
// at least kThrashReplaysFloor: past that the replay fails with the same out-of-memory error,
// telling the budget is too small. A count, not a cost, so the ops' timing (the window's weakness
// in real runs, stop 52) does not enter. DTR_MAX_RECOMPUTE=0 turns both limits off.
constexpr uint64_t kThrashReplaysPerRecord = 16;
constexpr uint64_t kThrashReplaysFloor = 1024;

using runtime_internal::ContainsValue;
using runtime_internal::IdString;

void Runtime::NoteBaseCost(double cost) {
  window_base_cost_ = window_base_cost_ * window_decay_ + cost;
  window_overhead_cost_ *= window_decay_;
  replays_for_op_ = 0;  // Note [Thrashing rematerializations]
}

absl::Status Runtime::CheckRecomputation(absl::string_view op_name) {
  const double limit = config_.max_recompute_ratio;
  // Note [Thrashing rematerializations]
  const uint64_t most_replays = std::max<uint64_t>(kThrashReplaysPerRecord * ops_.size(), kThrashReplaysFloor);
  if (limit > 0 && replays_for_op_ >= most_replays) {
    const uint64_t replays = std::exchange(replays_for_op_, 0);
    window_overhead_cost_ = 0;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dtr: the memory budget is too small for this program: bringing back what its next op needs "
        "has replayed %d ops, more than %d times the %d ops dtr has recorded, so it keeps evicting "
        "what it has just rebuilt (%s must be replayed next). Raise the budget, or set "
        "DTR_MAX_RECOMPUTE=0 to allow any slowdown (Note [Thrashing rematerializations]).",
        replays, kThrashReplaysPerRecord, ops_.size(), op_name));
  }
  // No work of the program's own to weigh against (nothing run yet, or costs corrected to 0).
  if (limit <= 0 || window_base_cost_ <= 0 || window_overhead_cost_ <= limit * window_base_cost_)
    return absl::OkStatus();
  const double ratio = window_overhead_cost_ / window_base_cost_;
  window_overhead_cost_ = 0;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "dtr: the memory budget is too small to train at a useful speed: rematerializing and "
      "choosing what to evict have cost %.3gx the program's own time (its ops and the time "
      "between them) over the recent ops (limit %gx: DTR_MAX_RECOMPUTE, or dtr-sim's "
      "--max-recompute), and %s must be replayed next. Raise the budget, or set "
      "DTR_MAX_RECOMPUTE=0 to allow any slowdown (Note [Recomputation limit]).",
      ratio, limit, op_name));
}

void Runtime::Await(StorageId id) {
  StorageRecord& r = rec(id);
  if (r.waits++ == 0) SetPoolFlag(r, PoolEntry::kAwaited, true);  // Note [One flag, one write]
}

void Runtime::Unawait(StorageId id) {
  StorageRecord& r = rec(id);
  if (--r.waits == 0) SetPoolFlag(r, PoolEntry::kAwaited, false);
}

absl::Status Runtime::Materialize(StorageId target) {
  if (rec(target).resident()) return absl::OkStatus();
  JoinPendingEvictions();  // Note [Joins at the next search] (eviction_search.cc)
  // Note [Rebuilt segments]: what this rematerialization brings back is taken last until it ends.
  struct RebuildUnderway {
    explicit RebuildUnderway(Runtime* rt) : rt_(rt) {
      if (rt_->rebuilds_underway_++ == 0) ++rt_->rebuild_epoch_;
    }
    ~RebuildUnderway() { --rt_->rebuilds_underway_; }
    Runtime* rt_;
  } underway(this);
  // Note [Inputs a rematerialization will read]: off by default, and then nothing is listed.
  PendingReplays pending;
  if (config_.pending_protection != 1) ListPendingReplays(target, &pending);
  pending_replays_.push_back(&pending);
  struct PendingUnderway {
    ~PendingUnderway() {
      for (PendingReplays::Op& op : pending->ops) rt->ReleasePendingReads(op);
      rt->pending_replays_.pop_back();
    }
    Runtime* rt;
    PendingReplays* pending;
  } pending_underway{this, &pending};
  const bool lazy = config_.input_locking == InputLocking::kLazy;
  // One frame per storage being brought back; `stage` is the recipe op being replayed.
  struct Frame {
    StorageId id;
    size_t stage = 0;
    bool deps_listed = false;  // deps holds the inputs of recipe[stage]
    bool self_locked = false;
    std::vector<StorageId> deps;
    std::vector<bool> held;  // which of deps this frame has locked
  };
  std::vector<Frame> stack;
  stack.push_back(Frame{target});
  auto release_deps = [&](Frame& f) {
    for (size_t i = 0; i < f.deps.size(); ++i) {
      if (f.held[i]) Unlock(f.deps[i]);
      if (lazy) Unawait(f.deps[i]);
    }
    f.deps_listed = false;
  };
  auto unwind = [&](absl::Status status) {
    for (Frame& f : stack) {
      if (f.deps_listed) release_deps(f);
      if (f.self_locked) {
        // A half-replayed recipe leaves no usable contents: drop them again.
        StorageRecord& r = rec(f.id);
        --r.locks;
        RefreshPoolEntry(r);
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
    if (!stack[top].deps_listed) {
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
      // Note [Lazy input locks]: eagerly, every input is locked now, resident or not.
      f.held.assign(f.deps.size(), !lazy);
      for (StorageId d : f.deps) lazy ? Await(d) : Lock(d);
      f.deps_listed = true;
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
    for (size_t i = 0; i < f.deps.size(); ++i)
      if (!f.held[i]) {
        Lock(f.deps[i]);
        f.held[i] = true;
      }
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
    release_deps(f);
    if (more) continue;
    if (f.self_locked) {
      rec(id).rebuilding = false;
      Unlock(id);
    }
    stack.pop_back();
    // Note [Lazy input locks]: the frame that waited for it holds it from now on.
    if (!stack.empty()) {
      Frame& waiting = stack.back();
      for (size_t i = 0; i < waiting.deps.size(); ++i)
        if (waiting.deps[i] == id && !waiting.held[i]) {
          Lock(id);
          waiting.held[i] = true;
        }
    }
    if (absl::Status done = FinishRemat(id); !done.ok()) return unwind(done);
  }
  return absl::OkStatus();
}

void Runtime::ListPendingReplays(StorageId target, PendingReplays* pending) {
  // Each evicted storage behind the target is visited once: the walk's epoch marks it.
  const uint32_t epoch = NextWalkEpoch();
  rec(target).walk_epoch = epoch;
  absl::InlinedVector<StorageId, 16> todo = {target};
  while (!todo.empty()) {
    const StorageId s = todo.back();
    todo.pop_back();
    for (OpId op_id : rec(s).recipe) {
      if (!pending->index.try_emplace(op_id, uint32_t(pending->ops.size())).second) continue;
      PendingReplays::Op& op = pending->ops.emplace_back();
      op.id = op_id;
      for (StorageId in : ops_[op_id].inputs) {
        if (in == s) continue;  // an in-place op of s's recipe: s is its frame's own (Materialize)
        StorageRecord& r = rec(in);
        op.reads.push_back(in);
        if (r.pending_reads++ == 0) SetPoolFlag(r, PoolEntry::kPending, true);
        if (!r.resident() && r.rematerializable() && r.walk_epoch != epoch) {
          r.walk_epoch = epoch;
          todo.push_back(in);
        }
      }
    }
  }
}

void Runtime::ReleasePendingReads(PendingReplays::Op& op) {
  if (op.replayed) return;
  op.replayed = true;
  for (StorageId in : op.reads)
    if (StorageRecord* r = storages_.Find(in); r != nullptr && --r->pending_reads == 0)
      SetPoolFlag(*r, PoolEntry::kPending, false);
}

void Runtime::NotePendingReplayed(OpId id) {
  if (config_.pending_protection == 1) return;  // nothing was listed
  for (PendingReplays* pending : pending_replays_)
    if (auto it = pending->index.find(id); it != pending->index.end())
      ReleasePendingReads(pending->ops[it->second]);
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
  if (absl::Status s = RunReplay(first, op, replay_bytes, keep); !s.ok()) return s;
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    if (!keep[i]) continue;
    StorageId o = op.outputs[i];
    if (rec(o).join_pending) JoinEvicted(o);  // Note [Joins at the next search] (eviction_search.cc)
    StorageRecord& r = rec(o);
    NoteEvictedRegionChanged(r);  // Note [Exact neighborhood cost cache]
    components_.AddCost(r.component, -r.cost);
    r.component = EvictedComponents::kNone;
    --evicted_count_;
    r.state = StorageState::kResident;
    ++residency_changes_;  // Note [Neighborhood cost cache]: and the neighbors' costs just fell
    // (The pool entries do not mirror the cache since stop 48, Note [Candidate table].)
    ForEachNeighbor(o, [&](StorageId n) { rec(n).neighborhood_walked_at = StorageRecord::kNotCached; });
    memory_ += r.size;
    if (o != id) {
      if (absl::Status s = FinishRemat(o); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::ReplayInPlaceOp(StorageId id, size_t stage) {
  OpId op_id = rec(id).recipe[stage];
  const bool keep_one[1] = {true};
  return RunReplay(op_id, ops_[op_id], /*output_bytes=*/0, keep_one);
}

absl::Status Runtime::RunReplay(OpId id, const OpRecord& op, uint64_t output_bytes, absl::Span<const bool> keep) {
  if (absl::Status s = CheckRecomputation(op.name); !s.ok()) return s;  // Note [Recomputation limit]
  // Note [Scratch memory]: the replay needs the op's workspace again.
  const uint64_t bytes = output_bytes + op.scratch_bytes;
  if (absl::Status s = Reserve(bytes, "rematerializing ", op.name); !s.ok()) return s;
  UpdatePeak(bytes);
  absl::StatusOr<double> cost = backend_->Replay(id, op, keep);
  if (!cost.ok()) return cost.status();
  NotePendingReplayed(id);  // Note [Inputs a rematerialization will read]
  ++stats_.replays;
  ++replays_for_op_;  // Note [Thrashing rematerializations]
  stats_.remat_cost += *cost;
  window_overhead_cost_ += *cost;
  AdvanceClock(*cost);
  return absl::OkStatus();
}

absl::Status Runtime::FinishRemat(StorageId id) {
  rec(id).rebuild_epoch = rebuild_epoch_;  // Note [Rebuilt segments]
  if (config_.replays_refresh_staleness) Touch(id);  // Note [Staleness of replayed storages]
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
  RefreshPoolEntry(r);  // Note [Candidate table]: recent_remats
  ++stats_.rematerializations;
  if (r.recent_remats >= config_.thrash_report_threshold &&
      r.recent_remats - 1 < config_.thrash_report_threshold)
    ++stats_.thrash_events;
}

}  // namespace dtr
