"""The training workload of dtr's profile-guided build (Note [Profile-guided optimization],
CMakeLists.txt; scripts/setup.sh runs it under the instrumented library):
    python -m dtr --budget 1TiB scripts/pgo_workload.py
Small models of its own, not the benchmark's (bench/bench_models.py), so that what the profile
gains is measured on models it was not trained on: an MLP with LayerNorm, GELU and dropout under
AdamW; a CNN with batch norm, in-place ReLU and residual adds; a GRU classifier over embeddings
and a variable-length LSTMCell loop; a recursive network over random binary trees; a causal
attention block. Each trains a few steps under a budget that never binds, then under two that do
(static memory + r x its activations' peak, r = 0.6 and 0.35), where dtr evicts, searches and rematerializes. A budget that is
infeasible raises torch.OutOfMemoryError, which is part of the workload too. Prints a line a model
and budget; about 3 s on one core, with the instrumented library too."""
import random
import sys
import time

# setup.sh runs this from a `pip install --target` directory on PYTHONPATH, whose dtr.pth Python
# does not read: start dtr as it would (the Python-side fixups under the preload); a no-op when
# dtr.pth already did.
import _dtr_startup  # noqa: F401
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtr


class MLP(nn.Module):
    def __init__(self, width=256, depth=6):
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(),
                                                  nn.Dropout(0.1)) for _ in range(depth))
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


class CNN(nn.Module):
    def __init__(self, c=16, blocks=6):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.res = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                               nn.ReLU(inplace=True), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                               nn.BatchNorm2d(c)) for _ in range(blocks))
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        h = F.max_pool2d(self.stem(x), 2)
        for r in self.res:
            h = F.relu(h + r(h))
        return self.head(h.mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self, vocab=500, dim=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.cell = nn.LSTMCell(dim, dim)
        self.out = nn.Linear(2 * dim, vocab)

    def forward(self, tokens, length):
        e = self.emb(tokens)
        g, _ = self.gru(e)
        h = c = torch.zeros(tokens.shape[0], e.shape[2])
        for t in range(length):  # a data-dependent number of steps
            h, c = self.cell(e[:, t], (h, c))
        return self.out(torch.cat([g[:, length - 1], h], 1))


class TreeNet(nn.Module):
    def __init__(self, dim=128):
        super().__init__()
        self.leaf = nn.Linear(dim, dim)
        self.combine = nn.Linear(2 * dim, dim)
        self.out = nn.Linear(dim, 5)

    def node(self, tree, leaves):
        if isinstance(tree, int):
            return torch.tanh(self.leaf(leaves[tree:tree + 1]))
        left, right = (self.node(t, leaves) for t in tree)
        return torch.tanh(self.combine(torch.cat([left, right], 1)))

    def forward(self, tree, leaves):
        return self.out(self.node(tree, leaves))


class Attention(nn.Module):
    def __init__(self, dim=96, heads=4, layers=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.norm = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.out = nn.Linear(dim, 10)

    def forward(self, x):
        b, s, d = x.shape
        for qkv, proj, norm in zip(self.qkv, self.proj, self.norm):
            q, k, v = qkv(norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
            x = x + F.dropout(proj(a.transpose(1, 2).reshape(b, s, d)), 0.1)
        return self.out(x.mean(1))


def random_tree(rng, lo, hi):
    if hi - lo == 1:
        return lo
    mid = rng.randrange(lo + 1, hi)
    return (random_tree(rng, lo, mid), random_tree(rng, mid, hi))


def workloads(rng):
    """(name, model, optimizer factory, step function) for each model."""
    def classify(model, make_input):
        def step():
            x, y = make_input()
            return F.cross_entropy(model(x), y)
        return step

    mlp = MLP()
    yield "mlp", mlp, torch.optim.AdamW, classify(mlp, lambda: (torch.randn(512, 64), torch.randint(10, (512,))))
    cnn = CNN()
    yield "cnn", cnn, torch.optim.Adam, classify(cnn, lambda: (torch.randn(32, 3, 32, 32), torch.randint(10, (32,))))
    rec = Recurrent()

    def rec_step():
        length = rng.randrange(8, 24)
        tokens = torch.randint(500, (64, length))
        return F.cross_entropy(rec(tokens, length), torch.randint(500, (64,)))
    yield "recurrent", rec, torch.optim.SGD, rec_step
    tree = TreeNet()

    def tree_step():
        n = rng.randrange(64, 160)
        return F.cross_entropy(tree(random_tree(rng, 0, n), torch.randn(n, 128)), torch.randint(5, (1,)))
    yield "tree", tree, torch.optim.Adagrad, tree_step
    att = Attention()
    yield "attention", att, torch.optim.AdamW, classify(att, lambda: (torch.randn(16, 128, 96), torch.randint(10, (16,))))


def train(model, optimizer, step, steps):
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = step()
        loss.backward()
        optimizer.step()
    return loss.item()


def main():
    if not dtr.is_enabled():
        sys.exit("pgo_workload.py: run it under dtr: python -m dtr --budget 1TiB scripts/pgo_workload.py")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = random.Random(0)
    start = time.perf_counter()
    for name, model, make_optimizer, step in workloads(rng):
        optimizer = make_optimizer(model.parameters(), lr=1e-3)
        dtr.set_budget("1TiB")
        train(model, optimizer, step, 2)
        static = dtr.stats()["allocated_bytes"]  # parameters, gradients, optimizer state
        dtr.reset_peak_stats()
        train(model, optimizer, step, 3)
        peak = dtr.stats()["peak_allocated_bytes"]
        for r in (0.6, 0.35):
            before = dtr.stats()
            try:
                dtr.set_budget(static + int(r * (peak - static)))
                train(model, optimizer, step, 5)
                outcome = "trained"
            except torch.OutOfMemoryError:
                outcome = "out of memory"
            after = dtr.stats()
            print(f"pgo_workload: {name} at r={r} of its activations ({static >> 10} KiB static, peak "
                  f"{peak >> 10} KiB): {outcome}, {after['evictions'] - before['evictions']} evictions, "
                  f"{after['rematerializations'] - before['rematerializations']} rematerializations", flush=True)
            dtr.set_budget("1TiB")
        del model, optimizer
    print(f"pgo_workload: done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
