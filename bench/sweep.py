"""Budget sweep harness (issue 6): trains each benchmark model (bench/bench_models.py) plainly, under
the preloaded dtr at budgets from 1.0 of its peak down to the smallest that works, and under
torch.utils.checkpoint, all in one invocation; replays traces of the real runs in dtr-sim for
every heuristic; compares the simulated overhead with planners that know the whole chain in
advance (dtr-chain: Rotor's dynamic program, Chen et al.'s sqrt(N)); and writes
<out>/<device>.md, <out>/<device>.json and <out>/<device>_<model>.png.

  .venv/bin/python bench/sweep.py [--device cpu|cuda] [--models a,b] [--heuristics dtr,dtr-eq,lru]
                                  [--quick] [--out bench/results] [--build build]

Each (model, configuration) runs in its own subprocess (bench/step_worker.py); one process
sweeps many budgets (torch.ops.dtr.set_budget), downward, until the first that is out of
memory, and a fresh process then refines below the last budget that worked.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
try:
    import bench_models  # noqa: E402
except ModuleNotFoundError as e:
    sys.exit(f"sweep: {e} in {sys.executable}; run the sweep with the venv scripts/setup.sh made (.venv/bin/python)")

WORKER = os.path.join(HERE, "step_worker.py")
ALL_MODELS = ["resnet", "densenet", "transformer", "unet", "lstm", "lm", "treelstm", "chain"]
QUICK_MODELS = ["chain", "transformer"]
DEFAULT_RATIOS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
QUICK_RATIOS = [1.0, 0.7, 0.5]
FINE_STEP = 0.025
FINE_COUNT = 3
# Note [Alternated step checks]: the largest steps are measured again, alternated.
STEP_CHECK_ROUNDS = 3
MAX_STEP_CHECKS = 3
# Issue 16 item 2 bounds the step between budgets FINE_STEP of the peak apart: the first
# heuristic (dtr) is measured at every such budget from 1.0 down until one fails.
FINE_RATIOS = [round(1.0 - k * FINE_STEP, 4) for k in range(int(round(0.9 / FINE_STEP)) + 1)]  # 1.0 .. 0.1
SIM_RATIOS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
QUICK_SIM_RATIOS = [1.0, 0.7, 0.5, 0.3]
# Issue 16 item 3 sets budgets on activations, static + r x (peak - static), static being the
# parameters, gradients, optimizer state and batches; the chain-shaped models are compared with
# Rotor there too, beside the grid of peak ratios.
ACTIVATION_RS = [0.5, 0.3]
# A recognizable op the trace worker runs between building the model and training (see trace_split).
TRACE_MARK_BYTES = 4099
NON_BINDING_BUDGET = 1 << 40  # 1 TiB
# Note [The optimal schedule's own steps]: Rotor's cost is planned on this grid of budgets (fractions
# of the trace peak) from its floor up to ROTOR_RANGE above it.
ROTOR_GRID = 0.005
ROTOR_RANGE = 0.2


class WorkerError(Exception):
    """A worker exited non-zero; `lines` holds the JSON lines it printed before (blocks done)."""
    def __init__(self, msg, lines=()):
        super().__init__(msg)
        self.lines = list(lines)


def log(msg):
    print(f"[sweep {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ processes
def preload_library():
    """libdtr.so of the dtr package installed in this interpreter (scripts/setup.sh)."""
    try:
        import dtr
    except ImportError:
        sys.exit(f"sweep: the dtr package is not installed in {sys.executable}; run scripts/setup.sh")
    return dtr.library_path


class Runner:
    def __init__(self, args):
        self.args = args
        self.lib = preload_library()
        self.pythonpath = None  # a preloaded worker imports dtr from here (activation_runs.py --against)
        self.sim = os.path.join(args.build, "bin", "dtr-sim")
        self.chain = os.path.join(args.build, "bin", "dtr-chain")
        self.processes = 0

    def env(self, preload, **dtr):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
        env.update({"OMP_NUM_THREADS": str(self.args.threads), "PYTHONHASHSEED": "0"})
        if preload:
            env["LD_PRELOAD"] = self.lib
            if self.pythonpath:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [self.pythonpath, env.get("PYTHONPATH")]))
        env.update({k: str(v) for k, v in dtr.items()})
        return env

    def worker(self, cmd, model, extra, preload=False, timeout=1200, **dtr):
        argv = [sys.executable, WORKER, cmd, "--model", model, "--device", self.args.device,
                "--threads", str(self.args.threads)] + extra
        self.processes += 1
        r = subprocess.run(argv, env=self.env(preload, **dtr), capture_output=True, text=True, timeout=timeout)
        lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode != 0:
            raise WorkerError(f"{cmd} {model} ({'preloaded ' + str(dtr) if preload else 'plain'}) exited "
                              f"{r.returncode}:\n{r.stderr[-3000:]}", lines)
        return lines

    def blocks(self, model, blocks, preload=False, max_step_seconds=0, **dtr):
        extra = ["--blocks", json.dumps(blocks), "--warmup", str(self.args.warmup), "--steps", str(self.args.steps)]
        if max_step_seconds:
            extra += ["--max-step-seconds", f"{max_step_seconds:.3f}"]
        out = self.worker("blocks", model, extra, preload=preload, **dtr)
        return [o for o in out if "event" not in o]


# ------------------------------------------------------------------------------------ real runs
def plain_runs(runner, bm):
    blocks = [{"variant": "model", "budget": None, "label": "plain"}]
    if bm.has_checkpoint:
        blocks.append({"variant": "checkpoint", "budget": None, "label": "checkpoint"})
    return runner.blocks(bm.name, blocks)


def step_time(block, a):
    """The block's median step time by the chosen clock (--timer)."""
    return block["median_step_cpu_seconds"] if a.timer == "cpu" else block["median_step_seconds"]


# Note [Paired steps]
# Issue 16 item 2 bounds how much more time training takes between two budgets FINE_STEP apart.
# Every block trains on the same batches in the same order from the same seeds, so the k-th
# measured step is the same work at every budget, and the step between two budgets is the ratio
# of the total time of their measured steps: step k against step k. A ratio of median step times
# compares different steps where the steps' work differs: the TreeLSTM draws a fresh tree of
# 16-32 leaves a step, a small tree costs about the same at both budgets and a large one much
# more at the lower, so the median moved from a small tree to a large one. Its step 0.3 -> 0.275
# of the peak, measured side by side (8 steps, two runs each): medians 17.0-17.9 ms against
# 25.1-25.6 ms (1.45), step-by-step ratios 1.06-1.77 (median 1.23), totals 1.29; stop 64's
# sweep 1.42 by medians, 1.28 by totals. On models whose steps are alike the two agree (ResNet
# 1.15 and 1.15, the chain 1.59 and 1.59 in that sweep). The alternated checks (Note [Alternated
# step checks]) take each round's ratio of totals and the median over rounds, so one round
# disturbed by the machine counts for no more than one of three.
def step_seconds(block, a):
    """The block's measured step times by the chosen clock (--timer), in the order they ran."""
    return block["step_cpu_seconds"] if a.timer == "cpu" else block["step_seconds"]


def paired_ratio(above, below):
    """Note [Paired steps]: the total time of `below`'s steps over that of the same steps of `above`."""
    if len(above) != len(below) or not above:
        raise ValueError(f"paired steps: {len(above)} steps against {len(below)}")
    return sum(below) / sum(above)


def step_between(above, below):
    """How many times `above`'s training time `below` takes: the total time of the same measured steps
    (Note [Paired steps]), or, for blocks of a JSON written before the steps were kept and without
    them, the ratio of their median steps' time ratios."""
    if "measured_steps" in above and "measured_steps" in below:
        return paired_ratio(above["measured_steps"], below["measured_steps"])
    return below["time_ratio"] / above["time_ratio"]


def timed_blocks(res):
    """The model's preloaded blocks whose steps are timed against the plain run: every heuristic's
    sweep points, the unbudgeted and never-binding runs, and the probe halfway below the smallest
    working budget when it trained."""
    extra = [b for b in (res["unlimited"], res["non_binding"]) if b]
    if (res.get("edge_probe") or {}).get("status") == "ok":
        extra.append(res["edge_probe"])
    return [b for pts in res["sweeps"].values() for b in pts], extra


def oom_delay(failure, res, a):
    """How long an out-of-memory failure took to come, in plain steps: the failing step's time until
    the error (or the model's build, when it failed there) over the plain step time; None if not
    out of memory or not measured."""
    key = "cpu_seconds_to_oom" if a.timer == "cpu" else "seconds_to_oom"
    if not failure or failure.get("status") != "oom" or key not in failure or not res.get("plain_step_seconds"):
        return None
    return failure[key] / res["plain_step_seconds"]


def failure_cell(failure, res, a):
    d = oom_delay(failure, res, a)
    cell = {"oom": "oom", "too-slow": "too slow"}.get(failure["status"], failure["status"])
    return cell if d is None else f"{cell} after {d:.2f} steps"


def identical(block, ref):
    return block["losses"] == ref["losses"] and block["param_digest"] == ref["param_digest"]


def never_binding_budget(runner):
    """DTR_BUDGET for the preloaded runs: recording from the start (Note [Recording starts with a
    budget]), as a run under DTR_BUDGET does, with torch.ops.dtr.set_budget setting each block's
    budget. On a GPU smaller than 1 TiB that budget is refused: all of the device's memory."""
    return "1.0" if getattr(runner.args, "device", "cpu") == "cuda" else NON_BINDING_BUDGET


def budget_block(ratio, base):
    """step_worker's block for the model under the budget ratio x base."""
    return {"variant": "model", "budget": int(round(ratio * base)), "ratio": ratio, "label": f"{ratio:g}"}


