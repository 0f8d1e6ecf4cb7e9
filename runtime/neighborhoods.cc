// Neighborhoods in the recipe graph: a storage's dependencies and dependents over live recipes
// (Note [Recipes], runtime.cc), the cost of its evicted neighborhood that the heuristics score
// (with the evicted-neighbor hint that skips most walks, and the cache that reuses a walk), and
// compaction of the union-find evicted components (Note [Evicted components],
// evicted_components.h).
#include <vector>

#include "absl/container/inlined_vector.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace dtr {

using runtime_internal::ContainsValue;

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

bool Runtime::Reusable(uint64_t walked_at) const {
  if (walked_at == StorageRecord::kNotCached) return false;
  if (ExactNeighborhoodCache()) return walked_at == cache_generation_;
  const uint32_t reuse_for = config_.neighborhood_cache_events;
  return reuse_for > 0 && residency_changes_ - walked_at < reuse_for;
}

// What NeighborhoodCost(e.id, ...) returns, without reading the record when the pool entry shows
// nothing to walk (Note [Candidate table]).
double Runtime::EntryNeighborhoodCost(const PoolEntry& e, const PartialScore* bound, double above, bool* stopped) {
  if (stopped != nullptr) *stopped = false;
  if (neighborhood_ == NeighborhoodKind::kNone || !(e.flags & PoolEntry::kNeighborEvicted)) return 0;
  return NeighborhoodCost(e.id, bound, above, stopped);
}

// Note [Evicted-neighbor hint]
// Most candidates have no evicted neighbor, and finding that out walks the recipe and reader
// ops: a cache miss per hop, ~0.8 us a candidate once the records outgrow the cache. So each
// storage carries `neighbor_evicted`, set on all its neighbors when one is evicted
// (EvictUnchecked is the only way a storage leaves residence; an evicted neighbor gets it too,
// for when it comes back; for a storage evicted at its death, at the next search: Note [Joins
// at the next search], eviction_search.cc) and cleared when a walk finds no evicted neighbor.
// It is sticky, never wrong when false: a storage only gains a neighbor by an op that reads or
// writes both, and that op makes both resident first. So a false flag means a neighborhood cost
// of 0 without a walk.
// A pool member's entry mirrors it as PoolEntry::kNeighborEvicted (Note [Candidate table]).
// CheckInvariants verifies it.
double Runtime::NeighborhoodCost(StorageId id, const PartialScore* bound, double above, bool* stopped) {
  if (stopped != nullptr) *stopped = false;
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
    if (!any_evicted) {
      self.neighbor_evicted = false;
      RefreshPoolEntry(self);
    }
    return cost;
  }
  // Exact e* (both directions) or evicted ancestors only: graph walks over evicted storages,
  // each stopping after neighborhood_walk_limit of them (Note [Bounded neighborhood walks]).
  if (CachedCostValid(self)) {
    if (!self.neighborhood_cost_is_bound) {
      ++stats_.neighborhood_cache_hits;
      return self.neighborhood_cost;  // Note [Neighborhood cost cache]
    }
    // Note [Cut walks leave a bound]: the walk would be cut again, at the latest where it was.
    if (bound != nullptr && bound->Final(self.neighborhood_cost) > above) {
      ++stats_.neighborhood_cache_hits;
      if (stopped != nullptr) *stopped = true;
      return self.neighborhood_cost;
    }
  }
  bool cut = false;
  const double cost = WalkNeighborhood(id, bound, above, &cut, &any_evicted);
  if (kind == NeighborhoodKind::kExact && !cut && !any_evicted)
    self.neighbor_evicted = false;  // both directions were looked at
  if (stopped != nullptr) *stopped = cut;
  // A cut walk's sum is partial: under the exact cache it is kept as a bound, under the
  // event-count cache not at all.
  if ((!cut || ExactNeighborhoodCache()) && (!ExactNeighborhoodCache() || RecordCachedRegions(id))) {
    self.neighborhood_walked_at = ExactNeighborhoodCache() ? cache_generation_ : residency_changes_;
    self.neighborhood_cost = cost;
    self.neighborhood_cost_is_bound = cut;
  } else {
    self.neighborhood_walked_at = StorageRecord::kNotCached;
  }
  RefreshPoolEntry(self);
  return cost;
}

