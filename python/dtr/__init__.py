"""dtr: Dynamic Tensor Rematerialization for stock PyTorch.

Training under a memory budget with no change to the model: dtr frees activations it can
recompute and recomputes them when they are touched. The usual way in needs no code at all::

    python -m dtr --budget 6GiB train.py        # or: DTR_BUDGET=6GiB python train.py

For programs that prefer code::

    import dtr
    dtr.enable(budget="6GiB")     # before the model's tensors exist, ideally (see enable)
    ...
    print(dtr.stats()["evictions"])
    dtr.disable()

Every function here is a thin call into the C++ library (hooks/), reachable from C++ too
(<dtr/dtr.h>). Importing this package loads nothing and costs nothing.
"""
import json as _json
import os as _os

from dtr import _library

__all__ = ["enable", "disable", "is_enabled", "stats", "pin", "unpin", "set_budget", "budget",
           "reset_peak_stats", "unevictable_at_peak", "trace_mark", "library_path", "cmake_prefix_path", "OPTIONS"]

__version__ = _library.build_info.VERSION if _library.build_info else "0+unknown"

# enable()'s keyword arguments and the environment variables they stand for (hooks/env_config.h).
OPTIONS = {
    "budget": "DTR_BUDGET",
    "heuristic": "DTR_HEURISTIC",
    "dealloc": "DTR_DEALLOC",
    "search": "DTR_SEARCH",
    "stats_file": "DTR_STATS_FILE",
    "trace_file": "DTR_TRACE_FILE",
    "verbose": "DTR_VERBOSE",
    "evict": "DTR_EVICT",
    "device": "DTR_DEVICE",
    "cuda_allocator": "DTR_CUDA_ALLOCATOR",
    "max_replay_depth": "DTR_MAX_REPLAY_DEPTH",
    "max_recompute": "DTR_MAX_RECOMPUTE",
    "neighborhood_cache": "DTR_NEIGHBORHOOD_CACHE",
    "exhaustive_pool": "DTR_EXHAUSTIVE_POOL",
    "neighborhood_walk_limit": "DTR_NEIGHBORHOOD_WALK_LIMIT",
    "backward_protection": "DTR_BACKWARD_PROTECTION",
    "backward_next_use": "DTR_BACKWARD_NEXT_USE",
    "freeze_gradients": "DTR_FREEZE_GRADIENTS",
    "idle_below": "DTR_IDLE_BELOW",
}

cmake_prefix_path = _library.CMAKE_PREFIX_PATH
library_path = _library.PRELOAD_LIB


def _env_value(name, value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _parse_budget(budget):
    """Bytes (int), or None for unlimited; accepts ints and DTR_BUDGET's text forms."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise TypeError(f"dtr: budget must be an int (bytes) or a string like '6GiB', not {budget!r}")
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"dtr: budget must be positive, got {budget} (None: unlimited)")
        return budget
    n = _library.load().dtr_parse_bytes(budget.encode())
    if n == -2 or n == 0:
        raise ValueError(f"dtr: invalid budget {budget!r}: "
                         + (_library.load().dtr_last_error().decode() or "must be nonzero"))
    return None if n == -1 else n


def enable(budget=None, **options):
    """Puts this process's tensors under dtr, with `budget` (bytes, or '6GiB'; None: unlimited,
    dtr then records nothing and only tracks and reports peaks, until a budget is set). Other
    options (heuristic, dealloc, search, stats_file, trace_file, verbose, evict) are those of the
    DTR_* variables.

    Enabling after tensors exist is supported: tensors allocated before are never evicted and not
    counted in the budget (their memory was not dtr's to manage). Threads started from Python
    afterwards are covered; threads that already run are not (start training threads after, or
    use `python -m dtr`, which covers every thread from the start). Calling enable() again, or
    after disable(), changes only the budget; the other options are fixed at the first enable.
    Raises ValueError for a bad option, RuntimeError if dtr cannot take this process.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"dtr.enable: unknown option(s) {sorted(unknown)}; accepted: budget, "
                        + ", ".join(k for k in OPTIONS if k != "budget"))
    import torch  # noqa: F401
    lib = _library.load()
    nbytes = _parse_budget(budget)
    if lib.dtr_is_active() or _activated():
        if options:
            raise ValueError(f"dtr.enable: dtr is already active; only the budget can change now "
                             f"(got {sorted(options)})")
        if lib.dtr_set_paused(0):
            raise RuntimeError("dtr.enable: resuming dtr failed (the reason is on stderr)")
        set_budget(nbytes)
        return
    saved = {}
    wanted = dict(options, budget=budget)
    try:
        for key, value in wanted.items():
            if value is None:
                continue
            var = OPTIONS[key]
            saved[var] = _os.environ.get(var)
            _os.environ[var] = _env_value(var, value)
        err = lib.dtr_config_error().decode()
        if err:
            raise ValueError(err)
        rc = lib.dtr_activate_checked()
        if rc == 2:
            raise ValueError(lib.dtr_last_error().decode())
        if rc != 0:
            raise RuntimeError(lib.dtr_last_error().decode())
    finally:
        # The configuration is parsed once, at activation: leave the environment as it was so
        # child processes do not inherit a budget they did not ask for.
        for var, old in saved.items():
            if old is None:
                _os.environ.pop(var, None)
            else:
                _os.environ[var] = old
    if not lib.dtr_is_active():
        raise RuntimeError("dtr: not activated (DTR_ENABLE=0 is set in the environment)")
    from dtr import _torch_fixups
    _torch_fixups.apply(lib)
    _torch_fixups.hook_threads(lib)


