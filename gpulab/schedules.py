"""Pipeline schedules as data, and their Gantt chart (lesson and lab 13, pipeline parallelism).

A **step** is one operation of one pipeline stage on one microbatch: ``Step(stage, mb, kind)`` with
``kind`` ``"F"`` (forward) or ``"B"`` (backward). A **schedule** is a list of time slots, each slot a
list of the steps that run during it (at most one per stage); every step takes one slot. Plain
tuples ``(stage, mb, kind)`` work wherever a :class:`Step` does::

    # GPipe, p = 2 stages, m = 2 microbatches: all forwards, then all backwards
    [[(0, 0, "F")], [(0, 1, "F"), (1, 0, "F")], [(1, 1, "F")], [(1, 0, "B")], ...]

A stage with no step in a slot is idle there: the idle stage-slots are the pipeline **bubble**.

**Interleaved schedules** (virtual stages, Megatron-LM's interleaved 1F1B; lab 13, section 7): ``p``
devices each hold ``v`` model chunks, so the model has ``p * v`` virtual stages and a step's
``stage`` is its virtual stage. Chunk ``c`` of device ``d`` is virtual stage ``c * p + d``
(chunk-major), so :func:`device_of` ``(stage, p) = stage % p`` places a step, and "one step per stage
per slot" becomes one step per *device* per slot. A slot is then one chunk's worth of work (``1/v``
of a non-interleaved stage). With ``v = 1`` every stage is its own device and nothing changes.

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


def device_of(stage: int, p: int) -> int:
    """The device (0..p-1) that runs virtual stage ``stage`` when ``p`` devices hold the chunks
    chunk-major: device ``d`` holds virtual stages ``d, d + p, d + 2p, ...`` (``stage`` itself if ``v = 1``)."""
    return stage % p


def chunk_of(stage: int, p: int) -> int:
    """Which of its device's chunks (0..v-1) virtual stage ``stage`` is: ``stage // p``."""
    return stage // p


def num_stages(schedule: Schedule) -> int:
    """The number of stages a schedule uses (highest stage index + 1)."""
    return 1 + max((s.stage for _, s in steps(schedule)), default=-1)


def as_text(schedule: Schedule, p: int | None = None, v: int = 1) -> str:
    """The schedule as a text Gantt chart: one row per stage, one column per slot, ``.`` = idle.

    With ``v > 1`` (interleaved, ``p`` devices): one row per device, a step written ``F<mb>.<chunk>``.

    >>> print(as_text([[(0, 0, "F")], [(0, 0, "B")]]))
    stage 0 | F0 B0
    """
    p = num_stages(schedule) if p is None else p
    grid = [["." for _ in schedule] for _ in range(p)]
    for t, s in steps(schedule):
        if 0 <= s.stage < p * v:
            d = device_of(s.stage, p)
            label = f"{s.kind}{s.mb}" + (f".{chunk_of(s.stage, p)}" if v > 1 else "")
            grid[d][t] = label if grid[d][t] == "." else "!!"  # !! = two ops
    width = max([2] + [len(c) for row in grid for c in row])
    row = "device" if v > 1 else "stage"
    return "\n".join(f"{row} {r} | " + " ".join(c.ljust(width) for c in cells).rstrip()
                     for r, cells in enumerate(grid))


_COLORS = {FORWARD: "#4c72b0", BACKWARD: "#dd8452"}


def gantt(schedule: Schedule | None = None, ax=None, p: int | None = None, title: str | None = None,
          times: dict | None = None, labels: bool = True, v: int = 1):
    """Draw ``schedule`` as a Gantt chart: stages top to bottom, time left to right.

    Forwards are blue, backwards orange, each labelled with its microbatch; the idle stage time
    (the bubble) is shaded grey with hatching. With ``times`` (``{(stage, mb, kind): (start,
    duration)}``, e.g. from a simulation with unequal stage costs) the boxes are drawn at those
    times instead of one slot each, and ``schedule`` may be ``None``. With ``v > 1`` (interleaved,
    ``p`` devices) the rows are devices and later chunks are drawn lighter. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    if schedule is None and times is None:
        raise ValueError("gantt needs a schedule or times")
    if times is not None:
        boxes = [(int(k[0]), float(start), float(dur), Step(*k)) for k, (start, dur) in times.items()]
    else:
        boxes = [(s.stage, float(t), 1.0, s) for t, s in steps(schedule)]  # (stage, start, duration, step)
    p = 1 + max((b[0] for b in boxes), default=-1) if p is None else p
    # (row, start, duration, step, chunk): a row is a device, which is the stage itself when v = 1
    boxes = [(device_of(st, p), start, dur, s, chunk_of(st, p)) if v > 1 else (st, start, dur, s, 0)
             for st, start, dur, s in boxes]
    end = max([b[1] + b[2] for b in boxes] + ([float(len(schedule))] if times is None else [0.0]))
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.32 * end + 1.5), 0.45 * p + 1.2))
    for stage in range(p):  # the bubble: all of the row, painted over by the busy boxes
        ax.broken_barh([(0, end)], (stage - 0.4, 0.8), facecolors="#e6e6e6", hatch="///", edgecolor="#bdbdbd",
                       linewidth=0)
    for stage, start, dur, s, chunk in boxes:
        light = 0.5 * chunk / max(v - 1, 1)  # later chunks: mixed with white (opaque, so no hatch shows through)
        color = [(1 - light) * c + light for c in to_rgb(_COLORS.get(s.kind, "red"))]
        ax.broken_barh([(start, dur)], (stage - 0.4, 0.8), facecolors=[color], edgecolor="white", linewidth=1)
        if labels and dur >= 0.5:
            ax.text(start + dur / 2, stage, str(s.mb), ha="center", va="center", fontsize=7,
                    color="white" if chunk == 0 else "black")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"{'device' if v > 1 else 'stage'} {s}" for s in range(p)])
    if times is None:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(("time slot" if times is None else "time") + (" (one chunk's work)" if v > 1 else ""))
    ax.legend(handles=[Patch(color=_COLORS[FORWARD], label="forward"), Patch(color=_COLORS[BACKWARD], label="backward"),
                       Patch(facecolor="#e6e6e6", hatch="///", edgecolor="#bdbdbd", label="idle (bubble)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax
