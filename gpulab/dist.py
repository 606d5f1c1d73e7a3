"""Launching N ranks from a notebook cell or a script (lessons 11 to 13).

``launch(fn, world_size)`` runs ``fn(rank, world_size, *args)`` in ``world_size`` fresh Python
processes joined by ``torch.distributed`` and returns the results in rank order:

- gloo between CPU processes; NCCL when there are at least ``world_size`` GPUs (one rank per GPU);
  inside a rank, :func:`rank_device` says where its tensors belong (its GPU under NCCL, else the CPU),
  and :func:`demo_world` sizes a demonstration to the GPUs there are (Kaggle's two T4s: 2 NCCL ranks);
- the function is shipped *by value* with cloudpickle, so code defined in a notebook cell works
  (``torch.multiprocessing.spawn`` cannot pickle it);
- the ranks meet through a store on a port the OS picks, so parallel launches (tests, cohorts) never collide;
- a timeout on the process group and a watchdog: a rank that raises ends the launch at once with
  its traceback; a hung rank ends it after ``timeout_s`` with a message naming the rank.

Use plain ``send``/``recv``/``isend``/``irecv`` with gloo: its ``batch_isend_irecv`` can hang.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpulab import forkserver
from gpulab.paths import ROOT  # noqa: E402


class RankFailure(RuntimeError):
    """A launch that did not finish. The message is prose for people; checks read the fields.

    ``kind`` says what happened, without parsing the message:

    - ``"error"``: a rank raised; ``exc_type``/``exc_message`` name its exception;
    - ``"not_implemented"``: that exception was ``NotImplementedError`` (an unfinished exercise);
    - ``"peer_gone"``: a rank failed because a peer left while it waited (one side of a deadlock);
    - ``"timeout"``: a rank timed out waiting, or did not finish in time (a hang).

    ``rank`` is the rank whose failure explains the others (``None`` when several hung), and
    ``report`` its traceback or output.
    """

    def __init__(self, message: str, kind: str, rank: int | None = None, report: str = "",
                 exc_type: str = "", exc_message: str = ""):
        super().__init__(message)
        self.kind, self.rank, self.report = kind, rank, report
        self.exc_type, self.exc_message = exc_type, exc_message

    @property
    def hung(self) -> bool:
        """A deadlock: a rank timed out, or its peer left while it waited."""
        return self.kind in ("timeout", "peer_gone")


class RankError(RankFailure):
    """A rank raised an exception; the message holds that rank's traceback."""


class RankTimeout(RankFailure):
    """A rank did not finish in time (a hang: a missing send, a collective only some ranks call)."""


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(world_size: int, device: str | None = None) -> str:
    """``"nccl"`` when the run uses CUDA and has a GPU per rank, else ``"gloo"``."""
    import torch

    from gpulab.device import current_device

    device = device or current_device()
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() >= world_size \
            and torch.distributed.is_nccl_available():
        return "nccl"
    return "gloo"


def demo_world(preferred: int, device: str | None = None) -> int:
    """How many ranks a demonstration launches here (lessons and labs 11 to 13).

    With ``device == "cuda"`` and at least two GPUs visible: one rank per GPU, at most ``preferred``,
    so :func:`launch` picks NCCL (Kaggle's two T4s run 2 ranks; an 8-GPU node runs ``preferred``).
    Otherwise ``preferred`` CPU processes over gloo (one GPU cannot all-reduce with anyone, and NCCL
    refuses two ranks on one GPU). Formulas in the cells use the returned size, so they hold either way.
    """
    import torch

    from gpulab.device import current_device

    device = device or current_device()
    gpus = torch.cuda.device_count() if device == "cuda" and torch.cuda.is_available() else 0
    if gpus >= 2 and torch.distributed.is_nccl_available():
        return max(1, min(preferred, gpus))
    return preferred


