"""Budgets on activations in dtr-sim: for each benchmark model, a trace of real training steps
(DTR_TRACE_FILE, CPU, preloaded with no budget) replayed by dtr-sim under
budget = static + r x (peak - static), where static is what the model holds between steps
(parameters, gradients, optimizer state, batches: the trace worker reports it) and peak the
trace's own peak. Reports, per model, the run's memory floor (Note [Memory floor],
runtime/runtime.cc: no heuristic can go below it), the smallest r that trains, and the compute
ratio at each r: (base cost + rematerialization cost) / base cost of the measured training steps
(the costs are the op times measured while tracing). Each trace holds --steps steps, of which the
first --warmup are simulated but not measured (Note [Steady-state steps], runtime/sim/simulator.h:
the first step runs before the gradients and the optimizer state exist, so under a budget that
counts them it has their room for activations and costs far less than the steps after it; the
trace marks each step and dtr-sim reports the costs at each mark). These are the
runtime's decisions alone: the real runs of bench/sweep.py add dtr's per-op bookkeeping.
The op costs in a trace are timings, and the sampled search draws differently per seed, so
each budget is simulated on --traces traces of the model, each with every seed of --seeds: a
cell is the median and the range of those runs, and a budget trains when at least half of them
do (stop 32: three traces of the same ResNet gave 1.44x, 1.28x and 1.32x at r = 0.5).

  python bench/activation_budgets.py [--build build-release] [--models a,b] [--out FILE]
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from sweep import ALL_MODELS, TRACE_MARK_BYTES, steady_overhead  # noqa: E402

RATIOS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1]
WORKER = os.path.join(REPO, "bench", "step_worker.py")


def trace(model, work, lib, steps, index=0, reuse=False):
    """Traces `steps` steps of the model into the work directory; with `reuse`, a trace of as many
    steps already there (with its report beside it) is taken instead, so runs with other dtr-sim
    options compare on the same op timings."""
    path = os.path.join(work, f"{model}.trace" if index == 0 else f"{model}.{index}.trace")
    if reuse and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            info = json.load(f)
        if info.get("steps") == steps:
            return path, info
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_")}
    env.update(LD_PRELOAD=lib, DTR_TRACE_FILE=path, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    r = subprocess.run([sys.executable, WORKER, "trace", "--model", model, "--device", "cpu", "--threads", "1",
                        "--steps", str(steps), "--mark-bytes", str(TRACE_MARK_BYTES)],
                       env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise SystemExit(f"tracing {model} failed:\n{r.stderr[-3000:]}")
    info = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][-1]
    with open(path + ".json", "w") as f:
        json.dump(info, f)
    return path, info


def simulate(sim, path, budget, heuristic, search, seed=1, extra=()):
    argv = [sim, "--trace", path, "--budget", str(int(budget)), "--heuristic", heuristic, "--seed", str(seed),
            "--search", search, *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"dtr-sim gave no result: {' '.join(argv)}\n{r.stderr[-2000:]}")
    return json.loads(lines[-1])


def measured_ratio(d, warmup):
    """The compute ratio of the steps from the mark `step-<warmup>` to the mark `end` (Note
    [Steady-state steps]); inf for a run out of memory."""
    overhead = steady_overhead(d, warmup)
    return float("inf") if overhead is None else 1 + overhead


def sweep(model, args, lib):
    """Every trace of the model (its op costs are timings, noisy on a shared machine) under every
    seed: a budget's cell is the median of those runs and their range. Static, peak and floor are
    the first trace's; each trace's budgets are its own static + r x (its peak - its static)."""
    traces = []
    for k in range(args.traces):
        path, info = trace(model, args.work, lib, args.steps, k, args.reuse_traces)
        static = info["static_bytes"]
        free = simulate(args.sim, path, 1 << 60, args.heuristic, args.search, extra=args.sim_args)
        steady_overhead(free, args.warmup)  # raises if the trace lacks the marks it measures between
        traces.append(dict(path=path, info=info, static=static, peak=free["peak_bytes"],
                           floor=free["stats"]["floor_bytes"]))
    first = traces[0]
    act = max(1, first["peak"] - first["static"])
    cells = []
    for r in RATIOS:
        ratios = []
        for t in traces:
            budget = t["static"] + r * max(1, t["peak"] - t["static"])
            for seed in args.seeds:
                d = simulate(args.sim, t["path"], budget, args.heuristic, args.search, seed, args.sim_args)
                ratios.append(measured_ratio(d, args.warmup))
        ratios.sort()
        median = statistics.median_low(ratios)  # an actual run's ratio; inf when most ran out of memory
        if median == float("inf"):
            cells.append((r, None))
            break
        cells.append((r, (median, ratios[0], ratios[-1])))
    return dict(model=model, static=first["static"], peak=first["peak"], floor=first["floor"],
                floor_r=(first["floor"] - first["static"]) / act, cells=cells,
                unevictable=first["info"].get("unevictable_at_peak"))


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def ratio_cell(median, low, high):
    """The median run's ratio, then the range over the runs (`oom` for a run that ran out)."""
    if low == high:
        return f"{median:.2f}x"
    return f"{median:.2f}x ({low:.2f}-{'oom' if high == float('inf') else f'{high:.2f}'})"


