"""Feedback a learner can act on: each exercise's message in ``result.json`` (and ``feedback.md``)
after grading.

A case's raw message says what went wrong in one call. A learner also needs to know which exercise
it is (its title), where it lives in the lab (the heading above its cell), what to try (its hint),
and, when an exercise failed only because another cell did not run, which cell to fix first: that
is said once, in the failing exercise's terms, instead of a second copy of a traceback.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grader.checks import exercises
from grader.notebooks import exercise_id, section_title

CELL_FAILED = "the answer cell failed to run: "  # how grader.worker reports a cell that raised when executed
CELL_STOPPED = "(while its answer cell ran)"      # how grader.grade marks a crash or a hang during a cell
STUB = re.compile(r"exercise `([^`]+)`(?:, (.+?))?: replace this line with your code\.")  # release's stubs
_UNDEFINED = (re.compile(r"NameError: name '(\w+)' is not defined"),
              re.compile(r"ImportError: cannot import name '(\w+)'"))
_NOT_DEFINED = re.compile(r"^define ((?:`\w+`(?:, )?)+) \(run its cell first\)")  # run_case: an entry is missing
# A name a cell binds at its top level, read without parsing (a cell with a syntax error has no tree).
_TOP_LEVEL = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)|^(\w+)\s*(?::[^=\n]*)?=(?!=)", re.MULTILINE)


@dataclass(frozen=True)
class Cell:
    """One exercise's answer cell as the learner wrote it."""

    eid: str
    section: str | None   # the heading above it in the lab
    binds: frozenset      # the names it defines, or would once it runs (for a missing cell: the solution's)
    problem: str | None   # why it did not run ("has a syntax error at line 4"), None when it ran


def advise(result: dict, stem: str, solution, answers: dict[str, str]) -> None:
    """Give every exercise of a graded ``result`` its ``title`` and a message a learner can act on.

    ``solution`` is the lab's solution notebook (where each exercise's cell is, what it defines);
    ``answers`` the submission's answer cells ``{exercise_id: source}``. Changes ``result`` in place.
    """
    lab = exercises(stem)
    sections = {exercise_id(c): section_title(solution, i) for i, c in enumerate(solution.cells) if exercise_id(c)}
    solved = {exercise_id(c): c.get("source", "") for c in solution.cells if exercise_id(c)}
    cells = {e["id"]: _cell(e, lab[e["id"]], sections.get(e["id"]), answers, solved.get(e["id"], ""))
             for e in result["exercises"] if e["id"] in lab}
    for entry in result["exercises"]:
        ex = lab.get(entry["id"])
        if ex is None:
            continue
        entry["title"] = ex.title
        if entry["status"] == "passed":
            continue
        message = (_cascade(entry, cells) or _own_cell(entry, cells[ex.id])
                   or _not_attempted(entry, cells[ex.id], ex.title, stem) or entry["message"])
        entry["message"] = f"{message}\n\nHint: {ex.hint}" if ex.hint else message


def _cell(entry: dict, ex, section: str | None, answers: dict[str, str], solved: str) -> Cell:
    source = answers.get(ex.id)
    # what the learner's cell defines; for a missing cell, what the lab's cell would have
    binds = frozenset(ex.entries) | _top_level_names(solved if source is None else source)
    if source is None:
        problem = "is missing from the submission"
    elif CELL_FAILED in entry["message"]:
        problem = _failure(entry["message"].split(CELL_FAILED, 1)[1])
    elif CELL_STOPPED in entry["message"]:
        problem = "hung while it ran" if entry["status"] == "timeout" else "ended the process while it ran"
    else:
        problem = None
    return Cell(ex.id, section, binds, problem)


def _top_level_names(source: str) -> frozenset:
    return frozenset(a or b for a, b in _TOP_LEVEL.findall(source))


def _failure(text: str) -> str:
    """``"has a syntax error at line 4"`` or ``"stopped at line 9 with ValueError: ..."``, from the worker's
    report."""
    last = text.strip().splitlines()[-1] if text.strip() else "an error"
    if last.startswith(("SyntaxError", "IndentationError", "TabError")):
        line = re.search(r'", line (\d+)', text)
        return "has a syntax error" + (f" at line {line.group(1)}" if line else "") + f" ({last})"
    line = re.search(r'^File "<answer cell [^>]*>", line (\d+)', text.strip(), re.MULTILINE)
    return f"stopped at line {line.group(1)} with {last}" if line else f"stopped with {last}"


def _where(cell: Cell) -> str:
    return f'exercise `{cell.eid}`, section "{cell.section}"' if cell.section else f"exercise `{cell.eid}`"


def _cascade(entry: dict, cells: dict[str, Cell]) -> str | None:
    """The exercise failed only because another exercise's cell did not run or is not written yet."""
    eid, raw = entry["id"], entry["message"]
    stub = STUB.search(raw) if entry["status"] == "not_attempted" else None
    if stub and stub.group(1) != eid and stub.group(1) in cells:
        other = cells[stub.group(1)]
        what = stub.group(2) or "code"
        return (f"Exercise `{eid}` could not run because it calls your {what}, which is not written yet "
                f"({_where(other)}). Write that one first; this exercise is checked again with it.")
    for name in _undefined(raw):
        owner = next((c for c in cells.values() if c.eid != eid and c.problem and name in c.binds), None)
        if owner is not None:
            return (f"Exercise `{eid}` could not run because your cell defining `{name}` ({_where(owner)}) "
                    f"{owner.problem}. Fix that cell first; this exercise is checked again with it.")
    return None


def _undefined(message: str) -> list[str]:
    """The names ``message`` reports as undefined, first found first."""
    names = [m.group(1) for pattern in _UNDEFINED for m in pattern.finditer(message)]
    missing = _NOT_DEFINED.match(message)
    if missing:
        names += re.findall(r"`(\w+)`", missing.group(1))
    return list(dict.fromkeys(names))


def _own_cell(entry: dict, cell: Cell) -> str | None:
    if CELL_FAILED not in entry["message"]:
        return None  # a crash or a hang says so itself
    where = f' (under "{cell.section}")' if cell.section else ""
    report = entry["message"].split(CELL_FAILED, 1)[1]
    return (f"Your cell for this exercise{where} {cell.problem}, so none of its cases could run. "
            f"Run the cell in the lab to see the error, fix it, and run its check.\n\n{report}")


def _not_attempted(entry: dict, cell: Cell, title: str, stem: str) -> str | None:
    if entry["status"] != "not_attempted":
        return None
    place = f'under "{cell.section}" in labs/{stem}.ipynb' if cell.section else f"in labs/{stem}.ipynb"
    if cell.problem:  # the cell is missing
        return (f"Not attempted: the submission has no cell for exercise `{cell.eid}` ({title}); it belongs "
                f"{place}. If you deleted it, copy it back from a fresh copy of the lab and write your answer there.")
    undefined = _NOT_DEFINED.match(entry["message"])
    if undefined:
        return (f"Your cell for exercise `{cell.eid}` ({title}, {place}) ran but does not define "
                f"{undefined.group(1)}: the check calls it by that name, so keep the name the lab gives it.")
    stub = STUB.search(entry["message"])
    if stub is None:
        return None
    part = f" The first part still to write: {stub.group(2)}." if stub.group(2) else ""
    return (f"Not attempted yet: exercise `{cell.eid}` ({title}), {place}.{part} Write your answer in place "
            "of its `raise NotImplementedError(...)` line, then run the check cell below it.")
