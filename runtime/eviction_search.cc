// Eviction: the pool of evictable storages, the victim search that scores them (sampled or
// exact, with carried runners-up and thrash damping), evicting a victim, and keeping memory under
// the budget (Reserve, EvictAtLeast, SetBudget), with the error that explains an infeasible one.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/bytes.h"
#include "runtime/heuristic.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace dtr {

// Note [Evictable pool]
// pool_ holds exactly the storages that are resident, rematerializable, unpinned and of nonzero
// size; pool_index is each one's position. Locks are transient (held during one op), so locked
// storages stay in the pool and the search skips them.
//
// Note [Candidate table]
// Each pool entry (PoolEntry, records.h) mirrors what a search reads of its storage: cost, size,
// last access and flags for what makes it skipped or in need of its record (locked, awaiting its
// reader, an evicted neighbor, a thrash or rebuild factor that may apply), or scored otherwise
// (a backward pass's result, an activation the backward pass has still to read: Note [Next use
// in a backward pass]; the size gave up its 56th bit to that flag). A sampled search reads
// one aligned 32-byte entry per candidate, loaded together before any is scored (DrawCandidates),
// and reads a record only to walk a neighborhood or reuse a walked cost, for a damping factor,
// for the handles of what a ranking returns (and the victim's), or to find a carried runner-up
// that moved in the pool. Until stop 48 the entry also mirrored the cached neighborhood cost
// (48 bytes, half of them across two cache lines), which only the non-default event-count cache
// read without the record (Note [A decision in a few thousand instructions]).
// Before, every candidate's record was read, twice (scoring, then ranking), each a cache miss
// once the records (about 200 bytes each) outgrow the cache. Whatever changes a mirrored field
// of a pool member refreshes its entry (SyncPool or RefreshPoolEntry; Touch writes the last
// access; SetPoolFlag one flag, Note [One flag, one write]) before anything can search;
// CheckInvariants compares every entry with its record between operations (locks are 0 there, so
// kLocked is only checked clear), and the fuzzers fail if one refresh is left out. Decisions are
// the same as reading the records: dtr-sim's output is identical on 168 runs (generated chain,
// U-Net, TreeLSTM and random DAG; seven heuristics; 0.7, 0.5 and 0.3 of the peak; sampled and
// exact search). runtime_bench (bench/results/runtime.md): ranking 32
// candidates at 1e5 and 1e6 storages in 10.9 and 17.3 us, against 14.5 and 23.2 us; a dtr-eq
// decision at 1e5 16.7 us against 20.2 us.
//
// Note [One flag, one write]
// A lock, an await, a pending read (Note [Inputs a rematerialization will read]), a program
// reference, a reader gained or lost and a backward pass's read each change fields that one flag
// alone mirrors (kLocked, kAwaited, kPending, kAwaitsReader, kAwaitsBackward), and every op
// locks, unlocks and reads its inputs. Since an entry mirrors its record whenever a field
// changes (above), such a change can move only that flag, so it is written alone (SetPoolFlag)
// instead of the entry being filled again from the record (FillPoolEntry reads fourteen fields).
// CheckInvariants still compares whole entries, and the fuzzers with it: a change that relied on
// an unlock's refill to reach the entry would fail them. Measured with -O3 (callgrind, what dtr
// adds a recorded op under a budget that never binds): the chain 6,931 -> 6,464 instructions,
// the Transformer 9,339 -> 8,697, of which -O3 about 160-190 (bench/results/runtime.md, stop 68).
//
// Note [Victim search]
// Sampled mode scores max(min_samples, ceil(sample_factor * sqrt(n))) uniformly drawn pool
// entries plus the kCarriedCandidates best runners-up of the previous search (re-scored: scores
// move with the clock), evicts the lowest, and carries the new runners-up forward. Carrying
// good candidates across searches (as Redis's approximate LRU does with its eviction pool) keeps
// sampling from settling on a poor victim when a small sample misses every good one, which
// made sampled search thrash on TreeLSTM traces. The draws are SplitMix64's (runtime/split_mix.h;
// std::mt19937_64 through std::uniform_int_distribution until stop 44, a tenth of a decision at
// 1e5 storages). Exact mode scores all n. Storages smaller than
// small_storage_fraction of the pool's mean size are skipped unless nothing else is evictable.
// Scores are multiplied by (1 + thrash_damping * decayed recent remats), Note [Thrashing].
// The sample stops growing at max_samples (64): the best of K uniform draws lies in the best
// q of the pool with probability 1 - (1 - q)^K whatever n is, and the carried runners-up add
// to it. On a generated TreeLSTM of 680k events (50k storages in the pool) the cap cost 0.2%
// of compute at r = 0.3 (1.2447x against 1.2422x with sqrt(n), about 150 a search; 128 gave
// 1.2428x, 32 gave 1.2496x) and made each decision a fixed price, not one that grows with n
// (bench/results/runtime.md).
//
// Note [Small pools are searched whole]
// A pool of at most exhaustive_pool entries (256) is scored whole, sampled mode or not: the
// heuristic as it is defined, where that is cheap. The sample's guarantee above is relative (the
// best q of the pool), and near the smallest budgets one decision outside the very best can cost
// a cascade of replays. The benchmark models' pools hold at most 256 entries when a search runs
// (a sample of 256 decided exactly as exact search on all 42 runs compared: 7 models, 3 traces,
// r = 0.5 and 0.3), where sampled mode drew 32 and re-scored 16 carried runners-up. On the
// traces of bench/activation_budgets.py (3 a model, the same budgets; sampled: medians over
// seeds 1-3), sampled against whole, at r = 0.3 of the activations: DenseNet 6.73x -> 1.72x,
// UNet 5.09x -> 3.68x, the LSTM 1.97x -> 1.92x, the chain 1.55x -> 1.50x; at 0.4: ResNet 1.88x
// -> 1.55x, UNet 1.75x -> 1.60x, DenseNet 1.54x -> 1.34x; the TreeLSTM at 0.2 and 0.15 3.35x ->
// 2.92x and 20.8x -> 13.1x. Of the 39 cells that trained both ways, 33 cost less, 3 the same and
// 3 more, inside the sampled runs' range (bench/results/activations.md, "Small pools are
// searched whole"). A whole search costs more per decision: up to 189 us against 33 us sampled
// on runtime_bench's worst case, where every candidate borders a long evicted chain; real runs'
// search time a step stayed the same or fell, since better victims mean fewer searches
// (runtime.md). Larger pools are sampled as before, at a fixed price per decision.
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
// Not when its recipe is a single op whose inputs are constants (replay depth 1): then there is no
// chain behind it, that op is all a rematerialization replays, and its score already prices it.
// (Longer recipes of constants alone, x = randn(); x.mul_(2), stay last resorts: the rule is
// conservative.) The common case is a parameter's gradient zeroed in place by
// `optimizer.zero_grad(set_to_none=False)` (an overwriting zero_: Note [Overwriting in-place ops],
// hooks/op_classification.cc). Until the backward pass accumulates into it, it holds zeros that a
// fill brings back, yet as a last resort it kept a whole set of gradients resident through every
// backward pass: on the TreeLSTM at r = 0.175, 563 KiB of a 1.36 MiB budget was held and unread
// when the first last-resort eviction came, half of it zeros; the other half, the autograd
// engine's sums of the gradients of shared weights, were then evicted and replayed the backward
// pass. A batch made by a factory is another case. Such a storage is an ordinary candidate; once
// an in-place op accumulates into it, its depth grows and it is a last resort again. On
// bench/activation_budgets.py's traces (3 a model x seeds 1-3, medians), before -> after: the
// TreeLSTM at r = 0.2 1.61x -> 1.21x and at 0.15 out of memory (or 208x with no recomputation
// limit) -> 1.30x; ResNet at 0.5 1.27x -> 1.13x, at 0.3 3.41x -> 3.32x; UNet at 0.3 2.53x ->
// 2.26x; the Transformer at 0.2 2.12x -> 1.65x; the LSTM at 0.3 1.78x -> 1.32x; the chain at 0.1
// 2.92x -> 1.35x (bench/results/activations.md, stop 56).
//
// Note [Results of the backward pass]
// The same holds, less strictly, for everything a backward pass computes while later backward
// ops still read it: a gradient that waits to be accumulated or split (DenseNet's concatenations,
// a residual's sum, a recurrent state's), a parameter's gradient between its accumulations.
// Bringing one back replays backward ops whose inputs, the gradients before them, are dead and
// evicted, and so on back to the loss; e* prices only the evicted set around it, which by then
// is shared with the forward activations (one large set), so its score hardly differs from an
// activation's. In a trace of DenseNet at 0.275 of its activations (r), bringing back 5 evicted
// batch-norm gradients replayed 950 ops, a quarter of all the recomputation: the cliff of issue
// 16 (activations.md, "Results of the backward pass"). So the torch layer marks the ops the
// autograd engine runs for a backward pass (a graph task is current on the thread; gradient mode
// would also mark the forward ops of custom autograd Functions, reentrant checkpointing and
// AOTAutograd), and a storage whose recipe holds one has its score multiplied by
// backward_protection (10 until stop 54, 100 since: Note [Next use in a backward pass]). The
// search then evicts any activation that scores up to that many times worse before it, and
// still takes it when nothing else comes close, so a budget that needs it trains. Where the
// allocator picks among the ranked candidates the first that fits a request alone
// (Engine::EvictRankedOn, the CUDA allocator's fragmentation-aware choice), a fitting
// gradient can still go before activations that do not fit. On bench/activation_budgets.py's
// traces (3 a model x 3 seeds, the same traces), 10 against 1: DenseNet at r = 0.25 2.13x
// against 4.12x, ResNet trains at 0.3 (3.48x, out of memory before), the TreeLSTM at 0.2 and
// 0.15 2.40x and 10.86x against 3.22x and 11.21x, the Transformer at 0.2 2.25x against 2.45x; the
// LSTM at 0.15 costs 4.14x against 3.75x; every other cell is within 0.05x. A factor of 30
// decided about as 10 on one trace of each model. Marking every op run with gradient mode off
// instead (the optimizer's updates too) gave about the same on other traces of these models
// (DenseNet at 0.25 2.05x, ResNet at 0.3 3.51x, the TreeLSTM at 0.2 2.52x).
//
// Note [Next use in a backward pass]
// Staleness stands for how soon a storage is needed again (the DTR paper's h divides by it).
// In a backward pass it stops telling: every activation was last used in the forward pass, so
// all are about as stale, and the search evicted the convolution outputs the backward pass reads
// next as readily as those it reads last (ResNet at r = 0.5 replayed 14 of its 33 replayed
// storages 2-3 times a step: activations.md, stop 49). Yet a backward pass reads the
// activations about in the reverse of their last forward use. So the runtime keeps a mirror:
// when a backward op starts (Runtime::OpCall::backward), the latest last access among its inputs
// that a forward op computed and no backward op has read yet (awaits_backward, mirrored as
// PoolEntry::kAwaitsBackward) moves the mirror back to it, never forward (a backward pass
// starts with the mirror at the clock; the first forward op after it ends the pass). Such an
// activation last used at f <= mirror is read in about d = 2 (mirror - f) + 1 clock units, a
// backward op costing about twice its forward op, and is scored with staleness^(1 - w) d^w
// instead of its staleness, w = backward_next_use (0.75). Activations the pass has read, or gone
// by without reading (f > mirror: a forward op read them last, say a concatenation, but an
// earlier one saved them), and everything else, keep their staleness. Two rules keep the
// mirror honest. A forward op's in-place write does not set the flag: the optimizer's
// zero_grad writes every gradient before the forward pass, and the backward pass accumulates
// into them from the last layer to the first, so their write time would pull the mirror back
// to the start of the step at the first accumulation. And an evicted input, which the
// backward op is about to bring back, does not move the mirror: letting it took UNet at r =
// 0.4 1.69x -> 1.82x and the Transformer at 0.175 2.50x -> 2.72x, and the LSTM at 0.2 2.44x ->
// 2.28x (measured, not understood). The cost: a flag test per candidate, and two square roots
// per activation the pass has still to read (not measured apart: runtime_bench's fixture
// has no backward ops).
// Measured in dtr-sim on activations.md's traces (3 a model x 3 seeds, medians), against w = 0
// with the backward protection of 10: r = 0.5: ResNet 1.34x -> 1.27x, the LSTM 1.27x -> 1.21x,
// UNet 1.24x -> 1.28x, the others within 0.01x; r = 0.3: DenseNet 1.67x -> 1.55x, the LSTM
// 1.95x -> 1.78x, the TreeLSTM 1.29x -> 1.19x, the chain 1.24x -> 1.20x, UNet 2.42x -> 2.53x,
// ResNet 3.39x -> 3.41x; lower: the TreeLSTM at 0.2 and 0.175 2.11x and 5.04x -> 1.61x and
// 2.44x (at 0.15 its 30.8x thrash now stops at Note [Recomputation limit]), the LSTM at 0.2
// 2.90x -> 2.44x. It costs more on UNet (0.45 1.32x -> 1.42x, 0.3 and 0.275 by 0.1x), near
// the Transformer's floor (0.225 1.83x -> 1.90x, 0.175 2.35x -> 2.50x), on the chain at its
// smallest budgets (0.125 1.90x -> 2.03x, 0.1 2.40x -> 2.92x) and the LSTM at 0.175 (3.54x ->
// 3.61x). The estimate makes the activations the pass reads next score up to
// about ten times higher, enough to put the results of the backward pass (Note [Results of the
// backward pass]) before them again: with a protection of 10, DenseNet at 0.25 went 1.98x ->
// 4.87x, bringing back batch-norm and convolution gradients; with 100 it is 1.96x. The
// protection of 100 alone (w = 0) changes no cell by more than 0.05x but the TreeLSTM at
// 0.175 (3.26x) and the LSTM at 0.175 (3.86x). Tried and not adopted (bench/results/runtime.md,
// "Next use in a backward pass"): w = 1 (the TreeLSTM at 0.2 3.58x), 0.9 and 0.5; the first
// forward use instead of the last; other estimates for activations the pass went by; falling
// back to staleness while replays cost more than the program; evicted activations passing
// their forward time to their recipes' inputs.
//
// Note [Thrashing]
// Each rematerialization adds one to the storage's recent_remats, which halves every
// thrash_half_life_ops ops. The victim search multiplies the score by
// (1 + thrash_damping * recent_remats), so a storage that keeps coming back is kept longer;
// reaching thrash_report_threshold counts a thrash event in the stats.
// Damping is off by default since stop 32 (thrash_damping 0; the DTR paper's heuristic has no
// such factor). On the benchmark traces (bench/activation_budgets.py's, medians of 3 traces x 3
// seeds, dtr, r from 0.6 to 0.25, 34 cells that trained) a damping of 1 cost more in 22 cells
// and less in 6 (many by 0.01x, within noise). The large differences: the TreeLSTM at r = 0.25
// 5.90x against 3.14x (its cliff below 0.3) and 1.57x against 1.36x at 0.4, DenseNet at 0.35
// 2.26x against 1.80x, UNet at 0.4 1.88x against 1.71x, ResNet at 0.4 1.75x against 1.61x; it
// helped DenseNet at 0.3 (2.46x against 2.93x) and the LSTM at 0.3 and 0.25 (2.17x and 2.31x
// against 2.21x and 2.50x). A budget that thrashes all the same fails clearly under Note
// [Recomputation limit] (remat.cc).

