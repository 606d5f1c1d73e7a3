"""The learner side of lab 12_tensor_parallel: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/12_tensor_parallel.py``).
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from grader.exercise import entry
from grader.runs.ranks import launch_ranks

WORLD = 4                # ranks per launch: TP=2 on {0,1} and {2,3}, TP=4 on all


RANK_TIMEOUT_S = 20.0    # a hung learner rank ends the launch after this (plus the watchdog's slack)


REGION_NAMES = {"copy": "CopyToParallelRegion", "reduce": "ReduceFromParallelRegion",
                "gather": "GatherFromParallelRegion", "scatter": "ScatterToParallelRegion"}


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _grad(t):
    return None if getattr(t, "grad", None) is None else t.grad.detach().clone()


def _param(module, name):
    p = getattr(module, name, None)  # module may be None: then so is p
    return p if isinstance(p, torch.Tensor) else None


def _pgrad(module, name):
    return _grad(_param(module, name))


def _pvalue(module, name):
    p = _param(module, name)
    return None if p is None else p.detach().clone()


def _fwd_bwd(forward, dy):
    """Run forward and backward (upstream gradient ``dy``) with every collective recorded; returns (y, calls)."""
    from gpulab.commlog import record_collectives

    with record_collectives() as log:
        y = forward()
        log.phase = "backward"
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"forward must return a torch.Tensor, got {type(y).__name__}.")
        if y.shape == dy.shape:  # else no backward: the judge reports the shape (the same on every rank)
            # (y * dy).sum() gives y exactly the gradient dy; y.backward(dy) would import sympy (3 s per rank)
            (y * dy).sum().backward()
    return y.detach().clone(), log.as_dicts()


def _try_build(cls, *args):
    """Constructing with sizes that do not divide must raise; report what happened."""
    try:
        cls(*args)
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


def rank_main(rank, world_size, rank_fn, learner, configs, timeout_s):
    """One rank of a check: tensor-parallel groups of 2 ({0,1}, {2,3}) and 4, then for every config
    ``rank_fn(learner, cfg, group, rank in group, tp)``, or the constructor call that must raise."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    groups = {2: [dist.new_group([0, 1], timeout=timeout), dist.new_group([2, 3], timeout=timeout)],
              4: [dist.group.WORLD]}
    torch.manual_seed(0)
    out = []
    for cfg in configs:
        tp = cfg["tp"]
        group = groups[tp][rank // tp]
        if cfg.get("indivisible"):  # (class name, sizes...) that do not divide by tp
            name, *sizes = cfg["indivisible"]
            out.append(_try_build(learner[name], *sizes, group))
        else:
            out.append(rank_fn(learner, cfg, group, rank % tp, tp))
    return out


# Sizes to construct each layer with, without a process group, in the probe.
_PROBE_SIZES = {"ColumnParallelLinear": (4, 4), "RowParallelLinear": (4, 4), "ParallelMLP": (4, 8),
                "ParallelSelfAttention": (8, 2)}


def _probe(L):
    """Call the learner's code once here, without ranks: a stub raises NotImplementedError at once, so
    an untouched exercise costs no launch (what else it raises, usually for want of a group, is ignored)."""
    for name, fn in L.items():
        if name in _PROBE_SIZES:
            fn(*_PROBE_SIZES[name], None)
        else:  # f, g, gather or scatter: an autograd Function
            fn.forward(types.SimpleNamespace(), torch.zeros(2, 4), None)


def _launch_run(rank_fn, names, ns, case, device, probe=_probe):
    """The run side of a layer exercise: one launch of ``rank_fn`` on WORLD ranks for all the case's configs;
    ``probe(L)`` calls the learner's objects once here, so that a stub costs no launch."""
    L = {name: entry(ns, name) for name in names}
    ranks = launch_ranks((rank_fn, *L.values()), rank_main, WORLD, rank_fn, L, case.inputs["configs"],
                         RANK_TIMEOUT_S, timeout_s=RANK_TIMEOUT_S, probe=lambda: probe(L))
    return {"ranks": ranks}


_REGIONS = tuple(REGION_NAMES.values())


def _rank_regions(L, cfg, pg, r, tp):
    op = cfg["op"]
    if op == "copy":
        x, dy = _leaf(cfg["x"]), cfg["dys"][r].contiguous()
    elif op == "reduce":
        x, dy = _leaf(cfg["xs"][r]), cfg["dy"]
    elif op == "gather":
        x, dy = _leaf(cfg["x"].chunk(tp, -1)[r].contiguous()), cfg["dy"]
    else:
        x, dy = _leaf(cfg["x"]), cfg["dy"].chunk(tp, -1)[r].contiguous()
    y, calls = _fwd_bwd(lambda: L[REGION_NAMES[op]].apply(x, pg), dy)
    return {"y": y, "x_grad": _grad(x), "calls": calls}


def _linear_obs(layer, cfg, x, dy):
    """In a rank: load the case's full nn.Linear into ``layer``, then forward and backward."""
    layer.load_from_full(_linear(cfg["w"], cfg["b"]))
    obs = {"weight": _pvalue(layer, "weight"), "has_bias": _param(layer, "bias") is not None}
    obs["y"], obs["calls"] = _fwd_bwd(lambda: layer(x), dy)
    obs.update(x_grad=_grad(x), w_grad=_pgrad(layer, "weight"), b_grad=_pgrad(layer, "bias"))
    return obs


def _rank_column(L, cfg, pg, r, tp):
    layer = L["ColumnParallelLinear"](cfg["in"], cfg["out"], pg, bias=cfg["b"] is not None,
                                      gather_output=cfg["gather"])
    dy = cfg["dy"] if cfg["gather"] else cfg["dy"].chunk(tp, -1)[r].contiguous()
    return _linear_obs(layer, cfg, _leaf(cfg["x"]), dy)


def _rank_row(L, cfg, pg, r, tp):
    layer = L["RowParallelLinear"](cfg["in"], cfg["out"], pg, bias=cfg["b"] is not None,
                                   input_is_parallel=cfg["parallel"])
    x = _leaf(cfg["x"].chunk(tp, -1)[r].contiguous() if cfg["parallel"] else cfg["x"])
    return _linear_obs(layer, cfg, x, cfg["dy"])


@dataclass(frozen=True)
class _Block:
    """A block as its checks name it."""

    name: str         # the learner's class
    col: str          # its column-parallel sub-layer (the reference keeps the gradient of its output under this key)
    row: str          # its row-parallel sub-layer
    params: tuple     # the case's keys of col's weight and bias, then of row's
    col_what: str     # col's shard, in messages
    output_note: str  # added to a wrong output
    f_note: str       # added when x.grad is this rank's partial sum
    calls_note: str   # added to wrong collectives


def _block_obs(block, cfg, full, layer):
    """In a rank: the case's weights into ``full`` (the single-device block), its shards into ``layer``
    (load_from_full), then the sub-layers' shards and forward and backward through ``layer``."""
    wc, bc, wr, br = block.params
    setattr(full, block.col, _linear(cfg[wc], cfg[bc]))
    setattr(full, block.row, _linear(cfg[wr], cfg[br]))
    layer.load_from_full(full)
    x, subs = _leaf(cfg["x"]), [getattr(layer, sub, None) for sub in (block.col, block.row)]
    obs = {}
    for sub, module in zip((block.col, block.row), subs):
        obs[f"{sub}_present"] = module is not None
        obs[f"{sub}_weight"] = _pvalue(module, "weight")
    obs["y"], obs["calls"] = _fwd_bwd(lambda: layer(x), cfg["dy"])
    obs["x_grad"] = _grad(x)
    for sub, module in zip((block.col, block.row), subs):
        obs[f"{sub}_w_grad"], obs[f"{sub}_b_grad"] = _pgrad(module, "weight"), _pgrad(module, "bias")
    return obs


_MLP = _Block("ParallelMLP", "fc1", "fc2", ("w1", "b1", "w2", "b2"), "fc1 (column-parallel)", output_note="",
              f_note=" Outputs and weight gradients can all be right while this is wrong.",
              calls_note=" Megatron's MLP needs exactly ONE all-reduce in forward (g, after fc2) and one in backward "
                         "(f, before fc1): GELU works on fc1's local slice, so nothing is gathered in between.")


def _rank_mlp(L, cfg, pg, r, tp):
    from gpulab.tensor_parallel_ref import MLP

    sizes, bias = (cfg["hidden"], cfg["ffn"]), cfg["b1"] is not None
    return _block_obs(_MLP, cfg, MLP(*sizes, bias=bias), L["ParallelMLP"](*sizes, pg, bias=bias))


_ATTENTION = _Block(
    "ParallelSelfAttention", "qkv", "proj", ("wqkv", "bqkv", "wproj", "bproj"),
    "qkv (column-parallel, this rank's heads: cat(Wq[rows], Wk[rows], Wv[rows]))",
    output_note=(" (Are the heads split right? Rank r owns heads r*H/p..(r+1)*H/p: its q, k, v are "
                 "(B, H/p, S, head_dim) views of its local qkv output.)"), f_note="",
    calls_note=(" Split by heads, attention needs exactly one all-reduce in forward (after proj) and one "
                "in backward (before qkv): each head's attention is local to its rank."))


def _rank_attention(L, cfg, pg, r, tp):
    from gpulab.tensor_parallel_ref import SelfAttention

    sizes, options = (cfg["hidden"], cfg["heads"]), dict(bias=cfg["bqkv"] is not None, causal=cfg["causal"])
    return _block_obs(_ATTENTION, cfg, SelfAttention(*sizes, **options),
                      L["ParallelSelfAttention"](*sizes, pg, **options))


def _volume_run(ns, case, device):
    x = case.inputs
    args = (x["batch"], x["seq"], x["hidden"], x["dtype_bytes"], x["tp_size"])
    out = {"blocks": {b: entry(ns, "tp_allreduce_bytes")(b, *args) for b in ("mlp", "attention")}}
    payload = x["batch"] * x["seq"] * x["hidden"] * x["dtype_bytes"]
    out["ring"] = [entry(ns, "ring_allreduce_traffic")(payload, p) for p in (1, 2, 4, 8, x["tp_size"])]
    out["step"] = [entry(ns, "step_allreduce_bytes")(*args, x["n_layers"], recompute=rc) for rc in (False, True)]
    return out


def _rank_vocab_ce(L, cfg, pg, r, tp):
    logits = _leaf(cfg["logits"].chunk(tp, -1)[r].contiguous())   # (B, S, V/p): this rank's vocabulary ids
    y, calls = _fwd_bwd(lambda: L["VocabParallelCrossEntropy"].apply(logits, cfg["target"], pg), cfg["dy"])
    return {"y": y, "x_grad": _grad(logits), "calls": calls}


def _vocab_ce_probe(L):
    L["vocab_range"](8, None)
    L["VocabParallelCrossEntropy"].forward(types.SimpleNamespace(), torch.zeros(1, 1, 4), torch.zeros(1, 1).long(),
                                           None)


_SP_NAMES = ("GatherFromSequenceParallelRegion", "ReduceScatterToSequenceParallelRegion", "SequenceParallelMLP")


def _full_block(cfg):
    """The single-device MLPBlock holding the case's weights (float32)."""
    from gpulab.tensor_parallel_ref import MLPBlock

    full = MLPBlock(cfg["hidden"], cfg["ffn"], bias=cfg["b1"] is not None, dropout=cfg["dropout"])
    with torch.no_grad():
        for name, value in (("ln.weight", "ln_w"), ("ln.bias", "ln_b"), ("mlp.fc1.weight", "w1"),
                            ("mlp.fc1.bias", "b1"), ("mlp.fc2.weight", "w2"), ("mlp.fc2.bias", "b2")):
            if cfg[value] is not None:
                full.get_parameter(name).copy_(cfg[value])
    return full


def _group_sum(t, pg):
    """Sum of a replicated parameter's gradient over the group, as the optimizer's gradient sync does: with
    sequence parallelism each rank's LayerNorm (and row-parallel bias) gradient covers its tokens only."""
    import torch.distributed as dist

    if t is None:
        return None
    t = t.clone()
    dist.all_reduce(t, group=pg)
    return t


def _rank_sp(L, cfg, pg, r, tp):
    import torch.distributed as dist

    from gpulab.commlog import record_collectives
    from gpulab.tensor_parallel_ref import activation_bytes

    h, f = cfg["hidden"], cfg["ffn"]
    full = _full_block(cfg)
    layer = L["SequenceParallelMLP"](h, f, pg, dropout=cfg["dropout"], bias=cfg["b1"] is not None, seed=cfg["seed"])
    layer.load_from_full(full)
    x = _leaf(cfg["x"].chunk(tp, 1)[r].contiguous())             # (B, S/p, h): this rank's tokens
    dy = cfg["dy"].chunk(tp, 1)[r].contiguous()
    with record_collectives() as log:
        y = layer(x)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"forward must return a torch.Tensor, got {type(y).__name__}.")
        ln_bytes = activation_bytes(y, "LayerNorm")
        log.phase = "backward"
        if y.shape == dy.shape:
            (y * dy).sum().backward()
    obs = {"y": y.detach().clone(), "x_grad": _grad(x), "calls": log.as_dicts(), "ln_bytes": ln_bytes,
           "ln_bytes_full": activation_bytes(full(cfg["x"].clone().requires_grad_(True)), "LayerNorm")}
    for part in ("ln", "fc1", "fc2"):
        obs[f"{part}_present"] = isinstance(getattr(layer, part, None), torch.nn.Module)
    ln, fc1, fc2 = (getattr(layer, part, None) for part in ("ln", "fc1", "fc2"))
    obs.update(ln_w_grad=_group_sum(_pgrad(ln, "weight"), pg), ln_b_grad=_group_sum(_pgrad(ln, "bias"), pg),
               fc1_w_grad=_pgrad(fc1, "weight"), fc1_b_grad=_pgrad(fc1, "bias"),
               fc2_w_grad=_pgrad(fc2, "weight"), fc2_b_grad=_group_sum(_pgrad(fc2, "bias"), pg))
    if cfg["dropout"] and y.shape == x.shape:   # which elements dropout kept, and whether other ranks kept the same
        kept = (y.detach() != x.detach()).to(torch.uint8)
        masks = [torch.empty_like(kept) for _ in range(tp)]
        dist.all_gather(masks, kept, group=pg)
        obs["same_mask_as"] = [j for j in range(tp) if j != r and torch.equal(masks[j], kept)]
    return obs


