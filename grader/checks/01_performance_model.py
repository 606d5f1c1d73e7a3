"""Checks of lab 01, performance model: costs, roofline, a correct timer, scaling laws."""
from __future__ import annotations

import math

import torch

from grader.exercise import Case, Exercise, entry

LAB = "01_performance_model"
TITLE = "Performance model: timing, roofline, scaling"


def _randint(gen, lo, hi) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _close(got, want, rel=1e-9) -> bool:
    try:
        return math.isclose(float(got), float(want), rel_tol=rel, abs_tol=1e-12)
    except (TypeError, ValueError):
        return False


# --- costs: FLOPs and bytes of the four op families ---------------------------------------------

def ref_costs(inp: dict) -> dict:
    """The reference (flops, bytes) of every op in one case."""
    b = inp["dtype_bytes"]
    n, rows, cols = inp["numel"], inp["rows"], inp["cols"]
    M, N, K = inp["M"], inp["N"], inp["K"]
    B, H, Sq, Sk, D = inp["batch"], inp["heads"], inp["seq_q"], inp["seq_k"], inp["head_dim"]
    causal = inp["causal"]
    # query i sees keys 0..i (top-left aligned), at most seq_k of them
    pairs = sum(min(i + 1, Sk) for i in range(Sq)) if causal else Sq * Sk
    return {
        "elementwise": (n * inp["flops_per_element"], n * (inp["n_inputs"] + 1) * b),
        "softmax": (5 * rows * cols, 2 * rows * cols * b),
        "matmul": (2 * M * N * K, (M * K + K * N + M * N) * b),
        "attention": (4 * B * H * pairs * D, B * H * (2 * Sq + 2 * Sk) * D * b),
    }


def _costs_cases(gen, public):
    cases = []
    if public:
        cases.append(Case("fp32 sizes from the lesson", dict(
            numel=1 << 20, n_inputs=2, flops_per_element=1, rows=4096, cols=1024, M=1024, N=1024,
            K=1024, batch=1, heads=8, seq_q=1024, seq_k=1024, head_dim=64, causal=False, dtype_bytes=4)))
        cases.append(Case("fp16, causal attention, odd sizes", dict(
            numel=1000, n_inputs=1, flops_per_element=8, rows=3, cols=77, M=100, N=33, K=7,
            batch=2, heads=3, seq_q=5, seq_k=5, head_dim=16, causal=True, dtype_bytes=2)))
    for i in range(2 if public else 6):
        sq = _randint(gen, 1, 300)
        cases.append(Case(f"random sizes #{i}", dict(
            numel=_randint(gen, 1, 1 << 22), n_inputs=_randint(gen, 1, 3),
            flops_per_element=_randint(gen, 1, 20), rows=_randint(gen, 1, 5000),
            cols=_randint(gen, 1, 5000), M=_randint(gen, 1, 4096), N=_randint(gen, 1, 4096),
            K=_randint(gen, 1, 4096), batch=_randint(gen, 1, 8), heads=_randint(gen, 1, 32),
            seq_q=sq, seq_k=sq + _randint(gen, 0, 1) * _randint(gen, 0, 200), head_dim=64,
            causal=bool(_randint(gen, 0, 1)) or i == 0, dtype_bytes=[1, 2, 4][_randint(gen, 0, 2)])))
    return cases


def _costs_run(ns, case, device):
    x = case.inputs
    return {
        "elementwise": entry(ns, "elementwise_cost")(x["numel"], x["dtype_bytes"], n_inputs=x["n_inputs"],
                                                     flops_per_element=x["flops_per_element"]),
        "softmax": entry(ns, "softmax_cost")(x["rows"], x["cols"], x["dtype_bytes"]),
        "matmul": entry(ns, "matmul_cost")(x["M"], x["N"], x["K"], x["dtype_bytes"]),
        "attention": entry(ns, "attention_cost")(x["batch"], x["heads"], x["seq_q"], x["seq_k"],
                                                 x["head_dim"], x["dtype_bytes"], causal=x["causal"]),
    }


def _costs_judge(case, obs):
    want = ref_costs(case.inputs)
    for op, (flops, nbytes) in want.items():
        got = obs.get(op)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"{op}_cost must return a pair (flops, bytes), got {got!r}."
        if not _close(got[0], flops):
            return f"{op}_cost: flops {got[0]!r}, expected {flops} for {case.inputs}."
        if not _close(got[1], nbytes):
            return f"{op}_cost: bytes {got[1]!r}, expected {nbytes} for {case.inputs}."
    return None


