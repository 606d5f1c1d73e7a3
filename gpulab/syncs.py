"""Finding host syncs (lesson 06): every place a step makes the CPU wait for a tensor's value.

On a GPU, the CPU queues kernels and runs ahead; reading a value back (``.item()``, ``bool(t)`` in an
``if``, ``print(t)``, ``.tolist()``, ``.numpy()``, ``.cpu()``) or an operator whose output *size* depends on
the data (``nonzero``, boolean-mask indexing, ``unique``) makes it wait until the queue drains. On a CPU
nothing waits, so syncs are invisible in timings: :class:`SyncDetector` finds them by what the code asks
for, device-independently. It is a ``TorchFunctionMode`` (it sees the Tensor methods Python calls:
``item``, ``__bool__``, ``__format__`` ...) plus a ``TorchDispatchMode`` backstop for the scalar read
(``aten._local_scalar_dense``) that C++ code reaches without passing Python. Each finding records the
call and the line of the caller's code. On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` is the
runtime's own detector; :func:`cuda_sync_debug` turns it on around a block.
"""
from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods that hand a value (or its size) to Python: each is a sync on a GPU.
VALUE_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__format__",
               "__repr__", "__str__", "__array__"}
DATA_DEPENDENT_SHAPES = {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere", "bincount",
                         "repeat_interleave"}


@dataclass
class Sync:
    """One host sync: the call (``"Tensor.item"``) and the caller's line (``"file:line: code"``)."""

    call: str
    where: str


def _caller() -> str:
    """The innermost frame outside torch and this module: the line of code that asked for the value."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        detector = name.endswith("gpulab/syncs.py") and frame.name in ("__torch_function__", "__torch_dispatch__")
        if "/torch/" not in name and not detector and "/contextlib.py" not in name:
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "?"


class _Functions(TorchFunctionMode):
    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        bool_mask = (name == "__getitem__" and len(args) > 1 and isinstance(args[1], torch.Tensor)
                     and args[1].dtype == torch.bool)
        to_host = name in ("cpu", "to") and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu" and (
            name == "cpu" or "cpu" in [str(a) for a in args[1:]] + [str(v) for v in (kwargs or {}).values()])
        if not (name in VALUE_READS or name in DATA_DEPENDENT_SHAPES or bool_mask or to_host):
            return func(*args, **(kwargs or {}))
        if not self.detector.reading:  # a read inside a read (print -> __format__ -> item) counts once
            self.detector.found.append(Sync(f"Tensor.{name}" + (" with a boolean mask" if bool_mask else ""),
                                            _caller()))
        self.detector.reading += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.detector.reading -= 1


class _Dispatch(TorchDispatchMode):
    """The backstop: a scalar read that no Python-visible method asked for (C++ code calling item())."""

    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not self.detector.reading:
            self.detector.found.append(Sync("a scalar read (aten._local_scalar_dense)", _caller()))
        return func(*args, **(kwargs or {}))


class SyncDetector:
    """``with SyncDetector() as syncs: step()`` and ``syncs.found`` lists every host sync the step asked for.

    ``bool(syncs)`` is True when there was at least one. The detector runs the code unchanged (results are
    the same as without it)."""

    def __init__(self):
        self.found: list[Sync] = []
        self.reading = 0   # > 0 while a recorded read runs (its inner calls are not counted again)
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        self._stack.enter_context(_Functions(self))
        self._stack.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def __bool__(self) -> bool:
        return bool(self.found)

    def report(self) -> str:
        return "\n".join(f"  {s.call} at {s.where}" for s in self.found) or "  none"


@contextlib.contextmanager
def cuda_sync_debug(mode: str = "warn"):
    """On CUDA, make the runtime warn ("warn") or raise ("error") on every synchronizing call in the block."""
    if not torch.cuda.is_available():
        yield
        return
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


# --- the lesson's training step, with the syncs real code has -----------------------------------------------

def make_classifier(d_in: int = 16, d_hidden: int = 32, n_classes: int = 4, seed: int = 0,
                    device: str = "cpu") -> torch.nn.Module:
    """Linear -> ReLU -> Linear, input (B, d_in) float32, logits (B, n_classes); weights drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, n_classes))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model.to(device)


def new_stats(device: str = "cpu") -> dict:
    """The running statistics a training loop keeps, as 0-d tensors on ``device`` (updated in place)."""
    zero = lambda dtype: torch.zeros((), dtype=dtype, device=device)  # noqa: E731
    return {"loss": zero(torch.float32), "correct": zero(torch.int64), "clipped": zero(torch.int64),
            "skipped": zero(torch.int64)}


def train_step_with_syncs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, max_norm: float,
                          stats: dict) -> None:
    """One SGD step on (x (B, d_in) float32, y (B,) int64) as it is often written: correct, and full of syncs.

    A batch whose loss is not finite is skipped (parameters unchanged, counted in ``stats["skipped"]``);
    gradients are clipped to ``max_norm`` (counted in ``stats["clipped"]`` when the norm was above it); the
    loss sum and the number of correct predictions of the steps taken go to ``stats["loss"]`` and
    ``stats["correct"]``."""
    logits = model(x)                                          # (B, n_classes)
    loss = torch.nn.functional.cross_entropy(logits, y)
    if not torch.isfinite(loss):                               # sync: Python branches on a tensor's value
        print(f"skipping a step: loss {loss.item()}")           # sync
        stats["skipped"] += 1
        return
    model.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if norm.item() > max_norm:                                 # sync
        stats["clipped"] += 1
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    stats["loss"] += loss.item()                               # sync
    stats["correct"] += (logits.argmax(-1) == y).sum().item()  # sync
