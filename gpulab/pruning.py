"""Small training tasks for pruning and distillation (lesson 09 introduces them).

Everything runs on one CPU thread, whatever device the notebook uses: the models are spiral MLPs
(:mod:`gpulab.spirals`, 2 inputs, 4 classes), so each run takes about a second and gives the same
numbers on every machine for a given seed.

- :func:`fit`: full-batch Adam on any loss of the logits, with a hook after each step (re-applying
  pruning masks, for instance).
- :func:`distill_task`: for a teacher trained on plenty of clean data, a *small, noisy* transfer set
  for a student: the setting where the teacher's soft labels help a student most.
- :func:`student_accuracy`: trains the small student on the transfer set with a given loss and
  returns its test accuracy, so "with the teacher" and "without" differ in the loss only.
- :func:`zeros_vs_sparse_ms`: the time of a dense matmul whose weight is mostly zeros, next to the
  same product with the weight stored as CSR (``torch.sparse``).
- :func:`semi_structured_ms`: a 2:4-pruned fp16 linear layer, dense vs ``to_sparse_semi_structured``
  (sparse tensor cores: CUDA GPUs of compute capability 8.0 and later only).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpulab.bench import benchmark
from gpulab.spirals import MLP, accuracy

CLASSES = 4


def fit(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[torch.Tensor], torch.Tensor], steps: int,
        lr: float, after_step: Callable[[], None] | None = None) -> list[float]:
    """Full-batch Adam on ``loss_fn(model(x))`` for ``steps`` steps; returns every step's loss.

    ``x``: float32 ``(B, d_in)``; ``loss_fn`` maps the ``(B, classes)`` logits to a scalar.
    ``after_step()`` runs after each ``optimizer.step()``, under ``torch.no_grad()`` (re-applying
    pruning masks, for instance). One thread, as :func:`gpulab.spirals.train`: the matrices are tiny.
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        if after_step is not None:
            with torch.no_grad():
                after_step()
        losses.append(float(loss.detach()))
    model.eval()
    torch.set_num_threads(threads)
    return losses


@dataclass
class DistillTask:
    """A trained ``teacher``; a small transfer set ``x`` (float32 ``(n, 2)``) with noisy labels
    ``y`` (int64 ``(n,)``) and the teacher's logits on it, ``teacher_logits`` (float32 ``(n, 4)``);
    a clean test set ``x_test``, ``y_test``; and ``noise``, the share of labels drawn at random."""

    teacher: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    teacher_logits: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    noise: float


def distill_task(teacher: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor,
                 y_test: torch.Tensor, seed: int = 0, n_transfer: int = 320, noise: float = 0.4) -> DistillTask:
    """A transfer set for a student of ``teacher`` (trained on the clean ``x_train``, ``y_train``):
    ``n_transfer`` points drawn from ``x_train`` with a ``noise`` share of their labels replaced by
    random classes (a cheap, noisy labelling), and the teacher's logits on them. ``seed`` picks the
    points and the noise."""
    gen = torch.Generator().manual_seed(seed + 7)
    pick = torch.randperm(len(x_train), generator=gen)[:n_transfer]
    x, y = x_train[pick], y_train[pick].clone()
    flip = torch.rand(n_transfer, generator=gen) < noise
    y[flip] = torch.randint(0, CLASSES, (int(flip.sum()),), generator=gen)
    with torch.no_grad():
        teacher_logits = teacher(x)
    return DistillTask(teacher, x, y, teacher_logits, x_test, y_test, noise)


def student_accuracy(task: DistillTask, loss_fn: Callable[[torch.Tensor], torch.Tensor], seed: int = 0,
                     hidden: int = 32, steps: int = 400, lr: float = 1e-2) -> float:
    """Test accuracy (0..1) of a student MLP (2 -> ``hidden`` -> ``hidden`` -> 4), initialised from
    ``seed`` and trained on ``task.x`` with ``loss_fn(student_logits)`` (a scalar)."""
    torch.manual_seed(seed)
    student = MLP(hidden=hidden, classes=CLASSES)
    fit(student, task.x, loss_fn, steps, lr)
    return accuracy(student, task.x_test, task.y_test)


