"""Programs that once gave silently wrong results, hung or grew under dtr (issue 13), one per
defect. `python fidelity_scenarios.py NAME` prints one JSON line: {"out": {...}, "dtr": stats or
null}. test_fidelity.py runs each plainly and under the preload, where `evict_all()` evicts
everything evictable at the marked points, and compares the outputs bit for bit.

Unlike scenarios.py, these programs read tensors the way users do (t.numpy(), torch.save, ...):
dtr must notice on its own (Note [Memory read outside the dispatcher], hooks/engine.cc)."""
import copy
import ctypes
import hashlib
import io
import json
import os
import pickle
import sys
import threading

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import DTR, evict_all  # noqa: E402


def dg(t):
    """Digest through the dispatcher (clone), so reading never exposes the tensor itself."""
    c = t.detach().clone().contiguous()
    if c.is_complex():
        c = torch.view_as_real(c.resolve_conj().resolve_neg()).clone()
    return hashlib.sha256(c.numpy().tobytes()).hexdigest()[:16] + str(tuple(t.shape))


def ballast():
    """Evictable tensors, so every scenario evicts and rematerializes something."""
    g = torch.Generator().manual_seed(11)
    return [torch.randn(64, 64, generator=g).exp() * 2 for _ in range(4)]


def numpy_writes():
    """Item 1: memory written outside the dispatcher, through every way out."""
    keep = ballast()
    out = {}
    a = torch.zeros(64, 64)
    a.numpy()[:] = 3.0                       # a view of a factory's output, written
    b = torch.ones(64, 64)
    b2 = b * 2                                # read before the write below
    np.asarray(b)[5:9] = -1.0                 # __array__
    c = torch.full((64, 64), 0.5)
    c3 = c + 1
    ctypes.memset(c.data_ptr(), 0, 64 * 4)    # a raw pointer (first row zeroed)
    d = torch.zeros(32, 32)
    np.from_dlpack(d)[:] = 7.0                # __dlpack__
    e = torch.empty(16, 16).fill_(2.0)
    torch.from_dlpack(torch.utils.dlpack.to_dlpack(e))[0] = 9.0  # another tensor over e's memory
    arr = np.ones((64, 64), np.float32)
    f = torch.from_numpy(arr)
    f2 = f * 2                                # read before numpy refills the array
    arr[:] = 5.0
    f3 = f * 2
    derived = [a * 1, b2 + 0, c3 + 0, d + 1, e * 1]
    evict_all()
    for k, v in dict(a=a, b=b, b2=b2, c=c, c3=c3, d=d, e=e, f=f, f2=f2, f3=f3).items():
        out[k] = dg(v)
    out["derived"] = [dg(x) for x in derived]
    out["ballast"] = [dg(x) for x in keep]
    return out


def kept_numpy_view():
    """Item 2: a .numpy() view of an activation, kept while the activation could be evicted."""
    keep = ballast()
    x = torch.randn(128, 64, generator=torch.Generator().manual_seed(1))
    y = x.exp() * 3
    view = y.numpy()
    evict_all()
    junk = [torch.full((128, 64), 7.0) for _ in range(8)]  # would reuse y's block if freed
    return {"view": hashlib.sha256(view.tobytes()).hexdigest()[:16], "y": dg(y),
            "junk": dg(junk[0]), "ballast": [dg(x) for x in keep]}


