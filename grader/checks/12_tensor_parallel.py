"""Checks of lab 12, tensor parallelism: Megatron's f and g operators, column- and row-parallel
linear layers, the parallel MLP and self-attention, and the communication volume per layer.

Every distributed check is ONE launch of 4 CPU ranks over gloo (``gpulab.dist.launch``), which tests
both tensor-parallel sizes at once: size 2 on two groups, ranks {0, 1} and {2, 3} (so a collective
that forgets its ``group=`` or a shard indexed by the *global* rank is caught), and size 4 on all
ranks. In each rank the check builds the full single-device layer from the case's tensors, loads
the learner's shards with ``load_from_full``, runs forward and backward with the collectives
recorded (``gpulab.commlog.record_collectives``), and returns per-rank observations:
outputs, input gradients, weight and bias gradients, the loaded shards and every collective per
phase. The judge recomputes the single-device layer in float64 and compares each rank's shard.

Shard conventions (the docstrings in the lab say the same): rank ``r`` of a group of ``p``
- ColumnParallelLinear: ``weight = A[r*out/p:(r+1)*out/p]`` (out/p, in), ``bias`` the same rows;
- RowParallelLinear: ``weight = A[:, r*in/p:(r+1)*in/p]`` (out, in/p), ``bias`` (out,) whole;
- ParallelSelfAttention: heads ``r*H/p .. (r+1)*H/p``; ``qkv.weight = cat(Wq[rows], Wk[rows], Wv[rows])``
  with ``rows = r*hidden/p .. (r+1)*hidden/p``; ``proj`` row-parallel.
"""
from __future__ import annotations

import math

import torch

from gpulab.compare import compare
from grader.exercise import Benchmark, Case, Exercise, entry

LAB = "12_tensor_parallel"
TITLE = "Tensor parallelism: Megatron layers"

WORLD = 4                # ranks per launch: TP=2 on {0,1} and {2,3}, TP=4 on all
RANK_TIMEOUT_S = 20.0    # a hung learner rank ends the launch after this (plus the watchdog's slack)
TOL = dict(atol=1e-4, rtol=1e-4)
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")

_PEER_GONE = "Another rank exited or crashed while this one was waiting"  # gpulab.dist's note

# Verdicts that hold for every later case of the same learner code (a hang, a stub): the next
# cases answer at once instead of launching (and waiting) again. Keyed by exercise and the ids of
# the learner's objects, which are kept alive here so an id is never reused.
_STICKY: dict = {}


def _randint(gen, lo, hi) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _close(got, want, rel=1e-9) -> bool:
    try:
        return math.isclose(float(got), float(want), rel_tol=rel, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


# --- the rank side: runs in each of the 4 launched processes --------------------------------------

REGION_NAMES = {"copy": "CopyToParallelRegion", "reduce": "ReduceFromParallelRegion",
                "gather": "GatherFromParallelRegion", "scatter": "ScatterToParallelRegion"}


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _grad(t):
    return None if t is None or getattr(t, "grad", None) is None else t.grad.detach().clone()


def _param(module, name):
    p = getattr(module, name, None) if module is not None else None
    return p if isinstance(p, torch.Tensor) else None


def _pgrad(module, name):
    return _grad(_param(module, name))


def _pvalue(module, name):
    p = _param(module, name)
    return None if p is None else p.detach().clone()


def _fwd_bwd(forward, dy_for):
    """Run forward and backward with every collective recorded; returns (y, calls)."""
    from gpulab.commlog import record_collectives

    with record_collectives() as log:
        y = forward()
        log.phase = "backward"
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"forward must return a torch.Tensor, got {type(y).__name__}.")
        dy = dy_for(y)
        if y.shape == dy.shape:  # else no backward: the judge reports the shape (the same on every rank)
            # (y * dy).sum() gives y exactly the gradient dy; y.backward(dy) would import sympy (3 s per rank)
            (y * dy).sum().backward()
    return y.detach().clone(), log.as_dicts()


def _try_build(build):
    """Constructing with sizes that do not divide must raise; report what happened."""
    try:
        build()
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's choice of exception is what we check
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None, "message": ""}


def _linear(W, b):
    full = torch.nn.Linear(W.shape[1], W.shape[0], bias=b is not None)
    with torch.no_grad():
        full.weight.copy_(W)
        if b is not None:
            full.bias.copy_(b)
    return full


def _rank_regions(L, cfg, pg, r, tp):
    Fn = L[REGION_NAMES[cfg["op"]]]
    op = cfg["op"]
    if op == "copy":
        x, dy = _leaf(cfg["x"]), cfg["dys"][r].contiguous()
    elif op == "reduce":
        x, dy = _leaf(cfg["xs"][r]), cfg["dy"]
    elif op == "gather":
        x, dy = _leaf(cfg["x"].chunk(tp, -1)[r].contiguous()), cfg["dy"]
    else:
        x, dy = _leaf(cfg["x"]), cfg["dy"].chunk(tp, -1)[r].contiguous()
    y, calls = _fwd_bwd(lambda: Fn.apply(x, pg), lambda y: dy)
    return {"y": y, "x_grad": _grad(x), "calls": calls}


def _rank_column(L, cfg, pg, r, tp):
    Col = L["ColumnParallelLinear"]
    if cfg.get("indivisible"):
        return _try_build(lambda: Col(cfg["in"], cfg["out"], pg))
    layer = Col(cfg["in"], cfg["out"], pg, bias=cfg["b"] is not None, gather_output=cfg["gather"])
    layer.load_from_full(_linear(cfg["w"], cfg["b"]))
    obs = {"weight": _pvalue(layer, "weight"), "has_bias": _param(layer, "bias") is not None}
    x = _leaf(cfg["x"])
    dy = cfg["dy"] if cfg["gather"] else cfg["dy"].chunk(tp, -1)[r].contiguous()
    obs["y"], obs["calls"] = _fwd_bwd(lambda: layer(x), lambda y: dy)
    obs.update(x_grad=_grad(x), w_grad=_pgrad(layer, "weight"), b_grad=_pgrad(layer, "bias"))
    return obs


