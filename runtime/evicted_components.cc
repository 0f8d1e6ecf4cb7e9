// Union-find with per-set cost sums; see Note [Evicted components].
#include "runtime/evicted_components.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace dtr {

EvictedComponents::Node EvictedComponents::MakeSet(double cost) {
  Node n = Node(parent_.size());
  parent_.push_back(n);
  rank_.push_back(0);
  cost_.push_back(cost);
  version_.push_back(0);
  return n;
}

EvictedComponents::Node EvictedComponents::Find(Node n) const {
  while (parent_[n] != n) {
    parent_[n] = parent_[parent_[n]];
    n = parent_[n];
  }
  return n;
}

EvictedComponents::Node EvictedComponents::Union(Node a, Node b) {
  a = Find(a);
  b = Find(b);
  if (a == b) return a;
  if (rank_[a] < rank_[b]) std::swap(a, b);
  parent_[b] = a;
  if (rank_[a] == rank_[b]) ++rank_[a];
  cost_[a] += cost_[b];
  version_[a] = std::max(version_[a], version_[b]) + 1;
  return a;
}

std::vector<EvictedComponents::Node> EvictedComponents::Compact(const std::vector<Node>& live) {
  EvictedComponents fresh;
  absl::flat_hash_map<Node, Node> new_root_of_old_root;
  std::vector<Node> result;
  result.reserve(live.size());
  for (Node old : live) {
    Node old_root = Find(old);
    auto [it, inserted] = new_root_of_old_root.try_emplace(old_root, kNone);
    if (inserted) {
      it->second = fresh.MakeSet(cost_[old_root]);
      result.push_back(it->second);
    } else {
      Node n = fresh.MakeSet(0);
      fresh.Union(it->second, n);
      it->second = fresh.Find(n);
      result.push_back(n);
    }
  }
  *this = std::move(fresh);
  return result;
}

}  // namespace dtr
