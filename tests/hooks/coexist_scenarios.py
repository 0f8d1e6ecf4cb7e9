"""dtr next to the rest of PyTorch: programs that use a feature dtr does not manage itself
(torch.utils.checkpoint, higher-order ops, torch.func, FakeTensorMode and meta tensors, dispatch
modes, __torch_dispatch__ subclasses, nested, sparse and quantized tensors, torch.compile) in the
same process as ordinary training that dtr evicts and rematerializes.

`python coexist_scenarios.py NAME` runs one scenario and prints, as its last stdout line, one JSON
object {"out": {...digests and floats of every result...}, "dtr": stats-or-null}. Run plainly (no
DTR_* variables) and under dtr, "out" must be identical: test_coexistence.py compares them.
Evictions are forced mid-program by lowering the budget with torch.ops.dtr.set_budget to 1 byte
(which evicts everything evictable, then refuses) and restoring the previous budget, mostly between
a forward pass and its backward, so the backward rematerializes what it saved."""
import hashlib
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTR = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "stats")
INFO = {}  # facts only a dtr run has (printed as "info", not compared)


def stats():
    return json.loads(torch.ops.dtr.stats()) if DTR else None


def dg(t):
    """SHA-256 digest (16 hex digits) and shape of a dense strided tensor; other values: repr."""
    if not isinstance(t, torch.Tensor):
        return repr(t)
    t = t.detach()
    if DTR:
        torch.ops.dtr.pin(t)  # .numpy() reads outside the dispatcher
    h = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16] + str(tuple(t.shape))
    if DTR:
        torch.ops.dtr.unpin(t)
    return h


def evict_all():
    """Evicts everything evictable (no-op without dtr), then restores the budget it found."""
    if not DTR:
        return
    old = torch.ops.dtr.budget()
    try:
        torch.ops.dtr.set_budget(1)  # cannot get under 1 byte: raises, having evicted all it can
    except Exception:  # noqa: BLE001
        pass
    torch.ops.dtr.set_budget(max(old, 0))  # -1 (unlimited) -> 0 (unlimited)


def mlp(din=16, width=64, dout=4, depth=3):
    layers, d = [], din
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.Tanh()]
        d = width
    layers.append(nn.Linear(d, dout))
    return nn.Sequential(*layers)


def train_plain(steps=3, seed=11):
    """The ordinary training that runs next to the feature under test: a small MLP, SGD with
    momentum, evicting everything between each forward and backward."""
    torch.manual_seed(seed)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(32, 16), torch.randn(32, 4)
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        evict_all()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [dg(p) for p in m.parameters()]}


# ---------------------------------------------------------------------------------------------
# a, b: torch.utils.checkpoint


def _checkpoint(reentrant):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    inp = nn.Linear(16, 64)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.ReLU())
                           for _ in range(3))
    head = nn.Linear(64, 4)
    params = list(inp.parameters()) + list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    losses, grads = [], []
    for _ in range(3):
        x, y = torch.randn(32, 16), torch.randn(32, 4)
        opt.zero_grad()
        h = torch.tanh(inp(x))
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=reentrant)
        loss = F.mse_loss(head(h), y)
        evict_all()  # the checkpoint boundaries and the head's activations go
        loss.backward()
        grads.append([dg(p.grad) for p in params])
        opt.step()
        losses.append(loss.item())
        evict_all()
    return {"losses": losses, "grads": grads, "params": [dg(p) for p in params]}


def checkpoint_reentrant():
    return _checkpoint(True)


def checkpoint_nonreentrant():
    return _checkpoint(False)


# ---------------------------------------------------------------------------------------------
# c: torch.cond


def cond():
    torch.manual_seed(1)
    enc = nn.Linear(16, 32)
    wa = nn.Linear(32, 32)
    wb = nn.Linear(32, 32)
    head = nn.Linear(32, 4)
    mods = [enc, wa, wb, head]
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)

    def branch_a(h):
        return torch.tanh(wa(h)) * 2

    def branch_b(h):
        return torch.sigmoid(wb(h)).exp()

    losses, taken = [], []
    for step in range(4):
        x = torch.randn(32, 16) + (1.0 if step % 2 == 0 else -1.0)  # predicate alternates
        y = torch.randn(32, 4)
        opt.zero_grad()
        h = enc(x).relu()
        pred = x.sum() > 0
        taken.append(bool(pred))
        h2 = torch.cond(pred, branch_a, branch_b, (h,))
        loss = F.mse_loss(head(h2), y)
        evict_all()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "taken": taken, "params": [dg(p) for p in params],
            "train": train_plain()}


