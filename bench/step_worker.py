"""One subprocess of the budget sweep (bench/sweep.py): builds one model and measures training
steps, printing one JSON object per line on stdout. It runs plainly or under
LD_PRELOAD=libdtr.so (the driver decides; DTR_HEURISTIC etc. come from the environment).

  step_worker.py blocks  --model M --blocks JSON     a list of measured blocks
  step_worker.py trace   --model M --steps N         N steps for DTR_TRACE_FILE (each marked: `mark step-I`,
                                                     then `mark end`), and the bytes
                                                     that are not activations
  step_worker.py profile --model M --batches 0,1     Rotor-style profile of the chain stages

A block is {"variant": "model"|"checkpoint", "budget": null|BYTES, "label": ...}: set the budget
(torch.ops.dtr.set_budget; null leaves it as it is), build the model and an SGD optimizer from
their seeds, run `warmup` steps, then `steps` measured steps (each timed alone: zero_grad,
forward, backward, optimizer step, loss.item(); wall and process CPU time), and report the step
times, every step's loss, a digest of the final parameters, and under dtr the peak memory of the
block and dtr's counters over the measured steps. Every block starts from the same seeds and batches, so its losses must
equal the plain run's bit for bit. The blocks run in order and stop at the first one that is
out of memory or slower than --max-step-seconds per step (reported, then exit 0).
"""
import argparse
import gc
import hashlib
import json
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402

DTR = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "stats") and bool(torch.ops.dtr.is_active())
COUNTERS = ("evictions", "eager_evictions", "rematerializations", "replays", "remat_seconds", "base_seconds",
            "op_seconds", "search_seconds", "bookkeeping_seconds", "ops_recorded", "eviction_calls",
            "eviction_searches", "candidates_scored", "neighborhood_visits")
# Counters kept in the runtime's part of the statistics (victim searches and their work).
RUNTIME_COUNTERS = ("eviction_searches", "candidates_scored", "neighborhood_visits")
# The allocator's (what a binding budget makes it do with segments), reported as allocator_<name>.
ALLOCATOR_COUNTERS = ("segment_allocs", "segment_frees", "segment_resizes", "segment_splits", "segment_donors",
                      "cache_flushes")


_emit_lock = threading.Lock()


def emit(obj):
    with _emit_lock:
        print(json.dumps(obj), flush=True)


FIRST_STEP_CAP_FACTOR = 10


def over_cap(step, verb, wall, cpu, cap):
    return (f"step {step} {verb} {wall:.2f} s (CPU {cpu:.2f} s) > its cap {cap:.3f} s "
            f"(--max-step-seconds, x{FIRST_STEP_CAP_FACTOR} for a first step on CUDA)")


class Watchdog:
    """Ends the process when one training step has used more than `cap` seconds of CPU time (or
    ten times that of wall time): a thrashing step can take minutes, and it would only finish to
    be discarded. Before exiting it reports the block as too slow, so the driver records it like
    a step that finished over the cap. ATen ops release the GIL, so this thread runs during them.
    On CUDA a block's first step may take FIRST_STEP_CAP_FACTOR times the cap: it also creates the
    cuBLAS and cuDNN handles and picks kernels (0.2 s on an H100 for a 10 ms step)."""
    def __init__(self, cap):
        # (block, step, its cap, CPU and wall time at its start), replaced as one value so the
        # watching thread never mixes one step's start with another's cap.
        self.cap, self.current = cap, None
        if cap:
            threading.Thread(target=self._watch, daemon=True).start()

    def start(self, block, step, step_cap):
        self.current = (block, step, step_cap, time.process_time(), time.perf_counter())

    def stop(self):
        self.current = None

    def _watch(self):
        while True:
            time.sleep(0.05)
            current = self.current
            if current is None:
                continue
            block, step, cap, cpu0, wall0 = current
            dc, dt = time.process_time() - cpu0, time.perf_counter() - wall0
            if dc > cap or dt > 10 * cap:
                emit(dict(block, status="too-slow", message=over_cap(step, "passed", dt, dc, cap) + " and was stopped"))
                os._exit(0)


class TooSlow(Exception):
    pass


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def dtr_stats():
    s = json.loads(torch.ops.dtr.stats())
    s.update({k: s["runtime"][k] for k in RUNTIME_COUNTERS if k in s.get("runtime", {})})
    s.update({"allocator_" + k: s["allocator"][k] for k in ALLOCATOR_COUNTERS if k in s.get("allocator", {})})
    return s


