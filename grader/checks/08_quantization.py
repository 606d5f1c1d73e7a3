"""Checks of lab 08, quantization: INT8 and FP8, PTQ and QAT, a weight-only int8 Triton matmul.

What the checks catch beyond plain output equality (curriculum, lab 08 "C:"):
- zero-points are integers, rounded to nearest (not floored, truncated or left fractional);
- quantized values saturate at the edges of [qmin, qmax] (inputs sit exactly at, just inside and
  just outside both edges), so a clamp to [-128, 128] (128 wraps to -128 in int8) or no clamp fails;
- per-channel scales follow the right axis (square matrices included, so a wrong axis cannot hide
  behind a shape error);
- quantized storage really is ``torch.int8`` (or an fp8 dtype), not float32 holding integers;
- the straight-through estimator passes the gradient inside the clipping range and zeroes it
  outside (the convention of ``torch.fake_quantize_per_tensor_affine``);
- the weight-only matmul kernel reads the int8 weights itself: a Triton kernel launched, one of its
  arguments is the int8 weight, no launch received a float weight, and no float copy of the weight
  was materialised in PyTorch during the call (every ATen op that creates a tensor is recorded with
  ``TorchDispatchMode``); the output is poisoned with a guard region and the inputs must survive.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

from gpulab.compare import compare, padded
from gpulab.device import synchronize
from grader.exercise import Benchmark, Case, Exercise, changed_inputs, entry, to_cpu
from grader.kit.kernels import (bounds_verdict, final_verdict, launch_verdict, mismatch_verdict, observe_kernel,
                                outside_verdict, return_verdict)

LAB = "08_quantization"
TITLE = "Quantization: INT8, FP8, PTQ and QAT"

EPS = torch.finfo(torch.float32).eps  # smallest scale: an all-zero range still gets a usable scale
TIE = 1e-3                            # |v - (k + 0.5)| below this: either neighbour is a correct round
FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0, 3, -6), "e5m2": (torch.float8_e5m2, 57344.0, 2, -14)}
#        fmt: (dtype, largest finite value, mantissa bits, smallest normal exponent)


def _randint(gen, lo, hi) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _tensor(v) -> torch.Tensor:
    return v.detach().cpu() if isinstance(v, torch.Tensor) else torch.as_tensor(v)


def _bshape(ndim: int, axis) -> list:
    """The shape that broadcasts a per-channel vector along ``axis`` of an ``ndim``-d tensor."""
    shape = [1] * ndim
    if axis is not None:
        shape[axis] = -1
    return shape


def _away_from_ties(v: torch.Tensor) -> torch.Tensor:
    """Move values within 0.02 of a half-integer to 0.1 from it, so fp32 and fp64 round alike."""
    frac = v - torch.floor(v)
    near = (frac - 0.5).abs() < 0.02
    return torch.where(near, torch.floor(v) + torch.where(frac < 0.5, 0.4, 0.6), v)


def _allowed(v: torch.Tensor, qmin: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds of the correct quantized values for unrounded codes ``v`` (float64): round to
    nearest, either neighbour near a tie (fp32 division may land on either side), then clamp."""
    r = torch.round(v)
    fl = torch.floor(v)
    tie = (v - fl - 0.5).abs() < TIE
    lo = torch.where(tie, fl, r).clamp(qmin, qmax)
    hi = torch.where(tie, fl + 1, r).clamp(qmin, qmax)
    return lo, hi


def _fmt_idx(flat: int, shape) -> str:
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat % size if size else 0)
        flat //= size if size else 1
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def _check_codes(q: torch.Tensor, v: torch.Tensor, qmin: int, qmax: int, name: str,
                 v_name: str = "x / scale + zero_point") -> str | None:
    """``None`` if the integer codes ``q`` are ``v`` rounded to nearest and clamped, else a report."""
    lo, hi = _allowed(v, qmin, qmax)
    qd = q.to(torch.float64)
    bad = (qd < lo) | (qd > hi)
    n = int(bad.sum())
    if n == 0:
        return None
    lines = [f"{name}: {n} of {q.numel()} values are wrong (expected clamp(round({v_name}), {qmin}, {qmax}))."]
    for i in bad.flatten().nonzero().flatten()[:4].tolist():
        lines.append(f"  at {_fmt_idx(i, q.shape)}: got {int(qd.flatten()[i])}, expected {int(lo.flatten()[i])} "
                     f"({v_name} = {float(v.flatten()[i]):.4g})")
    above, below = v > qmax + 0.5 + TIE, v < qmin - 0.5 - TIE
    beyond = above | below
    if bool((bad & beyond).any()) and bool((bad <= beyond).all()):  # only values beyond the range are wrong
        wrapped = bool((bad & above & (qd <= 0)).any()) or bool((bad & below & (qd >= 0)).any())
        lines.append(f"  Values beyond the range must saturate at {qmin} / {qmax}"
                     + (": yours wrapped around, so the clamp is missing or too wide (128 does not fit in int8)"
                        if wrapped else "") + ". Clamp to [qmin, qmax] *before* converting to int8.")
    elif bool((bad & ((qd == qmin) | (qd == qmax) | (lo == qmin) | (hi == qmax))).all()):
        lines.append(f"  The errors sit at the range edges: clamp to exactly [qmin, qmax] = [{qmin}, {qmax}].")
    else:
        frac = (v - torch.floor(v))[bad]
        if bool((frac > 0.5).all()) and bool((qd[bad] == torch.floor(v)[bad]).all()):
            lines.append("  Every wrong value was rounded down: use torch.round (round to nearest), not floor "
                         "or a cast to int (which truncates).")
    return "\n".join(lines)


# --- qparams: ranges and (scale, zero_point) ----------------------------------------------------

def ref_range(x: torch.Tensor, axis) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.double()
    if axis is None:
        return x.min(), x.max()
    dims = [d for d in range(x.ndim) if d != axis % x.ndim]
    if not dims:  # a 1-D tensor per channel: every element is its own channel
        return x.clone(), x.clone()
    return x.amin(dim=dims), x.amax(dim=dims)


def ref_qparams(lo, hi, symmetric: bool, qmin: int, qmax: int):
    """(scale, unrounded zero-point code v) in float64; the zero-point is clamp(round(v))."""
    lo = torch.clamp(_tensor(lo).double(), max=0.0)  # the range must contain 0 (padding, ReLU zeros)
    hi = torch.clamp(_tensor(hi).double(), min=0.0)
    if symmetric:
        scale = torch.maximum(-lo, hi) / qmax
        return scale.clamp(min=EPS), torch.zeros_like(scale)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=EPS)
    return scale, qmin - lo / scale


def _qparams_cases(gen, public):
    specs = []  # (name, x, axis, symmetric, qmin, qmax)
    if public:
        rows = torch.randn(48, 48, generator=gen) * torch.logspace(-2, 0.5, 48)[torch.randperm(48, generator=gen)][:, None]
        zero_row = torch.randn(6, 20, generator=gen)
        zero_row[2] = 0.0
        specs += [
            ("per-tensor symmetric int8", torch.randn(64, 32, generator=gen) * 1.7, None, True, -128, 127),
            ("per-tensor asymmetric int8, mixed signs", torch.randn(64, 32, generator=gen) * 2 + 1.3, None, False, -128, 127),
            ("per-tensor asymmetric, all positive (ReLU output): the range must include 0",
             torch.rand(50, 20, generator=gen) * 3 + 0.5, None, False, -128, 127),
            ("per-channel axis=0 symmetric on a square (48, 48) weight", rows, 0, True, -128, 127),
            ("per-channel axis=0 asymmetric on the same square weight", rows + 0.01, 0, False, -128, 127),
            ("per-channel axis=1 asymmetric on (16, 40) activations", torch.randn(16, 40, generator=gen) * 3 - 1, 1, False, -128, 127),
            ("per-channel axis=1 of a 3-D (4, 6, 10) tensor", torch.randn(4, 6, 10, generator=gen), 1, False, -128, 127),
            ("per-channel 4-bit symmetric [-8, 7]", torch.randn(12, 30, generator=gen), 0, True, -8, 7),
            ("per-channel with an all-zero channel (scale must stay > 0)", zero_row, 0, False, -128, 127),
            ("uint8-style range [0, 255], asymmetric", torch.randn(30, 30, generator=gen) - 0.4, None, False, 0, 255),
            ("per-channel on a 1-D tensor (37,): every element is its own channel",
             torch.randn(37, generator=gen) * 2, 0, False, -128, 127),
        ]
    else:
        specs = _qparams_hidden(gen)
    cases = []
    for name, x, axis, symmetric, qmin, qmax in specs:
        lo, hi = ref_range(x, axis)
        cases.append(Case(f"{name} (symmetric={symmetric}, qmin={qmin}, qmax={qmax})", dict(
            x=x, axis=axis, symmetric=symmetric, qmin=qmin, qmax=qmax, lo=lo.float(), hi=hi.float())))
    return cases


