"""CUDA graphs and a faithful CPU stand-in (lesson 06).

A CUDA graph records the kernels a block of code launches, with their arguments *as pointers*, once
(capture); ``replay()`` relaunches the whole recording with one call. Python does not run again: no
print, no counter, no new allocation; kernels read the addresses they read at capture. So the contract
is: copy new inputs *into* the static input buffers, replay, read the static output buffers.

:func:`graph_api` returns the same small interface on both devices:

- ``api.graph()`` a new graph object with ``replay()``; ``api.capture(g)`` the context that records into it;
  ``api.warmup()`` the context for the warm-up runs CUDA wants before capture (a side stream);
- ``api.captures`` and ``api.replays`` count what happened; :func:`eager_ops` lists the compute operators a
  block ran outside a replay (lab 06's check: a graph runner that computes eagerly).

On CUDA it is ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``. On a CPU, :class:`RecordingGraph` records
the ATen operators run during capture (a ``TorchDispatchMode``) with the very tensor objects they read and
wrote, and ``replay()`` re-executes them into those same tensors: like a CUDA graph, a replay ignores
tensors created after capture, skips Python side effects, and overwrites the captured outputs in place.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _is_view(func) -> bool:
    """An operator whose output aliases an input without writing it (view, reshape of a contiguous tensor)."""
    schema = func._schema
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _is_view(func):
            self.ops.append((func, args, kwargs, out))
        return out


class RecordingGraph:
    """The CPU stand-in for ``torch.cuda.CUDAGraph``: capture records ATen ops, replay re-runs them in place."""

    def __init__(self, api: "RecordingGraphAPI"):
        self.api, self.ops, self.captured = api, [], False

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay() before capture: capture the graph first (with api.capture(g): ...).")
        self.api.replays += 1
        self.api.replaying = True   # what runs now is the graph, not the caller's eager code
        try:
            for func, args, kwargs, out in self.ops:
                new = func(*args, **kwargs)
                # out-of-place results land in the captured output tensors (their addresses are fixed)
                for old, fresh in zip(_tensors(out), _tensors(new)):
                    if old is not fresh:
                        old.copy_(fresh)
        finally:
            self.api.replaying = False


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class RecordingGraphAPI:
    """:func:`graph_api` on a CPU."""

    device = "cpu"

    def __init__(self):
        self.captures = 0
        self.replays = 0
        self.replaying = False

    def graph(self) -> RecordingGraph:
        return RecordingGraph(self)

    @contextlib.contextmanager
    def capture(self, g: RecordingGraph):
        if g.captured:
            raise RuntimeError("this graph is already captured: replay it, or make a new one with api.graph().")
        self.captures += 1
        with torch.no_grad(), _Recorder(g.ops):
            yield
        g.captured = True

    def warmup(self):
        return contextlib.nullcontext()


class CudaGraphAPI:
    """:func:`graph_api` on CUDA: ``torch.cuda.CUDAGraph`` with counters."""

    device = "cuda"

    def __init__(self):
        self.captures = 0
        self.replays = 0
        self._side = torch.cuda.Stream()

    def graph(self) -> "_CountedCudaGraph":
        return _CountedCudaGraph(self)

    @contextlib.contextmanager
    def capture(self, g: "_CountedCudaGraph"):
        self.captures += 1
        with torch.no_grad(), torch.cuda.graph(g.cuda_graph):
            yield

    @contextlib.contextmanager
    def warmup(self):
        """Warm-up runs on a side stream (what torch.cuda.graph's docs ask for), then rejoin."""
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(self._side):
            yield
        torch.cuda.current_stream().wait_stream(self._side)


class _CountedCudaGraph:
    """A ``torch.cuda.CUDAGraph`` whose replays its API counts."""

    def __init__(self, api: CudaGraphAPI):
        self.api, self.cuda_graph = api, torch.cuda.CUDAGraph()

    def replay(self) -> None:
        self.api.replays += 1
        self.cuda_graph.replay()


def graph_api(device: str):
    """The graph interface for ``device``: CUDA graphs on ``"cuda"``, the recording stand-in on ``"cpu"``."""
    return CudaGraphAPI() if device == "cuda" else RecordingGraphAPI()


# Reading and writing buffers, not computing: what a replaying call may run outside the graph.
BUFFER_OPS = {"copy_", "clone", "_to_copy", "detach", "alias", "empty", "empty_like", "empty_strided", "zeros_like",
              "lift_fresh", "zero_", "fill_"}


@contextlib.contextmanager
def eager_ops(api):
    """Yield a list of the ATen compute operators (names, ``"addmm"``...) the block runs outside a replay of
    ``api``'s graphs (copies and allocations are not computing). A CPU ``RecordingGraphAPI`` marks its replays;
    on CUDA a replay runs no ATen operator at all."""
    computed: list = []

    class _Eager(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if not getattr(api, "replaying", False) and name not in BUFFER_OPS:
                computed.append(name)
            return func(*args, **(kwargs or {}))

    with _Eager():
        yield computed
