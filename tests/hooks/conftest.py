import os
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


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    # The suites test host memory; on a machine with a GPU, DTR_DEVICE=auto would manage CUDA
    # memory instead (scripts/gpu-check.sh tests that).
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": ""})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, preload=False, timeout=300, **dtr_env):
    """Runs a command in a subprocess; with preload, under LD_PRELOAD=libdtr.so and DTR_* vars."""
    env = clean_env(**dtr_env)
    if preload:
        env["LD_PRELOAD"] = dtr_lib()
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def _require_package():
    # Not a skip: a missing package is a broken setup, and skipped tests would hide it.
    assert os.path.exists(dtr_lib()), f"dtr is not installed in {sys.executable} (run scripts/setup.sh)"
