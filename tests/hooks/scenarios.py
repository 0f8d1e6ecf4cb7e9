"""Small programs exercising one dtr rule each. `python scenarios.py NAME` prints one JSON line:
{"out": {...digests...}, "dtr": stats-or-null}. Run plainly and under the preload (with a budget or
with torch.ops.dtr.set_budget forcing evictions); the test compares the digests."""
import hashlib
import json
import sys
import threading

import torch
import torch.nn.functional as F

DTR = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "pin")


def dg(t):
    if not isinstance(t, torch.Tensor):
        return repr(t)
    t = t.detach()
    if DTR:
        torch.ops.dtr.pin(t)
    h = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16] + str(tuple(t.shape))
    if DTR:
        torch.ops.dtr.unpin(t)
    return h


def squeeze():
    """Forces evictions of everything evictable (no-op without dtr)."""
    if DTR:
        torch.ops.dtr.set_budget(1)  # raises: cannot get under 1 byte, but has evicted all it can
        

def evict_all():
    if not DTR:
        return
    try:
        torch.ops.dtr.set_budget(1)
    except Exception:
        pass
    torch.ops.dtr.set_budget(0)  # back to unlimited; evicted storages stay evicted


def rng():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(64, 64)           # no Generator argument: default generator
    b = torch.rand(64, 64)
    c = torch.randint(0, 100, (64, 64))
    d = torch.randperm(500)
    e = torch.rand_like(a)
    f = torch.randn_like(a)
    h = F.dropout(a * 1.0, 0.5, training=True)
    i = torch.bernoulli(b, generator=g)
    j = torch.normal(a, 1.0)
    k = torch.randn(64, 64, generator=g)
    derived = [x.float() * 2 + 1 for x in (a, b, c, e, f, h, i, j, k)]
    evict_all()
    out = {n: dg(x) for n, x in zip("abcdefhijk", (a, b, c, d, e, f, h, i, j, k))}
    out.update({f"derived{n}": dg(x) for n, x in enumerate(derived)})
    out["stream_after"] = dg(torch.rand(16))  # the global stream is unchanged by replays
    out["gen_after"] = dg(torch.rand(16, generator=g))
    return out


def views_inplace():
    torch.manual_seed(1)
    x = torch.randn(64, 64) * 1.0
    y = x.exp()
    v = y[:, :32]                         # view
    v.add_(torch.ones(64, 32), alpha=2)   # in-place through a view, with alpha
    z = y.t().contiguous()
    y.mul_(0.5)                           # mutation after z read y: z must keep the old contents
    w = x.sin()
    o = torch.empty(64, 64)
    torch.add(w, z, alpha=3, out=o)       # out= variant
    m = torch.empty(0)
    torch.mm(w, z, out=m)                 # out= with resize
    p = w.cos()
    torch._foreach_add_([p, w], [torch.ones(64, 64), torch.ones(64, 64)])  # list mutation
    q = w.tanh()
    q.index_put_((torch.tensor([1, 2]),), torch.zeros(64))                 # never replayed
    r = p.relu()
    r.clamp_(max=0.5).add_(1)
    s = p.sigmoid()
    s.copy_(r)                            # copy_: never replayed
    evict_all()
    return {n: dg(t) for n, t in dict(x=x, y=y, v=v, z=z, w=w, o=o, m=m, p=p, q=q, r=r, s=s).items()}


