"""Loops that grew without bound under dtr (issue 13, items 8-10). `python growth.py MODE [STEPS]`
runs MODE for STEPS steps (200) and prints one JSON line: dtr's accounted bytes and the process's
resident set at every 20th step, the result's digest, and dtr's stats. test_fidelity.py checks
that both memories stay flat after step 40 and that the results equal the plain run's.

- ema: an exponential moving average carried across steps, acc = acc * 0.9 + x
  (Note [Bounded replay chains], runtime/runtime.cc).
- numpy_inputs: a model trained on batches that torch.from_numpy wraps (Note [Memory read outside
  the dispatcher], hooks/engine.cc).
- zero_grad: gradients zeroed in place (zero_grad(set_to_none=False)) with momentum SGD
  (Note [Dead constants in accumulating recipes], runtime/lifetime.cc)."""
import hashlib
import json
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DTR = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "pin")


def accounted():
    return json.loads(torch.ops.dtr.stats())["allocated_bytes"] if DTR else 0


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def dg(t):
    return hashlib.sha256(t.detach().clone().contiguous().numpy().tobytes()).hexdigest()[:16]


def train(params, forward, batch, steps, samples):
    """Momentum SGD with gradients zeroed in place: with set_to_none they are fresh evictable
    outputs the optimizer step must rematerialize, and numpy_inputs' model does not train below
    0.97 of its peak (the runtime floor, README "Known limits", issue 16)."""
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch()
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            samples.append((step, accounted(), rss()))
    return losses[-5:]


def main():
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rs = np.random.RandomState(0)
    samples = []
    if mode == "ema":
        acc = torch.zeros(256, 256)
        model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256))
        for step in range(steps):
            x = torch.randn(256, 256)
            with torch.no_grad():  # as EMA code does (with grad, plain torch keeps every step's graph)
                acc = acc * 0.9 + torch.tanh(model(x))
            if step % 20 == 0 or step == steps - 1:
                samples.append((step, accounted(), rss()))
        result = [dg(acc)]
    elif mode == "numpy_inputs":
        model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))
        batch = lambda: (torch.from_numpy(rs.rand(512, 256).astype(np.float32)),  # noqa: E731
                         torch.from_numpy(rs.randint(0, 10, 512)))
        result = train(model.parameters(), lambda x: model(x), batch, steps, samples)
        result += [dg(p) for p in model.parameters()]
    elif mode == "zero_grad":
        emb, lin = nn.Embedding(1000, 64), nn.Linear(64, 100)
        body = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.Tanh())])
        params = list(emb.parameters()) + list(body.parameters()) + list(lin.parameters())

        def batch():
            idx = torch.randint(0, 1000, (1024,))
            return idx, idx % 100

        result = train(params, lambda idx: lin(body(emb(idx))), batch, steps, samples)
        result += [dg(p) for p in (emb.weight, lin.weight)]
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps({"samples": samples, "result": result,
                      "dtr": json.loads(torch.ops.dtr.stats()) if DTR else None}))


if __name__ == "__main__":
    main()
