"""Python-side adjustments torch needs once dtr owns DispatchKey::Fake, applied after `import torch`
in every process where dtr is active (preloaded or enabled in-process).

- HigherOrderOperators (torch.cond, while_loop, scan, eager flex_attention, ...) dispatch in
  Python and raise "could not find kernel for HigherOrderOperator ... at dispatch key" once Fake
  is in the thread's include set. Make Fake a fallthrough for every HOP: the existing ones, and
  through torch's default-fallthrough list, the ones created later. Their subgraph ops then reach
  dtr like any other op (../shared/design/pytorch-integration.md, "HigherOrderOperators").
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
    _applied = True


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
