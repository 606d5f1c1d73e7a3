""""Your output matches the X variant instead": naming the mistake behind a wrong answer (every lab).

A judge that finds a mismatch computes the answers of the mistakes learners actually make (the
other GELU form, eps outside the square root, the mask off by one, a sum instead of a mean) and
tells the learner which one their output equals. The first variant that matches wins, so list the
most specific first.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from gpulab.compare import compare


def matching_variant(got, variants: Iterable[tuple[str, object]], same: Callable[[object, object], bool]) -> str | None:
    """The label of the first ``(label, candidate)`` whose candidate ``same(got, candidate)`` accepts.

    Candidates may be callables (``lambda: ...``) so an expensive one is computed only when the
    earlier ones did not match."""
    for label, candidate in variants:
        value = candidate() if callable(candidate) else candidate
        try:
            if value is not None and same(got, value):
                return label
        except Exception:  # a candidate that cannot be compared (another shape...) is not a match
            continue
    return None


def tensor_match(dtype: torch.dtype | None = None, **tolerances) -> Callable[[object, torch.Tensor], bool]:
    """``same`` for :func:`matching_variant`: :func:`gpulab.compare.compare` passes with these settings."""
    return lambda got, want: compare(got, want, dtype=dtype, **tolerances) is None


def diagnose(message: str | None, got, variants, same,
             template: str = "\n  Your output matches {} instead.") -> str | None:
    """``message`` with ``template`` naming the first matching variant appended (``message`` if none
    matches or there is no mismatch to explain)."""
    if not message:
        return message
    label = matching_variant(got, variants, same)
    return message if label is None else message + template.format(label)
