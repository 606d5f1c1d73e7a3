"""Checks of lab 12, tensor parallelism: Megatron's f and g operators, column- and row-parallel
linear layers, the parallel MLP and self-attention, and the communication volume per layer.

Every distributed check is ONE launch of 4 CPU ranks over gloo (:func:`grader.runs.ranks.launch_ranks`),
which tests both tensor-parallel sizes at once: size 2 on two groups, ranks {0, 1} and {2, 3} (so a
collective that forgets its ``group=`` or a shard indexed by the *global* rank is caught), and size 4
on all ranks. In each rank the check builds the full single-device layer from the case's tensors,
loads the learner's shards with ``load_from_full``, runs forward and backward with the collectives
recorded (``gpulab.commlog.record_collectives``), and returns per-rank observations: outputs, input
gradients, weight and bias gradients, the loaded shards and every collective per phase. The judge
recomputes the single-device layer in float64 and compares each rank's shard.

Shard conventions (the docstrings in the lab say the same): rank ``r`` of a group of ``p``
- ColumnParallelLinear: ``weight = A[r*out/p:(r+1)*out/p]`` (out/p, in), ``bias`` the same rows;
- RowParallelLinear: ``weight = A[:, r*in/p:(r+1)*in/p]`` (out, in/p), ``bias`` (out,) whole;
- ParallelSelfAttention: heads ``r*H/p .. (r+1)*H/p``; ``qkv.weight = cat(Wq[rows], Wk[rows], Wv[rows])``
  with ``rows = r*hidden/p .. (r+1)*hidden/p``; ``proj`` row-parallel.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from gpulab.compare import compare
from grader.exercise import Benchmark, Case, Exercise
from grader.kit.cases import choice, randint, randn
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "12_tensor_parallel"
RUN = run_side(LAB)  # the learner side: grader/runs/12_tensor_parallel.py
TITLE = "Tensor parallelism: Megatron layers"

# float32 layers against a float64 reference: looser than ACCUMULATED's atol (1e-6) because outputs
# and gradients near zero are sums of many products (attention, a GELU between two matmuls).
TOL = dict(atol=1e-4, rtol=1e-4)
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


# --- the rank side: runs in each of the 4 launched processes --------------------------------------


def _launch_case(public, configs) -> list:
    """The one case of a layer exercise: all its configs, one launch."""
    return [Case(("public sizes" if public else "random sizes") + ", TP=2 and TP=4", {"configs": configs})]


# --- the judge side -------------------------------------------------------------------------------

def _describe_calls(ops) -> str:
    if not ops:
        return "no collective"
    counts = {op: ops.count(op) for op in dict.fromkeys(ops)}
    return ", ".join(f"{n} {op}" for op, n in counts.items())


def _check_groups(obs, tp) -> str | None:
    """Every collective must run on the layer's group (checked before values: a wrong group sums wrongly)."""
    calls = obs.get("calls")
    if not isinstance(calls, list):
        return "no record of collectives came back."
    for c in calls:
        if c["op"] != "barrier" and c["group_size"] != tp:
            return (f"a collective ({c['op']}) ran over {c['group_size']} ranks, but this layer's process group "
                    f"has {tp}: pass group=process_group to every collective (and use dist.get_rank(group), "
                    "dist.get_world_size(group)).")
    return None


def _check_calls(obs, want, what, why, payload=None) -> str | None:
    """``want``: {"forward": [ops], "backward": [ops]}; "all_gather" stands for either gather form. ``why``
    follows a complaint. Checked after the groups and the values, so a missing f is reported by the input
    gradient it breaks."""
    calls = obs["calls"]
    for phase in ("forward", "backward"):
        raw = [c["op"] for c in calls if c["phase"] == phase]
        got = ["all_gather" if op in GATHERS else op for op in raw]
        if got != want[phase]:
            return (f"{what} issued {_describe_calls(raw)} in {phase}, expected {_describe_calls(want[phase])}. "
                    "(Collectives are counted when called as dist.<name>(...).)" + why)
        if payload is not None:
            sizes = [c["bytes"] for c in calls if c["phase"] == phase and c["op"] == "all_reduce"]
            if any(s != payload for s in sizes):
                return (f"{what} all-reduced {sizes} bytes in {phase}, expected {payload} bytes (the block's "
                        "output or input: batch x seq x hidden elements)." + why)
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
        if not isinstance(ranks, list) or len(ranks) != RUN.WORLD or any(
                not isinstance(o, list) or len(o) != len(configs) for o in ranks):
            return "the launch returned no observations for every rank and config."
        for i, cfg in enumerate(configs):
            ref = None if cfg.get("indivisible") else ref_fn(cfg)
            for rank in range(RUN.WORLD):
                r = rank % cfg["tp"]
                if msg := check_fn(cfg, ref, ranks[rank][i], r, rank):
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


def _first_mismatch(obs, wants) -> str | None:
    """The report of the first ``(key, want, name)`` whose observation differs; a ``None`` want is skipped."""
    for key, want, name in wants:
        if want is not None and (msg := _cmp(obs.get(key), want, name)):
            return msg
    return None


# --- f and g (and the gather and scatter) ----------------------------------------------------------

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
        B, S = (2, 3) if public else (randint(gen, 1, 3), randint(gen, 1, 4))
        n = 8 if public else 4 * randint(gen, 1, 4)
        for op in ("copy", "reduce", "gather", "scatter"):
            configs.append({"op": op, "tp": tp, "label": f"{RUN.REGION_NAMES[op]} (TP={tp}, x {B}x{S}x{n})",
                            "x": randn(gen, B, S, n), "dy": randn(gen, B, S, n),
                            "xs": randn(gen, tp, B, S, n),     # reduce: a different input on each rank
                            "dys": randn(gen, tp, B, S, n)})   # copy: a different upstream gradient on each rank
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
    if msg := _check_groups(obs, tp):
        return msg
    if msg := _cmp(obs.get("y"), ref["y"](r), "forward output"):
        return msg + _rank_note(r, rank)
    x_grad = obs.get("x_grad")
    if op == "copy" and _matches(x_grad, cfg["dys"][r]):
        return "x.grad is this rank's own gradient: f must all-reduce (sum) the gradient over the group in backward."
    if op == "reduce" and isinstance(x_grad, torch.Tensor) and tp > 1 and _matches(x_grad, tp * cfg["dy"]):
        return "x.grad is world_size times the gradient: g's backward is the identity (no all-reduce)."
    if msg := _cmp(x_grad, ref["x_grad"](r), "x.grad (the input gradient)"):
        return msg + _rank_note(r, rank)
    return _check_calls(obs, want, RUN.REGION_NAMES[op], f" {why}.")


TP_REGIONS = Exercise(
    "tp_regions", 3, RUN._REGIONS, _regions_cases, partial(RUN._launch_run, RUN._rank_regions, RUN._REGIONS),
    _judge_launch(_regions_ref, _regions_check), title="f, g, gather and scatter as autograd Functions",
    hint="Each is a torch.autograd.Function with forward(ctx, x, group) and backward(ctx, grad) returning "
         "(grad_x, None). f: identity / all-reduce; g: all-reduce / identity; gather: all_gather + cat "
         "on the last dim / keep your slice; scatter: keep your slice / all_gather. Pass group=group, "
         "use dist.get_rank(group), and all-reduce a contiguous clone, never the input itself.")