using runtime_internal::IdString;

// ---- Pool -----------------------------------------------------------------------------------

bool Runtime::Eligible(const StorageRecord& r) const {
  return r.resident() && r.rematerializable() && r.pins == 0 && r.size > 0;
}

void Runtime::SyncPool(StorageId id) {
  StorageRecord& r = rec(id);
  bool in_pool = r.pool_index != UINT32_MAX;
  bool eligible = Eligible(r);
  if (eligible && in_pool) {
    FillPoolEntry(r, &pool_[r.pool_index]);
  } else if (eligible) {
    r.pool_index = uint32_t(pool_.size());
    PoolEntry e;
    e.id = id;
    FillPoolEntry(r, &e);
    pool_.push_back(e);
    pool_bytes_ += r.size;
  } else if (in_pool) {
    const PoolEntry last = pool_.back();
    pool_[r.pool_index] = last;
    rec(last.id).pool_index = r.pool_index;
    pool_.pop_back();
    r.pool_index = UINT32_MAX;
    pool_bytes_ -= r.size;
  }
}

// ---- Victim search --------------------------------------------------------------------------

// The flags whose factors need EntryDamping; an entry with none has a damping of 1.
static constexpr uint64_t kDampingFlags =
    PoolEntry::kRemats | PoolEntry::kRebuilt | PoolEntry::kBackward | PoolEntry::kPending;

