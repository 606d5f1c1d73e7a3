"""Record the collectives a rank issues (lessons 11 and 12): which op, how many bytes, over how many
ranks, in what order and in which phase of the step.

On a CPU, timing gloo collectives teaches nothing about NCCL on NVLink. What transfers to a GPU
cluster is the **volume**: how many collectives a step issues and how many bytes each moves.
``record_collectives`` wraps the ``torch.distributed`` functions for the duration of a ``with``
block and logs one :class:`Event` per call, so a cell (or a check) can compare what really went
over the wire with the formula::

    with record_collectives() as log:
        loss.backward(); ddp.finish_gradient_synchronization()
    log.count("all_reduce"), log.nbytes("all_reduce")

``nbytes`` is the size ``n`` of the alpha-beta cost model, per op:

======================================  ==================================================
op                                      bytes logged
======================================  ==================================================
all_reduce, broadcast, reduce           the tensor
reduce_scatter_tensor, reduce_scatter   the input (all ``p`` chunks)
all_gather_into_tensor, all_gather      the output (all ``p`` chunks)
all_to_all_single, all_to_all           the input
send, isend / recv, irecv               the tensor sent / received
gather, scatter                         the rank's own tensor
barrier                                 0
======================================  ==================================================

Set ``log.phase`` (e.g. ``"forward"``, ``"backward"``) before each part of the work: every event
carries the phase it happened in, and ``count``/``nbytes`` can filter by it (lesson 12 counts the
collectives of a tensor-parallel layer's forward and backward this way).

``log.mark(label)`` adds your own event to the same timeline (the checks mark each gradient as
it is accumulated, to see whether an all-reduce started before backward ended). Only calls made
through the ``torch.distributed`` module's attributes are seen (``dist.all_reduce(...)``), not
functions imported by name before the block began, nor PyTorch's own C++ DDP.
"""
from __future__ import annotations

import inspect
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

WRAPPED = ("all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
           "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
           "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv", "barrier")
POINT_TO_POINT = ("send", "recv", "isend", "irecv")
COLLECTIVES = tuple(op for op in WRAPPED if op not in POINT_TO_POINT)

_SIZE_ARG = {"all_reduce": "tensor", "all_reduce_coalesced": "tensors", "broadcast": "tensor", "reduce": "tensor",
             "all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor",
             "all_gather_single": "output_tensor", "reduce_scatter": "input_list",
             "reduce_scatter_tensor": "input", "reduce_scatter_single": "input", "all_to_all": "input_tensor_list",
             "all_to_all_single": "input", "gather": "tensor", "scatter": "tensor", "send": "tensor",
             "recv": "tensor", "isend": "tensor", "irecv": "tensor"}


@dataclass
class Event:
    """One call (``op``) or one mark (``op == "mark"``, with its ``label``)."""

    op: str
    nbytes: int = 0
    numel: int = 0
    async_op: bool = False
    peer: int | None = None   # dst of a send, src of a recv or broadcast
    label: str = ""
    t: float = 0.0            # time.perf_counter() at the call
    phase: str = ""           # the log's phase when the call was made
    group_size: int = -1      # ranks in the call's process group


@dataclass
class CommLog:
    events: list = field(default_factory=list)
    phase: str = "forward"    # set it before each part of the work you want to tell apart

    def mark(self, label: str) -> None:
        self.events.append(Event("mark", label=label, t=time.perf_counter(), phase=self.phase))

    def calls(self, op: str | tuple | None = None, phase: str | None = None) -> list:
        ops = (op,) if isinstance(op, str) else op
        return [e for e in self.events if e.op != "mark" and (ops is None or e.op in ops)
                and (phase is None or e.phase == phase)]

    def count(self, op: str | tuple | None = None, phase: str | None = None) -> int:
        """Number of calls of ``op`` (a name, a tuple of names, or every op when ``None``), in ``phase``."""
        return len(self.calls(op, phase))

    def nbytes(self, op: str | tuple | None = None, phase: str | None = None) -> int:
        """Total bytes of the calls of ``op`` in ``phase``."""
        return sum(e.nbytes for e in self.calls(op, phase))

    def clear(self) -> None:
        self.events.clear()

    def summary(self) -> dict:
        """``{op: (calls, bytes)}`` for every op seen."""
        out: dict = {}
        for e in self.calls():
            n, b = out.get(e.op, (0, 0))
            out[e.op] = (n + 1, b + e.nbytes)
        return out

    def describe(self) -> str:
        """One line per phase, e.g. ``"forward: all_reduce x1 (768 B); backward: all_reduce x1 (768 B)"``."""
        parts = []
        for phase in dict.fromkeys(e.phase for e in self.calls()):
            ops = dict.fromkeys(e.op for e in self.calls(phase=phase))
            parts.append(f"{phase}: " + ", ".join(
                f"{op} x{self.count(op, phase)} ({self.nbytes(op, phase)} B)" for op in ops))
        return "; ".join(parts) or "no collectives"

    def as_dicts(self) -> list:
        """The calls as plain dicts ``{"op", "phase", "bytes", "group_size"}`` (to return from a rank)."""
        return [{"op": e.op, "phase": e.phase, "bytes": e.nbytes, "group_size": e.group_size} for e in self.calls()]


def _tensor_bytes(x) -> tuple[int, int]:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size(), x.numel()
    if isinstance(x, (list, tuple)):
        sizes = [_tensor_bytes(t) for t in x]
        return sum(s[0] for s in sizes), sum(s[1] for s in sizes)
    return 0, 0


def _group_size(group) -> int:
    import torch.distributed as dist

    try:
        return dist.get_world_size(group) if group is not None else dist.get_world_size()
    except Exception:  # no process group (a unit test), or a group this rank is not in
        return -1


_local = threading.local()


def _wrap(op: str, original, log: CommLog):
    sig = inspect.signature(original)

    def wrapper(*args, **kwargs):
        if getattr(_local, "depth", 0):  # a wrapped op calling another one: log the outer call only
            return original(*args, **kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
            arguments = bound.arguments
        except TypeError:
            arguments = {}
        nbytes, numel = _tensor_bytes(arguments.get(_SIZE_ARG.get(op, ""), None))
        peer = arguments.get("dst", arguments.get("src"))
        log.events.append(Event(op, nbytes, numel, bool(arguments.get("async_op", False)) or op in ("isend", "irecv"),
                                peer if isinstance(peer, int) else None, t=time.perf_counter(), phase=log.phase,
                                group_size=_group_size(arguments.get("group"))))
        _local.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.depth = 0

    wrapper.__wrapped__ = original
    wrapper.__name__ = op
    return wrapper


@contextmanager
def record_collectives(log: CommLog | None = None):
    """Log every ``torch.distributed`` call made inside the block; yields the :class:`CommLog`.

    Both ``torch.distributed.<op>`` and ``torch.distributed.distributed_c10d.<op>`` are wrapped.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    log = CommLog() if log is None else log
    saved = []
    for op in WRAPPED:
        original = getattr(dist, op, None)
        if original is None:
            continue
        wrapper = _wrap(op, original, log)
        for module in (dist, c10d):
            if getattr(module, op, None) is original:
                saved.append((module, op, original))
                setattr(module, op, wrapper)
    try:
        yield log
    finally:
        for module, op, original in saved:
            setattr(module, op, original)
