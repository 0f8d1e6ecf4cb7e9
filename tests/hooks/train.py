"""Trains one tiny model for a few seeded steps and prints one JSON line: the losses, SHA-256
digests of every gradient after each backward and of every parameter at the end, and dtr's stats
(when preloaded). The test compares plain and dtr runs digest for digest (bit-identical)."""
import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

def dtr_active():
    # Checked when used, not at import: dtr.enable() may run after this module is imported.
    return hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "pin") and torch.ops.dtr.is_active()


def digest(t):
    # .numpy() reads the storage outside the dispatcher: pin it resident while we read it.
    t = t.detach()
    DTR = dtr_active()
    if DTR:
        torch.ops.dtr.pin(t)
    h = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16] if t.is_contiguous() else \
        hashlib.sha256(t.numpy().copy().tobytes()).hexdigest()[:16]
    if DTR:
        torch.ops.dtr.unpin(t)
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--enable", metavar="BUDGET", help="dtr.enable(budget=BUDGET) before the model exists")
    ap.add_argument("--enable-late", metavar="BUDGET", help="dtr.enable(budget=BUDGET) after the model and "
                    "its batches exist (tensors allocated before enabling)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.enable:
        import dtr
        dtr.enable(budget=int(args.enable) if args.enable.isdigit() else args.enable)
    m, batches, loss_fn = models.MODELS[args.model]()
    if args.enable_late:
        import dtr
        dtr.enable(budget=None if args.enable_late == "unlimited" else int(args.enable_late))
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], []
    for b in batches:
        opt.zero_grad()
        loss = loss_fn(m, b)
        loss.backward()
        losses.append(loss.item())
        grads.append([digest(p.grad) for p in m.parameters() if p.grad is not None])
        opt.step()
    params = [digest(p) for p in m.parameters()]
    stats = json.loads(torch.ops.dtr.stats()) if dtr_active() else None
    print(json.dumps({"losses": losses, "grads": grads, "params": params, "dtr": stats}))


if __name__ == "__main__":
    main()
