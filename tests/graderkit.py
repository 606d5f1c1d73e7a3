"""Building submissions for grader tests: start from the generated lab, then tamper with it."""
from __future__ import annotations

import copy
import functools
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


def _first_tensor(args):
    import torch

    return next((a for a in args if isinstance(a, torch.Tensor)), None)


@functools.cache
def _write_nothing_kernel():
    """A Triton kernel with a ``pass`` body: it launches, and writes nothing."""
    import triton

    @triton.jit
    def write_nothing(x_ptr):
        pass
    return write_nothing


def _launch_nothing(returns):
    def answer(*args, out=None, **kwargs):
        first = _first_tensor(args)
        _write_nothing_kernel()[(1,)](first)
        return returns(first, out)
    return answer


# Wrappers of kernel exercises that do nothing useful: they return zeros, an empty tensor, the `out` buffer
# as it came, or launch a kernel that writes nothing.
KERNEL_DO_NOTHING = {
    "return zeros like the first tensor": lambda *a, **k: _first_tensor(a).new_zeros(_first_tensor(a).shape),
    "return an empty tensor": lambda *a, **k: _first_tensor(a).new_empty(0),
    "return `out` untouched": lambda *a, out=None, **k: out,
    "launch a pass-bodied kernel, return `out`": _launch_nothing(lambda first, out: out),
    "launch a pass-bodied kernel, return zeros": _launch_nothing(lambda first, out: first.new_zeros(first.shape)),
}


def assert_do_nothing_scores_zero(ex, kernels: bool = False, seeds: tuple = (1, 2)) -> None:
    """Every do-nothing answer (with ``kernels``, the kernel wrappers' too) scores 0 on the public cases
    and the hidden sets of ``seeds`` of ``ex``."""
    from grader.exercise import evaluate

    cases = ex.cases() + [c for seed in seeds for c in ex.cases(seed, public=False)]
    stubs = {**DO_NOTHING, **(KERNEL_DO_NOTHING if kernels else {})}
    for stub, fn in stubs.items():
        r = evaluate(ex, {name: fn for name in ex.entries}, "cpu", cases)
        assert r.score == 0, (stub, r.message)


def assert_untouched_lab_scores_zero(stem: str, first_case_only: bool = False) -> None:
    """The lab as learners get it (``labs/STEM.ipynb``, stubs everywhere) earns nothing: every exercise is
    "not attempted" (a stub raises before any rank or kernel starts). ``first_case_only`` for slow labs."""
    from grader.checks import exercises
    from grader.exercise import evaluate
    from grader.notebooks import answer_cells, exec_source, export_source, read_notebook

    nb = read_notebook(ROOT / "labs" / f"{stem}.ipynb")
    ns = exec_source(export_source(nb, answer_cells(nb)), f"<labs/{stem}.ipynb>")
    for eid, ex in exercises(stem).items():
        result = evaluate(ex, ns, "cpu", ex.cases()[:1] if first_case_only else None)
        assert result.status == "not_attempted" and result.score == 0, (eid, result.message)


def hidden_rules(ex, seed: int, rule=None) -> list:
    """The rule tags of a hidden set: each case is named ``"<rule>: <details>"``, or ``rule(case)``."""
    rule = rule or (lambda c: c.name.split(":")[0])
    return sorted(rule(c) for c in ex.cases(seed, public=False))


def assert_same_rules_every_seed(ex, not_rules: tuple = ("random",), rule=None) -> None:
    """One case per rule, named by it, and the same rules for every seed (a regrade cannot change a score).
    ``rule(case)``: the rule of a case read from its inputs, where names do not carry it (several cases
    may share one; every seed has as many of each)."""
    rules = hidden_rules(ex, 1, rule)
    assert not any(r.startswith(not_rules) for r in rules), rules
    assert rule or len(set(rules)) == len(rules), rules
    for seed in (2, 3, 20261122, 987654321):
        assert hidden_rules(ex, seed, rule) == rules


def assert_fails_every_seed(ex, ns: dict, text: str, seeds: tuple = (1, 2, 3), pick=None) -> None:
    """A wrong answer ``ns`` fails the hidden set of every seed (the cases ``pick(case)`` selects, if given,
    to keep kernel labs quick), with ``text`` in the message."""
    from grader.exercise import evaluate

    for seed in seeds:
        cases = [c for c in ex.cases(seed, public=False) if pick is None or pick(c)]
        assert cases, f"seed {seed}: no hidden case picked"
        r = evaluate(ex, ns, "cpu", cases)
        assert r.status != "passed" and text in r.message, (seed, r.message)


def read_the_case():
    """The case of the run function that called the answer, read from the caller's frame: what an
    answer sees of the judge's case (its name and inputs), and all it may learn from it."""
    import inspect

    frame = inspect.currentframe().f_back.f_back
    while frame is not None and "case" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["case"] if frame is not None else None


def mutant(sol: dict, stem: str, eid: str, old: str, new: str) -> dict:
    """The solution namespace ``sol`` of lab ``stem`` with one piece of its answer to ``eid`` replaced
    (a plausible bug), executed as a learner's cell would be."""
    from grader.notebooks import exec_source

    return exec_source(solution_with(stem, eid, old, new), f"<wrong {eid}: {new}>", dict(sol))
