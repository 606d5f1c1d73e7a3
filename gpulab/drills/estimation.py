"""Checked estimation: quick-fire napkin-math questions with numeric answers, each checked within a stated relative
tolerance, the worked solution shown after the answer (drills notebook of lesson 16).

Every expected value is computed here by the formula the solution shows, from stated inputs; datasheet figures come
from :mod:`gpulab.datasheet` or, where it lacks one, from :data:`EXTRA_FIGURES` below, each with its source. A
tolerance is relative (``0.25`` is ±25%), so an answer off by a factor of 2 always fails, and each question says
whether mixing GB and GiB stays inside it. The optional 30-second timer is shown, never judged.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Callable

from gpulab import datasheet as ds
from gpulab.drills.units import DIMENSION_NAMES, UNITS, parse_quantity

QUICK_S = 30  # the timer's target per question: shown beside the verdict, never part of it

# Figures gpulab.datasheet does not carry, with their sources.
IB_NDR_BITS_PER_S = 400e9      # one NDR InfiniBand port (NVIDIA ConnectX-7 datasheet: 400 Gb/s)
PCIE5_X16_BYTES_PER_S = 64e9   # one direction of PCIe Gen5 x16 (H100 SXM datasheet: 128 GB/s both directions)
A100_HBM_BYTES_PER_S = 2.039e12  # A100 80GB SXM datasheet: HBM2e bandwidth
EXTRA_FIGURES = {"IB_NDR_BITS_PER_S": "NVIDIA ConnectX-7 datasheet, one NDR port",
                 "PCIE5_X16_BYTES_PER_S": "H100 SXM datasheet, PCIe Gen5 128 GB/s over both directions",
                 "A100_HBM_BYTES_PER_S": "A100 80GB SXM datasheet, HBM2e"}
DATASHEET = "H100 SXM datasheet"


@dataclass(frozen=True)
class Given:
    """One stated input: its name in the formula, its value in base units (bytes, s, FLOP), how it is shown."""

    name: str
    value: float
    unit: str = ""      # the unit it is shown in (a key of units.UNITS), "" for a plain count
    source: str = ""    # where the figure comes from (datasheet, model config, an assumption)

    def shown(self) -> str:
        return human(self.value, self.unit)


@dataclass(frozen=True)
class Estimate:
    """A quick-fire question: ``text`` with ``{name}`` for each :class:`Given`; ``formula`` a Python expression over
    the givens' names giving the answer in base units; ``unit`` the unit the answer is asked in; ``tol`` relative."""

    qid: str
    topic: str
    text: str
    givens: tuple
    formula: str
    unit: str
    tol: float = 0.25
    why: str = ""

    @property
    def value(self) -> float:
        """The expected answer in base units, by the formula."""
        names = {g.name: g.value for g in self.givens}
        return eval(self.formula, {"__builtins__": {}, "sqrt": math.sqrt}, names)  # our own formula strings

    @property
    def answer(self) -> float:
        """The expected answer in the question's unit."""
        return self.value / UNITS[self.unit][1]

    def prompt(self) -> str:
        shown = {g.name: g.shown() for g in self.givens}
        asks = {"x": "Answer as a ratio (like 2.5x)", "": "Answer as a plain number"}
        ask = asks.get(self.unit, f"Answer in {self.unit}")
        return f"{self.text.format(**shown)} {ask}; {self.tolerance_note()}"

    def tolerance_note(self) -> str:
        note = f"within ±{self.tol:.0%}."
        sibling = _binary_sibling(self.unit)
        if sibling:
            apart = _apart(self.unit, sibling)
            inside = "inside the tolerance, so either is accepted" if apart <= self.tol else \
                "outside the tolerance, so write the unit you mean"
            note += f" {self.unit} and {sibling} differ by {apart:.1%}: {inside}."
        return note

    def solution(self) -> str:
        """The worked solution: the formula, the inputs substituted, the result, and why."""
        shown = {g.name: g.shown() for g in self.givens}
        substituted = re.sub(r"\b[a-z_][a-z0-9_]*\b", lambda m: shown.get(m.group(0), m.group(0)), self.formula)
        by_source: dict[str, list[str]] = {}
        for g in self.givens:
            if g.source:
                by_source.setdefault(g.source, []).append(f"{g.name} = {g.shown()}")
        sources = "; ".join(f"{', '.join(names)} ({source})" for source, names in by_source.items())
        lines = [f"{self.formula}", f"= {substituted}", f"= {human(self.value, self.unit)}"]
        if self.why:
            lines.append(self.why)
        if sources:
            lines.append(f"Inputs: {sources}.")
        return "\n".join(lines)


