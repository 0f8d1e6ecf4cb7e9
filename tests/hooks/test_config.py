"""Start-up configuration errors and the infeasible-budget error."""
import os

from conftest import HERE, PY, run

TRAIN = os.path.join(HERE, "train.py")


def test_malformed_budget_stops_at_startup():
    r = run([PY, "-c", "import torch; print('ran')"], preload=True, DTR_BUDGET="12XB")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "DTR_BUDGET" in r.stderr and "accepted" in r.stderr
    assert "ran" not in r.stdout


def test_unknown_dtr_variable_stops_at_startup():
    r = run([PY, "-c", "import torch"], preload=True, DTR_BUGDET="1G")
    assert r.returncode == 2 and "DTR_BUGDET" in r.stderr, r.stderr


def test_infeasible_budget_raises_oom_not_crash():
    r = run([PY, TRAIN, "mlp"], preload=True, DTR_BUDGET="64KiB")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "OutOfMemoryError" in r.stderr and "out of memory under DTR_BUDGET" in r.stderr


def test_preload_into_non_torch_process_is_light():
    r = run(["/bin/true"], preload=True, DTR_BUDGET="1G")
    assert r.returncode == 0
    # The preloaded shim must not pull in libtorch.
    r = run(["/bin/sh", "-c", "cat /proc/self/maps"], preload=True)
    assert "libtorch" not in r.stdout and "libdtr.so" in r.stdout


def test_budget_without_eviction_fails_where_dtr_succeeds():
    # The main job's claim: at this budget the run dies without rematerialization and trains
    # with it (same budget, same allocator; DTR_EVICT=0 only switches eviction off).
    import json
    plain = run([PY, TRAIN, "transformer"], preload=True)
    assert plain.returncode == 0, plain.stderr[-2000:]
    peak = json.loads(plain.stdout.strip().splitlines()[-1])["dtr"]["peak_allocated_bytes"]
    budget = str(int(peak * 0.8))
    no_evict = run([PY, TRAIN, "transformer"], preload=True, DTR_BUDGET=budget, DTR_EVICT="0")
    assert no_evict.returncode == 1 and "OutOfMemoryError" in no_evict.stderr, no_evict.stderr[-2000:]
    assert "Eviction is off (DTR_EVICT=0)" in no_evict.stderr, no_evict.stderr[-2000:]
    with_dtr = run([PY, TRAIN, "transformer"], preload=True, DTR_BUDGET=budget)
    assert with_dtr.returncode == 0, with_dtr.stderr[-2000:]
    result = json.loads(with_dtr.stdout.strip().splitlines()[-1])
    assert result["losses"] == json.loads(plain.stdout.strip().splitlines()[-1])["losses"]
    assert result["dtr"]["rematerializations"] > 0