// Inline in the searches below: every candidate of every search starts here. The caller counts
// it in stats_.candidates_scored and passes what it reads of the runtime (the heuristic, the
// clock), which a pass over many candidates reads once.
inline Runtime::PartialScore Runtime::StartScore(const PoolEntry& e, HeuristicKind kind, double now) {
  PartialScore p;
  p.kind = kind;
  p.in.cost = e.cost;
  p.in.size = double(int64_t(e.size));  // below 2^55: exact, and one instruction where unsigned takes several
  p.in.staleness = std::max(now - e.last_access, 0.0) + 1.0;
  // Note [Next use in a backward pass]: in a backward pass most candidates carry the flag, so no
  // branch hint.
  if ((e.flags & PoolEntry::kAwaitsBackward) && in_backward_pass_)
    p.in.staleness = BackwardStaleness(e.last_access, p.in.staleness);
  if (kind == HeuristicKind::kRandom) p.in.random = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (e.flags & kDampingFlags) [[unlikely]] p.damping = EntryDamping(e);
  return p;
}

// The factors a few entries carry (Note [Thrashing], Note [Rebuilt segments], Note [Results of the
// backward pass], Note [Inputs a rematerialization will read]); out of line, so the pass over the
// candidates stays short.
double Runtime::EntryDamping(const PoolEntry& e) {
  double damping = 1;
  const bool thrash = config_.thrash_damping > 0 && (e.flags & PoolEntry::kRemats);
  const bool rebuilt = rebuilds_underway_ > 0 && (e.flags & PoolEntry::kRebuilt);
  if (thrash || rebuilt) damping = Damping(e.id, thrash, rebuilt);  // else the entry is all there is to read
  if (e.flags & PoolEntry::kBackward) damping *= config_.backward_protection;  // Note [Results of the backward pass]
  // Note [Inputs a rematerialization will read]
  if (e.flags & PoolEntry::kPending) damping *= config_.pending_protection;
  return damping;
}

// Note [Next use in a backward pass]
double Runtime::BackwardStaleness(double last_access, double staleness) const {
  if (last_access > backward_mirror_) return staleness;  // the pass went by without reading it
  constexpr double kBackwardPace = 2;  // a backward op costs about twice its forward op
  const double d = (backward_mirror_ - last_access) * kBackwardPace + 1.0;
  const double w = config_.backward_next_use;
  if (w == kDefaultBackwardNextUse) return std::sqrt(std::sqrt(staleness * d * d * d));  // 0.75, without pow
  return std::pow(staleness, 1 - w) * std::pow(d, w);
}

double Runtime::Damping(StorageId id, bool thrash, bool rebuilt) {
  const StorageRecord& r = rec(id);
  double damping = 1;
  if (thrash) {
    double age = double(op_counter_ - r.last_remat_op) / double(config_.thrash_half_life_ops);
    damping = 1 + config_.thrash_damping * r.recent_remats * std::exp2(-age);
  }
  // Note [Rebuilt segments] (remat.cc): on top of Note [Thrashing]'s factor, not instead of it.
  if (rebuilt && r.rebuild_epoch == rebuild_epoch_) damping *= config_.rebuild_protection;
  return damping;
}

