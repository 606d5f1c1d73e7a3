"""The learner side of lab 09_pruning_distillation: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/09_pruning_distillation.py``).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.exercise import entry, to_cpu


def strided(w: torch.Tensor) -> torch.Tensor:
    """``w`` (out, in) with the same values, stored transposed: a non-contiguous weight (a tied or transposed
    layer's), on which ``.view`` fails and memory order is not row order."""
    return w.t().contiguous().t()  # (in, out) storage -> an (out, in) view


@contextlib.contextmanager
def _views_reported():
    """Yield a dict that receives ``{"view_error": message}`` when the block calls ``.view`` on a tensor whose
    strides do not allow it (a non-contiguous weight): the judge names the mistake."""
    failed: dict = {}
    try:
        yield failed
    except RuntimeError as exc:
        if "view size is not compatible" not in str(exc):
            raise
        failed["view_error"] = str(exc).splitlines()[0][:200]


def _magnitude_run(ns, case, device):
    # a list: run_case does not copy it; the first weight non-contiguous, as a tied layer's is
    weights = [(strided(w) if i == 0 else w.clone()).to(device) for i, w in enumerate(case.inputs["weights"])]
    fn = entry(ns, "magnitude_masks")
    with _views_reported() as failed:
        masks = fn(weights, case.inputs["sparsity"], case.inputs["scope"])
    if failed:
        return failed
    return {"masks": to_cpu(list(masks) if isinstance(masks, (list, tuple)) else masks), "after": to_cpu(weights)}


def _linear(w, b) -> nn.Linear:
    layer = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)
    return layer


def _describe_linear(layer) -> dict:
    if not isinstance(layer, nn.Linear):
        return {"type": type(layer).__name__}
    devices = sorted({str(t.device) for t in (layer.weight, layer.bias) if isinstance(t, torch.Tensor)})
    if "meta" in devices:  # no values to read: the judge reports where the layer was built
        return {"type": "Linear", "devices": devices}
    return {"type": "Linear", "weight": to_cpu(layer.weight), "bias": to_cpu(layer.bias), "devices": devices,
            "param": isinstance(layer.weight, nn.Parameter), "in": layer.in_features, "out": layer.out_features}


def _prune_pair(fn, i, device, default_device=None):
    """fc1, fc2 built from the case on ``device`` and what ``fn`` returns for them, run with ``default_device``
    as torch's default device when given."""
    fc1, fc2 = _linear(i["w1"], i["b1"]).to(device), _linear(i["w2"], i["b2"]).to(device)
    with torch.device(default_device) if default_device else contextlib.nullcontext():
        return fc1, fc2, fn(fc1, fc2, i["keep"])


def _structured_run(ns, case, device):
    i, fn = case.inputs, entry(ns, "prune_hidden_units")
    # First with another default device ("meta": no storage): layers built without device=fc1.weight.device
    # land there, as they land on the CPU when the check runs on a GPU. An answer that moves its layers with
    # .to(device) cannot run so (meta tensors have no values to move): it runs again as usual.
    try:
        fc1, fc2, out = _prune_pair(fn, i, device, default_device="meta")
        on_default = isinstance(out, (tuple, list)) and any(
            isinstance(layer, nn.Linear) and layer.weight.device.type == "meta" for layer in out)
    except Exception:
        on_default = False
    if not on_default:
        fc1, fc2, out = _prune_pair(fn, i, device)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"returned": type(out).__name__}
    new1, new2 = out
    obs = {"fc1": _describe_linear(new1), "fc2": _describe_linear(new2), "device": str(fc1.weight.device),
           "orig": to_cpu([fc1.weight, fc2.weight])}
    if isinstance(new1, nn.Linear) and isinstance(new2, nn.Linear) and not on_default:
        try:
            with torch.no_grad():
                obs["y"] = to_cpu(new2(F.relu(new1(i["x"].to(device)))))
        except RuntimeError as exc:  # shapes that do not chain: reported by the judge
            obs["y_error"] = str(exc).splitlines()[0]
    return obs


def _nm_run(ns, case, device):
    w = strided(case.inputs["w"]).to(device)  # non-contiguous, as a tied or transposed layer's weight is
    fn = entry(ns, "nm_mask")
    try:
        with _views_reported() as failed:
            mask = fn(w, case.inputs["n"], case.inputs["m"])
        if failed:
            return failed
    except ValueError as exc:
        return {"raised": str(exc)}
    except NotImplementedError:
        raise
    except Exception as exc:  # on a short last group: the learner's reshape failing is a wrong answer, not a crash
        if w.shape[1] % case.inputs["m"] == 0:
            raise
        return {"raised_other": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"mask": to_cpu(mask), "after": to_cpu(w)}


STEPS = 3


def _masked_model(state: dict) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(*state["0.weight"].shape[::-1]), nn.ReLU(),
                          nn.Linear(*state["2.weight"].shape[::-1])).double()
    model.load_state_dict(state)
    return model


def _make_optimizer(model: nn.Module, kind: str):
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.05)
    if kind == "sgd-momentum":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _prepared(case, device):
    """The case's model and optimizer after dense warm-up steps (so the optimizer's state predates the
    pruning), with the masks applied to the weights once: the state a pruning step leaves."""
    i = case.inputs
    model = _masked_model(i["state"]).to(device)
    opt = _make_optimizer(model, i["optimizer"])
    x, y = i["x"].to(device), i["y"].to(device)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x[0]), y[0]).backward()
        opt.step()
    masks = {name: m.clone().to(device) for name, m in i["masks"].items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in masks:
                p.mul_(masks[name])
    return model, opt, masks, x, y


def _masked_run(ns, case, device):
    fn = entry(ns, "masked_train_step")
    model, opt, masks, x, y = _prepared(case, device)
    history = []
    for t in range(STEPS):
        loss = fn(model, masks, opt, x[t + 1], y[t + 1])
        loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        history.append((loss, {n: to_cpu(p).clone() for n, p in model.named_parameters()}))
    return {"history": history}


def _distill_run(ns, case, device):
    i = case.inputs
    s = i["s"].to(device).requires_grad_(True)
    t = i["t"].to(device).requires_grad_(i["teacher_grad"])
    loss = entry(ns, "distillation_loss")(s, t, i["y"].to(device), i["T"], i["alpha"])
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        return {"loss": to_cpu(loss), "not_scalar": True}
    loss.backward()
    return {"loss": to_cpu(loss), "grad_s": to_cpu(s.grad), "grad_t": to_cpu(t.grad)}
