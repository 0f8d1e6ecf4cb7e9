"""What dtr's bookkeeping costs a training step, in instructions: deterministic where time is not.

Issue 16 asks that dtr with no budget, or with a budget that never binds, cost at most 1.05x a
plain step on every benchmark model. On a shared machine single steps vary by up to 2x (the
TreeLSTM 10-21 ms a step within one hour), which hides a 5% target, so this benchmark counts the
instructions of training steps under callgrind instead, side by side in one process per model:
the plain step, then dtr with no budget (`dtr.enable()`), then dtr under a 1 TiB budget
(`dtr.set_budget`). Each mode builds the model and its SGD optimizer from their seeds
(bench/step_worker.py), runs `--warmup` steps, then counts the instructions of `--steps` steps
between two callgrind client requests (a helper compiled here); its losses must equal the plain
mode's bit for bit, and no mode may rematerialize. With no budget dtr records nothing, every op
passing through its dispatcher hook (Note [Recording starts with a budget], hooks/fallback.cc),
and the run must show that; under the budget dtr's counters give the ops it recorded a step, and
so the instructions it added an op in either mode (the same program runs the same ops).

What the ratios leave out: memory stalls and page faults are not instructions, and the plain
mode uses PyTorch's CPU allocator where dtr's modes use dtr's (which may fault less), so they are
not time ratios (bench/results/cpu.md has those, with the noise): they isolate dtr's own work.
dtr is enabled after torch has run the plain mode, which dtr supports (tensors made before are
left alone); a preloaded run (`python -m dtr`) records the same ops.

Needs valgrind (Debian: apt-get install valgrind, which scripts/setup.sh installs) and a C
compiler. A model takes 5-15 minutes on this machine (torch's import under valgrind, not
instrumented, about 2.5 of them), so all eight take about 40 minutes with --jobs 2.

    .venv/bin/python bench/step_instructions.py [--models resnet,treelstm] [--jobs 2] [--out FILE]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import installed_dtr_build  # noqa: E402

MODES = ("plain", "no budget", "1 TiB budget")
TIB = 1 << 40
COUNTERS = ("ops_recorded", "rematerializations", "evictions", "eager_evictions")

# Client requests around the measured steps: zeroed and started before them, stopped and dumped
# under the mode's name after them, so each dump holds one mode's measured steps alone.
HELPER_C = r"""
#include <valgrind/callgrind.h>
void dtr_bench_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void dtr_bench_stop(const char* mode) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(mode); }
"""
DUMP_PREFIX = "measured: "


def worker(args):
    """Runs inside valgrind: every mode of one model; prints one JSON line."""
    import ctypes

    import torch
    torch.set_num_threads(1)
    import bench_models
    import step_worker
    helper = ctypes.CDLL(args.helper)
    bm = bench_models.get(args.worker)
    batches = bm.batches(args.warmup + args.steps, "cpu")
    out = {}
    for mode in MODES:
        if mode == "no budget":
            import dtr
            # The 1 TiB mode measures what recording an op costs: without idle_below=0 dtr would
            # go idle after its first step (Note [Idle far below the budget], hooks/fallback.cc),
            # and its measured steps would cost about what no budget does.
            dtr.enable(idle_below=0)
        elif mode == "1 TiB budget":
            torch.ops.dtr.set_budget(TIB)
        model = bm.build("cpu")
        model.train()
        opt = step_worker.make_optimizer(model)
        torch.manual_seed(1234)  # dropout masks, as step_worker.run_block
        losses = [step_worker.train_step(bm, "model", model, opt, batches[i]) for i in range(args.warmup)]
        before = step_worker.dtr_stats() if mode != "plain" else None
        helper.dtr_bench_start()
        for i in range(args.warmup, args.warmup + args.steps):
            losses.append(step_worker.train_step(bm, "model", model, opt, batches[i]))
        helper.dtr_bench_stop((DUMP_PREFIX + mode).encode())
        out[mode] = {"losses": losses}
        if before is not None:
            after = step_worker.dtr_stats()
            out[mode].update({k: (after[k] - before[k]) / args.steps for k in COUNTERS})
        del model, opt
    print("STEP_INSTRUCTIONS " + json.dumps(out), flush=True)


def dumped_events(dump_dir, prefix):
    """{mode: {event: count}} from the dumps of one run (Ir alone, or with --cache-sim the cache
    simulation's misses too)."""
    found = {}
    for name in os.listdir(dump_dir):
        if not name.startswith(prefix):
            continue
        with open(os.path.join(dump_dir, name)) as f:
            text = f.read()
        trigger = re.search(r"^desc: Trigger: Client Request: " + re.escape(DUMP_PREFIX) + r"(.*)$", text, re.M)
        events = re.search(r"^events:\s+(.*)$", text, re.M)
        total = re.search(r"^totals:\s+([\d ]+)$", text, re.M) or re.search(r"^summary:\s+([\d ]+)$", text, re.M)
        if trigger and events and total:
            found[trigger.group(1).strip()] = dict(zip(events.group(1).split(), map(int, total.group(1).split())))
    return found


def run_model(model, args, helper, dump_dir):
    prefix = f"{model}."
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", *(["--cache-sim=yes"] if args.cache_sim else []),
           f"--callgrind-out-file={os.path.join(dump_dir, prefix)}%p",
           args.python, os.path.abspath(__file__), "--worker", model, "--helper", helper,
           "--warmup", str(args.warmup), "--steps", str(args.steps)]
    # One intra-op thread, no BLAS server threads spinning beside the steps, no preload.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("LD_PRELOAD", None)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"").decode(errors="replace")[-3000:]  # bytes, text=True or not
        raise RuntimeError(f"step_instructions: {model}: valgrind ran past --timeout {args.timeout:g} s; raise it on a "
                           f"slower machine, or lower --warmup/--steps\n{tail}") from None
    lines = [l for l in p.stdout.splitlines() if l.startswith("STEP_INSTRUCTIONS ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"step_instructions: {model}: exit {p.returncode}\n{p.stderr[-3000:]}")
    result = json.loads(lines[-1][len("STEP_INSTRUCTIONS "):])
    counts = dumped_events(dump_dir, prefix)
    for mode in MODES:
        if mode not in counts:
            raise RuntimeError(f"step_instructions: {model}: no callgrind dump for {mode} in {dump_dir}")
        result[mode]["instructions_per_step"] = counts[mode]["Ir"] / args.steps
        result[mode]["events_per_step"] = {k: v / args.steps for k, v in counts[mode].items()}
    return result


def check(model, result):
    """The modes must compute the same losses, and a budget that never binds must not recompute."""
    plain = result["plain"]["losses"]
    for mode in MODES[1:]:
        if result[mode]["losses"] != plain:
            raise SystemExit(f"step_instructions: {model} under {mode}: losses {result[mode]['losses']} "
                             f"differ from the plain mode's {plain}")
        if result[mode]["rematerializations"]:
            raise SystemExit(f"step_instructions: {model} rematerialized under {mode}")
    if result["no budget"]["ops_recorded"] or not result["1 TiB budget"]["ops_recorded"]:
        raise SystemExit(f"step_instructions: {model}: dtr recorded {result['no budget']['ops_recorded']} ops a step "
                         f"with no budget and {result['1 TiB budget']['ops_recorded']} under one: it records under a "
                         f"budget only")


# Note [Simulated cache misses]
# Under a budget that never binds the TreeLSTM's step took 1.30-1.44x a plain one in CPU time
# (stop 77) where its instructions were 1.127x. --cache-sim has callgrind simulate the caches
# (the host's L1 sizes; its last level as callgrind models it) for the same measured steps: its
# TreeLSTM step (stop 79) had 1.144x the instructions, 1.55x the L1 instruction-cache misses
# (1.71M -> 2.64M a step), 1.16x the L1 data-cache misses and 1.04x the last-level ones. Of the
# 0.93M more L1i misses a step, 0.68M are in dtr's own code (with what it inlines), about 500 per
# recorded op for its 6,700 instructions per op: a miss every 13 instructions, about one per
# 64-byte line, so its per-op path runs cold, each line once per op; torch's code misses 0.17M
# more (the boxed calls, and its code evicted by dtr's). The estimate below weighs a miss as a
# rough cycle count does, Ir + 10 x L1 misses + 100 x last-level misses: 1.20x for that step.
# So what dtr's per-op path costs in time follows the bytes of code it runs as much as its
# instruction count. Built with -O2 both counts stayed as they were; -Os added to both; branch
# hints (ABSL_PREDICT_FALSE) on 26 rare cases of Engine::Fallback moved them by 0.1%.
MISS_WEIGHTS = {"Ir": 1, "I1mr": 10, "D1mr": 10, "D1mw": 10, "ILmr": 100, "DLmr": 100, "DLmw": 100}


def cycle_estimate(events):
    return sum(w * events.get(k, 0) for k, w in MISS_WEIGHTS.items())


def table(models, results, cache_sim=False):
    head = ("| model | plain step (instructions) | no budget | 1 TiB budget | ops dtr recorded a step (1 TiB) | "
            "instructions dtr added an op (no budget, 1 TiB) |")
    if cache_sim:
        head += (" L1i misses a step (plain -> 1 TiB) | L1d misses a step (plain -> 1 TiB) | "
                 "estimated cycles, 1 TiB / plain (Note [Simulated cache misses]) |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for m in models:
        r = results[m]
        base = r["plain"]["instructions_per_step"]
        ops = r["1 TiB budget"]["ops_recorded"]
        ratios = [r[mode]["instructions_per_step"] / base for mode in MODES[1:]]
        added = [(r[mode]["instructions_per_step"] - base) / ops if ops else float("nan") for mode in MODES[1:]]
        row = (f"| {m} | {base / 1e6:.1f}M | {ratios[0]:.3f}x | {ratios[1]:.3f}x | {ops:.0f} | "
               f"{added[0]:,.0f}, {added[1]:,.0f} |")
        if cache_sim:
            p, b = r["plain"]["events_per_step"], r["1 TiB budget"]["events_per_step"]
            l1d = [e["D1mr"] + e["D1mw"] for e in (p, b)]
            row += (f" {p['I1mr'] / 1e6:.2f}M -> {b['I1mr'] / 1e6:.2f}M ({b['I1mr'] / p['I1mr']:.2f}x) | "
                    f"{l1d[0] / 1e6:.2f}M -> {l1d[1] / 1e6:.2f}M ({l1d[1] / l1d[0]:.2f}x) | "
                    f"{cycle_estimate(b) / cycle_estimate(p):.3f}x |")
        rows.append(row)
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma-separated (default: all of bench_models.MODELS)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the measured ones (at least 1)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps")
    ap.add_argument("--jobs", type=int, default=2, help="valgrind processes at once")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a model's valgrind run may take")
    ap.add_argument("--out", default=None, help="also write the table, with how it was made, as markdown here")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also simulate the caches: L1 misses and a cycle estimate (Note [Simulated cache misses])")
    ap.add_argument("--keep-dumps", default=None, metavar="DIR",
                    help="copy callgrind's dumps here (one a mode and model) to read with callgrind_annotate")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1 (a first step allocates the optimizer's state)")
    import bench_models
    models = args.models.split(",") if args.models else list(bench_models.MODELS)
    for m in models:
        bench_models.get(m)  # an unknown name fails here, before any valgrind run
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            sys.exit(f"step_instructions: needs {tool} on PATH (Debian: apt-get install valgrind gcc)")
    with tempfile.TemporaryDirectory(prefix="dtr-step-instructions-") as tmp:
        src, helper = os.path.join(tmp, "helper.c"), os.path.join(tmp, "libhelper.so")
        with open(src, "w") as f:
            f.write(HELPER_C)
        c = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, src], capture_output=True, text=True)
        if c.returncode != 0:
            sys.exit(f"step_instructions: cannot build the callgrind helper (are valgrind's headers installed?):\n"
                     f"{c.stderr}")
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
            futures = {m: ex.submit(run_model, m, args, helper, tmp) for m in models}
            try:
                results = {m: f.result() for m, f in futures.items()}
            except RuntimeError as e:  # what failed, without a traceback through the thread pool
                for f in futures.values():
                    f.cancel()
                sys.exit(str(e))
        if args.keep_dumps:
            os.makedirs(args.keep_dumps, exist_ok=True)
            for name in os.listdir(tmp):
                if any(name.startswith(f"{m}.") for m in models):
                    shutil.copy(os.path.join(tmp, name), args.keep_dumps)
    for m in models:
        check(m, results[m])
    text = table(models, results, args.cache_sim)
    print(text)
    if args.out:
        version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                 text=True).stdout.strip()
        with open(args.out, "w") as f:
            f.write(f"# dtr's instructions a training step\n\nMade by `python bench/step_instructions.py` "
                    f"(callgrind; {args.warmup} warm-up and {args.steps} measured steps a mode, one process a "
                    f"model, torch {version}, 1 thread, dtr built {installed_dtr_build(args.python)}). Ratios are of "
                    "the plain step's instructions."
                    + (" Cache misses simulated by callgrind (--cache-sim; Note [Simulated cache misses], "
                       "bench/step_instructions.py)." if args.cache_sim else "") + "\n\n"
                    f"{text}\n")


if __name__ == "__main__":
    main()