def minor_faults():
    """Pages this process has faulted in so far (fresh pages its kernels touch: runtime/README.md, "Pages
    kept under a binding budget"); None where getrusage is missing."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def is_oom(e):
    return isinstance(e, RuntimeError) and ("out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError")


def param_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach()
        if DTR:
            torch.ops.dtr.pin(t)  # .numpy() reads the storage outside the dispatcher
        h.update(t.cpu().contiguous().numpy().tobytes())
        if DTR:
            torch.ops.dtr.unpin(t)
    return h.hexdigest()[:16]


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(bm, variant, model, opt, batch):
    opt.zero_grad(set_to_none=False)
    loss = bm.loss(model, batch) if variant == "model" else bm.checkpoint_loss(model, batch)
    loss.backward()
    opt.step()
    return loss.item()


# Where the running block is: an out-of-memory error reports how long it took to come (issue 16:
# below the floor, a clear error, fast).
_progress = {}


def run_block(bm, block, batches, args, watchdog):
    variant = block["variant"]
    _progress.clear()
    _progress.update(step=None, t0=time.perf_counter(), c0=time.process_time())
    if variant == "checkpoint" and not bm.has_checkpoint:
        raise ValueError(f"{bm.name} has no checkpointed variant")
    if DTR and block.get("budget") is not None:
        torch.ops.dtr.set_budget(int(block["budget"]))
    if DTR:
        torch.ops.dtr.reset_peak()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model = bm.build(args.device)
    model.train()
    opt = make_optimizer(model)
    torch.manual_seed(1234)  # dropout masks
    losses, times, cpu_times, before = [], [], [], None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            faults0 = minor_faults()
            if DTR:
                before = dtr_stats()
        sync(args.device)
        cap = args.max_step_seconds * (FIRST_STEP_CAP_FACTOR if i == 0 and args.device == "cuda" else 1)
        watchdog.start(block, i, cap)
        t0, c0 = time.perf_counter(), time.process_time()
        _progress.update(step=i, t0=t0, c0=c0)
        losses.append(train_step(bm, variant, model, opt, batches[i]))
        sync(args.device)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        watchdog.stop()
        if i >= args.warmup:
            times.append(dt)
            cpu_times.append(dc)
        if cap and min(dt, dc) > cap:
            raise TooSlow(over_cap(i, "took", dt, dc, cap))
    faults1 = minor_faults()
    out = dict(block, status="ok", losses=losses, step_seconds=times, median_step_seconds=statistics.median(times),
               step_cpu_seconds=cpu_times, median_step_cpu_seconds=statistics.median(cpu_times),
               load_average=os.getloadavg()[0], param_digest=param_digest(model),
               minor_faults_per_step=None if faults1 is None else (faults1 - faults0) / args.steps)
    if DTR:
        after = dtr_stats()
        out["dtr_library"] = loaded_dtr_library()
        out["peak_reserved_bytes"] = after["peak_reserved_bytes"]
        out["peak_allocated_bytes"] = after["peak_allocated_bytes"]
        out["budget_bytes"] = after["budget_bytes"]
        out["per_step"] = {k: (after[k] - before[k]) / args.steps for k in COUNTERS + tuple(
            "allocator_" + c for c in ALLOCATOR_COUNTERS) if k in after}
    elif args.device == "cuda":
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    del model, opt
    gc.collect()
    return out


def loaded_dtr_library():
    """The path of the libdtr_torch.so this process runs (/proc/self/maps), so that a harness
    comparing two builds can check which one each run used; None where it cannot be read."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("/libdtr_torch.so"):
                    return os.path.realpath(line.split(None, 5)[5].strip())
    except OSError:
        pass
    return None


def check_dtr_manages(device):
    """Under the preload on CUDA, dtr must account for CUDA memory, or its budgets mean nothing."""
    if not DTR or device != "cuda":
        return
    before = dtr_stats()["allocated_bytes"]
    t = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    grew = dtr_stats()["allocated_bytes"] - before
    del t
    if grew < (1 << 20):
        raise SystemExit("step_worker: this libdtr.so does not manage CUDA memory (its CUDA path is not built): "
                         "dtr budgets cannot be swept with --device cuda")


