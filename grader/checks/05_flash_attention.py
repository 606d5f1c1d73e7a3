"""Checks of lab 05, FlashAttention: reference attention, its memory, FlashAttention-2 in plain PyTorch
(a tiled autograd.Function), a tiled forward kernel with online softmax and log-sum-exp, causal masking
with early exit, and (stretch) the backward pass.

Conventions (stated in the lab's docstrings): q (batch, heads, seq_q, head_dim), k and v (batch, heads,
seq_k, head_dim), out like q; lse float32 (batch, heads, seq_q), the natural log of sum_j exp(scale *
q_i . k_j), scale included; causal masking aligned top-left, as ``F.scaled_dot_product_attention(is_causal=True)``
(query i attends keys 0..i, all keys once i >= seq_k - 1, so no row is ever empty).

The kernel checks (``grader.kit.kernels``) pass non-square tiles, BLOCK_M, BLOCK_N = 64, 32 or 32, 64
(so a mix-up shows), and q, k, v contiguous, as (B, S, H, D) tensors seen transposed, or row-padded
(rows further apart than D, the gaps NaN); one forward case leaves ``out`` and ``lse`` to the wrapper,
in float16. The causal kernel also returns how many key blocks each program processed, compared with
an early exit's count, and one case fills the keys no query can see with NaN, so a kernel that loads
them anyway fails whatever it reports. The backward is compared with float64 autograd, what its
forward saved is measured (at most q, k, v, out and the lse), and a Triton kernel must launch in backward.

The PyTorch FlashAttention-2 (``FlashAttentionPyTorch``, called as CS336's tests call it: ``apply(q, k, v,
causal)``, scale left to its 1/sqrt(d) default unless the case sets one) takes (B, S, D) and (B, H, S, D)
float32 tensors; its out, the log-sum-exp read back from its saved tensors (exactly one of shape q.shape[:-1])
and dq, dk, dv are compared with float64 autograd. What it keeps is measured (``gpulab.launches``): saved
tensors at most q, k, v, out and a float32 L, nothing of P's size on ctx, no whole (seq_q, seq_k) tensor
created in forward or backward (tiles of at most 64), and, without a causal mask, at least the five
(Sq x Sk x D) matmuls of a backward that recomputes P. The Triton backward's check also calls
``FlashAttentionFunction.apply(q, k, v, causal)`` on (B, S, D) tensors and wants a (B, Sq) lse saved.

Hidden cases are random sizes inside fixed rules: every seed's hidden set has seq_k = seq_q, seq_k <
seq_q and seq_k > seq_q (causal and not), both tile orientations, fp16 and fp32, large scores, the
transposed and row-padded layouts (tests/test_checks_05.py checks it).
"""
from __future__ import annotations

import math
from functools import partial

import torch

from gpulab.compare import compare
from grader.exercise import Benchmark, Case, Exercise, changed_inputs
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.helpers import offering
from grader.kit.kernels import (
    bounds_verdict,
    final_verdict,
    launch_verdict,
    mismatch_verdict,
    outside_verdict,
)
from grader.kit.variants import matching_variant, tensor_match
from grader.runs import run_side

LAB = "05_flash_attention"
RUN = run_side(LAB)  # the learner side: grader/runs/05_flash_attention.py
TITLE = "FlashAttention: IO-aware attention"

# (BLOCK_M, BLOCK_N) passed by the kernel checks, alternating: non-square, so that a kernel using one
# where the other belongs fails; small enough for the interpreter.
TILES = ((64, 32), (32, 64))
SEQ_SHAPES = ("seq_k = seq_q", "seq_k < seq_q", "seq_k > seq_q")
LN2 = math.log(2.0)
_TASK = "compute attention with your @triton.jit kernel, not with PyTorch (F.scaled_dot_product_attention included)"


# --- the reference, in float64 ----------------------------------------------------------------

def _scores64(q, k, causal: bool, scale: float | None, diagonal: int = 0):
    """scale * q kᵀ (B, H, Sq, Sk) of float64 q and k; causal: key j > query i + diagonal is -inf (top-left)."""
    s = (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale) * (q @ k.transpose(-1, -2))
    if causal:
        s = s.masked_fill(~torch.ones(*s.shape[-2:], dtype=torch.bool).tril(diagonal), float("-inf"))
    return s


