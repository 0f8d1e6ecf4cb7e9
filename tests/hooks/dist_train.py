"""One rank of a small distributed training job, launched by torchrun (gloo, CPU). Each rank
writes $DIST_OUT/rank<r>.json: its losses, digests of its final parameters (full tensors under
FSDP), its peak before the budget, and dtr's stats when dtr runs it. test_distributed.py compares
these file for file between a plain job and the same job under dtr.

Modes: ddp, ddp_bucket_view, ddp_no_sync, ddp_unused, ddp_static (DistributedDataParallel with
gradient_as_bucket_view, no_sync() every other step, find_unused_parameters with a branch that
skips a layer on odd steps, static_graph), fsdp (fully_shard per block), collectives (functional
collectives, an async all_reduce left pending while the model computes, all_gather into a list,
reduce_scatter_tensor, broadcast and point-to-point, mixed into training).

Budgets: with --budget-fraction F, the first WARMUP steps run without a budget and each rank then
sets its budget to F x its own peak (dtr.set_budget), so every rank trains under pressure whatever
the mode's footprint. With --infeasible-rank R, rank R sets a budget far below its working set:
it must die with torch.OutOfMemoryError and the job must end.

With --device cuda (scripts/gpu-check.sh, 2 or more GPUs) each rank trains on its own GPU over
NCCL, with deterministic algorithms.
"""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

WARMUP = 2
STEPS = 6
WIDTH, DEPTH, BATCH = 128, 8, 2048


def dtr_active():
    return hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "is_active") and torch.ops.dtr.is_active()


def digest(t):
    if hasattr(t, "full_tensor"):  # a DTensor (FSDP): every rank digests the whole parameter
        t = t.full_tensor()
    t = t.detach().contiguous()
    if t.is_cuda:
        return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]
    if dtr_active():
        torch.ops.dtr.pin(t)  # .numpy() reads memory outside the dispatcher
    h = hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]
    if dtr_active():
        torch.ops.dtr.unpin(t)
    return h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(DEPTH))
        self.skippable = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x, use_skippable=True):
        for b in self.blocks:
            x = b(x)
        if use_skippable:
            x = torch.tanh(self.skippable(x))
        return self.head(x)


def collectives_step(model, x, y, rank, world):
    """Training with communication mixed in: every kind of collective dtr must leave alone."""
    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    # An async all_reduce left pending while the forward allocates under the budget.
    shift = torch.full((WIDTH,), float(rank + 1), device=x.device)
    work = dist.all_reduce(shift, async_op=True)
    h = x
    for b in model.blocks:
        h = b(h)
    work.wait()
    h = h + shift / 100
    # Functional collectives (wait_tensor runs as an op) on activations.
    h = funcol.wait_tensor(funcol.all_reduce(h, "sum", group)) / world  # 2.13's backward takes only "sum"
    loss = nn.functional.cross_entropy(model.head(torch.tanh(model.skippable(h))), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    # all_gather into a list (gloo flattens on its worker thread) and reduce_scatter_tensor.
    gathered = [torch.empty(WIDTH, device=x.device) for _ in range(world)]
    dist.all_gather(gathered, model.head.weight.grad[0].contiguous())
    scattered = torch.empty(WIDTH, device=x.device)
    dist.reduce_scatter_tensor(scattered, torch.cat(gathered), op=dist.ReduceOp.SUM)
    # Point-to-point: rank 0 sends, rank 1 receives, then broadcast back.
    token = torch.arange(WIDTH, dtype=torch.float32, device=x.device) * (rank + 1)
    if world > 1:
        if rank == 0:
            dist.send(token, 1)
        elif rank == 1:
            dist.recv(token, 0)
    dist.broadcast(token, 0)
    return loss, float(scattered.sum() + token.sum() + sum(g.sum() for g in gathered))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--budget-fraction", type=float)
    ap.add_argument("--infeasible-rank", type=int)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        torch.use_deterministic_algorithms(True)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net().to(device)
    mode = args.mode
    if mode.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        kw = {"ddp_bucket_view": {"gradient_as_bucket_view": True},
              "ddp_unused": {"find_unused_parameters": True},
              "ddp_static": {"static_graph": True}}.get(mode, {})
        wrapped = DDP(model, bucket_cap_mb=0.05, **kw)
    elif mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (world,))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    else:
        wrapped = model
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    out = {"rank": rank, "losses": [], "extra": [], "step_seconds": []}
    for step in range(args.steps):
        t0 = time.perf_counter()
        if step == WARMUP and dtr_active():
            import dtr
            out["peak_before_budget"] = dtr.stats()["peak_allocated_bytes"]
            if args.budget_fraction is not None:
                out["budget"] = int(args.budget_fraction * out["peak_before_budget"])
                dtr.set_budget(out["budget"])
                dtr.reset_peak_stats()  # the peaks reported are those under the budget
            if args.infeasible_rank == rank:
                # Above what is allocated between steps (so set_budget accepts it), far below
                # what a step needs: the next forward or backward runs out of memory.
                dtr.set_budget(int(0.3 * out["peak_before_budget"]))
        x = torch.randn(BATCH, WIDTH, generator=g).to(device)
        y = torch.randint(0, 10, (BATCH,), generator=g).to(device)
        if mode == "collectives":
            loss, extra = collectives_step(model, x, y, rank, world)
            out["extra"].append(extra)
        elif mode == "ddp_no_sync" and step % 2 == 0:
            with wrapped.no_sync():
                loss = nn.functional.cross_entropy(wrapped(x), y)
                loss.backward()
            out["losses"].append(loss.item())
            out["step_seconds"].append(time.perf_counter() - t0)
            continue
        else:
            loss = nn.functional.cross_entropy(wrapped(x, use_skippable=(mode != "ddp_unused" or step % 2 == 0)), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        out["losses"].append(loss.item())
        out["step_seconds"].append(time.perf_counter() - t0)
        if dtr_active():
            out.setdefault("allocated_after_step", []).append(json.loads(torch.ops.dtr.stats())["allocated_bytes"])
    out["params"] = [digest(p) for p in wrapped.parameters()]
    if dtr_active():
        out["dtr"] = json.loads(torch.ops.dtr.stats())
    with open(os.path.join(os.environ["DIST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    # Both ranks tear gloo down together: a rank destroying its process group while the other
    # still has gloo work in flight aborted now and then ("terminate called without an active
    # exception", SIGABRT after both ranks had written their results, plain runs included).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
