"""bench/step_instructions.py without valgrind (about 10 s): its worker runs every mode of the chain
in one process, its client requests doing nothing off valgrind, and what it reports must hold
together: the same losses in every mode, no rematerialization under dtr, nothing recorded with no
budget and ops recorded under the budget that never binds. Then the
parts that read valgrind's output and judge a run: the dump parser on callgrind's own format,
and the check that fails a run whose losses differ or that recomputed."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "step_instructions.py")


def load_script():
    spec = importlib.util.spec_from_file_location("step_instructions", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# pytest-xdist (scripts/test.sh) runs the tests that read the worker's result on one worker, so the
# worker runs once.
WORKER_RESULT = pytest.mark.xdist_group("step_instructions_worker")


@pytest.fixture(scope="module")
def worker_result(tmp_path_factory):
    si = load_script()
    tmp = tmp_path_factory.mktemp("step_instructions")
    src, helper = tmp / "helper.c", tmp / "libhelper.so"
    src.write_text(si.HELPER_C)
    # valgrind's headers come with scripts/setup.sh (Debian's valgrind package).
    c = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(src)], capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTR_") and k != "LD_PRELOAD"}
    r = subprocess.run([sys.executable, SCRIPT, "--worker", "chain", "--helper", str(helper), "--warmup", "1",
                        "--steps", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("STEP_INSTRUCTIONS ")]
    assert len(lines) == 1, r.stdout
    return si, json.loads(lines[0][len("STEP_INSTRUCTIONS "):])


@WORKER_RESULT
def test_every_mode_trains_the_same_and_dtr_records_under_a_budget_only(worker_result):
    si, result = worker_result
    assert list(result) == list(si.MODES)
    plain = result["plain"]["losses"]
    assert len(plain) == 2 and all(isinstance(x, float) for x in plain)
    for mode in si.MODES[1:]:
        assert result[mode]["losses"] == plain, mode
        assert result[mode]["rematerializations"] == 0, mode
    # Note [Recording starts with a budget]: with no budget every op passes through.
    assert result["no budget"]["ops_recorded"] == 0 and result["no budget"]["eager_evictions"] == 0
    assert result["1 TiB budget"]["ops_recorded"] > 100  # 64 layers forward and backward, and the step
    assert result["1 TiB budget"]["eager_evictions"] > 0  # dead activations
    si.check("chain", {mode: dict(result[mode], instructions_per_step=1) for mode in si.MODES})


@WORKER_RESULT
def test_check_fails_a_run_whose_losses_differ_that_recomputed_or_recorded_with_no_budget(worker_result):
    si, result = worker_result
    changed = json.loads(json.dumps(result))
    changed["1 TiB budget"]["losses"][-1] += 1e-7
    with pytest.raises(SystemExit, match="differ"):
        si.check("chain", changed)
    recomputed = json.loads(json.dumps(result))
    recomputed["no budget"]["rematerializations"] = 0.5
    with pytest.raises(SystemExit, match="rematerialized"):
        si.check("chain", recomputed)
    recorded = json.loads(json.dumps(result))
    recorded["no budget"]["ops_recorded"] = 1
    with pytest.raises(SystemExit, match="under a budget only"):
        si.check("chain", recorded)


def test_dumps_are_read_by_mode(tmp_path):
    si = load_script()
    # The header of a dump as callgrind 3.19 writes it for CALLGRIND_DUMP_STATS_AT, and the one
    # it writes at exit (not a measured mode).
    for i, (trigger, total) in enumerate([("Client Request: measured: no budget", 1500),
                                          ("Client Request: measured: plain", 1000),
                                          ("Program termination", 7)]):
        (tmp_path / f"chain.123.{i + 1}").write_text(
            f"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 123\ncmd:  python\npart: {i + 1}\n\n"
            f"desc: I1 cache: \ndesc: Timerange: Basic block 0 - 10\ndesc: Trigger: {trigger}\n\n"
            f"positions: line\nevents: Ir\nsummary: {total}\n\nfn=(1) main\n0 {total}\n\ntotals: {total}\n")
    (tmp_path / "other.124.1").write_text("desc: Trigger: Client Request: measured: plain\ntotals: 5\n")
    assert si.dumped_events(str(tmp_path), "chain.") == {"no budget": {"Ir": 1500}, "plain": {"Ir": 1000}}
    rows = si.table(["chain"], {"chain": {"plain": {"instructions_per_step": 1000},
                                          "no budget": {"instructions_per_step": 1500, "ops_recorded": 0},
                                          "1 TiB budget": {"instructions_per_step": 1250, "ops_recorded": 10}}}
                    ).splitlines()
    assert rows[-1] == "| chain | 0.0M | 1.500x | 1.250x | 10 | 50, 25 |"


def test_simulated_cache_misses_are_read_and_tabled(tmp_path):
    """--cache-sim: callgrind's dump then counts nine events; each is read by name, and the table
    gains the L1 misses a step and the cycle estimate of Note [Simulated cache misses]."""
    si = load_script()
    events = "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw"
    for i, (mode, totals) in enumerate([("plain", "1000 400 200 20 30 10 1 2 3"),
                                        ("1 TiB budget", "1200 500 250 40 36 12 1 2 3")]):
        (tmp_path / f"chain.9.{i + 1}").write_text(
            f"desc: Trigger: Client Request: measured: {mode}\n\npositions: line\nevents: {events}\n"
            f"summary: {totals.split()[0]}\n\nfn=(1) main\n0 {totals}\n\ntotals: {totals}\n")
    read = si.dumped_events(str(tmp_path), "chain.")
    assert read["1 TiB budget"] == dict(zip(events.split(), [1200, 500, 250, 40, 36, 12, 1, 2, 3]))
    per_step = {mode: {"instructions_per_step": e["Ir"], "events_per_step": e} for mode, e in read.items()}
    per_step["plain"]["ops_recorded"] = 0
    per_step["1 TiB budget"]["ops_recorded"] = 10
    per_step["no budget"] = {"instructions_per_step": 1000, "ops_recorded": 0}
    rows = si.table(["chain"], {"chain": per_step}, cache_sim=True).splitlines()
    assert rows[1].count("---") == rows[0].count("|") - 1, rows
    # Cycles: plain 1000 + 10 x 60 + 100 x 6 = 2200; 1 TiB 1200 + 10 x 88 + 100 x 6 = 2680.
    assert rows[-1] == ("| chain | 0.0M | 1.000x | 1.200x | 10 | 0, 20 | 0.00M -> 0.00M (2.00x) | "
                        "0.00M -> 0.00M (1.20x) | 1.218x |"), rows[-1]