def conj_neg():
    """Item 3: the lazy conjugate and negative bits of views read by recorded ops."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 64, dtype=torch.complex64, generator=g)
    y = x * 2
    c = y.conj()
    n = torch._neg_view(y)
    outs = dict(conj_mul=c * 1, conj_add=c + y, conj_mm=c @ y, neg_mul=n * 1, neg_add=n + 1,
                conj_abs=c.abs(), conj_real=torch.view_as_real(c.resolve_conj()) * 1)
    evict_all()
    return {k: dg(v) for k, v in outs.items()}


def global_settings():
    """Item 4: settings changed between an op and its replay."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 256, generator=g)
    w = torch.randn(256, 256, generator=g)
    ys = {}
    torch.set_flush_denormal(True)
    ys["flush_denormal"] = (x * 1e-39) * 3
    torch.set_flush_denormal(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys["autocast"] = x @ w
    torch.set_float32_matmul_precision("medium")
    ys["matmul_precision"] = x @ w
    torch.set_float32_matmul_precision("highest")
    torch.backends.mkldnn.enabled = False
    ys["mkldnn_off"] = F.conv2d(x[None, None, :64, :64], w[None, None, :5, :5])
    torch.backends.mkldnn.enabled = True
    torch.set_num_threads(2)
    ys["two_threads"] = x.sum(0) + (x @ w).sum(1)
    torch.set_num_threads(1)
    with torch.no_grad():
        ys["no_grad"] = x * 2
    torch.set_default_dtype(torch.float64)
    ys["default_dtype"] = torch.arange(10) * 0.1
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    ys["deterministic"] = x.cumsum(0)
    torch.use_deterministic_algorithms(False)
    evict_all()
    # Read back under the opposite settings: replays must restore the recorded ones.
    torch.set_flush_denormal(True)
    torch.set_num_threads(2)
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = {k: dg(v.float()) for k, v in ys.items()}
    torch.set_default_dtype(torch.float32)
    torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(1)
    torch.set_flush_denormal(False)
    return out


def hidden_rng():
    """Note [Random ops without a Generator argument]: an aten op that draws from the default
    generator without saying so. dtr must see the generator move while it runs (GenMark): its
    outputs are then constants, and later calls are recorded with the generator's state. Missed,
    its replays would draw again, other values."""
    lib = torch.library.Library("aten", "FRAGMENT")
    lib.define("_dtr_test_hidden_rng(Tensor x) -> Tensor")
    lib.impl("_dtr_test_hidden_rng", lambda x: x + torch.rand(x.shape), "CPU")
    torch.manual_seed(0)
    keep = ballast()
    x = torch.ones(64, 64)
    ys = [torch.ops.aten._dtr_test_hidden_rng(x) * (i + 1) for i in range(4)]
    evict_all()
    out = {f"y{i}": dg(y) for i, y in enumerate(ys)}
    out["after"] = dg(torch.rand(8))  # replays leave the program's stream where it was
    out["ballast"] = [dg(t) for t in keep]
    return out


def lstm_grad_mode():
    """Note [Global state a replay depends on]: nn.LSTM on CPU runs aten::mkldnn_rnn_layer, whose
    kernel takes oneDNN's training path (with a workspace output) when grad mode is on and the
    inference path (no workspace, other bits) when it is off. Backward runs with grad mode off
    and replays the forward's layers; a forward under no_grad is replayed with grad mode on. Each
    replay must take the path the op first took."""
    torch.manual_seed(0)
    keep = ballast()
    lstm = torch.nn.LSTM(32, 32, num_layers=2)
    x = torch.randn(10, 4, 32)
    out, (h, c) = lstm(x)
    loss = out.square().sum() + h.sum() + c.sum()
    evict_all()
    loss.backward()
    res = {"loss": dg(loss), "ballast": [dg(t) for t in keep]}
    res.update({n: dg(p.grad) for n, p in lstm.named_parameters()})
    with torch.no_grad():
        y, _ = lstm(x)
    evict_all()
    res["no_grad_forward"] = dg(y * 2)
    return res


def leaving_python():
    """Item 5: evicted tensors serialized, copied, shared or read as Python values."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(4))
    ys = [x.exp() * (i + 1) for i in range(8)]
    out = {}
    evict_all()
    buf = io.BytesIO()
    torch.save(ys[0], buf)
    out["save"] = dg(torch.load(io.BytesIO(buf.getvalue())))
    evict_all()
    out["pickle"] = dg(pickle.loads(pickle.dumps(ys[1])))
    evict_all()
    out["deepcopy"] = dg(copy.deepcopy(ys[2]))
    evict_all()
    out["tolist"] = repr(ys[3].tolist())[:400]
    evict_all()
    out["item"] = ys[4][3, 5].item()
    evict_all()
    ys[5].share_memory_()
    z = ys[5] * 2
    evict_all()
    out["shared"], out["from_shared"] = dg(ys[5]), dg(z)
    import torch.multiprocessing as mp
    q = mp.get_context("spawn").SimpleQueue()
    evict_all()
    q.put(ys[6])
    out["queued"] = dg(q.get())
    out["rest"] = [dg(y) for y in ys]
    return out


def sparse_quantized():
    """Item 6: sparse and quantized ops reading evicted inputs."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 64, generator=g)
    y = x.exp()
    dense = torch.relu(x)
    out = {}
    evict_all()
    s = dense.to_sparse()
    evict_all()
    out["sparse_mm"] = dg(torch.sparse.mm(s, y))
    out["sparse_add"] = dg((s + s).to_dense())
    evict_all()
    csr = dense.to_sparse_csr()
    evict_all()
    out["csr_mv"] = dg(csr @ y[:, 0])
    q = torch.quantize_per_tensor(y, 0.1, 0, torch.quint8)
    evict_all()
    out["dequant"] = dg(q.dequantize())
    lin = torch.nn.quantized.Linear(64, 32)
    w = torch.randn(32, 64, generator=g) / 10
    lin.set_weight_bias(torch.quantize_per_tensor(w, 0.01, 0, torch.qint8), torch.zeros(32))
    out["qlinear"] = dg(lin(torch.quantize_per_tensor(y / 10, 0.05, 0, torch.quint8)).dequantize())
    out["y"] = dg(y)
    return out


def fork_workers():
    """Item 7: fork() while another thread runs ops under dtr; each child reads a tensor evicted in
    the parent. Without the atfork handlers a child that inherits a held lock hangs."""
    import multiprocessing as mp
    g = torch.Generator().manual_seed(6)
    shared = [torch.randn(64, 64, generator=g).exp() for _ in range(8)]
    stop = threading.Event()

    def busy():
        t = torch.randn(64, 64, generator=torch.Generator().manual_seed(7))
        while not stop.is_set():
            u = t.exp() * 2
            _ = u.sum()

    worker = threading.Thread(target=busy)
    worker.start()
    ctx = mp.get_context("fork")
    sums = []
    try:
        for _ in range(12):
            evict_all()  # here: a fork between its two set_budget calls would hand the child a 1-byte budget
            q = ctx.Queue()
            p = ctx.Process(target=lambda: q.put([float(s.sum()) for s in shared]))
            p.start()
            sums.append(q.get(timeout=120))
            p.join(60)
            assert p.exitcode == 0, p.exitcode
    finally:
        stop.set()
        worker.join()
    evict_all()
    return {"child_sums": sums[0], "same_in_every_child": all(s == sums[0] for s in sums),
            "parent": [dg(s) for s in shared]}


def mlp_with_momentum_sgd():
    """A small MLP (seed 0) and momentum SGD, for the scenarios about gradients."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 8))
    return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)


def zeroed_grads():
    """optimizer.zero_grad(set_to_none=False) keeps every .grad and zeroes it in place (an
    overwriting zero_): until the backward pass accumulates into them they are storages a fill
    brings back, which dtr may evict like any other (Note [Results awaiting their reader],
    runtime/eviction_search.cc). Evicted here before each forward pass, with the last step's batch;
    the backward pass's in-place accumulation must replay the fill and give the same gradients."""
    m, opt = mlp_with_momentum_sgd()
    g = torch.Generator().manual_seed(3)
    out = {}
    for step in range(3):  # the first step makes the gradients; the next two zero them
        opt.zero_grad(set_to_none=False)
        evict_all()
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        out[f"loss{step}"] = loss.item()
        out[f"grads{step}"] = [dg(p.grad) for p in m.parameters()]
        opt.step()
    out["params"] = [dg(p) for p in m.parameters()]
    return out


def held_loss():
    """The loss read after the optimizer step (`loss.item()` after `opt.step()`, as much training
    code logs it): while the backward pass frees the loss's inputs, the held loss is frozen (Note
    [Held results of dead inputs], runtime/lifetime.cc), so evicting everything between backward
    and step leaves it resident and the step's in-place updates need not replay the forward pass
    to bring it back (Note [Mutation]). A .grad the backward pass accumulated into is frozen the
    same way; the zeroed ones evicted before each forward pass are brought back by a fill."""
    m, opt = mlp_with_momentum_sgd()
    g = torch.Generator().manual_seed(5)
    out = {}
    for step in range(3):
        opt.zero_grad(set_to_none=False)
        evict_all()
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
        loss = F.mse_loss(m(x), F.one_hot(y, 8).float())  # a 0-dim view of a 1 KiB storage
        loss.backward()
        evict_all()
        opt.step()
        out[f"loss{step}"] = loss.item()
        out[f"grads{step}"] = [dg(p.grad) for p in m.parameters()]
    out["params"] = [dg(p) for p in m.parameters()]
    return out


def packed_outputs(relaid=False):
    """Note [Outputs that share a storage] (hooks/replay_record.h): an op whose three results are
    views of one storage it allocated, as CUDA's _efficient_attention_backward returns the
    gradients of packed q, k and v. dtr records it: evicted, the storage comes back whole, each
    view reading its own part. Under dtr the output also says what was unevictable while the
    views lived and how many replays reading the first took. `relaid`: a kernel that, on every call
    after the first, returns the second and third results from each other's place; a replay must
    copy them back into the first call's layout."""
    lib = torch.library.Library("aten", "FRAGMENT")
    lib.define("_dtr_test_packed_triple(Tensor x) -> (Tensor, Tensor, Tensor)")
    calls = [0]

    def packed(x):
        calls[0] += 1
        chunk = torch.empty((x.shape[0], 3) + tuple(x.shape[1:]), dtype=x.dtype)
        # Relaid: the first result where it was, the other two swapped.
        slots = (0, 2, 1) if relaid and calls[0] > 1 else (0, 1, 2)
        parts = [chunk.select(1, slot) for slot in slots]
        for i, part in enumerate(parts):
            torch.mul(x, i + 1.5, out=part)
        return tuple(parts)

    lib.impl("_dtr_test_packed_triple", packed, "CPU")
    keep = ballast()
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(12)).exp()
    q, k, v = torch.ops.aten._dtr_test_packed_triple(x)
    s = q + k * v
    evict_all()
    out = {}
    if DTR:
        stats = json.loads(torch.ops.dtr.stats())
        out["dtr_unevictable"], replays = stats["unevictable_by_reason"], stats["replays"]
    try:
        out["q"] = dg(q)
        if DTR:
            out["dtr_replays_reading_q"] = json.loads(torch.ops.dtr.stats())["replays"] - replays
        out.update(k=dg(k), v=dg(v), s=dg(s), ballast=[dg(t) for t in keep])
    except RuntimeError as e:
        out["error"] = str(e).splitlines()[0]
    del lib
    return out


SCENARIOS = dict(numpy_writes=numpy_writes, kept_numpy_view=kept_numpy_view, conj_neg=conj_neg,
                 global_settings=global_settings, hidden_rng=hidden_rng, lstm_grad_mode=lstm_grad_mode,
                 leaving_python=leaving_python, sparse_quantized=sparse_quantized, fork_workers=fork_workers,
                 zeroed_grads=zeroed_grads, held_loss=held_loss,
                 packed_outputs=packed_outputs, packed_outputs_relaid=lambda: packed_outputs(relaid=True))

if __name__ == "__main__":
    torch.set_num_threads(1)
    res = SCENARIOS[sys.argv[1]]()
    print(json.dumps({"out": res, "dtr": json.loads(torch.ops.dtr.stats()) if DTR else None}))
