"""Tiny shared models (lesson 10 introduces them): a small, readable pre-norm transformer block.

The block is written op by op (no fused attention by default) so that every tensor autograd keeps
for the backward pass can be named, counted and checked against a formula, as in Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), section 4.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The pieces a selective checkpoint may recompute ("block": the whole block), and the combinations
# lab 10's planner chooses from, roughly cheapest first.
SUBLAYERS = ("attn_core", "attn", "mlp", "block")
RECOMPUTE_CANDIDATES = ((), ("attn_core",), ("mlp",), ("attn_core", "mlp"), ("attn",), ("attn", "mlp"), ("block",))


class TransformerBlock(nn.Module):
    """A pre-norm GPT block (GPT-2 / Megatron layout), with ``h = d_model``, ``a = n_heads``,
    ``d = h / a`` and ``f = d_ff`` (default ``4 h``)::

        x1 = x  + Drop(Proj(AttnCore(split(QKV(LN1(x))))))      # attention sublayer
        y  = x1 + Drop(FC2(GELU(FC1(LN2(x1)))))                    # MLP sublayer
        AttnCore(q, k, v) = Drop(softmax(q kᵀ / sqrt(d) + causal_bias)) v

    Inputs and outputs are ``(b, s, h)`` in the parameters' dtype. One dropout probability ``p``
    serves all three dropouts; with ``p == 0`` (or in ``eval()`` mode) they are skipped entirely.

    **What autograd saves for backward** (``attn_impl="math"``, training mode), per block, with
    ``t = b * s`` tokens, activations in the parameters' dtype (``e`` bytes per element), dropout
    masks as ``torch.bool`` (1 byte) and LayerNorm statistics in float32 (4 bytes):

    ==========================  ===============================  ====================
    op                          saved tensor                     elements
    ==========================  ===============================  ====================
    LN1                         its input x, mean, rstd          t h  (+ 2 t fp32)
    QKV linear                  its input LN1(x)                 t h
    q kᵀ                        q and k                          2 t h
    softmax                     its output P                     b a s s
    attention dropout           its mask (bool)                  b a s s  (1 byte)
    P v                         dropout(P) and v                 b a s s + t h
    output projection           its input (heads merged)         t h
    residual dropout            its mask (bool)                  t h  (1 byte)
    LN2                         its input x1, mean, rstd         t h  (+ 2 t fp32)
    FC1                         its input LN2(x1)                t h
    GELU                        its input FC1(...)               t f
    FC2                         its input GELU(...)              t f
    MLP dropout                 its mask (bool)                  t h  (1 byte)
    ==========================  ===============================  ====================

    Total: ``t (8 h + 2 f) e + 2 b a s² e + b a s² + 2 t h + 16 t`` bytes; with ``f = 4 h`` and
    ``e = 2`` this is Korthikanti's ``s b h (34 + 5 a s / h)`` plus the LayerNorm statistics the paper
    leaves out. Without dropout the masks disappear and ``dropout(P)`` *is* ``P`` (one tensor, counted
    once), so the attention core keeps only ``b a s² e``. Weights are saved too, but they are
    parameters (already in memory), not activations. Counting is by storage: ``q``, ``k`` and ``v``
    are views of one ``(b, s, 3 h)`` buffer, or copies of ``t h`` each, depending on ``b``; either
    way they hold ``3 t h`` elements. The causal mask is an additive bias, so the addition saves
    nothing (``masked_fill`` would save a boolean ``s x s`` mask).

    ``attn_impl="sdpa"`` uses ``F.scaled_dot_product_attention`` instead (FlashAttention-style
    kernels on a GPU keep no ``s x s`` tensor); the table above then no longer applies to the core.
    """

    def __init__(self, d_model: int = 64, n_heads: int = 2, d_ff: int | None = None, dropout: float = 0.0,
                 causal: bool = True, attn_impl: str = "math", device=None, dtype=None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads}).")
        if attn_impl not in ("math", "sdpa"):
            raise ValueError(f"attn_impl must be 'math' or 'sdpa', got {attn_impl!r}.")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.d_ff = d_model, n_heads, d_ff or 4 * d_model
        self.head_dim = d_model // n_heads
        self.p, self.causal, self.attn_impl = float(dropout), causal, attn_impl
        self.ln1 = nn.LayerNorm(d_model, **kw)
        self.qkv = nn.Linear(d_model, 3 * d_model, **kw)
        self.proj = nn.Linear(d_model, d_model, **kw)
        self.ln2 = nn.LayerNorm(d_model, **kw)
        self.fc1 = nn.Linear(d_model, self.d_ff, **kw)
        self.fc2 = nn.Linear(self.d_ff, d_model, **kw)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_ff={self.d_ff}, dropout={self.p}, "
                f"causal={self.causal}, attn_impl={self.attn_impl!r}")

    # -- pieces, so a selective checkpoint can wrap any of them ------------------------------------
    def drop(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout with the block's ``p``; skipped (no op, no mask) when ``p == 0`` or in eval mode.

        Written out rather than ``F.dropout`` so that it saves the same thing on every device: a
        ``torch.bool`` keep-mask (1 byte per element; ``F.dropout`` on a CPU saves a full-precision
        noise tensor instead). The mask comes from the device's default generator: recomputing it
        needs that generator's state (lesson 10)."""
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(x.shape, device=x.device) >= self.p   # bool, same shape as x
        return x * keep * (1.0 / (1.0 - self.p))                  # mul saves only `keep`

    def split_heads(self, x: torch.Tensor):
        """LN1 then QKV: ``(b, s, h)`` -> ``q, k, v`` each ``(b, a, s, d)`` (views of one buffer)."""
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x))                                   # (b, s, 3h)
        qkv = qkv.view(b, s, 3, self.n_heads, self.head_dim)          # (b, s, 3, a, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                # 3 x (b, a, s, d)
        return q, k, v

    def attn_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``Drop(softmax(q kᵀ / sqrt(d) + causal_bias)) v``: ``(b, a, s, d)`` x3 -> ``(b, a, s, d)``.
        The part of the block whose saved tensors grow with ``s²``."""
        if self.attn_impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                                  is_causal=self.causal)
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (b, a, s, s)
        if self.causal:  # additive bias: the addition saves nothing for backward
            bias = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
            scores = scores + bias
        probs = torch.softmax(scores, dim=-1)                         # (b, a, s, s)
        return torch.matmul(self.drop(probs), v)                      # (b, a, s, d)

    def merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        """``(b, a, s, d)`` -> ``(b, s, h)`` (a copy: the transpose is not contiguous)."""
        b, a, s, d = o.shape
        return o.transpose(1, 2).reshape(b, s, a * d)

    def attn_out(self, o: torch.Tensor) -> torch.Tensor:
        """Output projection and residual dropout of the attention sublayer: ``(b, a, s, d)`` -> ``(b, s, h)``."""
        return self.drop(self.proj(self.merge_heads(o)))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """The attention sublayer's residual branch (LN1 included): ``(b, s, h)`` -> ``(b, s, h)``."""
        return self.attn_out(self.attn_core(*self.split_heads(x)))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP sublayer's residual branch (LN2 included): ``(b, s, h)`` -> ``(b, s, h)``."""
        return self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)   # (b, s, h)
        return x + self.mlp(x)      # (b, s, h)


def make_block(d_model: int = 64, n_heads: int = 2, d_ff: int | None = None, dropout: float = 0.0,
               causal: bool = True, seed: int = 0, device="cpu", dtype=torch.float32,
               attn_impl: str = "math") -> TransformerBlock:
    """A :class:`TransformerBlock` in training mode whose weights depend only on ``seed`` (built on
    the CPU in float32, then moved), so two processes build the same block."""
    gen = torch.Generator().manual_seed(seed)
    block = TransformerBlock(d_model, n_heads, d_ff, dropout, causal, attn_impl)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.startswith("ln"):  # LayerNorm: weight near 1, bias near 0
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else block.d_model
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
    return block.to(device=device, dtype=dtype).train()
