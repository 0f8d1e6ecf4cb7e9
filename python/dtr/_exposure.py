"""Tells dtr when a tensor's memory leaves PyTorch's dispatcher, so that no replay ever reads
memory that changed behind its back and no view handed out ever points at evicted memory
(hooks/engine.cc, Note [Memory read outside the dispatcher]). Installed with the other Python
fixups wherever dtr is active.

- Writable views (Tensor.numpy, np.asarray, __dlpack__ / to_dlpack, __cuda_array_interface__)
  and element-wise Python callbacks (apply_, map_, map2_):
  torch.ops.dtr.expose(t, True). The storage is resident for good and is never a replay source.
- A raw pointer (Tensor.data_ptr, or a storage's data_ptr) taken by the program: as a writable
  view (ctypes may write through it). Taken by PyTorch's own Python code (an identity check): torch.ops.dtr.expose(t,
  False), as for a serialization (torch.save, pickle: __reduce_ex__): the storage stays resident
  while it lives.
- Reads that finish before they return (tolist, copy.deepcopy, torch.max_pool1d's composite
  kernel): the tensor is pinned for the call only, so an evicted tensor is brought back first. share_memory_ and multiprocessing's
  reduction move the storage to shared memory, external from then on: it is brought back first.

C++ code that reads or writes a tensor through data_ptr() outside an op is not seen: it must pin
the tensor (torch.ops.dtr.pin, README "What dtr pins").
"""
import functools
import sys

_installed = False


def _on_storage(op, t, *args):
    """Runs dtr's `op` (expose, pin, unpin) on tensor t, for the storage behind it.

    A subclass shares its storage with the tensor it was made from, and dtr may have recorded
    that storage (a __torch_function__-only subclass such as torchvision's tv_tensors runs its ops
    through dtr like a plain tensor): dtr's side decides whether the memory is its own (Note [Raw
    access through a subclass], hooks/engine.cc), with the subclass's __torch_function__ and
    __torch_dispatch__ kept from seeing dtr's op. A wrapper subclass (DTensor, FakeTensor) holds
    none of dtr's memory and is left alone there. While torch.compile traces, a subclass is a
    fake tensor holding no memory, and the dispatch switch would break the graph: nothing is done."""
    import torch
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        if t.device.type in ("cpu", "cuda"):
            op(t, *args)
        return
    if torch.compiler.is_compiling():
        return
    with torch._C.DisableTorchFunctionSubclass(), torch._C._DisableTorchDispatch():
        op(t, *args)


