"""Pipeline schedules as data, and their Gantt chart (lesson and lab 13, pipeline parallelism).

A **step** is one operation of one pipeline stage on one microbatch: ``Step(stage, mb, kind)`` with
``kind`` ``"F"`` (forward) or ``"B"`` (backward). A **schedule** is a list of time slots, each slot a
list of the steps that run during it (at most one per stage); every step takes one slot. Plain
tuples ``(stage, mb, kind)`` work wherever a :class:`Step` does::

    # GPipe, p = 2 stages, m = 2 microbatches: all forwards, then all backwards
    [[(0, 0, "F")], [(0, 1, "F"), (1, 0, "F")], [(1, 1, "F")], [(1, 0, "B")], ...]

A stage with no step in a slot is idle there: the idle stage-slots are the pipeline **bubble**.
This module only represents and draws schedules; generating, validating and measuring them are the
lab's exercises.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

FORWARD, BACKWARD = "F", "B"


class Step(NamedTuple):
    """One op: ``stage`` (0 = first) runs its forward ``"F"`` or backward ``"B"`` on microbatch ``mb``."""

    stage: int
    mb: int
    kind: str

    def __str__(self) -> str:  # the form error messages use: F(1, 2) = forward of stage 1 on microbatch 2
        return f"{self.kind}({self.stage}, {self.mb})"


Schedule = Sequence[Sequence[Step]]  # schedule[t] = the steps running in time slot t


def steps(schedule: Schedule):
    """Every ``(slot, Step)`` of a schedule, in slot order (tuples become :class:`Step`)."""
    for t, slot in enumerate(schedule):
        for step in slot:
            yield t, Step(*step)


def num_stages(schedule: Schedule) -> int:
    """The number of stages a schedule uses (highest stage index + 1)."""
    return 1 + max((s.stage for _, s in steps(schedule)), default=-1)


def as_text(schedule: Schedule, p: int | None = None) -> str:
    """The schedule as a text Gantt chart: one row per stage, one column per slot, ``.`` = idle.

    >>> print(as_text([[(0, 0, "F")], [(0, 0, "B")]]))
    stage 0 | F0 B0
    """
    p = num_stages(schedule) if p is None else p
    grid = [["." for _ in schedule] for _ in range(p)]
    for t, s in steps(schedule):
        if 0 <= s.stage < p:
            grid[s.stage][t] = f"{s.kind}{s.mb}" if grid[s.stage][t] == "." else "!!"  # !! = two ops
    width = max([2] + [len(c) for row in grid for c in row])
    return "\n".join(f"stage {r} | " + " ".join(c.ljust(width) for c in row).rstrip() for r, row in enumerate(grid))


_COLORS = {FORWARD: "#4c72b0", BACKWARD: "#dd8452"}


def gantt(schedule: Schedule | None = None, ax=None, p: int | None = None, title: str | None = None,
          times: dict | None = None, labels: bool = True):
    """Draw ``schedule`` as a Gantt chart: stages top to bottom, time left to right.

    Forwards are blue, backwards orange, each labelled with its microbatch; the idle stage time
    (the bubble) is shaded grey with hatching. With ``times`` (``{(stage, mb, kind): (start,
    duration)}``, e.g. from a simulation with unequal stage costs) the boxes are drawn at those
    times instead of one slot each, and ``schedule`` may be ``None``. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if schedule is None and times is None:
        raise ValueError("gantt needs a schedule or times")
    if times is not None:
        boxes = [(int(k[0]), float(start), float(dur), Step(*k)) for k, (start, dur) in times.items()]
    else:
        boxes = [(s.stage, float(t), 1.0, s) for t, s in steps(schedule)]  # (stage, start, duration, step)
    p = 1 + max((b[0] for b in boxes), default=-1) if p is None else p
    end = max([b[1] + b[2] for b in boxes] + ([float(len(schedule))] if times is None else [0.0]))
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.32 * end + 1.5), 0.45 * p + 1.2))
    for stage in range(p):  # the bubble: all of the row, painted over by the busy boxes
        ax.broken_barh([(0, end)], (stage - 0.4, 0.8), facecolors="#e6e6e6", hatch="///", edgecolor="#bdbdbd",
                       linewidth=0)
    for stage, start, dur, s in boxes:
        ax.broken_barh([(start, dur)], (stage - 0.4, 0.8), facecolors=_COLORS.get(s.kind, "red"),
                       edgecolor="white", linewidth=1)
        if labels and dur >= 0.5:
            ax.text(start + dur / 2, stage, str(s.mb), ha="center", va="center", fontsize=7, color="white")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in range(p)])
    if times is None:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("time slot" if times is None else "time")
    ax.legend(handles=[Patch(color=_COLORS[FORWARD], label="forward"), Patch(color=_COLORS[BACKWARD], label="backward"),
                       Patch(facecolor="#e6e6e6", hatch="///", edgecolor="#bdbdbd", label="idle (bubble)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax
