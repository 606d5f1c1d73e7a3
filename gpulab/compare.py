"""Comparing tensors the way a kernel engineer does (lesson 02, used by every check).

(Named `compare`, not `check`: `gpulab.check` is the inline exercise check learners call.)

- Tolerances depend on the dtype: an fp16 kernel cannot match an fp64 reference to 1e-6.
- Outputs are *poisoned* (filled with NaN) before the kernel runs, and surrounded by a guard
  region, so an element the kernel forgot to write, or one it wrote out of bounds, is caught.
- A mismatch report names shape, dtype, the first differing elements and max/mean error,
  in the manner of llm.c's ``dev/cuda`` checks.
"""
from __future__ import annotations

import math

import torch

# (atol, rtol) per dtype of the *tested* output. The reference is computed in fp32 or fp64.
TOLERANCES = {
    torch.float64: (1e-8, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float8_e4m3fn: (1.25e-1, 1.25e-1),
    torch.float8_e5m2: (2.5e-1, 2.5e-1),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for comparing an output of ``dtype``; exact (0, 0) for integer dtypes."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if not dtype.is_floating_point:
        return (0.0, 0.0)
    raise ValueError(f"no tolerance known for {dtype}")


def _fmt_index(flat: int, shape: tuple[int, ...]) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size if size else 0)
        flat //= size if size else 1
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def compare(actual, expected: torch.Tensor, *, atol: float | None = None, rtol: float | None = None,
            name: str = "output", dtype: torch.dtype | None = None, max_report: int = 5) -> str | None:
    """Compare ``actual`` with ``expected``; return ``None`` if they match, else a readable report.

    ``dtype`` is the dtype ``actual`` must have (defaults to ``expected.dtype``); tolerances default
    to :data:`TOLERANCES` for that dtype. NaN or inf where the reference is finite always fails.
    """
    dtype = dtype or expected.dtype
    if not isinstance(actual, torch.Tensor):
        return f"{name}: expected a torch.Tensor, got {type(actual).__name__}."
    if tuple(actual.shape) != tuple(expected.shape):
        return (f"{name}: shape {tuple(actual.shape)} but expected {tuple(expected.shape)}.")
    if actual.dtype != dtype:
        return f"{name}: dtype {actual.dtype} but expected {dtype}."
    d_atol, d_rtol = tolerance(dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if a.numel() == 0:
        return None
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    err = (a - e).abs()
    bad = ~(both_nan | same_inf) & ~(err <= atol + rtol * e.abs())  # NaN compares False -> bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    finite = err[bad & torch.isfinite(err)]  # errors of the differing elements that are numbers
    lines = [f"{name}: {n_bad} of {a.numel()} elements differ for shape {tuple(a.shape)} {dtype} "
             f"(atol={atol:g}, rtol={rtol:g})."]
    n_nan = int(torch.isnan(a).sum())
    if n_nan:
        lines.append(f"  {n_nan} elements are NaN: never written (poisoned buffer) or a NaN computed.")
    if finite.numel():
        lines.append(f"  max abs error {float(finite.max()):.4g}, mean abs error {float(finite.mean()):.4g} "
                     "(over the differing, finite elements)")
    flat_bad = bad.flatten().nonzero().flatten()[:max_report].tolist()
    af, ef = a.flatten(), e.flatten()
    for i in flat_bad:
        lines.append(f"  at {_fmt_index(i, tuple(a.shape))}: got {float(af[i]):.6g}, expected {float(ef[i]):.6g}")
    return "\n".join(lines)


class MismatchError(AssertionError):
    """Raised by :func:`assert_close`; its message is a full mismatch report."""


def assert_close(actual, expected, **kwargs) -> None:
    """Raise :class:`MismatchError` with a readable report unless ``actual`` matches ``expected``."""
    report = compare(actual, expected, **kwargs)
    if report is not None:
        raise MismatchError(report)


POISON = float("nan")
# The most elements one Triton block can hold (``TRITON_MAX_TENSOR_NUMEL`` in ``triton/_utils.py``,
# 2**20 from Triton 3.x through 3.9; ``tl.arange(0, 2**21)`` raises). A guard region this long after
# a buffer holds everything an unmasked 1-D block can write or read past its end, whatever BLOCK the
# learner picks: that is what compiled kernels on a GPU get, since nothing checks their accesses.
MAX_BLOCK = 1 << 20
# In Triton's CPU interpreter ``gpulab.launches`` checks every access instead (and skips any outside
# the buffers), so a short guard region is enough there; a long one would cost time, because the
# interpreter copies every argument's whole storage back after each launch.
GUARD = 257


def guard_elements(device) -> int:
    """Elements of guard region (and input padding) for buffers on ``device``: :data:`GUARD` where
    the interpreter's accesses are bounds-checked, else :data:`MAX_BLOCK`."""
    from gpulab.launches import can_check_bounds

    return GUARD if torch.device(device).type == "cpu" and can_check_bounds() else MAX_BLOCK


# The guard region holds a NaN with a payload no arithmetic produces, compared bit for bit: a store of
# any value into it shows, NaN included (an unmasked kernel that reads NaN padding stores NaN).
_GUARD_BITS = {torch.float64: (torch.int64, 0x7FF80000BAD0BAD0), torch.float32: (torch.int32, 0x7FC0BAD0),
               torch.float16: (torch.int16, 0x7EAD), torch.bfloat16: (torch.int16, 0x7FCB)}


def _poison_value(dtype: torch.dtype):
    return POISON if dtype.is_floating_point else torch.iinfo(dtype).min


def poisoned(shape, dtype=torch.float32, device="cpu", guard: int | None = None):
    """An output buffer filled with poison, followed by a guard region of ``guard`` elements
    (default :func:`guard_elements`).

    Returns ``(out, storage)``: ``out`` is a contiguous view of ``shape`` at the start of
    ``storage``; pass ``out`` to the kernel, then :func:`guard_report` on ``storage``.
    Integer dtypes are poisoned with their minimum value, floats with NaN (the guard region with
    a NaN of its own bit pattern).
    """
    numel = math.prod(shape)
    guard = guard_elements(device) if guard is None else guard
    storage = torch.full((numel + guard,), _poison_value(dtype), dtype=dtype, device=device)
    if dtype in _GUARD_BITS:
        int_dtype, bits = _GUARD_BITS[dtype]
        storage.view(int_dtype)[numel:] = bits
    return storage[:numel].view(shape), storage


def guard_report(storage: torch.Tensor, numel: int, name: str = "output") -> str | None:
    """``None`` if the guard region after the first ``numel`` elements is untouched, else a report."""
    guard = storage[numel:].detach()  # checked where it lives: only two numbers cross to the host
    if guard.dtype in _GUARD_BITS:
        int_dtype, bits = _GUARD_BITS[guard.dtype]
        touched = guard.view(int_dtype) != bits
    elif guard.dtype.is_floating_point:
        touched = ~torch.isnan(guard)
    else:
        touched = guard != torch.iinfo(guard.dtype).min
    n = int(touched.sum())
    if n == 0:
        return None
    first = int(touched.nonzero()[0])
    return (f"{name}: the kernel wrote {n} element(s) past the end of the tensor (first at offset "
            f"{numel + first}, {first} past the end). A store is missing its mask `offs < n`.")


def padded(x: torch.Tensor, device=None, guard: int | None = None, fill=None) -> torch.Tensor:
    """A copy of ``x`` (same shape, contiguous) at the start of a buffer with ``guard`` more elements
    (default :func:`guard_elements`).

    Inputs travel this way, so a load without a mask reads the padding (``fill``: poison by
    default), never memory nobody owns. The result is a view; its storage holds the padding.
    """
    device = x.device if device is None else device
    guard = guard_elements(device) if guard is None else guard
    if fill is None:
        fill = POISON if x.dtype.is_floating_point else (0 if x.dtype == torch.bool else torch.iinfo(x.dtype).max)
    storage = torch.full((x.numel() + guard,), fill, dtype=x.dtype, device=device)
    storage[: x.numel()].copy_(x.reshape(-1))
    return storage[: x.numel()].view(x.shape)


def validate(x, name: str, *, dtype=None, device=None, ndim: int | None = None,
             shape: tuple | None = None, contiguous: bool = False) -> torch.Tensor:
    """Check a tensor argument and raise an error that says what to change.

    ``dtype`` may be one dtype or a tuple of allowed dtypes; ``shape`` may contain ``None`` for
    "any size". Returns ``x`` so it can be used inline.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}.")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if x.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise TypeError(f"`{name}` has dtype {x.dtype}; expected {want}. "
                            f"Convert with `{name}.to({allowed[0]})`.")
    if device is not None and x.device.type != torch.device(device).type:
        raise ValueError(f"`{name}` is on {x.device}, but this run uses {device}. "
                         f"Move it with `{name}.to('{device}')`.")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"`{name}` must have {ndim} dimension(s), got shape {tuple(x.shape)}.")
    if shape is not None:
        ok = len(shape) == x.ndim and all(s is None or s == t for s, t in zip(shape, x.shape))
        if not ok:
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"`{name}` must have shape {want}, got {tuple(x.shape)}.")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"`{name}` is not contiguous (strides {x.stride()}); this kernel indexes it "
                         f"as a flat array. Pass `{name}.contiguous()`.")
    return x
