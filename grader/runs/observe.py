"""One observed call of a learner's kernel wrapper (labs 02-08, 14, 15): the learner side of the kernel checks.

:func:`observe_kernel` calls the wrapper once with *poisoned* output buffers (NaN, followed by a
guard region) and inputs padded the same way, while :func:`gpulab.launches.watch_launches` records
which kernels launched, whether they are the learner's own, and, in the CPU interpreter, every
access outside the tensors a kernel was given. It then calls the wrapper a second time with the
learner's kernels *ablated* (each launch does nothing, and uninitialised PyTorch allocations hold
poison): an output that is still right was not computed by them. The result is a
:class:`KernelCall`; ``as_obs()`` turns it into plain tensors and values for the judge, whose
verdict ladder is :mod:`grader.kit.kernels` (see its docstring for what these rules catch).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from gpulab.compare import guard_elements, guard_report, poisoned
from gpulab.device import synchronize
from gpulab.launches import record_torch_ops, watch_launches

REJECTABLE = (ValueError, TypeError, AssertionError)
DEFAULT_TASK = "compute its result with your @triton.jit kernel, not with PyTorch operations"

# PyTorch operations a wrapper may run around its kernels (lesson 15): allocation, views, copies,
# validation. Anything else (sort, topk, max, gather, scatter ...) is work that belongs in the kernel.
WRAPPER_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "full", "full_like", "new_full", "ones", "ones_like", "arange", "fill_", "zero_", "detach", "alias", "view",
    "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice",
    "select", "clone", "_to_copy", "copy_", "contiguous", "lift_fresh", "lift_fresh_copy", "is_same_size",
    "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride"})


def _copy_to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _same_tensor(r, buf: torch.Tensor) -> bool:
    return isinstance(r, torch.Tensor) and r.data_ptr() == buf.data_ptr() and tuple(r.shape) == tuple(buf.shape)


@dataclass
class KernelCall:
    """What one call of a learner's wrapper did. Outputs and inputs are CPU copies."""

    outputs: dict                      # name -> the output buffer after the call
    returned: object = None            # what the wrapper returned (not transported)
    returned_out: bool = False         # it returned the buffers it was given
    launches: list = field(default_factory=list)       # every Triton kernel launched, in order
    own_launches: list = field(default_factory=list)   # those defined by the learner
    launch_args: list = field(default_factory=list)    # per launch, its tensor arguments' (dtype, numel, data_ptr)
    out_of_bounds: str | None = None   # the first write outside a buffer
    out_of_bounds_read: str | None = None  # the first read outside every tensor (interpreter only)
    written_outside: list = field(default_factory=list)  # outputs PyTorch modified in place
    ablated: dict | None = None        # outputs when the learner's kernels do not run
    rejected: str | None = None        # the wrapper's exception on an input it may reject
    inputs_after: dict = field(default_factory=dict)
    watched: object = None             # what the lab's own ``watch`` context yielded

    def as_obs(self) -> dict:
        """Plain observations for the judge; output buffers under their own names ("out" ...)."""
        return {**self.outputs, "output_names": list(self.outputs), "returned_out": self.returned_out,
                "launches": list(self.launches), "own_launches": list(self.own_launches),
                "guard": self.out_of_bounds, "oob_read": self.out_of_bounds_read,
                "written_outside": list(self.written_outside), "ablated": self.ablated,
                "rejected": self.rejected, "inputs_after": dict(self.inputs_after)}