def copies_overwritten():
    """Note [Copies of overwritten contents] (runtime/mutation.cc): copies of storages that an
    in-place op then overwrites. Six are whole copies that take the original's recipe (a plain
    clone, a multi-output op's second output, a channels-last clone that keeps its strides, the
    clone autograd saves for silu_, and a copy of a copy); a clone of a view and a clone into
    another memory format stay frozen. All are evicted and read back."""
    torch.manual_seed(3)
    x = torch.randn(64, 64)
    a = x.exp()
    c1 = a.clone()
    a.mul_(2)
    vals, ind = x.sort(1)
    c2 = ind.clone()
    ind.add_(1)
    b = x.reshape(4, 4, 16, 16).contiguous(memory_format=torch.channels_last).exp()
    c3 = b.clone()                                       # keeps channels-last strides: whole
    c4 = b.clone(memory_format=torch.contiguous_format)  # other strides: frozen
    b.sin_()
    a2 = x.cos()
    c5 = a2[:, :32].clone()                              # part of a2: frozen
    a2.sin_()
    w = torch.randn(64, 64, requires_grad=True)
    h = x @ w
    F.silu(h, inplace=True)                              # autograd saves a clone of h
    loss = h.sum()
    d = x.tanh()
    e = d.clone()
    d.mul_(3)
    f = e.clone()                                        # a copy of a copy
    e.add_(1)
    evict_all()
    loss.backward()
    out = dict(a=a, c1=c1, vals=vals, ind=ind, c2=c2, b=b, c3=c3, c4=c4, a2=a2, c5=c5, h=h, grad=w.grad,
               d=d, e=e, f=f)
    return {n: dg(t) for n, t in out.items()}


def multi_output():
    torch.manual_seed(2)
    x = torch.randn(128, 64).exp()
    mx, idx = x.max(1)
    vals, ind = x.sort(1)
    tv, ti = x.topk(5, 1)
    std, mean = torch.std_mean(x, 1)
    parts = x.split(16, 0)
    u, s_ = mx.exp(), vals.log()
    evict_all()
    out = dict(mx=mx, idx=idx, vals=vals, ind=ind, tv=tv, ti=ti, std=std, mean=mean, u=u, s=s_)
    res = {n: dg(t) for n, t in out.items()}
    res.update({f"part{i}": dg(p) for i, p in enumerate(parts)})
    return res


def leaving():
    """Tensors leaving the dispatcher: item(), tolist(), numpy() of evicted tensors."""
    torch.manual_seed(3)
    x = torch.randn(256, 64).exp()
    y = x * 3
    z = y.sum(0)
    evict_all()
    res = {"item": y[3, 4].item(), "sum": z.sum().item()}
    if DTR:
        torch.ops.dtr.pin(y)
    res["numpy"] = hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16]
    res["tolist"] = repr(z.tolist())[:200]
    if DTR:
        torch.ops.dtr.unpin(y)
    return res


def threads():
    """Tensors created in the main thread, evicted, then read from a plain Python thread."""
    torch.manual_seed(4)
    xs = [torch.randn(64, 64).exp() for _ in range(8)]
    ys = [x @ x for x in xs]
    evict_all()
    out = {}

    def work():
        out["sums"] = [dg(y + 1) for y in ys]
        zs = [y.relu() for y in ys]
        out["z"] = [dg(z.sum(1)) for z in zs]

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out


