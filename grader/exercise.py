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

import traceback
from dataclasses import dataclass, field
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

    def as_dict(self) -> dict:
        return {"id": self.id, "points": self.points, "score": self.score,
                "status": self.status, "message": self.message}


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
    """Run and judge every case in this process (the inline check's path)."""
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


def borrowed(obj) -> str | None:
    """``module.Name`` when the learner's class (or one it derives from) or function comes from
    ``gpulab``: the course's helpers include modelling copies of some answers (lab 16 models lab 14's
    scheduler), and handing one in is not writing the exercise."""
    classes = obj.__mro__ if isinstance(obj, type) else (obj,)
    for c in classes:
        if getattr(c, "__module__", "").split(".")[0] == "gpulab":
            return f"{c.__module__}.{getattr(c, '__qualname__', c)}"
    return None


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
