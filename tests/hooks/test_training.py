"""End-to-end: tiny models trained with fixed seeds plainly and under the preloaded dtr at
decreasing budgets; losses, gradients and parameters must be bit-identical, the peak reserved
memory must stay within the budget, and eviction/rematerialization must actually happen."""
import json
import os

import pytest

from conftest import HERE, NEVER_BINDS, PY, run

TRAIN = os.path.join(HERE, "train.py")
LATE_BUDGET = os.path.join(HERE, "late_budget.py")
MODELS = ["mlp", "cnn", "transformer", "lstm", "treelstm", "unet"]
# Fractions of the unconstrained run's peak *allocated* bytes (peak reserved includes the cache).
# These tiny models are dominated by constants (parameters + gradients + momentum buffers are
# 3x the parameters): the MLP's smallest feasible budget is 0.95 of its peak, and since lazy
# input locks (stop 38) the others train down to 0.6. Each budget is a process of about 4 s, so
# three budgets cover that range (CI's 35 minutes; there were eight, then five): the MLP's floor,
# one in the middle, and the smallest that every other model trains at. bench/sweep.py steps
# through the budgets finely.
FRACTIONS = [0.95, 0.8, 0.6]


def train(tmp_path, model, tag, preload, **env):
    r = run([PY, TRAIN, model], preload=preload, **env)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    return r, out


def assert_identical(a, b):
    for key in ("losses", "grads", "params"):
        assert a[key] == b[key], key


def stats_of(r):
    return json.loads(r.stdout.strip().splitlines()[-1])["dtr"]



