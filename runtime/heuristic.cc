// Heuristic definitions (DTR paper, Sec. 4 and Appendix C.3).
#include "runtime/heuristic.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtr {

// Note [Heuristics]
// Every score is "lower is a better victim". Staleness is strictly positive (the clock adds one
// unit), so a just-used storage gets a large but finite score. dtr-eq is the paper's h_DTR^eq: its
// neighborhood cost is the summed cost of the union-find components of the storage's evicted
// neighbours (Note [Evicted components]); dtr uses the exact evicted neighborhood e*; msps sums
// only evicted ancestors (what would have to be recomputed to bring the storage back).
//
// Note [Default heuristic]
// dtr is the default. In dtr-sim on the seven benchmark traces (median of three seeds, stop 29,
// runtime/README.md) it trains every model at least as low as dtr-eq and costs less almost
// everywhere; dtr-eq has a cliff on the TreeLSTM (1.96x against 14.8x at r = 0.3 of activations)
// because eager eviction merges the union-find components until their cost no longer tells
// storages apart. dtr's walks are bounded (Note [Bounded neighborhood walks]) and cut once they
// cannot win (Note [Bounded victim search]), so a real run's search time per step is no longer
// above dtr-eq's.
const std::vector<HeuristicInfo>& AllHeuristics() {
  static const std::vector<HeuristicInfo> kAll = {
      {HeuristicKind::kDtrEq, "dtr-eq",
       "(cost + cost of union-find evicted components around it) / (size * staleness)",
       NeighborhoodKind::kUnionFind},
      {HeuristicKind::kDtr, "dtr", "(cost + cost of the exact evicted neighborhood e*) / (size * staleness); default",
       NeighborhoodKind::kExact},
      {HeuristicKind::kDtrLocal, "dtr-local", "cost / (size * staleness): no neighborhood",
       NeighborhoodKind::kNone},
      {HeuristicKind::kLru, "lru", "1 / staleness: evict the least recently used", NeighborhoodKind::kNone},
      {HeuristicKind::kSize, "size", "1 / size: evict the largest (GreedyRemat)", NeighborhoodKind::kNone},
      {HeuristicKind::kMsps, "msps", "(cost + cost of evicted ancestors) / size (Peng et al.)",
       NeighborhoodKind::kAncestors},
      {HeuristicKind::kRandom, "random", "uniform random: a no-metadata baseline", NeighborhoodKind::kNone},
  };
  return kAll;
}

const HeuristicInfo& InfoFor(HeuristicKind kind) {
  for (const auto& info : AllHeuristics())
    if (info.kind == kind) return info;
  return AllHeuristics().front();
}

absl::StatusOr<HeuristicKind> ParseHeuristic(absl::string_view name) {
  for (const auto& info : AllHeuristics())
    if (info.name == name) return info.kind;
  std::vector<std::string> names;
  for (const auto& info : AllHeuristics()) names.emplace_back(info.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown heuristic '", name, "'; expected one of: ", absl::StrJoin(names, ", ")));
}

std::string HeuristicName(HeuristicKind kind) { return std::string(InfoFor(kind).name); }

double Score(HeuristicKind kind, const ScoreInputs& in) { return ScoreInline(kind, in); }

}  // namespace dtr
