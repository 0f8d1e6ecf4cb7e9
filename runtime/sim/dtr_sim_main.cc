// dtr-sim: replays a trace through the DTR runtime under a budget, or writes a synthetic trace.
//   dtr-sim [--trace FILE|-] [--budget BYTES | --ratio R] [--heuristic NAME] [--dealloc eager|banish]
//           [--search sampled|exact] [--seed N] [--check]
//   dtr-sim --generate KIND [--n N] [--seed N] [--b B --heuristic NAME]
// The last line printed by a replay is one JSON object (see SimResult::ToJson).
#include <cmath>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/bytes.h"
#include "runtime/sim/generators.h"
#include "runtime/sim/simulator.h"

namespace {

constexpr const char* kUsage = R"(usage:
  dtr-sim [--trace FILE|-] [--budget BYTES | --ratio R] [--heuristic NAME] [--dealloc eager|banish]
          [--search sampled|exact] [--seed N] [--max-recompute X] [--thrash-damping X] [--min-samples N] [--max-samples N]
          [--exhaustive-pool N]
          [--walk-limit N] [--full-walks] [--neighborhood-cache exact|N] [--replays-refresh-staleness]
          [--keep-held-recipes] [--freeze-backward-results]
          [--rebuild-protection K] [--backward-protection K] [--backward-next-use W]
          [--pending-protection K]
          [--input-locks lazy|eager] [--check] [--log-remats]
  dtr-sim --generate KIND [--n N] [--seed N] [--b B] [--heuristic NAME]
  dtr-sim --list-heuristics
Replays a dtr trace (format: runtime/sim/trace.h) under a memory budget and prints one JSON line.
--budget takes bytes (suffixes K/M/G, KiB/MiB/GiB); --ratio is a fraction of the trace's peak
with no budget. --generate writes a synthetic trace (chain, adversarial, unet, treelstm,
random-dag) to stdout; for adversarial, --b is the budget in unit tensors it plays against.
--full-walks scores every candidate's neighborhood in full instead of stopping the walks of
candidates that cannot win (the same decisions, more work: Note [Bounded victim search]).
--neighborhood-cache exact|N: exact (the default) reuses a walked neighborhood cost until
something it summed changes (Note [Exact neighborhood cost cache]); N reuses it for N evictions
and rematerializations (the approximation until stop 41); 0 walks every time. exact and 0 both
score exact e* (Note [Neighborhood cost cache]).
--replays-refresh-staleness makes a rematerialization touch the storages it brings back (the rule
until stop 33: Note [Staleness of replayed storages]).
--keep-held-recipes keeps the recipes of the held results of the ops that read a dying storage
(what a backward pass accumulated into in place, the loss once the backward pass has gone past it)
instead of freezing them so the dying storage is collected (the rule until stop 57: Note [Held
results of dead inputs]).
--freeze-backward-results freezes the held results of every op of a backward pass once an input
dies, not only of its in-place ops and its much smaller ones (Note [Frozen results pass it on];
DTR_FREEZE_GRADIENTS=1 in real runs).
--rebuild-protection K multiplies by K the scores of the storages a rematerialization under way
has brought back (default 30; 1: none; Note [Rebuilt segments]).
--backward-protection K multiplies by K the scores of the storages computed or written by ops the
trace marks pass=backward, a backward pass's (default 100; 1: none; Note [Results of the backward
pass]).
--backward-next-use W weighs, in a backward pass, how soon it will read a forward activation it has
not read yet against the activation's staleness: staleness^(1-W) * estimate^W (default 0.75; 0:
staleness alone, the DTR paper's; Note [Next use in a backward pass]).
--pending-protection K multiplies by K the scores of the storages that ops a rematerialization
under way has still to replay read (default 1: none, the live runtime's; Note [Inputs a
rematerialization will read]).
--exhaustive-pool N scores the whole pool while it holds at most N entries, sampled search or
not (default 256; 0: always sample; Note [Small pools are searched whole]).
--walk-limit N stops each direction of a dtr or msps neighborhood walk after N evicted storages
(default 64; 0: no limit; Note [Bounded neighborhood walks]).
--input-locks eager locks every input of an op before bringing any back (the rule until stop 38);
lazy, the default, locks an input once it is back (Note [Lazy input locks]).
--log-remats adds "remat_events" to the JSON: every trace event whose replay rematerialized
something (event index, op, pass, whether it was in place, rematerializations, their cost), to see
where a run's recomputation goes.
)";

