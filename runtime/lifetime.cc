// Record lifetime: what happens when the program drops its last reference (eager eviction,
// banishing, releasing dead constants), detaching a storage from its recipe, and collecting
// records nothing can need any more, iteratively through a worklist.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace dtr {

// Note [Record lifetime]
// A record is collected (dropped, memory released) when it has no external references, no locks,
// no pins and no readers: nothing can ever need its contents again. Dropping it empties its
// recipe, which may drop ops, which removes them from their inputs' readers, which may collect
// those inputs in turn; a worklist makes this cascade iterative. When the last external reference
// goes, eager eviction evicts the storage (if it is rematerializable and still needed by a
// dependent); banishing frees it for good once no evicted dependent needs it and detaches its
// resident dependents.

namespace {

template <typename Vec, typename T>
void EraseValue(Vec& v, const T& x) {
  auto it = std::find(v.begin(), v.end(), x);
  if (it != v.end()) v.erase(it);
}

}  // namespace

using runtime_internal::ContainsValue;

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
  for (StorageId d : dependents) Detach(d, ConstantReason::kBanishedAncestor);
  StorageRecord& r = rec(id);
  r.banish_pending = false;
  ++stats_.banishments;
  // With no readers left it is collected right away (memory released permanently).
  MaybeCollect(id);
}

void Runtime::Detach(StorageId id, ConstantReason why) {
  StorageRecord& r = rec(id);
  if (!r.rematerializable()) return;
  r.constant_reason = why;  // before ClearRecipe, which calls out to the backend
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
  for (StorageId o : accumulators) Detach(o, ConstantReason::kAccumulator);
  MaybeCollect(id);
}

void Runtime::ClearRecipe(StorageId id) {
  StorageRecord& r = rec(id);
  ForgetNeighborhoodCost(r);  // Note [Exact neighborhood cost cache]: its own walk changed
  absl::InlinedVector<OpId, 2> recipe;
  recipe.swap(r.recipe);
  r.cost = 0;
  r.backward_recipe = false;
  SyncPool(id);
  for (OpId op_id : recipe) {
    OpRecord& op = ops_[op_id];
    if (--op.recipe_users > 0) continue;
    for (StorageId in : op.inputs) {
      StorageRecord* in_rec = storages_.Find(in);
      if (in_rec == nullptr) continue;
      EraseValue(in_rec->readers, op_id);
      RefreshPoolEntry(*in_rec);  // it may await its reader now (Note [Candidate table])
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
      NoteEvictedRegionChanged(r);  // Note [Exact neighborhood cost cache]
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

}  // namespace dtr
