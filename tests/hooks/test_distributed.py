"""dtr under torch.distributed (2 ranks, gloo, CPU): every rank under its own budget, DDP in each
bucket mode, no_sync, unused parameters and static graph, FSDP (fully_shard), and collectives of
every kind mixed into training. Losses and final weights must be bit-identical to the same job
without dtr, with evictions and rematerializations on every rank; an infeasible budget on one
rank must end the whole job with OutOfMemoryError in bounded time. The three ways to launch
(DTR_* in torchrun's environment, python -m dtr -m torch.distributed.run, dtr-run -- torchrun)
must all put both ranks under dtr, and DTR_STATS_FILE's {rank} must keep their files apart."""
import json
import os
import re
import shutil
import time

import pytest

from conftest import NEVER_BINDS, HERE, PY, run

SCRIPT = os.path.join(HERE, "dist_train.py")
RANKS = 2
MODES = ["ddp", "ddp_bucket_view", "ddp_no_sync", "ddp_unused", "ddp_static", "fsdp", "collectives"]
# Each rank's budget after the warm-up steps, as a fraction of its own peak so far: low enough
# that every rank evicts and rematerializes, above this model's floor (0.8 fails: replays lock
# their inputs, issue 16).
FRACTION = 0.85
# The collectives job all-reduces an activation: its result comes from communication, a constant
# dtr never evicts, so less of the peak is evictable. With unused parameters, steps differ and
# the peak of the warm-up steps is not the largest step's: 0.85 of it failed once in three.
MODE_FRACTION = {"collectives": 0.9, "ddp_unused": 0.9}


def torchrun_args(*script_args):
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", "--max-restarts=0",
            SCRIPT, *script_args]


# gloo's teardown sometimes aborts a rank after the job is done (dist_train.py's barrier before
# destroy_process_group made it rarer, not impossible). It happens in plain runs too: in stop 31,
# 2 of 14 runs of the budgeted tests on torch 2.13 aborted so, once in the reference job without
# dtr. Such a job is launched once more; if that one aborts the same way after every rank wrote
# its results (twice in a row in stop 32's CI, on a loaded machine), the results stand: they are
# complete, and the assertions on them are the test.
TEARDOWN_ABORT = "terminate called without an active exception"


def launch(tmp_path, tag, cmd, timeout=300, relaunch_after_teardown_abort=True, **env):
    out = tmp_path / tag
    out.mkdir()
    t0 = time.monotonic()
    r = run(cmd, timeout=timeout, DIST_OUT=out, **env)
    r.seconds = time.monotonic() - t0
    # The abort and nothing else: a rank killed by SIGABRT, no rank reporting an error.
    r.teardown_aborted = (r.returncode != 0 and TEARDOWN_ABORT in r.stderr and "(SIGABRT)" in r.stderr
                          and re.search(r"\[rank\d+\]: ", r.stderr) is None
                          and all((out / f"rank{i}.json").exists() for i in range(RANKS)))
    if r.teardown_aborted and relaunch_after_teardown_abort:
        return launch(tmp_path, tag + "-again", cmd, timeout, relaunch_after_teardown_abort=False, **env)
    if r.teardown_aborted:
        print(f"{tag}: gloo's teardown aborted again after every rank wrote its results; they stand")
        r.returncode = 0
    r.ranks = []
    if r.returncode != 0:
        # The whole output stays with the test's files; the assertion shows where the ranks
        # failed (faulthandler's dumps and errors come before torchrun's long summary).
        (out / "stderr.txt").write_text(r.stderr)
        key = [line for line in r.stderr.splitlines()
               if any(w in line for w in ("Error", "error:", "Fatal", "terminate", "what()", "File ", "Thread 0x"))]
        r.why = "\n".join(key[:60]) + "\n...\n" + r.stderr[-2000:]
    if r.returncode == 0:
        r.ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]
    return r


def assert_same_training(ref, got):
    for a, b in zip(ref.ranks, got.ranks):
        assert a["losses"] == b["losses"], (a["rank"], a["losses"], b["losses"])
        assert a["params"] == b["params"], a["rank"]
        assert a.get("extra") == b.get("extra"), a["rank"]


def assert_under_pressure(r):
    for rank in r.ranks:
        s = rank["dtr"]
        assert s["evictions"] > 0 and s["rematerializations"] > 0, (rank["rank"], s)
        assert s["peak_reserved_bytes"] <= rank.get("budget", s["budget_bytes"]), (rank["rank"], s)


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    """The plain DDP job, and a fixed budget in bytes as users give it: FRACTION of the largest
    rank peak of the same job under dtr with no budget."""
    plain = launch(tmp_path_factory.mktemp("plain"), "ddp", [PY, *torchrun_args("ddp")])
    assert plain.returncode == 0, plain.why
    peaks = launch(tmp_path_factory.mktemp("peaks"), "ddp", [PY, *torchrun_args("ddp")], DTR_ENABLE=1)
    assert peaks.returncode == 0, peaks.why
    for rank in peaks.ranks:
        # Memory held between steps is flat, as without dtr. It grew by one set of gradients
        # per step (SGD's momentum buffers kept every step's gradient) before Note [Dead
        # constants in accumulating recipes].
        held = rank["allocated_after_step"]
        assert max(held[1:]) <= 1.02 * held[1], (rank["rank"], held)
    return plain, int(FRACTION * max(k["dtr"]["peak_allocated_bytes"] for k in peaks.ranks))


