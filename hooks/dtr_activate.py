"""Activation by environment variable alone (installed by scripts/install.sh as a .pth file).

Python runs this at start-up, before any user code. When DTR_BUDGET is set (or DTR_ENABLE=1)
and the process is not already running under the preload, it re-executes the same interpreter
with the same arguments and LD_PRELOAD=<libdtr.so>, so dtr activates exactly as with an explicit
LD_PRELOAD (thread interposition included). DTR_ENABLE=0 turns it off. Costs one exec of the
interpreter at start-up, only in processes that asked for dtr.
"""
import os
import sys

LIB = "@DTR_LIB@"


def _wanted(env):
    if env.get("DTR_ENABLE") == "0":
        return False
    return "DTR_BUDGET" in env or env.get("DTR_ENABLE") == "1"


def _activate():
    env = os.environ
    if not _wanted(env) or os.path.basename(LIB) in env.get("LD_PRELOAD", ""):
        return
    if not os.path.exists(LIB):
        sys.stderr.write(f"dtr: DTR_BUDGET is set but {LIB} does not exist; rebuild or reinstall dtr\n")
        return
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:
        return
    preload = env.get("LD_PRELOAD", "")
    new_env = dict(env, LD_PRELOAD=f"{LIB} {preload}".strip())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, new_env)


_activate()
