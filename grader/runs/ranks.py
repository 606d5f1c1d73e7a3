"""Running a learner's code on real ranks, with one policy for stubs, errors and hangs (labs 11-13).

:func:`launch_ranks` wraps :func:`gpulab.dist.launch` (gloo, CPU tensors, the learner's function
shipped by value) for the run side of a distributed exercise:

- an unfinished exercise (a stub raising ``NotImplementedError``) is found by ``probe``, a cheap call
  in this process, before any rank starts, and reported as not attempted;
- a rank's exception becomes a short ``RuntimeError`` with that rank's traceback (its tail);
- a hang (:attr:`gpulab.dist.RankFailure.hung`: a rank timed out, or its peer left while it waited)
  raises :class:`RanksHung` with one summary: the launch's headline, gloo's words and the learner's
  frame that was waiting. A hang costs its timeout once: the same learner objects in the same
  exercise answer every later case at once with the same failure (``memo_key``).

The decisions read :class:`gpulab.dist.RankFailure`'s ``kind``, never its prose.
"""
from __future__ import annotations

import datetime
import signal
import threading

import torch

# memo_key -> the exception its launch ended with (a hang or a stub): later cases answer at once.
_STICKY: dict = {}
HANG_ADVICE = ("Every rank of a process group must call the same collectives in the same order (a collective "
               "under `if rank == 0:`, a recv that no rank sends to, or a collective on another group waits "
               "forever).")


class RanksHung(RuntimeError):
    """The ranks deadlocked and were stopped; ``summary`` says where (see :func:`hang_summary`) and,
    for a later case of the same learner objects, that it was not run because an earlier one hung."""

    REPEATED = "(an earlier case already hung, so this one was not run) "

    def __init__(self, summary: str, timeout_s: float):
        self.summary, self.timeout_s = summary, timeout_s
        super().__init__(f"a rank hung and was stopped after {timeout_s:g} s: {summary} {HANG_ADVICE}")

    def again(self) -> "RanksHung":
        """The same hang, as reported for a later case that is not run."""
        summary = self.summary if self.summary.startswith(self.REPEATED) else self.REPEATED + self.summary
        return RanksHung(summary, self.timeout_s)


def hang_summary(text: str) -> str:
    """The launch's headline, gloo's own words, and the learner's frame that was waiting."""
    lines = text.splitlines()
    gloo = next((ln.split("] ")[-1].strip() for ln in lines if "Timed out" in ln or "closed by peer" in ln), "")
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ") and "distributed" not in ln]
    out = lines[0][:300] if lines else ""
    if gloo:
        out += f" gloo: {gloo[:160]}"
    if frames:
        out += f" (waiting in: {frames[-1][:160]})"
    return out


def _tail(text: str, n: int = 1800) -> str:
    """The end of a failure's report, without its headline."""
    return "\n".join(text.splitlines()[1:])[-n:]


def launch_ranks(memo_key, rank_fn, world_size: int, *args, timeout_s: float, probe=None) -> list:
    """``rank_fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; the results in rank order.

    ``memo_key``: names the exercise and holds the learner's objects themselves (functions and classes
    hash by identity, and the memo keeps them alive, so an id is never reused); ``probe``:
    a callable run here first, whose ``NotImplementedError`` means "not attempted" (anything else it
    raises is ignored: the real launch reports it on the case's world size).
    Raises ``NotImplementedError``, :class:`RanksHung` or ``RuntimeError``.
    """
    from gpulab.dist import RankFailure, launch

    if memo_key in _STICKY:
        raise _STICKY[memo_key]
    try:
        if probe is not None:
            _run_probe(probe)
        return launch(rank_fn, world_size, *args, backend="gloo", device="cpu", timeout_s=timeout_s)
    except NotImplementedError as exc:
        _STICKY[memo_key] = NotImplementedError(str(exc) or "not implemented yet.")
        raise _STICKY[memo_key] from None
    except RankFailure as exc:
        if exc.kind == "not_implemented":
            _STICKY[memo_key] = NotImplementedError(exc.exc_message or "not implemented yet.")
            raise _STICKY[memo_key] from None
        if exc.hung:
            hung = RanksHung(hang_summary(str(exc)), timeout_s)
            _STICKY[memo_key] = hung.again()
            raise hung from None
        raise RuntimeError(f"{str(exc).splitlines()[0]}\n{_tail(str(exc))}") from None


def _run_probe(probe) -> None:
    """``probe()``, of which only a ``NotImplementedError`` escapes: anything else (often: no process
    group in this process) is left for the launch to report, on the case's world size."""
    try:
        probe()
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - see above
        pass


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an ``import`` (a slow first import of a torch submodule, say)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def probe_on_one_rank(rank_fn, *args, seconds: float = 5.0) -> None:
    """A probe for :func:`launch_ranks`: run ``rank_fn(0, 1, *args)`` in this process, in a one-rank
    gloo group, under an alarm that stops an endless loop. Only ``NotImplementedError`` escapes."""
    import torch.distributed as dist

    # Learner code runs here, in this process: only with an alarm that can stop an endless loop.
    if (not dist.is_available() or dist.is_initialized() or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        return

    class _ProbeTimeout(Exception):
        pass

    def _alarm(signum, frame):
        if _importing(frame):  # an exception here would leave a half-imported module behind for good
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return
        raise _ProbeTimeout()

    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=2))
    except Exception:
        return
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with torch.random.fork_rng(devices=[]):  # the rank functions seed the RNG: keep the learner's
            rank_fn(0, 1, *args)
    except NotImplementedError:
        raise
    except Exception:  # _ProbeTimeout included: the launch will report it, on the case's world size
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        dist.destroy_process_group()
