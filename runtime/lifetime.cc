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

// Note [Dead constants in accumulating recipes]: the smallest dead input, as a fraction of an
// accumulator, worth freezing the accumulator for.
constexpr uint64_t kDeadConstantRatio = 4;
// Note [Kept inputs of held results]: the largest dying input, as a fraction of the held results
// it would otherwise freeze, kept instead.
constexpr uint64_t kKeptInputRatio = 4;
// Note [Smaller backward results]: the largest held results of a backward op, as a fraction of
// the dying storage it reads, frozen to let that storage go.
constexpr uint64_t kSmallerResultRatio = 4;
// Note [Frozen results pass it on]: the largest held results a dying frozen result passes the
// freeze on to, all its backward readers' together, as a multiple of its size (over it, none).
constexpr uint64_t kPassOnRatio = 64;

template <typename Vec, typename T>
void EraseValue(Vec& v, const T& x) {
  auto it = std::find(v.begin(), v.end(), x);
  if (it != v.end()) v.erase(it);
}

// An output the program dropped, evicted, that nothing uses or brings back: its record stays
// only for the recipes that read it (Note [Dead siblings of a held result]).
bool DeadAndEvicted(const StorageRecord& r) {
  return !r.resident() && r.external_refs == 0 && r.pins == 0 && r.locks == 0 && r.waits == 0 &&
         r.pending_reads == 0;
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
  // Note [Held results of dead inputs]. Freezing drops the recipes that read this storage, and
  // one left unread is queued for collection (ClearRecipe) instead of evicted.
  // Note [Kept inputs of held results]: or kept resident, a constant now.
  if (config_.freeze_held_results && FreezeHeldResultsOf(id) &&
      (rec(id).deletion_pending || !rec(id).rematerializable()))
    return;
  if (config_.dealloc == DeallocPolicy::kBanish) {
    if (HasEvictedDependent(id)) {
      rec(id).banish_pending = true;
    } else {
      Banish(id);
    }
    return;
  }
  if (Eligible(rec(id))) EvictUnchecked(id, /*eager=*/true);
}

