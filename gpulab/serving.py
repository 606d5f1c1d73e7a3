"""Serving an LLM, as data: real model shapes, request traces and a simulated server (lesson 14).

- :class:`ModelSpec` and :data:`MODELS`: the shapes that decide KV-cache bytes and step costs of
  published models (from their public configs: Llama 2, Mistral, Falcon, Llama 3).
- :class:`Request` and :func:`make_trace`: a seeded arrival trace (Poisson arrivals, random prompt
  and output lengths).
- :func:`simulate`: a server loop around any scheduler with ``add(request)`` and ``step() -> ids``
  (lab 14's continuous-batching scheduler, or the lesson's static batcher). It keeps the truth
  (tokens generated per request), refuses a batch that breaks the memory budget, and advances a
  simulated clock by ``step_time(prefill_tokens, decode_seqs)``, a function the lab calibrates on
  the learner's measured decode step. :func:`summarize` turns a run into throughput and latency
  percentiles.

Semantics of a step (lesson 14): each request in the batch processes the tokens whose keys and
values are not cached (its whole prompt and output so far when it was not in the previous batch: a
prefill; else one token: a decode) and generates one token. During the step it holds
``ceil(tokens / block_size)`` KV blocks, ``tokens = prompt_len + generated`` at the start of the step.
A request that was in the previous batch but not in this one is *preempted*: its cache is dropped and
recomputed when it comes back. A request leaves after generating ``max_new_tokens`` tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gpulab.bench import percentile


@dataclass(frozen=True)
class ModelSpec:
    """What serving cost depends on: layers, widths, heads (query and key/value) and parameter count."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_params: float

    @property
    def attention(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else f"GQA ({self.n_heads // self.n_kv_heads} query heads per KV head)"


MODELS = {s.name: s for s in [
    ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 128, 6.74e9),
    ModelSpec("Llama-2-13B", 40, 5120, 40, 40, 128, 13.0e9),
    ModelSpec("Llama-2-70B", 80, 8192, 64, 8, 128, 69.0e9),
    ModelSpec("Mistral-7B", 32, 4096, 32, 8, 128, 7.24e9),
    ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 8.03e9),
    ModelSpec("Falcon-7B", 32, 4544, 71, 1, 64, 7.2e9),
]}


@dataclass(frozen=True)
class Request:
    """A request arriving at ``arrival`` (seconds, or steps) with a prompt of ``prompt_len`` tokens,
    asking for ``max_new_tokens`` tokens."""

    rid: int
    arrival: float
    prompt_len: int
    max_new_tokens: int


