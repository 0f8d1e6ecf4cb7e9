#include "hooks/env_config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/bytes.h"
#include "runtime/heuristic.h"

extern char** environ;

namespace dtr::hooks {
namespace {

const char* const kKnown[] = {"DTR_BUDGET",     "DTR_DEVICE",     "DTR_CUDA_ALLOCATOR", "DTR_HEURISTIC",  "DTR_DEALLOC",
                              "DTR_SEARCH",     "DTR_STATS_FILE", "DTR_TRACE_FILE",
                              "DTR_VERBOSE",    "DTR_ENABLE",     "DTR_EVICT",      "DTR_MAX_REPLAY_DEPTH",
                              "DTR_MAX_RECOMPUTE", "DTR_NEIGHBORHOOD_CACHE", "DTR_EXHAUSTIVE_POOL",
                              "DTR_NEIGHBORHOOD_WALK_LIMIT",
                              "DTR_BACKWARD_PROTECTION", "DTR_BACKWARD_NEXT_USE", "DTR_FREEZE_GRADIENTS",
                              "DTR_IDLE_BELOW", "DTR_DEBUG_DISABLE_RULES"};

std::string HeuristicNames() {
  std::vector<std::string> names;
  for (const HeuristicInfo& h : AllHeuristics()) names.emplace_back(h.name);
  return absl::StrJoin(names, " | ");
}

absl::Status Bad(const char* var, const char* value, absl::string_view accepted) {
  return absl::InvalidArgumentError(absl::StrCat("dtr: invalid ", var, "='", value,
                                                 "'; accepted: ", accepted));
}

// A count variable: an integer from `least` to 2^30, `what` saying what it counts.
absl::Status ParseCount(const std::function<const char*(const char*)>& getenv_fn, const char* var, int64_t least,
                        absl::string_view what, uint32_t* out) {
  const char* v = getenv_fn(var);
  if (v == nullptr) return absl::OkStatus();
  int64_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < least || n > (int64_t(1) << 30))
    return Bad(var, v, absl::StrCat("an integer from ", least, " to 1073741824: ", what));
  *out = uint32_t(n);
  return absl::OkStatus();
}

// A finite number of at least `least`.
absl::Status ParseFactor(const std::function<const char*(const char*)>& getenv_fn, const char* var, double least,
                         double most, absl::string_view what, double* out) {
  const char* v = getenv_fn(var);
  if (v == nullptr) return absl::OkStatus();
  double x = 0;
  if (!absl::SimpleAtod(v, &x) || !(x >= least && x <= most) || !std::isfinite(x))
    return Bad(var, v,
               std::isfinite(most) ? absl::StrCat("a number from ", least, " to ", most, ": ", what)
                                   : absl::StrCat("a number >= ", least, ": ", what));
  *out = x;
  return absl::OkStatus();
}

}  // namespace

std::string DtrEnvConfig::ToString() const {
  const char* dev = device == DeviceChoice::kCpu ? "cpu" : device == DeviceChoice::kCuda ? "cuda" : "auto";
  return absl::StrCat("DtrEnvConfig{enable=", enable, ", evict=", evict, ", budget=",
                      budget_fraction > 0 ? absl::StrCat(budget_fraction, " of device memory")
                      : unlimited()       ? std::string("unlimited")
                                          : FormatBytes(budget_bytes),
                      ", device=", dev, ", cuda_allocator=", cuda_allocator,
                      ", heuristic=", HeuristicName(heuristic), ", dealloc=", DeallocPolicyName(dealloc),
                      ", search=", SearchModeName(search), ", stats_file='", stats_file,
                      "', trace_file='", trace_file, "', verbose=", verbose,
                      ", max_replay_depth=", max_replay_depth, ", max_recompute=", max_recompute_ratio,
                      ", neighborhood_cache=", NeighborhoodCacheName(neighborhood_cache_events), ", exhaustive_pool=", exhaustive_pool,
                      ", neighborhood_walk_limit=", neighborhood_walk_limit,
                      ", backward_protection=", backward_protection, ", backward_next_use=", backward_next_use,
                      ", freeze_gradients=", freeze_gradients, ", idle_below=", idle_below,
                      ", disabled_rules=0x", absl::Hex(disabled_rules), "}");
}

