"""Planning a training or serving deployment on paper: hardware, layouts and the costs earlier labs taught
(lesson 16, the capstone).

- :class:`Cluster`: what a machine offers (GPUs, memory, an assumed TFLOP/s and MFU, HBM bandwidth, the
  alpha-beta figures of the links inside a node and between nodes). :data:`CLUSTERS` holds the two
  clusters of the published runs below; their numbers are datasheet figures, labelled as such.
- :class:`Layout`: a training layout, DP x TP x PP (and EP, expert parallelism inside the DP group), with the
  microbatch size, the ZeRO stage and activation recomputation.
- :class:`MoESpec`: a mixture-of-experts model (every layer's MLP is ``num_experts`` SwiGLU experts, ``top_k``
  of them per token); :data:`MIXTRAL_8X7B` holds Mixtral's shape, :func:`all_to_all_time` prices its token
  exchange on the alpha-beta model. :data:`PUBLISHED` holds layouts published runs used, with their sources;
  :data:`GPT3_175B_ASSUMED` the interview's 175B case, whose layout is an assumption.
- The building blocks of earlier labs, as plain formulas: :func:`ring_allreduce_time` (lab 11's alpha-beta
  model of a ring), :func:`bubble_fraction` (lab 13's ``(p-1)/(m+p-1)``), :func:`group_link` (which link
  a process group's ring crosses, from the rank order TP fastest, then DP, then PP, as Megatron-LM orders
  them), :func:`kv_bytes_per_token` (lab 14's cache).
- Serving on paper: :func:`replica_step_time` (one step of a TP-sharded replica on the roofline, plus its
  per-layer all-reduces) and :func:`simulate_replicas` (a seeded trace split round-robin over replicas, each
  served by :func:`gpulab.serving.simulate`, batching the oldest requests; lab 14's scheduler is yours);
  :func:`replica_latencies`, the same run's latency samples, for a confidence bound on its tail.
- Prefill and decode apart: :func:`fcfs_pool` (a first-come-first-served queue over identical servers, the
  disaggregated prefill replicas) and :data:`SERVE_UTILISATION`, the busy share a replica is sized for.
- Fault-tolerant serving: :data:`TAIL_SAMPLES` and :data:`TAIL_CONFIDENCE` (how a simulated p99 is bounded) and
  :func:`make_fleet` (a seeded, heterogeneous mix of 8-GPU nodes in racks, for placing replicas).

All sizes are bytes, times seconds, rates per second; the functions take and return Python floats.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from gpulab.datasheet import H100_FP16_FLOPS, H100_HBM_BYTES, H100_HBM_BYTES_PER_S, H100_NVLINK_BYTES_PER_S
from gpulab.serving import ModelSpec, make_trace, simulate, summarize


@dataclass(frozen=True)
class Cluster:
    """``n_gpus`` GPUs in nodes of ``gpus_per_node``: per GPU ``gpu_bytes`` of memory, ``peak_flops`` (dense
    bf16) reached at ``mfu`` (model FLOPs utilisation, an assumption), ``hbm_bytes_per_s``; links as
    alpha (latency, s) and bandwidth (bytes/s per GPU, one direction) inside a node and between nodes."""

    name: str
    n_gpus: int
    gpus_per_node: int
    gpu_bytes: float
    peak_flops: float
    mfu: float
    hbm_bytes_per_s: float
    intra_alpha: float
    intra_bytes_per_s: float
    inter_alpha: float
    inter_bytes_per_s: float

    def with_gpus(self, n_gpus: int) -> "Cluster":
        return replace(self, n_gpus=n_gpus)


@dataclass(frozen=True)
class Layout:
    """A training layout: ``dp * tp * pp`` GPUs; each DP replica runs ``global_batch / (dp * micro_batch)``
    microbatches of ``micro_batch`` sequences per step; ZeRO ``zero`` (0-3) shards model states over DP;
    ``recompute`` keeps only each layer's input and recomputes the rest in the backward pass."""

    dp: int
    tp: int
    pp: int
    micro_batch: int = 1
    zero: int = 0
    recompute: bool = False
    ep: int = 1

    def __str__(self) -> str:
        return (f"DP={self.dp} x TP={self.tp} x PP={self.pp}{f' (EP={self.ep} inside DP)' if self.ep > 1 else ''}, "
                f"microbatch {self.micro_batch}, ZeRO-{self.zero}{', recompute' if self.recompute else ''}")


