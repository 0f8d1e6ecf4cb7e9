"""Starting programs under dtr: the environment and preload a child needs (python -m dtr, dtr-run)
and the start-up hook behind environment-only activation (_dtr_startup.py, run from dtr.pth).

Every path ends the same way: the program runs with LD_PRELOAD=<dtr/lib/libdtr.so> and the DTR_*
variables, so dtr activates as libtorch loads and every thread (the preload wraps
pthread_create) gets dtr's dispatch key; in Python processes the start-up hook then applies the
Python-side fixups once torch is imported (_torch_fixups.py)."""
import os
import sys

from dtr import _library

# Command-line options of python -m dtr and dtr-run, and the variables they set.
CLI_OPTIONS = {
    "--budget": "DTR_BUDGET",
    "--stats-file": "DTR_STATS_FILE",
    "--heuristic": "DTR_HEURISTIC",
    "--dealloc": "DTR_DEALLOC",
    "--search": "DTR_SEARCH",
    "--trace-file": "DTR_TRACE_FILE",
    "--verbose": "DTR_VERBOSE",
    "--evict": "DTR_EVICT",
    "--device": "DTR_DEVICE",
    "--cuda-allocator": "DTR_CUDA_ALLOCATOR",
    "--max-replay-depth": "DTR_MAX_REPLAY_DEPTH",
    "--max-recompute": "DTR_MAX_RECOMPUTE",
    "--neighborhood-cache": "DTR_NEIGHBORHOOD_CACHE",
    "--exhaustive-pool": "DTR_EXHAUSTIVE_POOL",
    "--neighborhood-walk-limit": "DTR_NEIGHBORHOOD_WALK_LIMIT",
    "--backward-protection": "DTR_BACKWARD_PROTECTION",
    "--backward-next-use": "DTR_BACKWARD_NEXT_USE",
    "--freeze-gradients": "DTR_FREEZE_GRADIENTS",
    "--idle-below": "DTR_IDLE_BELOW",
}


class UsageError(Exception):
    pass


def parse_options(argv, stop_at_positional):
    """Parses leading `--opt value` / `--opt=value` pairs. Returns (variables, flags, rest): rest
    starts at the first argument that is not one of ours (or after `--`)."""
    env, flags, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return env, flags, argv[i + 1:]
        name, eq, value = arg.partition("=")
        if name in CLI_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                i += 1
                value = argv[i]
            env[CLI_OPTIONS[name]] = value
        elif arg.startswith("-") and arg not in ("-m", "-c", "-"):
            flags.append(arg)
        elif stop_at_positional:
            return env, flags, argv[i:]
        else:
            raise UsageError(f"unexpected argument {arg!r}")
        i += 1
    return env, flags, []


def installed_torch_version():
    """The installed torch's version from its metadata, without importing it (fast)."""
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return None


def torch_mismatch():
    """A message if the installed torch is not the one dtr was built against, else None."""
    built = _library.built_torch_version()
    have = installed_torch_version()
    if built is None or have is None:
        return None
    if _library._base_version(have) != _library._base_version(built):
        try:
            _library.check_torch(have)
        except _library.TorchMismatchError as e:
            return str(e)
    return None


def child_environment(dtr_vars, base=None):
    """The environment for a program under dtr: `dtr_vars` plus libdtr.so first in LD_PRELOAD."""
    env = dict(os.environ if base is None else base)
    env.update(dtr_vars)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if os.path.basename(p) != "libdtr.so"]
    env["LD_PRELOAD"] = " ".join([_library.PRELOAD_LIB] + preload)
    return env