// Note [Held results of dead inputs]
// A storage the program no longer holds is evicted eagerly (its memory goes, its record stays)
// while some recipe reads it. When that recipe belongs to a storage the program still holds, the
// dead storage and everything behind it stay recorded so that the held one can be brought back,
// and bringing it back replays all of it. Two kinds of held storage decided whole runs near the
// floors of issue 16 (activations.md, "Held results of dead inputs"):
// - What a backward pass accumulates into in place: a parameter's .grad (zeroed by
//   zero_grad(set_to_none=False)) and the engine's sums of a gradient several ops contribute to.
//   Each contribution dies at once; the sum, held and unread until its consumer runs, was a
//   victim of last resort, and evicting one replayed the backward pass behind it (ResNet at
//   r = 0.3 of its activations 3.57x; a sum's replay of a convolution_backward with its
//   workspace ran it out of memory when only the .grads were frozen).
// - The loss, or another result of a forward op that the program holds and the backward pass
//   has gone past: an optimizer step that updates a parameter in place must first bring back
//   every evicted held storage computed from it (Note [Mutation]), and an evicted loss replayed
//   the forward pass before the first update (`loss.item()` after `opt.step()`; in PyTorch 2.x
//   UNet's loss is a view of the unreduced loss's 64 KiB): 26% of UNet's recomputation at 0.3.
// So when a storage dies, the results of an op reading it are frozen (constants: their contents
// are right) if the op is an in-place op of a backward pass (any op of it with the option of
// Note [Frozen results pass it on]), or a functional forward op, while a backward pass runs,
// whose results were last used at or after the point the pass has read back to (the reach:
// Note [Next use in a backward pass]'s mirror, but moved by evicted inputs too, so that held
// logits are frozen also when lm_head's backward op had to bring the hidden state back:
// runtime/README.md, "Held outputs across the optimizer step"; with backward_next_use 0 neither
// moves and no forward result is frozen); and only if every result whose recipe holds the op is
// resident, held, unlocked and unpinned, so that the op's record goes (or is held only by a
// dead sibling: Note [Dead siblings of a held result]). A dying storage left unread is then
// collected instead of evicted. A held activation the pass has still to read keeps its recipe (freezing saved
// activations would pin the forward pass), and so does a forward in-place sum (freezing an
// LSTM's gate sums ran it out of memory at r <= 0.5) unless it accumulates a dying gradient
// (Note [Accumulators of dead gradients]).
// Freezing is this runtime's choice, not the program's, so Note [Memory floor] counts the frozen
// bytes as evictable (held_result_bytes_; counted as constants they raised the LSTM's floor from
// r = 0.10 to 0.19 of its activations, above budgets that train). The rule does not look at the
// budget: the torch layer's runtime has none (its allocator enforces it). RuntimeConfig::
// freeze_held_results = false (dtr-sim --keep-held-recipes) keeps the recipes, for comparison.
// Where a forward op's held results are much larger than the dying storage, that storage is kept
// instead (Note [Kept inputs of held results]); a backward op's much smaller results are frozen
// too (Note [Smaller backward results]).
//
// Note [Frozen results pass it on]
// RuntimeConfig::freeze_backward_results (DTR_FREEZE_GRADIENTS=1; off by default) extends the
// rule to every op of a backward pass. Its functional ops' results are gradients too, held by the
// autograd engine until the next backward op reads them, or by the program (a parameter's .grad
// with zero_grad(set_to_none=True), PyTorch 2.x's default), and once their inputs die bringing
// one back replays the backward pass behind it; and the dead storages their recipes keep
// recorded border the forward activations the backward pass reads, in every walk of their
// evicted neighborhoods. On ResNet at r = 0.35 of its activations (dtr-sim, one trace) freezing
// them cut the recomputation that native_batch_norm_backward's inputs needed from 95M to 25M
// (1.42x -> 1.19x). Freezing them alone broke the 64-layer chain (out of memory above r = 0.5):
// a frozen gradient that dies once the next backward op has read it is a dead constant, kept
// resident for as long as that op's result's recipe reads it, and 2.4 MiB of them piled up. So
// a frozen result that dies passes the rule on (ReleaseDeadConstant): the held results of the
// ops that read it are frozen in turn, and it is collected once no record reads it (a reader
// kept by a dead sibling keeps it resident); each gradient is then resident from its input's
// death to its own, as without dtr. Since stop 78 this holds without the option too, for what
// this runtime froze as held results (a backward pass's in-place sums, the loss, the results of
// Note [Smaller backward results], ...), to held results of its backward readers together at
// most kPassOnRatio times the dying one's size: a frozen sum that died while an evicted gradient's
// recipe still read it stayed resident until that record went (Note [Dead constants in
// accumulating recipes] frees a dead constant only from in-place readers). Hugging Face's Mamba
// sums the gradients of its scan's 2 MiB discretized A and B that way, read by exp's and mul's
// backward ops: four such sums, 8 MiB against a 15 MiB budget, stayed resident through the rest
// of the backward pass, and the scan thrashed. Without the limit, the lm's 4-byte frozen loss
// seed passed the freeze on to its 13.6 MiB gradient of the log-probabilities and on, 19 MiB
// unevictable at its peak; 64 keeps what passing it on gains in dtr-sim on activations.md's
// traces (with the two rules below: ResNet at r = 0.3 1.64x -> 1.49x, the LSTM at 0.15 2.62x ->
// 2.18x, the Transformer trains at 0.1; no cell worse; runtime/README.md). The option's price is at
// the floor: a held gradient is no longer a victim of last resort (Note [Results awaiting their
// reader]) but a constant, and where only evicting one made room the run stops out of memory:
// tests/hooks' MLP, whose parameters, gradients and momentum are most of its peak, at 0.95 of
// its peak; the LSTM at r = 0.15 (2.48x before) and, in real runs, below 0.375 of its peak
// instead of 0.35. Faster elsewhere (bench/results/activations.md and cpu.md, stop 58), but a
// user's run that trained must not stop training, so it is an option.
//
// Note [Kept inputs of held results]
// The held results the rule above freezes are often far larger than the storage whose death
// freezes them: a causal language model's logits (batch x sequence x vocabulary), held in the
// output object the program keeps until the next step, are frozen when the final hidden state
// (batch x sequence x hidden) dies in the backward pass. Frozen, they are resident and
// unevictable through the rest of the backward pass, where memory is tightest. So when the
// results to freeze of forward ops reading the dying storage are together at least
// kKeptInputRatio times its size, and it is resident, the dying storage is kept instead: a
// constant (ConstantReason::kKeptInput, counted by Note [Memory floor] as this runtime's choice,
// like frozen results), dead, resident for as long as a recipe reads it (no in-place reader is
// frozen to release it, unlike other dead constants); the held results keep their recipe, often
// that one op over resident or constant inputs, and stay evictable. The
// optimizer's update of the weight they read brings them back and freezes them (Note
// [Mutation]), as it did before the rule above existed, and the kept storage goes with the last
// recipe reading it. Hugging Face's Mamba at half its activations (dtr-sim, stop 78): its 2 MB
// logits against a 128 KiB hidden state; with Note [Smaller backward results] and frozen results
// passing it on, this trains it at r = 0.5 (1.78x) and 0.45 (4.24x), where without it the scan
// ran out of memory at 0.5. Results of in-place ops and of the backward pass are frozen as before.
//
// Note [Smaller backward results]
// When a storage dies, a backward op that read it and whose held, resident results together
// are at most 1/kSmallerResultRatio of its size has them frozen (a sum over a broadcast
// dimension, the gradient of a matmul's smaller operand): keeping them costs little, and the
// dying storage is then collected with the records behind it instead of evicted with them kept,
// so a dead constant those records kept resident goes too. Mamba's scan backward reduces 2 MiB
// gradients to dt's 256 KiB and A's 4 KiB; without this the chain of its exp's backward kept the
// frozen sums above resident (it runs out of memory at r = 0.55 with passing on alone, trains at
// 1.36x with both). Larger results keep their recipes: freezing every backward result is the
// option of Note [Frozen results pass it on], whose price is at the floor.
//
// Note [Dead siblings of a held result]
// An op's record goes only when no recipe holds it, and a multi-output op's outputs share it.
// nll_loss_forward returns the loss and total_weight; the program drops total_weight at once, but
// nll_loss_backward reads it, so it is evicted with its record kept for as long as a gradient's
// recipe reads it. Requiring the op to go then never froze the loss: on the TreeLSTM at 0.25 of
// its peak (dtr-sim, the sweep's trace) two optimizer steps brought the evicted loss back before
// their first update, replaying the forward pass (the last one 1,398 rematerializations, 10% of
// the run's recomputation; the run's compute ratio 4.70x, 4.14x without them). So an
// output that is dead and evicted does not keep its held siblings from being frozen; the op and
// the dying storage's record then stay for it (a dying storage is evicted, as without the rule;
// a dying frozen one, Note [Frozen results pass it on], stays resident until the record goes),
// and the frozen ones no longer need them. A dead sibling still resident blocks, as before: it
// may be in use. Besides the loss the rule freezes the statistics native_batch_norm and
// native_layer_norm save for the backward pass once their input dies (their output is the dead
// sibling); they die a few ops later, as constants that stay resident while a gradient's recipe
// reads them: up to 16 KiB more on the Transformer with no budget. In dtr-sim ResNet is slightly
// slower for it (0.45 of its peak, three traces: 1.71-1.75x -> 1.77-1.81x; not from the
// statistics alone), the TreeLSTM faster (0.25: 3.62-4.47x -> 3.24-4.27x).
bool Runtime::FreezeHeldResultsOf(StorageId dying, bool pass_on) {
  // Note [Accumulators of dead gradients]
  const bool dying_gradient = rec(dying).rematerializable() && rec(dying).backward_recipe;
  // Every case below needs a backward pass under way, a dying gradient or a reader that ran in
  // a backward pass: most deaths, an activation dying in a forward pass, have none of them.
  if (!in_backward_pass_ && !dying_gradient &&
      std::none_of(rec(dying).readers.begin(), rec(dying).readers.end(),
                   [&](OpId op_id) { return ops_[op_id].backward; }))
    return false;
  // Forward results apart: Note [Kept inputs of held results] may keep `dying` instead; and
  // what a dying frozen result passes on, which must not outweigh it.
  absl::InlinedVector<StorageId, 4> frozen, forward_frozen, passed_on, accumulators;
  uint64_t forward_frozen_bytes = 0, passed_on_bytes = 0;
  const uint64_t dying_size = rec(dying).size;
  for (OpId op_id : rec(dying).readers) {
    const OpRecord& op = ops_[op_id];
    const bool backward_result = op.backward && (op.in_place || config_.freeze_backward_results);
    const bool forward_result = !op.backward && !op.in_place && in_backward_pass_;
    const bool accumulator = dying_gradient && !op.backward && !in_backward_pass_ && (op.in_place || op.copies_input);
    // Note [Smaller backward results], or what a dying frozen result passes on (Note [Frozen
    // results pass it on]).
    const bool functional_backward = op.backward && !backward_result;
    if (!backward_result && !forward_result && !accumulator && !functional_backward) continue;
    absl::InlinedVector<StorageId, 2> outputs;
    size_t dead_siblings = 0;
    for (StorageId o : op.outputs) {
      const StorageRecord* out = storages_.Find(o);
      if (out == nullptr || !out->rematerializable() || !ContainsValue(out->recipe, op_id)) continue;
      if (DeadAndEvicted(*out)) {
        ++dead_siblings;
        continue;
      }
      // Held, resident, and not in use (a replay frame or the op under way holds it).
      if (!out->resident() || out->external_refs == 0 || out->locks > 0 || out->pins > 0 || out->rebuilding)
        break;
      // The loss, not an activation the pass has still to read: the pass went back past its last
      // forward use (Note [Next use in a backward pass]).
      if (forward_result && !accumulator && out->last_access < backward_reach_) break;
      // As for dead constants: a gradient's bytes for the accumulator's evictability, not a scalar's.
      if (accumulator && dying_size * kDeadConstantRatio < out->size) break;
      outputs.push_back(o);
    }
    // Only if the op goes with them (freezing some of its results leaves it reading `dying`), or
    // if what keeps it is a dead sibling (Note [Dead siblings of a held result]).
    if (outputs.empty() || outputs.size() + dead_siblings != op.recipe_users) continue;
    uint64_t bytes = 0;
    for (StorageId o : outputs) bytes += rec(o).size;
    const bool passing_on = functional_backward && bytes * kSmallerResultRatio > dying_size;
    if (passing_on && !pass_on) continue;
    auto& into = accumulator ? accumulators : passing_on ? passed_on : op.backward ? frozen : forward_frozen;
    uint64_t uncounted = 0;
    uint64_t& into_bytes = passing_on ? passed_on_bytes : forward_result ? forward_frozen_bytes : uncounted;
    for (StorageId o : outputs) {
      if (ContainsValue(frozen, o) || ContainsValue(forward_frozen, o) || ContainsValue(passed_on, o) ||
          ContainsValue(accumulators, o))
        continue;
      into.push_back(o);
      into_bytes += rec(o).size;
    }
  }
  // Note [Frozen results pass it on]: not to results out of all proportion to the dying one.
  if (passed_on_bytes <= dying_size * kPassOnRatio) frozen.insert(frozen.end(), passed_on.begin(), passed_on.end());
  // Note [Kept inputs of held results]
  const StorageRecord& d = rec(dying);
  // Unlocked and unpinned: OnUnreferenced comes here only then (a frozen `dying` is no candidate).
  const bool keep_dying = !forward_frozen.empty() && d.rematerializable() && d.resident() && !d.rebuilding &&
                          d.size * kKeptInputRatio <= forward_frozen_bytes;
  if (!keep_dying) frozen.insert(frozen.end(), forward_frozen.begin(), forward_frozen.end());
  for (StorageId o : frozen) Detach(o, ConstantReason::kHeldResult);
  // Frozen by this runtime, but optimizer state, which lives across steps: Note [Memory floor]
  // counts it as a constant, as it does the accumulators ReleaseDeadConstant freezes.
  for (StorageId o : accumulators) Detach(o, ConstantReason::kAccumulator);
  if (keep_dying) Detach(dying, ConstantReason::kKeptInput);
  return !frozen.empty() || !accumulators.empty() || keep_dying;
}

