"""The class roster (``--roster FILE.csv``): who the learners are and which submission is whose.

Columns: ``learner`` (required, unique), ``submission`` (optional: a path relative to the submissions
folder, or a glob such as ``alice_*`` or ``alice/*``; case is ignored), and optionally ``email``,
``sis_id``, ``canvas_id``, ``sis_login_id``, ``name`` (as Canvas shows it, "Last, First") and ``section``.
A row without ``submission`` takes the submission whose learner (folder name or file stem) is its
``learner``, or, for a Canvas download, whose file name holds ``_<canvas_id>_``.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path

from grader.intake import Found

FIELDS = ("learner", "submission", "email", "sis_id", "canvas_id", "sis_login_id", "name", "section")
IDENTITY = ("email", "sis_id", "canvas_id", "sis_login_id", "name", "section")


@dataclass(frozen=True)
class Person:
    learner: str
    submission: str = ""
    email: str = ""
    sis_id: str = ""
    canvas_id: str = ""
    sis_login_id: str = ""
    name: str = ""
    section: str = ""

    def identity(self) -> dict:
        return {k: getattr(self, k) for k in IDENTITY}


def read_csv_rows(path, required: tuple[str, ...], what: str) -> list[tuple[int, dict]]:
    """``(line number, row)`` of a CSV file with lower-cased, stripped headers and stripped cells;
    ValueError naming the file when a required column is missing. Excel's byte-order mark is fine."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc}") from None
    reader = csv.DictReader(text.splitlines())
    headers = [(h or "").strip().lower() for h in (reader.fieldnames or [])]
    missing = [c for c in required if c not in headers]
    if missing:
        raise ValueError(f"the {what} {path} has no column {', '.join(missing)} (its header row: "
                         f"{', '.join(headers) or 'empty'}); the columns are {', '.join(required)}.")
    rows = []
    for row in reader:
        clean = {(k or "").strip().lower(): (v or "").strip() if isinstance(v, str) else "" for k, v in row.items()}
        if any(clean.values()):
            rows.append((reader.line_num, clean))
    return rows


def read_roster(path) -> list[Person]:
    people, seen = [], {}
    for line, row in read_csv_rows(path, ("learner",), "roster"):
        learner = row["learner"]
        if not learner:
            raise ValueError(f"{path}, line {line}: the learner is empty.")
        if learner in seen:
            raise ValueError(f"{path}, lines {seen[learner]} and {line}: learner {learner!r} appears twice.")
        seen[learner] = line
        people.append(Person(**{k: row.get(k, "") for k in FIELDS}))
    return people


def _matches(person: Person, found: Found) -> bool:
    name = found.submission.lower()
    if person.submission:
        pattern = person.submission.lower().rstrip("/")
        return fnmatchcase(name, pattern) or fnmatchcase(name.split("/")[0], pattern)
    if found.learner.lower() == person.learner.lower():
        return True
    return bool(person.canvas_id) and f"_{person.canvas_id}_" in f"_{name.rsplit('/', 1)[-1]}"


def assign(found: list[Found], people: list[Person]) -> tuple[list[Found], list[tuple[str, str]]]:
    """Each found submission with its roster learner, and the ones the roster does not place (kept under
    the learner intake gave them) with why."""
    placed, unplaced = [], []
    for f in found:
        owners = [p for p in people if _matches(p, f)]
        if len(owners) == 1:
            placed.append(replace(f, learner=owners[0].learner))
            continue
        placed.append(f)
        unplaced.append((f.submission, "matches the roster rows of " + ", ".join(p.learner for p in owners)
                         if owners else "not on the roster"))
    return placed, unplaced
