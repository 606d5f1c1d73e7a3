"""Tensor parallelism helpers (lesson 12 introduces them; lab 12 and its checks use them).

- :class:`MLP` and :class:`SelfAttention`: the single-device transformer blocks that Megatron-LM's
  tensor parallelism splits (Shoeybi et al., "Megatron-LM", 2019, section 3). Their weights use
  ``nn.Linear``'s layout ``(out_features, in_features)``; the attention's fused ``qkv`` projection
  is laid out ``[q | k | v]``, each block ``hidden = n_heads * head_dim`` rows, head after head.
- :class:`MLPBlock`: the pre-LayerNorm residual MLP block that sequence parallelism shards along the
  sequence (Korthikanti et al., 2022), and :func:`activation_bytes`, the bytes a region's autograd
  nodes saved for backward (lab 12 measures the LayerNorm region per rank with it).
- :class:`MoEWeights`: router and experts of a mixture-of-experts layer (lab 12's expert parallelism).
- Counting the collectives a rank issues is :func:`gpulab.commlog.record_collectives` (lesson 11).
- :func:`draw_megatron`: the picture of which collective each tensor-parallel layer issues,
  forward and backward (the f and g operators).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """The transformer MLP ``fc2(GELU(fc1(x)))``: x (..., hidden) -> (..., hidden); exact (erf) GELU."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden, bias=bias)   # weight (ffn_hidden, hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden, bias=bias)   # weight (hidden, ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MLPBlock(nn.Module):
    """A pre-LayerNorm residual MLP block, ``x + dropout(MLP(LayerNorm(x)))``: x (batch, seq, hidden) float32
    -> (batch, seq, hidden). Lab 12's sequence parallelism shards its LayerNorm and dropout regions along seq."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn_hidden, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.mlp(self.ln(x)))


class MoEWeights(nn.Module):
    """The weights of a single-device mixture-of-experts layer (lab 12's expert parallelism loads its shards
    from it): ``router = nn.Linear(hidden, num_experts, bias=False)`` (weight (E, hidden)) and ``experts``, an
    ``nn.ModuleList`` of ``num_experts`` :class:`MLP` (hidden -> ffn_hidden -> hidden). The routing itself is
    the lab's exercise, so this holds no forward."""

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int):
        super().__init__()
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, ffn_hidden) for _ in range(num_experts))


def activation_bytes(y: torch.Tensor, op: str = "LayerNorm") -> int:
    """Bytes of the activations that autograd nodes whose name contains ``op`` saved for backward,
    walking ``y``'s graph (call it before backward frees them). Activations only: saved tensors of two
    or more dims (a LayerNorm's input and its per-token mean and rstd, not its (hidden,) weight)."""
    seen, stack, total = set(), [y.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if op in node.name():
            for name in dir(node):
                value = getattr(node, name, None) if name.startswith("_saved_") else None
                if isinstance(value, torch.Tensor) and value.dim() >= 2:
                    total += value.numel() * value.element_size()
        stack.extend(n for n, _ in node.next_functions)
    return total


class SelfAttention(nn.Module):
    """Multi-head self-attention (causal by default): x (batch, seq, hidden) -> (batch, seq, hidden).

    ``qkv = nn.Linear(hidden, 3 * hidden)``: rows ``[0, hidden)`` make q, ``[hidden, 2 hidden)`` k and
    ``[2 hidden, 3 hidden)`` v; inside each block, head ``j`` owns rows ``j * head_dim .. (j + 1) * head_dim``.
    ``proj = nn.Linear(hidden, hidden)`` mixes the concatenated heads.
    """

    def __init__(self, hidden: int, n_heads: int, bias: bool = True, causal: bool = True):
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of n_heads ({n_heads}).")
        self.hidden, self.n_heads, self.head_dim, self.causal = hidden, n_heads, hidden // n_heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q, k, v = self.qkv(x).split(self.hidden, dim=-1)                            # each (B, S, hidden)
        q, k, v = (t.view(B, S, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, S, d)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)           # (B, H, S, d)
        return self.proj(o.transpose(1, 2).reshape(B, S, self.hidden))               # (B, S, hidden)


# --- the picture ---------------------------------------------------------------------------------

def draw_megatron(tp: int = 2, axes=None):
    """Boxes and arrows: Megatron's MLP and self-attention split over ``tp`` ranks, with the f and g
    operators and the collective each issues in forward and backward. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if axes is None:
        fig, axes = plt.subplots(2, 1, figsize=(11, 2.4 + 1.3 * tp))
    else:
        fig = axes[0].figure
    blocks = [
        ("Megatron MLP", ["X·A$_{%d}$\ncolumn-parallel\n(A split by columns)", "GeLU\n(local: no comm)",
                          "·B$_{%d}$\nrow-parallel\n(B split by rows)"]),
        ("Megatron self-attention", ["QKV$_{%d}$\ncolumn-parallel\n(heads of rank %d)",
                                     "softmax(QKᵀ)V\nper head (local)", "·O$_{%d}$\nrow-parallel\n(proj rows)"]),
    ]
    for ax, (title, stages) in zip(axes, blocks):
        ax.set_xlim(0, 12)
        ax.set_ylim(-0.85, tp + 0.05)
        ax.axis("off")

        def box(x, y, w, h, text, color, fs=8):
            ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                        fc=color, ec="black", lw=0.8))
            ax.text(x, y, text, ha="center", va="center", fontsize=fs)

        def arrow(x0, y0, x1, y1):
            ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10, lw=0.8))

        mid = (tp - 1) / 2 + 0.2
        box(0.7, mid, 1.1, 0.7, "X\n(replicated)", "#eeeeee")
        box(2.1, mid, 0.7, 0.7, "f", "#ffe082", fs=12)
        ax.text(2.1, mid - 0.62, "fwd: identity\nbwd: all-reduce", ha="center", va="top", fontsize=7,
                color="#8d6e00")
        arrow(1.25, mid, 1.75, mid)
        xs = [4.0, 6.1, 8.2]
        for r in range(tp):
            y = tp - 1 - r + 0.2
            arrow(2.45, mid, xs[0] - 0.85, y)
            for i, (x, text) in enumerate(zip(xs, stages)):
                label = text % ((r, r) if text.count("%d") == 2 else (r,)) if "%d" in text else text
                box(x, y, 1.7, 0.78, label, ["#bbdefb", "#c8e6c9", "#bbdefb"][i], fs=7)
                if i:
                    arrow(xs[i - 1] + 0.85, y, x - 0.85, y)
            ax.text(xs[0] - 1.25, y + 0.45, f"rank {r}", fontsize=7, color="gray")
            arrow(xs[-1] + 0.85, y, 9.75, mid)
        box(10.1, mid, 0.7, 0.7, "g", "#ef9a9a", fs=12)
        ax.text(10.1, mid - 0.62, "fwd: all-reduce\nbwd: identity", ha="center", va="top", fontsize=7,
                color="#b71c1c")
        box(11.35, mid, 1.0, 0.7, "Z\n(replicated)", "#eeeeee")
        arrow(10.45, mid, 10.85, mid)
        ax.set_title(f"{title} over {tp} ranks: 1 all-reduce in forward (g), 1 in backward (f), "
                     "each of batch·seq·hidden elements", fontsize=9)
    fig.tight_layout()
    return fig
