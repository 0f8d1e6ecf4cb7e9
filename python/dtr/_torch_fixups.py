"""Python-side adjustments torch needs once dtr owns DispatchKey::Fake, applied after `import torch`
in every process where dtr is active (preloaded or enabled in-process).

- HigherOrderOperators (torch.cond, while_loop, scan, eager flex_attention, ...) dispatch in
  Python and raise "could not find kernel for HigherOrderOperator ... at dispatch key" once Fake
  is in the thread's include set. Make Fake a fallthrough for every HOP: the existing ones, and
  through torch's default-fallthrough list, the ones created later. Their subgraph ops then reach
  dtr like any other op (../shared/design/pytorch-integration.md, "HigherOrderOperators").
- Code compiled by inductor reads its inputs' memory directly, never through the dispatcher, so
  an evicted input would be read unallocated: every tensor input of a compiled graph
  (CompiledFxGraph.__call__, forward and backward) is pinned resident while the graph runs. Its
  outputs are constants to dtr (not replayable op by op).
- os.fork() takes dtr's lock first (Note [fork], hooks/engine.cc).
- Memory handed out of the dispatcher (numpy, DLPack, data_ptr, serialization) is reported to
  dtr (dtr/_exposure.py).
- Threads started from Python after an in-process dtr.enable() (no preload, so no pthread_create
  interposer) get the key when they start.
"""
import threading

_applied = False


def apply(lib):
    global _applied
    if _applied:
        return
    import torch
    fake = torch._C.DispatchKey(lib.dtr_dispatch_key())
    ops = torch._ops
    defaults = getattr(ops, "_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS", None)
    if defaults is not None and fake not in defaults:
        defaults.append(fake)
    for hop in list(getattr(ops, "_higher_order_ops", {}).values()):
        if fake in getattr(hop, "py_kernels", {}):
            # A torch whose own C++ FakeTensor owns this key: dtr's registration would have
            # failed before this point; never override a real kernel.
            continue
        hop.fallthrough(fake)
        cache = getattr(hop, "_dispatch_cache", None)
        if cache is not None:
            cache.clear()
    from dtr import _exposure
    _exposure.install()
    # Note [fork] (hooks/engine.cc): take dtr's lock with the GIL released before os.fork().
    import os
    os.register_at_fork(before=lib.dtr_fork_hold, after_in_parent=lib.dtr_fork_release,
                        after_in_child=lib.dtr_fork_release)
    # Note [Statistics before the interpreter's teardown] (hooks/activation.cc).
    import atexit
    atexit.register(lib.dtr_write_stats_file)
    from dtr._launcher import _after_import
    _after_import("torch._inductor.output_code", _pin_compiled_graph_inputs)
    _applied = True


def _pin_compiled_graph_inputs():
    import torch
    from torch._inductor import output_code
    cls = getattr(output_code, "CompiledFxGraph", None)
    if cls is None or getattr(cls.__call__, "_dtr_pins_inputs", False):
        return
    original = cls.__call__
    pin, unpin = torch.ops.dtr.pin, torch.ops.dtr.unpin

    def __call__(self, inputs):
        # Taken before the call: the boxed calling convention may clear `inputs`. Holding them
        # keeps each input alive until the graph returns (it may have freed some earlier).
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        for t in tensors:
            pin(t)
        try:
            return original(self, inputs)
        finally:
            for t in tensors:
                unpin(t)

    __call__._dtr_pins_inputs = True
    cls.__call__ = __call__


_threads_hooked = False


def hook_threads(lib):
    """Gives every Python thread started from now on dtr's dispatch key (the preload's
    pthread_create wrapper does this for all threads; in-process enabling has no wrapper)."""
    global _threads_hooked
    if _threads_hooked:
        return
    original = threading.Thread._bootstrap_inner

    def _bootstrap_inner(self):
        lib.dtr_thread_init()
        return original(self)

    threading.Thread._bootstrap_inner = _bootstrap_inner
    _threads_hooked = True