def rank_device(group=None):
    """Inside a rank of :func:`launch`: the ``torch.device`` its tensors must live on (lessons 11 to 13).

    Under NCCL, this rank's own GPU (``launch`` gives rank ``r`` GPU ``r``): NCCL moves GPU memory
    only, and a CPU tensor in a collective fails. Under gloo, the CPU. Build a rank's tensors with
    ``device=rank_device()``, move models and inputs with ``.to(rank_device())``, and make every
    other tensor ``like`` one of those (``torch.empty_like``, ``device=x.device``), so one function
    runs on both backends. ``group``: a layer that talks over a process group of its own asks
    about that group's backend (lab 12's tensor-parallel layers: ``rank_device(process_group)``).
    """
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def backend_note(world_size: int, device: str | None = None, backend: str | None = None) -> str:
    """One line for a lesson's output: which backend ``launch`` uses for ``world_size`` ranks here, and why
    (lessons 11 to 13). ``backend``: the one a cell forced, if any."""
    import torch

    from gpulab.device import current_device

    device = device or current_device()
    chosen = backend or pick_backend(world_size, device)
    gpus = torch.cuda.device_count() if device == "cuda" and torch.cuda.is_available() else 0
    if chosen == "nccl":
        return f"backend nccl: {world_size} ranks, one per GPU ({gpus} visible)."
    if backend:
        why = "this cell asks for gloo (CPU tensors, the same result on any machine)"
    elif device != "cuda":
        why = "this run is on the CPU"
    else:
        why = f"NCCL needs one GPU per rank and {gpus} GPU{'s are' if gpus != 1 else ' is'} visible"
    return (f"backend gloo: {world_size} CPU processes; {why}. With a GPU per rank (Kaggle's two T4s for two "
            "ranks) launch picks nccl.")


