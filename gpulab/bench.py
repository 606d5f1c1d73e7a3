"""Timing done right, and the accounting that turns a time into a rate (lesson 01).

Three rules, each a classic interview pitfall:
1. Warm up first: the first calls pay for compilation, autotuning and allocator growth.
2. Synchronise before reading the clock: GPU launches return before the kernel has run.
3. Repeat and report the distribution (median, p95, p99), not one number.

On CUDA the timing is delegated to ``triton.testing.do_bench`` (CUDA events, L2 flushed between
runs). On the CPU a ``perf_counter`` loop does the same job. Lab 01 has learners write this
timer themselves; every later lab uses this one.

Two ways the flush itself can mislead, both measured by ``benchmarks/gpu_check.py`` before the course
relies on either: ``do_bench`` flushes by *zeroing* 256 MB, which leaves dirty lines in L2 that are
written back during the next timed kernel (a small row pays for them), and its ~90 us memset hides
the host's launch time. ``benchmark(..., flush="read")`` flushes by reading the buffer instead (the
lines it leaves are clean); :func:`host_clock` times launch-bound code by the host's clock over
back-to-back calls, the way a serving loop sees it.
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
              warmup_ms: float = 25, rep_ms: float = 100, flush: str = "zero", **kwargs) -> Timing:
    """Time ``fn(*args, **kwargs)``; returns a :class:`Timing` in milliseconds.

    On CUDA: ``triton.testing.do_bench`` with ``warmup_ms``/``rep_ms`` of warm-up and timed runs
    (``flush="zero"``, the default); ``flush="read"`` or ``"none"`` times the same way with CUDA events
    but flushes L2 by reading 256 MB (clean lines) or not at all (see the module docstring).
    Elsewhere: ``warmup`` untimed calls, then ``repeats`` timed calls, each bracketed by
    :func:`gpulab.device.synchronize` (there is no L2 to flush).
    """
    if not callable(fn):
        raise TypeError(f"benchmark needs a callable first, got {type(fn).__name__}.")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}.")
    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}.")
    device = current_device() if device is None else device
    if isinstance(device, str) and device == "cuda" and flush != "zero":
        return summarize(_cuda_event_samples(lambda: fn(*args, **kwargs), flush, warmup_ms, rep_ms))
    if isinstance(device, str) and device == "cuda":
        import triton.testing

        samples = triton.testing.do_bench(lambda: fn(*args, **kwargs), warmup=warmup_ms,
                                          rep=rep_ms, return_mode="all")
        return summarize(list(samples))
    # one call per sample, synchronised: the host clock over back-to-back calls, one call at a time
    return host_clock(lambda: fn(*args, **kwargs), device=device, calls=1, warmup=warmup, rounds=repeats)


FLUSHES = ("zero", "read", "none")
FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 (50 MB on an H100), as do_bench's


def _cuda_event_samples(call, flush: str, warmup_ms: float, rep_ms: float) -> list[float]:
    """do_bench's loop (CUDA events around each call, warm-up and repeats sized from a first estimate)
    with another flush: ``"read"`` sums a 256 MB buffer before each call, ``"none"`` flushes nothing."""
    import torch

    buffer = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def clear():
        if flush == "read":
            buffer.sum()  # every line read, none written: L2 holds clean lines of a buffer no kernel uses

    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        clear()
        call()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        call()
    n = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        clear()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def host_clock(fn, *args, device=None, calls: int = 100, warmup: int = 10, rounds: int = 5, **kwargs) -> Timing:
    """Time launch-bound code by the host's clock: ``calls`` back-to-back calls between two
    synchronisations, divided by ``calls``; ``rounds`` such rounds make the samples (ms per call).

    This is what a decode loop or a CUDA-graph replay costs end to end, launch overhead included;
    a per-call event timer with an L2 flush between calls hides the host's side (lesson 06).
    """
    device = current_device() if device is None else device
    for _ in range(warmup):
        fn(*args, **kwargs)
    synchronize(device)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3 / calls)
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
