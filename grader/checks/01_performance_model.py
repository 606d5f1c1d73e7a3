"""Checks of lab 01, performance model: costs, roofline, a correct timer, scaling laws.

Answers are formulas of plain numbers; the timer is run on a simulated GPU and clock (no GPU, no waiting).
"""
from __future__ import annotations

import statistics

import torch

from grader.exercise import Case, Exercise
from grader.kit.cases import randint, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "01_performance_model"
RUN = run_side(LAB)  # the learner side: grader/runs/01_performance_model.py
TITLE = "Performance model: timing, roofline, scaling"
FORMULA_RTOL = 1e-6  # roofline and scaling answers may be computed in another (equivalent) order


# --- costs: FLOPs and bytes of the four op families ---------------------------------------------

def ref_costs(x: dict) -> dict:
    """The reference (flops, bytes) of every op in one case."""
    b, n, rows, cols, M, N, K = x["dtype_bytes"], x["numel"], x["rows"], x["cols"], x["M"], x["N"], x["K"]
    B, H, Sq, Sk, D = x["batch"], x["heads"], x["seq_q"], x["seq_k"], x["head_dim"]
    # query i sees keys 0..i (top-left aligned), at most seq_k of them
    pairs = sum(min(i + 1, Sk) for i in range(Sq)) if x["causal"] else Sq * Sk
    return {"elementwise": (n * x["flops_per_element"], n * (x["n_inputs"] + 1) * b),
            "softmax": (5 * rows * cols, 2 * rows * cols * b),
            "matmul": (2 * M * N * K, (M * K + K * N + M * N) * b),
            "attention": (4 * B * H * pairs * D, B * H * (2 * Sq + 2 * Sk) * D * b)}


def _costs_cases(gen, public):
    cases = [] if not public else [
        Case("fp32 sizes from the lesson", dict(
            numel=1 << 20, n_inputs=2, flops_per_element=1, rows=4096, cols=1024, M=1024, N=1024,
            K=1024, batch=1, heads=8, seq_q=1024, seq_k=1024, head_dim=64, causal=False, dtype_bytes=4)),
        Case("fp16, causal attention, odd sizes", dict(
            numel=1000, n_inputs=1, flops_per_element=8, rows=3, cols=77, M=100, N=33, K=7,
            batch=2, heads=3, seq_q=5, seq_k=5, head_dim=16, causal=True, dtype_bytes=2)),
        Case("fp16, causal attention with fewer keys than queries (seq_k < seq_q)", dict(
            numel=77, n_inputs=3, flops_per_element=2, rows=5, cols=3, M=7, N=100, K=33,
            batch=1, heads=2, seq_q=12, seq_k=5, head_dim=32, causal=True, dtype_bytes=2))]
    # Random sizes inside fixed rules, so every seed has causal and non-causal attention with
    # seq_k <, = and > seq_q, and every dtype size.
    shapes = ["seq_k < seq_q", "seq_k > seq_q", "seq_k = seq_q"]
    for i in range(2 if public else 6):
        sq = randint(gen, 2, 300)
        sk = {"seq_k < seq_q": randint(gen, 1, sq - 1), "seq_k > seq_q": sq + randint(gen, 1, 200),
              "seq_k = seq_q": sq}[shapes[i % 3]]
        causal = i % 2 == 0
        cases.append(Case(f"{'causal' if causal else 'full'} attention, {shapes[i % 3]}, {[1, 2, 4][i % 3]}-byte "
                          f"dtype: random sizes #{i}", dict(
            numel=randint(gen, 1, 1 << 22), n_inputs=randint(gen, 1, 3),
            flops_per_element=randint(gen, 1, 20), rows=randint(gen, 1, 5000),
            cols=randint(gen, 1, 5000), M=randint(gen, 1, 4096), N=randint(gen, 1, 4096),
            K=randint(gen, 1, 4096), batch=randint(gen, 1, 8), heads=randint(gen, 1, 32),
            seq_q=sq, seq_k=sk, head_dim=64, causal=causal, dtype_bytes=[1, 2, 4][i % 3])))
    return cases


