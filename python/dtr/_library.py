"""Finds dtr's shared libraries inside the package, checks the installed torch against the one
dtr was built for, and loads libdtr_torch.so with ctypes (its C API: hooks/include/dtr/dtr.h).

Nothing here imports torch at module level: `import dtr` must stay free for processes that never
use it (the .pth start-up hook imports parts of this package)."""
import ctypes
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(_HERE, "lib")
PRELOAD_LIB = os.path.join(LIB_DIR, "libdtr.so")
TORCH_LIB = os.path.join(LIB_DIR, "libdtr_torch.so")
CMAKE_PREFIX_PATH = os.path.join(_HERE, "share", "cmake")

try:
    from dtr import _build_info as build_info
except ImportError:  # a source checkout that was never built
    build_info = None


class TorchMismatchError(ImportError):
    """dtr's library was built against another torch than the one installed."""


def _base_version(v):
    return v.split("+")[0]


def built_torch_version():
    return build_info.TORCH_VERSION if build_info else None


def check_torch(torch_version=None):
    """Raises TorchMismatchError unless the installed torch is the one dtr was built against
    (same release and build: 2.14.1+cu130 and 2.14.1+cpu are different binaries)."""
    if build_info is None or not os.path.exists(TORCH_LIB):
        raise TorchMismatchError(
            f"dtr's shared library is missing ({TORCH_LIB}): install the package with "
            "`pip install --no-build-isolation .` from dtr's source tree")
    if torch_version is None:
        import torch
        torch_version = torch.__version__
    if str(torch_version) != build_info.TORCH_VERSION:
        raise TorchMismatchError(
            f"dtr was built against torch {build_info.TORCH_VERSION}, but torch {torch_version} is "
            f"installed in {sys.prefix}. Its C++ library would not load (or would crash) against "
            "another torch: rebuild dtr for this torch with "
            "`pip install --no-build-isolation --force-reinstall <dtr source>` (or scripts/setup.sh)")


_lib = None


def load():
    """Loads libdtr_torch.so (after torch), without activating it: activation is the caller's
    (dtr.enable checks the configuration first). Under the preload the library is already in the
    process and this returns the same handle."""
    global _lib
    if _lib is not None:
        return _lib
    import torch  # noqa: F401  libtorch must be in the process first
    check_torch()
    already = os.environ.get("_DTR_PYTHON_LOADER")
    os.environ["_DTR_PYTHON_LOADER"] = "1"
    try:
        lib = ctypes.CDLL(TORCH_LIB, mode=ctypes.RTLD_GLOBAL)
    finally:
        if already is None:
            del os.environ["_DTR_PYTHON_LOADER"]
        else:
            os.environ["_DTR_PYTHON_LOADER"] = already
    for name, res, args in [
        ("dtr_activate_checked", ctypes.c_int, []),
        ("dtr_is_active", ctypes.c_int, []),
        ("dtr_has_engine", ctypes.c_int, []),
        ("dtr_last_error", ctypes.c_char_p, []),
        ("dtr_config_error", ctypes.c_char_p, []),
        ("dtr_config_string", ctypes.c_char_p, []),
        ("dtr_stats_json", ctypes.c_char_p, []),
        ("dtr_write_stats_file", None, []),
        ("dtr_set_budget", ctypes.c_int, [ctypes.c_int64]),
        ("dtr_set_paused", ctypes.c_int, [ctypes.c_int]),
        ("dtr_dispatch_key", ctypes.c_int, []),
        ("dtr_thread_init", None, []),
        ("dtr_fork_hold", None, []),
        ("dtr_fork_release", None, []),
        ("dtr_parse_bytes", ctypes.c_int64, [ctypes.c_char_p]),
        ("dtr_built_torch_version", ctypes.c_char_p, []),
    ]:
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


def loaded_under_preload():
    """Whether this process runs with libdtr.so preloaded."""
    return any(os.path.basename(p) == "libdtr.so" for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split())
