"""A pretend GPU for CPU machines: launches return at once, the work finishes later (lesson 01).

It behaves like one CUDA stream: work runs in launch order, and ``synchronize()`` waits for all
of it. Lab 01's timer check uses it, because on a CPU nothing else shows the two classic timer
bugs: reading the clock before the work finished, and timing the slow first calls.
"""
from __future__ import annotations

import time


class SimulatedDevice:
    """One in-order queue of work; nothing actually computes, time passes as it would."""

    def __init__(self) -> None:
        self._busy_until = time.perf_counter()
        self.launches = 0

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of work and return immediately, as a kernel launch does."""
        start = max(time.perf_counter(), self._busy_until)
        self._busy_until = start + seconds
        self.launches += 1

    def synchronize(self) -> None:
        """Block until every queued piece of work has finished."""
        remaining = self._busy_until - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    def __repr__(self) -> str:
        return f"SimulatedDevice(launches={self.launches})"


class SimulatedKernel:
    """A callable 'kernel' on a :class:`SimulatedDevice`: ``steady_ms`` per call, but the first
    ``cold_calls`` calls cost ``cold_ms`` each (compilation and autotuning, as with Triton)."""

    def __init__(self, device: SimulatedDevice, steady_ms: float = 4.0, cold_ms: float = 60.0,
                 cold_calls: int = 3) -> None:
        self.device, self.steady_ms, self.cold_ms, self.cold_calls = device, steady_ms, cold_ms, cold_calls
        self.calls = 0

    def __call__(self, *args, **kwargs):
        cold = self.calls < self.cold_calls
        self.calls += 1
        self.device.launch((self.cold_ms if cold else self.steady_ms) / 1e3)
        return None