@dataclass(frozen=True)
class MoESpec(ModelSpec):
    """A mixture-of-experts model: every layer's MLP is ``num_experts`` SwiGLU experts of width ``expert_hidden``
    (``3 d_model expert_hidden`` parameters each) and each token goes to ``top_k`` of them. ``n_params`` counts
    everything; the experts' share is sharded over EP, the rest (attention, embeddings, router) is dense."""

    num_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 14336

    @property
    def expert_params(self) -> float:
        return self.n_layers * self.num_experts * 3 * self.d_model * self.expert_hidden

    @property
    def dense_params(self) -> float:
        return self.n_params - self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token passes through: the dense part and ``top_k`` experts per layer."""
        return self.dense_params + self.expert_params * self.top_k / self.num_experts


# Datasheet figures (A100 SXM 80 GB and H100 SXM), one NIC per GPU; MFU is an assumption.
CLUSTERS = {c.name: c for c in [
    Cluster("A100-80GB x 1024 (Selene-like, HDR InfiniBand)", 1024, 8, 80e9, 312e12, 0.45, 2.0e12,
            2e-6, 300e9, 8e-6, 25e9),
    Cluster("H100-80GB x 8192 (RoCE 400G)", 8192, 8, H100_HBM_BYTES, H100_FP16_FLOPS, 0.40, H100_HBM_BYTES_PER_S,
            2e-6, H100_NVLINK_BYTES_PER_S, 8e-6, 50e9),
]}

# Model shapes of the published runs (from their papers and configs).
GPT3_175B = ModelSpec("GPT-3-175B", 96, 12288, 96, 96, 128, 175e9)
LLAMA3_405B = ModelSpec("Llama-3-405B", 126, 16384, 128, 8, 128, 405e9)

# Mixtral 8x7B (Jiang et al., 'Mixtral of Experts', arXiv:2401.04088; its released config): 46.7B parameters,
# 12.9B active per token.
MIXTRAL_8X7B = MoESpec("Mixtral-8x7B", 32, 4096, 32, 8, 128, 46.7e9, num_experts=8, top_k=2, expert_hidden=14336)

# A GPT of 145.6B parameters (Narayanan et al., Table 1: 96 heads, hidden 12288, 80 layers; 12 h^2 L weights plus a
# 51,200-token embedding make its 145.6B).
GPT_145B = ModelSpec("GPT-145.6B", 80, 12288, 96, 96, 128, 145.6e9)

# Published training layouts: (model, sequence length, global batch in sequences, cluster, layout, source). The
# microbatch, ZeRO stage and recomputation are not in the tables: each row's are the planner's assumptions.
PUBLISHED = {
    "GPT 145.6B (Megatron-LM)": (GPT_145B, 2048, 2304,
                                 CLUSTERS["A100-80GB x 1024 (Selene-like, HDR InfiniBand)"].with_gpus(1536),
                                 Layout(dp=24, tp=8, pp=8, micro_batch=1, zero=0, recompute=True),
                                 "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters "
                                 "Using Megatron-LM', SC 2021 (arXiv:2104.04473), Table 1: 145.6B parameters, TP 8, "
                                 "PP 8, 1536 GPUs, batch 2304, sequence 2048"),
    "Llama 3 405B (Meta)": (LLAMA3_405B, 8192, 2048, CLUSTERS["H100-80GB x 8192 (RoCE 400G)"],
                            Layout(dp=64, tp=8, pp=16, micro_batch=1, zero=1, recompute=True),
                            "Llama Team, 'The Llama 3 Herd of Models' (arXiv:2407.21783), Table 4: 8192 GPUs, "
                            "TP 8, CP 1, PP 16, DP 64, sequence 8192, 32 sequences per DP rank"),
}

# The interview's training case, GPT-3 175B on 1024 A100s at batch 1536: the GPU count and batch are those of
# Narayanan et al.'s Section 5.1 estimate of GPT-3's training time, which states no layout. The layout here is an
# assumption (the TP 8 x PP 8 of their 145.6B row), not a published one.
GPT3_175B_ASSUMED = (GPT3_175B, 2048, 1536, CLUSTERS["A100-80GB x 1024 (Selene-like, HDR InfiniBand)"],
                     Layout(dp=16, tp=8, pp=8, micro_batch=1, zero=0, recompute=True),
                     "an assumption: Narayanan et al. (arXiv:2104.04473), Section 5.1, estimate GPT-3 175B's training "
                     "time on 1024 GPUs at batch 1536 and state no layout; TP 8 x PP 8 is their 145.6B row's")


def ring_allreduce_time(nbytes: float, p: int, alpha: float, bytes_per_s: float) -> float:
    """Lab 11's ring all-reduce: ``2(p-1) alpha + 2 (p-1)/p n / bandwidth``; 0 for one rank."""
    return 0.0 if p <= 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / bytes_per_s


