"""One observed call of a learner's kernel wrapper, and the verdicts every kernel check gives (labs 02-08).

Learner side, :func:`observe_kernel` calls the wrapper once with *poisoned* output buffers (NaN,
followed by a guard region) and inputs padded the same way, while
:func:`gpulab.launches.watch_launches` records which kernels launched, whether they are the
learner's own, and, in the CPU interpreter, every access outside the tensors a kernel was given
(and skips those outside their storages). So a missing mask gives a verdict at any block size,
never a dead process: on the CPU the bounds check does it, on a GPU the guard regions and input
padding do, as long as the largest Triton block (``gpulab.compare.guard_elements``).
It then calls the wrapper a second time with the learner's kernels *ablated* (each launch does
nothing, and uninitialised PyTorch allocations hold poison, so no scratch tensor keeps the first
call's values by chance): an output that is still right was not computed by them.
The result is a :class:`KernelCall`; ``as_obs()`` turns it into plain tensors and values.

Judge side, the verdict ladder, first failing rung wins, each message written once here:

1. rejected: the wrapper raised on an input it may reject (a Neutral pass) or on a valid one;
2. no kernel launched;
3. not your kernel: only kernels from gpulab, the grader, Triton, PyTorch or another package ran;
4. computed outside your kernels: the ablated run still gives the right output;
5. out of bounds: a store wrote past a buffer (interpreter bounds check or guard region);
6. `out` not returned;
7. numerical mismatch (the lab's comparison and diagnosis), with any out-of-bounds read noted;
8. out-of-bounds read with an otherwise right output; 9. an input modified.

Labs whose judges insert their own rungs (04's PyTorch-op and launch-count rules, 05's return
tuple) call the rungs one by one; :func:`judge_kernel` is the whole ladder. For the common case,
a wrapper with one output ``out`` (labs 02 and 03), :func:`observe_out` and :func:`judge_out` are
the two sides in one call each.

Limits. Everything in the learner's process is ultimately forgeable; the judge only reads
observations. What these rules catch: PyTorch doing the work next to a token or no-op kernel
(any write path: ``out.copy_``, ``out.data``, numpy views, since ablation looks at the result,
not at how it was written), a name appended to the launch record by walking the call stack (no
kernel of the learner's ran, so ablation still sees the right output), kernels borrowed from
gpulab, the grader or a package. What they do not catch: a wrapper that detects the ablated run
(for instance by inspecting ``KernelInterface.__getitem__`` or the check's frames) and behaves
differently in it; a learner kernel that does a token share of the work PyTorch's result depends
on (copying the result into ``out``, or an input into a scratch tensor: without it the ablated
run is wrong too; 04 and 08 add their own PyTorch-op and allocation rules against that, 15 uses
:func:`wrapper_torch_ops` and :func:`torch_ops_verdict`); kernels
launched other than by ``kernel[grid](...)`` (``kernel.run``) are not seen at all; reads and
writes far outside every buffer on a GPU (compiled kernels are not bounds-checked: the guard
region covers an unmasked 1-D block of any size and 2-D tiles overhanging by less than it). In a
notebook, the lab's locked cells count as the learner's own code (only the grader can tell them
apart).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from gpulab.compare import compare, guard_elements, guard_report, poisoned
from gpulab.device import synchronize
from gpulab.launches import record_torch_ops, watch_launches
from grader.exercise import Neutral, changed_inputs

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


# --- the verdict ladder (judge side) --------------------------------------------------------------

class Verdict(str):
    """A failing verdict; ``stage`` names the rung of the ladder that gave it."""

    stage = ""


def _verdict(stage: str, text: str) -> Verdict:
    v = Verdict(text)
    v.stage = stage
    return v


def _names(names: list) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def rejected_verdict(obs: dict, fn_name: str, may_reject: bool):
    """Rung 1: the wrapper raised. Allowed (and worth nothing) on an input it may reject."""
    if obs.get("rejected") is None:
        return None
    if may_reject:
        return Neutral(f"rejected with {obs['rejected'][:120]} (allowed; not scored)")
    return _verdict("rejected", f"{fn_name} raised {obs['rejected']}, but this input is valid.")


def launch_verdict(obs: dict, fn_name: str, task: str = DEFAULT_TASK) -> Verdict | None:
    """Rungs 2 and 3: some kernel launched, and at least one is the learner's own."""
    if not obs["launches"]:
        return _verdict("no_launch", f"no Triton kernel was launched: {fn_name} must {task}.")
    if "own_launches" in obs and not obs["own_launches"]:
        names = _names(list(dict.fromkeys(obs["launches"])))
        return _verdict("not_own", f"the Triton kernel(s) that ran ({names}) are not yours: {fn_name} must {task}. "
                                   "Write the kernel with @triton.jit in your answer; kernels from gpulab, the "
                                   "grader, Triton or PyTorch do not count.")
    return None


def _nontrivial(outputs: dict) -> bool:
    """Some output holds a value a do-nothing or zero-filling wrapper could not produce."""
    return any(t.numel() and bool(t.double().nan_to_num(0.0).ne(0).any()) for t in outputs.values())


