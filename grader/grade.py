"""``python -m grader grade``: grade one submission, trusting nothing it contains but its answers.

1. Read the submission; find the lab (``--lab`` or the answer cells' exercise ids); anything
   unreadable or of another lab is ``invalid``, with a message.
2. Take only the answer cells (by exercise id, else by the lab's cell id; the last copy wins, as it
   would when a notebook runs top to bottom) and splice them into the solution's locked cells.
   Tags and metadata of the submission are ignored.
3. Generate hidden cases from a secret per-run seed, here in the judge.
4. Run the answers in child processes (``grader.worker``) with a timeout per exercise; a crash or a
   hang costs only the exercise it happened in, and a fresh worker carries on with the rest (without
   re-running the answer cells of finished exercises, unless a remaining one uses what they define).
   Python's, NumPy's and torch's random generators are seeded per exercise from the run's seed, so
   one seed gives one grade, whatever the answers draw.
5. Judge the observations here, and write ``result.json``, ``feedback.md`` and ``junit.xml``.

The judge has limits too: one wall-clock deadline per submission (workers and notebook run
together), a budget for the bytes of observations that come back (spooled to a temporary file, never
held twice), and a byte and CPU budget for draining each worker's pipes.
"""
from __future__ import annotations

import ast
import functools
import hashlib
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
from grader.advice import advise
from grader.checks import exercises, lab_stems
from grader.exercise import Case, ExerciseResult, gpu_skips, judge_case, skip_records, skipped_result, summarize
from grader.notebooks import InvalidNotebook, answer_cells, exercise_id, export_source, read_notebook
from grader.report import write_reports
from grader.runs import PACKAGE as RUNS_PACKAGE
from grader.worker import CHANNEL_FD, HEADER

DEFAULT_TIMEOUT = 60.0   # seconds per exercise (its answer cell plus all its cases)
DEFAULT_DEADLINE = 1200.0  # seconds per submission, all workers and the notebook run together
# Importing torch and triton, and the locked setup cells: the course's own code, never the learner's, so the
# allowance is generous (a busy two-core machine took over 30 s; the per-submission deadline still bounds it).
STARTUP_ALLOWANCE = 120.0
LOG_CAP = 32 * 1024       # bytes of a worker's own stdout/stderr kept for grader.log
LOG_DRAIN = 16 << 20      # bytes of a worker's stdout/stderr read at all; then the judge closes the pipe
CHATTER_CAP = 16 << 20    # bytes of frames per worker besides accepted observations (an honest one: < 1 MiB)
FRAME_COST = 256          # the least a frame counts against CHATTER_CAP (a flood of empty frames is a flood)
SPOOL_FROM = 1 << 20      # observation frames from this size on go to a temporary file, smaller ones stay in memory
DRAIN_CPU_S = 20.0        # CPU seconds the judge spends reading one worker's pipes
OBSERVATION_BUDGET = 128 << 20  # bytes of observations one submission may send back, all exercises together
FRAME_CAP = {b"M": 256, b"T": 256 * 1024, b"O": 1 << 40}  # the largest frame of each kind (O: see the budget)
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

    how: str = "exited"                  # exited | timeout | tampered | flood | deadline
    marker: str = ""                     # the last accepted progress marker
    observations: dict = field(default_factory=dict)   # {eid: temporary file at the torch.save bytes}
    refused: dict = field(default_factory=dict)         # {eid: bytes of observations over the budget}
    output: list = field(default_factory=list)          # learner print() output
    log: bytearray = field(default_factory=bytearray)   # the process's own stdout/stderr, tail kept


@dataclass
class Budget:
    """What is left of one submission's :data:`OBSERVATION_BUDGET`, shared by its workers."""

    left: int


class _Window(io.RawIOBase):
    """The bytes of ``file`` from ``start`` on, as a file of their own (what ``torch.load`` reads)."""

    def __init__(self, file, start: int) -> None:
        super().__init__()
        self.file, self.start = file, start
        file.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self.file.readinto(buf)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            offset += self.start
        return self.file.seek(offset, whence) - self.start

    def tell(self) -> int:
        return self.file.tell() - self.start

    def close(self) -> None:
        self.file.close()
        super().close()


