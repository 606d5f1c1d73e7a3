"""The course's performance goals (README, "Performance goals") and the verdict a GPU run gives each.

A goal names one benchmark row (``grader/checks/NN_name.py``'s ``BENCHMARKS``), the figure it is
judged by and the bar. A verdict is ``met``, ``missed``, ``wrong output`` (the row's output did not
match its baseline, so its time proves nothing) or ``not measured`` with the reason: a goal is never
judged on a number this run did not measure.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Goal:
    lab: str
    row: str        # the benchmark row's name, exactly
    metric: str     # "pct_of_copy" (% of measured copy bandwidth) or "speedup_vs_baseline" (x the PyTorch baseline)
    at_least: float

    def text(self) -> str:
        unit = "% of copy bandwidth" if self.metric == "pct_of_copy" else "x the PyTorch baseline"
        return f">= {self.at_least:g}{unit}"


GOALS = [
    Goal("02_triton_basics", "vector_add fp32 vs torch.add", "pct_of_copy", 80),
    Goal("02_triton_basics", "bias_gelu erf vs eager gelu(x+b)", "pct_of_copy", 80),
    Goal("03_reductions", "softmax 65536x4096 fp16 vs torch", "pct_of_copy", 80),
    Goal("03_reductions", "rmsnorm 16384x4096 fp16 vs eager", "pct_of_copy", 80),
    Goal("03_reductions", "layernorm 16384x4096 fp16 vs F", "pct_of_copy", 80),
    Goal("04_matmul", "autotuned fp16 4096^3 vs torch.mm", "speedup_vs_baseline", 0.8),
    Goal("04_matmul", "autotuned fp16 8192^3 vs torch.mm", "speedup_vs_baseline", 0.8),
    Goal("05_flash_attention", "flash D=128 S=4k vs SDPA", "speedup_vs_baseline", 0.7),
    Goal("05_flash_attention", "flash D=64 S=4k causal vs SDPA", "speedup_vs_baseline", 0.7),
    Goal("08_quantization", "int8 decode GEMV M=1 K=N=4096 vs fp16", "pct_of_copy", 80),
    Goal("08_quantization", "int8 decode GEMV M=1 K=N=8192 vs fp16", "pct_of_copy", 80),
    Goal("08_quantization", "int8 decode GEMV M=1 K=N=8192 vs fp16", "speedup_vs_baseline", 1.5),
    Goal("14_inference_serving", "paged decode attention B=64 ctx=2048 H=32/KV=8 D=128 fp16 vs gather + SDPA",
         "pct_of_copy", 60),
    Goal("15_gpu_algorithms", "per-row top-8 of 16384 x 1024 float32 vs torch.topk", "speedup_vs_baseline", 1.0),
]


def verdict(goal: Goal, rows: dict, why_missing: dict) -> dict:
    """The verdict on ``goal`` from this run's rows (``{row name: row}``); ``why_missing[lab]`` says why a
    lab's rows are absent (its step did not run, or failed)."""
    out = {"lab": goal.lab, "row": goal.row, "goal": goal.text()}
    row = rows.get(goal.row)
    if row is None:
        return {**out, "verdict": "not measured", "why": why_missing.get(goal.lab, "the row was not run")}
    if "error" in row:
        return {**out, "verdict": "not measured", "why": f"the row failed: {row['error']}"}
    if not row.get("output_ok", False):
        return {**out, "verdict": "wrong output", "why": row.get("output_check", "output not checked")}
    if row.get("tiny"):
        return {**out, "verdict": "not measured", "why": "tiny sizes on the CPU: no GPU figure"}
    value = row.get(goal.metric)
    if value is None:
        return {**out, "verdict": "not measured", "why": f"the row has no {goal.metric}"}
    return {**out, "verdict": "met" if value >= goal.at_least else "missed", "measured": value}
