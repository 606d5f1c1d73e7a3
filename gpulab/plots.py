"""Plots the lessons share: the roofline (lesson 01) and grouped bars (lesson 02)."""
from __future__ import annotations

import numpy as np


def roofline(peaks, points=(), ax=None, title: str | None = None):
    """Draw the roofline of measured ``peaks`` and place ``points`` on it.

    ``points``: iterable of ``(label, arithmetic_intensity_flop_per_byte, achieved_tflops or None)``.
    A point with no measured rate is drawn on the roof (the best it could do). Returns the axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peak_bw = peaks.copy_gbps * 1e9        # bytes/s
    peak_flops = peaks.matmul_tflops * 1e12  # FLOP/s
    ridge = peak_flops / peak_bw
    ai = np.logspace(-2, 4, 400)
    roof = np.minimum(peak_flops, ai * peak_bw) / 1e12
    ax.loglog(ai, roof, color="black", lw=2, label="roofline (measured peaks)")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.text(ridge * 1.1, roof.min() * 2, f"ridge {ridge:.1f} FLOP/B", color="gray", fontsize=8)
    for label, x, achieved in points:
        bound = min(peak_flops, x * peak_bw) / 1e12
        y = bound if achieved is None else achieved
        ax.scatter([x], [y], zorder=3)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, -12), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or f"Roofline of {peaks.name}: {peaks.copy_gbps:.0f} GB/s copy, "
                          f"{peaks.matmul_tflops:.2f} TFLOP/s {peaks.matmul_dtype} matmul", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return ax


def grouped_bars(groups: dict, ylabel: str, ax=None, title: str = ""):
    """Bars for ``{group_label: {series_label: value}}``; every group has the same series."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    labels = list(groups)
    series = list(next(iter(groups.values())))
    width = 0.8 / len(series)
    x = np.arange(len(labels))
    for i, name in enumerate(series):
        values = [groups[g][name] for g in labels]
        bars = ax.bar(x + i * width - 0.4 + width / 2, values, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return ax