class _Refused(Exception):
    """The channel broke a rule; ``how`` is ``tampered`` (a malformed frame) or ``flood``."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


class _Frames:
    """Splits the worker's channel into frames ``(kind, payload, size)``, holding at most one small
    frame in memory.

    A large observation frame's payload goes to a temporary file as it arrives (``payload`` is that
    file); one larger than what is left of the submission's budget is skipped as it arrives
    (``payload`` is ``None``), so a 10 GiB answer costs the judge no memory. Every frame counts against
    :data:`CHATTER_CAP` (at least :data:`FRAME_COST` bytes; an observation's payload only once it is
    refused, :meth:`refuse`); anything outside :data:`FRAME_CAP` is refused.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget, self.head, self.chatter = budget, bytearray(), 0
        self.kind, self.size, self.left, self.sink = None, 0, 0, None

    def feed(self, data: bytes) -> list:
        frames, pos, view = [], 0, memoryview(data)
        while pos < len(view):
            if self.kind is None:
                need = HEADER.size - len(self.head)
                self.head += view[pos:pos + need]
                pos += need
                if len(self.head) < HEADER.size:
                    break
                self._start(*HEADER.unpack(self.head))
                self.head.clear()
            take = min(self.left, len(view) - pos)
            if isinstance(self.sink, bytearray):
                self.sink += view[pos:pos + take]
            elif self.sink is not None:
                self.sink.write(view[pos:pos + take])  # a temporary file
            pos += take
            self.left -= take
            if self.left == 0:
                frames.append((self.kind, self.sink, self.size))
                self.kind, self.sink = None, None
        return frames

    def _start(self, kind: bytes, size: int) -> None:
        if kind not in FRAME_CAP or size > FRAME_CAP[kind]:
            raise _Refused("tampered")
        self.refuse(HEADER.size + max(FRAME_COST, 0 if kind == b"O" else size))
        if kind == b"O" and size > self.budget.left:
            self.sink = None
        elif kind == b"O" and size >= SPOOL_FROM:
            self.sink = tempfile.TemporaryFile(prefix="gpulab-obs-")
        else:
            self.sink = bytearray()
        self.kind, self.size, self.left = kind, size, size

    def refuse(self, size: int) -> None:
        """Count ``size`` bytes the judge read for nothing; too many is a flood."""
        self.chatter += size
        if self.chatter > CHATTER_CAP:
            raise _Refused("flood")

    def close(self) -> None:
        if self.kind == b"O" and not isinstance(self.sink, (bytearray, type(None))):
            self.sink.close()


def _send_job(proc, job: bytes) -> None:
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the worker died before reading its job: the judge reports it


