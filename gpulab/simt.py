"""Thread blocks on the CPU: NVIDIA's numba-cuda simulator, and a record of every memory access (lesson 17).

With ``NUMBA_ENABLE_CUDASIM=1``, ``numba.cuda.jit`` kernels run in NVIDIA's CUDA simulator: every thread
of a block is a Python thread, ``cuda.syncthreads()`` is a real barrier, ``cuda.shared.array`` is one
array per launch shared by the threads, ``cuda.atomic`` operations are atomic. Warp shuffles and
ballots are not simulated (see :mod:`gpulab.warp`). Import ``cuda`` from here, before anything imports
``numba.cuda``, so the simulator is on:

    from gpulab.simt import cuda
    @cuda.jit
    def kernel(x, out): ...
    kernel[blocks, threads](x, out)

:func:`recording` wraps a launch and writes down each thread's memory accesses, as
``compute-sanitizer`` does on a GPU: for each access, the block, the thread, how many barriers the
thread had passed (its *epoch*), which array and element, read, write or atomic. Two threads touching
one shared element in the same epoch, one of them writing, is a race however the simulator happened to
schedule them; the 32 addresses of one warp's k-th access give its sectors and bank conflicts. New
shared arrays are filled with a poison value (NaN, or the integer type's largest value), so a read of
shared memory no thread wrote shows too.

Importing this module also fixes a race of the simulator: two threads reaching ``cuda.shared.array`` at
once could each create "the" block's array; here it is made under a lock, once.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from dataclasses import dataclass

import numpy as np

if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise ImportError("numba.cuda was imported before gpulab.simt, without the simulator. Restart the kernel and "
                      "import `from gpulab.simt import cuda` first.")
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # the course runs its CUDA Python kernels in NVIDIA's simulator

from numba import cuda  # noqa: E402
from numba.cuda.simulator import kernel as _sim_kernel  # noqa: E402
from numba.cuda.simulator import kernelapi as _sim_api  # noqa: E402
from numba.cuda.simulator.cudadrv import devicearray as _sim_arrays  # noqa: E402

__all__ = ["cuda", "Access", "recording", "FIELDS"]

FIELDS = ("block", "thread", "epoch", "order", "space", "array", "kind", "index", "itemsize")


@dataclass(frozen=True)
class Access:
    """One memory access by one thread. ``block``: the block's linear index; ``thread``: the thread's
    linear index in its block (``x + blockDim.x * (y + blockDim.y * z)``, so ``thread // 32`` is its warp);
    ``epoch``: barriers it had passed; ``order``: its how-many-th access of this space and kind in the
    epoch (lanes of a warp with equal ``order`` made one request); ``space``: ``"shared"`` or
    ``"global"``; ``array``: the array's number in order of first use; ``kind``: ``"r"``, ``"w"``
    or ``"a"`` (atomic); ``index``: the flat element index; ``itemsize``: bytes per element."""

    block: int
    thread: int
    epoch: int
    order: int
    space: str
    array: int
    kind: str
    index: int
    itemsize: int


class _Recorder:
    def __init__(self):
        self.accesses: list = []
        self.arrays: dict = {}   # id of an ndarray -> its number
        self.keep: list = []     # the arrays numbered, kept alive so their ids stay unique
        self.shapes: list = []   # (space, shape, dtype name) of each array, by number
        self.lock = threading.Lock()

    def log(self, space: str, ary: np.ndarray, idx, kind: str) -> None:
        t = threading.current_thread()
        if not isinstance(t, _sim_kernel.BlockThread) or t.__dict__.get("_gpulab_quiet"):
            return  # host code between launches, or the inside of an atomic (logged once, as "a")
        flat = np.arange(ary.size).reshape(ary.shape)[idx] if ary.ndim else np.zeros(1, int)
        grid = _grid_dim(t)
        block = t.blockIdx.x + grid[0] * (t.blockIdx.y + grid[1] * t.blockIdx.z)
        with self.lock:
            number = self.arrays.setdefault(id(ary), len(self.arrays))
            if number == len(self.keep):
                self.keep.append(ary)
                self.shapes.append((space, tuple(ary.shape), ary.dtype.name))
            counters = t.__dict__.setdefault("_gpulab_order", {})
            key = (space, kind)
            order = counters.get(key, 0)
            counters[key] = order + 1
            epoch = t.__dict__.get("_gpulab_epoch", 0)
            for i in np.atleast_1d(flat).ravel().tolist():
                self.accesses.append(Access(block, t.thread_id, epoch, order, space, number, kind, int(i),
                                            ary.itemsize))


_ACTIVE: list = []  # the recorder of the launch being recorded (one at a time)


def _grid_dim(t) -> tuple:
    return tuple(t._manager._grid_dim) + (1,) * (3 - len(t._manager._grid_dim))


class _WatchedShared(np.ndarray):
    """A shared array that reports each element access to the active recorder."""

    def __getitem__(self, idx):
        if _ACTIVE:
            _ACTIVE[-1].log("shared", self, idx, "r")
        return np.ndarray.__getitem__(self, idx)

    def __setitem__(self, idx, value):
        if _ACTIVE:
            _ACTIVE[-1].log("shared", self, idx, "w")
        np.ndarray.__setitem__(self, idx, value)


def _poison(ary: np.ndarray) -> None:
    if np.issubdtype(ary.dtype, np.floating):
        ary.fill(np.nan)
    elif np.issubdtype(ary.dtype, np.integer):
        ary.fill(np.iinfo(ary.dtype).max)


_ALLOCATING = threading.Lock()


def _shared_array(self, shape, dtype, alignment=None):
    """``FakeCUDAShared.array``, returning watched, poisoned arrays (one per source line, as the original),
    made under a lock: every thread of the block gets the same array."""
    from numba.core import types
    from numba.np import numpy_support

    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])
    with _ALLOCATING:  # the simulator's own version lets two threads each make "the" array (rarely): one only
        res = self._allocations.get(caller)
        if res is None:
            res = np.empty(shape, dtype).view(_WatchedShared)
            _poison(res)
            self._allocations[caller] = res
    return res


def _watched_getitem(self, idx):
    if _ACTIVE:
        _ACTIVE[-1].log("global", self._item._ary, idx, "r")
    return _original["get"](self, idx)


def _watched_setitem(self, idx, value):
    if _ACTIVE:
        _ACTIVE[-1].log("global", self._item._ary, idx, "w")
    return _original["set"](self, idx, value)


def _counting_syncthreads(self):
    _original["sync"](self)
    self.__dict__["_gpulab_epoch"] = self.__dict__.get("_gpulab_epoch", 0) + 1
    self.__dict__["_gpulab_order"] = {}


def _atomic(method):
    def wrapped(self, array, index, *args):
        if _ACTIVE and isinstance(array, _WatchedShared):
            _ACTIVE[-1].log("shared", array, index, "a")
        elif _ACTIVE and isinstance(array, _sim_arrays.FakeWithinKernelCUDAArray):
            _ACTIVE[-1].log("global", array._item._ary, index, "a")
        t = threading.current_thread()
        t.__dict__["_gpulab_quiet"] = True
        try:
            return method(self, array, index, *args)
        finally:
            t.__dict__["_gpulab_quiet"] = False
    return wrapped


# Every launch gets its shared arrays from _shared_array: one array per allocation, poisoned, watched (it
# records only inside `recording`).
_sim_api.FakeCUDAShared.array = _shared_array

_original: dict = {}
_ATOMICS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "max", "min", "exch", "cas", "compare_and_swap")


@contextlib.contextmanager
def recording():
    """Record every memory access of the simulator launches inside the ``with`` block.

    Yields the recorder: ``.accesses`` fills with :class:`Access` records (in no particular order across
    threads), ``.shapes[k]`` is ``(space, shape, dtype name)`` of array number ``k``."""
    recorder = _Recorder()
    _original.update(get=_sim_arrays.FakeWithinKernelCUDAArray.__getitem__,
                     set=_sim_arrays.FakeWithinKernelCUDAArray.__setitem__,
                     sync=_sim_kernel.BlockThread.syncthreads)
    atomics = {name: getattr(_sim_api.FakeCUDAAtomic, name) for name in _ATOMICS
               if hasattr(_sim_api.FakeCUDAAtomic, name)}
    _sim_arrays.FakeWithinKernelCUDAArray.__getitem__ = _watched_getitem
    _sim_arrays.FakeWithinKernelCUDAArray.__setitem__ = _watched_setitem
    _sim_kernel.BlockThread.syncthreads = _counting_syncthreads
    for name, method in atomics.items():
        setattr(_sim_api.FakeCUDAAtomic, name, _atomic(method))
    _ACTIVE.append(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.remove(recorder)
        _sim_arrays.FakeWithinKernelCUDAArray.__getitem__ = _original["get"]
        _sim_arrays.FakeWithinKernelCUDAArray.__setitem__ = _original["set"]
        _sim_kernel.BlockThread.syncthreads = _original["sync"]
        for name, method in atomics.items():
            setattr(_sim_api.FakeCUDAAtomic, name, method)