def _activated():
    """Active but paused counts as activated (dtr_is_active() is 0 while paused)."""
    return bool(_library.load().dtr_has_engine())


def disable():
    """Stops evicting and recording: every evicted tensor the program holds is brought back first,
    the budget is lifted, and ops run untouched from now on. enable() resumes. (The allocator and
    dispatcher hook stay installed: PyTorch cannot uninstall either.)"""
    if not _is_loaded() or not _activated():
        return
    lib = _library.load()
    set_budget(None)
    if lib.dtr_set_paused(1):
        raise RuntimeError("dtr.disable: bringing back an evicted tensor failed (the reason is on stderr); dtr is "
                           "still enabled, with no budget")


def is_enabled():
    """True while dtr manages this process's tensors."""
    return _is_loaded() and bool(_library.load().dtr_is_active())


def _is_loaded():
    if _library._lib is not None:
        return True
    import sys
    if "torch" not in sys.modules:
        return False
    # Under the preload the library is in the process although Python never loaded it.
    if _library.loaded_under_preload():
        _library.load()
        return True
    return False


def stats():
    """dtr's counters as a dict ({} when dtr is not active): budget_bytes (-1: unlimited), recording
    (False until the process has had a budget: Note [Recording starts with a budget]), idle
    (recording paused far below the budget: Note [Idle far below the budget]), idle_periods,
    peak_reserved_bytes, peak_allocated_bytes, evictions, rematerializations, remat_seconds,
    op_seconds, search_seconds, bookkeeping_seconds, ops_recorded, ... (README)."""
    if not _is_loaded():
        return {}
    return _json.loads(_library.load().dtr_stats_json().decode())


def unevictable_at_peak(exclude=()):
    """What dtr could not evict at the largest tracked memory since the start (or
    reset_peak_stats()), by reason: a dict with tracked_bytes, evictable_bytes, unevictable_bytes,
    excluded_bytes and by_reason ({reason: bytes}), leaving out the storages of the tensors in
    `exclude` (say the parameters and optimizer state). {} when dtr is not active; raises
    RuntimeError when it has had no budget, so has recorded nothing (a budget that never binds,
    set before the model is built and run, with idle_below=0 so that dtr records every step, is
    enough)."""
    if not _is_loaded() or not _activated():
        return {}
    import torch
    tensors = [t for t in exclude if isinstance(t, torch.Tensor)]
    return _json.loads(torch.ops.dtr.unevictable_at_peak(tensors))


def set_budget(budget):
    """Changes the budget now (bytes, '6GiB', or None: unlimited). Evicts to get under a lower
    budget; raises torch.OutOfMemoryError, keeping the old budget, if what cannot be evicted does
    not fit."""
    import torch
    nbytes = _parse_budget(budget)
    if not _is_loaded() or not _activated():
        raise RuntimeError("dtr is not active: call dtr.enable() first")
    torch.ops.dtr.set_budget(-1 if nbytes is None else nbytes)


def budget():
    """The budget in bytes, or None when unlimited or inactive."""
    if not _is_loaded() or not _activated():
        return None
    import torch
    b = torch.ops.dtr.budget()
    return None if b < 0 else b


def reset_peak_stats():
    """Resets peak_reserved_bytes and peak_allocated_bytes to the current values."""
    if _is_loaded() and _activated():
        import torch
        torch.ops.dtr.reset_peak()


def trace_mark(label):
    """Writes `mark LABEL` into the trace (DTR_TRACE_FILE; nothing when not tracing): dtr-sim
    reports its costs so far at each mark, so the steps after a warm-up can be measured apart.
    Mark each training step with its own label (dtr.trace_mark(f"step-{i}")). LABEL is one word
    of printable ASCII; anything else raises ValueError, whether or not dtr is active."""
    label = str(label)
    if not label or not all("!" <= c <= "~" for c in label):
        raise ValueError(f"dtr.trace_mark: the label must be one word of printable ASCII, without spaces "
                         f"(got {label!r})")
    if _is_loaded() and _activated():
        import torch
        torch.ops.dtr.trace_mark(label)


def pin(tensor):
    """Keeps `tensor`'s storage resident and never evicted, for code that reads its memory
    outside PyTorch's dispatcher (.numpy() views kept around, data_ptr(), C extensions)."""
    if _is_loaded() and _activated():
        import torch
        torch.ops.dtr.pin(tensor)


def unpin(tensor):
    """Undoes one pin()."""
    if _is_loaded() and _activated():
        import torch
        torch.ops.dtr.unpin(tensor)
