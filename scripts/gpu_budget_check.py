"""Budget sweep on CUDA for scripts/gpu-check.sh: two models (a conv net and a Transformer encoder,
built here so the GPU machine needs nothing beyond torch), each trained plain, then under dtr at
fractions of the plain run's peak reserved memory, every run in a fresh process.

For each run it reports: time per step (CUDA events, after warm-up), max_memory_reserved against
the budget, dtr's evictions/rematerializations, and whether losses and final weights are
bit-identical to the unbudgeted dtr run (deterministic algorithms on). Writes a JSON and a
Markdown table to --out. Gradients are reset with zero_grad(set_to_none=True), PyTorch 2.x's
default (`--zero-grad zeros` for set_to_none=False); `--alloc-conf` sets PYTORCH_CUDA_ALLOC_CONF
for the dtr runs (`expandable_segments:False` keeps the native allocator's cudaMalloc segments,
which dtr otherwise swaps for expandable ones under a budget: Note [Expandable segments under a
budget] in hooks/cuda_allocator.cc).

  python3 scripts/gpu_budget_check.py --out $OUT            (the sweep)
  python3 scripts/gpu_budget_check.py --worker MODEL ...    (one run; used by the sweep)
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

MODELS = ("convnet", "transformer")
FAILURES = "failures"  # where the output of failed runs goes (under --out)


def build(name, torch):
    nn = torch.nn
    if name == "convnet":
        layers, c = [], 3
        for width in (64, 64, 128, 128, 256, 256):
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            c = width
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
        data = (torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,)))
        loss_fn = lambda out, y: nn.functional.cross_entropy(out, y)
    else:
        layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 6), nn.Linear(512, 512))
        data = (torch.randn(32, 256, 512), torch.randn(32, 256, 512))
        loss_fn = lambda out, y: nn.functional.mse_loss(out, y)
    return model, data, loss_fn


def worker(args):
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    model, (x, y), loss_fn = build(args.worker, torch)
    model = model.to(dev)
    x, y = x.to(dev), y.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses, times = [], []
    for step in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=args.zero_grad == "none")
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        end.record()
        losses.append(loss.item())
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(start.elapsed_time(end))
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    stats = {}
    try:
        import dtr

        if dtr.is_enabled():
            stats = dtr.stats()
    except Exception:
        pass
    print(json.dumps({
        "model": args.worker, "ms_per_step": sum(times) / max(1, len(times)), "losses": losses,
        "weights": h.hexdigest(), "max_reserved": torch.cuda.max_memory_reserved(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "evictions": stats.get("evictions", 0), "remats": stats.get("rematerializations", 0),
        "dtr_stats": stats,
    }))


def run(model, args, budget=None, dtr=True, evict=True):
    cmd = [sys.executable]
    if dtr:
        cmd += ["-m", "dtr"] + (["--budget", str(budget)] if budget else []) + ([] if evict else ["--evict", "0"])
    cmd += [__file__, "--worker", model, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--zero-grad", args.zero_grad]
    cuda_allocator = args.cuda_allocator
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_")}
    if dtr:
        env["DTR_CUDA_ALLOCATOR"] = cuda_allocator
        if args.alloc_conf is not None:
            env["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    wall = time.time() - t0
    if p.returncode != 0:
        # The whole output of a failed run, for the report's reader (the table keeps 3 lines).
        os.makedirs(FAILURES, exist_ok=True)
        name = f"{model}-{'dtr' if dtr else 'plain'}-{cuda_allocator}-{budget or 'unbudgeted'}{'' if evict else '-noevict'}"
        with open(os.path.join(FAILURES, name + ".log"), "w") as f:
            f.write(" ".join(cmd) + f"\nexit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        oom = "OutOfMemoryError" in p.stderr or "out of memory" in p.stderr
        return {"ok": False, "oom": oom, "error": " | ".join(tail), "wall_s": wall}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(ok=True, wall_s=wall)
    return r


def sweep(args):
    global FAILURES
    FAILURES = os.path.join(args.out, "failures")
    rows, report = [], {}
    for model in args.models:
        plain = run(model, args, dtr=False)
        ref = run(model, args, dtr=True)
        report[model] = {"plain": plain, "dtr_unbudgeted": ref, "budgets": []}
        if not (plain.get("ok") and ref.get("ok")):
            rows.append(f"| {model} | - | plain or unbudgeted dtr failed: {plain.get('error') or ref.get('error')} |")
            save(args.out, rows, report)
            continue
        peak = plain["max_reserved"]
        rows.append(f"| {model} | plain | {plain['ms_per_step']:.2f} ms | 1.00x | {peak / 2**20:.0f} MiB | - | - |")
        rows.append(f"| {model} | dtr, no budget | {ref['ms_per_step']:.2f} ms | "
                    f"{ref['ms_per_step'] / plain['ms_per_step']:.2f}x | {ref['max_reserved'] / 2**20:.0f} MiB | - | "
                    f"{'yes' if ref['losses'] == plain['losses'] else 'NO'} (vs plain) |")
        save(args.out, rows, report)
        for frac in args.fractions:
            budget = int(peak * frac)
            r = run(model, args, budget=budget)
            report[model]["budgets"].append(dict(r, fraction=frac, budget=budget))
            if not r["ok"]:
                rows.append(f"| {model} | {frac:.2f} of peak | {'OOM' if r['oom'] else 'FAILED'} | - | - | - | "
                            f"{r['error'][:120]} |")
                save(args.out, rows, report)
                continue
            same = r["losses"] == ref["losses"] and r["weights"] == ref["weights"]
            within = r["max_reserved"] <= budget
            expandable = " (expandable segments by dtr)" if r["dtr_stats"].get("expandable_segments_by_dtr") else ""
            rows.append(f"| {model} | {frac:.2f} of peak{expandable} | {r['ms_per_step']:.2f} ms | "
                        f"{r['ms_per_step'] / plain['ms_per_step']:.2f}x | {r['max_reserved'] / 2**20:.0f} MiB "
                        f"({'<=' if within else 'OVER'} budget) | {r['evictions']}/{r['remats']} | "
                        f"{'yes' if same else 'NO'} |")
            save(args.out, rows, report)
        # The same budget without eviction (a plain cap) must die: dtr is what makes it train.
        low = int(peak * min(args.fractions))
        capped = run(model, args, budget=low, evict=False)
        report[model]["without_eviction"] = capped
        rows.append(f"| {model} | {min(args.fractions):.2f} of peak, DTR_EVICT=0 | "
                    f"{'OOM (expected)' if not capped['ok'] and capped['oom'] else 'UNEXPECTED: ' + str(capped.get('error', 'trained'))[:80]}"
                    f" | - | - | - | - |")
        save(args.out, rows, report)
    print(save(args.out, rows, report))


def save(out, rows, report):
    """Writes the table and the JSON so far: a sweep stopped at its deadline keeps what it ran."""
    table = ("| model | run | time/step | vs plain | max reserved | evictions/remats | bit-identical |\n"
             "|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    os.makedirs(out, exist_ok=True)
    for name, text in (("budget_sweep.json", json.dumps(report, indent=1)), ("budget_sweep.md", table + "\n")):
        # Whole files only: a sweep killed at its deadline while writing keeps the last ones.
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=MODELS)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.9, 0.7, 0.5])
    ap.add_argument("--cuda-allocator", choices=("native", "dtr"), default="native")
    ap.add_argument("--zero-grad", choices=("none", "zeros"), default="none",
                    help="zero_grad(set_to_none=True), PyTorch's default, or set_to_none=False")
    ap.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF for the dtr runs")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-check"))
    args = ap.parse_args()
    worker(args) if args.worker else sweep(args)


if __name__ == "__main__":
    main()
