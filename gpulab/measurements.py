"""The "Your measurements" table that opens every lesson's interview section (lessons 01-13).

The model outline of each lesson cites the learner's own numbers, so each lesson gathers them in one
table of ``(what, value)`` rows, printed with :func:`show_measurements`.
"""
from __future__ import annotations

from gpulab.device import current_device

CPU_NOTE = "CPU run: no kernel timings, by design. Run on a GPU to fill in the measured rows."


def format_measurements(rows, title: str = "Your measurements") -> str:
    """``rows`` (``(name, value)`` pairs, values already formatted) as aligned text under ``title``."""
    rows = [(str(name), str(value)) for name, value in rows]
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join([title] + [f"  {name:{width}s}  {value}" for name, value in rows])


def show_measurements(rows, *, cpu_note: str | None = CPU_NOTE, device: str | None = None) -> None:
    """Print the lesson's measurements; off the GPU, then ``cpu_note`` (``None``: no note), which says
    which rows only a GPU run fills in."""
    print(format_measurements(rows))
    if cpu_note and (device or current_device()) != "cuda":
        print(f"\n({cpu_note})")