double Runtime::WalkNeighborhood(StorageId id, const PartialScore* bound, double above, bool* cut_out,
                                 bool* any_evicted_out) {
  const NeighborhoodKind kind = neighborhood_;
  bool any_evicted = false;
  double cost = 0;
  const uint32_t epoch = NextWalkEpoch();
  std::vector<StorageId>& frontier = walk_frontier_;
  const size_t limit = config_.neighborhood_walk_limit == 0 ? SIZE_MAX : config_.neighborhood_walk_limit;
  const double cost_limit = bound != nullptr ? bound->CostLimit(above) : 0;
  bool cut = false;
  // Pushes n's evicted, not yet visited deps (upward) or dependents in the order Deps and
  // Dependents list them, each once (Note [Bounded neighborhood walks]: the same visits in the
  // same order as pushing the whole lists and skipping the others when popped).
  auto push_neighbors = [&](StorageId n, bool upward) {
    const size_t start = frontier.size();
    auto push = [&](StorageId s, const StorageRecord& r) {
      ++stats_.neighborhood_visits;
      if (r.resident() || r.walk_epoch == epoch) return;
      for (size_t i = start; i < frontier.size(); ++i)
        if (frontier[i] == s) return;
      frontier.push_back(s);
    };
    const StorageRecord& self_or_walked = rec(n);
    if (upward) {
      for (OpId op : self_or_walked.recipe)
        for (StorageId in : ops_[op].inputs)
          if (in != n) push(in, rec(in));
      return;
    }
    for (OpId op_id : self_or_walked.readers)
      for (StorageId o : ops_[op_id].outputs) {
        if (o == n) continue;
        const StorageRecord* r = storages_.Find(o);
        if (r != nullptr && ContainsValue(r->recipe, op_id)) push(o, *r);
      }
  };
  // Sets `cut` and stops once the bound is exceeded: the rest cannot change the outcome.
  auto walk = [&](bool upward) {
    size_t taken = 0;
    frontier.clear();
    push_neighbors(id, upward);
    while (!frontier.empty()) {
      StorageId n = frontier.back();
      frontier.pop_back();
      StorageRecord& r = rec(n);
      if (r.walk_epoch == epoch) continue;  // pushed twice, by two walked storages
      r.walk_epoch = epoch;
      any_evicted = true;
      cost += r.cost;
      if (bound != nullptr && cost > cost_limit && bound->Final(cost) > above) {
        cut = true;
        return;
      }
      if (++taken == limit) break;
      push_neighbors(n, upward);
    }
  };
  walk(/*upward=*/true);
  if (kind == NeighborhoodKind::kExact && !cut) walk(/*upward=*/false);
  *cut_out = cut;
  *any_evicted_out = any_evicted;
  return cost;
}

