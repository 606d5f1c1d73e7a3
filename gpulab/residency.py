"""Which tensor storages a process holds right now, and how many bytes (lesson 11's FSDP).

On a GPU, ``torch.cuda.memory_allocated()`` answers "how many bytes are resident"; a CPU has no
such counter. :func:`live_storages` finds them instead: every tensor Python can reach
(``gc.get_objects()``), plus every tensor the autograd graph saved for backward, reached from the
``grad_fn`` of the ``roots`` (a saved tensor created inside an ATen op has no Python object, so
``gc`` alone would miss, say, the weight ``F.linear`` keeps for its backward). Storages are told
apart by address, so views of one buffer count once::

    before = live_storages()
    ... h = layer(x) ...
    held = live_storages([h])
    extra = sum(n for ptr, n in held.items() if ptr not in before)   # bytes created and still held

Reading a saved tensor runs its unpack hook (``torch.autograd.graph.saved_tensors_hooks``), as
backward would: code whose unpack hook communicates must be measured on every rank alike.
"""
from __future__ import annotations

import gc
import warnings


def _add(found: dict, t) -> None:
    import torch

    if isinstance(t, (list, tuple)):
        for u in t:
            _add(found, u)
    elif isinstance(t, torch.Tensor) and t.device.type != "meta":
        storage = t.untyped_storage()
        if storage.data_ptr() and storage.nbytes():
            found[storage.data_ptr()] = storage.nbytes()


def _saved_by_graph(roots, found: dict) -> None:
    """Add the tensors saved by every autograd node reachable from ``roots`` (tensors)."""
    stack = [r.grad_fn for r in roots if getattr(r, "grad_fn", None) is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names = [n for n in dir(node) if n.startswith("_saved_")]
        if hasattr(node, "saved_tensors"):  # a Python autograd.Function's ctx: its saved tensors, its attributes
            names.append("saved_tensors")
            _add(found, list(vars(node).values()))
        for name in names:
            try:
                _add(found, getattr(node, name))
            except RuntimeError:  # already freed by a backward pass
                pass
        stack.extend(fn for fn, _ in node.next_functions)


def live_storages(roots=(), python: bool = True) -> dict:
    """``{storage address: bytes}`` of every tensor storage reachable from Python (unless ``python`` is
    False: then only ``roots`` themselves) or saved by the autograd graph behind ``roots`` (tensors);
    CPU and GPU storages alike."""
    import torch

    found: dict = {}
    with warnings.catch_warnings():  # isinstance on every live object touches deprecated module attributes
        warnings.simplefilter("ignore")
        for obj in gc.get_objects() if python else roots:
            if isinstance(obj, torch.Tensor):
                _add(found, obj)
    _saved_by_graph(roots, found)
    return found


def extra_bytes(now: dict, before: dict) -> int:
    """Bytes of the storages in ``now`` that were not in ``before`` (both from :func:`live_storages`)."""
    return sum(n for ptr, n in now.items() if ptr not in before)
