"""``python -m grader grade``: grade one submission, trusting nothing it contains but its answers.

1. Read the submission; find the lab (``--lab`` or the answer cells' exercise ids); anything
   unreadable or of another lab is ``invalid``, with a message.
2. Take only the answer cells (by exercise id, else by the lab's cell id; the last copy wins, as it
   would when a notebook runs top to bottom) and splice them into the solution's locked cells.
   Tags and metadata of the submission are ignored.
3. Generate hidden cases from a secret per-run seed, here in the judge.
4. Run the answers in child processes (``grader.worker``) with a timeout per exercise; a crash or a
   hang costs only the exercise it happened in, and a fresh worker carries on with the rest.
5. Judge the observations here, and write ``result.json``, ``feedback.md`` and ``junit.xml``.
"""
from __future__ import annotations

import functools
import io
import os
import pickle
import secrets
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Everything the judge will need is imported now, before any learner code runs anywhere.
import grader.rebuild  # noqa: F401
import grader.report  # noqa: F401
from gpulab.paths import ROOT
from grader import sandbox
from grader.checks import exercises, lab_stems
from grader.exercise import Case, ExerciseResult, judge_case, summarize
from grader.notebooks import InvalidNotebook, answer_cells, exercise_id, export_source, read_notebook
from grader.report import write_reports
from grader.runs import PACKAGE as RUNS_PACKAGE
from grader.worker import CHANNEL_FD, HEADER

DEFAULT_TIMEOUT = 60.0   # seconds per exercise (its answer cell plus all its cases)
STARTUP_ALLOWANCE = 30.0  # importing torch and triton, and the locked setup cells
LOG_CAP = 32 * 1024       # bytes of a worker's own stdout/stderr kept for grader.log
FRAME_CAP = {b"M": 256, b"T": 256 * 1024, b"O": 256 << 20}  # the largest frame of each kind
OUTPUT_CAP = 256 * 1024   # characters of learner output kept per worker; further T frames are dropped
MAX_ITEMS = 200_000       # items an exercise's observations may hold, written out in full
MAX_DEPTH = 50            # nesting depth of those observations


def solution_path(stem: str) -> Path:
    return ROOT / "solutions" / f"{stem}.ipynb"


def pick_answers(submission, solution, lab_ids: list[str]) -> dict[str, str]:
    """``{exercise_id: source}`` from the submission: by exercise id, else by the lab's cell id."""
    by_cell_id = {c.get("id"): exercise_id(c) for c in solution.cells if exercise_id(c)}
    answers: dict[str, str] = {}
    for cell in submission.cells:
        if cell.get("cell_type") != "code":
            continue
        eid = exercise_id(cell) or by_cell_id.get(cell.get("id"))
        if eid in lab_ids:
            answers[eid] = cell.get("source", "")  # a later copy replaces an earlier one
    return answers


def identify_lab(submission, requested: str | None) -> tuple[str | None, str]:
    """``(stem, "")`` for the submission's lab, or ``(None, reason)`` when it is not gradable."""
    ids = set(answer_cells(submission))
    owners = {stem: len(ids & set(exercises(stem))) for stem in lab_stems()}
    best = max(owners, key=owners.get) if owners else None
    if requested is not None:
        if requested not in lab_stems():
            return None, f"unknown lab {requested!r}; labs: {', '.join(lab_stems())}."
        if owners.get(requested, 0) == 0 and best and owners[best] > 0:
            return None, (f"this notebook holds the exercises of lab {best}, not {requested}: "
                          f"submit labs/{requested}.ipynb.")
        return requested, ""
    if not best or owners[best] == 0:
        return None, "no exercise cells found: this is not a GPU Systems Lab notebook (pass --lab if it is)."
    return best, ""


@dataclass
class WorkerRun:
    """What one worker sent back before it finished, died or ran out of time."""

    how: str = "exited"                  # exited | timeout | tampered
    marker: str = ""                     # the last accepted progress marker
    observations: dict = field(default_factory=dict)   # {eid: torch.save bytes}
    output: list = field(default_factory=list)          # learner print() output
    log: bytearray = field(default_factory=bytearray)   # the process's own stdout/stderr, tail kept