def _run_worker(job: bytes, plan: list[str], runs: list[str], device: str, timeout_s: float,
                work: Path, nonce: str, until: float, budget: Budget) -> WorkerRun:
    """Run one worker until it finishes, dies, or runs out of time; trust nothing it sends.

    ``plan`` is the markers the worker must send, in order; a marker out of order is ignored and an
    observation counts only for the exercise that is running, once. The clock restarts at each
    accepted marker (the locked setup gets :data:`STARTUP_ALLOWANCE`, each step ``timeout_s``), and
    an absolute deadline bounds the whole worker whatever it sends; ``until`` (``time.monotonic()``)
    is the submission's deadline. Observations count against ``budget``.
    """
    deadline_s = min(STARTUP_ALLOWANCE + timeout_s * (len(plan) + 1), max(0.0, until - time.monotonic()))
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
    frames, expected = _Frames(budget), iter(plan + ["done"])
    want, running = next(expected), None
    started = since = time.monotonic()
    cpu_start, log_read = time.thread_time(), 0
    sel = selectors.DefaultSelector()
    os.set_blocking(read_fd, False)
    os.set_blocking(proc.stdout.fileno(), False)
    sel.register(read_fd, selectors.EVENT_READ, "channel")
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "log")

    prefix = nonce.encode() + b" "

    def take(received) -> None:
        nonlocal want, running, since
        for kind, payload, size in received:
            if kind == b"O":
                observe(payload, size)
                continue
            if not payload.startswith(prefix):
                continue  # not from the harness of this worker
            payload = payload[len(prefix):]
            if kind == b"M" and payload.decode("utf-8", "replace") == want:
                run.marker, since = want, time.monotonic()
                running = want[4:] if want.startswith("run ") else None
                want = next(expected, None)
            elif kind == b"T" and running and sum(map(len, run.output)) < OUTPUT_CAP:
                run.output.append(payload.decode("utf-8", "replace"))

    def observe(spool, size: int) -> None:
        """Keep the running exercise's observations (once), counted against the budget."""
        if spool is None:  # larger than what is left of the budget: skipped as it arrived
            if running and running not in run.observations:
                run.refused.setdefault(running, size)
            return
        spool = io.BytesIO(spool) if isinstance(spool, bytearray) else spool
        spool.seek(0)
        tag = prefix + (running or "").encode() + b"\0"
        if running and running not in run.observations and running not in run.refused \
                and spool.read(len(tag)) == tag:
            run.observations[running] = _Window(spool, len(tag))
            budget.left -= size
        else:
            spool.close()
            frames.refuse(size)

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
                    log_read += len(data)
                    if log_read > LOG_DRAIN:  # stop reading: its further writes fail in the box
                        sel.unregister(key.fd)
                        proc.stdout.close()
                        run.log += f"\n[grader: over {LOG_DRAIN >> 20} MiB of output; the rest was not read]".encode()
                else:
                    try:
                        take(frames.feed(data))
                    except _Refused as exc:
                        run.how = exc.how
                        break
            if run.how != "exited":
                break
            if time.thread_time() - cpu_start > DRAIN_CPU_S:
                run.how = "flood"
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
                run.how = "deadline" if now >= until else "timeout"
                break
    finally:
        sel.close()
        os.close(read_fd)
        frames.close()
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


def _decode(spool):
    """The observations of one exercise (a file at their ``torch.save`` bytes), or a ValueError when
    they are not plain, modest values."""
    import torch

    outcomes = torch.load(spool, weights_only=True)
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


def exercise_seed(seed: int, name: str) -> int:
    """The seed of Python's, NumPy's and torch's generators while exercise ``name`` runs (``"setup"``:
    the locked setup), from the run's ``seed``. A hash: the worker sees this seed, never the run's,
    which also draws the hidden cases."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:4], "big") & 0x7FFF_FFFF


def _names(source: str) -> tuple[set, set] | None:
    """``(names the cell binds at module level, names it mentions anywhere)``; ``None`` when it may bind
    names no parser can see (``from m import *``). A cell that does not parse binds nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set(), set()
    bound, mentioned = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            mentioned.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            mentioned.add(node.value)  # globals()["name"]
        elif isinstance(node, ast.Global):
            bound.update(node.names)
        elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None

    def module_level(node) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(child.name)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in child.names)
            elif isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
                bound.add(child.id)
            elif not isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                module_level(child)
    module_level(tree)
    return bound, mentioned


def cells_to_run(order: list[str], answers: dict[str, str], remaining: list[str], skip: set) -> list[str]:
    """The answer cells a fresh worker for ``remaining`` executes, in the lab's order: those of the
    remaining exercises, and of finished ones only where a cell it runs uses a name they bind (a
    helper, an import, a constant), so a finished exercise's slow cell is not paid for again."""
    candidates = [e for e in order if e in answers and e not in skip]
    info = {e: _names(answers[e]) for e in candidates}
    needed = {e for e in candidates if e in remaining or info[e] is None}
    while True:
        bound = set().union(*(info[e][0] for e in needed if info[e]))
        wanted = set().union(*(info[e][1] for e in needed if info[e])) - bound
        more = {e for e in candidates if e not in needed and info[e][0] & wanted}
        if not more:
            return [e for e in candidates if e in needed]
        needed |= more