def _binary_sibling(unit: str) -> str | None:
    """GiB for GB, GB for GiB (the mix-up the tolerance note speaks about); None for other units."""
    for si, binary in (("KB", "KiB"), ("MB", "MiB"), ("GB", "GiB"), ("TB", "TiB")):
        if unit in (si, binary):
            return binary if unit == si else si
    return None


def _apart(unit: str, sibling: str) -> float:
    """How far apart two units are (KB and KiB: 2.4%)."""
    big, small = sorted((UNITS[unit][1], UNITS[sibling][1]), reverse=True)
    return big / small - 1


def human(value: float, unit: str) -> str:
    """``value`` (base units) written in ``unit``: ``human(2.08e11, "GB")`` is ``"208 GB"``."""
    number = value / UNITS[unit][1] if unit else value
    if not unit and abs(number) >= 1e9:  # a parameter or token count: 13 billion, 1 trillion
        scale, word = (1e12, "trillion") if abs(number) >= 1e12 else (1e9, "billion")
        return f"{number / scale:.3g} {word}"
    if number and (abs(number) >= 1e6 or abs(number) < 1e-3):
        text = f"{number:.3g}"
    elif float(number).is_integer():
        text = f"{number:,.0f}"
    else:
        text = f"{number:.3g}" if abs(number) < 100 else f"{number:,.0f}"
    return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}".strip()


@dataclass(frozen=True)
class Verdict:
    """The check of one answer: ``ok`` within tolerance; ``read`` the answer in the question's unit (None when it
    could not be read); ``message`` what to tell the learner."""

    ok: bool
    read: float | None
    message: str


def check_answer(estimate: Estimate, text: str) -> Verdict:
    """Check ``text`` against ``estimate``: a bare number is read in the question's unit; a unit is converted
    (GB, GiB, Gb, ms, ...); a unit of the wrong kind (a time for a size) fails with what was expected."""
    try:
        quantity = parse_quantity(text)
    except ValueError as err:
        return Verdict(False, None, str(err))
    want = UNITS[estimate.unit][0] if estimate.unit else "1"
    if quantity.unit and quantity.dimension != want:
        return Verdict(False, None, f"{text.strip()!r} is {DIMENSION_NAMES[quantity.dimension]}; this question asks "
                                    f"for {DIMENSION_NAMES[want]} in {estimate.unit or 'a plain number'}")
    read = quantity.to(estimate.unit) if estimate.unit else quantity.number
    expected = estimate.answer
    ratio = read / expected if expected else math.inf
    ok = abs(ratio - 1) <= estimate.tol
    where = f"read as {human(read * UNITS[estimate.unit][1] if estimate.unit else read, estimate.unit)}"
    if ok:
        return Verdict(True, read, f"right: {where}, within ±{estimate.tol:.0%} of "
                                   f"{human(estimate.value, estimate.unit)}")
    hint = ""
    if estimate.unit == "%" and not quantity.unit and abs(read * 100 / expected - 1) <= estimate.tol:
        hint = " (a fraction? write it as a percentage, with %)"
    slips = ((8, "bits for bytes, or bytes for bits?"), (1000, "check the unit's prefix (k, M, G; ms, us)"))
    for factor, slip in slips:
        if any(abs(ratio * f - 1) <= estimate.tol for f in (factor, 1 / factor)):
            hint = f" (a factor of {factor}: {slip})"
    return Verdict(False, read, f"not within ±{estimate.tol:.0%}: {where}, {ratio:.3g}x the expected "
                                f"{human(estimate.value, estimate.unit)}{hint}")