def outside_verdict(obs: dict, fn_name: str, correct: Callable[[dict], bool]) -> Verdict | None:
    """Rung 4: with the learner's kernels switched off, the outputs are still right. ``correct``
    receives the ablated outputs (``{name: tensor}``) and says whether they are right: for several
    outputs, whether any of them is (each must come from the kernels)."""
    ablated = obs.get("ablated")
    if not ablated or not _nontrivial(ablated) or not correct(ablated):
        return None
    how = " (PyTorch wrote into the output in place)" if obs.get("written_outside") else ""
    return _verdict("outside", (
        f"{fn_name} gives the right result even when your kernels do not run: the check called it again with "
        f"every @triton.jit kernel you wrote replaced by one that does nothing, and the result was still right. "
        f"It is computed outside your kernels{how}; compute it inside them."))


def bounds_verdict(obs: dict) -> Verdict | None:
    """Rung 5: a store wrote outside the buffers (bounds check in the interpreter, guard regions)."""
    return _verdict("out_of_bounds", obs["guard"]) if obs.get("guard") else None


def return_verdict(obs: dict, fn_name: str, returns: str | None = None) -> Verdict | None:
    """Rung 6: the wrapper wrote into the buffers it was given and returned them."""
    if obs.get("returned_out"):
        return None
    return _verdict("not_returned", returns or (
        f"{fn_name} must write its result into `out` when `out` is given, and return `out` "
        "(the check passes a buffer pre-filled with NaN)."))


def mismatch_verdict(report: str, obs: dict) -> Verdict:
    """Rung 7: the lab's comparison report, with an out-of-bounds read (often its cause) noted."""
    if obs.get("oob_read"):
        report += f"\n  Also, {obs['oob_read']}"
    return _verdict("mismatch", report)


def final_verdict(case, obs: dict) -> Verdict | None:
    """Rungs 8 and 9 for a right output: no out-of-bounds read, inputs unmodified."""
    if obs.get("oob_read"):
        return _verdict("out_of_bounds_read", obs["oob_read"] + " The output is right, but such a load reads "
                        "memory that is not the tensor's: on a GPU it can fault or read another buffer.")
    changed = changed_inputs(case, obs.get("inputs_after", {}))
    return _verdict("input_modified", changed) if changed else None


@contextlib.contextmanager
def wrapper_torch_ops(allowed: frozenset = WRAPPER_OPS):
    """For ``observe_kernel(watch=lambda bufs: wrapper_torch_ops())``: yields the list of PyTorch
    operations (``"aten.<op>"``) the wrapper ran outside its kernels, except ``allowed``."""
    with watch_launches(check_bounds=False) as seen, record_torch_ops(seen, allowed) as ops:
        yield ops


def torch_ops_verdict(ops: list, fn_name: str, task: str) -> Verdict | None:
    """The wrapper computed part of the result with PyTorch next to its kernel (the kernel copies or
    does a token share, PyTorch the rest: ablation alone cannot see it). ``task``: what the kernel does."""
    if not ops:
        return None
    names = _names(list(dict.fromkeys(ops))[:6])
    return _verdict("torch_ops", f"{fn_name} ran PyTorch operations outside your kernel ({names}): {task}. The "
                                 "wrapper only checks its arguments, allocates, and launches the kernel.")


def outputs_of(obs: dict) -> dict:
    return {name: obs[name] for name in obs.get("output_names", ["out"])}


def judge_kernel(case, obs: dict, fn_name: str, check: Callable[[dict], str | None], *, task: str = DEFAULT_TASK,
                 returns: str | None = None, may_reject: bool = False):
    """The whole ladder. ``check(outputs)`` compares ``{name: tensor}`` with the reference and
    returns a report (with the lab's diagnosis) or None."""
    rejected = rejected_verdict(obs, fn_name, may_reject)
    if rejected is not None:
        return rejected
    for rung in (lambda: launch_verdict(obs, fn_name, task),
                 lambda: outside_verdict(obs, fn_name, lambda outputs: check(outputs) is None),
                 lambda: bounds_verdict(obs), lambda: return_verdict(obs, fn_name, returns)):
        verdict = rung()
        if verdict:
            return verdict
    report = check(outputs_of(obs))
    if report:
        return mismatch_verdict(report, obs)
    return final_verdict(case, obs)


# --- one output `out` (the common case) ------------------------------------------------------------

def observe_out(call: Callable, shape, dtype: torch.dtype, device, **options) -> dict:
    """:func:`observe_kernel` of ``call(out=out)`` with one poisoned output ``out`` of ``shape`` and
    ``dtype`` (``options``: ``inputs``, ``may_reject`` ...), as the judge's observations."""
    return observe_kernel(call, {"out": (tuple(shape), dtype)}, device, **options).as_obs()


def judge_out(case, obs: dict, fn_name: str, expected: torch.Tensor, dtype: torch.dtype, *,
              may_reject: bool = False, **tolerances):
    """:func:`judge_kernel` for one output ``out``, compared with ``expected`` by
    :func:`gpulab.compare.compare` (``tolerances``: its ``atol`` and ``rtol``; default per dtype)."""
    return judge_kernel(case, obs, fn_name, lambda outs: compare(outs["out"], expected, dtype=dtype, name=fn_name,
                                                                 **tolerances), may_reject=may_reject)