def run_answers(stem: str, setup_source: str, answers: dict[str, str], cases: dict[str, list[Case]],
                device: str, timeout_s: float, work: Path, seed: int = 0,
                until: float | None = None) -> tuple[dict, dict, str, str]:
    """Run every exercise in sandboxed workers, until ``until`` (``time.monotonic()``) at the latest.

    Returns ``({eid: outcomes}, {eid: (status, message)}, learner output, worker log)``.

    Determinism: an exercise is blamed for a crash or a hang only when it was the first to run in
    its worker (after the setup and the answer cells). When a worker dies later, in exercise E, a
    fresh worker starts again at E, so an earlier exercise's damage (heap corruption shows up
    later) never costs E its points, and grading the same notebook twice gives the same statuses.
    Each answer cell and each exercise's cases start from generators seeded by :func:`exercise_seed`,
    so answers that draw random numbers grade the same in any worker.
    """
    order = list(exercises(stem))
    lab = exercises(stem)
    until = time.monotonic() + DEFAULT_DEADLINE if until is None else until
    allowed = max(0.0, until - time.monotonic())
    runnable = {eid: run_reference(ex) for eid, ex in lab.items()}
    seeds = {name: exercise_seed(seed, name) for name in ["setup", *order]}
    budget = Budget(OBSERVATION_BUDGET)
    done: dict[str, list] = {}
    fatal: dict[str, tuple[str, str]] = {}  # eid -> (status, message)
    no_exec: set[str] = set()               # answer cells that crash or hang when executed
    retried: set[str] = set()               # exercises already given a fresh worker of their own
    output, log = [], []
    for attempt in range(1, 2 * len(order) + 2):
        remaining = [e for e in order if e in cases and e not in done and e not in fatal]
        if not remaining:
            break
        if time.monotonic() >= until:
            fatal.update({e: _out_of_time(allowed) for e in remaining})
            break
        cells = [(e, answers[e]) for e in cells_to_run(order, answers, remaining, no_exec)]
        plan = ["setup"] + [f"exec {e}" for e, _ in cells] + [f"run {e}" for e in remaining]
        nonce = secrets.token_hex(8)
        job = pickle.dumps({"lab": stem, "nonce": nonce, "device": device, "setup_source": setup_source,
                            "cells": cells, "run": remaining, "runs": {e: runnable[e] for e in remaining},
                            "cases": {e: cases[e] for e in remaining}, "seeds": seeds})
        run = _run_worker(job, plan, remaining, device, timeout_s, work, nonce, until, budget)
        output += run.output
        log.append(f"--- worker {attempt}: {run.how} at {run.marker or 'start'!r} ---\n"
                   + run.log.decode("utf-8", "replace"))
        for eid, spool in run.observations.items():
            try:
                done[eid] = _decode(spool)
            except Exception as exc:
                fatal[eid] = ("error", "the answer returned something that is not plain numbers, strings "
                                       f"or tensors, or far too much of it ({type(exc).__name__}: "
                                       f"{str(exc)[:80]}); return the documented types.")
            finally:
                spool.close()
        for eid, size in run.refused.items():
            fatal[eid] = ("error", f"the answer returned {size / 2**20:.0f} MiB of results, more than the "
                                   f"{OBSERVATION_BUDGET >> 20} MiB a whole submission may send back "
                                   f"({budget.left / 2**20:.0f} MiB were left); return only what the "
                                   "exercise asks for (the documented results are far smaller).")
        if run.marker == "done" or all(e in done or e in fatal for e in remaining):
            break
        if run.how == "deadline":
            fatal.update({e: _out_of_time(allowed) for e in remaining if e not in done and e not in fatal})
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


def _out_of_time(allowed: float) -> tuple[str, str]:
    return "timeout", (f"grading of this submission stopped at its deadline ({allowed:.0f} s for all exercises "
                       "together) before this exercise finished; make the answers (and their cells) faster.")