double Runtime::PartialScore::CostLimit(double above) const {
  double limit;
  switch (kind) {
    case HeuristicKind::kDtrEq:
    case HeuristicKind::kDtr:
      limit = above / damping * (in.size * in.staleness) - in.cost;
      break;
    case HeuristicKind::kMsps:
      limit = above / damping * in.size - in.cost;
      break;
    default:
      return -std::numeric_limits<double>::infinity();
  }
  // Rounding, cancellation included: let Final decide near the boundary.
  return limit - (std::abs(limit) + in.cost) * 1e-9;
}

double Runtime::ScoreUnchecked(const PoolEntry& e) {
  ++stats_.candidates_scored;
  const PartialScore p = StartScore(e, config_.heuristic, now_);
  return p.FinalInline(EntryNeighborhoodCost(e));
}

double Runtime::ScoreOf(StorageId id) {
  JoinPendingEvictions();  // Note [Joins at the next search]
  PoolEntry e;
  e.id = id;
  FillPoolEntry(rec(id), &e);
  return ScoreUnchecked(e);
}

// Note [Bounded victim search]
// dtr's and msps's neighborhood costs are graph walks (Note [Bounded neighborhood walks]), and
// under a tight budget much of a search's time goes into walking the large evicted regions of
// candidates that cannot win. A score never falls as its neighborhood cost grows (PartialScore::Final), so a
// candidate is out once its score with the cost walked so far exceeds the score it must beat,
// and its walk stops there. What it must beat is the keep-th best score of distinct candidates
// found so far: the best alone in an exhaustive victim search, the best and the
// kCarriedCandidates runners-up in a sampled one (they are carried into the next search, Note
// [Victim search]), the max_count best in a ranking (Note [Ranked candidates]; above 64 kept,
// every candidate is scored in full). Candidates are
// walked in the order of their scores with no neighborhood (a lower bound), so good bounds
// come early; small storages compete only among themselves, so they have their own bound.
// The comparison is strict and a walk sums its costs in the same order whether or not it is
// cut, so the victim and the carried runners-up are exactly those of scoring every candidate
// in full (Simulator.CuttingLosingWalksKeepsEveryDecision compares both on generated traces,
// RuntimeTest.CuttingLosingWalksKeepsTheRankedList the ranked lists). Heuristics without a
// walk score every candidate in full, in candidate order (kRandom draws in that order, which
// since the sample is drawn before the carried candidates are scored differs from before).
// Measured in dtr-sim (dtr, sampled, --seed 1): on a generated TreeLSTM of 68k events at 0.3 of
// its peak the walks visited 11.1M storages instead of 29.2M (0.32 s against 0.46 s of
// simulation); on the traced TreeLSTM and DenseNet (bench/activation_budgets.py) at 0.5 of their
// peaks, 8% and 21% fewer. Shared evicted regions, not losing candidates, are the rest.
// Since stop 44 the candidates without an evicted neighbor (three quarters of a sample in
// runtime_bench's fixture, whose bound is their score) are scored first, in one pass, and their
// keep best distinct pairs selected (since stop 48 as the pass goes, Note [A decision in a few
// thousand instructions]; from stop 44 by nth_element, then a sort of those kept); the walks
// follow in the order of their bounds, each held to the keep-th best of all of those and of the
// walks before it. That bound is at least as tight as stop 43's, which merged those candidates in
// as the walks passed their scores, so the victim and the carried runners-up are the same and
// fewer walks run (Simulator.CuttingLosingWalksKeepsEveryDecision). The kept pairs are what a
// sampled search carries, and its victim is their first (ChooseVictim's pass over the candidates
// runs only when nothing was kept or a tie at the top reaches the last pair of a full list).
// Decisions are the same as before: dtr-sim's output, but for the neighborhood visits and cache
// hits, is identical to stop 43's on 288 runs of generated traces (chain, U-Net, TreeLSTM, random
// DAG; dtr, msps, dtr-eq, lru; 0.7/0.5/0.3; sampled, exact, never whole) and 360 of the benchmark
// models' traces (dtr, dtr-eq, msps; 0.8 to 0.3), with the old draws; visits 2.9% and 0.4% fewer
// in all. A cut walk left nothing to reuse, so in runtime_bench's fixture the tighter bound
// repeated losing walks (visits at 1e5 8.2 -> 18.6 an op); a cut walk now leaves a bound (Note
// [Cut walks leave a bound], neighborhoods.cc: 3.5; on the same runs, with the new draws, 4.6% and
// 2.0% fewer visits than stop 43). Under the non-default 8-event
// cache (an approximation whose values depend on which walks completed) 18 of 96 runs decide
// differently, as many better as worse. The fixture at 1e5 storages: 27.8k -> 18.9k instructions
// an op with its eviction, with the SplitMix64 draws (Note [Victim search]), and medians of 13.0
// -> 10.4 us (bench/results/runtime.md, "A leaner victim search").
//
// Note [A decision in a few thousand instructions]
// Issue 16 asks for a decision in at most 2 us at 1e5 live storages. At stop 47 a sampled one
// took 15.0k instructions and about 5 us in runtime_bench's fixture (BM_NextVictimSampled), for
// 80 candidates: about 190 instructions a candidate where scoring one is a division and a
// comparison. Stop 48 cut it to about half without changing a decision:
// - The kept pairs are chosen as the first pass goes: the carried runners-up come first and in
//   their order (Note [Victim search]), so they join the list at its end, and once it is full a
//   fresh draw is turned away by one comparison with a local copy of its last pair. KeepBest
//   (nth_element, then a sort of those kept, both branching on every comparison) went.
// - The first pass reads what it needs of the runtime once (the clock, the arrays' bases, the
//   heuristic as a constant of each instance, the scored count in a local): a store through the
//   arrays could alias a member, so the compiler reloaded or wrote back each on every candidate.
// - A candidate with an evicted neighbor whose bound already exceeds what a walk must beat is
//   left out of the walks there (what a walk must beat only falls as the search goes, so it
//   would have been passed over), and only the others' records are loaded: stop 47 loaded the
//   record of every such candidate (a quarter of a sample) for about one walk a decision.
// - Candidates are pool indices, read where they are, not 56-byte copies; a whole-pool search
//   no longer copies the pool.
// - A pool entry is 32 bytes, aligned (Note [Candidate table]): one cache line a candidate
//   instead of 1.5 on average.
// The victim and the carried runners-up are the same: dtr-sim's output, but for neighborhood
// visits and cache hits, is identical to stop 47's on 224 runs (the eight benchmark models'
// traces under dtr, msps and dtr-eq at 0.7, 0.5 and 0.35 of the peak, sampled, exact and sampled
// with --exhaustive-pool 0; a generated U-Net and TreeLSTM of 102k and 680k events, sampled) and
// on 66 under the 8-event cache with --check. Measured in bench/results/runtime.md ("A decision
// in a few thousand instructions").
static constexpr double kUnscored = -1;  // scores are never negative
static constexpr size_t kMaxKeptForCutting = 64;
// Note [Prefetched neighborhoods]: a whole pool is scored without prefetching (its loads would
// not stay in the cache until scored), and so are a few thousand records, which the cache holds.
static constexpr size_t kMaxPrefetchedCandidates = 256;
static constexpr size_t kMinStoragesToPrefetch = 8192;