def _rank_row(L, cfg, pg, r, tp):
    Row = L["RowParallelLinear"]
    if cfg.get("indivisible"):
        return _try_build(lambda: Row(cfg["in"], cfg["out"], pg))
    layer = Row(cfg["in"], cfg["out"], pg, bias=cfg["b"] is not None, input_is_parallel=cfg["parallel"])
    layer.load_from_full(_linear(cfg["w"], cfg["b"]))
    obs = {"weight": _pvalue(layer, "weight"), "has_bias": _param(layer, "bias") is not None}
    x = _leaf(cfg["x"].chunk(tp, -1)[r].contiguous() if cfg["parallel"] else cfg["x"])
    obs["y"], obs["calls"] = _fwd_bwd(lambda: layer(x), lambda y: cfg["dy"])
    obs.update(x_grad=_grad(x), w_grad=_pgrad(layer, "weight"), b_grad=_pgrad(layer, "bias"))
    return obs


def _block_obs(block, names, x, dy):
    obs = {}
    for sub in names:
        module = getattr(block, sub, None)
        obs[f"{sub}_present"] = module is not None
        obs[f"{sub}_weight"] = _pvalue(module, "weight")
    obs["y"], obs["calls"] = _fwd_bwd(lambda: block(x), lambda y: dy)
    obs["x_grad"] = _grad(x)
    for sub in names:
        module = getattr(block, sub, None)
        obs[f"{sub}_w_grad"], obs[f"{sub}_b_grad"] = _pgrad(module, "weight"), _pgrad(module, "bias")
    return obs


def _rank_mlp(L, cfg, pg, r, tp):
    from gpulab.tensor_parallel_ref import MLP

    Par = L["ParallelMLP"]
    if cfg.get("indivisible"):
        return _try_build(lambda: Par(cfg["hidden"], cfg["ffn"], pg))
    bias = cfg["b1"] is not None
    ref = MLP(cfg["hidden"], cfg["ffn"], bias=bias)
    ref.fc1, ref.fc2 = _linear(cfg["w1"], cfg["b1"]), _linear(cfg["w2"], cfg["b2"])
    mlp = Par(cfg["hidden"], cfg["ffn"], pg, bias=bias)
    mlp.load_from_full(ref)
    return _block_obs(mlp, ("fc1", "fc2"), _leaf(cfg["x"]), cfg["dy"])


def _rank_attention(L, cfg, pg, r, tp):
    from gpulab.tensor_parallel_ref import SelfAttention

    Par = L["ParallelSelfAttention"]
    if cfg.get("indivisible"):
        return _try_build(lambda: Par(cfg["hidden"], cfg["heads"], pg))
    bias = cfg["bqkv"] is not None
    ref = SelfAttention(cfg["hidden"], cfg["heads"], bias=bias, causal=cfg["causal"])
    ref.qkv, ref.proj = _linear(cfg["wqkv"], cfg["bqkv"]), _linear(cfg["wproj"], cfg["bproj"])
    attn = Par(cfg["hidden"], cfg["heads"], pg, bias=bias, causal=cfg["causal"])
    attn.load_from_full(ref)
    return _block_obs(attn, ("qkv", "proj"), _leaf(cfg["x"]), cfg["dy"])


RANK_RUNNERS = {"regions": _rank_regions, "column": _rank_column, "row": _rank_row, "mlp": _rank_mlp,
                "attention": _rank_attention}


def rank_main(rank, world_size, kind, learner, configs, timeout_s):
    """One rank of a check: tensor-parallel groups of 2 ({0,1}, {2,3}) and 4, then every config."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    groups = {2: [dist.new_group([0, 1], timeout=timeout), dist.new_group([2, 3], timeout=timeout)],
              4: [dist.group.WORLD]}
    torch.manual_seed(0)
    out = []
    for cfg in configs:
        tp = cfg["tp"]
        out.append(RANK_RUNNERS[kind](learner, cfg, groups[tp][rank // tp], rank % tp, tp))
    return out


# --- the learner-process side: probe, launch, translate failures -----------------------------------

def _probe(kind, L):
    """Call the learner's code once without ranks: a stub raises NotImplementedError at once, so an
    untouched exercise costs no launch. Any other outcome (usually: no process group) is ignored."""
    import types

    try:
        if kind == "regions":
            for name in REGION_NAMES.values():
                L[name].forward(types.SimpleNamespace(), torch.zeros(2, 4), None)
        elif kind == "column":
            L["ColumnParallelLinear"](4, 4, None)
        elif kind == "row":
            L["RowParallelLinear"](4, 4, None)
        elif kind == "mlp":
            L["ParallelMLP"](4, 8, None)
        elif kind == "attention":
            L["ParallelSelfAttention"](8, 2, None)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - expected without a process group
        pass


def _launch_run(kind, names):
    def run(ns, case, device):
        from gpulab.dist import RankError, RankTimeout, launch

        L = {name: entry(ns, name) for name in names}
        key = (kind, tuple(id(L[n]) for n in names))
        if key in _STICKY:
            exc_type, message, _ = _STICKY[key]
            raise exc_type(message)
        try:
            _probe(kind, L)
            ranks = launch(rank_main, WORLD, kind, L, case.inputs["configs"], RANK_TIMEOUT_S,
                           backend="gloo", device="cpu", timeout_s=RANK_TIMEOUT_S)
        except NotImplementedError as exc:
            _STICKY[key] = (NotImplementedError, str(exc), tuple(L.values()))
            raise
        except (RankTimeout, RankError) as exc:
            text = str(exc)
            # A hang: a rank timed out waiting, or (both sides of a deadlock timing out together) the
            # peer it waited for left first. Any other rank failure is the learner's exception.
            if isinstance(exc, RankTimeout) or _PEER_GONE in text:
                message = (f"the ranks hung and were stopped: {text.splitlines()[0]} Every rank of a process "
                           "group must call the same collectives in the same order (a collective under `if rank "
                           "== 0:`, a recv that no rank sends to, or a collective on another group waits forever).")
                _STICKY[key] = (RuntimeError, message, tuple(L.values()))
                raise RuntimeError(message) from None
            stub = [line for line in text.splitlines() if line.startswith("NotImplementedError")]
            if stub:
                message = stub[-1].partition(":")[2].strip() or "not implemented yet."
                _STICKY[key] = (NotImplementedError, message, tuple(L.values()))
                raise NotImplementedError(message) from None
            raise RuntimeError("a rank raised an exception:\n" + text[-1800:]) from None
        return {"ranks": ranks}
    return run


# --- the judge side -------------------------------------------------------------------------------

def _describe_calls(ops) -> str:
    if not ops:
        return "no collective"
    counts = {op: ops.count(op) for op in dict.fromkeys(ops)}
    return ", ".join(f"{n} {op}" for op, n in counts.items())


def _check_groups(calls, tp) -> str | None:
    """Every collective must run on the layer's group (checked before values: a wrong group sums wrongly)."""
    if not isinstance(calls, list):
        return "no record of collectives came back."
    for c in calls:
        if c["op"] != "barrier" and c["group_size"] != tp:
            return (f"a collective ({c['op']}) ran over {c['group_size']} ranks, but this layer's process group "
                    f"has {tp}: "
                    "pass group=process_group to every collective (and use dist.get_rank(group), "
                    "dist.get_world_size(group)).")
    return None


