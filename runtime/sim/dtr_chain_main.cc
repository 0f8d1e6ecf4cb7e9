// dtr-chain: the static planners' numbers for a chain (format: Note [Chain format v1] in
// runtime/sim/chain.h) under one or more budgets, the comparison points for dtr-sim:
//   dtr-chain --chain FILE|- (--budget B[,B...] | --ratio R[,R...]) [--planner NAME]
//             [--segments K] [--segmentation pytorch|balanced] [--slots S] [--schedule]
// Prints one JSON object per line for each (budget, planner). Exit status: 0 when every line
// was printed (infeasible budgets included), 1 when a planner failed, 2 for bad usage or input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/bytes.h"
#include "runtime/sim/chain.h"
#include "runtime/sim/chain_schedule.h"
#include "runtime/sim/json.h"
#include "runtime/sim/rotor_planner.h"
#include "runtime/sim/sequential_checkpoint_planner.h"

namespace {

using namespace dtr;
using namespace dtr::sim;

constexpr const char* kUsage = R"(usage:
  dtr-chain --chain FILE|- (--budget B[,B...] | --ratio R[,R...]) [--planner NAME]
            [--segments K] [--segmentation pytorch|balanced] [--slots S] [--schedule]
Plans a chain (format: runtime/sim/chain.h) under each budget and prints one JSON line per
(budget, planner): planner, budget_bytes, status ("ok" or "infeasible"), makespan, base_cost
(sum of u_f + u_b), overhead (makespan / base_cost - 1), peak_bytes (exact), and per planner
segments (sequential planners), slots (rotor) or min_budget_bytes and message (infeasible).
  --budget      bytes, suffixes K/M/G (powers of 1000) or KiB/MiB/GiB; a comma list
  --ratio       fractions of the peak with no recomputation (F_all all the way, then B); a list
  --planner     rotor (optimal persistent schedule, Rotor's Alg. 3), sqrt (checkpoint_sequential
                with ceil(sqrt(L)) segments), best-sequential (the cheapest segment count that
                fits), sequential (needs --segments), or all (default: rotor, sqrt, best-sequential)
  --segmentation how checkpoint_sequential cuts segments: pytorch (default; floor(L/k) stages
                each, the last takes the rest) or balanced (see sequential_checkpoint_planner.h)
  --slots       rotor's memory slots S (default 500; 0 = exact bytes, short chains only)
  --schedule    add each plan's operation sequence ("schedule")
)";

int Fail(const std::string& message) {
  std::cerr << "dtr-chain: " << message << "\n";
  return 2;
}