def zeros_vs_sparse_ms(sparsities, out_features: int = 1024, in_features: int = 1024, batch: int = 128,
                       device: str = "cpu", seed: int = 0, repeats: int = 5) -> list[dict]:
    """For each sparsity in ``sparsities``: ``{"sparsity", "dense_ms", "csr_ms"}``, the fastest time of
    ``x @ W.T`` (``x``: float32 ``(batch, in_features)``, ``W``: ``(out_features, in_features)``) with that
    share of ``W``'s entries set to zero at random, computed by the dense kernel and with ``W`` stored
    as CSR (``torch.sparse.mm``, which skips the zeros). The fastest of ``repeats`` runs, not the median:
    on a shared CPU other jobs only ever add time, in bursts that would land on some sparsities only."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_features, generator=gen).to(device)
    x_t = x.T.contiguous()                                                    # (in, batch) for the CSR product
    weights = []
    for s in sparsities:
        w = torch.randn(out_features, in_features, generator=gen)
        w = (w * (torch.rand(w.shape, generator=gen) >= s)).to(device)      # share s of exact zeros
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                                   # "CSR support is in beta"
            weights.append((w, w.to_sparse_csr()))
    best = [[float("inf"), float("inf")] for _ in weights]
    # Round-robin over the sparsities, one timed run each per pass (do_bench's own repeats on CUDA): a
    # burst of other work on a shared CPU then hits every sparsity alike instead of a few.
    for _ in range(1 if device == "cuda" else repeats):
        for i, (w, w_csr) in enumerate(weights):
            dense = benchmark(lambda: x @ w.T, device=device, warmup=1, repeats=1).min_ms
            csr = benchmark(lambda: torch.sparse.mm(w_csr, x_t), device=device, warmup=1, repeats=1).min_ms
            best[i] = [min(best[i][0], dense), min(best[i][1], csr)]
    return [{"sparsity": s, "dense_ms": d, "csr_ms": c} for s, (d, c) in zip(sparsities, best)]


def semi_structured_support(device: str) -> str | None:
    """``None`` if ``torch.sparse.to_sparse_semi_structured`` can run here, else the reason why not."""
    if device != "cuda" or not torch.cuda.is_available():
        return ("2:4 sparse kernels need a CUDA GPU with sparse tensor cores (NVIDIA Ampere, compute "
                "capability 8.0, or later); this run is on the CPU, so nothing is timed.")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"this GPU is compute capability {major}.{minor}; sparse tensor cores start at 8.0 (Ampere)."
    return None


def semi_structured_ms(w: torch.Tensor, mask: torch.Tensor, x: torch.Tensor) -> dict:
    """``{"dense_ms", "sparse_ms", "speedup", "max_abs_err"}`` (medians) for ``F.linear(x, w * mask)`` as a dense fp16
    matmul and with the weight compressed by ``to_sparse_semi_structured`` (values plus 2-bit indices).

    ``w``: float ``(out, in)`` and ``mask``: bool ``(out, in)`` 2:4 along ``in``; ``x``: ``(batch, in)``; all on
    a CUDA device (see :func:`semi_structured_support`). Sizes should be multiples of 64. If this GPU or
    PyTorch build has no 2:4 kernel, returns ``{"error": message}`` instead of raising.
    """
    from torch.sparse import to_sparse_semi_structured

    dense_w = (w * mask).half()                                   # (out, in), half of each group of 4 zero
    x = x.half()
    try:
        sparse_w = to_sparse_semi_structured(dense_w)
        err = float((F.linear(x, sparse_w) - F.linear(x, dense_w)).abs().max())
    except (RuntimeError, NotImplementedError) as exc:  # no sparse kernel for this GPU or build: say so
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    dense = benchmark(lambda: F.linear(x, dense_w), device="cuda")
    sparse = benchmark(lambda: F.linear(x, sparse_w), device="cuda")
    return {"dense_ms": dense.median_ms, "sparse_ms": sparse.median_ms,
            "speedup": dense.median_ms / sparse.median_ms, "max_abs_err": err}