def _signed(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _qparams_hidden(gen) -> list:
    """One case per rule, every seed; the seed draws the sizes, magnitudes and bit widths.
    A case's name starts with its rule (the text before the first ':')."""
    def data(*shape, shift=True):
        x = torch.randn(*shape, generator=gen) * float(torch.rand(1, generator=gen) * 5 + 0.1)
        return x + float(torch.randn(1, generator=gen)) if shift else x

    def size(lo=2, hi=24):
        return _randint(gen, lo, hi)

    def any_shape():
        return [size() for _ in range(_randint(gen, 1, 3))]

    def mixed_signs():
        x = data(*any_shape(), shift=False)
        x.view(-1)[:2] = torch.tensor([-1.0, 1.5])[:x.numel()]
        return x

    n = size(3, 24)
    zero = data(size(3, 12), size())
    zero[_randint(gen, 0, zero.shape[0] - 1)] = 0.0
    bits = [4, 6, 3][_randint(gen, 0, 2)]
    ubits = [8, 4][_randint(gen, 0, 1)]
    specs = [  # (rule, x, axis, symmetric, qmin, qmax)
        ("per-tensor symmetric", data(*any_shape()), None, True, -128, 127),
        ("per-tensor asymmetric, mixed signs", mixed_signs(), None, False, -128, 127),
        ("per-tensor asymmetric, all positive (the range must include 0)",
         torch.rand(*any_shape(), generator=gen) * 3 + 0.5, None, False, -128, 127),
        ("per-channel axis=0 on a square matrix", data(n, n), 0, True, -128, 127),
        ("per-channel on the last axis", data(*any_shape()[:2], size(25, 40)), -1, False, -128, 127),
        ("per-channel on the middle axis of a 3-D tensor", data(size(), size(), size()), 1, False, -128, 127),
        ("per-channel on a 1-D tensor (every element is its own channel)", data(size(3, 40)), 0, False, -128, 127),
        ("per-channel with an all-zero channel", zero, 0, False, -128, 127),
        ("unsigned range [0, 2^bits - 1], asymmetric", data(*any_shape()), None, False, 0, (1 << ubits) - 1),
        ("low-bit symmetric per-channel", data(size(), size()), 0, True, *_signed(bits)),
    ]
    out = []
    for rule, x, axis, symmetric, qmin, qmax in specs:
        axis = None if axis is None else axis % x.ndim
        out.append((f"{rule}: shape {tuple(x.shape)} axis={axis}", x, axis, symmetric, qmin, qmax))
    return out


def _qparams_run(ns, case, device):
    c = case.inputs
    lo, hi = entry(ns, "minmax_range")(c["x"], axis=c["axis"])
    scale, zero_point = entry(ns, "qparams")(c["lo"], c["hi"], symmetric=c["symmetric"], qmin=c["qmin"], qmax=c["qmax"])
    return {"lo": to_cpu(lo), "hi": to_cpu(hi), "scale": to_cpu(scale), "zero_point": to_cpu(zero_point),
            "inputs_after": {"x": c["x"].cpu()}}


def _judge_vector(name, got, want, rtol=1e-5, atol=0.0) -> str | None:
    got = _tensor(got)
    if tuple(got.shape) != tuple(want.shape) and not (got.numel() == want.numel() == 1):
        return f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    if not got.dtype.is_floating_point:
        got = got.double()
    report = compare(got.reshape(want.shape).double(), want.double(), atol=atol, rtol=rtol, name=name,
                     dtype=torch.float64)
    return report


def _qparams_judge(case, obs):
    c = case.inputs
    lo, hi = ref_range(c["x"], c["axis"])
    per = "one value per index along axis=%s: reduce over every *other* dimension" % c["axis"] \
        if c["axis"] is not None else "0-d tensors for a per-tensor range"
    for name, got, want in (("minmax_range lo", obs["lo"], lo), ("minmax_range hi", obs["hi"], hi)):
        msg = _judge_vector(name, got, want)
        if msg:
            return msg + f"\n  Expected {per}."
    scale, v = ref_qparams(c["lo"], c["hi"], c["symmetric"], c["qmin"], c["qmax"])
    msg = _judge_vector("qparams scale", obs["scale"], scale)
    if msg:
        hint = ("symmetric: scale = max(|lo|, |hi|) / qmax" if c["symmetric"] else
                "asymmetric: scale = (hi - lo) / (qmax - qmin)")
        return msg + (f"\n  After widening [lo, hi] to include 0: {hint}; never below "
                      f"torch.finfo(torch.float32).eps.")
    zp = _tensor(obs["zero_point"])
    if zp.dtype.is_floating_point or zp.dtype == torch.bool:
        frac = "" if bool((zp == torch.round(zp)).all()) else " (and it holds fractions: it was not rounded)"
        return (f"qparams zero_point has dtype {zp.dtype}{frac}: store it as integers (torch.int32). A zero-point "
                "is the integer code of the real value 0.0, so that 0 is represented exactly.")
    if zp.numel() != scale.numel():
        return f"qparams zero_point has shape {tuple(zp.shape)}, expected {tuple(scale.shape)}."
    msg = _check_codes(zp.reshape(scale.shape), v, c["qmin"], c["qmax"], "qparams zero_point",
                       v_name="qmin - lo / scale")
    if msg:
        return msg + "\n  zero_point = qmin - round(lo / scale), with lo widened to include 0, rounded to nearest."
    return changed_inputs(case, obs.get("inputs_after", {}))


# --- quantize / dequantize ------------------------------------------------------------------------

_EDGES = [-50.0, -1.0, -0.6, -0.4, 0.0, 0.3]  # offsets below/at qmin (mirrored at qmax)


def _codes_with_edges(gen, shape, qmin, qmax):
    """Unrounded codes v of ``shape``: mostly inside the range, the last column at and around both edges."""
    v = qmin - 6 + torch.rand(*shape, generator=gen) * (qmax - qmin + 12)
    v = _away_from_ties(v)
    edges = [qmin + e for e in _EDGES] + [qmax - e for e in _EDGES] + [qmax + 1e4 / 3]
    flat = v.view(-1, shape[-1]) if len(shape) > 1 else v.view(1, -1)
    n = min(flat.shape[1], len(edges))
    for r in range(flat.shape[0]):
        start = (r * 3) % max(1, len(edges) - n + 1)
        flat[r, :n] = torch.tensor(edges[start:start + n])[torch.randperm(n, generator=gen)]
    return v


def _roundtrip_cases(gen, public):
    specs = []  # (name, shape, axis, symmetric, qmin, qmax, dtype)
    if public:
        specs = [("per-tensor symmetric int8", (40, 37), None, True, -128, 127, "float32"),
                 ("per-tensor asymmetric int8 with values at, inside and beyond both edges", (200,), None, False, -128, 127, "float32"),
                 ("per-channel axis=0 on a square (32, 32) weight", (32, 32), 0, False, -128, 127, "float32"),
                 ("per-channel axis=1 on (20, 33)", (20, 33), 1, True, -128, 127, "float32"),
                 ("per-channel axis=2 of a 3-D (3, 4, 25)", (3, 4, 25), 2, False, -128, 127, "float32"),
                 ("4-bit [-8, 7] per-tensor", (64, 16), None, False, -8, 7, "float32"),
                 ("restricted int8 [-127, 127] per-tensor", (50, 13), None, True, -127, 127, "float32"),
                 ("float16 input, per-tensor", (30, 40), None, False, -128, 127, "float16"),
                 ("per-channel on a 1-D tensor: every element is its own channel", (37,), 0, False, -128, 127, "float32"),
                 ("per-channel axis=0 of a 3-D cube (7, 7, 7): a wrong axis keeps the shape", (7, 7, 7), 0, True, -128, 127,
                  "float32")]
    else:
        specs = _roundtrip_hidden(gen)
    cases = []
    for name, shape, axis, symmetric, qmin, qmax, dtype in specs:
        nch = 1 if axis is None else shape[axis]
        scale = (torch.rand(nch, generator=gen) * 0.1 + 0.002)
        zp = torch.zeros(nch, dtype=torch.int32) if symmetric else \
            torch.randint(qmin // 2, qmax // 2 + 1, (nch,), generator=gen, dtype=torch.int32)
        if axis is None:
            scale, zp = scale[0], zp[0]
        v = _codes_with_edges(gen, shape, qmin, qmax)
        bs = _bshape(len(shape), axis)
        x = ((v - zp.reshape(bs).double()) * scale.reshape(bs).double()).to(getattr(torch, dtype))
        q = torch.randint(qmin, qmax + 1, shape, generator=gen, dtype=torch.int8)
        cases.append(Case(f"{name}: shape {shape}, axis={axis}, [{qmin}, {qmax}], {dtype}", dict(
            x=x, scale=scale.float(), zero_point=zp, axis=axis, qmin=qmin, qmax=qmax, q=q)))
    return cases


def _roundtrip_hidden(gen) -> list:
    """One case per rule, every seed, with random sizes (the rule is the name before ':')."""
    def size():
        return _randint(gen, 13, 40)

    def any_shape():
        return tuple(size() for _ in range(_randint(gen, 1, 3)))

    n, bits = size(), [4, 5][_randint(gen, 0, 1)]
    specs = [  # (rule, shape, axis, symmetric, qmin, qmax, dtype)
        ("per-tensor symmetric int8", any_shape(), None, True, -128, 127, "float32"),
        ("per-tensor asymmetric int8", any_shape(), None, False, -128, 127, "float32"),
        ("per-channel axis=0 on a square matrix", (n, n), 0, False, -128, 127, "float32"),
        ("per-channel on the last axis", any_shape()[:2] + (size(),), -1, True, -128, 127, "float32"),
        ("per-channel axis=0 of a 3-D tensor", (size(), size(), size()), 0, False, -128, 127, "float32"),
        ("per-channel on the middle axis of a 3-D tensor", (size(), size(), size()), 1, True, -128, 127, "float32"),
        ("per-channel on a 1-D tensor", (size(),), 0, False, -128, 127, "float32"),
        ("low-bit range", any_shape(), [None, 0][_randint(gen, 0, 1)], False, *_signed(bits), "float32"),
        ("restricted symmetric range [-127, 127]", any_shape(), None, True, -127, 127, "float32"),
        ("float16 input", any_shape(), None, False, -128, 127, "float16"),
    ]
    return [(rule, shape, None if axis is None else axis % len(shape), *rest)
            for rule, shape, axis, *rest in specs]


def _roundtrip_run(ns, case, device):
    c = case.inputs
    q = entry(ns, "quantize")(c["x"], c["scale"], c["zero_point"], axis=c["axis"], qmin=c["qmin"], qmax=c["qmax"])
    dq = entry(ns, "dequantize")(c["q"], c["scale"], c["zero_point"], axis=c["axis"])
    return {"q": to_cpu(q), "dq": to_cpu(dq),
            "inputs_after": {k: c[k].cpu() for k in ("x", "scale", "zero_point", "q")}}


def _roundtrip_judge(case, obs):
    c = case.inputs
    q = obs["q"]
    if not isinstance(q, torch.Tensor):
        return f"quantize must return a torch.Tensor, got {type(q).__name__}."
    if q.dtype != torch.int8:
        return (f"quantize returned dtype {q.dtype}: the stored values must really be torch.int8 (1 byte each). "
                f"A {q.dtype} tensor holding integer values saves no memory: convert with .to(torch.int8) "
                "after clamping.")
    if tuple(q.shape) != tuple(c["x"].shape):
        return f"quantize returned shape {tuple(q.shape)}, expected {tuple(c['x'].shape)}."
    bs = _bshape(c["x"].ndim, c["axis"])
    scale, zp = c["scale"].double().reshape(bs), c["zero_point"].double().reshape(bs)
    v = c["x"].double() / scale + zp
    msg = _check_codes(q, v, c["qmin"], c["qmax"], "quantize")
    if msg:
        if c["axis"] is not None:
            msg += (f"\n  Per-channel: scale[i] and zero_point[i] apply to index i along axis={c['axis']}; "
                    f"reshape them to {tuple(bs)} to broadcast.")
        return msg
    want = (c["q"].double() - zp) * scale
    msg = compare(obs["dq"], want, dtype=torch.float32, name="dequantize")
    if msg:
        if isinstance(obs["dq"], torch.Tensor) and obs["dq"].dtype != torch.float32:
            msg += "\n  dequantize returns float32: (q.float() - zero_point) * scale."
        return msg
    return changed_inputs(case, obs["inputs_after"])


# --- calibration -----------------------------------------------------------------------------------

def ref_calibrate(flat: torch.Tensor, method: str, percentile: float) -> tuple[float, float]:
    flat = flat.double()
    if method == "minmax":
        return float(flat.min()), float(flat.max())
    p = torch.tensor([1 - percentile / 100, percentile / 100], dtype=torch.float64)
    lo, hi = torch.quantile(flat, p)
    return float(lo), float(hi)


def _calib_cases(gen, public):
    specs = []  # (name, sizes, method, percentile, kind)
    if public:
        specs = [("min-max over 4 batches, an outlier in batch 1", [2048, 2048, 2048, 2048], "minmax", 99.9, "outlier"),
                 ("percentile 99.9 over the same batches", [2048, 2048, 2048, 2048], "percentile", 99.9, "outlier"),
                 ("percentile 99 over batches of different sizes", [4000, 640, 1280], "percentile", 99.0, "heavy"),
                 ("min-max of ReLU activations", [1000, 3000], "minmax", 99.9, "relu"),
                 ("percentile 99.99 of ReLU activations", [1000, 3000, 500], "percentile", 99.99, "relu"),
                 ("percentile 100 equals min-max", [700, 900], "percentile", 100.0, "outlier"),
                 ("a single batch", [5000], "percentile", 99.5, "heavy")]
    else:  # one case per rule, every seed (the rule is the name before ':'); random batch counts and sizes
        def batches(lo, hi):
            return [_randint(gen, 200, 3000) for _ in range(_randint(gen, lo, hi))]

        def level():
            return [99.0, 99.9, 99.99, 95.0][_randint(gen, 0, 3)]
        specs = [("min-max, an outlier in an early batch", batches(3, 5), "minmax", 99.9, "outlier"),
                 ("percentile, several batches of different sizes", batches(2, 5), "percentile", level(), "heavy"),
                 ("percentile of a single batch", batches(1, 1), "percentile", level(), "heavy"),
                 ("percentile 100 equals min-max", batches(2, 4), "percentile", 100.0, "outlier"),
                 ("min-max of ReLU activations", batches(1, 3), "minmax", 99.9, "relu"),
                 ("percentile of ReLU activations", batches(2, 4), "percentile", level(), "relu")]
    cases = []
    for name, sizes, method, pct, kind in specs:
        n = sum(sizes)
        if kind == "relu":
            flat = torch.relu(torch.randn(n, generator=gen) * 2)
        elif kind == "heavy":  # Student-t-like tails
            flat = torch.randn(n, generator=gen) / (torch.rand(n, generator=gen) * 0.9 + 0.1)
        else:
            flat = torch.randn(n, generator=gen)
            if len(sizes) > 1:
                flat[sizes[0] + _randint(gen, 0, sizes[1] - 1)] = 25.0  # in batch 1, not the last
                flat[_randint(gen, 0, sizes[0] - 1)] = -18.0
        cases.append(Case(f"{name}: {len(sizes)} batch(es) of {sizes} values, method={method!r}, percentile={pct}",
                          dict(flat=flat, sizes=sizes, method=method, percentile=pct)))
    return cases


def _calib_run(ns, case, device):
    c = case.inputs
    batches = [b.view(-1, 4) if b.numel() % 4 == 0 else b for b in torch.split(c["flat"].clone(), c["sizes"])]
    out = entry(ns, "calibrate")(batches, method=c["method"], percentile=c["percentile"])
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"bad": f"calibrate must return a pair (lo, hi), got {type(out).__name__}"}
    return {"lo": float(out[0]), "hi": float(out[1])}


def _calib_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    lo, hi = ref_calibrate(c["flat"], c["method"], c["percentile"])
    tol = 1e-4 * max(hi - lo, 1e-6)
    for name, got, want in (("lo", obs["lo"], lo), ("hi", obs["hi"], hi)):
        if not math.isfinite(got) or abs(got - want) > tol:
            extra = ("the minimum and maximum over *all* batches (a running min/max, as an observer keeps)"
                     if c["method"] == "minmax" else
                     f"the {100 - c['percentile']:g}-th and {c['percentile']:g}-th percentiles of all batches' values "
                     "together (torch.quantile on the concatenation, linear interpolation), not an average of "
                     "per-batch percentiles")
            return f"calibrate: {name} = {got:.6g}, expected {want:.6g}: the range is {extra}."
    return None


# --- PTQ: a weight-only quantized linear layer ------------------------------------------------------

def _ptq_weight(gen, out_f, in_f, bits, per_channel, zero_row=False):
    """Random weights whose codes stay away from rounding ties (row norms vary over 30x)."""
    w = torch.randn(out_f, in_f, generator=gen) * torch.logspace(-1.5, 0, out_f)[torch.randperm(out_f, generator=gen)][:, None]
    if zero_row:
        w[out_f // 2] = 0.0
    qmax = (1 << (bits - 1)) - 1
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax()
    s = (amax / qmax).clamp(min=EPS)
    return (_away_from_ties(w.double() / s) * s).float()


def _ptq_cases(gen, public):
    specs = [(32, 32, 8, True, True, False), (24, 40, 8, False, True, False), (33, 17, 4, True, True, False),
             (48, 48, 8, True, False, False), (16, 20, 8, True, True, True), (20, 20, 3, False, True, False)]
    specs = [("", *spec) for spec in specs]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        def size():
            return _randint(gen, 4, 48)
        o = [size() for _ in range(5)]
        other = [size() for _ in range(5)]
        other = [k + 1 if k == n else k for k, n in zip(other, o)]  # surely not square
        specs = [("per-channel int8 on a square weight: ", o[0], o[0], 8, True, True, False),
                 ("per-tensor 4-bit: ", o[1], other[1], 4, False, True, False),
                 ("per-channel 6-bit, no bias: ", o[2], other[2], 6, True, False, False),
                 ("per-channel with an all-zero row: ", o[3], other[3], 8, True, True, True),
                 ("per-channel 4-bit on a square weight: ", o[4], o[4], 4, True, True, False)]
    cases = []
    for rule, out_f, in_f, bits, per_channel, bias, zero_row in specs:
        w = _ptq_weight(gen, out_f, in_f, bits, per_channel, zero_row)
        cases.append(Case(f"{rule}Linear({in_f}, {out_f}, bias={bias}), bits={bits}, per_channel={per_channel}"
                          + (", one all-zero row" if zero_row else ""), dict(
            weight=w, bias=torch.randn(out_f, generator=gen) * 0.1 if bias else None,
            x=torch.randn(9, in_f, generator=gen), bits=bits, per_channel=per_channel)))
    return cases


def _ptq_run(ns, case, device):
    c = case.inputs
    out_f, in_f = c["weight"].shape
    linear = nn.Linear(in_f, out_f, bias=c["bias"] is not None)
    with torch.no_grad():
        linear.weight.copy_(c["weight"])
        if c["bias"] is not None:
            linear.bias.copy_(c["bias"])
    qlin = entry(ns, "QuantLinear").from_float(linear, bits=c["bits"], per_channel=c["per_channel"])
    if not isinstance(qlin, nn.Module):
        return {"bad": f"QuantLinear.from_float must return an nn.Module, got {type(qlin).__name__}"}
    with torch.no_grad():
        y = qlin(c["x"])
    bias = getattr(qlin, "bias", None)
    return {"qweight": to_cpu(getattr(qlin, "qweight", None)), "scale": to_cpu(getattr(qlin, "scale", None)),
            "bias": to_cpu(bias), "y": to_cpu(y), "inputs_after": {"weight": linear.weight.detach().cpu()}}


def _ptq_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    w = c["weight"].double()
    out_f, in_f = w.shape
    qmax = (1 << (c["bits"] - 1)) - 1
    qw, scale = obs["qweight"], obs["scale"]
    if not isinstance(qw, torch.Tensor) or not isinstance(scale, torch.Tensor):
        return "QuantLinear needs tensor attributes `qweight` (int8) and `scale` (float32)."
    if qw.dtype != torch.int8:
        return (f"QuantLinear.qweight has dtype {qw.dtype}: quantized weights must be stored as torch.int8 "
                "(1 byte per weight, 4x smaller than float32); keeping float values next to a scale saves nothing.")
    if tuple(qw.shape) != (out_f, in_f):
        return f"QuantLinear.qweight has shape {tuple(qw.shape)}, expected the weight's ({out_f}, {in_f})."
    if c["per_channel"]:
        want = (w.abs().amax(dim=1) / qmax).clamp(min=EPS)
        wrong_axis = (w.abs().amax(dim=0) / qmax).clamp(min=EPS)
        flat = scale.double().flatten()
        if (flat.numel() == in_f != out_f) or (flat.numel() == out_f == in_f and not torch.allclose(
                flat, want, rtol=1e-5) and torch.allclose(flat, wrong_axis, rtol=1e-5)):
            return ("QuantLinear.scale is per *input* channel (one per column): per-channel scales of a linear "
                    "weight (out_features, in_features) are per *output* channel, axis 0, one per row: "
                    "scale[i] = max|W[i, :]| / qmax. Each output is then one dot product times one scale.")
        if flat.numel() != out_f:
            return f"QuantLinear.scale has shape {tuple(scale.shape)}, expected ({out_f},): one scale per output row."
    else:
        want = (w.abs().amax() / qmax).clamp(min=EPS).reshape(1)
        if scale.numel() != 1:
            return f"QuantLinear.scale has shape {tuple(scale.shape)}; per-tensor quantization has one scale."
    if scale.dtype != torch.float32:
        return f"QuantLinear.scale has dtype {scale.dtype}, expected float32."
    msg = compare(scale.double().flatten(), want, rtol=1e-5, atol=0, dtype=torch.float64, name="QuantLinear.scale")
    if msg:
        return msg + f"\n  Symmetric quantization of the weight: scale = max|W| / qmax with qmax = {qmax} for {c['bits']} bits."
    v = w / want.reshape(-1, 1) if c["per_channel"] else w / want
    msg = _check_codes(qw, v, -qmax - 1, qmax, "QuantLinear.qweight")
    if msg:
        return msg
    if c["bias"] is not None and compare(obs["bias"], c["bias"], name="QuantLinear.bias", dtype=torch.float32):
        return "QuantLinear.bias must be the float layer's bias, kept in float32."
    deq = qw.double() * scale.double().reshape(-1, 1)
    want_y = c["x"].double() @ deq.T + (c["bias"].double() if c["bias"] is not None else 0)
    msg = compare(obs["y"], want_y, atol=1e-4, rtol=1e-4, dtype=torch.float32, name="QuantLinear forward")
    if msg:
        return msg + "\n  forward(x) = x @ (qweight * scale[:, None]).T + bias, in float32."
    return changed_inputs(case, obs["inputs_after"])


# --- fake quantization with a straight-through estimator ---------------------------------------------

def _fq_cases(gen, public):
    specs = []  # (name, shape, per_row, qmin, qmax, symmetric)
    if public:
        specs = [("per-tensor int8 symmetric, values on both sides of the clip range", (64, 20), False, -128, 127, True),
                 ("per-tensor 4-bit asymmetric [-8, 7]", (50, 11), False, -8, 7, False),
                 ("per-row scales (shape (C, 1)), 3-bit [-4, 3]", (16, 33), True, -4, 3, True),
                 ("per-row scales, int8 asymmetric", (12, 40), True, -128, 127, False)]
    else:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        for rule, bits, per_row, symmetric in (("per-tensor symmetric int8", 8, False, True),
                                               ("per-row symmetric 4-bit", 4, True, True),
                                               ("per-tensor asymmetric 3-bit", 3, False, False),
                                               ("per-row asymmetric 2-bit", 2, True, False)):
            specs.append((rule, (_randint(gen, 4, 40), _randint(gen, 4, 40)), per_row, *_signed(bits), symmetric))
    cases = []
    for name, shape, per_row, qmin, qmax, symmetric in specs:
        n = shape[0] if per_row else 1
        scale = torch.rand(n, generator=gen) * 0.2 + 0.01
        zp = torch.zeros(n, dtype=torch.int32) if symmetric else \
            torch.randint(qmin // 2, qmax // 2 + 1, (n,), generator=gen, dtype=torch.int32)
        if per_row:
            scale, zp = scale.view(-1, 1), zp.view(-1, 1)
        else:
            scale, zp = scale[0], zp[0]
        v = _codes_with_edges(gen, shape, qmin, qmax)
        x = ((v - zp.double()) * scale.double()).float()
        cases.append(Case(f"{name}: x {shape}, [{qmin}, {qmax}]", dict(
            x=x, scale=scale.float(), zero_point=zp, qmin=qmin, qmax=qmax, grad=torch.randn(*shape, generator=gen))))
    return cases


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


def _fq_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    scale, zp = c["scale"].double(), c["zero_point"].double()
    qmin, qmax = c["qmin"], c["qmax"]
    v = c["x"].double() / scale + zp  # unrounded codes
    lo, hi = _allowed(v, qmin, qmax)
    y = obs["y"]
    if y.dtype != torch.float32 or tuple(y.shape) != tuple(c["x"].shape):
        return f"fake_quant returned {y.dtype} {tuple(y.shape)}, expected float32 {tuple(c['x'].shape)}."
    code = y.double() / scale + zp  # the learner's integer codes, recovered
    bad = (code < lo - 1e-3) | (code > hi + 1e-3)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        want = float(((lo - zp) * scale).flatten()[i])
        return (f"fake_quant forward: {int(bad.sum())} of {y.numel()} values differ from "
                f"(clamp(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale; at {_fmt_idx(i, y.shape)}: "
                f"got {float(y.flatten()[i]):.6g}, expected {want:.6g}.")
    if not obs["requires_grad"] or obs["grad"] is None:
        return ("no gradient reached x: fake_quant's output must be differentiable. Build it with a "
                "torch.autograd.Function (FakeQuantSTE.apply) whose backward returns a gradient for x.")
    g, grad = c["grad"].double(), obs["grad"].double()
    inside = (v >= qmin) & (v <= qmax)                                # round(v) surely in [qmin, qmax]
    outside = (v < qmin - 0.5 - TIE) | (v > qmax + 0.5 + TIE)         # round(v) surely outside
    band = ~inside & ~outside  # within half a step outside: conventions differ (rounded or unrounded code)
    close = (grad - g).abs() <= 1e-6 * (1 + g.abs())
    zero = grad == 0
    n_in = int(inside.sum())
    if n_in and int((zero & inside).sum()) == n_in:
        return (f"the gradient is zero at all {n_in} elements inside the clipping range: torch.round has "
                "derivative 0 almost everywhere, so autograd through round() stops training. A straight-through "
                "estimator treats round as the identity in backward: grad_x = grad_output inside the range.")
    wrong_in = inside & ~close
    if bool(wrong_in.any()):
        i = int(wrong_in.flatten().nonzero()[0])
        return (f"STE gradient wrong at {int(wrong_in.sum())} of {n_in} elements inside the clipping range; at "
                f"{_fmt_idx(i, v.shape)}: got {float(grad.flatten()[i]):.6g}, expected grad_output "
                f"{float(g.flatten()[i]):.6g} (the STE passes it through unchanged).")
    leak = outside & ~zero
    if bool(leak.any()):
        return (f"the gradient is nonzero at {int(leak.sum())} of {int(outside.sum())} elements outside the clipping "
                f"range [{qmin}, {qmax}] (in integer codes): a clipped STE zeroes them, because a clamped output "
                "does not move when x moves. Mask grad_output with qmin <= round(x / scale) + zero_point <= qmax.")
    if bool((band & ~(close | zero)).any()):
        return ("within half a step outside the clip range the gradient must be grad_output or 0 "
                "(mask on the rounded or the unrounded code), nothing else.")
    return changed_inputs(case, obs["inputs_after"])


# --- QAT: a linear layer that trains through fake-quantized weights ---------------------------------

def _qat_cases(gen, public):
    specs = [("", 24, 16, 4, True), ("", 16, 16, 3, False), ("", 33, 7, 8, True)]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        specs = [(f"{b}-bit {'with' if b % 2 else 'without'} bias: ", _randint(gen, 3, 40), _randint(gen, 3, 40),
                  b, bool(b % 2)) for b in (3, 4, 5)]
    cases = []
    for rule, in_f, out_f, bits, bias in specs:
        w = _ptq_weight(gen, out_f, in_f, bits, per_channel=True)
        cases.append(Case(f"{rule}QATLinear from Linear({in_f}, {out_f}, bias={bias}), bits={bits}", dict(
            weight=w, bias=torch.randn(out_f, generator=gen) * 0.1 if bias else None, bits=bits,
            x=torch.randn(10, in_f, generator=gen), grad=torch.randn(10, out_f, generator=gen))))
    return cases


def _qat_run(ns, case, device):
    c = case.inputs
    out_f, in_f = c["weight"].shape
    linear = nn.Linear(in_f, out_f, bias=c["bias"] is not None)
    with torch.no_grad():
        linear.weight.copy_(c["weight"])
        if c["bias"] is not None:
            linear.bias.copy_(c["bias"])
    layer = entry(ns, "QATLinear").from_linear(linear, bits=c["bits"])
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
            "grad_b": to_cpu(b.grad) if isinstance(b, torch.Tensor) else None,
            "weight": to_cpu(weight.detach())}


def _qat_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    w, x, g = c["weight"].double(), c["x"].double(), c["grad"].double()
    qmax = (1 << (c["bits"] - 1)) - 1
    s = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=EPS)
    wq = torch.round(w / s).clamp(-qmax - 1, qmax) * s
    y = x @ wq.T + (c["bias"].double() if c["bias"] is not None else 0)
    msg = compare(obs["weight"], c["weight"], name="QATLinear.weight (copied from the float layer)")
    if msg:
        return msg
    msg = compare(obs["y"], y, atol=1e-4, rtol=1e-4, dtype=torch.float32, name="QATLinear forward")
    if msg:
        return msg + (f"\n  forward = x @ fake_quant(W).T + b with per-output-channel symmetric scales "
                      f"max|W[i, :]| / {qmax}, computed from the *detached* weight.")
    if obs["grad_w"] is None or float(obs["grad_w"].abs().max()) == 0.0:
        return ("QATLinear.weight received no gradient: the fake-quantized weight must stay connected to the "
                "float weight through the straight-through estimator (use your fake_quant, do not detach it).")
    for name, got, want in (("grad of the input x", obs["grad_x"], g @ wq),
                            ("grad of weight", obs["grad_w"], g.T @ x)):
        msg = compare(got, want, atol=1e-4, rtol=1e-4, dtype=torch.float32, name=f"QATLinear {name}")
        if msg:
            hint = ("x's gradient flows through the *fake-quantized* weight: grad_x = grad_y @ fake_quant(W)."
                    if "input" in name else
                    "with the STE, grad_W = grad_y.T @ x (every weight is inside its min-max range); the scale is an "
                    "observer's statistic, computed from W.detach(), so no gradient flows through it.")
            return msg + "\n  " + hint
    if c["bias"] is not None:
        msg = compare(obs["grad_b"], g.sum(0), atol=1e-4, rtol=1e-4, dtype=torch.float32, name="QATLinear grad of bias")
        if msg:
            return msg
    return None


# --- FP8 with per-tensor scaling ---------------------------------------------------------------------

def _fp8_cases(gen, public):
    specs = [("e4m3", "Gaussian", (64, 64), 1.0, "float32"), ("e5m2", "Gaussian x 1e3", (40, 50), 1e3, "float32"),
             ("e4m3", "small values (1e-3): unscaled, most would underflow", (32, 32), 1e-3, "float32"),
             ("e4m3", "outliers", (30, 30), 1.0, "float32"), ("e5m2", "gradients 1e-6", (16, 64), 1e-6, "float16"),
             ("e4m3", "all zeros", (8, 8), 0.0, "float32")]
    specs = [(fmt, f"{fmt}, {name}", *rest) for fmt, name, *rest in specs]
    if not public:  # one case per rule, every seed (the rule is the name before ':'); random sizes and magnitudes
        def magnitude(lo, hi):  # 10 ** uniform(lo, hi)
            return float(10 ** (lo + (hi - lo) * torch.rand(1, generator=gen)))
        fmt = ["e4m3", "e5m2"][_randint(gen, 0, 1)]
        rules = [("e4m3", "small values (unscaled, most would underflow)", magnitude(-6, -3), "float32"),
                 ("e5m2", "gradient-sized values (unscaled, most would underflow)", magnitude(-9, -6), "float32"),
                 ("e4m3", "values beyond 448 (unscaled, they would saturate)", magnitude(2.5, 4), "float32"),
                 ("e5m2", "large values", magnitude(3, 5), "float32"),
                 (fmt, "float16 input", magnitude(-2, 2), "float16"),
                 (fmt, "all zeros", 0.0, "float32")]
        specs = [(f, f"{rule}: {f}", (_randint(gen, 1, 64), _randint(gen, 1, 64)), m, dt) for f, rule, m, dt in rules]
    cases = []
    for fmt, name, shape, mag, dtype in specs:
        x = torch.randn(*shape, generator=gen) * mag
        if name.endswith("outliers"):
            x.view(-1)[:3] = torch.tensor([300.0, -150.0, 90.0])
        x = x.to(getattr(torch, dtype))
        fdt, fmax = FP8[fmt][:2]
        ref_scale = torch.tensor(2.0 ** _randint(gen, -10, 4))
        x8 = (torch.randn(*shape, generator=gen) * 40).clamp(-fmax, fmax).to(fdt)
        cases.append(Case(f"{name}, shape {shape} {dtype}", dict(
            x=x, fmt=fmt, x8_bits=x8.view(torch.uint8), scale_in=ref_scale)))
    return cases


def _fp8_run(ns, case, device):
    c = case.inputs
    fdt = FP8[c["fmt"]][0]
    out = entry(ns, "fp8_quantize")(c["x"], fmt=c["fmt"])
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"bad": f"fp8_quantize must return (x_fp8, scale), got {type(out).__name__}"}
    x8, scale = out
    deq = entry(ns, "fp8_dequantize")(c["x8_bits"].view(fdt), c["scale_in"])
    return {"dtype": str(x8.dtype) if isinstance(x8, torch.Tensor) else type(x8).__name__,
            "values": x8.detach().cpu().float() if isinstance(x8, torch.Tensor) else None,
            "scale": float(scale), "deq": to_cpu(deq),
            "inputs_after": {"x": c["x"].cpu()}}


