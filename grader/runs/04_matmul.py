"""The learner side of lab 04_matmul: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/04_matmul.py``).
"""
from __future__ import annotations

import contextlib
import numbers

import torch

from gpulab.compare import guard_elements, padded
from gpulab.launches import record_stores, record_torch_ops, watch_launches
from grader.exercise import entry
from grader.runs import observe as kernels

# Extra elements at the end of each row of a row-padded operand (its gaps hold NaN: reading them shows)
ROW_PAD = 7


def _intensity_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "tile_intensity")(x["BLOCK_M"], x["BLOCK_N"], x["BLOCK_K"], x["K"], x["dtype_bytes"])
    if isinstance(got, (tuple, list)):
        got = [g if isinstance(g, (numbers.Number, str)) else repr(g) for g in got]
    return {"got": got if isinstance(got, list) else repr(got)}


def _plain_pair(value):
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            if all(float(v) == int(v) for v in value):
                return [int(v) for v in value]
        except (TypeError, ValueError):
            pass
    return repr(value)


def _order_run(ns, case, device):
    fn = entry(ns, "grouped_pid")
    x = case.inputs
    total = x["num_pid_m"] * x["num_pid_n"]
    return {"pairs": [_plain_pair(fn(pid, x["num_pid_m"], x["num_pid_n"], x["GROUP_M"])) for pid in range(total)]}


# PyTorch operations a wrapper may run around its kernel: the kit's allocation, views and copies, plus
# resizing an output. Anything else (mm, addmm, add, relu, gelu ...) is arithmetic that belongs inside the kernel.
_ALLOWED_TORCH_OPS = kernels.WRAPPER_OPS | {"resize_", "set_"}


def _layout(a_base, b_base, layout):
    """Rebuild the views on the learner's side (a view does not survive pickling)."""
    a = a_base.t() if layout in ("a_t", "both_t") else a_base
    b = b_base.t() if layout in ("b_t", "both_t") else b_base
    if layout == "b_sliced":
        b = b_base[:, ::2]
    if layout == "a_rows":  # (M, K + ROW_PAD) buffer seen as (M, K): a.stride(0) > K
        a = a_base[:, :-ROW_PAD]
    if layout == "b_rows":
        b = b_base[:, :-ROW_PAD]
    return a, b


@contextlib.contextmanager
def _recorders(out: torch.Tensor):
    """This lab's own recorders, around the learner's call: the stores into ``out`` (the program
    order), the launches (their launcher types) and the PyTorch arithmetic outside the kernels."""
    with record_stores(out) as stores, watch_launches(check_bounds=False) as seen, \
            record_torch_ops(seen, _ALLOWED_TORCH_OPS) as ops:
        yield stores, seen, ops


def _matmul_run(fn_name, ns, case, device):
    """The run of a matmul kernel exercise: ``fn_name(a, b, out=out, **blocks)``, or with the case's
    bias (the epilogue) ``fn_name(a, b, bias, activation=..., out=out, **blocks)``, observed."""
    x = case.inputs
    a_base, b_base = padded(x["a"], device), padded(x["b"], device)
    a, b = _layout(a_base, b_base, x["layout"])
    fn, inputs = entry(ns, fn_name), {"a": a_base, "b": b_base}
    args, kwargs = (a, b), dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), x["blocks"] or ()))
    if "bias" in x:  # the epilogue
        inputs["bias"] = padded(x["bias"], device)
        args, kwargs["activation"] = (a, b, inputs["bias"]), x["epilogue"]
    # The guard region covers everything an unmasked store of the case's tiles (256 x 256 when the
    # autotuner picks them) could reach: a missing mask is reported, never a write into memory
    # that belongs to someone else.
    M, N = a.shape[0], b.shape[1]
    bm, bn = x["blocks"][:2] if x["blocks"] else (256, 256)
    overhang = (-(-M // bm) * bm - M) * N + (-(-N // bn) * bn - N)
    result = kernels.observe_kernel(lambda out: fn(*args, out=out, **kwargs), {"out": ((M, N), a.dtype)},
                                    device, inputs=inputs, guard=guard_elements(device) + overhang,
                                    watch=lambda bufs: _recorders(bufs["out"]))
    stores, seen, ops = result.watched
    obs = {**result.as_obs(), "kinds": [launch.kind for launch in seen.launches], "torch_ops": ops,
           "device": str(device)}
    if x.get("order"):
        obs.update(_order_evidence(ns, a, b, bm, bn, x["blocks"][3]), tiles=_tiles(stores, N, bm, bn))
    return obs


def _tiles(stores, N: int, bm: int, bn: int):
    """Per program id, the tile [pid_m, pid_n] of its first store into the (M, N) output; None where
    the stores cannot be observed (compiled kernels)."""
    if not stores:
        return None
    first: dict = {}
    for pid, offset in stores:
        first.setdefault(pid, [offset // N // bm, offset % N // bn])
    return [first.get(pid) for pid in range(max(first) + 1)]


def _order_evidence(ns, a, b, bm, bn, g) -> dict:
    """What the learner's own grouped_pid says the order should be, and (compiled mode) whether the
    kernel's source calls it."""
    num_m, num_n = -(-a.shape[0] // bm), -(-b.shape[1] // bn)
    fn = ns.get("grouped_pid")
    own = None
    if callable(fn):
        try:
            own = [_plain_pair(fn(pid, num_m, num_n, g)) for pid in range(num_m * num_n)]
        except Exception as exc:  # noqa: BLE001 - the learner's function; reported by its own exercise
            own = f"grouped_pid raised {type(exc).__name__}: {exc}"
    src = getattr(ns.get("matmul_kernel"), "src", "") or ""  # a compiled JITFunction keeps its source
    return {"own_order": own, "num_pid": [num_m, num_n], "calls_grouped_pid": "grouped_pid" in src if src else None}


def _describe_configs(configs) -> dict:
    import triton

    if not isinstance(configs, (list, tuple)):
        return {"error": f"must return a list of triton.Config, got {type(configs).__name__}"}
    out = []
    for c in configs:
        if not isinstance(c, triton.Config):
            out.append({"type": type(c).__name__})
            continue
        kw = {k: (v if isinstance(v, (bool, int, float, str)) else repr(v)) for k, v in c.kwargs.items()}
        out.append({"type": "Config", "kwargs": kw, "num_warps": c.num_warps, "num_stages": c.num_stages,
                    "text": f"Config({kw}, num_warps={c.num_warps}, num_stages={c.num_stages})"})
    return {"configs": out}


def _autotune_run(ns, case, device):
    x = case.inputs
    configs = entry(ns, "matmul_configs")
    if x.get("kind") == "configs":
        return {dev: _describe_configs(configs(dev)) for dev in ("cuda", "cpu")}
    if device == "cpu":  # never let the interpreter benchmark a list of configs
        described = _describe_configs(configs("cpu"))
        if len(described.get("configs", [])) != 1:
            return {"skipped": "matmul_configs('cpu') must return exactly one config (see the first case)."}
    return _matmul_run("matmul_autotuned", ns, case, device)
