"""The check every real-model test makes (test_torchvision_models.py, test_transformers_models.py):
a model trained by its script plainly, under `python -m dtr --budget` with a budget that never
binds, and at half its activations: losses and the final state dict bit-identical, a step leaving
nothing behind, the budget never exceeded, activations recomputed."""
import json

from conftest import NEVER_BINDS, PY, RECORDING_UNDER_NEVER_BINDS, run


def train(script, args, *launcher):
    r = run([PY, *launcher, script, *args])
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_trains_at_half_its_activations(script, name, args):
    """Returns dtr's statistics of the budgeted run."""
    plain = train(script, args)
    # Recording every op from the start, as under a budget, with nothing evicted but dead storages.
    free = train(script, args, "-m", "dtr", "--budget", NEVER_BINDS, *RECORDING_UNDER_NEVER_BINDS)
    assert (free["losses"], free["state"]) == (plain["losses"], plain["state"])
    # Note [Accumulators of dead gradients] (runtime/lifetime.cc): a step leaves nothing behind
    # (ViT and Swin grew by 3.3 MiB a step; every model held its first step's gradients through
    # the second). After each step: parameters, optimizer state, that step's gradients and what
    # the program keeps of the step (its output).
    held = free["allocated_after_step"]
    assert held == [held[0]] * len(held), held
    # Parameters, their gradients and the optimizer's state: what no schedule can evict.
    static = plain["static_bytes"]
    peak = free["dtr"]["peak_allocated_bytes"]
    assert peak > 1.5 * static, (peak, static)  # activations are most of it
    budget = int(static + 0.5 * (peak - static))
    out = train(script, args, "-m", "dtr", "--budget", str(budget))
    assert (out["losses"], out["state"]) == (plain["losses"], plain["state"])
    s = out["dtr"]
    print(f"{name}: peak {peak} B, static {static} B, budget {budget} B: "
          f"{s['rematerializations']} rematerializations, peak reserved {s['peak_reserved_bytes']} B")
    assert s["peak_reserved_bytes"] <= budget, s
    assert s["rematerializations"] > 0, s
    return s
