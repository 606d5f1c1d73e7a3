"""Checks of lab 16, the capstone: a training planner (memory per GPU by ZeRO stage and recomputation, a modelled step
time with the bubble and the alpha-beta collectives, feasibility, the layout search) checked against the published
145.6B GPT (Megatron-LM) and Llama 3 405B layouts, and its mixture-of-experts extension (EP inside DP: experts'
memory over ep, the all-to-alls, EP's rules, EP in the search); serving capacity (weights and KV cache per GPU, a
175B deployment at 100 requests/s judged by a queueing simulation, 7B on 4 GPUs, ResNet-152 batching, a slow
deployment's per-rank profile); reliability (Young/Daly, a ZeRO re-shard, stragglers and hangs, a diverging run) and
an MLOps checklist with a canary decision; fault-tolerant serving (a confidence bound on a simulated p99, the load of
retries and hedges, N+1 replicas on the bound with rolling upgrades, failure domains on a mixed fleet, failover and
draining) and performance engineering practice (a fair CPU vs GPU benchmark design, a noise-aware per-SKU CI gate).
Wrong answers are named by the mistake they match. Hidden cases: one per rule, the same rules on every seed, named by
their inputs alone and shuffled (grader.kit.neutral).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from functools import lru_cache

import torch

from gpulab.bench import percentile
from gpulab.perfci import BENCH_RULES, DESIGN_FIELDS, MIN_EFFECT, MIN_RUNS, SKU_NOISE, STAGES, make_runs
from gpulab.planning import (
    CLUSTERS,
    GPT3_175B,
    GPT3_175B_ASSUMED,
    LLAMA3_405B,
    MIXTRAL_8X7B,
    PUBLISHED,
    SERVE_175B,
    SERVE_UTILISATION,
    TAIL_CONFIDENCE,
    TAIL_SAMPLES,
    Cluster,
    Layout,
    MoESpec,
    Workload,
    all_to_all_time,
    fcfs_pool,
    group_link,
    kv_bytes_per_token,
    make_fleet,
    replica_latencies,
    replica_step_time,
    ring_allreduce_time,
    simulate_replicas,
)
from gpulab.reliability import (
    BOTTLENECKS,
    CAUSES,
    MLOPS_ITEMS,
    make_divergence_trace,
    make_profile,
    make_step_times,
)
from gpulab.serving import MODELS, ModelSpec, make_trace
from grader.exercise import Case, Exercise
from grader.kit.cases import choice, randint, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.neutral import neutral
from grader.kit.variants import diagnose
from grader.runs import run_side

LAB = "16_capstone_design"
RUN = run_side(LAB)  # the learner side: grader/runs/16_capstone_design.py
TITLE = "Capstone: planning, capacity, reliability and MLOps"

HEADROOM = 0.9          # a plan may use 90% of GPU memory: the rest is the allocator's, NCCL's and workspace
PLAN_RTOL = 0.02        # a plan's modelled step time may be 2% above the best layout's
KNOWN_GOOD = 1.5        # a published layout's modelled time must be within 1.5x of the planner's own plan
SERVE_SLACK = 1.25      # a serving plan may use 25% more GPUs than the fewest the reference finds
_YOURS = "\n  Yours counts {}."

A100 = CLUSTERS["A100-80GB x 1024 (Selene-like, HDR InfiniBand)"]
H100 = CLUSTERS["H100-80GB x 8192 (RoCE 400G)"]


def _numbers(got, keys) -> dict | str:
    """The learner's dict of numbers as floats, or what is wrong with it."""
    if not isinstance(got, dict) or not all(k in got for k in keys):
        return f"must return a dict with the keys {list(keys)}, got {got!r}"
    try:
        return {k: float(got[k]) for k in keys}
    except (TypeError, ValueError):
        return f"every value must be a number, got {got!r}"


def _judge_numbers(name: str, raw, want: dict, variant, hints: dict, case, unit: str = "") -> str | None:
    """The first of ``want``'s numbers the learner's dict ``raw`` gets wrong, with its hint and the mistake it
    matches: ``variant(bug)`` is the reference with one bug, for each ``(bug, label)`` in ``hints["_variants"]``."""
    got = _numbers(raw, tuple(want))
    if isinstance(got, str):
        return f"{name} {got}."
    for key, value in want.items():
        if not close(got[key], value, 1e-6):
            message = (f"{name}: {key} = {got[key]:.6g}{unit}, expected {value:.6g}{unit} for {case.name}. "
                       f"{hints.get(key, '')}")
            variants = [(label, lambda bug=bug: variant(bug)[key]) for bug, label in hints["_variants"]]
            return diagnose(message.rstrip(), got[key], variants, lambda g, w: close(g, w, 1e-6), _YOURS)
    return None


# --- 1. memory per GPU ----------------------------------------------------------------------------------

MEM_KEYS = ("weights", "grads", "optimizer", "activations", "total")


def ref_training_memory(spec: ModelSpec, seq_len: int, layout: Layout, *, bug: str = "") -> dict:
    """Bytes per GPU: bf16 weights and grads (2 B each), fp32 master + Adam moments (12 B), sharded over DP by
    ZeRO stage; activations of the first stage's ceil(L/pp) layers for the pp microbatches 1F1B keeps in
    flight: 34 s b h / tp per layer (sequence parallel, flash attention), or 2 s b h / tp with recomputation
    plus one layer's 34 s b h / tp during its recomputed backward. ``bug`` names a variant (diagnoses)."""
    per_gpu = spec.n_params / (layout.tp * layout.pp)
    dp, z = layout.dp, layout.zero
    early = 1 if bug == "zero one stage early" else 0  # ZeRO-1 sharding the gradients, ZeRO-2 the weights
    weights = 2 * per_gpu / (dp if z + early >= 3 else 1)
    grads = 2 * per_gpu / (dp if z + early >= 2 else 1)
    optimizer = 0.0 if bug == "no optimizer" else 12 * per_gpu / (dp if z >= 1 else 1)
    optimizer *= {"adam without master": 8 / 12, "adam 16": 16 / 12}.get(bug, 1.0)
    if bug == "per node":
        weights, grads, optimizer = 8 * weights, 8 * grads, 8 * optimizer
    sbh = seq_len * layout.micro_batch * spec.d_model
    layers = math.ceil(spec.n_layers / layout.pp)
    in_flight = 1 if bug == "one microbatch" else layout.pp
    recompute = layout.recompute and bug != "recompute ignored"
    per_layer = (2 if recompute else 34) * sbh / layout.tp
    activations = in_flight * layers * per_layer + (34 * sbh / layout.tp if recompute and bug != "no recompute "
                                                    "peak" else 0.0)
    if bug == "no activations":
        activations = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": activations,
            "total": weights + grads + optimizer + activations}


_MEM_VARIANTS = (("no optimizer", "no optimizer states: Adam keeps an fp32 master copy and two fp32 moments, "
                  "12 bytes per parameter, the largest part"),
                 ("adam without master", "Adam's two moments but no fp32 master copy of the weights (4 + 4, not 12)"),
                 ("adam 16", "16 bytes per parameter of optimizer state: 16 is the whole model state (2 weights + 2 "
                  "gradients + 12 optimizer); the optimizer's share is the fp32 master copy and two moments, 12"),
                 ("zero one stage early", "ZeRO sharding one stage early: stage 1 shards only the optimizer states, "
                  "stage 2 adds the gradients, only stage 3 the weights"),
                 ("per node", "a node's 8 GPUs together: the question is bytes per GPU"),
                 ("recompute ignored", "the activations without recomputation: with it each layer keeps only its "
                  "input, 2 s b h / tp"),
                 ("no recompute peak", "no recomputation peak: while a layer recomputes, its full 34 s b h / tp "
                  "activations live again"),
                 ("one microbatch", "the activations of one microbatch: under 1F1B the first stage holds pp "
                  "microbatches in flight"),
                 ("no activations", "no activations at all"))


def _layout_case(rule, spec, seq, batch, cluster, layout):
    name = (f"{rule}: {spec.name}, sequence {seq}, batch {batch}, {cluster.n_gpus} x {cluster.gpu_bytes / 1e9:.0f} GB "
            f"GPUs in nodes of {cluster.gpus_per_node}; {layout}")
    return Case(name, dict(spec=RUN._plain(spec), seq_len=seq, global_batch=batch, cluster=RUN._plain(cluster),
                           layout=RUN._plain(layout)))


def _published_cases(*rows):
    """The published layouts, then one case per ``(rule, spec, seq_len, batch, cluster, layout)`` row."""
    return [_layout_case("a published layout", spec, seq, batch, cl, lay) for spec, seq, batch, cl, lay, _
            in PUBLISHED.values()] + [_layout_case(*row) for row in rows]


def _random_layout(gen):
    tp, pp = choice(gen, (1, 2, 4, 8)), choice(gen, (1, 2, 4, 8, 16))
    dp = choice(gen, (1, 2, 4, 8, 16, 32))
    return Layout(dp, tp, pp, choice(gen, (1, 2, 4)), randint(gen, 0, 3), choice(gen, (False, True)))


def _training_memory_cases(gen, public):
    if public:
        return _published_cases(("ZeRO-1, no recompute", GPT3_175B, 2048, 1536, A100, Layout(32, 8, 4, 1, 1, False)),
                                ("ZeRO-3, recompute", LLAMA3_405B, 8192, 2048, H100, Layout(1024, 8, 1, 2, 3, True)),
                                ("ZeRO-2, no recompute", GPT3_175B, 2048, 1536, A100, Layout(16, 8, 8, 1, 2, False)))
    cases = []
    for zero in range(4):
        lay = dataclasses.replace(_random_layout(gen), zero=zero)
        spec = choice(gen, (GPT3_175B, LLAMA3_405B, MODELS["Llama-2-70B"], MODELS["Llama-2-7B"]))
        cl = choice(gen, (A100, H100)).with_gpus(lay.dp * lay.tp * lay.pp)
        cases.append(_layout_case(f"ZeRO stage {zero}", spec, choice(gen, (2048, 4096, 8192)), 1024, cl, lay))
    # 126 layers over 4, 8 or 16 stages: the first stage holds ceil(L / pp), not L // pp nor L / pp
    lay = dataclasses.replace(_random_layout(gen), pp=choice(gen, (4, 8, 16)))
    cases.append(_layout_case("layers that do not split evenly", LLAMA3_405B, choice(gen, (2048, 4096)), 1024,
                              H100.with_gpus(lay.dp * lay.tp * lay.pp), lay))
    return cases


_MEM_HINTS = {
    "weights": "bf16 weights: 2 bytes per parameter of this GPU's n_params / (tp * pp); divided by dp at ZeRO-3.",
    "grads": "bf16 gradients: 2 bytes per parameter of this GPU's share; divided by dp from ZeRO-2 on.",
    "optimizer": "Mixed-precision Adam: 12 bytes per parameter (fp32 master, two fp32 moments); divided by dp "
                 "from ZeRO-1 on.",
    "activations": "Per layer and microbatch 34 s b h / tp bytes, or 2 s b h / tp with recomputation (plus one "
                   "layer's 34 s b h / tp while it recomputes); the first stage holds ceil(L / pp) layers for pp "
                   "microbatches.",
    "total": "total is the sum of the other four.",
    "_variants": _MEM_VARIANTS,
}


def _training_memory_judge(case, obs):
    x = case.inputs
    spec, layout = RUN._spec(x["spec"]), RUN._layout(x["layout"])
    return _judge_numbers("training_memory", obs["mem"], ref_training_memory(spec, x["seq_len"], layout),
                          lambda bug: ref_training_memory(spec, x["seq_len"], layout, bug=bug), _MEM_HINTS, case,
                          " bytes per GPU")


# --- 2. step time -----------------------------------------------------------------------------------------

TIME_KEYS = ("compute", "tp_comm", "pp_comm", "bubble", "dp_comm", "total")


def ref_step_time(spec: ModelSpec, seq_len: int, global_batch: int, layout: Layout, cluster: Cluster, *,
                  bug: str = "") -> dict:
    """Seconds per step. compute: 6 N tokens FLOPs (8 with recompute) over all GPUs at peak x MFU; TP: 4
    all-reduces per layer and microbatch (6 with recompute) of s b h bf16 activations; PP: a send forward and
    one backward per microbatch; bubble: (compute + TP + PP) x (pp - 1) / m; DP: a ring all-reduce of the
    bf16 gradients (1.5x the volume at ZeRO-3). Each group's link by :func:`gpulab.planning.group_link`."""
    n_gpus = layout.dp * layout.tp * layout.pp
    m = global_batch // (layout.dp * layout.micro_batch)
    flops = (8 if layout.recompute and bug != "no recompute flops" else 6) * spec.n_params * global_batch * seq_len
    compute = flops / (n_gpus * cluster.peak_flops * cluster.mfu)
    act = 2 * seq_len * layout.micro_batch * spec.d_model
    alpha, bw = group_link(cluster, 1, layout.tp) if bug != "tp on nvlink" else (cluster.intra_alpha,
                                                                                 cluster.intra_bytes_per_s)
    per_layer = 6 if layout.recompute else 4
    tp = math.ceil(spec.n_layers / layout.pp) * m * per_layer * ring_allreduce_time(act, layout.tp, alpha, bw)
    if bug == "tp half":
        tp /= 2
    alpha, bw = group_link(cluster, layout.tp * layout.dp, layout.pp)
    pp = 0.0 if layout.pp == 1 else 2 * m * (alpha + act / bw)
    bubble = 0.0 if bug == "no bubble" else (compute + tp + pp) * (layout.pp - 1) / (
        m + layout.pp - 1 if bug == "bubble share" else m)
    alpha, bw = group_link(cluster, layout.tp, layout.dp)
    grads = 2 * spec.n_params / (layout.tp * layout.pp)
    dp = ring_allreduce_time(grads, layout.dp, alpha, bw) * (1.5 if layout.zero == 3 and bug != "zero3 as ddp" else 1)
    if bug == "dp no factor 2":
        dp /= 2
    return {"compute": compute, "tp_comm": tp, "pp_comm": pp, "bubble": bubble, "dp_comm": dp,
            "total": compute + tp + pp + bubble + dp}


_TIME_VARIANTS = (("no bubble", "no pipeline bubble: (p - 1) / m of the pipelined work is idle"),
                  ("tp on nvlink", "TP on NVLink although its group spans nodes: tp > gpus_per_node puts the "
                   "per-layer all-reduces on the network"),
                  ("no recompute flops", "no extra forward for recomputation (8 N, not 6 N, FLOPs per token)"),
                  ("tp half", "half the TP all-reduces: 2 in the forward and 2 in the backward per layer"),
                  ("dp no factor 2", "a ring all-reduce without its factor 2 (reduce-scatter + all-gather)"),
                  ("bubble share", "the bubble's share of the whole step, (p - 1) / (m + p - 1), applied to the "
                   "pipelined work: the idle time is (p - 1) / m of that work"),
                  ("zero3 as ddp", "ZeRO-3 priced as DDP: it also all-gathers the weights again for the backward, "
                   "1.5 x DDP's traffic"))


def _step_time_cases(gen, public):
    if public:
        return _published_cases(("TP across nodes", GPT3_175B, 2048, 1536, A100, Layout(8, 16, 8, 1, 1, False)),
                                ("no pipeline", LLAMA3_405B, 8192, 2048, H100, Layout(1024, 8, 1, 2, 3, True)))
    cases = []
    for rule, tp_choices, pp_choices in (("TP inside a node", (2, 4, 8), (2, 4, 8)),
                                         ("TP across nodes", (16,), (2, 4)),
                                         ("a deep pipeline", (4, 8), (16, 32))):
        lay = Layout(choice(gen, (2, 4, 8, 16)), choice(gen, tp_choices), choice(gen, pp_choices),
                     choice(gen, (1, 2)), randint(gen, 0, 3), choice(gen, (False, True)))
        cl = choice(gen, (A100, H100)).with_gpus(lay.dp * lay.tp * lay.pp)
        batch = lay.dp * lay.micro_batch * randint(gen, 8, 64)
        cases.append(_layout_case(rule, choice(gen, (GPT3_175B, LLAMA3_405B)), choice(gen, (2048, 4096)), batch, cl,
                                  lay))
    return cases


_TIME_HINTS = {
    "compute": "6 x n_params x tokens FLOPs per step (8 x with recomputation), over dp x tp x pp GPUs at "
               "peak_flops x mfu.",
    "tp_comm": "Per layer of a stage (ceil(L / pp)) and microbatch, 4 ring all-reduces (6 with recomputation) of "
               "2 s b h bytes over tp ranks, on the link group_link(cluster, 1, tp) gives.",
    "pp_comm": "Per microbatch, one send forward and one backward of 2 s b h bytes: 2 m (alpha + bytes / "
               "bandwidth) on group_link(cluster, tp * dp, pp); 0 without a pipeline.",
    "bubble": "The pipeline idles (pp - 1) / m of the pipelined work: (compute + tp_comm + pp_comm) x (pp - 1) / m.",
    "dp_comm": "A ring all-reduce of the 2-byte gradients of n_params / (tp * pp) parameters over dp ranks on "
               "group_link(cluster, tp, dp); 1.5 x at ZeRO-3 (the extra parameter all-gather).",
    "total": "total is the sum of the other five.",
    "_variants": _TIME_VARIANTS,
}


def _step_time_judge(case, obs):
    x = case.inputs
    args = (RUN._spec(x["spec"]), x["seq_len"], x["global_batch"], RUN._layout(x["layout"]), RUN._cluster(x["cluster"]))
    return _judge_numbers("step_time", obs["time"], ref_step_time(*args), lambda bug: ref_step_time(*args, bug=bug),
                          _TIME_HINTS, case, " s")


# --- 3. feasibility ----------------------------------------------------------------------------------------

