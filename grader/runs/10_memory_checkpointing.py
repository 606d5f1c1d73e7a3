"""The learner side of lab 10_memory_checkpointing: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/10_memory_checkpointing.py``).
"""
from __future__ import annotations

import contextlib
import numbers

import torch

from gpulab.launches import count_flops
from gpulab.models import RECOMPUTE_CANDIDATES as CANDIDATES
from gpulab.models import make_block
from grader.exercise import entry

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def _dtype_bytes(dtype) -> int:
    """Bytes per element of a dtype or its name."""
    return torch.empty((), dtype=_DTYPES.get(dtype, dtype)).element_size()


def _number(x):
    """A plain number for the judge (numpy and 0-dim tensor scalars included), else its repr."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return int(x) if float(x).is_integer() else float(x)
    return repr(x)


@contextlib.contextmanager
def _packed_storages():
    """Record every tensor autograd packs for backward while the block runs: a list of
    ``(storage data_ptr, storage nbytes)``, one per pack, duplicates included (the judge counts them).
    The packed tensors are kept alive until the block ends, so no address is reused by a later tensor."""
    packs: list = []
    alive: list = []

    def pack(t):
        alive.append(t)
        packs.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield packs
    alive.clear()


def _scenario(name: str, inputs: dict):
    """Rebuild a scenario (function, arguments, tensors to exclude) from plain case inputs (CPU)."""
    gen = torch.Generator().manual_seed(inputs["seed"])
    n, m = inputs["n"], inputs["m"]
    if name == "square":      # one tensor saved twice by the same op
        x = torch.randn(n, m, generator=gen).requires_grad_()
        return (lambda x: x * x), (x,), ()
    if name == "views":       # two overlapping views of one storage
        x = torch.randn(n, 3 * m, generator=gen).requires_grad_()
        return (lambda x: x[:, :2 * m] @ x[:, m:].t()), (x,), ()
    if name == "linear":      # the weight is saved too, but it is a parameter
        x = torch.randn(n, m, generator=gen).requires_grad_()
        w = torch.nn.Parameter(torch.randn(2 * m, m, generator=gen))
        return (lambda x: torch.relu(torch.nn.functional.linear(x, w)).exp()), (x,), (w,)
    if name == "block":
        block = make_block(inputs["d_model"], inputs["n_heads"], None, inputs["dropout"], seed=inputs["seed"])
        x = torch.randn(n, m, inputs["d_model"], generator=gen).requires_grad_()
        return block, (x,), tuple(block.parameters())
    raise ValueError(name)


def _saved_run(ns, case, device):
    fn, args, exclude = _scenario(case.inputs["kind"], case.inputs)
    return {"bytes": _number(entry(ns, "saved_tensor_bytes")(fn, *args, exclude=exclude))}


def _formula_args(x: dict) -> tuple:
    return (x["batch"], x["seq"], x["d_model"], x["n_heads"], x["d_ff"], x["dropout"], _dtype_bytes(x["dtype"]))


def _formula_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "block_activation_bytes")(*_formula_args(x), stats_bytes=x.get("stats_bytes"))
    return {"bytes": _number(got)}


def _build_fn(x: dict, device):
    block = make_block(x["d_model"], x["n_heads"], None, x["dropout"], seed=x["seed"], device=device)
    gen = torch.Generator().manual_seed(x["seed"] + 1)
    xs = [torch.randn(x["batch"], x["seq"], x["d_model"], generator=gen)]
    if x["kind"] == "two_inputs":
        xs.append(torch.randn(x["batch"], x["seq"], x["d_model"], generator=gen))
        fn = lambda a, b: block.mlp(a) * b  # noqa: E731 - two inputs, both need gradients
    else:
        fn = block
    weight = torch.randn(x["batch"], x["seq"], x["d_model"], generator=gen).to(device)  # loss = (y * weight).sum()
    return block, fn, [t.to(device).requires_grad_() for t in xs], weight


def _fwd_bwd(block, f, xs, weight, seed):
    block.zero_grad(set_to_none=True)
    for t in xs:
        t.grad = None
    torch.manual_seed(seed)  # seeds the CPU and every GPU generator: the same dropout masks
    with count_flops() as counter:
        y = f(*xs)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"the checkpointed function must return the tensor fn returns, got {type(y).__name__}.")
        # The caller's stream goes on between forward and backward (later layers' dropout); a
        # recomputation in backward must leave it where it was.
        torch.rand(8)
        if y.device.type == "cuda":
            torch.rand(8, device=y.device)
        (y * weight).sum().backward()
    # the caller's random number generators: the CPU one, and the GPU one for CUDA tensors
    rng = [torch.get_rng_state()] + ([torch.cuda.get_rng_state(y.device).cpu()] if y.device.type == "cuda" else [])
    grads = {f"param {n}": (p.grad.detach().cpu() if p.grad is not None else None) for n, p in block.named_parameters()}
    for i, t in enumerate(xs):
        grads[f"input {i}"] = t.grad.detach().cpu() if t.grad is not None else None
    return y.detach().cpu(), grads, counter.get_total_flops(), rng


@contextlib.contextmanager
def _one_thread():
    """Run a case on one intra-op thread: the tensors are tiny, and on a busy CPU OpenMP's
    synchronisation between threads costs far more than the work (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _ckpt_observe(fn_plain, fn_ckpt, block, xs, weight, seed):
    """Forward and backward of ``fn_plain`` and of ``fn_ckpt``: outputs, gradients, FLOPs, the caller's
    RNG afterwards and the storages packed for backward (with the parameters' addresses), side by side."""
    with _one_thread():
        out_p, grads_p, flops_p, rng_p = _fwd_bwd(block, fn_plain, xs, weight, seed)
        out_c, grads_c, flops_c, rng_c = _fwd_bwd(block, fn_ckpt, xs, weight, seed)
        with count_flops() as counter, torch.no_grad():
            fn_plain(*xs)
        torch.manual_seed(seed)
        with _packed_storages() as packs_p:
            out = fn_plain(*xs)
        del out
        torch.manual_seed(seed)
        with _packed_storages() as packs_c:
            out = fn_ckpt(*xs)
        del out
    return {"out_plain": out_p, "out_ckpt": out_c, "grads_plain": grads_p, "grads_ckpt": grads_c,
            "flops_plain": flops_p, "flops_ckpt": flops_c, "flops_forward": counter.get_total_flops(),
            "rng_plain": rng_p, "rng_ckpt": rng_c,
            "packs_plain": packs_p, "packs_ckpt": packs_c,
            "param_ptrs": [prm.untyped_storage().data_ptr() for prm in block.parameters()],
            "input_bytes": sum(t.nbytes for t in xs)}


def _ckpt_run(ns, case, device):
    ck = entry(ns, "checkpoint")
    block, fn, xs, weight = _build_fn(case.inputs, device)
    return _ckpt_observe(fn, lambda *a: ck(fn, *a), block, xs, weight, case.inputs["seed"])


def _selective_run(ns, case, device):
    sel = entry(ns, "selective_forward")
    block, _, xs, weight = _build_fn(case.inputs, device)
    rec = frozenset(case.inputs["recompute"])
    return _ckpt_observe(block, lambda x: sel(block, x, rec), block, xs, weight, case.inputs["seed"])


def _plan_args(x):
    return (x["batch"], x["seq"], x["d_model"], x["n_heads"], x["d_ff"], x["dropout"], x["dtype_bytes"])


def _plan_run(ns, case, device):
    x = case.inputs
    costs = {}
    for cand in CANDIDATES:
        got = entry(ns, "recompute_cost")(*_plan_args(x), frozenset(cand), stats_bytes=x["stats_bytes"])
        costs[",".join(cand)] = [float(v) for v in got] if isinstance(got, (tuple, list)) else repr(got)
    plan = entry(ns, "plan_recompute")(*_plan_args(x), x["budget_bytes"], stats_bytes=x["stats_bytes"])
    return {"costs": costs, "plan": None if plan is None else sorted(str(p) for p in plan)}


def _zero_kwargs(x):
    return dict(param_dtype=_DTYPES[x["param_dtype"]], grad_dtype=_DTYPES[x["grad_dtype"]], optimizer=x["optimizer"],
                master_weights=x["master_weights"])


def _zero_call(x, zero, fsdp):
    """``fsdp(...)`` for the FSDP case, else ``zero(...)`` at the case's stage (the learner's or the reference)."""
    if x["stage"] == "fsdp":
        return fsdp(x["n_params"], x["world_size"], x["unit_params"], **_zero_kwargs(x))
    return zero(x["n_params"], x["world_size"], x["stage"], **_zero_kwargs(x))


def _zero_run(ns, case, device):
    got = _zero_call(case.inputs, entry(ns, "zero_memory"), entry(ns, "fsdp_memory"))
    return {"mem": {k: float(v) for k, v in got.items()} if isinstance(got, dict) else repr(got)}


def _offload_run(ns, case, device):
    x = case.inputs
    nbytes = entry(ns, "offload_bytes")(x["n_params"], x["world_size"], x["what"],
                                         param_dtype=_DTYPES[x["param_dtype"]], grad_dtype=_DTYPES[x["grad_dtype"]])
    t = entry(ns, "offload_step_time")(x["compute_s"], x["transfer_bytes"], x["pcie_gbps"], overlap=x["overlap"])
    timing = {k: (bool(v) if k == "hidden" else float(v)) for k, v in t.items()} if isinstance(t, dict) else repr(t)
    nbytes = _number(nbytes)
    return {"bytes": float(nbytes) if not isinstance(nbytes, str) else nbytes, "time": timing}