def attention64(q, k, v, causal: bool, scale: float | None):
    """(out, lse) of softmax(scale * q k^T [+ top-left causal mask]) v in float64, on the CPU."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    sq = q.shape[-2]
    if causal and k.shape[-2] > sq:  # keys sq.. are seen by no query (top-left): drop them (they may hold NaN)
        k, v = k[..., :sq, :], v[..., :sq, :]
    s = _scores64(q, k, causal, scale)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)  # lse: (B, H, Sq)


def _padded_keys64(q, k, v, causal, scale, block):
    """What a kernel computes when it forgets the key mask: keys padded to a multiple of ``block``
    with k = 0 (score 0) and v = 0 enter the softmax."""
    pad = (-k.shape[-2]) % block
    if pad == 0 or causal:  # causal: padded keys sit beyond every real key, only rows past them would see them
        return None
    zeros = torch.zeros(*k.shape[:-2], pad, k.shape[-1], dtype=k.dtype)
    return attention64(q, torch.cat([k, zeros], -2), torch.cat([v, zeros], -2), False, scale)


def _matches_strict_mask(out, q, k, v, scale, dtype, tol) -> bool:
    """Whether ``out`` equals causal attention with a strict mask (key j < query i), the `<` for `<=`
    mistake, on every row that has a key under that mask (row 0 has none: NaN there)."""
    if not isinstance(out, torch.Tensor) or out.shape[-2] < 2:
        return False
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    want = torch.softmax(_scores64(q, k, True, scale, diagonal=-1), dim=-1) @ v
    return compare(out[..., 1:, :], want[..., 1:, :], dtype=dtype, **tol) is None


# --- inputs ------------------------------------------------------------------------------------

def _qkv(gen, b, h, sq, sk, d, dtype="float32", magnitude=1.0, layout="bhsd", scale=None,
         hide_unseen=False, tiles=TILES[0], causal=None, dout=False):
    """Inputs for one case. ``layout="bshd"`` stores q, k, v as (B, S, H, D): the learner's side
    sees the (B, H, S, D) transposed view, the layout a fused QKV projection produces.
    ``layout="rows"`` stores them as (B, H, S, D + ROW_PAD), the extra columns NaN: the learner's side
    sees the (B, H, S, D) view whose rows are D + ROW_PAD apart. ``layout="bsd"`` makes one head of
    (B, S, D) tensors (``h`` is ignored), the layout of CS336's tests. ``tiles``: the (BLOCK_M, BLOCK_N)
    a kernel check passes. ``causal`` (the reference and backward exercises, whose entries take it)
    and ``dout`` (the backward's incoming gradient) are added to the inputs when given."""
    dt = getattr(torch, dtype)
    shape = {"bshd": lambda s: (b, s, h, d), "bsd": lambda s: (b, s, d)}.get(layout, lambda s: (b, h, s, d))
    q, k, v = (randn(gen, *shape(s), scale=m).to(dt) for s, m in ((sq, magnitude), (sk, magnitude), (sk, 1.0)))
    if hide_unseen:  # keys past the last query tile: no query sees them, an early exit never loads them
        first = -(-sq // 128) * 128
        k[:, :, first:] = float("nan")
        v[:, :, first:] = float("nan")
    if layout == "rows":
        q, k, v = (torch.cat([t, torch.full((*t.shape[:-1], RUN.ROW_PAD), float("nan"), dtype=dt)], -1) for t in (q,
                                                                                                                  k, v))
    inp = dict(q=q, k=k, v=v, layout=layout, scale=scale, magnitude=magnitude, block_m=tiles[0], block_n=tiles[1])
    if causal is not None:
        inp["causal"] = causal
    if dout:
        inp["dout"] = randn(gen, *(shape(sq) if layout == "bsd" else (b, h, sq, d))).to(dt)
    return inp


_LAYOUT_NAMES = {"bhsd": "", "bsd": ", q/k/v are (B, S, D): one head, CS336's layout",
                 "bshd": ", q/k/v are (B, S, H, D) tensors seen transposed (non-contiguous)",
                 "rows": f", q/k/v row-padded (rows D + {RUN.ROW_PAD} apart: stride(2) > D)"}


def _name(inp: dict, extra: str = "") -> str:
    """The case's name: sizes, layout, scale, and the tiles (kernel checks) or ``causal`` (the others)."""
    q, k = RUN._view(inp["q"], inp["layout"]), RUN._view(inp["k"], inp["layout"])
    heads = "" if q.ndim == 3 else f" H={q.shape[1]}"
    text = f"B={q.shape[0]}{heads} seq_q={q.shape[-2]} seq_k={k.shape[-2]} D={q.shape[-1]} "
    text += str(q.dtype).replace("torch.", "")
    text += _LAYOUT_NAMES[inp["layout"]]
    if inp["scale"] is not None:
        text += f", scale={inp['scale']:.3g}"
    if inp["magnitude"] > 1:
        text += f", large scores (|s| up to ~{_max_score(inp):.0f}: exp overflows without the max)"
    if "causal" in inp:
        text += f", causal={inp['causal']}"
    else:  # only the kernel checks pass tiles
        text += f"; BLOCK_M={inp['block_m']}, BLOCK_N={inp['block_n']}"
    return text + extra


def _max_score(inp) -> float:
    q, k = RUN._view(inp["q"], inp["layout"]).double(), RUN._view(inp["k"], inp["layout"]).double()
    scale = inp["scale"] or 1 / math.sqrt(q.shape[-1])
    return float(torch.nan_to_num(scale * q @ k.transpose(-1, -2), nan=0.0).abs().max())


def _cases(gen, specs) -> list[Case]:
    """One case per ``(b, h, seq_q, seq_k, head_dim, _qkv keywords[, name suffix])``, tiles TILES[i % 2]."""
    cases = []
    for i, (b, h, sq, sk, d, kw, *extra) in enumerate(specs):
        inp = _qkv(gen, b, h, sq, sk, d, tiles=TILES[i % 2], **kw)
        cases.append(Case(_name(inp, *extra), inp))
    return cases


def _ragged(gen, lo, hi) -> int:
    """A random integer in [lo, hi], not a multiple of 16 (every tile size here): a partial last tile."""
    n = randint(gen, lo, hi)
    return n - 1 if n % 16 == 0 else n


def _seq_pair(gen, shape: str, max_seq: int) -> tuple[int, int]:
    """(seq_q, seq_k) in [1, max_seq] related as ``shape`` (one of SEQ_SHAPES). Unequal lengths differ
    by at least 64 (max_seq / 2 if smaller): more than a key block, so using one for the other shows."""
    if shape == "seq_k = seq_q":
        a = _ragged(gen, 2, max_seq)
        return a, a
    gap = min(64, max_seq // 2)
    long = _ragged(gen, gap + 1, max_seq)
    short = _ragged(gen, 1, long - gap)
    return (long, short) if shape == "seq_k < seq_q" else (short, long)


def _random_attention_cases(gen, n, causal_mix: bool, max_seq=128):
    """``n`` cases of random sizes inside fixed rules: case i has SEQ_SHAPES[i % 3], tiles TILES[i % 2],
    float32 and float16 alternating, large scores (case 2), the transposed layout with whole tiles
    (case 3) and, with ``causal_mix``, causal on odd cases (so both kinds meet every shape in 6 cases)."""
    cases = []
    for i in range(n):
        b, h = choice(gen, [(1, 1), (1, 2), (2, 1)])
        if i == 3:  # (B, S, H, D) seen transposed: two heads, so a row stride is not D; whole tiles
            b, h = 1, 2
            sq = sk = 64 * randint(gen, 1, max_seq // 64)
        else:
            sq, sk = _seq_pair(gen, SEQ_SHAPES[i % 3], max_seq)
        d = choice(gen, [16, 32, 64])
        big = i == 2
        scale = None if big or randint(gen, 0, 1) else uniform(gen, 0.05, 1.05)
        inp = _qkv(gen, b, h, sq, sk, d, dtype="float32" if big else ["float32", "float16"][i % 2],
                   magnitude=6.0 if big else 1.0, layout="bshd" if i == 3 else "bhsd", scale=scale,
                   tiles=TILES[i % 2], causal=bool(i % 2) if causal_mix else None)
        cases.append(Case(_name(inp), inp))
    return cases


def _rows_case(gen) -> Case:
    """Row-padded q, k, v (random sizes past one 64-tile, so tile mix-ups show too)."""
    sq, sk = _ragged(gen, 65, 128), _ragged(gen, 65, 128)
    inp = _qkv(gen, 1, choice(gen, [1, 2]), sq, sk, 32, dtype="float16", layout="rows", tiles=TILES[0])
    return Case(_name(inp), inp)


def _one_tile_multiple_case(gen) -> Case:
    """seq_k a multiple of BLOCK_M = 32 but not of BLOCK_N = 64 (tiles TILES[1]): a kernel that decides
    whether its key loads need masks by the wrong tile size reads past the last key. More queries than
    keys by over a key block, so that a causal kernel's unmasked (left of the diagonal) blocks reach it too."""
    sk = 32 * (2 * randint(gen, 0, 1) + 1)  # 32 or 96
    sq = _ragged(gen, sk + 65, sk + 100)
    inp = _qkv(gen, 1, choice(gen, [1, 2]), sq, sk, 32, tiles=TILES[1])
    return Case(_name(inp), inp)


# --- tolerances and diagnoses ----------------------------------------------------------------------

# compare's keyword arguments for (out, lse) per kind of case and whether it runs on a GPU. fp16 outputs:
# fp16's tolerance. fp32: 1e-5, except where fp32 rounding of large scores moves the softmax (the
# large-magnitude cases) and on a GPU, where ``tl.dot`` rounds fp32 inputs to TF32 (10-bit mantissa) by default.
_TOLERANCES = {
    ("float16", False): ({}, {}),
    ("float16", True): ({}, {"atol": 3e-5, "rtol": 3e-5}),
    ("float32", False): ({"atol": 1e-5, "rtol": 1e-5}, {}),
    ("float32", True): ({"atol": 1e-2, "rtol": 1e-2}, {"atol": 1e-2, "rtol": 1e-3}),
    ("large", False): ({"atol": 2e-3, "rtol": 2e-3}, {"atol": 1e-3, "rtol": 1e-5}),
    ("large", True): ({"atol": 2e-3, "rtol": 2e-3}, {"atol": 0.5, "rtol": 1e-2}),
}


def _tolerances(inp: dict, device: str) -> dict:
    kind = "large" if inp["magnitude"] > 1 else str(inp["q"].dtype).replace("torch.", "")
    out, lse = _TOLERANCES[kind, device == "cuda"]
    return {"out": out, "lse": lse}


def _near(got: torch.Tensor, want: torch.Tensor) -> bool:
    """``got`` is ``want`` within 1e-3 wherever ``want`` is finite (somewhere): an lse mistake's signature."""
    ok = torch.isfinite(want)
    return bool(ok.any()) and bool(((got - want).abs()[ok] <= 1e-3 + 1e-3 * want.abs()[ok]).all())


def _lse_diagnosis(got, want: torch.Tensor, q, k, scale, causal: bool) -> str:
    """A hint when lse matches a classic mistake: log2 units, the max left out, the scale left out."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    qd, kd = q.detach().double(), k.detach().double()
    m = _scores64(qd, kd, causal, scale).amax(-1)  # each row's max score
    no_max = "\n  Your lse lacks the running max: lse = m + log(l), where l was summed as exp(s - m)."
    return matching_variant(got.detach().double(), [
        ("\n  Your lse is in log2 units: multiply by ln 2 (the check wants the natural log).", want / LN2),
        (no_max, want - m), (no_max, (want - m) / LN2),
        ("\n  Your lse ignores the scale: it is the log-sum-exp of the *scaled* scores.",
         lambda: torch.logsumexp(_scores64(qd, kd, causal, 1.0), -1)),
    ], _near) or ""


# --- exercise 1: reference attention --------------------------------------------------------------

def _reference_cases(gen, public):
    if not public:
        return _random_attention_cases(gen, 6, causal_mix=True, max_seq=200)
    return _cases(gen, [(1, 2, 64, 64, 32, dict(causal=False)), (1, 2, 64, 64, 32, dict(causal=True)),
                        (2, 1, 37, 100, 16, dict(dtype="float16", causal=True)), (1, 1, 100, 37, 16, dict(causal=True)),
                        (1, 1, 50, 70, 64, dict(scale=0.3, causal=False)),
                        (1, 1, 64, 64, 64, dict(magnitude=6.0, causal=False)),
                        (1, 1, 64, 64, 64, dict(magnitude=6.0, causal=True))])


def _reference_judge(case, obs):
    x = case.inputs
    if "bad_return" in obs:
        return f"attention_reference must return a pair (out, lse), got {obs['bad_return']}."
    q, k, v = (RUN._view(x[n], x["layout"]) for n in ("q", "k", "v"))
    out64, lse64 = attention64(q, k, v, x["causal"], x["scale"])
    tol = _tolerances(x, "cpu")
    msg = compare(obs["out"], out64, dtype=q.dtype, name="out", **tol["out"])
    if msg:
        if x["causal"] and isinstance(obs["out"], torch.Tensor) and obs["out"].shape == out64.shape and \
                _matches_strict_mask(obs["out"], q, k, v, x["scale"], q.dtype, tol["out"]):
            msg += "\n  Your output matches a strict mask (key j < query i): query i must also attend to key i."
        elif x["magnitude"] > 1:
            msg += "\n  Large scores overflow exp(): subtract each row's max before exponentiating."
        return msg
    msg = compare(obs["lse"], lse64, dtype=torch.float32, name="lse", **tol["lse"])
    if msg:
        return msg + _lse_diagnosis(obs["lse"], lse64, q, k, x["scale"], x["causal"])
    return changed_inputs(case, obs["inputs_after"])


REFERENCE = Exercise("attention_reference", 2, ("attention_reference",), _reference_cases, RUN._reference_run,
                     _reference_judge, title="Reference attention with log-sum-exp",
                     hint="s = scale * q @ k.transpose(-1, -2) in float32; causal: s.masked_fill(~ones(Sq, Sk)"
                          ".tril(), -inf); lse = torch.logsumexp(s, -1); out = softmax(s) @ v, cast to q's dtype.")


# --- exercise 2: memory of naive vs flash attention ----------------------------------------------

def ref_attention_memory_bytes(batch, heads, seq_q, seq_k, dtype_bytes, flash=False) -> int:
    if flash:
        return 4 * batch * heads * seq_q            # lse, float32
    return 2 * batch * heads * seq_q * seq_k * dtype_bytes  # S and P


def _memory_cases(gen, public):
    specs = [(1, 32, 4096, 4096, 2), (4, 16, 8192, 8192, 2), (1, 1, 1, 1, 4), (2, 3, 5, 7, 4)]
    if not public:  # every dtype size and every SEQ_SHAPES relation
        specs = []
        for i in range(5):
            sq, sk = _seq_pair(gen, SEQ_SHAPES[i % 3], 1 << 17)
            specs.append((randint(gen, 1, 16), randint(gen, 1, 64), sq, sk, [1, 2, 4][i % 3]))
    return [Case(f"batch={b} heads={h} seq_q={sq} seq_k={sk} dtype_bytes={nb} flash={f}",
                 dict(batch=b, heads=h, seq_q=sq, seq_k=sk, dtype_bytes=nb, flash=f))
            for b, h, sq, sk, nb in specs for f in (False, True)]


def _memory_judge(case, obs):
    want = ref_attention_memory_bytes(**case.inputs)
    got = obs["bytes"]
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got != want:
        x = case.inputs
        what = ("the log-sum-exp only: (batch, heads, seq_q) float32" if x["flash"] else
                "S and P, each (batch, heads, seq_q, seq_k) of dtype_bytes")
        return f"attention_memory_bytes = {got!r}, expected {want} ({what}) for {x}."
    return None


MEMORY = Exercise("attention_memory", 1, ("attention_memory_bytes",), _memory_cases, RUN._memory_run, _memory_judge,
                  title="Memory: naive S and P vs flash's log-sum-exp", hint="naive: two (batch, heads, seq_q, "
                  "seq_k) tensors of dtype_bytes; flash: one (batch, heads, seq_q) float32 tensor.")


# --- exercise 3: FlashAttention-2 in plain PyTorch ------------------------------------------------

PT_TILE = 64  # the largest tile the docstring allows: longer sequences than this need several tiles


def _pytorch_case(gen, rule, b, h, sq, sk, d, causal, scale=None, magnitude=1.0) -> Case:
    """One case of ``FlashAttentionPyTorch``: float32 (B, S, D) tensors when ``h`` is None, else (B, H, S, D)."""
    inp = _qkv(gen, b, h or 1, sq, sk, d, layout="bsd" if h is None else "bhsd", scale=scale,
               magnitude=magnitude, causal=causal, dout=True)
    call = "apply(q, k, v, causal)" if scale is None else "apply(q, k, v, causal, scale)"
    return Case(f"{rule}: {_name(inp)}, called as FlashAttentionPyTorch.{call}", inp)


def _pytorch_cases(gen, public):
    if public:
        return [_pytorch_case(gen, "3-D", 2, None, 77, 77, 32, False),
                _pytorch_case(gen, "4-D causal", 1, 2, 70, 100, 16, True),
                _pytorch_case(gen, "4-D causal", 1, 1, 100, 45, 32, True),
                _pytorch_case(gen, "large scores", 1, None, 80, 80, 64, False, magnitude=6.0),
                _pytorch_case(gen, "explicit scale", 1, 1, 65, 65, 16, True, scale=0.3)]
    cases = []  # 3-D and 4-D, causal and not, every length past one tile and ragged
    for rule, h, causal in [("3-D", None, False), ("3-D causal", None, True), ("4-D", 2, False),
                            ("4-D causal", 2, True)]:
        sq, sk = _ragged(gen, PT_TILE + 1, 150), _ragged(gen, PT_TILE + 1, 150)
        cases.append(_pytorch_case(gen, rule, randint(gen, 1, 2), h, sq, sk, choice(gen, [16, 32, 64]), causal))
    sq = _ragged(gen, PT_TILE + 1, 130)
    cases.append(_pytorch_case(gen, "large scores", 1, None, sq, sq, 64, False, magnitude=6.0))
    cases.append(_pytorch_case(gen, "explicit scale", 1, 2, _ragged(gen, PT_TILE + 1, 130), _ragged(gen, 1, 130),
                               32, True, scale=round(uniform(gen, 0.05, 1.05), 3)))
    return cases


def _full_scores(shapes, sq, sk) -> tuple | None:
    """The first shape ending in (Sq, Sk) or (Sk, Sq): a whole score matrix, not a tile."""
    return next((s for s in shapes if len(s) >= 2 and tuple(s[-2:]) in ((sq, sk), (sk, sq))), None)


def _pytorch_out_hint(got, q, k, v, x) -> str:
    """Why the output differs: the max not subtracted, a wrong default scale, a strict causal mask."""
    if x["magnitude"] > 1 and not bool(torch.isfinite(got).all()):
        return ("\n  Large scores overflow exp(): subtract the running max m before exponentiating, "
                "p = exp(s - m_new), and rescale l and acc by exp(m - m_new).")
    d = q.shape[-1]
    if x["scale"] is None:
        wrong = [(f"\n  Your output matches scale = {name}: the default is 1/sqrt(d) = {d ** -0.5:.4g}.",
                  lambda sc=sc: attention64(q, k, v, x["causal"], sc)[0]) for name, sc in
                 (("1", 1.0), ("1/d", 1.0 / d), ("sqrt(d)", d ** 0.5))]
        hint = matching_variant(got, wrong, tensor_match(torch.float32))
        if hint:
            return hint
    if x["causal"] and _matches_strict_mask(got, q, k, v, x["scale"], torch.float32, {}):
        return "\n  Your output matches a strict causal mask (key j < query i): query i also attends key i."
    return ""


def _pytorch_judge(case, obs):
    x = case.inputs
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    lead, sk = tuple(q.shape[:-1]), k.shape[-2]
    if "bad_return" in obs:
        return f"FlashAttentionPyTorch.apply must return the output, attached to the graph; got {obs['bad_return']}."
    out64, lse64 = attention64(q, k, v, x["causal"], x["scale"])
    large = {"atol": 2e-3, "rtol": 2e-3} if x["magnitude"] > 1 else {"atol": 1e-5, "rtol": 1e-5}
    msg = compare(obs["out"], out64, dtype=q.dtype, name="out", **large)
    if msg:
        return msg + (_pytorch_out_hint(obs["out"], q, k, v, x) if obs["out"].shape == out64.shape else "")
    if len(obs["lse"]) != 1:
        return (f"the forward saved {len(obs['lse'])} tensors of shape {lead} (found among "
                f"{[s for s, _ in obs['saved']]}); save exactly one: L, the log-sum-exp of each query row, float32, "
                f"shaped like q without its last dimension ({'(B, Sq)' if q.ndim == 3 else '(B, H, Sq)'}).")
    msg = compare(obs["lse"][0], lse64, dtype=torch.float32, name="L (saved log-sum-exp)",
                  **({"atol": 1e-3, "rtol": 1e-5} if x["magnitude"] > 1 else {}))
    if msg:
        return msg + _lse_diagnosis(obs["lse"][0], lse64, q, k, x["scale"], x["causal"])
    verdict = _pytorch_memory_verdict(obs, q, k, v, lead)
    if verdict:
        return verdict
    out64, dq64, dk64, dv64 = attention_grads64(q, k, v, x["causal"], x["scale"], dout)
    rel = 1e-4 if x["magnitude"] > 1 else 1e-5
    for name, want in (("dv", dv64), ("dk", dk64), ("dq", dq64)):
        if obs[name] is None:
            return f"{name[1]}.grad is None: backward must return a gradient for {name[1]}."
        msg = compare(obs[name], want, dtype=q.dtype, name=name, atol=rel * (1 + float(want.abs().max())), rtol=1e-4)
        if msg:
            return msg + "\n  " + _GRAD_HINTS[name].replace("lse", "L")
    need = 5 * 2 * math.prod(lead) * sk * q.shape[-1]  # S, dP, dV, dQ, dK: five (Sq x Sk x D) matmuls
    if not x["causal"] and obs["bwd_flops"] < 0.99 * need:
        return (f"backward ran {obs['bwd_flops']:.3g} matmul FLOPs; recomputing P takes {need:.3g} (five "
                "Sq x Sk x D products: S = scale Q Kᵀ again, then dV, dP, dQ and dK). Keep no P from the forward: "
                "recompute it tile by tile as P = exp(S - L).")
    return changed_inputs(case, obs["inputs_after"])


def _pytorch_memory_verdict(obs, q, k, v, lead) -> str | None:
    """Saved tensors: q, k, v, out and L only; nothing (Sq x Sk) on ctx; tiles, not whole score matrices."""
    sq, sk = q.shape[-2], k.shape[-2]
    allowed = (2 * q.numel() + k.numel() + v.numel()) * q.element_size() + 4 * math.prod(lead)
    total = sum(nb for _, nb in obs["saved"])
    full = _full_scores([s for s, _ in obs["saved"]], sq, sk)
    if total > allowed + 256 or full:
        return (f"the forward saved {total} bytes for backward ({[s for s, _ in obs['saved']]}), but q, k, v, out "
                f"and the float32 L are {allowed} bytes. Save only those and recompute P = exp(S - L) tile by tile "
                "in backward: FlashAttention's memory saving in training.")
    stashed = sum(math.prod(s) for _, s in obs["ctx"])
    if stashed >= math.prod(lead) * sk or _full_scores([s for _, s in obs["ctx"]], sq, sk):
        return (f"the forward kept tensors on ctx outside save_for_backward ({obs['ctx']}): as many elements as "
                "P itself. Stash nothing: backward recomputes P = exp(S - L) from q, k, v, out and L.")
    if min(sq, sk) > PT_TILE:
        for when in ("fwd", "bwd"):
            shape = _full_scores(obs[f"{when}_shapes"], sq, sk)
            if shape:
                return (f"the {'forward' if when == 'fwd' else 'backward'} created a tensor of shape {shape}: a "
                        f"whole (seq_q, seq_k) score matrix. Loop over query tiles and key tiles of at most "
                        f"{PT_TILE} (TILE_Q x TILE_K) so only one tile of S and P exists at a time.")
    return None


_PYTORCH_HINT = ("forward: for each query tile, for each key tile: s = scale * q_i @ k_j^T (-inf where masked); "
                 "m_new = max(m, rowmax(s)); p = exp(s - m_new); l = exp(m - m_new) * l + rowsum(p); acc = exp(m - "
                 "m_new) * acc + p @ v_j. Then out_i = acc / l, L_i = m + log(l); save q, k, v, out, L. backward: "
                 "D = rowsum(dO * O); per tile pair p = exp(s - L); dv += p^T dO; ds = p * (dO v^T - D); "
                 "dq += scale ds k; dk += scale ds^T q.")
PYTORCH = Exercise("flash_pytorch", 3, ("FlashAttentionPyTorch",), _pytorch_cases, RUN._pytorch_run, _pytorch_judge,
                   title="FlashAttention-2 in plain PyTorch: tiled forward, backward by recomputation",
                   hint=_PYTORCH_HINT)


# --- the kernels (exercises 4 and 5) -------------------------------------------------------------


def _computed_outside(obs, fn_name, q, out64, lse64, tol):
    """The ladder's rung for outputs computed outside the learner's kernels (by the ablated run)."""
    def right(o):
        outs = [o.get("out"), o.get("lse")] if "out" in o else [o.get("returned[0]"), o.get("returned[1]")]
        return (isinstance(outs[0], torch.Tensor) and compare(outs[0], out64, dtype=q.dtype, **tol["out"]) is None) or \
            (isinstance(outs[1], torch.Tensor) and compare(outs[1], lse64, dtype=torch.float32, **tol["lse"]) is None)
    return outside_verdict(obs, fn_name, right)


def _kernel_judge(fn_name, case, obs) -> str | None:
    causal, x = fn_name == "flash_attention_causal", case.inputs
    q, k, v = (RUN._view(x[n], x["layout"]) for n in ("q", "k", "v"))
    out64, lse64 = attention64(q, k, v, causal, x["scale"])
    tol = _tolerances(x, obs.get("device", "cpu"))
    verdict = (launch_verdict(obs, fn_name, _TASK) or _computed_outside(obs, fn_name, q, out64, lse64, tol)
               or bounds_verdict(obs))
    if verdict:
        return verdict
    if "bad_return" in obs:
        want = "(out, lse, stats)" if causal else "(out, lse)"
        return f"{fn_name}{'(q, k, v)' if x.get('alloc') else ''} must return {want}, got {obs['bad_return']}."
    if x.get("alloc"):
        return _judge_alloc(case, obs, q, out64, lse64, tol)
    if causal:
        msg = _judge_stats(case, obs, q, k)
        if msg:
            return msg
    msg = compare(obs["out"], out64, dtype=q.dtype, name="out", **tol["out"])
    if msg:
        if x["layout"] == "rows":  # the gaps hold NaN: a kernel reading them gets NaN
            msg += (f"\n  q, k and v here are row-padded views: rows are q.stride(2) = {q.stride(2)} elements apart, "
                    f"not HEAD_DIM = {q.shape[-1]}. Offset query i by i * stride_qm (and keys by stride_kn).")
        elif int(torch.isnan(obs["out"]).sum()) == obs["out"].numel() and not torch.isnan(q).any():
            msg += "\n  Every element is still NaN: write into the `out` buffer you are given."
        elif causal and _matches_strict_mask(obs["out"], q, k, v, x["scale"], q.dtype, tol["out"]):
            msg += ("\n  Your output matches a strict causal mask (key j < query i): query i attends keys 0..i, "
                    "itself included (offs_m >= offs_n).")
        elif (padded := _padded_keys64(q, k, v, causal, x["scale"], x["block_n"])) is not None and \
                compare(obs["out"], padded[0], dtype=q.dtype, **tol["out"]) is None:
            msg += (f"\n  Your output matches attention over keys padded to a multiple of BLOCK_N={x['block_n']}: "
                    "set the scores of keys >= seq_k to -inf before the softmax.")
        elif x["magnitude"] > 1:
            msg += "\n  Large scores overflow exp(): exponentiate s - m with m the running row max."
        elif (rows := _unwritten_tail(obs["out"])) is not None:
            msg += (f"\n  Query rows {rows}..{q.shape[2] - 1} were never written (still NaN): launch "
                    "cdiv(seq_q, BLOCK_M) query tiles and mask the last one's loads and stores.")
        elif k.shape[2] > x["block_n"]:
            msg += ("\n  With several key blocks, the running max changes: rescale l and acc by "
                    "exp(m_old - m_new) before adding the new block.")
        return mismatch_verdict(msg, obs)
    if not obs.get("returned_out"):
        return (f"{fn_name} must write into `out` and `lse` when they are given and return those same tensors "
                "(the check passes buffers pre-filled with NaN).")
    msg = compare(obs["lse"], lse64, dtype=torch.float32, name="lse", **tol["lse"])
    if msg:
        hint = _lse_diagnosis(obs["lse"], lse64, q, k, x["scale"], causal)
        near = compare(obs["lse"], lse64, dtype=torch.float32, atol=1e-2, rtol=1e-3) is None
        if not hint and q.dtype == torch.float16 and near:
            hint = ("\n  Small errors with fp16 inputs: accumulate q·kᵀ in float32 (tl.dot's default out_dtype) and "
                    "keep m, l and acc in float32; only p is cast to fp16, for p @ v.")
        return mismatch_verdict(msg + hint, obs)
    return final_verdict(case, obs)


def _unwritten_tail(out) -> int | None:
    """The first of the trailing query rows that are entirely NaN (never written), if any."""
    if not isinstance(out, torch.Tensor) or out.ndim != 4:
        return None
    row_nan = torch.isnan(out).all(-1).all(0).all(0)  # (Sq,)
    if not bool(row_nan[-1]) or bool(row_nan.all()):
        return None
    first = int((~row_nan).nonzero().max()) + 1
    return first if bool(row_nan[first:].all()) and not bool(torch.isnan(out[..., :first, :]).any()) else None


# --- exercise 4: the tiled forward kernel ----------------------------------------------------------

def _alloc_case(gen, seqs=None) -> Case:
    """float16 inputs, ``out`` and ``lse`` left to their defaults (None): the kernel's wrapper allocates
    them, out in q's dtype and lse in float32 whatever q's dtype."""
    sq, sk = seqs or (_ragged(gen, 33, 96), _ragged(gen, 33, 96))
    inp = _qkv(gen, 1, 1, sq, sk, 32, dtype="float16", tiles=TILES[1])
    inp["alloc"] = True
    return Case(_name(inp, ", out=None and lse=None: your wrapper allocates them"), inp)


def _flash_cases(gen, public):
    if not public:
        return _random_attention_cases(gen, 5, causal_mix=False) + [_rows_case(gen), _alloc_case(gen),
                                                                      _one_tile_multiple_case(gen)]
    return _cases(gen, [(1, 2, 128, 128, 64, dict()),
                        (1, 1, 100, 77, 64, dict()),
                        (2, 1, 33, 128, 32, dict(dtype="float16")),
                        (1, 1, 128, 45, 64, dict(dtype="float16")),
                        (1, 1, 1, 1, 16, dict()),
                        (1, 1, 64, 96, 32, dict(scale=0.3)),
                        (1, 1, 64, 96, 64, dict(magnitude=6.0)),
                        (1, 2, 64, 64, 64, dict(dtype="float16", layout="bshd")),
                        (1, 2, 100, 90, 32, dict(dtype="float16", layout="rows"))]) + [_alloc_case(gen, (77, 50))]


def _judge_alloc(case, obs, q, out64, lse64, tol) -> str | None:
    """The wrapper allocated ``out`` like q and ``lse`` in float32, and computed them right."""
    out, lse = obs["out"], obs["lse"]
    b, h, sq, d = q.shape
    if out.dtype != q.dtype or tuple(out.shape) != (b, h, sq, d):
        return (f"with out=None, flash_attention returned out of dtype {out.dtype} and shape {tuple(out.shape)}; "
                f"allocate it like q: {q.dtype}, {(b, h, sq, d)}.")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (b, h, sq):
        return (f"with lse=None, flash_attention returned lse of dtype {lse.dtype} and shape {tuple(lse.shape)}; "
                f"allocate it as float32 {(b, h, sq)} whatever q's dtype: float16 keeps only ~3 significant "
                "digits of a log-sum-exp, and the backward pass recomputes P = exp(s - lse) from it.")
    msg = (compare(out, out64, dtype=q.dtype, name="out", **tol["out"])
           or compare(lse, lse64, dtype=torch.float32, name="lse", **tol["lse"]))
    return mismatch_verdict(msg, obs) if msg else final_verdict(case, obs)


FORWARD = Exercise("flash_forward", 4, ("flash_attention",), _flash_cases, partial(RUN._kernel_run, "flash_attention"),
                   partial(_kernel_judge, "flash_attention"), title="Tiled attention forward with online softmax",
                   hint="Per key block: s = dot(q, k^T) * scale * log2(e); mask keys >= seq_k with -inf; m_new = "
                        "max(m, rowmax(s)); alpha = exp2(m - m_new); p = exp2(s - m_new); l = l * alpha + rowsum(p); "
                        "acc = acc * alpha + dot(p, v). At the end out = acc / l and lse = (m + log2(l)) * ln(2).")


# --- exercise 5: causal masking with early exit ----------------------------------------------------

def expected_key_blocks(seq_q: int, seq_k: int, block_m: int, block_n: int) -> list[tuple[int, int]]:
    """Per query tile m: the (fewest, most) key blocks a correct causal kernel processes. The tile's
    rows end at min((m+1) BLOCK_M, seq_q), so keys up to there are needed (fewest); a kernel that bounds
    its loop by (m+1) BLOCK_M without clipping to seq_q reads at most the last tile's padding rows' keys."""
    return [(-(-min((m + 1) * block_m, seq_q, seq_k) // block_n), -(-min((m + 1) * block_m, seq_k) // block_n))
            for m in range(-(-seq_q // block_m))]


def _causal_cases(gen, public):
    if not public:
        cases = _random_attention_cases(gen, 4, causal_mix=False) + [_rows_case(gen), _one_tile_multiple_case(gen)]
        sq = _ragged(gen, 33, 96)  # past one 32-row tile: loading a key block too many shows
        inp = _qkv(gen, 1, 1, sq, randint(gen, -(-sq // 128) * 128 + 1, 224), 32, hide_unseen=True, tiles=TILES[1])
        return cases + [Case(_name(inp, ", keys no query can see hold NaN"), inp)]
    return _cases(gen, [(1, 2, 128, 128, 64, dict()),
                        (1, 1, 100, 100, 64, dict(dtype="float16")),
                        (1, 1, 128, 45, 64, dict(dtype="float16")),
                        (1, 1, 1, 1, 16, dict()),
                        (1, 1, 96, 96, 64, dict(magnitude=6.0)),
                        (1, 2, 100, 80, 32, dict(layout="rows")),
                        (1, 1, 100, 200, 32, dict(hide_unseen=True),
                         ", keys 128..199 (seen by no query) hold NaN: an early exit never loads them")])


def _judge_stats(case, obs, q, k) -> str | None:
    """The stats the causal wrapper returned: the tiles it was given, and key blocks an early exit runs."""
    tile_m, tile_n = case.inputs["block_m"], case.inputs["block_n"]
    stats = obs.get("stats")
    if not isinstance(stats, dict):
        return ("with return_stats=True, flash_attention_causal must return (out, lse, stats) where stats = "
                "{'BLOCK_M': int, 'BLOCK_N': int, 'key_blocks': int tensor (batch, heads, cdiv(seq_q, BLOCK_M))}; "
                f"got {stats!r} for stats.")
    bm, bn, blocks = stats["BLOCK_M"], stats["BLOCK_N"], stats["key_blocks"]
    if bm != tile_m or bn != tile_n:
        return (f"stats report BLOCK_M={bm!r}, BLOCK_N={bn!r}, but the check passed BLOCK_M={tile_m}, "
                f"BLOCK_N={tile_n}: use the tile sizes you are given (and report them).")
    b, h, sq, _ = q.shape
    n_m = -(-sq // bm)
    if not isinstance(blocks, torch.Tensor) or tuple(blocks.shape) != (b, h, n_m) or blocks.is_floating_point():
        got = tuple(blocks.shape) if isinstance(blocks, torch.Tensor) else type(blocks).__name__
        return f"stats['key_blocks'] must be an integer tensor of shape {(b, h, n_m)}, got {got}."
    for m, (lo, hi) in enumerate(expected_key_blocks(sq, k.shape[2], bm, bn)):
        got = blocks[:, :, m]
        if bool((got > hi).any()):
            total = -(-k.shape[2] // bn)
            return (f"query tile {m} (rows {m * bm}..{min((m + 1) * bm, sq) - 1}) processed {int(got.max())} key "
                    f"blocks, but keys past its last row are masked for every row: it needs at most {hi} of the "
                    f"{total}. Stop the key loop at the diagonal (early exit): "
                    "hi = min((start_m + 1) * BLOCK_M, seq_k).")
        if bool((got < lo).any()):
            return (f"query tile {m} processed {int(got.min())} key blocks, but its rows need keys 0.."
                    f"{min((m + 1) * bm, sq, k.shape[2]) - 1}: {lo} blocks of {bn} (count every block the loop runs).")
    return None


CAUSAL = Exercise("flash_causal", 3, ("flash_attention_causal",), _causal_cases,
                  partial(RUN._kernel_run, "flash_attention_causal"), partial(_kernel_judge, "flash_attention_causal"),
                  title="Causal masking with early exit", hint="Stop the key loop at hi = min((start_m + 1) * "
                  "BLOCK_M, seq_k); blocks entirely left of the diagonal need no causal mask; the blocks crossing it "
                  "need offs_m[:, None] >= offs_n[None, :]. Count the blocks the loops run and store the count per "
                  "program.")


# --- exercise 6 (stretch): the backward pass ----------------------------------------------------

def attention_grads64(q, k, v, causal, scale, dout):
    """(out, dq, dk, dv) of attention in float64 by autograd, on the CPU."""
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    out = torch.softmax(_scores64(q, k, causal, scale), dim=-1) @ v
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


def _backward_cases(gen, public):
    if public:
        specs = [(1, 1, 64, 64, 32, "float32", False), (1, 1, 100, 77, 32, "float32", True),
                 (1, 1, 96, 96, 64, "float16", True), (1, 1, 45, 100, 16, "float16", False)]
        three_d = [(2, 77, 32, True)]
    else:  # causal and not, in float32 and float16, with seq_k < seq_q and seq_k > seq_q; one 3-D case
        specs = []
        for dtype, causal, shape in [("float32", True, 1), ("float16", False, 2), ("float16", True, 2),
                                     ("float32", False, 1)]:
            b, h = choice(gen, [(1, 1), (1, 2), (2, 1)])
            sq, sk = _seq_pair(gen, SEQ_SHAPES[shape], 96)
            specs.append((b, h, sq, sk, choice(gen, [16, 32, 64]), dtype, causal))
        three_d = [(randint(gen, 1, 2), _ragged(gen, 33, 96), choice(gen, [16, 32]), True)]
    cases = _cases(gen, [(b, h, sq, sk, d, dict(dtype=dtype, causal=causal, dout=True))
                         for b, h, sq, sk, d, dtype, causal in specs])
    for b, s, d, causal in three_d:  # CS336's call: (B, S, D) tensors, scale left to its default
        inp = _qkv(gen, b, 1, s, s, d, layout="bsd", causal=causal, dout=True)
        cases.append(Case(_name(inp, ", called as FlashAttentionFunction.apply(q, k, v, causal)"), inp))
    return cases


_GRAD_HINTS = {"dv": "dV = Pᵀ dO, with P = exp(scale · Q Kᵀ - lse) (masked entries 0).",
               "dk": "dK = scale · dSᵀ Q with dS = P ∘ (dP - δ), dP = dO Vᵀ, δ = rowsum(dO ∘ O).",
               "dq": "dQ = scale · dS K with dS = P ∘ (dP - δ), δ = rowsum(dO ∘ O)."}


def _backward_judge(case, obs):
    x = case.inputs
    if "bad_return" in obs:
        return (f"flash_attention_autograd must return the output tensor, attached to the graph "
                f"(FlashAttentionFunction.apply(...)); got {obs['bad_return']}.")
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    if not obs["bwd_launches"]:
        return ("no Triton kernel was launched during backward: compute dq, dk and dv with your own @triton.jit "
                "kernels (recomputing P from the lse), not with PyTorch autograd.")
    verdict = launch_verdict({"launches": obs["bwd_launches"], "own_launches": obs["bwd_own_launches"]},
                             "backward", "compute dq, dk and dv with your own @triton.jit kernels (recomputing P "
                             "from the lse), not with PyTorch autograd") or bounds_verdict(obs)
    if verdict:
        return verdict
    lead = tuple(q.shape[:-1])  # (B, H, Sq), or (B, Sq) for 3-D inputs: the lse's shape
    allowed = sum(t.numel() * t.element_size() for t in (q, k, v)) + q.numel() * q.element_size() + 4 * math.prod(lead)
    total = sum(nb for _, nb in obs["saved"])
    if total > allowed + 256:
        biggest = max(obs["saved"], key=lambda s: s[1])
        return (f"the forward saved {total} bytes for backward (largest: a tensor of shape {biggest[0]}), but "
                f"q, k, v, out and the float32 lse are {allowed} bytes. Save only those and recompute P = exp(S - lse) "
                "tile by tile in backward: that is FlashAttention's memory saving in training.")
    if sum(shape == lead for shape, _ in obs["saved"]) != 1:
        return (f"the forward saved {[shape for shape, _ in obs['saved']]}: save exactly one lse, shaped like q "
                f"without its last dimension, {lead} here (a 3-D input's lse is (B, Sq): one_head() views in, "
                "squeeze(1) out).")
    out64, dq64, dk64, dv64 = attention_grads64(q, k, v, x["causal"], x["scale"], dout)
    on_gpu = obs.get("device") == "cuda"
    rel = 5e-3 if q.dtype == torch.float16 else (2e-2 if on_gpu else 1e-5)

    def grad_report(got, want, name="output"):  # relative to the gradient's largest entry
        return compare(got, want, dtype=q.dtype, name=name, atol=rel * (1.0 + float(want.abs().max())),
                       rtol=max(rel, 1e-4))
    grads64 = {"dv": dv64, "dk": dk64, "dq": dq64}
    verdict = outside_verdict(obs, "backward", lambda o: any(grad_report(o[n], grads64[n]) is None
                                                             for n in ("dq", "dk", "dv") if n in o))
    if verdict:
        return verdict
    msg = compare(obs["out"], out64, dtype=q.dtype, name="out",
                  **({"atol": 1e-2, "rtol": 1e-2} if on_gpu and q.dtype == torch.float32 else {}))
    if msg:
        return msg
    for name, want in grads64.items():
        if obs[name] is None:
            return f"{name[1]}.grad is None: backward must return a gradient for {name[1]}."
        msg = grad_report(obs[name], want, name)
        if msg:
            return mismatch_verdict(msg + "\n  " + _GRAD_HINTS[name], obs)
    return final_verdict(case, obs)


BACKWARD = Exercise("flash_backward", 2, ("flash_attention_autograd", "FlashAttentionFunction"), _backward_cases,
                    RUN._backward_run, _backward_judge,
                    title="Stretch: the backward pass as a torch.autograd.Function", hint="Save q, k, v, out, lse "
                    "only. delta = rowsum(dO * O); one kernel per key block accumulates dV += Pᵀ dO and dK += dSᵀ Q "
                    "over query blocks, one per query block accumulates dQ += dS K, with P = exp2(s - lse * log2(e)) "
                    "and dS = P * (dP - delta); scale dK and dQ by the softmax scale. forward(ctx, q, k, v, "
                    "causal=False, scale=None): (B, S, D) inputs go to the kernels as one_head() views, and their lse "
                    "is saved as (B, Sq).")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.tflops")
EXERCISES = [offering(ex, OFFERED) for ex in (REFERENCE, MEMORY, PYTORCH, FORWARD, CAUSAL, BACKWARD)]


# --- benchmarks (python -m grader bench) ----------------------------------------------------------

def attention_flops(batch, heads, seq_q, seq_k, head_dim, causal: bool) -> float:
    """FLOPs of the forward: 2 matmuls of 2 * Sq * Sk * D each. Causal counts half (the convention of
    the FlashAttention papers and of Triton's tutorial), whatever a kernel skips."""
    flops = 4.0 * batch * heads * seq_q * seq_k * head_dim
    return flops / 2 if causal else flops


def _bench_make(seq, head_dim, causal):
    def make(device, tiny):
        b, h, s = (1, 1, 64) if tiny else (4, 16, seq)
        q, k, v = (torch.randn(b, h, s, head_dim, device=device, dtype=torch.float16) for _ in range(3))
        return {"q": q, "k": k, "v": v, "causal": causal,
                "flops": attention_flops(b, h, s, s, head_dim, causal),
                "bytes": (4 * b * h * s * head_dim) * 2 + 4 * b * h * s}  # q, k, v, out once; lse
    return make


def _bench_baseline(d):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(d["q"], d["k"], d["v"], is_causal=d["causal"])


def _sdpa_info() -> dict:
    """Which attention the baseline ran: the SDPA backend pinned above, and the FlashAttention
    implementation PyTorch had active (its own FlashAttention-2 unless FA3/FA4 was activated)."""
    from torch.nn import attention

    current = getattr(attention, "current_flash_attention_impl", lambda: None)()  # torch >= 2.9
    default = "PyTorch's built-in FlashAttention-2" if torch.cuda.is_available() else "PyTorch's CPU flash kernel"
    return {"baseline_sdpa_backend": "FLASH_ATTENTION", "baseline_flash_impl": current or default,
            "torch": torch.__version__}


BENCHMARKS = [
    Benchmark(f"flash D={d} S={s // 1024}k{' causal' if c else ''} vs SDPA", "flash_attention",
              _bench_make(s, d, c), lambda fn, inp: fn(inp["q"], inp["k"], inp["v"], causal=inp["causal"]),
              _bench_baseline, info=_sdpa_info)
    for d in (64, 128) for c in (False, True) for s in (1024, 2048, 4096, 8192)
]