// Note [Gradients that keep dead constants]
// A gradient computed from no parameter (Note [Accumulators of dead gradients]: a bias gradient
// `sum(grad_output)` of a frozen in-place sum) is not frozen by the optimizer's updates, so
// until it dies, at the next zero_grad(set_to_none=True), its recipe keeps the dead frozen sum
// behind it resident: through the whole next forward pass, where the peak is. On CUDA, a
// 4-layer nn.TransformerEncoder (d 512, batch 32 x 256) held four 48 MiB q/k/v gradient sums
// after every step, 457 MiB against 266 MiB with set_to_none=False, and ran out of memory at 0.7
// of its plain peak, where set_to_none=False trained. So when an op outside a backward pass (the
// optimizer) reads a held, resident gradient (a storage whose recipe ran in a backward pass),
// and a short walk up its recipe through dead storages finds a resident dead constant at least
// a quarter of its size, the gradient is frozen: its contents are final, as the optimizer's first
// update makes those of every gradient computed from a parameter. The gradients of an ordinary
// layer reach no dead constant and keep their recipes.
constexpr int kDeadConstantWalkDepth = 4;

void Runtime::FreezeGradientsKeepingDeadConstants(absl::Span<const StorageId> inputs) {
  for (StorageId in : inputs) {
    const StorageRecord* r = storages_.Find(in);
    // A lock here is the op's own (its caller holds its operands: OpCall::inputs_held); freezing
    // leaves the storage resident and locked.
    if (r == nullptr || !r->backward_recipe || !r->rematerializable() || r->external_refs == 0 ||
        !r->resident() || r->pins > 0 || r->rebuilding)
      continue;
    if (KeepsDeadConstant(in)) Detach(in, ConstantReason::kHeldResult);
  }
}

