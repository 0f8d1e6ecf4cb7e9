"""One rule each: scenarios.py programs run plainly and under the preload (evicting everything
evictable mid-program through torch.ops.dtr.set_budget) must give bit-identical digests, with
evictions and rematerializations actually happening; with a rule switched off
(DTR_DEBUG_DISABLE_RULES) the same program must go wrong, showing the rule is needed."""
import json
import os
import subprocess

import pytest

from conftest import HERE, NEVER_BINDS, PY, REPO, build_dir, run

SCEN = os.path.join(HERE, "scenarios.py")
TRAIN = os.path.join(HERE, "train.py")


def scenario(name, preload, **env):
    if preload:
        env.setdefault("DTR_BUDGET", NEVER_BINDS)
    r = run([PY, SCEN, name], preload=preload, **env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r


_plain = {}


def plain(name):
    if name not in _plain:
        _plain[name] = scenario(name, False)[0]["out"]
    return _plain[name]


@pytest.mark.parametrize("name", ["rng", "views_inplace", "multi_output", "leaving", "threads", "set_budget",
                                  "raw_writes", "layout", "default_dtype", "batchnorm_stats",
                                  "foreign_memory", "replaced_memory", "deaths_while_locked", "overwritten",
                                  "deep_recipes"])
def test_scenario_bit_identical_with_evictions(name):
    res, r = scenario(name, True)
    assert res["out"] == plain(name)
    assert res["dtr"]["evictions"] > 0 and res["dtr"]["rematerializations"] > 0, res["dtr"]


def test_copies_of_overwritten_contents_come_back_bit_identical():
    """Note [Copies of overwritten contents]: the six whole copies take their originals' recipes
    (the others are frozen), and every tensor reads back as plain PyTorch computes it."""
    res, r = scenario("copies_overwritten", True)
    assert res["out"] == plain("copies_overwritten")
    assert res["dtr"]["copies_given_recipes"] == 6, res["dtr"]
    assert res["dtr"]["rematerializations"] > 0, res["dtr"]


def test_deaths_released_at_once_come_back_bit_identical():
    """Note [Deaths released at once]: storages dying while recorded ops read them are released
    in their deleter, and brought back (or kept, for a dead constant) when a replay needs them."""
    res, _ = scenario("dead_then_needed", True)
    assert res["out"] == plain("dead_then_needed")
    stats = res["dtr"]
    assert stats["deaths_released_at_once"] > 0 and stats["rematerializations"] > 0, stats


def test_views_take_the_short_path_only_when_they_may():
    """Note [Views the dispatcher passes by]: aten's metadata-only views take no path of dtr's, and
    one of an evicted storage leaves it evicted. Note [Views on a short path]: other views of
    resident tracked storages (numpy's included) skip the general path, one of an evicted storage
    (brought back) or of one no op has read (registered) does not. Every result is bit-identical
    to the plain run's."""
    res, _ = scenario("views_both_paths", True)
    assert res["out"] == plain("views_both_paths")
    assert res["extra"] == {"passed": 0, "resident": 2, "passed evicted": 0, "brought back by a passed view": 0,
                            "evicted": 0, "foreign": 1, "unseen": 0}, res["extra"]
    assert res["dtr"]["rematerializations"] > 0, res["dtr"]


def test_metadata_only_views_pass_dtr_by():
    """Note [Views the dispatcher passes by]: once dtr is active, the listed aten views have a
    fallthrough kernel on dtr's key (the dispatcher skips dtr for them, as in a plain run); an op
    that reads elements, and a view left off the list, have none (they reach the fallback)."""
    code = (
        "import torch, dtr\n"
        "dtr.enable(budget='1TiB')\n"
        "ft = torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough\n"
        "has = torch._C._dispatch_has_kernel_for_dispatch_key\n"
        "for op in ('aten::t', 'aten::view', 'aten::detach', 'aten::select.int', 'aten::slice.Tensor',\n"
        "           'aten::transpose.int', 'aten::expand', 'aten::split.Tensor', 'aten::unsqueeze', 'aten::permute'):\n"
        "    assert has(op, 'Fake') and ft(op, 'Fake'), op\n"
        "for op in ('aten::mm', 'aten::add.Tensor', 'aten::view.dtype', 'aten::lift_fresh', 'aten::copy_'):\n"
        "    assert not has(op, 'Fake'), op\n"
        "print('ok')\n")
    r = run([PY, "-c", code])
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("rule,name,must_differ", [
    # Rule 6 (RNG): random ops without a Generator argument (randn, rand, randint, randperm,
    # rand_like, dropout) replay from the saved default-generator state; the global stream is
    # unchanged. This was the CNN "momentum" wrong-loss bug: its input came from torch.randn.
    ("6", "rng", ["a", "b", "c", "d", "stream_after"]),
    # Rule 1 (mutations go through Runtime::Mutate, which applies rule 2): in-place ops through
    # views, out= variants, _foreach_*_ and copy_.
    ("1", "views_inplace", ["y", "z"]),
    # ... and batch norm's undeclared in-place update of its running statistics: evicted, they
    # would come back as their initial values and eval mode would read those, or (2.14) the
    # kernel reads them unallocated.
    ("1", "batchnorm_stats", ["eval_out", "buffers"]),
    # Rule 2 (readers of a mutated storage are detached first): z = y.t().contiguous() read y
    # before y.mul_(0.5); replayed afterwards it would read the halved values.
    ("2", "views_inplace", ["z"]),
    # Rule 4 (never record empty*): a buffer filled through numpy would replay as garbage.
    ("4", "raw_writes", ["buf", "sum"]),
    # Rule 5 (replays must reproduce the layout): a kernel that picks another layout on replay.
    ("5", "layout", ["y", "z", "ysum"]),
])
def test_rule_is_needed(rule, name, must_differ):
    r = run([PY, SCEN, name], preload=True, DTR_BUDGET=NEVER_BINDS, DTR_DEBUG_DISABLE_RULES=rule)
    if r.returncode != 0:
        # Going wrong loudly also shows the rule is needed, but only this way: reading memory
        # that was evicted. Any other failure is a broken test.
        assert "data is not allocated" in r.stderr, r.stderr[-2000:]
        return
    res = json.loads(r.stdout.strip().splitlines()[-1])
    wrong = [k for k in plain(name) if plain(name)[k] != res["out"].get(k)]
    for k in must_differ:
        assert k in wrong, (rule, wrong)


def test_default_dtype_is_replayed():
    """Rule 6 also covers the default dtype: torch.set_default_dtype between an op and its replay.
    Without it rule 5 turns the wrong replay into a loud error; without both, results are wrong."""
    r = run([PY, SCEN, "default_dtype"], preload=True, DTR_BUDGET=NEVER_BINDS, DTR_DEBUG_DISABLE_RULES="6")
    assert r.returncode != 0 and "cannot be rematerialized" in r.stderr, r.stderr[-2000:]
    res, _ = scenario("default_dtype", True, DTR_DEBUG_DISABLE_RULES="5,6")
    assert res["out"]["b"] != plain("default_dtype")["b"]


def test_rng_rule_needed_for_cnn_training():
    ref = json.loads(run([PY, TRAIN, "cnn"]).stdout.strip().splitlines()[-1])
    peak = json.loads(run([PY, TRAIN, "cnn"], preload=True).stdout.strip().splitlines()[-1])["dtr"][
        "peak_allocated_bytes"]
    budget = int(peak * 0.8)
    r = run([PY, TRAIN, "cnn"], preload=True, DTR_BUDGET=budget)
    good = json.loads(r.stdout.strip().splitlines()[-1])
    assert good["losses"] == ref["losses"] and good["params"] == ref["params"]
    r = run([PY, TRAIN, "cnn"], preload=True, DTR_BUDGET=budget, DTR_DEBUG_DISABLE_RULES="6")
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert bad["losses"] != ref["losses"]


def test_set_budget_lowers_and_refuses_impossible():
    res, r = scenario("set_budget", True)
    info = json.loads([l for l in r.stdout.splitlines() if l.startswith("INFO ")][0][5:])
    assert info["tiny"].startswith("OutOfMemoryError"), info
    assert info["budget_after_tiny"] == 1 << 40  # the old budget (NEVER_BINDS) is kept
    assert info["peak_after"] <= info["budget"] < info["before"], info


def test_stats_file(tmp_path):
    f = tmp_path / "stats.json"
    peak = json.loads(run([PY, TRAIN, "lstm"], preload=True).stdout.strip().splitlines()[-1])["dtr"][
        "peak_allocated_bytes"]
    budget = int(peak * 0.9)
    r = run([PY, TRAIN, "lstm"], preload=True, DTR_BUDGET=budget, DTR_STATS_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(f.read_text())
    for k in ("budget_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "evictions",
              "rematerializations", "remat_seconds", "ops_recorded"):
        assert k in s, k
    assert s["budget_bytes"] == budget
    assert 0 < s["peak_allocated_bytes"] <= s["peak_reserved_bytes"] <= budget
    assert s["evictions"] > 0 and s["rematerializations"] > 0 and s["ops_recorded"] > 0
    assert s["remat_seconds"] > 0


def test_stats_file_is_written_before_the_interpreters_teardown(tmp_path):
    """Note [Statistics before the interpreter's teardown] (hooks/activation.cc): a process that
    aborts after its atexit handlers (here os.abort, registered before torch's import, so it runs
    after dtr's handler; gloo's teardown does it for real) still leaves its DTR_STATS_FILE."""
    f = tmp_path / "stats.json"
    script = tmp_path / "abort_at_exit.py"
    script.write_text("import atexit, os\natexit.register(os.abort)\nimport torch\n"
                      "x = torch.randn(256, 256)\ny = (x @ x).relu().sum()\nprint(float(y))\n")
    r = run([PY, str(script)], preload=True, DTR_BUDGET=NEVER_BINDS, DTR_STATS_FILE=str(f))
    assert r.returncode != 0, "the script was meant to abort at exit"
    s = json.loads(f.read_text())
    assert s["ops_recorded"] > 0 and s["peak_allocated_bytes"] > 0


def test_a_binding_budget_recycles_cached_memory_instead_of_mapping_anew():
    """Note [Recycling a cached segment] (allocator/caching_allocator.cc): two sizes taking turns
    under a budget that holds only one of them at a time. The cached segment of the other size is
    resized (mremap) for each request instead of being released and a new one mapped, whose pages
    would all be faulted in again; the values are what they must be."""
    code = """
import json, torch, dtr
total = 0.0
for i in range(50):
    x = torch.ones(64 * 1024); total += float(x.sum()); del x         # 256 KiB
    y = torch.full((96 * 1024,), 2.0); total += float(y.sum()); del y  # 384 KiB
s = dtr.stats()
print(json.dumps(dict(total=total, allocator=s["allocator"], peak_reserved=s["peak_reserved_bytes"])))
"""
    r = run([PY, "-c", code], preload=True, DTR_BUDGET="500KiB")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["total"] == 50 * (64 * 1024 + 2 * 96 * 1024)
    a = out["allocator"]
    assert a["segment_resizes"] >= 98, a  # every request after the first two
    assert a["segment_allocs"] <= 4 and a["segment_frees"] == 0, a
    assert out["peak_reserved"] <= 500 * 1024


def test_small_tensors_are_aligned_and_cost_their_rounded_bytes():
    """Note [CPU allocator granularity] (hooks/cpu_allocator_adapter.cc): every CPU tensor's data
    is aligned to 64 bytes, as torch's own CPU allocator aligns it, and a small tensor takes its
    bytes and the slot header rounded to 64, not to CUDA's 512: 1,000 one-element tensors take
    128 bytes each (500 KiB in all at 512 each)."""
    code = """
import json, torch, dtr
before = dtr.stats()["allocated_bytes"]
keep = [torch.full((1,), float(i)) for i in range(1000)]
odd = [torch.empty(n, dtype=torch.uint8) for n in (1, 63, 65, 127, 129, 4097)]
print(json.dumps(dict(grew=dtr.stats()["allocated_bytes"] - before,
                      misaligned=[t.data_ptr() % 64 for t in keep + odd if t.data_ptr() % 64],
                      total=float(sum(float(t) for t in keep)))))
"""
    r = run([PY, "-c", code], preload=True, DTR_BUDGET="4MiB")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["misaligned"] == [] and out["total"] == sum(range(1000)), out
    # 1,000 x (4 B + a 64 B header, rounded to 128), plus the six odd sizes and the list.
    assert 1000 * 128 <= out["grew"] < 1000 * 128 + 64 * 1024, out


def test_recomputation_limit_turns_thrashing_into_a_clear_oom():
    """Note [Recomputation limit]: under a budget where dtr's replays and searches cost more than
    DTR_MAX_RECOMPUTE times the program's own time (its ops and, Note [Program time between
    ops], the time between them), the op that needs a replay raises torch.OutOfMemoryError
    saying the budget is too small to train at a useful speed; with the limit off, the same run
    trains."""
    peak = json.loads(run([PY, TRAIN, "lstm"], preload=True).stdout.strip().splitlines()[-1])["dtr"][
        "peak_allocated_bytes"]
    # Thrashing but feasible: constants are 40% of this LSTM's peak, and since Note [One victim
    # at a time] (hooks/engine.cc) it runs out of memory at 0.8 of it (dtr-sim on its trace too).
    # The peak is a plain run's (dtr records nothing with no budget: Note [Recording starts with
    # a budget]), 1-2% below the one dtr reported while it recorded with no budget, of which this
    # test took 0.85; 0.85 of the plain peak runs out of memory, 0.87 and 0.9 train.
    budget = int(peak * 0.9)
    slow = run([PY, TRAIN, "lstm"], preload=True, DTR_BUDGET=budget, DTR_MAX_RECOMPUTE=0)
    assert slow.returncode == 0, slow.stderr[-2000:]
    stats = json.loads(slow.stdout.strip().splitlines()[-1])["dtr"]
    assert stats["rematerializations"] > 0, stats
    # This program is mostly Python: its replays cost about 1% of its time (0.003 of it at the
    # first replay), which a limit of 0.05 of its ops' own time caught but no longer does. 0.001
    # stands in for a budget too small.
    limited = run([PY, TRAIN, "lstm"], preload=True, DTR_BUDGET=budget, DTR_MAX_RECOMPUTE="0.001")
    assert limited.returncode != 0, limited.stdout[-2000:]
    assert "OutOfMemoryError" in limited.stderr, limited.stderr[-2000:]
    assert "too small to train at a useful speed" in limited.stderr, limited.stderr[-2000:]
    assert "DTR_MAX_RECOMPUTE=0" in limited.stderr, limited.stderr[-2000:]
    bad = run([PY, TRAIN, "lstm"], preload=True, DTR_MAX_RECOMPUTE="-1")
    assert bad.returncode != 0 and "DTR_MAX_RECOMPUTE" in bad.stderr, bad.stderr[-2000:]


def test_trace_file_replays_in_simulator(tmp_path):
    f = tmp_path / "trace.txt"
    r = run([PY, TRAIN, "treelstm"], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    text = f.read_text()
    assert text.startswith("dtr-trace 6")
    # Note [Program time between ops]: the program's time between its ops, each gap at most 10 ms.
    waits = [float(line.split()[1]) for line in text.splitlines() if line.startswith("wait ")]
    assert len(waits) > 100 and all(0 < w <= 1e7 for w in waits), waits[:10]
    # Note [Results of the backward pass]: the ops the autograd engine runs for the backward pass
    # say so; the forward pass's (sigmoid and tanh run only there) do not.
    ops = [line.split() for line in text.splitlines() if line.startswith(("call ", "mutate ", "overwrite "))]
    backward = [o for o in ops if o[1].endswith("_backward")]
    assert backward and all("pass=backward" in o for o in backward), backward[:3]
    forward = [o for o in ops if o[1] in ("aten::sigmoid", "aten::tanh")]
    assert forward and not any("pass=backward" in o for o in forward), forward[:3]
    sim = os.path.join(build_dir(), "bin", "dtr-sim")
    assert os.path.exists(sim), f"{sim} is not built (scripts/test.sh builds it; BUILD_DIR names the build)"
    p = subprocess.run([sim, "--trace", str(f)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "ok" in p.stdout, p.stdout[-2000:]


def test_trace_waits_are_the_program_time_between_ops_at_most_10_ms(tmp_path):
    """Note [Program time between ops]: before an op, the trace gives the time the program spent
    since the last managed op ended (`wait`, in ns): a 4 ms sleep between two ops shows as at least
    4 ms, a 30 ms one as the cap, 10 ms."""
    f = tmp_path / "trace.txt"
    code = """
import time, torch
x = torch.randn(64, 64)
for i in range(3):
    y = x @ x
    time.sleep(0.004)
    z = y.add(1)
    time.sleep(0.03)
"""
    r = run([PY, "-c", code], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = f.read_text().splitlines()
    before = {}  # op name -> the waits just before its lines
    for i, line in enumerate(lines[:-1]):
        if line.startswith("wait "):
            op = next((l for l in lines[i + 1:] if l.startswith(("call ", "opaque ", "mutate "))), "- none")
            before.setdefault(op.split()[1], []).append(int(line.split()[1]))
    adds = before.get("aten::add.Tensor", [])
    mms = before.get("aten::mm", [])
    assert len(adds) == 3 and all(4e6 <= w <= 1e7 for w in adds), before
    assert mms.count(10_000_000) == 2, before  # after the 30 ms sleeps of the first two rounds


def test_a_wait_leaves_out_the_replays_and_searches_between_the_ops(tmp_path):
    """Note [Program time between ops]: what dtr does between two managed ops is its own time, not
    the program's. Here a replay brought back by dtr.expose runs between two ops (and a search by
    set_budget before it): the wait before the next op leaves it out. Counted in, that wait would be
    the replay's time, up to the 10 ms cap. The bound is taken from the gap the script itself
    measures, so a stall of the machine in between grows both alike."""
    f = tmp_path / "trace.txt"
    code = """
import json, time, torch
torch.set_num_threads(1)
x = torch.randn(1024, 1024)
a = x @ x  # the replay below runs this again: tens of ms on one thread
c = torch.randn(1024, 1024)  # the last managed op before the gap
t0 = time.perf_counter_ns()
torch.ops.dtr.pin(x)  # dtr's own ops are not managed ops: they do not end the gap
torch.ops.dtr.pin(c)
before = json.loads(torch.ops.dtr.stats())
torch.ops.dtr.set_budget(9 * 2**20)  # 12 MiB in use: a, the one unpinned storage, is evicted
torch.ops.dtr.unpin(c)
torch.ops.dtr.expose(a, False)  # brings a back, evicting c
after = json.loads(torch.ops.dtr.stats())
t1 = time.perf_counter_ns()
s = a.sum()  # the first managed op after it
print("replays", after["replays"] - before["replays"],
      "remat_ns", int((after["remat_seconds"] - before["remat_seconds"]) * 1e9), "gap_ns", t1 - t0)
"""
    r = run([PY, "-c", code], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    _, replays, _, remat_ns, _, gap_ns = r.stdout.split()
    replays, remat_ns, gap_ns = int(replays), int(remat_ns), int(gap_ns)
    assert replays == 1, r.stdout
    assert remat_ns > 4e6, r.stdout  # else the check below would say little
    lines = f.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("call aten::sum"))
    assert lines[at - 1].startswith("wait "), lines[at - 3:at + 1]
    wait = int(lines[at - 1].split()[1])
    # With the replay left out, the wait is the gap less the replay (and the searches), plus the
    # few microseconds the script's clock does not see; with it counted, the gap up to 10 ms.
    assert wait < gap_ns - remat_ns + 2e6, (wait, gap_ns, remat_ns)


def test_trace_marks_let_the_simulator_measure_steps_apart(tmp_path):
    """Note [Steady-state steps]: dtr.trace_mark writes a mark into the trace, and dtr-sim reports
    the costs so far at each one, so the steps after a warm-up can be measured on their own. A
    label that is not one word of printable ASCII is refused with a message (by the package and by
    the op), and nothing is written for it; without dtr, dtr.trace_mark checks and does nothing."""
    f = tmp_path / "trace.txt"
    code = """
import torch, dtr
w = torch.randn(64, 64, requires_grad=True)
for step in range(3):
    dtr.trace_mark(f"step-{step}")
    x = torch.randn(32, 64)
    (x @ w).tanh().sum().backward()
for bad in ("two words", "", "étape"):
    try:
        dtr.trace_mark(bad)
    except ValueError as e:
        print("refused:", e)
try:
    torch.ops.dtr.trace_mark("two words")  # the op itself checks too
except RuntimeError as e:
    print("op refused:", e)
"""
    r = run([PY, "-c", code], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    refused = [line for line in r.stdout.splitlines()
               if line.startswith("refused: dtr.trace_mark: the label must be one word of printable ASCII")]
    assert len(refused) == 3, r.stdout + r.stderr[-2000:]
    assert "op refused: dtr.trace_mark: the label must be one word of printable ASCII" in r.stdout, r.stdout
    text = f.read_text()
    assert [line for line in text.splitlines() if line.startswith("mark")] == ["mark step-0", "mark step-1", "mark step-2"]
    sim = os.path.join(build_dir(), "bin", "dtr-sim")
    p = subprocess.run([sim, "--trace", str(f)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(p.stdout.strip().splitlines()[-1])
    marks = d["marks"]
    assert [m["label"] for m in marks] == ["step-0", "step-1", "step-2"]
    # No budget: nothing is rematerialized, and each step (mm, tanh, sum, backward) adds base cost.
    assert all(m["total_cost"] == m["base_cost"] for m in marks)
    assert 0 < marks[1]["base_cost"] - marks[0]["base_cost"] and marks[2]["base_cost"] < d["base_cost"]
    assert marks[0]["event"] < marks[1]["event"] < marks[2]["event"] < d["events"]
    plain = run([PY, "-c", "import dtr; dtr.trace_mark('step-0'); print(dtr.is_enabled())\n"
                 "try:\n    dtr.trace_mark('a b')\nexcept ValueError as e:\n    print('refused')"])
    assert plain.returncode == 0 and plain.stdout.split() == ["False", "refused"], plain.stdout + plain.stderr[-2000:]


def test_trace_marks_the_ops_of_a_backward_pass(tmp_path):
    """Note [Results of the backward pass]: the ops the autograd engine runs for a backward pass
    are marked pass=backward, those of a backward that builds a graph (create_graph=True) and of
    its double backward included; forward ops are not, under torch.no_grad either, and neither is
    the optimizer step, which runs with gradients off but outside a backward pass. (The seed
    gradient, ones_like, is made before the engine starts.)"""
    f = tmp_path / "trace.txt"
    code = """
import torch, dtr
x = torch.randn(16, 16)
w = torch.randn(16, 16, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
dtr.trace_mark("no_grad")
with torch.no_grad():
    a = torch.tanh(x @ w)
dtr.trace_mark("forward")
y = torch.sigmoid(x @ w).sum()
dtr.trace_mark("grad")
g, = torch.autograd.grad(y, w, create_graph=True)
dtr.trace_mark("forward2")
z = (g * g).sum()
dtr.trace_mark("backward2")
z.backward()
dtr.trace_mark("step")
opt.step()
dtr.trace_mark("end")
"""
    r = run([PY, "-c", code], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    phases, phase = {}, None
    for line in f.read_text().splitlines():
        if line.startswith("mark "):
            phase = line.split()[1]
        elif phase and line.startswith(("call ", "mutate ", "overwrite ")):
            phases.setdefault(phase, []).append(line.split())
    assert set(phases) == {"no_grad", "forward", "grad", "forward2", "backward2", "step"}, phases.keys()
    for name in ("no_grad", "forward", "forward2", "step"):
        assert not any("pass=backward" in op for op in phases[name]), (name, phases[name])
    for name in ("grad", "backward2"):
        assert any("pass=backward" in op for op in phases[name]), (name, phases[name])
        unmarked = {op[1] for op in phases[name] if "pass=backward" not in op}
        assert unmarked <= {"aten::ones_like"}, (name, unmarked)
    assert any(op[1] == "aten::sigmoid_backward" for op in phases["grad"]), phases["grad"]


def test_trace_gives_each_ops_scratch_memory(tmp_path):
    """Note [Scratch memory]: CPU convolution allocates a workspace it frees before returning.
    The trace says how much, right after the op's cost, and dtr-sim counts it: a budget below the
    convolution's inputs, output and workspace cannot work, while the same trace without the
    workspaces simulates under it."""
    f = tmp_path / "trace.txt"
    r = run([PY, TRAIN, "cnn"], preload=True, DTR_TRACE_FILE=str(f))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = f.read_text().splitlines()
    scratch = {}
    for line in lines:
        tok = line.split()
        if tok and tok[0] in ("call", "opaque", "mutate", "overwrite", "mutate-opaque") and len(tok) > 3 \
                and tok[3].startswith("scratch="):
            scratch.setdefault(tok[1], []).append(int(tok[3][len("scratch="):]))
    convs = [line for line in lines if line.startswith("call aten::convolution ")]
    assert convs and len(scratch.get("aten::convolution", [])) == len(convs), (convs[:3], scratch)
    assert min(scratch["aten::convolution"]) > 0
    sim = os.path.join(build_dir(), "bin", "dtr-sim")
    stripped = tmp_path / "without_scratch.txt"
    stripped.write_text("\n".join(" ".join(t for t in line.split() if not t.startswith("scratch="))
                                  for line in lines) + "\n")

    def simulate(trace, *args):
        p = subprocess.run([sim, "--trace", str(trace), *args], capture_output=True, text=True, timeout=120)
        result = json.loads(p.stdout.splitlines()[-1])
        assert p.returncode == (0 if result["status"] == "ok" else 1), p.stdout[-2000:] + p.stderr[-2000:]
        return result

    with_scratch, without = simulate(f), simulate(stripped)
    floor, floor_without = with_scratch["stats"]["floor_bytes"], without["stats"]["floor_bytes"]
    assert floor > floor_without, (floor, floor_without)
    assert with_scratch["peak_bytes"] >= without["peak_bytes"]
    assert simulate(f, "--budget", str(floor - 1))["status"] == "oom"
    assert simulate(stripped, "--budget", str(floor - 1))["status"] == "ok"


def test_numpy_tolist_of_evicted_tensors():
    """.numpy() goes through detach (a view: dtr rematerializes the storage), tolist() of an
    evicted tensor raises torch's clear 'unallocated storage' error instead of reading garbage."""
    code = ("import torch\n"
            "torch.manual_seed(0)\n"
            "x=[torch.randn(64,64).exp() for _ in range(4)]; y=[t*3 for t in x]\n"
            "try: torch.ops.dtr.set_budget(1)\n"
            "except Exception: pass\n"
            "torch.ops.dtr.set_budget(0)\n"
            "import hashlib; print([hashlib.sha256(t.numpy().tobytes()).hexdigest()[:8] for t in y])\n"
            "try:\n  y[0].tolist(); print('TOLIST ok')\n"
            "except RuntimeError as e: print('TOLIST', str(e).splitlines()[0])\n")
    plain_code = code.replace("torch.ops.dtr.set_budget", "(lambda b: None)")
    a = run([PY, "-c", plain_code])
    b = run([PY, "-c", code], preload=True, DTR_BUDGET=NEVER_BINDS)
    assert a.returncode == 0 and b.returncode == 0, b.stderr[-2000:]
    assert a.stdout.splitlines()[0] == b.stdout.splitlines()[0]
    assert b.stdout.splitlines()[1] in ("TOLIST ok", "TOLIST tolist() shouldn't be called on a tensor with unallocated storage")


def test_two_training_threads_share_a_budget():
    """Two models train concurrently on Python threads under one budget; each thread's losses and
    parameters equal the plain run's whatever the interleaving. The budget is set on activations
    (issue 16's form): what the two models hold after training (parameters, gradients, momentum,
    data: train.py's solo runs, with set_to_none gradients) plus 0.9 of the rest of their summed
    solo peaks; the threads zero their gradients in place, which keeps them resident.
    Calibration, not a guarantee: a thread that runs out of room counts the other thread's memory
    in flight (tensors it allocated that no op has read yet, its pins), which it can neither evict
    nor wait for, so how low a shared budget can go depends on the interleaving. At 0.6 of the
    activations (0.85 of the summed peaks) the CNN thread ran out of memory in 1 CI run of 3, at
    0.75 in 1 of 2 (with 244 KiB of the other thread's untracked memory); lowering that floor is
    issue 16's."""
    ref = plain("train_threads")
    solo = [json.loads(run([PY, TRAIN, m], preload=True).stdout.strip().splitlines()[-1])["dtr"]
            for m in ("mlp", "cnn")]
    peaks = sum(s["peak_allocated_bytes"] for s in solo)
    held = sum(s["allocated_bytes"] for s in solo)
    budget = int(held + 0.9 * (peaks - held))
    evictions = remats = 0
    for _ in range(4):
        res, _ = scenario("train_threads", True, DTR_BUDGET=budget)
        assert res["out"] == ref, json.dumps({k: v for k, v in res["out"].items() if "error" in v})[:4000]
        st = res["dtr"]
        assert st["peak_reserved_bytes"] <= budget, st
        evictions += st["evictions"]
        remats += st["rematerializations"]
    assert evictions > 0 and remats > 0, (evictions, remats)


def test_arguments_are_released():
    """Tensors an op takes die with their last Python reference (the fallback's copies of its
    arguments are all dropped), through ops that run, are evicted and brought back, write in place,
    make views, throw in their kernel or fail before it; bit-identical."""
    res, _ = scenario("released_arguments", True)
    assert res["out"] == plain("released_arguments")
    assert res["out"]["alive"] == 0 and res["out"]["errors"] == 60, res["out"]
    assert res["extra"] == {"failed_before_the_op": True}, res["extra"]
    assert res["dtr"]["rematerializations"] > 0, res["dtr"]


def test_no_deadlock_with_a_thread_holding_the_gil():
    """Note [No Python decref under the engine lock] (hooks/fallback.cc), for increfs too: ops on a
    tensor Python alone holds, whose kernels take references of their inputs while dtr's engine
    lock is held, beside a thread that holds the GIL while it waits for that lock (Tensor.numpy()),
    finish. (Kernels on dtr's key that borrowed such a tensor without a reference of dtr's, tried
    in stop 83, hung here: runtime/README.md, "Unboxed kernels for hot ops: tried, not kept".)"""
    r = run([PY, SCEN, "gil_holder_beside_ops"], preload=True, timeout=120, DTR_BUDGET=NEVER_BINDS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["out"]["both_ran"]
