"""Benchmark design and performance CI, as data (lesson 16, section 16).

- :data:`BENCH_RULES`: what makes a CPU vs GPU comparison fair, one rule per id; a design (a dict, fields in
  :data:`DESIGN_FIELDS`) is checked against them by lesson 16's exercise.
- :data:`STAGES`: the stages of one end-to-end training run a benchmark may time.
- :data:`MIN_RUNS` and :data:`MIN_EFFECT`: a performance gate compares at least this many runs on each side, and
  never fails a change smaller than this share of the baseline, however significant.
- :data:`SKU_NOISE` and :func:`make_runs`: run-to-run noise per GPU SKU (assumptions, not measurements) and seeded
  run times with an exact sample mean and standard deviation, for the lesson's gate.
"""
from __future__ import annotations

import torch

STAGES = ("data_loading", "host_to_device", "compute", "device_to_host")

DESIGN_FIELDS = {
    "metric": '"time_to_accuracy" (both sides train to the same accuracy), "time_per_epoch" or "peak_throughput"',
    "timed": f"the stages the clock covers, a list drawn from {STAGES}",
    "cpu_library": '"tuned" (a BLAS/oneDNN build, vectorised data path) or "naive" (a loop, a debug build)',
    "cpu_threads": "threads the CPU side runs", "cpu_cores": "cores the CPU machine has",
    "data": '{"cpu": dataset id, "gpu": dataset id}',
    "hparams": '{"cpu": {...}, "gpu": {...}}: batch size, learning rate, epochs, precision target',
    "repeats": "independent runs per side",
    "report": '"mean_with_ci" (mean and a confidence interval), "mean", "best_run" or "single_run"',
    "cost": "whether the result is also given per dollar (price per hour x hours to accuracy)",
}

BENCH_RULES = {
    "time_to_accuracy": "Compare time to the same target accuracy, not time per epoch or peak throughput: a faster "
                        "epoch that needs more epochs is no win",
    "end_to_end": "Time the whole run: data loading and host-device transfers as well as the compute",
    "tuned_baseline": "Give the CPU a tuned baseline: an optimised library on all of its cores",
    "same_data": "Train both sides on the same data",
    "same_hyperparameters": "Use the same hyper-parameters (batch, learning rate, epochs) on both sides",
    "repeats_with_ci": "Repeat each side at least MIN_RUNS times and report the mean with a confidence interval, not "
                       "the best or a single run",
    "cost": "Report the cost too (dollars to the target accuracy): a GPU hour costs more than a CPU hour",
}

MIN_RUNS = 5
MIN_EFFECT = 0.01

# Run-to-run coefficient of variation per SKU: assumptions for the lesson (a dedicated node is quieter than a
# shared cloud instance), not measurements.
SKU_NOISE = {"H100": 0.01, "A100": 0.02, "L4": 0.08}


def make_runs(seed: int, mean_s: float, cv: float, n: int) -> list[float]:
    """``n`` run times (s) whose sample mean is ``mean_s`` and sample standard deviation (n - 1) is ``cv x mean_s``
    exactly: seeded normal draws, standardised, then scaled (one run: ``[mean_s]``)."""
    if n == 1:
        return [float(mean_s)]
    z = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = (z - z.mean()) / z.std()  # (n,): sample mean 0, sample std 1
    return [float(v) for v in mean_s * (1 + cv * z)]