def all_to_all_time(nbytes: float, p: int, alpha: float, bytes_per_s: float) -> float:
    """An all-to-all of ``nbytes`` per rank over ``p`` ranks, pairwise: each rank keeps 1/p and sends the rest,
    ``(p-1) alpha + (p-1)/p n / bandwidth``; 0 for one rank (MoE token dispatch and combine)."""
    return 0.0 if p <= 1 else (p - 1) * alpha + (p - 1) / p * nbytes / bytes_per_s


def bubble_fraction(p: int, m: int) -> float:
    """Lab 13's idle share of a GPipe/1F1B pipeline of ``p`` stages and ``m`` microbatches."""
    return (p - 1) / (m + p - 1)


def group_link(cluster: Cluster, stride: int, size: int) -> tuple[float, float]:
    """``(alpha, bytes_per_s)`` of a process group of ``size`` ranks ``stride`` apart: inside one node when
    ``stride * size <= gpus_per_node`` (NVLink), else across nodes (the network)."""
    if stride * size <= cluster.gpus_per_node:
        return cluster.intra_alpha, cluster.intra_bytes_per_s
    return cluster.inter_alpha, cluster.inter_bytes_per_s


def kv_bytes_per_token(spec: ModelSpec, dtype_bytes: float) -> float:
    """Lab 14's cache per token: K and V, per layer, per key/value head: ``2 L n_kv d_head dtype_bytes``."""
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * dtype_bytes


