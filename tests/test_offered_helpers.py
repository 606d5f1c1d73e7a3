"""Every lab's answers may call only the course helpers the lab offers (grader.kit.helpers): a helper that
models an exercise (lab 16's planner models lab 14's cache sizes, lab 13's bubble formula ...) handed in, derived
from, wrapped or called earns nothing, in every lab, decided by where the code lives."""
import pytest

from grader.checks import exercises, lab_stems
from grader.kit.helpers import every_lab, unoffered
from grader.runs.reuse import helpers_used, reporting_helpers
from tests.conftest import solution_namespace


@pytest.mark.parametrize("stem", lab_stems())
def test_every_exercise_of_every_lab_reports_and_judges_the_helpers_it_reaches(stem):
    for ex in exercises(stem).values():
        assert getattr(ex.run, "func", None) is reporting_helpers, ex.id
        assert every_lab() <= ex.judge.args[1], ex.id


@pytest.mark.slow
@pytest.mark.parametrize("stem", lab_stems())
def test_each_solution_calls_only_the_helpers_its_lab_offers(stem):
    ns = solution_namespace(stem)
    for ex in exercises(stem).values():
        assert unoffered(ex, ns) == [], ex.id


def test_a_course_helper_reached_by_delegation_a_spoofed_module_or_a_wrapper_is_found():
    from gpulab.planning import ring_allreduce_time
    from gpulab.precision import overflows

    def delegating(grad, scale):
        return overflows(grad, scale)

    class Holder:
        def __init__(self):
            self.parts = [ring_allreduce_time]

    spoofed = type(overflows)(overflows.__code__, overflows.__globals__, "my_overflows")
    spoofed.__module__ = "__lab__"
    assert helpers_used(delegating) == ["gpulab.precision.overflows"]
    assert helpers_used(Holder()) == ["gpulab.planning.ring_allreduce_time"]
    assert helpers_used(spoofed) == ["gpulab:overflows"]  # named by its code, wherever it claims to live


def test_library_classes_are_not_followed_but_a_class_claiming_a_library_module_is():
    import torch

    from gpulab.planning import group_link

    class Claims(torch.nn.Module):
        def forward(self, x):
            return group_link(x)

    Claims.__module__ = "torch.nn"
    assert helpers_used(torch.nn.Linear(2, 2)) == []
    assert helpers_used(Claims) == ["gpulab.planning.group_link"]