def _g(name, value, unit="", source=""):
    return Given(name, value, unit, source)


LLAMA2_7B = "Llama-2-7B config"
LLAMA2_70B = "Llama-2-70B config, grouped-query attention"
LLAMA3 = "Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 GPUs"
H100_BF16 = _g("peak", ds.H100_FP16_FLOPS, "TFLOP/s", f"{DATASHEET}, dense bf16")
H100_HBM = _g("hbm", ds.H100_HBM_BYTES_PER_S, "TB/s", DATASHEET)
NVLINK = _g("link", ds.H100_NVLINK_BYTES_PER_S, "GB/s", f"{DATASHEET}, NVLink per direction")
IB = _g("ib", IB_NDR_BITS_PER_S / 8, "Gb/s", EXTRA_FIGURES["IB_NDR_BITS_PER_S"])  # bytes/s, shown in bits

ESTIMATES = (
    Estimate("E-KV-TOKEN", "KV cache per token",
             "Llama-2-7B keeps K and V for {layers} layers x {kv_heads} KV heads x {head_dim} dimensions, "
             "{value_bytes} per value (fp16). KV-cache bytes per token?",
             (_g("layers", 32, "", LLAMA2_7B), _g("kv_heads", 32, "", LLAMA2_7B), _g("head_dim", 128, "", LLAMA2_7B),
              _g("value_bytes", 2, "B")),
             "2 * layers * kv_heads * head_dim * value_bytes", "KiB", 0.05, "2: one K and one V vector per head."),
    Estimate("E-KV-SEQ", "KV cache per sequence",
             "Llama-2-70B: {layers} layers, {kv_heads} KV heads (GQA) of {head_dim} dimensions, fp16 ({value_bytes}). "
             "KV cache of one {tokens}-token sequence?",
             (_g("layers", 80, "", LLAMA2_70B), _g("kv_heads", 8, "", LLAMA2_70B), _g("head_dim", 128, "", LLAMA2_70B),
              _g("value_bytes", 2, "B"), _g("tokens", 4096)),
             "2 * layers * kv_heads * head_dim * value_bytes * tokens", "GB", 0.05, "An exact count: GQA divides it by "
             "the 8 query heads per KV head."),
    Estimate("E-KV-FIT", "sequences that fit",
             "Llama-2-70B in fp16 ({params} parameters, {weight_bytes} each) on {gpus} GPUs of {hbm_bytes}. How many "
             "{tokens}-token sequences fit in what the weights leave ({layers} layers, {kv_heads} KV heads of "
             "{head_dim}, fp16 KV at {kv_bytes} per value; ignore activations and fragmentation)?",
             (_g("params", 70e9, "", LLAMA2_70B), _g("weight_bytes", 2, "B"), _g("gpus", 8),
              _g("hbm_bytes", ds.H100_HBM_BYTES, "GB", DATASHEET), _g("tokens", 4096),
              _g("layers", 80, "", LLAMA2_70B), _g("kv_heads", 8, "", LLAMA2_70B), _g("head_dim", 128, "", LLAMA2_70B),
              _g("kv_bytes", 2, "B")),
             "(gpus * hbm_bytes - params * weight_bytes) / (2 * layers * kv_heads * head_dim * kv_bytes * tokens)",
             "sequences", 0.25, "Free memory over one sequence's KV bytes (the leading 2: one K and one V)."),
    Estimate("E-DECODE-FLOOR", "decode step floor",
             "A 7B model in fp16 ({params} parameters x {weight_bytes}) decodes at batch 1 on one H100 "
             "({hbm}). Lowest possible time per output token?",
             (_g("params", 7e9), _g("weight_bytes", 2, "B"), H100_HBM),
             "params * weight_bytes / hbm", "ms", 0.25, "Every step reads every weight once: memory-bound."),
    Estimate("E-DECODE-TP", "decode floor with TP",
             "A {params}-parameter model in fp8 ({weight_bytes} per parameter) at TP={tp} on H100s ({hbm} each). "
             "Weight-read floor per decode step (ignore the all-reduces)?",
             (_g("params", 175e9), _g("weight_bytes", 1, "B"), _g("tp", 8), H100_HBM),
             "params * weight_bytes / (tp * hbm)", "ms", 0.25, "Each GPU reads its 1/tp of the weights in parallel."),
    Estimate("E-SKU-RATIO", "A100 to H100, memory-bound",
             "A memory-bound kernel runs at the same share of peak bandwidth on an A100 ({a100}) and an H100 "
             "({h100}). Expected speed-up on the H100?",
             (_g("a100", A100_HBM_BYTES_PER_S, "TB/s", EXTRA_FIGURES["A100_HBM_BYTES_PER_S"]),
              _g("h100", ds.H100_HBM_BYTES_PER_S, "TB/s", DATASHEET)),
             "h100 / a100", "x", 0.25, "A performance gate per GPU type expects this ratio, not the FLOP ratio."),
    Estimate("E-AR-NVLINK", "all-reduce on NVLink",
             "Ring all-reduce of {size} of gradients over {p} GPUs in one node, NVLink {link}. Time (bandwidth "
             "term only)?",
             (_g("size", 1e9, "GB"), _g("p", 8), NVLINK),
             "2 * (p - 1) / p * size / link", "ms", 0.25,
             "A ring all-reduce is a reduce-scatter plus an all-gather: each GPU sends 2(p-1)/p of the data."),
    Estimate("E-AR-IB", "all-reduce on InfiniBand",
             "The same {size} ring all-reduce over {p} nodes, the ring's slowest link one InfiniBand port "
             "({ib}). Time (bandwidth term only)?",
             (_g("size", 1e9, "GB"), _g("p", 16), IB),
             "2 * (p - 1) / p * size / ib", "ms", 0.25, "Gb/s is bits: 8 of them to a byte."),
    Estimate("E-ZERO-DDP", "model state, DDP",
             "A {params}-parameter model trained with Adam in mixed precision ({state_bytes} per parameter: fp16 "
             "weights and gradients, fp32 master weights, momentum, variance) with plain DDP. Model state per GPU?",
             (_g("params", 13e9), _g("state_bytes", 16, "B")), "params * state_bytes", "GB", 0.25,
             "DDP replicates everything: 2 + 2 + 4 + 4 + 4 bytes per parameter on every GPU."),
    Estimate("E-ZERO-1", "model state, ZeRO-1",
             "The {params}-parameter model on {gpus} GPUs with ZeRO-1 (optimizer state, {opt_bytes} per parameter, "
             "sharded; fp16 weights and gradients, {replicated_bytes} per parameter, replicated). Per GPU?",
             (_g("params", 13e9), _g("gpus", 64), _g("opt_bytes", 12, "B"), _g("replicated_bytes", 4, "B")),
             "params * (replicated_bytes + opt_bytes / gpus)", "GB"),
    Estimate("E-ZERO-2", "model state, ZeRO-2",
             "The {params}-parameter model on {gpus} GPUs with ZeRO-2 (optimizer state and gradients, "
             "{sharded_bytes} per parameter, sharded; fp16 weights, {weight_bytes}, replicated). Per GPU?",
             (_g("params", 13e9), _g("gpus", 64), _g("sharded_bytes", 14, "B"), _g("weight_bytes", 2, "B")),
             "params * (weight_bytes + sharded_bytes / gpus)", "GB"),
    Estimate("E-ZERO-3", "model state, ZeRO-3/FSDP",
             "The {params}-parameter model on {gpus} GPUs with ZeRO-3/FSDP (all {state_bytes} per parameter "
             "sharded). Per GPU?",
             (_g("params", 13e9), _g("gpus", 64), _g("state_bytes", 16, "B")), "params * state_bytes / gpus", "GB"),
    Estimate("E-FSDP-BYTES", "FSDP traffic per step",
             "FSDP on {gpus} GPUs, {params} parameters in bf16 ({weight_bytes}): bytes each GPU sends per step "
             "(all-gather in forward, all-gather in backward, reduce-scatter of gradients)?",
             (_g("params", 13e9), _g("gpus", 64), _g("weight_bytes", 2, "B")),
             "3 * (gpus - 1) / gpus * params * weight_bytes", "GB", 0.25,
             "Three collectives of (p-1)/p each: 1.5x DDP's all-reduce (a reduce-scatter plus an all-gather)."),
    Estimate("E-FSDP-GATHER", "FSDP unit all-gather",
             "One FSDP unit is one of {layers} layers of a {params}-parameter model in bf16 ({weight_bytes}). "
             "All-gather it over {gpus} GPUs, each with one {ib} InfiniBand port. Time?",
             (_g("params", 13e9), _g("layers", 40), _g("weight_bytes", 2, "B"), _g("gpus", 64), IB),
             "(gpus - 1) / gpus * params / layers * weight_bytes / ib", "ms", 0.25,
             "Compare with E-UNIT-COMPUTE: the prefetch hides only if this is shorter than the unit's compute."),
    Estimate("E-UNIT-COMPUTE", "one unit's forward compute",
             "The same unit ({params} / {layers} layers) runs forward on {tokens} tokens per GPU at the H100's "
             "dense bf16 peak ({peak}). Time?",
             (_g("params", 13e9), _g("layers", 40), _g("tokens", 4096), H100_BF16),
             "2 * params / layers * tokens / peak", "ms", 0.25, "2 FLOP per parameter per token in the forward."),
    Estimate("E-BUBBLE", "pipeline bubble",
             "GPipe or 1F1B with {p} stages and {m} microbatches per step. Bubble fraction of the step?",
             (_g("p", 8), _g("m", 32)), "(p - 1) / (m + p - 1)", "%"),
    Estimate("E-MFU", "MFU from tokens/s",
             "A {params}-parameter model trains at {tokens_per_s} per GPU on H100s ({peak} dense bf16). MFU?",
             (_g("params", 13e9), _g("tokens_per_s", 4000, "tokens/s"), H100_BF16),
             "6 * params * tokens_per_s / peak", "%", 0.25, "6 FLOP per parameter per token: 2 forward, 4 backward."),
    Estimate("E-TRAIN-TIME", "training time",
             "Train {params} parameters on {tokens} tokens with {gpus} H100s ({peak} each) at {mfu} MFU. Hours?",
             (_g("params", 7e9), _g("tokens", 1e12), _g("gpus", 1024), H100_BF16, _g("mfu", 0.4, "%")),
             "6 * params * tokens / (gpus * peak * mfu)", "h"),
    Estimate("E-PCIE", "PCIe copy",
             "Copy {size} from pinned host memory to an H100 over PCIe Gen5 x16 ({pcie} one way). Time?",
             (_g("size", 4e9, "GB"), _g("pcie", PCIE5_X16_BYTES_PER_S, "GB/s", EXTRA_FIGURES["PCIE5_X16_BYTES_PER_S"])),
             "size / pcie", "ms", 0.25, "Pageable memory is slower still: it is staged through a pinned buffer."),
    Estimate("E-GPU-MTBF", "one GPU's MTBF",
             "A run saw {failures} interruptions in {days} on {gpus} GPUs. What mean time between failures of one "
             "GPU does that imply?",
             (_g("failures", 419, "", LLAMA3), _g("days", 54 * 86400, "days", LLAMA3), _g("gpus", 16384, "", LLAMA3)),
             "days * gpus / failures", "h", 0.25,
             "A job of N GPUs fails N times as often as one GPU: one GPU's MTBF is the job's times N."),
    Estimate("E-YOUNG-DALY", "checkpoint interval",
             "That run ({failures} interruptions in {days}) takes {cost} to save a checkpoint. Young/Daly interval?",
             (_g("failures", 419, "", LLAMA3), _g("days", 54 * 86400, "days", LLAMA3), _g("cost", 60, "s")),
             "sqrt(2 * days / failures * cost)", "min", 0.25, "sqrt(2 x MTBF x checkpoint cost)."),
    Estimate("E-GEMM-AI", "GEMM intensity",
             "A {m} x {k} by {k} x {n} matmul in fp16 ({elem_bytes}), each matrix moved once. FLOP per byte?",
             (_g("m", 4096), _g("n", 4096), _g("k", 4096), _g("elem_bytes", 2, "B")),
             "2 * m * n * k / (elem_bytes * (m * k + k * n + m * n))", "FLOP/B"),
    Estimate("E-GEMV-AI", "decode GEMV intensity",
             "Batch-1 decode: an {k} x {n} fp16 weight ({elem_bytes}) times one vector. FLOP per byte?",
             (_g("k", 8192), _g("n", 8192), _g("elem_bytes", 2, "B")),
             "2 * k * n / (elem_bytes * (k * n + k + n))", "FLOP/B", 0.25, "About 1: far below any ridge point."),
    Estimate("E-RIDGE", "roofline ridge point",
             "H100: {peak} dense fp16, {hbm} HBM. Arithmetic intensity where the roofline turns compute-bound?",
             (H100_BF16, H100_HBM), "peak / hbm", "FLOP/B"),
    Estimate("E-GEMM-TIME", "GEMM at peak",
             "A {m} x {m} by {m} x {m} fp16 matmul at the H100's dense peak ({peak}). Time?",
             (_g("m", 4096), H100_BF16), "2 * m * m * m / peak", "us", 0.25,
             "Compute-bound (E-GEMM-AI is far above E-RIDGE), so FLOPs over peak."),
    Estimate("E-FLASH-NAIVE", "attention scores traffic",
             "Unfused attention, {heads} heads, sequence {seq}, fp16 ({elem_bytes}): bytes to write the scores S, "
             "read them for softmax, write P and read P back, per layer forward?",
             (_g("heads", 32), _g("seq", 8192), _g("elem_bytes", 2, "B")),
             "4 * heads * seq * seq * elem_bytes", "GB", 0.25, "Four passes over an S x S matrix per head."),
    Estimate("E-FLASH-MIN", "FlashAttention traffic",
             "FlashAttention on the same layer ({heads} heads, sequence {seq}, head dimension {head_dim}, fp16 "
             "{elem_bytes}), K and V tiles served from on-chip memory: its minimum HBM traffic (read Q, K, V once, "
             "write O once)?",
             (_g("heads", 32), _g("seq", 8192), _g("head_dim", 128), _g("elem_bytes", 2, "B")),
             "4 * heads * seq * head_dim * elem_bytes", "MB", 0.25,
             "Never materialises S x S: naive / flash traffic is about 1 + seq / head_dim."),
    Estimate("E-INT8-WEIGHTS", "int8 weights",
             "{params} parameters in int8 ({weight_bytes} each) with one fp16 scale ({scale_bytes}) per group of "
             "{group}. Weight memory?",
             (_g("params", 70e9), _g("weight_bytes", 1, "B"), _g("scale_bytes", 2, "B"), _g("group", 128)),
             "params * (weight_bytes + scale_bytes / group)", "GB"),
    Estimate("E-TP-BYTES", "TP all-reduce payload",
             "Megatron TP: per layer forward, 2 all-reduces of the activations (batch {batch} x sequence {seq} x "
             "hidden {hidden}, bf16 {elem_bytes}). Bytes all-reduced per layer forward?",
             (_g("batch", 8), _g("seq", 2048), _g("hidden", 8192), _g("elem_bytes", 2, "B")),
             "2 * batch * seq * hidden * elem_bytes", "MB", 0.25, "One after attention, one after the MLP."),
    Estimate("E-TP-TIME", "TP all-reduce time",
             "Those 2 all-reduces (batch {batch} x {seq} x {hidden}, bf16 {elem_bytes}) at TP={p} on NVLink "
             "({link}). Time per layer forward?",
             (_g("batch", 8), _g("seq", 2048), _g("hidden", 8192), _g("elem_bytes", 2, "B"), _g("p", 8), NVLINK),
             "2 * 2 * (p - 1) / p * batch * seq * hidden * elem_bytes / link", "ms", 0.25,
             "Two all-reduces, each sending 2(p-1)/p of the payload per GPU."),
    Estimate("E-LITTLE", "concurrency (Little's law)",
             "{rate} requests per second, each generating {tokens} tokens at {per_token} per token. Requests in "
             "flight?",
             (_g("rate", 100), _g("tokens", 250), _g("per_token", 0.02, "ms")),
             "rate * tokens * per_token", "requests", 0.25, "L = lambda x W: the KV cache must hold them all."),
    Estimate("E-AMDAHL", "Amdahl's law",
             "{parallel} of a step parallelises perfectly; the rest is serial. Speed-up on {n} GPUs?",
             (_g("parallel", 0.95, "%"), _g("n", 64)), "1 / ((1 - parallel) + parallel / n)", "x"),
    Estimate("E-TP-WEIGHTS", "weights per GPU",
             "A {params}-parameter model in bf16 ({weight_bytes}) at TP={tp}. Weight bytes per GPU?",
             (_g("params", 175e9), _g("weight_bytes", 2, "B"), _g("tp", 8)), "params * weight_bytes / tp", "GB"),
)
BY_ESTIMATE = {e.qid: e for e in ESTIMATES}


