"""Which of the course's helpers (``gpulab``) an answer is, or hands its work to: the learner side reports them,
the judge decides (each lab offers some helpers and not others: lab 16 models lab 14's scheduler and cache sizes
for its planner, which are lab 14's exercises).

An answer reaches a helper by being one (a function or class of ``gpulab``, whatever its ``__module__`` says:
the code's file decides), deriving from one, or naming one in its code: a function's globals, closure and
defaults, a class's methods and bases, followed through the learner's own functions and classes.
"""
from __future__ import annotations

import functools
import os
import sys
import types
from pathlib import Path

import gpulab

_GPULAB = str(Path(gpulab.__file__).resolve().parent) + os.sep
_DEPTH = 6  # how far to follow the learner's own functions and classes


def _in_gpulab(fn) -> bool:
    """Whether a function's code comes from a file of ``gpulab/``."""
    code = getattr(fn, "__code__", None)
    return code is not None and _course_file(code.co_filename)


@functools.lru_cache(maxsize=1024)
def _course_file(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_GPULAB)


def _helper(obj) -> str | None:
    """``module.Name`` when ``obj`` is a function or class of ``gpulab`` or derives from one; a class or function
    whose code lives in ``gpulab/`` under another module name is ``gpulab:Name`` (a renamed helper)."""
    for c in obj.__mro__ if isinstance(obj, type) else (obj,) if isinstance(obj, types.FunctionType) else ():
        name = f"{c.__module__}.{c.__qualname__}"
        if name.startswith("gpulab."):
            return name
        if any(_in_gpulab(m) for m in (vars(c).values() if isinstance(c, type) else (c,))):
            return f"gpulab:{c.__qualname__}"
    return None


_LIBRARIES = ("torch", "triton", "numpy", "numba")
_WRAPPERS = (list, tuple, dict, set, frozenset, functools.partial, staticmethod, classmethod, property,
             types.MethodType)  # what may hold a learner's object: always followed


@functools.lru_cache(maxsize=None)
def _library_dirs() -> tuple:
    dirs = []
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(str(Path(module.__file__).resolve().parent) + os.sep)
    return tuple(dirs)


def _library(obj) -> bool:
    """``obj`` belongs to a library the course builds on, and is not followed: a function whose code lives in
    the library's files, a class found where its ``__module__`` says (a learner's class claiming to be torch's
    is not; numba's simulator class, one method of which gpulab patches, is), or an instance of either."""
    if isinstance(obj, _WRAPPERS):
        return False
    if isinstance(obj, types.FunctionType):
        return obj.__code__.co_filename.startswith(_library_dirs()) and not _in_gpulab(obj)
    target = obj if isinstance(obj, type) else type(obj)
    module = getattr(target, "__module__", None) or ""
    if module == "builtins":
        return not isinstance(obj, type)  # numbers, strings, builtin functions: nothing of the learner's inside
    if module.split(".")[0] not in _LIBRARIES:
        return False
    return getattr(sys.modules.get(module), getattr(target, "__name__", ""), None) is target


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a code object and the functions nested in it use."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def _reached(obj) -> list:
    """What ``obj`` hands work to: a function's globals, closure and defaults; a class's members and bases."""
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        return [obj.__func__]
    if isinstance(obj, property):
        return [obj.fget, obj.fset]
    if isinstance(obj, types.FunctionType):
        names, scope = _names(obj.__code__), obj.__globals__
        out = [scope[n] for n in names if n in scope]
        out += [_contents(c) for c in obj.__closure__ or ()]
        modules = [m for m in out if isinstance(m, types.ModuleType)]
        opened = set()
        while modules:  # `planning.X`, `gpulab.planning.X`: the attributes the code names, modules in modules
            opened |= {id(m) for m in modules}
            found = [getattr(m, n) for m in modules for n in names if hasattr(m, n)]
            out += found
            modules = [m for m in found if isinstance(m, types.ModuleType) and id(m) not in opened]
        return out + list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
    if isinstance(obj, type):
        return [b for b in obj.__mro__[1:] if b is not object] + list(vars(obj).values())
    if isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(obj, types.ModuleType):
        return [type(obj), *vars(obj).values()]  # an instance: its class and what it holds
    return []


def helpers_used(*answers) -> list[str]:
    """The ``gpulab`` functions and classes the ``answers`` are, derive from or call, sorted."""
    found, seen, todo = set(), set(), [(a, 0) for a in answers]
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen or depth > _DEPTH:
            continue
        seen.add(id(obj))
        if _library(obj):
            continue
        name = _helper(obj)
        if name:
            found.add(name)
            continue
        todo += [(x, depth + 1) for x in _reached(obj)]
    return sorted(found)


def reporting_helpers(run, entries: tuple, offered: frozenset, ns: dict, case, device: str) -> dict:
    """``run``'s observations and ``"helpers"``: the course helpers the answer's ``entries`` reach (the judge
    decides whether the lab offers them; ``offered``, the lab's public list, only routes errors here). An answer
    that reaches a helper not offered and fails reports the failure as ``"failed"``, so that the judge names the
    helper first; any other error is the learner's, reported as usual."""
    used = helpers_used(*(ns[name] for name in entries if name in ns))
    try:
        obs = run(ns, case, device)
    except NotImplementedError:
        raise
    except Exception as exc:
        if set(used) <= offered:
            raise
        return {"helpers": used, "failed": f"{type(exc).__name__}: {exc}"}
    return {**obs, "helpers": used} if isinstance(obs, dict) else obs