# --- column-parallel linear (the linear layers' common parts too) --------------------------------------


def _linear_cases(kind):
    cls, flag_name = ("ColumnParallelLinear", "gather_output") if kind == "column" else \
        ("RowParallelLinear", "input_is_parallel")

    def make(gen, public):
        configs = []
        B, S = (2, 3) if public else (randint(gen, 1, 3), randint(gen, 1, 4))
        for tp, flag, bias in [(2, True, True), (2, False, True), (4, True, True), (4, False, False)]:
            fin = 8 if public else randint(gen, 1, 12)
            fout = 12 if public else 4 * randint(gen, 1, 4)
            if kind == "row":
                fin, fout = fout, fin           # the split dimension must divide by 4
            configs.append({"tp": tp, "in": fin, "out": fout, ("gather" if kind == "column" else "parallel"): flag,
                            "label": f"{cls}({fin}, {fout}, bias={bias}, {flag_name}={flag}) at TP={tp}, "
                                     f"x {B}x{S}x{fin}",
                            "w": randn(gen, fout, fin, scale=1 / math.sqrt(fin)),
                            "b": randn(gen, fout) if bias else None,
                            "x": randn(gen, B, S, fin), "dy": randn(gen, B, S, fout)})
        bad = 10 if public else 4 * randint(gen, 1, 4) + 2   # divisible by 2, not by 4
        for tp, size in ((2, 7), (4, bad)):
            fin, fout = (8, size) if kind == "column" else (size, 8)
            configs.append({"tp": tp, "in": fin, "out": fout, "indivisible": (cls, fin, fout),
                            "label": f"{cls}({fin}, {fout}) at TP={tp} (not divisible)"})
        return _launch_case(public, configs)
    return make


def _linear_ref(cfg):
    def fn(x, p, extra):
        return torch.nn.functional.linear(x, p["w"], p["b"])
    return _autograd_ref(fn, cfg["x"], cfg["dy"], {"w": cfg["w"], "b": cfg["b"]})


# Which part of nn.Linear's (out, in) weight each layer holds, in the judge's words.
_SPLITS = {"column": ("OUTPUT", "rows", "(out_features/p, in_features)", "this rank's out_features/p entries"),
           "row": ("INPUT", "columns", "(out_features, in_features/p)",
                   "the whole (out_features,) bias, on every rank")}


