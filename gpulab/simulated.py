"""A pretend GPU for CPU machines: launches return at once, the work finishes later (lesson 01).

It behaves like one CUDA stream: work runs in launch order, and ``synchronize()`` waits for all
of it. Lab 01's timer check uses it, because on a CPU nothing else shows the two classic timer
bugs: reading the clock before the work finished, and timing the slow first calls.

With a :class:`SimulatedClock` nothing sleeps: the clock jumps to the end of the work on
``synchronize()``, so a timer measures exactly the durations the kernel was given, however busy
the machine is. Lab 01's check uses that to predict a timer's median, p95 and p99 exactly.
"""
from __future__ import annotations

import contextlib
import sys
import time


class SimulatedClock:
    """A pretend clock that moves only when simulated work finishes, plus ``tick_s`` per read (so
    a loop that polls it still ends). Readings are seconds, as ``time.perf_counter()`` returns."""

    _NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns")

    def __init__(self, start_s: float = 1000.0, tick_s: float = 1e-6) -> None:
        self.now = start_s
        self.tick_s = tick_s

    def read(self) -> float:
        self.now += self.tick_s
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)

    def _fakes(self) -> dict:
        ns = lambda: int(self.read() * 1e9)  # noqa: E731
        return {"perf_counter": self.read, "perf_counter_ns": ns, "monotonic": self.read,
                "monotonic_ns": ns, "time": self.read, "time_ns": ns}

    @contextlib.contextmanager
    def installed(self, *namespaces: dict):
        """While the block runs, ``time.perf_counter``, ``time.monotonic``, ``time.time`` (and their
        ``_ns`` forms, and ``timeit.default_timer``) read this clock, also where a namespace (a
        notebook's globals) imported one of them by name. Everything is restored afterwards."""
        fakes = self._fakes()
        originals = {name: getattr(time, name) for name in self._NAMES}
        patched = []  # (namespace dict, key, original function)
        for ns in namespaces:
            for key, value in list(ns.items()):
                name = next((n for n, fn in originals.items() if value is fn), None)
                if name is not None:  # e.g. `from time import perf_counter` in a notebook
                    patched.append((ns, key, value))
                    ns[key] = fakes[name]
        timeit = sys.modules.get("timeit")
        if timeit is not None and getattr(timeit, "default_timer", None) is originals["perf_counter"]:
            patched.append((timeit.__dict__, "default_timer", originals["perf_counter"]))
            timeit.default_timer = fakes["perf_counter"]
        for name in self._NAMES:
            setattr(time, name, fakes[name])
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(time, name, fn)
            for owner, key, value in reversed(patched):
                owner[key] = value


class SimulatedDevice:
    """One in-order queue of work; nothing actually computes, time passes as it would."""

    def __init__(self, clock: SimulatedClock | None = None) -> None:
        self.clock = clock
        self._busy_until = self._now()
        self.launches = 0

    def _now(self) -> float:
        return self.clock.now if self.clock is not None else time.perf_counter()

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of work and return immediately, as a kernel launch does."""
        start = max(self._now(), self._busy_until)
        self._busy_until = start + seconds
        self.launches += 1

    def pending(self) -> bool:
        """Whether queued work has not finished yet (what a clock read before ``synchronize`` misses)."""
        return self._busy_until > self._now()

    def synchronize(self) -> None:
        """Block until every queued piece of work has finished (with a clock: jump to that time)."""
        if self.clock is not None:
            self.clock.advance_to(self._busy_until)
            return
        remaining = self._busy_until - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    def __repr__(self) -> str:
        return f"SimulatedDevice(launches={self.launches})"


class SimulatedKernel:
    """A callable 'kernel' on a :class:`SimulatedDevice`: ``steady_ms`` per call, but the first
    ``cold_calls`` calls cost ``cold_ms`` each (compilation and autotuning, as with Triton).

    ``durations_ms``, if given, replaces ``steady_ms``: the warm calls take these durations in
    turn, over and over, so any ``len(durations_ms)`` consecutive warm calls take exactly them."""

    def __init__(self, device: SimulatedDevice, steady_ms: float = 4.0, cold_ms: float = 60.0,
                 cold_calls: int = 3, durations_ms: list | None = None) -> None:
        self.device, self.steady_ms, self.cold_ms, self.cold_calls = device, steady_ms, cold_ms, cold_calls
        # The schedule and the call count live in a closure, not in attributes: a timer under test
        # must measure the calls, not read their durations off the kernel or set its call count.
        durations = tuple(durations_ms) if durations_ms else (steady_ms,)
        count = [0]

        def next_ms() -> float:
            n = count[0]
            count[0] += 1
            return cold_ms if n < cold_calls else durations[(n - cold_calls) % len(durations)]

        self._next_ms, self._count = next_ms, count.__getitem__

    @property
    def calls(self) -> int:
        """How many times the kernel was called (read-only)."""
        return self._count(0)

    def __call__(self, *args, **kwargs):
        self.device.launch(self._next_ms() / 1e3)
        return None
