"""Note [Idle far below the budget] (hooks/fallback.cc): under a budget the program's steps stay
far below, dtr goes idle after a quiet step and records nothing; when memory nears the budget
again it resumes before the op that finds it there, evicts and rematerializes as before, and the
training is bit-identical to a plain run throughout."""
import json

from conftest import PY, run as run_process

# A 16-layer MLP of width 128 with batch norm (running statistics written in place every step,
# idle or not) and dropout (random: replayed from its generator's state): 3 MiB of weights,
# gradients and momentum, and a step that holds about 16 x 5 activations of batch x 128 floats,
# 2.5 MiB at a batch of 64, about 40 MiB at 1024.
PROGRAM = r"""
import hashlib, json, sys, torch
torch.manual_seed(0)
on = sys.argv[1] == "dtr"
batches = [int(b) for b in sys.argv[2].split(",")]
if on:
    import dtr
    budget = int(sys.argv[3])
    if budget:
        dtr.set_budget(budget)
layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.BatchNorm1d(128), torch.nn.Tanh(),
                                                   torch.nn.Dropout(0.1)) for _ in range(16)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01, momentum=0.9)
out = {"losses": [], "steps": []}
for i, b in enumerate(batches):
    x = torch.randn(b, 128)
    opt.zero_grad()
    loss = layers(x).square().mean()
    loss.backward()
    opt.step()
    out["losses"].append(loss.item())
    if on:
        st = dtr.stats()
        out["steps"].append({k: st[k] for k in ("idle", "idle_periods", "ops_recorded", "evictions", "eager_evictions",
                                               "rematerializations", "peak_reserved_bytes")})
out["params"] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in layers.state_dict().values())).hexdigest()
print(json.dumps(out))
"""


