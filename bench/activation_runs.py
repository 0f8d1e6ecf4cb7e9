"""Budgets on activations in real training runs: issue 16 item 3's ratios measured side by side
with the plain run, where bench/activation_budgets.py simulates the same budgets in dtr-sim.

For each benchmark model, budget = static + r x (peak - static), as the real-model tests compute
it (tests/hooks/real_models.py): static is what the model holds between steps (parameters,
gradients, optimizer state, batches; `step_worker.py trace` run plainly reports it) and peak the
allocated peak of a preloaded run under a budget that never binds. Then --rounds rounds, each a
plain process and a preloaded process (started under that budget, so dtr records from the start,
as under DTR_BUDGET) that trains the model afresh under the never-binding budget and then at each
r, largest first, stopping at the first that runs out of memory. Every block trains on the same
batches from the same seeds (bench/step_worker.py), so its losses and final parameters must equal
the plain run's bit for bit, and dtr's peak reserved bytes must stay within the budget; both are
checked and reported. A cell is the median over the rounds of (dtr's median step time / the same
round's plain median step time), in process CPU time (the steps run on one thread, and the
machine is shared: bench/results/cpu.md), with the range over the rounds.

These ratios include what dtr-sim leaves out: dtr's bookkeeping of every op (the never-binding
column alone) and its allocator. They also include the shared machine's noise, which the plain
run measured before each preloaded one bounds.

With --against DIR, each round also runs the same blocks under another build of dtr, installed in
DIR by `pip install --no-build-isolation --target DIR .` (say the code before a change, or a build
without the profile-guided optimization: `PGO=0`), the two preloaded processes in alternating
order, and a second table gives both builds' ratios and, per round, this build's step time over
that one's: a change measured side by side, on the same plain runs.

  python bench/activation_runs.py [--models a,b] [--ratios 0.5,0.3] [--rounds 5] [--against DIR] [--out FILE]
"""
import argparse
import copy
import os
import statistics
import sys
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from activation_budgets import GENERATED_END, mib, publish  # noqa: E402
from sweep import ALL_MODELS, NON_BINDING_BUDGET as NEVER_BINDS, Runner, WorkerError, installed_dtr_build  # noqa: E402

# Issue 16 item 3: at r = 0.5 at most 1.3x (the TreeLSTM 1.5x); at r = 0.3 every model at most 2x.
TARGETS = {0.5: 1.3, 0.3: 2.0}
TREELSTM_TARGET_AT_HALF = 1.5


def target(model, r):
    if r == 0.5 and model == "treelstm":
        return TREELSTM_TARGET_AT_HALF
    return TARGETS.get(r)


def static_and_peak(runner, model):
    """What the model holds between steps, and the allocated peak of a training run under a budget
    that never binds (the same steps as every measured block)."""
    # As many steps as a block runs: the batches, made up front, are static memory too.
    steps = str(runner.args.warmup + runner.args.steps)
    trace = [o for o in runner.worker("trace", model, ["--steps", steps]) if o.get("event") == "trace"][-1]
    free = runner.blocks(model, [{"variant": "model", "budget": None, "label": "never binds"}], preload=True,
                         DTR_BUDGET=NEVER_BINDS)[-1]
    if free["status"] != "ok":
        raise SystemExit(f"activation_runs: {model} did not train under a budget that never binds: {free}")
    return trace["static_bytes"], free["peak_allocated_bytes"]


def against_runner(runner, package_dir):
    """A runner whose preloaded workers run the dtr installed in package_dir instead."""
    lib = os.path.join(package_dir, "dtr", "lib", "libdtr.so")
    if not os.path.isfile(lib):
        raise SystemExit(f"activation_runs: --against {package_dir}: no {lib}; install a build there with "
                         "`pip install --no-build-isolation --target DIR .`")
    other = copy.copy(runner)
    other.lib, other.pythonpath = lib, os.path.abspath(package_dir)
    return other


