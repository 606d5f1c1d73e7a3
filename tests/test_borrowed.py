"""``grader.exercise.borrowed``: a course helper or a forbidden class handed in as an answer is named,
whatever it is called and however it is wrapped; the learner's own code, using helpers, is not."""
import functools
import types

import torch

from gpulab.compare import compare
from grader.exercise import borrowed

GradScaler = torch.amp.GradScaler


def test_the_learners_own_class_and_function_are_their_own():
    class Mine:
        def step(self, x):
            return compare(x, x, dtype=torch.float32)  # a course helper used inside an answer is fine

    def mine(x):
        return compare  # referring to a course helper is fine too

    assert borrowed(Mine) is None and borrowed(Mine()) is None and borrowed(mine) is None
    assert borrowed(Mine, forbidden=(GradScaler,)) is None


def test_a_course_function_is_named_even_wrapped_or_renamed():
    renamed = types.FunctionType(compare.__code__, compare.__globals__, "my_compare", compare.__defaults__)
    renamed.__module__, renamed.__qualname__ = "__lab__", "my_compare"
    assert borrowed(compare) and borrowed(functools.partial(compare, dtype=torch.float32)) and borrowed(renamed)


def test_a_course_class_with_its_module_and_name_rewritten_is_still_course_code():
    from gpulab import models

    cls = next(v for v in vars(models).values() if isinstance(v, type) and v.__module__ == "gpulab.models"
               and any(callable(m) and hasattr(m, "__code__") for m in vars(v).values()))
    disguised = type("LossScaler", (cls,), {})
    disguised.__module__ = "__lab__"
    cls_copy = type(cls.__name__, cls.__bases__, dict(vars(cls)))
    cls_copy.__module__ = "__lab__"
    assert borrowed(disguised) and borrowed(cls_copy)


def test_a_forbidden_class_subclassed_wrapped_held_in_a_list_or_named_in_code_is_found():
    class Sub(GradScaler):
        pass

    class Wrapper:
        def __init__(self):
            self.inner = GradScaler("cpu", enabled=False)

    class InList:
        def __init__(self):
            self.parts = [1, {"s": GradScaler("cpu", enabled=False)}]

    class Named:
        def update(self):
            return torch.amp.GradScaler  # built inside a method

    for answer in (Sub, Sub("cpu", enabled=False), Wrapper(), InList(), Named, Named()):
        assert borrowed(answer, forbidden=(GradScaler,)), answer
    assert borrowed(Wrapper()) is None  # without the lab naming it, torch's class is the learner's business
