// In-place ops: Mutate records an op that writes storages in place, and InvalidateReaders
// first makes sure no live recipe reads the old contents any more (Note [Mutation]).
#include <algorithm>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace dtr {

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

using runtime_internal::ContainsValue;

absl::Status Runtime::Mutate(const MutateCall& call,
                             absl::FunctionRef<absl::StatusOr<double>()> execute) {
  NoteOpStart(call.backward, call.inputs);
  absl::InlinedVector<StorageId, 8> reads(call.inputs.begin(), call.inputs.end());
  reads.insert(reads.end(), call.mutated.begin(), call.mutated.end());
  InputList inputs;
  if (absl::Status s = LockAndMaterialize(call.name, reads, &inputs); !s.ok()) return s;
  auto unlock_inputs = [&] { UnlockAll(inputs); };
  NoteOpBytes(inputs, 0, call.scratch_bytes);
  absl::InlinedVector<StorageId, 2> mutated;
  for (StorageId m : call.mutated)
    if (!ContainsValue(mutated, m)) mutated.push_back(m);
  // Note [Mutation]: nothing may replay against the old contents any more.
  if (absl::Status s = call.invalidate_readers ? InvalidateReaders(mutated) : absl::OkStatus(); !s.ok()) {
    unlock_inputs();
    return s;
  }
  // Note [Scratch memory]
  if (absl::Status s = Reserve(call.scratch_bytes, "scratch memory of ", call.name); !s.ok()) {
    unlock_inputs();
    return s;
  }
  UpdatePeak(call.scratch_bytes);
  reported_scratch_ = 0;
  absl::StatusOr<double> cost = execute();
  if (!cost.ok()) {
    // The contents of the mutated storages are unknown now: they cannot be replayed.
    for (StorageId m : mutated) Detach(m, ConstantReason::kUnreplayableWrite);
    unlock_inputs();
    return cost.status();
  }
  const uint64_t scratch = MeasuredScratch(inputs, 0, call.scratch_bytes);
  AdvanceClock(*cost);
  ++stats_.ops_recorded;
  stats_.base_cost += *cost;
  NoteBaseCost(*cost);
  const bool overwrites = call.overwrites && mutated.size() == 1;
  if (call.replayable && RecordsWrite(mutated, call.overwrites)) {
    StorageId m = mutated[0];
    // The old contents are gone and nothing reads them any more (InvalidateReaders): the recipe
    // restarts here.
    if (overwrites) ClearRecipe(m);
    const absl::string_view name = call.name_interned ? call.name : InternName(call.name);
    OpRecord* op;
    const OpId op_id = ops_.Emplace(&op);
    op->name = name;
    for (StorageId in : inputs)
      if (in != m) op->inputs.push_back(in);
    op->outputs.push_back(m);
    op->output_sizes.push_back(rec(m).size);
    op->cost = *cost;
    op->scratch_bytes = scratch;
    op->handle = call.handle;
    op->in_place = true;
    op->overwrites = overwrites;
    op->recipe_users = 1;
    op->backward = call.backward;
    if (call.recorded != nullptr) *call.recorded = true;
    uint32_t depth = overwrites ? 1 : rec(m).replay_depth + 1;  // the recipe grows by one op
    for (StorageId in : ops_[op_id].inputs) {
      StorageRecord& in_rec = rec(in);
      in_rec.readers.push_back(op_id);
      SyncAwaitsReaderFlag(in_rec);  // read now
      if (in_rec.rematerializable()) depth = std::max(depth, in_rec.replay_depth + 1);
    }
    rec(m).recipe.push_back(op_id);
    rec(m).backward_recipe |= call.backward;  // Note [Results of the backward pass]
    if (FrozenByChoice(rec(m).constant_reason)) held_result_bytes_ -= rec(m).size;  // Note [Memory floor]
    rec(m).constant_reason = ConstantReason::kNone;
    rec(m).cost += *cost;
    rec(m).replay_depth = depth;
    if (depth > config_.max_replay_depth) {
      Detach(m, ConstantReason::kReplayDepth);  // Note [Bounded replay chains]
      ++stats_.depth_limited;
    }
    SyncPool(m);  // a constant it overwrote is evictable now
  } else {
    for (StorageId m : mutated) Detach(m, ConstantReason::kUnreplayableWrite);
  }
  for (StorageId in : inputs) Touch(in);
  if (call.backward && config_.backward_next_use > 0) NoteBackwardAccesses(inputs);
  unlock_inputs();
  return absl::OkStatus();
}

