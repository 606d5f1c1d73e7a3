"""Checks of lab 08, quantization: INT8 and FP8, PTQ and QAT, a weight-only int8 Triton matmul.

Beyond plain output equality (curriculum, lab 08 "C:"): zero-points rounded to nearest and stored as integers;
codes saturating at both edges of [qmin, qmax] (inputs sit at, just inside and beyond them); per-channel scales on
the right axis (square matrices, so a wrong axis cannot hide behind a shape error); storage really in int8 or fp8;
a straight-through estimator that passes the gradient inside the clipping range and zeroes it outside (as
``torch.fake_quantize_per_tensor_affine``); and a weight-only matmul kernel that reads the int8 weights itself: no
launch receives a float weight, no float copy of it is made in PyTorch (``gpulab.launches.record_allocations``),
next to the kernel rules of ``grader.kit.kernels``. Hidden cases: one per rule on every seed, ``"<rule>: details"``.
"""
from __future__ import annotations

import math

import torch

from gpulab.compare import _fmt_index, compare
from grader.exercise import Benchmark, Case, Exercise, changed_inputs
from grader.kit import kernels
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "08_quantization"
RUN = run_side(LAB)  # the learner side: grader/runs/08_quantization.py
TITLE = "Quantization: INT8, FP8, PTQ and QAT"

EPS = torch.finfo(torch.float32).eps  # smallest scale: an all-zero range still gets a usable scale
TIE = 1e-3                            # |v - (k + 0.5)| below this: either neighbour is a correct round
#        fmt: (dtype, largest finite value, mantissa bits, smallest normal exponent)
_EDGES = [-50.0, -1.0, -0.6, -0.4, 0.0, 0.3]  # code offsets below/at qmin (mirrored at qmax)


# --- integer codes: rounded to nearest, clamped; inputs whose codes are known ---------------------