def render(rows, args):
    head = ["model", "static", "peak", "floor (r)"] + [f"r={r:g}" for r in RATIOS]
    options = "".join(f" {a}" for a in args.sim_args)
    out = [f"# Budgets on activations in dtr-sim ({args.heuristic}, {args.search} search{options})\n",
           f"Made by `python bench/activation_budgets.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
           f"traces of {args.steps} training steps on the CPU, of which the first {args.warmup} are warm-up "
           "(simulated, not measured: Note [Steady-state steps]). Budget = static + r x (peak - static). Cells: "
           "compute ratio of the measured steps (base + rematerialization cost over base cost), the median over "
           f"{args.traces} traces of each model x seeds {','.join(map(str, args.seeds))} of the sampled search, "
           "with the range in parentheses; `oom`: out of memory in more than half of those runs (the sweep stops "
           "there). Static, peak and floor are the first trace's. The floor is Note [Memory floor]'s lower bound "
           "for the same run, as a ratio r.\n",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = {r: v for r, v in row["cells"]}
        line = [row["model"], mib(row["static"]), mib(row["peak"]), f"{mib(row['floor'])} ({row['floor_r']:.2f})"]
        for r in RATIOS:
            line.append("" if r not in cells else "oom" if cells[r] is None else ratio_cell(*cells[r]))
        out.append("| " + " | ".join(line) + " |")
    out.append(render_unevictable(rows))
    out.append(GENERATED_END)
    return "\n".join(out) + "\n"


# Everything after this line in --out is kept when the file is regenerated (hand-written notes).
GENERATED_END = "<!-- end of the generated part: bench/activation_budgets.py keeps what follows -->"
UNEVICTABLE_LIMIT = 0.05  # issue 16: pinned and constant memory beyond static <= 5% of the activations
# Constants this runtime chose (runtime/records.h, FrozenByChoice), by the names stats report.
CHOSEN_REASONS = ("held result frozen to free the recipes behind it",
                  "dead input kept so that a larger held result stays evictable")


def render_unevictable(rows):
    """What dtr could not evict at the trace's largest tracked memory, beyond the static storages
    (Note [Unevictable memory by reason], hooks/memory_report.cc), as a share of the activations."""
    out = ["\n## Unevictable memory beyond static, by reason\n",
           "Measured while tracing (no budget): at the largest memory dtr tracked, the resident storages it "
           "could not evict (constants, pinned, exposed, locked), leaving out the static storages (parameters, "
           "gradients, optimizer state, batches), from `torch.ops.dtr.unevictable_at_peak`. Share: of the "
           f"activations (peak - static); issue 16 asks for at most {UNEVICTABLE_LIMIT:.0%}. Reasons are listed "
           "largest first, down to 1% of the activations. The last share leaves out what this runtime froze or "
           "kept by its own choice (live gradients it will not recompute, Note [Held results of dead inputs] "
           "and the Notes beside it in runtime/lifetime.cc), which Note [Memory floor] counts as evictable.\n",
           "| model | activations | unevictable beyond static | share | within 5% | reasons | share without dtr's choices |",
           "|---|---|---|---|---|---|---|"]
    for row in rows:
        u = row.get("unevictable")
        if not u:
            out.append(f"| {row['model']} | | not measured | | | |")
            continue
        act = max(1, row["peak"] - row["static"])
        share = u["unevictable_bytes"] / act
        reasons = sorted(u["by_reason"].items(), key=lambda kv: -kv[1])
        shown = [f"{why} {mib(b)}" for why, b in reasons if b >= 0.01 * act] or ["—"]
        chosen = sum(b for why, b in reasons if any(r in why for r in CHOSEN_REASONS))
        out.append(f"| {row['model']} | {mib(act)} | {mib(u['unevictable_bytes'])} | {share:.1%} | "
                   f"{'yes' if share <= UNEVICTABLE_LIMIT else '**no**'} | " + "; ".join(shown).replace("|", "/") +
                   f" | {(u['unevictable_bytes'] - chosen) / act:.1%} |")
    return "\n".join(out) + "\n"


def write_keeping_notes(path, text):
    """Writes the generated text to path, keeping the hand-written part of an existing file: what
    follows GENERATED_END, or (a file from before the marker) everything from its first '## ' heading."""
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if GENERATED_END in old:
            kept = old.split(GENERATED_END, 1)[1].lstrip("\n")
        else:
            at = old.find("\n## ")
            kept = old[at + 1:] if at >= 0 else ""
    with open(path, "w") as f:
        f.write(text + ("\n" + kept if kept else ""))


def publish(text, out):
    """Prints the generated text and, with an --out file, writes it there keeping the notes."""
    print(text)
    if out:
        write_keeping_notes(out, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-release"), help="CMake build dir with bin/dtr-sim")
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--heuristic", default="dtr")
    ap.add_argument("--search", default="sampled", choices=["sampled", "exact"])
    ap.add_argument("--steps", type=int, default=6, help="training steps per trace")
    ap.add_argument("--warmup", type=int, default=2,
                    help="of those, steps simulated but not measured (the first runs without gradients and "
                         "optimizer state: Note [Steady-state steps])")
    ap.add_argument("--seeds", default="1,2,3", help="seeds of dtr-sim's sampled search, comma-separated")
    ap.add_argument("--traces", type=int, default=3, help="traces per model (each traced anew)")
    ap.add_argument("--work", default=None, help="where the traces go (default: <build>/activation-work)")
    ap.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    ap.add_argument("--reuse-traces", action="store_true",
                    help="simulate the traces an earlier run left in --work instead of tracing anew")
    ap.add_argument("--sim-args", default="",
                    help="more dtr-sim options, space-separated (e.g. '--backward-protection 1')")
    args = ap.parse_args()
    if not 0 <= args.warmup < args.steps:
        ap.error(f"--warmup {args.warmup} must be at least 0 and below --steps {args.steps}")
    args.sim = os.path.join(args.build, "bin", "dtr-sim")
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.sim_args = args.sim_args.split()
    args.work = args.work or os.path.join(args.build, "activation-work")
    os.makedirs(args.work, exist_ok=True)
    import dtr

    models = args.models.split(",")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(lambda m: sweep(m, args, dtr.library_path), models))
    publish(render(rows, args), args.out)


if __name__ == "__main__":
    main()