def cmd_blocks(args):
    bm = bench_models.get(args.model)
    check_dtr_manages(args.device)
    blocks = json.loads(args.blocks)
    batches = bm.batches(args.warmup + args.steps, args.device)
    emit({"event": "start", "model": bm.name, "dtr": DTR, "device": args.device, "torch": torch.__version__,
          "threads": torch.get_num_threads(), "heuristic": os.environ.get("DTR_HEURISTIC", "dtr") if DTR else None})
    watchdog = Watchdog(args.max_step_seconds)
    for block in blocks:
        try:
            emit(run_block(bm, block, batches, args, watchdog))
        except TooSlow as e:
            emit(dict(block, status="too-slow", message=str(e)))
            return
        except RuntimeError as e:
            if not is_oom(e):
                raise
            # The failing step's time until the error (the model's build, when step is None).
            emit(dict(block, status="oom", message=str(e).strip().splitlines()[0][:600], oom_step=_progress.get("step"),
                      seconds_to_oom=time.perf_counter() - _progress["t0"],
                      cpu_seconds_to_oom=time.process_time() - _progress["c0"]))
            return


def storages(x):
    """{data_ptr: nbytes} of the storages under a tensor or nested tuple/list/dict of tensors."""
    out = {}
    for t in tensors_in(x):
        s = t.storage()
        if s.size() and s.data_ptr():
            out[s.data_ptr()] = s.nbytes()
    return out


def tensors_in(x):
    """The tensors in a nested tuple/list/dict."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in tensors_in(y)]
    return []


def optimizer_state_tensors(opt):
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def cmd_trace(args):
    """Runs `steps` training steps (the trace is the whole process: DTR_TRACE_FILE) on batches
    0..steps-1, marking each step's start in the trace (`mark step-I`, then `mark end`), and
    reports the bytes that are not activations at the end (parameters, gradients, optimizer
    state, the batches) and, per batch, the bytes of the chain's input among them."""
    bm = bench_models.get(args.model)
    batches = bm.batches(args.steps, args.device)
    model = bm.build(args.device)
    model.train()
    opt = make_optimizer(model)
    torch.manual_seed(1234)
    # The mark: an op the driver finds in the trace to tell building from training.
    torch.full((args.mark_bytes,), 1, dtype=torch.uint8, device=args.device)
    losses = []
    for i, b in enumerate(batches):
        if DTR:  # Note [Steady-state steps] (runtime/sim/simulator.h): the driver measures steps apart
            torch.ops.dtr.trace_mark(f"step-{i}")
        losses.append(train_step(bm, "model", model, opt, b))
    if DTR:
        torch.ops.dtr.trace_mark("end")
    static = {}
    static_tensors = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None] + \
        optimizer_state_tensors(opt) + tensors_in(batches)
    static.update(storages(static_tensors))
    chain_inputs = []
    for b in batches:
        chain = bm.stages(model, b)
        if chain is None:
            chain_inputs.append(None)
            continue
        s0 = storages(chain[0])
        chain_inputs.append({"input_bytes": sum(s0.values()),
                             "input_bytes_in_static": sum(v for k, v in s0.items() if k in static)})
    event = {"event": "trace", "model": bm.name, "steps": args.steps, "losses": losses,
             "static_bytes": sum(static.values()), "chain_inputs": chain_inputs}
    if DTR:
        # Note [Unevictable memory by reason] (hooks/memory_report.cc): what dtr could not evict at
        # the largest tracked memory, beyond the static storages.
        event["unevictable_at_peak"] = json.loads(torch.ops.dtr.unevictable_at_peak(static_tensors))
    emit(event)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def detached_input(state, requires_grad):
    def one(t):
        t = t.detach()
        if requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t
    return tuple(one(t) for t in state) if isinstance(state, tuple) else one(state)


def allocated_now(device):
    if device == "cuda":
        return torch.cuda.memory_allocated()
    return dtr_stats()["allocated_bytes"] if DTR else None


def reset_peak(device):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elif DTR:
        torch.ops.dtr.reset_peak()


def peak_now(device):
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return dtr_stats()["peak_allocated_bytes"] if DTR else None


