"""The learner side of lab 01_performance_model: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/01_performance_model.py``).
"""
from __future__ import annotations

import torch

from grader.exercise import entry


def _costs_run(ns, case, device):
    x = case.inputs
    return {"elementwise": entry(ns, "elementwise_cost")(x["numel"], x["dtype_bytes"], n_inputs=x["n_inputs"],
                                                         flops_per_element=x["flops_per_element"]),
            "softmax": entry(ns, "softmax_cost")(x["rows"], x["cols"], x["dtype_bytes"]),
            "matmul": entry(ns, "matmul_cost")(x["M"], x["N"], x["K"], x["dtype_bytes"]),
            "attention": entry(ns, "attention_cost")(x["batch"], x["heads"], x["seq_q"], x["seq_k"],
                                                     x["head_dim"], x["dtype_bytes"], causal=x["causal"])}


def _roofline_run(ns, case, device):
    x = case.inputs
    return {"ai": entry(ns, "arithmetic_intensity")(x["flops"], x["bytes"]),
            "time": entry(ns, "roofline_time")(x["flops"], x["bytes"], x["peak_flops"], x["peak_bw"]),
            "bound": entry(ns, "bound")(x["flops"], x["bytes"], x["peak_flops"], x["peak_bw"])}


def _benchmark_run(ns, case, device):
    from gpulab.simulated import SimulatedClock, SimulatedDevice, SimulatedKernel

    x = case.inputs
    clock = SimulatedClock()
    sim = SimulatedDevice(clock=clock)
    kernel = SimulatedKernel(sim, steady_ms=x["steady_ms"], cold_ms=x["cold_ms"], cold_calls=x["cold_calls"],
                             durations_ms=x["durations_ms"])
    with clock.installed(ns):
        stats = entry(ns, "benchmark")(kernel, torch.zeros(4), device=sim, warmup=x["warmup"], repeats=x["repeats"])
    get = (lambda k: stats[k]) if isinstance(stats, dict) else (lambda k: getattr(stats, k))
    return {"median_ms": float(get("median_ms")), "p95_ms": float(get("p95_ms")),
            "p99_ms": float(get("p99_ms")), "calls": kernel.calls}


def _scaling_run(ns, case, device):
    x = case.inputs
    return {"amdahl": entry(ns, "amdahl_speedup")(x["p"], x["n"]),
            "strong": entry(ns, "strong_scaling_efficiency")(x["t1"], x["tn"], x["n"]),
            "weak": entry(ns, "weak_scaling_efficiency")(x["t1"], x["tn"])}
