"""Plausible wrong answers as one-line edits of a solution's answer cell: each must fail on every seed and say
why. A mutant is ``(exercise, the solution's text, the mistake, what the message says)``; the text may be a
tuple of texts, replaced in turn by the tuple of mistakes."""
import types

from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import HIDDEN_SEED


def rebound(ns: dict) -> dict:
    """A copy of ``ns`` whose functions look their globals up in the copy (a replaced helper is the one called)."""
    out = dict(ns)
    for name, value in out.items():
        if isinstance(value, types.FunctionType) and value.__globals__ is ns:
            out[name] = types.FunctionType(value.__code__, out, value.__name__, value.__defaults__, value.__closure__)
    return out


def mutated(stem: str, solution: dict, eid: str, old, new) -> dict:
    """``solution``'s namespace with the answer cell of ``eid`` run again with ``old`` replaced by ``new``."""
    lines = kit.source(kit.load("solutions", stem), eid).splitlines()
    src = "\n".join(line for line in lines if "### HINT" not in line)
    for before, after in zip(old, new) if isinstance(old, tuple) else [(old, new)]:
        assert before in src, (eid, before)
        src = src.replace(before, after)
    ns = rebound(solution)
    exec(compile(src, f"<answer cell {eid}>", "exec"), ns)
    return rebound(ns)


def assert_fails_on_every_seed(ex, ns: dict, says: str, seeds=(1, 2, HIDDEN_SEED)) -> None:
    """``ns``'s answer loses points on the public and hidden cases of every seed, and a failed case says ``says``."""
    for seed in seeds:
        r = evaluate(ex, ns, "cpu", ex.cases(seed, True) + ex.cases(seed, False))
        assert r.score < ex.points, (seed, r.message)
        assert any(says in c.message for c in r.cases if c.status != "passed"), (seed, r.message)


def ids(table: list) -> list:
    return [f"{m[0]}: {str(m[2])[:40]}" for m in table]