def _run_uncompiled(functions):
    """Note [Hooks under torch.compile]: the wrappers are Python functions. TorchDynamo inlines
    them where it traces a user's function (x.numpy() there traces as it does without dtr), but a
    wrapper called from code dynamo runs for a compiled function is a frame it would compile on
    its own, and for Tensor.numpy that loops: dynamo makes the traced numpy() a call of its
    to_numpy_helper, which calls Tensor.numpy, the wrapper, whose compiled frame calls
    to_numpy_helper again (RecursionError). So the wrappers' frames, and those they call, run as
    they are. The switch lives in torch._C, so no import of dynamo (a second) is paid for it; a
    torch without it keeps the loop. Test: tests/hooks/test_coexistence.py,
    test_raw_access_in_compiled_functions."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return
    for f in functions:
        set_code_exec_strategy(f.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


def _writable_for_caller(frame):
    """Whether a raw pointer handed to the code of `frame` may be written through: PyTorch's own
    Python code uses the address as an identity (nn.RNN compares its weights', FSDP its shards');
    any other caller may write through it (ctypes). Frames of torch.storage (a TypedStorage
    asking its UntypedStorage) are skipped."""
    while frame is not None and frame.f_globals.get("__name__", "") == "torch.storage":
        frame = frame.f_back
    caller = frame.f_globals.get("__name__", "") if frame is not None else ""
    return not (caller == "torch" or caller.startswith("torch."))


def install():
    global _installed
    if _installed:
        return
    import torch
    expose = torch.ops.dtr.expose
    pin, unpin = torch.ops.dtr.pin, torch.ops.dtr.unpin

    def exposing(original, writable):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            _on_storage(expose, self, writable)
            return original(self, *args, **kwargs)
        return wrapper

    def pinned_during(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            _on_storage(pin, self)
            try:
                return original(self, *args, **kwargs)
            finally:
                _on_storage(unpin, self)
        return wrapper

    def materialized_first(original):
        # For calls that replace the storage's memory (share_memory_ moves it to shared memory,
        # which is external from then on): a pin held across the call would outlive the record
        # it was taken on. Another thread evicting it in between makes the call fail loudly
        # (torch: "invalid python storage"), never read stale bytes.
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            _on_storage(pin, self)
            _on_storage(unpin, self)
            return original(self, *args, **kwargs)
        return wrapper

    T = torch.Tensor
    T.numpy = exposing(T.numpy, True)
    # Python callbacks applied element by element through the data pointers, outside any op:
    # self is written, the other tensors are read during the call.
    def callback_writer(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            _on_storage(expose, self, True)
            pinned = []  # unpinned even when a later pin fails (out of memory bringing it back)
            try:
                for a in args:
                    if isinstance(a, torch.Tensor):
                        _on_storage(pin, a)
                        pinned.append(a)
                return original(self, *args, **kwargs)
            finally:
                for a in pinned:
                    _on_storage(unpin, a)
        return wrapper

    for name in ("apply_", "map_", "map2_"):
        if hasattr(T, name):
            setattr(T, name, callback_writer(getattr(T, name)))
    T.__dlpack__ = exposing(T.__dlpack__, True)
    original_data_ptr = T.data_ptr

    @functools.wraps(original_data_ptr)
    def data_ptr(self):
        _on_storage(expose, self, _writable_for_caller(sys._getframe(1)))
        return original_data_ptr(self)

    T.data_ptr = data_ptr

    # The same through a storage (Tensor.untyped_storage().data_ptr(), Tensor.storage().data_ptr(),
    # whose TypedStorage asks its UntypedStorage): dtr's entry is the storage's, so a uint8 tensor
    # over all of it stands for it.
    S = torch.UntypedStorage
    original_storage_data_ptr = S.data_ptr

    @functools.wraps(original_storage_data_ptr)
    def storage_data_ptr(self):
        if type(self) is S and self.device.type in ("cpu", "cuda") and self.nbytes() > 0:
            writable = _writable_for_caller(sys._getframe(1))
            with torch._C._DisableTorchDispatch():  # an active mode (FakeTensorMode) must not see these
                whole = torch.empty(0, dtype=torch.uint8, device=self.device).set_(self)
                expose(whole, writable)
        return original_storage_data_ptr(self)

    S.data_ptr = storage_data_ptr
    T.__reduce_ex__ = exposing(T.__reduce_ex__, False)
    T.tolist = pinned_during(T.tolist)
    T.__deepcopy__ = pinned_during(T.__deepcopy__)
    T.share_memory_ = materialized_first(T.share_memory_)
    cai = T.__dict__.get("__cuda_array_interface__")
    if isinstance(cai, property):
        T.__cuda_array_interface__ = property(exposing(cai.fget, True))

    # torch.max_pool1d without indices is a composite kernel that reads its input's memory
    # directly (max_pool1d_impl): dtr, below it, never sees the read.
    torch.max_pool1d = pinned_during(torch.max_pool1d)

    from torch.utils import dlpack
    original_to_dlpack = dlpack.to_dlpack
    dlpack.to_dlpack = exposing(original_to_dlpack, True)
    if getattr(torch, "to_dlpack", None) is original_to_dlpack:
        torch.to_dlpack = dlpack.to_dlpack

    # multiprocessing queues pickle tensors with their own reducer (it moves the storage to
    # shared memory, which then is external: Note [Memory read outside the dispatcher]).
    from torch.multiprocessing import reductions
    from multiprocessing.reduction import ForkingPickler
    reduce_tensor = materialized_first(reductions.reduce_tensor)
    for cls in (torch.Tensor, torch.nn.parameter.Parameter):
        ForkingPickler.register(cls, reduce_tensor)
    _run_uncompiled([T.numpy, T.tolist, T.share_memory_, T.data_ptr, S.data_ptr] +
                    [getattr(T, name) for name in ("apply_",) if hasattr(T, name)])
    _installed = True
