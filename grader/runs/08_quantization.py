"""The learner side of lab 08_quantization: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/08_quantization.py``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from gpulab.compare import padded
from gpulab.device import synchronize
from gpulab.launches import record_allocations
from grader.exercise import entry, to_cpu
from grader.runs import observe as kernels

FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0, 3, -6), "e5m2": (torch.float8_e5m2, 57344.0, 2, -14)}


def _qparams_run(ns, case, device):
    c = case.inputs
    lo, hi = entry(ns, "minmax_range")(c["x"], axis=c["axis"])
    scale, zero_point = entry(ns, "qparams")(c["lo"], c["hi"], symmetric=c["symmetric"], qmin=c["qmin"], qmax=c["qmax"])
    return {"lo": to_cpu(lo), "hi": to_cpu(hi), "scale": to_cpu(scale), "zero_point": to_cpu(zero_point),
            "inputs_after": {"x": c["x"].cpu()}}


def _roundtrip_run(ns, case, device):
    c = case.inputs
    q = entry(ns, "quantize")(c["x"], c["scale"], c["zero_point"], axis=c["axis"], qmin=c["qmin"], qmax=c["qmax"])
    dq = entry(ns, "dequantize")(c["q"], c["scale"], c["zero_point"], axis=c["axis"])
    return {"q": to_cpu(q), "dq": to_cpu(dq), "inputs_after": {k: c[k] for k in ("x", "scale", "zero_point", "q")}}


def _calib_run(ns, case, device):
    c = case.inputs
    batches = [b.view(-1, 4) if b.numel() % 4 == 0 else b for b in torch.split(c["flat"].clone(), c["sizes"])]
    out = entry(ns, "calibrate")(batches, method=c["method"], percentile=c["percentile"])
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"bad": f"calibrate must return a pair (lo, hi), got {type(out).__name__}"}
    return {"lo": float(out[0]), "hi": float(out[1])}


def _float_linear(c) -> nn.Linear:
    """The float layer of a case: copies of its ``weight`` and ``bias`` (or none)."""
    linear = nn.Linear(c["weight"].shape[1], c["weight"].shape[0], bias=c["bias"] is not None)
    linear.load_state_dict({"weight": c["weight"]} if c["bias"] is None else {"weight": c["weight"], "bias": c["bias"]})
    return linear


def _ptq_run(ns, case, device):
    c = case.inputs
    linear = _float_linear(c)
    qlin = entry(ns, "QuantLinear").from_float(linear, bits=c["bits"], per_channel=c["per_channel"])
    if not isinstance(qlin, nn.Module):
        return {"bad": f"QuantLinear.from_float must return an nn.Module, got {type(qlin).__name__}"}
    with torch.no_grad():
        y = qlin(c["x"])
    return {"qweight": to_cpu(getattr(qlin, "qweight", None)), "scale": to_cpu(getattr(qlin, "scale", None)),
            "bias": to_cpu(getattr(qlin, "bias", None)), "y": to_cpu(y),
            "inputs_after": {"weight": linear.weight.detach().cpu()}}


def _fq_run(ns, case, device):
    c = case.inputs
    x = c["x"].clone().requires_grad_(True)
    y = entry(ns, "fake_quant")(x, c["scale"], c["zero_point"], c["qmin"], c["qmax"])
    if not isinstance(y, torch.Tensor):
        return {"bad": f"fake_quant must return a torch.Tensor, got {type(y).__name__}"}
    if y.requires_grad:
        y.backward(c["grad"])
    return {"y": to_cpu(y), "requires_grad": bool(y.requires_grad), "grad": to_cpu(x.grad),
            "inputs_after": {"scale": c["scale"], "zero_point": c["zero_point"]}}


def _qat_run(ns, case, device):
    c = case.inputs
    layer = entry(ns, "QATLinear").from_linear(_float_linear(c), bits=c["bits"])
    if not isinstance(layer, nn.Module):
        return {"bad": f"QATLinear.from_linear must return an nn.Module, got {type(layer).__name__}"}
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, nn.Parameter) or not weight.requires_grad:
        return {"bad": "QATLinear must keep a trainable float `weight` (an nn.Parameter): QAT updates the float "
                       "weights and fake-quantizes them in every forward"}
    x = c["x"].clone().requires_grad_(True)
    y = layer(x)
    y.backward(c["grad"])
    b = getattr(layer, "bias", None)
    return {"y": to_cpu(y), "grad_x": to_cpu(x.grad), "grad_w": to_cpu(weight.grad),
            "grad_b": to_cpu(b.grad) if isinstance(b, torch.Tensor) else None, "weight": to_cpu(weight.detach())}


def _fp8_run(ns, case, device):
    c = case.inputs
    out = entry(ns, "fp8_quantize")(c["x"], fmt=c["fmt"])
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"bad": f"fp8_quantize must return (x_fp8, scale), got {type(out).__name__}"}
    x8, scale = out
    deq = entry(ns, "fp8_dequantize")(c["x8_bits"].view(FP8[c["fmt"]][0]), c["scale_in"])
    return {"dtype": str(x8.dtype) if isinstance(x8, torch.Tensor) else type(x8).__name__,
            "values": x8.detach().cpu().float() if isinstance(x8, torch.Tensor) else None,
            "scale": float(scale), "deq": to_cpu(deq), "inputs_after": {"x": c["x"].cpu()}}


def _wmm_run(ns, case, device):
    c = case.inputs
    x, w_q, w_scale = (padded(c[name], device) for name in ("x", "w_q", "w_scale"))
    M, N = x.shape[0], w_q.shape[0]
    fn = entry(ns, "int8_weight_matmul")
    if device == "cuda":  # compile and autotune before recording: autotuning allocates its own tensors
        fn(x, w_q, w_scale, out=torch.empty(M, N, dtype=x.dtype, device=device))
        synchronize(device)
    # The floating-point tensors PyTorch creates during the learner's call (not the ablated one).
    call = kernels.observe_kernel(lambda out: fn(x, w_q, w_scale, out=out), {"out": ((M, N), x.dtype)}, device,
                                  inputs={"x": x, "w_q": w_q, "w_scale": w_scale},
                                  watch=lambda bufs: record_allocations())
    made = call.watched
    return {**call.as_obs(), "args": [[(dt, n) for dt, n, _ in tensors] for tensors in call.launch_args],
            "float_elements": made.float_elements, "biggest": [*made.biggest[:2], list(made.biggest[2])]}