def _failure(how: str, timeout_s: float) -> tuple[str, str]:
    if how == "timeout":
        return "timeout", (f"did not finish within {timeout_s:g} s (an infinite loop, or far too slow); "
                           "the run was stopped.")
    if how == "tampered":
        return "crashed", "the answer wrote into the grader's channel; the run was stopped."
    if how == "flood":
        return "crashed", ("the answer flooded the grader with output or channel frames; the run was stopped. "
                           "Print less (a few lines per call).")
    return "crashed", ("the process ended while running this exercise (sys.exit, os._exit, a segfault, "
                       "a write far outside an array, or running out of memory).")


def _preload_notebook_modules() -> None:
    """Import what the notebook run needs now, before any learner code has run anywhere."""
    for name in ("nbformat", "papermill"):
        try:
            __import__(name)
        except ImportError:
            pass  # no Jupyter on this machine: the notebook run reports "skipped"


def _notebook_timeout(solution, timeout_s: float, left_s: float) -> float | None:
    """The per-cell timeout that keeps the notebook run (whose budget is ``60 + timeout * cells / 4``
    seconds, :func:`grader.rebuild.run_rebuilt`) within ``left_s``; ``None`` when even 1 s does not fit."""
    cells = max(1, sum(1 for c in solution.cells if c.get("cell_type") == "code"))
    fits = (left_s - 60) * 4 / cells
    return min(timeout_s, fits) if fits >= 1 else None


def grade(path, lab: str | None = None, device: str = "cpu", seed: int | None = None,
          timeout_s: float = DEFAULT_TIMEOUT, notebook_run: bool = True, log_path=None,
          deadline_s: float = DEFAULT_DEADLINE) -> dict:
    """Grade one submission and return the ``result.json`` dict (schema 1). Never raises for bad input.

    ``deadline_s`` bounds the whole grade (every worker, then the notebook run, which is skipped
    when too little is left); ``result.json`` records it and the ``seed`` (a regrade with that seed
    gives the same exercises list). ``log_path``, when given, receives the workers' own output
    (``grader.log``): what a crash printed.
    """
    start = time.perf_counter()
    until = time.monotonic() + deadline_s
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
    skips = gpu_skips(lab_exercises, device)  # {eid: why}: this GPU lacks what they need (never run)
    solution = read_notebook(solution_path(stem))
    answers = pick_answers(submission, solution, list(lab_exercises))
    setup_source = export_source(solution, {}, parameters={"DEVICE": device, "SEED": 0})
    seed = secrets.randbits(31) if seed is None else seed
    cases = {eid: ex.cases(seed=seed, public=True) + ex.cases(seed=seed, public=False)
             for eid, ex in lab_exercises.items() if eid not in skips}
    sandbox.warn_if_weak()
    _preload_notebook_modules()
    with tempfile.TemporaryDirectory(prefix="gpulab-grade-") as tmp:
        done, fatal, output, log = run_answers(stem, setup_source, answers, cases, device, timeout_s, Path(tmp),
                                               seed=seed, until=until)
    results: list[ExerciseResult] = []
    for eid, ex in lab_exercises.items():
        if eid in skips:
            results.append(skipped_result(ex, skips[eid]))
        elif eid not in answers:
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
              "max_score": float(sum(r.points for r in results)),  # a skipped exercise counts 0
              "duration_s": None, "exercises": [r.as_dict() for r in results],
              "seed": seed, "deadline_s": deadline_s, "timeout_s": timeout_s,
              "learner_output": output[-4000:],
              **({"skipped_for_capability": skip_records(lab_exercises, skips, device)} if skips else {}),
              "isolation": {**sandbox.isolation(), "limits": {**sandbox.limits_summary(device),
                                                              "observation_bytes": OBSERVATION_BUDGET}}}
    advise(result, stem, solution, answers)  # titles, hints, where each cell is, cascades named once
    logs = [log]
    if notebook_run:
        cell_timeout = _notebook_timeout(solution, timeout_s, until - time.monotonic())
        result["notebook_run"] = (
            grader.rebuild.run_rebuilt(solution, answers, device, cell_timeout, log=logs) if cell_timeout else
            {"status": "skipped", "error": f"the submission's deadline ({deadline_s:g} s) left no time to run "
                                           "the notebook top to bottom."})
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
