"""Random small PyTorch programs for the property test (test_property.py). A program is a list of
steps, each one line of Python over named slots (s0, s1, ...), fully determined by an integer seed:
random.Random(seed) picks the structure, explicit seeds (gen(k), np.random.RandomState(k),
torch.manual_seed(seed)) the data. The steps mix elementwise ops, matmul, reductions, views,
in-place ops (also through views), out= ops, multi-output ops, numpy round trips and writes, RNG
ops with and without a generator, autograd with optimizers, torch.save/deepcopy/pickle, .item()
and .tolist(), with pressure points (evict_all(), set_budget(fraction)) that only act under dtr.
A program's result is a digest of every live slot at its end (after one more evict_all()), and
the first exception, if any ("step 7: RuntimeError: ..."): a plain run and a run under the
preload must give the same.

  python random_programs.py run --seeds A B [--budget-mode budget|evict|none]   one JSON line a seed
  python random_programs.py run --seed S [--steps i,j,k]   only those steps (a step whose input slot
                                                          was never made is skipped)
  python random_programs.py show --seed S [--steps i,j,k]  the program as Python source
  python random_programs.py serve   requests {"seed": S, "steps": [...] or null} on stdin, one a line
  --drop REGEX leaves out the steps whose source matches (to tell failing categories apart).
The last line of `run` is {"stats": torch.ops.dtr.stats() or null}."""
import copy
import gc
import hashlib
import io
import json
import pickle
import random
import re
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

DTR = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "pin")
MODE = "budget"  # budget: evict_all() and set_budget() act; evict: only evict_all(); none: neither

# ---------------------------------------------------------------- helpers the steps call


def gen(k):
    return torch.Generator().manual_seed(k)


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def npd(arr):
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16] + str(arr.shape)


_budget_active = [False]
_base_reserved = [0]  # bytes reserved when the program started (leaks of earlier programs included)
FLOOR = 1 << 20


def evict_all():
    """Evicts everything evictable (no-op without dtr), then lifts the budget again."""
    if not DTR or MODE == "none":
        return
    try:
        torch.ops.dtr.set_budget(1)  # raises OutOfMemoryError after evicting all it can
    except Exception:  # noqa: BLE001
        pass
    torch.ops.dtr.set_budget(0)
    _budget_active[0] = False


def set_budget(frac):
    """Under dtr, a budget of frac times the bytes this program has reserved so far, at least
    FLOOR (0: unlimited); an infeasible one is lifted again. No-op without dtr."""
    if not DTR or MODE != "budget":
        return
    if frac == 0:
        torch.ops.dtr.set_budget(0)
        _budget_active[0] = False
        return
    reserved = json.loads(torch.ops.dtr.stats())["reserved_bytes"]
    try:
        own = reserved - _base_reserved[0]
        torch.ops.dtr.set_budget(_base_reserved[0] + max(FLOOR, int(own * frac)))
        _budget_active[0] = True
    except Exception:  # noqa: BLE001  (torch.OutOfMemoryError: infeasible now)
        torch.ops.dtr.set_budget(0)
        _budget_active[0] = False


HEADER = '''import copy, hashlib, io, pickle
import numpy as np, torch, torch.nn.functional as F
def gen(k): return torch.Generator().manual_seed(k)
def roundtrip(obj):  # torch.save to memory and torch.load back
    buf = io.BytesIO(); torch.save(obj, buf); buf.seek(0); return torch.load(buf)
def npd(arr): return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16] + str(arr.shape)
def evict_all():  # under dtr: evict everything evictable
    try: torch.ops.dtr.set_budget(1)
    except Exception: pass
    torch.ops.dtr.set_budget(0)
def set_budget(frac):  # under dtr: budget = frac * bytes this program reserved so far, at least 1 MiB
    ...                #   (0: unlimited); lifted again if infeasible
torch.manual_seed(SEED)'''

NS = dict(torch=torch, F=F, np=np, io=io, copy=copy, pickle=pickle, gen=gen, roundtrip=roundtrip,
          npd=npd, evict_all=evict_all, set_budget=set_budget)

# ---------------------------------------------------------------- digests