def _signed(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _bshape(ndim: int, axis) -> list:
    """The shape that broadcasts a per-channel vector along ``axis`` (>= 0, or None) of an ``ndim``-d tensor."""
    return [-1 if d == axis else 1 for d in range(ndim)]


def _away_from_ties(v: torch.Tensor) -> torch.Tensor:
    """Move values within 0.02 of a half-integer to 0.1 from it, so fp32 and fp64 round alike."""
    frac = v - torch.floor(v)
    near = (frac - 0.5).abs() < 0.02
    return torch.where(near, torch.floor(v) + torch.where(frac < 0.5, 0.4, 0.6), v)


def _allowed(v: torch.Tensor, qmin: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds of the correct quantized values for unrounded codes ``v`` (float64): round to
    nearest, either neighbour near a tie (fp32 division may land on either side), then clamp."""
    r, fl = torch.round(v), torch.floor(v)
    tie = (v - fl - 0.5).abs() < TIE
    return torch.where(tie, fl, r).clamp(qmin, qmax), torch.where(tie, fl + 1, r).clamp(qmin, qmax)


def _check_codes(q: torch.Tensor, v: torch.Tensor, qmin: int, qmax: int, name: str,
                 v_name: str = "x / scale + zero_point") -> str | None:
    """``None`` if the integer codes ``q`` are ``v`` rounded to nearest and clamped, else a report."""
    lo, hi = _allowed(v, qmin, qmax)
    qd = q.to(torch.float64)
    bad = (qd < lo) | (qd > hi)
    if not bool(bad.any()):
        return None
    lines = [f"{name}: {int(bad.sum())} of {q.numel()} values are wrong (expected clamp(round({v_name}), {qmin}, "
             f"{qmax}))."]
    for i in bad.flatten().nonzero().flatten()[:4].tolist():
        lines.append(f"  at {_fmt_index(i, tuple(q.shape))}: got {int(qd.flatten()[i])}, expected "
                     f"{int(lo.flatten()[i])} ({v_name} = {float(v.flatten()[i]):.4g})")
    above, below = v > qmax + 0.5 + TIE, v < qmin - 0.5 - TIE
    beyond = above | below
    if bool((bad & beyond).any()) and bool((bad <= beyond).all()):  # only values beyond the range are wrong
        wrapped = bool((bad & above & (qd <= 0)).any()) or bool((bad & below & (qd >= 0)).any())
        lines.append(f"  Values beyond the range must saturate at {qmin} / {qmax}"
                     + (": yours wrapped around, so the clamp is missing or too wide (128 does not fit in int8)"
                        if wrapped else "") + ". Clamp to [qmin, qmax] *before* converting to int8.")
    elif bool((bad & ((qd == qmin) | (qd == qmax) | (lo == qmin) | (hi == qmax))).all()):
        lines.append(f"  The errors sit at the range edges: clamp to exactly [qmin, qmax] = [{qmin}, {qmax}].")
    elif bool(((v - torch.floor(v))[bad] > 0.5).all()) and bool((qd[bad] == torch.floor(v)[bad]).all()):
        lines.append("  Every wrong value was rounded down: use torch.round (round to nearest), not floor "
                     "or a cast to int (which truncates).")
    return "\n".join(lines)


def _quantized_input(gen, shape, axis, symmetric: bool, qmin: int, qmax: int, lo: float, width: float):
    """(x in float64, scale, zero_point): random scales in [lo, lo + width), int32 zero-points (0 if symmetric,
    else in [qmin // 2, qmax // 2]), per tensor (``axis`` None: 0-d) or per channel along ``axis``; the codes
    x / scale + zero_point lie away from rounding ties, each row's first ones at, just inside and beyond both edges."""
    n = 1 if axis is None else shape[axis]
    scale = torch.rand(n, generator=gen) * width + lo
    zp = torch.zeros(n, dtype=torch.int32) if symmetric else \
        torch.randint(qmin // 2, qmax // 2 + 1, (n,), generator=gen, dtype=torch.int32)
    if axis is None:
        scale, zp = scale[0], zp[0]
    v = _away_from_ties(qmin - 6 + torch.rand(*shape, generator=gen) * (qmax - qmin + 12))
    edges = [qmin + e for e in _EDGES] + [qmax - e for e in _EDGES] + [qmax + 1e4 / 3]
    rows = v.view(-1, shape[-1]) if len(shape) > 1 else v.view(1, -1)
    k = min(rows.shape[1], len(edges))
    for r in range(rows.shape[0]):
        start = (r * 3) % max(1, len(edges) - k + 1)
        rows[r, :k] = torch.tensor(edges[start:start + k])[torch.randperm(k, generator=gen)]
    bs = _bshape(len(shape), axis)
    return (v - zp.reshape(bs).double()) * scale.reshape(bs).double(), scale, zp


def _row_scaled(gen, n: int, k: int, lo: float, hi: float) -> torch.Tensor:
    """A random (n, k) weight whose rows' magnitudes are spread from 10**lo to 10**hi, in random order."""
    return randn(gen, n, k) * torch.logspace(lo, hi, n)[torch.randperm(n, generator=gen)][:, None]


def _any_shape(gen, lo: int, hi: int) -> list:
    """1 to 3 dimensions, each of a size in [lo, hi]."""
    return [randint(gen, lo, hi) for _ in range(randint(gen, 1, 3))]


# --- exercise 1: ranges and (scale, zero_point) ----------------------------------------------------

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
    lo = torch.clamp(torch.as_tensor(lo).double(), max=0.0)  # the range must contain 0 (padding, ReLU zeros)
    hi = torch.clamp(torch.as_tensor(hi).double(), min=0.0)
    if symmetric:
        scale = torch.maximum(-lo, hi) / qmax
        return scale.clamp(min=EPS), torch.zeros_like(scale)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=EPS)
    return scale, qmin - lo / scale


def _qparams_cases(gen, public):
    cases = []
    for name, x, axis, symmetric, qmin, qmax in _qparams_public(gen) if public else _qparams_hidden(gen):
        if not public:  # after the rule, what the seed drew
            axis = None if axis is None else axis % x.ndim
            name = f"{name}: shape {tuple(x.shape)} axis={axis}"
        # qparams gets a range of its own, of x's kind (signs, zero channels kept), not minmax_range's answer:
        # the widest of two rescaled copies of x (so a one-element channel's lo and hi differ too)
        (lo1, hi1), (lo2, hi2) = (ref_range(x * (0.5 + 1.5 * torch.rand(x.shape, generator=gen)), axis)
                                  for _ in range(2))
        lo, hi = torch.minimum(lo1, lo2), torch.maximum(hi1, hi2)
        cases.append(Case(f"{name} (symmetric={symmetric}, qmin={qmin}, qmax={qmax})", dict(
            x=x, axis=axis, symmetric=symmetric, qmin=qmin, qmax=qmax, lo=lo.float(), hi=hi.float())))
    return cases


def _qparams_public(gen) -> list:
    rows, zero_row = _row_scaled(gen, 48, 48, -2, 0.5), randn(gen, 6, 20)
    zero_row[2] = 0.0
    return [  # (name, x, axis, symmetric, qmin, qmax)
        ("per-tensor symmetric int8", randn(gen, 64, 32, scale=1.7), None, True, -128, 127),
        ("per-tensor asymmetric int8, mixed signs", randn(gen, 64, 32, scale=2) + 1.3, None, False, -128, 127),
        ("per-tensor asymmetric, all positive (ReLU output): the range must include 0",
         torch.rand(50, 20, generator=gen) * 3 + 0.5, None, False, -128, 127),
        ("per-channel axis=0 symmetric on a square (48, 48) weight", rows, 0, True, -128, 127),
        ("per-channel axis=0 asymmetric on the same square weight", rows + 0.01, 0, False, -128, 127),
        ("per-channel axis=1 asymmetric on (16, 40) activations", randn(gen, 16, 40, scale=3) - 1, 1, False, -128,
         127),
        ("per-channel axis=1 of a 3-D (4, 6, 10) tensor", randn(gen, 4, 6, 10), 1, False, -128, 127),
        ("per-channel 4-bit symmetric [-8, 7]", randn(gen, 12, 30), 0, True, -8, 7),
        ("per-channel with an all-zero channel (scale must stay > 0)", zero_row, 0, False, -128, 127),
        ("uint8-style range [0, 255], asymmetric", randn(gen, 30, 30) - 0.4, None, False, 0, 255),
        ("per-channel on a 1-D tensor (37,): every element is its own channel", randn(gen, 37, scale=2), 0, False,
         -128, 127)]


def _qparams_hidden(gen) -> list:
    """One case per rule, every seed; the seed draws the sizes, magnitudes and bit widths."""
    def data(*shape, shift=True):  # of 1 to 3 random dimensions if no shape is given
        x = randn(gen, *(shape or _any_shape(gen, 2, 24))) * uniform(gen, 0.1, 5.1)
        return x + float(torch.randn(1, generator=gen)) if shift else x

    def size(lo=2, hi=24):
        return randint(gen, lo, hi)

    def mixed_signs():
        x = data(shift=False)
        x.view(-1)[:2] = torch.tensor([-1.0, 1.5])[:x.numel()]
        return x

    n = size(3, 24)
    zero = data(size(3, 12), size())
    zero[randint(gen, 0, zero.shape[0] - 1)] = 0.0
    bits, ubits = choice(gen, [4, 6, 3]), choice(gen, [8, 4])
    return [  # (rule, x, axis, symmetric, qmin, qmax)
        ("per-tensor symmetric", data(), None, True, -128, 127),
        ("per-tensor asymmetric, mixed signs", mixed_signs(), None, False, -128, 127),
        ("per-tensor asymmetric, all positive",
         torch.rand(*_any_shape(gen, 2, 24), generator=gen) * 3 + 0.5, None, False, -128, 127),
        ("per-channel axis=0 on a square matrix", data(n, n), 0, True, -128, 127),
        ("per-channel on the last axis", data(*_any_shape(gen, 2, 24)[:2], size(25, 40)), -1, False, -128, 127),
        ("per-channel on the middle axis of a 3-D tensor", data(size(), size(), size()), 1, False, -128, 127),
        ("per-channel on a 1-D tensor (every element is its own channel)", data(size(3, 40)), 0, False, -128, 127),
        ("per-channel with an all-zero channel", zero, 0, False, -128, 127),
        ("unsigned range [0, 2^bits - 1], asymmetric", data(), None, False, 0, (1 << ubits) - 1),
        ("low-bit symmetric per-channel", data(size(), size()), 0, True, *_signed(bits))]


def _qparams_judge(case, obs):
    c = case.inputs
    lo, hi = ref_range(c["x"], c["axis"])
    scale, v = ref_qparams(c["lo"], c["hi"], c["symmetric"], c["qmin"], c["qmax"])
    per = "one value per index along axis=%s: reduce over every *other* dimension" % c["axis"] \
        if c["axis"] is not None else "0-d tensors for a per-tensor range"
    formula = ("symmetric: scale = max(|lo|, |hi|) / qmax" if c["symmetric"] else
               "asymmetric: scale = (hi - lo) / (qmax - qmin)")
    for name, got, want, hint in (
            ("minmax_range lo", obs["lo"], lo, f"\n  Expected {per}."),
            ("minmax_range hi", obs["hi"], hi, f"\n  Expected {per}."),
            ("qparams scale", obs["scale"], scale, f"\n  After widening [lo, hi] to include 0: {formula}; never below "
                                                   "torch.finfo(torch.float32).eps.")):
        got = torch.as_tensor(got)  # to 1e-5, in want's shape (one element for a scalar)
        if tuple(got.shape) != tuple(want.shape) and not (got.numel() == want.numel() == 1):
            return f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}." + hint
        if msg := compare(got.reshape(want.shape).double(), want, atol=0.0, rtol=1e-5, name=name, dtype=torch.float64):
            return msg + hint
    zp = torch.as_tensor(obs["zero_point"])
    if zp.dtype.is_floating_point or zp.dtype == torch.bool:
        frac = "" if bool((zp == torch.round(zp)).all()) else " (and it holds fractions: it was not rounded)"
        return (f"qparams zero_point has dtype {zp.dtype}{frac}: store it as integers (torch.int32). A zero-point "
                "is the integer code of the real value 0.0, so that 0 is represented exactly.")
    if zp.numel() != scale.numel():
        return f"qparams zero_point has shape {tuple(zp.shape)}, expected {tuple(scale.shape)}."
    if msg := _check_codes(zp.reshape(scale.shape), v, c["qmin"], c["qmax"], "qparams zero_point",
                           v_name="qmin - lo / scale"):
        return msg + "\n  zero_point = qmin - round(lo / scale), with lo widened to include 0, rounded to nearest."
    return changed_inputs(case, obs.get("inputs_after", {}))


QPARAMS = Exercise("quant_params", 3, ("minmax_range", "qparams"), _qparams_cases, RUN._qparams_run, _qparams_judge,
                   title="Ranges, scales and zero-points (symmetric, asymmetric, per-tensor, per-channel)",
                   hint="Widen [lo, hi] to include 0. Symmetric: scale = max(-lo, hi) / qmax, zero_point = 0. "
                        "Asymmetric: scale = (hi - lo) / (qmax - qmin), zero_point = qmin - round(lo / scale) as "
                        "int32. Clamp the scale to at least torch.finfo(torch.float32).eps. Per-channel: reduce over "
                        "every dim except `axis`.")


# --- exercise 2: quantize / dequantize -------------------------------------------------------------

_ROUNDTRIP_PUBLIC = [  # (name, shape, axis, symmetric, qmin, qmax, dtype)
    ("per-tensor symmetric int8", (40, 37), None, True, -128, 127, "float32"),
    ("per-tensor asymmetric int8 with values at, inside and beyond both edges", (200,), None, False, -128, 127,
     "float32"),
    ("per-channel axis=0 on a square (32, 32) weight", (32, 32), 0, False, -128, 127, "float32"),
    ("per-channel axis=1 on (20, 33)", (20, 33), 1, True, -128, 127, "float32"),
    ("per-channel axis=2 of a 3-D (3, 4, 25)", (3, 4, 25), 2, False, -128, 127, "float32"),
    ("4-bit [-8, 7] per-tensor", (64, 16), None, False, -8, 7, "float32"),
    ("restricted int8 [-127, 127] per-tensor", (50, 13), None, True, -127, 127, "float32"),
    ("float16 input, per-tensor", (30, 40), None, False, -128, 127, "float16"),
    ("per-channel on a 1-D tensor: every element is its own channel", (37,), 0, False, -128, 127, "float32"),
    ("per-channel axis=0 of a 3-D cube (7, 7, 7): a wrong axis keeps the shape", (7, 7, 7), 0, True, -128, 127,
     "float32")]


def _roundtrip_cases(gen, public):
    cases = []
    for name, shape, axis, symmetric, qmin, qmax, dtype in _ROUNDTRIP_PUBLIC if public else _roundtrip_hidden(gen):
        x, scale, zp = _quantized_input(gen, shape, axis, symmetric, qmin, qmax, 0.002, 0.1)
        q = torch.randint(qmin, qmax + 1, shape, generator=gen, dtype=torch.int8)
        cases.append(Case(f"{name}: shape {shape}, axis={axis}, [{qmin}, {qmax}], {dtype}", dict(
            x=x.to(getattr(torch, dtype)), scale=scale.float(), zero_point=zp, axis=axis, qmin=qmin, qmax=qmax, q=q)))
    return cases


def _roundtrip_hidden(gen) -> list:
    """One case per rule, every seed, with random sizes (the rule is the name before ':')."""
    def shape(ndim=None):
        return tuple(_any_shape(gen, 13, 40)) if ndim is None else tuple(randint(gen, 13, 40) for _ in range(ndim))

    n, bits = randint(gen, 13, 40), choice(gen, [4, 5])
    specs = [  # (rule, shape, axis, symmetric, qmin, qmax, dtype)
        ("per-tensor symmetric int8", shape(), None, True, -128, 127, "float32"),
        ("per-tensor asymmetric int8", shape(), None, False, -128, 127, "float32"),
        ("per-channel axis=0 on a square matrix", (n, n), 0, False, -128, 127, "float32"),
        ("per-channel on the last axis", shape()[:2] + shape(1), -1, True, -128, 127, "float32"),
        ("per-channel axis=0 of a 3-D tensor", shape(3), 0, False, -128, 127, "float32"),
        ("per-channel on the middle axis of a 3-D tensor", shape(3), 1, True, -128, 127, "float32"),
        ("per-channel on a 1-D tensor", shape(1), 0, False, -128, 127, "float32"),
        ("low-bit range", shape(), choice(gen, [None, 0]), False, *_signed(bits), "float32"),
        ("restricted symmetric range [-127, 127]", shape(), None, True, -127, 127, "float32"),
        ("float16 input", shape(), None, False, -128, 127, "float16")]
    return [(rule, shape, None if axis is None else axis % len(shape), *rest) for rule, shape, axis, *rest in specs]


def _roundtrip_judge(case, obs):
    c, q = case.inputs, obs["q"]
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
    if msg := _check_codes(q, c["x"].double() / scale + zp, c["qmin"], c["qmax"], "quantize"):
        if c["axis"] is not None:
            msg += (f"\n  Per-channel: scale[i] and zero_point[i] apply to index i along axis={c['axis']}; "
                    f"reshape them to {tuple(bs)} to broadcast.")
        return msg
    if msg := compare(obs["dq"], (c["q"].double() - zp) * scale, dtype=torch.float32, name="dequantize"):
        if isinstance(obs["dq"], torch.Tensor) and obs["dq"].dtype != torch.float32:
            msg += "\n  dequantize returns float32: (q.float() - zero_point) * scale."
        return msg
    return changed_inputs(case, obs["inputs_after"])


ROUNDTRIP = Exercise("quant_roundtrip", 3, ("quantize", "dequantize"), _roundtrip_cases, RUN._roundtrip_run,
                     _roundtrip_judge, title="quantize / dequantize",
                     hint="q = clamp(round(x / scale) + zero_point, qmin, qmax).to(torch.int8), computed in float32; "
                          "per-channel: reshape scale and zero_point to broadcast along `axis`. dequantize: "
                          "(q.float() - zero_point) * scale.")


# --- exercise 3: calibration --------------------------------------------------------------------------

def ref_calibrate(flat: torch.Tensor, method: str, percentile: float) -> tuple[float, float]:
    flat = flat.double()
    if method == "minmax":
        return float(flat.min()), float(flat.max())
    lo, hi = torch.quantile(flat, torch.tensor([1 - percentile / 100, percentile / 100], dtype=torch.float64))
    return float(lo), float(hi)


def _calib_cases(gen, public):
    if public:  # (name, batch sizes, method, percentile, kind of data)
        specs = [("min-max over 4 batches, an outlier in batch 1", [2048] * 4, "minmax", 99.9, "outlier"),
                 ("percentile 99.9 over the same batches", [2048] * 4, "percentile", 99.9, "outlier"),
                 ("percentile 99 over batches of different sizes", [4000, 640, 1280], "percentile", 99.0, "heavy"),
                 ("min-max of ReLU activations", [1000, 3000], "minmax", 99.9, "relu"),
                 ("percentile 99.99 of ReLU activations", [1000, 3000, 500], "percentile", 99.99, "relu"),
                 ("percentile 100 equals min-max", [700, 900], "percentile", 100.0, "outlier"),
                 ("a single batch", [5000], "percentile", 99.5, "heavy")]
    else:  # one case per rule, every seed (the rule is the name before ':'); random batch counts and sizes
        def batches(lo, hi):
            return [randint(gen, 200, 3000) for _ in range(randint(gen, lo, hi))]
        levels = [99.0, 99.9, 99.99, 95.0]
        specs = [("min-max, an outlier in an early batch", batches(3, 5), "minmax", 99.9, "outlier"),
                 ("percentile, several batches of different sizes", batches(2, 5), "percentile", choice(gen, levels),
                  "heavy"),
                 ("percentile of a single batch", batches(1, 1), "percentile", choice(gen, levels), "heavy"),
                 ("percentile 100", batches(2, 4), "percentile", 100.0, "outlier"),
                 ("min-max of ReLU activations", batches(1, 3), "minmax", 99.9, "relu"),
                 ("percentile of ReLU activations", batches(2, 4), "percentile", choice(gen, levels), "relu")]
    cases = []
    for name, sizes, method, pct, kind in specs:
        n = sum(sizes)
        if kind == "relu":
            flat = torch.relu(randn(gen, n, scale=2))
        elif kind == "heavy":  # Student-t-like tails
            flat = randn(gen, n) / (torch.rand(n, generator=gen) * 0.9 + 0.1)
        else:
            flat = randn(gen, n)
            if len(sizes) > 1:
                flat[sizes[0] + randint(gen, 0, sizes[1] - 1)] = 25.0  # in batch 1, not the last
                flat[randint(gen, 0, sizes[0] - 1)] = -18.0
        cases.append(Case(f"{name}: {len(sizes)} batch(es) of {sizes} values, method={method!r}, percentile={pct}",
                          dict(flat=flat, sizes=sizes, method=method, percentile=pct)))
    return cases


def _calib_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    lo, hi = ref_calibrate(c["flat"], c["method"], c["percentile"])
    for name, got, want in (("lo", obs["lo"], lo), ("hi", obs["hi"], hi)):
        if not math.isfinite(got) or abs(got - want) > 1e-4 * max(hi - lo, 1e-6):
            extra = ("the minimum and maximum over *all* batches (a running min/max, as an observer keeps)"
                     if c["method"] == "minmax" else
                     f"the {100 - c['percentile']:g}-th and {c['percentile']:g}-th percentiles of all batches' values "
                     "together (torch.quantile on the concatenation, linear interpolation), not an average of "
                     "per-batch percentiles")
            return f"calibrate: {name} = {got:.6g}, expected {want:.6g}: the range is {extra}."
    return None


CALIBRATE = Exercise("quant_calibrate", 2, ("calibrate",), _calib_cases, RUN._calib_run, _calib_judge,
                     title="Calibration: min-max and percentile",
                     hint="Concatenate every batch (flattened). min-max: (min, max). percentile p: torch.quantile of "
                          "the concatenation at (1 - p/100) and p/100.")


# --- exercise 4: PTQ, a weight-only quantized linear layer ---------------------------------------------

def _linear_inputs(gen, out_f, in_f, bits, per_channel, bias, rows, zero_row=False) -> dict:
    """A float linear layer's weight (codes away from rounding ties, row norms over 30x; one row of
    zeros if ``zero_row``) and bias (or None), and ``rows`` input rows ``x``."""
    w = _row_scaled(gen, out_f, in_f, -1.5, 0)
    if zero_row:
        w[out_f // 2] = 0.0
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax()
    s = (amax / _signed(bits)[1]).clamp(min=EPS)
    return dict(weight=(_away_from_ties(w.double() / s) * s).float(),
                bias=randn(gen, out_f, scale=0.1) if bias else None, bits=bits, x=randn(gen, rows, in_f))


def _ptq_cases(gen, public):
    specs = [("", 32, 32, 8, True, True, False), ("", 24, 40, 8, False, True, False),
             ("", 33, 17, 4, True, True, False), ("", 48, 48, 8, True, False, False),
             ("", 16, 20, 8, True, True, True), ("", 20, 20, 3, False, True, False)]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        o = [randint(gen, 4, 48) for _ in range(5)]
        other = [randint(gen, 4, 48) for _ in range(5)]
        other = [k + 1 if k == n else k for k, n in zip(other, o)]  # surely not square
        specs = [("per-channel int8 on a square weight: ", o[0], o[0], 8, True, True, False),
                 ("per-tensor 4-bit: ", o[1], other[1], 4, False, True, False),
                 ("per-channel 6-bit, no bias: ", o[2], other[2], 6, True, False, False),
                 ("per-channel with an all-zero row: ", o[3], other[3], 8, True, True, True),
                 ("per-channel 4-bit on a square weight: ", o[4], o[4], 4, True, True, False)]
    return [Case(f"{rule}Linear({in_f}, {out_f}, bias={bias}), bits={bits}, per_channel={per_channel}"
                 + (", one all-zero row" if zero_row else ""),
                 dict(_linear_inputs(gen, out_f, in_f, bits, per_channel, bias, 9, zero_row), per_channel=per_channel))
            for rule, out_f, in_f, bits, per_channel, bias, zero_row in specs]


def _ptq_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c, w = case.inputs, case.inputs["weight"].double()
    out_f, in_f = w.shape
    qmax = _signed(c["bits"])[1]
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
    if msg := compare(scale.double().flatten(), want, rtol=1e-5, atol=0, dtype=torch.float64, name="QuantLinear.scale"):
        return msg + (f"\n  Symmetric quantization of the weight: scale = max|W| / qmax with qmax = {qmax} for "
                      f"{c['bits']} bits.")
    if msg := _check_codes(qw, w / want.reshape(-1, 1) if c["per_channel"] else w / want, -qmax - 1, qmax,
                           "QuantLinear.qweight"):
        return msg
    if c["bias"] is not None and compare(obs["bias"], c["bias"], name="QuantLinear.bias", dtype=torch.float32):
        return "QuantLinear.bias must be the float layer's bias, kept in float32."
    want_y = c["x"].double() @ (qw.double() * scale.double().reshape(-1, 1)).T + (
        c["bias"].double() if c["bias"] is not None else 0)
    if msg := compare(obs["y"], want_y, atol=1e-4, rtol=1e-4, dtype=torch.float32, name="QuantLinear forward"):
        return msg + "\n  forward(x) = x @ (qweight * scale[:, None]).T + bias, in float32."
    return changed_inputs(case, obs["inputs_after"])


PTQ = Exercise("ptq_linear", 3, ("QuantLinear",), _ptq_cases, RUN._ptq_run, _ptq_judge,
               title="Post-training quantization: a weight-only int8 linear layer", hint="qmax = 2**(bits-1) - 1; "
               "per-channel scale = W.abs().amax(dim=1) / qmax (one per output row); store qweight = "
               "round(W / scale[:, None]).clamp(-qmax-1, qmax).to(torch.int8) as a buffer.")


# --- exercise 5: fake quantization with a straight-through estimator ----------------------------------

def _fq_cases(gen, public):
    if public:  # (name, shape, per_row, qmin, qmax, symmetric)
        specs = [("per-tensor int8 symmetric, values on both sides of the clip range", (64, 20), False, -128, 127,
                  True),
                 ("per-tensor 4-bit asymmetric [-8, 7]", (50, 11), False, -8, 7, False),
                 ("per-row scales (shape (C, 1)), 3-bit [-4, 3]", (16, 33), True, -4, 3, True),
                 ("per-row scales, int8 asymmetric", (12, 40), True, -128, 127, False)]
    else:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        specs = [(rule, (randint(gen, 4, 40), randint(gen, 4, 40)), per_row, *_signed(bits), symmetric)
                 for rule, bits, per_row, symmetric in (("per-tensor symmetric int8", 8, False, True),
                                                        ("per-row symmetric 4-bit", 4, True, True),
                                                        ("per-tensor asymmetric 3-bit", 3, False, False),
                                                        ("per-row asymmetric 2-bit", 2, True, False))]
    cases = []
    for name, shape, per_row, qmin, qmax, symmetric in specs:
        x, scale, zp = _quantized_input(gen, shape, 0 if per_row else None, symmetric, qmin, qmax, 0.01, 0.2)
        if per_row:  # scales of shape (C, 1)
            scale, zp = scale.view(-1, 1), zp.view(-1, 1)
        cases.append(Case(f"{name}: x {shape}, [{qmin}, {qmax}]", dict(
            x=x.float(), scale=scale.float(), zero_point=zp, qmin=qmin, qmax=qmax, grad=randn(gen, *shape))))
    return cases


def _fq_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c, y = case.inputs, obs["y"]
    scale, zp, qmin, qmax = c["scale"].double(), c["zero_point"].double(), c["qmin"], c["qmax"]
    v = c["x"].double() / scale + zp  # unrounded codes
    lo, hi = _allowed(v, qmin, qmax)
    if y.dtype != torch.float32 or tuple(y.shape) != tuple(c["x"].shape):
        return f"fake_quant returned {y.dtype} {tuple(y.shape)}, expected float32 {tuple(c['x'].shape)}."
    code = y.double() / scale + zp  # the learner's integer codes, recovered
    bad = (code < lo - 1e-3) | (code > hi + 1e-3)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        return (f"fake_quant forward: {int(bad.sum())} of {y.numel()} values differ from "
                f"(clamp(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale; at "
                f"{_fmt_index(i, tuple(y.shape))}: got {float(y.flatten()[i]):.6g}, expected "
                f"{float(((lo - zp) * scale).flatten()[i]):.6g}.")
    if not obs["requires_grad"] or obs["grad"] is None:
        return ("no gradient reached x: fake_quant's output must be differentiable. Build it with a "
                "torch.autograd.Function (FakeQuantSTE.apply) whose backward returns a gradient for x.")
    g, grad = c["grad"].double(), obs["grad"].double()
    inside = (v >= qmin) & (v <= qmax)                                # round(v) surely in [qmin, qmax]
    outside = (v < qmin - 0.5 - TIE) | (v > qmax + 0.5 + TIE)         # round(v) surely outside
    band = ~inside & ~outside  # within half a step outside: conventions differ (rounded or unrounded code)
    close, zero = (grad - g).abs() <= 1e-6 * (1 + g.abs()), grad == 0
    n_in = int(inside.sum())
    if n_in and int((zero & inside).sum()) == n_in:
        return (f"the gradient is zero at all {n_in} elements inside the clipping range: torch.round has "
                "derivative 0 almost everywhere, so autograd through round() stops training. A straight-through "
                "estimator treats round as the identity in backward: grad_x = grad_output inside the range.")
    if bool((wrong_in := inside & ~close).any()):
        i = int(wrong_in.flatten().nonzero()[0])
        return (f"STE gradient wrong at {int(wrong_in.sum())} of {n_in} elements inside the clipping range; at "
                f"{_fmt_index(i, tuple(v.shape))}: got {float(grad.flatten()[i]):.6g}, expected grad_output "
                f"{float(g.flatten()[i]):.6g} (the STE passes it through unchanged).")
    if bool((leak := outside & ~zero).any()):
        return (f"the gradient is nonzero at {int(leak.sum())} of {int(outside.sum())} elements outside the clipping "
                f"range [{qmin}, {qmax}] (in integer codes): a clipped STE zeroes them, because a clamped output "
                "does not move when x moves. Mask grad_output with qmin <= round(x / scale) + zero_point <= qmax.")
    if bool((band & ~(close | zero)).any()):
        return ("within half a step outside the clip range the gradient must be grad_output or 0 "
                "(mask on the rounded or the unrounded code), nothing else.")
    return changed_inputs(case, obs["inputs_after"])


FAKE_QUANT = Exercise("fake_quant_ste", 3, ("fake_quant",), _fq_cases, RUN._fq_run, _fq_judge,
                      title="Fake quantization with a clipped straight-through estimator",
                      hint="forward: (clamp(round(x/s)+zp, qmin, qmax) - zp) * s, and save the mask qmin <= "
                           "round(x/s)+zp <= qmax; backward: grad_output * mask for x, None for the other arguments.")


# --- exercise 6: QAT, a linear layer that trains through fake-quantized weights ---------------------

def _qat_cases(gen, public):
    specs = [("", 24, 16, 4, True), ("", 16, 16, 3, False), ("", 33, 7, 8, True)]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        specs = [(f"{b}-bit {'with' if b % 2 else 'without'} bias: ", randint(gen, 3, 40), randint(gen, 3, 40),
                  b, bool(b % 2)) for b in (3, 4, 5)]
    cases = []
    for rule, in_f, out_f, bits, bias in specs:
        inputs = _linear_inputs(gen, out_f, in_f, bits, True, bias, 10)
        cases.append(Case(f"{rule}QATLinear from Linear({in_f}, {out_f}, bias={bias}), bits={bits}",
                          dict(inputs, grad=randn(gen, 10, out_f))))
    return cases


def _qat_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    w, x, g = c["weight"].double(), c["x"].double(), c["grad"].double()
    qmax = _signed(c["bits"])[1]
    s = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=EPS)
    wq = torch.round(w / s).clamp(-qmax - 1, qmax) * s  # fake_quant(W), per output row
    if msg := compare(obs["weight"], c["weight"], name="QATLinear.weight (copied from the float layer)"):
        return msg
    y = x @ wq.T + (c["bias"].double() if c["bias"] is not None else 0)
    if msg := compare(obs["y"], y, atol=1e-4, rtol=1e-4, dtype=torch.float32, name="QATLinear forward"):
        return msg + (f"\n  forward = x @ fake_quant(W).T + b with per-output-channel symmetric scales "
                      f"max|W[i, :]| / {qmax}, computed from the *detached* weight.")
    if obs["grad_w"] is None or float(obs["grad_w"].abs().max()) == 0.0:
        return ("QATLinear.weight received no gradient: the fake-quantized weight must stay connected to the "
                "float weight through the straight-through estimator (use your fake_quant, do not detach it).")
    grads = [("grad of the input x", obs["grad_x"], g @ wq,
              "\n  x's gradient flows through the *fake-quantized* weight: grad_x = grad_y @ fake_quant(W)."),
             ("grad of weight", obs["grad_w"], g.T @ x,
              "\n  with the STE, grad_W = grad_y.T @ x (every weight is inside its min-max range); the scale is an "
              "observer's statistic, computed from W.detach(), so no gradient flows through it.")]
    if c["bias"] is not None:
        grads.append(("grad of bias", obs["grad_b"], g.sum(0), ""))
    for name, got, want, hint in grads:
        if msg := compare(got, want, atol=1e-4, rtol=1e-4, dtype=torch.float32, name=f"QATLinear {name}"):
            return msg + hint
    return None


QAT = Exercise("qat_linear", 2, ("QATLinear",), _qat_cases, RUN._qat_run, _qat_judge,
               title="QAT: a linear layer with fake-quantized weights", hint="forward: s = W.detach().abs().amax("
               "dim=1, keepdim=True) / qmax (clamped to eps); F.linear(x, fake_quant(W, s, 0, -qmax-1, qmax), bias).")


# --- exercise 7: FP8 with per-tensor scaling -------------------------------------------------------------

def _fp8_cases(gen, public):
    if public:  # (fmt, name, shape, magnitude, dtype)
        specs = [("e4m3", "Gaussian", (64, 64), 1.0, "float32"), ("e5m2", "Gaussian x 1e3", (40, 50), 1e3, "float32"),
                 ("e4m3", "small values (1e-3): unscaled, most would underflow", (32, 32), 1e-3, "float32"),
                 ("e4m3", "outliers", (30, 30), 1.0, "float32"), ("e5m2", "gradients 1e-6", (16, 64), 1e-6, "float16"),
                 ("e4m3", "all zeros", (8, 8), 0.0, "float32")]
        specs = [(fmt, f"{fmt}, {name}", *rest) for fmt, name, *rest in specs]
    else:  # one case per rule, every seed (the rule is the name before ':'); random sizes and magnitudes
        fmt = choice(gen, ["e4m3", "e5m2"])
        rules = [("e4m3", "small values", 10 ** uniform(gen, -6, -3), "float32"),
                 ("e5m2", "gradient-sized values", 10 ** uniform(gen, -9, -6),
                  "float32"),
                 ("e4m3", "values beyond 448", 10 ** uniform(gen, 2.5, 4), "float32"),
                 ("e5m2", "large values", 10 ** uniform(gen, 3, 5), "float32"),
                 (fmt, "float16 input", 10 ** uniform(gen, -2, 2), "float16"),
                 (fmt, "all zeros", 0.0, "float32")]
        specs = [(f, f"{rule}: {f}", (randint(gen, 1, 64), randint(gen, 1, 64)), m, dt) for f, rule, m, dt in rules]
    cases = []
    for fmt, name, shape, mag, dtype in specs:
        x = randn(gen, *shape, scale=mag)
        if name.endswith("outliers"):
            x.view(-1)[:3] = torch.tensor([300.0, -150.0, 90.0])
        fdt, fmax = RUN.FP8[fmt][:2]
        scale_in = torch.tensor(2.0 ** randint(gen, -10, 4))
        x8 = randn(gen, *shape, scale=40).clamp(-fmax, fmax).to(fdt)
        cases.append(Case(f"{name}, shape {shape} {dtype}", dict(
            x=x.to(getattr(torch, dtype)), fmt=fmt, x8_bits=x8.view(torch.uint8), scale_in=scale_in)))
    return cases


def _fp8_judge(case, obs):
    if "bad" in obs:
        return obs["bad"] + "."
    c = case.inputs
    fdt, fmax, mbits, emin = RUN.FP8[c["fmt"]]
    if obs["dtype"] != str(fdt):
        return (f"fp8_quantize returned {obs['dtype']}: the values must be stored as {fdt} (1 byte each) for "
                f"fmt={c['fmt']!r}; rounding float32 values to the fp8 grid but keeping float32 saves nothing.")
    x, scale = c["x"].double(), obs["scale"]
    amax = float(x.abs().max())
    if amax == 0:
        if not (math.isfinite(scale) and scale > 0):
            return f"fp8_quantize of an all-zero tensor must still return a positive, finite scale (got {scale})."
    elif not math.isclose(scale, amax / fmax, rel_tol=1e-5):
        return (f"fp8_quantize scale = {scale:.6g}, expected amax / {fmax:g} = {amax / fmax:.6g}: per-tensor scaling "
                f"maps the largest |x| to the largest finite {c['fmt']} value, so x / scale uses the whole range.")
    vals = obs["values"].double()
    if tuple(vals.shape) != tuple(x.shape):
        return f"fp8_quantize returned shape {tuple(vals.shape)}, expected {tuple(x.shape)}."
    # Half a unit in the last place of the format, relative (normal values) or absolute (subnormal ones).
    bound = torch.maximum(x.abs() * 2.0 ** -(mbits + 1), torch.full_like(x, scale * 2.0 ** (emin - mbits - 1)))
    bad = ~((vals * scale - x).abs() <= bound * 1.001 + 1e-300)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        return (f"fp8_quantize: {int(bad.sum())} of {x.numel()} values are further from x than {c['fmt']} rounding "
                f"allows; at {_fmt_index(i, tuple(x.shape))}: x = {float(x.flatten()[i]):.6g}, x_fp8 * scale = "
                f"{float((vals * scale).flatten()[i]):.6g}. Store (x / scale).to({fdt}).")
    if msg := compare(obs["deq"], c["x8_bits"].view(fdt).double() * float(c["scale_in"]), dtype=torch.float32,
                      name="fp8_dequantize"):
        return msg + "\n  fp8_dequantize returns x_fp8.float() * scale (float32)."
    return changed_inputs(case, obs["inputs_after"])


# No `requires`: the run calls fp8_quantize on the case's CPU tensors on every device (PyTorch casts to fp8 in
# software), so it grades the same on a T4; only fp8 *matmuls* need fp8 tensor cores (sm_89+), and none is graded.
# The int8 kernel needs none either: on sm_75 tl.dot runs as FMAs, correct and within the same tolerance.
FP8_QUANT = Exercise("fp8_quant", 2, ("fp8_quantize", "fp8_dequantize"), _fp8_cases, RUN._fp8_run,
                     _fp8_judge, title="FP8 e4m3 / e5m2 with per-tensor scaling",
                     hint="scale = amax / 448 (e4m3) or / 57344 (e5m2), 1.0 if amax is 0; x_fp8 = (x.float() / scale)"
                          ".clamp(-fmax, fmax).to(torch.float8_e4m3fn or torch.float8_e5m2).")


# --- exercise 8: the weight-only int8 matmul kernel -----------------------------------------------

_CANCEL = 256  # columns of x and w at each end of K whose products cancel (see _cancelling_inputs)


def _cancelling_inputs(gen, x, w):
    """Make the first and last ``_CANCEL`` columns' products cancel, in place: the first columns give every output
    a large positive partial sum, the last take it back, so the result is the middle columns' small sum. Accumulated
    in float16, the large partial sum sits on a coarse grid, every middle tile added to it is rounded to that grid,
    and the error comes out 30 to 100 times the float32 accumulator's (measured in the interpreter, BLOCK_K 32 to
    256): only float32 accumulation passes."""
    m, k = x.shape
    big = _CANCEL
    w[:, :big] = w[:, :big].abs()
    w[:, k - big:] = w[:, :big]                                      # mirrored weights ...
    x[:, :big] = torch.rand(m, big, generator=gen) + 0.5
    x[:, big:k - big] *= 0.25
    x[:, k - big:] = -x[:, :big]                                     # ... times opposite activations


def _wmm_cases(gen, public):
    cancel = "partial sums that cancel: "
    specs = [("", 1, 64, 64, "float32"), ("", 5, 100, 72, "float32"), ("", 16, 96, 130, "float16"),
             ("", 33, 160, 192, "float32"), ("", 4, 128, 256, "float16"), (cancel, 8, 96, 2048, "float16")]
    if not public:  # one case per rule, every seed (the rule is the name before ':'), random sizes
        def nk():
            return randint(gen, 64, 200), randint(gen, 64, 200)
        specs = [("decode (M = 1): ", 1, *nk(), "float16"),
                 ("small M: ", randint(gen, 2, 16), *nk(), "float32"),
                 ("M above one block: ", randint(gen, 17, 40), *nk(), "float16"),
                 ("float32, M above one block: ", randint(gen, 17, 40), *nk(), "float32"),
                 (cancel, randint(gen, 1, 16), randint(gen, 64, 160), randint(gen, 1024, 2048), "float16")]
    cases = []
    for rule, m, n, k, dtype in specs:
        while not public and m * (n + k) * 4 > n * k:  # keep activations + output well below the weight's size
            n, k = n + 16, k + 16
        w = _row_scaled(gen, n, k, -2, -0.5)
        x = randn(gen, m, k)
        if rule == cancel:
            _cancelling_inputs(gen, x, w)
        scale = (w.abs().amax(dim=1) / 127).float()
        w_q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
        cases.append(Case(f"{rule}M={m} N={n} K={k} {dtype} activations", dict(
            x=x.to(getattr(torch, dtype)), w_q=w_q, w_scale=scale)))
    return cases


def _wmm_judge(case, obs):
    x, w_q, s = case.inputs["x"], case.inputs["w_q"], case.inputs["w_scale"]
    (M, K), N = x.shape, w_q.shape[0]
    if verdict := kernels.launch_verdict(obs, "int8_weight_matmul", "compute the product in your @triton.jit "
                                         "kernel, which loads the int8 weights and dequantizes them in registers"):
        return verdict
    nk = N * K
    floats = [(dt, n) for launch in obs["args"] for dt, n in launch if "float" in dt and n >= nk]
    if floats:
        return (f"a kernel received a floating-point tensor of {floats[0][1]} elements ({floats[0][0]}), as large as "
                f"the ({N}, {K}) weight: the weight was dequantized before the kernel. Pass the int8 weight itself and "
                "convert each tile inside the kernel (w.to(tl.float32) or to x's dtype), then apply the scales.")
    if obs["float_elements"] >= nk:
        n, op, shape = obs["biggest"]
        return (f"your wrapper created {obs['float_elements']} floating-point elements in PyTorch during the call "
                f"(the weight has {nk}; largest: {op} of shape {tuple(shape)}): the weight was dequantized in "
                "PyTorch. Weight-only quantization saves memory traffic only if the kernel reads int8 and dequantizes "
                "in registers; allocate nothing bigger than the output.")
    if not any(dt in ("torch.int8", "torch.uint8") and n == nk for launch in obs["args"] for dt, n in launch):
        return (f"no kernel launch received the int8 weight ({N} x {K} = {nk} one-byte elements): pass `w_q` to "
                "the kernel and load int8 values there.")
    w = w_q.double() * s.double()[:, None]  # (N, K) dequantized weight
    want = x.double() @ w.T
    loose = 1e-2 * (x.double().abs() @ w.abs().T) + 1e-6  # "right" for the ablated run: any careful PyTorch sum
    if verdict := (kernels.outside_verdict(obs, "int8_weight_matmul",
                                           lambda o: bool(((o["out"].double() - want).abs() <= loose).all()))
                   or kernels.bounds_verdict(obs) or kernels.return_verdict(obs, "int8_weight_matmul")):
        return verdict
    out = obs["out"]  # the (M, N) buffer of x's dtype the check passed
    # Rounding of the output (fp16: 2^-11 relative), plus the dot product's own error, which scales
    # with |x| @ |w|.T (not |out|, which may be ~0). For float32 activations on a GPU that is TF32
    # (tl.dot's default for fp32) rounding x to 10 mantissa bits: 1e-3. float16 activations times
    # int8 codes are exact products, so only the float32 accumulator rounds, far below 5e-5; a
    # float16 accumulator errs by 5e-4 to 2e-3 of |x| @ |w|.T on the cancelling case.
    dot_rtol = 5e-5 if x.dtype == torch.float16 else 1e-3
    bound = 2e-3 * want.abs() + dot_rtol * (x.double().abs() @ w.abs().T) + 1e-6
    bad = ~((out.double() - want).abs() <= bound)  # NaN (an element never written) is bad too
    if not bool(bad.any()):
        return kernels.final_verdict(case, obs)
    lines = [f"int8_weight_matmul: {int(bad.sum())} of {out.numel()} outputs differ for M={M} N={N} K={K} {x.dtype}."]
    n_nan = int(torch.isnan(out).sum())
    if n_nan:
        lines.append(f"  {n_nan} outputs are NaN: never written (the output was poisoned) or a NaN computed.")
    for i in bad.flatten().nonzero().flatten()[:4].tolist():
        lines.append(f"  at {_fmt_index(i, (M, N))}: got {float(out.flatten()[i]):.6g}, expected "
                     f"{float(want.flatten()[i]):.6g} (allowed error {float(bound.flatten()[i]):.2g})")
    lines.append("  out[m, n] = sum_k x[m, k] * w_q[n, k] * w_scale[n]: accumulate in float32 and apply the "
                 "per-output-channel scale once, to the accumulator.")
    return kernels.mismatch_verdict("\n".join(lines), obs)


WEIGHT_MATMUL = Exercise("int8_weight_matmul", 4, ("int8_weight_matmul",), _wmm_cases, RUN._wmm_run, _wmm_judge,
                         title="Weight-only int8 matmul in Triton (dequantize in the kernel)",
                         hint="Tile (BLOCK_M, BLOCK_N) outputs; per K step load an x tile and an int8 w tile (mask "
                              "both), acc = tl.dot(x, w.to(x.dtype), acc) in float32; after the loop multiply by the "
                              "scales of the tile's columns and store with a mask.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.gbps", "gpulab.bench.pct_of_peak", "gpulab.peaks.measured_peaks",
           "gpulab.spirals.MLP", "gpulab.spirals.accuracy", "gpulab.spirals.decision_grid",
           "gpulab.spirals.make_spirals", "gpulab.spirals.map_linears", "gpulab.spirals.train")
EXERCISES = [offering(ex, OFFERED) for ex in (QPARAMS, ROUNDTRIP, CALIBRATE, PTQ, FAKE_QUANT, QAT, FP8_QUANT,
                                          WEIGHT_MATMUL)]


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
        return {"x": x, "w_q": w_q, "scale": scale, "w_t": w_t, "out": torch.empty(m, n, device=device, dtype=dtype),
                "bytes": n * k + 4 * n + x.element_size() * (m * k + m * n), "flops": 2 * m * n * k}
    return make


def _bench_quant(device, tiny):
    n = 1 << 14 if tiny else 1 << 27
    x = torch.randn(n, device=device, dtype=torch.float32 if device == "cpu" else torch.float16)
    return {"x": x, "scale": torch.tensor(4.0 / 127, device=device),
            "zp": torch.tensor(0, dtype=torch.int32, device=device), "bytes": n * (x.element_size() + 1)}


def _bench_dequant(device, tiny):
    n = 1 << 14 if tiny else 1 << 27
    q = torch.randint(-128, 128, (n,), device=device, dtype=torch.int8)
    return {"q": q, "scale": torch.tensor(4.0 / 127, device=device),
            "zp": torch.tensor(0, dtype=torch.int32, device=device), "bytes": n * (1 + 4)}


BENCHMARKS = [
    # int8_gemv: the decode path the solution adds beside the tiled kernel (no padded rows, many programs).
    Benchmark(f"{label} M={m} K=N={kn} vs fp16", name, _bench_wmm(m, kn),
              lambda fn, d: fn(d["x"], d["w_q"], d["scale"], out=d["out"]),
              lambda d: torch.matmul(d["x"], d["w_t"], out=d["out"]))
    for name, label in (("int8_weight_matmul", "int8 W-only"), ("int8_gemv", "int8 decode GEMV"))
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
