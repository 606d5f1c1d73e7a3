"""A small decoder-only language model with random weights (lesson 14 and its lab).

The layout is Llama's: token embedding, ``n_layers`` pre-norm blocks of RMSNorm -> attention with
rotary position embeddings (RoPE) and grouped-query heads (GQA: ``n_kv_heads`` key/value heads shared
by ``n_heads`` query heads; ``n_kv_heads == n_heads`` is plain multi-head attention, ``1`` is MQA)
-> residual, RMSNorm -> SwiGLU MLP -> residual, then a final RMSNorm and the vocabulary head.

Nothing is downloaded: :func:`make_lm` draws the weights from a seed, so the judge and the learner
build the same model. The pieces of a block are separate methods, so that lab 14 can write the
KV-cached forward pass from them; :meth:`TinyLM.forward` recomputes every position from scratch
and is the reference that cached decoding must equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LMConfig:
    """The shape of a :class:`TinyLM`."""

    vocab: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 128
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of ``x`` (B, heads, T, head_dim) at integer ``positions`` (T,).

    Each pair of channels ``(i, i + head_dim/2)`` is rotated by the angle ``position * base^(-2i/head_dim)``,
    so a query at position m and a key at position n meet at an angle that depends on ``m - n`` only."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float64) / half)  # (half,)
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]                    # (T, half)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    """One pre-norm decoder block. ``x`` is (B, T, d_model) throughout."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"n_heads ({cfg.n_heads}) must be a multiple of n_kv_heads ({cfg.n_kv_heads}).")
        self.cfg = cfg
        hd = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model)
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """RMSNorm, then the q, k, v projections of the T positions of ``x``, with RoPE applied to q and k
        at ``positions`` (T,): q (B, n_heads, T, head_dim), k and v (B, n_kv_heads, T, head_dim)."""
        b, t, _ = x.shape
        h = self.attn_norm(x)
        hd, cfg = self.cfg.head_dim, self.cfg
        q = self.wq(h).view(b, t, cfg.n_heads, hd).transpose(1, 2)      # (B, H, T, hd)
        k = self.wk(h).view(b, t, cfg.n_kv_heads, hd).transpose(1, 2)   # (B, KV, T, hd)
        v = self.wv(h).view(b, t, cfg.n_kv_heads, hd).transpose(1, 2)   # (B, KV, T, hd)
        return rope(q, positions, cfg.rope_base), rope(k, positions, cfg.rope_base), v

    def project_out(self, o: torch.Tensor) -> torch.Tensor:
        """The attention output (B, n_heads, T, head_dim) -> the residual branch (B, T, d_model)."""
        b, _, t, _ = o.shape
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm, then the SwiGLU MLP: the MLP's residual branch (B, T, d_model)."""
        h = self.mlp_norm(x)
        return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(head_dim) + causal mask) v over all T positions, every key/value head
    shared by n_heads / n_kv_heads query heads: q (B, H, T, hd), k and v (B, KV, T, hd) -> (B, H, T, hd)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, T, hd): query head h reads key/value head h // group
    v = v.repeat_interleave(group, dim=1)
    t = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])               # (B, H, T, T)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)   # key j > query i
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


class TinyLM(nn.Module):
    """The model: ``forward(tokens)`` maps (B, T) token ids to (B, T, vocab) logits, recomputing
    every position (no cache). ``embed``, ``blocks[i].project_qkv / project_out / feed_forward``
    and ``logits`` are the pieces a cached forward pass is made of."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 token ids -> (B, T, d_model)."""
        return self.embedding(tokens)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and vocabulary head: (B, T, d_model) -> (B, T, vocab)."""
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)                                   # (B, T, d)
        for block in self.blocks:
            q, k, v = block.project_qkv(x, positions)
            x = x + block.project_out(causal_attention(q, k, v))
            x = x + block.feed_forward(x)
        return self.logits(x)                                    # (B, T, vocab)

    def truncated(self, n_layers: int) -> "TinyLM":
        """A model sharing this one's embedding, first ``n_layers`` blocks, final norm and head: a cheap
        *draft* for speculative decoding ("early exit", as in LayerSkip), whose guesses agree with the
        full model more often the more layers it keeps."""
        draft = TinyLM.__new__(TinyLM)
        nn.Module.__init__(draft)
        draft.cfg = LMConfig(**{**self.cfg.__dict__, "n_layers": n_layers})
        draft.embedding, draft.norm, draft.head = self.embedding, self.norm, self.head
        draft.blocks = nn.ModuleList(list(self.blocks)[:n_layers])
        return draft


def make_lm(cfg: LMConfig = LMConfig(), seed: int = 0, device="cpu", dtype=torch.float32,
            residual_scale: float = 0.5, head_gain: float = 2.0) -> TinyLM:
    """A :class:`TinyLM` in eval mode whose weights depend only on ``seed`` (drawn on the CPU in float32).

    ``residual_scale`` shrinks each block's output projections (as GPT-2 scales them by depth), so
    the residual stream changes a little per layer and a truncated draft still predicts well;
    ``head_gain`` sharpens the next-token distribution (random weights would give nearly uniform ones)."""
    gen = torch.Generator().manual_seed(seed)
    model = TinyLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name == "embedding.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # nn.Linear weights are (out, in)
                gain = head_gain if name == "head.weight" else (
                    residual_scale if name.endswith(("wo.weight", "w_down.weight")) else 1.0)
                p.copy_(gain * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    return model.to(device=device, dtype=dtype).eval()