// Note [Bounded neighborhood walks]
// dtr's exact e* and msps's evicted ancestors are walks over evicted storages, and under a tight
// budget the evicted region around a candidate is large: on a generated TreeLSTM of 68k events
// at 0.3 of its peak, unbounded dtr walks visited 213 storages per candidate (142.6M in all; 5.8 s
// of simulation against dtr-eq's 0.5 s). Each walk (each direction) therefore stops after
// neighborhood_walk_limit evicted storages (29.2M visits with 256, 1.9 s, same compute ratio):
// it underestimates only the largest neighborhoods, whose candidates score badly anyway. At stop
// 27, on the seven benchmark traces (bench/results/activations.md), 256 gave the unbounded walk's
// median compute ratios on ResNet, Transformer, UNet and the chain, and stayed within the
// seed-to-seed spread on the others; a limit of 32 lost up to 4x on the TreeLSTM at r = 0.3, and
// at stop 28 one of 64 cost 8.85x there against 2.22x.
// Stop 53: the default is 64. The search has changed since (exact cache, cut walks, whole small
// pools, the backward pass's protection). On activations.md's regenerated traces, 64 against
// 256 moves a cell by more than 0.03x only to cost less (the TreeLSTM at r = 0.3 1.29x against
// 1.45x, at 0.25 1.50x against 1.93x, at 0.2 2.11x against 2.47x, the LSTM at 0.4 1.42x against
// 1.58x, the chain at 0.1 2.40x against 2.54x: 14 cells), except at the TreeLSTM's thrash (0.15:
// 30.8x against 12.2x; 0.175, off the table's grid, 5.04x against 3.14x). Next to the floors it
// is a trade, probably because an underestimated neighborhood is evicted sooner, which pays off
// until the region it borders is most of what is evicted (on a second set of traces DenseNet at
// 0.25 2.07x against 1.93x, the LSTM at 0.175 3.21x against 2.97x). Real runs gain more than the
// simulator shows, since it does not count the search's own time: the CPU TreeLSTM at 0.4 of its
// peak searched 85-95 ms a step with 256 and 28-36 ms with 64 (bench/results/runtime.md,
// "Shorter neighborhood walks").
// A walk pushes only the evicted neighbors it has not visited yet, each once per walked storage
// and in the order Deps and Dependents list them, so it visits and sums in the order of a walk
// that pushes the whole lists and skips the rest when it pops them; and it tests the bound
// against PartialScore::CostLimit before computing the score. Stop 31: identical dtr-sim results
// on 480 runs (8 traces x dtr, msps, dtr-eq x 5 ratios x both search modes); the costliest of them
// (the sweep's TreeLSTM at 0.4 of its peak under dtr) 12.2 s -> 9.85 s of simulation.
// Note [Neighborhood cost cache]
// (The event-count cache, neighborhood_cache_events = N; the default until stop 41, when Note
// [Exact neighborhood cost cache] below replaced it.)
// Under a tight budget nearly every candidate's walk crosses the same large evicted region (110-140
// storages a walk on the recurrent models), and real runs score about 22 candidates an eviction
// call, many of them the same storages call after call: on the CPU TreeLSTM at 0.45 of its peak,
// 1.3-1.6M visits and 18-22 ms of searching a step against 6-8 ms of its own ops. Yet one eviction
// or rematerialization changes a region of a hundred storages by one. So a storage keeps its last
// full walk's cost and reuses it while fewer than neighborhood_cache_events (8) evictions and
// rematerializations have happened since, with two rules:
// - evicting or bringing back a storage clears the cached cost of its neighbors (EvictUnchecked,
//   ReplayFirstOp): a storage's own neighbors are never stale, and evicting beside an evicted
//   neighbor is what grows a recomputation chain;
// - a cut walk (Note [Bounded victim search]) stores nothing, its sum being partial.
// What a reused cost misses, for at most 8 residency changes: changes two or more hops away (an
// eviction that extends the region the walk crossed: an underestimate; a rematerialization, or
// an evicted storage collected, that shrinks it: an overestimate), edges dropped with a recipe
// (Detach, ClearRecipe: an overestimate) and, on a GPU, op costs corrected since (Note [Deferred
// op costs]). The cost is an estimate either way (walks are bounded, the search samples). A cut
// walk and a full walk leave different caches, so Note [Bounded victim search]'s "same
// decisions" holds with neighborhood_cache_events = 0, which is also exact e* (dtr-sim
// --neighborhood-cache 0). `neighborhood_cache_hits` in the stats counts the walks saved.
// Measured (stop 33), dtr-sim on activations.md's traces at 0.55 of the peak, seed 1, 0 -> 8:
// visits 1.71M -> 0.73M (TreeLSTM), 3.56M -> 0.92M (LSTM), 150k -> 72k (DenseNet), 93k -> 71k
// (chain). Medians of 3 traces x 3 seeds on the same traces, r = 0.6 .. 0.1, moved by at most
// the seed spread: the largest moves DenseNet at r = 0.5 1.22x -> 1.28x and at 0.3 2.63x ->
// 2.96x, the LSTM at 0.45 1.38x -> 1.48x, the TreeLSTM at 0.25 3.94x -> 4.26x and at 0.2
// 7.24x -> 6.30x, ResNet at 0.35 1.79x -> 1.66x. 16 saved a third more visits but cost more near
// the floors (DenseNet at 0.3 3.10x, the TreeLSTM at 0.2 12.3x). Real runs (bench/step_worker.py,
// torch 2.14.1, CPU, 4 steps, DTR_NEIGHBORHOOD_CACHE=0 against 8, three rounds): search time a
// step 25-50% lower, step time 5-25% (bench/results/runtime.md).
//
// Note [Exact neighborhood cost cache]
// The cache above reused a cost for 8 events whatever happened two or more hops away, and those
// changes are what decide near the floor: on activations.md's traces, walking every time (cache
// 0, exact e*) against the 8-event cache cost less in most cells and at times far less (UNet at
// r = 0.3 3.11x -> 2.38x, DenseNet at 0.25 5.67x -> 5.00x, the LSTM at 0.3 1.94x -> 1.81x, the
// TreeLSTM at 0.25 2.24x -> 2.10x), but searched more. So by default (kExactNeighborhoodCache)
// a cached cost stays valid exactly as long as nothing it summed has changed.
// What a walk from t sums is the evicted storages reachable from t through evicted storages and
// their costs. Each of them is in the same union-find set (Note [Evicted components]) as one of
// t's evicted neighbors, since evicting a storage joins the sets of all its evicted neighbors and
// sets never split. So a walk records the sets of t's evicted neighbors (root and version, at
// most two: above and below t; beside more, it is not cached), and every change a walk could see
// moves on the version of the set it happens in:
// - an eviction joins the sets around it into one whose version is new (Union), or makes a
//   fresh set; it also forgets the costs of the evicted storage's neighbors, whose walks it now
//   starts (the event-count cache's rule, kept);
// - an evicted storage brought back, collected (its recipe goes with it) or its cost corrected
//   (Note [Deferred op costs]) touches its set first (NoteEvictedRegionChanged); bringing one
//   back also forgets its neighbors' costs;
// - compaction renames the sets: the generation moves on, forgetting every cached cost;
// - a storage's own recipe cleared forgets its own cost; an op recorded, functional or in place,
//   adds edges to resident storages only, which no walk crosses, so it changes no walk.
// A reused cost checks its sets (two Finds) instead of walking. Sets only grow, and a storage
// brought back stays in its set, so a version moves on for some changes no walk from t saw: a
// walk is then repeated that did not need to be, never the reverse. CheckInvariants walks every
// valid cached cost again and compares: the fuzzers and dtr-sim's --check fail on a change this
// list misses. Decisions are then those of walking every time (cache 0): identical dtr-sim
// results on activations.md's traces (7 models x 3 traces x r = 0.5 .. 0.2).
//
// Note [Cut walks leave a bound]
// A walk cut by the victim search (Note [Bounded victim search]) has summed a prefix of what the
// full walk sums, in the same order, so while the cache's test above holds (nothing it could
// reach has changed) that partial sum is a lower bound of the storage's cost. Under the exact
// cache it is kept, marked as a bound (neighborhood_cost_is_bound): a later search whose bound
// the partial score already exceeds cuts the storage without walking (the walk would stop there
// or sooner, so the decision is the same), and anything else (a search it might win, a full
// score, a ranking of more than 64) walks again and caches what it finds. CheckInvariants checks
// a bound is at most what a walk finds. Until stop 44 a cut walk left nothing, and a search held
// to a tighter bound then repeated losing walks search after search: runtime_bench's fixture at
// 1e5 storages visited 18.6 storages an op with it, 3.5 with it kept (8.2 with stop 43's looser
// bound). dtr-sim's decisions are unchanged (648 runs, bench/results/runtime.md, "A leaner victim
// search"), visits fewer in 354 of them and more in none. The event-count cache keeps nothing
// of a cut walk, as before.
bool Runtime::CachedCostValid(const StorageRecord& r) const {
  if (!Reusable(r.neighborhood_walked_at)) return false;
  if (!ExactNeighborhoodCache()) return true;
  for (int i = 0; i < r.cached_regions; ++i)
    if (!components_.Unchanged(r.cached_region_root[i], r.cached_region_version[i])) return false;
  return true;
}

bool Runtime::RecordCachedRegions(StorageId id) {
  StorageRecord& self = rec(id);
  int count = 0;
  bool fits = true;
  ForEachNeighbor(id, [&](StorageId n) {
    const StorageRecord& r = rec(n);
    if (r.resident() || !fits) return;
    const EvictedComponents::Node root = components_.Find(r.component);
    for (int i = 0; i < count; ++i)
      if (self.cached_region_root[i] == root) return;
    if (count == StorageRecord::kCachedRegions) {
      fits = false;
      return;
    }
    self.cached_region_root[count] = root;
    self.cached_region_version[count] = components_.Version(root);
    ++count;
  });
  self.cached_regions = uint8_t(fits ? count : 0);
  return fits;
}

uint32_t Runtime::NextWalkEpoch() {
  if (++walk_epoch_ == 0) {  // wrapped: no record may keep a mark from 2^32 walks ago
    storages_.ForEach([](StorageId, StorageRecord& r) { r.walk_epoch = 0; });
    walk_epoch_ = 1;
  }
  return walk_epoch_;
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
  ++cache_generation_;  // Note [Exact neighborhood cost cache]: the sets' names changed
}

}  // namespace dtr
