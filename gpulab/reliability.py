"""Supplied traces and checklists for the reliability and MLOps part of lesson 16 (the capstone).

- :func:`make_step_times`: per-rank step times of a data-parallel job, ``(steps, ranks)`` float64 seconds,
  ``NaN`` where a rank reported nothing (it hangs), with chosen stragglers and one-off hiccups.
- :func:`make_divergence_trace`: the logs of a run that diverges for a chosen cause (``CAUSES``): loss,
  global and per-layer gradient norms, learning rate, fp16 loss scale and batch ids, one row per step.
- :func:`make_profile`: one step of a slow multi-GPU deployment as a per-rank time breakdown (kernels, NCCL,
  CPU gaps, host-device copies), for a chosen bottleneck (``BOTTLENECKS``).
- :data:`MLOPS_ITEMS`: the checklist a production pipeline is scored against (lesson 16's exercise).

Everything is drawn from a seed (``torch.Generator``), so a trace is the same on every machine.
"""
from __future__ import annotations

import torch

CAUSES = ("bad_batch", "fp16_overflow", "lr_too_high")


def make_step_times(seed: int, steps: int, ranks: int, stragglers=(), hung=(), slowdown: float = 1.5,
                    hiccups: int = 3) -> torch.Tensor:
    """``(steps, ranks)`` float64 step times around 1 s (2% noise); each rank in ``stragglers`` is
    ``slowdown`` times slower every step; each rank in ``hung`` stops reporting (``NaN``) for the last
    quarter of the steps; ``hiccups`` random (step, rank) cells are 3x slow once (a GC pause, a page fault)."""
    gen = torch.Generator().manual_seed(seed)
    times = 1.0 + 0.02 * torch.randn(steps, ranks, generator=gen, dtype=torch.float64)
    for r in stragglers:
        times[:, r] *= slowdown
    for _ in range(hiccups):
        t, r = int(torch.randint(steps, (1,), generator=gen)), int(torch.randint(ranks, (1,), generator=gen))
        times[t, r] *= 3.0
    for r in hung:
        times[steps - max(1, steps // 4):, r] = float("nan")
    return times


def make_divergence_trace(seed: int, cause: str, steps: int = 200, layers: int = 12) -> dict:
    """The logs of a run that goes wrong at a random step after 60, for ``cause`` in :data:`CAUSES`:

    - ``bad_batch``: one batch (a corrupt or extreme sample) spikes the loss for one step; the run recovers.
    - ``fp16_overflow``: the loss scale halves again and again as gradients overflow, then the loss is NaN.
    - ``lr_too_high``: the gradient norm grows step after step, led by one layer; the loss takes off, then NaN.

    Returns float64 tensors ``loss`` (steps,), ``grad_norm`` (steps,), ``layer_grad_norm`` (steps, layers),
    ``lr`` (steps,), ``loss_scale`` (steps,) and int64 ``batch_id`` (steps,), plus the truth under
    ``"_truth"`` (step, layer): what a learner's diagnosis should find, for the lesson to show.
    """
    if cause not in CAUSES:
        raise ValueError(f"cause must be one of {CAUSES}, got {cause!r}")
    gen = torch.Generator().manual_seed(seed)
    t0 = 60 + int(torch.randint(steps - 100, (1,), generator=gen))
    layer = int(torch.randint(layers, (1,), generator=gen))
    noise = lambda *shape: 1 + 0.03 * torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    step = torch.arange(steps, dtype=torch.float64)
    loss = (2.0 + 8.0 * torch.exp(-step / 40)) * noise(steps)                # a healthy, falling loss
    sizes = torch.logspace(-1, 1, layers, dtype=torch.float64)[torch.randperm(layers, generator=gen)]
    layer_norm = sizes * noise(steps, layers)  # layers differ in size: a big layer is not a suspect
    lr = torch.clamp(step / 50, max=1.0) * 3e-4
    scale = torch.full((steps,), 2.0**16, dtype=torch.float64)
    if cause == "bad_batch":
        loss[t0] *= 4.0
        layer_norm[t0, layer] *= 30.0
        layer_norm[t0] *= 2.0
    elif cause == "fp16_overflow":
        for k in range(6):  # the scale halves every step from t0 - 6 on; then the loss and gradients are NaN
            scale[t0 - 6 + k:] /= 2
        layer_norm[t0 - 6:, layer] *= torch.logspace(1, 4, steps - t0 + 6, dtype=torch.float64)
        loss[t0:] = float("nan")
        layer_norm[t0:] = float("nan")
    else:  # lr_too_high: lr keeps climbing past its plateau; one layer's gradients grow first, then all
        lr = lr * torch.where(step > t0 - 30, 1 + (step - t0 + 30) / 10, torch.ones_like(step))
        growth = torch.exp(torch.clamp(step - t0 + 30, min=0) / 6)
        layer_norm[:, layer] *= growth
        layer_norm *= torch.exp(torch.clamp(step - t0 + 5, min=0) / 4)[:, None]
        loss = torch.where(step >= t0, loss * torch.exp((step - t0) / 5 + 1), loss)
        loss[t0 + 30:] = float("nan")  # diverged: the run produces NaNs from here on
        layer_norm[t0 + 30:] = float("nan")
    grad_norm = torch.sqrt(torch.nansum(layer_norm**2, dim=1))
    grad_norm[torch.isnan(layer_norm).any(dim=1)] = float("nan")
    batch_id = torch.randperm(10 * steps, generator=gen)[:steps]
    return {"loss": loss, "grad_norm": grad_norm, "layer_grad_norm": layer_norm, "lr": lr, "loss_scale": scale,
            "batch_id": batch_id, "_truth": (t0, layer)}


BOTTLENECKS = ("stage_imbalance", "communication", "host_overhead", "host_device_copies", "compute")


def make_profile(seed: int, bottleneck: str, ranks: int = 8) -> dict:
    """Milliseconds per step on each rank, float64 tensors of shape (ranks,): ``kernel_ms`` (GPU kernels),
    ``nccl_ms`` (collectives, including waiting for the slowest rank), ``cpu_gap_ms`` (GPU idle while the
    host prepares work), ``memcpy_ms`` (host-device copies), ``step_ms`` (their sum), and the int ``slow_rank``
    the bottleneck is planted on. ``stage_imbalance`` makes one rank's kernels twice as long, and the
    others wait for it inside NCCL: their NCCL time grows, though the network is fine."""
    if bottleneck not in BOTTLENECKS:
        raise ValueError(f"bottleneck must be one of {BOTTLENECKS}, got {bottleneck!r}")
    gen = torch.Generator().manual_seed(seed)
    jitter = lambda: 1 + 0.05 * torch.rand(ranks, generator=gen, dtype=torch.float64)  # noqa: E731
    kernel, nccl, cpu, copy = 60 * jitter(), 10 * jitter(), 5 * jitter(), 3 * jitter()
    slow = int(torch.randint(ranks, (1,), generator=gen))
    if bottleneck == "stage_imbalance":
        kernel[slow] *= 2
        nccl += kernel[slow] - kernel  # the others wait for the slow rank in their next collective
    elif bottleneck == "communication":
        nccl *= 8
    elif bottleneck == "host_overhead":
        cpu *= 12
    elif bottleneck == "host_device_copies":
        copy *= 9
    return {"kernel_ms": kernel, "nccl_ms": nccl, "cpu_gap_ms": cpu, "memcpy_ms": copy,
            "step_ms": kernel + nccl + cpu + copy, "slow_rank": slow}


# The MLOps checklist: id -> what it means. A scenario's right selection is graded (lesson 16).
MLOPS_ITEMS = {
    "latency_percentiles": "Track p50/p95/p99 latency per endpoint (and time to first token for LLMs), not the mean",
    "throughput": "Track throughput: requests/s and tokens/s against capacity",
    "gpu_utilization": "Track GPU utilisation, memory and KV-cache occupancy per replica",
    "error_rate": "Track error and timeout rates (HTTP 5xx, OOMs, rejected requests)",
    "input_drift": "Compare the live input distribution with the training data (e.g. PSI per feature)",
    "output_drift": "Watch the prediction distribution and a quality metric on labelled samples",
    "loss_and_grad_norm": "Log loss, gradient norm (global and per layer), learning rate and loss scale each step",
    "per_rank_step_time": "Log per-rank step times and collective waits to catch stragglers and hangs",
    "checkpoint_health": "Checkpoint on a Young/Daly interval and test that checkpoints restore",
    "model_registry": "Version every model with its data, code commit, config and metrics in a registry",
    "pinned_artifacts": "Serve immutable, versioned artifacts (weights + tokenizer + engine) so a rollback is exact",
    "canary_slice": "Send a small slice of traffic (1-5%) to the new version first",
    "compare_to_baseline": "Compare the canary with the current version on the same metrics, with enough requests",
    "automatic_rollback": "Roll back automatically when the canary breaks an SLO or a guardrail metric",
    "shadow_traffic": "Replay mirrored production traffic to the new version before it serves users",
    "full_rollout_at_once": "Switch all traffic to the new version at once to finish quickly",
    "mean_latency_only": "Alert on mean latency only",
    "overwrite_in_place": "Overwrite the serving model files in place with the new version",
    "retrain_on_every_alert": "Retrain automatically whenever any metric alerts",
}