@pytest.mark.parametrize("model", MODELS)
def test_bit_identical_under_budgets(tmp_path, model):
    r, ref = train(tmp_path, model, "plain", preload=False)
    assert r.returncode == 0, r.stderr
    r, unl = train(tmp_path, model, "unlimited", preload=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_identical(ref, unl)
    peak = stats_of(r)["peak_allocated_bytes"]
    assert peak > 0
    worked = []
    for f in FRACTIONS:
        budget = int(peak * f)
        r, out = train(tmp_path, model, f"b{budget}", preload=True, DTR_BUDGET=budget)
        if r.returncode != 0:
            # An infeasible budget must fail cleanly with dtr's out-of-memory explanation.
            assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
            assert "out of memory under DTR_BUDGET" in r.stderr, r.stderr[-3000:]
            break
        s = stats_of(r)
        assert s["peak_reserved_bytes"] <= budget, s
        assert_identical(ref, out)
        worked.append((budget, s))
    print(f"{model}: unconstrained peak allocated {peak} B; worked: "
          + ", ".join(f"{b} B (evictions={s['evictions']}, remats={s['rematerializations']}, "
                      f"eviction_calls={s['eviction_calls']})" for b, s in worked)
          + (f"; smallest ratio {worked[-1][0] / peak:.2f}" if worked else ""))
    assert worked, f"{model}: no budget below the unconstrained peak {peak} worked"
    smallest = worked[-1][1]
    assert smallest["evictions"] > 0 and smallest["rematerializations"] > 0, smallest
    assert smallest["eviction_calls"] > 0, "the budget never forced the allocator to evict"


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_frozen_gradients_train_bit_identical(tmp_path, model):
    """DTR_FREEZE_GRADIENTS=1 (Note [Frozen results pass it on]): what each op of the backward pass
    computes is frozen once its input dies; training stays bit-identical and within the budget."""
    r, ref = train(tmp_path, model, "plain", preload=False)
    assert r.returncode == 0, r.stderr
    r, _ = train(tmp_path, model, "unlimited", preload=True)
    assert r.returncode == 0, r.stderr[-3000:]
    budget = int(stats_of(r)["peak_allocated_bytes"] * 0.8)
    r, out = train(tmp_path, model, "frozen", preload=True, DTR_BUDGET=budget, DTR_FREEZE_GRADIENTS="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_identical(ref, out)
    s = stats_of(r)
    assert s["peak_reserved_bytes"] <= budget, s
    assert s["evictions"] > 0 and s["rematerializations"] > 0, s


def test_frozen_gradients_cannot_make_room_at_the_mlps_floor(tmp_path):
    """The price of DTR_FREEZE_GRADIENTS=1: a frozen gradient is no longer evicted when nothing else
    can go. The MLP, whose parameters, gradients and momentum are most of its peak, trains at 0.95
    of it only by evicting a gradient: with the option it stops with dtr's out-of-memory error,
    naming the frozen results, instead."""
    r, _ = train(tmp_path, "mlp", "unlimited", preload=True)
    assert r.returncode == 0, r.stderr[-3000:]
    budget = int(stats_of(r)["peak_allocated_bytes"] * 0.95)
    r, _ = train(tmp_path, "mlp", "kept", preload=True, DTR_BUDGET=budget)
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = train(tmp_path, "mlp", "frozen", preload=True, DTR_BUDGET=budget, DTR_FREEZE_GRADIENTS="1")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "out of memory under DTR_BUDGET" in r.stderr, r.stderr[-3000:]
    assert "held result frozen" in r.stderr, r.stderr[-3000:]


def test_a_budget_set_after_unbudgeted_steps_trains_as_one_set_from_the_start(tmp_path):
    """Note [Exact reuse] (allocator/caching_allocator.cc): steps run with no budget must not leave
    the allocator's segments split so that the budget set after them is partly unusable. Before,
    the unbudgeted backward placed gradients and momentum buffers inside freed activation
    segments; the remnants beside them kept 0.95 MiB of this 6.9 MiB budget reserved, and the
    same budget cost 108 evictions a step instead of 68 (a 2-rank DDP job at half its peak ran
    12.9x slower than plain instead of 1.6x)."""
    def launch(*args, **env):
        r = run([PY, LATE_BUDGET, *args], preload=bool(env), **env)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    plain = launch("--bytes", "0")
    late = launch("--fraction", "0.5", DTR_ENABLE="1")  # the budget is the process's first
    early = launch("--bytes", str(late["budget"]), DTR_BUDGET=NEVER_BINDS)  # recording from the start
    for got in (late, early):
        assert (got["losses"], got["params"]) == (plain["losses"], plain["params"])
        s = got["dtr"]
        assert s["budget_bytes"] == late["budget"] and s["peak_reserved_bytes"] <= late["budget"], s
        assert s["evictions"] > 0 and s["rematerializations"] > 0, s
    print(f"budget {late['budget']} B: set late {late['dtr']}; recording from the start {early['dtr']}")
    # The same budget holds as many activations, so it needs about as many evictions.
    assert late["dtr"]["peak_allocated_bytes"] >= 0.97 * early["dtr"]["peak_allocated_bytes"], (late, early)
    assert late["dtr"]["evictions"] <= 1.15 * early["dtr"]["evictions"], (late, early)


def test_saved_inputs_of_in_place_activations_stay_evictable(tmp_path):
    """Note [Copies of overwritten contents] (runtime/mutation.cc): SiLU(inplace=True) and
    Hardswish(inplace=True) after batch norm, as in EfficientNet and MobileNetV3. Autograd saves a
    clone of each input they overwrite; each clone takes batch norm as its recipe instead of being
    frozen, so at dtr's largest tracked memory everything but the running statistics is
    evictable, and half the peak trains bit-identically (with the clones frozen, torchvision's
    EfficientNet-B0 kept about 55 MiB of them as constants and ran out of memory there)."""
    r, ref = train(tmp_path, "silu_cnn", "plain", preload=False)
    assert r.returncode == 0, r.stderr
    r, unl = train(tmp_path, "silu_cnn", "unlimited", preload=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_identical(ref, unl)
    budget = int(stats_of(r)["peak_allocated_bytes"] * 0.5)
    r, out = train(tmp_path, "silu_cnn", "half", preload=True, DTR_BUDGET=budget)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_identical(ref, out)
    s = stats_of(r)
    assert s["peak_reserved_bytes"] <= budget, s
    assert s["rematerializations"] > 0, s
    # Six activations overwritten in place a step, three steps.
    assert s["copies_given_recipes"] == 6 * 3, s
    at_peak = s["unevictable_at_peak"]
    assert not any("in-place op changed" in reason for reason in at_peak["by_reason"]), at_peak
    assert at_peak["evictable_bytes"] >= 0.95 * at_peak["tracked_bytes"], at_peak
