"""What the instructor adds by hand on top of the autograder, each in a file of their own that no
command ever writes (so a regrade keeps it):

- overrides (``--overrides overrides.csv``; columns ``learner, exercise, points, comment``, optional
  ``lab``): ``exercise`` is an exercise id, whose score becomes ``points``, or ``total``, which sets the
  lab's final total (late penalty included) to ``points``;
- written-answer scores (``--scores scores.csv``, or ``.yaml``/``.yml``, a list of mappings; columns or
  keys ``learner, question, points, comment``, optional ``lab``): one gradebook column per question,
  ``interview:<question>``, added to the total. A row with no points is not scored yet (it adds 0).

Rows whose ``lab`` names another lab are ignored, so one file can serve a whole course.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from grader.roster import read_csv_rows


@dataclass(frozen=True)
class Override:
    target: str          # an exercise id or "total"
    points: float
    comment: str


@dataclass(frozen=True)
class Written:
    question: str
    points: float | None  # None: not scored yet
    comment: str


def _points(text, where: str, blank_ok: bool = False) -> float | None:
    if (text is None or str(text).strip() == "") and blank_ok:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{where}: points {text!r} is not a number.")
    return value


def read_overrides(path, lab: str, exercise_ids: list[str]) -> dict[str, list[Override]]:
    """learner -> the overrides of this lab, in file order; ValueError naming the line of a bad row."""
    out: dict[str, list[Override]] = {}
    seen: dict[tuple[str, str], int] = {}
    for line, row in read_csv_rows(path, ("learner", "exercise", "points"), "overrides file"):
        if row.get("lab") and row["lab"] != lab:
            continue
        where = f"{path}, line {line}"
        target = row["exercise"]
        if target != "total" and target not in exercise_ids:
            raise ValueError(f"{where}: {target!r} is not an exercise of {lab} ({', '.join(exercise_ids)}) "
                             "nor `total`.")
        if (row["learner"], target) in seen:
            raise ValueError(f"{where}: {row['learner']} / {target} is overridden already on line "
                             f"{seen[row['learner'], target]}; keep one.")
        seen[row["learner"], target] = line
        out.setdefault(row["learner"], []).append(Override(target, _points(row["points"], where),
                                                           row.get("comment", "")))
    return out


def _score_rows(path) -> list[tuple[int, dict]]:
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path} is YAML, but PyYAML is not installed; write it as CSV instead.") from None
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read the scores file {path}: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise ValueError(f"{path} must be a list of mappings with keys learner, question, points, comment.")
        rows = [(i + 1, {str(k).strip().lower(): "" if v is None else str(v).strip() for k, v in d.items()})
                for i, d in enumerate(data)]
        for n, row in rows:
            if not row.get("learner") or not row.get("question"):
                raise ValueError(f"{path}, entry {n}: learner and question are required.")
        return rows
    return read_csv_rows(path, ("learner", "question", "points"), "scores file")


def read_scores(path, lab: str) -> tuple[list[str], dict[str, list[Written]]]:
    """The questions in the order first met, and learner -> their written-answer scores for this lab."""
    questions: list[str] = []
    out: dict[str, list[Written]] = {}
    seen: dict[tuple[str, str], int] = {}
    where_kind = "entry" if Path(path).suffix.lower() in (".yaml", ".yml") else "line"
    for line, row in _score_rows(path):
        if row.get("lab") and row["lab"] != lab:
            continue
        where = f"{path}, {where_kind} {line}"
        learner, question = row["learner"], row["question"]
        if (learner, question) in seen:
            raise ValueError(f"{where}: {learner} / {question} is scored already at {seen[learner, question]}; "
                             "keep one.")
        seen[learner, question] = line
        if question not in questions:
            questions.append(question)
        out.setdefault(learner, []).append(Written(question, _points(row.get("points"), where, blank_ok=True),
                                                   row.get("comment", "")))
    return questions, out
