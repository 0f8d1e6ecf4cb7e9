"""An ordinary training script with no dtr in it: torchvision's ResNet-18 on synthetic images,
SGD with momentum, a fixed seed. The main job (scripts/main.sh) runs it plainly and under dtr's
budget. Prints one line per step and, last, one JSON line with the losses, a SHA-256 of the
final weights, the step time and dtr's stats when dtr is active (so runs can be compared bit
for bit).

    python examples/train_resnet18.py [--steps N] [--batch B] [--size S]
"""
import argparse
import hashlib
import json
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=64, help="image side in pixels")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--deterministic", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(args.deterministic)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(1)
    losses, times = [], []
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, args.size, args.size, generator=data)
        y = torch.randint(0, 10, (args.batch,), generator=data)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        print(f"step {step} loss {losses[-1]:.9g} ({times[-1]:.2f} s)", flush=True)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().clone().numpy().tobytes())
    stats = None
    if hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "stats") and torch.ops.dtr.is_active():
        stats = json.loads(torch.ops.dtr.stats())
    step_time = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    print(json.dumps({"losses": losses, "weights": h.hexdigest(), "median_step_seconds": step_time, "dtr": stats}))


if __name__ == "__main__":
    main()