bool Runtime::KeepsDeadConstant(StorageId gradient) {
  const uint64_t size = rec(gradient).size;
  absl::InlinedVector<std::pair<StorageId, int>, 8> frontier{{gradient, 0}};
  const uint32_t epoch = NextWalkEpoch();
  rec(gradient).walk_epoch = epoch;
  while (!frontier.empty()) {
    auto [id, depth] = frontier.back();
    frontier.pop_back();
    for (OpId op_id : rec(id).recipe) {
      for (StorageId in : ops_[op_id].inputs) {
        StorageRecord* d = storages_.Find(in);
        if (d == nullptr || d->walk_epoch == epoch) continue;
        d->walk_epoch = epoch;
        const bool dead = d->external_refs == 0 && d->locks == 0 && d->pins == 0;
        if (!dead) continue;
        if (!d->rematerializable()) {
          if (d->resident() && d->size * kDeadConstantRatio >= size) return true;
          continue;
        }
        if (depth + 1 < kDeadConstantWalkDepth) frontier.push_back({in, depth + 1});
      }
    }
  }
  return false;
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
  if (FrozenByChoice(why) && r.resident()) held_result_bytes_ += r.size;  // Note [Memory floor]
  ClearRecipe(id);
  ++stats_.detached;
  // Frozen with nobody holding it: Note [Dead constants in accumulating recipes].
  const StorageRecord* now = storages_.Find(id);
  if (now != nullptr && now->external_refs == 0 && now->locks == 0 && now->pins == 0 && now->resident())
    ReleaseDeadConstant(id);
}

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
// Note [Accumulators of dead gradients]
// The same holds for a gradient that dies with its recipe: SGD's momentum buffer is
// `torch.clone(grad)` at the first step and `buf.mul_(m).add_(grad)` after, ops of no backward
// pass, and the buffer's recipe keeps each dead gradient's record, and the records behind it,
// for as long as the buffer lives. Usually a gradient is frozen before it dies (the optimizer
// updates the parameters it was computed from: Note [Mutation]) and the rule above frees it. A
// gradient computed from no parameter is not: the bias gradient `sum(grad_output)` of a linear
// layer whose grad_output is a frozen sum (Note [Held results of dead inputs]), as in the packed
// q/k/v projection of nn.MultiheadAttention and torchvision's Swin, where the three
// select_backward results are summed in place. Its record kept that frozen sum resident, a dead
// constant, one more per step: torchvision's ViT and Swin under SGD with momentum grew by
// 3.3 MiB a step (out of memory at half their activations after 3 steps). So when a gradient
// (a rematerializable storage computed in a backward pass) dies, a resident held storage that a
// forward op accumulated it into in place, or copied it whole into, is frozen as an accumulator
// (FreezeHeldResultsOf), under the same size rule, and the gradient is collected with its
// records; outside a backward pass only, so that a copy a second backward pass will read
// (create_graph) keeps its recipe. A gradient frozen before it dies is a dead constant, and the
// rule above frees it from such a copy too: the first step's gradients, read by the buffers'
// clones, stayed resident through the second step (MobileNetV3-Small held 5.8 MiB more after
// it than after any other). With AdamW the buffers are made by zeros_like and read the gradient
// only in place. A forward op accumulating a gradient into an activation in place would freeze
// the activation too (its contents are right; it only stops being evictable): no model here does.
void Runtime::ReleaseDeadConstant(StorageId id) {
  // Note [Frozen results pass it on]
  if (config_.freeze_held_results && rec(id).constant_reason == ConstantReason::kHeldResult)
    FreezeHeldResultsOf(id, /*pass_on=*/true);
  // Note [Kept inputs of held results]: kept for its forward readers' recipes, which freezing an
  // in-place reader would not release it from.
  if (rec(id).constant_reason == ConstantReason::kKeptInput) {
    MaybeCollect(id);
    return;
  }
  const uint64_t size = rec(id).size;
  std::vector<StorageId> accumulators;
  for (OpId op_id : rec(id).readers) {
    const OpRecord& op = ops_[op_id];
    // Note [Accumulators of dead gradients]: a momentum buffer that copied the gradient whole.
    const bool copy = op.copies_input && !op.backward && !in_backward_pass_;
    if (!op.in_place && !copy) continue;
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
  // A frozen held result frees its accumulators as one: Note [Memory floor] counts both as
  // this runtime's choice.
  const ConstantReason why = rec(id).constant_reason == ConstantReason::kHeldResult ? ConstantReason::kHeldResult
                                                                                     : ConstantReason::kAccumulator;
  for (StorageId o : accumulators) Detach(o, why);
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
      SyncAwaitsReaderFlag(*in_rec);  // it may await its reader now
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
      if (FrozenByChoice(r.constant_reason)) held_result_bytes_ -= r.size;
      backend_->Release(id, r, /*permanently=*/true);
    }
    r.state = StorageState::kBanished;
    ClearRecipe(id);  // may queue inputs
    ++stats_.collected;
    storages_.Erase(id);
  }
}

}  // namespace dtr
