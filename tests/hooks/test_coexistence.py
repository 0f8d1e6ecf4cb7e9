"""dtr next to the rest of PyTorch: each coexist_scenarios.py program runs plainly and under dtr
(which evicts everything evictable mid-program through torch.ops.dtr.set_budget), and must give
exactly the same results, with evictions (and rematerializations where evicted tensors are touched
again) actually happening. The features: torch.utils.checkpoint (reentrant and not), torch.cond,
torch.func.grad/vmap, FakeTensorMode and meta tensors, a user TorchDispatchMode, a wrapper
subclass with __torch_dispatch__, nested (strided and jagged), sparse (COO, CSR) and quantized
tensors, and torch.compile (eager, aot_eager, inductor)."""
import json
import os

import pytest

from conftest import HERE, PY, run

SCEN = os.path.join(HERE, "coexist_scenarios.py")
# Generous: the scenarios force their evictions with set_budget. Setting a DTR_* variable also has
# dtr's start-up hook (dtr.pth) apply its Python-side fixups, as it does for users.
BUDGET = "1GiB"


def scenario(name, preload, **env):
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a Python traceback in stderr on a crash
    r = run([PY, SCEN, name], preload=preload, **env)
    assert r.returncode == 0, f"{name} ({'dtr' if preload else 'plain'}) exited {r.returncode}:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


_plain = {}


def plain(name):
    if name not in _plain:
        res = scenario(name, False)
        assert res["dtr"] is None
        _plain[name] = res["out"]
    return _plain[name]


def differences(a, b, path=""):
    """Where two JSON values differ (for readable assertion messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path or ".", a, b)]


def under_dtr(name, remats=True, **env):
    """Runs the scenario under dtr, checks it against the plain run and that dtr evicted (and
    rematerialized); returns the dtr run's whole JSON."""
    env.setdefault("DTR_BUDGET", BUDGET)
    return under_dtr_result(name, scenario(name, True, **env), remats)


def under_dtr_result(name, res, remats=True):
    """under_dtr's checks on a dtr run already made."""
    ref = plain(name)
    assert res["out"] == ref, differences(ref, res["out"])[:10]
    st = res["dtr"]
    assert st is not None, "dtr was not active"
    assert st["evictions"] > 0, st
    if remats:
        assert st["rematerializations"] > 0, st
    return res


def test_checkpoint_reentrant():
    res = under_dtr("checkpoint_reentrant")
    assert len(res["out"]["losses"]) == 3


def test_checkpoint_nonreentrant():
    res = under_dtr("checkpoint_nonreentrant")
    assert len(res["out"]["losses"]) == 3


def test_cond():
    res = under_dtr("cond")
    assert set(res["out"]["taken"]) == {True, False}  # both branches ran


def test_cond_preload_without_dtr_variables():
    """dtr is active with only LD_PRELOAD (the library activates itself as libtorch loads, budget
    unlimited): HigherOrderOperators must work there too. With no budget dtr records nothing
    (Note [Recording starts with a budget]; the scenario's set_budget(1) is refused, so it never
    gets one), but its dispatch key is on, which is what breaks a HOP without the fixups;
    test_cond has them evicted and replayed."""
    res = scenario("cond", True)
    assert res["dtr"] is not None and res["dtr"]["recording"] is False and res["dtr"]["evictions"] == 0
    assert res["out"] == plain("cond"), differences(plain("cond"), res["out"])[:10]


def test_func_grad_vmap():
    res = under_dtr("func_vmap_grad")
    assert len(res["out"]["per_sample"]) == 3


def test_fake_tensor_mode_and_meta():
    res = under_dtr("fake_meta")
    out = res["out"]
    assert out["fake"][0] == "FakeTensor" and out["fake"][1] == "torch.Size([32, 4])", out["fake"]
    assert out["meta"][1] == "meta" and out["meta"][0] == "torch.Size([32, 4])", out["meta"]
    # meta and fake ops are never recorded
    info = res["info"]
    assert info["ops_recorded_after_fake"] == info["ops_recorded_before_fake"], info
    assert info["ops_recorded_before_fake"] > 0, info


def test_fake_tensor_from_evicted_real_tensor():
    res = under_dtr("fake_from_real")
    assert res["out"]["fake"] == ["torch.Size([32])", "cpu", "FakeTensor"]


def test_user_dispatch_mode():
    res = under_dtr("dispatch_mode")
    counts = res["out"]["counts"]
    assert len(counts) == 3 and all(c.get("aten.addmm", 0) > 0 and c.get("aten.mm", 0) > 0 for c in counts), counts
    assert not any(k.startswith("dtr.") for c in counts for k in c), counts
    # (the counts are part of "out": under_dtr checked they equal the plain run's)


def test_torch_dispatch_subclass():
    res = under_dtr("subclass")
    assert res["out"]["calls"] > 0


def test_nested_strided():
    under_dtr("nested_strided")


def test_nested_jagged():
    under_dtr("nested_jagged")


def test_sparse():
    under_dtr("sparse")


def test_sparse_with_evicted_dense_operand():
    under_dtr("sparse_evicted_operand")


def test_quantized():
    under_dtr("quantized")


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_torch_compile(backend, tmp_path):
    """torch.compile with deterministic algorithms: dtr (evicting the compiled graph's input and
    everything between forward and backward) agrees bit for bit with a plain run. Each run
    compiles from scratch (its own inductor cache). Where they differ, a second plain run from
    scratch tells whether two plain compiles agree at all (a third fresh inductor compile on every
    run cost CI about 25 s on each wheel, so it runs only to explain a failure)."""
    name = f"compile_{backend}"

    def env(i):
        # One compile thread: inductor's pool of compile workers took longer to start than the
        # few kernels here take to compile (65 s -> 55 s for the test on 2 cores).
        return {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"cache{i}"), "TORCHINDUCTOR_COMPILE_THREADS": "1"}

    first = scenario(name, False, **env(1))["out"]
    res = scenario(name, True, DTR_BUDGET=BUDGET, **env(3))
    if res["out"] != first:
        second = scenario(name, False, **env(2))["out"]
        assert first == second, ("two plain runs compiled from scratch differ, so dtr's run cannot "
                                 f"be compared with them: {differences(first, second)[:10]}")
    _plain[name] = first
    checked = under_dtr_result(name, res)
    assert len(checked["out"]["losses"]) == 3


def test_raw_access_in_compiled_functions():
    """A compiled function returning x.numpy() and a fullgraph F.max_pool1d on a
    __torch_function__ subclass give the plain run's results under dtr (Note [Hooks under
    torch.compile], dtr/_exposure.py); the compiled numpy() looped until RecursionError before."""
    res = under_dtr("compile_raw_access")
    assert res["out"]["pool_type"] == "_Tagged" and len(res["out"]["numpy"]) == 4
