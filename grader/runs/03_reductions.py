"""The learner side of lab 03_reductions: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/03_reductions.py``).
"""
from __future__ import annotations

from functools import reduce

import torch

from gpulab.compare import guard_elements, padded
from grader.exercise import entry
from grader.runs import observe as kernels

PAD_VALUE = 1.0e4  # what the padding after an input holds (gpulab.compare.guard_elements of it)


def _place(x: torch.Tensor, device, row_pad: int = 0) -> torch.Tensor:
    """``x`` as the kernel sees it: at the start of a buffer whose trailing padding holds PAD_VALUE, or
    with ``row_pad`` > 0 a row-padded view, rows N + row_pad elements apart (stride(0) > N), the gaps
    and the tail holding PAD_VALUE."""
    if not row_pad:
        return padded(x, device, fill=PAD_VALUE)
    M, N = x.shape
    storage = torch.full((M * (N + row_pad) + guard_elements(device),), PAD_VALUE, dtype=x.dtype, device=device)
    view = storage[: M * (N + row_pad)].view(M, N + row_pad)[:, :N]
    view.copy_(x)
    return view


def _block_kwargs(block_n) -> dict:
    return {} if block_n is None else {"BLOCK_N": block_n}


def _softmax_run(ns, case, device):
    x = _place(case.inputs["x"], device, case.inputs.get("row_pad", 0))
    fn, kw = entry(ns, "softmax"), _block_kwargs(case.inputs["block_n"])
    return kernels.observe_out(lambda out: fn(x, **kw, out=out), x.shape, x.dtype, device, inputs={"x": x})


def _watched(combine):
    """``combine`` called on copies of its arguments; ``mutated`` records whether it wrote into them."""
    mutated = []

    def call(p, q):
        pc, qc = p.clone(), q.clone()
        r = combine(pc, qc)
        same = torch.equal(pc.nan_to_num(), p.nan_to_num()) and torch.equal(qc.nan_to_num(), q.nan_to_num())
        mutated.append(not same)
        return r
    return call, mutated


_LEFT_FOLD = "left fold ((s0 + s1) + s2) + ..."


def _chunks(splits) -> list:
    """The column ranges (lo, hi) of the chunks between ``splits``."""
    return list(zip(splits[:-1], splits[1:]))


def _stats_observe(stats, part, kw: dict, alloc: bool, device) -> dict:
    """softmax_stats on ``part``: into a poisoned ``out``, or (``alloc``) with ``out`` left to its default,
    None, with the states it returns as ``out`` (the name of its type if it is no tensor)."""
    if not alloc:
        return kernels.observe_out(lambda out: stats(part, **kw, out=out), (part.shape[0], 2), torch.float32,
                                   device, inputs={"x": part})
    call = kernels.observe_kernel(lambda: stats(part, **kw), {}, device, inputs={"x": part}, ablate=False)
    ret = call.returned
    return {**call.as_obs(), "out": ret.detach().cpu() if isinstance(ret, torch.Tensor) else type(ret).__name__}


def _stats_run(ns, case, device):
    stats, (combine, mutated) = entry(ns, "softmax_stats"), _watched(entry(ns, "combine_stats"))
    inp = case.inputs
    if inp["kind"] == "combine":
        a, b, c = (inp[k].to(device) for k in "abc")
        ab, ba = combine(a, b), combine(b, a)
        left, right = combine(combine(a, b), c), combine(a, combine(b, c))
        return {"ab": ab.cpu(), "ba": ba.cpu(), "left": left.cpu(), "right": right.cpu(),
                "combine_mutated": any(mutated)}
    x, kw, row_pad, alloc = inp["x"], _block_kwargs(inp["block_n"]), inp.get("row_pad", 0), inp["kind"] == "alloc"
    whole = _place(x, device, row_pad)
    # Each chunk (M, hi - lo), then the whole x; with row_pad a chunk is a column slice of the row-padded whole.
    parts = [whole[:, lo:hi] if row_pad else _place(x[:, lo:hi].contiguous(), device)
             for lo, hi in _chunks(inp["splits"])] + [whole]
    seen = [_stats_observe(stats, part, kw, alloc, device) for part in parts]
    last = seen[-1]
    obs = {"chunks": [r["out"] for r in seen[:-1]], "whole": last["out"],
           "launches": [name for r in seen for name in r["launches"]],
           "own_launches": [name for r in seen for name in r["own_launches"]],
           "guard": next((r["guard"] for r in seen if r["guard"]), None),
           "oob_read": next((r["oob_read"] for r in seen if r["oob_read"]), None),
           "returned_out": all(r["returned_out"] for r in seen),
           "ablated": last["ablated"], "written_outside": last["written_outside"], "inputs_after": last["inputs_after"]}
    # The learner's own chunk states, combined in three orders (the allocating case: the first only).
    states = [s.to(device) for s in obs["chunks"] if isinstance(s, torch.Tensor)]
    if len(states) == len(parts) - 1:
        obs["folds"] = {_LEFT_FOLD: reduce(combine, states).cpu()}
        if not alloc:
            right = reduce(lambda acc, s: combine(s, acc), states[::-1])
            obs["folds"].update({"right fold s0 + (s1 + (s2 + ...))": right.cpu(),
                                 "reversed order ((sK + sK-1) + ...)": reduce(combine, states[::-1]).cpu()})
    obs["combine_mutated"] = any(mutated)
    return obs


def _norm_run(op, ns, case, device):
    inp = case.inputs
    x = _place(inp["x"], device, inp.get("row_pad", 0))
    vectors = {k: inp[k].to(device) for k in ("weight", "bias") if k in inp}  # (N,) each, in argument order
    fn, kw = entry(ns, op), {"eps": inp["eps"], **_block_kwargs(inp["block_n"])}
    return kernels.observe_out(lambda out: fn(x, *vectors.values(), **kw, out=out), x.shape, x.dtype, device,
                               inputs={"x": x, **vectors})


def _rms_bwd_run(ns, case, device):
    inp = case.inputs
    x, dy = _place(inp["x"], device, inp.get("row_pad", 0)), _place(inp["dy"], device, inp.get("dy_row_pad", 0))
    w = inp["weight"].to(device)
    M, N = x.shape
    fn, blocks = entry(ns, "rmsnorm_backward"), _block_kwargs(inp["block_n"])
    return kernels.observe_kernel(lambda dx, dweight: fn(x, w, dy, eps=inp["eps"], out=(dx, dweight), **blocks),
                                  {"dx": ((M, N), x.dtype), "dweight": ((N,), w.dtype)}, device,
                                  inputs={"x": x, "weight": w, "dy": dy}).as_obs()