class _Frames:
    """Splits the worker's channel into frames, refusing anything outside :data:`FRAME_CAP`."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes):
        self.buf += data
        frames = []
        while len(self.buf) >= HEADER.size:
            kind, size = HEADER.unpack_from(self.buf)
            if kind not in FRAME_CAP or size > FRAME_CAP[kind]:
                raise ValueError(f"malformed frame {kind!r} of {size} bytes")
            if len(self.buf) < HEADER.size + size:
                break
            frames.append((kind, bytes(self.buf[HEADER.size:HEADER.size + size])))
            del self.buf[:HEADER.size + size]
        return frames


def _send_job(proc, job: bytes) -> None:
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the worker died before reading its job: the judge reports it


def _run_worker(job: bytes, plan: list[str], runs: list[str], device: str, timeout_s: float,
                work: Path, nonce: str) -> WorkerRun:
    """Run one worker until it finishes, dies, or runs out of time; trust nothing it sends.

    ``plan`` is the markers the worker must send, in order; a marker out of order is ignored and an
    observation counts only for the exercise that is running, once. The clock restarts at each
    accepted marker (the locked setup gets :data:`STARTUP_ALLOWANCE`, each step ``timeout_s``), and
    an absolute deadline bounds the whole worker whatever it sends.
    """
    deadline_s = STARTUP_ALLOWANCE + timeout_s * (len(plan) + 1)
    argv = [sys.executable, "-m", "grader.worker"]
    launch = sandbox.wrap(argv, device=device, cpu_seconds=deadline_s, cwd_outside=work)
    limits = launch.preexec
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)
    run = WorkerRun()

    def plumbing():  # in the child, before exec: the channel at CHANNEL_FD, then the limits
        os.dup2(write_fd, CHANNEL_FD)
        limits()

    try:
        proc = subprocess.Popen(launch.command, cwd=launch.cwd, env=launch.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(write_fd, CHANNEL_FD), preexec_fn=plumbing,
                                start_new_session=True)
    finally:
        os.close(write_fd)
    threading.Thread(target=_send_job, args=(proc, job), daemon=True).start()
    frames, expected = _Frames(), iter(plan + ["done"])
    want, running = next(expected), None
    started = since = time.monotonic()
    sel = selectors.DefaultSelector()
    os.set_blocking(read_fd, False)
    os.set_blocking(proc.stdout.fileno(), False)
    sel.register(read_fd, selectors.EVENT_READ, "channel")
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "log")

    prefix = nonce.encode() + b" "

    def take(received) -> None:
        nonlocal want, running, since
        for kind, payload in received:
            if not payload.startswith(prefix):
                continue  # not from the harness of this worker
            payload = payload[len(prefix):]
            if kind == b"M" and payload.decode("utf-8", "replace") == want:
                run.marker, since = want, time.monotonic()
                running = want[4:] if want.startswith("run ") else None
                want = next(expected, None)
            elif kind == b"O" and running and payload.startswith(running.encode() + b"\0"):
                run.observations.setdefault(running, payload[len(running) + 1:])
            elif kind == b"T" and running and sum(map(len, run.output)) < OUTPUT_CAP:
                run.output.append(payload.decode("utf-8", "replace"))

    def finished() -> bool:
        return run.how == "tampered" or run.marker == "done" or set(runs) <= set(run.observations)

    graced = False
    try:
        while sel.get_map() and not finished():
            ready = sel.select(timeout=0.1)
            for key, _ in ready:
                try:
                    data = os.read(key.fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                elif key.data == "log":
                    run.log += data
                    del run.log[:-LOG_CAP]
                else:
                    try:
                        take(frames.feed(data))
                    except ValueError:
                        run.how = "tampered"
                        break
            if finished():
                break
            if not ready and proc.poll() is not None:
                break  # exited, and everything it wrote has been read
            # The clock is read after the pipes: when this thread was starved (a busy judge in a
            # cohort), what the worker sent meanwhile counts before any verdict of "too slow".
            now = time.monotonic()
            limit = STARTUP_ALLOWANCE if run.marker in ("", "setup") else timeout_s
            if now - since > limit or now - started > deadline_s:
                if ready and not graced:  # one more look at what is waiting, once
                    graced = True
                    continue
                run.how = "timeout"
                break
    finally:
        sel.close()
        os.close(read_fd)
        sandbox.stop(proc)
        launch.cleanup()
    return run


def _expanded_size(value, memo: dict, depth: int = 0) -> int:
    """How many items ``value`` has when written out in full (a list shared twice counts twice).

    Pickle keeps shared references, so a few bytes can hold a structure whose ``repr`` would take
    hours: the judge measures first, through the memo, in time proportional to what it received.
    """
    if depth > MAX_DEPTH:
        return MAX_ITEMS + 1
    key = id(value)
    if key in memo:
        return memo[key]
    if isinstance(value, dict):
        size = 1 + sum(_expanded_size(k, memo, depth + 1) + _expanded_size(v, memo, depth + 1)
                       for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        size = 1 + sum(_expanded_size(v, memo, depth + 1) for v in value)
    elif isinstance(value, (str, bytes)):
        size = 1 + len(value) // 64
    else:
        size = 1  # numbers, tensors (their size is bounded by the frame cap), None
    memo[key] = size = min(size, MAX_ITEMS + 1)
    return size


def _decode(data: bytes):
    """The observations of one exercise, or a ValueError when they are not plain, modest values."""
    import torch

    outcomes = torch.load(io.BytesIO(data), weights_only=True)
    if _expanded_size(outcomes, {}) > MAX_ITEMS:
        raise ValueError("too large or too deeply nested")
    return outcomes


def run_reference(ex):
    """What the worker is told to call for exercise ``ex``: its run function, pickled by reference
    (module and name, never by value), so the worker imports it from ``grader/runs/`` in the box.
    Anything else (a function of the judge's modules, a closure) is refused here, before it could
    carry a reference answer into the learner's process."""
    fn = ex.run.func if isinstance(ex.run, functools.partial) else ex.run
    module = getattr(fn, "__module__", "") or ""
    if not module.startswith(RUNS_PACKAGE + ".") or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        raise RuntimeError(f"exercise {ex.id}: its run side must be a function of {RUNS_PACKAGE} "
                           f"(found {module}.{getattr(fn, '__qualname__', fn)})")
    return ex.entries, ex.run


def run_answers(stem: str, setup_source: str, answers: dict[str, str], cases: dict[str, list[Case]],
                device: str, timeout_s: float, work: Path) -> tuple[dict, dict, str, str]:
    """Run every exercise in sandboxed workers.

    Returns ``({eid: outcomes}, {eid: (status, message)}, learner output, worker log)``.

    Determinism: an exercise is blamed for a crash or a hang only when it was the first to run in
    its worker (after the setup and the answer cells). When a worker dies later, in exercise E, a
    fresh worker starts again at E, so an earlier exercise's damage (heap corruption shows up
    later) never costs E its points, and grading the same notebook twice gives the same statuses.
    """
    order = list(exercises(stem))
    lab = exercises(stem)
    runnable = {eid: run_reference(ex) for eid, ex in lab.items()}
    done: dict[str, list] = {}
    fatal: dict[str, tuple[str, str]] = {}  # eid -> (status, message)
    no_exec: set[str] = set()               # answer cells that crash or hang when executed
    retried: set[str] = set()               # exercises already given a fresh worker of their own
    output, log = [], []
    for attempt in range(1, 2 * len(order) + 2):
        remaining = [e for e in order if e not in done and e not in fatal]
        if not remaining:
            break
        cells = [(e, answers[e]) for e in order if e in answers and e not in no_exec]
        plan = ["setup"] + [f"exec {e}" for e, _ in cells] + [f"run {e}" for e in remaining]
        nonce = secrets.token_hex(8)
        job = pickle.dumps({"lab": stem, "nonce": nonce, "device": device, "setup_source": setup_source,
                            "cells": cells, "run": remaining, "runs": {e: runnable[e] for e in remaining},
                            "cases": {e: cases[e] for e in remaining}})
        run = _run_worker(job, plan, remaining, device, timeout_s, work, nonce)
        output += run.output
        log.append(f"--- worker {attempt}: {run.how} at {run.marker or 'start'!r} ---\n"
                   + run.log.decode("utf-8", "replace"))
        for eid, data in run.observations.items():
            try:
                done[eid] = _decode(data)
            except Exception as exc:
                fatal[eid] = ("error", "the answer returned something that is not plain numbers, strings "
                                       f"or tensors, or far too much of it ({type(exc).__name__}: "
                                       f"{str(exc)[:80]}); return the documented types.")
        if run.marker == "done" or all(e in done or e in fatal for e in remaining):
            break
        what = run.marker.split(" ", 1)
        culprit = what[1] if len(what) == 2 else None
        if culprit is None:  # died in the locked setup: nothing the learner wrote is to blame
            for eid in remaining:
                fatal[eid] = ("error", f"the lab's setup did not complete ({run.how}); see grader.log.")
            break
        if what[0] == "run" and culprit != remaining[0] and culprit not in retried:
            retried.add(culprit)  # not the first to run in this worker: run it again first, in a fresh one
            continue
        status, message = _failure(run.how, timeout_s)
        fatal[culprit] = (status, message if what[0] == "run" else message + " (while its answer cell ran)")
        if what[0] == "exec":
            no_exec.add(culprit)
    return done, fatal, "\n".join(output), "\n".join(log)


def _failure(how: str, timeout_s: float) -> tuple[str, str]:
    if how == "timeout":
        return "timeout", (f"did not finish within {timeout_s:g} s (an infinite loop, or far too slow); "
                           "the run was stopped.")
    if how == "tampered":
        return "crashed", "the answer wrote into the grader's channel; the run was stopped."
    return "crashed", ("the process ended while running this exercise (sys.exit, os._exit, a segfault, "
                       "a write far outside an array, or running out of memory).")


def _preload_notebook_modules() -> None:
    """Import what the notebook run needs now, before any learner code has run anywhere."""
    for name in ("nbformat", "papermill"):
        try:
            __import__(name)
        except ImportError:
            pass  # no Jupyter on this machine: the notebook run reports "skipped"


def grade(path, lab: str | None = None, device: str = "cpu", seed: int | None = None,
          timeout_s: float = DEFAULT_TIMEOUT, notebook_run: bool = True, log_path=None) -> dict:
    """Grade one submission and return the ``result.json`` dict (schema 1). Never raises for bad input.

    ``log_path``, when given, receives the workers' own output (``grader.log``): what a crash printed.
    """
    start = time.perf_counter()
    path = Path(path)
    base = {"schema": 1, "lab": lab, "submission": path.name, "device": device}
    try:
        submission = read_notebook(path)
    except InvalidNotebook as exc:
        return {**base, "status": "invalid", "message": str(exc), "score": 0.0, "max_score": 0.0,
                "duration_s": round(time.perf_counter() - start, 2), "exercises": []}
    stem, reason = identify_lab(submission, lab)
    if stem is None:
        return {**base, "status": "invalid", "message": reason, "score": 0.0, "max_score": 0.0,
                "duration_s": round(time.perf_counter() - start, 2), "exercises": []}
    lab_exercises = exercises(stem)
    solution = read_notebook(solution_path(stem))
    answers = pick_answers(submission, solution, list(lab_exercises))
    setup_source = export_source(solution, {}, parameters={"DEVICE": device, "SEED": 0})
    seed = secrets.randbits(31) if seed is None else seed
    cases = {eid: ex.cases(seed=seed, public=True) + ex.cases(seed=seed, public=False)
             for eid, ex in lab_exercises.items()}
    sandbox.warn_if_weak()
    _preload_notebook_modules()
    with tempfile.TemporaryDirectory(prefix="gpulab-grade-") as tmp:
        done, fatal, output, log = run_answers(stem, setup_source, answers, cases, device, timeout_s, Path(tmp))
    results: list[ExerciseResult] = []
    for eid, ex in lab_exercises.items():
        if eid not in answers:
            results.append(ExerciseResult(eid, ex.points, 0.0, "not_attempted",
                                          "no answer cell for this exercise in the submission."))
        elif eid in fatal:
            status, message = fatal[eid]
            results.append(ExerciseResult(eid, ex.points, 0.0, status, message))
        else:
            outcomes = done.get(eid, [])
            if (not isinstance(outcomes, list) or len(outcomes) != len(cases[eid])
                    or not all(isinstance(o, dict) for o in outcomes)):
                results.append(ExerciseResult(eid, ex.points, 0.0, "error", "incomplete results from the run."))
                continue
            results.append(summarize(ex, [judge_case(ex, c, o) for c, o in zip(cases[eid], outcomes)]))
    result = {**base, "lab": stem, "status": "graded",
              "score": round(sum(r.score for r in results), 4),
              "max_score": float(sum(ex.points for ex in lab_exercises.values())),
              "duration_s": None, "exercises": [r.as_dict() for r in results],
              "learner_output": output[-4000:],
              "isolation": {**sandbox.isolation(), "limits": sandbox.limits_summary(device)}}
    logs = [log]
    if notebook_run:
        result["notebook_run"] = grader.rebuild.run_rebuilt(solution, answers, device, timeout_s, log=logs)
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text("\n".join(logs), encoding="utf-8", errors="replace")
    result["duration_s"] = round(time.perf_counter() - start, 2)
    return result


def grade_to_dir(path, out_dir, **kwargs) -> dict:
    """:func:`grade`, then write ``result.json``, ``feedback.md`` and ``junit.xml`` into ``out_dir``."""
    result = grade(path, log_path=Path(out_dir) / "grader.log", **kwargs)
    write_reports(result, Path(out_dir))
    return result