# ---------------------------------------------------------------------------------------------
# d: torch.func.grad and vmap (per-sample gradients)


def func_vmap_grad():
    from torch.func import functional_call, grad, vmap
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, x, y):
        out = functional_call(model, p, (x.unsqueeze(0),))
        return F.mse_loss(out, y.unsqueeze(0))

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
    out = {"per_sample": []}
    lr = 0.1
    for step in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        feats = x.exp().tanh()  # evicted below, rematerialized inside the transforms
        evict_all()
        g = per_sample(params, feats, y)
        out["per_sample"].append({k: dg(v) for k, v in g.items()})
        # clipped per-sample gradients, averaged (DP-SGD-like), applied functionally
        norms = torch.stack([v.flatten(1).norm(dim=1) for v in g.values()]).norm(dim=0)
        scale = (1.0 / norms).clamp(max=1.0)
        evict_all()
        params = {k: p - lr * (g[k] * scale.view(-1, *([1] * (g[k].dim() - 1)))).mean(0)
                  for k, p in params.items()}
    # the plain (batched) gradient through torch.func.grad as well, and a vmapped forward
    gx = grad(lambda p: F.mse_loss(functional_call(model, p, (x,)), y))(params)
    out["batched_grad"] = {k: dg(v) for k, v in gx.items()}
    out["vmap_fwd"] = dg(vmap(lambda xi: functional_call(model, params, (xi,)))(x))
    out["params"] = {k: dg(v) for k, v in params.items()}
    out["train"] = train_plain()
    return out


# ---------------------------------------------------------------------------------------------
# e: FakeTensorMode and meta tensors


def fake_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode
    out = {"train1": train_plain(steps=2, seed=3)}
    before = stats()

    # meta tensors: a model and data on device='meta'
    with torch.device("meta"):
        mm_ = mlp()
        xm = torch.randn(32, 16)
    ym = mm_(xm)
    lm = ym.square().mean()
    lm.backward()
    out["meta"] = [str(ym.shape), str(ym.device), str(lm.device),
                   [str(p.grad.shape) for p in mm_.parameters()]]
    # FakeTensorMode: factories inside the mode, a model built inside it, forward and backward
    mode = FakeTensorMode()
    with mode:
        mf = mlp()
        xf = torch.randn(32, 16)
        yf = mf(xf)
        lf = F.mse_loss(yf, torch.zeros(32, 4))
        lf.backward()
        grad_shapes = [str(p.grad.shape) for p in mf.parameters()]
    out["fake"] = [type(yf).__name__, str(yf.shape), str(yf.device), grad_shapes]

    after = stats()
    if DTR:  # the test checks that nothing meta or fake was recorded
        INFO["ops_recorded_before_fake"] = before["ops_recorded"]
        INFO["ops_recorded_after_fake"] = after["ops_recorded"]
    out["train2"] = train_plain(steps=3, seed=4)
    return out


