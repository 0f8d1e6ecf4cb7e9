"""dtr's per-op bookkeeping on small CPU ops, measured side by side with plain PyTorch.

Runs `y = y * w + x` on 64x64 float tensors (a fresh chain every 50 steps) in fresh processes:
plain, under dtr with no budget, and under a budget that never binds (1 TiB). The modes are
interleaved round by round, and the median of the rounds is reported, because the CI machine
is shared and noisy. The kernels take about 1 us, so the difference per op is dtr's fallback:
recording, pins, the runtime's bookkeeping (bench/results/runtime.md).

    .venv/bin/python bench/op_overhead.py [--rounds 5] [--ops 60000]
"""
import argparse
import os
import statistics
import subprocess
import sys

CODE = r"""
import sys, time, torch
mode, n = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
if mode != "plain":
    import dtr
    dtr.enable(budget=None if mode == "no budget" else "1TiB")
x = torch.randn(64, 64)
w = torch.randn(64, 64)
def run(k):
    y = x
    for i in range(k):
        y = y * w + x
        if i % 50 == 0:
            y = x.clone()
run(2000)
t = time.perf_counter()
run(n)
us = (time.perf_counter() - t) / (2 * n) * 1e6
if mode != "plain":
    # A dtr mode must have had dtr in the loop: the fallback active, and under the budget the
    # ops recorded (with no budget none is, Note [Recording starts with a budget]).
    import json
    recorded = json.loads(torch.ops.dtr.stats())["ops_recorded"]
    if not torch.ops.dtr.is_active() or (mode != "no budget") != (recorded >= 2 * n):
        sys.exit(f"op_overhead: dtr not in the loop in mode {mode!r} (active "
                 f"{torch.ops.dtr.is_active()}, {recorded} ops recorded)")
print(us)
"""

MODES = ["plain", "no budget", "1 TiB budget"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=60000, help="loop iterations (2 ops each) per run")
    args = ap.parse_args()
    # Each mode as it is meant, whatever the caller's environment: no budget, trace or preload
    # (dtr.enable(budget=None) would keep a DTR_BUDGET).
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    times = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, "-c", CODE, mode, str(args.ops)], check=True,
                                 capture_output=True, text=True, env=env).stdout
            times[mode].append(float(out.strip().splitlines()[-1]))
    plain = statistics.median(times["plain"])
    print(f"{'mode':<14} {'us/op (median)':>15} {'ratio':>7} {'dtr us/op':>10}   rounds")
    for mode in MODES:
        med = statistics.median(times[mode])
        rounds = " ".join(f"{t:.2f}" for t in times[mode])
        print(f"{mode:<14} {med:>15.2f} {med / plain:>6.2f}x {med - plain:>10.2f}   {rounds}")


if __name__ == "__main__":
    main()