def run(mode, batches, budget=0, **env):
    args = [PY, "-c", PROGRAM, mode, ",".join(map(str, batches)), str(budget)]
    r = run_process(args, preload=mode == "dtr", **env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def same_training(res, plain):
    assert res["losses"] == plain["losses"] and res["params"] == plain["params"]


def test_idle_under_a_budget_that_never_binds():
    batches = [64] * 6
    plain = run("plain", batches)
    res = run("dtr", batches, 1 << 40)
    same_training(res, plain)
    steps = res["steps"]
    # The first step's backward pass ends it: dtr goes idle at the next recorded op (the
    # optimizer's first update), so the later steps record nothing but the optimizer's writes
    # into the parameters and momentum buffers that were recorded before (Note [Ops while paused]:
    # the recipes reading them are detached, which the runtime counts as an op).
    assert [s["idle"] for s in steps] == [True] * 6, steps
    assert steps[-1]["idle_periods"] == 1
    idle_per_step = [b["ops_recorded"] - a["ops_recorded"] for a, b in zip(steps, steps[1:])]
    # Recording throughout with DTR_IDLE_BELOW=0.
    rec = run("dtr", batches, 1 << 40, DTR_IDLE_BELOW="0")
    same_training(rec, plain)
    assert not any(s["idle"] for s in rec["steps"]) and rec["steps"][-1]["idle_periods"] == 0
    per_step = [b["ops_recorded"] - a["ops_recorded"] for a, b in zip(rec["steps"], rec["steps"][1:])]
    assert min(per_step) > 100 and 4 * max(idle_per_step) < min(per_step), (idle_per_step, per_step)


def test_idle_ends_where_memory_nears_the_budget():
    """Small steps go idle; a step 16 times larger needs more than the budget: dtr resumes at the
    op that finds half the budget allocated, evicts what that step made since, keeps the budget
    and trains bit-identically; quiet steps after it make dtr idle again."""
    small, large = 64, 1024
    peak = run("dtr", [large], 1 << 40, DTR_IDLE_BELOW="0")["steps"][0]["peak_reserved_bytes"]
    budget = int(peak * 0.6)
    batches = [small, small, small, large, small, small, small, small]
    plain = run("plain", batches)
    res = run("dtr", batches, budget)
    same_training(res, plain)
    steps = res["steps"]
    assert all(s["peak_reserved_bytes"] <= budget for s in steps), (budget, steps)
    assert steps[2]["idle"] and steps[2]["idle_periods"] == 1, steps
    # The large step: recorded from half the budget on, evicting and rematerializing.
    assert not steps[3]["idle"], steps
    assert steps[3]["ops_recorded"] > steps[2]["ops_recorded"], steps
    pressure = [s["evictions"] - s["eager_evictions"] for s in steps]
    assert pressure[3] > pressure[2] and steps[3]["rematerializations"] > steps[2]["rematerializations"], steps
    # Idle again after two quiet steps (the wait doubled when the idle period ended).
    assert steps[-1]["idle"] and steps[-1]["idle_periods"] == 2, steps
    assert not steps[4]["idle"], steps
    # Recording throughout gives the same training.
    same_training(run("dtr", batches, budget, DTR_IDLE_BELOW="0"), plain)


def test_an_op_larger_than_the_rest_of_the_budget_while_idle_says_why():
    """Idle, nothing is evicted: an op that alone takes more than the budget leaves fails with the
    out-of-memory error, which names idleness and the remedy; the next op records again, so the
    same request then evicts what was recorded before dtr went idle and succeeds."""
    code = r"""
import torch, dtr
dtr.set_budget(64 << 20)
w = torch.randn(128, 128, requires_grad=True)
v = torch.randn(128, 128)
kept = [torch.tanh(torch.randn(1 << 14, 128) @ v) for _ in range(2)]  # 16 MiB, recorded
sums = [float(k.sum()) for k in kept]
opt = torch.optim.SGD([w], lr=0.01)
for _ in range(2):
    opt.zero_grad()
    torch.tanh(torch.randn(64, 128) @ w).sum().backward()
    opt.step()
assert dtr.stats()["idle"]
try:
    torch.ones(56 << 20, dtype=torch.uint8)
    print("no error")
except torch.OutOfMemoryError as e:
    print("OOM", str(e).replace("\n", " "))
x = torch.ones(56 << 20, dtype=torch.uint8)
st = dtr.stats()
print("after", int(x[:1024].sum()), st["idle"], st["evictions"] - st["eager_evictions"] > 0)
del x
print("kept", [float(k.sum()) for k in kept] == sums)
"""
    r = run_process([PY, "-c", code], preload=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("OOM") and "idle" in lines[0] and "DTR_IDLE_BELOW" in lines[0], r.stdout
    assert lines[1:] == ["after 1024 False True", "kept True"], r.stdout


def test_budget_changes_and_disable_while_idle():
    """set_budget, dtr.disable() and dtr.enable() while idle end idleness at once (set_budget is
    itself an op that runs paused: it must not wait for itself), and a new budget that binds
    evicts what was recorded before idling. A tensor the program holds evicted keeps dtr from
    idling until it is gone. Values stay exact throughout."""
    code = r"""
import json, torch, dtr
torch.manual_seed(0)
dtr.set_budget("1TiB")
v = torch.randn(128, 128)
kept = [torch.tanh(torch.randn(4096, 128) @ v) for _ in range(4)]  # 8 MiB, recorded
sums = [float(k.sum()) for k in kept]
w = torch.randn(128, 128, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)
def step():
    opt.zero_grad()
    torch.tanh(torch.randn(64, 128) @ w).sum().backward()
    opt.step()
    return dtr.stats()
out = {}
step(); out["idle_after_step"] = step()["idle"]
base = dtr.stats()["allocated_bytes"]
dtr.set_budget(base - (4 << 20))  # evicts about half of `kept`
st = dtr.stats()
out["set_budget_resumed"] = not st["idle"]
out["evicted_by_new_budget"] = st["evictions"] - st["eager_evictions"]
dtr.set_budget("1TiB")
out["idle_while_holding_evicted"] = [step()["idle"] for _ in range(3)]
out["sums_exact"] = [float(k.sum()) for k in kept] == sums  # brings every one back
out["idle_once_back"] = [step()["idle"] for _ in range(2)]
dtr.disable()
out["disabled"] = (dtr.is_enabled(), dtr.stats()["idle"])
step()
dtr.enable(budget="1TiB")
out["enabled"] = (dtr.is_enabled(), dtr.stats()["idle"])
out["idle_again"] = [step()["idle"] for _ in range(2)]
print(json.dumps(out))
"""
    r = run_process([PY, "-c", code], preload=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["idle_after_step"] and out["set_budget_resumed"] and out["evicted_by_new_budget"] > 0, out
    assert out["idle_while_holding_evicted"] == [False] * 3 and out["sums_exact"], out
    assert out["idle_once_back"][-1] and out["disabled"] == [False, False] and out["enabled"] == [True, False], out
    assert out["idle_again"][-1], out
