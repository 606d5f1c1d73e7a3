"""Numeric closeness, one policy per kind of number (every lab's judge).

- Tensors a kernel writes: :data:`gpulab.compare.TOLERANCES`, ``(atol, rtol)`` per output dtype
  (use :func:`gpulab.compare.compare`, which reports where and by how much they differ).
- Tensors after several steps (training steps, a sum over ranks, a backward pass): :data:`ACCUMULATED`,
  looser, because the order of float32 additions differs from the reference's.
- Python numbers from a formula (bytes, FLOPs, seconds, fractions): :func:`close`, relative 1e-9.
"""
from __future__ import annotations

import math

import torch

from gpulab.compare import TOLERANCES, tolerance  # noqa: F401 - re-exported: the kernel policy

SCALAR_RTOL = 1e-9
SCALAR_ATOL = 1e-12

# (atol, rtol) of results accumulated over several operations, per dtype.
ACCUMULATED = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-6, 1e-4),
}


def close(got, want, rel: float = SCALAR_RTOL, abs_tol: float = SCALAR_ATOL) -> bool:
    """Whether the number ``got`` is ``want`` up to ``rel`` (relative) or ``abs_tol``; ``False``
    for anything that is not a number (the learner returned a string, a tensor of several values...)."""
    try:
        return math.isclose(float(got), float(want), rel_tol=rel, abs_tol=abs_tol)
    except (TypeError, ValueError):
        return False
