"""What an exercise is, and how one case of it is run and judged.

One definition serves two callers (design.md): the notebook's inline ``gpulab.check`` runs the
public cases in the learner's kernel; the grader runs hidden cases from a secret seed, with
``run`` in a child process and ``judge`` in its own. So an exercise is split in three parts:

- ``make_cases(gen, public)`` builds the inputs (CPU tensors and plain values), in the judge;
- ``run(ns, case, device)`` calls the learner's code from namespace ``ns`` and returns plain
  observations (CPU tensors, numbers, strings), in the learner's process;
- ``judge(case, obs)`` compares the observations with the reference, in the judge: it returns
  ``None`` when the case passes, else a message for the learner.
"""
from __future__ import annotations

import functools
import os
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

PUBLIC_SEED = 0
STATUSES = ("passed", "failed", "error", "timeout", "crashed", "not_attempted")
RUN_STATUSES = ("error", "crashed", "not_attempted")  # what run_case and the worker report besides "ok"


@dataclass(frozen=True)
class Case:
    """One set of inputs for an exercise. ``inputs`` holds CPU tensors and plain values."""

    name: str
    inputs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: its id (the answer cell's ``gpulab.exercise``), points and check."""

    id: str
    points: float
    entries: tuple            # names the answer cell defines, e.g. ("vector_add",)
    make_cases: Callable[[torch.Generator, bool], list]
    run: Callable[[dict, Case, str], dict]
    judge: Callable[[Case, dict], "str | None"]
    hint: str = ""
    title: str = ""
    requires: str = ""        # a gpulab.capability feature the run needs on CUDA ("bf16", "fp8"); "" for none

    def cases(self, seed: int = PUBLIC_SEED, public: bool = True) -> list[Case]:
        """The public or hidden cases drawn from ``seed`` (:mod:`grader.kit.cases`): the notebook's
        inline check uses :data:`PUBLIC_SEED`, the grader its run's seed for both kinds."""
        gen = torch.Generator().manual_seed(seed)
        return list(self.make_cases(gen, public))


@dataclass(frozen=True)
class Benchmark:
    """One timed comparison. ``make(device, tiny)`` returns the inputs dict, with the op's
    ``"bytes"`` and ``"flops"`` (for rates); ``call(fn, inputs)`` runs the learner's ``entry``;
    ``baseline(inputs)`` runs the PyTorch equivalent; ``info()``, if given, returns fields recorded
    with the row (what the baseline really ran, for instance which attention backend)."""

    name: str
    entry: str
    make: Callable[[str, bool], dict]
    call: Callable[[Callable, dict], Any]
    baseline: Callable[[dict], Any]
    info: Callable[[], dict] | None = None


@dataclass(frozen=True)
class RunSide:
    """What the learner's process holds of an exercise: the names its answer cell defines and its
    run function (from ``grader/runs/``). :func:`run_case` needs nothing more."""

    entries: tuple
    run: Callable[[dict, "Case", str], dict]


def capability_skip(ex: Exercise, device: str) -> str | None:
    """Why ``ex`` cannot be graded on this machine's GPU (``"needs fp8 (sm_89+), this GPU is sm_75"``), or
    ``None``. Only a CUDA run on a GPU without the exercise's ``requires`` is skipped: the grader never marks a
    learner down for their GPU, and the CPU runs everything. Asked in the judge, before any worker starts."""
    if not ex.requires or device != "cuda":
        return None
    from gpulab.capability import missing

    return missing(ex.requires, device)


def gpu_skips(lab: dict, device: str) -> dict[str, str]:
    """``{exercise id: why}`` for the exercises of ``lab`` (``{id: Exercise}``) this GPU cannot grade."""
    reasons = {eid: capability_skip(ex, device) for eid, ex in lab.items()}
    return {eid: why for eid, why in reasons.items() if why}


def skipped_result(ex: Exercise, why: str) -> ExerciseResult:
    """An exercise left out for the grading GPU: no points either way (0 of 0; the maximum drops by its points).
    The status stays one of schema 1's; ``skipped`` says why."""
    return ExerciseResult(ex.id, 0.0, 0.0, "not_attempted",
                          f"not graded: this exercise {why}. Its {ex.points:g} points are left out of the maximum; "
                          "grade it with --device cpu, or on a GPU that has it, to get them.", skipped=why)


def skip_records(lab: dict, skips: dict[str, str], device: str) -> list[dict]:
    """``result.json``'s ``skipped_for_capability``: ``[{"id", "requires", "device_capability", "points"}]``."""
    from gpulab.capability import device_capability, sm

    capability = device_capability(device)
    return [{"id": eid, "requires": lab[eid].requires, "device_capability": sm(capability) if capability else None,
             "points": float(lab[eid].points)} for eid in skips]


class Neutral(str):
    """A judge's verdict for a case that passes without earning anything (an allowed, clean
    rejection of an input), so rejecting everything cannot collect partial credit."""


@dataclass
class CaseResult:
    name: str
    status: str               # passed | failed | error | not_attempted | timeout | crashed
    message: str = ""
    weight: float = 1.0       # 0 for a Neutral pass


@dataclass
class ExerciseResult:
    id: str
    points: float
    score: float
    status: str
    message: str
    cases: list = field(default_factory=list)
    skipped: str = ""         # why this GPU could not grade it (capability_skip); its points are left out

    def as_dict(self) -> dict:
        out = {"id": self.id, "points": self.points, "score": self.score,
               "status": self.status, "message": self.message}
        return {**out, "skipped": self.skipped} if self.skipped else out


# Where a learner's code lives: the grader's answer cells, IPython/ipykernel cells, exported notebooks.
_LEARNER_FILES = ("<answer cell", "<ipython-input-", ".ipynb>")
FOLDED_MARK = "Full traceback:"   # gpulab.feedback folds what follows (a <details> in the widget)


def _is_learner_file(filename: str) -> bool:
    return filename.startswith(_LEARNER_FILES) or filename.endswith(_LEARNER_FILES) or "/ipykernel_" in filename


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not e for e in chain):
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def _short_traceback(exc: BaseException, limit: int = 4000) -> str:
    """The error in the learner's terms: the original exception's line, then the learner's own
    frames (outermost call first), then ``(N internal frames hidden)``.

    The frames inside Triton, torch and the checks follow after :data:`FOLDED_MARK` (at most
    ``limit`` characters): the inline check folds them away, the grader's reports keep them.
    A typo in a Triton kernel run by the interpreter raises through six chained tracebacks of the
    interpreter's internals; the cause (``AttributeError: ... 'arrange'``) and the kernel line come first.
    """
    chain = _chain(exc)
    root = exc  # the original error: follow `raise ... from` (Triton wraps errors so) to its start
    while root.__cause__ is not None and root.__cause__ in chain:
        root = root.__cause__
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    mine = [f for f in frames if _is_learner_file(f.filename)]
    if not mine and frames:
        mine = frames[-1:]  # no frame of the learner's: show where it was raised
    shown = traceback.StackSummary.from_list(mine).format() if mine else []
    lines = ["".join(traceback.format_exception_only(type(root), root)).strip()]
    if shown:
        lines += ["Your code:" if _is_learner_file(mine[-1].filename) else "Raised here:", "".join(shown).rstrip()]
    hidden = len(frames) - len(mine)
    if hidden:
        full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()
        if len(full) > limit:
            full = "...\n" + full[-limit:]
        lines += [f"({hidden} internal frame{'s' if hidden != 1 else ''} hidden)", FOLDED_MARK, full]
    return "\n".join(lines)