def make_trace(seed: int, n: int, rate: float, prompt_len=(16, 256), new_tokens=(16, 256)) -> list[Request]:
    """``n`` requests with Poisson arrivals (``rate`` per second) and prompt and output lengths drawn
    uniformly from the inclusive ranges given, all from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    gaps = -torch.log1p(-torch.rand(n, generator=gen, dtype=torch.float64)) / rate  # exponential gaps
    arrivals = torch.cumsum(gaps, 0) - gaps[0]                                     # the first at t = 0
    prompts = torch.randint(prompt_len[0], prompt_len[1] + 1, (n,), generator=gen)
    outs = torch.randint(new_tokens[0], new_tokens[1] + 1, (n,), generator=gen)
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outs[i])) for i in range(n)]


class BudgetExceeded(RuntimeError):
    """A scheduler chose a batch that does not fit (blocks or batch size), or an impossible one."""


@dataclass
class SimResult:
    """One simulated run: per request ``arrival``, ``first_token`` and ``finish`` times; per step its
    ``(start, batch size, blocks used, prefill tokens)``; how many preemptions happened."""

    requests: dict = field(default_factory=dict)   # rid -> {"arrival", "first_token", "finish", "tokens"}
    steps: list = field(default_factory=list)      # (start time, batch size, blocks, prefill tokens)
    preemptions: int = 0
    clock: float = 0.0


def simulate(scheduler, requests: list[Request], step_time, num_blocks: int, block_size: int, max_batch: int,
             max_steps: int = 1_000_000) -> SimResult:
    """Serve ``requests`` with ``scheduler`` (``add(request)``, ``step() -> list of request ids``) on a
    simulated clock: before each step, every request that has arrived is added; the step takes
    ``step_time(prefill_tokens, decode_seqs)`` seconds. Raises :class:`BudgetExceeded` on a batch over
    ``max_batch`` or ``num_blocks``, with an unknown or finished id, or empty while requests wait."""
    pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
    by_id = {r.rid: r for r in pending}
    res = SimResult(requests={r.rid: {"arrival": r.arrival, "first_token": None, "finish": None, "tokens": 0}
                              for r in pending})
    generated = {r.rid: 0 for r in pending}
    added, resident, done = 0, set(), 0
    for _ in range(max_steps):
        if done == len(pending):
            return res
        while added < len(pending) and pending[added].arrival <= res.clock:
            scheduler.add(pending[added])
            added += 1
        live = [r.rid for r in pending[:added] if generated[r.rid] < r.max_new_tokens]
        if not live:  # idle until the next arrival
            res.clock = pending[added].arrival
            continue
        batch = list(scheduler.step())
        _validate(batch, by_id, generated, added, pending, num_blocks, block_size, max_batch, res.clock)
        tokens = {rid: by_id[rid].prompt_len + generated[rid] for rid in batch}
        prefill = sum(n for rid, n in tokens.items() if rid not in resident)
        res.preemptions += len(resident - set(batch))
        res.steps.append((res.clock, len(batch), sum(-(-n // block_size) for n in tokens.values()), prefill))
        res.clock += step_time(prefill, len(batch) - sum(rid not in resident for rid in batch))
        resident = set()
        for rid in batch:
            generated[rid] += 1
            row = res.requests[rid]
            row["tokens"] = generated[rid]
            if row["first_token"] is None:
                row["first_token"] = res.clock
            if generated[rid] == by_id[rid].max_new_tokens:
                row["finish"] = res.clock
                done += 1
            else:
                resident.add(rid)
    raise BudgetExceeded(f"not finished after {max_steps} steps")


def _validate(batch, by_id, generated, added, pending, num_blocks, block_size, max_batch, clock):
    arrived = {r.rid for r in pending[:added]}
    if not batch:
        raise BudgetExceeded(f"t={clock:.4g}: the scheduler returned an empty batch while requests wait")
    if len(set(batch)) != len(batch):
        raise BudgetExceeded(f"t={clock:.4g}: a request appears twice in the batch {batch}")
    for rid in batch:
        if rid not in arrived:
            raise BudgetExceeded(f"t={clock:.4g}: request {rid!r} has not arrived (or does not exist)")
        if generated[rid] >= by_id[rid].max_new_tokens:
            raise BudgetExceeded(f"t={clock:.4g}: request {rid} already finished; retire it")
    if len(batch) > max_batch:
        raise BudgetExceeded(f"t={clock:.4g}: {len(batch)} requests in the batch, max_batch is {max_batch}")
    blocks = sum(math.ceil((by_id[rid].prompt_len + generated[rid]) / block_size) for rid in batch)
    if blocks > num_blocks:
        raise BudgetExceeded(f"t={clock:.4g}: the batch needs {blocks} KV blocks, the budget is {num_blocks}")


def summarize(res: SimResult) -> dict:
    """Throughput (generated tokens per second of the run) and latency percentiles of a run: end-to-end
    latency (arrival to last token) and time to first token (TTFT), p50 and p99, in seconds."""
    rows = [r for r in res.requests.values() if r["finish"] is not None]
    latency = [r["finish"] - r["arrival"] for r in rows]
    ttft = [r["first_token"] - r["arrival"] for r in rows]
    start = min(r["arrival"] for r in res.requests.values())
    return {"throughput": sum(r["tokens"] for r in rows) / (res.clock - start),
            "p50": percentile(latency, 50), "p99": percentile(latency, 99),
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "mean_batch": sum(s[1] for s in res.steps) / len(res.steps), "preemptions": res.preemptions}
