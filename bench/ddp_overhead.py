"""Overhead of dtr on a 2-rank DDP job (gloo, CPU; tests/hooks/dist_train.py's model): time per
step without dtr, under dtr with no budget, and under dtr with each rank's budget set to a
fraction of its own peak after the warm-up steps. The budgeted jobs start under a budget that
never binds (DTR_BUDGET=1TiB), so that dtr records from the start as under `python -m dtr
--budget`; one more job sets the last fraction with no budget before it, which leaves all that
was made before it resident (Note [Recording starts with a budget]). The configurations
alternate, round after round, in one run, so machine load affects them alike; the table gives
the median step time (the slower rank's) and its ratio to the plain job's.

    python bench/ddp_overhead.py [--rounds 3] [--steps 20] [--fractions 0.8 0.5] [--out FILE]

A fraction below the model's floor does not train: the table says so (torch.OutOfMemoryError).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "tests", "hooks", "dist_train.py")
WARMUP = 2  # dist_train.WARMUP: the budget is set at the start of this step


def run_job(steps, fraction, dtr, late=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = "1"
    if dtr:
        env["DTR_ENABLE"] = "1"
    if fraction is not None and not late:
        env["DTR_BUDGET"] = "1TiB"  # recording from the start
    with tempfile.TemporaryDirectory() as out:
        env["DIST_OUT"] = out
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=0", SCRIPT, "ddp", "--steps", str(steps)]
        if fraction is not None:
            cmd += ["--budget-fraction", str(fraction)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            oom = "OutOfMemoryError" in r.stderr
            return None, "torch.OutOfMemoryError (below the floor)" if oom else r.stderr[-2000:]
        ranks = [json.load(open(os.path.join(out, f"rank{i}.json"))) for i in range(2)]
    # Steps after the one that sets the budget; the slower rank paces the job.
    per_step = [max(k["step_seconds"][s] for k in ranks) for s in range(WARMUP + 1, steps)]
    return (statistics.median(per_step), ranks), None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.9, 0.8, 0.7, 0.5])
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    configs = [("plain", None, False, False), ("dtr, no budget", None, True, False)] + [
        (f"dtr, budget {f} x peak", f, True, False) for f in args.fractions]
    if args.fractions:
        f = args.fractions[-1]
        configs.append((f"dtr, budget {f} x peak, no budget before it", f, True, True))
    times = {name: [] for name, *_ in configs}
    notes, stats = {}, {}
    for _ in range(args.rounds):
        for name, fraction, dtr, late in configs:
            if name in notes:
                continue
            result, err = run_job(args.steps, fraction, dtr, late)
            if err:
                notes[name] = err
                continue
            times[name].append(result[0])
            stats[name] = result[1]
    base = statistics.median(times["plain"])
    lines = ["| configuration | s/step (median) | vs plain | evictions / remats (rank 0, rank 1) |",
             "|---|---|---|---|"]
    for name, *_ in configs:
        if name in notes:
            lines.append(f"| {name} | - | - | {notes[name]} |")
            continue
        t = statistics.median(times[name])
        er = ", ".join(f"{k['dtr']['evictions']} / {k['dtr']['rematerializations']}" for k in stats[name]) \
            if "dtr" in stats[name][0] else "-"
        lines.append(f"| {name} | {t:.4f} | {t / base:.2f}x | {er} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"2-rank DDP (gloo, CPU), {args.rounds} rounds x {args.steps} steps, "
                    f"`python bench/ddp_overhead.py`\n\n{table}\n")


if __name__ == "__main__":
    main()