class EstimateRun:
    """One estimation question on a clock (``clock()`` seconds): ``start()``, then ``check(text)`` returns the
    :class:`Verdict` and saves the attempt to ``store`` (if given) as ``{"answer", "ok", "seconds", "attempts"}``."""

    def __init__(self, qid: str, store=None, clock: Callable[[], float] = time.monotonic):
        if qid not in BY_ESTIMATE:
            raise KeyError(f"no estimation question {qid!r}; they are {', '.join(BY_ESTIMATE)}")
        self.estimate, self.store, self.clock = BY_ESTIMATE[qid], store, clock
        self.started_at: float | None = None

    def start(self) -> None:
        self.started_at = self.clock()

    def seconds(self) -> float | None:
        return None if self.started_at is None else self.clock() - self.started_at

    def check(self, text: str) -> Verdict:
        verdict = check_answer(self.estimate, text)
        if self.store is not None and verdict.read is not None:  # an unreadable answer is not an attempt
            attempts = self.store.get(self.estimate.qid).get("attempts", 0) + 1
            seconds = self.seconds()
            self.store.update(self.estimate.qid, answer=text.strip(), ok=verdict.ok, attempts=attempts,
                              **({} if seconds is None else {"seconds": round(seconds, 1)}))
        return verdict

    def timer_note(self) -> str:
        seconds = self.seconds()
        if seconds is None:
            return ""
        return f"{seconds:.0f} s ({'inside' if seconds <= QUICK_S else 'over'} the {QUICK_S} s target; not judged)"
