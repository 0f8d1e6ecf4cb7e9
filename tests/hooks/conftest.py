import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def dtr_lib():
    """The preload library of the dtr package installed in this interpreter (the tests run
    through the package, as users do: scripts/setup.sh installs it into the venv)."""
    import dtr
    return dtr.library_path


def build_dir():
    """The CMake build with dtr-sim and dtr-chain (scripts/test.sh builds it)."""
    return os.environ.get("BUILD_DIR", os.path.join(REPO, "build"))


# A budget that never binds: dtr records from the start (it records nothing until the process has
# a budget, Note [Recording starts with a budget]), so a program can evict on demand
# (torch.ops.dtr.set_budget(1)) and see its tensors come back. run() adds DTR_IDLE_BELOW=0 to a
# run under it unless the test sets DTR_IDLE_BELOW itself, so that dtr keeps recording after the
# first step instead of going idle (Note [Idle far below the budget], which test_idle.py tests).
NEVER_BINDS = "1TiB"
RECORDING_UNDER_NEVER_BINDS = ("--idle-below", "0")  # the same, for `python -m dtr --budget 1TiB`


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    # The suites test host memory; on a machine with a GPU, DTR_DEVICE=auto would manage CUDA
    # memory instead (scripts/gpu-check.sh tests that).
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": ""})
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Hung(subprocess.TimeoutExpired):
    """A run past its timeout. Its stderr ends with every thread's native stack, taken before the
    process was killed, so that a hang in CI says where it hung."""

    def __str__(self):
        return super().__str__() + "\n--- stderr, then the stacks (tail) ---\n" + \
            (self.stderr or b"").decode(errors="replace")[-12000:]


def native_stacks(pid):
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb on this machine: no stacks)"
    try:
        r = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 40"],
                           capture_output=True, text=True, timeout=120)
        return r.stdout[-20000:] + r.stderr[-2000:]
    except (OSError, subprocess.SubprocessError) as ex:
        return f"(gdb failed: {ex})"


def run(args, preload=False, timeout=300, **dtr_env):
    """Runs a command in a subprocess; with preload, under LD_PRELOAD=libdtr.so and DTR_* vars.
    Past `timeout` seconds it raises Hung with the process's native stacks."""
    if dtr_env.get("DTR_BUDGET") == NEVER_BINDS:
        dtr_env.setdefault("DTR_IDLE_BELOW", "0")
    env = clean_env(**dtr_env)
    if preload:
        env["LD_PRELOAD"] = dtr_lib()
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = native_stacks(p.pid)
        p.kill()
        out, err = p.communicate()
        raise Hung(args, timeout, output=out, stderr=err + b"\n--- native stacks ---\n" + stacks.encode())
    return subprocess.CompletedProcess(args, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@pytest.fixture(scope="session", autouse=True)
def _require_package():
    # Not a skip: a missing package is a broken setup, and skipped tests would hide it.
    assert os.path.exists(dtr_lib()), f"dtr is not installed in {sys.executable} (run scripts/setup.sh)"
