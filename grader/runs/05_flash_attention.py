"""The learner side of lab 05_flash_attention: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/05_flash_attention.py``).
"""
from __future__ import annotations

import torch

from gpulab.compare import padded
from gpulab.device import synchronize
from gpulab.launches import count_matmul_flops, record_allocations, record_saved, watch_launches
from grader.exercise import entry, to_cpu
from grader.runs.observe import observe_kernel, run_ablated

ROW_PAD = 8  # extra elements after each row of D in the "rows" layout (stride(2) = D + ROW_PAD)


def _view(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "rows":
        return t[..., :-ROW_PAD]
    return t.transpose(1, 2) if layout == "bshd" else t


def _describe(ret) -> str:
    return type(ret).__name__ + (f" of length {len(ret)}" if isinstance(ret, (tuple, list)) else "")


def _reference_run(ns, case, device):
    x = case.inputs
    base = {n: x[n].to(device) for n in ("q", "k", "v")}
    q, k, v = (_view(base[n], x["layout"]) for n in ("q", "k", "v"))
    ret = entry(ns, "attention_reference")(q, k, v, causal=x["causal"], scale=x["scale"])
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        return {"bad_return": _describe(ret)}
    return {"out": to_cpu(ret[0]), "lse": to_cpu(ret[1]), "inputs_after": to_cpu(base)}


def _memory_run(ns, case, device):
    x = case.inputs
    return {"bytes": entry(ns, "attention_memory_bytes")(x["batch"], x["heads"], x["seq_q"], x["seq_k"],
                                                         x["dtype_bytes"], flash=x["flash"])}


def _ctx_tensors(grad_fn) -> list[tuple[str, tuple]]:
    """(attribute, shape) of every tensor kept on the Function's ctx outside save_for_backward (the
    backward node of a custom Function is its ctx), in lists, tuples and dicts too."""
    found = []
    for name, value in vars(grad_fn).items():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        found += [(name, tuple(t.shape)) for t in items if isinstance(t, torch.Tensor)]
    return found


def _pytorch_run(ns, case, device):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiles are tiny: on a busy CPU, OpenMP's thread sync would cost more than the work
    try:
        return _pytorch_observe(ns, case, device)
    finally:
        torch.set_num_threads(threads)


def _pytorch_observe(ns, case, device):
    """Forward (saved tensors, ctx attributes, shapes created) and backward (gradients, matmul FLOPs)."""
    x = case.inputs
    fn = entry(ns, "FlashAttentionPyTorch")
    q, k, v = (x[n].to(device).requires_grad_() for n in ("q", "k", "v"))
    args = (q, k, v, x["causal"]) if x["scale"] is None else (q, k, v, x["causal"], x["scale"])
    with record_saved() as saved, record_allocations() as fwd_alloc:
        out = fn.apply(*args)
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        return {"bad_return": "a tensor that requires grad" if isinstance(out, torch.Tensor) else type(out).__name__}
    lead = tuple(q.shape[:-1])  # (B, Sq) or (B, H, Sq): the log-sum-exp's shape
    lse = [to_cpu(t) for t in out.grad_fn.saved_tensors if tuple(t.shape) == lead]
    with count_matmul_flops() as flops, record_allocations() as bwd_alloc:
        out.backward(x["dout"].to(device))
    return {"out": to_cpu(out), **to_cpu({"dq": q.grad, "dk": k.grad, "dv": v.grad}), "lse": lse,
            "saved": [(s.shape, s.nbytes) for s in saved], "ctx": _ctx_tensors(out.grad_fn),
            "fwd_shapes": sorted(fwd_alloc.shapes), "bwd_shapes": sorted(bwd_alloc.shapes),
            "bwd_flops": flops.total, "inputs_after": to_cpu({"q": q, "k": k, "v": v})}


def _kernel_run(fn_name, ns, case, device) -> dict:
    """One observed call of ``fn_name`` (flash_attention, or flash_attention_causal, which returns stats):
    into poisoned ``out`` and ``lse``, or, for an ``alloc`` case, with both left to the wrapper (then
    the tensors it returns are observed)."""
    fn, causal_entry, x = entry(ns, fn_name), fn_name == "flash_attention_causal", case.inputs
    base = {n: padded(x[n], device) for n in ("q", "k", "v")}
    q, k, v = (_view(base[n], x["layout"]) for n in ("q", "k", "v"))
    b, h, sq, d = q.shape
    kwargs = dict(scale=x["scale"], BLOCK_M=x["block_m"], BLOCK_N=x["block_n"])
    kwargs.update({"return_stats": True} if causal_entry else {"causal": False})
    if x.get("alloc"):
        call = observe_kernel(lambda: fn(q, k, v, **kwargs), {}, device, inputs=base)
    else:
        call = observe_kernel(lambda out, lse: fn(q, k, v, out=out, lse=lse, **kwargs),
                              {"out": ((b, h, sq, d), q.dtype), "lse": ((b, h, sq), torch.float32)}, device,
                              inputs=base)
    ret = call.returned
    obs = {**call.as_obs(), "device": str(device)}
    if not isinstance(ret, (tuple, list)) or len(ret) != (3 if causal_entry else 2) or (
            x.get("alloc") and not all(isinstance(r, torch.Tensor) for r in ret)):
        obs["bad_return"] = _describe(ret)
    elif x.get("alloc"):
        obs["out"], obs["lse"] = to_cpu(ret)
    elif causal_entry:  # only what the judge reads of the stats
        stats = ret[2]
        obs["stats"] = ({key: to_cpu(stats.get(key)) for key in ("BLOCK_M", "BLOCK_N", "key_blocks")}
                        if isinstance(stats, dict) else f"a {type(stats).__name__}")
    return obs


def _backward_run(ns, case, device):
    x = case.inputs
    fn = entry(ns, "flash_attention_autograd")
    if x["layout"] == "bsd":  # as CS336's tests call it: positional causal, no scale
        cls = entry(ns, "FlashAttentionFunction")
        fn = lambda q, k, v, causal, scale: cls.apply(q, k, v, causal)  # noqa: E731
    q, k, v = (x[n].to(device).requires_grad_() for n in ("q", "k", "v"))
    with record_saved() as saved, watch_launches() as fwd:
        out = fn(q, k, v, causal=x["causal"], scale=x["scale"])
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return {"bad_return": "a tensor that requires grad" if isinstance(out, torch.Tensor) else type(out).__name__}
    saved = [(s.shape, s.nbytes) for s in saved]
    with watch_launches() as bwd:
        out.backward(x["dout"].to(device))
    synchronize(device)
    return {"out": to_cpu(out), **to_cpu({"dq": q.grad, "dk": k.grad, "dv": v.grad}), "saved": saved,
            "fwd_launches": list(fwd.names),
            "bwd_launches": list(bwd.names), "bwd_own_launches": bwd.own, "device": str(device),
            "guard": fwd.first_out_of_bounds(writes=True) or bwd.first_out_of_bounds(writes=True),
            "oob_read": fwd.first_out_of_bounds(writes=False) or bwd.first_out_of_bounds(writes=False),
            "ablated": _ablated_grads(fn, x, device) if bwd.own else None,
            "inputs_after": to_cpu({"q": q, "k": k, "v": v})}


def _ablated_grads(fn, x, device) -> dict | None:
    """dq, dk, dv of a forward and backward in which the learner's kernels do not run (on leaves
    of their own: the observed run's gradients stay as they are)."""
    q, k, v = (x[n].detach().to(device, copy=True).requires_grad_() for n in ("q", "k", "v"))

    def grads():
        fn(q, k, v, causal=x["causal"], scale=x["scale"]).backward(x["dout"].to(device))
        return {n: t.grad.detach().cpu() for n, t in (("dq", q), ("dk", k), ("dv", v)) if t.grad is not None}
    ran, got = run_ablated(grads, device)
    return got if ran else None
