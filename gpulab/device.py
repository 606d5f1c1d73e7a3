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


def shared_memory_per_block() -> int | None:
    """Bytes of shared memory one CTA (one program) may use on the GPU Triton compiles for (lesson 04).

    232,448 (227 KiB) on an H100, 166,912 on an A100, 101,376 on an A10G, L4 or RTX 30/40, 65,536 on a
    T4: what Triton's CUDA driver reports as ``max_shared_mem`` and checks every launch against. Inside a
    ``gpulab.aot.target(...)`` or ``aot.stand_in(...)`` block, the target's (what the stand-in driver
    reports); None where kernels run in the interpreter on a CPU (no limit that matters).
    """
    from gpulab import aot  # noqa: PLC0415 - aot imports only the standard library at load

    target = aot.current_target()
    if target is not None:
        return target.properties()["max_shared_mem"]
    if current_device() != "cuda":
        return None
    if not interpreted():
        from triton.runtime import driver  # noqa: PLC0415

        active = driver.active
        return active.utils.get_device_properties(active.get_current_device())["max_shared_mem"]
    import torch  # noqa: PLC0415 - the interpreter on a GPU machine: the same figure, from PyTorch

    return getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", None)


def tuning_configs(configs: list, grading_keep: int = 2, shared_bytes=None) -> list:
    """The autotuner's candidates for this run (lessons 04 and 08), best guesses first in ``configs``.

    ``shared_bytes(config)``, if given, estimates a config's shared memory: configs over this GPU's
    per-block limit (:func:`shared_memory_per_block`) are dropped, so a table tuned for an H100 still runs
    on a T4; if none fits, the one with the smallest estimate is kept. Then, while grading
    (``GPULAB_GRADING=1``, set in the grader's sandbox), only the first ``grading_keep``: every sandboxed
    worker starts with an empty Triton cache and an exercise has a minute, so twelve configs compiled and
    timed for each of a dozen shapes would not fit.
    """
    limit = shared_memory_per_block() if shared_bytes is not None else None
    if limit:
        configs = [c for c in configs if shared_bytes(c) <= limit] or [min(configs, key=shared_bytes)]
    if os.environ.get("GPULAB_GRADING") == "1":
        configs = configs[:grading_keep]
    return configs


def prune_configs(shared_bytes, grading_keep: int = 2):
    """An ``early_config_prune`` for ``triton.autotune(..., prune_configs_by={"early_config_prune": ...})``
    (lessons 04 and 08): :func:`tuning_configs` applied when the autotuner runs, on the GPU it runs on.

    ``shared_bytes(config, named_args)`` estimates a config's shared memory from the kernel's arguments
    by name (their dtypes: fp32 inputs need twice the bytes of fp16), e.g. :func:`pipeline_shared_bytes`.
    Pruning at run time, not when the cell runs, keeps one autotuned kernel right on every GPU and dtype.
    """
    def prune(configs, named_args, **_kwargs):
        return tuning_configs(list(configs), grading_keep, lambda c: shared_bytes(c, named_args))

    return prune


def pipeline_shared_bytes(config, a_bytes: int = 2, b_bytes: int = 2) -> int:
    """Shared memory of a tiled matmul's software pipeline (lesson 04): ``num_stages`` buffers of an A tile
    (BLOCK_M x BLOCK_K elements of ``a_bytes``) and a B tile (BLOCK_K x BLOCK_N of ``b_bytes``).

    ``config`` is a ``triton.Config``. An upper bound of what Triton allocates: exact for Hopper's wgmma
    path (sm_90); Ampere and Ada (mma, sm_80-89) keep ``num_stages - 1`` buffers, a T4 (sm_75) one
    stage. ``tests/test_compile_targets.py`` checks it against the compiled figure on every target.
    """
    kw = config.kwargs
    per_stage = kw["BLOCK_M"] * kw["BLOCK_K"] * a_bytes + kw["BLOCK_K"] * kw["BLOCK_N"] * b_bytes
    return config.num_stages * per_stage


def pick_tiles(choices: dict):
    """The entry of ``choices`` made for this GPU's shared memory (lessons 04 and 05).

    ``choices`` maps the shared memory per CTA an entry was tuned for, in KiB, to the entry (tile sizes,
    launch options): 227 for an H100/H200, 163 for an A100, 99 for an A10G, L4 or RTX 30/40, 64 for a T4
    (which also has no tensor cores for ``tl.dot``: small tiles). Returns the entry with the largest key
    this GPU holds (:func:`shared_memory_per_block`), the smallest key's if none fits, and the largest
    key's in the interpreter. Call it where the kernel is launched, or in a cell run on the GPU itself.
    """
    limit = shared_memory_per_block()
    keys = sorted(choices)
    if limit is None:
        return choices[keys[-1]]
    fitting = [k for k in keys if k * 1024 <= limit]
    return choices[fitting[-1] if fitting else keys[0]]