def _fp8_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    fdt, fmax, mbits, emin = FP8[c["fmt"]]
    if obs["dtype"] != str(fdt):
        return (f"fp8_quantize returned {obs['dtype']}: the values must be stored as {fdt} (1 byte each) for "
                f"fmt={c['fmt']!r}; rounding float32 values to the fp8 grid but keeping float32 saves nothing.")
    x = c["x"].double()
    amax = float(x.abs().max())
    scale = obs["scale"]
    if amax == 0:
        if not (math.isfinite(scale) and scale > 0):
            return f"fp8_quantize of an all-zero tensor must still return a positive, finite scale (got {scale})."
    elif not math.isclose(scale, amax / fmax, rel_tol=1e-5):
        return (f"fp8_quantize scale = {scale:.6g}, expected amax / {fmax:g} = {amax / fmax:.6g}: per-tensor scaling "
                f"maps the largest |x| to the largest finite {c['fmt']} value, so x / scale uses the whole range.")
    vals = obs["values"].double()
    if tuple(vals.shape) != tuple(x.shape):
        return f"fp8_quantize returned shape {tuple(vals.shape)}, expected {tuple(x.shape)}."
    err = (vals * scale - x).abs()
    bound = torch.maximum(x.abs() * 2.0 ** -(mbits + 1), torch.full_like(x, scale * 2.0 ** (emin - mbits - 1)))
    bad = ~(err <= bound * 1.001 + 1e-300)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        return (f"fp8_quantize: {int(bad.sum())} of {x.numel()} values are further from x than {c['fmt']} rounding "
                f"allows; at {_fmt_idx(i, x.shape)}: x = {float(x.flatten()[i]):.6g}, x_fp8 * scale = "
                f"{float((vals * scale).flatten()[i]):.6g}. Store (x / scale).to({fdt}).")
    want = c["x8_bits"].view(fdt).double() * float(c["scale_in"])
    msg = compare(obs["deq"], want, dtype=torch.float32, name="fp8_dequantize")
    if msg:
        return msg + "\n  fp8_dequantize returns x_fp8.float() * scale (float32)."
    return changed_inputs(case, obs["inputs_after"])