static constexpr uint64_t kSkippedFlags = PoolEntry::kLocked | PoolEntry::kAwaitsReader | PoolEntry::kAwaited;
static bool Skipped(const PoolEntry& e) { return e.flags & kSkippedFlags; }

// Note [Prefetched neighborhoods]
// A union-find neighborhood cost (dtr-eq) reads, for each evicted-neighbor candidate, its recipe
// and reader ops, their inputs' and outputs' records, and each evicted one's component: three
// dependent loads per neighbor, each a cache miss once the records outgrow the cache, one
// after another. A sampled search's candidates are independent, so their loads can overlap:
// before scoring, one pass starts loading every such candidate's ops, a second their
// neighbors' records, a third the evicted neighbors' union-find links. Loads only: the scores,
// and so the decisions, are the same. runtime_bench, recording an op that evicts, dtr-eq (AMD
// EPYC, 2026-11-28, runs interleaved with the build before; bench/results/runtime.md): at 1e5
// storages 21-24 us -> 13-15 us, at 1e6 27-29 us -> 23-24 us; at 1e3, where the records fit in
// the cache, the passes cost more than they save (about 1 us), so small runtimes skip them.
// dtr's walks (the default heuristic) gained nothing and lost at 1e6 (14.6 -> 18-19 us): most
// of their candidates are cut before any walk, so their loads would be wasted; they are not
// prefetched. The second pass lists neighbors as ForEachNeighbor does, but without its check
// that a reader's output holds the reader in its recipe: that check reads the very records
// being prefetched (a few extra loads cost less than a miss each).
void Runtime::PrefetchNeighborhoods() const {
  for (const uint32_t index : candidates_) {
    const PoolEntry& e = pool_[index];
    if (!(e.flags & PoolEntry::kNeighborEvicted)) continue;
    const StorageRecord& r = storages_[e.id];
    for (OpId op : r.recipe) ops_.Prefetch(op);
    for (OpId op : r.readers) ops_.Prefetch(op);
  }
  for (const uint32_t index : candidates_) {
    const PoolEntry& e = pool_[index];
    if (!(e.flags & PoolEntry::kNeighborEvicted)) continue;
    const StorageRecord& r = storages_[e.id];
    for (OpId op : r.recipe)
      if (const OpRecord* o = ops_.Find(op))
        for (StorageId in : o->inputs) storages_.Prefetch(in);
    for (OpId op : r.readers)
      if (const OpRecord* o = ops_.Find(op))
        for (StorageId out : o->outputs) storages_.Prefetch(out);
  }
  for (const uint32_t index : candidates_) {
    const PoolEntry& e = pool_[index];
    if (!(e.flags & PoolEntry::kNeighborEvicted)) continue;
    ForEachNeighbor(e.id, [&](StorageId n) {
      const StorageRecord& r = storages_[n];
      if (!r.resident()) components_.Prefetch(r.component);
    });
  }
}

void Runtime::InsertAmongBest(const Scored& entry, size_t keep, std::vector<Scored>* best) {
  const size_t n = best->size();  // entry comes before best->back() if the list is full
  Scored* kept = best->data();
  // After every pair not above entry: a binary search, since a ranking keeps 32 and more, and
  // after the carried runners-up most of its draws land inside the list.
  const size_t place = size_t(std::upper_bound(kept, kept + n, entry) - kept);
  // A storage drawn twice is scored the same twice, so the equal pair lies just before the
  // place; except under random, which draws a score per candidate: there a storage drawn twice
  // can be kept, and carried, twice.
  if (place > 0 && kept[place - 1].id == entry.id) return;
  size_t last = n;  // the pair at keep - 1 leaves a full list
  if (n < keep) {
    best->push_back(entry);
    kept = best->data();
  } else {
    last = keep - 1;
  }
  for (size_t j = last; j > place; --j) kept[j] = kept[j - 1];
  kept[place] = entry;
}

