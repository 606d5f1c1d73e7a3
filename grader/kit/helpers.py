"""The course helpers a lab offers, judged: an answer that is, derives from or calls a ``gpulab`` helper the lab
does not offer earns nothing for that exercise.

Some helpers model an earlier lab's exercise for a later one (lab 16 plans with lab 14's cache sizes), so
handing one in is not writing the exercise. The learner side reports which helpers an answer reaches
(:func:`grader.runs.reuse.reporting_helpers`); :func:`offering` wraps an exercise so that its judge compares
them with the lab's list (the helpers its setup cell imports) before anything else.
"""
from __future__ import annotations

import dataclasses
import importlib
from functools import partial

from grader.exercise import Exercise
from grader.runs.reuse import helpers_used, reporting_helpers


def _judge_helpers(judge, offered: frozenset, entries: tuple, case, obs):
    used = obs.get("helpers", []) if isinstance(obs, dict) else []
    foreign = [name for name in used if name not in offered]
    if foreign:
        return (f"{', '.join(f'`{e}`' for e in entries)} reaches {foreign[0]}, a course helper this lab does not "
                f"offer for its answers: write your own (the exercise is the computation itself). The helpers "
                f"this lab's answers may call: {', '.join(sorted(offered))}.")
    if isinstance(obs, dict) and "failed" in obs:
        return f"{', '.join(f'`{e}`' for e in entries)} raised {obs['failed']}"
    return judge(case, {k: v for k, v in obs.items() if k != "helpers"} if isinstance(obs, dict) else obs)


# Offered in every lab: choosing the device and comparing tensors compute no exercise's answer.
EVERY_LAB_MODULES = ("gpulab.device", "gpulab.compare")


def every_lab() -> frozenset:
    """``gpulab.setup``, ``gpulab.feedback.check`` and the public functions and classes of
    :data:`EVERY_LAB_MODULES`, as ``"gpulab.module.Name"``."""
    names = {"gpulab.setup", "gpulab.feedback.check"}
    for module_name in EVERY_LAB_MODULES:
        module = importlib.import_module(module_name)
        names |= {f"{module_name}.{name}" for name, obj in vars(module).items()
                  if not name.startswith("_") and callable(obj) and getattr(obj, "__module__", "") == module_name}
    return frozenset(names)


def offering(ex: Exercise, offered) -> Exercise:
    """``ex`` with its run reporting the helpers the answer reaches, and its judge refusing those not
    ``offered`` (``"gpulab.module.Name"`` each, every one an existing helper) or offered in every lab."""
    offered = frozenset(offered) | every_lab()
    for name in offered:
        module, _, attr = name.rpartition(".")
        if not hasattr(importlib.import_module(module), attr):
            raise ValueError(f"{ex.id}: the offered helper {name} does not exist")
    return dataclasses.replace(ex, run=partial(reporting_helpers, ex.run, ex.entries, offered),
                               judge=partial(_judge_helpers, ex.judge, frozenset(offered), ex.entries))


def unoffered(ex: Exercise, ns: dict) -> list[str]:
    """The helpers ``ns``'s answer to ``ex`` reaches that its lab does not offer (a solution's: none)."""
    offered = ex.judge.args[1]
    return [name for name in helpers_used(*(ns[n] for n in ex.entries if n in ns)) if name not in offered]