def set_budget():
    """Train the MLP for 2 steps unlimited, lower the budget at run time, 2 more steps."""
    import models
    m, batches, loss_fn = models.mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    batches = batches + batches[:1]
    losses = []
    info = {}
    for i, b in enumerate(batches):
        if i == 2 and DTR:
            st = json.loads(torch.ops.dtr.stats())
            info["before"] = st["peak_allocated_bytes"]
            try:
                torch.ops.dtr.set_budget(1024)
                info["tiny"] = "accepted"
            except Exception as ex:  # noqa: BLE001
                info["tiny"] = type(ex).__name__ + ": " + str(ex).splitlines()[0][:200]
            info["budget_after_tiny"] = torch.ops.dtr.budget()
            budget = int(st["peak_allocated_bytes"] * 0.95)
            torch.ops.dtr.set_budget(budget)
            torch.ops.dtr.reset_peak()
            info["budget"] = torch.ops.dtr.budget()
        # Gradients zeroed in place (1.x's default) are resident constants; with 2.x's default
        # set_to_none they are fresh, evictable outputs whose replay at opt.step needs the whole
        # backward chain, and 0.95 of this peak is below that floor (issue 16 covers the floor).
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(m, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": losses, "params": [dg(p) for p in m.parameters()]}
    if DTR:
        info["peak_after"] = json.loads(torch.ops.dtr.stats())["peak_reserved_bytes"]
        print("INFO " + json.dumps(info))
    return out


def raw_writes():
    """An empty() buffer filled outside the dispatcher through a pointer dtr does not see (taken
    in C, as C extensions fill buffers: torch._C.StorageBase.data_ptr bypasses dtr's Python
    wrapper), as data loaders do (rule 4). (t.numpy(), Tensor.data_ptr() and a storage's
    data_ptr() from Python are seen: Note [Memory read outside the dispatcher].)"""
    import ctypes
    import numpy as np
    buf = torch.empty(64, 64)
    src = np.random.RandomState(5).rand(64, 64).astype(np.float32)
    ctypes.memmove(torch._C.StorageBase.data_ptr(buf.untyped_storage()), src.ctypes.data, src.nbytes)
    y = buf * 2
    evict_all()
    junk = [torch.full((64, 64), 7.0) for _ in range(4)]  # reuses freed blocks
    return {"buf": dg(buf), "y": dg(y), "sum": dg(buf + 1), "junk": dg(junk[0])}


def layout():
    """A kernel whose output layout is not a function of its inputs, as with backend heuristics
    (rule 5): every second call of aten::neg returns the same values in column-major layout."""
    lib = torch.library.Library("aten", "IMPL")
    calls = [0]

    def neg(x):
        calls[0] += 1
        r = torch.mul(x, -1)
        if calls[0] % 2 == 0 and r.dim() == 2:
            r = r.t().contiguous().t()
        return r

    lib.impl("neg", neg, "CPU")
    torch.manual_seed(6)
    x = torch.randn(64, 32).exp()
    y = -x
    z = y[:, :16]
    evict_all()
    out = {"y": dg(y), "z": dg(z), "ysum": dg(y.sum(0))}
    del lib
    return out


def default_dtype():
    """torch.set_default_dtype between an op and its replay (Note [Global state a replay depends on])."""
    i = torch.arange(64 * 64).reshape(64, 64)
    a = i * 0.5                 # int tensor * float scalar: the default dtype
    b = torch.ones(64, 64) * 3  # a factory without dtype
    torch.set_default_dtype(torch.float64)
    evict_all()
    out = {"a": dg(a), "b": dg(b), "c": dg(torch.ones(2) * a[0, :2])}
    torch.set_default_dtype(torch.float32)
    return out


def train_threads():
    """Two models trained at the same time on two Python threads, sharing the budget: one thread's
    allocations evict the other's activations, which that thread then rematerializes."""
    import models
    jobs = {}
    for name in ("mlp", "cnn"):
        m, batches, loss_fn = models.MODELS[name]()  # built here: construction draws from the global RNG
        jobs[name] = (m, batches * 2, loss_fn, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
    out = {}

    def train(name):
        m, batches, loss_fn, opt = jobs[name]
        losses = []
        try:
            for b in batches:
                opt.zero_grad(set_to_none=False)  # see set_budget: 2.x set_to_none moves the floor
                loss = loss_fn(m, b)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            out[name] = {"losses": losses, "params": [dg(p) for p in m.parameters()]}
        except Exception as ex:  # noqa: BLE001  (reported in the output, compared by the test)
            import traceback
            out[name] = {"error": f"{type(ex).__name__}: {ex}"[:3000], "where": traceback.format_exc()[-1500:]}

    threads = [threading.Thread(target=train, args=(n,)) for n in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def batchnorm_stats():
    """Batch norm updates its running statistics in place without saying so in its 1.13 schema
    (Note [Hidden mutation in native_batch_norm]); eval mode then reads them."""
    import models
    m, batches, loss_fn = models.cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for b in batches[:2]:
        opt.zero_grad()
        loss_fn(m, b).backward()
        opt.step()
        evict_all()
    m.eval()
    with torch.no_grad():
        y = m(batches[2][0])
    evict_all()
    return {"eval_out": dg(y), "buffers": [dg(b) for b in m.buffers()]}


def foreign_memory():
    """Rule 3: only memory dtr's allocator handed out is ever evicted. A tensor over numpy's memory
    keeps it (and its data pointer) while everything computed from it is evicted and replayed."""
    import numpy as np
    arr = np.random.RandomState(9).rand(64, 64).astype(np.float32)
    a = torch.from_numpy(arr)
    b = a.exp()
    c = b * 2
    evict_all()
    return {"a": dg(a), "b": dg(b), "c": dg(c), "a_on_numpy_memory": a.data_ptr() == arr.ctypes.data}


def replaced_memory():
    """Note [Memory replaced under a live storage]: FSDP frees an unsharded parameter's memory
    with untyped_storage().resize_(0) after the forward and refills it later. What was computed
    from the old bytes must never replay from the new ones (here: other values)."""
    w = torch.empty(64, 64)
    w.copy_(torch.randn(64, 64, generator=torch.Generator().manual_seed(3)))  # a constant, as FSDP's
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(4))
    y = torch.tanh(x @ w)
    z = y * 2
    evict_all()
    nbytes = w.untyped_storage().nbytes()
    w.untyped_storage().resize_(0)
    w.untyped_storage().resize_(nbytes)
    w.copy_(torch.zeros(64, 64))
    evict_all()
    return {"y": dg(y), "z": dg(z), "w": dg(w)}


def deaths_while_locked():
    """Tensors die on one thread while another thread is inside an op (holding dtr's lock): their
    deleters hand the memory over and the op's thread releases it (Note [Deleters never wait]).
    Under a budget, so freed segments go back to the system at once and a use of a released
    slot faults instead of reading stale memory. Blocks are 256 KiB: mapped segments."""
    torch.manual_seed(5)
    a = torch.randn(256, 256)
    ys = [a.exp() for _ in range(4)]
    if DTR:
        torch.ops.dtr.set_budget(1 << 40)
    stop = threading.Event()

    def hold():
        while not stop.is_set():
            (a @ a).sum()

    t = threading.Thread(target=hold)
    t.start()
    sums = []
    try:
        for _ in range(3000):
            x = torch.randn(256, 256) * 2  # a recorded output and a recorded temporary, both dying here
            sums.append(float(x.sum()))
            del x
    finally:
        stop.set()
        t.join()
    evict_all()
    return {"sums": dg(torch.tensor(sums)), "ys": [dg(y) for y in ys]}


def dead_then_needed():
    """Storages that die while recorded ops still read them (Note [Deaths released at once]): an
    activation is evicted at its death and must come back, when a reader's replay needs it, into
    memory the engine makes for it; a dead constant (written from numpy, not replayable) read by a
    live recipe keeps its bytes. Everything is evicted, then read back."""
    import numpy as np
    torch.manual_seed(11)
    w = torch.randn(64, 64)
    outs = []
    for i in range(6):
        a = torch.randn(64, 64) * (i + 1)  # recorded: evicted at its death, rebuilt for b's replay
        b = a.tanh()
        k = torch.empty(64, 64)
        k.copy_(torch.from_numpy(np.full((64, 64), 0.25 * i, dtype=np.float32)))  # a constant
        outs.append((b @ w) + k.exp())
        del a, b, k
    evict_all()
    return {"outs": [dg(o) for o in outs]}


def overwritten():
    """Storages made by an unrecorded op (empty) and then filled in full by an in-place op
    (Note [Overwriting in-place ops]): fill_, a random fill with the default generator and with
    its own, nn.init on a parameter-like tensor. They are the only evictable storages here, so
    the evictions and rematerializations the test requires are theirs. A partial fill (through a
    view) keeps its storage a constant."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    m = torch.empty(64, 64).bernoulli_(0.5)
    u = torch.empty(64, 64).uniform_(-1, 1, generator=g)
    f = torch.empty(64, 64).fill_(2.5)
    w = torch.empty(64, 64)
    torch.nn.init.kaiming_uniform_(w)
    p = torch.empty(128)
    p[:64].normal_()
    p[64:].zero_()
    evict_all()
    out = {n: dg(x) for n, x in zip("mufwp", (m, u, f, w, p))}
    out["stream_after"] = dg(torch.rand(16))  # the global stream is unchanged by replays
    return out


def deep_recipes():
    """Recipes that grow past max_replay_depth (1000, Note [Bounded replay chains]): a buffer
    updated in place, one filled in full first (Note [Overwriting in-place ops]) and a functional
    chain. At the limit the runtime drops the op it just recorded; its replay record must be freed
    once (it was freed twice), and the values stay exact."""
    torch.manual_seed(0)
    x = torch.zeros(256)
    y = torch.empty(256).fill_(2.0)
    z = torch.randn(256)
    for _ in range(1100):
        x.add_(1)
        y.mul_(1.0001)
        z = z * 0.999 + 1
    w = x * 2 + y
    evict_all()
    return {"x": dg(x), "y": dg(y), "z": dg(z), "w": dg(w)}


# What a scenario measured of dtr besides its results (only under dtr): printed beside them.
EXTRA = {}


def dtr_counter(name):
    """One of torch.ops.dtr.stats()'s counters (0 without dtr)."""
    return json.loads(torch.ops.dtr.stats())[name] if DTR else 0


def counting(key, counter, make):
    """make()'s result; EXTRA[key] is how far dtr's `counter` moved while it ran."""
    before = dtr_counter(counter)
    out = make()
    EXTRA[key] = dtr_counter(counter) - before
    return out


def counting_short_views(key, make):
    """make()'s result; EXTRA[key] is how many of its views took Note [Views on a short path]."""
    return counting(key, "views_on_short_path", make)


def views_both_paths():
    """Note [Views the dispatcher passes by]: aten's views that read no element (t, view, select,
    unsqueeze, expand, ...) go past dtr's key: none takes a path of dtr's, and one of an evicted
    storage leaves it evicted (the op that reads the view brings it back). Note [Views on a short
    path]: any other view (view.dtype here) of a resident storage dtr tracks takes the short path
    (numpy's memory included: torch.from_numpy's lift_fresh, a view, registered it); one of an
    evicted storage (brought back for it) or of memory no op has read yet (registered by the view)
    takes the general path. Every result reads back as plain PyTorch computes it, a resolved conj
    view's too."""
    import numpy as np
    torch.manual_seed(5)
    w = torch.randn(32, 32)
    y = (torch.randn(32, 32) @ w).tanh()
    passed = counting_short_views("passed", lambda: [y.t(), y.view(-1), y[3], y.unsqueeze(0).expand(2, 32, 32)])
    resident = counting_short_views("resident", lambda: [y.view(torch.int32), y[5].view(torch.int32)])
    evict_all()
    passed_evicted = counting("brought back by a passed view", "rematerializations",  # y stays evicted
                              lambda: counting_short_views("passed evicted", lambda: y.t()))
    evicted = counting_short_views("evicted", lambda: y.view(torch.int32))  # y comes back for it
    n = torch.from_numpy(np.arange(64, dtype=np.float32).reshape(8, 8))  # registered, a constant
    foreign = counting_short_views("foreign", lambda: n.view(torch.int32))
    # No op has read empty's result yet: the view registers it.
    unseen = counting_short_views("unseen", lambda: torch.empty(8, 8).view(torch.int32))
    unseen.fill_(3)
    c = torch.randn(8, 8, dtype=torch.cfloat) * 2
    resolved = c.conj().resolve_conj()
    outs = ([r @ w if r.dim() == 2 else r * 2 for r in passed] + [passed_evicted @ w] +
            [r.bitwise_xor(7) for r in resident] +
            [evicted.bitwise_xor(7), foreign.bitwise_xor(7), unseen * 1, torch.view_as_real(resolved) + 1])
    return {"outs": [dg(o) for o in outs]}


def released_arguments():
    """Every tensor an op took must die with its last Python reference (a reference the fallback
    kept too many would keep it alive, and the weak references below would not clear), through
    ops that run, are evicted and brought back, write in place, return views, throw in their
    kernel, or (under dtr) fail before their kernel runs; the results read back as plain PyTorch's."""
    import gc
    import weakref
    torch.manual_seed(11)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    bias = torch.randn(16)
    refs = [weakref.ref(x), weakref.ref(w), weakref.ref(bias)]
    outs, errors = [], 0
    for i in range(20):
        y = torch.addmm(bias, x, w).sigmoid() * x + w
        v = y.t().detach()
        y.mul_(0.5).add_(x)
        if i % 5 == 0:
            evict_all()  # y and v come back for the next ops
        outs.append(dg(y.mm(w).tanh() - v.sum(1, keepdim=True)))
        for bad in (lambda: torch.mm(x, torch.randn(3, 3)),   # the kernel throws
                    lambda: x.add_(torch.randn(3, 3)),        # an in-place kernel throws
                    lambda: x.view(7, 5)):                    # a view throws
            try:
                bad()
            except RuntimeError:
                errors += 1
        refs.append(weakref.ref(y))
    if DTR:
        # The fallback fails before the op runs: its evicted operand cannot come back within the
        # budget.
        evict_all()
        # What is resident now (constants: x, which a failed add_ wrote) and 64 bytes more.
        torch.ops.dtr.set_budget(json.loads(torch.ops.dtr.stats())["allocated_bytes"] + 64)
        try:
            y * 2
            EXTRA["failed_before_the_op"] = False
        except torch.OutOfMemoryError:
            EXTRA["failed_before_the_op"] = True
        torch.ops.dtr.set_budget(0)
    del x, w, bias, y, v
    gc.collect()
    return {"outs": outs, "errors": errors, "alive": sum(r() is not None for r in refs)}


def gil_holder_beside_ops():
    """One thread runs ops on a tensor Python alone holds (whose kernels take references of their
    inputs under dtr's engine lock) while another holds the GIL through Tensor.numpy() (whose
    detach waits for that lock). Must finish (test_no_deadlock_with_a_thread_holding_the_gil)."""
    import threading
    import time
    torch.manual_seed(3)
    x, y = torch.randn(128, 128), torch.randn(4, 4)
    stop = time.monotonic() + 3
    counts = [0, 0]

    def ops():
        while time.monotonic() < stop:
            x.sum()
            x.pow(2)
            counts[0] += 1

    def numpy():
        while time.monotonic() < stop:
            y.numpy()
            counts[1] += 1

    threads = [threading.Thread(target=ops), threading.Thread(target=numpy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"both_ran": counts[0] > 0 and counts[1] > 0, "sum": dg(x.sum())}


SCENARIOS = dict(rng=rng, views_inplace=views_inplace, multi_output=multi_output, leaving=leaving,
                 threads=threads, set_budget=set_budget, raw_writes=raw_writes, layout=layout,
                 default_dtype=default_dtype, train_threads=train_threads,
                 batchnorm_stats=batchnorm_stats, foreign_memory=foreign_memory,
                 replaced_memory=replaced_memory, deaths_while_locked=deaths_while_locked,
                 overwritten=overwritten, deep_recipes=deep_recipes, dead_then_needed=dead_then_needed,
                 copies_overwritten=copies_overwritten, views_both_paths=views_both_paths,
                 released_arguments=released_arguments, gil_holder_beside_ops=gil_holder_beside_ops)

if __name__ == "__main__":
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)
    res = SCENARIOS[sys.argv[1]]()
    print(json.dumps({"out": res, "dtr": json.loads(torch.ops.dtr.stats()) if DTR else None, "extra": EXTRA}))
