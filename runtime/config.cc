// RuntimeConfig validation and printing.
#include "runtime/config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace dtr {

absl::StatusOr<DeallocPolicy> ParseDeallocPolicy(absl::string_view name) {
  if (name == "eager" || name == "eager-evict") return DeallocPolicy::kEagerEvict;
  if (name == "banish") return DeallocPolicy::kBanish;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown deallocation policy '", name, "'; expected 'eager' or 'banish'"));
}

absl::StatusOr<SearchMode> ParseSearchMode(absl::string_view name) {
  if (name == "sampled") return SearchMode::kSampled;
  if (name == "exact") return SearchMode::kExact;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown search mode '", name, "'; expected 'sampled' or 'exact'"));
}

absl::StatusOr<InputLocking> ParseInputLocking(absl::string_view name) {
  if (name == "eager") return InputLocking::kEager;
  if (name == "lazy") return InputLocking::kLazy;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown input locking '", name, "'; expected 'eager' or 'lazy'"));
}

std::string DeallocPolicyName(DeallocPolicy policy) {
  return policy == DeallocPolicy::kBanish ? "banish" : "eager";
}
std::string SearchModeName(SearchMode mode) { return mode == SearchMode::kExact ? "exact" : "sampled"; }
std::string InputLockingName(InputLocking locking) {
  return locking == InputLocking::kEager ? "eager" : "lazy";
}

absl::StatusOr<uint32_t> ParseNeighborhoodCache(absl::string_view text) {
  if (text == "exact") return kExactNeighborhoodCache;
  uint32_t events = 0;
  if (!absl::SimpleAtoi(text, &events) || events == kExactNeighborhoodCache)
    return absl::InvalidArgumentError(absl::StrCat(
        "neighborhood cache '", text, "' is neither 'exact' nor a count of events (0: no cache)"));
  return events;
}

std::string NeighborhoodCacheName(uint32_t events) {
  return events == kExactNeighborhoodCache ? "exact" : absl::StrCat(events);
}

absl::Status RuntimeConfig::Validate() const {
  if (budget_bytes == 0) return absl::InvalidArgumentError("budget must be positive");
  if (!(sample_factor > 0) || !std::isfinite(sample_factor))
    return absl::InvalidArgumentError(absl::StrCat("sample_factor must be > 0, got ", sample_factor));
  if (min_samples == 0) return absl::InvalidArgumentError("min_samples must be >= 1");
  if (!(small_storage_fraction >= 0 && small_storage_fraction < 1))
    return absl::InvalidArgumentError(
        absl::StrCat("small_storage_fraction must be in [0, 1), got ", small_storage_fraction));
  if (!(thrash_damping >= 0) || !std::isfinite(thrash_damping))
    return absl::InvalidArgumentError(absl::StrCat("thrash_damping must be >= 0, got ", thrash_damping));
  if (thrash_half_life_ops == 0) return absl::InvalidArgumentError("thrash_half_life_ops must be >= 1");
  if (!(rebuild_protection >= 1) || !std::isfinite(rebuild_protection))
    return absl::InvalidArgumentError(
        absl::StrCat("rebuild_protection must be >= 1 (1: none), got ", rebuild_protection));
  if (!(backward_protection >= 1) || !std::isfinite(backward_protection))
    return absl::InvalidArgumentError(
        absl::StrCat("backward_protection must be >= 1 (1: none), got ", backward_protection));
  if (!(backward_next_use >= 0 && backward_next_use <= 1))
    return absl::InvalidArgumentError(
        absl::StrCat("backward_next_use must be in [0, 1] (0: staleness alone), got ", backward_next_use));
  if (!(pending_protection >= 1) || !std::isfinite(pending_protection))
    return absl::InvalidArgumentError(
        absl::StrCat("pending_protection must be >= 1 (1: none), got ", pending_protection));
  if (max_replay_depth == 0) return absl::InvalidArgumentError("max_replay_depth must be >= 1");
  if (!(max_recompute_ratio >= 0) || !std::isfinite(max_recompute_ratio))
    return absl::InvalidArgumentError(
        absl::StrCat("max_recompute_ratio must be >= 0 (0: no limit), got ", max_recompute_ratio));
  if (recompute_half_life_ops == 0) return absl::InvalidArgumentError("recompute_half_life_ops must be >= 1");
  return absl::OkStatus();
}

std::string RuntimeConfig::ToString() const {
  return absl::StrFormat(
      "budget=%s heuristic=%s dealloc=%s search=%s sample_factor=%g min_samples=%d max_samples=%d "
      "exhaustive_pool=%d neighborhood_walk_limit=%d cut_losing_walks=%d neighborhood_cache=%s "
      "small_storage_fraction=%g thrash_damping=%g thrash_half_life_ops=%d replays_refresh_staleness=%d "
      "freeze_held_results=%d freeze_backward_results=%d rebuild_protection=%g backward_protection=%g backward_next_use=%g pending_protection=%g input_locking=%s "
      "max_replay_depth=%d max_recompute_ratio=%g recompute_half_life_ops=%d seed=%d",
      budget_bytes == kUnlimitedBudget ? std::string("unlimited") : absl::StrCat(budget_bytes),
      HeuristicName(heuristic), DeallocPolicyName(dealloc), SearchModeName(search), sample_factor,
      min_samples, max_samples, exhaustive_pool, neighborhood_walk_limit, cut_losing_walks, NeighborhoodCacheName(neighborhood_cache_events),
      small_storage_fraction, thrash_damping, thrash_half_life_ops,
      replays_refresh_staleness, freeze_held_results, freeze_backward_results, rebuild_protection, backward_protection, backward_next_use, pending_protection,
      InputLockingName(input_locking), max_replay_depth,
      max_recompute_ratio, recompute_half_life_ops, seed);
}

}  // namespace dtr
