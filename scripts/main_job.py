"""The main job's driver (scripts/main.sh): torchvision's ResNet-18 (examples/train_resnet18.py,
an ordinary script with no dtr in it) trained four ways, each in its own process:
  1. plain PyTorch, no dtr: the reference losses, weights and step time;
  2. under dtr without a budget: dtr's peak (what the budget below is a fraction of);
  3. under a budget of RATIO x that peak with eviction off (DTR_EVICT=0, what the budget means
     without rematerialization): must die with torch.OutOfMemoryError;
  4. under the same budget with dtr: must finish with losses and final weights bit-identical to
     run 1, never reserving more than the budget; prints dtr's stats and the overhead.
Exits non-zero if any of that does not hold."""
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "train_resnet18.py")
ARGS = ["--batch", "64", "--steps", "6"]
RATIO = 0.8


def run(*prefix, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    e.update(env)
    t0 = time.time()
    r = subprocess.run([sys.executable, *prefix, SCRIPT, *ARGS], env=e, capture_output=True, text=True)
    return r, time.time() - t0


def last_json(r):
    if r.returncode != 0:
        sys.exit(f"main job: unexpected failure (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def mib(n):
    return f"{n / 2**20:.1f} MiB"


def main():
    print("== 1. plain PyTorch (no dtr)", flush=True)
    r, wall = run()
    plain = last_json(r)
    print(f"losses {plain['losses']}\nmedian step {plain['median_step_seconds']:.2f} s, {wall:.0f} s in all")

    print("== 2. under dtr, no budget", flush=True)
    r, wall = run("-m", "dtr")
    free = last_json(r)
    peak = free["dtr"]["peak_allocated_bytes"]
    budget = int(peak * RATIO)
    same_free = free["losses"] == plain["losses"] and free["weights"] == plain["weights"]
    print(f"peak {mib(peak)}; bit-identical to plain: {same_free}")

    print(f"== 3. budget {mib(budget)} ({RATIO:.0%} of the peak), eviction off (DTR_EVICT=0)", flush=True)
    r, wall = run("-m", "dtr", "--budget", str(budget), "--evict", "0")
    oom = [l for l in r.stderr.splitlines() if "OutOfMemoryError" in l]
    if r.returncode == 0 or not oom:
        sys.exit(f"main job: expected torch.OutOfMemoryError without rematerialization, got rc {r.returncode}\n"
                 f"{r.stderr[-2000:]}")
    print(f"died as expected: {oom[-1][:160]}...")

    print(f"== 4. budget {mib(budget)} with dtr", flush=True)
    r, wall = run("-m", "dtr", "--budget", str(budget))
    res = last_json(r)
    s = res["dtr"]
    same = res["losses"] == plain["losses"] and res["weights"] == plain["weights"]
    print(f"losses {res['losses']}")
    print(f"losses and final weights bit-identical to the plain run: {same}")
    print(f"peak reserved {mib(s['peak_reserved_bytes'])} <= budget {mib(budget)}: "
          f"{s['peak_reserved_bytes'] <= budget}")
    print(f"evictions {s['evictions']} ({s['evictions'] - s['eager_evictions']} under budget pressure), "
          f"rematerializations {s['rematerializations']} ({s['remat_seconds']:.2f} s recomputing)")
    print(f"median step {res['median_step_seconds']:.2f} s vs {plain['median_step_seconds']:.2f} s plain: "
          f"{res['median_step_seconds'] / plain['median_step_seconds']:.2f}x "
          "(wall time on a shared machine: bench/ measures overhead properly)")
    ok = same and same_free and s["peak_reserved_bytes"] <= budget and s["rematerializations"] > 0
    print("== main job:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