# --- roofline ------------------------------------------------------------------------------------

def _roofline_cases(gen, public):
    # (flops, bytes, peak_flops, peak_bw): an H100-like machine, a CPU-like one, random ones
    fixed = [(2 * 4096**3, 3 * 4096**2 * 2, 989e12, 3.35e12), (1 << 20, 12 << 20, 989e12, 3.35e12),
             (2e9, 1e8, 0.2e12, 45e9)]
    cases = [Case(f"flops={f:.3g} bytes={b:.3g}", dict(flops=f, bytes=b, peak_flops=pf, peak_bw=pb))
             for f, b, pf, pb in fixed]
    for i in range(2 if public else 8):
        pf = 10 ** (11 + 4 * float(torch.rand(1, generator=gen)))
        pb = 10 ** (10 + 3 * float(torch.rand(1, generator=gen)))
        nbytes = 10 ** (4 + 6 * float(torch.rand(1, generator=gen)))
        ridge = pf / pb
        ai = ridge * (10 ** (2 * float(torch.rand(1, generator=gen)) - 1))  # 0.1x .. 10x the ridge
        if abs(math.log10(ai / ridge)) < 0.05:
            ai *= 2.0  # keep away from the ridge, where "memory" vs "compute" is a tie
        cases.append(Case(f"random machine #{i}", dict(flops=ai * nbytes, bytes=nbytes, peak_flops=pf, peak_bw=pb)))
    return cases


def _roofline_run(ns, case, device):
    x = case.inputs
    return {"ai": entry(ns, "arithmetic_intensity")(x["flops"], x["bytes"]),
            "time": entry(ns, "roofline_time")(x["flops"], x["bytes"], x["peak_flops"], x["peak_bw"]),
            "bound": entry(ns, "bound")(x["flops"], x["bytes"], x["peak_flops"], x["peak_bw"])}


def _roofline_judge(case, obs):
    x = case.inputs
    t_compute, t_memory = x["flops"] / x["peak_flops"], x["bytes"] / x["peak_bw"]
    if not _close(obs["ai"], x["flops"] / x["bytes"], 1e-6):
        return f"arithmetic_intensity = {obs['ai']!r}, expected flops / bytes = {x['flops'] / x['bytes']:.6g}."
    if not _close(obs["time"], max(t_compute, t_memory), 1e-6):
        return (f"roofline_time = {obs['time']!r} s, expected {max(t_compute, t_memory):.6g} s: compute "
                f"takes {t_compute:.3g} s, memory {t_memory:.3g} s, and they overlap.")
    want = "memory" if t_memory > t_compute else "compute"
    if obs["bound"] != want:
        return f"bound = {obs['bound']!r}, expected {want!r} (arithmetic intensity {x['flops'] / x['bytes']:.3g} " \
               f"vs ridge point {x['peak_flops'] / x['peak_bw']:.3g} FLOP/byte)."
    return None


# --- benchmark: a timer that synchronises and warms up ----------------------------------------

def _benchmark_cases(gen, public):
    # Real sleeps, so the bounds below are wide (a loaded machine oversleeps by a few ms) and the
    # cold calls are long enough that every wrong timer still lands far outside them.
    return [Case("simulated GPU kernel: 4 ms per call, first 3 calls 300 ms",
                 dict(steady_ms=4.0, cold_ms=300.0, cold_calls=3, warmup=5, repeats=20)),
            Case("simulated GPU kernel: 8 ms per call, first call 400 ms",
                 dict(steady_ms=8.0, cold_ms=400.0, cold_calls=1, warmup=3, repeats=12))]


def _benchmark_run(ns, case, device):
    from gpulab.simulated import SimulatedDevice, SimulatedKernel

    x = case.inputs
    sim = SimulatedDevice()
    kernel = SimulatedKernel(sim, steady_ms=x["steady_ms"], cold_ms=x["cold_ms"], cold_calls=x["cold_calls"])
    stats = entry(ns, "benchmark")(kernel, torch.zeros(4), device=sim, warmup=x["warmup"], repeats=x["repeats"])
    get = (lambda k: stats[k]) if isinstance(stats, dict) else (lambda k: getattr(stats, k))
    return {"median_ms": float(get("median_ms")), "p95_ms": float(get("p95_ms")),
            "p99_ms": float(get("p99_ms")), "calls": kernel.calls}