bool Runtime::RecordsWrite(absl::Span<const StorageId> mutated, bool overwrites) const {
  if (mutated.empty() || std::any_of(mutated.begin(), mutated.end(), [&](StorageId m) { return m != mutated[0]; }))
    return false;
  const StorageRecord* r = storages_.Find(mutated[0]);
  return r != nullptr && (overwrites || r->rematerializable());
}

absl::Status Runtime::InvalidateReaders(absl::Span<const StorageId> mutated) {
  // Nothing reads them (an optimizer's update of a parameter, once the step's graph is gone):
  // no walk to set up.
  if (std::all_of(mutated.begin(), mutated.end(), [&](StorageId m) { return rec(m).readers.empty(); })) {
    DrainCollection();
    return absl::OkStatus();
  }
  // Note [Mutation]: walk downstream from the mutated storages through the unreferenced ones.
  std::vector<StorageId> freeze, bring_back, abandon, frontier, next;
  auto walk = [&] {
    freeze.clear();
    bring_back.clear();
    abandon.clear();
    frontier.clear();
    // Visited marks without a hash set: nothing in this walk searches for victims or walks a
    // neighborhood, which use the same marks.
    const uint32_t epoch = NextWalkEpoch();
    for (StorageId m : mutated) {
      Dependents(m, &next);
      frontier.insert(frontier.end(), next.begin(), next.end());
    }
    while (!frontier.empty()) {
      StorageId t = frontier.back();
      frontier.pop_back();
      StorageRecord& r = rec(t);
      if (r.walk_epoch == epoch) continue;
      r.walk_epoch = epoch;
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
      if (!status.ok()) return WithFrozenGradientsHint(status, t);
      if (!RecipeFromOriginal(t, mutated)) Detach(t, ConstantReason::kMutatedAncestor);
    }
  }
  for (StorageId t : freeze)
    if (!RecipeFromOriginal(t, mutated)) Detach(t, ConstantReason::kMutatedAncestor);
  // Nothing reads the abandoned storages any more: collecting them drops the old graph.
  for (StorageId t : abandon) {
    ++stats_.detached;
    MaybeCollect(t);
  }
  DrainCollection();
  return absl::OkStatus();
}

// An optimizer's update that cannot bring back an evicted gradient (a parameter's .grad, held
// and evicted in the backward pass, whose recipe replays the backward ops behind it) fails out
// of memory, and so may an in-place accumulation inside a backward pass. The option of Note
// [Frozen results pass it on] keeps such gradients as they are computed instead: Hugging Face's
// Mixtral at 0.3 of its activations fails so by default and trains with it, bit-identically, as
// did the Llama with gradient checkpointing at half its activations until stop 78
// (runtime/README.md). The error says so, and which kind of write it was, where the option is off.
absl::Status Runtime::WithFrozenGradientsHint(const absl::Status& status, StorageId target) const {
  const StorageRecord* r = storages_.Find(target);
  if (!absl::IsResourceExhausted(status) || config_.freeze_backward_results || r == nullptr || !r->backward_recipe)
    return status;
  const absl::string_view message = status.message();
  return absl::ResourceExhaustedError(absl::StrCat(
      message, absl::EndsWith(message, ".") ? "" : ".",
      " This happened while an in-place ",
      // NoteOpStart has followed the failing op: a write inside a backward pass is autograd
      // accumulating a gradient, one outside it an update such as an optimizer's step.
      in_backward_pass_ ? "accumulation of a gradient in the backward pass" : "update (an optimizer's step, say)",
      " brought back an evicted gradient: DTR_FREEZE_GRADIENTS=1 (python -m dtr --freeze-gradients) keeps "
      "gradients once computed instead of evicting and recomputing them, and may train at this budget."));
}