def dtr_run_main(argv=None):
    """dtr-run [--budget B] [--stats-file F] ... -- command args...: runs a command (and every
    process it starts) under dtr."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(DTR_RUN_USAGE)
        return 0 if argv else 2
    try:
        env_vars, flags, command = parse_options(argv, stop_at_positional=True)
    except UsageError as e:
        print(f"dtr-run: {e}\n{DTR_RUN_USAGE}", file=sys.stderr)
        return 2
    if flags:
        print(f"dtr-run: unknown option(s) {flags}\n{DTR_RUN_USAGE}", file=sys.stderr)
        return 2
    if not command:
        print(f"dtr-run: no command given\n{DTR_RUN_USAGE}", file=sys.stderr)
        return 2
    mismatch = torch_mismatch()
    if mismatch:
        print(f"dtr-run: {mismatch}", file=sys.stderr)
        return 2
    env = child_environment(env_vars)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(f"dtr-run: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127


DTR_RUN_USAGE = """usage: dtr-run [--budget B] [--stats-file F] [--heuristic H] [--dealloc D] [--search S]
               [--trace-file F] [--verbose N] [--evict 0|1] [--] command [args...]
Runs `command` (and every process it starts: torchrun ranks, shells, DataLoader workers) under
dtr: LD_PRELOAD=<dtr/lib/libdtr.so> plus the DTR_* variables the options name. Processes that
never load torch are not affected."""


# ---------------------------------------------------------------------------------------------
# Environment-only activation (dtr.pth -> _dtr_startup.py -> startup()).

def wanted(env):
    """dtr was asked for: some DTR_* variable is set, and DTR_ENABLE is not 0."""
    if env.get("DTR_ENABLE") == "0":
        return False
    return any(k.startswith("DTR_") for k in env)


def startup():
    env = os.environ
    if env.get("DTR_ENABLE") == "0":
        return
    if _library.loaded_under_preload():
        # Preloaded by hand (LD_PRELOAD=$(python -m dtr --print-lib)) or by us: dtr activates as
        # libtorch loads; Python's part follows the import.
        _after_import("torch", _apply_fixups)
        return
    if not wanted(env):
        return
    mismatch = torch_mismatch()
    if mismatch:
        # Refuse at `import torch`, not here: processes that never use torch (pip, say) go on.
        def refuse():
            raise _library.TorchMismatchError(mismatch)
        _after_import("torch", refuse)
        return
    _reexec_under_preload()


def _reexec_under_preload():
    """Re-executes this interpreter with the same arguments under the preload, so dtr activates
    exactly as with an explicit LD_PRELOAD. When that is impossible (an embedded interpreter),
    dtr is enabled in-process once torch is imported."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = f.read()
        # Each argument ends with a NUL; an empty argument is an argument too ('' in a shell).
        argv = [a.decode(errors="surrogateescape") for a in cmdline.split(b"\0")[:-1]]
        exe = os.path.realpath("/proc/self/exe")
    except OSError:
        argv, exe = [], ""
    if not argv or exe != os.path.realpath(sys.executable):
        _after_import("torch", _enable_in_process)
        return
    env = child_environment({})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def _apply_fixups():
    from dtr import _torch_fixups
    lib = _library.load()
    if lib.dtr_is_active():
        _torch_fixups.apply(lib)


def _enable_in_process():
    import dtr
    dtr.enable()


class _PostImportHook:
    """A meta-path finder that runs callbacks right after a module finishes importing."""

    def __init__(self, name):
        self.name = name
        self.callbacks = []

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, callbacks = spec.loader, self.callbacks
        exec_module = loader.exec_module

        def exec_then_run(module):
            exec_module(module)
            for cb in callbacks:
                cb()

        loader.exec_module = exec_then_run
        sys.meta_path.remove(self)
        return spec


def _after_import(module, callback):
    """Runs `callback` once `module` is imported (now, if it already is)."""
    if module in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _PostImportHook) and finder.name == module:
            finder.callbacks.append(callback)
            return
    hook = _PostImportHook(module)
    hook.callbacks.append(callback)
    sys.meta_path.insert(0, hook)


def dtr_run_entry():
    """The dtr-run console script."""
    sys.exit(dtr_run_main())
