"""Overhead of the preloaded dtr with no budget pressure (not a test): runs each model's training
(train.py, a few steps, repeated) plainly and under LD_PRELOAD=libdtr.so without DTR_BUDGET, and
prints wall times and the ratio. Usage: .venv/bin/python tests/hooks/overhead.py [reps]"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import PY, clean_env, dtr_lib  # noqa: E402

MODELS = ["mlp", "cnn", "transformer", "lstm", "treelstm", "unet"]
# Times the training loop inside one process (import time excluded), repeated `reps` times.
CODE = r"""
import sys, time, torch
sys.path.insert(0, %r)
import models
torch.set_num_threads(1)
name, reps = sys.argv[1], int(sys.argv[2])
m, batches, loss_fn = models.MODELS[name]()
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
def epoch():
    for b in batches:
        opt.zero_grad(); loss = loss_fn(m, b); loss.backward(); opt.step()
epoch()
t0 = time.perf_counter()
for _ in range(reps): epoch()
print((time.perf_counter() - t0) / reps)
""" % HERE


def timed(model, reps, preload):
    env = clean_env()
    if preload:
        env["LD_PRELOAD"] = dtr_lib()
    r = subprocess.run([PY, "-c", CODE, model, str(reps)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return float(r.stdout.strip().splitlines()[-1])


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"{'model':12s} {'plain ms/epoch':>15s} {'dtr ms/epoch':>13s} {'ratio':>6s}")
    for m in MODELS:
        p = min(timed(m, reps, False) for _ in range(2))
        d = min(timed(m, reps, True) for _ in range(2))
        print(f"{m:12s} {p * 1e3:15.2f} {d * 1e3:13.2f} {d / p:6.2f}", flush=True)


if __name__ == "__main__":
    main()
