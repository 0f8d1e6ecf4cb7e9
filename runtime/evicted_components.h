// EvictedComponents: the union-find structure behind dtr-eq's approximate evicted neighborhood.
// Each evicted storage owns a node; evicting a storage unions its node with the components of its
// evicted neighbours; rematerializing subtracts its cost from its component without splitting it
// (the paper's constant-time split approximation). See Note [Evicted components].
#ifndef DTR_RUNTIME_EVICTED_COMPONENTS_H_
#define DTR_RUNTIME_EVICTED_COMPONENTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtr {

// Note [Evicted components]
// Invariant (checked by Runtime::CheckInvariants): for every root r, Cost(r) equals the sum of
// cost(S) over the evicted storages S whose node is in r's set. A node is created for each
// eviction; a rematerialized storage's node stays in its set (as a "phantom" member carrying no
// cost), so sets only grow until the arena is compacted. Compaction rebuilds the arena from the
// live evicted storages, keeping their set membership and sums, so memory stays proportional
// to the number of evicted storages rather than the number of evictions ever made.
class EvictedComponents {
 public:
  using Node = uint32_t;
  static constexpr Node kNone = UINT32_MAX;

  Node MakeSet(double cost);
  Node Find(Node n) const;  // path halving through a mutable parent array
  // Starts loading n's parent link, where a Find begins (Note [Prefetched neighborhoods]).
  void Prefetch(Node n) const {
    if (n < parent_.size()) __builtin_prefetch(&parent_[n]);
  }
  // Unions the sets of a and b; returns the new root.
  Node Union(Node a, Node b);
  double Cost(Node n) const { return cost_[Find(n)]; }
  void AddCost(Node n, double delta) { cost_[Find(n)] += delta; }
  // Note [Exact neighborhood cost cache] (neighborhoods.cc): each set carries a version that
  // moves on whenever a member changes (Touch) or the set grows (Union), so (root, version) names
  // one state of one set: Unchanged says whether the set is still that.
  void Touch(Node n) { ++version_[Find(n)]; }
  uint32_t Version(Node root) const { return version_[root]; }
  bool Unchanged(Node root, uint32_t version) const {
    return root < parent_.size() && Find(root) == root && version_[root] == version;
  }

  size_t node_count() const { return parent_.size(); }

  // Rebuilds the arena keeping only `live` nodes. Returns the new node for each entry of `live`
  // (same order), with the same set partition among them and each set's cost carried over.
  std::vector<Node> Compact(const std::vector<Node>& live);

 private:
  mutable std::vector<Node> parent_;
  std::vector<uint32_t> rank_;
  std::vector<double> cost_;  // meaningful at roots only
  std::vector<uint32_t> version_;  // meaningful at roots only
};

}  // namespace dtr

#endif  // DTR_RUNTIME_EVICTED_COMPONENTS_H_
