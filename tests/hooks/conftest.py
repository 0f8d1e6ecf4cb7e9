import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"


def dtr_lib():
    return os.environ.get("DTR_LIB", os.path.join(REPO, "build", "lib", "libdtr.so"))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, preload=False, timeout=300, **dtr_env):
    """Runs a command in a subprocess; with preload, under LD_PRELOAD=libdtr.so and DTR_* vars."""
    env = clean_env(**dtr_env)
    if preload:
        env["LD_PRELOAD"] = dtr_lib()
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def _require_lib():
    if not os.path.exists(dtr_lib()):
        pytest.skip(f"libdtr.so not found at {dtr_lib()} (set DTR_LIB)")