// The shortest decimal form that reads back to exactly `value`.
std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  for (int digits = 1; digits <= 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

struct Budget {
  uint64_t bytes;
  double ratio;  // NaN when given in bytes
};

// One output line, built field by field.
class JsonLine {
 public:
  JsonLine& Field(absl::string_view key, absl::string_view raw_value) {
    absl::StrAppend(&text_, text_.empty() ? "{" : ",", JsonString(key), ":", raw_value);
    return *this;
  }
  std::string Done() const { return text_ + "}"; }

 private:
  std::string text_;
};

JsonLine Begin(absl::string_view planner, const Budget& budget, bool ok) {
  JsonLine line;
  line.Field("planner", JsonString(planner)).Field("budget_bytes", absl::StrCat(budget.bytes));
  if (!std::isnan(budget.ratio)) line.Field("ratio", JsonNumber(budget.ratio));
  line.Field("status", ok ? "\"ok\"" : "\"infeasible\"");
  return line;
}

void AddResult(JsonLine& line, const Chain& chain, const ScheduleRun& run, bool ok) {
  const double base = chain.base_cost();
  line.Field("makespan", ok ? JsonNumber(run.makespan) : "null")
      .Field("base_cost", JsonNumber(base))
      .Field("overhead", ok && base > 0 ? JsonNumber(run.makespan / base - 1) : "null")
      .Field("peak_bytes", ok ? absl::StrCat(run.peak_bytes) : "null");
}

struct Options {
  std::string planner = "all";
  int segments = 0;
  Segmentation segmentation = Segmentation::kPyTorch;
  RotorOptions rotor;
  bool schedule = false;
};

// Prints rotor's line; false when the planner failed for a reason other than the budget.
bool RunRotor(const Chain& chain, const Budget& budget, const Options& options) {
  auto plan = PlanRotor(chain, budget.bytes, options.rotor);
  if (!plan.ok() && !absl::IsResourceExhausted(plan.status())) {
    std::cerr << "dtr-chain: rotor: " << plan.status().message() << "\n";
    return false;
  }
  JsonLine line = Begin("rotor", budget, plan.ok());
  AddResult(line, chain, plan.ok() ? plan->run : ScheduleRun{}, plan.ok());
  line.Field("slots", absl::StrCat(options.rotor.slots));
  if (plan.ok()) {
    line.Field("recomputed_forwards", absl::StrCat(plan->run.recomputed_forwards));
    if (options.schedule) line.Field("schedule", JsonString(ScheduleToString(plan->schedule)));
  } else {
    line.Field("min_budget_bytes", absl::StrCat(MinimumPersistentPeakBytes(chain)))
        .Field("message", JsonString(plan.status().message()));
  }
  std::cout << line.Done() << "\n";
  return true;
}

void PrintSequential(absl::string_view name, const Chain& chain, const Budget& budget, const SequentialPlan& plan,
                     const Options& options) {
  const bool ok = plan.run.peak_bytes <= budget.bytes;
  JsonLine line = Begin(name, budget, ok);
  AddResult(line, chain, plan.run, ok);
  line.Field("segments", absl::StrCat(plan.segments))
      .Field("segmentation", JsonString(SegmentationName(options.segmentation)));
  if (ok) {
    line.Field("recomputed_forwards", absl::StrCat(plan.run.recomputed_forwards));
    if (options.schedule) line.Field("schedule", JsonString(ScheduleToString(plan.schedule)));
  } else {
    line.Field("min_budget_bytes", absl::StrCat(plan.run.peak_bytes))
        .Field("message", JsonString(absl::StrCat("checkpoint_sequential with ", plan.segments, " segments peaks at ",
                                                  plan.run.peak_bytes, " bytes")));
  }
  std::cout << line.Done() << "\n";
}

bool RunSequential(absl::string_view name, int segments, const Chain& chain, const Budget& budget,
                   const Options& options) {
  auto plan = PlanSequential(chain, segments, options.segmentation);
  if (!plan.ok()) {
    std::cerr << "dtr-chain: " << name << ": " << plan.status().message() << "\n";
    return false;
  }
  PrintSequential(name, chain, budget, *plan, options);
  return true;
}

bool RunBestSequential(const Chain& chain, const Budget& budget, const Options& options) {
  auto plan = PlanBestSequential(chain, budget.bytes, options.segmentation);
  if (plan.ok()) {
    PrintSequential("best-sequential", chain, budget, *plan, options);
    return true;
  }
  if (!absl::IsResourceExhausted(plan.status())) {
    std::cerr << "dtr-chain: best-sequential: " << plan.status().message() << "\n";
    return false;
  }
  uint64_t smallest = UINT64_MAX;
  for (int k = 1; k <= chain.length(); ++k) {
    auto candidate = PlanSequential(chain, k, options.segmentation);
    if (candidate.ok()) smallest = std::min(smallest, candidate->run.peak_bytes);
  }
  JsonLine line = Begin("best-sequential", budget, false);
  AddResult(line, chain, ScheduleRun{}, false);
  line.Field("segmentation", JsonString(SegmentationName(options.segmentation)))
      .Field("min_budget_bytes", absl::StrCat(smallest))
      .Field("message", JsonString(plan.status().message()));
  std::cout << line.Done() << "\n";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string chain_path, budget_text, ratio_text;
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string* out) -> bool {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--schedule") {
      options.schedule = true;
    } else if (!value(&v)) {
      return Fail(absl::StrCat("unknown or incomplete option '", arg, "'\n", kUsage));
    } else if (arg == "--chain") {
      chain_path = v;
    } else if (arg == "--budget") {
      budget_text = v;
    } else if (arg == "--ratio") {
      ratio_text = v;
    } else if (arg == "--planner") {
      if (v != "rotor" && v != "sqrt" && v != "best-sequential" && v != "sequential" && v != "all")
        return Fail(
            absl::StrCat("--planner: unknown planner '", v, "' (rotor, sqrt, best-sequential, sequential, all)"));
      options.planner = v;
    } else if (arg == "--segments") {
      if (!absl::SimpleAtoi(v, &options.segments) || options.segments < 1)
        return Fail(absl::StrCat("--segments: expected a positive integer, got '", v, "'"));
    } else if (arg == "--segmentation") {
      auto segmentation = ParseSegmentation(v);
      if (!segmentation.ok()) return Fail(absl::StrCat("--segmentation: ", segmentation.status().message()));
      options.segmentation = *segmentation;
    } else if (arg == "--slots") {
      if (!absl::SimpleAtoi(v, &options.rotor.slots) || options.rotor.slots < 0)
        return Fail(absl::StrCat("--slots: expected a non-negative integer, got '", v, "'"));
    } else {
      return Fail(absl::StrCat("unknown option '", arg, "'\n", kUsage));
    }
  }
  if (chain_path.empty()) return Fail(absl::StrCat("--chain is required\n", kUsage));
  if (budget_text.empty() == ratio_text.empty()) return Fail("give --budget or --ratio (one of them)");
  if (options.planner == "sequential" && options.segments == 0) return Fail("--planner sequential needs --segments K");
  if (options.planner != "sequential" && options.segments != 0)
    return Fail("--segments only applies to --planner sequential");

  absl::StatusOr<Chain> chain = ReadChainFile(chain_path);
  if (!chain.ok()) return Fail(std::string(chain.status().message()));
  if (options.segments > chain->length())
    return Fail(absl::StrCat("--segments ", options.segments, " exceeds the chain's ", chain->length(), " stages"));

  std::vector<Budget> budgets;
  if (!budget_text.empty()) {
    for (absl::string_view item : absl::StrSplit(budget_text, ',')) {
      auto bytes = ParseBytes(item);
      if (!bytes.ok()) return Fail(absl::StrCat("--budget: ", bytes.status().message()));
      budgets.push_back({*bytes, std::nan("")});
    }
  } else {
    const uint64_t peak = StoreAllPeakBytes(*chain);
    for (absl::string_view item : absl::StrSplit(ratio_text, ',')) {
      double ratio;
      if (!absl::SimpleAtod(item, &ratio) || !std::isfinite(ratio) || !(ratio > 0))
        return Fail(absl::StrCat("--ratio: expected positive numbers, got '", item, "'"));
      budgets.push_back({uint64_t(std::floor(ratio * double(peak))), ratio});
    }
  }

  bool all_ran = true;
  const bool all = options.planner == "all";
  for (const Budget& budget : budgets) {
    if (all || options.planner == "rotor") all_ran &= RunRotor(*chain, budget, options);
    if (all || options.planner == "sqrt")
      all_ran &= RunSequential("sqrt", SqrtSegments(*chain), *chain, budget, options);
    if (all || options.planner == "best-sequential") all_ran &= RunBestSequential(*chain, budget, options);
    if (options.planner == "sequential")
      all_ran &= RunSequential("sequential", options.segments, *chain, budget, options);
  }
  return all_ran ? 0 : 1;
}
