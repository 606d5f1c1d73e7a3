"""Shared test fixtures. Unit tests run on the CPU, with Triton in its interpreter."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script
# Kernels defined in test modules are decorated at import: the interpreter must be on first.
import gpulab.device  # noqa: E402
from gpulab.paths import ROOT  # noqa: E402

gpulab.device.set_device("cpu")

from grader.checks import exercises  # noqa: E402
from grader.exercise import evaluate  # noqa: E402
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook  # noqa: E402

HIDDEN_SEED = 20261122


def _timeout_scale() -> float:
    """How much longer than on a quiet machine a test may wait for something that should succeed.

    ``GPULAB_TEST_TIMEOUT_SCALE`` sets it; by default 3, or twice the load per core measured when the
    tests start if that is more (a shared 2-core CI machine with two busy processes beside the suite
    runs everything 2 to 3 times slower). Only waits for success scale: a test that expects a timeout
    keeps its small one, so the suite is no slower when nothing hangs."""
    if os.environ.get("GPULAB_TEST_TIMEOUT_SCALE"):
        return float(os.environ["GPULAB_TEST_TIMEOUT_SCALE"])
    load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(3.0, 2.0 * load_per_core)


TIMEOUT_SCALE = _timeout_scale()


def scaled(seconds: float) -> float:
    """``seconds``, a wait that suffices on a quiet machine, scaled for a busy one (:data:`TIMEOUT_SCALE`)."""
    return seconds * TIMEOUT_SCALE


def solution_namespace(stem: str) -> dict:
    """Execute the solution of lab ``stem`` as a module (its exported cells and answers)."""
    import torch

    nb = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    source = export_source(nb, answer_cells(nb))
    ns = exec_source(source, f"<solutions/{stem}.ipynb>")
    # The export runs in the test process: a cell that switches autograd off for good (a bare
    # torch.set_grad_enabled(False)) would break every later backward in this pytest worker.
    assert torch.is_grad_enabled(), f"solutions/{stem}.ipynb switches autograd off; use `with torch.no_grad():`"
    return ns


def grade(stem: str, exercise_id: str, ns: dict, hidden: bool = True):
    """Evaluate one exercise on its public cases, and on hidden ones from a fixed seed."""
    ex = exercises(stem)[exercise_id]
    cases = ex.cases()
    if hidden:
        cases += ex.cases(seed=HIDDEN_SEED, public=False)
    return evaluate(ex, ns, "cpu", cases)


def public(stem: str, exercise_id: str, ns: dict, n: int | None = None):
    """Evaluate one exercise on its public cases only (the first ``n``): a wrong answer's message, quickly."""
    ex = exercises(stem)[exercise_id]
    return evaluate(ex, ns, "cpu", ex.cases()[:n])


def failed_rules(result) -> list:
    """The rules (a hidden case's name before ':') of the cases that did not pass."""
    return [c.name.split(":")[0] for c in result.cases if c.status != "passed"]


@pytest.fixture(scope="session")
def sol01():
    return solution_namespace("01_performance_model")


@pytest.fixture(scope="session")
def sol02():
    return solution_namespace("02_triton_basics")


def with_answer(ns: dict, **replacements) -> dict:
    """A copy of a solution namespace with some entries replaced by (wrong) answers."""
    out = dict(ns)
    out.update(replacements)
    return out


def pytest_configure(config):
    # Tests (and the notebooks they execute) keep their own progress file and peaks cache, so a
    # test run never overwrites a learner's.
    os.environ.setdefault("GPULAB_PROGRESS", str(ROOT / ".gpulab" / "test-progress.json"))
    os.environ.setdefault("GPULAB_CACHE", str(ROOT / ".gpulab" / "test-cache"))
