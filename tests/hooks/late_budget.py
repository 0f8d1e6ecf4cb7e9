"""Trains an MLP whose budget comes after some steps, as dtr.set_budget lets a job set it (the
distributed tests do: each rank measures its peak, then budgets a fraction of it). Prints one
JSON line: the budget, the losses, a digest of the final parameters, and dtr's counters and peak
over the budgeted steps. test_training.py runs it with dtr recording from the start and with the
budget as the process's first, at the same budget in bytes: both must train the same way.

  late_budget.py --fraction F   budget = F x the peak allocated in the unbudgeted steps
  late_budget.py --bytes B      budget = B bytes (B = 0: no dtr calls, a plain run)
"""
import argparse
import hashlib
import json

import torch
import torch.nn as nn

WIDTH, DEPTH, BATCH = 128, 8, 2048  # one activation: 1 MiB; parameters, gradients, momentum: 0.6 MiB each
WARMUP, STEPS = 2, 4


def main():
    ap = argparse.ArgumentParser()
    budget = ap.add_mutually_exclusive_group(required=True)
    budget.add_argument("--fraction", type=float)
    budget.add_argument("--bytes", type=int)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    out = {"losses": []}
    before = None
    for step in range(WARMUP + STEPS):
        if step == WARMUP and args.bytes != 0:
            import dtr
            stats = dtr.stats()
            out["budget"] = args.bytes or int(args.fraction * stats["peak_allocated_bytes"])
            dtr.set_budget(out["budget"])
            dtr.reset_peak_stats()
            before = dtr.stats()
        x = torch.randn(BATCH, WIDTH, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out["losses"].append(loss.item())
    if before is not None:
        import dtr
        after = dtr.stats()
        out["dtr"] = {k: after[k] - before[k] for k in ("evictions", "rematerializations")}
        out["dtr"].update({k: after[k] for k in ("peak_allocated_bytes", "peak_reserved_bytes", "budget_bytes")})
        for p in model.parameters():
            dtr.pin(p)  # .numpy() reads the storage outside the dispatcher
    out["params"] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
