"""Timing done right, and the accounting that turns a time into a rate (lesson 01).

Three rules, each a classic interview pitfall:
1. Warm up first: the first calls pay for compilation, autotuning and allocator growth.
2. Synchronise before reading the clock: GPU launches return before the kernel has run.
3. Repeat and report the distribution (median, p95, p99), not one number.

On CUDA the timing is delegated to ``triton.testing.do_bench`` (CUDA events, L2 flushed between
runs). On the CPU a ``perf_counter`` loop does the same job. Lab 01 has learners write this
timer themselves; every later lab uses this one.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from gpulab.device import current_device, synchronize


@dataclass(frozen=True)
class Timing:
    """Summary of repeated runs, in milliseconds."""

    median_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    n: int
    samples_ms: list = field(repr=False, default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples_ms")
        return d


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation, as ``numpy.percentile``."""
    if not samples:
        raise ValueError("percentile of no samples")
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> Timing:
    """Turn raw per-run times (ms) into a :class:`Timing`."""
    samples_ms = [float(t) for t in samples_ms]
    return Timing(median_ms=statistics.median(samples_ms), p95_ms=percentile(samples_ms, 95),
                  p99_ms=percentile(samples_ms, 99), mean_ms=statistics.fmean(samples_ms),
                  min_ms=min(samples_ms), n=len(samples_ms), samples_ms=samples_ms)


def benchmark(fn, *args, device=None, warmup: int = 3, repeats: int = 20,
              warmup_ms: float = 25, rep_ms: float = 100, **kwargs) -> Timing:
    """Time ``fn(*args, **kwargs)``; returns a :class:`Timing` in milliseconds.

    On CUDA: ``triton.testing.do_bench`` with ``warmup_ms``/``rep_ms`` of warm-up and timed runs.
    Elsewhere: ``warmup`` untimed calls, then ``repeats`` timed calls, each bracketed by
    :func:`gpulab.device.synchronize`.
    """
    if not callable(fn):
        raise TypeError(f"benchmark needs a callable first, got {type(fn).__name__}.")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}.")
    device = current_device() if device is None else device
    if isinstance(device, str) and device == "cuda":
        import triton.testing

        samples = triton.testing.do_bench(lambda: fn(*args, **kwargs), warmup=warmup_ms,
                                          rep=rep_ms, return_mode="all")
        return summarize(list(samples))
    for _ in range(warmup):
        fn(*args, **kwargs)
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return summarize(samples)


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second) for ``nbytes`` moved in ``ms``."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Achieved rate in TFLOP/s for ``flops`` floating-point operations in ``ms``."""
    return flops / (ms * 1e-3) / 1e12


def pct_of_peak(achieved: float, peak: float) -> float:
    """``achieved`` as a percentage of ``peak`` (both in the same unit)."""
    if peak <= 0:
        raise ValueError(f"peak must be positive, got {peak}.")
    return 100.0 * achieved / peak