def _check_linear_shard(kind, cfg, obs, r, rank, part) -> str | None:
    """The weight shard of a column- or row-parallel layer (``part``: this rank's rows or columns) and its bias."""
    features, dim, shape_doc, bias_doc = _SPLITS[kind]
    tp, fin, fout = cfg["tp"], cfg["in"], cfg["out"]
    want = cfg["w"][part] if kind == "column" else cfg["w"][:, part]
    w = obs.get("weight")
    if not isinstance(w, torch.Tensor):
        return f"the layer has no `weight` parameter (this rank's shard, shape {shape_doc})."
    if tuple(w.shape) != tuple(want.shape):
        swapped = tuple(w.shape) in ((fout // tp, fin), (fout, fin // tp))  # the other layer's shard shape
        wrong = (f": the weight was split along the wrong dimension. A {kind}-parallel layer splits the {features} "
                 f"features, i.e. the {dim} of nn.Linear's (out, in) weight") if swapped else ""
        return f"weight shard has shape {tuple(w.shape)}, expected {shape_doc} = {tuple(want.shape)}{wrong}."
    if not _matches(w, want):
        return (f"load_from_full loaded the wrong shard: rank {r} must hold {dim} {part.start}..{part.stop - 1} "
                f"of the full weight{_rank_note(r, rank)}.")
    if obs.get("has_bias") != (cfg["b"] is not None):
        return "bias=False must leave the layer without a bias (self.bias = None)." if cfg["b"] is None else \
            f"the layer has no `bias` parameter ({bias_doc})."
    return None


def _column_check(cfg, ref, obs, r, rank):
    tp, fout = cfg["tp"], cfg["out"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"out_features = {fout} at TP={tp}")
    rows = slice(r * fout // tp, (r + 1) * fout // tp)
    y_want, y_what = (ref["y"], "output") if cfg["gather"] else \
        (ref["y"].chunk(tp, -1)[r], "output (this rank's slice of the features)")
    if msg := (_check_linear_shard("column", cfg, obs, r, rank, rows) or _check_groups(obs, tp)
               or _first_mismatch(obs, [("y", y_want, y_what)])):
        return msg
    partial = cfg["dy"].double().chunk(tp, -1)[r] @ cfg["w"].double()[rows]  # x.grad without f's all-reduce
    if tp > 1 and _matches(obs.get("x_grad"), partial.float()):
        return ("x.grad is only this rank's partial sum: the input gradient of a column-parallel layer must be "
                "all-reduced over the group in backward (apply f, CopyToParallelRegion, to the input).")
    want = {"forward": ["all_gather"] if cfg["gather"] else [], "backward": ["all_reduce"]}
    return (_first_mismatch(obs, [("x_grad", ref["x_grad"], "x.grad (the input gradient)"),
                                  ("w_grad", ref["w_grad"][rows], "weight.grad"),
                                  ("b_grad", None if cfg["b"] is None else ref["b_grad"][rows], "bias.grad")])
            or _check_calls(obs, want, "ColumnParallelLinear", " The layer all-reduces only the input gradient (f) "
                            "in backward, and gathers its output in forward only when gather_output=True."))


COLUMN_PARALLEL = Exercise(
    "column_parallel", 3, ("ColumnParallelLinear",), _linear_cases("column"),
    partial(RUN._launch_run, RUN._rank_column, ("ColumnParallelLinear",)),
    _judge_launch(_linear_ref, _column_check), title="Column-parallel linear",
    hint="weight = full.weight[r*out/p:(r+1)*out/p] (rows = output features). forward: x = CopyToParallelRegion"
         ".apply(x, group); y = F.linear(x, weight, bias); gather only if gather_output. Raise ValueError when "
         "out_features % p != 0.")


# --- row-parallel linear ----------------------------------------------------------------------


def _row_check(cfg, ref, obs, r, rank):
    tp, fin = cfg["tp"], cfg["in"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"in_features = {fin} at TP={tp}")
    cols = slice(r * fin // tp, (r + 1) * fin // tp)
    if msg := _check_linear_shard("row", cfg, obs, r, rank, cols):
        return msg
    if cfg["b"] is not None and tp > 1 and _matches(obs.get("y"), (ref["y"] + (tp - 1) * cfg["b"].double()).float()):
        return (f"the output holds the bias {tp} times: each rank added it before the all-reduce. Add the "
                "bias once, after the all-reduce (g).")
    x_want, x_what = (ref["x_grad"].chunk(tp, -1)[r], "this rank's slice") if cfg["parallel"] else \
        (ref["x_grad"], "all of it")
    if msg := _check_groups(obs, tp) or _first_mismatch(obs, [
        ("y", ref["y"], "output"), ("x_grad", x_want, f"x.grad (the input gradient, {x_what})"),
        ("w_grad", ref["w_grad"][:, cols], "weight.grad"),
        ("b_grad", None if cfg["b"] is None else ref["b_grad"], "bias.grad (the whole bias, the same on every rank)")]):
        return msg
    want = {"forward": ["all_reduce"], "backward": [] if cfg["parallel"] else ["all_gather"]}
    return _check_calls(obs, want, "RowParallelLinear", " The layer all-reduces its output once in forward (g); in "
                        "backward it communicates only when its input was split here (input_is_parallel=False: "
                        "all-gather the input gradient).")


ROW_PARALLEL = Exercise(
    "row_parallel", 3, ("RowParallelLinear",), _linear_cases("row"), partial(RUN._launch_run, RUN._rank_row,
                                                                             ("RowParallelLinear",)),
    _judge_launch(_linear_ref, _row_check), title="Row-parallel linear",
    hint="weight = full.weight[:, r*in/p:(r+1)*in/p] (columns = input features), bias whole. forward: "
         "scatter x unless input_is_parallel, y = ReduceFromParallelRegion.apply(F.linear(x, weight), "
         "group), then add the bias ONCE. Raise ValueError when in_features % p != 0.")


# --- the two blocks, MLP and attention: a column-parallel layer, local work, a row-parallel layer ----


def _block_tensors(gen, block, B, S, h, col_out, row_in, bias) -> dict:
    """A block's case tensors, in this order: col's (col_out, h) weight and its bias, row's (h, row_in) weight
    and its bias (weights scaled by 1/sqrt(fan-in)), the (B, S, h) input and its upstream gradient."""
    wc, bc, wr, br = block.params
    return {wc: randn(gen, col_out, h, scale=1 / math.sqrt(h)), bc: randn(gen, col_out) if bias else None,
            wr: randn(gen, h, row_in, scale=1 / math.sqrt(row_in)), br: randn(gen, h) if bias else None,
            "x": randn(gen, B, S, h), "dy": randn(gen, B, S, h)}


def _check_shard(obs, key, want, what) -> str | None:
    got = obs.get(key)
    if not isinstance(got, torch.Tensor):
        return f"{what} has no `weight` parameter."
    if tuple(got.shape) != tuple(want.shape):
        return f"{what}.weight has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    if not _matches(got, want):
        return f"{what}.weight after load_from_full is not this rank's shard."
    return None


def _check_parts(block, obs) -> str | None:
    for sub in (block.col, block.row):
        if not obs.get(f"{sub}_present"):
            return (f"{block.name} needs attributes {block.col} (a ColumnParallelLinear) and {block.row} (a "
                    f"RowParallelLinear); {sub} is missing.")
    return None


def _check_block(block, cfg, ref, obs, r, rank, rows, cols) -> str | None:
    """A block whose sub-layers exist: ``rows`` of col's weight and ``cols`` of row's are this rank's shards.
    Then the row-parallel bias added once, the groups, the output, the input gradient (f), the weight
    gradients, and exactly one all-reduce forward and one backward."""
    tp, col, row = cfg["tp"], block.col, block.row
    wc, bc, wr, br = block.params
    if msg := (_check_shard(obs, f"{col}_weight", cfg[wc][rows], block.col_what)
               or _check_shard(obs, f"{row}_weight", cfg[wr][:, cols], f"{row} (row-parallel)")):
        return msg + _rank_note(r, rank)
    y = obs.get("y")
    if cfg[br] is not None and tp > 1 and _matches(y, (ref["y"] + (tp - 1) * cfg[br].double()).float()):
        return f"the output holds {row}'s bias {tp} times: add the row-parallel bias once, after the all-reduce."
    if msg := _check_groups(obs, tp):
        return msg
    if msg := _cmp(y, ref["y"], "output"):
        return msg + block.output_note
    partial = ref[col][..., rows] @ cfg[wc].double()[rows]  # this rank's term of x.grad, without f's all-reduce
    if tp > 1 and _matches(obs.get("x_grad"), partial.float()):
        return ("x.grad (the input gradient) is only this rank's partial sum: the column-parallel "
                f"{col} must all-reduce the input gradient in backward (f).{block.f_note}")
    if msg := _first_mismatch(obs, [
        ("x_grad", ref["x_grad"], "x.grad (the input gradient)"),
        (f"{col}_w_grad", ref[f"{wc}_grad"][rows], f"{col}.weight.grad"),
        (f"{col}_b_grad", None if cfg[bc] is None else ref[f"{bc}_grad"][rows], f"{col}.bias.grad"),
        (f"{row}_w_grad", ref[f"{wr}_grad"][:, cols], f"{row}.weight.grad"),
        (f"{row}_b_grad", None if cfg[br] is None else ref[f"{br}_grad"], f"{row}.bias.grad")]):
        return msg
    B, S = cfg["x"].shape[:2]
    return _check_calls(obs, {"forward": ["all_reduce"], "backward": ["all_reduce"]}, block.name, block.calls_note,
                        payload=B * S * cfg["hidden"] * 4)


# --- parallel MLP ----------------------------------------------------------------------------------


def _mlp_cases(gen, public):
    configs = []
    B, S = (2, 3) if public else (randint(gen, 1, 3), randint(gen, 1, 4))
    for tp, bias in ((2, True), (4, True), (4, False)):
        h = 8 if public else 4 * randint(gen, 1, 3)
        f = 16 if public else 4 * randint(gen, 1, 6)
        configs.append({"tp": tp, "hidden": h, "ffn": f,
                        "label": f"ParallelMLP(hidden={h}, ffn_hidden={f}, bias={bias}) at TP={tp}, x {B}x{S}x{h}",
                        **_block_tensors(gen, RUN._MLP, B, S, h, f, f, bias)})
    configs.append({"tp": 4, "hidden": 8, "ffn": 10, "indivisible": ("ParallelMLP", 8, 10),
                    "label": "ParallelMLP(hidden=8, ffn_hidden=10) at TP=4 (not divisible)"})
    return _launch_case(public, configs)


def _mlp_ref(cfg):
    F = torch.nn.functional

    def fn(x, p, extra):
        h1 = F.linear(x, p["w1"], p["b1"])
        h1.retain_grad()
        extra["fc1"] = h1
        return F.linear(F.gelu(h1), p["w2"], p["b2"])
    return _autograd_ref(fn, cfg["x"], cfg["dy"], {k: cfg[k] for k in ("w1", "b1", "w2", "b2")})


def _mlp_check(cfg, ref, obs, r, rank):
    tp, f = cfg["tp"], cfg["ffn"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"ffn_hidden = {f} at TP={tp}")
    rows = slice(r * f // tp, (r + 1) * f // tp)  # this rank's ffn features: fc1's rows, fc2's columns
    return _check_parts(RUN._MLP, obs) or _check_block(RUN._MLP, cfg, ref, obs, r, rank, rows, rows)


TP_MLP = Exercise(
    "tp_mlp", 3, ("ParallelMLP",), _mlp_cases, partial(RUN._launch_run, RUN._rank_mlp, ("ParallelMLP",)),
    _judge_launch(_mlp_ref, _mlp_check), title="Parallel MLP: column, GELU, row",
    hint="fc1 = ColumnParallelLinear(hidden, ffn, gather_output=False), fc2 = RowParallelLinear(ffn, hidden, "
         "input_is_parallel=True); forward fc2(gelu(fc1(x))). load_from_full(mlp) loads mlp.fc1 and mlp.fc2.")


# --- parallel self-attention -----------------------------------------------------------------------


def _attention_cases(gen, public):
    configs = []
    B = 2 if public else randint(gen, 1, 2)
    for tp, bias, causal in ((2, True, True), (4, True, True), (2, False, False)):
        heads = 4 if public else 4 * randint(gen, 1, 2)
        d = 4 if public else choice(gen, [2, 4, 8])
        S = 5 if public else randint(gen, 1, 6)
        h = heads * d
        configs.append({"tp": tp, "hidden": h, "heads": heads, "causal": causal,
                        "label": f"ParallelSelfAttention(hidden={h}, n_heads={heads}, bias={bias}, causal={causal}) "
                                 f"at TP={tp}, x {B}x{S}x{h}",
                        **_block_tensors(gen, RUN._ATTENTION, B, S, h, 3 * h, h, bias)})
    configs.append({"tp": 4, "hidden": 8, "heads": 2, "indivisible": ("ParallelSelfAttention", 8, 2),
                    "label": "ParallelSelfAttention(hidden=8, n_heads=2) at TP=4 (heads not divisible)"})
    return _launch_case(public, configs)


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
    if msg := _check_parts(RUN._ATTENTION, obs):
        return msg
    if tp > 1 and _matches(obs.get("qkv_weight"), cfg["wqkv"].chunk(tp, 0)[r]):
        return ("qkv.weight holds a contiguous slice of the fused [q | k | v] weight: rank 0 gets all of q's "
                "rows and none of v's, so its 'heads' mix q, k and v of different heads. Each rank must take "
                "the q, k and v rows of ITS heads: rows r*hidden/p..(r+1)*hidden/p of each of the three blocks.")
    return _check_block(RUN._ATTENTION, cfg, ref, obs, r, rank, _head_rows(h, tp, r), slice(r * h // tp,
                                                                                            (r + 1) * h // tp))


TP_ATTENTION = Exercise(
    "tp_attention", 3, ("ParallelSelfAttention",), _attention_cases,
    partial(RUN._launch_run, RUN._rank_attention, ("ParallelSelfAttention",)),
    _judge_launch(_attention_ref, _attention_check), title="Parallel self-attention split by heads",
    hint="qkv = ColumnParallelLinear(h, 3h), proj = RowParallelLinear(h, h). Load qkv with "
         "cat(Wq[rows], Wk[rows], Wv[rows]) for rows = r*h/p..(r+1)*h/p (not a contiguous slice of the "
         "fused weight); forward: split the local (B, S, 3h/p) into q, k, v of h/p, view as (B, H/p, S, d).")


# --- communication volume --------------------------------------------------------------------------

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
    if public:
        return [Case(", ".join(f"{k}={v}" for k, v in s.items()), s) for s in fixed]
    # one case per TP size on every seed (TP=1: nothing to all-reduce), random sizes
    specs = [dict(batch=randint(gen, 1, 64), seq=randint(gen, 1, 8192), hidden=128 * randint(gen, 1, 96),
                  dtype_bytes=choice(gen, [1, 2, 4]), tp_size=tp, n_layers=randint(gen, 1, 96)) for tp in (1, 2, 4, 8)]
    return [Case(f"TP={s['tp_size']}: " + ", ".join(f"{k}={v}" for k, v in s.items()), s) for s in specs]


def _volume_judge(case, obs):
    x = case.inputs
    args = (x["batch"], x["seq"], x["hidden"], x["dtype_bytes"], x["tp_size"])
    for block, got in obs["blocks"].items():
        want = ref_tp_allreduce_bytes(block, *args)
        if not isinstance(got, dict) or set(got) != {"forward", "backward"}:
            return f"tp_allreduce_bytes must return {{'forward': bytes, 'backward': bytes}}, got {got!r}."
        for phase in ("forward", "backward"):
            if not close(got[phase], want[phase]):
                return (f"tp_allreduce_bytes({block!r}, ...)[{phase!r}] = {got[phase]!r}, expected {want[phase]}: "
                        + ("with one rank nothing is all-reduced." if x["tp_size"] == 1 else
                           "one all-reduce of the block's (batch, seq, hidden) activations per direction."))
    payload = x["batch"] * x["seq"] * x["hidden"] * x["dtype_bytes"]
    for p, got in zip((1, 2, 4, 8, x["tp_size"]), obs["ring"]):
        want = ref_ring_allreduce_traffic(payload, p)
        if not close(got, want):
            return (f"ring_allreduce_traffic({payload}, {p}) = {got!r}, expected {want:g}: a ring all-reduce is a "
                    "reduce-scatter then an all-gather, each sending (p-1)/p of the payload per rank.")
    for rc, got in zip((False, True), obs["step"]):
        want = ref_step_allreduce_bytes(*args, x["n_layers"], recompute=rc)
        if not close(got, want):
            return (f"step_allreduce_bytes(..., recompute={rc}) = {got!r}, expected {want}: per layer two blocks, "
                    "each one all-reduce forward and one backward" + (", and full recomputation repeats the forward "
                                                                     "ones." if rc else "."))
    return None


TP_COMM_VOLUME = Exercise(
    "tp_comm_volume", 2, ("tp_allreduce_bytes", "ring_allreduce_traffic", "step_allreduce_bytes"),
    _volume_cases, RUN._volume_run, _volume_judge, title="Communication volume per layer",
    hint="Each block all-reduces batch*seq*hidden*dtype_bytes once forward (g) and once backward (f); "
         "nothing when tp_size == 1. A ring all-reduce sends 2(p-1)/p of the payload per rank. A layer has "
         "two blocks; full recomputation replays the forward all-reduces.")

# --- vocab-parallel cross-entropy -----------------------------------------------------------------


def _boundary_targets(gen, B, S, V, tp):
    """Target ids on shard edges: the first and last id of every rank's range [r*V/p, (r+1)*V/p)."""
    n = V // tp
    edges = torch.tensor([i for r in range(tp) for i in (r * n, (r + 1) * n - 1)])
    return edges[torch.randint(len(edges), (B, S), generator=gen)]


def _vocab_ce_cases(gen, public):
    configs = []
    for tp, kind in ((2, "boundary"), (2, "random"), (4, "random"), (4, "large")):
        B, S = (2, 3) if public else (randint(gen, 1, 3), randint(gen, 1, 4))
        V = (8 if public else 4 * randint(gen, 2, 6)) * (2 if tp == 2 else 1)
        logits = randn(gen, B, S, V, scale=3.0)
        if kind == "large":   # exp(1000) overflows float32: only a max-shifted softmax stays finite
            logits = logits * 20 + 1000
        target = (_boundary_targets(gen, B, S, V, tp) if kind == "boundary"
                  else torch.randint(V, (B, S), generator=gen))
        configs.append({"tp": tp, "kind": kind, "label": f"VocabParallelCrossEntropy at TP={tp}, logits {B}x{S}x{V}"
                        + {"random": "", "boundary": ", targets on shard boundaries",
                           "large": ", large logits (about 1000)"}[kind],
                        "logits": logits, "target": target, "dy": randn(gen, B, S)})
    bad = 10 if public else 4 * randint(gen, 1, 5) + 2   # divisible by 2, not by 4
    configs.append({"tp": 4, "indivisible": ("vocab_range", bad), "label": f"vocab_range({bad}) at TP=4"})
    return _launch_case(public, configs)


def _vocab_ce_ref(cfg):
    logits = cfg["logits"].double().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), cfg["target"].flatten(), reduction="none")
    loss = loss.view(cfg["target"].shape)                                   # (B, S)
    loss.backward(cfg["dy"].double())
    return {"y": loss.detach(), "x_grad": logits.grad}


def _check_vocab_calls(cfg, obs) -> str | None:
    """Forward: all-reduces of (B, S) statistics only (max, sum of exp, target logit); backward: nothing."""
    B, S = cfg["target"].shape
    calls, small = obs["calls"], B * S * 4
    for c in calls:
        if c["op"] in GATHERS:
            return (f"a {c['op']} of {c['bytes']} bytes was issued in {c['phase']}: the point of a vocab-parallel "
                    "loss is never to gather the (B, S, V) logits. All-reduce three (B, S) statistics instead: the "
                    "max, the sum of exp, and the target logit.")
        if c["phase"] == "backward":
            return (f"{c['op']} in backward: the gradient softmax - one_hot of this rank's shard needs no "
                    "communication (save the softmax, or what recomputes it, in forward).")
        if c["op"] != "all_reduce" or c["bytes"] > 2 * small:
            return (f"forward issued {c['op']} of {c['bytes']} bytes; expected only all-reduces of (B, S) "
                    f"statistics ({small} bytes each).")
    if not calls:
        return "no collective was issued: every rank holds only V/p logits, so the max, sum and target need the group."
    return None


def _layer_check(what, body):
    """A check_fn: a config that does not divide is judged by :func:`_check_indivisible` (``what(cfg)`` names it);
    any other by its collectives' groups first, then ``body(cfg, ref, obs, r, rank)``."""
    def check(cfg, ref, obs, r, rank):
        if cfg.get("indivisible"):
            return _check_indivisible(obs, what(cfg))
        return _check_groups(obs, cfg["tp"]) or body(cfg, ref, obs, r, rank)
    return check


def _vocab_ce_values(cfg, ref, obs, r, rank):
    tp = cfg["tp"]
    y, grad = obs.get("y"), obs.get("x_grad")
    if isinstance(y, torch.Tensor) and not bool(torch.isfinite(y).all()) or (
            isinstance(grad, torch.Tensor) and not bool(torch.isfinite(grad).all())):
        return ("the loss or the gradient is not finite (inf or NaN) for logits near 1000: exp overflows float32. "
                "Subtract the GLOBAL max (all-reduce MAX of each rank's row max) before exp.")
    if msg := _cmp(y, ref["y"], "loss (B, S)"):
        hint = (" Targets here sit on shard edges: rank r owns ids start <= t < end (end excluded), so exactly one "
                "rank contributes each target logit; mask the others to 0 before the all-reduce SUM."
                if cfg["kind"] == "boundary" else "")
        return msg + hint + _rank_note(r, rank)
    n = cfg["logits"].shape[-1] // tp
    if msg := _cmp(grad, ref["x_grad"][..., r * n:(r + 1) * n], "logits_shard.grad"):
        return msg + (" The gradient of this rank's shard is (softmax - one_hot(target))[shard] * grad_loss: the "
                      "one-hot is 1 only on the rank that owns the target id.")
    return _check_vocab_calls(cfg, obs)


VOCAB_PARALLEL_CE = Exercise(
    "vocab_parallel_ce", 3, ("vocab_range", "VocabParallelCrossEntropy"), _vocab_ce_cases,
    partial(RUN._launch_run, RUN._rank_vocab_ce, ("vocab_range", "VocabParallelCrossEntropy"),
            probe=RUN._vocab_ce_probe),
    _judge_launch(_vocab_ce_ref, _layer_check(
        lambda cfg: f"a vocabulary of {cfg['indivisible'][1]} ids at TP={cfg['tp']}", _vocab_ce_values)),
    title="Vocab-parallel cross-entropy",
    hint="forward: m = all-reduce MAX of the row max; z = logits - m; target logit = z at (target - start) where "
         "start <= target < end, else 0, then all-reduce SUM; sum_exp = all-reduce SUM of exp(z).sum(-1); loss = "
         "log(sum_exp) - target logit. backward: softmax = exp(z) / sum_exp, minus 1 at the target on the rank "
         "that owns it, times grad_loss[..., None]. No collective in backward.")


# --- sequence parallelism --------------------------------------------------------------------------

REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")


def _sp_cases(gen, public):
    configs = []
    for tp, bias, dropout in ((2, True, 0.0), (4, False, 0.0), (4, True, 0.5)):
        # with dropout, at least 2 x 2 x 8 elements per rank: two ranks' masks never agree by chance
        B = 2 if public or dropout else randint(gen, 1, 2)
        S = tp * (2 if public else randint(gen, 2 if dropout else 1, 3))
        h = 8 if public else 4 * randint(gen, 2 if dropout else 1, 3)
        f = 16 if public else 4 * randint(gen, 1, 4)
        seed = 0 if public else randint(gen, 0, 99)
        configs.append({"tp": tp, "hidden": h, "ffn": f, "dropout": dropout, "seed": seed,
                        "label": f"SequenceParallelMLP(hidden={h}, ffn_hidden={f}, dropout={dropout}, bias={bias}) "
                                 f"at TP={tp}, x {B}x{S}x{h} (S/p = {S // tp} tokens per rank)",
                        "ln_w": 1 + randn(gen, h, scale=0.1), "ln_b": randn(gen, h, scale=0.1),
                        **_block_tensors(gen, RUN._MLP, B, S, h, f, f, bias)})
    configs.append({"tp": 4, "hidden": 8, "ffn": 10, "indivisible": ("SequenceParallelMLP", 8, 10),
                    "label": "SequenceParallelMLP(hidden=8, ffn_hidden=10) at TP=4 (not divisible)"})
    return _launch_case(public, configs)


def _sp_ref(cfg):
    F = torch.nn.functional
    h = cfg["hidden"]

    def fn(x, p, extra):
        return x + F.linear(F.gelu(F.linear(F.layer_norm(x, (h,), p["ln_w"], p["ln_b"]), p["w1"], p["b1"])),
                            p["w2"], p["b2"])
    params = {k: cfg[k] for k in ("ln_w", "ln_b", "w1", "b1", "w2", "b2")}
    out = _autograd_ref(fn, cfg["x"], cfg["dy"], params)
    x = cfg["x"].double()
    out["mlp_out"] = fn(x, {k: None if v is None else v.double() for k, v in params.items()}, {}) - x
    return out


def _sp_values(cfg, ref, obs, r, tp) -> str | None:
    """Dropout off: the output shard, the input gradient shard and every weight gradient; dropout on: the
    output, which must be the residual plus this rank's kept MLP outputs scaled by 1 / (1 - p)."""
    rows = slice(r * cfg["ffn"] // tp, (r + 1) * cfg["ffn"] // tp)
    tokens = slice(r * cfg["x"].shape[1] // tp, (r + 1) * cfg["x"].shape[1] // tp)
    y = obs.get("y")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(ref["y"][:, tokens].shape):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        return (f"output has shape {got}, expected this rank's sequence shard {tuple(ref['y'][:, tokens].shape)}: "
                "a sequence-parallel block takes and returns (B, S/p, hidden).")
    if cfg["dropout"]:
        p = cfg["dropout"]
        kept = (obs["y"] != cfg["x"][:, tokens]).double()
        if bool(kept.all()):
            return f"no element was dropped with dropout={p}: apply dropout in training mode (module.training)."
        want = cfg["x"][:, tokens].double() + kept * ref["mlp_out"][:, tokens] / (1 - p)
        return _cmp(y, want, "output with dropout (x + mask * mlp(ln(x)) / (1 - p))")
    return _first_mismatch(obs, [
        ("y", ref["y"][:, tokens], "output (this rank's tokens)"),
        ("x_grad", ref["x_grad"][:, tokens], "x.grad (this rank's tokens)"),
        ("ln_w_grad", ref["ln_w_grad"], "ln.weight.grad summed over the group"),
        ("ln_b_grad", ref["ln_b_grad"], "ln.bias.grad summed over the group"),
        ("fc1_w_grad", ref["w1_grad"][rows], "fc1.weight.grad"),
        ("fc1_b_grad", None if cfg["b1"] is None else ref["b1_grad"][rows], "fc1.bias.grad"),
        ("fc2_w_grad", ref["w2_grad"][:, rows], "fc2.weight.grad"),
        ("fc2_b_grad", None if cfg["b2"] is None else ref["b2_grad"], "fc2.bias.grad summed over the group")])


def _sp_calls(cfg, obs) -> str | None:
    """Forward all-gather (g) then reduce-scatter (ḡ), backward the reverse, each of the full (B, S, h)."""
    B, S = cfg["x"].shape[:2]
    full = B * S * cfg["hidden"] * 4
    for phase, want in (("forward", ["all_gather", "reduce_scatter"]), ("backward", ["all_gather", "reduce_scatter"])):
        calls = [c for c in obs["calls"] if c["phase"] == phase]
        got = ["all_gather" if c["op"] in GATHERS else "reduce_scatter" if c["op"] in REDUCE_SCATTERS else c["op"]
               for c in calls]
        if "all_reduce" in got:
            return (f"{phase} issued {_describe_calls([c['op'] for c in calls])}: sequence parallelism replaces each "
                    "all-reduce by a reduce-scatter along the sequence (leaving the block) and an all-gather (entering "
                    "it). An all-reduce followed by a slice is right in value but sends twice the bytes and stores the "
                    "full sequence.")
        if got != want:
            return (f"{phase} issued {_describe_calls([c['op'] for c in calls])}, expected {_describe_calls(want)} "
                    "(forward: all-gather the sequence before fc1, reduce-scatter it after fc2; backward: the "
                    "reverse). Collectives are counted when called as dist.<name>(...).")
        for c in calls:
            if c["bytes"] != full:
                return (f"{c['op']} in {phase} logged {c['bytes']} bytes, expected {full}: the whole (B, S, hidden) "
                        "activation (a ring moves (p-1)/p of it per rank, so one all-gather plus one reduce-scatter "
                        "send exactly what the all-reduce of plain TP sends).")
    return None


def _sp_check(cfg, ref, obs, r, rank):
    tp = cfg["tp"]
    if cfg.get("indivisible"):
        return _check_indivisible(obs, f"ffn_hidden = {cfg['ffn']} at TP={tp}")
    for part in ("ln", "fc1", "fc2"):
        if not obs.get(f"{part}_present"):
            return ("SequenceParallelMLP needs attributes ln (nn.LayerNorm, whole on every rank), fc1 (a "
                    f"ColumnParallelLinear) and fc2 (a RowParallelLinear); {part} is missing.")
    if msg := _check_groups(obs, tp):
        return msg
    if msg := _sp_values(cfg, ref, obs, r, tp):
        return msg + _rank_note(r, rank)
    if obs.get("same_mask_as"):
        return (f"rank {r} dropped exactly the same elements as rank {obs['same_mask_as'][0]} of its group: every "
                "rank drew its dropout mask from the same RNG state, so different tokens share one mask. Give each "
                "rank its own generator (e.g. seeded with seed + rank in the group).")
    want_ln = obs["ln_bytes_full"] // tp
    if obs["ln_bytes"] != want_ln:
        return (f"the LayerNorm saved {obs['ln_bytes']} bytes of activations for backward on this rank, expected "
                f"{want_ln} (1/{tp} of the single-device block's {obs['ln_bytes_full']}): the LayerNorm must run on "
                "this rank's sequence shard, before the all-gather.")
    return _sp_calls(cfg, obs)


SEQUENCE_PARALLEL = Exercise(
    "sequence_parallel", 4, RUN._SP_NAMES, _sp_cases, partial(RUN._launch_run, RUN._rank_sp, RUN._SP_NAMES,
                                                              probe=RUN._sp_probe),
    _judge_launch(_sp_ref, _sp_check), title="Sequence parallelism: LayerNorm and dropout on sequence shards",
    hint="g: all_gather along dim 1 in forward, reduce_scatter along dim 1 in backward; ḡ: the reverse. Block: "
         "x (B, S/p, h) -> ln -> g -> fc1 (F.linear with its shard, no f) -> gelu -> fc2 (F.linear, no g) -> ḡ -> "
         "+ fc2.bias -> dropout with a per-rank generator -> + x. reduce_scatter wants contiguous chunks: "
         "[c.contiguous() for c in x.chunk(p, dim=1)].")


# --- mixture of experts: routing, capacity, load balancing ------------------------------------------

CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)   # exact in binary: ceil never meets a rounding error


def ref_expert_capacity(tokens, num_experts, top_k, capacity_factor) -> int:
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def ref_route(router_logits, top_k, capacity, token_major=False, renormalise=False):
    """The spec's routing; ``token_major`` fills slots token by token (a token's 2nd choice before the next
    token's 1st), ``renormalise`` divides the weights by their sum over the top-k: the two wrong variants the
    judge names."""
    T, E = router_logits.shape
    weight, index = router_logits.softmax(-1).topk(top_k, dim=-1)             # (T, k)
    if renormalise:
        weight = weight / weight.sum(-1, keepdim=True)
    in_order = index.reshape(-1) if token_major else index.t().reshape(-1)    # (k*T,)
    seen = torch.nn.functional.one_hot(in_order, E).cumsum(0)
    position = seen.gather(1, in_order.unsqueeze(1)).squeeze(1) - 1
    position = position.view(T, top_k) if token_major else position.view(top_k, T).t()  # (T, k)
    return index, weight, torch.where(position < capacity, position, torch.full_like(position, -1))


def ref_load_balancing_loss(router_logits, expert_index, num_experts):
    P = router_logits.softmax(-1).mean(0)
    f = torch.nn.functional.one_hot(expert_index[:, 0], num_experts).to(P.dtype).mean(0)
    return num_experts * (f * P).sum()


def ref_moe_all_to_all_bytes(tokens, hidden, num_experts, top_k, capacity_factor, dtype_bytes) -> int:
    return num_experts * ref_expert_capacity(tokens, num_experts, top_k, capacity_factor) * hidden * dtype_bytes


def _dropping_logits(gen, T, E, k):
    """Router logits (T, E) and a capacity that drops at least one choice, and (top-2) whose slots differ when
    filled token by token: an answer that ignores the capacity or fills in the wrong order fails every case."""
    for _ in range(100):
        logits, capacity = randn(gen, T, E, scale=2.0), randint(gen, 1, max(1, T * k // E) + 1)
        slot = ref_route(logits.double(), k, capacity)[2]
        if (slot < 0).any() and (k == 1 or not torch.equal(slot, ref_route(logits.double(), k, capacity,
                                                                          token_major=True)[2])):
            return logits, capacity
    raise AssertionError(f"no routing of {T} tokens over {E} experts drops a choice")


def _routing_cases(gen, public):
    if public:
        specs = [(8, 4, 1, 1.0), (8, 4, 2, 1.25), (10, 4, 2, 0.5), (6, 2, 1, 2.0)]
    else:
        specs = [(randint(gen, 3, 24), choice(gen, [2, 4, 8]), k, choice(gen, CAPACITY_FACTORS)) for k in (1, 2, 2)]
    cases = []
    for n, (T, E, k, cf) in enumerate(specs):
        # route's capacity is drawn on its own (not expert_capacity of any size asked for), below the busiest
        # expert's load most of the time, so choices are dropped; load_balancing_loss gets an index of its own
        # (k distinct experts per token), so an answer that recomputes the index from the logits shows
        logits, capacity = _dropping_logits(gen, T, E, k)
        index = torch.rand(T, E, generator=gen).argsort(-1)[:, :k]            # (T, k)
        cases.append(Case(f"{'public' if public else 'random'} {n + 1}: {T} tokens, {E} experts, top-{k}, "
                          f"capacity factor {cf}, capacity {capacity}",
                          {"T": T, "E": E, "k": k, "cf": cf, "logits": logits, "capacity": capacity,
                           "expert_index": index,
                           # capacities to compute, floor != ceil in most of them
                           "sizes": [(T, E, k, cf), (T + 1, E, k, 1.25), (3 * E + 1, E, 1, 1.0)]}))
    return cases


def _check_route(x, C, got) -> str | None:
    want = ref_route(x["logits"].double(), x["k"], C)
    if not isinstance(got, tuple) or len(got) != 3:
        return f"route must return (expert_index, combine_weight, slot), got {type(got).__name__}."
    index, weight, slot = got
    if not isinstance(index, torch.Tensor) or not torch.equal(index.long(), want[0]):
        return (f"route's expert_index differs from the top-{x['k']} experts of softmax(router_logits) "
                f"(best first, as torch.topk): got {index!r}.")
    renormalised = ref_route(x["logits"].double(), x["k"], C, renormalise=True)[1]
    if isinstance(weight, torch.Tensor) and _matches(weight.double(), renormalised) and not _matches(
            want[1], renormalised):
        return ("combine_weight sums to 1 over each token's top-k: that is a softmax AFTER top-k (renormalised "
                "weights, Mixtral's choice). The spec: softmax over all experts first, then top-k; the weights are "
                "the chosen experts' probabilities, not renormalised.")
    if msg := compare(weight, want[1], dtype=torch.float32, name="combine_weight", atol=1e-6, rtol=1e-5):
        return msg
    if not isinstance(slot, torch.Tensor) or not torch.equal(slot.long(), want[2]):
        wrong = slot.long() if isinstance(slot, torch.Tensor) else None
        token_major = ref_route(x["logits"].double(), x["k"], C, token_major=True)[2]
        why = (" You filled the slots token by token (a token's 2nd choice before the next token's 1st): the spec's "
               "priority is every 1st choice in token order, then every 2nd choice."
               if wrong is not None and torch.equal(wrong, token_major) else "")
        shown = wrong.tolist() if wrong is not None else repr(slot)
        return (f"route dropped the wrong choices (capacity {C} per expert): slot = {shown}, "
                f"expected {want[2].tolist()} (-1: dropped).{why}")
    return None


def _routing_judge(case, obs):
    x = case.inputs
    for size, got in zip(x["sizes"], obs["capacity"]):
        want = ref_expert_capacity(*size)
        if got != want or not isinstance(got, int):
            T, E, k, cf = size
            floor = " (that is the floor: round UP, or the last tokens of a full expert have no slot)" \
                if got == math.floor(cf * T * k / E) else ""
            return f"expert_capacity({T}, {E}, {k}, {cf}) = {got!r}, expected the int {want} = ceil(cf*T*k/E){floor}."
    if msg := _check_route(x, x["capacity"], obs["route"]):
        return msg
    want = ref_load_balancing_loss(x["logits"].double(), x["expert_index"], x["E"])
    got = obs["aux"]
    if isinstance(got, torch.Tensor) and got.numel() == 1 and close(float(got) * x["E"], float(want), rel=1e-5):
        return (f"load_balancing_loss = {float(got):.6g}, expected {float(want):.6g}: the num_experts factor is "
                "missing (with it, uniform routing scores 1 whatever E is).")
    if not isinstance(got, torch.Tensor) or got.numel() != 1 or not close(float(got), float(want), rel=1e-5):
        return (f"load_balancing_loss = {got!r}, expected {float(want):.6g} = E * sum_i f_i * P_i (f_i: fraction of "
                "tokens whose 1st choice is i; P_i: mean router probability of i).")
    for (h, b), got in zip(((8, 4), (64, 2)), obs["bytes"]):
        want = ref_moe_all_to_all_bytes(x["T"], h, x["E"], x["k"], x["cf"], b)
        if got != want:
            return (f"moe_all_to_all_bytes(tokens={x['T']}, hidden={h}, E={x['E']}, k={x['k']}, cf={x['cf']}, "
                    f"dtype_bytes={b}) = {got!r}, expected {want}: the whole (E, capacity, hidden) buffer, empty slots "
                    "included.")
    return None


MOE_ROUTING = Exercise(
    "moe_routing", 3, ("expert_capacity", "route", "load_balancing_loss", "moe_all_to_all_bytes"),
    _routing_cases, RUN._routing_run, _routing_judge, title="MoE routing: top-k, capacity, dropping, load balancing",
    hint="capacity: math.ceil. route: weight, index = softmax(logits).topk(k); order the choices index.t().reshape(-1) "
         "(all 1st choices, then all 2nd); one_hot(...).cumsum(0) gives each choice's position in its expert; "
         "slot = position if position < capacity else -1. aux = E * (f * P).sum().")


# --- expert parallelism ----------------------------------------------------------------------------


def _ep_cases(gen, public):
    configs = []
    for tp, E, k, cf in ((2, 4, 1, 1.0), (4, 4, 2, 1.25), (2, 4, 2, 0.5)):
        T = 8 if public else randint(gen, 3, 12)
        h = 8 if public else 4 * randint(gen, 1, 3)
        f = 16 if public else 4 * randint(gen, 1, 4)
        if not public:
            E, cf = tp * choice(gen, [1, 2]), choice(gen, CAPACITY_FACTORS)
        configs.append({"tp": tp, "hidden": h, "ffn": f, "E": E, "k": k, "cf": cf, "aux_coef": 0.5,
                        "label": f"ExpertParallelMoE(hidden={h}, ffn_hidden={f}, num_experts={E}, top_k={k}, "
                                 f"capacity_factor={cf}) at EP={tp}, {T} tokens per rank",
                        "router": randn(gen, E, h, scale=1.0), "x": randn(gen, tp, T, h), "dy": randn(gen, tp, T, h),
                        "fc1.weight": randn(gen, E, f, h, scale=1 / math.sqrt(h)), "fc1.bias": randn(gen, E, f),
                        "fc2.weight": randn(gen, E, h, f, scale=1 / math.sqrt(f)), "fc2.bias": randn(gen, E, h)})
    configs.append({"tp": 4, "indivisible": ("ExpertParallelMoE", 8, 16, 6),
                    "label": "ExpertParallelMoE(hidden=8, ffn_hidden=16, num_experts=6) at EP=4 (not divisible)"})
    return _launch_case(public, configs)


def _ref_moe(x, p, cfg, token_major=False):
    """Single-process MoE on one rank's tokens x (T, h), float64, all experts local: (y, aux)."""
    F = torch.nn.functional
    T = x.shape[0]
    C = ref_expert_capacity(T, cfg["E"], cfg["k"], cfg["cf"])
    logits = x @ p["router"].T                                                # (T, E)
    index, weight, slot = ref_route(logits, cfg["k"], C, token_major=token_major)
    y = torch.zeros_like(x)
    for t in range(T):
        for j in range(cfg["k"]):
            if slot[t, j] >= 0:
                e = int(index[t, j])
                hid = F.gelu(F.linear(x[t], p["fc1.weight"][e], p["fc1.bias"][e]))
                y = y.index_add(0, torch.tensor([t]), (weight[t, j] * F.linear(hid, p["fc2.weight"][e],
                                                                               p["fc2.bias"][e])).unsqueeze(0))
    return y, ref_load_balancing_loss(logits, index, cfg["E"])


_EP_PARAMS = ("router", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def _ep_ref(cfg):
    """Every rank's (y, aux, x.grad) and the parameter gradients summed over the group's ranks."""
    params = {k: cfg[k].double().requires_grad_(True) for k in _EP_PARAMS}
    out = {"y": [], "aux": [], "x_grad": [], "token_major_y": []}
    for r in range(cfg["tp"]):
        x = cfg["x"][r].double().requires_grad_(True)
        y, aux = _ref_moe(x, params, cfg)
        ((y * cfg["dy"][r].double()).sum() + cfg["aux_coef"] * aux).backward()
        out["y"].append(y.detach())
        out["aux"].append(aux.detach())
        out["x_grad"].append(x.grad)
        with torch.no_grad():
            out["token_major_y"].append(_ref_moe(cfg["x"][r].double(), params, cfg, token_major=True)[0])
    out.update({f"{k}_grad": params[k].grad for k in _EP_PARAMS})
    return out


def _ep_calls(cfg, obs) -> str | None:
    T = cfg["x"].shape[1]
    want = ref_moe_all_to_all_bytes(T, cfg["hidden"], cfg["E"], cfg["k"], cfg["cf"], 4)
    for phase in ("forward", "backward"):
        calls = [c for c in obs["calls"] if c["phase"] == phase]
        ops = [c["op"] for c in calls]
        if [op.replace("_single", "") for op in ops] != ["all_to_all", "all_to_all"]:
            return (f"{phase} issued {_describe_calls(ops)}, expected 2 all_to_all (dispatch, then combine"
                    + ("" if phase == "forward" else ", their gradients in reverse") + "). Expert parallelism "
                    "exchanges tokens all-to-all; gathering every rank's tokens sends p times more. (Collectives are "
                    "counted when called as dist.<name>(...).)")
        for c in calls:
            if c["bytes"] != want:
                return (f"an all_to_all in {phase} carried {c['bytes']} bytes, expected {want} = E * capacity * hidden "
                        "* 4: the whole fixed-size (E, capacity, hidden) buffer.")
    return None


def _ep_values(cfg, ref, obs, r, rank):
    tp = cfg["tp"]
    if "placement" in obs:
        return (f"forward with torch's default device elsewhere than the tokens' (the check sets it to 'meta'; on a "
                f"GPU it stays 'cpu' while the tokens are CUDA tensors) raised {obs['placement']}. Make every tensor "
                "forward creates on the tokens' device: torch.arange(T, device=x.device), x.new_zeros(...).")
    if msg := _first_mismatch(obs, [("y", ref["y"][r], "y (this rank's tokens)"), ("aux", ref["aux"][r], "aux"),
                                    ("x_grad", ref["x_grad"][r], "x.grad"),
                                    ("router_grad", ref["router_grad"], "router.weight.grad summed over the group")]):
        return msg + _rank_note(r, rank)
    local = cfg["E"] // tp
    if len(obs["experts"]) != local:
        return f"layer.experts holds {len(obs['experts'])} experts, expected E/p = {local} (experts r*E/p..(r+1)*E/p)."
    for i, grads in enumerate(obs["experts"]):
        e = r * local + i
        for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            if msg := _cmp(grads.get(name), ref[f"{name}_grad"][e], f"expert {e} {name}.grad"):
                return msg + (" (Each expert's gradient gathers the tokens every rank sent it: the backward of the "
                              "dispatch all-to-all must bring those gradients back.)")
    return _ep_calls(cfg, obs)


def _ep_judge(case, obs):
    """First the drop order on every rank (a wrong order on one rank also breaks the summed router gradient of the
    others, which would hide the cause), then each rank's values and collectives."""
    refs = {}

    def ref_of(cfg):
        if id(cfg) not in refs:
            refs[id(cfg)] = _ep_ref(cfg)
        return refs[id(cfg)]

    ranks = obs.get("ranks") if isinstance(obs, dict) else None
    for i, cfg in enumerate(case.inputs["configs"]):
        if cfg.get("indivisible") or not isinstance(ranks, list) or len(ranks) != RUN.WORLD:
            continue
        ref = ref_of(cfg)
        for rank in range(RUN.WORLD):
            y = ranks[rank][i].get("y") if isinstance(ranks[rank], list) and len(ranks[rank]) > i else None
            r = rank % cfg["tp"]
            if _matches(y, ref["token_major_y"][r].float()) and not _matches(y, ref["y"][r].float()):
                return (f"{cfg['label']}, global rank {rank}: the output drops the wrong tokens: slots were filled "
                        "token by token; the spec fills every 1st choice in token order, then every 2nd choice.")
    return _judge_launch(ref_of, _layer_check(lambda cfg: f"num_experts = {cfg['indivisible'][3]} at EP={cfg['tp']}",
                                              _ep_values))(case, obs)


EXPERT_PARALLEL = Exercise(
    "expert_parallel", 4, RUN._EP_NAMES, _ep_cases, partial(RUN._launch_run, RUN._rank_ep, RUN._EP_NAMES,
                                                            probe=RUN._ep_probe),
    _ep_judge, title="Expert parallelism: MoE with all-to-all",
    hint="AllToAll: dist.all_to_all(received, [c.contiguous() for c in x.chunk(p)], group=group), cat; backward the "
         "same. Layer: route your tokens, write them into an (E*C, h) buffer at row index*C + slot, AllToAll, view "
         "(p, E/p, C, h), run local expert i on [:, i], AllToAll back, index_add weight * result into y.")


# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.commlog.record_collectives", "gpulab.dist.launch", "gpulab.dist.rank_device",
           "gpulab.tensor_parallel_ref.MLP",
           "gpulab.tensor_parallel_ref.SelfAttention", "gpulab.tensor_parallel_ref.draw_megatron")
EXERCISES = [offering(ex, OFFERED) for ex in (TP_REGIONS, COLUMN_PARALLEL, ROW_PARALLEL, TP_MLP, TP_ATTENTION,
                                          TP_COMM_VOLUME, VOCAB_PARALLEL_CE, SEQUENCE_PARALLEL, MOE_ROUTING,
                                          EXPERT_PARALLEL)]


# --- benchmarks (python -m grader bench): one rank, so only the wrappers' overhead shows --------

def _one_rank_group(device):
    import torch.distributed as dist

    if not dist.is_initialized():  # one rank: an in-process store, no port to collide with another run's
        backend = "nccl" if device == "cuda" and dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
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
