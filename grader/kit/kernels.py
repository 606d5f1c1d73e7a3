"""The verdicts every kernel check gives (labs 02-08), on one observed call of a learner's kernel wrapper.

Learner side (:mod:`grader.runs.observe`), :func:`observe_kernel` calls the wrapper once with
*poisoned* output buffers (NaN,
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

from typing import Callable

import torch

from gpulab.compare import compare
from grader.exercise import Neutral, changed_inputs
from grader.runs.observe import (  # noqa: F401 - the learner side, re-exported for the checks' judges
    DEFAULT_TASK,
    REJECTABLE,
    WRAPPER_OPS,
    KernelCall,
    observe_kernel,
    observe_out,
    run_ablated,
    wrapper_torch_ops,
)

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

def judge_out(case, obs: dict, fn_name: str, expected: torch.Tensor, dtype: torch.dtype, *,
              may_reject: bool = False, **tolerances):
    """:func:`judge_kernel` for one output ``out``, compared with ``expected`` by
    :func:`gpulab.compare.compare` (``tolerances``: its ``atol`` and ``rtol``; default per dtype)."""
    return judge_kernel(case, obs, fn_name, lambda outs: compare(outs["out"], expected, dtype=dtype, name=fn_name,
                                                                 **tolerances), may_reject=may_reject)
