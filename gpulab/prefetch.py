"""The host-to-device transfer calls a prefetching loop is written against (lesson 15).

A loop that feeds a GPU overlaps the copy of batch ``i + 1`` with the compute of batch ``i``: the
batch is *pinned* (page-locked host memory, the only kind the copy engine reads asynchronously),
copied with ``non_blocking=True`` on a side *stream*, and the compute stream *waits* for that
stream (a GPU-side dependency, the host never blocks) before it uses the batch. The host never
synchronises inside the loop: one synchronisation per step would drain the GPU's queue every time.

The loop takes its transfer calls from an object with this interface, so one loop runs on both:

- ``copy_stream``: the side stream copies go on;
- ``pin(t) -> t'``: a pinned copy of the host tensor ``t``;
- ``to_device(t, *, non_blocking, stream) -> t'``: the device copy of ``t``, issued on ``stream``
  (``None``: the current stream);
- ``wait(stream)``: the current (compute) stream waits for everything issued on ``stream`` so far;
- ``synchronize()``: the host waits for the device.

:class:`CudaTransfers` does it on a GPU. :class:`RecordingTransfers` does it on the CPU and records
every call in ``log``, so the loop's contract (pinned, non-blocking, one batch ahead, a wait before
each use and none that serialises the next copy, no synchronisation inside the loop) is checked
without a GPU; lab 15's check reads the log.
"""
from __future__ import annotations

import contextlib

import torch


class CudaTransfers:
    """The transfer calls on a CUDA device: pinned memory, ``non_blocking`` copies, a side stream."""

    def __init__(self, device: str = "cuda"):
        self.device = torch.device(device)
        self.copy_stream = torch.cuda.Stream(self.device)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        # Pinning allocates page-locked memory and copies into it: a real loader pins once, in a background
        # thread (DataLoader(pin_memory=True)), or reuses pinned buffers; an already pinned batch is kept.
        return t if t.is_pinned() else t.pin_memory()

    def to_device(self, t: torch.Tensor, *, non_blocking: bool = False, stream=None) -> torch.Tensor:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            out = t.to(self.device, non_blocking=non_blocking)
        if stream is not None:
            # Allocated on the side stream, used on the compute stream: tell the caching allocator, so
            # the memory is not handed out again before the compute that reads it has run.
            out.record_stream(torch.cuda.current_stream(self.device))
        return out

    def wait(self, stream) -> None:
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class RecordedStream:
    """A stand-in for a CUDA stream: just a name in the log."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class RecordingTransfers:
    """The transfer calls on the CPU, as if on a GPU, with every call recorded in ``log``.

    ``batches``: the host tensors the loop will be given (so copies are traced back to them).
    Log entries are tuples: ``("pin", i)``, ``("copy", i, pinned, non_blocking, stream_name)``,
    ``("wait", stream_name)``, ``("sync",)``; :meth:`step` wraps the loop's compute and logs
    ``("step", i, ready, source)``: ``i`` the step's number, ``source`` the batch index its input
    was copied from (``None`` for a tensor that is no device copy), ``ready`` whether a wait on the
    copy's stream came after the copy was issued (on a GPU, reading it earlier is a race).
    A pinned buffer written in place (``buf.copy_(batch)``) after a copy from it was issued, with no
    ``synchronize()`` since, logs ``("overwrite", j, i)`` when it is copied again, for batch ``i``:
    the copy of batch ``j`` may still be reading it (a race on a GPU); its batch is then found by
    content.
    """

    def __init__(self, batches: list):
        self.copy_stream = RecordedStream("copy")
        self.log: list[tuple] = []
        self._batches = list(batches)
        self._host = {id(b): i for i, b in enumerate(batches)}   # host tensor -> batch index
        self._pinned: dict[int, int] = {}                         # pinned copy -> batch index
        self._in_flight: dict[int, tuple] = {}                    # pinned copy -> (its version, batch) when copied
        self._device: dict[int, tuple] = {}                       # device copy -> (batch index, log position)
        self._keep: list = []                                     # keeps ids unique while the loop runs
        self._steps = 0

    def _batch_of(self, t) -> tuple[int | None, bool]:
        if id(t) in self._pinned:
            return self._pinned[id(t)], True
        return self._host.get(id(t)), False

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        index, _ = self._batch_of(t)
        self._pinned[id(out)] = index
        self._keep.append(out)
        self.log.append(("pin", index))
        return out

    def to_device(self, t: torch.Tensor, *, non_blocking: bool = False, stream=None) -> torch.Tensor:
        out = t.clone()
        index, pinned = self._batch_of(t)
        if pinned and id(t) in self._in_flight:   # a pinned buffer copied before: reused
            version, earlier = self._in_flight[id(t)]
            if t._version != version:             # rewritten since: which batch it holds now, by content
                index = next((i for i, b in enumerate(self._batches) if b.shape == t.shape and torch.equal(b, t)),
                             None)
                self.log.append(("overwrite", earlier, index))
        if pinned:
            self._in_flight[id(t)] = (t._version, index)
        name = stream.name if isinstance(stream, RecordedStream) else ("current" if stream is None else repr(stream))
        self._device[id(out)] = (index, len(self.log), name)
        self._keep.append(out)
        self.log.append(("copy", index, pinned, bool(non_blocking), name))
        return out

    def wait(self, stream) -> None:
        if isinstance(stream, RecordedStream):
            name = stream.name
        else:
            name = "None" if stream is None else type(stream).__name__
        self.log.append(("wait", name))

    def synchronize(self) -> None:
        self._in_flight.clear()   # every copy issued so far has finished
        self.log.append(("sync",))

    def step(self, compute):
        """``compute`` wrapped so each call is logged as a step (see the class docstring)."""
        def logged(x):
            source, at, stream = self._device.get(id(x), (None, len(self.log), "current"))
            ready = stream == "current" or any(e == ("wait", stream) for e in self.log[at + 1:])
            self.log.append(("step", self._steps, ready, source))
            self._steps += 1
            return compute(x)
        return logged
