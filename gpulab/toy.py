"""A tiny model and its data for the multi-rank labs (lesson 11 introduces them).

Small enough for four gloo ranks on a laptop CPU, and built to expose the classic data-parallel
bugs: a **buffer** that changes the output (a replica that skips broadcasting buffers computes
different gradients) and a **frozen parameter** (``requires_grad=False``: no gradient, no hook,
no optimizer state, but it must still match rank 0).

Everything is initialised from an explicit ``seed`` through a private ``torch.Generator``, never
from the global RNG, so ``ToyMLP(seed=s)`` is bit-identical in every process. Distributed checks
build the model with ``seed + rank`` on each rank on purpose: only a wrapper that broadcasts rank
0's state makes the replicas agree.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyMLP(nn.Module):
    """``x (B, d_in) -> [Linear -> ReLU] * len(hidden) -> Linear -> (B, d_out)``, float32.

    Registration order (what ``.parameters()`` yields, first layer first)::

        layers.0.weight (h0, d_in), layers.0.bias (h0,), layers.1.weight (h1, h0), ...,
        layers.L.weight (d_out, h_last), layers.L.bias (d_out,), frozen_shift (d_out,) [frozen]

    plus one buffer ``input_scale (d_in,)``. The forward pass is
    ``layers(x * input_scale) + frozen_shift``.
    """

    def __init__(self, d_in: int = 8, hidden: tuple = (32, 32), d_out: int = 4, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(int(seed))
        dims = [d_in, *hidden, d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        with torch.no_grad():
            for layer in self.layers:
                bound = layer.in_features ** -0.5  # nn.Linear's default range, from our generator
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.uniform_(-bound, bound, generator=gen)
        self.frozen_shift = nn.Parameter(0.1 * torch.randn(d_out, generator=gen), requires_grad=False)
        self.register_buffer("input_scale", 1.0 + 0.5 * torch.rand(d_in, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.input_scale
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h + self.frozen_shift


def toy_batch(seed: int, batch: int, d_in: int = 8, d_out: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch ``(x (batch, d_in), y (batch, d_out))``, float32, from ``seed`` only."""
    gen = torch.Generator().manual_seed(int(seed))
    x = torch.randn(batch, d_in, generator=gen)
    w = torch.randn(d_in, d_out, generator=gen) / d_in ** 0.5
    y = torch.tanh(x @ w) + 0.05 * torch.randn(batch, d_out, generator=gen)
    return x, y


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of the rows of ``t`` (rows must divide evenly: then the
    mean of the ranks' mean losses is the mean loss of the whole batch)."""
    if t.shape[0] % world_size:
        raise ValueError(f"batch of {t.shape[0]} rows does not split evenly over {world_size} ranks.")
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]

