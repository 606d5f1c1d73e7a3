"""One warp, lane by lane: the documented semantics of CUDA's warp shuffles and votes (lesson 17).

NVIDIA's CUDA simulator runs threads and blocks but not warp-level primitives, so the course models
them here, exactly as the CUDA C++ Programming Guide defines them ("Warp Shuffle Functions", "Warp
Vote Functions"); ``tests/test_simt_tools.py`` checks the model on the guide's own examples. A
:class:`Warp` holds 32 lanes, some of them active; a per-lane variable is a NumPy array of 32 values
(one per lane), and each call is the same instruction executed by every active lane:

    warp = Warp()                                   # 32 active lanes
    v = warp.shfl_down_sync(FULL_MASK, v, 16)       # lane i gets v[i + 16] (its own v if i + 16 >= 32)

The rules the guide states, and what the model does when they are broken:

- every calling (active) lane must be named in ``mask``, and every lane ``mask`` names must be active
  and make the same call: otherwise the result is undefined, so the model raises :class:`WarpError`;
- a lane reading from a lane that is inactive or not in ``mask`` gets an undefined value: NaN here;
- ``shfl_up``/``shfl_down`` past the edge of a ``width``-segment return the lane's own value;
  ``shfl_xor`` from a later segment returns the lane's own value; ``shfl`` takes ``src_lane % width``
  within the lane's segment;
- ``ballot_sync(mask, pred)``: bit ``i`` set when lane ``i`` is active, in ``mask`` and ``pred[i]``.

Inactive lanes hold NaN in every result: they did not execute the instruction.
"""
from __future__ import annotations

import numpy as np

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF


class WarpError(RuntimeError):
    """A warp-level call whose result CUDA leaves undefined (a wrong mask)."""


def lanes_of(mask: int) -> list:
    """The lane numbers whose bits are set in ``mask``."""
    return [i for i in range(WARP_SIZE) if mask >> i & 1]


class Warp:
    """32 lanes; ``active`` (a bool array or a bit mask) says which are executing (default: all)."""

    def __init__(self, active=FULL_MASK):
        if isinstance(active, (int, np.integer)):
            active = np.array([bool(int(active) >> i & 1) for i in range(WARP_SIZE)])
        self.active = np.asarray(active, dtype=bool).copy()  # (32,)
        self.lane = np.arange(WARP_SIZE)                      # (32,) each lane's id, laneId in CUDA
        self.calls: list = []                                 # (primitive, mask, argument) per call

    def activemask(self) -> int:
        """``__activemask()``: the bits of the lanes executing this instruction."""
        return sum(1 << i for i in range(WARP_SIZE) if self.active[i])

    def _check_mask(self, name: str, mask: int) -> np.ndarray:
        mask = int(mask) & FULL_MASK
        named = np.array([bool(mask >> i & 1) for i in range(WARP_SIZE)])
        missing = [i for i in range(WARP_SIZE) if self.active[i] and not named[i]]
        if missing:
            raise WarpError(f"{name}: lane {missing[0]} executes it but its bit is not set in mask {mask:#010x}; "
                            "each calling lane must be in the mask (use __activemask() or the mask of the lanes "
                            "that take this branch).")
        absent = [i for i in range(WARP_SIZE) if named[i] and not self.active[i]]
        if absent:
            raise WarpError(f"{name}: mask {mask:#010x} names lane {absent[0]}, which is not executing this call "
                            "(it exited or took another branch); the result is undefined and on a GPU the warp can "
                            "hang. Name only the lanes that execute it.")
        return named

    def _shuffle(self, name: str, mask: int, var, src: np.ndarray, arg) -> np.ndarray:
        named = self._check_mask(name, mask)
        var = np.asarray(var, dtype=np.float64)
        if var.shape != (WARP_SIZE,):
            raise ValueError(f"{name}: var must hold one value per lane, shape (32,), got {var.shape}.")
        self.calls.append((name, int(mask) & FULL_MASK, arg))
        out = np.full(WARP_SIZE, np.nan)
        for lane in range(WARP_SIZE):
            if self.active[lane]:
                s = int(src[lane])
                out[lane] = var[s] if named[s] and self.active[s] else np.nan  # a silent source: undefined
        return out

    def _segments(self, width: int) -> tuple:
        if width not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"width must be a power of two up to 32, got {width}.")
        return self.lane % width, self.lane - self.lane % width  # lane within segment, segment start

    def shfl_sync(self, mask: int, var, src_lane, width: int = WARP_SIZE) -> np.ndarray:
        """``__shfl_sync``: lane i gets ``var`` of lane ``src_lane % width`` of its own segment
        (``src_lane`` may be one number or one per lane)."""
        _, start = self._segments(width)
        src = start + np.broadcast_to(np.asarray(src_lane, dtype=int), (WARP_SIZE,)) % width
        return self._shuffle("shfl_sync", mask, var, src, src_lane)

    def shfl_up_sync(self, mask: int, var, delta: int, width: int = WARP_SIZE) -> np.ndarray:
        """``__shfl_up_sync``: lane i gets ``var`` of lane i - delta, or its own if that leaves its segment."""
        within, _ = self._segments(width)
        src = np.where(within - delta >= 0, self.lane - delta, self.lane)
        return self._shuffle("shfl_up_sync", mask, var, src, delta)

    def shfl_down_sync(self, mask: int, var, delta: int, width: int = WARP_SIZE) -> np.ndarray:
        """``__shfl_down_sync``: lane i gets ``var`` of lane i + delta, or its own if that leaves its segment."""
        within, _ = self._segments(width)
        src = np.where(within + delta < width, self.lane + delta, self.lane)
        return self._shuffle("shfl_down_sync", mask, var, src, delta)

    def shfl_xor_sync(self, mask: int, var, lane_mask: int, width: int = WARP_SIZE) -> np.ndarray:
        """``__shfl_xor_sync``: lane i gets ``var`` of lane ``i ^ lane_mask``; a lane whose partner is in a
        later ``width``-segment keeps its own value."""
        _, start = self._segments(width)
        partner = self.lane ^ lane_mask
        src = np.where((partner < WARP_SIZE) & (partner < start + width), partner, self.lane)
        return self._shuffle("shfl_xor_sync", mask, var, src, lane_mask)

    def ballot_sync(self, mask: int, predicate) -> int:
        """``__ballot_sync``: bit i set when lane i is active, named in ``mask`` and its predicate is true."""
        named = self._check_mask("ballot_sync", mask)
        pred = np.broadcast_to(np.asarray(predicate, dtype=bool), (WARP_SIZE,))
        self.calls.append(("ballot_sync", int(mask) & FULL_MASK, None))
        return sum(1 << i for i in range(WARP_SIZE) if self.active[i] and named[i] and pred[i])