def run_case(ex: Exercise | RunSide, ns: dict, case: Case, device: str) -> dict:
    """Run one case in the learner's process. Never raises for learner mistakes.

    Returns ``{"status": "ok", "obs": ...}``, ``{"status": "not_attempted", "message": ...}``
    or ``{"status": "error", "message": ...}``.
    """
    missing = [name for name in ex.entries if name not in ns]
    if missing:
        return {"status": "not_attempted",
                "message": f"define {', '.join('`%s`' % m for m in missing)} (run its cell first)."}
    # The learner gets copies: in the inline path the judge's own inputs must survive any mutation.
    own = Case(case.name, {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.inputs.items()})
    try:
        obs = ex.run(ns, own, device)
    except NotImplementedError as exc:
        return {"status": "not_attempted", "message": str(exc) or "not implemented yet."}
    except Exception as exc:  # the learner's bug, reported, never raised
        return {"status": "error", "message": _short_traceback(exc)}
    return {"status": "ok", "obs": obs}


def judge_case(ex: Exercise, case: Case, outcome: dict) -> CaseResult:
    """Turn a :func:`run_case` outcome into a :class:`CaseResult`, in the judge's process."""
    status = outcome.get("status")
    if status != "ok":
        # Only the statuses the run side produces: an outcome saying "passed" was forged (the judge
        # alone decides what passes), and it earns nothing.
        message = outcome.get("message", "")
        return CaseResult(case.name, status if status in RUN_STATUSES else "error",
                          message[:4000] if isinstance(message, str) else "malformed outcome")
    try:
        message = ex.judge(case, outcome["obs"])
    except Exception as exc:  # malformed observations (wrong types) are the learner's failure
        message = f"could not check the result: {type(exc).__name__}: {exc}"
    if isinstance(message, Neutral):
        return CaseResult(case.name, "passed", str(message), weight=0.0)
    return CaseResult(case.name, "passed" if message is None else "failed", message or "")