def _sp_probe(L):
    L["SequenceParallelMLP"](4, 8, None)
    for name in _SP_NAMES[:2]:
        L[name].forward(types.SimpleNamespace(), torch.zeros(1, 2, 4), None)


def _routing_run(ns, case, device):
    x = case.inputs
    out = {"capacity": [entry(ns, "expert_capacity")(*size) for size in x["sizes"]],
           "route": entry(ns, "route")(x["logits"].clone(), x["k"], x["capacity"])}
    out["aux"] = entry(ns, "load_balancing_loss")(x["logits"].clone(), x["expert_index"].clone(), x["E"])
    bytes_fn = entry(ns, "moe_all_to_all_bytes")
    out["bytes"] = [bytes_fn(x["T"], h, x["E"], x["k"], x["cf"], b) for h, b in ((8, 4), (64, 2))]
    return out


_EP_NAMES = ("AllToAll", "ExpertParallelMoE")


def _full_moe(cfg):
    from gpulab.tensor_parallel_ref import MoEWeights

    full = MoEWeights(cfg["hidden"], cfg["ffn"], cfg["E"])
    with torch.no_grad():
        full.router.weight.copy_(cfg["router"])
        for e, expert in enumerate(full.experts):
            for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
                expert.get_parameter(name).copy_(cfg[name][e])
    return full


