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


# --- Shared rules for check tests: do-nothing answers earn nothing; every rule in every hidden set ----

DO_NOTHING = {"return []": lambda *a, **k: [], "return None": lambda *a, **k: None,
              "return True": lambda *a, **k: True, "return 0.0": lambda *a, **k: 0.0, "return {}": lambda *a, **k: {},
              "return the first argument": lambda *a, **k: a[0] if a else None}


def assert_do_nothing_scores_zero(ex) -> None:
    """Every do-nothing answer scores 0 on the public cases and two hidden sets of ``ex``."""
    from grader.exercise import evaluate

    cases = ex.cases() + ex.cases(1, public=False) + ex.cases(2, public=False)
    for stub, fn in DO_NOTHING.items():
        r = evaluate(ex, {name: fn for name in ex.entries}, "cpu", cases)
        assert r.score == 0, (stub, r.message)


def hidden_rules(ex, seed: int) -> list:
    """The rule tags of a hidden set: each case is named ``"<rule>: <details>"``."""
    return sorted(c.name.split(":")[0] for c in ex.cases(seed, public=False))


def assert_same_rules_every_seed(ex, not_rules: tuple = ("random",)) -> None:
    """One case per rule, named by it, and the same rules for every seed (a regrade cannot change a score)."""
    rules = hidden_rules(ex, 1)
    assert not any(r.startswith(not_rules) for r in rules), rules
    assert len(set(rules)) == len(rules), rules
    for seed in (2, 3, 20261122, 987654321):
        assert hidden_rules(ex, seed) == rules
