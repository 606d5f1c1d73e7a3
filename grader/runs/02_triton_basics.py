"""The learner side of lab 02_triton_basics: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/02_triton_basics.py``).
"""
from __future__ import annotations

import torch

from gpulab.compare import padded
from grader.exercise import entry
from grader.runs.observe import observe_out


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Rebuild a non-contiguous view on the learner's side (a view does not survive pickling)."""
    if layout == "strided":      # every other element of a 1-D buffer of twice the length
        return t[::2]
    if layout == "transposed":   # stored (N, M), seen as (M, N)
        return t.t()
    if layout == "sliced":       # rows 0, 2, 4 ... and columns 1, 4, 7 ... of a bigger matrix
        return t[::2, 1::3]
    return t


def _vector_add_run(ns, case, device):
    x_base, y_base = padded(case.inputs["x"], device), padded(case.inputs["y"], device)
    x, y = _layout(x_base, case.inputs["layout"]), _layout(y_base, case.inputs["layout"])
    fn = entry(ns, "vector_add")
    return observe_out(lambda out: fn(x, y, out=out), x.shape, x.dtype, device, inputs={"x": x_base, "y": y_base},
                       may_reject=case.inputs["layout"] != "contiguous")


def _bias_gelu_run(ns, case, device):
    x_base, bias = padded(case.inputs["x"], device), padded(case.inputs["bias"], device)
    x = _layout(x_base, case.inputs["layout"])
    fn, approx = entry(ns, "bias_gelu"), case.inputs["approximate"]
    return observe_out(lambda out: fn(x, bias, approximate=approx, out=out), x.shape, x.dtype, device,
                       inputs={"x": x_base, "bias": bias}, may_reject=case.inputs["layout"] != "contiguous")


def _copy_2d_run(ns, case, device):
    base = padded(case.inputs["src"], device)
    src = _layout(base, case.inputs["layout"])
    fn = entry(ns, "copy_2d")
    return observe_out(lambda out: fn(src, out=out), src.shape, src.dtype, device, inputs={"src": base})


def _bytes_run(ns, case, device):
    x = case.inputs
    return {"bytes": entry(ns, "bias_gelu_bytes")(x["M"], x["N"], x["dtype_bytes"], fused=x["fused"])}