def summarize(ex: Exercise, results: list[CaseResult]) -> ExerciseResult:
    """Score an exercise: points times the fraction of cases passed (partial credit)."""
    if not results or all(r.status == "not_attempted" for r in results):
        msg = results[0].message if results else "no cases ran."
        return ExerciseResult(ex.id, ex.points, 0.0, "not_attempted", msg, results)
    n_pass = sum(r.status == "passed" for r in results)
    total = sum(r.weight for r in results)
    earned = sum(r.weight for r in results if r.status == "passed")
    score = round(ex.points * earned / total, 4) if total else 0.0
    if n_pass == len(results):
        return ExerciseResult(ex.id, ex.points, float(ex.points), "passed",
                              f"all {len(results)} cases passed.", results)
    worst = next(s for s in ("crashed", "timeout", "error", "failed", "not_attempted")
                 if any(r.status == s for r in results))
    if worst == "not_attempted":
        worst = "failed"
    first = next(r for r in results if r.status != "passed")
    message = f"{n_pass}/{len(results)} cases passed. Case '{first.name}': {first.message}"
    return ExerciseResult(ex.id, ex.points, score, worst, message, results)


def evaluate(ex: Exercise, ns: dict, device: str, cases: list[Case] | None = None) -> ExerciseResult:
    """Run and judge every case in this process (the inline check's path). On a GPU without what the
    exercise ``requires``, nothing runs: the result says so (:func:`skipped_result`)."""
    why = capability_skip(ex, device)
    if why:
        skipped = skipped_result(ex, why)
        skipped.cases = [CaseResult("on this GPU", "not_attempted", skipped.message)]
        return skipped
    cases = ex.cases() if cases is None else cases
    results = [judge_case(ex, case, run_case(ex, ns, case, device)) for case in cases]
    return summarize(ex, results)


# Small helpers the per-lab check modules share ------------------------------------------------

def entry(ns: dict, name: str) -> Callable[..., Any]:
    """The learner's callable ``name`` from ``ns``; a clear error if it is not callable."""
    fn = ns[name]
    if not callable(fn):
        raise TypeError(f"`{name}` must be a function, got {type(fn).__name__}.")
    return fn


def borrowed(obj, forbidden: tuple = ()) -> str | None:
    """What of the course's helpers (or of ``forbidden``, e.g. ``torch.amp.GradScaler``) the learner's
    answer ``obj`` is, derives from, holds or calls; ``None`` when it is the learner's own.

    The course's helpers include modelling copies of some answers, and handing one in is not writing
    the exercise. Evidence that an answer cannot rename away:

    - where the code lives: a function or a class's method whose code object comes from a file of
      ``gpulab/`` (a spoofed ``__module__`` or ``__qualname__`` changes nothing);
    - what a class derives from: any base in its MRO that is course code or ``forbidden``;
    - delegation: an instance's attributes (in lists, tuples, dicts and nested objects) holding a
      course object or a ``forbidden`` one; a function or method whose globals, closure or defaults
      reach one, or whose code names one (``torch.amp.GradScaler(...)`` inside a method).

    ``obj`` is a class, an instance, a function (or ``functools.partial``). Runs on the learner's side;
    its answer is an observation, judged like any other.
    """
    return _Borrowed(tuple(forbidden)).find(obj, depth=0)


_COURSE_DIR = str(Path(__file__).resolve().parent.parent / "gpulab") + os.sep


def _code_file(fn) -> str:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code.co_filename if code is not None else ""


