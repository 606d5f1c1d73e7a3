"""The learner side of lab 07_mixed_precision: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/07_mixed_precision.py``).
"""
from __future__ import annotations

import torch

from gpulab.launches import record_allocations, record_torch_ops, watch_launches
from gpulab.precision import replay_scaler
from gpulab.toy import ToyMLP, toy_batch
from grader.exercise import borrowed, entry, to_cpu

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float8_e5m2": torch.float8_e5m2}


def _number(x):
    """A plain float for the judge (0-dim tensors and numpy scalars included), else None."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


LIMITS = ("max", "min_normal", "min_subnormal", "eps")


def _fields(got, keys) -> dict:
    """The run side of an answer that returns a dict of numbers: those numbers, or the type that came back."""
    if not isinstance(got, dict):
        return {"bad": type(got).__name__}
    return {k: _number(got.get(k)) for k in keys}


def _limits_run(ns, case, device):
    x = case.inputs
    return _fields(entry(ns, "format_limits")(x["e"], x["m"], x["finite_only"]), LIMITS)


REPORT = ("underflow", "subnormal", "overflow")


def _report_run(ns, case, device):
    x = case.inputs
    grads = x["x"].to(device).clone()  # the learner's own copy: an in-place scale must show
    got = _fields(entry(ns, "cast_report")(grads, _DTYPES[x["dtype"]], x["scale"]), REPORT)
    return {**got, "mutated": not torch.equal(grads.cpu(), x["x"])}


# GradScaler's own kernels: the unscale-and-check and the update rule the exercise writes
_GRADSCALER_OPS = {"aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_"}


def _borrowed_scaler(scaler, ops: list) -> str | None:
    """What of GradScaler (or of a course helper) a learner's scaler is, holds or runs, if anything."""
    if isinstance(scaler, torch.amp.GradScaler):
        return f"a torch.amp.GradScaler ({type(scaler).__name__})"
    held = [name for name, v in vars(scaler).items() if isinstance(v, torch.amp.GradScaler)]
    if held:
        return f"a wrapper around a torch.amp.GradScaler (self.{held[0]})"
    used = sorted(_GRADSCALER_OPS.intersection(ops))
    if used:
        return f"built on GradScaler's kernels ({', '.join(used)})"
    return borrowed(type(scaler))


def _scaler_run(ns, case, device):
    x = case.inputs
    scaler = entry(ns, "LossScaler")(init_scale=x["init_scale"], growth_factor=x["growth"],
                                     backoff_factor=x["backoff"], growth_interval=x["interval"])
    with watch_launches(check_bounds=False) as watch, record_torch_ops(watch) as ops:
        out = replay_scaler(scaler, list(x["grads"]), device=device, unscale_first=x["unscale_first"])
    return {**out, "borrowed": _borrowed_scaler(scaler, ops)}


D_IN, HIDDEN, D_OUT, BATCH = 16, (32, 32), 4, 32


def _train_setup(case, device):
    """The model, optimizer, scaler and batches of a case: the same in the learner's process and the judge's."""
    x = case.inputs
    model = ToyMLP(D_IN, HIDDEN, D_OUT, seed=x["seed"]).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9) if x["opt"] == "sgd"
           else torch.optim.AdamW(params, lr=1e-2))
    dtype = _DTYPES[x["dtype"]]
    scaler = torch.amp.GradScaler(device, init_scale=x["init_scale"], enabled=dtype == torch.float16)
    batches = [tuple(t.to(device) for t in toy_batch(x["seed"] + s, BATCH, D_IN, D_OUT)) for s in range(x["steps"])]
    return model, opt, scaler, batches, dtype


def _record_steps(step_fn, case, device) -> dict:
    """Run ``step_fn`` over the case's batches; observe returns, weights, dtypes and the optimizer's steps."""
    model, opt, scaler, batches, dtype = _train_setup(case, device)
    seen, calls = {}, [0]
    model.layers[0].register_forward_hook(lambda mod, inp, out: seen.setdefault("forward", str(out.dtype)) and None)
    real_step = opt.step

    def counted(*args, **kwargs):
        calls[0] += 1
        return real_step(*args, **kwargs)

    opt.step = counted
    out = {"returned": [], "params": [], "dtypes": [], "stepped": [], "scale": [],
           "init": {n: to_cpu(p).float().clone() for n, p in model.named_parameters()}}
    for xb, yb in batches:
        before = calls[0]
        try:
            ret = step_fn(model, opt, scaler, xb, yb, dtype, case.inputs["max_norm"])
        except ValueError as exc:  # GradScaler's own refusal: gradients of fp16 weights
            if "unscale FP16 gradients" not in str(exc):
                raise
            return {"fp16_grads": True}
        except RuntimeError as exc:  # GradScaler's: the previous step's state was never cleared by update()
            if "unscale_() is being called after step()" not in str(exc):
                raise
            return {"no_update": True}
        if not isinstance(ret, (tuple, list)) or len(ret) != 2:
            return {"bad": type(ret).__name__}
        out["returned"].append([_number(v) for v in ret])
        out["params"].append({n: to_cpu(p).float().clone() for n, p in model.named_parameters()})  # not a view
        out["dtypes"].append({n: str(p.dtype) for n, p in model.named_parameters()})
        out["stepped"].append(calls[0] > before)
        out["scale"].append(float(scaler.get_scale()))
    out["forward"], out["device"] = seen.get("forward"), str(device)
    return out


def _train_run(ns, case, device):
    return _record_steps(entry(ns, "amp_train_step"), case, device)


# Reductions and casts would leave the low precision: the exercise is compensation in float16/bfloat16 itself.
_FORBIDDEN = {"aten.sum": "torch.sum", "aten.cumsum": "torch.cumsum", "aten.nansum": "torch.nansum",
              "aten.mean": "torch.mean", "aten._to_copy": "a cast (.float(), .double(), .to(...))",
              "aten._local_scalar_dense": "Python floats (.item(), float()): float64 arithmetic",
              "aten.lift_fresh": "a tensor built from Python numbers (torch.tensor(...)): float64 arithmetic"}


def _kahan_run(ns, case, device):
    x = case.inputs["x"].to(device).clone()  # the learner's own copy: a write into it must show
    fn = entry(ns, "kahan_sum")
    with watch_launches(check_bounds=False) as watch, record_torch_ops(watch) as ops, record_allocations() as made:
        got = fn(x)
    forbidden = sorted({op for op in ops if op in _FORBIDDEN})
    return {"out": to_cpu(got) if isinstance(got, torch.Tensor) else repr(got)[:80], "forbidden": forbidden,
            "dtypes": sorted(made.dtypes - {str(x.dtype)}), "mutated": not torch.equal(x.cpu(), case.inputs["x"])}