def dg(x):
    if isinstance(x, torch.Tensor):
        c = x.detach().clone().contiguous()  # through the dispatcher: rematerializes under dtr
        h = hashlib.sha256(c.numpy().tobytes()).hexdigest()[:16]
        return f"{h} {tuple(x.shape)} {str(x.dtype)[6:]} {x.stride()}{' grad' if x.requires_grad else ''}"
    if isinstance(x, np.ndarray):
        return "np " + npd(x) + " " + str(x.dtype)
    if isinstance(x, (bool, int, float, str, np.generic)) or x is None:
        return repr(x)
    if isinstance(x, torch.Generator):
        return "gen " + dg(x.get_state())
    if isinstance(x, torch.optim.Optimizer):
        return "opt " + dg(x.state_dict())
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {dg(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        if all(isinstance(v, (bool, int, float)) or isinstance(v, list) for v in x):  # tolist()
            return "list " + hashlib.sha256(repr(x).encode()).hexdigest()[:16]
        return "[" + ", ".join(dg(v) for v in x) + "]"
    return type(x).__name__

# ---------------------------------------------------------------- programs


SLOT = re.compile(r"\bs(\d+)\b")


class Step:
    """One line of Python. `ins`: the slots it reads (it is skipped when one is missing), `outs`:
    the slots it makes."""
    __slots__ = ("i", "code", "outs", "ins", "cat", "_compiled")

    def __init__(self, i, code, outs, cat):
        self.i, self.code, self.outs, self.cat = i, code, tuple(outs), cat
        self.ins = tuple(sorted({f"s{n}" for n in SLOT.findall(code)} - set(outs), key=lambda s: int(s[1:])))
        self._compiled = None

    def describe(self):
        return self.code

    def compiled(self):
        if self._compiled is None:
            self._compiled = compile(self.code, f"<step {self.i}>", "exec")
        return self._compiled


class M:
    """What the generator knows about a slot. kind: T (tensor), gen, opt, val (anything else),
    np (ndarray), rng (an RNG state tensor), cT (complex view), xT (other tensors: only digested).
    grad: in autograd; leaf: a leaf requiring grad; lv: a leaf or a view of one; ro: no in-place
    writes; ovl: overlapping memory (expand); deps: the leaves a grad tensor depends on; root: the
    slot that made the memory (views, detach(), dlpack and no-op conversions share it)."""
    __slots__ = ("kind", "shape", "dt", "grad", "leaf", "lv", "ro", "ovl", "contig", "deps", "has_grad", "params",
                 "root")

    def __init__(self, kind="T", shape=None, dt="f32", grad=False, leaf=False, lv=False, ro=False, ovl=False,
                 contig=True, deps=frozenset(), params=()):
        self.kind, self.shape, self.dt, self.grad, self.leaf, self.lv = kind, shape, dt, grad, leaf, lv
        self.ro, self.ovl, self.contig, self.deps, self.has_grad, self.params = ro, ovl, contig, deps, False, params
        self.root = None  # the slot whose storage this tensor's memory is (views share it)


FLOATS = ("f32", "f64")
TORCH_DT = {"f32": "torch.float32", "f64": "torch.float64", "i64": "torch.int64", "b": "torch.bool"}
NP_DT = {"f32": "np.float32", "f64": "np.float64", "i64": "np.int64", "b": "np.bool_"}
RANK = {"b": 0, "i64": 1, "f32": 2, "f64": 3}
SIZES = (8, 12, 16, 24, 32, 48, 64)


def promote(*dts):
    return max(dts, key=RANK.get)


def fl(dt):
    return dt in FLOATS


def dtarg(dt):
    return "" if dt == "f32" else f", dtype={TORCH_DT[dt]}"


def S(shape):
    return repr(tuple(shape))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.meta = {}
        self.steps = []
        self.n = 0
        self.dlpacked = set()  # roots with a from_dlpack() alias

    # -- bookkeeping
    def new(self, m):
        name = f"s{self.n}"
        self.n += 1
        self.meta[name] = m
        if m.root is None:
            m.root = name
        return name

    def emit(self, code, outs=(), cat=""):
        self.steps.append(Step(len(self.steps), code, outs, cat))

    def derived(self, ins, shape, dt, contig=True, grad=None):
        ms = [self.meta[a] for a in ins]
        g = any(m.grad for m in ms) if grad is None else grad
        g = g and fl(dt)
        deps = frozenset().union(*[m.deps for m in ms]) if g else frozenset()
        return M(shape=tuple(shape), dt=dt, grad=g, ro=g, contig=contig, deps=deps)

    def view_of(self, a, shape, contig, ovl=False, dt=None):
        m = self.meta[a]
        mo = M(shape=tuple(shape), dt=dt or m.dt, grad=m.grad, lv=m.lv, ro=m.ro, ovl=m.ovl or ovl,
               contig=contig, deps=m.deps)
        mo.root = m.root
        return mo

    def tensors(self, pred=None):
        return [s for s, m in self.meta.items() if m.kind == "T" and m.shape is not None and (pred is None or pred(m))]

    def pick(self, pred=None, exclude=()):
        c = [s for s in self.tensors(pred) if s not in exclude]
        return self.r.choice(c) if c else None

    def writable(self, m):
        return not (m.ro or m.ovl or m.grad)

    def k(self):
        return self.r.randrange(10 ** 6)

    def shape(self):
        r = self.r
        nd = r.choice((1, 2, 2, 2, 3))
        if nd == 1:
            return (r.choice(SIZES),)
        if nd == 2:
            return (r.choice(SIZES), r.choice(SIZES))
        return (r.choice((2, 3, 4)), r.choice((8, 12, 16)), r.choice((8, 12, 16)))

    def scalar(self, dt):
        r = self.r
        if dt == "b":
            return r.choice(("True", "False"))
        if dt == "i64":
            return str(r.randint(-5, 9))
        return r.choice(("0.5", "-1.25", "2.0", "3.0", "0.1", "-0.75", "1e-3"))

    # -- sources
    def source(self, shape=None, dt=None):
        r = self.r
        shape = tuple(self.shape() if shape is None else shape)
        dt = dt or r.choice(("f32", "f32", "f32", "f64", "i64", "b"))
        sh, k = S(shape), self.k()
        out = self.new(M(shape=shape, dt=dt))
        if shape == ():
            if dt == "b":
                code = f"{out} = torch.tensor({self.scalar(dt)})"
            elif dt == "i64":
                code = f"{out} = torch.randint(-9, 9, (), generator=gen({k}))"
            else:
                code = f"{out} = torch.randn((), generator=gen({k}){dtarg(dt)})"
        elif fl(dt):
            code = r.choice((
                f"{out} = torch.randn({sh}, generator=gen({k}){dtarg(dt)})",
                f"{out} = torch.randn({sh}, generator=gen({k}){dtarg(dt)})",
                f"{out} = torch.rand({sh}, generator=gen({k}){dtarg(dt)}) * 2 - 1",
                f"{out} = torch.randn({sh}{dtarg(dt)})",
                f"{out} = torch.rand({sh}{dtarg(dt)})",
                f"{out} = torch.from_numpy(np.random.RandomState({k}).standard_normal({sh}).astype({NP_DT[dt]}))",
                f"{out} = torch.linspace(-3, 3, {numel(shape)}{dtarg(dt)}).reshape({sh})",
                f"{out} = torch.full({sh}, {self.scalar(dt)}{dtarg(dt)})",
                f"{out} = torch.empty({sh}{dtarg(dt)}); {out}.numpy()[...] = np.random.RandomState({k}).standard_normal({sh})",
            ))
        elif dt == "i64":
            code = r.choice((
                f"{out} = torch.randint(-20, 20, {sh}, generator=gen({k}))",
                f"{out} = torch.randint(0, 64, {sh})",
                f"{out} = torch.arange({numel(shape)}).reshape({sh})",
                f"{out} = torch.from_numpy(np.random.RandomState({k}).randint(-50, 50, {sh}).astype(np.int64))",
                f"{out} = torch.randperm({numel(shape)}).reshape({sh})",
            ))
        else:
            code = r.choice((
                f"{out} = torch.rand({sh}, generator=gen({k})) > 0.5",
                f"{out} = torch.randint(0, 2, {sh}).bool()",
                f"{out} = torch.from_numpy(np.random.RandomState({k}).rand(*{sh}) > 0.5)",
            ))
        self.emit(code, [out], "source")
        return out

    def need(self, shape, dt, exclude=(), pred=None, reuse=0.6):
        """A tensor slot of this shape and dtype: an existing one or a new source step."""
        shape = tuple(shape)
        c = self.tensors(lambda m: m.shape == shape and m.dt == dt and (pred is None or pred(m)))
        c = [s for s in c if s not in exclude]
        if c and self.r.random() < reuse:
            return self.r.choice(c)
        return self.source(shape, dt)

    def need_ng(self, shape, dt, exclude=()):
        """need() of a tensor outside autograd (an in-place op's operand)."""
        return self.need(shape, dt, exclude, lambda m: not m.grad)

    # -- categories: each returns False when it found nothing to apply to
    def c_source(self):
        self.source()
        return True

    def c_unary(self, a=None):
        r = self.r
        a = a or self.pick()
        if a is None:
            return False
        m = self.meta[a]
        nd = len(m.shape)
        d = r.randrange(nd) if nd else None
        same = (m.shape, m.dt, m.contig)
        if fl(m.dt):
            c = self.scalar(m.dt)
            ops = [("{a}.sin()",) + same, ("{a}.cos()",) + same, ("torch.tanh({a})",) + same,
                   ("{a}.sigmoid()",) + same, ("F.relu({a})",) + same, ("{a}.exp()",) + same,
                   ("{a}.abs()",) + same, ("-{a}",) + same, ("{a}.abs().sqrt()",) + same,
                   ("torch.log1p({a}.abs())",) + same, (f"{{a}} * {c}",) + same, (f"{{a}} + {c}",) + same,
                   ("{a}.pow(2)",) + same, ("F.gelu({a})",) + same, ("{a}.clamp(-0.5, 0.75)",) + same,
                   ("{a}.floor()",) + same, ("torch.erf({a})",) + same, ("{a}.clone()",) + same,
                   ("{a}.contiguous()", m.shape, m.dt, True), (f"torch.where({{a}} > 0, {{a}}, {c})",) + same,
                   ("{a}.double()", m.shape, "f64", m.contig), ("{a}.float()", m.shape, "f32", m.contig),
                   ("{a}.long()", m.shape, "i64", m.contig), (f"{{a}} > {c}", m.shape, "b", m.contig)]
            if nd:
                ops += [(f"{{a}}.softmax({d})",) + same, (f"F.log_softmax({{a}}, {d})",) + same,
                        (f"{{a}}.cumsum({d})",) + same, (f"{{a}}.flip({d})", m.shape, m.dt, True),
                        (f"{{a}}.roll({r.randint(1, 5)}, {d})", m.shape, m.dt, True)]
        elif m.dt == "i64":
            ops = [("{a} + 3",) + same, ("{a} * -2",) + same, ("{a} % 7",) + same, ("-{a}",) + same,
                   ("{a}.abs()",) + same, ("{a} // 3",) + same, ("{a}.clamp(-4, 6)",) + same,
                   ("{a}.float()", m.shape, "f32", m.contig), ("{a} * 0.5", m.shape, "f32", m.contig),
                   ("{a} > 2", m.shape, "b", m.contig), ("{a}.clone()",) + same, ("{a} & 0xff",) + same]
            if nd:
                ops += [(f"{{a}}.cumsum({d})",) + same]
        else:
            ops = [("~{a}",) + same, ("{a}.long()", m.shape, "i64", m.contig),
                   ("{a}.float()", m.shape, "f32", m.contig), ("{a}.logical_not()",) + same,
                   ("{a}.clone()",) + same]
        t, shape, dt, contig = r.choice(ops)
        mo = self.derived([a], shape, dt, contig)
        if t in ("{a}.double()", "{a}.float()", "{a}.long()", "{a}.contiguous()") and dt == m.dt and contig == m.contig:
            mo.root = m.root  # returns the tensor itself
        out = self.new(mo)
        self.emit(f"{out} = " + t.format(a=a), [out], "unary")
        return True

    def c_binary(self, a=None):
        r = self.r
        a = a or self.pick()
        if a is None:
            return False
        m = self.meta[a]
        shapes = [m.shape] * 3
        if m.shape:
            shapes += [m.shape[-1:], m.shape[:-1] + (1,)]
        bshape = r.choice(shapes)
        if fl(m.dt):
            bdt = r.choice((m.dt,) * 4 + ("f32", "f64", "i64"))
            ops = ["+", "-", "*", "/", "max", "min", "add", ">", "=="]
            if fl(bdt):
                ops += ["atan2"]
            if bdt == m.dt:
                ops += ["lerp"]
        elif m.dt == "i64":
            bdt = r.choice(("i64", "i64", "i64", "f32", "b"))
            ops = ["+", "*", "max", "min", ">", "=="] + (["-", "%"] if bdt == "i64" else [])
        else:
            bdt = r.choice(("b", "b", "i64"))
            ops = ["&", "|", "^"] if bdt == "b" else ["+", "*"]
        b = self.need(bshape, bdt)
        x, y = (a, b) if r.random() < 0.8 or bshape != m.shape else (b, a)
        op = r.choice(ops)
        dt = promote(m.dt, bdt)
        contig = m.contig and self.meta[b].contig
        if op in "+-*&|^":
            e = f"{x} {op} {y}"
        elif op == "/":
            e, dt = f"{x} / {y}", promote(dt, "f32")
        elif op in ("max", "min"):
            e = f"torch.{op}imum({x}, {y})"
        elif op == "add":
            e = f"torch.add({x}, {y}, alpha={self.scalar(dt)})"
        elif op in (">", "=="):
            e, dt = f"{x} {op} {y}", "b"
        elif op == "atan2":
            e = f"torch.atan2({x}, {y})"
        elif op == "lerp":
            e = f"torch.lerp({x}, {y}, 0.3)"
        else:  # %
            e = f"{x} % ({y}.abs() + 1)"
        out = self.new(self.derived([a, b], m.shape, dt, contig))
        self.emit(f"{out} = {e}", [out], "binary")
        return True

    def c_matmul(self, a=None):
        r = self.r
        a = a or self.pick(lambda m: fl(m.dt) and 1 <= len(m.shape) <= 3)
        if a is None or not 1 <= len(self.meta[a].shape) <= 3:
            return False
        m = self.meta[a]
        dt, sh = m.dt, m.shape
        n = r.choice(SIZES)
        if len(sh) == 1:
            (k,) = sh
            kind = r.choice(("dot", "vm", "outer"))
            if kind == "dot":
                b = self.need((k,), dt)
                e, shape = f"torch.dot({a}, {b})", ()
            elif kind == "vm":
                b = self.need((k, n), dt)
                e, shape = f"{a} @ {b}", (n,)
            else:
                b = self.need((n,), dt)
                e, shape = f"torch.outer({a}, {b})", (k, n)
            ins = [a, b]
        elif len(sh) == 2:
            mm_, k = sh
            kind = r.choice(("mm", "@", "matmul", "einsum", "addmm", "mv", "gram", "linear"))
            if kind == "mv":
                b = self.need((k,), dt)
                e, shape, ins = f"torch.mv({a}, {b})", (mm_,), [a, b]
            elif kind == "gram":
                e, shape, ins = f"{a} @ {a}.t()", (mm_, mm_), [a]
            elif kind == "linear":
                w = self.need((n, k), dt)
                bias = self.need((n,), dt) if r.random() < 0.6 else None
                e = f"F.linear({a}, {w}, {bias})" if bias else f"F.linear({a}, {w})"
                shape, ins = (mm_, n), [a, w] + ([bias] if bias else [])
            else:
                b = self.need((k, n), dt)
                shape, ins = (mm_, n), [a, b]
                if kind == "addmm":
                    c = self.need(r.choice(((mm_, n), (n,))), dt)
                    e, ins = f"torch.addmm({c}, {a}, {b}, beta=0.5, alpha=2.0)", ins + [c]
                elif kind == "einsum":
                    e = f"torch.einsum('ij,jk->ik', {a}, {b})"
                elif kind == "@":
                    e = f"{a} @ {b}"
                else:
                    e = f"torch.{kind}({a}, {b})"
        else:
            bb, mm_, k = sh
            if r.random() < 0.5:
                b = self.need((bb, k, n), dt)
                e = f"torch.bmm({a}, {b})"
            else:
                b = self.need((k, n), dt)
                e = f"torch.matmul({a}, {b})"
            shape, ins = (bb, mm_, n), [a, b]
        out = self.new(self.derived(ins, shape, dt))
        self.emit(f"{out} = {e}", [out], "matmul")
        return True

    def c_reduce(self, a=None):
        r = self.r
        a = a or self.pick()
        if a is None:
            return False
        m = self.meta[a]
        nd = len(m.shape)
        if nd == 0:
            t, shape, dt = "{a}.sum()", (), ("i64" if m.dt == "b" else m.dt)
        else:
            d = r.randrange(nd)
            rest = m.shape[:d] + m.shape[d + 1:]
            keep = m.shape[:d] + (1,) + m.shape[d + 1:]
            if fl(m.dt):
                ops = [(f"{{a}}.sum({d})", rest, m.dt), ("{a}.sum()", (), m.dt),
                       (f"{{a}}.mean({d}, keepdim=True)", keep, m.dt), (f"{{a}}.amax({d})", rest, m.dt),
                       (f"{{a}}.norm(dim={d})", rest, m.dt), (f"{{a}}.var({d})", rest, m.dt),
                       (f"torch.logsumexp({{a}}, {d})", rest, m.dt), (f"{{a}}.argmax({d})", rest, "i64"),
                       (f"{{a}}.prod({d})", rest, m.dt), ("{a}.max()", (), m.dt), ("{a}.std()", (), m.dt)]
            elif m.dt == "i64":
                ops = [(f"{{a}}.sum({d})", rest, "i64"), (f"{{a}}.amax({d})", rest, "i64"),
                       (f"{{a}}.argmin({d})", rest, "i64"), ("{a}.max()", (), "i64"),
                       (f"{{a}}.float().mean({d})", rest, "f32")]
            else:
                ops = [(f"{{a}}.any({d})", rest, "b"), (f"{{a}}.all({d})", rest, "b"),
                       (f"{{a}}.sum({d})", rest, "i64"), (f"torch.count_nonzero({{a}}, {d})", rest, "i64")]
            t, shape, dt = r.choice(ops)
        out = self.new(self.derived([a], shape, dt, contig=m.contig))
        self.emit(f"{out} = " + t.format(a=a), [out], "reduce")
        return True

    def c_view(self, a=None):
        r = self.r
        a = a or self.pick(lambda m: len(m.shape) >= 1)
        if a is None or not self.meta[a].shape:
            return False
        m = self.meta[a]
        sh, nd = m.shape, len(m.shape)
        d = r.randrange(nd)
        n = sh[d]
        choices = ["reshape", "narrow", "slice", "select", "unsqueeze", "expand", "detach", "split", "flatten"]
        if m.contig:
            choices += ["view", "view", "as_strided"]
        if nd >= 2:
            choices += ["transpose", "transpose", "slice2", "diagonal" if nd == 2 else "permute"]
        kind = r.choice(choices)
        targets = [(numel(sh),)]
        if nd >= 2:
            targets.append((sh[0] * sh[1],) + sh[2:])
        if sh[0] % 2 == 0:
            targets.append((2, sh[0] // 2) + sh[1:])
        tgt = r.choice(targets)
        outs = None
        if kind == "view":
            e, mo = f"{a}.view({S(tgt)[1:-1].rstrip(',') if len(tgt) > 1 else tgt[0]})", self.view_of(a, tgt, True)
        elif kind == "reshape":
            e, mo = f"{a}.reshape({S(tgt)})", self.view_of(a, tgt, m.contig)
        elif kind == "flatten":
            e, mo = f"{a}.flatten()", self.view_of(a, (numel(sh),), m.contig)
        elif kind == "narrow":
            ln = r.randint(1, n)
            st = r.randint(0, n - ln)
            e, mo = f"{a}.narrow({d}, {st}, {ln})", self.view_of(a, sh[:d] + (ln,) + sh[d + 1:], m.contig and d == 0)
        elif kind == "slice":  # of the first dimension
            i = r.randint(0, sh[0] - 1)
            j = r.randint(i + 1, sh[0])
            e, mo = f"{a}[{i}:{j}]", self.view_of(a, (j - i,) + sh[1:], m.contig)
        elif kind == "slice2":
            n1 = sh[1]
            i = r.randint(0, n1 - 1)
            j = r.randint(i + 1, n1)
            step = r.choice((1, 2, 3))
            ln = len(range(i, j, step))
            e, mo = f"{a}[:, {i}:{j}:{step}]", self.view_of(a, (sh[0], ln) + sh[2:], False)
        elif kind == "select":
            i = r.randrange(n)
            if d == 0 and r.random() < 0.5:
                e = f"{a}[{i}]"
            else:
                e = f"{a}.select({d}, {i})"
            mo = self.view_of(a, sh[:d] + sh[d + 1:], m.contig and d == 0)
        elif kind == "unsqueeze":
            d2 = r.randint(0, nd)
            e, mo = f"{a}.unsqueeze({d2})", self.view_of(a, sh[:d2] + (1,) + sh[d2:], m.contig)
        elif kind == "expand":
            k = r.choice((2, 3, 4))
            e = f"{a}.unsqueeze(0).expand({k}, {', '.join(map(str, sh))})"
            mo = self.view_of(a, (k,) + sh, False, ovl=True)
        elif kind == "detach":
            e, mo = f"{a}.detach()", self.view_of(a, sh, m.contig)
            mo.grad, mo.deps, mo.ro = False, frozenset(), m.ro or m.grad
        elif kind == "transpose":
            d1, d2 = r.sample(range(nd), 2)
            e = f"{a}.t()" if nd == 2 and r.random() < 0.5 else f"{a}.transpose({d1}, {d2})"
            ns = list(sh)
            ns[d1], ns[d2] = ns[d2], ns[d1]
            mo = self.view_of(a, ns, False)
        elif kind == "permute":
            p = list(range(nd))
            r.shuffle(p)
            e, mo = f"{a}.permute({', '.join(map(str, p))})", self.view_of(a, [sh[i] for i in p], p == sorted(p) and m.contig)
        elif kind == "diagonal":
            e, mo = f"{a}.diagonal()", self.view_of(a, (min(sh),), False)
        elif kind == "as_strided":
            N = numel(sh)
            c = r.randint(1, min(8, N))
            rs = r.randint(c, c + 4)
            rows = max(1, min(8, (N - c) // rs + 1))
            e = f"{a}.as_strided(({rows}, {c}), ({rs}, 1))"
            mo = self.view_of(a, (rows, c), rs == c)
        else:  # split / chunk / unbind: several views
            form = r.choice(("split", "chunk", "unbind"))
            if form == "unbind" and n > 8:
                form = "chunk"
            if form == "split":
                k = r.randint(1, n)
                sizes = [k] * (n // k) + ([n % k] if n % k else [])
                e = f"{a}.split({k}, {d})"
            elif form == "chunk":
                c = r.randint(2, 4)
                cs = -(-n // c)
                sizes = [cs] * (n // cs) + ([n % cs] if n % cs else [])
                e = f"{a}.chunk({c}, {d})"
            else:
                sizes = [None] * n
                e = f"{a}.unbind({d})"
            if len(sizes) > 8:
                sizes = sizes[:8]
                e = e.replace(f"{a}.", f"{a}.narrow({d}, 0, {sum(sizes)}).") if None not in sizes else e
            outs = []
            for s in sizes:
                osh = sh[:d] + sh[d + 1:] if s is None else sh[:d] + (s,) + sh[d + 1:]
                outs.append(self.new(self.view_of(a, osh, m.contig and d == 0)))
            self.emit(f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {e}", outs, "view")
            return True
        out = self.new(mo)
        self.emit(f"{out} = {e}", [out], "view")
        return True

    def c_multi(self, a=None):
        r = self.r
        a = a or self.pick(lambda m: m.dt != "b" and len(m.shape) >= 1)
        if a is None or not self.meta[a].shape or self.meta[a].dt == "b":
            return False
        m = self.meta[a]
        sh = m.shape
        d = r.randrange(len(sh))
        n = sh[d]
        rest = sh[:d] + sh[d + 1:]
        keep = sh[:d] + (1,) + sh[d + 1:]
        k = r.randint(1, min(n, 6))
        ops = [(f"torch.max({a}, {d})", [(rest, m.dt), (rest, "i64")]),
               (f"torch.min({a}, {d})", [(rest, m.dt), (rest, "i64")]),
               (f"{a}.topk({k}, {d})", [(sh[:d] + (k,) + sh[d + 1:], m.dt), (sh[:d] + (k,) + sh[d + 1:], "i64")]),
               (f"{a}.sort({d}, descending={r.random() < 0.5})", [(sh, m.dt), (sh, "i64")]),
               (f"torch.sort({a}, dim={d}, stable=True)", [(sh, m.dt), (sh, "i64")]),
               (f"torch.aminmax({a}, dim={d})", [(rest, m.dt), (rest, m.dt)]),
               (f"torch.kthvalue({a}, {k}, {d})", [(rest, m.dt), (rest, "i64")]),
               (f"torch.cummax({a}, {d})", [(sh, m.dt), (sh, "i64")])]
        if not m.ovl:  # median over an expand()ed dimension gives garbage in plain PyTorch (2.13, 2.14)
            ops.append((f"{a}.median({d})", [(rest, m.dt), (rest, "i64")]))
        if fl(m.dt):
            ops += [(f"torch.std_mean({a}, {d})", [(rest, m.dt), (rest, m.dt)]),
                    (f"torch.var_mean({a}, {d}, keepdim=True)", [(keep, m.dt), (keep, m.dt)])]
        e, shapes = r.choice(ops)
        outs = [self.new(self.derived([a], s, dt, grad=m.grad and dt != "i64")) for s, dt in shapes]
        self.emit(f"{', '.join(outs)} = {e}", outs, "multi")
        return True

    def c_inplace(self):
        r = self.r
        t = self.pick(self.writable)
        if t is None:
            return False
        m = self.meta[t]
        sh, nd, dt = m.shape, len(m.shape), m.dt

        def bshape():
            return r.choice([sh, sh] + ([sh[-1:]] if nd else []))

        ops = ["copy", "zero", "fill", "masked_fill"]
        if nd:
            ops += ["slice_set", "slice_set_t", "index_fill"]
        if dt != "b":
            ops += ["add", "add", "mul", "mul_t", "clamp", "iadd", "foreach"]
            if nd:
                ops += ["index_add"]
        if fl(dt):
            ops += ["sub", "div", "sin", "relu", "sigmoid", "addcmul", "lerp", "neg", "pow"]
        elif dt == "i64":
            ops += ["rem", "neg"]
        else:
            ops += ["not", "and"]
        op = r.choice(ops)
        x = self.scalar(dt)
        if op == "copy":
            b = self.need_ng(bshape(), r.choice((dt, dt, "f32", "i64", "f64")), exclude=(t,))
            code = f"{t}.copy_({b})"
        elif op == "zero":
            code = f"{t}.zero_()"
        elif op == "fill":
            code = f"{t}.fill_({x})"
        elif op == "masked_fill":
            mk = self.need_ng(bshape(), "b")
            code = f"{t}.masked_fill_({mk}, {x})"
        elif op == "slice_set":
            i = r.randrange(sh[0])
            code = f"{t}[{i}:{r.randint(i + 1, sh[0])}] = {x}"
        elif op == "slice_set_t":
            i = r.randrange(sh[0])
            j = r.randint(i + 1, sh[0])
            b = self.need_ng(((j - i),) + sh[1:], dt, exclude=(t,))
            code = f"{t}[{i}:{j}] = {b}"
        elif op == "index_fill":
            d = r.randrange(nd)
            idx = r.sample(range(sh[d]), r.randint(1, min(4, sh[d])))
            code = f"{t}.index_fill_({d}, torch.tensor({idx}), {x})"
        elif op in ("add", "sub", "mul_t", "iadd"):
            bdt = r.choice((dt,) * 3 + (("f32", "f64", "i64") if fl(dt) else ("i64",)))
            b = self.need_ng(bshape(), bdt, exclude=(t,))
            if op == "add":
                code = f"{t}.add_({b}, alpha={self.scalar('i64' if dt == 'i64' else 'f32')})"
            elif op == "sub":
                code = f"{t}.sub_({b})"
            elif op == "mul_t":
                code = f"{t}.mul_({b})"
            else:
                code = f"{t} += {b}"
        elif op == "mul":
            code = f"{t}.mul_({x})"
        elif op == "div":
            code = f"{t}.div_({r.choice(('2.0', '-3.0', '0.5'))})"
        elif op == "clamp":
            code = f"{t}.clamp_(-1, 2)" if r.random() < 0.7 else f"{t}.clamp_(min=0)"
        elif op == "foreach":
            t2 = self.pick(lambda mm: self.writable(mm) and mm.dt == dt, exclude=(t,))
            if t2 is None:
                code = f"{t}.mul_({x})"
            else:
                code = f"torch._foreach_mul_([{t}, {t2}], {x})" if r.random() < 0.5 else \
                       f"torch._foreach_add_([{t}, {t2}], [{self.need_ng(sh, dt, exclude=(t,))}, {self.need_ng(self.meta[t2].shape, dt, exclude=(t2,))}])"
        elif op == "index_add":
            d = r.randrange(nd)
            idx = [r.randrange(sh[d]) for _ in range(r.randint(1, 6))]
            src = self.need_ng(sh[:d] + (len(idx),) + sh[d + 1:], dt, exclude=(t,))
            code = f"{t}.index_add_({d}, torch.tensor({idx}), {src})"
        elif op in ("sin", "relu", "sigmoid", "neg", "not"):
            code = f"{t}.{'logical_not' if op == 'not' else op}_()"
        elif op == "pow":
            code = f"{t}.pow_(2)"
        elif op == "addcmul":
            b = self.need_ng(bshape(), dt, exclude=(t,))
            c = self.need_ng(bshape(), dt, exclude=(t,))
            code = f"{t}.addcmul_({b}, {c}, value=0.5)"
        elif op == "lerp":
            b = self.need_ng(sh, dt, exclude=(t,))
            code = f"{t}.lerp_({b}, 0.25)"
        elif op == "rem":
            code = f"{t}.remainder_(7)"
        else:  # and
            b = self.need_ng(bshape(), "b", exclude=(t,))
            code = f"{t}.logical_and_({b})"
        self.emit(code, [], "inplace")
        return True

    def c_out(self):
        r = self.r
        if r.random() < 0.4:  # into a fresh empty(0), resized by the op
            dt = r.choice(FLOATS)
            out = self.new(M(dt=dt))
            kind = r.choice(("mm", "add", "sum", "sin"))
            sh = self.shape() if kind != "mm" else (r.choice(SIZES), r.choice(SIZES))
            if kind == "mm":
                k = r.choice(SIZES)
                a, b = self.need_ng((sh[0], k), dt), self.need_ng((k, sh[1]), dt)
                e = f"torch.mm({a}, {b}, out={out})"
            elif kind == "add":
                a, b = self.need_ng(sh, dt), self.need_ng(sh, dt)
                e = f"torch.add({a}, {b}, alpha=2, out={out})"
            elif kind == "sin":
                a = self.need_ng(sh, dt)
                e = f"torch.sin({a}, out={out})"
            else:
                a = self.need_ng(sh + (8,), dt)
                e = f"torch.sum({a}, {len(sh)}, out={out})"
            self.meta[out].shape = sh
            self.emit(f"{out} = torch.empty(0{dtarg(dt)}); {e}", [out], "out")
            return True
        t = self.pick(lambda m: self.writable(m) and m.dt != "b")
        if t is None:
            return False
        m = self.meta[t]
        sh, dt = m.shape, m.dt
        kinds = ["add", "mul", "clamp"]
        if fl(dt):
            kinds += ["sin"]
            if len(sh) == 2:
                kinds += ["mm", "mm"]
        if len(sh) >= 1:
            kinds += ["sum"]
            if sh[0] % 2 == 0:
                kinds += ["cat"]
        kind = r.choice(kinds)
        ex = (t,)
        nograd = lambda mm: not mm.grad  # noqa: E731  (out= ops do not differentiate)
        if kind in ("add", "mul"):
            a, b = self.need(sh, dt, ex, nograd), self.need(r.choice([sh, sh[-1:]]), dt, ex, nograd)
            e = f"torch.{kind}({a}, {b}, out={t})"
        elif kind == "clamp":
            e = f"torch.clamp({self.need(sh, dt, ex, nograd)}, -1, 1, out={t})"
        elif kind == "sin":
            e = f"torch.sin({self.need(sh, dt, ex, nograd)}, out={t})"
        elif kind == "mm":
            k = r.choice(SIZES)
            e = f"torch.mm({self.need((sh[0], k), dt, ex, nograd)}, {self.need((k, sh[1]), dt, ex, nograd)}, out={t})"
        elif kind == "sum":
            d = r.randint(0, len(sh))
            e = f"torch.sum({self.need(sh[:d] + (r.choice((2, 8)),) + sh[d:], dt, ex, nograd)}, {d}, out={t})"
        else:
            h = (sh[0] // 2,) + sh[1:]
            e = f"torch.cat([{self.need(h, dt, ex, nograd)}, {self.need(h, dt, ex, nograd)}], 0, out={t})"
        self.emit(e, [], "out")
        return True

    def c_numpy(self):
        r = self.r
        kind = r.choice(("read", "read", "sum", "copy", "write", "write", "write", "from", "npwrite"))
        if kind in ("read", "sum", "copy"):
            a = self.pick()
            if a is None:
                return False
            m = self.meta[a]
            src = f"{a}.detach()" if m.grad else a
            out = self.new(M(kind="val"))
            if kind == "read":
                code = f"{out} = npd({src}.numpy())" if r.random() < 0.7 else f"{out} = npd(np.asarray({src}))"
            elif kind == "sum":
                code = f"{out} = float({src}.numpy().astype(np.float64).sum())"
            else:
                self.meta[out] = M(kind="np", shape=m.shape, dt=m.dt)
                code = f"{out} = {src}.numpy().copy()"
            self.emit(code, [out], "numpy")
            return True
        if kind == "write":
            t = self.pick(self.writable)
            if t is None:
                return False
            m = self.meta[t]
            sh = m.shape
            idx = "[...]"
            if sh and r.random() < 0.5:
                i = r.randrange(sh[0])
                idx = f"[{i}:{r.randint(i + 1, sh[0])}]"
            if m.dt == "b":
                v = "True"
            elif r.random() < 0.4:
                v = self.scalar(m.dt)
            elif m.dt == "i64":
                v = f"np.random.RandomState({self.k()}).randint(-9, 9, {S(sh)}){idx}"
            else:
                v = f"np.random.RandomState({self.k()}).standard_normal({S(sh)}){idx}"
            if m.dt != "b" and r.random() < 0.2:
                self.emit(f"{t}.numpy(){idx} *= 2", [], "numpy")
            else:
                self.emit(f"{t}.numpy(){idx} = {v}", [], "numpy")
            return True
        arrs = [s for s, m in self.meta.items() if m.kind == "np"]
        if not arrs:
            return False
        arr = r.choice(arrs)
        am = self.meta[arr]
        if kind == "npwrite":
            self.emit(f"{arr}[...] {'^= True' if am.dt == 'b' else '+= 1'}", [], "numpy")
            return True
        out = self.new(M(shape=am.shape, dt=am.dt))
        how = r.choice(("torch.from_numpy", "torch.as_tensor", "torch.tensor"))
        self.emit(f"{out} = {how}({arr})", [out], "numpy")
        return True

    def gens(self):
        return [s for s, m in self.meta.items() if m.kind == "gen"]

    def c_rng(self):
        r = self.r
        kind = r.choice(("like", "dropout", "bern_", "bern", "randperm", "normal", "multinomial", "gen",
                         "gen_randn", "fill_", "randint"))
        g = r.choice(self.gens()) if self.gens() and r.random() < 0.6 else None
        garg = f", generator={g}" if g else ""
        if kind == "gen":
            out = self.new(M(kind="gen"))
            self.emit(f"{out} = torch.Generator().manual_seed({self.k()})", [out], "rng")
            return True
        if kind in ("randperm", "gen_randn", "randint"):
            sh = self.shape()
            if kind == "randperm":
                n = r.choice(SIZES)
                sh = (n,)
                e = f"torch.randperm({n}{garg})"
                dt = "i64"
            elif kind == "randint":
                e, dt = f"torch.randint(0, 10, {S(sh)}{garg})", "i64"
            else:
                dt = r.choice(FLOATS)
                e = f"torch.randn({S(sh)}{garg}{dtarg(dt)})"
            out = self.new(M(shape=sh, dt=dt))
            self.emit(f"{out} = {e}", [out], "rng")
            return True
        if kind in ("bern_", "fill_"):
            t = self.pick(lambda m: self.writable(m) and fl(m.dt))
            if t is None:
                return False
            if kind == "bern_":
                code = f"{t}.bernoulli_({r.choice(('0.5', '0.2', '0.9'))}{garg})"
            else:
                code = r.choice((f"{t}.uniform_(-1, 1{garg})", f"{t}.normal_({garg[2:]})",
                                 f"{t}.exponential_({garg[2:]})", f"{t}.random_(0, 10{garg})"))
            self.emit(code, [], "rng")
            return True
        a = self.pick(lambda m: fl(m.dt) and (kind != "multinomial" or len(m.shape) in (1, 2)))
        if a is None:
            return False
        m = self.meta[a]
        if kind == "like":
            e, grad = r.choice((f"torch.randn_like({a})", f"torch.rand_like({a})")), False
        elif kind == "dropout":
            e, grad = f"F.dropout({a}, {r.choice(('0.5', '0.1', '0.3'))}, training=True)", None
        elif kind == "bern":
            e, grad = f"torch.bernoulli({a}.sigmoid(){garg})", False
        elif kind == "normal":
            e, grad = f"torch.normal({a}, 0.5{garg})", False
        else:
            k = r.randint(1, 6)
            out = self.new(M(shape=m.shape[:-1] + (k,), dt="i64"))
            self.emit(f"{out} = torch.multinomial({a}.detach().abs() + 0.1, {k}, replacement=True{garg})", [out], "rng")
            return True
        out = self.new(self.derived([a], m.shape, m.dt, contig=m.contig, grad=grad))
        self.emit(f"{out} = {e}", [out], "rng")
        return True

    def c_autograd(self):
        r = self.r
        leaves = [s for s, m in self.meta.items() if m.kind == "T" and m.leaf]
        graph = self.tensors(lambda m: m.grad)
        opts = [s for s, m in self.meta.items() if m.kind == "opt"]
        kinds = ["param"] * 2
        if graph:
            kinds += ["op"] * 6 + ["backward"] * 3 + ["agrad", "checkpoint", "inplace"]
        if any(self.meta[p].has_grad for p in leaves):
            kinds += ["readgrad"] * 2 + ["opt"] * 2 + ["manual"]
        if opts:
            kinds += ["step"] * 3 + ["zero"]
        kind = r.choice(kinds)
        if kind == "param":
            dt = r.choice(("f32", "f32", "f64"))
            sh = self.shape()
            out = self.new(M(shape=sh, dt=dt, grad=True, leaf=True, lv=True, ro=True))
            self.meta[out].deps = frozenset([out])
            src = self.tensors(lambda m: not m.grad and m.dt == dt and m.shape == sh)
            if src and r.random() < 0.3:
                self.emit(f"{out} = {r.choice(src)}.detach().clone().requires_grad_()", [out], "autograd")
            elif r.random() < 0.3:
                self.emit(f"{out} = torch.nn.Parameter(torch.rand({S(sh)}, generator=gen({self.k()}){dtarg(dt)}))",
                          [out], "autograd")
            else:
                self.emit(f"{out} = torch.randn({S(sh)}, generator=gen({self.k()}){dtarg(dt)}).requires_grad_()",
                          [out], "autograd")
            return True
        if kind == "op":
            y = r.choice(graph)
            f = r.choice((self.c_unary, self.c_unary, self.c_binary, self.c_matmul, self.c_reduce, self.c_view,
                          self.c_multi))
            return f(y)
        if kind == "backward":
            y = r.choice(graph)
            for p in self.meta[y].deps:
                if p in self.meta:
                    self.meta[p].has_grad = True
            if r.random() < 0.6:
                out = self.new(M(shape=(), dt=self.meta[y].dt, grad=True, ro=True, deps=self.meta[y].deps))
                self.emit(f"{out} = ({y} ** 2).mean(); {out}.backward(retain_graph=True)", [out], "autograd")
            else:
                self.emit(f"{y}.sum().backward(retain_graph=True)", [], "autograd")
            return True
        if kind == "agrad":
            y = r.choice(graph)
            deps = sorted((p for p in self.meta[y].deps if p in self.meta), key=lambda s: int(s[1:]))
            if not deps:
                return False
            p = r.choice(deps)
            out = self.new(M(shape=self.meta[p].shape, dt=self.meta[p].dt))
            self.emit(f"{out}, = torch.autograd.grad(({y} ** 2).sum(), [{p}], retain_graph=True)", [out], "autograd")
            return True
        if kind == "checkpoint":
            y = r.choice([g for g in graph if fl(self.meta[g].dt)])
            m = self.meta[y]
            fn = r.choice(("lambda x: F.dropout(x.sin(), 0.3) * 2", "lambda x: torch.tanh(x) * x.exp().clamp(max=5)"))
            out = self.new(self.derived([y], m.shape, m.dt, m.contig))
            self.emit(f"{out} = torch.utils.checkpoint.checkpoint({fn}, {y}, use_reentrant=False)", [out], "autograd")
            return True
        if kind == "inplace":
            c = [g for g in graph if not self.meta[g].lv and not self.meta[g].ovl and not self.meta[g].leaf]
            if not c:
                return False
            y = r.choice(c)
            self.emit(r.choice((f"{y}.mul_(0.5)", f"{y}.add_(1)", f"{y}.clamp_(-1, 1)")), [], "autograd")
            return True
        with_grad = [p for p in leaves if self.meta[p].has_grad]
        if kind == "readgrad":
            p = r.choice(with_grad)
            out = self.new(M(shape=self.meta[p].shape, dt=self.meta[p].dt))
            self.emit(f"{out} = {p}.grad", [out], "autograd")
            return True
        if kind == "manual":
            p = r.choice(with_grad)
            self.emit(r.choice((f"with torch.no_grad(): {p}.sub_({p}.grad, alpha=0.1)", f"{p}.data.mul_(0.5)")),
                      [], "autograd")
            return True
        if kind == "opt":
            ps = r.sample(with_grad, min(len(with_grad), r.randint(1, 3)))
            ps += [p for p in r.sample(leaves, min(len(leaves), r.randint(0, 1))) if p not in ps]
            out = self.new(M(kind="opt", params=tuple(ps)))
            plist = "[" + ", ".join(ps) + "]"
            if r.random() < 0.6:
                fe = ", foreach=True" if r.random() < 0.4 else ""
                self.emit(f"{out} = torch.optim.SGD({plist}, lr=0.1, momentum=0.9{fe})", [out], "autograd")
            else:
                self.emit(f"{out} = torch.optim.Adam({plist}, lr=0.01)", [out], "autograd")
            return True
        o = r.choice(opts)
        if kind == "step":
            self.emit(f"{o}.step()", [], "autograd")
        else:
            if r.random() < 0.5:
                self.emit(f"{o}.zero_grad()", [], "autograd")
                for p in self.meta[o].params:
                    if p in self.meta:
                        self.meta[p].has_grad = False
            else:
                self.emit(f"{o}.zero_grad(set_to_none=False)", [], "autograd")
        return True

    def c_save(self):
        r = self.r
        kind = r.choice(("rt", "rt", "pair", "dict", "deepcopy", "pickle", "optstate"))
        if kind == "optstate":
            opts = [s for s, m in self.meta.items() if m.kind == "opt"]
            if not opts:
                return False
            out = self.new(M(kind="val"))
            self.emit(f"{out} = roundtrip({r.choice(opts)}.state_dict())", [out], "save")
            return True
        a = self.pick(lambda m: not m.grad or m.leaf)
        if a is None:
            return False
        m = self.meta[a]

        def copy_meta():
            mo = M(shape=m.shape, dt=m.dt, grad=m.leaf, leaf=m.leaf, lv=m.leaf, ro=m.leaf or m.ovl, ovl=m.ovl,
                   contig=m.contig)
            return mo

        if kind == "pair":
            b = self.pick(lambda mm: not mm.grad, exclude=(a,))
            if b is None:
                return False
            outs = [self.new(copy_meta()), self.new(M())]
            mb = self.meta[b]
            self.meta[outs[1]] = M(shape=mb.shape, dt=mb.dt, ro=mb.ro or mb.ovl, ovl=mb.ovl, contig=mb.contig)
            self.meta[outs[1]].root = outs[1]
            how = r.choice(("roundtrip", "copy.deepcopy"))
            self.emit(f"{outs[0]}, {outs[1]} = {how}(({a}, {b}))", outs, "save")
            for o in outs:
                if self.meta[o].leaf:
                    self.meta[o].deps = frozenset([o])
            return True
        out = self.new(copy_meta())
        if m.leaf:
            self.meta[out].deps = frozenset([out])
        if kind == "rt":
            e = f"roundtrip({a})"
        elif kind == "dict":
            e = f"roundtrip({{'x': {a}, 'n': 3}})['x']"
        elif kind == "deepcopy":
            e = f"copy.deepcopy({a})"
        else:
            e = f"pickle.loads(pickle.dumps({a}))"
        self.emit(f"{out} = {e}", [out], "save")
        return True

    def c_item(self):
        r = self.r
        a = self.pick()
        if a is None:
            return False
        m = self.meta[a]
        src = f"{a}.detach()" if m.grad else a
        out = self.new(M(kind="val"))
        forms = [f"{src}.sum().item()", f"{src}.tolist()", f"bool(({src} != 0).any())"]
        if m.shape:
            forms.append(f"{src}[{', '.join(str(r.randrange(n)) for n in m.shape)}].item()")
        if m.dt != "b":
            forms.append(f"float({src}.abs().max())")
            forms.append(f"int({src}.argmax())")
        e = r.choice(forms)
        if r.random() < 0.15 and m.dt != "b":  # data-dependent control flow
            t = self.pick(lambda mm: self.writable(mm) and mm.dt != "b")
            if t is not None:
                self.emit(f"if {src}.sum() > 0: {t}.add_(1)", [], "item")
                return True
        self.emit(f"{out} = {e}", [out], "item")
        return True

    def c_index(self):
        r = self.r
        a = self.pick(lambda m: len(m.shape) >= 1)
        if a is None:
            return False
        m = self.meta[a]
        sh, nd = m.shape, len(m.shape)
        d = r.randrange(nd)
        kinds = ["cat", "stack", "index_select", "adv", "gather", "masked_select", "nonzero", "take", "repeat"]
        if nd == 2:
            kinds += ["tril"]
        if nd == 1:
            kinds += ["diag"]
        if fl(m.dt):
            kinds += ["pad"]
        kind = r.choice(kinds)
        ins = [a]
        if kind == "cat":
            n2 = r.choice(SIZES) if d or nd == 1 else r.choice((2, 3, 8))
            b = self.need(sh[:d] + (n2,) + sh[d + 1:], m.dt, exclude=(a,))
            e, shape, ins = f"torch.cat([{a}, {b}], {d})", sh[:d] + (sh[d] + n2,) + sh[d + 1:], [a, b]
        elif kind == "stack":
            b = self.need(sh, m.dt)
            e, shape, ins = f"torch.stack([{a}, {b}], {d})", sh[:d] + (2,) + sh[d:], [a, b]
        elif kind in ("index_select", "adv"):
            idx = [r.randrange(sh[0 if kind == "adv" else d]) for _ in range(r.randint(1, 6))]
            if kind == "adv":
                e, shape = f"{a}[torch.tensor({idx})]", (len(idx),) + sh[1:]
            else:
                e, shape = f"{a}.index_select({d}, torch.tensor({idx}))", sh[:d] + (len(idx),) + sh[d + 1:]
        elif kind == "gather":
            L = r.randint(1, 6)
            shape = sh[:d] + (L,) + sh[d + 1:]
            e = f"torch.gather({a}, {d}, torch.randint(0, {sh[d]}, {S(shape)}, generator=gen({self.k()})))"
        elif kind == "masked_select":
            mk = self.need(sh, "b")
            e, shape, ins = f"{a}.masked_select({mk})", None, [a, mk]
        elif kind == "nonzero":
            out = self.new(M(shape=None, dt="i64"))
            self.emit(f"{out} = {a}.nonzero()", [out], "index")
            return True
        elif kind == "take":
            idx = [r.randrange(numel(sh)) for _ in range(r.randint(1, 6))]
            e, shape = f"torch.take({a}, torch.tensor({idx}))", (len(idx),)
        elif kind == "repeat":
            reps = [r.choice((1, 2)) for _ in sh]
            e, shape = f"{a}.repeat({', '.join(map(str, reps))})", tuple(x * y for x, y in zip(sh, reps))
        elif kind == "tril":
            e, shape = f"torch.tril({a}, {r.randint(-2, 2)})", sh
        elif kind == "diag":
            e, shape = f"torch.diag({a})", (sh[0], sh[0])
        else:
            e, shape = f"F.pad({a}, (1, 2))", sh[:-1] + (sh[-1] + 3,)
        mo = self.derived(ins, shape or (), m.dt)
        mo.shape = shape
        out = self.new(mo)
        self.emit(f"{out} = {e}", [out], "index")
        return True

    def c_misc(self):
        r = self.r
        kind = r.choice(("del", "del", "del", "seed", "rngstate", "genstate", "setrng"))
        if kind == "del":
            live = [s for s in self.meta]
            if not live:
                return False
            s = r.choice(live)
            self.emit(f"del {s}", [], "misc")
            del self.meta[s]
            return True
        if kind == "seed":
            self.emit(f"torch.manual_seed({self.k()})", [], "misc")
            return True
        states = [s for s, m in self.meta.items() if m.kind == "rng"]
        if kind == "rngstate" or (kind == "setrng" and not states):
            out = self.new(M(kind="rng"))
            self.emit(f"{out} = torch.get_rng_state()", [out], "misc")
            return True
        if kind == "genstate":
            gs = self.gens()
            if not gs:
                return False
            g = r.choice(gs)
            if states and r.random() < 0.5:
                self.emit(f"{g}.set_state({r.choice(states)})", [], "misc")
            else:
                out = self.new(M(kind="rng"))
                self.emit(f"{out} = {g}.get_state()", [out], "misc")
            return True
        self.emit(f"torch.set_rng_state({r.choice(states)})", [], "misc")
        return True

    def c_nn(self):
        r = self.r
        a = self.pick(lambda m: fl(m.dt) and 2 <= len(m.shape) <= 3)
        if a is None:
            return False
        m = self.meta[a]
        sh, dt = m.shape, m.dt
        C = sh[1]
        kinds = ["batch_norm", "layer_norm", "mse", "normalize", "softplus"]
        kinds += ["conv1d", "max_pool1d"] if len(sh) == 3 else ["cross_entropy", "embedding"]
        kind = r.choice(kinds)
        ins = [a]
        shape = sh
        if kind == "batch_norm":
            rm, rv = self.need_ng((C,), dt), self.need_ng((C,), dt)
            if r.random() < 0.7:  # updates rm and rv in place (Note [Hidden mutation in native_batch_norm])
                e = f"F.batch_norm({a}, {rm}, {rv}, training=True, momentum=0.1)"
            else:
                e = f"F.batch_norm({a}, {rm}, {rv}.abs() + 0.5, training=False)"
            ins += [rm, rv]
        elif kind == "layer_norm":
            n = sh[-1]
            if r.random() < 0.5:
                w, b = self.need((n,), dt), self.need((n,), dt)
                e, ins = f"F.layer_norm({a}, ({n},), {w}, {b})", ins + [w, b]
            else:
                e = f"F.layer_norm({a}, ({n},))"
        elif kind == "mse":
            b = self.need(sh, dt)
            e, shape, ins = f"F.mse_loss({a}, {b})", (), ins + [b]
        elif kind == "normalize":
            e = f"F.normalize({a}, dim={r.randrange(len(sh))})"
        elif kind == "softplus":
            e = r.choice((f"F.softplus({a})", f"F.silu({a})", f"F.elu({a})"))
        elif kind == "conv1d":
            B, C, L = sh
            k, O = r.choice((1, 3)), r.choice((4, 8))
            w = self.need((O, C, k), dt)
            pad = r.choice((0, k // 2))
            e, shape, ins = f"F.conv1d({a}, {w}, padding={pad})", (B, O, L - k + 1 + 2 * pad), ins + [w]
        elif kind == "max_pool1d":
            e, shape = f"F.max_pool1d({a}, 2)", sh[:2] + (sh[2] // 2,)
        elif kind == "cross_entropy":
            N = sh[0]
            e, shape = f"F.cross_entropy({a}, torch.randint(0, {C}, ({N},), generator=gen({self.k()})))", ()
        else:  # embedding: a is the weight, indices from an int tensor
            idx = self.pick(lambda mm: mm.dt == "i64" and 1 <= len(mm.shape) <= 2)
            if idx is None:
                return False
            e = f"F.embedding({idx}.remainder({sh[0]}), {a})"
            shape, ins = self.meta[idx].shape + (C,), ins + [idx]
        out = self.new(self.derived(ins, shape, dt))
        self.emit(f"{out} = {e}", [out], "nn")
        return True

    def c_storage(self):
        """Ops on storages and raw memory: set_, .data =, resize_, share_memory_, dlpack, apply_,
        dtype and complex views, sparse, unique, autograd hooks."""
        r = self.r
        # apply_ and map_ run Python on the tensor's memory outside the dispatcher; rarer, as they
        # crash a process under dtr when that memory is evicted (each crash restarts a batch).
        kind = r.choices(("set_", "data", "resize_", "share", "dlpack", "apply_", "map_", "dtype_view",
                          "complex", "complex_op", "sparse", "unique", "hook"),
                         (1, 1, 1, 1, 1, 0.3, 0.3, 1, 1, 1, 1, 1, 1))[0]
        if kind in ("set_", "data"):
            # Replacing the memory under a from_dlpack() alias leaves the alias dangling (plain
            # PyTorch then writes freed memory), so never on those.
            t = self.pick(lambda m: (self.writable(m) or (kind == "data" and m.leaf)) and not m.ovl
                          and m.root not in self.dlpacked)
            if t is None:
                return False
            m = self.meta[t]
            b = self.need_ng(m.shape if m.leaf or r.random() < 0.5 else self.shape(), m.dt, exclude=(t,))
            mb = self.meta[b]
            self.emit(f"{t}.set_({b})" if kind == "set_" else f"{t}.data = {b}", [], "storage")
            m.shape, m.contig, m.ovl, m.root = mb.shape, mb.contig, mb.ovl, mb.root
            return True
        if kind == "resize_":
            t = self.pick(lambda m: self.writable(m) and m.contig and len(m.shape) >= 1)
            if t is None:
                return False
            m = self.meta[t]
            n = r.randint(1, numel(m.shape))
            self.emit(f"{t}.resize_({n})", [], "storage")
            m.shape = (n,)
            return True
        if kind == "share":
            t = self.pick(lambda m: m.root not in self.dlpacked)
            if t is None:
                return False
            self.emit(f"{t}.share_memory_()", [], "storage")
            return True
        if kind == "dlpack":
            a = self.pick()
            if a is None:
                return False
            m = self.meta[a]
            out = self.new(self.view_of(a, m.shape, m.contig))
            mo = self.meta[out]
            mo.grad, mo.deps, mo.ro = False, frozenset(), m.ro or m.grad
            self.dlpacked.add(m.root)
            self.emit(f"{out} = torch.from_dlpack({a}.detach())", [out], "storage")
            return True
        if kind in ("apply_", "map_"):
            t = self.pick(lambda m: self.writable(m) and m.dt != "b")
            if t is None:
                return False
            m = self.meta[t]
            if kind == "apply_":
                self.emit(f"{t}.apply_(lambda v: v * 2 + 1)", [], "storage")
            else:
                b = self.need_ng(m.shape, m.dt, exclude=(t,))
                self.emit(f"{t}.map_({b}, lambda x, y: x - y)", [], "storage")
            return True
        if kind == "dtype_view":
            a = self.pick(lambda m: m.contig and m.dt in ("f32", "f64") and len(m.shape) >= 1)
            if a is None:
                return False
            m = self.meta[a]
            out = self.new(M(kind="xT"))
            self.emit(f"{out} = {a}.view({'torch.int32' if m.dt == 'f32' else 'torch.int64'})", [out], "storage")
            return True
        cplx = [s for s, m in self.meta.items() if m.kind == "cT"]
        if kind == "complex" or (kind == "complex_op" and not cplx):
            a = self.pick(lambda m: m.contig and fl(m.dt) and not m.grad and numel(m.shape) % 2 == 0
                          and len(m.shape) >= 1)
            if a is None:
                return False
            m = self.meta[a]
            out = self.new(M(kind="cT", shape=(numel(m.shape) // 2,), dt=m.dt, ro=m.ro, ovl=m.ovl))
            self.emit(f"{out} = torch.view_as_complex({a}.view(-1, 2))", [out], "storage")
            return True
        if kind == "complex_op":
            c = r.choice(cplx)
            mc = self.meta[c]
            x = r.random()
            if x < 0.4 and not (mc.ro or mc.ovl):
                self.emit(f"{c}.mul_({r.choice(('1j', '0.5 - 2j', '-1j'))})", [], "storage")
                return True
            if x < 0.7:
                out = self.new(M(shape=mc.shape, dt=mc.dt))
                self.emit(f"{out} = ({c} * {c}).abs()", [out], "storage")
            else:
                out = self.new(M(shape=mc.shape + (2,), dt=mc.dt, ro=mc.ro, ovl=mc.ovl))
                self.emit(f"{out} = torch.view_as_real({c})", [out], "storage")
            return True
        if kind == "sparse":
            a = self.pick(lambda m: fl(m.dt) and len(m.shape) == 2 and not m.grad)
            if a is None:
                return False
            m = self.meta[a]
            if r.random() < 0.5:
                out = self.new(self.derived([a], m.shape, m.dt))
                self.emit(f"{out} = ({a} * ({a} > 0.5)).to_sparse().to_dense()", [out], "storage")
            else:
                n = r.choice(SIZES)
                b = self.need((m.shape[1], n), m.dt)
                out = self.new(self.derived([a, b], (m.shape[0], n), m.dt))
                self.emit(f"{out} = torch.sparse.mm({a}.relu().to_sparse(), {b})", [out], "storage")
            return True
        if kind == "unique":
            a = self.pick(lambda m: not m.grad and m.dt in ("i64", "b"))
            if a is None:
                return False
            outs = [self.new(M(shape=None, dt=self.meta[a].dt)), self.new(M(shape=None, dt="i64"))]
            self.emit(f"{outs[0]}, {outs[1]} = torch.unique({a}, return_counts=True)", outs, "storage")
            return True
        y = self.pick(lambda m: m.grad)
        if y is None:
            return False
        self.emit(f"{y}.register_hook(lambda g: g * 2)", [], "storage")
        return True

    CATS = (("source", 7), ("unary", 14), ("binary", 11), ("matmul", 6), ("reduce", 6), ("view", 14),
            ("multi", 4), ("inplace", 14), ("out", 4), ("numpy", 6), ("rng", 6), ("autograd", 12),
            ("save", 4), ("item", 4), ("index", 4), ("misc", 4), ("nn", 4), ("storage", 4))

    def program(self):
        r = self.r
        names = [c for c, _ in self.CATS]
        weights = [w for _, w in self.CATS]
        nsteps = r.randint(15, 60)
        while len(self.steps) < nsteps:
            if self.steps and r.random() < 0.15:
                x = r.random()
                if x < 0.6:
                    self.emit("evict_all()", [], "pressure")
                elif x < 0.9:
                    self.emit(f"set_budget({r.choice((0.3, 0.5, 0.7, 0.8, 0.9))})", [], "pressure")
                else:
                    self.emit("set_budget(0)", [], "pressure")
                continue
            cat = r.choices(names, weights)[0]
            if not getattr(self, "c_" + cat)():
                self.c_source()
        return self.steps


_cache = {}


def generate(seed):
    if seed not in _cache:
        if len(_cache) > 64:
            _cache.clear()
        _cache[seed] = Gen(seed).program()
    return _cache[seed]


def source(seed, steps=None):
    """The program (or the given subset of its steps) as Python source."""
    prog = generate(seed)
    sel = prog if steps is None else [prog[i] for i in steps if 0 <= i < len(prog)]
    lines = [HEADER.replace("SEED", str(seed))]
    lines += [f"{s.describe():<70}  # step {s.i}" for s in sel]
    lines.append("evict_all()  # then every live slot is digested")
    return "\n".join(lines)


def _errstr(i, e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"step {i}: {type(e).__name__}: {msg[:300]}"


DROP = None  # --drop REGEX: steps whose source matches are left out (to tell categories apart)


def run_program(seed, steps=None):
    prog = generate(seed)
    sel = prog if steps is None else [prog[i] for i in steps if 0 <= i < len(prog)]
    if DROP is not None:
        sel = [st for st in sel if not DROP.search(st.code)]
    torch.manual_seed(seed)
    torch.set_grad_enabled(True)
    if DTR:
        torch.ops.dtr.set_budget(0)
        _budget_active[0] = False
        st0 = json.loads(torch.ops.dtr.stats())
        _base_reserved[0] = st0["reserved_bytes"]
    ns = dict(NS)
    error = None
    budget_oom = False
    for st in sel:
        if any(s not in ns for s in st.ins):
            continue
        try:
            exec(st.compiled(), ns)  # noqa: S102
        except Exception as e:  # noqa: BLE001  (reported, compared with the other run)
            error = _errstr(st.i, e)
            budget_oom = DTR and _budget_active[0] and isinstance(e, torch.OutOfMemoryError)
            break
    if DTR:
        torch.ops.dtr.set_budget(0)
        _budget_active[0] = False
    evict_all()
    digests = {}
    for s in sorted((k for k in ns if SLOT.fullmatch(k)), key=lambda s: int(s[1:])):
        try:
            digests[s] = dg(ns[s])
        except Exception as e:  # noqa: BLE001
            digests[s] = "digest error: " + _errstr(-1, e)
    ns.clear()
    if error is not None:
        gc.collect()
    res = {"seed": seed, "digests": digests, "error": error}
    if DTR:
        st1 = json.loads(torch.ops.dtr.stats())
        res["dtr"] = {k: st1[k] - st0[k] for k in ("evictions", "rematerializations")}
    if budget_oom:
        res["budget_oom"] = True
    return res


def main(argv):
    global MODE, DROP
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=("run", "show", "serve"))
    p.add_argument("--seeds", nargs=2, type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", default=None)
    p.add_argument("--budget-mode", default="budget", choices=("budget", "evict", "none"))
    p.add_argument("--drop", default=None, help="leave out the steps whose source matches this regex")
    a = p.parse_args(argv)
    MODE = a.budget_mode
    if a.drop:
        DROP = re.compile(a.drop)
    steps = None if a.steps is None else [int(x) for x in a.steps.split(",") if x != ""]
    if a.cmd == "show":
        print(source(a.seed, steps))
        return
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    gc.freeze()
    if a.cmd == "serve":
        for line in sys.stdin:
            req = json.loads(line)
            print(json.dumps(run_program(req["seed"], req.get("steps"))), flush=True)
        return
    seeds = range(*a.seeds) if a.seeds else [a.seed]
    for s in seeds:
        print(json.dumps(run_program(s, steps)), flush=True)
    print(json.dumps({"stats": json.loads(torch.ops.dtr.stats()) if DTR else None}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
