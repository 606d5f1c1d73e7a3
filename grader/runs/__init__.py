"""The learner side of every check: the code that runs beside the learner's answers.

``grader/runs/NN_name.py`` holds lab ``NN_name``'s run functions, ``run(ns, case, device)``: each
calls the learner's code from namespace ``ns`` and returns plain observations. This folder, with
:mod:`grader.exercise`, :mod:`grader.notebooks` and :mod:`grader.worker`, is all of the grader the
sandbox holds (bound by name, read-only); the judge (``grader/checks/``, ``grader/kit/``, the
references and verdicts) never enters it. Nothing here may import the judge's modules or know an
answer: ``tests/test_layering.py`` keeps it so.

The module names start with digits (they share the notebooks' stems), so they are loaded with
:func:`run_side` rather than an ``import`` statement.
"""
from __future__ import annotations

import importlib
import re
from types import ModuleType

PACKAGE = __name__  # "grader.runs": every run function lives in a module below it
_NAME = re.compile(r"^[A-Za-z0-9_]+$")  # a stem, never a dotted path


def run_side(stem: str) -> ModuleType:
    """The learner-side module of lab ``stem`` (``grader/runs/<stem>.py``)."""
    if not _NAME.match(stem):
        raise KeyError(f"not a lab stem: {stem!r}")
    return importlib.import_module(f"{__name__}.{stem}")
