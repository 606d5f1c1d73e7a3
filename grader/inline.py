"""The one door from the learner-side package into the lab checks (the inline ``check`` and the
progress view of lesson 00).

``gpulab`` never imports ``grader``: it finds this module through the ``gpulab.checks`` entry point
declared in ``pyproject.toml`` (see :func:`gpulab.checks_entry.checks`), so the helper package stands
alone and the checks can be replaced or left out.
"""
from __future__ import annotations

from grader.checks import exercises, find_exercise, lab_stems, load_lab
from grader.exercise import FOLDED_MARK, ExerciseResult, evaluate

__all__ = ["FOLDED_MARK", "run_public", "labs"]


def run_public(exercise_id: str, namespace: dict, device: str) -> tuple[str, ExerciseResult, str]:
    """``(lab stem, result, hint)``: the public cases of ``exercise_id`` run on the learner's code."""
    stem, ex = find_exercise(exercise_id)
    return stem, evaluate(ex, namespace, device), ex.hint


def labs() -> list[dict]:
    """``[{"lab", "title", "points": {exercise_id: points}}]`` for every lab with checks, in order."""
    return [{"lab": stem, "title": getattr(load_lab(stem), "TITLE", stem),
             "points": {eid: ex.points for eid, ex in exercises(stem).items()}} for stem in lab_stems()]