def fake_from_real():
    """FakeTensorMode.from_tensor of real (trained, partly evicted) tensors: the fake copies have
    the real shapes and strides; the real tensors keep their values."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    torch.manual_seed(5)
    m = mlp()
    x = torch.randn(32, 16)
    h = m[0](x).exp()
    evict_all()
    mode = FakeTensorMode()
    fh = mode.from_tensor(h)
    with mode:
        r = (fh @ fh.t()).sum(1)
    out = {"fake": [str(r.shape), str(r.device), type(r).__name__], "h": dg(h), "real": dg((h @ h.t()).sum(1))}
    out["train"] = train_plain(seed=5)
    return out


# ---------------------------------------------------------------------------------------------
# f: a user TorchDispatchMode


def dispatch_mode():
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace != "dtr":  # evict_all's own calls (only made under dtr)
                self.counts[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(6)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses, counts = [], []
    for step in range(3):
        x, y = torch.randn(32, 16), torch.randn(32, 4)
        mode = CountOps()
        with mode:
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            evict_all()  # inside the mode: the backward's rematerializations must not be seen by it
            loss.backward()
            opt.step()
            losses.append(loss.item())
        counts.append(dict(sorted(mode.counts.items())))
    return {"losses": losses, "counts": counts, "params": [dg(p) for p in m.parameters()]}


# ---------------------------------------------------------------------------------------------
# g: a wrapper tensor subclass with __torch_dispatch__


class Wrapped(torch.Tensor):
    """A wrapper subclass that delegates every op to its inner tensor and wraps the results."""
    calls = 0

    @staticmethod
    def __new__(cls, inner, requires_grad=False):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device,
            requires_grad=requires_grad)

    def __init__(self, inner, requires_grad=False):
        self.inner = inner

    def __repr__(self):
        return f"Wrapped({self.inner!r})"

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inners, meta, outer_size, outer_stride):
        return Wrapped(inners["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        Wrapped.calls += 1
        unwrap = lambda t: t.inner if isinstance(t, Wrapped) else t  # noqa: E731
        args = torch.utils._pytree.tree_map(unwrap, args)
        kwargs = torch.utils._pytree.tree_map(unwrap, kwargs or {})
        res = func(*args, **kwargs)
        if func._schema.is_mutable:  # in-place / out=: return the (unwrapped) mutated argument
            return res
        wrap = lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return torch.utils._pytree.tree_map(wrap, res)


def subclass():
    torch.manual_seed(7)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    gate = torch.randn(32, 4)
    losses = []
    out = {}
    for step in range(3):
        x, y = torch.randn(32, 16), torch.randn(32, 4)
        opt.zero_grad()
        feats = x.exp() * 0.1
        wx = Wrapped(feats)               # the input enters as a subclass
        h = m(wx)                         # plain parameters, wrapped activations
        assert isinstance(h, Wrapped)
        mixed = h * gate + (h.sigmoid() * torch.ones(4))  # wrapped (x) plain
        loss = F.mse_loss(mixed, Wrapped(y))
        evict_all()
        loss.backward()
        for p in m.parameters():  # gradients came back through the subclass: unwrap them
            if isinstance(p.grad, Wrapped):
                p.grad = p.grad.inner
        opt.step()
        losses.append(loss.inner.item())
        out[f"h{step}"] = dg(h.inner)
        evict_all()
    out.update(losses=losses, params=[dg(p) for p in m.parameters()], calls=Wrapped.calls,
               train=train_plain(seed=7))
    return out


# ---------------------------------------------------------------------------------------------
# h: nested tensors


def nested_strided():
    return _nested("strided")


def nested_jagged():
    return _nested("jagged")


def _nested(which):
    """A Linear, GELU and softmax over a nested tensor of 4 sequences (lengths 3, 5, 2, 7), with
    gradients to the nested input and the Linear; evicting mid-forward and before the backward."""
    layout = {"strided": torch.strided, "jagged": torch.jagged}[which]
    torch.manual_seed(8)
    lens = [3, 5, 2, 7]
    w = nn.Linear(16, 8)
    opt = torch.optim.SGD(w.parameters(), lr=0.05, momentum=0.9)
    out = {"losses": []}
    for step in range(2):
        seqs = [torch.randn(n, 16).exp() * 0.2 for n in lens]
        nt = torch.nested.nested_tensor(seqs, layout=layout, requires_grad=True)
        opt.zero_grad()
        h = F.gelu(w(nt))
        h2 = h.softmax(-1) * h * 2 + 1
        evict_all()
        loss = sum(p.square().sum() for p in h2.unbind()) / 1000
        evict_all()
        loss.backward()
        out[f"grad_nt{step}"] = [dg(g) for g in nt.grad.unbind()]
        out[f"grad_w{step}"] = [dg(p.grad) for p in w.parameters()]
        opt.step()
        out["losses"].append(loss.item())
        out[f"h2_{step}"] = [dg(p) for p in h2.unbind()]
        pad = h2.detach().to_padded_tensor(0.0)
        out[f"padded{step}"] = dg(pad)
    out["w"] = [dg(p) for p in w.parameters()]
    out["train"] = train_plain(seed=8)
    return out


# ---------------------------------------------------------------------------------------------
# i: sparse tensors


def _sparse_setup(n=48):
    dense_adj = (torch.rand(n, n) < 0.1).float() * torch.rand(n, n)
    return dense_adj.to_sparse(), dense_adj.to_sparse_csr()


def _sparse_training():
    """The graph-like model both sparse scenarios train: adjacency in COO and CSR, two layers."""
    torch.manual_seed(9)
    n, d = 48, 16
    coo, csr = _sparse_setup(n)
    lin1, lin2 = nn.Linear(d, 32), nn.Linear(32, 4)
    params = list(lin1.parameters()) + list(lin2.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return n, d, coo, csr, lin1, lin2, params, opt


def sparse():
    """COO and CSR operands in a training step; evicting between forward and backward."""
    n, d, coo, csr, lin1, lin2, params, opt = _sparse_training()
    out = {"losses": []}
    for step in range(3):
        x, y = torch.randn(n, d), torch.randn(n, 4)
        opt.zero_grad()
        h = torch.relu(lin1(x))
        h = torch.sparse.mm(coo, h)               # COO (x) dense, differentiable in the dense side
        h = torch.tanh(h)
        h = torch.matmul(csr, lin2(h))            # CSR (x) dense
        loss = F.mse_loss(h, y)
        evict_all()
        loss.backward()
        opt.step()
        out["losses"].append(loss.item())
    # sparse tensors built from dense ones, and sparse-only ops
    vals = torch.randn(20).exp()
    idx = torch.stack([torch.randint(0, n, (20,)), torch.randint(0, n, (20,))])
    s = torch.sparse_coo_tensor(idx, vals * 2, (n, n)).coalesce()
    sp = (torch.randn(n, n).relu() * 3).to_sparse()
    evict_all()
    out["s_dense"] = dg(s.to_dense())
    out["sp_dense"] = dg(sp.to_dense())
    out["sp_sum"] = dg(torch.sparse.sum(sp, 1).to_dense())
    out["sp_add"] = dg((sp + s).to_dense())
    out["params"] = [dg(p) for p in params]
    out["train"] = train_plain(seed=9)
    return out


def sparse_evicted_operand():
    """A dense operand of a sparse op that dtr evicted before the op runs, as a budget that binds
    would do to the node features of a graph network between two layers."""
    n, d, coo, csr, lin1, lin2, params, opt = _sparse_training()
    out = {"losses": []}
    for step in range(3):
        x, y = torch.randn(n, d), torch.randn(n, 4)
        opt.zero_grad()
        h = torch.relu(lin1(x))
        evict_all()                               # h is evicted: sparse.mm must rematerialize it
        h = torch.tanh(torch.sparse.mm(coo, h))
        g = lin2(h)
        evict_all()                               # g is evicted: the CSR matmul must rematerialize it
        loss = F.mse_loss(torch.matmul(csr, g), y)
        evict_all()
        loss.backward()
        opt.step()
        out["losses"].append(loss.item())
    v = torch.randn(n, 8).tanh()
    evict_all()
    out["csr_mv"] = dg(csr @ v[:, 0])
    out["coo_mm"] = dg(torch.sparse.mm(coo, v))
    # an uncoalesced COO tensor holds the dense values it was built from (computed, evictable)
    vals = torch.randn(20).exp()
    idx = torch.stack([torch.randint(0, n, (20,)), torch.randint(0, n, (20,))])
    s = torch.sparse_coo_tensor(idx, vals * 2, (n, n))
    evict_all()
    out["coo_built_dense"] = dg(s.to_dense())
    out["params"] = [dg(p) for p in params]
    return out


# ---------------------------------------------------------------------------------------------
# j: quantized tensors


def quantized():
    torch.manual_seed(10)
    out = {"train1": train_plain(seed=10)}
    x = torch.randn(8, 16).exp()
    y = torch.randn(8, 16).tanh()
    qx = torch.quantize_per_tensor(x, 0.05, 0, torch.quint8)
    qy = torch.quantize_per_tensor(y, 0.02, 64, torch.quint8)
    qz = torch.quantize_per_tensor(x * 0.5, 0.03, 0, torch.qint8)
    evict_all()
    out["qx"] = dg(qx.int_repr())
    out["qx_deq"] = dg(qx.dequantize())
    out["qadd"] = dg(torch.ops.quantized.add(qx, qy, 0.1, 10).dequantize())
    out["qrelu"] = dg(torch.relu(qy).dequantize())
    out["qz"] = dg(qz.int_repr())
    # a quantized linear module
    import torch.ao.nn.quantized as nnq
    ql = nnq.Linear(16, 8)
    torch.manual_seed(11)
    wq = torch.quantize_per_tensor(torch.randn(8, 16) * 0.3, 0.01, 0, torch.qint8)
    ql.set_weight_bias(wq, torch.randn(8))
    ql.scale, ql.zero_point = 0.1, 64
    qin = torch.quantize_per_tensor(torch.randn(8, 16).relu() + 0.1, 0.05, 0, torch.quint8)
    evict_all()
    out["qlinear"] = dg(ql(qin).dequantize())
    # per-channel
    pc = torch.quantize_per_channel(torch.randn(4, 16).exp(), torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                    torch.tensor([0, 1, 2, 3]), 0, torch.quint8)
    evict_all()
    out["per_channel"] = dg(pc.dequantize())
    out["train2"] = train_plain(seed=12)
    return out


# ---------------------------------------------------------------------------------------------
# k: torch.compile


def _compiled(backend):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(13)
    pre = nn.Sequential(nn.Linear(16, 32), nn.Tanh())     # not compiled
    core = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh())
    head = nn.Linear(32, 4)                                # not compiled
    ccore = torch.compile(core, backend=backend)
    params = [p for mod in (pre, core, head) for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    losses, grads = [], []
    for step in range(3):
        x, y = torch.randn(32, 16), torch.randn(32, 4)
        opt.zero_grad()
        h = pre(x) * 1.5
        evict_all()               # the compiled graph's input is evicted when it runs
        h = ccore(h)
        loss = F.mse_loss(head(h), y)
        evict_all()               # everything evictable, between forward and backward
        loss.backward()
        grads.append([dg(p.grad) for p in params])
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads, "params": [dg(p) for p in params]}


def compile_eager():
    return _compiled("eager")


def compile_aot_eager():
    return _compiled("aot_eager")


def compile_inductor():
    return _compiled("inductor")


class _Tagged(torch.Tensor):
    """A __torch_function__-only subclass, as torchvision's tv_tensors."""