def observe_kernel(call: Callable, outputs: dict, device, *, inputs: dict | None = None,
                   may_reject: bool = False, guard: int | None = None, watch: Callable | None = None,
                   ablate: bool = True) -> KernelCall:
    """Call ``call(**buffers)`` with poisoned buffers and observe everything a kernel check needs.

    ``outputs``: ``{name: (shape, dtype)}`` of the buffers to poison; ``call`` receives them by
    name and passes them to the learner's wrapper. ``inputs``: ``{name: tensor}`` the wrapper
    reads (their bases, for views; best made with :func:`gpulab.compare.padded`): copied after the
    call for the unmodified-inputs rule, and restored for the ablated run. ``may_reject``: a
    ValueError/TypeError/AssertionError is observed (``rejected``) instead of raised. ``watch``:
    ``buffers -> context manager`` entered around the real call only (a lab's own recorders);
    what it yields becomes ``watched``. ``launch_args`` lists what each launch was given (lesson 08:
    the int8 weight, and no float tensor as large as it). ``guard``: elements of guard region after
    each output (default: :func:`gpulab.compare.guard_elements`).
    """
    inputs = inputs or {}
    guard = guard_elements(device) if guard is None else guard
    bufs = {name: poisoned(tuple(shape), dtype, device, guard=guard) for name, (shape, dtype) in outputs.items()}
    views = {name: view for name, (view, _) in bufs.items()}
    versions = {name: view._version for name, view in views.items()}
    # The ablated run must see the inputs as they were, even if this call writes into them.
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in inputs.values()}
    snapshots = [(st, st.clone()) for st in storages.values()] if ablate else []
    result = KernelCall(outputs={})
    with watch_launches() as seen:
        with (watch(views) if watch else contextlib.nullcontext()) as watched:
            try:
                result.returned = call(**views)
            except REJECTABLE as exc:
                if not may_reject:
                    raise
                result.rejected = f"{type(exc).__name__}: {exc}"
    synchronize(device)
    result.watched = watched
    result.launches, result.own_launches = list(seen.names), seen.own
    result.launch_args = [launch.tensors for launch in seen.launches]
    names = {t.untyped_storage().data_ptr(): name for name, t in {**inputs, **views}.items()}
    result.out_of_bounds = seen.first_out_of_bounds(writes=True, names=names) or next(
        (r for name, (view, storage) in bufs.items() if (r := guard_report(storage, view.numel(), name))), None)
    result.out_of_bounds_read = seen.first_out_of_bounds(writes=False, names=names)
    result.written_outside = [name for name, view in views.items() if view._version != versions[name]]
    result.outputs = {name: _copy_to_cpu(view) for name, view in views.items()}
    result.inputs_after = {name: _copy_to_cpu(t) for name, t in inputs.items()}
    ret, bufs_in_order = result.returned, list(views.values())
    if len(bufs_in_order) == 1 and not isinstance(ret, (tuple, list)):
        result.returned_out = _same_tensor(ret, bufs_in_order[0])
    else:
        result.returned_out = (isinstance(ret, (tuple, list)) and len(ret) >= len(bufs_in_order)
                               and all(_same_tensor(r, b) for r, b in zip(ret, bufs_in_order)))
    if ablate and result.rejected is None and result.own_launches:
        after = [(st, st.clone()) for st, _ in snapshots]
        for storage, saved in snapshots:
            storage.copy_(saved)
        result.ablated = _ablated_outputs(call, outputs, device, inputs, guard)
        for storage, saved in after:  # callers may read the inputs as this call left them
            storage.copy_(saved)
    return result


def _ablated_outputs(call, outputs: dict, device, inputs: dict, guard: int) -> dict | None:
    """The outputs of a second call in which the learner's kernels do not run (None if it raised).
    With no output buffers (the wrapper allocates its own), the tensors it returns: "returned[i]"."""
    bufs = {name: poisoned(tuple(shape), dtype, device, guard=guard) for name, (shape, dtype) in outputs.items()}
    views = {name: view for name, (view, _) in bufs.items()}
    ran, ret = run_ablated(lambda: call(**views), device)
    if not ran:
        return None
    if not views:
        items = ret if isinstance(ret, (tuple, list)) else [ret]
        return {f"returned[{i}]": _copy_to_cpu(t) for i, t in enumerate(items) if isinstance(t, torch.Tensor)}
    return {name: _copy_to_cpu(view) for name, view in views.items()}


def run_ablated(call: Callable, device) -> tuple[bool, object]:
    """``(True, call())`` with the learner's kernels ablated (their launches do nothing, and
    uninitialised allocations hold poison); ``(False, None)`` if it raised."""
    with watch_launches(ablate=True, check_bounds=False):
        try:
            return True, call()
        except Exception:  # a wrapper that needs its kernel's results to finish: nothing to learn
            return False, None
        finally:
            synchronize(device)



@contextlib.contextmanager
def wrapper_torch_ops(allowed: frozenset = WRAPPER_OPS):
    """For ``observe_kernel(watch=lambda bufs: wrapper_torch_ops())``: yields the list of PyTorch
    operations (``"aten.<op>"``) the wrapper ran outside its kernels, except ``allowed``."""
    with watch_launches(check_bounds=False) as seen, record_torch_ops(seen, allowed) as ops:
        yield ops



def observe_out(call: Callable, shape, dtype: torch.dtype, device, **options) -> dict:
    """:func:`observe_kernel` of ``call(out=out)`` with one poisoned output ``out`` of ``shape`` and
    ``dtype`` (``options``: ``inputs``, ``may_reject`` ...), as the judge's observations."""
    return observe_kernel(call, {"out": (tuple(shape), dtype)}, device, **options).as_obs()
