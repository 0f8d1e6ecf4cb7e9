"""python -m dtr: run a Python program under dtr, exactly as `python` would run it.

    python -m dtr [--budget 6GiB] [--stats-file F] [options] script.py args...
    python -m dtr [options] -m some.module args...
    python -m dtr [options] -c "code" args...
    python -m dtr --info | --print-lib | --version

The target runs in a fresh interpreter (this one, re-executed with libdtr.so preloaded and the
DTR_* variables set), so sys.argv, __main__, the exit code, uncaught exceptions, signals and
every thread behave as under plain `python`.
"""
import os
import subprocess
import sys

from dtr import _launcher, _library

USAGE = """usage: python -m dtr [--budget B] [--stats-file F] [--heuristic H] [--dealloc D]
                     [--search S] [--trace-file F] [--verbose N] [--evict 0|1]
                     (script.py | -m module | -c code) [args...]
       python -m dtr --info | --print-lib | --version
  --budget B       cap on the memory dtr's allocator reserves: 6GiB, 6000MB, 123456 (bytes),
                   unlimited (default: no cap; dtr then tracks and reports peaks)
  --stats-file F   JSON statistics written at exit; {rank} and {pid} in F expand per process
  --heuristic H    eviction heuristic: dtr (default), dtr-eq, dtr-local, lru, size, msps, random
  --max-recompute X  out of memory once recomputing costs X times the program's own time
                   (default 10; 0: train however slowly)
  --info           versions, build features and the parsed configuration; refuses a mismatched torch
  --print-lib      the preload library's path, for LD_PRELOAD=$(python -m dtr --print-lib)
Each option sets the DTR_* variable of the same name (README); DTR_* already in the environment
apply too."""


def info():
    try:
        _library.check_torch()
    except _library.TorchMismatchError as e:
        print(f"dtr: {e}", file=sys.stderr)
        return 2
    import torch
    lib = _library.load()
    b = _library.build_info
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    print(f"dtr {b.VERSION}")
    print(f"torch {torch.__version__} ({cuda} build) at {os.path.dirname(torch.__file__)}")
    print(f"built against torch {b.TORCH_VERSION}")
    print(f"CPU adapter: {'compiled' if b.CPU_ADAPTER else 'not compiled'}")
    print(f"CUDA adapter: {'compiled' if b.CUDA_ADAPTER else 'not compiled'}")
    print("profile-guided optimization: " + {"use": "yes (scripts/setup.sh)", "generate": "instrumented build, "
                                             "writing a profile"}.get(b.PGO, "no"))
    print(f"library: {_library.TORCH_LIB}")
    print(f"preload: {_library.PRELOAD_LIB}")
    print(f"active in this process: {'yes' if lib.dtr_is_active() else 'no'}")
    err = lib.dtr_config_error().decode()
    if err:
        print(f"configuration: INVALID: {err}")
        return 2
    print(f"configuration: {lib.dtr_config_string().decode()}")
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(_library.build_info.VERSION if _library.build_info else "unknown")
        return 0
    if argv[0] == "--print-lib":
        if not os.path.exists(_library.PRELOAD_LIB):
            print(f"dtr: {_library.PRELOAD_LIB} is missing; reinstall dtr", file=sys.stderr)
            return 2
        print(_library.PRELOAD_LIB)
        return 0
    try:
        dtr_vars, flags, target = _launcher.parse_options(argv, stop_at_positional=True)
    except _launcher.UsageError as e:
        print(f"python -m dtr: {e}\n{USAGE}", file=sys.stderr)
        return 2
    if "--info" in flags:
        os.environ.update(dtr_vars)
        return info()
    # -m and -c are the interpreter's own: they and everything after belong to the target.
    if flags:
        print(f"python -m dtr: unknown option(s) {flags}\n{USAGE}", file=sys.stderr)
        return 2
    if not target:
        print(f"python -m dtr: no program given\n{USAGE}", file=sys.stderr)
        return 2
    if target[0] in ("-m", "-c") and len(target) < 2:
        print(f"python -m dtr: {target[0]} needs an argument", file=sys.stderr)
        return 2
    mismatch = _launcher.torch_mismatch()
    if mismatch:
        print(f"dtr: {mismatch}", file=sys.stderr)
        return 2
    env = _launcher.child_environment(dtr_vars)
    argv = [sys.executable, *subprocess._args_from_interpreter_flags(), *target]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