// Note [Copies of overwritten contents]
// Autograd saves a copy of a tensor that an in-place op overwrites when the op's derivative needs
// the old values: SiLU(inplace=True) and Hardswish(inplace=True) clone their input, which
// torchvision's EfficientNet and MobileNetV3 (and YOLO-style networks) run after most batch
// norms; programs do it too (`y = x.clone(); x.mul_(2)`). The copy's recipe reads the old
// contents, so Note [Mutation] froze it: EfficientNet-B0's training step kept about 55 MiB of
// such copies as constants at half its activations. But the old contents are what the
// original's recipe made: when the copy is a whole, equally laid out copy of the storage being
// overwritten (OpCall::copies_input, a recorded clone) and that storage's recipe is one op that
// created it, the copy takes that op as its own recipe, as if it had been that op's output (a
// record of its own, with a replay handle the backend copies and that keeps only that output:
// ReplayBackend::CopyReplay). It is then rematerializable like any activation, at the
// producer's cost. Anything else (an original with in-place ops in its recipe, a partial copy,
// a backend that cannot copy the handle, a copy not of the overwritten storage itself) is frozen
// as before.
bool Runtime::RecipeFromOriginal(StorageId copy, absl::Span<const StorageId> mutated) {
  StorageRecord& r = rec(copy);
  if (!r.resident() || r.recipe.size() != 1) return false;
  const OpRecord& copy_op = ops_[r.recipe[0]];
  if (!copy_op.copies_input || copy_op.outputs.size() != 1 || copy_op.outputs[0] != copy) return false;
  const StorageId original = copy_op.inputs[0];
  if (!ContainsValue(mutated, original)) return false;
  const StorageRecord& orig = rec(original);
  if (orig.recipe.size() != 1) return false;
  const OpId producer_id = orig.recipe[0];
  const OpRecord& producer = ops_[producer_id];
  if (producer.in_place) return false;
  const auto at = std::find(producer.outputs.begin(), producer.outputs.end(), original);
  if (at == producer.outputs.end()) return false;
  const size_t output = size_t(at - producer.outputs.begin());
  if (producer.output_sizes[output] != r.size) return false;
  const uint64_t handle = backend_->CopyReplay(producer, output);
  if (handle == 0) return false;
  ClearRecipe(copy);  // drops the copy op, the original's reader
  OpRecord* op;
  const OpId op_id = ops_.Emplace(&op);  // may move the records: read producer through its id
  const OpRecord& p = ops_[producer_id];
  op->name = p.name;
  op->inputs = p.inputs;
  op->outputs.push_back(copy);
  op->output_sizes.push_back(r.size);
  op->cost = p.cost;
  op->scratch_bytes = p.scratch_bytes;
  op->handle = handle;
  op->backward = p.backward;
  op->recipe_users = 1;
  uint32_t depth = 1;
  for (StorageId in : op->inputs) {
    StorageRecord& in_rec = rec(in);
    in_rec.readers.push_back(op_id);
    SyncAwaitsReaderFlag(in_rec);
    if (in_rec.rematerializable()) depth = std::max(depth, in_rec.replay_depth + 1);
  }
  StorageRecord& cr = rec(copy);
  cr.recipe.push_back(op_id);
  cr.cost = op->cost;
  cr.replay_depth = depth;
  cr.backward_recipe = op->backward;
  ++stats_.copies_given_recipes;
  if (depth > config_.max_replay_depth) {
    Detach(copy, ConstantReason::kReplayDepth);  // Note [Bounded replay chains]
    ++stats_.depth_limited;
  }
  SyncPool(copy);
  return true;
}

}  // namespace dtr
