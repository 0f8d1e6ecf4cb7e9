"""A LibTorch C++ training program (examples/train_mlp.cc) built as a user builds it, with
find_package(dtr) from the installed package against the wheel's LibTorch: with DTR_BUDGET it
trains under dtr, bit-identical to the run without, within the budget, with real
rematerialization; the same binary also runs under the preload; an infeasible budget is dtr's
OutOfMemoryError."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hooks"))
from conftest import PY, REPO, clean_env, dtr_lib  # noqa: E402

# One pytest-xdist worker (scripts/test.sh) builds the example once for every test here.
pytestmark = pytest.mark.xdist_group("cpp_example")



@pytest.fixture(scope="module")
def budget(binary):
    """0.87 of the program's peak under dtr with a budget that never binds (about 3.46 MB of a 3.98 MB
    peak; parameters, gradients and momentum buffers are 1.81 MB of it). It trains down to 0.8."""
    r = run(binary, DTR_BUDGET="1TiB")  # never binds; dtr records (Note [Recording starts with a budget])
    assert r.returncode == 0, r.stderr[-2000:]
    return int(stats_of(r)[1]["peak_allocated_bytes"] * 0.87)


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    import dtr
    build = tmp_path_factory.mktemp("example")
    env = clean_env(PATH=os.environ["PATH"])
    cfg = subprocess.run(["cmake", "-G", "Ninja", "-S", os.path.join(REPO, "examples"), "-B", str(build),
                          f"-DCMAKE_PREFIX_PATH={dtr.cmake_prefix_path}", f"-DDTR_PYTHON={PY}"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    b = subprocess.run(["ninja", "-C", str(build)], env=env, capture_output=True, text=True, timeout=600)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    return str(build / "train_mlp")


def run(binary, **env):
    return subprocess.run([binary], env=clean_env(**env), capture_output=True, text=True, timeout=300)


def stats_of(r):
    line = [l for l in r.stderr.splitlines() if l.startswith("dtr active:")][-1]
    return int(line.split()[2]), json.loads(line.split("stats: ", 1)[1])


def test_linked_program_is_bit_identical_under_a_budget(binary, budget):
    plain = run(binary, DTR_ENABLE="0")
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert stats_of(plain) == (0, {})
    with_dtr = run(binary, DTR_BUDGET=budget)
    assert with_dtr.returncode == 0, with_dtr.stderr[-2000:]
    assert with_dtr.stdout == plain.stdout
    active, stats = stats_of(with_dtr)
    assert active == 1 and stats["budget_bytes"] == budget
    assert 0 < stats["peak_reserved_bytes"] <= budget
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0


def test_same_binary_under_the_preload(binary, budget):
    plain = run(binary, DTR_ENABLE="0")
    pre = run(binary, LD_PRELOAD=dtr_lib(), DTR_BUDGET=budget)
    assert pre.returncode == 0, pre.stderr[-2000:]
    assert pre.stdout == plain.stdout and stats_of(pre)[1]["evictions"] > 0


def test_infeasible_budget_gets_dtrs_out_of_memory_error(binary):
    r = run(binary, DTR_BUDGET="900KiB")
    assert r.returncode != 0
    assert "c10::OutOfMemoryError" in r.stderr and "out of memory under DTR_BUDGET" in r.stderr
    assert "constants" in r.stderr
