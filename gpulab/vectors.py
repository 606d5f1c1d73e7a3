"""Seeded clustered vectors for k-means and vector search (lesson 15).

Nothing is downloaded: points are drawn around random centres, so a k-means has clusters to find
and an approximate index has neighbourhoods to exploit, like embeddings of related items.
"""
from __future__ import annotations

import torch


def make_blobs(n: int, d: int, centers: int, seed: int = 0, spread: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points (n, d) float32, centres (centers, d) float32)``: each point a centre (standard
    normal, drawn from ``seed``) plus ``spread`` times standard normal noise; centres in turn."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(centers, d, generator=gen)
    which = torch.arange(n) % centers                         # (n,): the centre of each point, in turn
    return mu[which] + spread * torch.randn(n, d, generator=gen), mu
