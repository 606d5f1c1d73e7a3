"""Choosing the device: the one place that decides between CUDA and the CPU (lesson 00).

On a CPU, Triton kernels run in Triton's interpreter. The interpreter is chosen when a kernel is
*decorated* with ``@triton.jit``, so ``TRITON_INTERPRET=1`` must be set before any notebook cell
defines a kernel: that is why every notebook calls ``gpulab.setup`` first.
"""
from __future__ import annotations

import os
import platform
import sys

_VALID = ("auto", "cpu", "cuda")
_current: str | None = None


def pick_device(requested: str = "auto") -> str:
    """Return ``"cuda"`` or ``"cpu"`` for a requested ``"auto" | "cpu" | "cuda"``.

    ``"auto"`` takes the environment variable ``GPULAB_DEVICE`` if set (CI's GPU lane uses it),
    else CUDA when a GPU is visible, else the CPU. Asking for CUDA without a GPU is an error,
    not a silent fallback, so a GPU run can never quietly report CPU numbers.
    """
    import torch

    requested = (requested or "auto").strip().lower()
    if requested not in _VALID:
        raise ValueError(f"DEVICE must be one of {_VALID}, got {requested!r}. "
                         "Set DEVICE = 'auto' in the parameters cell.")
    if requested == "auto":
        requested = os.environ.get("GPULAB_DEVICE", "auto").strip().lower() or "auto"
        if requested not in _VALID:
            raise ValueError(f"GPULAB_DEVICE must be one of {_VALID}, got {requested!r}.")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("DEVICE = 'cuda' was asked for, but PyTorch sees no CUDA GPU on this "
                           "machine. Use DEVICE = 'auto' (or 'cpu') to run in Triton's interpreter.")
    return requested


def use_interpreter() -> None:
    """Switch Triton to its CPU interpreter for every kernel decorated from now on."""
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        # Kernels decorated before this point are already compiled-mode kernels.
        from triton import knobs  # noqa: PLC0415 - only when triton is already loaded
        knobs.runtime.interpret = True
    from gpulab.aot import scope_interpreter_patches  # noqa: PLC0415

    try:
        scope_interpreter_patches()  # keeps compiling for a GPU possible in this process (gpulab.aot)
    except ImportError:  # no Triton on this machine (macOS wheels do not exist)
        pass


def set_device(requested: str = "auto") -> str:
    """Pick the device (see :func:`pick_device`), remember it, and prepare Triton for it."""
    global _current
    device = pick_device(requested)
    if device == "cpu":
        use_interpreter()
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    _current = device
    return device


def current_device() -> str:
    """The device chosen by :func:`set_device` (choosing ``"auto"`` if none was chosen yet)."""
    return _current if _current is not None else set_device("auto")


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def synchronize(device=None) -> None:
    """Wait until all work queued on ``device`` has finished (lesson 01).

    GPU kernels are *asynchronous*: a launch returns before the kernel runs, so a timer must
    synchronise before reading the clock. ``device`` may be ``"cuda"``, ``"cpu"`` (nothing to
    wait for), a ``torch.device``, or any object with a ``synchronize()`` method (the simulated
    asynchronous device that lab 01's check uses).
    """
    import torch

    if device is None:
        device = current_device()
    if hasattr(device, "synchronize") and not isinstance(device, (str, torch.device)):
        device.synchronize()
        return
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def describe() -> dict:
    """What this machine offers: device, GPU name, Triton mode and the distributed backend."""
    import torch

    from gpulab.dist import pick_backend

    device = current_device()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # macOS has no Triton wheels
        triton_version = None
    info = {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "triton_mode": "interpreter (CPU)" if interpreted() else "compiled (GPU)",
        # What gpulab.dist.launch picks for two ranks: NCCL needs a GPU per rank, so one GPU means gloo.
        "distributed_backend": pick_backend(2, device),
    }
    return info


def tuning_configs(configs: list, grading_keep: int = 2, shared_bytes=None) -> list:
    """The autotuner's candidates for this run (lessons 04 and 08), best guesses first in ``configs``.

    While grading (``GPULAB_GRADING=1``, set in the grader's sandbox) only the first ``grading_keep``:
    every sandboxed worker starts with an empty Triton cache and an exercise has a minute, so twelve
    configs compiled and timed for each of a dozen shapes would not fit. ``shared_bytes(config)``, if
    given, estimates a config's shared memory: configs over this GPU's per-block limit are dropped
    (227 KiB on an H100, 99 KiB on an RTX 4090), so a table tuned for an H100 still runs elsewhere.
    """
    if shared_bytes is not None and current_device() == "cuda":
        import torch

        limit = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", None)
        if limit:
            configs = [c for c in configs if shared_bytes(c) <= limit] or configs[:1]
    if os.environ.get("GPULAB_GRADING") == "1":
        configs = configs[:grading_keep]
    return configs