def _benchmark_judge(case, obs):
    x = case.inputs
    steady = x["steady_ms"]
    if obs["calls"] < x["warmup"] + x["repeats"]:
        return f"fn was called {obs['calls']} times; expected warmup + repeats = {x['warmup'] + x['repeats']}."
    if obs["median_ms"] < 0.75 * steady:
        return (f"median {obs['median_ms']:.3f} ms, but each call really takes {steady} ms: the clock was read "
                "before the work finished. Call `synchronize(device)` before reading the clock after each call.")
    if obs["median_ms"] > 3 * steady + 2.0:
        return (f"median {obs['median_ms']:.2f} ms, but each warm call takes {steady} ms: the slow first calls "
                "(compilation, autotuning) leaked into the result. Run `warmup` untimed calls first, then take "
                "the median of per-call samples.")
    for key in ("p95_ms", "p99_ms"):  # generous: a busy machine may add many ms to one sample
        if obs[key] > 10 * steady:
            return (f"{key} = {obs[key]:.1f} ms, but the steady-state time is {steady} ms: the slow first calls "
                    "(compilation, autotuning) were timed. Run `warmup` untimed calls first.")
    if not obs["median_ms"] <= obs["p95_ms"] <= obs["p99_ms"]:
        return f"expected median <= p95 <= p99, got {obs['median_ms']:.3f}, {obs['p95_ms']:.3f}, {obs['p99_ms']:.3f}."
    return None


# --- scaling laws ----------------------------------------------------------------------------------

def _scaling_cases(gen, public):
    cases = [Case("p=0.95, n=8, 10 s -> 1.6 s", dict(p=0.95, n=8, t1=10.0, tn=1.6)),
             Case("p=0.5, n=64, 10 s -> 10 s (no gain)", dict(p=0.5, n=64, t1=10.0, tn=10.0))]
    for i in range(2 if public else 6):
        n = _randint(gen, 2, 1024)
        cases.append(Case(f"random #{i}", dict(p=float(torch.rand(1, generator=gen)), n=n,
                                               t1=1 + 99 * float(torch.rand(1, generator=gen)),
                                               tn=0.1 + 50 * float(torch.rand(1, generator=gen)))))
    return cases


def _scaling_run(ns, case, device):
    x = case.inputs
    return {"amdahl": entry(ns, "amdahl_speedup")(x["p"], x["n"]),
            "strong": entry(ns, "strong_scaling_efficiency")(x["t1"], x["tn"], x["n"]),
            "weak": entry(ns, "weak_scaling_efficiency")(x["t1"], x["tn"])}


def _scaling_judge(case, obs):
    x = case.inputs
    want = {"amdahl": 1 / ((1 - x["p"]) + x["p"] / x["n"]), "strong": x["t1"] / (x["n"] * x["tn"]),
            "weak": x["t1"] / x["tn"]}
    names = {"amdahl": "amdahl_speedup", "strong": "strong_scaling_efficiency", "weak": "weak_scaling_efficiency"}
    for key, value in want.items():
        if not _close(obs[key], value, 1e-6):
            return f"{names[key]} = {obs[key]!r}, expected {value:.6g} for {x}."
    return None


EXERCISES = [
    Exercise("costs", 3, ("elementwise_cost", "softmax_cost", "matmul_cost", "attention_cost"),
             _costs_cases, _costs_run, _costs_judge, title="FLOPs and bytes of four op families",
             hint="A matmul does one multiply and one add per (m, n, k): 2*M*N*K FLOPs. Count every tensor "
                  "read once and every output written once. Causal attention skips the masked pairs."),
    Exercise("roofline", 2, ("arithmetic_intensity", "roofline_time", "bound"),
             _roofline_cases, _roofline_run, _roofline_judge, title="Roofline time and bound",
             hint="Compute and memory traffic overlap, so the time is the larger of the two, not their sum."),
    Exercise("benchmark", 3, ("benchmark",), _benchmark_cases, _benchmark_run, _benchmark_judge,
             title="A correct timer",
             hint="Warm up with untimed calls; call synchronize(device) before you start AND before you stop "
                  "the clock of each call; report the median and p95/p99 of the samples."),
    Exercise("scaling", 2, ("amdahl_speedup", "strong_scaling_efficiency", "weak_scaling_efficiency"),
             _scaling_cases, _scaling_run, _scaling_judge, title="Amdahl and scaling efficiency",
             hint="Amdahl: the serial fraction (1 - p) does not shrink with n. Strong scaling divides by n."),
]
