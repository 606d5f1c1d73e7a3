"""The learner side of lab 01_performance_model: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/01_performance_model.py``).
"""
from __future__ import annotations

import sys

import torch

from gpulab import bench
from gpulab.simulated import SimulatedClock, SimulatedDevice, SimulatedKernel
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


class _Clock(SimulatedClock):
    """The simulated clock, counting its reads and noting how many kernel calls had been made at the
    first read that came while work was still queued (a clock read before the work finished)."""

    def __init__(self) -> None:
        super().__init__()
        self.device, self.calls = None, lambda: 0
        self.reads, self.early_read_at = 0, None

    def read(self) -> float:
        self.reads += 1
        if self.early_read_at is None and self.device is not None and self.device.pending():
            self.early_read_at = self.calls()
        return super().read()


def _inside(code) -> bool:
    """Whether the Python stack above this call runs ``code`` (a timer handing its work to a helper)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _benchmark_run(ns, case, device):
    x = case.inputs
    clock = _Clock()
    clock.device = SimulatedDevice(clock=clock)
    kernel = SimulatedKernel(clock.device, cold_ms=x["cold_ms"], cold_calls=x["cold_calls"],
                             durations_ms=x["durations_ms"])
    clock.calls = lambda: kernel.calls
    helper = []  # per call: whether gpulab's own timer made it (an answer that hands its work to it)

    def fn(*args, **kwargs):
        helper.append(_inside(bench.benchmark.__code__))
        return kernel(*args, **kwargs)

    with clock.installed(ns):
        stats = entry(ns, "benchmark")(fn, torch.zeros(4), device=clock.device, warmup=x["warmup"],
                                       repeats=x["repeats"])
    get = (lambda k: stats[k]) if isinstance(stats, dict) else (lambda k: getattr(stats, k))
    return {"median_ms": float(get("median_ms")), "p95_ms": float(get("p95_ms")),
            "p99_ms": float(get("p99_ms")), "calls": kernel.calls, "clock_reads": clock.reads,
            "early_read_at": clock.early_read_at, "gpulab_timer": any(helper)}


def _scaling_run(ns, case, device):
    x = case.inputs
    return {"amdahl": entry(ns, "amdahl_speedup")(x["p"], x["n"]),
            "strong": entry(ns, "strong_scaling_efficiency")(x["t1"], x["tn"], x["n"]),
            "weak": entry(ns, "weak_scaling_efficiency")(x["t1"], x["tn"])}