def compile_raw_access():
    """Raw access inside compiled functions: dynamo traces dtr's Python hooks (dtr/_exposure.py)
    where they are called in a traced function, and never compiles them on their own (Note [Hooks
    under torch.compile]): a compiled x.numpy() looped until RecursionError under dtr."""
    torch.manual_seed(14)
    x = torch.randn(4, 8) * 1.0
    as_numpy = torch.compile(lambda t: (t * 2).numpy(), backend="eager")
    pool = torch.compile(lambda t: F.max_pool1d(t, 2) + 1, backend="eager", fullgraph=True)
    y = x.exp()
    evict_all()
    a = as_numpy(x)
    p = pool(x.as_subclass(_Tagged))
    return {"numpy": a.tolist(), "pool": dg(p.as_subclass(torch.Tensor)), "pool_type": type(p).__name__, "y": dg(y)}


SCENARIOS = dict(checkpoint_reentrant=checkpoint_reentrant, checkpoint_nonreentrant=checkpoint_nonreentrant,
                 cond=cond, func_vmap_grad=func_vmap_grad, fake_meta=fake_meta,
                 fake_from_real=fake_from_real, dispatch_mode=dispatch_mode, subclass=subclass,
                 nested_strided=nested_strided, nested_jagged=nested_jagged, sparse=sparse,
                 sparse_evicted_operand=sparse_evicted_operand, quantized=quantized, compile_eager=compile_eager,
                 compile_aot_eager=compile_aot_eager, compile_inductor=compile_inductor,
                 compile_raw_access=compile_raw_access)

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)
    res = SCENARIOS[sys.argv[1]]()
    print(json.dumps({"out": res, "dtr": stats(), "info": INFO}))