@pytest.mark.parametrize("mode", MODES)
def test_training_is_bit_identical_under_a_budget_on_every_rank(tmp_path, mode):
    ref = launch(tmp_path, "plain", [PY, *torchrun_args(mode)])
    assert ref.returncode == 0, ref.why
    stats = tmp_path / "stats-{rank}.json"
    fraction = MODE_FRACTION.get(mode, FRACTION)
    got = launch(tmp_path, "dtr", [PY, *torchrun_args(mode, "--budget-fraction", str(fraction))],
                 DTR_ENABLE=1, DTR_STATS_FILE=stats)
    assert got.returncode == 0, got.why
    assert_same_training(ref, got)
    assert_under_pressure(got)
    # {rank} kept the ranks' statistics apart, and each file is that rank's. A rank whose teardown
    # gloo aborted (TEARDOWN_ABORT, twice in a row: its results stand) may have died before dtr
    # wrote the file (in destroy_process_group, before the interpreter's atexit handlers: Note
    # [Statistics before the interpreter's teardown]), so there only the files written are
    # checked, and there may be none (CI, stop 72: both ranks of the fsdp job, twice).
    files = [(rank, tmp_path / f"stats-{rank['rank']}.json") for rank in got.ranks]
    written = [(rank, f) for rank, f in files if f.exists() or not got.teardown_aborted]
    assert written or got.teardown_aborted, "no rank wrote its DTR_STATS_FILE"
    for rank, f in written:
        assert json.loads(f.read_text())["rematerializations"] >= rank["dtr"]["rematerializations"]
    print(f"{mode}: " + "; ".join(
        f"rank {k['rank']}: budget {k['budget']} B = {fraction} x {k['peak_before_budget']} B, "
        f"evictions {k['dtr']['evictions']}, remats {k['dtr']['rematerializations']}" for k in got.ranks))


# On one pytest-xdist worker (scripts/test.sh), so ddp_reference's two jobs run once.
@pytest.mark.xdist_group("ddp_reference")
@pytest.mark.parametrize("launcher", ["env", "python -m dtr", "dtr-run"])
def test_every_launcher_puts_every_rank_under_its_budget(tmp_path, ddp_reference, launcher):
    plain, budget = ddp_reference
    dtr_run = shutil.which("dtr-run", path=os.path.dirname(PY))
    cmd = {
        "env": [PY, *torchrun_args("ddp")],
        "python -m dtr": [PY, "-m", "dtr", "--budget", str(budget), *torchrun_args("ddp")],
        "dtr-run": [dtr_run, "--budget", str(budget), "--", PY, *torchrun_args("ddp")],
    }[launcher]
    env = {"DTR_BUDGET": budget} if launcher == "env" else {}
    got = launch(tmp_path, "dtr", cmd, **env)
    assert got.returncode == 0, got.why
    assert_same_training(plain, got)
    for rank in got.ranks:
        assert rank["dtr"]["budget_bytes"] == budget, rank["dtr"]
    assert_under_pressure(got)


def test_an_infeasible_budget_on_one_rank_ends_the_job(tmp_path):
    # Recording from the start (Note [Recording starts with a budget]), so that set_budget can
    # evict what the first steps left to get under the new budget, and the next step cannot fit.
    got = launch(tmp_path, "dtr", [PY, *torchrun_args("ddp", "--infeasible-rank", "1")], timeout=240,
                 DTR_BUDGET=NEVER_BINDS)
    assert got.returncode != 0
    assert "[rank1]: torch.OutOfMemoryError: dtr:" in got.stderr, got.stderr[-3000:]
    assert "out of memory under DTR_BUDGET" in got.stderr, got.stderr[-3000:]
    assert "[rank0]: torch.OutOfMemoryError" not in got.stderr, got.stderr[-3000:]
    # torchrun tore the job down: rank 0 did not wait for its peer forever (gloo's own timeout
    # is 30 minutes).
    assert got.seconds < 180, got.seconds
    print(f"infeasible budget on rank 1: job ended in {got.seconds:.1f} s")


def test_bad_stats_file_placeholder_stops_every_rank_at_startup(tmp_path):
    got = launch(tmp_path, "dtr", [PY, *torchrun_args("ddp")], timeout=120,
                 DTR_STATS_FILE=tmp_path / "stats-{rnak}.json")
    assert got.returncode != 0
    assert "unknown placeholder {rnak}" in got.stderr, got.stderr[-3000:]