absl::StatusOr<DtrEnvConfig> ParseEnvConfig(
    const std::function<const char*(const char*)>& getenv_fn,
    const std::function<void(const std::function<void(const std::string&)>&)>& for_each_name) {
  DtrEnvConfig c;
  absl::Status unknown = absl::OkStatus();
  for_each_name([&](const std::string& name) {
    if (!unknown.ok() || name.rfind("DTR_", 0) != 0) return;
    for (const char* k : kKnown)
      if (name == k) return;
    unknown = absl::InvalidArgumentError(absl::StrCat(
        "dtr: unknown environment variable ", name, "; known: ", absl::StrJoin(kKnown, ", ")));
  });
  if (!unknown.ok()) return unknown;

  for (auto [var, field] : {std::pair<const char*, bool*>{"DTR_ENABLE", &c.enable},
                             std::pair<const char*, bool*>{"DTR_EVICT", &c.evict},
                             std::pair<const char*, bool*>{"DTR_FREEZE_GRADIENTS", &c.freeze_gradients}}) {
    const char* v = getenv_fn(var);
    if (v == nullptr) continue;
    if (!strcmp(v, "0")) *field = false;
    else if (!strcmp(v, "1")) *field = true;
    else return Bad(var, v, "0 | 1");
  }
  if (const char* v = getenv_fn("DTR_BUDGET")) {
    if (!strcmp(v, "unlimited") || !strcmp(v, "none")) {
      c.budget_bytes = kUnlimitedBudget;
    } else if (std::strchr(v, '.') != nullptr && std::strspn(v, "0123456789.") == std::strlen(v)) {
      double f = 0;
      if (!absl::SimpleAtod(v, &f) || !(f > 0 && f <= 1))
        return Bad("DTR_BUDGET", v, "a fraction of device memory in (0, 1] such as 0.6, or a byte count");
      c.budget_fraction = f;
    } else {
      auto b = ParseBytes(v);
      if (!b.ok() || *b == 0)
        return Bad("DTR_BUDGET", v,
                   absl::StrCat(AcceptedByteForms(), " (nonzero), a fraction of CUDA memory such as 0.6, or 'unlimited'"));
      c.budget_bytes = *b;
    }
  }
  if (const char* v = getenv_fn("DTR_DEVICE")) {
    if (!strcmp(v, "auto")) c.device = DeviceChoice::kAuto;
    else if (!strcmp(v, "cpu")) c.device = DeviceChoice::kCpu;
    else if (!strcmp(v, "cuda")) c.device = DeviceChoice::kCuda;
    else return Bad("DTR_DEVICE", v, "auto | cpu | cuda");
  }
  if (const char* v = getenv_fn("DTR_CUDA_ALLOCATOR")) {
    if (strcmp(v, "native") && strcmp(v, "dtr")) return Bad("DTR_CUDA_ALLOCATOR", v, "native | dtr");
    c.cuda_allocator = v;
  }
  if (const char* v = getenv_fn("DTR_HEURISTIC")) {
    auto h = ParseHeuristic(v);
    if (!h.ok()) return Bad("DTR_HEURISTIC", v, HeuristicNames());
    c.heuristic = *h;
  }
  if (const char* v = getenv_fn("DTR_DEALLOC")) {
    auto d = ParseDeallocPolicy(v);
    if (!d.ok()) return Bad("DTR_DEALLOC", v, "eager-evict | banish");
    c.dealloc = *d;
  }
  if (const char* v = getenv_fn("DTR_SEARCH")) {
    auto s = ParseSearchMode(v);
    if (!s.ok()) return Bad("DTR_SEARCH", v, "sampled | exact");
    c.search = *s;
  }
  for (auto [var, field] : {std::pair<const char*, std::string*>{"DTR_STATS_FILE", &c.stats_file},
                             std::pair<const char*, std::string*>{"DTR_TRACE_FILE", &c.trace_file}}) {
    const char* v = getenv_fn(var);
    if (v == nullptr) continue;
    if (!*v) return Bad(var, v, "a non-empty file path");
    // Note [Per-process file names]: the placeholders are checked now, expanded at open.
    if (absl::StatusOr<std::string> checked = ExpandFileName(var, v, getenv_fn, 0); !checked.ok())
      return checked.status();
    *field = v;
  }
  if (const char* v = getenv_fn("DTR_VERBOSE")) {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 0 || n > 2) return Bad("DTR_VERBOSE", v, "0 | 1 | 2");
    c.verbose = n;
  }
  struct Count {
    const char* var;
    int64_t least;
    const char* what;
    uint32_t* field;
  };
  for (const Count& k : {
           Count{"DTR_MAX_REPLAY_DEPTH", 1,
                 "the longest chain of recipe ops a storage may need replayed (default 1000)", &c.max_replay_depth},
           Count{"DTR_EXHAUSTIVE_POOL", 0,
                 "the most evictable storages a sampled search scores all of (default 256; 0: always sample)",
                 &c.exhaustive_pool},
           Count{"DTR_NEIGHBORHOOD_WALK_LIMIT", 0,
                 "the most evicted storages a neighborhood walk sums in each direction (default 64; 0: no limit)",
                 &c.neighborhood_walk_limit},
       })
    if (absl::Status s = ParseCount(getenv_fn, k.var, k.least, k.what, k.field); !s.ok()) return s;
  if (const char* v = getenv_fn("DTR_NEIGHBORHOOD_CACHE")) {
    absl::StatusOr<uint32_t> events = ParseNeighborhoodCache(v);
    if (!events.ok())
      return Bad("DTR_NEIGHBORHOOD_CACHE", v,
                 "exact (the default: a walked neighborhood cost is reused until something it summed changes), or "
                 "how many evictions and rematerializations it is reused for (0: walk every time)");
    c.neighborhood_cache_events = *events;
  }
  struct Factor {
    const char* var;
    double least;
    const char* what;
    double* field;
    double most = std::numeric_limits<double>::infinity();
  };
  for (const Factor& k : {
           Factor{"DTR_MAX_RECOMPUTE", 0,
                  "the most recomputation, as a multiple of the program's own time (its ops and the time "
                  "between them), before a budget counts as too small (default 10; 0: no limit)",
                  &c.max_recompute_ratio},
           Factor{"DTR_BACKWARD_PROTECTION", 1,
                  "how many times worse an activation may score and still be evicted before what the backward "
                  "pass computed (default 100; 1: no difference)",
                  &c.backward_protection},
           Factor{"DTR_BACKWARD_NEXT_USE", 0,
                  "how much a backward pass's estimate of when it reads a forward activation weighs against the "
                  "activation's staleness (default 0.75; 0: staleness alone)",
                  &c.backward_next_use, 1},
           Factor{"DTR_IDLE_BELOW", 0,
                  "the fraction of the budget below which, a whole training step long, dtr goes idle and records "
                  "nothing until memory reaches it again (default 0.5; 0: never idle)",
                  &c.idle_below, kMostIdleBelow},
       })
    if (absl::Status s = ParseFactor(getenv_fn, k.var, k.least, k.most, k.what, k.field); !s.ok()) return s;
  if (const char* v = getenv_fn("DTR_DEBUG_DISABLE_RULES")) {
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      int r = 0;
      if (!absl::SimpleAtoi(part, &r) || r < 1 || r > kMaxRule)
        return Bad("DTR_DEBUG_DISABLE_RULES", v, absl::StrCat("comma-separated rule numbers 1..", kMaxRule));
      c.disabled_rules |= 1u << r;
    }
  }
  return c;
}

