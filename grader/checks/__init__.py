"""Per-lab check definitions: ``grader/checks/NN_name.py`` holds ``LAB``, ``TITLE`` and ``EXERCISES``.

The module names start with digits (they share the notebooks' stems), so they are loaded with
``importlib`` rather than an ``import`` statement.
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache
from pathlib import Path

_HERE = Path(__file__).parent
_STEM = re.compile(r"^\d\d_[a-z0-9_]+$")


def lab_stems() -> list[str]:
    """Stems of every lab that has checks, sorted (``["01_performance_model", ...]``)."""
    return sorted(p.stem for p in _HERE.glob("*.py") if _STEM.match(p.stem))


@lru_cache(maxsize=None)
def load_lab(stem: str):
    """The check module of lab ``stem``; a clear error for an unknown lab."""
    if stem not in lab_stems():
        raise KeyError(f"unknown lab {stem!r}; labs with checks: {', '.join(lab_stems())}")
    module = importlib.import_module(f"grader.checks.{stem}")
    if getattr(module, "LAB", None) != stem:
        raise RuntimeError(f"grader/checks/{stem}.py must set LAB = {stem!r}")
    return module


def exercises(stem: str) -> dict:
    """``{exercise_id: Exercise}`` of lab ``stem``, in notebook order."""
    return {ex.id: ex for ex in load_lab(stem).EXERCISES}


def find_exercise(exercise_id: str):
    """``(stem, Exercise)`` for an exercise id; ids are unique across labs (a test keeps them so)."""
    for stem in lab_stems():
        found = exercises(stem).get(exercise_id)
        if found is not None:
            return stem, found
    raise KeyError(f"no exercise called {exercise_id!r}. Check the spelling in your `check(...)` call.")