# --- serving on paper ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """Online serving traffic: Poisson arrivals at ``rate`` per second, prompt and output lengths uniform
    in the inclusive ranges, an end-to-end ``p99_s`` target, weight and KV-cache bytes per value."""

    rate: float
    prompt_len: tuple
    new_tokens: tuple
    p99_s: float
    weight_bytes: float = 1.0
    kv_bytes: float = 1.0

    @property
    def max_context(self) -> int:
        return self.prompt_len[1] + self.new_tokens[1]


def replica_step_time(spec: ModelSpec, tp: int, cluster: Cluster, work: Workload, prefill_tokens: int,
                      decode_seqs: int) -> float:
    """One step of a replica sharded ``tp`` ways inside a node: the roofline's max(FLOPs at ``mfu`` of peak,
    bytes at HBM bandwidth) over ``tp`` GPUs, plus 2 all-reduces per layer of the step's activations.
    FLOPs: 2 per parameter and token; bytes: the weights once, plus the cache of the decoding sequences
    (each at half the maximum context, on average)."""
    tokens = prefill_tokens + decode_seqs
    flops = 2 * spec.n_params * tokens
    nbytes = spec.n_params * work.weight_bytes + decode_seqs * kv_bytes_per_token(spec, work.kv_bytes) * \
        work.max_context / 2
    roof = max(flops / (cluster.peak_flops * cluster.mfu), nbytes / cluster.hbm_bytes_per_s) / tp
    alpha, bw = group_link(cluster, 1, tp)
    return roof + 2 * spec.n_layers * ring_allreduce_time(tokens * spec.d_model * 2, tp, alpha, bw)


class _OldestFirst:
    """The batcher of :func:`simulate_replicas`: each step the ``max_batch`` oldest live requests. Its replicas
    hold KV blocks for ``max_batch`` sequences of the maximum context, so memory never stops a batch there and
    first come, first served reduces to this (a memory budget that binds is lab 14's exercise)."""

    def __init__(self, max_batch: int):
        self.max_batch, self.live, self.left = max_batch, [], {}  # requests oldest first; rid -> tokens to go

    def add(self, request) -> None:
        self.live.append(request)
        self.left[request.rid] = request.max_new_tokens

    def step(self) -> list:
        batch = self.live[:self.max_batch]
        for r in batch:
            self.left[r.rid] -= 1
        self.live = [r for r in self.live if self.left[r.rid] > 0]
        return [r.rid for r in batch]


def simulate_replicas(spec: ModelSpec, cluster: Cluster, work: Workload, tp: int, replicas: int, max_batch: int,
                      n_requests: int = 300, seed: int = 0, block_size: int = 16) -> dict:
    """p50/p99 end-to-end latency (s) and time to first token of ``n_requests`` seeded requests, dealt
    round-robin to ``replicas`` replicas of ``tp`` GPUs, each continuous-batching up to ``max_batch``
    sequences (KV blocks for ``max_batch`` sequences of the maximum context). ``summarize``'s keys.
    Runs are remembered: asking twice for the same plan costs one simulation."""
    work = replace(work, prompt_len=tuple(work.prompt_len), new_tokens=tuple(work.new_tokens))
    return dict(_simulate(spec, cluster, work, tp, replicas, max_batch, n_requests, seed, block_size)[0])


def replica_latencies(spec: ModelSpec, cluster: Cluster, work: Workload, tp: int, replicas: int, max_batch: int,
                      n_requests: int = 300, seed: int = 0, block_size: int = 16) -> list[float]:
    """The end-to-end latencies (s, ascending) of :func:`simulate_replicas`'s requests, one per request: the samples
    a tail bound is computed from (section 15). Remembered as :func:`simulate_replicas`'s runs are."""
    work = replace(work, prompt_len=tuple(work.prompt_len), new_tokens=tuple(work.new_tokens))
    return list(_simulate(spec, cluster, work, tp, replicas, max_batch, n_requests, seed, block_size)[1])


@lru_cache(maxsize=256)
def _simulate(spec, cluster, work, tp, replicas, max_batch, n_requests, seed, block_size) -> tuple[dict, tuple]:
    trace = make_trace(seed, n_requests, work.rate, work.prompt_len, work.new_tokens)
    blocks = max_batch * math.ceil(work.max_context / block_size)
    step = lambda prefill, decode: replica_step_time(spec, tp, cluster, work, prefill, decode)  # noqa: E731
    runs = [simulate(_OldestFirst(max_batch), trace[r::replicas], step, blocks, block_size,
                     max_batch) for r in range(replicas)]
    merged = runs[0]
    for run in runs[1:]:
        merged.requests.update(run.requests)
        merged.steps += run.steps
        merged.clock = max(merged.clock, run.clock)
    latencies = tuple(sorted(r["finish"] - r["arrival"] for r in merged.requests.values()))
    return summarize(merged), latencies

# The interview's serving case: 175B at 100 requests/s, p99 under 500 ms end to end, fp8 weights and cache.
SERVE_175B = Workload(rate=100, prompt_len=(64, 512), new_tokens=(8, 24), p99_s=0.5, weight_bytes=1.0, kv_bytes=1.0)

# Replicas are sized to be busy at most this share of the time on average: queues stay short (an assumption).
SERVE_UTILISATION = 0.7


def fcfs_pool(arrivals: list, services: list, servers: int) -> list[float]:
    """Seconds from arrival to the end of service of each request (in the order given, arrivals ascending),
    served first come first served by ``servers`` identical servers, each request by the first one free:
    the queue in front of disaggregated prefill replicas."""
    free = [0.0] * servers  # when each server is next free (a heap)
    out = []
    for arrival, service in zip(arrivals, services):
        start = max(arrival, heapq.heappop(free))
        heapq.heappush(free, start + service)
        out.append(start + service - arrival)
    return out


# --- fault-tolerant serving (section 15) -------------------------------------------------------------

# A p99 is judged by an upper confidence bound from this many simulated requests (20 of them beyond the p99), at
# this confidence: 300 requests leave 3 samples past the p99, too few to tell a 494 ms p99 from a 520 ms one.
TAIL_SAMPLES = 2000
TAIL_CONFIDENCE = 0.95


def make_fleet(seed: int, racks: int = 4, nodes_per_rack: int = 4, gpus=("H100", "A100"),
               idle: float = 0.6) -> list[dict]:
    """A heterogeneous fleet of 8-GPU nodes, as placement sees it: ``{"name", "rack", "gpu", "free"}`` per node,
    ``gpu`` drawn from ``gpus``, ``free`` (GPUs not yet taken) 8 for an ``idle`` share of the nodes and 0-7 for the
    others, all from the seed; racks are the failure domains above a node (a top-of-rack switch or a power feed
    takes every node in it)."""
    gen = torch.Generator().manual_seed(seed)
    fleet = []
    for r in range(racks):
        for n in range(nodes_per_rack):
            gpu = gpus[int(torch.randint(len(gpus), (1,), generator=gen))]
            busy = float(torch.rand(1, generator=gen)) >= idle
            free = int(torch.randint(0, 8, (1,), generator=gen)) if busy else 8
            fleet.append({"name": f"rack{r}-node{n}", "rack": f"rack{r}", "gpu": gpu, "free": free})
    return fleet