void Runtime::ScoreCandidates(size_t keep, double small) {
  const size_t count = candidates_.size();
  candidate_scores_.resize(count);  // every one is written below: a score or kUnscored
  best_.clear();
  // Keeping many (a ranking of the whole pool) would cost more in bookkeeping than it saves.
  const bool keep_best = keep <= kMaxKeptForCutting;
  auto record_score = [&](size_t i, double score) {
    candidate_scores_[i] = score;
    return Scored{score, pool_[candidates_[i]].id, candidates_[i], uint32_t(i)};
  };
  if (!keep_best || !NeighborhoodWalks() || !config_.cut_losing_walks) {
    std::fill(candidate_scores_.begin(), candidate_scores_.end(), kUnscored);
    if (neighborhood_ == NeighborhoodKind::kUnionFind && count <= kMaxPrefetchedCandidates &&
        storages_.size() >= kMinStoragesToPrefetch)
      PrefetchNeighborhoods();
    for (size_t i = 0; i < count; ++i) {
      const PoolEntry& e = pool_[candidates_[i]];
      if (Skipped(e)) continue;
      const Scored entry = record_score(i, ScoreUnchecked(e));
      if (keep_best && double(e.size) >= small) KeepIfAmongBest(entry, keep, &best_);
    }
    return;
  }
  // Note [Bounded victim search]: the candidates without an evicted neighbor are scored in full
  // first (their bound is their score), then the walks go in the order of their bounds, each
  // held to the keep-th best distinct score found so far.
  std::vector<PartialScore>& partial = partial_scores_;
  partial.resize(count);
  search_order_.clear();
  double best_small = std::numeric_limits<double>::infinity();
  // The pass every candidate takes, so what it reads of the runtime is read once: a store
  // through the arrays below may alias a member, which the compiler would otherwise reload
  // (now_, the arrays' bases) or write back (the scored count) on every candidate. Only dtr and
  // msps walk (NeighborhoodWalks), so kRandom's draw is not needed here, and the heuristic is a
  // constant of each instance of the pass.
  const PoolEntry* const pool = pool_.data();
  const uint32_t* const drawn = candidates_.data();
  double* const scores = candidate_scores_.data();
  const double now = now_;
  uint64_t scored = 0;
  auto first_pass = [&](auto heuristic) {
    constexpr HeuristicKind kind = decltype(heuristic)::value;
    // The kept list's last pair while it is full: most candidates lose to it, one comparison.
    bool full = false;
    Scored last{};
    for (size_t i = 0; i < count; ++i) {
      const PoolEntry& e = pool[drawn[i]];
      const uint64_t flags = e.flags;
      scores[i] = kUnscored;  // until scored
      if (flags & kSkippedFlags) continue;
      ++scored;
      const PartialScore p = StartScore(e, kind, now);
      const double bound = p.FinalInline(0);
      if (flags & PoolEntry::kNeighborEvicted) {
        // What a walk must beat only falls as candidates are kept, so one whose bound is already
        // above it would be passed over by the walks below: it is left out of them now. The
        // others' records are loaded now, so that their misses overlap the rest of this pass.
        const bool is_small = p.in.size < small;
        if (is_small ? bound > best_small : full && bound > last.score) continue;
        storages_.Prefetch(e.id);
        partial[i] = p;
        search_order_.push_back({bound, uint32_t(i)});
        continue;
      }
      scores[i] = bound;
      if (p.in.size < small) {
        best_small = std::min(best_small, bound);
        continue;
      }
      // KeepIfAmongBest's test, !(entry < last), on the local copy and before the pair is made.
      if (full && !(bound < last.score) && (bound != last.score || !(e.id < last.id))) continue;
      KeepIfAmongBest({bound, e.id, drawn[i], uint32_t(i)}, keep, &best_);
      full = best_.size() == keep;
      if (full) last = best_.back();
    }
  };
  if (config_.heuristic == HeuristicKind::kDtr) first_pass(std::integral_constant<HeuristicKind, HeuristicKind::kDtr>{});
  else first_pass(std::integral_constant<HeuristicKind, HeuristicKind::kMsps>{});
  stats_.candidates_scored += scored;
  std::sort(search_order_.begin(), search_order_.end());
  for (const auto& [lower_bound, i] : search_order_) {
    const bool is_small = partial[i].in.size < small;
    const double above = is_small                ? best_small
                         : best_.size() < keep ? std::numeric_limits<double>::infinity()
                                                 : best_.back().score;
    if (lower_bound > above) continue;
    bool stopped = false;
    const double nc = EntryNeighborhoodCost(pool_[candidates_[i]], &partial[i], above, &stopped);
    if (stopped) continue;
    const Scored entry = record_score(i, partial[i].Final(nc));
    if (is_small) best_small = std::min(best_small, entry.score);
    else KeepIfAmongBest(entry, keep, &best_);
  }
}

size_t Runtime::SampleSize(size_t n) const {
  size_t samples = std::max<size_t>(config_.min_samples,
                                    size_t(std::ceil(config_.sample_factor * std::sqrt(double(n)))));
  if (config_.max_samples > 0)
    samples = std::min<size_t>(samples, std::max(config_.max_samples, config_.min_samples));
  return samples;
}

bool Runtime::DrawCandidates() {
  const size_t n = pool_.size();
  const size_t samples = SampleSize(n);
  // Note [Small pools are searched whole]
  if (config_.search != SearchMode::kSampled || samples >= n || n <= config_.exhaustive_pool) {
    DrawWholePool();
    return false;
  }
  // Sized, not cleared, and filled in place. The candidates are pool indices: scoring reads the
  // entries where they are (Note [Candidate table]).
  candidates_.resize(carried_.size() + samples);
  uint32_t* next = candidates_.data();
  // The best candidates of earlier searches compete again (Note [Victim search]). An entry
  // moves when another leaves the pool before it: then its record says where it went.
  for (const auto& [id, hint] : carried_) {
    uint32_t index = hint;
    if (index >= n || pool_[index].id != id) {
      const StorageRecord* r = storages_.Find(id);
      if (r == nullptr || r->pool_index == UINT32_MAX) continue;
      index = r->pool_index;
    }
    *next++ = index;
  }
  // Draw the whole sample and start loading its entries before reading any: the pool is in no
  // useful memory order, and the loads then overlap instead of missing one after another. An
  // entry is aligned within one cache line (records.h), so one load each.
  const PoolEntry* const pool = pool_.data();
  for (size_t k = 0; k < samples; ++k) {
    const uint32_t index = uint32_t(rng_.Below(n));
    __builtin_prefetch(&pool[index]);
    *next++ = index;
  }
  // Then start loading the records that scoring will read, those with an evicted neighbor: here
  // for the union-find's costs, each of which reads its record (Note [Prefetched neighborhoods]);
  // dtr's and msps's first pass loads only those of candidates a walk may still need
  // (ScoreCandidates).
  if (neighborhood_ == NeighborhoodKind::kUnionFind)
    for (const uint32_t* index = next - samples; index != next; ++index)
      if (pool[*index].flags & PoolEntry::kNeighborEvicted) storages_.Prefetch(pool[*index].id);
  candidates_.resize(size_t(next - candidates_.data()));  // less the carried that left the pool
  return true;
}

void Runtime::DrawWholePool() {
  candidates_.resize(pool_.size());
  std::iota(candidates_.begin(), candidates_.end(), uint32_t{0});
}