def ref_layout_problems(spec, seq_len, global_batch, layout, cluster, *, bug: str = "") -> list[str]:
    """Why ``layout`` cannot run (empty when it can): GPU count, TP across nodes, heads, layers, batch, memory."""
    problems = []
    if layout.dp * layout.tp * layout.pp != cluster.n_gpus:
        problems.append(f"dp x tp x pp = {layout.dp * layout.tp * layout.pp}, not the {cluster.n_gpus} GPUs")
    if layout.tp > cluster.gpus_per_node and bug != "tp across nodes":
        problems.append(f"TP={layout.tp} spans nodes of {cluster.gpus_per_node} GPUs")
    if spec.n_heads % layout.tp:
        problems.append(f"{spec.n_heads} heads do not split {layout.tp} ways")
    if layout.pp > spec.n_layers:
        problems.append(f"{layout.pp} stages for {spec.n_layers} layers")
    if global_batch % (layout.dp * layout.micro_batch):
        problems.append(f"batch {global_batch} is not a multiple of dp x micro_batch")
    mem = ref_training_memory(spec, seq_len, layout, bug=bug)["total"]
    if mem > HEADROOM * cluster.gpu_bytes:
        problems.append(f"{mem / 1e9:.1f} GB per GPU > {HEADROOM:.0%} of {cluster.gpu_bytes / 1e9:.0f} GB")
    return problems


def _with_control(case: Case, layout: Layout, cluster: Cluster) -> Case:
    """``case`` plus a control layout of the other verdict (same model and batch), so an answer that accepts or
    rejects everything fails every case."""
    return dataclasses.replace(case, inputs=dict(case.inputs, control=dict(layout=RUN._plain(layout),
                                                                           cluster=RUN._plain(cluster))))


def _layout_problems_cases(gen, public):
    gpt3_spec, seq, batch, a100, gpt3_layout, _ = GPT3_175B_ASSUMED
    across = Layout(8, 16, 8, 1, 1, True)  # TP=16 over nodes of 8: never feasible
    if public:
        gpt3 = (GPT3_175B, 2048, 1536, A100)
        published, *wrong = _published_cases(("TP across nodes", *gpt3, across),
                                             ("no room for Adam", *gpt3, Layout(32, 8, 4, 1, 0, False)),
                                             ("activations of pp microbatches", *gpt3, Layout(16, 8, 8, 8, 1, False)),
                                             ("pure data parallel", *gpt3, Layout(1024, 1, 1, 1, 0, False)),
                                             ("the wrong GPU count", *gpt3, Layout(8, 8, 8, 1, 0, True)),
                                             ("heads that do not split", *gpt3[:3], A100.with_gpus(640),
                                              Layout(16, 5, 8, 1, 1, True)),
                                             ("more stages than layers", *gpt3, Layout(1, 8, 128, 1, 1, True)),
                                             ("a batch that does not divide", *gpt3, Layout(16, 8, 8, 5, 1, True)),
                                             ("over the 90% headroom", *gpt3[:3], A100.with_gpus(64),
                                              Layout(4, 8, 2, 1, 1, True)))
        llama = wrong.pop(0)
        return [_with_control(published, across, a100), _with_control(llama, Layout(32, 16, 16, 1, 1, True), H100)] + \
            [_with_control(c, gpt3_layout, a100) for c in wrong]
    dp, odd_tp = choice(gen, (2, 4, 8)), choice(gen, (5, 7))
    cases = [
        _layout_case("a feasible layout", gpt3_spec, seq, batch, a100.with_gpus(dp * 64),
                     dataclasses.replace(gpt3_layout, dp=dp)),
        _layout_case("TP across nodes", gpt3_spec, seq, batch, a100.with_gpus(dp * 128), Layout(dp, 16, 8, 1, 1, True)),
        _layout_case("fewer GPUs than the cluster", gpt3_spec, seq, batch,
                     a100.with_gpus(dp * 64 * choice(gen, (2, 4))), dataclasses.replace(gpt3_layout, dp=dp)),
        _layout_case("no room for Adam", gpt3_spec, seq, batch, a100.with_gpus(dp * 32), Layout(dp, 8, 4, 1, 0, False)),
        _layout_case("activations of pp microbatches", gpt3_spec, seq, batch, a100.with_gpus(dp * 64),
                     Layout(dp, 8, 8, choice(gen, (8, 16)), 1, False)),
        _layout_case("heads that do not split", gpt3_spec, seq, batch, a100.with_gpus(dp * odd_tp * 8),
                     Layout(dp, odd_tp, 8, 1, 1, True)),
        _layout_case("more stages than layers", gpt3_spec, seq, batch, a100.with_gpus(dp * 1024),
                     Layout(dp, 8, 128, 1, 1, True)),
        _layout_case("a batch that does not divide", gpt3_spec, seq, batch, a100.with_gpus(dp * 64),
                     Layout(dp, 8, 8, choice(gen, (5, 7)), 1, True)),
        # 77 and 75 GB per GPU: over 90% of 80 GB, under 100% (a test against the whole GPU accepts them)
        _layout_case("over the 90% headroom", gpt3_spec, seq, batch, a100.with_gpus(64),
                     choice(gen, (Layout(4, 8, 2, 1, 1, True), Layout(2, 8, 4, 2, 1, False))))]
    return [_with_control(cases[0], across, a100)] + [_with_control(c, gpt3_layout, a100) for c in cases[1:]]


def _judge_problems(x, layout, cluster, got, name, memory) -> str | None:
    args = (RUN._spec(x["spec"]), x["seq_len"], x["global_batch"], layout, cluster)
    want = ref_layout_problems(*args)
    if not isinstance(got, list):
        return f"layout_problems must return a list of strings (empty when the layout can run), got {got}."
    if bool(got) == bool(want):
        return None
    if want:
        why = f"layout_problems returned [] for {name}, which cannot run: {'; '.join(want)}."
        if not ref_layout_problems(*args, bug="tp across nodes"):
            return f"{why} Yours accepts TP groups across nodes: tensor parallelism's per-layer all-reduces belong " \
                   "on NVLink, inside a node."
        mem = ref_training_memory(*args[:2], layout)["total"]
        for bug, label in _MEM_VARIANTS:  # named only when the learner's training_memory makes that mistake
            wrong = ref_training_memory(*args[:2], layout, bug=bug)["total"]
            if memory is not None and not close(wrong, mem, 1e-6) and close(memory, wrong, 1e-6):
                return f"{why} Yours accepts {label}."
        if mem > HEADROOM * cluster.gpu_bytes and memory is not None and close(memory, mem, 1e-6):
            return (f"{why} Your training_memory is right ({mem / 1e9:.1f} GB): compare it with {HEADROOM} x "
                    f"gpu_bytes of ONE GPU ({HEADROOM * cluster.gpu_bytes / 1e9:.0f} GB), not the whole GPU and not "
                    "a node's memory.")
        return f"{why} Check every rule: GPU count, TP within a node, heads % tp, pp <= layers, the batch, memory."
    published = any(layout == lay and cluster == cl for _, _, _, cl, lay, _ in PUBLISHED.values())
    return (f"layout_problems rejected {name} ({got}), but it fits and can run"
            f"{' (it is the layout the published run used)' if published else ''}: "
            "reject only a wrong GPU count, TP beyond a node, heads or layers that do not split, a batch that "
            f"does not divide, or more than {HEADROOM:.0%} of GPU memory.")


def _layout_problems_judge(case, obs):
    x, control = case.inputs, case.inputs["control"]
    lay, cl = RUN._layout(control["layout"]), RUN._cluster(control["cluster"])
    return _judge_problems(x, RUN._layout(x["layout"]), RUN._cluster(x["cluster"]), obs["problems"], case.name,
                           obs.get("memory")) or \
        _judge_problems(x, lay, cl, obs["control"], f"{lay} on {cl.n_gpus} GPUs (the same model and batch)",
                        obs.get("control_memory"))


# --- 4. the planner ------------------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_MICRO_ZERO_RECOMPUTE = list(itertools.product((1, 2, 4, 8), range(4), (False, True)))


def _fastest(layouts, problems, seconds) -> tuple | None:
    """(layout, seconds) of the first feasible layout (``problems(layout)`` empty) with the least
    ``seconds(layout)`` among ``layouts``; None when none is feasible."""
    best = None
    for lay in layouts:
        if problems(lay):
            continue
        t = seconds(lay)
        if best is None or t < best[1]:
            best = (lay, t)
    return best


