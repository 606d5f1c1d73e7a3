"""This machine's measured peaks: copy bandwidth and matmul rate (lessons 01 and 02).

Datasheet peaks are never reached; "% of peak" in this course means "% of what a plain copy
(``torch.Tensor.copy_``) or ``torch.matmul`` achieves on this machine". Both are measured once
and cached per machine in ``~/.cache/gpulab/peaks.json`` (``GPULAB_CACHE`` moves it).

A measurement taken while the machine was busy stays low for good: :func:`measured_peaks` warns when
a peak is implausibly low for the device (:data:`PLAUSIBLE`), and ``python -m gpulab.peaks --refresh``
(or ``measured_peaks(refresh=True)``) measures again and replaces the cached figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gpulab.bench import benchmark, gbps, tflops
from gpulab.device import current_device, pick_device


@dataclass(frozen=True)
class Peaks:
    """Measured peaks of one device: copy bandwidth (GB/s) and matmul rate (TFLOP/s)."""

    device: str            # "cuda" or "cpu"
    name: str              # GPU or CPU model, the cache key
    copy_gbps: float       # torch copy_ of a large buffer: bytes read + bytes written per second
    matmul_tflops: float   # torch.matmul of square matrices in `matmul_dtype`
    matmul_dtype: str
    copy_bytes: int
    matmul_size: int

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.matmul_tflops * 1e12 / (self.copy_gbps * 1e9)


def _cache_file() -> Path:
    root = Path(os.environ.get("GPULAB_CACHE", Path.home() / ".cache" / "gpulab"))
    return root / "peaks.json"


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.machine()} {platform.processor() or 'cpu'} x{os.cpu_count()} torch{torch.__version__}"


def _cache_key(device: str) -> str:
    return f"v{_METHOD_VERSION} {_device_name(device)}"  # a new method re-measures


_METHOD_VERSION = 4  # 4: peaks by median (as kernels), not by the fastest run


def measure_peaks(device: str | None = None) -> Peaks:
    """Measure copy bandwidth and matmul rate now (a few seconds on CPU, under a second on GPU)."""
    import torch

    device = pick_device(device) if device else current_device()
    if device == "cuda":
        n_bytes, size, dtype = 1 << 30, 8192, torch.float16
    else:
        n_bytes, size, dtype = 256 << 20, 1024, torch.float32  # larger than any CPU cache
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = benchmark(dst.copy_, src, device=device, warmup=2, repeats=10)
    del src, dst
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    t_mm = benchmark(torch.matmul, a, b, device=device, warmup=2, repeats=10)
    # By median, as every kernel is timed: a kernel's % of peak then compares like with like (a
    # best-run peak against a median kernel time would understate every kernel).
    return Peaks(device=device, name=_device_name(device),
                 copy_gbps=gbps(2 * n_bytes, t_copy.median_ms),  # read + write
                 matmul_tflops=tflops(2 * size**3, t_mm.median_ms),
                 matmul_dtype=str(dtype).replace("torch.", ""), copy_bytes=n_bytes, matmul_size=size)


# Floors below which a measured peak says more about the machine's load than about the device: about a tenth
# of what a loaded 2-core cloud VM measured (20 GB/s copy, 0.06 TFLOP/s fp32 matmul, lesson 00) and of what
# the smallest current GPUs reach (hundreds of GB/s of memory bandwidth, tens of fp16 TFLOP/s).
PLAUSIBLE = {"cpu": {"copy_gbps": 2.0, "matmul_tflops": 0.006}, "cuda": {"copy_gbps": 100.0, "matmul_tflops": 5.0}}


def implausibly_low(peaks: Peaks) -> list[str]:
    """The peaks of ``peaks`` below :data:`PLAUSIBLE`'s floor for its device, as readable phrases."""
    floors = PLAUSIBLE.get(peaks.device, {})
    units = {"copy_gbps": ("copy bandwidth", "GB/s"), "matmul_tflops": ("matmul rate", "TFLOP/s")}
    return [f"{units[k][0]} {getattr(peaks, k):.3g} {units[k][1]} (expected at least {floor:g})"
            for k, floor in floors.items() if getattr(peaks, k) < floor]


def _warn_if_low(peaks: Peaks) -> None:
    low = implausibly_low(peaks)
    if low:  # printed, not warnings.warn: a busy test machine must not turn this into an error
        print(f"gpulab: warning: the measured peaks of {peaks.name} look too low for the device: {'; '.join(low)}. "
              "Was the machine busy when they were measured? When it is quiet, measure again with "
              "`python -m gpulab.peaks --refresh` (or measured_peaks(refresh=True)).", file=sys.stderr)


def measured_peaks(device: str | None = None, refresh: bool = False) -> Peaks:
    """This device's peaks, measured on first use and then read from the per-machine cache (``refresh``
    measures again and replaces them); warns when they are implausibly low for the device."""
    peaks = _cached_or_measured(device, refresh)
    _warn_if_low(peaks)
    return peaks


def _cached_or_measured(device: str | None, refresh: bool) -> Peaks:
    device = pick_device(device) if device else current_device()
    key = _cache_key(device)
    path = _cache_file()
    cache = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}  # a damaged cache is re-measured, never trusted
    if not refresh and key in cache:
        try:
            return Peaks(**cache[key])
        except TypeError:
            pass
    peaks = measure_peaks(device)
    cache[key] = asdict(peaks)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=2))
    except OSError:
        pass  # a read-only home still gets the numbers, just not cached
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.peaks",
                                     description="Show this machine's measured peaks (measured once, then cached).")
    parser.add_argument("--refresh", action="store_true", help="measure again (on a quiet machine) and replace the "
                                                                 "cached figures")
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    args = parser.parse_args(argv)
    peaks = measured_peaks(args.device, refresh=args.refresh)
    print(f"{peaks.name}: copy {peaks.copy_gbps:.1f} GB/s, matmul {peaks.matmul_tflops:.3f} TFLOP/s "
          f"({peaks.matmul_dtype}), ridge point {peaks.ridge_point:.1f} FLOP/byte; cached in {_cache_file()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