def _costs_judge(case, obs):
    x = case.inputs
    for op, (flops, nbytes) in ref_costs(x).items():
        got = obs.get(op)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"{op}_cost must return a pair (flops, bytes), got {got!r}."
        if not close(got[0], flops):
            msg = f"{op}_cost: flops {got[0]!r}, expected {flops} for {x}."
            if op == "attention" and x["causal"] and x["seq_k"] < x["seq_q"]:
                msg += (" Here seq_k < seq_q: query i sees min(i + 1, seq_k) keys, so the last "
                        f"{x['seq_q'] - x['seq_k']} queries see all {x['seq_k']} keys.")
            return msg
        if not close(got[1], nbytes):
            return f"{op}_cost: bytes {got[1]!r}, expected {nbytes} for {x}."
    return None


COSTS = Exercise("costs", 3, ("elementwise_cost", "softmax_cost", "matmul_cost", "attention_cost"),
                 _costs_cases, RUN._costs_run, _costs_judge, title="FLOPs and bytes of four op families",
                 hint="A matmul does one multiply and one add per (m, n, k): 2*M*N*K FLOPs. Count every tensor "
                      "read once and every output written once. Causal attention skips the masked pairs.")


# --- roofline ------------------------------------------------------------------------------------

def _roofline_cases(gen, public):
    # (flops, bytes, peak_flops, peak_bw): an H100-like machine, a CPU-like one, random ones
    fixed = [(2 * 4096**3, 3 * 4096**2 * 2, 989e12, 3.35e12), (1 << 20, 12 << 20, 989e12, 3.35e12),
             (2e9, 1e8, 0.2e12, 45e9)]
    cases = [Case(f"flops={f:.3g} bytes={b:.3g}", dict(flops=f, bytes=b, peak_flops=pf, peak_bw=pb))
             for f, b, pf, pb in fixed]
    n = 2 if public else 8
    # Half the random machines run below the ridge (memory-bound), half above it, in a random order:
    # neither a case's name nor its place says which.
    below = [i < n // 2 for i in torch.randperm(n, generator=gen).tolist()]
    for i in range(n):
        pf, pb, nbytes = 10 ** uniform(gen, 11, 15), 10 ** uniform(gen, 10, 13), 10 ** uniform(gen, 4, 10)
        factor = 10 ** uniform(gen, 0.05, 1.0)  # 1.1x .. 10x away from the ridge (never a tie)
        ai = pf / pb / factor if below[i] else pf / pb * factor
        cases.append(Case(f"machine #{i}: flops={ai * nbytes:.3g} bytes={nbytes:.3g}",
                          dict(flops=ai * nbytes, bytes=nbytes, peak_flops=pf, peak_bw=pb)))
    return cases


def _roofline_judge(case, obs):
    x = case.inputs
    t_compute, t_memory = x["flops"] / x["peak_flops"], x["bytes"] / x["peak_bw"]
    if not close(obs["ai"], x["flops"] / x["bytes"], FORMULA_RTOL):
        return f"arithmetic_intensity = {obs['ai']!r}, expected flops / bytes = {x['flops'] / x['bytes']:.6g}."
    if not close(obs["time"], max(t_compute, t_memory), FORMULA_RTOL):
        return (f"roofline_time = {obs['time']!r} s, expected {max(t_compute, t_memory):.6g} s: compute "
                f"takes {t_compute:.3g} s, memory {t_memory:.3g} s, and they overlap.")
    want = "memory" if t_memory > t_compute else "compute"
    if obs["bound"] != want:
        return f"bound = {obs['bound']!r}, expected {want!r} (arithmetic intensity {x['flops'] / x['bytes']:.3g} " \
               f"vs ridge point {x['peak_flops'] / x['peak_bw']:.3g} FLOP/byte)."
    return None


ROOFLINE = Exercise("roofline", 2, ("arithmetic_intensity", "roofline_time", "bound"),
                    _roofline_cases, RUN._roofline_run, _roofline_judge, title="Roofline time and bound",
                    hint="Compute and memory traffic overlap, so the time is the larger of the two, not their sum.")


# --- benchmark: a timer that synchronises and warms up ----------------------------------------

# The simulated GPU runs on a simulated clock (gpulab.simulated.SimulatedClock): nothing sleeps, and
# a timer that synchronises measures exactly the durations the kernel was given. The warm calls take
# REPEATS durations in a shuffled cycle, in four tiers: TIERS[t] = (count, multiple of the typical
# time). Each percentile falls well inside one tier, so every usual definition of a percentile
# (linear interpolation, nearest rank, numpy's or statistics.quantiles' methods) gives the same value,
# while the mean, mean + 2 std, or the max are far from it.
REPEATS = 200
TIERS = ((180, 1.0), (16, 2.5), (3, 8.0), (1, 20.0))  # median, p95, p99 in tiers 0, 1, 2; tier 3: max
PERCENTILE_RTOL, PERCENTILE_ATOL_MS = 0.02, 0.05      # a timer's own clock reads add microseconds


def _durations(gen, typical_ms: float) -> list:
    """REPEATS per-call times in ms, the tiers of TIERS in a random order."""
    values = [mult * typical_ms for count, mult in TIERS for _ in range(count)]
    return [values[i] for i in torch.randperm(len(values), generator=gen).tolist()]


def _benchmark_cases(gen, public):
    typical = [4.0, 8.0] if public else [uniform(gen, 1.0, 8.0), uniform(gen, 1.0, 8.0)]  # random on hidden
    cases = []
    for i, (typical_ms, (cold, cold_calls, warmup)) in enumerate(zip(typical, [(300.0, 3, 5), (400.0, 1, 3)])):
        first = f"first {cold_calls} calls" if cold_calls > 1 else "first call"
        cases.append(Case(f"simulated GPU kernel #{i}: {REPEATS} warm calls of varying length, the {first} slow",
                          dict(cold_ms=cold, cold_calls=cold_calls, warmup=warmup, repeats=REPEATS,
                               durations_ms=_durations(gen, typical_ms))))
    return cases


def _benchmark_judge(case, obs):
    x = case.inputs
    samples = x["durations_ms"]
    steady = min(samples)  # the typical call: TIERS[0] holds most calls, at 1x
    if obs["calls"] < x["warmup"] + x["repeats"]:
        return f"fn was called {obs['calls']} times; expected warmup + repeats = {x['warmup'] + x['repeats']}."
    if obs["gpulab_timer"]:
        return ("benchmark handed the timing to gpulab.bench.benchmark: this exercise is writing that timer. Warm up, "
                "then per call synchronize, read time.perf_counter(), call, synchronize, read it again.")
    if obs["median_ms"] < 0.75 * steady:
        return (f"median {obs['median_ms']:.3f} ms, but a typical call really takes {steady:.3g} ms: the clock was "
                "read before the work finished. Call `synchronize(device)` before reading the clock after each call.")
    if obs["median_ms"] > 3 * steady + 2.0:
        return (f"median {obs['median_ms']:.2f} ms, but a typical warm call takes {steady:.3g} ms: the slow first "
                "calls (compilation, autotuning) leaked into the result. Run `warmup` untimed calls first, then "
                "take the median of per-call samples.")
    slowest = max(samples)
    for key in ("p95_ms", "p99_ms"):
        if obs[key] > (slowest + x["cold_ms"]) / 2:
            return (f"{key} = {obs[key]:.1f} ms, but no warm call takes more than {slowest:.3g} ms: the slow first "
                    "calls (compilation, autotuning) were timed. Run `warmup` untimed calls first.")
    if obs["early_read_at"] is not None:
        return (f"the clock was read while work was still queued on the device (after {obs['early_read_at']} calls): "
                "that sample includes work launched before it started (the warm-up's, or the previous call's). "
                "Call `synchronize(device)` before every clock read: after the warm-up and after each call.")
    if not obs["median_ms"] <= obs["p95_ms"] <= obs["p99_ms"]:
        return f"expected median <= p95 <= p99, got {obs['median_ms']:.3f}, {obs['p95_ms']:.3f}, {obs['p99_ms']:.3f}."
    mismatch = _percentile_mismatch(obs, samples)
    if mismatch or obs["clock_reads"] > x["repeats"]:
        return mismatch
    return (f"benchmark read the clock {obs['clock_reads']} times for {x['repeats']} timed calls, too few to "
            "measure each call: read time.perf_counter() before and after each call and keep one sample per call.")


def _near(got: float, want: float) -> bool:
    return abs(got - want) <= PERCENTILE_RTOL * want + PERCENTILE_ATOL_MS


def _percentile_mismatch(obs, samples) -> str | None:
    """A message if the reported median, p95 or p99 are not those of the per-call samples."""
    from gpulab.bench import percentile

    mean, std = statistics.fmean(samples), statistics.pstdev(samples)
    for key, q, label in (("median_ms", 50, "median"), ("p95_ms", 95, "95th percentile"),
                          ("p99_ms", 99, "99th percentile")):
        got, want = obs[key], percentile(samples, q)
        if _near(got, want):
            continue
        msg = (f"{key} = {got:.3f} ms, but the {label} of the {len(samples)} per-call times your timer measured "
               f"is {want:.3f} ms (they range from {min(samples):.3g} to {max(samples):.3g} ms).")
        if _near(got, mean):
            msg += (" You reported the mean (a total time divided by the number of calls?): time each call "
                    "separately and take percentiles of those samples.")
        elif _near(got, max(samples)):
            msg += " You reported the slowest sample, the max: p99 is the value 99% of the way up the sorted samples."
        elif key != "median_ms" and any(_near(got, mean + z * std) for z in (1.645, 2.0, 2.326, 3.0)):
            msg += (" You reported mean + z * std, which assumes normally distributed times; timings have a long "
                    "tail. Sort the samples and take the value q% of the way up.")
        else:
            msg += " Sort the per-call samples and take the value q% of the way up (as numpy.percentile does)."
        return msg
    return None


BENCHMARK = Exercise("benchmark", 3, ("benchmark",), _benchmark_cases, RUN._benchmark_run, _benchmark_judge,
                     title="A correct timer",
                     hint="Warm up with untimed calls; call synchronize(device) before you start AND before you "
                          "stop the clock of each call; report the median and p95/p99 of the samples.")


# --- scaling laws ----------------------------------------------------------------------------------

SCALING_NAMES = {"amdahl": "amdahl_speedup", "strong": "strong_scaling_efficiency", "weak": "weak_scaling_efficiency"}


def _scaling_cases(gen, public):
    cases = [Case("p=0.95, n=8, 10 s -> 1.6 s", dict(p=0.95, n=8, t1=10.0, tn=1.6)),
             Case("p=0.5, n=64, 10 s -> 10 s", dict(p=0.5, n=64, t1=10.0, tn=10.0))]
    for i in range(2 if public else 6):
        n = randint(gen, 2, 1024)
        p, t1, tn = uniform(gen, 0.0, 1.0), uniform(gen, 1.0, 100.0), uniform(gen, 0.1, 50.1)
        cases.append(Case(f"workers #{i}: p={p:.3g}, n={n}, {t1:.3g} s -> {tn:.3g} s", dict(p=p, n=n, t1=t1, tn=tn)))
    return cases


def _scaling_judge(case, obs):
    x = case.inputs
    want = {"amdahl": 1 / ((1 - x["p"]) + x["p"] / x["n"]), "strong": x["t1"] / (x["n"] * x["tn"]),
            "weak": x["t1"] / x["tn"]}
    for key, value in want.items():
        if not close(obs[key], value, FORMULA_RTOL):
            return f"{SCALING_NAMES[key]} = {obs[key]!r}, expected {value:.6g} for {x}."
    return None


SCALING = Exercise("scaling", 2, tuple(SCALING_NAMES.values()), _scaling_cases, RUN._scaling_run, _scaling_judge,
                   title="Amdahl and scaling efficiency",
                   hint="Amdahl: the serial fraction (1 - p) does not shrink with n. Strong scaling divides by n.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.gbps", "gpulab.peaks.measured_peaks", "gpulab.plots.roofline")
EXERCISES = [offering(ex, OFFERED) for ex in (COSTS, ROOFLINE, BENCHMARK, SCALING)]