def _label(x, code_file: str = "") -> str:
    """``module.Name``; for course code under another module name, where its code really lives."""
    name = f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__name__)}"
    if code_file and not name.startswith("gpulab."):
        name += f" (course code from gpulab/{Path(code_file).name})"
    return name


class _Borrowed:
    """One search of :func:`borrowed`: ``seen`` keeps cycles and shared objects from costing twice."""

    MAX_DEPTH = 4

    def __init__(self, forbidden: tuple) -> None:
        self.forbidden = forbidden
        self.names = {getattr(f, "__name__", "") for f in forbidden} - {""}
        self.seen: set[int] = set()

    def origin(self, x, course: bool) -> str | None:
        """``x`` itself is ``forbidden`` or, when ``course``, course code (a class, function, or method).
        Only the answer itself is held to "no course code": what it uses may include course helpers
        (``gpulab.compare``, a lab's models), except the ``forbidden`` ones."""
        if any(x is f for f in self.forbidden):
            return _label(x)
        if isinstance(x, type):
            for c in x.__mro__:
                if any(c is f for f in self.forbidden):
                    return _label(c)
                if course and str(getattr(c, "__module__", "")).split(".")[0] == "gpulab":
                    return _label(c)
                files = [_code_file(m) for m in vars(c).values() if callable(m)]
                course_files = [f for f in files if f.startswith(_COURSE_DIR)]
                if course and course_files:
                    return _label(c, course_files[0])
            return None
        if course and callable(x) and _code_file(x).startswith(_COURSE_DIR):
            return _label(x, _code_file(x))
        return None

    def find(self, x, depth: int) -> str | None:
        if depth > self.MAX_DEPTH or id(x) in self.seen or x is None or isinstance(x, (str, bytes, int, float)):
            return None
        self.seen.add(id(x))
        found = self.origin(x, course=depth == 0) if (isinstance(x, type) or callable(x)) else None
        if found:
            return found
        if isinstance(x, functools.partial):
            # a partial is the function it wraps: held to the same rule as the answer itself
            return self.find(x.func, depth) or self._each(list(x.args) + list(x.keywords.values()), depth)
        if isinstance(x, (list, tuple, set, frozenset)):
            return self._each(list(x), depth)
        if isinstance(x, dict):
            return self._each(list(x.values()), depth)
        if isinstance(x, type):
            return self._each([m for m in vars(x).values()], depth)
        fn = getattr(x, "__func__", x)
        if hasattr(fn, "__code__"):
            return self._in_function(fn, depth)
        if isinstance(x, types.ModuleType) or isinstance(x, torch.Tensor):
            return None
        kind = self.origin(type(x), course=depth == 0)
        if kind:
            return f"an instance of {kind}"
        attrs = getattr(x, "__dict__", None)
        return self._each([type(x)] + (list(attrs.values()) if isinstance(attrs, dict) else []), depth)

    def _each(self, values: list, depth: int) -> str | None:
        for v in values:
            found = self.find(getattr(v, "__func__", v) if isinstance(v, (staticmethod, classmethod)) else v, depth + 1)
            if found:
                return found
        return None

    def _in_function(self, fn, depth: int) -> str | None:
        """A learner function: the names its code uses, resolved in its globals; its closure and defaults."""
        code, names = fn.__code__, set()
        stack = [code]
        while stack:
            c = stack.pop()
            names |= set(c.co_names)
            stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        named = sorted(names & self.names)
        if named:
            return f"code that calls {named[0]}"
        g = getattr(fn, "__globals__", {})
        values = [g[n] for n in sorted(names) if n in g and not isinstance(g[n], types.ModuleType)]
        values += [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
        values += list(getattr(fn, "__defaults__", None) or ())
        values += list((getattr(fn, "__kwdefaults__", None) or {}).values())
        return self._each(values, depth)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell: the variable is not assigned yet
        return False
    return True


def to_cpu(x):
    """Observations travel as CPU tensors and plain values."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu")
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def changed_inputs(case: Case, after: dict) -> str | None:
    """A message if any input tensor differs after the learner's call (inputs must not be mutated)."""
    for name, before in case.inputs.items():
        if isinstance(before, torch.Tensor) and name in after:
            a = after[name]
            if not isinstance(a, torch.Tensor) or a.shape != before.shape or not torch.equal(
                    torch.nan_to_num(a.to(before.dtype)), torch.nan_to_num(before)):
                return f"the input `{name}` was modified; a kernel must not write to its inputs."
    return None
