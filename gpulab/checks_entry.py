"""How the learner-side package finds the lab checks without importing the grader (lesson 00).

The ``grader`` package registers its door, ``grader.inline``, under the entry point group
``gpulab.checks`` (``pyproject.toml``); ``make setup`` installs it. Anything that provides the same
two functions (``run_public``, ``labs``) and ``FOLDED_MARK`` could stand in its place.
"""
from __future__ import annotations

import functools
from importlib.metadata import entry_points

GROUP = "gpulab.checks"
DOOR = "grader.inline"  # what the entry point names (pyproject.toml), imported when it is missing


class ChecksMissing(RuntimeError):
    """No lab checks are installed in this environment."""


@functools.lru_cache(maxsize=None)
def checks():
    """The installed checks module (``grader.inline``); :class:`ChecksMissing` if there is none."""
    found = list(entry_points(group=GROUP))
    if found:
        return found[0].load()
    # Not installed (a plain checkout on PYTHONPATH, as on the offline GPU machines): the grader
    # package beside this one is the door.
    try:
        import importlib

        return importlib.import_module(DOOR)
    except ImportError as exc:
        raise ChecksMissing("the lab checks are not installed in this Python environment: run `make setup` "
                            "in the project folder (it installs the project with `pip install -e .`), or "
                            "put the project folder on PYTHONPATH.") from exc