def sweep_heuristic(runner, bm, heuristic, base, plain_s, ref, ratios, edge_probe=None):
    """Budgets ratio*base, downward, until one fails; then FINE_STEP refinements below the last
    that worked (in a fresh process: the failed one may have died mid-step). With `edge_probe` (a
    dict), when the failure is FINE_STEP below the last budget that worked, the budget halfway
    between is run too, in a fresh process, and its block goes into edge_probe["block"]: a budget
    that trains there only by thrashing is a cliff the steps of FINE_STEP step over."""
    max_s = runner.args.max_slowdown * plain_s
    points, failures, errors = [], [], []

    def run(rs):
        blocks = [budget_block(r, base) for r in rs]
        try:
            # The batches step_worker makes before the first block are recorded, evictable until
            # their step reads them.
            done = runner.blocks(bm.name, blocks, preload=True, max_step_seconds=max_s, DTR_HEURISTIC=heuristic,
                                 DTR_BUDGET=never_binding_budget(runner))
        except WorkerError as e:
            # The budgets measured before the crash stand; the crash is the next budget's failure.
            done = [o for o in e.lines if "event" not in o]
            failed = {"status": "error", "message": str(e).splitlines()[0]}
            if len(done) < len(rs):
                failed["ratio"] = rs[len(done)]
            done.append(failed)
            errors.append(str(e))
        for b in done:
            if b["status"] != "ok":
                failures.append(b)
                return
            b["identical"] = identical(b, ref)
            if not b["identical"]:
                log(f"!!! {bm.name} {heuristic} at ratio {b['ratio']}: losses/parameters differ from the plain run")
            points.append(b)

    run(ratios)
    if failures and points and not runner.args.no_refine:
        last_ok, bad = points[-1]["ratio"], failures[0].get("ratio", 0)
        fine = [round(last_ok - k * FINE_STEP, 4) for k in range(1, FINE_COUNT + 1)]
        fine = [r for r in fine if r > bad + 1e-9]
        if fine:
            run(fine)
    failed_below = [f["ratio"] for f in failures if "ratio" in f]
    if edge_probe is not None and points and failed_below:
        last_ok = min(p["ratio"] for p in points)
        if abs(last_ok - max(failed_below) - FINE_STEP) < 1e-6:
            kept_points, kept_failures = len(points), len(failures)
            run([round(last_ok - FINE_STEP / 2, 4)])
            probed = points[kept_points:] + failures[kept_failures:]
            del points[kept_points:], failures[kept_failures:]
            if probed:
                edge_probe["block"] = probed[0]
    return points, failures, errors


def check_largest_steps(runner, bm, heuristic, base, points, rounds, most=MAX_STEP_CHECKS):
    """Note [Alternated step checks]: the sweep measures each budget once, in one process, one
    after the other, and on a shared machine a single measurement moves by tens of percent, so the
    largest step of FINE_STEP is measured again: its two budgets alternated `rounds` times, each
    in a fresh process, the step being the median over rounds of each round's ratio of the total
    time of the same steps (Note [Paired steps]). When the check makes the step smaller than
    another step the sweep measured, that one is checked next, up to `most` steps, so the reported
    largest step is a checked one unless `most` ran out. Returns the checks, each {"above",
    "below", "sweep_ratio", "ratio", "round_ratios", "above_seconds", "below_seconds"} (the
    seconds: each round's median step), or with "failure" instead of "ratio" when a run of it
    failed (its step then stays the sweep's)."""
    a = runner.args
    checks = []
    while len(checks) < most:
        hi, lo, r, check = largest_step(points, checks)
        if check is not None or r is None:
            break  # the largest step is a checked one (or there is none)
        seconds = {hi: [], lo: []}
        steps = {hi: [], lo: []}
        failure = None
        for _ in range(rounds):
            for ratio in (hi, lo):
                try:
                    done = runner.blocks(bm.name, [budget_block(ratio, base)], preload=True, DTR_HEURISTIC=heuristic,
                                         DTR_BUDGET=never_binding_budget(runner))
                except WorkerError as e:
                    done = [{"status": "error", "message": str(e).splitlines()[0]}]
                if not done or done[0]["status"] != "ok":
                    failure = dict(done[0] if done else {"status": "error"}, ratio=ratio)
                    break
                seconds[ratio].append(step_time(done[0], a))
                steps[ratio].append(step_seconds(done[0], a))
            if failure:
                break
        check = {"above": hi, "below": lo, "sweep_ratio": r, "above_seconds": seconds[hi], "below_seconds": seconds[lo]}
        if failure:
            check["failure"] = {k: failure[k] for k in ("status", "message", "ratio") if k in failure}
            log(f"{bm.name}: the check of {hi:g} -> {lo:g} failed at {failure['ratio']:g}: {failure['status']}")
            checks.append(check)
            break  # a budget the sweep trained failed in a fresh process: the sweep's step stands
        check["round_ratios"] = [paired_ratio(above, below) for above, below in zip(steps[hi], steps[lo])]
        check["ratio"] = statistics.median(check["round_ratios"])
        log(f"{bm.name}: {hi:g} -> {lo:g}: {r:.2f} times in the sweep, {check['ratio']:.2f} alternated {rounds} times")
        checks.append(check)
    return checks


def real_runs(runner, bm):
    a = runner.args
    res = {"name": bm.name, "description": bm.description, "checkpoint_note": bm.checkpoint_note,
           "chain_note": bm.chain_note, "errors": []}
    log(f"{bm.name}: plain")
    first = plain_runs(runner, bm)
    res["plain_runs"] = [first]
    ref = first[0]
    log(f"{bm.name}: preloaded, no budget (the base of the ratios)")
    blocks = [{"variant": "model", "budget": None, "label": "unlimited"}]
    if bm.has_checkpoint:
        blocks.append({"variant": "checkpoint", "budget": None, "label": "checkpoint"})
    # A budget that never binds: what being under a budget costs by itself.
    blocks.append({"variant": "model", "budget": NON_BINDING_BUDGET, "label": "non-binding"})
    try:
        unl = runner.blocks(bm.name, blocks, preload=True)
    except WorkerError as e:
        res["errors"].append(str(e))
        log(f"{bm.name}: the preloaded run failed; no dtr sweep:\n{e}")
        unl = []
    by_label = {b["label"]: b for b in unl if b.get("status") == "ok"}
    res["unlimited"] = by_label.get("unlimited")
    res["checkpoint_unlimited"] = by_label.get("checkpoint")
    res["non_binding"] = by_label.get("non-binding")
    unl = [res["unlimited"]] if res["unlimited"] else []
    res["base_bytes"] = unl[0]["peak_allocated_bytes"] if unl else None
    res["sweeps"], res["failures"] = {}, {}  # failures: the blocks that were out of memory or too slow
    if unl:
        for h in a.heuristics:
            log(f"{bm.name}: {h} sweep")
            try:
                ratios = a.fine_ratios if h == a.heuristics[0] and a.fine_ratios else a.ratios
                probe = {} if h == a.heuristics[0] and a.fine_ratios else None
                pts, fail, errs = sweep_heuristic(runner, bm, h, res["base_bytes"], step_time(ref, a), ref, ratios,
                                                  edge_probe=probe)
                if probe:
                    res["edge_probe"] = probe["block"]
                res["errors"] += errs
            except WorkerError as e:
                res["errors"].append(str(e))
                log(f"{bm.name}: {h} failed:\n{e}")
                pts, fail = [], [{"status": "error", "message": str(e).splitlines()[0]}]
            res["sweeps"][h], res["failures"][h] = pts, fail
    log(f"{bm.name}: plain again (timing drift)")
    res["plain_runs"].append(plain_runs(runner, bm))
    res["plain_step_seconds"] = min(step_time(r[0], a) for r in res["plain_runs"])
    res["plain_wall_step_seconds"] = min(r[0]["median_step_seconds"] for r in res["plain_runs"])
    ck_meds = [step_time(r[1], a) for r in res["plain_runs"] if len(r) > 1]
    res["checkpoint_step_seconds"] = min(ck_meds) if ck_meds else None
    # Time ratios against the better of the two plain measurements (never flatters dtr).
    p, pw = res["plain_step_seconds"], res["plain_wall_step_seconds"]
    points, extra = timed_blocks(res)
    for b in points + extra:
        b["time_ratio"] = step_time(b, a) / p
        b["wall_time_ratio"] = b["median_step_seconds"] / pw
        b["measured_steps"] = step_seconds(b, a)  # Note [Paired steps]
    for b in extra:
        b["identical"] = identical(b, ref)
    if res["checkpoint_step_seconds"]:
        res["checkpoint_time_ratio"] = res["checkpoint_step_seconds"] / p
        res["checkpoint_identical"] = all(identical(r[1], ref) for r in res["plain_runs"] if len(r) > 1)
    ck = res["checkpoint_unlimited"]
    if ck and res["base_bytes"]:
        res["checkpoint_memory_ratio"] = ck["peak_allocated_bytes"] / res["base_bytes"]
    h0 = a.heuristics[0]
    if a.fine_ratios and a.step_checks and res["sweeps"].get(h0):
        log(f"{bm.name}: the largest steps of {FINE_STEP:g}, alternated {a.step_checks} times")
        res["step_checks"] = check_largest_steps(runner, bm, h0, res["base_bytes"], res["sweeps"][h0], a.step_checks)
    if a.device == "cuda":
        # Plain peaks from torch.cuda; without a dtr that manages CUDA memory they are the base.
        res["plain_peak_allocated_bytes"] = ref.get("peak_allocated_bytes")
        if len(first) > 1:
            res["checkpoint_plain_peak_allocated_bytes"] = first[1].get("peak_allocated_bytes")
        if not res["base_bytes"] and res["plain_peak_allocated_bytes"]:
            res["base_bytes"] = res["plain_peak_allocated_bytes"]
            if res.get("checkpoint_plain_peak_allocated_bytes"):
                res["checkpoint_memory_ratio"] = res["checkpoint_plain_peak_allocated_bytes"] / res["base_bytes"]
    return res


# ------------------------------------------------------------------------------------ simulator
def trace_split(path):
    """(cost of the events before the trace mark = building the model and batches, total cost of
    all op events). Costs are the trace's own (ns)."""
    before, total, marked = 0.0, 0.0, False
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or parts[0] not in ("call", "opaque", "mutate"):
                continue
            c = float(parts[2])
            total += c
            if not marked:
                if parts[0] == "call" and parts[1].startswith("aten::full") and parts[-1].endswith(f":{TRACE_MARK_BYTES}"):
                    marked = True
                else:
                    before += c
    if not marked:
        raise WorkerError(f"{path}: the trace mark (aten::full of {TRACE_MARK_BYTES} bytes) is missing")
    return before, total


SIM_TIMEOUT_SECONDS = 120


def steady_overhead(d, warmup):
    """(remat cost) / (base cost) between the trace's marks step-<warmup> and end; None for a run
    that ran out of memory before the end mark (after it, the worker only measures the batches,
    and dtr-sim brings back what the program still holds: not training steps)."""
    marks = {m["label"]: m for m in d.get("marks") or []}
    if d["status"] == "ok" and (f"step-{warmup}" not in marks or "end" not in marks):
        raise WorkerError(f"dtr-sim's result lacks the trace marks step-{warmup} and end: {sorted(marks)}")
    if "end" not in marks:
        return None
    start, end = marks[f"step-{warmup}"], marks["end"]
    base = end["base_cost"] - start["base_cost"]
    if base <= 0:
        raise WorkerError(f"no base cost between the marks step-{warmup} and end: the measured steps ran no op")
    return ((end["total_cost"] - end["base_cost"]) - (start["total_cost"] - start["base_cost"])) / base