def one_round(runner, model, budgets, cap_factor, other=None, other_first=False):
    """A plain process, then a preloaded one training at each budget (None: never binds); with
    `other`, a second preloaded one under that runner's build, before or after the first."""
    plain = runner.blocks(model, [{"variant": "model", "budget": None, "label": "plain"}])[-1]
    blocks = [{"variant": "model", "budget": NEVER_BINDS if b is None else int(b), "label": label}
              for label, b in budgets]
    cap = cap_factor * plain["median_step_cpu_seconds"]
    order = [r for r in ((other, runner) if other_first else (runner, other)) if r is not None]
    results = {}
    for r in order:
        try:
            runs = r.blocks(model, blocks, preload=True, max_step_seconds=cap, DTR_BUDGET=NEVER_BINDS)
        except WorkerError as e:
            raise SystemExit(f"activation_runs: {model}: {e}") from None
        for run in runs:
            check_library(r, run)
        results[r is other] = {run["label"]: run for run in runs}
    return plain, results[False], results.get(True, {})


def check_library(runner, run):
    """A preloaded run must have run the build its runner preloads (with --against, two builds
    alternate: a run of the wrong one would compare a build with itself)."""
    want = os.path.dirname(os.path.realpath(runner.lib))
    got = run.get("dtr_library")
    if got is not None and os.path.dirname(got) != want:
        raise SystemExit(f"activation_runs: a run meant for the build in {want} ran {got}")


def cell(runs, plain_runs, budget):
    """Summary of one budget over the rounds: status, ratios, identity, budget kept, replays."""
    statuses = [r["status"] if r else "not run" for r in runs]
    ok = [(r, p) for r, p in zip(runs, plain_runs) if r and r["status"] == "ok"]
    if len(ok) * 2 <= len(runs):  # out of memory (or too slow) in at least half the rounds
        failed = [r for r in runs if r and r["status"] != "ok"]
        return dict(status=failed[0]["status"] if failed else "not run", statuses=statuses,
                    message=(failed[0].get("message", "") if failed else ""))
    ratios = sorted(r["median_step_cpu_seconds"] / p["median_step_cpu_seconds"] for r, p in ok)
    identical = all(r["losses"] == p["losses"] and r["param_digest"] == p["param_digest"] for r, p in ok)
    kept = budget is None or all(r["peak_reserved_bytes"] <= budget for r, _ in ok)
    remats = statistics.median(r["per_step"].get("rematerializations", 0) for r, _ in ok)
    return dict(status="ok", statuses=statuses, ratio=statistics.median_low(ratios), low=ratios[0], high=ratios[-1],
                identical=identical, kept=kept, remats=remats, faults=median_faults(r for r, _ in ok))


def median_faults(runs):
    """Pages faulted a measured step, the median over the runs (None where not counted)."""
    faults = [r["minor_faults_per_step"] for r in runs if r.get("minor_faults_per_step") is not None]
    return statistics.median(faults) if faults else None


def per_round_gain(rounds, label):
    """This build's step time over the other's in each round where both trained: median and range."""
    gains = sorted(runs[label]["median_step_cpu_seconds"] / others[label]["median_step_cpu_seconds"]
                   for _, runs, others in rounds
                   if runs.get(label, {}).get("status") == "ok" and others.get(label, {}).get("status") == "ok")
    return (statistics.median(gains), gains[0], gains[-1]) if gains else None


def measure(runner, model, args, other=None):
    static, peak = static_and_peak(runner, model)
    budgets = [("never binds", None)] + [(f"r={r:g}", static + r * (peak - static)) for r in args.ratios]
    rounds = [one_round(runner, model, budgets, args.cap, other, other_first=i % 2 == 1) for i in range(args.rounds)]
    plains = [p for p, _, _ in rounds]
    cells = {label: cell([runs.get(label) for _, runs, _ in rounds], plains, b) for label, b in budgets}
    against = None
    if other is not None:
        against = {label: dict(cell=cell([others.get(label) for _, _, others in rounds], plains, b),
                               gain=per_round_gain(rounds, label)) for label, b in budgets}
    return dict(model=model, static=static, peak=peak, budgets=dict(budgets), cells=cells, against=against,
                plain_ms=statistics.median(p["median_step_cpu_seconds"] for p in plains) * 1e3,
                plain_faults=median_faults(plains),
                plain_identical=all(p["losses"] == plains[0]["losses"] for p in plains))


def pages(faults):
    return f", {faults:,.0f} pages/step"


def render_cell(c, model, r=None):
    if c["status"] != "ok":
        return {"oom": "out of memory", "too-slow": "too slow",
                "not run": "not run (a larger budget failed)"}.get(c["status"], c["status"])
    text = f"{c['ratio']:.2f}x" if c["low"] == c["high"] else f"{c['ratio']:.2f}x ({c['low']:.2f}-{c['high']:.2f})"
    goal = target(model, r) if r is not None else None
    if goal is not None and c["ratio"] > goal:
        text = f"**{text}**"
    if r is not None:
        text += f", {c['remats']:.0f} remat/step"
    if c["faults"] is not None:
        text += pages(c["faults"])
    if not c["identical"]:
        text += ", NOT bit-identical"
    if not c["kept"]:
        text += ", BUDGET EXCEEDED"
    return text