bool Runtime::ChooseVictim(StorageId* victim, double* score) {
  JoinPendingEvictions();  // Note [Joins at the next search]
  size_t n = pool_.size();
  if (n == 0) return false;
  ++stats_.eviction_searches;
  double small = config_.small_storage_fraction * double(pool_bytes_) / double(n);
  double best = 0, best_small = 0;
  uint64_t best_unread_size = 0, best_awaited_size = 0;
  StorageId best_id, best_small_id, best_unread_id, best_awaited_id;
  // Takes candidates_[i] with its score from ScoreCandidates.
  auto consider = [&](size_t i) {
    const PoolEntry& e = pool_[candidates_[i]];
    const StorageId id = e.id;
    const uint64_t size = e.size;
    if (e.flags & PoolEntry::kLocked) return;
    if (e.flags & PoolEntry::kAwaited) {  // Note [Lazy input locks]: the last resort, after unread results
      if (!best_awaited_id.valid() || size > best_awaited_size) best_awaited_size = size, best_awaited_id = id;
      return;
    }
    if (e.flags & PoolEntry::kAwaitsReader) {  // Note [Results awaiting their reader]: last resort
      if (!best_unread_id.valid() || size > best_unread_size) best_unread_size = size, best_unread_id = id;
      return;
    }
    const double score = candidate_scores_[i];
    if (score == kUnscored) return;  // cannot beat what was kept (Note [Bounded victim search])
    if (double(size) < small) {
      if (!best_small_id.valid() || score < best_small) best_small = score, best_small_id = id;
      return;
    }
    if (!best_id.valid() || score < best) best = score, best_id = id;
  };
  // The victim is the first of the kept pairs (sorted by (score, id)) unless others tie its score:
  // then the pass above takes the first of them in candidate order, which the kept pairs know
  // only if none tied with them was turned away.
  auto victim_among_kept = [&](size_t keep) {
    if (best_.empty()) return false;
    const double top = best_.front().score;
    if (best_.size() == keep && best_.back().score == top) return false;
    const Scored* first = &best_.front();
    for (const Scored& c : best_) {
      if (c.score != top) break;
      if (c.candidate < first->candidate) first = &c;
    }
    best = top, best_id = first->id;
    return true;
  };
  if (DrawCandidates()) {
    ScoreCandidates(kCarriedCandidates + 1, small);
    if (!victim_among_kept(kCarriedCandidates + 1))
      for (size_t i = 0; i < candidates_.size(); ++i) consider(i);
    // Carry the runners-up (best first) into the next search: the best kCarriedCandidates + 1
    // distinct pairs ScoreCandidates kept, but the victim.
    carried_.clear();
    for (const Scored& c : best_)
      if (c.id != best_id && carried_.size() < kCarriedCandidates) carried_.push_back({c.id, c.pool_index});
    if (!best_id.valid()) {  // nothing usable in the sample: search the whole pool
      best_small_id = best_unread_id = best_awaited_id = StorageId{};
      DrawWholePool();
    }
  }
  if (!best_id.valid()) {
    ScoreCandidates(1, small);
    for (size_t i = 0; i < candidates_.size(); ++i) consider(i);
  }
  double chosen_score = std::numeric_limits<double>::infinity();  // an unread result's
  if (best_id.valid()) *victim = best_id, chosen_score = best;
  else if (best_small_id.valid()) *victim = best_small_id, chosen_score = best_small;
  else if (best_unread_id.valid()) *victim = best_unread_id;
  else if (best_awaited_id.valid()) *victim = best_awaited_id;  // Note [Lazy input locks]
  else return false;
  if (score != nullptr) *score = chosen_score;
  return true;
}

void Runtime::EvictUnchecked(StorageId id, bool eager) {
  StorageRecord& r = rec(id);
  r.state = StorageState::kEvicted;
  ++residency_changes_;  // Note [Neighborhood cost cache]
  memory_ -= r.size;
  SyncPool(id);
  backend_->Release(id, r, /*permanently=*/false);
  r.component = components_.MakeSet(r.cost);
  ++evicted_count_;
  ++stats_.evictions;
  if (eager) ++stats_.eager_evictions;
  if (r.waits > 0) ++stats_.awaited_evictions;
  if (eager && ExactNeighborhoodCache()) {  // Note [Joins at the next search]
    r.join_pending = true;
    // Queued storages collected since are dropped from time to time, so that a run with no
    // search keeps a queue no longer than twice its evicted storages.
    if (joins_pending_.size() >= 2 * evicted_count_ + 1024) DropCollectedJoins();
    joins_pending_.push_back(id);
  } else {
    JoinEvicted(id);
  }
  MaybeCompactComponents();
}

// Note [Joins at the next search]
// Evicting a storage tells its neighbors: each gets the evicted-neighbor hint (Note
// [Evicted-neighbor hint]) and loses its cached neighborhood cost (Note [Neighborhood cost
// cache]), and the evicted ones' sets are merged with the storage's (EvictedComponents). Only a
// victim search reads any of that, and a storage evicted at its death (eager eviction) is the
// common case with no search at all: with no budget, or one that never binds, every activation
// that dies before its readers is evicted so, and nearly all of them are collected at the next
// optimizer step, unread. So an eager eviction only queues the storage (join_pending), and the
// queue is joined, in order, before anything reads what a join writes: a victim search
// (ChooseVictim, RankedCandidates, NextVictim, ScoreOf) and a rematerialization (Materialize,
// and the storage itself where it comes back). A queued storage collected first is never
// joined; its neighbors then keep caches and sets a join would have invalidated or merged,
// which only the sets' union-find could tell (exact walks sum the same evicted storages, and a
// collected one is in none): dtr-eq's sets merge less, dtr decides the same. Only under the
// exact cache: the event-count cache (DTR_NEIGHBORHOOD_CACHE=N) keeps a cost for N evictions
// however stale, and a join's reset of the neighbors' costs is what refreshes them, so there
// storages are joined at once (found by review: a never-joined neighbor kept a stale cost and
// the victim changed). CheckInvariants accepts a queued neighbor in place of the hint, and skips
// the cached costs a queued join will invalidate. It saves about 0.7k instructions an eager
// eviction (the neighbor lists and their records).
void Runtime::JoinEvicted(StorageId id) {
  StorageRecord& r = rec(id);
  r.join_pending = false;
  std::vector<StorageId>& neighbours = scratch_;
  auto join = [&] {
    for (StorageId n : neighbours) {
      StorageRecord& nr = rec(n);
      nr.neighbor_evicted = true;  // Note [Evicted-neighbor hint]: an evicted one may come back
      nr.neighborhood_walked_at = StorageRecord::kNotCached;  // Note [Neighborhood cost cache]
      RefreshPoolEntry(nr);
      if (!nr.resident()) components_.Union(rec(id).component, nr.component);
    }
  };
  Deps(id, &neighbours);
  join();
  Dependents(id, &neighbours);
  join();
}

void Runtime::DropCollectedJoins() {
  std::erase_if(joins_pending_, [&](StorageId id) { return QueuedJoin(id) == nullptr; });
}

void Runtime::JoinPendingEvictionsSlow() {
  std::vector<StorageId> ids;
  ids.swap(joins_pending_);
  for (StorageId id : ids)
    if (QueuedJoin(id) != nullptr) JoinEvicted(id);
  ids.clear();
  if (joins_pending_.empty()) joins_pending_.swap(ids);  // keeps the capacity
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
  RestartRecomputationWindow();  // Note [Recomputation limit]: a new budget starts afresh
  if (absl::Status s = Reserve(0, "the new budget"); !s.ok()) {
    config_.budget_bytes = old;
    return s;
  }
  return absl::OkStatus();
}

