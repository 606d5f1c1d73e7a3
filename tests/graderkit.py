"""Building submissions for grader tests: start from the generated lab, then tamper with it."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.conftest import ROOT


def load(folder: str, stem: str) -> dict:
    """A notebook as JSON; for "labs", the lab as release generates it (the working copy may hold
    a learner's answers)."""
    if folder == "labs":
        from grader.release import release_notebook, render

        return json.loads(render(release_notebook(ROOT / "solutions" / f"{stem}.ipynb")))
    return json.loads((ROOT / folder / f"{stem}.ipynb").read_text())


def answer_index(nb: dict, eid: str) -> int:
    return next(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("gpulab", {}).get("exercise") == eid)


def source(nb: dict, eid: str) -> str:
    s = nb["cells"][answer_index(nb, eid)]["source"]
    return "".join(s) if isinstance(s, list) else s


def submission(stem: str, answers: dict | None = None, solved: tuple = ()) -> dict:
    """The generated lab of ``stem`` with ``solved`` exercises taken from the solution and other
    ``answers`` (``{eid: source}``) written in."""
    nb = load("labs", stem)
    sol = load("solutions", stem)
    for eid in solved:
        nb["cells"][answer_index(nb, eid)]["source"] = source(sol, eid)
    for eid, src in (answers or {}).items():
        nb["cells"][answer_index(nb, eid)]["source"] = src
    return nb


def write(nb: dict, path: Path) -> Path:
    path.write_text(json.dumps(nb))
    return path


def solution_with(stem: str, eid: str, old: str, new: str) -> str:
    """The solution's answer to ``eid`` with one piece of text replaced (a plausible bug)."""
    src = source(load("solutions", stem), eid)
    assert old in src, f"{old!r} not in the solution of {eid}"
    return src.replace(old, new)


def by_id(result: dict) -> dict:
    return {e["id"]: e for e in result["exercises"]}


def deepcopy(nb: dict) -> dict:
    return copy.deepcopy(nb)