def _rank_ep(L, cfg, pg, r, tp):
    from gpulab.commlog import record_collectives

    layer = L["ExpertParallelMoE"](cfg["hidden"], cfg["ffn"], cfg["E"], pg, top_k=cfg["k"], capacity_factor=cfg["cf"])
    layer.load_from_full(_full_moe(cfg))
    x = _leaf(cfg["x"][r])                                                    # (T, h): this rank's tokens
    with record_collectives() as log:
        # torch's default device elsewhere ("meta") than the tokens' (CPU): an index made without device= lands
        # there and fails, as a CPU one does beside CUDA tensors on a GPU (every rank alike, before any exchange)
        try:
            with torch.device("meta"):
                out = layer(x)
        except Exception as exc:  # noqa: BLE001 - only a tensor on the default device is reported here
            if "meta" not in str(exc):
                raise
            return {"placement": f"{type(exc).__name__}: {str(exc)[:300]}", "calls": []}
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
            raise TypeError(f"forward must return (y, aux), two tensors; got {type(out).__name__}.")
        y, aux = out
        log.phase = "backward"
        if y.shape == x.shape and aux.numel() == 1:
            ((y * cfg["dy"][r]).sum() + cfg["aux_coef"] * aux.sum()).backward()
    experts = getattr(layer, "experts", None)
    router = getattr(layer, "router", None)
    obs = {"y": y.detach().clone(), "aux": aux.detach().clone(), "x_grad": _grad(x), "calls": log.as_dicts(),
           "router_grad": _group_sum(_pgrad(router, "weight"), pg), "experts": []}
    for expert in (experts if isinstance(experts, torch.nn.ModuleList) else []):
        obs["experts"].append({n: _grad(p) for n, p in expert.named_parameters()})
    return obs


def _ep_probe(L):
    L["ExpertParallelMoE"](4, 8, 2, None)
    L["AllToAll"].forward(types.SimpleNamespace(), torch.zeros(2, 4), None)