int Fail(const std::string& message) {
  std::cerr << "dtr-sim: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtr;
  std::string trace_path = "-", generate, budget_text, ratio_text;
  sim::SimOptions options;
  sim::GeneratorOptions gen;
  options.runtime.search = SearchMode::kSampled;
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
    } else if (arg == "--list-heuristics") {
      for (const auto& h : AllHeuristics()) std::cout << h.name << "\t" << h.description << "\n";
      return 0;
    } else if (arg == "--check") {
      options.check_invariants = true;
    } else if (arg == "--log-remats") {
      options.log_remats = true;
    } else if (arg == "--full-walks") {
      options.runtime.cut_losing_walks = false;
    } else if (arg == "--replays-refresh-staleness") {
      options.runtime.replays_refresh_staleness = true;
    } else if (arg == "--keep-held-recipes") {
      options.runtime.freeze_held_results = false;
    } else if (arg == "--freeze-backward-results") {
      options.runtime.freeze_backward_results = true;
    } else if (!value(&v)) {
      return Fail(absl::StrCat("unknown or incomplete option '", arg, "'\n", kUsage));
    } else if (arg == "--trace") {
      trace_path = v;
    } else if (arg == "--generate") {
      generate = v;
    } else if (arg == "--budget") {
      budget_text = v;
    } else if (arg == "--ratio") {
      ratio_text = v;
    } else if (arg == "--heuristic") {
      auto h = ParseHeuristic(v);
      if (!h.ok()) return Fail(std::string(h.status().message()));
      options.runtime.heuristic = *h;
    } else if (arg == "--dealloc") {
      auto d = ParseDeallocPolicy(v);
      if (!d.ok()) return Fail(std::string(d.status().message()));
      options.runtime.dealloc = *d;
    } else if (arg == "--search") {
      auto s = ParseSearchMode(v);
      if (!s.ok()) return Fail(std::string(s.status().message()));
      options.runtime.search = *s;
    } else if (arg == "--input-locks") {
      auto l = ParseInputLocking(v);
      if (!l.ok()) return Fail(std::string(l.status().message()));
      options.runtime.input_locking = *l;
    } else if (arg == "--seed") {
      if (!absl::SimpleAtoi(v, &gen.seed)) return Fail(absl::StrCat("--seed: not a number '", v, "'"));
      options.runtime.seed = gen.seed;
    } else if (arg == "--max-recompute") {
      if (!absl::SimpleAtod(v, &options.runtime.max_recompute_ratio))
        return Fail(absl::StrCat("--max-recompute: not a number '", v, "'"));
    } else if (arg == "--thrash-damping") {
      if (!absl::SimpleAtod(v, &options.runtime.thrash_damping))
        return Fail(absl::StrCat("--thrash-damping: not a number '", v, "'"));
    } else if (arg == "--min-samples") {
      if (!absl::SimpleAtoi(v, &options.runtime.min_samples))
        return Fail(absl::StrCat("--min-samples: not a number '", v, "'"));
    } else if (arg == "--max-samples") {
      if (!absl::SimpleAtoi(v, &options.runtime.max_samples))
        return Fail(absl::StrCat("--max-samples: not a number '", v, "'"));
    } else if (arg == "--exhaustive-pool") {
      if (!absl::SimpleAtoi(v, &options.runtime.exhaustive_pool))
        return Fail(absl::StrCat("--exhaustive-pool: not a number '", v, "'"));
    } else if (arg == "--neighborhood-cache") {
      absl::StatusOr<uint32_t> events = ParseNeighborhoodCache(v);
      if (!events.ok()) return Fail(absl::StrCat("--neighborhood-cache: ", events.status().message()));
      options.runtime.neighborhood_cache_events = *events;
    } else if (arg == "--rebuild-protection") {
      if (!absl::SimpleAtod(v, &options.runtime.rebuild_protection))
        return Fail(absl::StrCat("--rebuild-protection: not a number '", v, "'"));
    } else if (arg == "--backward-protection") {
      if (!absl::SimpleAtod(v, &options.runtime.backward_protection))
        return Fail(absl::StrCat("--backward-protection: not a number '", v, "'"));
    } else if (arg == "--backward-next-use") {
      if (!absl::SimpleAtod(v, &options.runtime.backward_next_use))
        return Fail(absl::StrCat("--backward-next-use: not a number '", v, "'"));
    } else if (arg == "--pending-protection") {
      if (!absl::SimpleAtod(v, &options.runtime.pending_protection))
        return Fail(absl::StrCat("--pending-protection: not a number '", v, "'"));
    } else if (arg == "--walk-limit") {
      if (!absl::SimpleAtoi(v, &options.runtime.neighborhood_walk_limit))
        return Fail(absl::StrCat("--walk-limit: not a number '", v, "'"));
    } else if (arg == "--n") {
      if (!absl::SimpleAtoi(v, &gen.n) || gen.n <= 0) return Fail(absl::StrCat("--n: not a positive number '", v, "'"));
    } else if (arg == "--b") {
      if (!absl::SimpleAtoi(v, &gen.budget) || gen.budget <= 0)
        return Fail(absl::StrCat("--b: not a positive number '", v, "'"));
    } else {
      return Fail(absl::StrCat("unknown option '", arg, "'\n", kUsage));
    }
  }

  if (!generate.empty()) {
    gen.adversary_config = options.runtime;
    auto trace = sim::GenerateTrace(generate, gen);
    if (!trace.ok()) return Fail(std::string(trace.status().message()));
    std::cout.precision(17);
    sim::WriteTrace(*trace, std::cout);
    return 0;
  }

  absl::StatusOr<sim::Trace> trace = sim::ReadTraceFile(trace_path);
  if (!trace.ok()) return Fail(std::string(trace.status().message()));

  if (!budget_text.empty() && !ratio_text.empty()) return Fail("give --budget or --ratio, not both");
  if (!budget_text.empty()) {
    auto bytes = ParseBytes(budget_text);
    if (!bytes.ok()) return Fail(absl::StrCat("--budget: ", bytes.status().message()));
    options.runtime.budget_bytes = *bytes;
  } else if (!ratio_text.empty()) {
    double ratio;
    if (!absl::SimpleAtod(ratio_text, &ratio) || !(ratio > 0))
      return Fail(absl::StrCat("--ratio: expected a positive number, got '", ratio_text, "'"));
    auto peak = sim::UnconstrainedPeak(*trace);
    if (!peak.ok()) return Fail(std::string(peak.status().message()));
    options.runtime.budget_bytes = std::max<uint64_t>(1, uint64_t(std::floor(ratio * double(*peak))));
  }
  if (absl::Status s = options.runtime.Validate(); !s.ok()) return Fail(std::string(s.message()));
  auto result = sim::Simulate(*trace, options);
  if (!result.ok()) return Fail(absl::StrCat("simulation failed: ", result.status().message()));
  if (!result->ok) std::cerr << "dtr-sim: out of memory: " << result->error << "\n";
  std::cout << result->ToJson(options.runtime) << std::endl;
  return result->ok ? 0 : 1;
}