def run_sim(runner, trace, heuristic, ratio, budget=None):
    """One dtr-sim run at `ratio` of the trace's peak, or at `budget` bytes when given."""
    limit = ["--budget", str(int(budget))] if budget is not None else ["--ratio", f"{ratio:g}"]
    argv = [runner.sim, "--trace", trace] + limit + ["--heuristic", heuristic, "--seed", "1"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=SIM_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return {"ratio": ratio, "status": f"timeout ({SIM_TIMEOUT_SECONDS} s)", "overhead": None,
                "budget_bytes": int(budget) if budget is not None else None}
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise WorkerError(f"dtr-sim gave no JSON for {trace} {heuristic} {ratio}: rc {r.returncode}\n{r.stderr[-2000:]}")
    d = lines[-1]
    keep = {k: d.get(k) for k in ("status", "budget_bytes", "peak_bytes", "base_cost", "total_cost", "compute_ratio",
                                  "evictions", "rematerializations", "marks")}
    keep["ratio"] = ratio
    # Note [Memory floor] (runtime/runtime.cc): what must be resident at the worst op.
    keep["floor_bytes"] = (d.get("stats") or {}).get("floor_bytes")
    return keep


def sim_point(runner, trace, heuristic, ratio, budget=None):
    """run_sim with the overhead of the measured training steps alone, from the mark before the first
    of them to the end (Note [Steady-state steps], runtime/sim/simulator.h: the warm-up steps run
    before the gradients and the optimizer state exist, and cold); the marks, read once, dropped
    (cpu.json keeps the overhead; a timed-out run has none)."""
    d = run_sim(runner, trace, heuristic, ratio, budget)
    d["overhead"] = steady_overhead(d, runner.args.trace_warmup)
    d.pop("marks", None)
    return d


def trained(d):
    """Whether a dtr-sim point trained through the measured steps."""
    return d["status"] == "ok" and d["overhead"] is not None


def simulate(runner, bm, work):
    a = runner.args
    trace = os.path.join(work, f"{a.device}_{bm.name}.trace")
    steps = a.trace_warmup + a.trace_steps
    log(f"{bm.name}: trace ({steps} steps, {a.trace_warmup} of them warm-up)")
    info = runner.worker("trace", bm.name, ["--steps", str(steps), "--mark-bytes", str(TRACE_MARK_BYTES)],
                         preload=True, DTR_TRACE_FILE=trace)[-1]
    build_cost, total = trace_split(trace)
    sim = {"trace": os.path.relpath(trace, REPO), "info": info, "build_cost": build_cost, "trace_op_cost": total,
           "runs": {}}
    log(f"{bm.name}: dtr-sim, {len(a.sim_heuristics)} heuristics x {len(a.sim_ratios)} ratios")
    for h in a.sim_heuristics:
        sim["runs"][h] = [sim_point(runner, trace, h, r) for r in a.sim_ratios]
    ok = [d for d in sim["runs"][a.sim_heuristics[0]] if d["ratio"] == 1.0 and d["status"] == "ok"]
    sim["peak_bytes"] = ok[0]["peak_bytes"] if ok else None
    # The lower bound under no budget: unevictable bytes plus the worst op's operands. No
    # schedule, dtr's or another, trains in less (issue 16 item 1).
    sim["floor_bytes"] = ok[0]["floor_bytes"] if ok else None
    # Issue 16 item 3's budgets on activations, under the default heuristic.
    sim["activation_runs"] = []
    if sim["peak_bytes"] and DEFAULT_HEURISTIC in sim["runs"]:
        static = info["static_bytes"]
        for r in ACTIVATION_RS:
            budget = int(static + r * (sim["peak_bytes"] - static))
            d = sim_point(runner, trace, DEFAULT_HEURISTIC, budget / sim["peak_bytes"], budget=budget)
            d["activation_r"] = r
            sim["activation_runs"].append(d)
    return sim


# ------------------------------------------------------------------------------------ chain baselines
def write_chain_file(path, model, profile_time, profile_mem, note, note_timer):
    with open(path, "w") as f:
        f.write("dtr-chain v1\n")
        f.write(f"# {model}, batch {profile_time['batch']}: {note}\n")
        f.write(f"# u_f u_b in ns ({note_timer} time, plain process, minimum of the timed runs); a abar in bytes (exact storages: output; everything the\n")
        f.write("# forward keeps for backward, output included, input and parameters excluded); o_f o_b: transient\n")
        f.write("# bytes above those during forward/backward " +
                ("(allocator peaks)\n" if profile_mem else "(not measured: 0)\n"))
        f.write(f"input {profile_time['input_bytes']}\n")
        for i, s in enumerate(profile_time["stages"]):
            m = profile_mem["stages"][i] if profile_mem else {}
            f.write(f"stage {s['name']} {int(round(s['u_f'] * 1e9))} {int(round(s['u_b'] * 1e9))} {s['a']} {s['abar']} "
                    f"{m.get('o_f', 0)} {m.get('o_b', 0)}\n")


def run_chain(runner, path, budgets, planner="all"):
    """dtr-chain on one chain file: (its peak with no recomputation, {(planner, budget): result})
    for the given budgets (None: only the peak)."""
    what = ["--budget", ",".join(str(int(b)) for b in budgets), "--planner", planner] if budgets else \
        ["--ratio", "1", "--planner", "rotor"]
    argv = [runner.chain, "--chain", path, "--slots", str(runner.args.rotor_slots)] + what
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise WorkerError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    out, peak = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("ratio") == 1:
                peak = int(d["budget_bytes"])
            out[(d["planner"], int(d["budget_bytes"]))] = d
    return peak, out


def chain_baselines(runner, bm, sim, work):
    """Rotor-style profile of the chain stages on the traced batches, one chain file per batch,
    dtr-chain at the simulator's budgets less the bytes that are not the chain's activations."""
    a = runner.args
    info = sim["info"]
    # The measured steps' batches: the simulated overhead is theirs (Note [Steady-state steps]).
    batches = ",".join(str(i) for i in range(a.trace_warmup, a.trace_warmup + a.trace_steps))
    log(f"{bm.name}: chain profile (plain: times; preloaded: transient memory)")
    times = runner.worker("profile", bm.name, ["--batches", batches, "--repeats", str(a.profile_repeats),
                                               "--timer", a.timer])
    mems = None
    if a.device == "cpu":
        mems = runner.worker("profile", bm.name, ["--batches", batches, "--repeats", "1"], preload=True)
    files = []
    for i, pt in enumerate(times):
        path = os.path.join(work, f"{a.device}_{bm.name}_batch{pt['batch']}.chain")
        # On CUDA the plain profile measured the transient bytes itself (torch.cuda peaks).
        mem = mems[i] if mems else (pt if pt["stages"] and "o_f" in pt["stages"][0] else None)
        write_chain_file(path, bm.name, pt, mem, bm.chain_note, a.timer)
        files.append(path)
    res = {"files": [os.path.relpath(f, REPO) for f in files], "profiles": times, "memory_profiles": mems,
           "rows": [], "available": os.path.exists(runner.chain)}
    if not res["available"]:
        res["error"] = f"{runner.chain} not found (build target dtr-chain)"
        log(f"{bm.name}: {res['error']}; no optimal baselines")
        return res
    if not sim.get("peak_bytes"):
        res["error"] = "the simulator gave no peak at ratio 1.0"
        return res
    # Bytes in the simulator's budget that the chain does not model: parameters, gradients,
    # optimizer state and the batches (the chain's own input is counted by the chain once).
    nonchain = info["static_bytes"] - max(ci["input_bytes_in_static"] for ci in info["chain_inputs"])
    res["nonchain_bytes"] = nonchain
    # Each chain's own peak with no recomputation (F_all all the way, then B).
    peaks = [run_chain(runner, f, None)[0] for f in files]
    res["chain_peak_bytes"] = peaks
    sim_peak = sim["peak_bytes"]
    res["sim_activation_peak_bytes"] = sim_peak - nonchain
    ref = {d["ratio"]: d for d in sim["runs"][a.sim_heuristics[0]]}

    def aligned(ratio, sb):
        # Two alignments (see the report): "raw" gives the chain the simulator's budget less the
        # non-activation bytes; "calibrated" takes the same bytes away from each side's own peak
        # (the chains' peak: that of the step with the largest one, as the trace's peak is).
        removed = sim_peak - sb
        return {"ratio": ratio, "sim_budget_bytes": sb, "removed_bytes": removed,
                "raw_budget_bytes": sb - nonchain, "calibrated_budget_bytes": [max(peaks) - removed] * len(peaks)}

    rows = [aligned(r, ref[r]["budget_bytes"] if ref.get(r) and ref[r].get("budget_bytes") else int(round(r * sim_peak)))
            for r in a.sim_ratios]
    # Issue 16 item 3: the same comparison at the budgets on activations (simulate's activation_runs).
    act_rows = [dict(aligned(d["ratio"], d["budget_bytes"]), activation_r=d["activation_r"])
                for d in sim.get("activation_runs", []) if d.get("budget_bytes") is not None]
    outs = []
    for i, f in enumerate(files):
        want = sorted({row["raw_budget_bytes"] for row in rows + act_rows} |
                      {row["calibrated_budget_bytes"][i] for row in rows + act_rows})
        want = [b for b in want if b > 0]
        outs.append(run_chain(runner, f, want)[1] if want else {})
    planners = sorted({p for out in outs for (p, _) in out})
    res["planners"] = planners

    def combine(p, budgets):
        if any(b <= 0 for b in budgets):
            return {"status": "infeasible", "note": "budget below non-activation memory"}
        return combined_plan(outs, p, budgets)

    for row in rows + act_rows:
        row["planners"] = {p: combine(p, row["calibrated_budget_bytes"]) for p in planners}
        row["raw_planners"] = {p: combine(p, [row["raw_budget_bytes"]] * len(files)) for p in planners}
    res["rows"] = rows
    res["activation_rows"] = act_rows
    res["rotor_curve"] = rotor_curve(runner, files, sim_peak)
    return res


def combined_plan(outs, planner, budgets):
    """One planner's plans of the measured steps' chains (outs: run_chain's results per chain file,
    each at its budget) as one: their makespans over their base costs, or infeasible if one is."""
    per = [out.get((planner, b)) for out, b in zip(outs, budgets)]
    if any(d is None or d.get("status") != "ok" for d in per):
        return {"status": "infeasible"}
    mk, base = sum(d["makespan"] for d in per), sum(d["base_cost"] for d in per)
    return {"status": "ok", "overhead": mk / base - 1.0, "peak_bytes": max(d.get("peak_bytes", 0) for d in per)}


# Note [The optimal schedule's own steps]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Issue 16 item 2 asks that the step time rise by at most 1.5x between budgets FINE_STEP of the
# peak apart, down to the floor. Near its floor a chain has a wall of its own under any schedule:
# with room for one activation beside what the backward pass holds, every backward stage
# recomputes the forward pass from the input (L^2/2 stage replays for L stages), with room for
# two it recomputes from one checkpoint (about L^1.5), and so on; so a few activations more or
# less change the step time several times over. The real chain shows it: at 0.2125 of its peak
# every stage of the backward pass rebuilt all 64 layers from the input (which it evicted too),
# 5.4k rematerializations a step at 17.5x the plain step, against 0.7k at 0.225. Rotor's dynamic
# program, the optimal persistent schedule for the chain's profile, shows how large such a wall
# is for the optimal schedule at its own floor: rotor_curve plans it on budgets ROTOR_GRID of the
# trace peak apart from its floor, and the report gives its largest step of FINE_STEP beside
# dtr's. It is not a bound on dtr at dtr's budgets: Rotor keeps all static memory resident and
# plans whole stages, so its floor lies above dtr's smallest working budget (on the chain 1.43 MB
# of the sweep's budget accounting, against dtr's 1.24 MB), and its plan rounds memory to
# --rotor-slots slots, so its exact floor itself never fits and the grid's first plan is one step
# above it.
def rotor_curve(runner, files, trace_peak):
    """Rotor's step time (the chains' makespans over their base costs, summed over the measured
    steps' chains) at budgets ROTOR_GRID of the trace peak apart, from its floor up to ROTOR_RANGE
    above it: {"floor_bytes", "grid_bytes", "points": [[budget, time], ...]} (Note [The optimal
    schedule's own steps])."""
    try:
        floors = []
        for f in files:
            (d,) = run_chain(runner, f, [1], planner="rotor")[1].values()
            if not d.get("min_budget_bytes"):
                return {"error": f"dtr-chain gave no floor for {f}"}
            floors.append(int(d["min_budget_bytes"]))
        floor, grid = max(floors), ROTOR_GRID * trace_peak
        budgets = [int(round(floor + k * grid)) for k in range(int(round(ROTOR_RANGE / ROTOR_GRID)) + 1)]
        outs = [run_chain(runner, f, budgets, planner="rotor")[1] for f in files]
    except (WorkerError, subprocess.TimeoutExpired) as e:
        # The chain rows already planned stay; only these steps are missing.
        return {"error": str(e).strip().splitlines()[0][:300]}
    plans = [(b, combined_plan(outs, "rotor", [b] * len(outs))) for b in budgets]
    points = [[b, 1 + plan["overhead"]] for b, plan in plans if plan["status"] == "ok"]
    return {"floor_bytes": floor, "grid_bytes": grid, "points": points}


def rotor_largest_step(curve, trace_peak):
    """(budget above, budget below, time below / time above) of the largest step of FINE_STEP of the
    trace peak on Rotor's curve (Note [The optimal schedule's own steps]), or None."""
    points = (curve or {}).get("points") or []
    apart = FINE_STEP * trace_peak
    steps = [(hi[0], lo[0], lo[1] / hi[1]) for lo in points for hi in points
             if abs(hi[0] - lo[0] - apart) <= 0.5 * curve["grid_bytes"]]
    return max(steps, key=lambda s: s[2]) if steps else None


# ------------------------------------------------------------------------------------ report
def installed_dtr_build(python=sys.executable, package_dir=None):
    """How the dtr that `python` imports (from package_dir, a `pip install --target` directory, if
    given) was built, for the results' headers: with or without the profile-guided optimization
    scripts/setup.sh does (Note [Profile-guided optimization])."""
    env = dict(os.environ, PYTHONPATH=package_dir) if package_dir else None
    r = subprocess.run([python, "-c", "import dtr._build_info as b; print(b.PGO)"], capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        return "(unknown: dtr._build_info could not be read)"
    pgo = r.stdout.strip()
    return "profile-guided (scripts/setup.sh)" if pgo == "use" else f"without profile-guided optimization ({pgo or 'plain pip install'})"


def machine_info(device):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    torch_v = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    dtr_build = installed_dtr_build()
    gpu = None
    if device == "cuda":
        gpu = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                             capture_output=True, text=True).stdout.strip()

    def git(*a):
        r = subprocess.run(["git", "-C", REPO] + list(a), capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "torch": torch_v, "dtr_build": dtr_build, "gpu": gpu,
            "commit": commit, "dirty": bool(dirty), "python": platform.python_version(),
            "kernel": platform.release(), "load_average_start": os.getloadavg()}


def mib(b):
    return "—" if b is None else f"{b / 2**20:.2f} MiB"


def x(v, nd=2):
    return "—" if v is None else f"{v:.{nd}f}×"


def pct(v):
    if v is None:
        return "—"
    return f"{100 * v:.1f}%" if abs(v) < 10 else f"{100 * v:.0f}%"


def secs(v):
    return "—" if v is None else (f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s")


def interp_time(points, ratio):
    """dtr's time ratio at a memory ratio, linear between the measured budgets around it."""
    pts = sorted((p["ratio"], p["time_ratio"]) for p in points)
    if not pts or ratio < pts[0][0] - 1e-9:
        return None
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
        if r0 <= ratio <= r1:
            return t0 + (t1 - t0) * (ratio - r0) / (r1 - r0) if r1 > r0 else t0
    return pts[-1][1] if ratio >= pts[-1][0] else None


def at_ratio(points, ratio):
    for p in points:
        if abs(p["ratio"] - ratio) < 1e-9:
            return p
    return None


def failure_text(f):
    if not f:
        return "every ratio worked"
    return {"oom": "out of memory", "too-slow": "slower than the step-time cap", "error": "worker error"}.get(
        f["status"], f["status"]) + (f" at {f['ratio']:g}" if "ratio" in f else "")


def model_section(res, a, dev):
    L = []
    name = res["name"]
    L.append(f"## {name}\n")
    L.append(f"{res['description']}.\n")
    plains = [step_time(r[0], a) for r in res["plain_runs"]]
    walls = [r[0]["median_step_seconds"] for r in res["plain_runs"]]
    L.append(f"Plain step (no preload; {a.timer} time, wall in parentheses): {secs(plains[0])} ({secs(walls[0])}) "
             f"before the dtr runs, {secs(plains[-1])} ({secs(walls[-1])}) after; time ratios divide by the smaller.")
    u = res.get("unlimited")
    if u:
        L.append(f" Preloaded with no budget: {secs(step_time(u, a))} per step ({x(u['time_ratio'])}), "
                 f"peak allocated {mib(res['base_bytes'])} (= ratio 1.0), peak reserved {mib(u['peak_reserved_bytes'])} "
                 f"(the unbudgeted allocator caches freed blocks); with no budget dtr records "
                 f"{u['per_step']['ops_recorded']:.0f} ops a step (Note [Recording starts with a budget])"
                 + ("" if u["identical"] else "; **losses differ from the plain run**") + ".")
    nb = res.get("non_binding")
    if nb:
        L.append(f" Under a budget that never binds (1 TiB): {secs(step_time(nb, a))} per step ({x(nb['time_ratio'])}), "
                 f"dtr bookkeeping {secs(nb['per_step']['bookkeeping_seconds'])} per step over "
                 f"{nb['per_step']['ops_recorded']:.0f} ops"
                 + ("" if nb["identical"] else "; **losses differ from the plain run**") + ".")
    L.append("\n")
    for e in res["errors"]:
        L.append(f"\n**Error:** ```{e.splitlines()[0][:300]}```\n")
    hs = [h for h in a.heuristics if res["sweeps"].get(h)]
    if not hs:
        fails = [f"{h}: {failure_text(f)} ({f.get('message', '')[:200]})" for h in a.heuristics
                 for f in res.get("failures", {}).get(h, [])]
        L.append("No budget worked. " + "; ".join(fails) + "\n" if fails else "No dtr sweep.\n")
        if res.get("checkpoint_time_ratio") is not None and res.get("checkpoint_memory_ratio") is not None:
            L.append(f"torch.utils.checkpoint: {res['checkpoint_memory_ratio']:.2f} of the peak at "
                     f"{x(res['checkpoint_time_ratio'])} the plain step time ({res['checkpoint_note']}).\n")
        return "\n".join(L)
    # Compact table: time ratio per heuristic.
    ratios = sorted({p["ratio"] for h in hs for p in res["sweeps"][h]} |
                    {f["ratio"] for h in hs for f in res["failures"].get(h, []) if "ratio" in f}, reverse=True)
    L.append("| budget ratio | budget | " + " | ".join(f"{h} time ratio" for h in hs) + " |")
    L.append("|---|---|" + "---|" * len(hs))
    for r in ratios:
        cells = []
        for h in hs:
            p = at_ratio(res["sweeps"][h], r)
            if p:
                cells.append(x(p["time_ratio"]) + ("" if p["identical"] else " **≠**"))
            else:
                f = [f for f in res["failures"].get(h, []) if abs(f.get("ratio", -1) - r) < 1e-9]
                cells.append(failure_cell(f[0], res, a) if f else "—")
        L.append(f"| {r:g} | {mib(round(r * res['base_bytes']))} | " + " | ".join(cells) + " |")
    if res.get("checkpoint_time_ratio") is not None and res.get("checkpoint_memory_ratio") is not None:
        L.append(f"| checkpoint: {res['checkpoint_memory_ratio']:.2f} | "
                 f"{mib(res['checkpoint_unlimited']['peak_allocated_bytes'])} reached | "
                 + " | ".join(x(res["checkpoint_time_ratio"]) + " (torch.utils.checkpoint)" if i == 0 else "—"
                              for i in range(len(hs))) + " |")
    L.append("")
    L.append(caption_sweep(res, hs, a) + "\n")
    # Detailed table.
    L.append("<details><summary>all measurements</summary>\n")
    L.append(f"| ratio | heuristic | budget | peak reserved | peak allocated | step ({a.timer}) | time ratio | wall "
             "time ratio (load avg) | evictions/step (eager) | remats/step | remat s/step | search s/step | "
             "bookkeeping s/step | bit-identical |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ratios:
        for h in hs:
            p = at_ratio(res["sweeps"][h], r)
            if not p:
                continue
            s = p["per_step"]
            L.append(f"| {r:g} | {h} | {mib(p['budget_bytes'])} | {mib(p['peak_reserved_bytes'])} | "
                     f"{mib(p['peak_allocated_bytes'])} | {secs(step_time(p, a))} | {x(p['time_ratio'])} | "
                     f"{x(p['wall_time_ratio'])} ({p['load_average']:.1f}) | "
                     f"{s['evictions']:.1f} ({s['eager_evictions']:.1f}) | {s['rematerializations']:.1f} | "
                     f"{s['remat_seconds']:.4f} | {s['search_seconds']:.4f} | {s['bookkeeping_seconds']:.4f} | "
                     f"{'yes' if p['identical'] else '**NO**'} |")
    for h in hs:
        for f in res["failures"].get(h, []):
            L.append(f"| {f.get('ratio', '—')} | {h} | {failure_text(f)}: {f.get('message', '')[:160].replace('|', '/')} "
                     "| | | | | | | | | | | |")
    L.append("\nThe peak reserved bytes never exceed the budget (the allocator caps them); evictions include the "
             "eager evictions of dropped tensors, which happen with no budget too.\n")
    L.append("</details>\n")
    L.append(f"![{name}]({dev}_{name}.png)\n")
    ck = res.get("checkpoint_note")
    L.append(f"Checkpointing: {ck}.\n")
    return "\n".join(L)


def caption_sweep(res, hs, a):
    parts = []
    for h in hs:
        pts = res["sweeps"][h]
        low = min(pts, key=lambda p: p["ratio"])
        s = f"{h} trains down to {low['ratio']:g} of the peak at {x(low['time_ratio'])}"
        half = at_ratio(pts, 0.5)
        if half and low["ratio"] < 0.5:
            s += f" ({x(half['time_ratio'])} at 0.5)"
        below = [f for f in res["failures"].get(h, []) if f.get("ratio", 1) < low["ratio"]]
        if below:
            first = max(below, key=lambda f: f["ratio"])
            d = oom_delay(first, res, a)
            s += f", {failure_text(first)}" + ("" if d is None else f" after {d:.2f} plain steps")
        parts.append(s)
    n = sum(len(res["sweeps"][h]) for h in hs)
    bad = sum(1 for h in hs for p in res["sweeps"][h] if not p["identical"])
    text = "; ".join(parts) + "."
    cm, ct = res.get("checkpoint_memory_ratio"), res.get("checkpoint_time_ratio")
    if cm is not None and ct is not None:
        d = interp_time(res["sweeps"][hs[0]], cm)
        text += (f" torch.utils.checkpoint reaches {cm:.2f} of the peak at {x(ct)}; {hs[0]} at that memory costs "
                 + (f"{x(d)} (interpolated)." if d is not None else "— (below its smallest working budget)."))
    text += (f" All {n} dtr runs gave losses and final parameters bit-identical to the plain run." if bad == 0 else
             f" **{bad} of {n} dtr runs were NOT bit-identical to the plain run.**")
    return text


def sim_section(results, a):
    L = ["## Simulator: the traces replayed in dtr-sim\n",
         f"Each model's trace (DTR_TRACE_FILE, preloaded with no budget: building the model, then "
         f"{a.trace_warmup + a.trace_steps} training steps, each marked) replayed by "
         "`dtr-sim --trace F --ratio r --heuristic h --seed 1`, for every heuristic. "
         "Ratios are of the trace's own peak (exact tensor bytes, no allocator rounding). Cells are the "
         f"simulated slowdown of the last {a.trace_steps} steps, 1 + (rematerialization cost) / (base cost) between "
         f"the trace's marks; the first {a.trace_warmup} are simulated but not measured, as in the real runs (Note "
         "[Steady-state steps]: the first step runs before the gradients and the optimizer state exist, and cold); "
         "`oom`: infeasible. The trace carries the op times measured in that run, so near "
         "the smallest working budget the simulated outcome can change from one invocation to the next. "
         f"The traces and chain files are in `{os.path.relpath(a.work, REPO)}/`.\n"]
    for res in results:
        sim = res.get("sim")
        if not sim:
            continue
        hs = list(sim["runs"])
        L.append(f"### {res['name']} (trace peak {mib(sim['peak_bytes'])})\n")
        L.append("| ratio | " + " | ".join(hs) + " |")
        L.append("|---|" + "---|" * len(hs))
        for i, r in enumerate(a.sim_ratios):
            cells = []
            for h in hs:
                d = sim["runs"][h][i]
                cells.append(x(1 + d["overhead"]) if d["status"] == "ok" and d["overhead"] is not None else d["status"])
            L.append(f"| {r:g} | " + " | ".join(cells) + " |")
        L.append("\n" + caption_sim(sim, hs) + "\n")
        act = [f"r = {d['activation_r']:g} ({d['ratio']:.3f} of the trace peak) "
               + (x(1 + d["overhead"]) if trained(d) else activation_run_status(d, sim))
               for d in sim.get("activation_runs", [])]
        if act:
            L.append(f"Budgets on activations (static + r × (trace peak − static), static {mib(sim['info']['static_bytes'])}), "
                     f"{DEFAULT_HEURISTIC}: " + ", ".join(act) + ".\n")
    return "\n".join(L)


def min_ok_ratio(rows):
    ok = [d["ratio"] for d in rows if d["status"] == "ok"]
    return min(ok) if ok else None


def caption_sim(sim, hs):
    mins = {h: min_ok_ratio(sim["runs"][h]) for h in hs}
    best = min((m for m in mins.values() if m is not None), default=None)
    if best is None:
        return "No heuristic fits any simulated budget."
    winners = [h for h, m in mins.items() if m == best]
    row = lambda h: next(d for d in sim["runs"][h] if d["ratio"] == best)  # noqa: E731
    cheapest = min(winners, key=lambda h: row(h)["overhead"])
    s = (f"Smallest simulated budget that works: {best:g} of the trace peak ({', '.join(winners)}); there "
         f"{cheapest} is cheapest at {x(1 + row(cheapest)['overhead'])}.")
    if sim.get("floor_bytes") is not None and sim.get("peak_bytes"):
        s += (f" The lower bound (Note [Memory floor]) is {sim['floor_bytes'] / sim['peak_bytes']:.2f} of the trace "
              f"peak ({mib(sim['floor_bytes'])}).")
    others = [f"{h} {mins[h]:g}" if mins[h] is not None else f"{h} none" for h in hs if h not in winners]
    if others:
        s += " Smallest working ratio of the others: " + ", ".join(others) + "."
    return s


def ratio_cell(dtr, best):
    if dtr is None:
        return "dtr oom"
    if best is None:
        return "n.a. (no baseline fits)"
    if best <= 1e-12:
        return "—" if dtr <= 1e-12 else "∞ (baseline: no overhead)"
    return f"{dtr / best:.2f}"


PLANNER_ORDER = ["rotor", "sqrt", "best-sequential"]


def chain_section(results, a):
    L = ["## Simulator vs optimal plans on the chain-shaped models\n",
         "dtr's simulated overhead (as above: extra cost ÷ base cost of the measured training steps) against planners that "
         "know the whole chain in advance, from `dtr-chain --planner all --slots "
         f"{a.rotor_slots}` on a Rotor-style profile of the model's stages (one chain per measured step, costs and "
         "base costs summed over the steps): `rotor` is Rotor's optimal persistent dynamic program, `sqrt` "
         "checkpoint_sequential with ceil(√L) segments (Chen et al.), `best-sequential` the cheapest segment "
         "count that fits. The profile: forward/backward time per stage (plain process, minimum of the timed "
         "runs), exact bytes of each stage's output and of what its forward keeps for backward (saved-tensor "
         "hooks), transient bytes from dtr's allocator peaks.\n",
         "**Budget alignment (approximate).** The chain budget covers activations only. *Raw*: the "
         "simulator's budget less the bytes that are not the chain's activations (parameters, gradients, "
         "optimizer state, the batches; the chain's input counted once). The chain model's own peak without "
         "recomputation differs from the trace's activations at its peak (the profile counts every saved tensor "
         "and transient at stage granularity, the trace sees each operator's frees), so under the raw alignment "
         "the plans may have to recompute even at ratio 1. *Calibrated* (the main columns): the same number of "
         "bytes is taken away from each side's own peak (the simulator's trace peak, the largest of the traced steps' chain peaks without "
         "recomputation), so both need no recomputation at ratio 1. The plans work at stage granularity, dtr at "
         "operator granularity, so dtr can beat the \"optimal\" plan; the two sides' costs come from different "
         "measurements (the trace's op times under dtr, the plain profile's stage times) and are compared as "
         f"relative overheads only. Overheads in %; \"÷ best\": {DEFAULT_HEURISTIC}'s overhead divided by the best "
         "calibrated baseline's (— when both are zero). Rows where nothing fits are left out.\n"]
    any_rows = False
    for res in results:
        ch = res.get("chain")
        if not ch:
            continue
        any_rows = True
        L.append(f"### {res['name']}: {res['chain_note']}\n")
        if not ch.get("available") or "rows" not in ch or not ch.get("planners"):
            L.append(f"No baselines: {ch.get('error', 'dtr-chain gave no results')}. Chain files: "
                     + ", ".join(f"`{f}`" for f in ch["files"]) + "\n")
            continue
        act = ch["sim_activation_peak_bytes"]
        L.append(f"Bytes outside the chain's activations: {mib(ch['nonchain_bytes'])}; the trace's activations at "
                 f"its peak: {mib(act)}; the chain model's peak without recomputation: "
                 + ", ".join(f"{mib(pk)} ({pk / act - 1:+.0%})" for pk in ch["chain_peak_bytes"])
                 + " (per measured step).\n")
        hs = [h for h in dict.fromkeys((DEFAULT_HEURISTIC, "dtr", "dtr-eq", "lru")) if h in res["sim"]["runs"]]
        ps = [p for p in PLANNER_ORDER if p in ch["planners"]] + [p for p in ch["planners"] if p not in PLANNER_ORDER]
        L.append("| ratio | sim budget | bytes removed | " + " | ".join(hs) + " | " + " | ".join(ps) +
                 f" | {DEFAULT_HEURISTIC} ÷ best | rotor, raw alignment |")
        L.append("|---|---|---|" + "---|" * (len(hs) + len(ps) + 2))
        cap, dtr_only, base_only = [], [], []
        for i, row in enumerate(ch["rows"]):
            sims = {h: res["sim"]["runs"][h][i] for h in hs}
            cells = [pct(sims[h]["overhead"]) if sims[h]["status"] == "ok" else sims[h]["status"] for h in hs]
            feas = [row["planners"][p]["overhead"] for p in ps if row["planners"][p]["status"] == "ok"]
            if not feas and all(sims[h]["status"] != "ok" for h in hs):
                continue
            pcells = [pct(row["planners"][p]["overhead"]) if row["planners"][p]["status"] == "ok" else "infeasible"
                      for p in ps]
            best = min(feas) if feas else None
            eq = sims.get(DEFAULT_HEURISTIC)
            dtr_ov = eq["overhead"] if eq and eq["status"] == "ok" else None
            if dtr_ov is not None and best is not None and best > 1e-12:
                cap.append((row["ratio"], dtr_ov / best))
            if dtr_ov is not None and best is None:
                dtr_only.append(row["ratio"])
            if dtr_ov is None and best is not None:
                base_only.append(row["ratio"])
            raw = row["raw_planners"].get("rotor", {})
            L.append(f"| {row['ratio']:g} | {mib(row['sim_budget_bytes'])} | {mib(row['removed_bytes'])} | "
                     + " | ".join(cells) + " | " + " | ".join(pcells) + f" | {ratio_cell(dtr_ov, best)} | "
                     + (pct(raw["overhead"]) if raw.get("status") == "ok" else "infeasible") + " |")
        L.append("")
        text = []
        if cap:
            lo, hi = min(cap, key=lambda c: c[1]), max(cap, key=lambda c: c[1])
            text.append(f"Where both fit, {DEFAULT_HEURISTIC}'s simulated overhead is {lo[1]:.2f}× (at ratio {lo[0]:g}) to "
                        f"{hi[1]:.2f}× (at {hi[0]:g}) the best planner's")
        if dtr_only:
            text.append(f"{DEFAULT_HEURISTIC} fits where no planner does at ratio {', '.join(f'{r:g}' for r in dtr_only)}")
        if base_only:
            text.append(f"a planner fits where {DEFAULT_HEURISTIC} does not at ratio {', '.join(f'{r:g}' for r in base_only)}")
        L.append(("; ".join(text) + ".\n") if text else f"No budget where {DEFAULT_HEURISTIC} and a planner both have overhead.\n")
        act = activation_comparison(res, ch)
        if act:
            L.append(act + "\n")
        own = rotor_steps_text(ch, res["sim"]["peak_bytes"])
        if own:
            L.append(own + "\n")
    others = [r["name"] for r in results if r.get("sim") and not r.get("chain")]
    if others:
        L.append(f"No planner applies to {', '.join(others)}: not a chain of stages (skip connections across "
                 "levels, a different tree every step).\n")
    if not any_rows:
        L.append("No chain-shaped model in this run.\n")
    return "\n".join(L)


def rotor_steps_text(ch, trace_peak):
    """Rotor's own steps near its floor as a sentence (Note [The optimal schedule's own steps]), or None."""
    curve = ch.get("rotor_curve") or {}
    step = rotor_largest_step(curve, trace_peak)
    if step is None:
        return f"Rotor's steps near its floor: {curve['error']}." if curve.get("error") else None
    hi, lo, r = step
    (b0, t0), above = curve["points"][0], [p for p in curve["points"] if p[0] >= curve["points"][0][0] + FINE_STEP * trace_peak - 1]
    near = f", {above[0][1]:.2f}× at {FINE_STEP:g} of the trace peak above it" if above else ""
    return (f"The optimal schedule's own steps (Note [The optimal schedule's own steps]): on budgets "
            f"{ROTOR_GRID:g} of the trace peak apart, Rotor's plan costs {t0:.2f}× the base at the smallest that "
            f"fits ({mib(b0)} of activations){near}; its largest step of {FINE_STEP:g} within {ROTOR_RANGE:g} of "
            f"the trace peak above its floor is {r:.2f} times ({mib(hi)} → {mib(lo)}).")


def activation_run_status(d, sim):
    """A budget-on-activations run that did not train, in words (the floor named when it is why)."""
    if d["status"] == "oom" and sim.get("floor_bytes") and d["budget_bytes"] < sim["floor_bytes"]:
        return "out of memory (the budget is below the trace's floor, Note [Memory floor])"
    return "out of memory" if d["status"] == "oom" else d["status"]


def step_ratio(dtr_overhead, planner_overhead):
    """dtr's simulated step time over a planner's, each as 1 + overhead on its own base cost."""
    return (1 + dtr_overhead) / (1 + planner_overhead)


def activation_comparison(res, ch):
    """Issue 16 item 3's chain point as a sentence: dtr's simulated step against Rotor's at the budgets
    on activations (static + r x activations), or None without those rows."""
    sims = {d["activation_r"]: d for d in res["sim"].get("activation_runs", [])}
    parts = []
    compared = False  # a Rotor plan fitted beside a dtr run that trained
    for row in ch.get("activation_rows", []):
        r = row["activation_r"]
        d = sims.get(r)
        rotor, raw = row["planners"].get("rotor", {}), row["raw_planners"].get("rotor", {})
        where = f"r = {r:g} ({row['ratio']:.3f} of the trace peak)"
        if not d or not trained(d):
            parts.append(f"at {where} {DEFAULT_HEURISTIC}: " + (activation_run_status(d, res["sim"]) if d else "no run"))
            continue
        raw_text = (f"raw alignment {step_ratio(d['overhead'], raw['overhead']):.2f}×" if raw.get("status") == "ok"
                    else "raw alignment: Rotor infeasible")
        if rotor.get("status") != "ok":
            parts.append(f"at {where} {DEFAULT_HEURISTIC} costs {pct(d['overhead'])} and Rotor's plan does not fit ({raw_text})")
        else:
            compared = True
            parts.append(f"at {where} {DEFAULT_HEURISTIC}'s simulated step time is "
                         f"{step_ratio(d['overhead'], rotor['overhead']):.2f}× Rotor's "
                         f"({pct(d['overhead'])} against {pct(rotor['overhead'])} overhead; {raw_text})")
    if not parts:
        return None
    static = res["sim"]["info"]["static_bytes"]
    return (f"Budgets on activations (issue 16 item 3: static + r × (trace peak − static), static "
            f"{mib(static)}: parameters, gradients, optimizer state, batches): " + "; ".join(parts) + "."
            + (" Rotor's plans keep all of that resident; dtr may also evict the gradients that "
               "zero_grad(set_to_none=False) zeroed, until the backward pass accumulates into them (a fill "
               "brings them back: Note [Results awaiting their reader]), so its simulated step can cost less "
               "than Rotor's plan." if compared else ""))


def fine_steps(points):
    """[(ratio above, ratio below, time below / time above)] for the measured budgets FINE_STEP apart:
    the total time of the same measured steps (Note [Paired steps]), or the ratio of the median
    steps' time ratios for points measured before the steps were kept."""
    by = sorted(points, key=lambda p: -p["ratio"])
    return [(a["ratio"], b["ratio"], step_between(a, b)) for a, b in zip(by, by[1:])
            if abs(a["ratio"] - b["ratio"] - FINE_STEP) < 1e-6]


def largest_step(points, checks=()):
    """(ratio above, ratio below, time below / time above, its check or None) of the largest step
    of FINE_STEP, a step with a successful check counting by it (Note [Alternated step checks]);
    (None, None, None, None) when no two budgets FINE_STEP apart were measured."""
    by_pair = {(c["above"], c["below"]): c for c in checks if "ratio" in c}
    steps = [(hi, lo, by_pair[(hi, lo)]["ratio"], by_pair[(hi, lo)]) if (hi, lo) in by_pair else (hi, lo, r, None)
             for hi, lo, r in fine_steps(points)]
    return max(steps, key=lambda s: s[2]) if steps else (None, None, None, None)


def step_cell(points, checks=(), edge_probe=None):
    """The largest step of FINE_STEP, how it was measured, whether every one down to the smallest
    working budget ran, and what the budget halfway below the smallest working one did."""
    steps = fine_steps(points)
    if not steps:
        return "—"
    below = ""
    if edge_probe:
        low_point = min(points, key=lambda p: p["ratio"])
        if edge_probe.get("status") == "ok":
            below = (f"; halfway below, {edge_probe['ratio']:g}: {edge_probe['time_ratio']:.2f}×, "
                     f"{step_between(low_point, edge_probe):.2f} times {low_point['ratio']:g}'s")
        else:
            status = {"oom": "out of memory", "too-slow": "too slow"}.get(edge_probe["status"], edge_probe["status"])
            below = f"; halfway below, {edge_probe['ratio']:g}: {status}"
    hi, lo, r, check = largest_step(points, checks)
    how = ""
    ok = [c for c in checks if "ratio" in c]
    if check is not None:
        n = len(check["above_seconds"])
        how = f"; {check['sweep_ratio']:.2f} in the sweep, {r:.2f} alternated {n} times"
    elif ok:
        # Every step the sweep measured larger came out smaller alternated; this one was not checked.
        checked = sorted(c["ratio"] for c in ok)
        how = (f"; the sweep's, its larger step {checked[0]:.2f} alternated" if len(checked) == 1 else
               f"; the sweep's, its {len(checked)} larger steps {checked[0]:.2f}-{checked[-1]:.2f} alternated")
    failed = [c for c in checks if "failure" in c]
    if failed:
        f = failed[0]
        how += f"; the check of {f['above']:g} → {f['below']:g} failed at {f['failure']['ratio']:g} ({f['failure']['status']})"
    top = max(p["ratio"] for p in points)
    low = min(p["ratio"] for p in points)
    total = int(round((top - low) / FINE_STEP))
    return (f"{r:.2f} times ({hi:g} → {lo:g}{how})" + ("" if len(steps) == total else f"; {len(steps)} of {total} measured")
            + below)


def floor_ratio(res):
    """The trace's lower bound as a fraction of its peak (dtr-sim, Note [Memory floor]), or None."""
    sim = res.get("sim") or {}
    floor, peak = sim.get("floor_bytes"), sim.get("peak_bytes")
    return floor / peak if floor is not None and peak else None


def summary_section(results, a):
    h0 = a.heuristics[0]
    L = ["## Summary\n",
         f"| model | plain step | dtr, no budget | dtr, 1 TiB budget | {h0} at 1.0 | smallest working ratio (" + ", ".join(a.heuristics) +
         f") | lower bound | {h0} at 0.5 | {h0} at its smallest | {h0}'s largest step of {FINE_STEP:g} | checkpoint: memory, "
         f"time | {h0} at checkpoint's memory |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        sw = res.get("sweeps", {})
        mins = []
        for h in a.heuristics:
            pts = sw.get(h) or []
            mins.append(f"{min(p['ratio'] for p in pts):g}" if pts else "—")
        eq = sw.get(h0) or []
        one, half = at_ratio(eq, 1.0), at_ratio(eq, 0.5)
        low = min(eq, key=lambda p: p["ratio"]) if eq else None
        cm, ct = res.get("checkpoint_memory_ratio"), res.get("checkpoint_time_ratio")
        ckcell = f"{cm:.2f}, {x(ct)}" if cm is not None and ct is not None else "n/a"
        dck = interp_time(eq, cm) if eq and cm is not None else None
        u, nb1 = res.get("unlimited"), res.get("non_binding")
        fr = floor_ratio(res)
        L.append(f"| {res['name']} | {secs(res['plain_step_seconds'])} | {x(u['time_ratio']) if u else '—'} | "
                 f"{x(nb1['time_ratio']) if nb1 else '—'} | {x(one['time_ratio']) if one else '—'} | {' / '.join(mins)} | {f'{fr:.2f}' if fr is not None else '—'} | "
                 f"{x(half['time_ratio']) if half else '—'} | "
                 f"{(x(low['time_ratio']) + ' at ' + format(low['ratio'], 'g')) if low else '—'} | {step_cell(eq, res.get('step_checks') or (), res.get('edge_probe'))} | "
                 f"{ckcell} | "
                 f"{x(dck) if dck is not None else '—'} |")
    L.append("")
    text = ["Time ratios are dtr's median step time over the plain step time of the same invocation; ratios of "
            "memory are of the preloaded run's peak allocated bytes with no budget. The lower bound is the "
            "trace's memory floor in dtr-sim (Note [Memory floor]: the unevictable bytes plus the largest "
            "operands of any one op, which no schedule can go below) over the trace's peak; the trace counts "
            "exact tensor bytes, the real runs allocated blocks, so compare the two columns as fractions.",
            f"The largest step of {FINE_STEP:g} is the largest ratio of the training times of two budgets {FINE_STEP:g} "
            "of the peak apart: the total time of the same measured steps, which every budget trains on the same "
            "batches (Note [Paired steps], bench/sweep.py). The sweep measures each budget once, so the largest steps are measured again, "
            "their two budgets alternated in fresh processes, and a step so checked counts by its check (Note "
            "[Alternated step checks], bench/sweep.py). Below the smallest working budget the sweep also runs the "
            f"budget halfway to the one that failed: a model that trains there only by thrashing has a cliff "
            f"the steps of {FINE_STEP:g} step over."]
    own = [(r["name"], rotor_largest_step(r["chain"].get("rotor_curve"), r["sim"]["peak_bytes"]))
           for r in results if r.get("chain") and r.get("sim", {}).get("peak_bytes")]
    own = [(name, step[2]) for name, step in own if step]
    if own:
        text.append(f"The optimal schedule has steps of its own near its floor, where each activation fewer "
                    f"multiplies how often the stages are recomputed: Rotor's largest step of {FINE_STEP:g} of the "
                    "trace peak above its own floor (which lies above dtr's: it keeps the static memory resident "
                    "and plans whole stages), on the chain-shaped models' profiles, is "
                    + ", ".join(f"{r:.2f} ({name})" for name, r in own)
                    + " (Note [The optimal schedule's own steps], bench/sweep.py; the section on optimal plans).")
    eqs = [(r["name"], min(p["ratio"] for p in r["sweeps"][h0])) for r in results if r.get("sweeps", {}).get(h0)]
    if eqs:
        lo, hi = min(eqs, key=lambda e: e[1]), max(eqs, key=lambda e: e[1])
        text.append(f"{h0}'s smallest working budget ranges from {lo[1]:g} of the peak ({lo[0]}) to {hi[1]:g} "
                    f"({hi[0]})." if lo[1] != hi[1] else f"{h0}'s smallest working budget is {lo[1]:g} of the peak "
                                                         "for every model.")
    drift = [(abs(step_time(r["plain_runs"][0][0], a) - step_time(r["plain_runs"][-1][0], a))
              / min(step_time(r["plain_runs"][0][0], a), step_time(r["plain_runs"][-1][0], a)), r["name"])
             for r in results if len(r.get("plain_runs", [])) > 1]
    if drift:
        d, name = max(drift)
        text.append(f"The plain step measured before and after the dtr runs differs by up to {d:.0%} ({name}): "
                    "read differences of that size as noise.")
    unl = [r["unlimited"]["time_ratio"] for r in results if r.get("unlimited")]
    nb = [r["non_binding"]["time_ratio"] for r in results if r.get("non_binding")]
    both = [(r["non_binding"]["time_ratio"] / r["unlimited"]["time_ratio"]) for r in results
            if r.get("unlimited") and r.get("non_binding")]
    if unl and nb and both:
        mean = sum(both) / len(both) - 1
        text.append(f"Preloaded with no budget, steps cost {min(unl):.2f}–{max(unl):.2f}× the plain ones; under a "
                    f"budget that never binds (1 TiB) {min(nb):.2f}–{max(nb):.2f}×, on average {mean:+.0%} over no "
                    "budget. dtr's CPU allocator reuses a cached block only for a request of its own size, with a "
                    "budget or without (Note [Exact reuse], allocator/caching_allocator.cc); a miss resizes a "
                    "cached segment of a nearby size while such resizes are not undone (Note [Resizing a nearby "
                    "cached segment]), and under a budget a request that does not fit resizes a cached segment "
                    "for itself or releases some (Note [Recycling a cached segment]), a cost every budgeted ratio "
                    "includes.")
    L.append(" ".join(text) + "\n")
    return "\n".join(L)


def write_markdown(path, results, a, info, wall, command):
    dev = a.device
    via = info.get("invoked_by") or os.environ.get("BENCH_INVOKED_BY")
    L = [f"# dtr budget sweep: {dev}\n",
         (f"Made by `{via}`, which ran `{command}`" if via else f"Made by `{command}`")
         + f" (sweep wall time {wall / 60:.1f} min, {info['processes']} worker processes).\n",
         f"- date: {info['date']}" + (f" (this text rewritten from the JSON by `--rerender` on {info['rerendered']})"
                                      if info.get("rerendered") else ""),
         f"- machine: {info['cpu']}, {info['cores']} cores"
         + (f", {info['memory_bytes'] / 2**30:.0f} GiB" if info["memory_bytes"] else "")
         + f"; load average at start {', '.join(f'{v:.2f}' for v in info['load_average_start'])}, at end "
         + f"{', '.join(f'{v:.2f}' for v in info['load_average_end'])} (the machine is shared)"
         + (f"; GPU: {info['gpu']}" if info.get("gpu") else ""),
         f"- torch {info['torch']}, Python {info['python']}, Linux {info['kernel']}; {a.threads} intra-op thread(s)"
         + (f"; dtr built {info['dtr_build']}" if info.get("dtr_build") else ""),
         f"- git commit {info['commit']}" + (" (with uncommitted changes)" if info["dirty"] else ""),
         f"- dtr build: `{os.path.relpath(a.build, REPO)}`; {a.warmup} warm-up + {a.steps} measured steps per "
         f"budget; heuristics {', '.join(a.heuristics)}; step-time cap {a.max_slowdown:g}× the plain step",
         ""]
    if dev == "cuda":
        L.append("**CUDA:** this report ran with `--device cuda`. dtr's CUDA path is not built yet; the dtr rows "
                 "are present only if the preloaded library managed CUDA memory (the worker checks and refuses "
                 "otherwise).\n")
    else:
        L.append("The `--device cuda` path of this harness (synchronized timing, device placement, "
                 "torch.cuda peaks) has not been run: no GPU was available when it was written.\n")
    L.append("Method: for each model, a plain process (no preload) times the training step (median of the "
             "measured steps) and torch.utils.checkpoint; a preloaded process with no budget measures the peak "
             "allocated bytes (the base of the ratios; dtr records nothing there, Note [Recording starts with a "
             "budget], so it is a plain run's peak through dtr's allocator) and the checkpointed run's peak; then "
             "one preloaded process per heuristic, started under a budget that never binds (so that dtr records "
             "from the start, as under `DTR_BUDGET`, and the batches made up front are evictable), sets each "
             "budget with `torch.ops.dtr.set_budget`, rebuilds the model from "
             "its seed, warms up and times the measured steps, going down until a budget is out of memory (or "
             f"a step exceeds the cap): {a.heuristics[0]} at every {FINE_STEP:g} of the peak from 1.0"
             + ("" if getattr(a, "fine_ratios", None) else " (not in this run: its ratios were given)")
             + f", the others at the coarser ratios, where a fresh process refines in steps of {FINE_STEP:g} "
             "below the last budget that worked. The plain process runs again at the end; time ratios divide by the faster of "
             "the two plain medians. "
             + ("Times are the process's CPU time (user + sys; the steps run on one thread and synchronously), "
                "because the machine is shared: another job's load inflates wall time several-fold but CPU time "
                "by a few percent. Wall-time ratios and the load average are in the detailed tables. "
                if a.timer == "cpu" else "Times are wall-clock time between device synchronizations. ")
             + "Every dtr run's losses and final parameters are compared bit for bit with the plain run's. "
             "Per-step counters are differences of `torch.ops.dtr.stats()` over the measured steps (dtr's own "
             "seconds counters are wall time).\n")
    L.append(summary_section(results, a))
    for res in results:
        L.append(model_section(res, a, dev))
    if not a.no_sim:
        L.append(sim_section(results, a))
        L.append(chain_section(results, a))
    with open(path, "w") as f:
        f.write("\n".join(L).rstrip("\n") + "\n")


def log_scale_if_wide(ax):
    """A logarithmic y axis when slowdowns span more than 10x, so that 1.1x and 100x both read."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    if ys and max(ys) > 10 * max(min(ys), 1e-9):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def plot(path, res, a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = res.get("sim")
    fig, axes = plt.subplots(1, 2 if sim else 1, figsize=(12 if sim else 6.5, 4.5), squeeze=False)
    ax = axes[0][0]
    marked = False
    for h in a.heuristics:
        pts = sorted(res.get("sweeps", {}).get(h) or [], key=lambda p: p["ratio"])
        if pts:
            line, = ax.plot([p["ratio"] for p in pts], [p["time_ratio"] for p in pts], marker="o", ms=3,
                            label=f"dtr ({h})")
            # The budget just below the smallest that worked: out of memory or over the step-time cap.
            below = [f["ratio"] for f in res.get("failures", {}).get(h, []) if f.get("ratio", 1) < pts[0]["ratio"]]
            if below:
                ax.plot([max(below)], [pts[0]["time_ratio"]], marker="x", ms=8, mew=2, ls="none",
                        color=line.get_color())
                marked = True
    if marked:
        ax.plot([], [], marker="x", ms=8, mew=2, ls="none", color="gray", label="first failing budget (oom / cap)")
    cm, ct = res.get("checkpoint_memory_ratio"), res.get("checkpoint_time_ratio")
    if cm is not None and ct is not None:
        ax.plot([cm], [ct], marker="*", ms=14, ls="none", color="black", label="torch.utils.checkpoint")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    log_scale_if_wide(ax)
    ax.set_xlabel("budget / peak allocated with no budget")
    ax.set_ylabel("step time / plain step time")
    ax.set_title(f"{res['name']}: real runs ({a.device})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if sim:
        ax = axes[0][1]
        for h, rows in sim["runs"].items():
            ok = sorted((d["ratio"], 1 + d["overhead"]) for d in rows if d["status"] == "ok" and d["overhead"] is not None)
            if ok:
                main = h == DEFAULT_HEURISTIC
                ax.plot(*zip(*ok), marker=".", label=h, lw=2.4 if main else 1.2, zorder=3 if main else 2)
        ch = res.get("chain")
        if ch and ch.get("rows"):
            for p, style in (("rotor", "k--"), ("sqrt", "k:")):
                ok = sorted((row["ratio"], 1 + row["planners"][p]["overhead"]) for row in ch["rows"]
                            if p in row["planners"] and row["planners"][p]["status"] == "ok")
                if ok:
                    ax.plot(*zip(*ok), style, lw=1.5, label={"rotor": "optimal DP (Rotor)", "sqrt": "sqrt(N) (Chen)"}[p])
        log_scale_if_wide(ax)
        ax.set_xlabel("budget / trace peak")
        ax.set_ylabel("simulated compute / base compute")
        ax.set_title(f"{res['name']}: dtr-sim on its trace")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
DEFAULT_HEURISTIC = "dtr"  # dtr's own default (runtime/heuristic.cc, Note [Default heuristic])


def parse_args(argv):
    ap = argparse.ArgumentParser(description="dtr budget sweep: real runs, torch.utils.checkpoint, dtr-sim, "
                                             "optimal chain baselines; writes <out>/<device>.md/.json/_<model>.png")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(ALL_MODELS)} (default: all)")
    ap.add_argument("--heuristics", default=f"{DEFAULT_HEURISTIC},dtr-eq,lru", help="heuristics of the real runs (default: %(default)s)")
    ap.add_argument("--sim-heuristics", default=None, help="heuristics replayed in dtr-sim (default: all it lists)")
    ap.add_argument("--ratios", default=None, help="budget ratios of the real runs, downward (default 1.0 .. 0.1)")
    ap.add_argument("--sim-ratios", default=None, help="budget ratios in dtr-sim (default 1.0 .. 0.1, 0.05)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per budget (default 2; --quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per budget (default 5; --quick 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process (default 1)")
    # A guard against a hang, not a verdict: a budget too small to train at a useful speed is dtr's
    # to refuse (Note [Recomputation limit], DTR_MAX_RECOMPUTE: about 11x the program's time over
    # the recent ops), and below 20x the cap cut thrashing runs before dtr's error showed (the
    # chain's probe below its smallest budget, stop 69).
    ap.add_argument("--max-slowdown", type=float, default=100.0,
                    help="stop a sweep when a step takes longer than this many plain steps (default %(default)s)")
    ap.add_argument("--timer", default="cpu", choices=["cpu", "wall"],
                    help="clock of the time ratios: the process's CPU time (default; robust when other work shares "
                         "the machine, the steps being single-threaded and synchronous) or wall time; always wall "
                         "with --device cuda")
    ap.add_argument("--trace-steps", type=int, default=2, help="measured training steps in each trace (default 2)")
    ap.add_argument("--trace-warmup", type=int, default=2,
                    help="training steps traced before them, simulated but not measured (default 2)")
    ap.add_argument("--rotor-slots", type=int, default=2000,
                    help="memory slots of Rotor's DP in dtr-chain (default %(default)s; 0 = exact bytes)")
    ap.add_argument("--profile-repeats", type=int, default=None, help="timed runs per chain stage (default 5)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: chain and transformer, ratios 1.0/0.7/0.5, dtr, short sims (under a minute)")
    ap.add_argument("--no-sim", action="store_true", help="skip dtr-sim and the chain baselines")
    ap.add_argument("--no-refine", action="store_true", help="no finer ratios below the last that worked")
    ap.add_argument("--step-checks", type=int, default=STEP_CHECK_ROUNDS,
                    help="rounds in which the largest steps of the fine sweep are measured again, their two budgets "
                         "alternated in fresh processes (default %(default)s; 0: none)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"), help="where the report goes "
                                                                                 "(default: bench/results)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="CMake build dir with bin/dtr-sim and "
                                                                          "bin/dtr-chain (default: %(default)s); dtr "
                                                                          "itself is the installed package")
    ap.add_argument("--work", default=None, help="traces and chain files (default: <build>/bench-work)")
    ap.add_argument("--rerender", metavar="JSON", help="only rewrite the markdown and plots from a <device>.json "
                                                       "this script wrote (next to it)")
    a = ap.parse_args(argv)
    if a.rerender:
        return a

    def floats(s, what):
        try:
            v = [float(t) for t in s.split(",") if t.strip()]
        except ValueError:
            ap.error(f"{what}: expected comma-separated numbers, got {s!r}")
        if not v or any(not 0 < r <= 1.5 for r in v):
            ap.error(f"{what}: ratios must be in (0, 1.5], got {s!r}")
        return sorted(v, reverse=True)

    if a.device == "cuda":
        a.timer = "wall"
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    a.models = a.models.split(",") if a.models else (QUICK_MODELS if a.quick else ALL_MODELS)
    for m in a.models:
        if m not in bench_models.MODELS:
            ap.error(f"--models: unknown model {m!r}; known: {', '.join(ALL_MODELS)}")
    if a.quick and a.heuristics == f"{DEFAULT_HEURISTIC},dtr-eq,lru":
        a.heuristics = DEFAULT_HEURISTIC
    a.heuristics = [h for h in a.heuristics.split(",") if h]
    # The first heuristic takes every FINE_STEP (FINE_RATIOS) unless the ratios are given or quick.
    a.fine_ratios = None if a.ratios or a.quick or a.no_refine else FINE_RATIOS
    a.ratios = floats(a.ratios, "--ratios") if a.ratios else (QUICK_RATIOS if a.quick else DEFAULT_RATIOS)
    a.sim_ratios = floats(a.sim_ratios, "--sim-ratios") if a.sim_ratios else (QUICK_SIM_RATIOS if a.quick else SIM_RATIOS)
    if 1.0 not in a.sim_ratios:
        a.sim_ratios.insert(0, 1.0)  # the simulated peak comes from ratio 1.0
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    a.steps = a.steps if a.steps is not None else (2 if a.quick else 5)
    a.profile_repeats = a.profile_repeats or (2 if a.quick else 5)
    if a.quick:
        a.no_refine = True
    if a.steps < 1 or a.warmup < 0 or a.trace_steps < 1 or a.trace_warmup < 0 or a.step_checks < 0:
        ap.error("--steps and --trace-steps must be >= 1, --warmup, --trace-warmup and --step-checks >= 0")
    lib = preload_library()
    if not os.path.exists(lib):
        ap.error(f"{lib} not found: reinstall dtr (scripts/setup.sh)")
    sim = os.path.join(a.build, "bin", "dtr-sim")
    if not a.no_sim and not os.path.exists(sim):
        ap.error(f"{sim} not found (ninja -C {a.build} dtr-sim), or pass --no-sim")
    known = subprocess.run([sim, "--list-heuristics"], capture_output=True, text=True).stdout.split("\n") \
        if os.path.exists(sim) else []
    known = [line.split()[0] for line in known if line.strip()]
    if a.sim_heuristics:
        a.sim_heuristics = a.sim_heuristics.split(",")
    else:
        a.sim_heuristics = ([DEFAULT_HEURISTIC, "lru"] if a.quick else known) or [DEFAULT_HEURISTIC]
    for h in a.heuristics + a.sim_heuristics:
        if known and h not in known:
            ap.error(f"unknown heuristic {h!r}; dtr-sim knows {', '.join(known)}")
    if DEFAULT_HEURISTIC in a.sim_heuristics:
        a.sim_heuristics.remove(DEFAULT_HEURISTIC)
    a.sim_heuristics.insert(0, DEFAULT_HEURISTIC)  # sim_heuristics[0] gives the simulated peak and refined ratios
    a.work = os.path.abspath(a.work or os.path.join(a.build, "bench-work"))
    return a


def rerender(path):
    with open(path) as f:
        data = json.load(f)
    a = argparse.Namespace(**data["settings"])
    data["machine"]["rerendered"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    out = os.path.dirname(os.path.abspath(path))
    for res in data["models"]:
        points, extra = timed_blocks(res)
        for b in points + extra:
            if "measured_steps" not in b:  # a JSON from before Note [Paired steps]
                try:
                    b["measured_steps"] = step_seconds(b, a)
                except KeyError:
                    pass  # older still: no step times kept, step_between falls back to the medians
        plot(os.path.join(out, f"{a.device}_{res['name']}.png"), res, a)
    write_markdown(os.path.join(out, f"{a.device}.md"), data["models"], a, data["machine"],
                   data["machine"]["wall_seconds"], data["command"])
    log(f"rewrote {os.path.join(out, a.device + '.md')} and its plots from {path}")
    return 0


def write_json(path, command, info, a, results, wall, runner):
    info["load_average_end"] = os.getloadavg()
    info["processes"] = runner.processes
    info["wall_seconds"] = wall
    with open(path, "w") as f:
        json.dump({"command": command, "machine": info, "settings": dict(vars(a)), "models": results}, f, indent=1,
                  default=str)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.rerender:
        return rerender(a.rerender)
    command = " ".join([os.path.relpath(sys.executable, os.getcwd()) if sys.executable.startswith(REPO) else sys.executable,
                        os.path.relpath(os.path.abspath(__file__), os.getcwd())] + [shlex.quote(t) for t in argv])
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    t0 = time.time()
    info = machine_info(a.device)
    if not info["torch"]:
        sys.exit(f"sweep: {sys.executable} cannot import torch; run the sweep with the venv scripts/setup.sh "
                 "made (.venv/bin/python)")
    if a.device == "cuda" and not info["gpu"]:
        sys.exit(f"sweep: --device cuda, but torch in {sys.executable} sees no CUDA device")
    info["date"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    info["invoked_by"] = os.environ.get("BENCH_INVOKED_BY")
    runner = Runner(a)
    results = []
    for name in a.models:
        bm = bench_models.get(name)
        res = real_runs(runner, bm)
        if not a.no_sim and res.get("unlimited"):
            try:
                res["sim"] = simulate(runner, bm, a.work)
                if bm.chain_note:
                    res["chain"] = chain_baselines(runner, bm, res["sim"], a.work)
            except (WorkerError, subprocess.TimeoutExpired) as e:
                res["errors"].append(str(e))
                log(f"{name}: simulation failed:\n{e}")
        results.append(res)
        # Written after every model, so a sweep stopped by a time limit keeps what it measured.
        write_json(os.path.join(a.out, f"{a.device}.json"), command, info, a, results, time.time() - t0, runner)
        try:
            plot(os.path.join(a.out, f"{a.device}_{name}.png"), res, a)
        except ImportError as e:  # a GPU machine without matplotlib: plot later with --rerender
            log(f"{name}: no plot ({e}); rerender elsewhere with --rerender {a.device}.json")
        log(f"{name}: done ({(time.time() - t0) / 60:.1f} min so far)")
    wall = time.time() - t0
    write_json(os.path.join(a.out, f"{a.device}.json"), command, info, a, results, wall, runner)
    write_markdown(os.path.join(a.out, f"{a.device}.md"), results, a, info, wall, command)
    bad = [(r["name"], h, p["ratio"]) for r in results for h, pts in r.get("sweeps", {}).items() for p in pts
           if not p["identical"]]
    log(f"wrote {os.path.join(a.out, a.device + '.md')} in {wall / 60:.1f} min")
    if bad:
        log(f"!!! NOT bit-identical to the plain run: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