def launch(fn, world_size: int = 2, *args, backend: str | None = None, timeout_s: float = 60.0,
           device: str | None = None, **kwargs) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; return their results.

    Raises :class:`RankError` with the failing rank's traceback, or :class:`RankTimeout` naming the
    ranks that did not finish within ``timeout_s`` seconds.
    """
    import cloudpickle

    if not callable(fn):
        raise TypeError(f"launch needs a function first, got {type(fn).__name__}.")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}.")
    backend = backend or pick_backend(world_size, device)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}.")
    work = Path(tempfile.mkdtemp(prefix="gpulab-launch-"))
    try:
        (work / "payload.pkl").write_bytes(cloudpickle.dumps((fn, args, kwargs)))
        # The ranks meet through a store rank 0 opens on a port the OS picks (gpulab.dist_worker): no port is
        # chosen here, so launches running at the same time never collide.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1")
        procs = [_start_rank(work, rank, world_size, backend, timeout_s, env) for rank in range(world_size)]
        _watch(procs, work, timeout_s)
        return [cloudpickle.loads((work / f"rank{r}.result").read_bytes()) for r in range(world_size)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _start_rank(work: Path, rank: int, world_size: int, backend: str, timeout_s: float, env: dict):
    """One rank running :mod:`gpulab.dist_worker`, forked from a warm server where possible (no second
    ``import torch``), else a fresh process. Either way it stays in the caller's process group: a grader
    that kills its worker's group kills the ranks too."""
    argv = ["gpulab.dist_worker", str(work), str(rank), str(world_size), backend, str(timeout_s)]
    if forkserver.available():
        try:
            return forkserver.fork_rank(argv, env, work / f"rank{rank}.log", work / f"rank{rank}.exit")
        except (OSError, ValueError):
            pass  # the server could not start or answer: a fresh process works everywhere
    with open(work / f"rank{rank}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _exception_of(work: Path, rank: int) -> tuple[str, str]:
    """``(type name, message)`` of the exception rank ``rank`` raised, as its worker recorded it."""
    try:
        exc = json.loads((work / f"rank{rank}.exc").read_text())
        return str(exc["type"]), str(exc["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return "", ""


def _first_failure(procs, work: Path) -> tuple[int, str] | None:
    """The rank whose failure explains the others, and its report, if any rank failed.

    When one rank crashes, its peers fail moments later with "connection closed" errors, and in a
    deadlock every waiting rank times out at about the same moment: so a real error is shown first,
    then a timeout, then the earliest "peer gone" echo.
    """
    failed = []
    for rank, p in enumerate(procs):
        err = work / f"rank{rank}.error"
        code = p.poll()
        if err.exists():
            failed.append((err.stat().st_mtime_ns, rank, _tail(err)))
        elif code not in (None, 0):
            failed.append((time.time_ns(), rank, _tail(work / f"rank{rank}.log") or
                           f"exit code {code} (killed by a signal, e.g. a segfault or out of memory)"))
    if not failed:
        return None

    def cause_rank(item):  # a real error explains the rest; then a timeout; "peer gone" is an echo
        text = item[2].lower()
        if any(w in text for w in _PEER_GONE_WORDS):
            return 2
        return 1 if any(w in text for w in _TIMEOUT_WORDS) else 0

    return min(failed, key=lambda item: (cause_rank(item), item[0]))[1:]


# What torch says when a rank's tensor is not where its backend (or its other operand) is.
_DEVICE_WORDS = ("no backend type associated with device type", "tensors must be cuda", "tensors must be cpu",
                 "expected all tensors to be on the same device", "is not on the expected device")


def _device_advice(report: str) -> str:
    """A next step for a tensor on the wrong device (a rank written for gloo, run over NCCL), else ``""``."""
    if not any(w in report.lower() for w in _DEVICE_WORDS):
        return ""
    return ("\n(A tensor is on the wrong device for this backend: over NCCL every tensor of a collective, and "
            "every operand of a rank's math, must be on the rank's GPU. Create tensors with "
            "device=gpulab.dist.rank_device() (or like an existing one: torch.empty_like(x), device=x.device) and "
            "move models and inputs with .to(rank_device()).)")


_TIMEOUT_WORDS = ("timed out", "timeout", "deadline")
_PEER_GONE_WORDS = ("closed by peer", "reset by peer", "broken pipe", "connection refused", "connection closed")


def _watch(procs, work: Path, timeout_s: float) -> None:
    """Wait for every rank; on the first failure or at the deadline, stop them all and raise."""
    deadline = time.monotonic() + timeout_s + 15.0  # start-up (imports) on top of the group timeout
    try:
        while True:
            if _first_failure(procs, work):
                time.sleep(1.0)  # let the peers of a crashed rank report, then pick the first failure
                rank, report = _first_failure(procs, work)
                exc_type, exc_message = _exception_of(work, rank)
                if any(w in report.lower() for w in _TIMEOUT_WORDS):
                    raise RankTimeout(f"rank {rank} of {len(procs)} timed out waiting for another rank "
                                      f"(limit {timeout_s:g} s): a hang, usually a send without a matching recv, "
                                      f"or a collective that not every rank calls.\n{report}", "timeout", rank,
                                      report, exc_type, exc_message)
                kind = "not_implemented" if exc_type == "NotImplementedError" else "error"
                if any(w in report.lower() for w in _PEER_GONE_WORDS):
                    kind = "peer_gone"
                    report += ("\n(Another rank exited or crashed while this one was waiting for it: a send "
                               "without a matching recv, or a collective that not every rank calls.)")
                report += _device_advice(report)
                raise RankError(f"rank {rank} of {len(procs)} failed:\n{report}", kind, rank, report,
                                exc_type, exc_message)
            codes = [p.poll() for p in procs]
            if all(code == 0 for code in codes):
                return
            if time.monotonic() > deadline:
                hung = [r for r, c in enumerate(codes) if c is None]
                done = [r for r, c in enumerate(codes) if c == 0]
                outputs = "\n".join(f"--- rank {r} output ---\n{_tail(work / f'rank{r}.log', 1500)}" for r in hung)
                raise RankTimeout(
                    f"rank(s) {hung} did not finish within {timeout_s:g} s and were stopped"
                    f"{f'; rank(s) {done} had finished' if done else ''}. A hang usually means a send without "
                    "a matching recv, or a collective that not every rank calls.\n" + outputs,
                    "timeout", None, outputs)
            time.sleep(0.05)
    finally:
        _kill(procs)