def measure_stage(f, x, params, device):
    """Bytes of one stage: a (its output), abar (what its forward keeps for backward, the output
    included, its input and the parameters and gradients excluded), and, where an allocator
    reports peaks, o_f / o_b (transient bytes above what is held during forward / backward)."""
    saved = {}

    def pack(t):
        saved.update(storages(t))
        return t
    sync(device)
    reset_peak(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = f(x)
    sync(device)
    m1, pf = allocated_now(device), peak_now(device)
    ys = [t for t in as_tuple(y) if t.requires_grad]
    grads = [torch.ones_like(t) for t in ys]
    sync(device)
    m2 = allocated_now(device)
    reset_peak(device)
    torch.autograd.backward(ys, grads)
    sync(device)
    pb = peak_now(device)
    xin, outs = storages(x), storages(y)
    kept = dict(saved)
    kept.update(outs)
    rec = {"a": sum(outs.values()),
           "abar": sum(v for k, v in kept.items() if k not in xin and k not in params)}
    dx = sum(storages([t.grad for t in as_tuple(x) if t.grad is not None]).values())
    if m1 is not None:
        rec["o_f"] = max(0, pf - m1)
        rec["o_b"] = max(0, pb - m2 - dx)
    return rec


def cmd_profile(args):
    """Rotor-style profile of each chain stage f_i of the given batches: forward and backward
    time (the minimum of --repeats runs; see `clock`), the bytes of its output (a), the bytes its forward keeps for
    backward including the output but not its input or parameters (abar, exact, from
    saved-tensor hooks), and where an allocator reports peaks (dtr's, or CUDA's) the transient
    extra bytes of its forward and backward (o_f, o_b)."""
    bm = bench_models.get(args.model)
    # CPU time of the process on CPU (robust on a shared machine; the work is single-threaded and
    # synchronous), wall time on CUDA (kernels run asynchronously; timed between synchronizations).
    clock = time.perf_counter if args.device == "cuda" or args.timer == "wall" else time.process_time
    idx = [int(i) for i in args.batches.split(",")]
    all_batches = bm.batches(max(idx) + 1, args.device)
    model = bm.build(args.device)
    model.train()
    opt = make_optimizer(model)
    torch.manual_seed(1234)
    for b in all_batches:  # creates the gradients (they are not activations) and warms up
        train_step(bm, "model", model, opt, b)
    params = set(storages(list(model.parameters())).keys()) | set(storages(
        [p.grad for p in model.parameters() if p.grad is not None]).keys())
    for bi in idx:
        state, fns = bm.stages(model, all_batches[bi])
        inputs = [state]
        with torch.no_grad():
            for f in fns[:-1]:
                inputs.append(f(inputs[-1]))
        stages = []
        for i, f in enumerate(fns):
            rec = {"name": f"s{i}"}
            fwd, bwd = [], []
            for r in range(args.repeats + 1):
                # Run 0 measures bytes (saved-tensor hooks, allocator peaks); the others only time.
                x = detached_input(inputs[i], requires_grad=i > 0)
                if r == 0:
                    rec.update(measure_stage(f, x, params, args.device))
                    continue
                sync(args.device)
                t0 = clock()
                y = f(x)
                sync(args.device)
                t1 = clock()
                ys = [t for t in as_tuple(y) if t.requires_grad]
                grads = [torch.ones_like(t) for t in ys]
                sync(args.device)
                t2 = clock()
                torch.autograd.backward(ys, grads)
                sync(args.device)
                t3 = clock()
                fwd.append(t1 - t0)
                bwd.append(t3 - t2)
                del x, y, ys, grads
            # The minimum: the machine may be shared, and other work only ever adds time.
            rec["u_f"] = min(fwd)
            rec["u_b"] = min(bwd)
            stages.append(rec)
        emit({"event": "profile", "model": bm.name, "batch": bi, "input_bytes": sum(storages(inputs[0]).values()),
              "stages": stages, "memory_measured": allocated_now(args.device) is not None})
    opt.zero_grad()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("blocks", "trace", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
        p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
        if name == "blocks":
            p.add_argument("--blocks", required=True, help="JSON list of blocks (see the module docstring)")
            p.add_argument("--warmup", type=int, default=2)
            p.add_argument("--steps", type=int, default=5)
            p.add_argument("--max-step-seconds", type=float, default=0)
        elif name == "trace":
            p.add_argument("--steps", type=int, default=2)
            p.add_argument("--mark-bytes", type=int, default=4099)
        else:
            p.add_argument("--batches", default="0")
            p.add_argument("--repeats", type=int, default=3, help="timed runs per stage (>= 1)")
            p.add_argument("--timer", default="cpu", choices=["cpu", "wall"])
    args = ap.parse_args()
    if args.cmd == "profile" and args.repeats < 1:
        ap.error("--repeats must be >= 1")
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("step_worker: --device cuda but torch.cuda.is_available() is False")
        # Bit-identity needs a deterministic plain run: cuDNN's default convolution backward may
        # sum with atomics (the GPU sweep of 2026-11-28 saw ResNet and UNet "differ" from their
        # plain run with no budget; the LSTM, without convolutions, matched). cuBLAS then needs a
        # fixed workspace, set before its first handle. warn_only: an op with no deterministic
        # CUDA kernel warns instead of stopping the sweep.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        # ... without its NaN fill of every new tensor: a kernel per allocation, which would
        # weigh on these launch-bound steps' times and does not change a result.
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False
    {"blocks": cmd_blocks, "trace": cmd_trace, "profile": cmd_profile}[args.cmd](args)


if __name__ == "__main__":
    main()
