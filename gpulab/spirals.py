"""The spiral task: a tiny classification problem whose model trains in about a second (lesson 08).

Points on ``classes`` interleaved spiral arms in the plane, and an MLP that separates them. The
decision boundaries are tight, so the model is sensitive to the precision of its weights: 8-bit
quantization leaves it untouched while 4-bit post-training quantization breaks it, which is what
lesson and lab 08 (quantization) need to show PTQ vs QAT honestly. Everything runs on the CPU,
whatever device the notebook uses: the model is tiny, and the numbers are then the same on every
machine for a given seed.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_spirals(n_per_class: int, classes: int = 4, turns: float = 1.5, noise: float = 0.02,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``x`` float32 of shape ``(classes * n_per_class, 2)``, ``y`` int64 labels.

    Arm ``c`` is the curve ``r (cos(theta), sin(theta))`` with ``r`` uniform in [0, 1] and
    ``theta = 2 pi (turns r + c / classes)``, plus Gaussian noise of standard deviation ``noise``.
    The same ``seed`` always gives the same points.
    """
    gen = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(classes):
        r = torch.rand(n_per_class, generator=gen)                      # (n,)
        theta = 2 * math.pi * (turns * r + c / classes)
        pts = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1)  # (n, 2)
        xs.append(pts + noise * torch.randn(n_per_class, 2, generator=gen))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    return torch.cat(xs), torch.cat(ys)


class MLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` ReLU units, then a linear head to ``classes`` logits.

    Every layer is an ``nn.Linear`` in ``self.linears`` (the head last), so a quantized copy can
    swap them one by one (:func:`map_linears`).
    """

    def __init__(self, d_in: int = 2, hidden: int = 48, classes: int = 4, depth: int = 2):
        super().__init__()
        dims = [d_in] + [hidden] * depth + [classes]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d_in) -> (B, classes)
        *body, head = self.linears
        for layer in body:
            x = F.relu(layer(x))
        return head(x)


def map_linears(model: nn.Module, fn: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` replaced by ``fn(that_linear)``."""
    new = copy.deepcopy(model)
    for name, child in list(new.named_children()):
        if isinstance(child, nn.Linear):
            setattr(new, name, fn(child))
        else:
            setattr(new, name, map_linears(child, fn))
    return new


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 800, lr: float = 2e-2) -> list[float]:
    """Full-batch Adam on cross-entropy for ``steps`` steps; returns the loss of every step.

    Runs on one CPU thread: the matrices are tiny, and on a busy machine extra threads only wait for
    each other (measured, 1500 steps: 2.2 s on one thread, 4.5 to 7.5 s on two, on a busy 2-core machine).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        model.eval()
    finally:
        torch.set_num_threads(threads)
    return losses


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` classified as ``y`` (0..1)."""
    model.eval()
    return float((model(x).argmax(dim=1) == y).float().mean())


def decision_grid(model: nn.Module, n: int = 200, lim: float = 1.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(xx, yy, label)`` over an ``n x n`` grid of the plane, for ``plt.contourf`` of the boundaries."""
    axis = torch.linspace(-lim, lim, n)
    xx, yy = torch.meshgrid(axis, axis, indexing="xy")
    with torch.no_grad():
        label = model(torch.stack([xx.flatten(), yy.flatten()], dim=1)).argmax(dim=1).view(n, n)
    return xx, yy, label
