// The eviction heuristics, selectable by name. A heuristic scores a resident, evictable storage;
// the runtime evicts the lowest score. Inputs are the paper's s (staleness), m (size) and c
// (cost, possibly over an evicted neighborhood); see Note [Heuristics] in heuristic.cc.
#ifndef DTR_RUNTIME_HEURISTIC_H_
#define DTR_RUNTIME_HEURISTIC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtr {

enum class HeuristicKind {
  kDtrEq,     // (c0 + cost of union-find evicted components touching it) / (m * s)
  kDtr,       // (c0 + cost of the exact evicted neighborhood e*) / (m * s)
  kDtrLocal,  // c0 / (m * s)
  kLru,       // 1 / s: least recently used first
  kSize,      // 1 / m: largest first (GreedyRemat, Kumar et al. 2019)
  kMsps,      // (c0 + cost of evicted ancestors) / m  (Peng et al. 2020)
  kRandom,    // uniform random score: a baseline that uses no metadata
};

// Which neighborhood cost a heuristic needs; the runtime computes only that one.
enum class NeighborhoodKind { kNone, kUnionFind, kExact, kAncestors };

struct HeuristicInfo {
  HeuristicKind kind;
  absl::string_view name;
  absl::string_view description;
  NeighborhoodKind neighborhood;
};

const std::vector<HeuristicInfo>& AllHeuristics();
const HeuristicInfo& InfoFor(HeuristicKind kind);
absl::StatusOr<HeuristicKind> ParseHeuristic(absl::string_view name);
std::string HeuristicName(HeuristicKind kind);

struct ScoreInputs {
  double cost = 0;               // c0 of the storage's own recipe
  double neighborhood_cost = 0;  // per the heuristic's NeighborhoodKind
  double size = 0;               // bytes
  double staleness = 0;          // clock units since last access, >0
  double random = 0;             // U(0,1), used by kRandom only
};

double Score(HeuristicKind kind, const ScoreInputs& in);
// The same, inline: for a victim search's pass over its candidates (about 1k of the 27k
// instructions of a decision in runtime_bench's fixture at 1e5 storages). Inlined into the
// neighborhood walks' loop too, it made them slower (4% more instructions for the same visits on
// a TreeLSTM trace), so they call Score.
inline double ScoreInline(HeuristicKind kind, const ScoreInputs& in) {
  switch (kind) {
    case HeuristicKind::kDtrEq:
    case HeuristicKind::kDtr:
      return (in.cost + in.neighborhood_cost) / (in.size * in.staleness);
    case HeuristicKind::kDtrLocal:
      return in.cost / (in.size * in.staleness);
    case HeuristicKind::kLru:
      return 1.0 / in.staleness;
    case HeuristicKind::kSize:
      return 1.0 / in.size;
    case HeuristicKind::kMsps:
      return (in.cost + in.neighborhood_cost) / in.size;
    case HeuristicKind::kRandom:
      return in.random;
  }
  return 0;
}

}  // namespace dtr

#endif  // DTR_RUNTIME_HEURISTIC_H_
