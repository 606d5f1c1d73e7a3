"""gpulab: the helpers every GPU Systems Lab notebook imports.

Call :func:`setup` in a notebook's first code cell after the parameters, before any kernel is
defined: it chooses the device, switches Triton to its interpreter on CPU, seeds everything, and lets
Run All carry on past a demo cell that needs an unfinished exercise (:mod:`gpulab.runall`).
"""
from __future__ import annotations

from gpulab.device import current_device, describe, interpreted, synchronize
from gpulab.feedback import check
from gpulab.seed import seed_everything

__all__ = ["setup", "check", "current_device", "describe", "interpreted", "synchronize",
           "seed_everything"]


def setup(device: str = "auto", seed: int = 0, quiet: bool = False) -> str:
    """Choose the device, prepare Triton for it, seed every RNG; return ``"cuda"`` or ``"cpu"``.

    In a notebook it also installs :mod:`gpulab.runall`'s guard, except in strict mode (the test suite:
    there a stub must fail) and in the grader's sandbox (which judges each exercise itself)."""
    import os

    from gpulab import runall
    from gpulab.device import set_device

    chosen = set_device(device)
    seed_everything(seed)
    if os.environ.get("GPULAB_STRICT") != "1" and os.environ.get("GPULAB_GRADING") != "1":
        runall.install()
    if not quiet:
        info = describe()
        where = info["gpu"] if chosen == "cuda" else f"CPU ({info['cpu_cores']} cores)"
        print(f"gpulab: {chosen} on {where}; Triton {info['triton']} {info['triton_mode']}; "
              f"torch {info['torch']}; seed {seed}")
    return chosen