absl::StatusOr<std::string> ExpandFileName(const char* var, const std::string& pattern,
                                           const std::function<const char*(const char*)>& getenv_fn,
                                           long pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    const char ch = pattern[i];
    if (ch == '}') return Bad(var, pattern.c_str(), "a file path; '}' without '{' (placeholders: {rank}, {pid})");
    if (ch != '{') {
      out.push_back(ch);
      ++i;
      continue;
    }
    const size_t close = pattern.find('}', i);
    if (close == std::string::npos)
      return Bad(var, pattern.c_str(), "a file path; '{' without '}' (placeholders: {rank}, {pid})");
    const std::string name = pattern.substr(i + 1, close - i - 1);
    if (name == "pid") {
      absl::StrAppend(&out, pid);
    } else if (name == "rank") {
      const char* rank = getenv_fn("RANK");
      int64_t r = 0;
      if (rank != nullptr && (!absl::SimpleAtoi(rank, &r) || r < 0))
        return absl::InvalidArgumentError(absl::StrCat("dtr: ", var, "='", pattern, "' uses {rank} but RANK='", rank,
                                                       "' is not a non-negative integer"));
      absl::StrAppend(&out, r);
    } else {
      return Bad(var, pattern.c_str(), absl::StrCat("a file path; unknown placeholder {", name,
                                                    "} (placeholders: {rank}, {pid})"));
    }
    i = close + 1;
  }
  return out;
}

absl::StatusOr<std::string> ExpandFileNameNow(const char* var, const std::string& pattern) {
  return ExpandFileName(var, pattern, [](const char* n) { return std::getenv(n); }, static_cast<long>(getpid()));
}

absl::Status CheckOutputFile(const char* var, const std::string& pattern) {
  absl::StatusOr<std::string> path = ExpandFileNameNow(var, pattern);
  if (!path.ok()) return path.status();
  const size_t slash = path->rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path->substr(0, slash);
  const bool exists = access(path->c_str(), F_OK) == 0;
  if (exists ? access(path->c_str(), W_OK) != 0 : access(dir.c_str(), W_OK | X_OK) != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "dtr: ", var, "='", pattern, "': cannot write ", exists ? *path : absl::StrCat("into directory ", dir), " (",
        std::strerror(errno), "); name a writable file"));
  return absl::OkStatus();
}

absl::StatusOr<DtrEnvConfig> ParseProcessEnv() {
  return ParseEnvConfig([](const char* n) { return std::getenv(n); },
                        [](const std::function<void(const std::string&)>& f) {
                          for (char** e = environ; e && *e; ++e) {
                            const char* eq = std::strchr(*e, '=');
                            f(eq ? std::string(*e, eq - *e) : std::string(*e));
                          }
                        });
}

}  // namespace dtr::hooks
