"""The training loop of the real-model scripts (train_torchvision.py, train_transformers.py): a
few optimizer steps with fixed seeds, then one JSON line with the losses, a hash of the final
state dict, the static bytes (parameters, their gradients and the optimizer's state: what no
schedule can evict) and, when dtr is loaded, torch.ops.dtr.stats() and what dtr held after each
step. The tests run a script plainly and under `python -m dtr --budget ...` and compare the two
bit for bit (real_models.py)."""
import hashlib
import json

import torch

# One thread, set before the script builds its model: runs are compared bit for bit.
torch.set_num_threads(1)


def make_optimizer(name, model):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def tensor_bytes(t):
    return t.numel() * t.element_size()


def train(model, optimizer, steps, loss_of_step):
    """loss_of_step(model, step) returns the step's loss; the user's variables it makes (a
    model's output object, say) live until the next step makes them again, as in a real loop."""
    dtr_loaded = hasattr(torch.ops, "dtr") and hasattr(torch.ops.dtr, "stats")
    losses, allocated = [], []
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_of_step(model, step)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if dtr_loaded:  # what dtr holds between steps: constant from the second step on
            allocated.append(json.loads(torch.ops.dtr.stats())["allocated_bytes"])
    digest = hashlib.sha256()
    for value in model.state_dict().values():
        digest.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    out = {"losses": losses, "state": digest.hexdigest(),
           "param_bytes": sum(tensor_bytes(p) for p in params),
           "static_bytes": sum(tensor_bytes(p) for p in params) +
                           sum(tensor_bytes(p.grad) for p in params if p.grad is not None) +
                           sum(tensor_bytes(t) for t in state)}
    if dtr_loaded:
        out["dtr"] = json.loads(torch.ops.dtr.stats())
        out["allocated_after_step"] = allocated
    print(json.dumps(out))