def ref_plan_training(spec, seq_len, global_batch, cluster) -> tuple:
    """The feasible layout with the least modelled step time: TP a divisor of the node, PP a divisor of what is
    left, microbatches of 1, 2, 4 or 8 sequences, ZeRO 0-3, recomputation on or off."""
    layouts = (Layout(cluster.n_gpus // (tp * pp), tp, pp, mb, zero, recompute)
               for tp in _divisors(cluster.gpus_per_node) for pp in _divisors(cluster.n_gpus // tp)
               for mb, zero, recompute in _MICRO_ZERO_RECOMPUTE)
    return _fastest(layouts, lambda lay: ref_layout_problems(spec, seq_len, global_batch, lay, cluster),
                    lambda lay: ref_step_time(spec, seq_len, global_batch, lay, cluster)["total"])


def _plan_training_cases(gen, public):
    def case(rule, name, spec, seq, batch, cluster, published=None):
        return Case(f"{rule}: {name}, sequence {seq}, batch {batch}, {cluster.n_gpus} GPUs",
                    dict(spec=RUN._plain(spec), seq_len=seq, global_batch=batch, cluster=RUN._plain(cluster),
                         published=None if published is None else RUN._plain(published)))

    if public:
        return [case("a published run", name, spec, seq, batch, cl, lay)
                for name, (spec, seq, batch, cl, lay, _) in PUBLISHED.items()]
    spec = choice(gen, (MODELS["Llama-2-70B"], MODELS["Llama-2-13B"]))
    gpt = PUBLISHED["GPT 145.6B (Megatron-LM)"]
    return [case("a published run", "GPT 145.6B", *gpt[:4], gpt[4]),
            case("a mid-size model", spec.name, spec, 4096, 64 * randint(gen, 4, 16), H100.with_gpus(
                choice(gen, (64, 128, 256)))),
            # 3 x 2^k GPUs and a batch of 2^k sequences: only a pipeline of 3, 6 or 12 stages takes the factor 3
            case("a cluster of 3 x 2^k GPUs", "Llama-2-7B", MODELS["Llama-2-7B"], choice(gen, (2048, 4096)),
                 256 * choice(gen, (1, 2, 4)), H100.with_gpus(choice(gen, (48, 96, 192))))]


def _plan_against_reference(name: str, plan, case, args, problems, step, planner) -> tuple | str:
    """(the planned Layout, its modelled seconds, the reference plan, its seconds), or what is wrong with the plan:
    not a Layout, fields out of range, or a layout that cannot run. ``args`` = (spec, seq_len, global_batch,
    cluster); ``problems`` and ``step`` take (spec, seq_len, global_batch, layout, cluster), ``planner`` args."""
    lay = _planned_layout(name, plan, case, lambda lay: problems(*args[:3], lay, args[3]))
    if isinstance(lay, str):
        return lay
    return (lay, step(*args[:3], lay, args[3])["total"], *planner(*args))


def _planned_layout(name: str, plan, case, problems) -> Layout | str:
    """The planner's Layout (``plan``, its fields as a dict), or what is wrong with it: not a Layout, fields out of
    range, or a layout ``problems(layout)`` says cannot run."""
    if not isinstance(plan, dict):
        return f"{name} must return (Layout, explanation), got {plan}."
    if not all(isinstance(plan[k], int) and plan[k] > 0 for k in ("dp", "tp", "pp", "micro_batch", "ep")) or \
            plan["zero"] not in (0, 1, 2, 3) or not isinstance(plan["recompute"], bool):
        return (f"{name} returned {plan}: dp, tp, pp, ep and micro_batch must be positive ints, zero one of 0-3 and "
                "recompute a bool.")
    lay = RUN._layout(plan)
    found = problems(lay)
    return f"{name} chose {lay} for {case.name}, which cannot run: {'; '.join(found)}." if found else lay


def _plan_training_judge(case, obs):
    x = case.inputs
    spec, cluster = RUN._spec(x["spec"]), RUN._cluster(x["cluster"])
    got = _plan_against_reference("plan_training", obs["plan"], case, (spec, x["seq_len"], x["global_batch"], cluster),
                                  ref_layout_problems, ref_step_time, ref_plan_training)
    if isinstance(got, str):
        return got
    lay, t, best, t_best = got
    published = None if x["published"] is None else RUN._layout(x["published"])
    if t > (1 + PLAN_RTOL) * t_best and lay != published:
        return (f"plan_training chose {lay}: {t:.3f} s per step in the model, but {best} takes {t_best:.3f} s "
                f"for {case.name}. Search every tp dividing the node, pp dividing the rest, the microbatch size, "
                "ZeRO stage and recomputation, and keep the fastest feasible layout.")
    if len(obs["why"].split()) < 5:
        return "plan_training's explanation is missing: say why this layout (memory per GPU, step time, bubble)."
    if published is not None:
        if obs["published_problems"]:
            return (f"Your layout_problems rejects the published layout {published} ({obs['published_problems']}): "
                    "it ran, so a model that forbids it is wrong.")
        ratio = obs["published_time"] / obs["plan_time"]
        if ratio > KNOWN_GOOD:
            return (f"Your step_time puts the published layout {published} at {ratio:.2f}x your plan's time; it "
                    f"reached a high MFU in practice, so a model that calls it more than {KNOWN_GOOD}x slower "
                    "is missing something (the bubble? TP on the wrong link?).")
    return None


# --- 4b. mixture of experts: expert parallelism ---------------------------------------------------------------


def ref_moe_training_memory(spec: MoESpec, seq_len: int, layout: Layout, *, bug: str = "") -> dict:
    """Exercise 1's bytes for the dense part, plus this GPU's experts: (2, 2, 12) bytes per parameter of
    expert_params / (tp pp ep), ZeRO dividing them by the dp / ep ranks holding the same experts."""
    out = dict(ref_training_memory(dataclasses.replace(spec, n_params=spec.dense_params), seq_len, layout))
    ep = 1 if bug == "experts not divided by ep" else layout.ep
    share = spec.expert_params / (layout.tp * layout.pp * ep)
    expert_dp = layout.dp if bug == "expert zero over dp" else layout.dp // layout.ep
    for key, nbytes, stage in (("weights", 2, 3), ("grads", 2, 2), ("optimizer", 12, 1)):
        out[key] += 0.0 if bug == "no experts" else nbytes * share / (expert_dp if layout.zero >= stage else 1)
    out["total"] = out["weights"] + out["grads"] + out["optimizer"] + out["activations"]
    return out


_MOE_MEM_VARIANTS = (("experts not divided by ep", "the experts not divided by ep: each of the ep ranks of an EP "
                      "group holds num_experts / ep of them"),
                     ("expert zero over dp", "ZeRO sharding the experts' states over all dp ranks: only the dp / ep "
                      "ranks holding the same experts share them"),
                     ("no experts", "no experts: expert_params (most of a MoE model) come on top of the dense part"))
_MOE_MEM_HINTS = {
    "weights": "Dense part as in training_memory (n_params = spec.dense_params), plus 2 bytes per expert parameter of "
               "expert_params / (tp * pp * ep), divided by dp // ep at ZeRO-3.",
    "grads": "Dense part, plus 2 bytes per expert parameter of this GPU's share, divided by dp // ep from ZeRO-2 on.",
    "optimizer": "Dense part, plus 12 bytes per expert parameter of this GPU's share, divided by dp // ep from ZeRO-1.",
    "activations": "The dense activations of training_memory (the model counts MoE activations as the dense ones).",
    "total": "total is the sum of the other four.",
    "_variants": _MOE_MEM_VARIANTS,
}

_MOE_GPUS = 128
_MOE_SEQ, _MOE_BATCH = 4096, 512


def _moe_cluster(n=_MOE_GPUS):
    return H100.with_gpus(n)


def _moe_cases_public():
    cl = _moe_cluster()
    return [_layout_case("experts sharded 8 ways", MIXTRAL_8X7B, _MOE_SEQ, _MOE_BATCH, cl,
                         Layout(128, 1, 1, 2, 1, False, 8)),
            _layout_case("TP, PP and EP", MIXTRAL_8X7B, _MOE_SEQ, _MOE_BATCH, cl, Layout(16, 4, 2, 1, 1, True, 4)),
            _layout_case("ZeRO-3 with EP across nodes", MIXTRAL_8X7B, _MOE_SEQ, _MOE_BATCH, cl,
                         Layout(32, 4, 1, 1, 3, True, 8))]


def _moe_random_layout(gen):
    tp, pp, ep = choice(gen, (1, 2, 4)), choice(gen, (1, 2, 4)), choice(gen, (1, 2, 4, 8))
    return Layout(ep * choice(gen, (1, 2, 4)), tp, pp, choice(gen, (1, 2)), randint(gen, 0, 3),
                  choice(gen, (False, True)), ep)


def _moe_training_memory_cases(gen, public):
    if public:
        return _moe_cases_public()
    cases = []
    for zero in (1, 3):  # EP > 1: the experts' ZeRO shards over dp // ep ranks, their weights over ep
        lay = _moe_random_layout(gen)
        ep = choice(gen, (2, 4, 8))
        lay = dataclasses.replace(lay, zero=zero, ep=ep, dp=ep * choice(gen, (2, 4)))
        cases.append(_layout_case(f"ZeRO stage {zero}", MIXTRAL_8X7B, choice(gen, (2048, 4096)), 256,
                                  _moe_cluster(lay.dp * lay.tp * lay.pp), lay))
    return cases


def _moe_training_memory_judge(case, obs):
    x = case.inputs
    spec, layout = RUN._moe_spec(x["spec"]), RUN._layout(x["layout"])
    return _judge_numbers("moe_training_memory", obs["mem"], ref_moe_training_memory(spec, x["seq_len"], layout),
                          lambda bug: ref_moe_training_memory(spec, x["seq_len"], layout, bug=bug), _MOE_MEM_HINTS,
                          case, " bytes per GPU")


MOE_TIME_KEYS = TIME_KEYS[:-1] + ("a2a_comm", "total")


def ref_moe_step_time(spec: MoESpec, seq_len: int, global_batch: int, layout: Layout, cluster: Cluster, *,
                      bug: str = "") -> dict:
    """Exercise 2 at the active parameters (compute, TP, PP), plus per layer of a stage and microbatch 4
    all-to-alls (6 with recomputation) of s b top_k h bf16 bytes over the EP group (ranks tp apart), in the
    bubble with the rest of the pipelined work; DP: dense gradients over dp, expert gradients over dp / ep."""
    active = spec.n_params if bug == "all parameters active" else spec.active_params
    out = dict(ref_step_time(dataclasses.replace(spec, n_params=active), seq_len, global_batch, layout, cluster))
    m = global_batch // (layout.dp * layout.micro_batch)
    routed = seq_len * layout.micro_batch * (1 if bug == "no top_k" else spec.top_k) * spec.d_model * 2
    per_layer = (2 if bug == "a2a forward only" else 4) + (2 if layout.recompute else 0)
    link = (cluster.intra_alpha, cluster.intra_bytes_per_s) if bug == "a2a on nvlink" else \
        group_link(cluster, layout.tp, layout.ep)
    a2a = math.ceil(spec.n_layers / layout.pp) * m * per_layer * all_to_all_time(routed, layout.ep, *link)
    out["a2a_comm"] = 0.0 if bug == "no all-to-all" else a2a
    pipelined = out["compute"] + out["tp_comm"] + out["pp_comm"] + out["a2a_comm"]
    out["bubble"] = pipelined * (layout.pp - 1) / m
    expert_dp = layout.dp // layout.ep
    dense = ring_allreduce_time(2 * spec.dense_params / (layout.tp * layout.pp), layout.dp,
                                *group_link(cluster, layout.tp, layout.dp))
    experts = ring_allreduce_time(2 * spec.expert_params / (layout.tp * layout.pp * layout.ep), expert_dp,
                                  *group_link(cluster, layout.tp * layout.ep, expert_dp))
    if bug == "expert grads over dp":
        experts = ring_allreduce_time(2 * spec.expert_params / (layout.tp * layout.pp * layout.ep), layout.dp,
                                      *group_link(cluster, layout.tp, layout.dp))
    out["dp_comm"] = (dense + experts) * (1.5 if layout.zero == 3 else 1.0)
    out["total"] = pipelined + out["bubble"] + out["dp_comm"]
    return {k: out[k] for k in MOE_TIME_KEYS}


_MOE_TIME_VARIANTS = (("no all-to-all", "no all-to-all: every MoE layer sends each token to its top_k experts and "
                       "back, twice in the forward and twice in the backward"),
                      ("a2a forward only", "the all-to-alls of the forward only: the backward sends the gradients "
                       "back the same way, 4 per layer (6 with recomputation)"),
                      ("a2a on nvlink", "the all-to-all on NVLink although the EP group (ranks tp apart) spans "
                       "nodes"),
                      ("no top_k", "one copy of each token: it goes to top_k experts, top_k x the bytes"),
                      ("all parameters active", "every expert in the FLOPs: a token runs only top_k of them, "
                       "6 x active_params per token"),
                      ("expert grads over dp", "the expert gradients all-reduced over all dp ranks: only the dp / ep "
                       "ranks holding the same experts share them"))
_MOE_TIME_HINTS = {
    "compute": "step_time's compute with n_params = spec.active_params: a token runs top_k experts, not all.",
    "tp_comm": "step_time's TP all-reduces (they do not depend on the experts).",
    "pp_comm": "step_time's PP sends.",
    "a2a_comm": "ceil(L / pp) x m x 4 (6 with recomputation) all_to_all_time(s b top_k h 2 bytes, ep, "
                "*group_link(cluster, tp, ep)).",
    "bubble": "(compute + tp_comm + pp_comm + a2a_comm) x (pp - 1) / m: the all-to-alls are pipelined work too.",
    "dp_comm": "Ring all-reduce of the dense bf16 gradients over dp on group_link(cluster, tp, dp), plus of the "
               "expert gradients (expert_params / (tp pp ep)) over dp // ep on group_link(cluster, tp * ep, "
               "dp // ep); x 1.5 at ZeRO-3.",
    "total": "total is the sum of the other six.",
    "_variants": _MOE_TIME_VARIANTS,
}


def _moe_step_time_cases(gen, public):
    if public:
        return _moe_cases_public()
    lay = _moe_random_layout(gen)  # then EP > 1 without recomputation (4 all-to-alls a layer), and with it (6)
    ep = choice(gen, (2, 4))
    lay = dataclasses.replace(lay, ep=ep, dp=ep * choice(gen, (1, 2, 4)), recompute=False)
    cross = Layout(16, 2, choice(gen, (1, 2)), 1, randint(gen, 0, 3), True, 8)
    return [_layout_case(rule, MIXTRAL_8X7B, choice(gen, (2048, 4096)), lay.dp * lay.micro_batch * randint(gen, 8, 32),
                         _moe_cluster(lay.dp * lay.tp * lay.pp), lay)
            for rule, lay in (("EP inside a node or across", lay), ("EP across nodes", cross))]


def _moe_step_time_judge(case, obs):
    x = case.inputs
    args = (RUN._moe_spec(x["spec"]), x["seq_len"], x["global_batch"], RUN._layout(x["layout"]),
            RUN._cluster(x["cluster"]))
    return _judge_numbers("moe_step_time", obs["time"], ref_moe_step_time(*args),
                          lambda bug: ref_moe_step_time(*args, bug=bug), _MOE_TIME_HINTS, case, " s")


def ref_moe_layout_problems(spec, seq_len, global_batch, layout, cluster) -> list[str]:
    """Exercise 3's rules on the dense part, plus: a dense model takes no EP; ep divides dp and the experts;
    the memory with this GPU's experts fits."""
    if not isinstance(spec, MoESpec):
        return ref_layout_problems(spec, seq_len, global_batch, layout, cluster) + (
            [f"EP={layout.ep} for a dense model"] if layout.ep > 1 else [])
    problems = ref_layout_problems(dataclasses.replace(spec, n_params=spec.dense_params), seq_len, global_batch,
                                   layout, cluster)
    if layout.dp % layout.ep:
        problems.append(f"EP={layout.ep} does not divide DP={layout.dp}")
    if spec.num_experts % layout.ep:
        problems.append(f"{spec.num_experts} experts do not split {layout.ep} ways")
    mem = ref_moe_training_memory(spec, seq_len, layout)["total"]
    if mem > HEADROOM * cluster.gpu_bytes:
        problems.append(f"{mem / 1e9:.1f} GB per GPU > {HEADROOM:.0%} of {cluster.gpu_bytes / 1e9:.0f} GB")
    return problems


_MOE_FEASIBLE = Layout(128, 1, 1, 2, 1, False, 8)  # fits only because EP=8 shards the experts


def _moe_layout_problems_cases(gen, public):
    cl, seq, batch = _moe_cluster(), _MOE_SEQ, _MOE_BATCH
    dp = choice(gen, (16, 32)) if not public else 16
    rows = [("experts sharded 8 ways", MIXTRAL_8X7B, seq, batch, cl, _MOE_FEASIBLE),
            ("EP that does not divide DP", MIXTRAL_8X7B, seq, 480, _moe_cluster(96), Layout(12, 8, 1, 1, 1, True, 8)),
            ("a dense model with EP", MODELS["Llama-2-13B"], seq, batch, _moe_cluster(dp * 8),
             Layout(dp, 8, 1, 1, 1, True, 2 if public else choice(gen, (2, 4)))),
            ("more EP ranks than experts", MIXTRAL_8X7B, seq, batch, cl, Layout(32, 4, 1, 1, 1, True, 16)),
            ("experts that do not fit", MIXTRAL_8X7B, seq, batch, _moe_cluster(64), Layout(64, 1, 1, 1, 0, False, 1))]
    if not public:  # 74 to 79 GB per GPU: over 90% of 80 GB, under 100% (a test against the whole GPU accepts them)
        rows.append(("experts over the 90% headroom", MIXTRAL_8X7B, seq, batch, _moe_cluster(16), choice(gen, (
            Layout(8, 1, 2, 1, 0, False, 8), Layout(8, 1, 2, 1, 1, False, 4), Layout(8, 2, 1, 1, 2, False, 2),
            Layout(8, 1, 4, 2, 1, False, 2)))))
    control = (_MOE_FEASIBLE, cl)
    first, *rest = [_layout_case(*row) for row in rows]
    return [_with_control(first, Layout(64, 1, 1, 1, 0, False, 1), _moe_cluster(64))] + \
        [_with_control(c, *control) for c in rest]


def _judge_moe_problems(spec, x, layout, cluster, got, name) -> str | None:
    want = ref_moe_layout_problems(spec, x["seq_len"], x["global_batch"], layout, cluster)
    if not isinstance(got, list):
        return f"moe_layout_problems must return a list of strings (empty when the layout can run), got {got}."
    if bool(got) == bool(want):
        return None
    if want:
        why = f"moe_layout_problems returned [] for {name}, which cannot run: {'; '.join(want)}."
        if not isinstance(spec, MoESpec):
            return f"{why} Yours gives a dense model EP > 1: it has no experts to shard, so ep must be 1."
        if layout.dp % layout.ep:
            return (f"{why} Yours accepts EP={layout.ep} that does not divide DP={layout.dp}: experts are sharded "
                    "inside the DP group, so dp must be a multiple of ep.")
        return f"{why} Check every rule: exercise 3's, ep dividing dp and num_experts, the memory with the experts."
    why = f"moe_layout_problems rejected {name} ({got}), but it fits and can run"
    if ref_moe_layout_problems(spec, x["seq_len"], x["global_batch"], dataclasses.replace(layout, ep=1), cluster):
        return why + (f": its EP={layout.ep} shards the experts, so each GPU holds expert_params / (tp pp ep) of "
                      "them. Is your expert memory divided by ep?")
    return why + "."


def _moe_layout_problems_judge(case, obs):
    x, control = case.inputs, case.inputs["control"]
    control_spec = MIXTRAL_8X7B if "num_experts" not in x["spec"] else RUN._moe_spec(x["spec"])
    return _judge_moe_problems(RUN._moe_spec(x["spec"]), x, RUN._layout(x["layout"]), RUN._cluster(x["cluster"]),
                               obs["problems"], case.name) or \
        _judge_moe_problems(control_spec, x, RUN._layout(control["layout"]), RUN._cluster(control["cluster"]),
                            obs["control"], f"{RUN._layout(control['layout'])} for {control_spec.name}")


@lru_cache(maxsize=8)
def ref_plan_moe_training(spec, seq_len, global_batch, cluster) -> tuple:
    """exercise 4's search with ep over the divisors of dp that divide num_experts: (Layout, seconds)."""
    layouts = (Layout(dp, tp, pp, mb, zero, recompute, ep)
               for tp in _divisors(cluster.gpus_per_node) for pp in _divisors(cluster.n_gpus // tp)
               for dp in [cluster.n_gpus // (tp * pp)] for ep in _divisors(dp) if spec.num_experts % ep == 0
               for mb, zero, recompute in _MICRO_ZERO_RECOMPUTE)
    return _fastest(layouts, lambda lay: ref_moe_layout_problems(spec, seq_len, global_batch, lay, cluster),
                    lambda lay: ref_moe_step_time(spec, seq_len, global_batch, lay, cluster)["total"])


def _plan_moe_training_cases(gen, public):
    def case(rule, seq, batch, n_gpus):
        return Case(f"{rule}: Mixtral-8x7B, sequence {seq}, batch {batch}, {n_gpus} H100s",
                    dict(spec=RUN._plain(MIXTRAL_8X7B), seq_len=seq, global_batch=batch,
                         cluster=RUN._plain(_moe_cluster(
                        n_gpus))))

    if public:
        return [case("EP pays", _MOE_SEQ, _MOE_BATCH, _MOE_GPUS)]
    return [case("EP pays", _MOE_SEQ, 128 * choice(gen, (4, 8)), 128),
            case("a small cluster", 2048, 64 * choice(gen, (4, 8)), 64)]


def _plan_moe_training_judge(case, obs):
    x = case.inputs
    args = (RUN._moe_spec(x["spec"]), x["seq_len"], x["global_batch"], RUN._cluster(x["cluster"]))
    got = _plan_against_reference("plan_moe_training", obs["plan"], case, args, ref_moe_layout_problems,
                                  ref_moe_step_time, ref_plan_moe_training)
    if isinstance(got, str):
        return got
    lay, t, best, t_best = got
    if t > (1 + PLAN_RTOL) * t_best:
        message = (f"plan_moe_training chose {lay}: {t:.3f} s per step in the model, but {best} takes {t_best:.3f} s "
                   f"for {case.name}. Search ep too (divisors of dp that divide num_experts) with every tp, pp, "
                   "microbatch size, ZeRO stage and recomputation.")
        if best.ep > 1 and lay.ep == 1:
            message += " Yours kept EP=1: sharding the experts frees memory for a shallower pipeline or more DP."
        return message
    if len(obs["why"].split()) < 5:
        return "plan_moe_training's explanation is missing: say why this layout (EP, memory per GPU, step time)."
    return None


# --- 5. serving memory -------------------------------------------------------------------------------------

SERVE_KEYS = ("weights", "kv", "total")


def ref_serving_memory(spec, tp, batch, context, weight_bytes, kv_bytes, *, bug: str = "") -> dict:
    """Bytes per GPU of a replica sharded ``tp`` ways: its share of the weights, and the KV cache of ``batch``
    sequences of ``context`` tokens for its ceil(n_kv_heads / tp) key/value heads (replicated below one head)."""
    weights = spec.n_params * weight_bytes / (1 if bug == "weights not split" else tp)
    heads = {"no kv": 0, "kv not split": spec.n_kv_heads, "query heads": math.ceil(spec.n_heads / tp),
             "kv floor": spec.n_kv_heads / tp}.get(bug, math.ceil(spec.n_kv_heads / tp))
    kv = batch * context * (1 if bug == "k or v" else 2) * spec.n_layers * heads * spec.head_dim * kv_bytes
    return {"weights": weights, "kv": kv, "total": weights + kv}


_SERVE_HINTS = {"weights": "n_params x weight_bytes / tp: each GPU of the replica holds 1/tp of the weights.",
                "kv": "batch x context x 2 x n_layers x ceil(n_kv_heads / tp) x head_dim x kv_bytes.",
                "_variants": (("weights not split", "the whole replica's weights on one GPU (per replica or per "
                               "node, not per GPU): TP gives each GPU 1/tp of them"),
                              ("k or v", "one of K and V: the cache holds both, a factor 2"),
                              ("no kv", "no KV cache: every running sequence keeps K and V of all its tokens"),
                   ("kv not split", "the whole cache on every GPU: TP splits the key/value heads too"),
                   ("query heads", "the query heads: only the n_kv_heads key/value heads are cached"),
                   ("kv floor", "a fraction of a head: with fewer KV heads than GPUs each GPU keeps a whole "
                    "(replicated) head, ceil(n_kv_heads / tp)"))}


def _serving_memory_cases(gen, public):
    def case(rule, spec, tp, batch, context, wb, kvb):
        return Case(f"{rule}: {spec.name}, TP={tp}, {batch} sequences of {context} tokens, weights {wb} B, KV {kvb} B",
                    dict(spec=RUN._plain(spec), tp=tp, batch=batch, context=context, weight_bytes=wb, kv_bytes=kvb))

    if public:
        return [case("MHA", GPT3_175B, 8, 64, 536, 1, 1), case("GQA", MODELS["Llama-2-70B"], 4, 32, 4096, 2, 2),
                case("fewer KV heads than GPUs", MODELS["Llama-2-70B"], 16, 8, 4096, 2, 2)]
    spec = choice(gen, [MODELS["Llama-2-7B"], MODELS["Llama-2-13B"], GPT3_175B])
    return [case("MHA", spec, choice(gen, (1, 2, 4, 8)), randint(gen, 1, 128), randint(gen, 128, 8192), 2, 2),
            case("GQA", MODELS["Llama-3-8B"], choice(gen, (2, 4, 8)), randint(gen, 1, 128), randint(gen, 128, 8192), 2,
                 1),
            case("fewer KV heads than GPUs", MODELS["Mistral-7B"], 16, randint(gen, 1, 64), 4096, 1, 1)]


def _serving_memory_judge(case, obs):
    x = case.inputs
    args = (RUN._spec(x["spec"]), x["tp"], x["batch"], x["context"], x["weight_bytes"], x["kv_bytes"])
    return _judge_numbers("serving_memory", obs["mem"], ref_serving_memory(*args),
                          lambda bug: ref_serving_memory(*args, bug=bug), _SERVE_HINTS, case, " bytes per GPU")


# --- 6. the serving plan -----------------------------------------------------------------------------------

MAX_REPLICAS = 32


def _fits(spec, work, cluster, tp, max_batch, bug="") -> bool:
    mem = ref_serving_memory(spec, tp, max_batch, work.max_context, work.weight_bytes, work.kv_bytes, bug=bug)
    return mem["total"] <= HEADROOM * cluster.gpu_bytes


def _p99(spec, cluster, work, tp, replicas, max_batch) -> float:
    return simulate_replicas(spec, cluster, work, tp, replicas, max_batch)["p99"]


@lru_cache(maxsize=16)
def ref_plan_serving(spec, work, cluster) -> tuple:
    """(GPUs, tp, replicas, max_batch) of the fewest GPUs meeting the p99: for each tp inside a node, the largest
    power-of-two batch (<= 256) that fits beside the weights, and the fewest replicas (bisection) meeting p99."""
    best = None
    for tp in _divisors(cluster.gpus_per_node):
        if spec.n_heads % tp or not _fits(spec, work, cluster, tp, 1) or (best and tp >= best[0]):
            continue  # (a replica of tp GPUs cannot beat a plan of best[0] <= tp GPUs)
        max_batch = max(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if _fits(spec, work, cluster, tp, b))
        lo, hi = 1, MAX_REPLICAS
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _p99(spec, cluster, work, tp, mid, max_batch) <= work.p99_s else (mid + 1, hi)
        if _p99(spec, cluster, work, tp, lo, max_batch) > work.p99_s:
            continue  # even MAX_REPLICAS replicas miss the target: each step is too slow at this TP
        if best is None or tp * lo < best[0]:
            best = (tp * lo, tp, lo, max_batch)
    return best


def _plan_serving_cases(gen, public):
    def case(rule, spec, work):
        return Case(f"{rule}: {spec.name} at {work.rate:g} requests/s, prompts {work.prompt_len}, outputs "
                    f"{work.new_tokens} tokens, p99 < {work.p99_s:g} s, weights {work.weight_bytes:g} B, KV "
                    f"{work.kv_bytes:g} B per value", dict(spec=RUN._plain(spec), work=RUN._plain(work),
                                                            cluster=RUN._plain(H100.with_gpus(512))))

    if public:
        return [case("the interview's case", GPT3_175B, SERVE_175B),
                case("a long context", MODELS["Llama-2-13B"], Workload(2.0, (1024, 4096), (8, 32), 4.0, 2.0, 2.0))]
    return [case("175B at another rate", GPT3_175B, dataclasses.replace(SERVE_175B, rate=float(randint(gen, 60, 140)))),
            case("a 70B model in fp16", MODELS["Llama-2-70B"], Workload(float(randint(gen, 20, 40)), (128, 1024),
                                                                        (8, 32), 1.0, 2.0, 2.0)),
            # 13B at 8k tokens on one GPU: 8 sequences fit in 80 GB, only 4 in the 90% a plan may use
            case("a long context near the memory limit", MODELS["Llama-2-13B"],
                 Workload(float(randint(gen, 1, 2)), (1024, 8192), (8, 32), 4.0, 2.0, 2.0))]


def _plan_serving_judge(case, obs):
    x = case.inputs
    spec, cluster = RUN._spec(x["spec"]), RUN._cluster(x["cluster"])
    work = RUN._work(x["work"])
    plan = obs["plan"]
    if not isinstance(plan, dict) or not all(isinstance(plan[k], int) and plan[k] > 0 for k in plan):
        return f"plan_serving must return {{'tp': int, 'replicas': int, 'max_batch': int}}, got {plan}."
    tp, replicas, max_batch = plan["tp"], plan["replicas"], plan["max_batch"]
    if tp > cluster.gpus_per_node or spec.n_heads % tp:
        return (f"plan_serving chose TP={tp}: a replica's per-layer all-reduces must stay on NVLink inside a node "
                f"of {cluster.gpus_per_node} GPUs, and {spec.n_heads} heads must split {tp} ways.")
    if not _fits(spec, work, cluster, tp, max_batch):
        mem = ref_serving_memory(spec, tp, max_batch, work.max_context, work.weight_bytes, work.kv_bytes)
        message = (f"plan_serving: TP={tp} with max_batch={max_batch} needs {mem['total'] / 1e9:.1f} GB per GPU "
                   f"(weights {mem['weights'] / 1e9:.1f} GB + KV {mem['kv'] / 1e9:.1f} GB for {max_batch} sequences "
                   f"of {work.max_context} tokens), over {HEADROOM:.0%} of {cluster.gpu_bytes / 1e9:.0f} GB.")
        if mem["total"] <= cluster.gpu_bytes:
            message += (f" It fits the whole GPU, not the {HEADROOM:.0%} a plan may use: the rest is the "
                        "allocator's, NCCL's and the activations' workspace.")
        elif _fits(spec, work, cluster, tp, max_batch, bug="no kv"):
            message += " Yours forgets the KV cache: size the batch so the cache of every running sequence fits."
        return message
    best = ref_plan_serving(spec, work, cluster)
    if tp * replicas > SERVE_SLACK * best[0]:
        return (f"plan_serving uses {tp * replicas} GPUs ({replicas} x TP={tp}); {best[2]} replicas of TP={best[1]} "
                f"({best[0]} GPUs) also meet p99 < {work.p99_s:g} s. Search for the fewest replicas per TP degree.")
    run = simulate_replicas(spec, cluster, work, tp, replicas, max_batch)
    if run["p99"] > work.p99_s:
        message = (f"plan_serving: {replicas} replicas of TP={tp}, max_batch={max_batch} give p99 = {run['p99']:.3f} s "
                   f"in the simulation, over the {work.p99_s:g} s target for {case.name}. Add replicas (queueing), or "
                   f"use more TP per replica (each step faster). The reference meets it with {best[2]} x TP={best[1]}.")
        if tp == best[1] and replicas < best[2]:
            message += (" Every replica also spends steps on the prompts' prefill, and queues need headroom: size "
                        "the replicas with simulate_replicas, not from decode throughput alone.")
        if run["p50"] <= work.p99_s:
            message += (f" Its median (p50 = {run['p50']:.3f} s) meets the target: the target is on the 99th "
                        "percentile, read simulate_replicas(...)['p99'], not the median or the mean.")
        return message
    return None


# --- 6b. prefill and decode: mixed or disaggregated -------------------------------------------------------------

PD_KEYS = ("ttft_s", "tpot_s", "kv_transfer_s", "mixed_stall_s", "p99_ttft_s", "prefill_replicas", "decode_replicas",
           "mixed_replicas")


def ref_prefill_decode_split(spec, work, cluster, tp, decode_batch, n_requests=300, seed=0, *, bug: str = "") -> dict:
    """Prefill compute-bound (2 N p FLOPs at peak x MFU over tp GPUs), decode memory-bound (weights + the batch's
    cache at half the maximum context over tp x HBM bandwidth), the KV of a prompt over the network (each GPU its
    1/tp); replicas for the mean load at SERVE_UTILISATION; the p99 TTFT of the disaggregated prefill replicas
    from fcfs_pool on the seeded trace plus each request's KV transfer."""
    kv_token = kv_bytes_per_token(spec, work.kv_bytes)

    def prefill(p):
        if bug == "prefill memory-bound":
            return spec.n_params * work.weight_bytes / (tp * cluster.hbm_bytes_per_s)
        return 2 * spec.n_params * p / (tp * cluster.peak_flops * cluster.mfu)

    def transfer(p):
        if bug == "no kv transfer":
            return 0.0
        return cluster.inter_alpha + p * kv_token / (1 if bug == "kv over one nic" else tp) / cluster.inter_bytes_per_s

    if bug == "decode compute-bound":
        tpot = 2 * spec.n_params * decode_batch / (tp * cluster.peak_flops * cluster.mfu)
    else:
        kv = 0.0 if bug == "decode without kv" else decode_batch * kv_token * work.max_context / 2
        tpot = (spec.n_params * work.weight_bytes + kv) / (tp * cluster.hbm_bytes_per_s)
    prefill_load = work.rate * prefill(sum(work.prompt_len) / 2)
    decode_load = work.rate * sum(work.new_tokens) / 2 * tpot / decode_batch
    n_prefill = math.ceil(prefill_load / SERVE_UTILISATION)
    trace = make_trace(seed, n_requests, work.rate, work.prompt_len, work.new_tokens)
    through = fcfs_pool([r.arrival for r in trace], [prefill(r.prompt_len) for r in trace], n_prefill)
    if bug == "no queueing":
        through = [prefill(r.prompt_len) for r in trace]
    ttfts = [t + transfer(r.prompt_len) for t, r in zip(through, trace)]
    p99 = sum(ttfts) / len(ttfts) if bug == "p99 from the mean" else percentile(ttfts, 99)
    longest = work.prompt_len[1]
    return {"ttft_s": prefill(longest), "tpot_s": tpot, "kv_transfer_s": transfer(longest),
            "mixed_stall_s": tpot + prefill(longest), "p99_ttft_s": p99, "prefill_replicas": n_prefill,
            "decode_replicas": math.ceil(decode_load / SERVE_UTILISATION),
            "mixed_replicas": math.ceil((prefill_load + decode_load) / SERVE_UTILISATION)}


_PD_HINTS = {
    "ttft_s": "Prefill is compute-bound: 2 x n_params x prompt_tokens FLOPs over tp x peak_flops x mfu, for the "
              "longest prompt (work.prompt_len[1]).",
    "tpot_s": "Decode is memory-bound: (n_params x weight_bytes + decode_batch x kv_bytes_per_token x max_context / "
              "2) bytes over tp x hbm_bytes_per_s.",
    "kv_transfer_s": "inter_alpha + longest prompt x kv_bytes_per_token / tp / inter_bytes_per_s: each GPU sends its "
                     "share of the cache over its own NIC.",
    "mixed_stall_s": "tpot_s + ttft_s: a decode step that shares its step with the longest prefill waits for it.",
    "p99_ttft_s": "percentile over the seeded trace (make_trace(seed, n_requests, rate, prompt_len, new_tokens)) of "
                  "fcfs_pool(arrivals, prefill times, prefill_replicas) plus each request's KV transfer, at 99.",
    "prefill_replicas": "ceil(rate x prefill(mean prompt) / SERVE_UTILISATION).",
    "decode_replicas": "ceil(rate x mean new tokens x tpot / decode_batch / SERVE_UTILISATION): a decode replica "
                       "makes decode_batch tokens per tpot.",
    "mixed_replicas": "ceil((prefill load + decode load) / SERVE_UTILISATION): mixed replicas share both loads.",
    "_variants": (("prefill memory-bound", "prefill as memory-bound (the weights read once): a prompt's tokens share "
                   "each weight read, so its 2 N p FLOPs set the time"),
                  ("decode compute-bound", "decode as compute-bound: a decode step reads every weight and the cache "
                   "for a few tokens, so its bytes over HBM bandwidth set the time"),
                  ("decode without kv", "a decode step that reads the weights but not the batch's KV cache"),
                  ("no kv transfer", "no KV transfer: a disaggregated decode replica must receive each prompt's "
                   "cache over the network"),
                  ("kv over one nic", "the whole cache through one NIC: each of the tp GPUs sends its 1/tp share"),
                  ("p99 from the mean", "the mean TTFT: the target is the 99th percentile of the simulated TTFTs"),
                  ("no queueing", "no queueing: requests wait for a free prefill replica (fcfs_pool)")),
}


def _prefill_decode_split_cases(gen, public):
    def case(rule, spec, work, tp, batch):
        return Case(f"{rule}: {spec.name} at {work.rate:g} requests/s, prompts {work.prompt_len}, outputs "
                    f"{work.new_tokens}, TP={tp}, decode batch {batch}, weights {work.weight_bytes:g} B, KV "
                    f"{work.kv_bytes:g} B", dict(spec=RUN._plain(spec), work=RUN._plain(work), cluster=RUN._plain(
                        H100.with_gpus(512)), tp=tp, decode_batch=batch))

    long_prompts = Workload(8.0, (1024, 4096), (64, 256), 4.0, 2.0, 2.0)
    if public:
        return [case("the interview's case", GPT3_175B, SERVE_175B, 8, 32),
                case("long prompts", MODELS["Llama-2-70B"], long_prompts, 4, 16)]
    return [case("175B at another rate", GPT3_175B, dataclasses.replace(SERVE_175B, rate=float(randint(gen, 60, 140))),
                 8, choice(gen, (16, 32, 64))),
            case("long prompts", MODELS["Llama-2-70B"],
                 dataclasses.replace(long_prompts, rate=float(randint(gen, 4, 12))), choice(gen, (4, 8)),
                 choice(gen, (8, 16, 32)))]


def _prefill_decode_split_judge(case, obs):
    x = case.inputs
    args = (RUN._spec(x["spec"]), RUN._work(x["work"]), RUN._cluster(x["cluster"]), x["tp"], x["decode_batch"])
    return _judge_numbers("prefill_decode_split", obs["split"], ref_prefill_decode_split(*args),
                          lambda bug: ref_prefill_decode_split(*args, bug=bug), _PD_HINTS, case)


# --- 7. 7B on 4 GPUs -----------------------------------------------------------------------------------------

def ref_four_gpu_options(spec, cluster, work, batch, *, bug: str = "") -> dict:
    """Decoding work.new_tokens[1] tokens for ``batch`` sequences per group: TP=4 (one replica, faster steps
    with 2 all-reduces per layer), PP=4 (4 stages of a quarter of the layers, 4 microbatches in flight: a token
    still crosses every stage and 4 hops), 4 replicas (each GPU its own batch). Latency per request, tokens/s."""
    n = work.new_tokens[1]
    t1 = replica_step_time(spec, 1, cluster, work, 0, batch)
    t4 = replica_step_time(spec, 4, cluster, work, 0, batch)
    if bug == "tp free":
        t4 = t1 / 4
    hop = cluster.intra_alpha + batch * spec.d_model * 2 / cluster.intra_bytes_per_s
    cycle = 4 * (t1 / 4 + hop) if bug != "pp faster" else t1 / 4 + hop
    reps = 4 if bug != "replicas one" else 1
    return {"tp": {"latency_s": n * t4, "tokens_per_s": batch / t4},
            "pp": {"latency_s": n * cycle, "tokens_per_s": 4 * batch / cycle},
            "replicas": {"latency_s": n * t1, "tokens_per_s": reps * batch / t1}}


def _four_gpu_options_cases(gen, public):
    def case(rule, spec, batch):
        return Case(f"{rule}: {spec.name}, batch {batch} per group, {work.new_tokens[1]} new tokens",
                    dict(spec=RUN._plain(spec), cluster=RUN._plain(H100.with_gpus(4)), work=RUN._plain(work),
                         batch=batch))
    work = Workload(10.0, (128, 1024), (64, 256), 1.0, 2.0, 2.0)
    if public:
        return [case("one sequence", MODELS["Llama-2-7B"], 1), case("a batch", MODELS["Mistral-7B"], 32)]
    return [case("one sequence", choice(gen, [MODELS["Llama-2-7B"], MODELS["Llama-3-8B"]]), 1),
            case("a batch", choice(gen, [MODELS["Llama-2-7B"], MODELS["Mistral-7B"]]), randint(gen, 8, 64))]


_FOUR_HINTS = {"_variants": (
    ("tp free", "TP without its all-reduces (2 per layer per step, on NVLink: at batch 1 they cost as much as the "
                "weight reads)"),
    ("pp faster", "a pipeline that cuts a token's latency 4x: each token still crosses all 4 stages, so PP does not "
                  "cut latency, it only keeps 4 microbatches busy"),
    ("replicas one", "one replica's throughput: 4 replicas serve 4 batches at once"))}


def _four_gpu_options_judge(case, obs):
    x = case.inputs
    work = RUN._work(x["work"])
    args = (RUN._spec(x["spec"]), RUN._cluster(x["cluster"]), work, x["batch"])
    got = obs["got"]
    if not isinstance(got, dict):
        return f"four_gpu_options must return a dict of dicts, got {got}."
    for option, want in ref_four_gpu_options(*args).items():
        wrong = _judge_numbers(f"four_gpu_options[{option!r}]", got.get(option), want,
                               lambda bug: ref_four_gpu_options(*args, bug=bug)[option], _FOUR_HINTS, case)
        if wrong:
            return wrong
    return None


# --- 8. ResNet-152: batching against a latency target ------------------------------------------------------

def ref_resnet_batch(t_fixed, t_per_item, rate, slo, *, bug: str = "") -> dict:
    """The largest batch (<= 256) whose worst latency, waiting for the batch to fill ((b - 1) / rate) plus
    running it (t_fixed + b t_per_item), meets ``slo`` while its throughput keeps up with ``rate``."""
    best = {"batch": 0, "latency_s": 0.0, "items_per_s": 0.0}
    for b in range(1, 257):
        run = t_fixed + b * t_per_item
        latency = run + (0 if bug == "no wait" else (b - 1) / rate)
        meets = latency < slo if bug == "strict" else latency <= slo
        if meets and (b / run >= rate or bug == "no throughput"):
            best = {"batch": b, "latency_s": latency, "items_per_s": b / run}
            if bug == "smallest":
                return best
    return best


def _resnet_batch_cases(gen, public):
    def case(rule, t_fixed, t_per, rate, slo):
        return Case(f"{rule}: fixed {t_fixed * 1e3:.3g} ms, {t_per * 1e3:.3g} ms per image, {rate:g} images/s, "
                    f"target {slo * 1e3:g} ms", dict(t_fixed=t_fixed, t_per_item=t_per, rate=rate, slo=slo))
    if public:  # fp16 unfused, fused, fused + int8 (lesson 16's numbers)
        return [case("unfused fp16", 2.0e-3, 0.10e-3, 2000.0, 0.02), case("fused fp16", 0.7e-3, 0.10e-3, 2000.0, 0.02),
                case("fused int8", 0.7e-3, 0.05e-3, 2000.0, 0.02), case("a target no batch meets", 2e-3, 1e-3,
                                                                        2000.0, 0.01)]
    return [case("a feasible target", uniform(gen, 0.5e-3, 3e-3), uniform(gen, 0.03e-3, 0.2e-3),
                 float(randint(gen, 500, 4000)), uniform(gen, 0.01, 0.05)),
            case("a target no batch meets", 3e-3, 1e-3, 3000.0, uniform(gen, 0.001, 0.005)),
            case("a target met exactly", *_exact_target(gen)), case("throughput short of the rate", *_short(gen)),
            case("a batch over 64", *_large_batch(gen))]


def _exact_target(gen) -> tuple:
    """A target equal to one batch's worst latency: that batch meets it (latency <= slo)."""
    t_fixed, t_per, rate = uniform(gen, 0.5e-3, 3e-3), uniform(gen, 0.03e-3, 0.2e-3), float(randint(gen, 500, 4000))
    b = max(randint(gen, 2, 40), math.ceil(rate * t_fixed / max(1e-9, 1 - rate * t_per)))  # keeps up with the rate
    run = t_fixed + b * t_per
    return t_fixed, t_per, rate, run + (b - 1) / rate


def _short(gen) -> tuple:
    """Batch 1 meets the target, but no batch both meets it and keeps up with the rate: the answer is none."""
    while True:
        t_fixed, t_per, rate = uniform(gen, 1e-3, 3e-3), uniform(gen, 0.05e-3, 0.15e-3), float(randint(gen, 3000, 6000))
        b_min = math.ceil(rate * t_fixed / (1 - rate * t_per)) if rate * t_per < 0.9 else 10**9
        if 3 <= b_min <= 200:
            first, last = t_fixed + t_per, (b_min - 2) / rate + t_fixed + (b_min - 1) * t_per
            return t_fixed, t_per, rate, uniform(gen, first, last)


def _large_batch(gen) -> tuple:
    """A fast model at a high rate under a loose target: the best batch is over 64."""
    while True:
        args = (uniform(gen, 0.5e-3, 2e-3), uniform(gen, 0.01e-3, 0.03e-3), float(randint(gen, 10000, 30000)),
                uniform(gen, 0.008, 0.03))
        if ref_resnet_batch(*args)["batch"] > 64:
            return args


def _resnet_batch_judge(case, obs):
    x = case.inputs
    args = (x["t_fixed"], x["t_per_item"], x["rate"], x["slo"])
    want, got = ref_resnet_batch(*args), _numbers(obs["got"], ("batch", "latency_s", "items_per_s"))
    if isinstance(got, str):
        return f"resnet_batch {got}."
    if got["batch"] != want["batch"]:
        message = (f"resnet_batch chose batch {got['batch']:g}, expected {want['batch']} for {case.name} (worst "
                   f"latency {want['latency_s'] * 1e3:.3g} ms, {want['items_per_s']:.0f} images/s).")
        return diagnose(message, got["batch"], [
            ("no wait for the batch to fill: the first image waits (b - 1) / rate for the others",
             ref_resnet_batch(*args, bug="no wait")["batch"]),
            ("the smallest batch that works: the largest one that meets the target serves most per GPU",
             ref_resnet_batch(*args, bug="smallest")["batch"]),
            ("no throughput check: a batch whose b / (t_fixed + b t_per_item) is under the rate falls behind, and "
             "its queue grows without bound", ref_resnet_batch(*args, bug="no throughput")["batch"]),
            ("a target met exactly counted as missed: a latency equal to the target meets it (<=)",
             ref_resnet_batch(*args, bug="strict")["batch"])], lambda g, w: g == w, "\n  Yours is {}.")
    for key in ("latency_s", "items_per_s"):
        if not close(got[key], want[key], 1e-6):
            return (f"resnet_batch: {key} = {got[key]:.6g}, expected {want[key]:.6g} for batch {want['batch']}: "
                    "latency = (b - 1) / rate (the first image waits for the b - 1 after it) + t_fixed + b t_per_item; "
                    "items_per_s = b / (t_fixed + b t_per_item).")
    return None


# --- 8b. a slow multi-GPU deployment, methodically ------------------------------------------------------

SHARES = {"nccl_ms": ("communication", 0.4), "cpu_gap_ms": ("host_overhead", 0.3),
          "memcpy_ms": ("host_device_copies", 0.2)}  # in the order to check them, after imbalance


def ref_diagnose_deployment(profile: dict, *, bug: str = "") -> dict:
    """Imbalance first (a rank whose kernels take over 1.5x the median rank's: the others wait for it in NCCL),
    then the mean shares of the step: NCCL over 0.4, CPU gaps over 0.3, copies over 0.2; else compute.
    ``bug``: "mean" (over 1.5x the mean rank's), "twice" (over 2x the median), "slowest step" (shares of the
    slowest rank's step)."""
    kernel = profile["kernel_ms"]
    typical = float(kernel.mean()) if bug == "mean" else float(kernel.median())
    if float(kernel.max()) > (2.0 if bug == "twice" else 1.5) * typical:
        return {"bottleneck": "stage_imbalance", "rank": int(kernel.argmax())}
    step = float(profile["step_ms"].max() if bug == "slowest step" else profile["step_ms"].mean())
    for key, (name, limit) in SHARES.items():
        if float(profile[key].mean()) > limit * step:
            return {"bottleneck": name, "rank": -1}
    return {"bottleneck": "compute", "rank": -1}


def _near_a_threshold(gen, ranks: int, rule: str) -> dict:
    """A profile that a rule only just decides, so that a nearby rule decides it otherwise: "a mild imbalance"
    (one rank's kernels 1.51 to 1.6x the median: the mean as the yardstick, or 2x, miss it), "communication just
    over 40%" (of the mean step: the slowest rank's step as the yardstick misses it)."""
    for _ in range(200):
        prof = {k: v for k, v in make_profile(randint(gen, 0, 2**31), "compute", ranks).items() if k != "slow_rank"}
        kernel, nccl = prof["kernel_ms"], prof["nccl_ms"]
        if rule == "a mild imbalance":
            slow = randint(gen, 0, ranks - 1)
            kernel[slow] = float(kernel.median()) * uniform(gen, 1.51, 1.6)
            nccl += kernel[slow] - kernel  # the others wait for it in their next collective
            bugs = ("mean", "twice")
        else:
            rest = float((kernel + prof["cpu_gap_ms"] + prof["memcpy_ms"]).mean())
            share = uniform(gen, 0.402, 0.41)
            nccl *= share * rest / ((1 - share) * float(nccl.mean()))  # NCCL's mean share of the mean step
            bugs = ("slowest step",)
        prof["step_ms"] = kernel + nccl + prof["cpu_gap_ms"] + prof["memcpy_ms"]
        want = ref_diagnose_deployment(prof)
        if all(ref_diagnose_deployment(prof, bug=bug) != want for bug in bugs):
            return prof
    raise RuntimeError(f"no profile for {rule!r}")


def _diagnose_deployment_cases(gen, public):
    ranks = 8 if public else 16
    cases = [Case(f"{b}: {ranks} ranks", dict(profile={k: v for k, v in make_profile(
        randint(gen, 0, 2**31), b, ranks).items() if k != "slow_rank"})) for b in BOTTLENECKS]
    if not public:
        cases += [Case(f"{rule}: {ranks} ranks", dict(profile=_near_a_threshold(gen, ranks, rule)))
                  for rule in ("a mild imbalance", "communication just over 40%")]
    return cases


def _diagnose_deployment_judge(case, obs):
    profile, got = case.inputs["profile"], obs["got"]
    want = ref_diagnose_deployment(profile)
    if got == want:
        return None
    step = float(profile["step_ms"].mean())
    shares = ", ".join(f"{k[:-3]} {float(profile[k].mean()) / step:.0%}" for k in ("kernel_ms", *SHARES))
    kernel = profile["kernel_ms"]
    message = (f"diagnose_deployment = {got}, expected {want} for {case.name} (mean shares of the step: {shares}; "
               f"slowest rank's kernels {float(kernel.max()) / float(kernel.median()):.2f}x the median rank's).")
    if isinstance(got, dict) and want["bottleneck"] == "stage_imbalance" and got["bottleneck"] == "communication":
        message += (" NCCL time is high because the other ranks wait for the slow one inside their collective: "
                    "compare the ranks' kernel times before blaming the network.")
    return message


# --- 9. checkpoint interval -------------------------------------------------------------------------------

def ref_checkpoint_interval(ckpt_s: float, gpu_mtbf_s: float, n_gpus: int) -> float:
    """Young/Daly: sqrt(2 C M), with the job's MTBF M = one GPU's MTBF / n_gpus (any GPU failing stops the job)."""
    return math.sqrt(2 * ckpt_s * gpu_mtbf_s / n_gpus)


def _checkpoint_interval_cases(gen, public):
    def case(rule, c, mtbf_h, n):
        return Case(f"{rule}: checkpoint {c:g} s, GPU MTBF {mtbf_h:g} h, {n} GPUs",
                    dict(ckpt_s=c, gpu_mtbf_s=mtbf_h * 3600, n_gpus=n))
    if public:
        return [case("a large job", 60.0, 50_000, 16_384), case("one GPU", 30.0, 50_000, 1)]
    return [case("a large job", float(randint(gen, 10, 600)), float(randint(gen, 10_000, 100_000)),
                 choice(gen, (1024, 4096, 16_384))),
            case("one node", float(randint(gen, 5, 60)), float(randint(gen, 10_000, 100_000)), 8)]


def _checkpoint_interval_judge(case, obs):
    x = case.inputs
    c, m, n = x["ckpt_s"], x["gpu_mtbf_s"], x["n_gpus"]
    want = ref_checkpoint_interval(c, m, n)
    if close(obs["got"], want, 1e-6):
        return None
    message = (f"checkpoint_interval = {obs['got']!r} s, expected sqrt(2 C M) = {want:.6g} s with M = "
               f"{m:g} / {n} s for {case.name}.")
    return diagnose(message, obs["got"], [
        ("sqrt(C M): Young/Daly's factor 2 is missing", math.sqrt(c * m / n)),
        ("one GPU's MTBF: with n GPUs a failure comes n times as often", math.sqrt(2 * c * m)),
        ("sqrt(C M) with one GPU's MTBF", math.sqrt(c * m))], lambda g, w: close(g, w, 1e-6), "\n  Yours is {}.")


# --- 10. elastic restart: re-shard a ZeRO checkpoint ---------------------------------------------------------

def flat_shards(flat: torch.Tensor, world: int) -> list[torch.Tensor]:
    """``flat`` (n,) cut into ``world`` shards of ``ceil(n / world)`` elements each, the last zero-padded: how ZeRO
    and FSDP store a flat parameter across ``world`` ranks (the old shards of a case, and the reference)."""
    size = math.ceil(flat.numel() / world)
    padded = torch.zeros(size * world, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return list(padded.view(world, size).clone().unbind(0))  # (world, size) -> world shards of (size,)


def _reshard_zero_cases(gen, public):
    def case(rule, numel, old, new, dtype=torch.float32):
        flat = torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)
        return Case(f"{rule}: {numel} {str(dtype)[6:]} elements, {old} -> {new} ranks",
                    dict(flat=flat, shards=flat_shards(flat, old), numel=numel, new_world=new))
    if public:
        return [case("shrink", 1000, 8, 6), case("grow", 10, 3, 4), case("no padding", 24, 4, 8),
                case("old padding longer than a new shard", 10, 8, 3)]
    return [case("shrink", randint(gen, 100, 5000), 8, choice(gen, (3, 5, 6, 7))),
            case("grow", randint(gen, 10, 500), choice(gen, (2, 3, 5)), choice(gen, (8, 16))),
            case("fewer elements than ranks", randint(gen, 1, 6), 2, 8),
            case("bfloat16 shards", randint(gen, 10, 500), choice(gen, (2, 4)), choice(gen, (3, 6)), torch.bfloat16)]


def _reshard_zero_judge(case, obs):
    x = case.inputs
    flat, numel, new = x["flat"], x["numel"], x["new_world"]
    want, got = flat_shards(flat, new), obs["got"]
    if not isinstance(got, list) or not all(isinstance(t, torch.Tensor) for t in got):
        return f"reshard_zero must return a list of {new} 1-D tensors, got {got!r:.200}."
    if len(got) != new:
        return f"reshard_zero returned {len(got)} shards for a world of {new} ranks."
    size = want[0].numel()
    sizes = [t.numel() for t in got]
    if sizes != [size] * new:
        if sum(sizes) == numel:
            return (f"reshard_zero returned shards of sizes {sizes}: they drop the padding tail. Every rank "
                    f"holds ceil({numel} / {new}) = {size} elements (the last zero-padded), so collectives "
                    "see equal sizes.")
        return (f"reshard_zero returned shards of sizes {sizes}, expected {new} x ceil({numel} / {new}) = {size}: "
                "strip the old padding (keep the first numel elements) before cutting.")
    if any(t.dtype != flat.dtype for t in got):
        return f"reshard_zero changed the dtype to {got[0].dtype}; keep {flat.dtype}."
    joined = torch.cat(got)
    if not torch.equal(joined[:numel], flat):
        bad = int((joined[:numel] != flat).nonzero()[0])
        return (f"reshard_zero: the shards joined differ from the unsharded tensor at element {bad} "
                f"({float(joined[bad])} vs {float(flat[bad])}).")
    if torch.any(joined[numel:] != 0):
        return "reshard_zero: the padding tail must be zeros (it enters sums and norms)."
    if not obs["inputs_kept"]:
        return "reshard_zero modified the old shards: a checkpoint is read, never written."
    return None


# --- 11. stragglers and hangs -------------------------------------------------------------------------------

STRAGGLER_FACTOR, HUNG_STEPS = 1.2, 3


def ref_find_stragglers(times: torch.Tensor) -> dict:
    """hung: ranks whose last HUNG_STEPS steps are all missing (NaN); stragglers: the other ranks whose median
    step time is over STRAGGLER_FACTOR x the median of the ranks' medians (medians: one hiccup is no straggler)."""
    hung = [r for r in range(times.shape[1]) if torch.isnan(times[-HUNG_STEPS:, r]).all()]
    medians = torch.nanmedian(times, dim=0).values  # (ranks,)
    typical = float(torch.median(medians))
    slow = [r for r in range(times.shape[1]) if r not in hung and float(medians[r]) > STRAGGLER_FACTOR * typical]
    return {"stragglers": slow, "hung": hung}


def _find_stragglers_cases(gen, public):
    def case(rule, ranks, stragglers, hung, hiccups, dropped=None, slowdown=1.5):
        seed = randint(gen, 0, 2**31)
        times = make_step_times(seed, 40, ranks, stragglers, hung, slowdown, hiccups)
        if dropped is not None:  # one report lost (the last step's, and one mid-run): late, not hung
            times[-1, dropped] = times[20, dropped] = float("nan")
        return Case(f"{rule}: {ranks} ranks, 40 steps", dict(times=times))
    if public:
        return [case("one straggler", 16, [5], [], 0), case("a hang", 8, [], [3], 2),
                case("hiccups and a straggler", 32, [30], [], 12), case("a dropped report", 8, [1], [6], 0, 2),
                case("a slow group", 16, [2, 3, 8, 9, 12, 13], [], 2, slowdown=1.3)]
    ranks = choice(gen, (16, 32, 64))
    return [case("one straggler", ranks, [randint(gen, 0, ranks - 1)], [], 3),
            case("a hang and a straggler", ranks, [0], [randint(gen, 1, ranks - 1)], 3),
            case("hiccups and a straggler", ranks, [randint(gen, 0, ranks - 1)], [], 2 * ranks),
            case("a dropped report", ranks, [], [1], 3, randint(gen, 2, ranks - 1)),
            # 3/8 of the ranks 1.3x slow: over 1.2x the median rank, under 1.2x the mean (a mean is pulled up)
            case("a slow group", ranks, sorted(torch.randperm(ranks, generator=gen)[:3 * ranks // 8].tolist()), [], 3,
                 slowdown=1.3),
            _hiccups_on_one_rank(gen, ranks),
            case("a slow rank that hangs", ranks, [slow := randint(gen, 0, ranks - 1)], [slow], 3)]  # hung, only


def _hiccups_on_one_rank(gen, ranks: int) -> Case:
    """One rank 3x slow on 8 of 40 steps: its mean is 1.4x the others', its median is not (no straggler)."""
    times = make_step_times(randint(gen, 0, 2**31), 40, ranks, hiccups=0)
    times[torch.randperm(40, generator=gen)[:8], randint(gen, 0, ranks - 1)] *= 3.0
    return Case(f"repeated hiccups on one rank: {ranks} ranks, 40 steps", dict(times=times))


def _find_stragglers_judge(case, obs):
    times, got = case.inputs["times"], obs["got"]
    want = ref_find_stragglers(times)
    if not isinstance(got, dict):
        return f"find_stragglers must return {{'stragglers': [...], 'hung': [...]}}, got {got}."
    if got["hung"] != want["hung"]:
        return (f"find_stragglers: hung = {got['hung']}, expected {want['hung']} for {case.name}: a rank that "
                f"reported nothing (NaN) for its last {HUNG_STEPS} steps is hung (dump its stack, restart it); one "
                "missing report (a NaN here and there, even the last step's) is a late log line, not a hang.")
    if got["stragglers"] != want["stragglers"]:
        means = torch.nanmean(times, dim=0)
        mean_rule = [r for r in range(times.shape[1]) if r not in want["hung"]
                     and float(means[r]) > STRAGGLER_FACTOR * float(torch.nanmedian(means))]
        message = (f"find_stragglers: stragglers = {got['stragglers']}, expected {want['stragglers']} for "
                   f"{case.name}: a straggler's median step time is over {STRAGGLER_FACTOR} x the median rank's.")
        if set(got["stragglers"]) & set(want["hung"]):
            message += (f" Rank {sorted(set(got['stragglers']) & set(want['hung']))[0]} is hung: report it once, as "
                        "hung (a hang needs a restart, a straggler a look at its node), not as a straggler too.")
        elif set(got["stragglers"]) < set(want["stragglers"]):
            message += (" Yours misses some: compare with the median of the ranks' medians, not their mean (a group "
                        "of slow ranks pulls a mean up).")
        elif got["stragglers"] == mean_rule or set(got["stragglers"]) > set(want["stragglers"]):
            message += (" Yours flags ranks with a one-off hiccup (a mean or a maximum): use each rank's median, "
                        "so only a rank slow step after step counts.")
        return message
    return None


# --- 12. a diverging run ------------------------------------------------------------------------------------

WINDOW, SPIKE = 20, 1.5


def ref_diagnose_divergence(trace: dict) -> dict:
    """first_spike: the first step from WINDOW on whose loss is NaN or over SPIKE x the median of the WINDOW steps
    before; first_nan (-1 if none); layer: at the last step up to the spike whose per-layer norms are finite, the
    layer whose gradient norm is largest relative to its own median before; batch: that step's batch id; cause:
    fp16_overflow if the loss scale fell 8x in the 10 steps before the first NaN, bad_batch if the loss is back
    under SPIKE x the median the step after the spike, else lr_too_high."""
    loss, norms = trace["loss"], trace["layer_grad_norm"]
    spike = next(t for t in range(WINDOW, len(loss))
                 if math.isnan(loss[t]) or loss[t] > SPIKE * float(torch.median(loss[t - WINDOW:t])))
    nans = torch.isnan(loss).nonzero()
    first_nan = int(nans[0]) if len(nans) else -1
    last = max(t for t in range(spike + 1) if torch.isfinite(norms[t]).all())
    layer = int(torch.argmax(norms[last] / torch.median(norms[:max(last, 1)], dim=0).values))
    scale = trace["loss_scale"]
    base = float(torch.median(loss[spike - WINDOW:spike]))
    if first_nan >= 0 and scale[first_nan] * 8 <= scale[max(0, first_nan - 10)]:
        cause = "fp16_overflow"
    elif spike + 1 < len(loss) and loss[spike + 1] <= SPIKE * base:
        cause = "bad_batch"
    else:
        cause = "lr_too_high"
    return {"first_spike": spike, "first_nan": first_nan, "layer": layer, "batch": int(trace["batch_id"][spike]),
            "cause": cause}


def _diagnose_divergence_cases(gen, public):
    def case(cause):
        seed = randint(gen, 0, 2**31)
        trace = {k: v for k, v in make_divergence_trace(seed, cause).items() if not k.startswith("_")}
        return Case(f"{cause}: a seeded trace of 200 steps", dict(trace=trace))
    cases = [case(cause) for cause in CAUSES]
    if not public:
        cases += [Case(f"{rule}: a seeded trace of 200 steps", dict(trace=_bad_batch_variant(gen, rule)))
                  for rule in ("a small loss spike", "a NaN from one bad batch")]
    return cases


def _spike_at(loss: torch.Tensor, yardstick) -> int:
    """The first step from WINDOW on whose loss is NaN or over SPIKE x ``yardstick(t)``."""
    return next((t for t in range(WINDOW, len(loss)) if math.isnan(loss[t]) or loss[t] > SPIKE * yardstick(t)), -1)


def _bad_batch_variant(gen, rule: str) -> dict:
    """A bad-batch trace whose spike only the right rules find: "a small loss spike" (1.51-1.55x the rolling
    median, two near-spikes just before it: the window's mean, or the median of the whole run so far, misses it),
    "a NaN from one bad batch" (the loss is NaN for one step, the loss scale steady: no fp16 overflow). In both the
    spiked layer is not the largest one (raw norms blame another)."""
    for _ in range(500):
        full = make_divergence_trace(randint(gen, 0, 2**31), "bad_batch")
        (t0, _), trace = full["_truth"], {k: v for k, v in full.items() if not k.startswith("_")}
        loss, norms = trace["loss"], trace["layer_grad_norm"]
        if int(norms[t0].argmax()) == int((norms[t0] / norms[:t0].median(0).values).argmax()):
            continue  # the spiked layer is also the largest one
        if rule == "a NaN from one bad batch":
            loss[t0] = float("nan")
            return trace
        for k in (3, 8):
            loss[t0 - k] = float(torch.median(loss[t0 - k - WINDOW:t0 - k])) * 1.45
        loss[t0] = float(torch.median(loss[t0 - WINDOW:t0])) * uniform(gen, 1.51, 1.55)
        mean = _spike_at(loss, lambda t: float(loss[t - WINDOW:t].mean()))
        whole = _spike_at(loss, lambda t: float(torch.median(loss[:t])))
        if ref_diagnose_divergence(trace)["first_spike"] == t0 and t0 not in (mean, whole):
            return trace
    raise RuntimeError(f"no trace for {rule!r}")


_DIVERGE_HINTS = {
    "first_spike": f"the first step t >= {WINDOW} whose loss is NaN or > {SPIKE} x median(loss[t-{WINDOW}:t])",
    "first_nan": "the first step whose loss is NaN, -1 if none",
    "layer": "at the last step up to the spike with finite per-layer norms, argmax of norm / that layer's median "
             "norm before (the layer that blew up first, relative to itself: big layers are not suspects)",
    "batch": "batch_id at the spike: the batch to replay",
    "cause": "fp16_overflow (loss scale down 8x in the 10 steps before the first NaN), bad_batch (the loss "
             "recovers the next step), else lr_too_high",
}


def _diagnose_divergence_judge(case, obs):
    want, got = ref_diagnose_divergence(case.inputs["trace"]), obs["got"]
    if not isinstance(got, dict):
        return f"diagnose_divergence must return a dict with {list(want)}, got {got}."
    for key, value in want.items():
        if key not in got:
            return f"diagnose_divergence must return the key {key!r}."
        if got[key] != value:
            return (f"diagnose_divergence: {key} = {got[key]!r}, expected {value!r} for {case.name}: "
                    f"{_DIVERGE_HINTS[key]}.")
    return None


# --- 13. MLOps: the checklist and the canary ------------------------------------------------------------------

MLOPS_REQUIRED = {
    "serving": {"latency_percentiles", "throughput", "gpu_utilization", "error_rate", "input_drift",
                "output_drift"},
    "training": {"loss_and_grad_norm", "per_rank_step_time", "checkpoint_health", "gpu_utilization"},
    "rollout": {"model_registry", "pinned_artifacts", "canary_slice", "compare_to_baseline", "automatic_rollback"},
}
MLOPS_HARMFUL = {"full_rollout_at_once", "mean_latency_only", "overwrite_in_place", "retrain_on_every_alert"}
# Items of another pipeline: a checklist that selects everything but the anti-patterns has not chosen.
MLOPS_OFF_TOPIC = {
    "serving": {"loss_and_grad_norm", "per_rank_step_time", "checkpoint_health"},
    "training": {"latency_percentiles", "canary_slice", "shadow_traffic", "automatic_rollback"},
    "rollout": {"loss_and_grad_norm", "per_rank_step_time", "checkpoint_health"},
}


def _error_limit(baseline: dict, canary: dict) -> float:
    """The baseline's error rate p plus 3 standard errors of the canary's rate, sqrt(p (1 - p) / n_canary)."""
    p = baseline["errors"] / baseline["requests"]
    return p + 3 * math.sqrt(max(p * (1 - p), 1e-12) / canary["requests"])


def ref_rollout_decision(baseline: dict, canary: dict, slo: dict) -> str:
    """``"wait"`` below slo['min_requests'] canary requests; ``"rollback"`` if the canary's p99 breaks
    slo['p99_ms'], its error rate exceeds the baseline's by more than 3 standard errors, or its input drift
    (PSI) is 0.25 or more; else ``"promote"``."""
    if canary["requests"] < slo["min_requests"]:
        return "wait"
    if canary["p99_ms"] > slo["p99_ms"] or canary["errors"] / canary["requests"] > _error_limit(baseline, canary) or \
            canary["psi"] >= 0.25:
        return "rollback"
    return "promote"


def _mlops_cases(gen, public):
    def canary(rule, base=(100_000, None), **changes):
        base = dict(requests=base[0], errors=base[1] or randint(gen, 50, 200), p99_ms=uniform(gen, 200, 400),
                    psi=0.02)
        can = dict(requests=randint(gen, 2000, 5000), errors=0, p99_ms=base["p99_ms"] * uniform(gen, 0.9, 1.1),
                   psi=uniform(gen, 0.0, 0.1))
        can["errors"] = round(can["requests"] * base["errors"] / base["requests"])
        can.update(changes)
        slo = dict(p99_ms=500.0, min_requests=1000)
        return Case(f"canary {rule}: a canary against its baseline", dict(baseline=base, canary=can, slo=slo))

    def errors_at(rule, k):
        """A canary erring at the baseline's rate p plus k of its standard errors (k = 1.5: noise, promote; k = 4.5:
        a real rise, rollback). With p n >= 25, a limit of 2 p or more misses the rise, one of 1.2 p or less flags
        the noise, and the standard error of the baseline's million requests (not the canary's) flags it too."""
        base_errors, n = randint(gen, 1000, 2000), randint(gen, 25_000, 50_000)
        p = base_errors / 1_000_000
        errors = (math.floor if k < 3 else math.ceil)(n * p + k * math.sqrt(p * (1 - p) * n))
        return canary(rule, (1_000_000, base_errors), requests=n, errors=errors)
    cases = [Case(f"checklist for {s}: what to select", dict(scenario=s)) for s in MLOPS_REQUIRED]
    cases += [canary("healthy"), canary("too few requests", requests=randint(gen, 50, 900)),
              errors_at("errors within noise", 1.5), errors_at("errors over 3 standard errors", 4.5),
              canary("latency over the target", p99_ms=uniform(gen, 520, 900)),
              canary("more errors", errors=randint(gen, 60, 120)), canary("input drift", psi=uniform(gen, 0.3, 0.6))]
    if not public:  # the limits themselves: 3 standard errors (not 2), PSI 0.25 (not 0.1), reached is breached
        cases += [errors_at("errors between 2 and 3 standard errors", 2.5),
                  canary("a mild drift", psi=uniform(gen, 0.12, 0.24)), canary("drift at the limit", psi=0.25)]
    return cases


def _mlops_judge(case, obs):
    x, got = case.inputs, obs["got"]
    if "scenario" in x:
        if not isinstance(got, list):
            return f"mlops_checklist must return a list of item ids from MLOPS_ITEMS, got {got}."
        unknown = [i for i in got if i not in MLOPS_ITEMS]
        missing = sorted(MLOPS_REQUIRED[x["scenario"]] - set(got))
        harmful = sorted(MLOPS_HARMFUL & set(got))
        off_topic = sorted(MLOPS_OFF_TOPIC[x["scenario"]] & set(got))
        if unknown:
            return f"mlops_checklist({x['scenario']!r}): unknown ids {unknown}; use the keys of MLOPS_ITEMS."
        if harmful:
            return (f"mlops_checklist({x['scenario']!r}) selects {harmful}: "
                    + "; ".join(MLOPS_ITEMS[i] for i in harmful) + " — each is an anti-pattern. Leave it out.")
        if off_topic:
            return (f"mlops_checklist({x['scenario']!r}) selects {off_topic}, which belong to another pipeline: "
                    + "; ".join(MLOPS_ITEMS[i] for i in off_topic) + ". Select what a "
                    f"{x['scenario']} pipeline needs, not every item that is not an anti-pattern.")
        if missing:
            return (f"mlops_checklist({x['scenario']!r}) misses {len(missing)} item(s) a {x['scenario']} pipeline "
                    "needs: " + "; ".join(MLOPS_ITEMS[i] for i in missing) + ".")
        return None
    want = ref_rollout_decision(x["baseline"], x["canary"], x["slo"])
    if got == want:
        return None
    c, b = x["canary"], x["baseline"]
    return (f"rollout_decision = {got!r}, expected {want!r} for {case.name}: canary {c['requests']} requests, "
            f"{c['errors']} errors ({c['errors'] / c['requests']:.3%} vs baseline {b['errors'] / b['requests']:.3%}), "
            f"p99 {c['p99_ms']:.0f} ms (target {x['slo']['p99_ms']:.0f}), PSI {c['psi']:.2f}; the error limit p + 3 "
            f"sqrt(p (1 - p) / n_canary) is {_error_limit(b, c):.3%}, not a fixed multiple of p. Too few requests: "
            "wait; an SLO, error-rate (over 3 standard errors) or drift (PSI >= 0.25) breach: rollback; else promote.")


# --- 15. fault-tolerant serving --------------------------------------------------------------------------------

def ref_p99_upper_bound(latencies, confidence: float = TAIL_CONFIDENCE) -> tuple[float, int, float]:
    """(the distribution-free upper confidence bound on the p99, its rank k, an also-accepted value): x_(k) for the
    least k with P(Binomial(n, 0.99) <= k - 1) >= confidence, or (inf, 0, inf) when no sample is one. Where that
    probability at k - 1 falls within 1e-9 under the confidence, x_(k-1) is accepted too (a sum in another order
    may land a hair over)."""
    xs, n, q = sorted(latencies), len(latencies), 0.99
    covered = 0.0
    for k in range(1, n + 1):
        i = k - 1
        covered += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                            + i * math.log(q) + (n - i) * math.log1p(-q))
        if covered >= confidence - 1e-9:
            if covered < confidence:  # a borderline rank: k + 1 by this sum, k by one a hair over
                return (xs[k] if k < n else math.inf), k + 1, xs[k - 1]
            return xs[k - 1], k, xs[k - 1]
    return math.inf, 0, math.inf


def _latency_sample(gen, n: int) -> list[float]:
    """``n`` latencies (s) with a heavy tail: a lognormal body, every 50th request 2-4x slower (a long prompt)."""
    body = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 0.3 - 1.2)  # (n,) around 0.3 s
    slow = 1 + (torch.rand(n, generator=gen, dtype=torch.float64) < 0.02) * (1 + 2 * torch.rand(n, generator=gen))
    return [round(float(v), 6) for v in body * slow]


def _p99_upper_bound_cases(gen, public):
    def case(rule, n, confidence):
        return Case(f"{rule}: {n} latencies, confidence {confidence}",
                    dict(latencies=_latency_sample(gen, n), confidence=confidence))

    if public:
        return [case("too few samples for a bound", 200, 0.95), case("just enough samples", 300, 0.95),
                case("a tail of many samples", 2000, 0.95)]
    return [case("too few samples for a bound", randint(gen, 20, 298), 0.95),
            case("just enough samples", randint(gen, 300, 400), 0.95),
            case("a tail of many samples", randint(gen, 1500, 4000), choice(gen, (0.9, 0.95))),
            case("a high confidence", randint(gen, 800, 3000), 0.99)]


def _p99_upper_bound_judge(case, obs):
    x, got = case.inputs, obs["got"]
    if not isinstance(got, float):
        return f"p99_upper_bound must return a float (math.inf when no sample is a bound), got {got!r}."
    want, k, also = ref_p99_upper_bound(x["latencies"], x["confidence"])
    if got in (want, also):
        return None
    xs, n = sorted(x["latencies"]), len(x["latencies"])
    p99 = percentile(xs, 99)
    message = f"p99_upper_bound = {got:.6g} s, expected {want:.6g} s for {case.name}."
    if want == math.inf:
        return (message + f" With {n} samples even the slowest is below the true p99 with probability 0.99^{n} = "
                f"{0.99 ** n:.3f} > 1 - {x['confidence']}: no sample bounds the p99, return math.inf (simulate more "
                "requests).")
    if close(got, p99, 1e-9):
        return (message + f" Yours is the sample p99, {n - math.ceil(0.99 * n)} samples from the top: it is "
                "below the true p99 about half the time. Take the order statistic x_(k) whose rank k covers the "
                "true p99 with the confidence asked.")
    rank = [i + 1 for i, v in enumerate(xs) if v == got]
    return (message + f" That is the sample of rank {rank[0] if rank else '(none)'}, the bound is rank {k} of {n}: the "
            "least k with P(Binomial(n, 0.99) <= k - 1) >= confidence.")


def ref_retry_load(p_error, max_retries, hedge_quantile=None, budget=None, *, bug: str = "") -> float:
    """Attempts per request: retries 1 + p + ... + p^r, hedges 1 - q more, a budget capping the total at 1 + b."""
    attempts = 1 + max_retries * p_error if bug == "linear" else sum(p_error ** i for i in range(max_retries + 1))
    if hedge_quantile is not None:
        attempts += hedge_quantile if bug == "hedge q" else 1 - hedge_quantile
    if budget is not None and bug != "no budget":
        attempts = min(attempts, 1 + budget)
    return attempts


_RETRY_VARIANTS = (("linear", "1 + r p: a retry can fail too, so the attempts are 1 + p + p^2 + ... + p^r"),
                   ("hedge q", "a hedge for q of the requests: only those slower than the q-quantile, 1 - q, get one"),
                   ("no budget", "no retry budget: it caps the extra attempts at budget x the requests"))


def _retry_load_cases(gen, public):
    def case(rule, p, r, q=None, b=None):
        return Case(f"{rule}: p_error {p}, {r} retries, hedge at {q}, budget {b}",
                    dict(p_error=p, max_retries=r, hedge_quantile=q, budget=b))

    if public:
        return [case("retries on rare failures", 0.05, 3), case("an outage with one retry", 1.0, 1),
                case("hedged at the p95", 0.01, 2, 0.95), case("a budget in an outage", 1.0, 3, None, 0.1)]
    return [case("retries on rare failures", round(uniform(gen, 0.01, 0.3), 3), randint(gen, 2, 5)),
            case("an outage with one retry", 1.0, 1),
            case("hedged at a quantile", round(uniform(gen, 0.0, 0.05), 3), randint(gen, 1, 3),
                 choice(gen, (0.9, 0.95, 0.99))),
            case("a budget in an outage", 1.0, randint(gen, 2, 4), choice(gen, (0.9, 0.95)),
                 choice(gen, (0.05, 0.1, 0.2)))]


def _retry_load_judge(case, obs):
    x, got = case.inputs, obs["got"]
    if not isinstance(got, float):
        return f"retry_load must return a float, got {got!r}."
    want = ref_retry_load(**x)
    if close(got, want, 1e-9):
        return None
    message = (f"retry_load = {got:.6g} attempts per request, expected {want:.6g} for {case.name}: retries 1 + p + "
               "... + p^max_retries, a hedge for the 1 - q slowest, the budget capping the total at 1 + budget.")
    return diagnose(message, got, [(label, lambda bug=bug: ref_retry_load(**x, bug=bug)) for bug, label in
                                   _RETRY_VARIANTS], lambda g, w: close(g, w, 1e-9), _YOURS)


MAX_FT_REPLICAS = 32


def _upper(spec, cluster, work, tp, replicas, max_batch, n_requests=TAIL_SAMPLES) -> float:
    return ref_p99_upper_bound(replica_latencies(spec, cluster, work, tp, replicas, max_batch,
                                                 n_requests=n_requests))[0]


@lru_cache(maxsize=16)
def ref_plan_fault_tolerant(spec, work, cluster, tp, max_batch) -> int:
    """The fewest replicas (bisection in 2..MAX_FT_REPLICAS) whose p99 upper bound meets the target with one down;
    ``work.rate`` already holds the load factor."""
    lo, hi = 2, MAX_FT_REPLICAS
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _upper(spec, cluster, work, tp, mid - 1, max_batch) <= work.p99_s else (mid + 1, hi)
    return lo


def _plan_fault_tolerant_cases(gen, public):
    def case(rule, spec, work, tp, max_batch, factor):
        return Case(f"{rule}: {spec.name} at {work.rate:g} requests/s x {factor:g} load, prompts {work.prompt_len}, "
                    f"outputs {work.new_tokens}, p99 < {work.p99_s:g} s, TP={tp}, max_batch {max_batch}",
                    dict(spec=RUN._plain(spec), work=RUN._plain(work), cluster=RUN._plain(H100.with_gpus(512)), tp=tp,
                         max_batch=max_batch, load_factor=factor))

    if public:
        return [case("the interview's case", GPT3_175B, SERVE_175B, 8, 256, 1.0),
                case("retries that double the load", GPT3_175B, dataclasses.replace(SERVE_175B, rate=50.0), 8, 256,
                     2.0)]
    rate = float(choice(gen, (60, 80, 120)))
    return [case("175B at another rate", GPT3_175B, dataclasses.replace(SERVE_175B, rate=rate), 8, 256,
                 choice(gen, (1.0, 1.05, 1.1))),
            case("retries that double the load", GPT3_175B, dataclasses.replace(SERVE_175B, rate=rate / 2), 8, 256,
                 2.0),
            case("a 70B model in fp16", MODELS["Llama-2-70B"], Workload(float(choice(gen, (20, 30))), (128, 1024),
                                                                        (8, 32), 1.0, 2.0, 2.0), 4, 64, 1.0)]


def _plan_fault_tolerant_judge(case, obs):
    x, got = case.inputs, obs["plan"]
    keys = ("replicas", "upper_all", "upper_one_down", "max_unavailable")
    if not isinstance(got, dict) or not all(k in got for k in keys) or not isinstance(got["replicas"], int) or \
            not isinstance(got["max_unavailable"], int) or not 2 <= got["replicas"] <= MAX_FT_REPLICAS:
        return (f"plan_fault_tolerant must return {{'replicas': int in 2..{MAX_FT_REPLICAS}, 'upper_all': float, "
                f"'upper_one_down': float, 'max_unavailable': int}}, got {got}.")
    spec, cluster, tp, batch = RUN._spec(x["spec"]), RUN._cluster(x["cluster"]), x["tp"], x["max_batch"]
    work = RUN._work(x["work"])
    offered = dataclasses.replace(work, rate=work.rate * x["load_factor"])
    r = got["replicas"]

    def upper(n, w=offered):  # the p99 upper bound of n replicas at load w
        return _upper(spec, cluster, w, tp, n, batch)

    if upper(r - 1) > work.p99_s:
        message = (f"plan_fault_tolerant: {r} replicas for {case.name}; with one down the other {r - 1} take the whole "
                   f"load and their p99 upper bound ({TAIL_SAMPLES} requests, {TAIL_CONFIDENCE:.0%} confidence) is "
                   f"{upper(r - 1):.3f} s, over the {work.p99_s:g} s target.")
        reported = got["upper_one_down"]
        short = simulate_replicas(spec, cluster, offered, tp, r - 1, batch)["p99"]
        sample = percentile(replica_latencies(spec, cluster, offered, tp, r - 1, batch, n_requests=TAIL_SAMPLES), 99)
        if isinstance(reported, float) and (close(reported, short, 1e-9) or close(reported, sample, 1e-9)):
            message += (f" Yours judged it by a sample p99 ({reported:.3f} s): the p99 of 300 simulated requests rests "
                        "on 3 samples, and even that of TAIL_SAMPLES is below the true p99 half the time. Judge the "
                        "plan by p99_upper_bound of TAIL_SAMPLES requests.")
        elif x["load_factor"] > 1 and isinstance(reported, float) and close(reported, upper(r - 1, work), 1e-9):
            message += (f" It would meet it at {work.rate:g} requests/s: size the replicas for rate x load_factor "
                        f"({x['load_factor']:g}), the attempts retries and hedges send.")
        elif upper(r) <= work.p99_s:
            message += (" With all of them up it meets the target: the plan has no spare replica. Size it N+1: the "
                        "target must hold with replicas - 1.")
        return message
    best = ref_plan_fault_tolerant(spec, offered, cluster, tp, batch)
    if r > SERVE_SLACK * best:
        return (f"plan_fault_tolerant uses {r} replicas; {best} already meet p99 < {work.p99_s:g} s with one down "
                f"for {case.name}. Search for the fewest.")
    for key, n in (("upper_all", r), ("upper_one_down", r - 1)):
        want = upper(n)
        if not isinstance(got[key], float) or not close(got[key], want, 1e-9):
            message = (f"plan_fault_tolerant: {key} = {got[key]!r}, expected {want:.6g} s, the p99 upper bound of "
                       f"{n} replicas for {case.name} (p99_upper_bound of replica_latencies(..., n_requests="
                       f"{TAIL_SAMPLES}) at rate x load_factor).")
            if isinstance(got[key], float) and close(got[key], percentile(replica_latencies(
                    spec, cluster, offered, tp, n, batch, n_requests=TAIL_SAMPLES), 99), 1e-9):
                message += " Yours is the sample p99: report the upper bound."
            return message
    unavailable = 1
    while unavailable + 1 < r and upper(r - unavailable - 1) <= work.p99_s:
        unavailable += 1
    if got["max_unavailable"] != unavailable:
        message = (f"plan_fault_tolerant: max_unavailable = {got['max_unavailable']}, expected {unavailable} for "
                   f"{r} replicas ({case.name}).")
        if got["max_unavailable"] > unavailable:
            message += (f" A rolling upgrade that takes {got['max_unavailable']} out leaves "
                        f"{r - got['max_unavailable']} replicas, whose p99 upper bound is "
                        f"{upper(r - got['max_unavailable']):.3f} s: it drops below the target for the whole upgrade.")
        else:
            message += " Count how many can be out at once with the target still met (every v in 1..u)."
        return message
    return None


def ref_place_replicas(nodes, replicas, tp, gpu) -> list | None:
    """Replicas spread over the eligible nodes (right GPU, tp free), one per node, the emptiest rack first."""
    racks = {}
    for node in nodes:
        if node["gpu"] == gpu and node["free"] >= tp:
            racks.setdefault(node["rack"], []).append(node["name"])
    placed, used = [], dict.fromkeys(racks, 0)
    for _ in range(replicas):
        open_racks = [r for r in racks if used[r] < len(racks[r])]
        if not open_racks:
            return None
        rack = min(open_racks, key=lambda r: used[r])
        placed.append(racks[rack][used[rack]])
        used[rack] += 1
    return placed


def _fullest_rack(nodes, names) -> int:
    rack = {n["name"]: n["rack"] for n in nodes}
    counts = {}
    for name in names:
        counts[rack[name]] = counts.get(rack[name], 0) + 1
    return max(counts.values(), default=0)


def _eligible(nodes, tp, gpu) -> int:
    return sum(n["gpu"] == gpu and n["free"] >= tp for n in nodes)


def _place_replicas_cases(gen, public):
    def case(rule, seed, racks, per_rack, replicas, tp, gpu):
        nodes = make_fleet(seed, racks, per_rack)
        return Case(f"{rule}: {replicas} replicas of TP={tp} on {gpu} over {racks} racks of {per_rack} nodes",
                    dict(nodes=nodes, replicas=replicas, tp=tp, gpu=gpu, control=None))

    def too_many(seed, gpu):
        """One replica more than the fleet's eligible nodes, with a control of as many as it holds: an answer that
        always says None fails the control."""
        while _eligible(make_fleet(seed, 2, 4), 8, gpu) < 2:
            seed += 1
        fits = _eligible(make_fleet(seed, 2, 4), 8, gpu)
        out = case("more replicas than nodes", seed, 2, 4, fits + 1, 8, gpu)
        return dataclasses.replace(out, inputs=dict(out.inputs, control=fits))

    if public:
        return [case("whole nodes", 0, 6, 8, 13, 8, "H100"), case("half nodes", 3, 4, 4, 6, 4, "A100"),
                too_many(1, "H100")]
    seed = randint(gen, 0, 10_000)
    return [case("whole nodes", seed, 6, 8, randint(gen, 6, 10), 8, "H100"),
            case("half nodes", seed + 1, 4, 6, randint(gen, 4, 8), choice(gen, (2, 4)), "A100"),
            case("racks of different sizes", seed + 2, 3, 8, randint(gen, 5, 8), 4, "H100"),
            too_many(seed + 3, choice(gen, ("H100", "A100")))]


def _place_replicas_judge(case, obs):
    x = case.inputs
    if ref_place_replicas(x["nodes"], x["replicas"], x["tp"], x["gpu"]) is None:
        if obs["got"] is not None:
            return (f"place_replicas: the fleet of {case.name} has {_eligible(x['nodes'], x['tp'], x['gpu'])} "
                    f"{x['gpu']} nodes with {x['tp']} free GPUs, fewer than {x['replicas']} replicas: return None, "
                    f"got {obs['got']}.")
        return _judge_placement(case, x["nodes"], x["control"], x["tp"], x["gpu"], obs["control"])
    return _judge_placement(case, x["nodes"], x["replicas"], x["tp"], x["gpu"], obs["got"])


def _judge_placement(case, nodes, replicas, tp, gpu, got) -> str | None:
    """What is wrong with ``got``, a placement of ``replicas`` replicas the fleet can hold, or None."""
    if not isinstance(got, list) or len(got) != replicas:
        return f"place_replicas must return a list of {replicas} node names for {case.name}, got {got!r}."
    by_name = {n["name"]: n for n in nodes}
    for name in got:
        node = by_name.get(name)
        if node is None:
            return f"place_replicas placed a replica on {name!r}, which is not a node of the fleet."
        if node["gpu"] != gpu:
            return (f"place_replicas put a {gpu} replica on {name}, a {node['gpu']} node: a replica's weights and "
                    f"kernels are built for one GPU kind; place it on {gpu} nodes only.")
        if node["free"] < tp:
            return (f"place_replicas put a replica of TP={tp} on {name}, which has {node['free']} free GPUs: a "
                    "replica lives inside one node (its all-reduces on NVLink) with tp free GPUs.")
    if len(set(got)) < len(got):
        twice = sorted({name for name in got if got.count(name) > 1})
        return (f"place_replicas puts two replicas on one node ({', '.join(twice)}): one node failure would take "
                "both, and N+1 covers one. One replica per node.")
    fullest, least = _fullest_rack(nodes, got), _fullest_rack(nodes, ref_place_replicas(nodes, replicas, tp, gpu))
    if fullest > least:
        return (f"place_replicas puts {fullest} replicas in one rack, where {least} is possible for {case.name}: a "
                "rack (its switch, its power) fails as one, so spread the replicas over the racks, the emptiest "
                "rack first.")
    return None


def ref_failover_cost(spec, cluster, work, tp, in_flight, health, rate_per_replica, *, bug: str = "") -> dict:
    """Detection after ``failures`` probes, the requests misrouted meanwhile, the caches rebuilt by prefill
    (prompt and generated tokens, compute-bound), the worst request's delay, and a planned drain's time."""
    def prefill(tokens):
        if bug == "prefill memory-bound":
            return spec.n_params * work.weight_bytes / (tp * cluster.hbm_bytes_per_s)
        return 2 * spec.n_params * tokens / (tp * cluster.peak_flops * cluster.mfu)

    detect = health["interval_s"] * (1 if bug == "one probe" else health["failures"])
    contexts = [p if bug == "prompt only" else p + g for p, g, _ in in_flight]
    step = replica_step_time(spec, tp, cluster, work, 0, len(in_flight))
    left = [new if bug == "drain whole output" else new - g for _, g, new in in_flight]
    return {"detect_s": detect, "misrouted": rate_per_replica * detect, "reprefill_s": prefill(sum(contexts)),
            "worst_added_s": detect + prefill(max(contexts)), "drain_s": max(left) * step}


_FAILOVER_HINTS = {
    "detect_s": "interval_s x failures: the balancer marks a replica down after that many failed probes in a row.",
    "misrouted": "rate_per_replica x detect_s: its share keeps coming until it is marked down.",
    "reprefill_s": "2 x n_params x (prompt + generated tokens, summed over the in-flight requests) / (tp x peak_flops "
                   "x mfu).",
    "worst_added_s": "detect_s + the re-prefill of the longest context (prompt + generated).",
    "drain_s": "max(max_new_tokens - generated) decode steps of replica_step_time(spec, tp, cluster, work, 0, "
               "len(in_flight)).",
    "_variants": (("one probe", "detection after one failed probe: the balancer waits for `failures` in a row"),
                  ("prompt only", "the prompt alone: the generated tokens' keys and values died with the cache too"),
                  ("prefill memory-bound", "prefill as memory-bound: a prompt's tokens share each weight read, so "
                   "its FLOPs set the time"),
                  ("drain whole output", "the whole output: a drained request only finishes its remaining tokens")),
}


def _failover_cost_cases(gen, public):
    def case(rule, spec, work, tp, n, health, rate):
        in_flight = [(r.prompt_len, r.max_new_tokens // 2, r.max_new_tokens)
                     for r in make_trace(randint(gen, 0, 10_000), n, 1.0, work.prompt_len, work.new_tokens)]
        return Case(f"{rule}: {spec.name}, TP={tp}, {n} requests in flight, probes every {health['interval_s']} s, "
                    f"down after {health['failures']}, {rate:g} requests/s per replica",
                    dict(spec=RUN._plain(spec), cluster=RUN._plain(H100.with_gpus(512)), work=RUN._plain(work), tp=tp,
                         in_flight=in_flight, health=health, rate_per_replica=rate))

    if public:
        return [case("the interview's case", GPT3_175B, SERVE_175B, 8, 32, {"interval_s": 1.0, "failures": 3}, 8.0),
                case("a 70B model", MODELS["Llama-2-70B"], Workload(20.0, (128, 1024), (8, 32), 1.0, 2.0, 2.0), 4, 16,
                     {"interval_s": 5.0, "failures": 2}, 4.0)]
    return [case("175B", GPT3_175B, SERVE_175B, 8, randint(gen, 8, 64),
                 {"interval_s": choice(gen, (0.5, 1.0, 2.0)), "failures": randint(gen, 2, 5)},
                 float(randint(gen, 4, 12))),
            case("a 70B model", MODELS["Llama-2-70B"], Workload(20.0, (128, 1024), (8, 32), 1.0, 2.0, 2.0),
                 choice(gen, (4, 8)), randint(gen, 4, 32), {"interval_s": choice(gen, (2.0, 5.0)),
                                                            "failures": randint(gen, 2, 4)}, float(randint(gen, 2, 8)))]


def _failover_cost_judge(case, obs):
    x = case.inputs
    args = (RUN._spec(x["spec"]), RUN._cluster(x["cluster"]), RUN._work(x["work"]), x["tp"],
            [tuple(r) for r in x["in_flight"]], x["health"], x["rate_per_replica"])
    return _judge_numbers("failover_cost", obs["got"], ref_failover_cost(*args),
                          lambda bug: ref_failover_cost(*args, bug=bug), _FAILOVER_HINTS, case)


# --- 16. benchmark design and performance CI --------------------------------------------------------------------

def ref_benchmark_problems(design: dict) -> list[str]:
    """The BENCH_RULES a design breaks, sorted."""
    broken = {"time_to_accuracy": design["metric"] != "time_to_accuracy",
              "end_to_end": not set(STAGES) <= set(design["timed"]),
              "tuned_baseline": design["cpu_library"] != "tuned" or design["cpu_threads"] < design["cpu_cores"],
              "same_data": design["data"]["cpu"] != design["data"]["gpu"],
              "same_hyperparameters": design["hparams"]["cpu"] != design["hparams"]["gpu"],
              "repeats_with_ci": design["repeats"] < MIN_RUNS or design["report"] != "mean_with_ci",
              "cost": not design["cost"]}
    return sorted(rule for rule, bad in broken.items() if bad)


_WORKLOADS = ({"data": "criteo-1tb", "hparams": {"batch": 512, "lr": 0.2, "max_epochs": 40}, "repeats": 10},
              {"data": "imagenet-1k", "hparams": {"batch": 256, "lr": 0.1, "max_epochs": 90}, "repeats": 6})


def _fair_template(cores: int, workload: int = 0) -> dict:
    """A design that breaks no rule; ``workload`` 1 differs from 0 in every field a rule leaves free."""
    w = _WORKLOADS[workload]
    return {"metric": "time_to_accuracy", "timed": list(STAGES if workload == 0 else reversed(STAGES)),
            "cpu_library": "tuned", "cpu_threads": cores + 16 * workload, "cpu_cores": cores + 16 * workload,
            "data": {"cpu": w["data"], "gpu": w["data"]}, "hparams": {"cpu": dict(w["hparams"]),
                                                                      "gpu": dict(w["hparams"])},
            "repeats": w["repeats"], "report": "mean_with_ci", "cost": True}


def _unfair(gen, rule: str, cores: int, workload: int = 0) -> dict:
    """The fair template with the mistake a published comparison makes against ``rule``."""
    d = _fair_template(cores, workload)
    if rule == "time_to_accuracy":
        d["metric"] = choice(gen, ("time_per_epoch", "peak_throughput"))
    elif rule == "end_to_end":
        d["timed"] = choice(gen, (["compute"], ["compute", "device_to_host"], ["data_loading", "compute"]))
    elif rule == "tuned_baseline":
        d.update(choice(gen, ({"cpu_threads": 1}, {"cpu_library": "naive"}, {"cpu_threads": cores // 2})))
    elif rule == "same_data":
        d["data"] = dict(d["data"], gpu=d["data"]["cpu"] + "-subsample-10pct")
    elif rule == "same_hyperparameters":
        d["hparams"]["gpu"] = dict(d["hparams"]["gpu"], **choice(gen, ({"batch": 8192}, {"max_epochs": 20},
                                                                       {"lr": 1.6})))
    elif rule == "repeats_with_ci":
        d.update(choice(gen, ({"repeats": 1, "report": "single_run"}, {"report": "best_run"},
                              {"repeats": MIN_RUNS - 2}, {"report": "mean"})))
    elif rule == "cost":
        d["cost"] = False
    return d


def _benchmark_design_cases(gen, public):
    cores = choice(gen, (32, 64, 96))

    def review(rule, design):
        """The design, and a control of the other verdict on another workload (no near copy of the design, whose
        differences would point at the broken rule): an answer that always flags nothing, or always the same
        rules, fails every review."""
        control = _fair_template(cores, 1)
        if rule.startswith("a fair"):
            control = _unfair(gen, choice(gen, list(BENCH_RULES)), cores, 1)
        return Case(f"{rule}: a design to review", dict(design=design, control=control))

    cases = [Case(f"a fair design of your own: {cores} CPU cores", dict(cores=cores))]
    rules = list(BENCH_RULES)
    if public:
        return cases + [review(f"one unfair choice ({rule})", _unfair(gen, rule, cores))
                        for rule in ("end_to_end", "tuned_baseline", "repeats_with_ci")] + [
            review("a typical published speed-up", dict(_fair_template(cores), metric="time_per_epoch",
                                                        timed=["compute"], cpu_threads=1, repeats=1,
                                                        report="best_run", cost=False))]
    cases += [review(f"one unfair choice ({rule})", _unfair(gen, rule, cores)) for rule in rules]
    two = torch.randperm(len(rules), generator=gen)[:2].tolist()
    design = _unfair(gen, rules[two[0]], cores)
    other = _unfair(gen, rules[two[1]], cores)
    design.update({k: v for k, v in other.items() if v != _fair_template(cores)[k]})
    return cases + [review("two unfair choices", design), review("a fair design", _fair_template(cores))]


def _benchmark_design_judge(case, obs):
    x = case.inputs
    if "cores" in x:
        return _judge_fair_design(x["cores"], obs["got"])
    return _judge_review(case, x["design"], obs["got"]) or _judge_review(case, x["control"], obs["control"])


def _judge_fair_design(cores: int, got) -> str | None:
    if not isinstance(got, dict) or not set(DESIGN_FIELDS) <= set(got):
        missing = sorted(set(DESIGN_FIELDS) - set(got)) if isinstance(got, dict) else list(DESIGN_FIELDS)
        return f"fair_benchmark({cores}) must return a dict of every DESIGN_FIELDS key; missing {missing}."
    try:
        broken = ref_benchmark_problems(got)
    except (KeyError, TypeError) as exc:
        return f"fair_benchmark({cores}) returned a design its fields cannot be read from ({exc!r}): {got}."
    if broken:
        return f"fair_benchmark({cores}) breaks {broken}: " + "; ".join(BENCH_RULES[r] for r in broken) + "."
    return None


def _judge_review(case, design: dict, got) -> str | None:
    if not isinstance(got, list):
        return f"benchmark_problems must return a sorted list of BENCH_RULES ids, got {got!r}."
    want = ref_benchmark_problems(design)
    if sorted(got) == want:
        return None
    missed, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    message = f"benchmark_problems = {got}, expected {want} for {case.name}."
    if missed:
        message += " It misses: " + "; ".join(f"{r} ({BENCH_RULES[r]})" for r in missed) + "."
    if extra:
        message += f" The design keeps {extra}: flag only the rules it breaks."
    return message


def _slower_and_noise(base: list, runs: list) -> tuple[float, float, float]:
    """(m_c - m_b, 3 standard errors of that difference, m_b): sample means and variances (n - 1)."""
    b, c = torch.tensor(base, dtype=torch.float64), torch.tensor(runs, dtype=torch.float64)
    return float(c.mean() - b.mean()), 3 * math.sqrt(float(b.var()) / len(b) + float(c.var()) / len(c)), float(b.mean())


def ref_ci_gate(baseline: dict, candidate: dict) -> dict:
    """Per candidate SKU: no_baseline, rerun, regression (over 3 standard errors and MIN_EFFECT) or pass."""
    verdicts = {}
    for sku, runs in candidate.items():
        base = baseline.get(sku, [])
        if len(base) < MIN_RUNS:
            verdicts[sku] = "no_baseline"
        elif len(runs) < MIN_RUNS:
            verdicts[sku] = "rerun"
        else:
            slower, noise, mean = _slower_and_noise(base, runs)
            verdicts[sku] = "regression" if slower > noise and slower > MIN_EFFECT * mean else "pass"
    return verdicts


_SKU_MEANS = {"H100": 0.8, "A100": 1.6, "L4": 4.0}  # seconds per benchmark run, an example


def _ci_gate_cases(gen, public):
    def runs(sku, shift=0.0, n=10, cv=None, mean=None):
        return make_runs(randint(gen, 0, 10**6), (mean or _SKU_MEANS[sku]) * (1 + shift), cv or SKU_NOISE[sku], n)

    def case(rule, candidate, baseline=None):
        baseline = baseline or {sku: runs(sku) for sku in _SKU_MEANS}
        return Case(f"{rule}: candidate runs on {sorted(candidate)}", dict(baseline=baseline, candidate=candidate))

    n = randint(gen, 8, 12)
    cases = [
        case("no change on any SKU", {sku: runs(sku, 0.0, n) for sku in _SKU_MEANS}),
        # 3% on a 1%-noise SKU: beyond 3 standard errors (about 1.3%) and 1%; a fixed 5% passes it
        case("a real regression on a quiet SKU", {"H100": runs("H100", uniform(gen, 0.025, 0.035), n)}),
        # 6-7% on an 8%-noise SKU: within 3 standard errors (about 10%); a fixed 5% fails it
        case("a shift within a noisy SKU's noise", {"L4": runs("L4", uniform(gen, 0.06, 0.07), n)}),
        case("a single candidate run", {"A100": runs("A100", uniform(gen, 0.1, 0.3), 1)}),
        case("a SKU without a baseline of its own", {"L40S": runs("L4", uniform(gen, -0.2, 0.2), n, 0.02, 2.0)}),
        case("a speed-up", {"A100": runs("A100", -uniform(gen, 0.1, 0.2), n)}),
    ]
    if not public:
        # 0.6% on a 0.3%-noise SKU with 30 runs a side: significant, under MIN_EFFECT
        quiet = {"H100": make_runs(randint(gen, 0, 10**6), 0.8, 0.003, 30)}
        others = {s: runs(s) for s in ("A100", "L4")}
        cases.append(case("a significant change under the minimum effect", {"H100": runs("H100", 0.006, 30, 0.003)},
                          dict(quiet, **others)))
        cases.append(case("every SKU at its own speed, one regressed",
                          {"H100": runs("H100", 0.0, n), "A100": runs("A100", 0.08, n), "L4": runs("L4", 0.0, n)}))
    return cases


def _ci_gate_judge(case, obs):
    x, got = case.inputs, obs["got"]
    want = ref_ci_gate(x["baseline"], x["candidate"])
    if got == want:
        return None
    if not isinstance(got, dict):
        return f"ci_gate must return {{sku: verdict}} for every candidate SKU, got {got!r}."
    sku = next((s for s in want if got.get(s) != want[s]), None)
    if sku is None:
        return f"ci_gate returned verdicts for SKUs the candidate did not run: {sorted(set(got) - set(want))}."
    cand, base = x["candidate"][sku], x["baseline"].get(sku, [])
    message = f"ci_gate: {sku} is {got.get(sku)!r}, expected {want[sku]!r} for {case.name}."
    if want[sku] == "no_baseline":
        return message + (f" There is no baseline of {MIN_RUNS} runs on {sku}: another SKU's runs say nothing about "
                          "this one (compare each SKU with its own baseline only).")
    if want[sku] == "rerun":
        return message + (f" The candidate has {len(cand)} run(s) on {sku}: one run is noise, not evidence. Ask for "
                          f"at least MIN_RUNS = {MIN_RUNS}.")
    slower, noise, mean = _slower_and_noise(base, cand)
    message += (f" The candidate is {slower / mean:+.1%} against {sku}'s own baseline; 3 standard errors of the "
                f"difference are {noise / mean:.1%} and MIN_EFFECT {MIN_EFFECT:.0%}: a regression needs both, "
                "m_c - m_b > 3 sqrt(s_b^2 / n_b + s_c^2 / n_c) and > MIN_EFFECT x m_b.")
    pooled = [t for runs in x["baseline"].values() for t in runs]
    fixed = "regression" if slower > 0.05 * mean else "pass"
    if got.get(sku) == fixed:
        message += (" Yours matches a fixed 5% threshold, which " + ("passes this real regression on a quiet SKU."
                    if want[sku] == "regression" else "fails this SKU on its own noise."))
    if got.get(sku) == ref_ci_gate({sku: pooled}, {sku: cand})[sku]:
        message += (f" Yours matches a comparison with every SKU's baseline runs pooled: compare {sku} with its own "
                    "baseline only.")
    if want[sku] == "pass" and slower < 0:
        message += " It is faster: a speed-up passes."
    return message


# --- the exercises: titles and hints, then the declarations ----------------------------------------

_TEXT = {
    "training_memory": dict(
        title="Memory per GPU: weights, gradients, optimizer by ZeRO stage, activations",
        hint=(
            "(2 + 2 + 12) bytes per parameter of n_params / (tp * pp), the ZeRO stage dividing optimizer "
            "(1+), gradients (2+), weights (3) by dp; activations pp x ceil(L/pp) layers x 34 s b h / tp (2 s"
            " b h / tp + one layer's 34 s b h / tp with recompute).")),
    "step_time": dict(
        title="Modelled step time: compute, TP/PP/DP communication, the bubble",
        hint=(
            "Sum compute, the TP all-reduces, the PP sends, the bubble (pipelined work x (pp-1)/m) and the DP"
            " gradient all-reduce; each group's alpha and bandwidth from group_link.")),
    "layout_problems": dict(
        title="Feasibility: accept the published layouts, reject the impossible",
        hint=(
            "A list of reasons: dp*tp*pp != n_gpus, tp > gpus_per_node, heads % tp, pp > layers, batch % (dp "
            f"* micro_batch), memory total > {HEADROOM} x gpu_bytes.")),
    "plan_training": dict(
        title="The planner: the fastest layout that fits, checked against published runs",
        hint=(
            "Loop over tp in divisors of gpus_per_node, pp in divisors of n_gpus // tp, micro_batch in (1, 2,"
            " 4, 8), zero in 0..3, recompute in (False, True); skip layouts with problems; keep the least "
            "step_time; explain it in a sentence with its numbers.")),
    "moe_training_memory": dict(
        title="Mixture of experts: memory per GPU with the experts sharded over EP",
        hint=(
            "training_memory of the dense part (n_params = spec.dense_params), plus (2, 2, 12) bytes per "
            "parameter of expert_params / (tp * pp * ep), ZeRO dividing them by dp // ep.")),
    "moe_step_time": dict(
        title="Mixture of experts: the step time with the expert all-to-alls",
        hint=(
            "step_time at n_params = active_params, plus ceil(L/pp) m (4 or 6) all-to-alls of s b top_k h 2 "
            "bytes over ep ranks (group_link(cluster, tp, ep)) in the bubble; DP: dense gradients over dp, "
            "expert gradients over dp // ep.")),
    "moe_layout_problems": dict(
        title="Mixture of experts: which EP layouts can run",
        hint=(
            "A dense model: layout_problems plus a reason when ep > 1. MoE: layout_problems on the dense part, "
            "dp % ep, num_experts % ep, and moe_training_memory's total against the headroom.")),
    "plan_moe_training": dict(
        title="Mixture of experts: the planner with EP in its search",
        hint=(
            "plan_training's loops plus ep over the divisors of dp that divide num_experts; skip layouts with "
            "moe_layout_problems; keep the least moe_step_time total.")),
    "serving_memory": dict(
        title="Serving memory per GPU: weights and the KV cache",
        hint=(
            "weights = n_params x weight_bytes / tp; kv = batch x context x 2 x n_layers x ceil(n_kv_heads / "
            "tp) x head_dim x kv_bytes.")),
    "plan_serving": dict(
        title="Serving capacity: 175B at 100 requests/s with p99 under 500 ms",
        hint=(
            "For each tp dividing the node whose weights fit: the largest batch whose KV cache fits beside "
            "them, then the fewest replicas whose simulate_replicas p99 meets the target; keep the fewest "
            "GPUs.")),
    "prefill_decode_split": dict(
        title="Prefill and decode: TTFT, TPOT, mixed or disaggregated replicas",
        hint=(
            "Prefill compute-bound (2 N p / (tp peak mfu)), decode memory-bound ((N wb + B kv_token max_context / "
            "2) / (tp hbm)), KV transfer over the network (inter_alpha + p kv_token / tp / inter_bw), replicas = "
            "ceil(load / SERVE_UTILISATION), the p99 TTFT from fcfs_pool on the seeded trace.")),
    "four_gpu_options": dict(
        title="A 7B model on 4 GPUs: TP vs PP vs replicas",
        hint=(
            "t1, t4 = replica_step_time(spec, 1 or 4, ...); TP: n x t4 and batch / t4; PP: cycle = 4 (t1 / 4 "
            "+ hop), n x cycle and 4 batch / cycle; replicas: n x t1 and 4 batch / t1.")),
    "resnet_batch": dict(
        title="ResNet-152 serving: the batch a latency target allows",
        hint=(
            "For b in 1..256: run = t_fixed + b t_per_item; latency = (b - 1) / rate + run; keep the largest "
            "b with latency <= slo and b / run >= rate (batch 0 if none).")),
    "diagnose_deployment": dict(
        title="A slow multi-GPU deployment: imbalance, network, host or copies?",
        hint=(
            "First compare the ranks' kernel times (max over 1.5x the median: stage_imbalance, and its rank); then "
            "the mean shares of the step time: nccl > 0.4, cpu gaps > 0.3, memcpy > 0.2; else compute.")),
    "checkpoint_interval": dict(
        title="How often to checkpoint: Young/Daly",
        hint='The job fails when any GPU does: M = gpu_mtbf_s / n_gpus; interval = sqrt(2 C M).'),
    "reshard_zero": dict(
        title="Elastic restart: re-shard a ZeRO checkpoint to a new world size",
        hint=(
            "cat the old shards, keep the first numel elements, zero-pad to new_world x ceil(numel / "
            "new_world), and cut into new_world equal shards.")),
    "find_stragglers": dict(
        title="A straggler or a hung rank, from per-rank step times",
        hint=(
            f"hung: isnan(times[-{HUNG_STEPS}:, r]).all(); stragglers: nanmedian over steps per rank > "
            f"{STRAGGLER_FACTOR} x the median of those medians, hung ranks left out.")),
    "diagnose_divergence": dict(
        title="Debugging a diverging run: where to look",
        hint=(
            "Find the first spike against a rolling median, the first NaN, the layer whose gradient norm grew"
            " most against its own history, the batch id, then name the cause from the loss scale and whether"
            " the loss recovers.")),
    "mlops": dict(
        title="MLOps: what to monitor, how to roll out, when to roll back",
        hint=(
            "Select every item a scenario needs and no anti-pattern; rollout: wait below min_requests, "
            "rollback on p99 > target, error rate > baseline + 3 standard errors, or PSI >= 0.25.")),
    "p99_upper_bound": dict(
        title="Fault tolerance: a confidence bound on a simulated p99",
        hint=(
            "Sort; the count of samples below the true p99 is Binomial(n, 0.99): return the k-th smallest for the "
            "least k with P(Binomial(n, 0.99) <= k - 1) >= confidence; math.inf when no k <= n reaches it.")),
    "retry_load": dict(
        title="Fault tolerance: the load retries and hedged requests add",
        hint="1 + p + ... + p^max_retries attempts, plus 1 - hedge_quantile for hedges, capped at 1 + budget."),
    "plan_fault_tolerant": dict(
        title="Fault tolerance: N+1 replicas on the p99 bound, at the retried load, and rolling upgrades",
        hint=(
            "At rate x load_factor, upper(r) = p99_upper_bound(replica_latencies(..., r, ..., n_requests="
            "TAIL_SAMPLES)); the fewest R with upper(R - 1) <= p99_s (bisect 2..32); max_unavailable: the most u "
            "with upper(R - v) <= p99_s for every v in 1..u.")),
    "place_replicas": dict(
        title="Fault tolerance: failure domains on a mixed fleet of 8-GPU nodes",
        hint=(
            "Nodes of the right GPU with tp free GPUs, one replica per node, each replica in the rack holding the "
            "fewest so far; None when the nodes run out.")),
    "failover_cost": dict(
        title="Fault tolerance: health checks, the KV cache lost on failover, draining",
        hint=(
            "detect = interval x failures; misrouted = rate x detect; re-prefill prompt + generated tokens at 2 N t / "
            "(tp peak mfu); worst = detect + the longest re-prefill; drain = max tokens left x one decode step.")),
    "benchmark_design": dict(
        title="Benchmark design: a fair CPU vs GPU comparison, and the flaws of unfair ones",
        hint=(
            "fair_benchmark: every DESIGN_FIELDS key, no BENCH_RULES rule broken; benchmark_problems: one test per "
            "rule (metric, stages timed, tuned CPU on every core, same data, same hparams, repeats and CI, cost).")),
    "ci_gate": dict(
        title="Performance CI: a per-SKU gate that knows its noise",
        hint=(
            "Per SKU: no baseline of MIN_RUNS runs: no_baseline; fewer than MIN_RUNS candidate runs: rerun; regression "
            "if m_c - m_b > 3 sqrt(s_b^2 / n_b + s_c^2 / n_c) and > MIN_EFFECT x m_b; else pass.")),
}


# Points, in notebook order; each section defines _<id>_cases, _<id>_run and _<id>_judge.
_POINTS = dict(training_memory=3, step_time=3, layout_problems=2, plan_training=4, moe_training_memory=2,
               moe_step_time=3, moe_layout_problems=2, plan_moe_training=3, serving_memory=2, plan_serving=4,
               prefill_decode_split=3, four_gpu_options=2, resnet_batch=2, diagnose_deployment=2, checkpoint_interval=1,
               reshard_zero=2, find_stragglers=2, diagnose_divergence=3, mlops=3, p99_upper_bound=2, retry_load=2,
               plan_fault_tolerant=4, place_replicas=3, failover_cost=3, benchmark_design=3, ci_gate=3)
_ENTRIES = {"mlops": ("mlops_checklist", "rollout_decision"),
            "benchmark_design": ("fair_benchmark", "benchmark_problems")}  # names other than the exercise id

# The helpers lab 16's setup imports: its answers may call these, and no other gpulab function or class.
OFFERED = ("gpulab.setup", "gpulab.feedback.check", "gpulab.bench.percentile", "gpulab.planning.Cluster",
           "gpulab.planning.Layout", "gpulab.planning.MoESpec", "gpulab.planning.Workload",
           "gpulab.planning.all_to_all_time", "gpulab.planning.fcfs_pool", "gpulab.planning.group_link",
           "gpulab.planning.kv_bytes_per_token", "gpulab.planning.make_fleet", "gpulab.planning.replica_latencies",
           "gpulab.planning.replica_step_time", "gpulab.perfci.make_runs",
           "gpulab.planning.ring_allreduce_time", "gpulab.planning.simulate_replicas",
           "gpulab.reliability.make_divergence_trace", "gpulab.reliability.make_profile",
           "gpulab.reliability.make_step_times", "gpulab.serving.ModelSpec", "gpulab.serving.make_trace")

EXERCISES = [offering(Exercise(eid, points, _ENTRIES.get(eid, (eid,)), neutral(globals()[f"_{eid}_cases"]),
                               getattr(RUN, f"_{eid}_run"), globals()[f"_{eid}_judge"], **_TEXT[eid]), OFFERED)
             for eid, points in _POINTS.items()]
BENCHMARKS: list = []