def render(rows, args):
    head = ["model", "plain step", "static", "peak", "never binds"] + [f"r={r:g}" for r in args.ratios]
    out = ["# Budgets on activations in real training runs (CPU)\n",
           f"Made by `python bench/activation_runs.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
           f"{args.rounds} rounds of a plain process and a preloaded one per model"
           + (" (and one under the build in the second table, in alternating order)" if args.against else "")
           + f", {args.warmup} warm-up and "
           f"{args.steps} measured steps a budget, {args.threads} intra-op thread, dtr built {installed_dtr_build()}. "
           "Budget = static + r x "
           "(peak - static): static is what the model holds between steps (parameters, gradients, optimizer "
           "state, batches), peak the allocated peak under a budget that never binds. Cells: dtr's median step "
           "time over the same round's plain one (process CPU time), the median over the rounds with the range, "
           "the rematerializations a step and the pages the process faulted in a step (getrusage's minor faults, "
           "the median over the rounds: fresh pages the kernels touch, runtime/README.md \"Pages kept under a "
           "binding budget\"). Bold: above issue 16's target (r = 0.5: 1.3x, the TreeLSTM 1.5x; "
           "r = 0.3: 2x). Every run that trained was bit-identical to the plain run and kept its budget "
           "(peak reserved bytes) unless its cell says otherwise; `out of memory` is dtr's OutOfMemoryError in "
           f"at least half the rounds; `too slow` a step over {args.cap:g} plain steps. bench/results/activations.md "
           "simulates the same budgets in dtr-sim, without dtr's per-op bookkeeping.\n",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = row["cells"]
        plain = f"{row['plain_ms']:.2f} ms"
        if row.get("plain_faults") is not None:
            plain += pages(row["plain_faults"])
        line = [row["model"], plain, mib(row["static"]), mib(row["peak"]),
                render_cell(cells["never binds"], row["model"])]
        line += [render_cell(cells[f"r={r:g}"], row["model"], r) for r in args.ratios]
        out.append("| " + " | ".join(line) + " |")
    if args.against:
        out += ["", f"Side by side with the build in `{args.against}` (dtr built {installed_dtr_build(package_dir=args.against)}), "
                "its preloaded process in the same rounds, first in every other one: its ratios over the same plain "
                "runs, and this build's step time over that build's, the median over the rounds with the range.\n",
                "| model | budget | this build | that build | this / that |", "|---|---|---|---|---|"]
        for row in rows:
            for label in row["cells"]:
                r = None if label == "never binds" else float(label[2:])
                g = row["against"][label]["gain"]
                gain = f"{g[0]:.3f} ({g[1]:.3f}-{g[2]:.3f})" if g else "-"
                out.append(f"| {row['model']} | {label} | {render_cell(row['cells'][label], row['model'], r)} | "
                           f"{render_cell(row['against'][label]['cell'], row['model'], r)} | {gain} |")
    out.append(GENERATED_END)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--ratios", default="0.5,0.3", help="r of the budgets, comma-separated, largest first")
    ap.add_argument("--rounds", type=int, default=5, help="plain and preloaded processes per model")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cap", type=float, default=20.0, help="a step over this many plain steps stops the block")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="also run the dtr installed in DIR (pip install --target DIR), side by side")
    ap.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    args = ap.parse_args()
    args.ratios = sorted((float(x) for x in args.ratios.split(",")), reverse=True)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        ap.error("--rounds, --steps and --warmup must be at least 1")
    runner = Runner(SimpleNamespace(device="cpu", threads=args.threads, warmup=args.warmup, steps=args.steps,
                                    build=REPO))
    other = against_runner(runner, args.against) if args.against else None
    rows = []
    for model in args.models.split(","):
        if model not in ALL_MODELS:
            ap.error(f"unknown model {model!r}: one of {', '.join(ALL_MODELS)}")
        rows.append(measure(runner, model, args, other))
        print(f"activation_runs: {model} done", file=sys.stderr, flush=True)
    publish(render(rows, args), args.out)


if __name__ == "__main__":
    main()
