"""Seeded case generation: every random choice of a check comes from the case generator (lesson 00).

``Exercise.cases(seed, public)`` hands ``make_cases`` a ``torch.Generator`` seeded with ``seed``:
the inline check uses :data:`grader.exercise.PUBLIC_SEED`, the grader its run's ``--seed`` (a
secret one by default) for the public cases and the hidden ones alike, so the values of the public
cases a learner sees in the notebook are not the ones graded, and one ``--seed`` reproduces a whole
run. Draw everything through these helpers, never from the global RNG.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

import torch

T = TypeVar("T")


def randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """A whole number in ``[lo, hi]``, both ends included."""
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    """A float in ``[lo, hi)``."""
    return lo + (hi - lo) * float(torch.rand(1, generator=gen))


def choice(gen: torch.Generator, options: Sequence[T]) -> T:
    """One of ``options``, each equally likely."""
    return options[randint(gen, 0, len(options) - 1)]


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """A float32 CPU tensor of ``shape`` with standard normal entries times ``scale``."""
    return torch.randn(*shape, generator=gen) * scale
