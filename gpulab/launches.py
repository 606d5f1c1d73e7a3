"""Counting Triton kernel launches, so a check can tell a kernel from a PyTorch one-liner (lesson 02).

Every Triton kernel object (compiled ``JITFunction``, the CPU ``InterpretedFunction``, the
``Autotuner`` and ``Heuristics`` wrappers) is launched through ``KernelInterface.__getitem__``
(``kernel[grid](...)``), so counting calls there counts launches in both modes.
"""
from __future__ import annotations

import contextlib


def _kernel_name(kernel) -> str:
    inner = kernel
    for _ in range(4):  # Autotuner -> Heuristics -> JITFunction -> python function
        inner = getattr(inner, "fn", inner)
    return getattr(inner, "__name__", type(kernel).__name__)


@contextlib.contextmanager
def record_launches():
    """Context manager yielding a list that collects the name of every Triton kernel launched."""
    from triton.runtime.jit import KernelInterface

    launched: list[str] = []
    original = KernelInterface.__getitem__

    def counting_getitem(self, grid):
        launched.append(_kernel_name(self))
        return original(self, grid)

    KernelInterface.__getitem__ = counting_getitem
    try:
        yield launched
    finally:
        KernelInterface.__getitem__ = original