# --- the weight-only int8 matmul kernel -----------------------------------------------------------

class _AllocationRecorder:
    """A ``TorchDispatchMode`` that adds up the elements of every floating-point tensor an ATen op
    *creates* (views, in-place and ``out=`` ops create nothing), with the op names."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                schema = func._schema
                if not schema.is_mutable and all(r.alias_info is None for r in schema.returns):
                    for o in (out if isinstance(out, (tuple, list)) else (out,)):
                        if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.numel():
                            recorder.float_elements += o.numel()
                            recorder.biggest = max(recorder.biggest, (o.numel(), str(func), tuple(o.shape)))
                return out

        self.mode = _Mode()
        self.float_elements = 0
        self.biggest = (0, "", ())


@contextlib.contextmanager
def _launch_args():
    """Record the tensor arguments of every Triton launch: (dtype, numel, data_ptr) of each."""
    from triton.runtime.jit import KernelInterface

    calls: list[list] = []
    original = KernelInterface.__getitem__

    def getitem(self, grid):
        launch = original(self, grid)

        def recording(*args, **kwargs):
            calls.append([(str(a.dtype), a.numel(), a.data_ptr()) for a in (*args, *kwargs.values())
                          if isinstance(a, torch.Tensor)])
            return launch(*args, **kwargs)
        return recording

    KernelInterface.__getitem__ = getitem
    try:
        yield calls
    finally:
        KernelInterface.__getitem__ = original


_CANCEL = 256  # columns of x and w at each end of K whose products cancel (see _cancelling_inputs)


def _cancelling_inputs(gen, x, w):
    """Make the first and last ``_CANCEL`` columns' products cancel, in place: the first columns
    give every output a large positive partial sum, the last take it back, so the result is the
    middle columns' small sum. Accumulated in float16, the large partial sum sits on a coarse grid,
    every middle tile added to it is rounded to that grid, and the error comes out 30 to 100 times
    the float32 accumulator's (measured in the interpreter, BLOCK_K 32 to 256): only float32
    accumulation passes."""
    m, k = x.shape
    big = _CANCEL
    w[:, :big] = w[:, :big].abs()
    w[:, k - big:] = w[:, :big]                                      # mirrored weights ...
    x[:, :big] = torch.rand(m, big, generator=gen) + 0.5
    x[:, big:k - big] *= 0.25
    x[:, k - big:] = -x[:, :big]                                     # ... times opposite activations


def _wmm_cases(gen, public):
    specs = [("", 1, 64, 64, "float32", False), ("", 5, 100, 72, "float32", False), ("", 16, 96, 130, "float16", False),
             ("", 33, 160, 192, "float32", False), ("", 4, 128, 256, "float16", False),
             ("partial sums that cancel (float32 accumulation needed): ", 8, 96, 2048, "float16", True)]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        def nk():
            return _randint(gen, 64, 200), _randint(gen, 64, 200)
        specs = [("decode (M = 1): ", 1, *nk(), "float16", False),
                 ("small M: ", _randint(gen, 2, 16), *nk(), "float32", False),
                 ("M above one block: ", _randint(gen, 17, 40), *nk(), "float16", False),
                 ("float32, M above one block: ", _randint(gen, 17, 40), *nk(), "float32", False),
                 ("partial sums that cancel (float32 accumulation needed): ", _randint(gen, 1, 16),
                  _randint(gen, 64, 160), _randint(gen, 1024, 2048), "float16", True)]
    cases = []
    for rule, m, n, k, dtype, cancel in specs:
        while not public and m * (n + k) * 4 > n * k:  # keep activations + output well below the weight's size
            n, k = n + 16, k + 16
        w = torch.randn(n, k, generator=gen) * torch.logspace(-2, -0.5, n)[torch.randperm(n, generator=gen)][:, None]
        x = torch.randn(m, k, generator=gen)
        if cancel:
            _cancelling_inputs(gen, x, w)
        scale = (w.abs().amax(dim=1) / 127).float()
        w_q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
        cases.append(Case(f"{rule}M={m} N={n} K={k} {dtype} activations", dict(
            x=x.to(getattr(torch, dtype)), w_q=w_q, w_scale=scale)))
    return cases


def _wmm_run(ns, case, device):
    c = case.inputs
    x, w_q, w_scale = padded(c["x"], device), padded(c["w_q"], device), padded(c["w_scale"], device)
    M, K = x.shape
    N = w_q.shape[0]
    fn = entry(ns, "int8_weight_matmul")
    if device == "cuda":  # compile and autotune before recording: autotuning allocates its own tensors
        fn(x, w_q, w_scale, out=torch.empty(M, N, dtype=x.dtype, device=device))
        synchronize(device)
    rec = _AllocationRecorder()

    @contextlib.contextmanager
    def recorders(bufs):  # around the learner's call only: kernel arguments, PyTorch allocations
        with _launch_args() as calls, rec.mode:
            yield calls

    call = observe_kernel(lambda out: fn(x, w_q, w_scale, out=out), {"out": ((M, N), x.dtype)}, device,
                          inputs={"x": x, "w_q": w_q, "w_scale": w_scale}, watch=recorders)
    w_ptr = w_q.data_ptr()
    args = [[(dt, n, p == w_ptr) for dt, n, p in launch] for launch in call.watched]
    return {**call.as_obs(), "args": args, "float_elements": rec.float_elements,
            "biggest": [rec.biggest[0], rec.biggest[1], list(rec.biggest[2])]}


def _wmm_judge(case, obs):
    c = case.inputs
    x, w_q, s = c["x"], c["w_q"], c["w_scale"]
    M, K = x.shape
    N = w_q.shape[0]
    verdict = launch_verdict(obs, "int8_weight_matmul", "compute the product in your @triton.jit kernel, which loads "
                             "the int8 weights and dequantizes them in registers")
    if verdict:
        return verdict
    nk = N * K
    floats = [(dt, n) for call in obs["args"] for dt, n, _ in call if "float" in dt and n >= nk]
    if floats:
        return (f"a kernel received a floating-point tensor of {floats[0][1]} elements ({floats[0][0]}), as large as the "
                f"({N}, {K}) weight: the weight was dequantized before the kernel. Pass the int8 weight itself and "
                "convert each tile inside the kernel (w.to(tl.float32) or to x's dtype), then apply the scales.")
    if obs["float_elements"] >= nk:
        n, op, shape = obs["biggest"]
        return (f"your wrapper created {obs['float_elements']} floating-point elements in PyTorch during the call "
                f"(the weight has {nk}; largest: {op} of shape {tuple(shape)}): the weight was dequantized in PyTorch. "
                "Weight-only quantization saves memory traffic only if the kernel reads int8 and dequantizes in "
                "registers; allocate nothing bigger than the output.")
    if not any(dt in ("torch.int8", "torch.uint8") and n == nk for call in obs["args"] for dt, n, _ in call):
        return (f"no kernel launch received the int8 weight ({N} x {K} = {nk} one-byte elements): pass `w_q` to "
                "the kernel and load int8 values there.")
    w = w_q.double() * s.double()[:, None]  # (N, K) dequantized weight
    want = x.double() @ w.T
    loose = 1e-2 * (x.double().abs() @ w.abs().T) + 1e-6  # "right" for the ablated run: any careful PyTorch sum
    verdict = (outside_verdict(obs, "int8_weight_matmul",
                               lambda o: bool(((o["out"].double() - want).abs() <= loose).all()))
               or bounds_verdict(obs) or return_verdict(obs, "int8_weight_matmul"))
    if verdict:
        return verdict
    out = obs["out"]
    if not isinstance(out, torch.Tensor) or out.dtype != x.dtype or tuple(out.shape) != (M, N):
        return f"int8_weight_matmul: expected a {x.dtype} tensor of shape {(M, N)}."
    # Rounding of the output (fp16: 2^-11 relative), plus the dot product's own error, which scales
    # with |x| @ |w|.T (not |out|, which may be ~0). For float32 activations on a GPU that is TF32
    # (tl.dot's default for fp32) rounding x to 10 mantissa bits: 1e-3. float16 activations times
    # int8 codes are exact products, so only the float32 accumulator rounds, far below 5e-5; a
    # float16 accumulator errs by 5e-4 to 2e-3 of |x| @ |w|.T on the cancelling case.
    dot_rtol = 5e-5 if x.dtype == torch.float16 else 1e-3
    bound = 2e-3 * want.abs() + dot_rtol * (x.double().abs() @ w.abs().T) + 1e-6
    err = (out.double() - want).abs()
    bad = ~(err <= bound)  # NaN (an element never written) is bad too
    if bool(bad.any()):
        lines = [f"int8_weight_matmul: {int(bad.sum())} of {out.numel()} outputs differ for M={M} N={N} K={K} {x.dtype}."]
        n_nan = int(torch.isnan(out).sum())
        if n_nan:
            lines.append(f"  {n_nan} outputs are NaN: never written (the output was poisoned) or a NaN computed.")
        for i in bad.flatten().nonzero().flatten()[:4].tolist():
            lines.append(f"  at {_fmt_idx(i, (M, N))}: got {float(out.flatten()[i]):.6g}, expected "
                         f"{float(want.flatten()[i]):.6g} (allowed error {float(bound.flatten()[i]):.2g})")
        lines.append("  out[m, n] = sum_k x[m, k] * w_q[n, k] * w_scale[n]: accumulate in float32 and apply the "
                     "per-output-channel scale once, to the accumulator.")
        return mismatch_verdict("\n".join(lines), obs)
    return final_verdict(case, obs)


EXERCISES = [
    Exercise("quant_params", 3, ("minmax_range", "qparams"), _qparams_cases, _qparams_run, _qparams_judge,
             title="Ranges, scales and zero-points (symmetric, asymmetric, per-tensor, per-channel)",
             hint="Widen [lo, hi] to include 0. Symmetric: scale = max(-lo, hi) / qmax, zero_point = 0. Asymmetric: "
                  "scale = (hi - lo) / (qmax - qmin), zero_point = qmin - round(lo / scale) as int32. Clamp the scale "
                  "to at least torch.finfo(torch.float32).eps. Per-channel: reduce over every dim except `axis`."),
    Exercise("quant_roundtrip", 3, ("quantize", "dequantize"), _roundtrip_cases, _roundtrip_run, _roundtrip_judge,
             title="quantize / dequantize",
             hint="q = clamp(round(x / scale) + zero_point, qmin, qmax).to(torch.int8), computed in float32; per-channel: "
                  "reshape scale and zero_point to broadcast along `axis`. dequantize: (q.float() - zero_point) * scale."),
    Exercise("quant_calibrate", 2, ("calibrate",), _calib_cases, _calib_run, _calib_judge,
             title="Calibration: min-max and percentile",
             hint="Concatenate every batch (flattened). min-max: (min, max). percentile p: torch.quantile of the "
                  "concatenation at (1 - p/100) and p/100."),
    Exercise("ptq_linear", 3, ("QuantLinear",), _ptq_cases, _ptq_run, _ptq_judge,
             title="Post-training quantization: a weight-only int8 linear layer",
             hint="qmax = 2**(bits-1) - 1; per-channel scale = W.abs().amax(dim=1) / qmax (one per output row); "
                  "store qweight = round(W / scale[:, None]).clamp(-qmax-1, qmax).to(torch.int8) as a buffer."),
    Exercise("fake_quant_ste", 3, ("fake_quant",), _fq_cases, _fq_run, _fq_judge,
             title="Fake quantization with a clipped straight-through estimator",
             hint="forward: (clamp(round(x/s)+zp, qmin, qmax) - zp) * s, and save the mask qmin <= round(x/s)+zp <= qmax; "
                  "backward: grad_output * mask for x, None for the other arguments."),
    Exercise("qat_linear", 2, ("QATLinear",), _qat_cases, _qat_run, _qat_judge,
             title="QAT: a linear layer with fake-quantized weights",
             hint="forward: s = W.detach().abs().amax(dim=1, keepdim=True) / qmax (clamped to eps); "
                  "F.linear(x, fake_quant(W, s, 0, -qmax-1, qmax), bias)."),
    Exercise("fp8_quant", 2, ("fp8_quantize", "fp8_dequantize"), _fp8_cases, _fp8_run, _fp8_judge,
             title="FP8 e4m3 / e5m2 with per-tensor scaling",
             hint="scale = amax / 448 (e4m3) or / 57344 (e5m2), 1.0 if amax is 0; x_fp8 = (x.float() / scale)"
                  ".clamp(-fmax, fmax).to(torch.float8_e4m3fn or torch.float8_e5m2)."),
    Exercise("int8_weight_matmul", 4, ("int8_weight_matmul",), _wmm_cases, _wmm_run, _wmm_judge,
             title="Weight-only int8 matmul in Triton (dequantize in the kernel)",
             hint="Tile (BLOCK_M, BLOCK_N) outputs; per K step load an x tile and an int8 w tile (mask both), "
                  "acc = tl.dot(x, w.to(x.dtype), acc) in float32; after the loop multiply by the scales of the "
                  "tile's columns and store with a mask."),
]


# --- benchmarks (python -m grader bench) -----------------------------------------------------------

def _bench_wmm(m, kn):
    def make(device, tiny):
        k = n = 128 if tiny else kn
        dtype = torch.float32 if device == "cpu" else torch.float16  # "meta": the GPU's inputs, for gpulab.aot
        w = torch.randn(n, k, device=device) * 0.02
        scale = (w.abs().amax(dim=1) / 127).float()
        w_q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
        x = torch.randn(m, k, device=device, dtype=dtype)
        w_t = (w_q.float() * scale[:, None]).to(dtype).t()  # the baseline's dense weight, (K, N)
        esz = x.element_size()
        return {"x": x, "w_q": w_q, "scale": scale, "w_t": w_t, "out": torch.empty(m, n, device=device, dtype=dtype),
                "bytes": n * k + 4 * n + esz * (m * k + m * n), "flops": 2 * m * n * k}
    return make


def _bench_quant(device, tiny):
    n = 1 << 14 if tiny else 1 << 27
    x = torch.randn(n, device=device, dtype=torch.float32 if device == "cpu" else torch.float16)
    return {"x": x, "scale": torch.tensor(4.0 / 127, device=device), "zp": torch.tensor(0, dtype=torch.int32, device=device),
            "bytes": n * (x.element_size() + 1)}


def _bench_dequant(device, tiny):
    n = 1 << 14 if tiny else 1 << 27
    q = torch.randint(-128, 128, (n,), device=device, dtype=torch.int8)
    return {"q": q, "scale": torch.tensor(4.0 / 127, device=device), "zp": torch.tensor(0, dtype=torch.int32, device=device),
            "bytes": n * (1 + 4)}


BENCHMARKS = [
    Benchmark(f"int8 W-only M={m} K=N={kn} vs fp16", "int8_weight_matmul", _bench_wmm(m, kn),
              lambda fn, d: fn(d["x"], d["w_q"], d["scale"], out=d["out"]),
              lambda d: torch.matmul(d["x"], d["w_t"], out=d["out"]))
    for kn in (4096, 8192) for m in (1, 4, 16)
] + [
    # The decode path the solution adds beside the tiled kernel (no padded rows, many programs).
    Benchmark(f"int8 decode GEMV M={m} K=N={kn} vs fp16", "int8_gemv", _bench_wmm(m, kn),
              lambda fn, d: fn(d["x"], d["w_q"], d["scale"], out=d["out"]),
              lambda d: torch.matmul(d["x"], d["w_t"], out=d["out"]))
    for kn in (4096, 8192) for m in (1, 4, 16)
] + [
    # The baselines are the same formulas in eager PyTorch, what a model without your code runs. (A
    # bare cast moves the same bytes but does none of the work: % of copy bandwidth is the ceiling.)
    Benchmark("quantize fp16 -> int8 vs eager PyTorch", "quantize", _bench_quant,
              lambda fn, d: fn(d["x"], d["scale"], d["zp"]),
              lambda d: (torch.round(d["x"].float() / d["scale"]) + d["zp"]).clamp(-128, 127).to(torch.int8)),
    Benchmark("dequantize int8 -> fp32 vs eager PyTorch", "dequantize", _bench_dequant,
              lambda fn, d: fn(d["q"], d["scale"], d["zp"]), lambda d: (d["q"].float() - d["zp"]) * d["scale"]),
]
