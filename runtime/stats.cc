// RuntimeStats printing.
#include "runtime/stats.h"

#include "absl/strings/str_format.h"

namespace dtr {

std::string RuntimeStats::ToJson() const {
  return absl::StrFormat(
      "{\"ops_recorded\": %d, \"constants\": %d, \"evictions\": %d, \"eager_evictions\": %d, "
      "\"awaited_evictions\": %d, \"banishments\": %d, \"rematerializations\": %d, \"replays\": %d, \"detached\": %d, "
      "\"copies_given_recipes\": %d, \"depth_limited\": %d, "
      "\"collected\": %d, \"thrash_events\": %d, \"eviction_searches\": %d, "
      "\"candidates_scored\": %d, \"neighborhood_visits\": %d, \"neighborhood_cache_hits\": %d, "
      "\"base_cost\": %.17g, "
      "\"remat_cost\": %.17g, \"total_cost\": %.17g, \"memory_bytes\": %d, \"peak_memory_bytes\": %d, "
      "\"largest_op_bytes\": %d, \"floor_bytes\": %d}",
      ops_recorded, constants, evictions, eager_evictions, awaited_evictions, banishments, rematerializations, replays,
      detached, copies_given_recipes, depth_limited, collected, thrash_events, eviction_searches, candidates_scored, neighborhood_visits,
      neighborhood_cache_hits, base_cost, remat_cost, total_cost(), memory_bytes, peak_memory_bytes, largest_op_bytes,
      floor_bytes);
}

}  // namespace dtr