// Note [Ranked candidates]
// The allocators evict from a ranked list (hooks/engine.cc, MakeRoomOn) rather than one victim at
// a time, so they can prefer a victim whose block fits. The list is drawn like a victim search
// (Note [Victim search]): in sampled mode the carried runners-up and a sample are scored, the
// best max_count of them returned and the best kCarriedCandidates carried on (since stop 48 read
// from the search's kept list, Note [A decision in a few thousand instructions]). The whole pool is
// ranked when max_count is more than a sample can hold (a caller looking further down) or when
// the sample holds nothing but locked storages and results awaiting their reader.
// Ranking the whole pool every time, as this did before, cost the real runs more per decision
// than their simulated searches: on a CPU TreeLSTM at 0.6 of its peak, 27 us a decision with
// dtr-eq and 100 us with dtr, 12-19 ms of a 45-55 ms step. Ties rank by id. Results awaiting
// their reader are offered only by a ranking of the whole pool, after every other candidate,
// and the inputs a rematerialization awaits after them (Note [Lazy input locks]).
// A storage drawn twice is listed once (kRandom, which scores each draw anew, may list it twice;
// the second eviction then fails and the caller moves on).
std::vector<Runtime::Candidate> Runtime::RankedCandidates(size_t max_count) {
  std::vector<Candidate> all;
  if (pool_.empty() || max_count == 0) return all;
  JoinPendingEvictions();  // Note [Joins at the next search]
  bool sampled = DrawCandidates();
  if (sampled && max_count > SampleSize(pool_.size()) + kCarriedCandidates) {
    // A caller asking for more than a sample holds is looking further down the ranking
    // (Engine::EvictOnDevice, when the best were all on other devices): rank the whole pool.
    sampled = false;
    DrawWholePool();
  }
  std::vector<Scored>& ranked = scored_;
  bool sorted = false;  // ranked is in order, each storage once
  auto rank = [&] {
    const size_t keep = sampled ? std::max(max_count, kCarriedCandidates + 1) : max_count;
    ScoreCandidates(keep, /*small=*/0);
    ranked.clear();
    // A sample's ranking is ScoreCandidates' kept list: its keep best distinct (score, id) pairs,
    // in order, are the head of what the pass below would sort, and max_count <= keep of them
    // are returned (last resorts are neither scored nor offered by a sample; under kRandom a
    // storage drawn twice has two scores, so it takes the pass).
    if (sampled && keep <= kMaxKeptForCutting && config_.heuristic != HeuristicKind::kRandom) {
      ranked.assign(best_.begin(), best_.end());
      sorted = true;
      return !ranked.empty();
    }
    sorted = false;
    bool any_scored = false;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const PoolEntry& e = pool_[candidates_[i]];
      if (e.flags & PoolEntry::kLocked) continue;
      // Note [Results awaiting their reader]: ranked after every other candidate, so only a
      // ranking of the whole pool offers them (a sample's finite few would not come first);
      // Note [Lazy input locks]: so are awaited inputs, after them.
      const bool awaited = e.flags & PoolEntry::kAwaited;
      const bool last_resort = awaited || (e.flags & PoolEntry::kAwaitsReader);
      double score = std::numeric_limits<double>::infinity();
      if (last_resort && sampled) continue;
      if (!last_resort) {
        score = candidate_scores_[i];
        if (score == kUnscored) continue;  // Note [Bounded victim search]: not among the best
        any_scored = true;
      }
      ranked.push_back({score, e.id, candidates_[i]});
    }
    return any_scored;
  };
  if (!rank() && sampled) {
    sampled = false;
    DrawWholePool();
    rank();
  }
  // Ties rank by id; a sample may draw a storage twice: equal entries are adjacent after the sort.
  if (!sorted) {
    std::sort(ranked.begin(), ranked.end());
    ranked.erase(
        std::unique(ranked.begin(), ranked.end(), [](const Scored& a, const Scored& b) { return a.id == b.id; }),
        ranked.end());
  }
  if (!sampled)  // Note [Lazy input locks]: awaited inputs last
    std::stable_partition(ranked.begin(), ranked.end(),
                          [&](const Scored& c) { return !(pool_[c.pool_index].flags & PoolEntry::kAwaited); });
  if (sampled) {
    carried_.clear();
    for (const Scored& c : ranked) {
      if (carried_.size() == kCarriedCandidates || std::isinf(c.score)) break;
      carried_.push_back({c.id, c.pool_index});
    }
  }
  if (ranked.size() > max_count) ranked.resize(max_count);
  all.reserve(ranked.size());
  for (const Scored& c : ranked) storages_.Prefetch(c.id);
  for (const Scored& c : ranked) {  // only what is returned needs its record
    const StorageRecord& r = rec(c.id);
    all.push_back({c.id, c.score, r.size, r.handle});
  }
  return all;
}

std::optional<Runtime::Candidate> Runtime::NextVictim() {
  StorageId victim;
  double score;
  if (!ChooseVictim(&victim, &score)) return std::nullopt;
  const StorageRecord& r = rec(victim);
  return Candidate{victim, score, r.size, r.handle};
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
  for (const PoolEntry& e : pool_)
    if (!(e.flags & PoolEntry::kLocked)) evictable += e.size;
  return memory_ - evictable;
}

absl::Status Runtime::InfeasibleError(uint64_t bytes, absl::string_view what) const {
  uint64_t pinned = 0, locked = 0;
  std::array<uint64_t, kConstantReasonCount> constant_by_reason{};
  storages_.ForEach([&](StorageId, const StorageRecord& r) {
    if (!r.resident()) return;
    if (r.locks > 0) locked += r.size;
    else if (r.pins > 0) pinned += r.size;
    else if (!r.rematerializable()) constant_by_reason[size_t(r.constant_reason)] += r.size;
  });

  // The constants by reason, largest first, so that the message says which of them this
  // runtime chose (frozen results) and which the program made.
  uint64_t constant = 0;
  std::vector<size_t> reasons;
  for (size_t i = 0; i < kConstantReasonCount; ++i) {
    constant += constant_by_reason[i];
    if (constant_by_reason[i] > 0) reasons.push_back(i);
  }
  std::stable_sort(reasons.begin(), reasons.end(),
                   [&](size_t a, size_t b) { return constant_by_reason[a] > constant_by_reason[b]; });
  std::string by_reason;
  for (size_t i : reasons)
    absl::StrAppend(&by_reason, by_reason.empty() ? "" : ", ", FormatBytes(constant_by_reason[i]), " ",
                    ConstantReasonName(ConstantReason(i)));
  if (by_reason.empty()) by_reason = "parameters, inputs, unreplayable results";
  uint64_t needed = memory_ + bytes;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "dtr: budget of %s is infeasible: %s need %s more, with %s resident of which nothing more "
      "can be evicted: %s locked by the operation in progress, %s pinned, %s constants (%s). A "
      "budget of at least %s would be needed at this point (more may be needed later).",
      FormatBytes(config_.budget_bytes), what, FormatBytes(bytes), FormatBytes(memory_),
      FormatBytes(locked), FormatBytes(pinned), FormatBytes(constant), by_reason, FormatBytes(needed)));
}

}  // namespace dtr