def _check_calls(calls, tp, want, what, payload=None) -> str | None:
    """``want``: {"forward": [ops], "backward": [ops]}; "all_gather" stands for either gather form.
    Checked after the values, so a missing f is reported by the input gradient it breaks."""
    msg = _check_groups(calls, tp)
    if msg:
        return msg
    for phase in ("forward", "backward"):
        raw = [c["op"] for c in calls if c["phase"] == phase]
        got = ["all_gather" if op in GATHERS else op for op in raw]
        if got != want[phase]:
            return (f"{what} issued {_describe_calls(raw)} in {phase}, expected {_describe_calls(want[phase])}. "
                    "(Collectives are counted when called as dist.<name>(...).)")
        if payload is not None:
            sizes = [c["bytes"] for c in calls if c["phase"] == phase and c["op"] == "all_reduce"]
            if any(s != payload for s in sizes):
                return (f"{what} all-reduced {sizes} bytes in {phase}, expected {payload} bytes (the block's "
                        "output or input: batch x seq x hidden elements).")
    return None


def _cmp(got, want, name):
    if got is None:
        return f"{name} is None (no gradient reached it: is it a Parameter used in forward?)."
    return compare(got, want, dtype=torch.float32, name=name, **TOL)


def _matches(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and compare(
        got, want, dtype=got.dtype, **TOL) is None


def _check_indivisible(obs, what) -> str | None:
    if obs.get("raised") is None:
        return (f"{what} was accepted although it does not divide by the tensor-parallel size: raise a "
                "ValueError that says so (every rank must hold an equal shard).")
    if obs["raised"] != "ValueError":
        return (f"{what} raised {obs['raised']} ({obs['message'][:120]!r}); raise a ValueError with a clear "
                "message instead.")
    return None


def _judge_launch(ref_fn, check_fn):
    """A judge for one launch: ``ref_fn(cfg)`` once per config, ``check_fn(cfg, ref, obs, r, rank)`` per rank."""
    def judge(case, obs):
        ranks = obs.get("ranks") if isinstance(obs, dict) else None
        configs = case.inputs["configs"]
        if not isinstance(ranks, list) or len(ranks) != WORLD or any(
                not isinstance(o, list) or len(o) != len(configs) for o in ranks):
            return "the launch returned no observations for every rank and config."
        for i, cfg in enumerate(configs):
            ref = None if cfg.get("indivisible") else ref_fn(cfg)
            for rank in range(WORLD):
                r = rank % cfg["tp"]
                msg = check_fn(cfg, ref, ranks[rank][i], r, rank)
                if msg:
                    return f"{cfg['label']}, global rank {rank} (rank {r} of its group): {msg}"
        return None
    return judge


def _autograd_ref(fn, x, dy, params):
    """float64 single-device reference: y, x.grad and the grads of ``params`` (a dict of tensors)."""
    x = x.double().requires_grad_(True)
    params = {k: (None if v is None else v.double().requires_grad_(True)) for k, v in params.items()}
    extra = {}
    y = fn(x, params, extra)
    y.backward(dy.double())
    out = {"y": y.detach(), "x_grad": x.grad, **{f"{k}_grad": (None if v is None else v.grad)
                                                 for k, v in params.items()}}
    out.update({k: v.grad for k, v in extra.items()})
    return out


def _rank_note(r, rank) -> str:
    return (" (this rank is rank {r} of its group but global rank {g}: index shards with "
            "dist.get_rank(process_group))".format(r=r, g=rank) if r != rank else "")


# f and g ------------------------------------------------------------------------------------------

_REGION_WANT = {
    "copy": ({"forward": [], "backward": ["all_reduce"]},
             "f (CopyToParallelRegion) is the identity in forward and all-reduces the gradient in backward"),
    "reduce": ({"forward": ["all_reduce"], "backward": []},
               "g (ReduceFromParallelRegion) all-reduces in forward and passes the gradient through in backward"),
    "gather": ({"forward": ["all_gather"], "backward": []},
               "the gather all-gathers the last dim in forward and keeps this rank's slice of the gradient"),
    "scatter": ({"forward": [], "backward": ["all_gather"]},
                "the scatter keeps this rank's slice in forward and all-gathers the gradient in backward"),
}


def _regions_cases(gen, public):
    configs = []
    for tp in (2, 4):
        B, S = (2, 3) if public else (_randint(gen, 1, 3), _randint(gen, 1, 4))
        n = 8 if public else 4 * _randint(gen, 1, 4)
        for op in ("copy", "reduce", "gather", "scatter"):
            cfg = {"op": op, "tp": tp, "label": f"{REGION_NAMES[op]} (TP={tp}, x {B}x{S}x{n})"}
            cfg["x"] = _randn(gen, B, S, n)
            cfg["dy"] = _randn(gen, B, S, n)
            cfg["xs"] = _randn(gen, tp, B, S, n)      # reduce: a different input on each rank
            cfg["dys"] = _randn(gen, tp, B, S, n)     # copy: a different upstream gradient on each rank
            configs.append(cfg)
    return [Case("f, g, gather and scatter at TP=2 and TP=4" + ("" if public else " (random sizes)"),
                 {"configs": configs})]


def _regions_ref(cfg):
    op, tp = cfg["op"], cfg["tp"]
    x, dy = cfg["x"].double(), cfg["dy"].double()
    if op == "copy":
        return {"y": lambda r: x, "x_grad": lambda r: cfg["dys"].double().sum(0)}
    if op == "reduce":
        return {"y": lambda r: cfg["xs"].double().sum(0), "x_grad": lambda r: dy}
    if op == "gather":
        return {"y": lambda r: x, "x_grad": lambda r: dy.chunk(tp, -1)[r]}
    return {"y": lambda r: x.chunk(tp, -1)[r], "x_grad": lambda r: dy}


def _regions_check(cfg, ref, obs, r, rank):
    op, tp = cfg["op"], cfg["tp"]
    want, why = _REGION_WANT[op]
    msg = _check_groups(obs.get("calls"), tp)
    if msg:
        return msg
    msg = _cmp(obs.get("y"), ref["y"](r), "forward output")
    if msg:
        return msg + _rank_note(r, rank)
    x_grad = obs.get("x_grad")
    if op == "copy" and _matches(x_grad, cfg["dys"][r]):
        return "x.grad is this rank's own gradient: f must all-reduce (sum) the gradient over the group in backward."
    if op == "reduce" and isinstance(x_grad, torch.Tensor) and tp > 1 and _matches(x_grad, tp * cfg["dy"]):
        return "x.grad is world_size times the gradient: g's backward is the identity (no all-reduce)."
    msg = _cmp(x_grad, ref["x_grad"](r), "x.grad (the input gradient)")
    if msg:
        return msg + _rank_note(r, rank)
    msg = _check_calls(obs.get("calls"), tp, want, REGION_NAMES[op])
    return None if msg is None else f"{msg} {why}."


# column- and row-parallel linear ----------------------------------------------------------------

def _linear_cases(kind):
    def make(gen, public):
        configs = []
        B, S = (2, 3) if public else (_randint(gen, 1, 3), _randint(gen, 1, 4))
        variants = [(2, True, True), (2, False, True), (4, True, True), (4, False, False)]
        for tp, flag, bias in variants:
            fin = 8 if public else _randint(gen, 1, 12)
            fout = 12 if public else 4 * _randint(gen, 1, 4)
            if kind == "row":
                fin, fout = fout, fin           # the split dimension must divide by 4
            name = "gather_output" if kind == "column" else "input_is_parallel"
            cfg = {"tp": tp, "in": fin, "out": fout, ("gather" if kind == "column" else "parallel"): flag,
                   "label": f"{'Column' if kind == 'column' else 'Row'}ParallelLinear({fin}, {fout}, bias={bias}, "
                            f"{name}={flag}) at TP={tp}, x {B}x{S}x{fin}",
                   "w": _randn(gen, fout, fin) / math.sqrt(fin), "b": _randn(gen, fout) if bias else None,
                   "x": _randn(gen, B, S, fin), "dy": _randn(gen, B, S, fout)}
            configs.append(cfg)
        bad = 10 if public else 4 * _randint(gen, 1, 4) + 2   # divisible by 2, not by 4
        for tp, size in ((2, 7), (4, bad)):
            fin, fout = (8, size) if kind == "column" else (size, 8)
            configs.append({"tp": tp, "in": fin, "out": fout, "indivisible": True,
                            "label": f"{'Column' if kind == 'column' else 'Row'}ParallelLinear({fin}, {fout}) at "
                                     f"TP={tp} (not divisible)"})
        return [Case(("public sizes" if public else "random sizes") + ", TP=2 and TP=4", {"configs": configs})]
    return make


def _linear_ref(cfg):
    def fn(x, p, extra):
        return torch.nn.functional.linear(x, p["w"], p["b"])
    return _autograd_ref(fn, cfg["x"], cfg["dy"], {"w": cfg["w"], "b": cfg["b"]})


def _column_check(cfg, ref, obs, r, rank):
    tp, fin, fout = cfg["tp"], cfg["in"], cfg["out"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"out_features = {fout} at TP={tp}")
    w = obs.get("weight")
    if not isinstance(w, torch.Tensor):
        return "the layer has no `weight` parameter (this rank's shard, shape (out_features/p, in_features))."
    if tuple(w.shape) != (fout // tp, fin):
        swapped = tuple(w.shape) == (fout, fin // tp)
        wrong = (": the weight was split along the wrong dimension. A column-parallel layer splits the OUTPUT "
                 "features, i.e. the rows of nn.Linear's (out, in) weight") if swapped else ""
        return (f"weight shard has shape {tuple(w.shape)}, expected (out_features/p, in_features) = "
                f"{(fout // tp, fin)}{wrong}.")
    rows = slice(r * fout // tp, (r + 1) * fout // tp)
    if not _matches(w, cfg["w"][rows]):
        return (f"load_from_full loaded the wrong shard: rank {r} must hold rows {rows.start}..{rows.stop - 1} "
                f"of the full weight{_rank_note(r, rank)}.")
    if obs.get("has_bias") != (cfg["b"] is not None):
        return "bias=False must leave the layer without a bias (self.bias = None)." if cfg["b"] is None else \
            "the layer has no `bias` parameter (this rank's out_features/p entries)."
    msg = _check_groups(obs.get("calls"), tp)
    if msg:
        return msg
    y_want = ref["y"] if cfg["gather"] else ref["y"].chunk(tp, -1)[r]
    msg = _cmp(obs.get("y"), y_want, "output" if cfg["gather"] else "output (this rank's slice of the features)")
    if msg:
        return msg
    dy_r = cfg["dy"].double().chunk(tp, -1)[r]
    partial = dy_r @ cfg["w"].double()[rows]
    if tp > 1 and _matches(obs.get("x_grad"), partial.float()):
        return ("x.grad is only this rank's partial sum: the input gradient of a column-parallel layer must be "
                "all-reduced over the group in backward (apply f, CopyToParallelRegion, to the input).")
    msg = _cmp(obs.get("x_grad"), ref["x_grad"], "x.grad (the input gradient)")
    if msg:
        return msg
    msg = _cmp(obs.get("w_grad"), ref["w_grad"][rows], "weight.grad")
    if msg:
        return msg
    if cfg["b"] is not None:
        msg = _cmp(obs.get("b_grad"), ref["b_grad"][rows], "bias.grad")
        if msg:
            return msg
    want = {"forward": ["all_gather"] if cfg["gather"] else [], "backward": ["all_reduce"]}
    msg = _check_calls(obs.get("calls"), tp, want, "ColumnParallelLinear")
    if msg:
        return msg + (" The layer all-reduces only the input gradient (f) in backward, and gathers its output "
                      "in forward only when gather_output=True.")
    return None


def _row_check(cfg, ref, obs, r, rank):
    tp, fin, fout = cfg["tp"], cfg["in"], cfg["out"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"in_features = {fin} at TP={tp}")
    w = obs.get("weight")
    if not isinstance(w, torch.Tensor):
        return "the layer has no `weight` parameter (this rank's shard, shape (out_features, in_features/p))."
    if tuple(w.shape) != (fout, fin // tp):
        swapped = tuple(w.shape) == (fout // tp, fin)
        wrong = (": the weight was split along the wrong dimension. A row-parallel layer splits the INPUT "
                 "features, i.e. the columns of nn.Linear's (out, in) weight") if swapped else ""
        return (f"weight shard has shape {tuple(w.shape)}, expected (out_features, in_features/p) = "
                f"{(fout, fin // tp)}{wrong}.")
    cols = slice(r * fin // tp, (r + 1) * fin // tp)
    if not _matches(w, cfg["w"][:, cols]):
        return (f"load_from_full loaded the wrong shard: rank {r} must hold columns {cols.start}..{cols.stop - 1} "
                f"of the full weight{_rank_note(r, rank)}.")
    if obs.get("has_bias") != (cfg["b"] is not None):
        return "bias=False must leave the layer without a bias (self.bias = None)." if cfg["b"] is None else \
            "the layer has no `bias` parameter (the whole (out_features,) bias, on every rank)."
    y = obs.get("y")
    if cfg["b"] is not None and tp > 1 and _matches(y, (ref["y"] + (tp - 1) * cfg["b"].double()).float()):
        return (f"the output holds the bias {tp} times: each rank added it before the all-reduce. Add the "
                "bias once, after the all-reduce (g).")
    msg = _check_groups(obs.get("calls"), tp)
    if msg:
        return msg
    msg = _cmp(y, ref["y"], "output")
    if msg:
        return msg
    x_want = ref["x_grad"].chunk(tp, -1)[r] if cfg["parallel"] else ref["x_grad"]
    msg = _cmp(obs.get("x_grad"), x_want, "x.grad (the input gradient" +
               (", this rank's slice)" if cfg["parallel"] else ", all of it)"))
    if msg:
        return msg
    msg = _cmp(obs.get("w_grad"), ref["w_grad"][:, cols], "weight.grad")
    if msg:
        return msg
    if cfg["b"] is not None:
        msg = _cmp(obs.get("b_grad"), ref["b_grad"], "bias.grad (the whole bias, the same on every rank)")
        if msg:
            return msg
    want = {"forward": ["all_reduce"], "backward": [] if cfg["parallel"] else ["all_gather"]}
    msg = _check_calls(obs.get("calls"), tp, want, "RowParallelLinear")
    if msg:
        return msg + (" The layer all-reduces its output once in forward (g); in backward it communicates only "
                      "when its input was split here (input_is_parallel=False: all-gather the input gradient).")
    return None


# parallel MLP -------------------------------------------------------------------------------------

def _mlp_cases(gen, public):
    configs = []
    B, S = (2, 3) if public else (_randint(gen, 1, 3), _randint(gen, 1, 4))
    for tp, bias in ((2, True), (4, True), (4, False)):
        h = 8 if public else 4 * _randint(gen, 1, 3)
        f = 16 if public else 4 * _randint(gen, 1, 6)
        configs.append({"tp": tp, "hidden": h, "ffn": f,
                        "label": f"ParallelMLP(hidden={h}, ffn_hidden={f}, bias={bias}) at TP={tp}, x {B}x{S}x{h}",
                        "w1": _randn(gen, f, h) / math.sqrt(h), "b1": _randn(gen, f) if bias else None,
                        "w2": _randn(gen, h, f) / math.sqrt(f), "b2": _randn(gen, h) if bias else None,
                        "x": _randn(gen, B, S, h), "dy": _randn(gen, B, S, h)})
    configs.append({"tp": 4, "hidden": 8, "ffn": 10, "indivisible": True,
                    "label": "ParallelMLP(hidden=8, ffn_hidden=10) at TP=4 (not divisible)"})
    return [Case(("public sizes" if public else "random sizes") + ", TP=2 and TP=4", {"configs": configs})]


def _mlp_ref(cfg):
    F = torch.nn.functional

    def fn(x, p, extra):
        h1 = F.linear(x, p["w1"], p["b1"])
        h1.retain_grad()
        extra["h1"] = h1
        return F.linear(F.gelu(h1), p["w2"], p["b2"])
    return _autograd_ref(fn, cfg["x"], cfg["dy"], {k: cfg[k] for k in ("w1", "b1", "w2", "b2")})


def _check_shard(obs, key, want, what) -> str | None:
    got = obs.get(key)
    if not isinstance(got, torch.Tensor):
        return f"{what} has no `weight` parameter."
    if tuple(got.shape) != tuple(want.shape):
        return f"{what}.weight has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    if not _matches(got, want):
        return f"{what}.weight after load_from_full is not this rank's shard."
    return None


def _block_grads(obs, ref_grads) -> str | None:
    for key, want, name in ref_grads:
        if want is None:
            continue
        msg = _cmp(obs.get(key), want, name)
        if msg:
            return msg
    return None


def _mlp_check(cfg, ref, obs, r, rank):
    tp, h, f = cfg["tp"], cfg["hidden"], cfg["ffn"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"ffn_hidden = {f} at TP={tp}")
    for sub in ("fc1", "fc2"):
        if not obs.get(f"{sub}_present"):
            return (f"ParallelMLP needs attributes fc1 (a ColumnParallelLinear) and fc2 (a RowParallelLinear); "
                    f"{sub} is missing.")
    rows = slice(r * f // tp, (r + 1) * f // tp)
    msg = (_check_shard(obs, "fc1_weight", cfg["w1"][rows], "fc1 (column-parallel)")
           or _check_shard(obs, "fc2_weight", cfg["w2"][:, rows], "fc2 (row-parallel)"))
    if msg:
        return msg + _rank_note(r, rank)
    y = obs.get("y")
    if cfg["b2"] is not None and tp > 1 and _matches(y, (ref["y"] + (tp - 1) * cfg["b2"].double()).float()):
        return f"the output holds fc2's bias {tp} times: add the row-parallel bias once, after the all-reduce."
    msg = _check_groups(obs.get("calls"), tp)
    if msg:
        return msg
    msg = _cmp(y, ref["y"], "output")
    if msg:
        return msg
    partial = ref["h1"].chunk(tp, -1)[r] @ cfg["w1"].double()[rows]
    if tp > 1 and _matches(obs.get("x_grad"), partial.float()):
        return ("x.grad (the input gradient) is only this rank's partial sum: the column-parallel fc1 must "
                "all-reduce the input gradient in backward (f). Outputs and weight gradients can all be right "
                "while this is wrong.")
    msg = _cmp(obs.get("x_grad"), ref["x_grad"], "x.grad (the input gradient)")
    if msg:
        return msg
    msg = _block_grads(obs, [("fc1_w_grad", ref["w1_grad"][rows], "fc1.weight.grad"),
                             ("fc1_b_grad", None if cfg["b1"] is None else ref["b1_grad"][rows], "fc1.bias.grad"),
                             ("fc2_w_grad", ref["w2_grad"][:, rows], "fc2.weight.grad"),
                             ("fc2_b_grad", None if cfg["b2"] is None else ref["b2_grad"], "fc2.bias.grad")])
    if msg:
        return msg
    B, S = cfg["x"].shape[:2]
    msg = _check_calls(obs.get("calls"), tp, {"forward": ["all_reduce"], "backward": ["all_reduce"]},
                       "ParallelMLP", payload=B * S * h * 4)
    if msg:
        return msg + (" Megatron's MLP needs exactly ONE all-reduce in forward (g, after fc2) and one in backward "
                      "(f, before fc1): GELU works on fc1's local slice, so nothing is gathered in between.")
    return None


# parallel self-attention --------------------------------------------------------------------------

def _attention_cases(gen, public):
    configs = []
    B = 2 if public else _randint(gen, 1, 2)
    for tp, bias, causal in ((2, True, True), (4, True, True), (2, False, False)):
        heads = 4 if public else 4 * _randint(gen, 1, 2)
        d = 4 if public else [2, 4, 8][_randint(gen, 0, 2)]
        S = 5 if public else _randint(gen, 1, 6)
        h = heads * d
        configs.append({"tp": tp, "hidden": h, "heads": heads, "causal": causal,
                        "label": f"ParallelSelfAttention(hidden={h}, n_heads={heads}, bias={bias}, causal={causal}) "
                                 f"at TP={tp}, x {B}x{S}x{h}",
                        "wqkv": _randn(gen, 3 * h, h) / math.sqrt(h), "bqkv": _randn(gen, 3 * h) if bias else None,
                        "wproj": _randn(gen, h, h) / math.sqrt(h), "bproj": _randn(gen, h) if bias else None,
                        "x": _randn(gen, B, S, h), "dy": _randn(gen, B, S, h)})
    configs.append({"tp": 4, "hidden": 8, "heads": 2, "indivisible": True,
                    "label": "ParallelSelfAttention(hidden=8, n_heads=2) at TP=4 (heads not divisible)"})
    return [Case(("public sizes" if public else "random sizes") + ", TP=2 and TP=4", {"configs": configs})]


def _attention_ref(cfg):
    F = torch.nn.functional
    h, H = cfg["hidden"], cfg["heads"]

    def fn(x, p, extra):
        B, S, _ = x.shape
        qkv = F.linear(x, p["wqkv"], p["bqkv"])                     # (B, S, 3h)
        qkv.retain_grad()
        extra["qkv"] = qkv
        q, k, v = (t.reshape(B, S, H, h // H).transpose(1, 2) for t in qkv.split(h, -1))   # (B, H, S, d)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=cfg["causal"])
        return F.linear(o.transpose(1, 2).reshape(B, S, h), p["wproj"], p["bproj"])
    return _autograd_ref(fn, cfg["x"], cfg["dy"], {k: cfg[k] for k in ("wqkv", "bqkv", "wproj", "bproj")})


def _head_rows(h, tp, r):
    """Rows of the fused (3h, h) qkv weight that rank r's heads use: its q rows, then k, then v."""
    n = h // tp
    return torch.cat([torch.arange(part * h + r * n, part * h + (r + 1) * n) for part in range(3)])


def _attention_check(cfg, ref, obs, r, rank):
    tp, h, H = cfg["tp"], cfg["hidden"], cfg["heads"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"n_heads = {H} at TP={tp}")
    for sub in ("qkv", "proj"):
        if not obs.get(f"{sub}_present"):
            return (f"ParallelSelfAttention needs attributes qkv (a ColumnParallelLinear) and proj (a "
                    f"RowParallelLinear); {sub} is missing.")
    sel = _head_rows(h, tp, r)
    cols = slice(r * h // tp, (r + 1) * h // tp)
    got = obs.get("qkv_weight")
    if isinstance(got, torch.Tensor) and tp > 1 and _matches(got, cfg["wqkv"].chunk(tp, 0)[r]):
        return ("qkv.weight holds a contiguous slice of the fused [q | k | v] weight: rank 0 gets all of q's "
                "rows and none of v's, so its 'heads' mix q, k and v of different heads. Each rank must take "
                f"the q, k and v rows of ITS heads: rows r*hidden/p..(r+1)*hidden/p of each of the three blocks.")
    msg = (_check_shard(obs, "qkv_weight", cfg["wqkv"][sel], "qkv (column-parallel, this rank's heads: "
                                                             "cat(Wq[rows], Wk[rows], Wv[rows]))")
           or _check_shard(obs, "proj_weight", cfg["wproj"][:, cols], "proj (row-parallel)"))
    if msg:
        return msg + _rank_note(r, rank)
    y = obs.get("y")
    if cfg["bproj"] is not None and tp > 1 and _matches(y, (ref["y"] + (tp - 1) * cfg["bproj"].double()).float()):
        return f"the output holds proj's bias {tp} times: add the row-parallel bias once, after the all-reduce."
    msg = _check_groups(obs.get("calls"), tp)
    if msg:
        return msg
    msg = _cmp(y, ref["y"], "output")
    if msg:
        return msg + (" (Are the heads split right? Rank r owns heads r*H/p..(r+1)*H/p: its q, k, v are "
                      "(B, H/p, S, head_dim) views of its local qkv output.)")
    partial = ref["qkv"][..., sel] @ cfg["wqkv"].double()[sel]
    if tp > 1 and _matches(obs.get("x_grad"), partial.float()):
        return ("x.grad (the input gradient) is only this rank's partial sum: the column-parallel qkv must "
                "all-reduce the input gradient in backward (f).")
    msg = _cmp(obs.get("x_grad"), ref["x_grad"], "x.grad (the input gradient)")
    if msg:
        return msg
    msg = _block_grads(obs, [("qkv_w_grad", ref["wqkv_grad"][sel], "qkv.weight.grad"),
                             ("qkv_b_grad", None if cfg["bqkv"] is None else ref["bqkv_grad"][sel], "qkv.bias.grad"),
                             ("proj_w_grad", ref["wproj_grad"][:, cols], "proj.weight.grad"),
                             ("proj_b_grad", None if cfg["bproj"] is None else ref["bproj_grad"], "proj.bias.grad")])
    if msg:
        return msg
    B, S = cfg["x"].shape[:2]
    msg = _check_calls(obs.get("calls"), tp, {"forward": ["all_reduce"], "backward": ["all_reduce"]},
                       "ParallelSelfAttention", payload=B * S * h * 4)
    if msg:
        return msg + (" Split by heads, attention needs exactly one all-reduce in forward (after proj) and one "
                      "in backward (before qkv): each head's attention is local to its rank.")
    return None


# communication volume -----------------------------------------------------------------------------

def ref_tp_allreduce_bytes(block, batch, seq, hidden, dtype_bytes, tp_size) -> dict:
    n = 0 if tp_size == 1 else batch * seq * hidden * dtype_bytes
    return {"forward": n, "backward": n}


def ref_ring_allreduce_traffic(payload_bytes, world_size) -> float:
    return 2 * (world_size - 1) / world_size * payload_bytes


def ref_step_allreduce_bytes(batch, seq, hidden, dtype_bytes, tp_size, n_layers, recompute=False) -> int:
    if tp_size == 1:
        return 0
    return n_layers * (6 if recompute else 4) * batch * seq * hidden * dtype_bytes


def _volume_cases(gen, public):
    fixed = [dict(batch=1, seq=2048, hidden=4096, dtype_bytes=2, tp_size=4, n_layers=32),
             dict(batch=8, seq=1, hidden=4096, dtype_bytes=2, tp_size=4, n_layers=32),
             dict(batch=2, seq=16, hidden=64, dtype_bytes=4, tp_size=1, n_layers=2)]
    specs = fixed if public else [dict(batch=_randint(gen, 1, 64), seq=_randint(gen, 1, 8192),
                                       hidden=128 * _randint(gen, 1, 96), dtype_bytes=[1, 2, 4][_randint(gen, 0, 2)],
                                       tp_size=[1, 2, 4, 8][_randint(gen, 0, 3)], n_layers=_randint(gen, 1, 96))
                                  for _ in range(4)]
    return [Case(", ".join(f"{k}={v}" for k, v in s.items()), s) for s in specs]


def _volume_run(ns, case, device):
    x = case.inputs
    args = (x["batch"], x["seq"], x["hidden"], x["dtype_bytes"], x["tp_size"])
    out = {"blocks": {b: entry(ns, "tp_allreduce_bytes")(b, *args) for b in ("mlp", "attention")}}
    payload = x["batch"] * x["seq"] * x["hidden"] * x["dtype_bytes"]
    out["ring"] = [entry(ns, "ring_allreduce_traffic")(payload, p) for p in (1, 2, 4, 8, x["tp_size"])]
    out["step"] = [entry(ns, "step_allreduce_bytes")(*args, x["n_layers"], recompute=rc) for rc in (False, True)]
    return out


def _volume_judge(case, obs):
    x = case.inputs
    args = (x["batch"], x["seq"], x["hidden"], x["dtype_bytes"], x["tp_size"])
    for block, got in obs["blocks"].items():
        want = ref_tp_allreduce_bytes(block, *args)
        if not isinstance(got, dict) or set(got) != {"forward", "backward"}:
            return f"tp_allreduce_bytes must return {{'forward': bytes, 'backward': bytes}}, got {got!r}."
        for phase in ("forward", "backward"):
            if not _close(got[phase], want[phase]):
                return (f"tp_allreduce_bytes({block!r}, ...)[{phase!r}] = {got[phase]!r}, expected {want[phase]}: "
                        + ("with one rank nothing is all-reduced." if x["tp_size"] == 1 else
                           "one all-reduce of the block's (batch, seq, hidden) activations per direction."))
    payload = x["batch"] * x["seq"] * x["hidden"] * x["dtype_bytes"]
    for p, got in zip((1, 2, 4, 8, x["tp_size"]), obs["ring"]):
        want = ref_ring_allreduce_traffic(payload, p)
        if not _close(got, want):
            return (f"ring_allreduce_traffic({payload}, {p}) = {got!r}, expected {want:g}: a ring all-reduce is a "
                    "reduce-scatter then an all-gather, each sending (p-1)/p of the payload per rank.")
    for rc, got in zip((False, True), obs["step"]):
        want = ref_step_allreduce_bytes(*args, x["n_layers"], recompute=rc)
        if not _close(got, want):
            return (f"step_allreduce_bytes(..., recompute={rc}) = {got!r}, expected {want}: per layer two blocks, "
                    "each one all-reduce forward and one backward" + (", and full recomputation repeats the forward "
                                                                     "ones." if rc else "."))
    return None


# --- the exercises -------------------------------------------------------------------------------

_REGIONS = tuple(REGION_NAMES.values())

EXERCISES = [
    Exercise("tp_regions", 3, _REGIONS, _regions_cases, _launch_run("regions", _REGIONS),
             _judge_launch(_regions_ref, _regions_check), title="f, g, gather and scatter as autograd Functions",
             hint="Each is a torch.autograd.Function with forward(ctx, x, group) and backward(ctx, grad) returning "
                  "(grad_x, None). f: identity / all-reduce; g: all-reduce / identity; gather: all_gather + cat "
                  "on the last dim / keep your slice; scatter: keep your slice / all_gather. Pass group=group, "
                  "use dist.get_rank(group), and all-reduce a contiguous clone, never the input itself."),
    Exercise("column_parallel", 3, ("ColumnParallelLinear",), _linear_cases("column"), _launch_run(
        "column", ("ColumnParallelLinear",)), _judge_launch(_linear_ref, _column_check),
             title="Column-parallel linear",
             hint="weight = full.weight[r*out/p:(r+1)*out/p] (rows = output features). forward: "
                  "x = CopyToParallelRegion.apply(x, group); y = F.linear(x, weight, bias); gather only if "
                  "gather_output. Raise ValueError when out_features % p != 0."),
    Exercise("row_parallel", 3, ("RowParallelLinear",), _linear_cases("row"), _launch_run(
        "row", ("RowParallelLinear",)), _judge_launch(_linear_ref, _row_check),
             title="Row-parallel linear",
             hint="weight = full.weight[:, r*in/p:(r+1)*in/p] (columns = input features), bias whole. forward: "
                  "scatter x unless input_is_parallel, y = ReduceFromParallelRegion.apply(F.linear(x, weight), "
                  "group), then add the bias ONCE. Raise ValueError when in_features % p != 0."),
    Exercise("tp_mlp", 3, ("ParallelMLP",), _mlp_cases, _launch_run("mlp", ("ParallelMLP",)),
             _judge_launch(_mlp_ref, _mlp_check), title="Parallel MLP: column, GELU, row",
             hint="fc1 = ColumnParallelLinear(hidden, ffn, gather_output=False), fc2 = RowParallelLinear(ffn, hidden, "
                  "input_is_parallel=True); forward fc2(gelu(fc1(x))). load_from_full(mlp) loads mlp.fc1 and mlp.fc2."),
    Exercise("tp_attention", 3, ("ParallelSelfAttention",), _attention_cases,
             _launch_run("attention", ("ParallelSelfAttention",)), _judge_launch(_attention_ref, _attention_check),
             title="Parallel self-attention split by heads",
             hint="qkv = ColumnParallelLinear(h, 3h), proj = RowParallelLinear(h, h). Load qkv with "
                  "cat(Wq[rows], Wk[rows], Wv[rows]) for rows = r*h/p..(r+1)*h/p (not a contiguous slice of the "
                  "fused weight); forward: split the local (B, S, 3h/p) into q, k, v of h/p, view as (B, H/p, S, d)."),
    Exercise("tp_comm_volume", 2, ("tp_allreduce_bytes", "ring_allreduce_traffic", "step_allreduce_bytes"),
             _volume_cases, _volume_run, _volume_judge, title="Communication volume per layer",
             hint="Each block all-reduces batch*seq*hidden*dtype_bytes once forward (g) and once backward (f); "
                  "nothing when tp_size == 1. A ring all-reduce sends 2(p-1)/p of the payload per rank. A layer has "
                  "two blocks; full recomputation replays the forward all-reduces."),
]


# --- benchmarks (python -m grader bench): one rank, so only the wrappers' overhead shows --------

def _one_rank_group(device):
    import torch.distributed as dist

    from gpulab.dist import free_port

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" and dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    return dist.group.WORLD


def _bench_make(device, tiny):
    from gpulab.tensor_parallel_ref import MLP

    h, tokens = (64, 64) if tiny else (4096, 4096)
    dtype = torch.float32 if device == "cpu" else torch.float16
    ref = MLP(h, 4 * h).to(device, dtype)
    x = torch.randn(tokens, h, device=device, dtype=dtype, requires_grad=True)
    return {"ref": ref, "x": x, "group": _one_rank_group(device), "flops": 3 * 2 * tokens * h * 4 * h * 2,
            "h": h, "dtype": dtype, "device": device}


def _bench_call(cls, d):
    if "mlp" not in d:
        d["mlp"] = cls(d["h"], 4 * d["h"], d["group"]).to(d["device"], d["dtype"])
        d["mlp"].load_from_full(d["ref"])
    d["mlp"](d["x"]).sum().backward()


BENCHMARKS = [
    Benchmark("ParallelMLP fwd+bwd, 1 rank vs MLP", "ParallelMLP", _bench_make, _bench_call,
              lambda d: d["ref"](d["x"]).sum().backward()),
]
