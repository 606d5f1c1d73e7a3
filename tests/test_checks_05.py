"""Lab 05's checks: the solution passes; the classic FlashAttention bugs are rejected with a message
that names them: a causal mask off by one, a forgotten online-softmax rescale, no max subtraction,
lse in log2 or without the max, padded keys attended, no early exit, unwritten or overflowing
outputs, fp16 score accumulation, PyTorch's SDPA instead of a kernel, mutated inputs. The PyTorch
FlashAttention-2: no max subtraction, a wrong default scale, a strict mask, L saved with a head dimension,
P saved, kept on ctx or cached out of sight, a whole score matrix, no D term, no causal mask in backward,
4-D only; the Triton Function requiring scale or seeing (B, S, D) inputs through a head added outside."""
import math

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from grader.checks import exercises
from grader.exercise import evaluate
from grader.notebooks import exec_source
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer
from tests.graderkit import solution_with

STEM = "05_flash_attention"


@pytest.fixture(scope="module")
def sol05():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["attention_reference", "attention_memory", "flash_pytorch", "flash_forward",
                                 "flash_causal", "flash_backward"])
def test_solution_passes_public_and_hidden_cases(sol05, eid):
    result = grade(STEM, eid, sol05)
    assert result.status == "passed", result.message
    assert result.score == result.points


def test_flash_attention_dispatches_causal_and_counts_blocks(sol05):
    q = torch.randn(1, 1, 100, 32)
    out, lse, stats = sol05["flash_attention"](q, q, q, causal=True, return_stats=True, BLOCK_M=32, BLOCK_N=32)
    ref_out, ref_lse = sol05["attention_reference"](q, q, q, causal=True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert stats["key_blocks"].flatten().tolist() == [1, 2, 3, 4]


# --- one configurable buggy kernel: each constexpr flag is one classic mistake --------------------

@triton.jit
def _buggy_kernel(Q, K, V, Out, Lse, Stats,
                  stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od,
                  H, seq_q, seq_k, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, STRICT: tl.constexpr, NO_RESCALE: tl.constexpr, NO_MAX: tl.constexpr,
                  LSE_MODE: tl.constexpr, NO_KEY_MASK: tl.constexpr, NO_EARLY_EXIT: tl.constexpr,
                  FP16_SCORES: tl.constexpr, LSE_UNMASKED: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < seq_q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if NO_MAX:
        m_i = tl.zeros([BLOCK_M], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_blocks = tl.full((), 0, tl.int32)
    hi = seq_k
    if CAUSAL and not NO_EARLY_EXIT:
        hi = tl.minimum((start_m + 1) * BLOCK_M, seq_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kmask = cols[:, None] < seq_k
        k = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=kmask, other=0.0)
        v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=kmask, other=0.0)
        if FP16_SCORES:
            s = tl.dot(q, tl.trans(k), out_dtype=tl.float16).to(tl.float32) * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
        if not NO_KEY_MASK:
            s = tl.where(cols[None, :] < seq_k, s, float("-inf"))
        if CAUSAL:
            if STRICT:
                s = tl.where(offs_m[:, None] > cols[None, :], s, float("-inf"))
            else:
                s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        if NO_MAX:
            m_new = m_i
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if not NO_RESCALE:
            acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        n_blocks += 1
    out = acc / l_i[:, None]
    if LSE_MODE == 0:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    elif LSE_MODE == 1:
        lse = m_i + tl.log2(l_i)  # log2 units
    else:
        lse = tl.log2(l_i) * 0.6931471805599453  # the max left out
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=offs_m[:, None] < seq_q)
    if LSE_UNMASKED:
        tl.store(Lse + bh * seq_q + offs_m, lse)  # the last tile overhangs into the guard region
    else:
        tl.store(Lse + bh * seq_q + offs_m, lse, mask=offs_m < seq_q)
    tl.store(Stats + bh * tl.num_programs(0) + start_m, n_blocks)


_FLAGS = dict(CAUSAL=False, STRICT=False, NO_RESCALE=False, NO_MAX=False, LSE_MODE=0, NO_KEY_MASK=False,
              NO_EARLY_EXIT=False, FP16_SCORES=False, LSE_UNMASKED=False)


def _buggy(causal: bool, grid_m=triton.cdiv, lse_like_q=False, **bugs):
    """A flash_attention (causal=False) or flash_attention_causal (causal=True) built on _buggy_kernel.
    lse_like_q: when lse is None, allocate it in q's dtype (a wrong default for float16 inputs)."""
    flags = dict(_FLAGS, CAUSAL=causal, **bugs)

    def run(q, k, v, scale=None, out=None, lse=None, return_stats=False, BLOCK_M=32, BLOCK_N=32, causal=causal):
        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        scale = 1 / math.sqrt(D) if scale is None else scale
        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(B, H, Sq, dtype=q.dtype if lse_like_q else torch.float32) if lse is None else lse
        n_m = grid_m(Sq, BLOCK_M)
        stats = torch.zeros(B, H, triton.cdiv(Sq, BLOCK_M), dtype=torch.int32)
        _buggy_kernel[(max(n_m, 1), B * H)](
            q, k, v, out, lse, stats, *q.stride(), *k.stride(), *v.stride(), *out.stride(), H, Sq, Sk,
            scale * 1.4426950408889634, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **flags)
        if return_stats:
            return out, lse, {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "key_blocks": stats}
        return out, lse
    return run


def _public(eid, ns, pick=None):
    """Grade exercise ``eid`` on its public cases, or on the ones ``pick(names)`` selects (faster)."""
    ex = exercises(STEM)[eid]
    cases = ex.cases()
    if pick is not None:
        cases = [c for c in cases if pick(c.name, cases.index(c))]
    return evaluate(ex, ns, "cpu", cases)


def _forward(sol05, pick=None, **bugs):
    return _public("flash_forward", with_answer(sol05, flash_attention=_buggy(False, **bugs)), pick)


def _causal(sol05, pick=None, **bugs):
    return _public("flash_causal", with_answer(sol05, flash_attention_causal=_buggy(True, **bugs)), pick)


FIRST = lambda name, i: i == 0  # noqa: E731 - B=1 H=2 128 x 128 fp32: several key blocks
FIRST_TWO = lambda name, i: i < 2  # noqa: E731 - adds 100 x 77: seq_k not a multiple of the tile


def test_the_buggy_kernel_without_bugs_passes(sol05):
    assert _forward(sol05).status == "passed"
    assert _causal(sol05).status == "passed"


def test_causal_mask_off_by_one_fails(sol05):
    r = _causal(sol05, FIRST, STRICT=True)
    assert r.status == "failed" and "strict causal mask" in r.message


def test_forgotten_rescale_fails(sol05):
    r = _forward(sol05, FIRST, NO_RESCALE=True)
    assert r.status == "failed" and "exp(m_old - m_new)" in r.message


def test_missing_max_subtraction_fails_on_large_scores(sol05):
    r = _forward(sol05, lambda name, i: i == 0 or "large" in name, NO_MAX=True)
    assert r.status == "failed" and "large scores" in r.message
    assert any(c.status == "failed" and "overflow" in c.message for c in r.cases)


def test_lse_in_log2_fails(sol05):
    r = _forward(sol05, FIRST, LSE_MODE=1)
    assert r.status == "failed" and "log2 units" in r.message


def test_lse_without_the_max_fails(sol05):
    r = _forward(sol05, FIRST, LSE_MODE=2)
    assert r.status == "failed" and "lacks the running max" in r.message


def test_padded_keys_attended_fails(sol05):
    r = _forward(sol05, FIRST_TWO, NO_KEY_MASK=True)
    assert r.status == "failed" and "padded to a multiple of BLOCK_N" in r.message
    assert r.cases[0].status == "passed"  # seq_k a multiple of the tile: no padding, no harm


def test_no_early_exit_fails(sol05):
    r = _causal(sol05, FIRST, NO_EARLY_EXIT=True)
    assert r.status == "failed" and "early exit" in r.message


def test_no_early_exit_with_honest_looking_stats_still_fails_on_unseen_nan_keys(sol05):
    real = _buggy(True, NO_EARLY_EXIT=True)

    def lying(q, k, v, **kw):  # reports the counts an early exit would give, but loads every key
        out, lse, stats = real(q, k, v, **kw)
        bm, bn = stats["BLOCK_M"], stats["BLOCK_N"]
        counts = [-(-min((m + 1) * bm, k.shape[2]) // bn) for m in range(stats["key_blocks"].shape[-1])]
        stats["key_blocks"][:] = torch.tensor(counts, dtype=torch.int32)
        return out, lse, stats
    r = grade(STEM, "flash_causal", with_answer(sol05, flash_attention_causal=lying), hidden=False)
    assert r.status == "failed"
    bad = [c for c in r.cases if c.status != "passed"]
    assert [c.name for c in bad] == [r.cases[-1].name] and "hold NaN" in bad[0].name
    assert "NaN" in bad[0].message


def test_fp16_score_accumulation_fails(sol05):
    r = _forward(sol05, lambda name, i: i < 3, FP16_SCORES=True)
    assert r.status == "failed" and "accumulate q·kᵀ in float32" in r.message
    assert all(c.status == "passed" for c in r.cases if "float32" in c.name)


def test_grid_rounded_down_leaves_rows_unwritten(sol05):
    r = _forward(sol05, FIRST_TWO, grid_m=lambda n, b: n // b)
    assert r.status == "failed" and "NaN" in r.message


def test_unmasked_lse_store_hits_the_guard_region(sol05):
    r = _forward(sol05, FIRST_TWO, LSE_UNMASKED=True)
    assert r.status == "failed" and "past the end" in r.message and "lse" in r.message


def test_sdpa_instead_of_a_kernel_earns_nothing(sol05):
    def flash_attention(q, k, v, causal=False, scale=None, out=None, lse=None, **kw):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        s = (scale or q.shape[-1] ** -0.5) * q.float() @ k.float().transpose(-1, -2)
        out = o if out is None else out.copy_(o)
        lse = torch.logsumexp(s, -1) if lse is None else lse.copy_(torch.logsumexp(s, -1))
        return out, lse
    r = _forward_with(sol05, flash_attention)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def _forward_with(sol05, fn):
    return grade(STEM, "flash_forward", with_answer(sol05, flash_attention=fn), hidden=False)


def test_returning_fresh_tensors_instead_of_out_fails(sol05):
    real = sol05["flash_attention"]
    r = _forward_with(sol05, lambda q, k, v, out=None, lse=None, **kw: real(q, k, v, **kw))
    assert r.status == "failed" and "`out`" in r.message


def test_mutating_an_input_is_caught(sol05):
    real = sol05["flash_attention"]

    def flash_attention(q, k, v, **kw):
        res = real(q, k, v, **kw)
        k.mul_(2.0)  # e.g. scaling k in place to save a multiply
        return res
    r = _forward_with(sol05, flash_attention)
    assert r.status == "failed" and "was modified" in r.message


def test_ignoring_strides_fails_on_transposed_inputs(sol05):
    real = sol05["flash_attention"]

    def flash_attention(q, k, v, **kw):  # views the storage as if it were (B, H, S, D)
        fix = [t if t.is_contiguous() else t.as_strided(t.shape, torch.empty(t.shape).stride()) for t in (q, k, v)]
        return real(*fix, **kw)
    r = _forward_with(sol05, flash_attention)
    assert r.status == "failed" and "(B, S, H, D)" in r.message


def test_ignoring_the_tile_sizes_given_is_reported(sol05):
    real = _buggy(True)
    r = grade(STEM, "flash_causal", with_answer(
        sol05, flash_attention_causal=lambda q, k, v, BLOCK_M=None, BLOCK_N=None, **kw: real(
            q, k, v, BLOCK_M=64, BLOCK_N=64, **kw)), hidden=False)
    assert r.status == "failed" and "use the tile sizes you are given" in r.message


# --- exercise 1: the PyTorch reference ------------------------------------------------------------

def _reference(causal_diag=0, max_sub=True, lse_log2=False):
    def attention_reference(q, k, v, causal=False, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = scale * q.float() @ k.float().transpose(-1, -2)
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(causal_diag), float("-inf"))
        m = s.amax(-1, keepdim=True) if max_sub else torch.zeros_like(s[..., :1])
        e = torch.exp(s - m)
        lse = (m[..., 0] + e.sum(-1).log())
        out = (e / e.sum(-1, keepdim=True)) @ v.float()
        return out.to(q.dtype), lse / math.log(2) if lse_log2 else lse
    return attention_reference


def test_reference_helper_without_bugs_passes(sol05):
    assert grade(STEM, "attention_reference", with_answer(sol05, attention_reference=_reference())).status == "passed"


def test_reference_without_max_subtraction_fails(sol05):
    r = grade(STEM, "attention_reference", with_answer(sol05, attention_reference=_reference(max_sub=False)),
              hidden=False)
    assert r.status == "failed" and "subtract each row's max" in r.message


def test_reference_causal_off_by_one_fails(sol05):
    r = grade(STEM, "attention_reference", with_answer(sol05, attention_reference=_reference(causal_diag=-1)),
              hidden=False)
    assert r.status == "failed" and "strict mask" in r.message


def test_reference_lse_in_log2_fails(sol05):
    r = grade(STEM, "attention_reference", with_answer(sol05, attention_reference=_reference(lse_log2=True)),
              hidden=False)
    assert r.status == "failed" and "log2 units" in r.message


def test_reference_returning_only_out_fails(sol05):
    real = sol05["attention_reference"]
    r = grade(STEM, "attention_reference", with_answer(
        sol05, attention_reference=lambda *a, **kw: real(*a, **kw)[0]), hidden=False)
    assert r.status == "failed" and "pair (out, lse)" in r.message


def test_reference_in_fp16_fails(sol05):
    def attention_reference(q, k, v, causal=False, scale=None):  # no upcast: fp16 scores and sums
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = (q * scale) @ k.transpose(-1, -2)
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
    r = grade(STEM, "attention_reference", with_answer(sol05, attention_reference=attention_reference), hidden=False)
    assert r.status == "failed" and "float16" in r.message


# --- exercise 2: memory ----------------------------------------------------------------------------

def test_memory_counting_only_s_fails(sol05):
    def only_s(b, h, sq, sk, nb, flash=False):
        return 4 * b * h * sq if flash else b * h * sq * sk * nb
    r = grade(STEM, "attention_memory", with_answer(sol05, attention_memory_bytes=only_s))
    assert r.status == "failed" and "S and P" in r.message


def test_memory_flash_lse_in_the_input_dtype_fails(sol05):
    real = sol05["attention_memory_bytes"]
    def lse_in_input_dtype(b, h, sq, sk, nb, flash=False):
        return b * h * sq * nb if flash else real(b, h, sq, sk, nb)
    r = grade(STEM, "attention_memory", with_answer(sol05, attention_memory_bytes=lse_in_input_dtype))
    assert r.status == "failed" and "float32" in r.message


# --- exercise 5 (stretch): backward ----------------------------------------------------------------

def test_naive_autograd_instead_of_backward_kernels_fails(sol05):
    def flash_attention_autograd(q, k, v, causal=False, scale=None):  # autograd through PyTorch ops
        s = (scale or q.shape[-1] ** -0.5) * q.float() @ k.float().transpose(-1, -2)
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        return (torch.softmax(s, -1) @ v.float()).to(q.dtype)

    class FlashAttentionFunction:  # its apply, as CS336's tests call it
        apply = staticmethod(flash_attention_autograd)
    r = grade(STEM, "flash_backward", with_answer(sol05, flash_attention_autograd=flash_attention_autograd,
                                                  FlashAttentionFunction=FlashAttentionFunction), hidden=False)
    assert r.status == "failed" and r.score == 0 and "during backward" in r.message


def _function(sol05, save_p=False, zero_delta=False, causal_in_backward=True):
    """An autograd.Function on the solution's kernels, with one mistake switched on."""
    fwd, dkdv, dq_kernel = sol05["flash_attention"], sol05["flash_bwd_dkdv_kernel"], sol05["flash_bwd_dq_kernel"]

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            out, lse = fwd(q, k, v, causal=causal, scale=scale)
            extra = [torch.zeros(*q.shape[:3], k.shape[2], dtype=q.dtype)] if save_p else []  # "keeps P"
            ctx.save_for_backward(q, k, v, out, lse, *extra)
            ctx.causal, ctx.scale = causal, scale
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors[:5]
            dout = dout.contiguous()
            B, H, Sq, D = q.shape
            Sk = k.shape[2]
            delta = (out.float() * dout.float()).sum(-1)
            if zero_delta:
                delta = torch.zeros_like(delta)  # dS = P * dP: the softmax Jacobian's second term forgotten
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride())
            kw = dict(CAUSAL=ctx.causal and causal_in_backward, HEAD_DIM=D, BLOCK_M=32, BLOCK_N=32)
            dkdv[(triton.cdiv(Sk, 32), B * H)](q, k, v, dout, lse, delta, dk, dv, *strides, H, Sq, Sk,
                                               ctx.scale * 1.4426950408889634, **kw)
            dq_kernel[(triton.cdiv(Sq, 32), B * H)](q, k, v, dout, lse, delta, dq, *strides, H, Sq, Sk,
                                                    ctx.scale * 1.4426950408889634, **kw)
            return dq, dk, dv, None, None

    return lambda q, k, v, causal=False, scale=None: Fn.apply(q, k, v, causal, scale)


def _backward(sol05, **mistake):
    return grade(STEM, "flash_backward", with_answer(sol05, flash_attention_autograd=_function(sol05, **mistake)),
                 hidden=False)


def test_the_test_function_without_mistakes_passes(sol05):
    assert _backward(sol05).status == "passed"


def test_saving_p_for_backward_fails(sol05):
    r = _backward(sol05, save_p=True)
    assert r.status == "failed" and "recompute P" in r.message


def test_forgetting_delta_fails(sol05):
    r = _backward(sol05, zero_delta=True)
    assert r.status == "failed" and "δ = rowsum(dO ∘ O)" in r.message


def test_backward_without_the_causal_mask_fails_on_causal_cases(sol05):
    r = _backward(sol05, causal_in_backward=False)
    assert r.status == "failed"
    assert all(c.status == "passed" for c in r.cases if "causal=False" in c.name)


def test_output_detached_from_the_graph_fails(sol05):
    real = sol05["flash_attention"]
    r = grade(STEM, "flash_backward", with_answer(
        sol05, flash_attention_autograd=lambda q, k, v, causal=False, scale=None: real(q, k, v, causal, scale)[0]),
        hidden=False)
    assert r.status == "failed" and "attached to the graph" in r.message


# --- strides, tile shapes, seq_k < seq_q, defaults in float16 ------------------------------------

def _wrong(sol05, eid, old, new):
    """The solution with one piece of its answer to ``eid`` replaced (a plausible bug)."""
    return exec_source(solution_with(STEM, eid, old, new), f"<wrong {eid}: {new}>", dict(sol05))


def _hidden_fails(eid, ns, pick=lambda x: True, seeds=(1, 2, 3)):
    """Whether, for every seed, some hidden case of ``eid`` (among those ``pick`` selects) fails."""
    ex = exercises(STEM)[eid]
    return all(evaluate(ex, ns, "cpu", [c for c in ex.cases(seed=seed, public=False) if pick(c.inputs)]).status
               != "passed" for seed in seeds)


@pytest.mark.parametrize("eid", ["flash_forward", "flash_causal"])
def test_packed_rows_fail_on_row_padded_inputs(sol05, eid):
    # BUG: rows of q, k, v taken HEAD_DIM apart (right for contiguous inputs only)
    src_eid, kernel = {"flash_forward": ("flash_forward", "flash_fwd_kernel"),
                       "flash_causal": ("flash_causal", "flash_causal_kernel")}[eid]
    src = solution_with(STEM, src_eid, "offs_m[:, None] * stride_qm", "offs_m[:, None] * HEAD_DIM")
    src = src.replace("cols[:, None] * stride_kn", "cols[:, None] * HEAD_DIM").replace(
        "cols[:, None] * stride_vn", "cols[:, None] * HEAD_DIM")
    wrong = exec_source(src, f"<wrong {kernel}: packed rows>", dict(sol05))
    rows = lambda x: x["layout"] == "rows"  # noqa: E731
    r = _public(eid, wrong, lambda name, i: "row-padded" in name)
    assert r.status == "failed" and "row-padded views" in r.message, r.message
    assert _hidden_fails(eid, wrong, rows)


def test_early_exit_at_block_n_instead_of_block_m_fails(sol05):
    wrong = _wrong(sol05, "flash_causal", "hi = tl.minimum((start_m + 1) * BLOCK_M, seq_k)",
                   "hi = tl.minimum((start_m + 1) * BLOCK_N, seq_k)")
    assert _public("flash_causal", wrong).status == "failed"
    assert _hidden_fails("flash_causal", wrong)


def test_query_tiles_counted_with_block_n_fail(sol05):
    wrong = _wrong(sol05, "flash_forward", "n_m = triton.cdiv(Sq, BLOCK_M)", "n_m = triton.cdiv(Sq, BLOCK_N)")
    assert _public("flash_forward", wrong).status == "failed"
    assert _hidden_fails("flash_forward", wrong)


def test_early_exit_clipped_to_seq_q_fails_when_seq_k_is_shorter(sol05):
    # BUG: seq_q where seq_k belongs: the loop runs past the last key (masked, so the output is right)
    wrong = _wrong(sol05, "flash_causal", "hi = tl.minimum((start_m + 1) * BLOCK_M, seq_k)",
                   "hi = tl.minimum((start_m + 1) * BLOCK_M, seq_q)")
    r = _public("flash_causal", wrong)
    assert r.status == "failed" and "key blocks" in r.message
    assert _hidden_fails("flash_causal", wrong, lambda x: x["k"].shape[2] < x["q"].shape[2])


def test_memory_lse_over_seq_k_fails(sol05):
    real = sol05["attention_memory_bytes"]
    wrong = with_answer(sol05, attention_memory_bytes=lambda b, h, sq, sk, nb, flash=False:
                        4 * b * h * sk if flash else real(b, h, sq, sk, nb))
    assert _hidden_fails("attention_memory", wrong)


def test_lse_allocated_in_q_dtype_fails_on_float16(sol05):
    r = _forward(sol05, lambda name, i: "None" in name, lse_like_q=True)
    assert r.status == "failed" and "allocate it as float32" in r.message
    assert _hidden_fails("flash_forward", with_answer(sol05, flash_attention=_buggy(False, lse_like_q=True)),
                         lambda x: x.get("alloc"))


# --- hidden cases hold every rule, on every seed ---------------------------------------------------------

def _rules(eid, case) -> set:
    """The rules a case exercises, read from its inputs (not its name)."""
    x = case.inputs
    if eid == "attention_memory":
        sq, sk = x["seq_q"], x["seq_k"]
        return {f"{x['dtype_bytes']} bytes", "sk<sq" if sk < sq else "sk>sq" if sk > sq else "sk=sq"}
    layout = x["layout"]
    q, k = x["q"], x["k"]
    sq, sk = (q.shape[1], k.shape[1]) if layout == "bshd" else (q.shape[-2], k.shape[-2])
    if eid == "flash_pytorch":  # lengths are random: their relation is no rule here, a partial tile always is
        return {f"{q.ndim}-D {'causal' if x['causal'] else 'full'}", "large scores" if x["magnitude"] > 1 else "normal",
                "explicit scale" if x["scale"] else "default scale"} | (
            {"past one tile, ragged"} if min(sq, sk) > 64 and sq % 16 and sk % 16 else set())
    causal = x.get("causal", eid == "flash_causal")
    rules = {f"{'causal' if causal else 'full'} {'sk<sq' if sk < sq else 'sk>sq' if sk > sq else 'sk=sq'}",
             str(q.dtype).replace("torch.", ""), f"layout {layout}"}
    if eid in ("flash_forward", "flash_causal"):
        bm, bn = x["block_m"], x["block_n"]
        rules.add("BLOCK_M > BLOCK_N" if bm > bn else "BLOCK_M < BLOCK_N" if bm < bn else "square tiles")
        rules.add("partial key block" if sk % bn else "whole key blocks")
    if x["magnitude"] > 1:
        rules.add("large scores")
    if torch.isnan(k).any() and layout != "rows":
        rules.add("unseen keys hold NaN")
    if x.get("alloc"):
        rules.add("out and lse left to the kernel, " + str(q.dtype).replace("torch.", ""))
    return rules


@pytest.mark.parametrize("eid", ["attention_reference", "attention_memory", "flash_pytorch", "flash_forward",
                                 "flash_causal", "flash_backward"])
def test_every_seed_hides_cases_of_every_rule(eid):
    ex = exercises(STEM)[eid]
    seen = [set().union(*(_rules(eid, c) for c in ex.cases(seed=seed, public=False)))
            for seed in (1, 2, 3, 20261122, 4242)]
    assert all(s == seen[0] for s in seen), [s ^ seen[0] for s in seen]
    shapes = {f"{c} {s}" for c in ("causal", "full") for s in ("sk<sq", "sk>sq", "sk=sq")}
    must = {"attention_reference": shapes | {"large scores", "layout bshd", "float16"},
            "attention_memory": {"1 bytes", "2 bytes", "4 bytes", "sk<sq", "sk>sq", "sk=sq"},
            "flash_pytorch": {"3-D full", "3-D causal", "4-D full", "4-D causal", "large scores", "explicit scale",
                              "default scale", "past one tile, ragged"},
            "flash_forward": {"full sk<sq", "full sk>sq", "full sk=sq", "layout rows", "layout bshd", "large scores",
                              "BLOCK_M > BLOCK_N", "BLOCK_M < BLOCK_N", "partial key block", "whole key blocks",
                              "out and lse left to the kernel, float16"},
            "flash_causal": {"causal sk<sq", "causal sk>sq", "causal sk=sq", "layout rows", "layout bshd",
                             "large scores", "BLOCK_M > BLOCK_N", "BLOCK_M < BLOCK_N", "unseen keys hold NaN"},
            "flash_backward": {"causal sk<sq", "causal sk>sq", "full sk<sq", "full sk>sq", "float16", "float32",
                               "layout bsd"}}[eid]
    assert must <= seen[0], must - seen[0]


# --- exercise 3: FlashAttention-2 in plain PyTorch -------------------------------------------------

_CACHE: dict = {}  # where a "clever" forward leaves its P tiles for backward, out of the checks' sight


def _pt_scores(qi, kj, scale, i, j, causal, strict=False):
    """One tile of scaled scores, -inf right of the diagonal (strict: the diagonal too)."""
    s = scale * qi @ kj.transpose(-1, -2)
    if causal:
        rows, cols = torch.arange(i, i + s.shape[-2])[:, None], torch.arange(j, j + s.shape[-1])[None, :]
        s = s.masked_fill(cols >= rows if strict else cols > rows, float("-inf"))
    return s


def _pytorch_fn(tile=32, max_sub=True, default_scale=lambda d: d ** -0.5, keep_p="", lse_4d=False, zero_delta=False,
                causal_in_backward=True, strict=False):
    """FlashAttention-2 in PyTorch with one mistake switched on. keep_p: "" (P recomputed in backward),
    "saved" (its tiles saved for backward), "ctx" (tiles kept on ctx), "cache" (tiles in a module dict).
    tile=10**6: one tile, the whole (Sq, Sk) score matrix at once."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, scale=None):
            scale = default_scale(q.shape[-1]) if scale is None else scale
            sq, sk = q.shape[-2], k.shape[-2]
            out, lse, tiles = torch.empty_like(q), torch.empty(q.shape[:-1]), {}
            for i in range(0, sq, tile):
                qi = q[..., i:i + tile, :]
                m = torch.full(qi.shape[:-1], float("-inf")) if max_sub else torch.zeros(qi.shape[:-1])
                l, acc = torch.zeros(qi.shape[:-1]), torch.zeros_like(qi)
                for j in range(0, sk, tile):
                    s = _pt_scores(qi, k[..., j:j + tile, :], scale, i, j, causal, strict)
                    m_new = torch.maximum(m, s.amax(-1)) if max_sub else m
                    p, alpha = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
                    l, acc, m = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v[..., j:j + tile, :], m_new
                out[..., i:i + tile, :] = acc / l[..., None]
                lse[..., i:i + tile] = m + torch.log(l)
                for j in range(0, sk, tile) if keep_p else ():  # the final P tiles, kept for backward
                    s = _pt_scores(qi, k[..., j:j + tile, :], scale, i, j, causal, strict)
                    tiles[i, j] = torch.exp(s - lse[..., i:i + tile, None])
            ctx.keys = list(tiles)
            if keep_p == "ctx":
                ctx.p_tiles = tiles
            _CACHE.update(tiles if keep_p == "cache" else {})
            kept = list(tiles.values()) if keep_p == "saved" else []
            ctx.save_for_backward(q, k, v, out, lse.unsqueeze(-2) if lse_4d and q.ndim == 3 else lse, *kept)
            ctx.causal, ctx.scale = causal, scale
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors[:5]
            lse = lse.reshape(q.shape[:-1])
            kept = {"saved": lambda: dict(zip(ctx.keys, ctx.saved_tensors[5:])), "ctx": lambda: ctx.p_tiles,
                    "cache": lambda: _CACHE}.get(keep_p, dict)()
            delta = torch.zeros(q.shape[:-1]) if zero_delta else (dout * out).sum(-1)
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for i in range(0, q.shape[-2], tile):
                qi, doi, li, di = q[..., i:i + tile, :], dout[..., i:i + tile, :], lse[..., i:i + tile, None], \
                    delta[..., i:i + tile, None]
                for j in range(0, k.shape[-2], tile):
                    kj, vj = k[..., j:j + tile, :], v[..., j:j + tile, :]
                    p = kept.get((i, j))
                    if p is None:
                        causal = ctx.causal and causal_in_backward
                        p = torch.exp(_pt_scores(qi, kj, ctx.scale, i, j, causal, strict) - li)
                    dv[..., j:j + tile, :] += p.transpose(-1, -2) @ doi
                    ds = p * (doi @ vj.transpose(-1, -2) - di)
                    dq[..., i:i + tile, :] += ctx.scale * ds @ kj
                    dk[..., j:j + tile, :] += ctx.scale * ds.transpose(-1, -2) @ qi
            _CACHE.clear()
            return dq, dk, dv, None, None

    return Fn


def _pytorch(sol05, pick=None, **mistake):
    return _public("flash_pytorch", with_answer(sol05, FlashAttentionPyTorch=_pytorch_fn(**mistake)), pick)


def test_the_test_pytorch_function_without_mistakes_passes(sol05):
    assert _pytorch(sol05).status == "passed"


def test_pytorch_without_max_subtraction_fails_on_large_scores(sol05):
    r = _pytorch(sol05, lambda name, i: name.startswith("large"), max_sub=False)
    assert r.status == "failed" and "subtract the running max" in r.message, r.message


@pytest.mark.parametrize("default, name", [(lambda d: 1.0 / d, "1/d"), (lambda d: 1.0, "1")])
def test_pytorch_wrong_default_scale_fails(sol05, default, name):
    r = _pytorch(sol05, FIRST, default_scale=default)
    assert r.status == "failed" and f"matches scale = {name}: the default is 1/sqrt(d)" in r.message, r.message


def test_pytorch_strict_causal_mask_fails(sol05):
    r = _pytorch(sol05, lambda name, i: name.startswith("4-D causal"), strict=True)
    assert r.status == "failed" and "strict causal mask" in r.message, r.message


def test_pytorch_lse_saved_with_a_head_dimension_fails_for_3d_inputs(sol05):
    r = _pytorch(sol05, FIRST, lse_4d=True)
    assert r.status == "failed" and "save exactly one: L" in r.message and "(2, 77)" in r.message, r.message


def test_pytorch_saving_p_fails(sol05):
    r = _pytorch(sol05, FIRST, keep_p="saved")
    assert r.status == "failed" and "recompute P = exp(S - L)" in r.message and "saved" in r.message, r.message


def test_pytorch_p_kept_on_ctx_fails(sol05):
    r = _pytorch(sol05, FIRST, keep_p="ctx")
    assert r.status == "failed" and "kept tensors on ctx outside save_for_backward" in r.message, r.message


def test_pytorch_p_kept_out_of_sight_fails_by_its_backward_flops(sol05):
    r = _pytorch(sol05, FIRST, keep_p="cache")
    assert r.status == "failed" and "matmul FLOPs" in r.message and "Keep no P" in r.message, r.message


def test_pytorch_whole_score_matrix_fails(sol05):
    r = _pytorch(sol05, FIRST, tile=10**6)
    assert r.status == "failed" and "whole (seq_q, seq_k) score matrix" in r.message, r.message


def test_pytorch_forgetting_delta_fails(sol05):
    r = _pytorch(sol05, FIRST, zero_delta=True)
    assert r.status == "failed" and "rowsum(dO ∘ O)" in r.message, r.message


def test_pytorch_backward_without_the_causal_mask_fails_on_causal_cases(sol05):
    r = _pytorch(sol05, lambda name, i: i < 2, causal_in_backward=False)
    assert r.status == "failed" and [c.status for c in r.cases] == ["passed", "failed"], r.message


def test_pytorch_4d_only_fails_on_3d_inputs(sol05):
    real = sol05["FlashAttentionPyTorch"]

    class Only4D(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, scale=None):
            b, h, s, d = q.shape  # (B, H, S, D) only
            return real.forward(ctx, q, k, v, causal, scale)

        backward = real.backward
    r = _public("flash_pytorch", with_answer(sol05, FlashAttentionPyTorch=Only4D), lambda name, i: i < 2)
    assert r.status != "passed" and [c.status for c in r.cases][1] == "passed" and "unpack" in r.message, r.message


# --- the Triton path takes (B, S, D) too, and scale is optional (CS336's interface) ----------------

def test_flash_attention_takes_one_head_as_3d(sol05):
    q, k = torch.randn(2, 50, 16), torch.randn(2, 40, 16)
    out, lse = sol05["flash_attention"](q, k, k, causal=True)
    ref_out, ref_lse = sol05["attention_reference"](q.unsqueeze(1), k.unsqueeze(1), k.unsqueeze(1), causal=True)
    assert out.shape == (2, 50, 16) and lse.shape == (2, 50)
    torch.testing.assert_close(out, ref_out.squeeze(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse.squeeze(1), atol=1e-5, rtol=1e-5)


def _cs336_call(name, i):
    return "FlashAttentionFunction.apply" in name


def test_triton_function_requiring_scale_fails_the_cs336_call(sol05):
    real = sol05["FlashAttentionFunction"]

    class NeedsScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            return real.forward(ctx, q, k, v, causal, scale)

        backward = real.backward
    r = _public("flash_backward", with_answer(sol05, FlashAttentionFunction=NeedsScale), _cs336_call)
    assert r.status != "passed" and "scale" in r.message, r.message


def test_triton_function_seeing_3d_inputs_as_one_head_outside_fails(sol05):
    real = sol05["FlashAttentionFunction"]

    class Outside:  # the head dimension added around the Function: it saves a (B, 1, Sq) lse
        @staticmethod
        def apply(q, k, v, causal=False, scale=None):
            if q.ndim == 3:
                return real.apply(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), causal, scale).squeeze(1)
            return real.apply(q, k, v, causal, scale)
    r = _public("flash_backward", with_answer(sol05, FlashAttentionFunction=Outside), _cs336_call)
    assert r.status == "failed" and "save exactly one lse" in r.message and "(2, 77)" in r.message, r.message


# --- the contract: do-nothing answers earn nothing; every hidden set holds the same rules ----------------

EIDS = ["attention_reference", "attention_memory", "flash_pytorch", "flash_forward", "flash_causal", "flash_backward"]


def _rule(case) -> str:
    """The rule of a case, read from its inputs (names carry random sizes; sequence lengths, batch, heads
    and whether a scale is given are random in some cases)."""
    x = case.inputs
    if "flash" in x:
        return f"{x['dtype_bytes']} bytes, flash={x['flash']}"
    nan_keys = x["layout"] != "rows" and bool(torch.isnan(x["k"]).any())
    return " ".join(str(v) for v in (x["layout"], x["q"].dtype, x.get("causal"), x["magnitude"] > 1,
                                     x.get("alloc", False), nan_keys, x["block_m"], x["block_n"]))


@pytest.mark.slow
@pytest.mark.parametrize("eid", EIDS)
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(exercises(STEM)[eid], kernels=eid != "attention_memory")


@pytest.mark.parametrize("eid", EIDS)
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid], rule=None if eid == "flash_pytorch" else _rule)


# --- more wrong answers, each failing on every seed ------------------------------------------------------

def _plain(c):
    return c.inputs.get("magnitude", 1) <= 1 and c.inputs.get("layout") == "bhsd"


@pytest.mark.parametrize("eid, old, new, text, pick", [
    ("attention_reference", ".tril()  # top-left", ".tril(diagonal=k.shape[-2] - q.shape[-2])  # top-left",
     "out:", lambda c: c.inputs.get("causal")),
    ("attention_reference", "scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale",
     "scale = 1.0 / q.shape[-1] if scale is None else scale", "out:", lambda c: c.inputs["scale"] is None),
    ("attention_memory", "return 2 * batch * heads * seq_q * seq_k * dtype_bytes",
     "return 2 * batch * heads * seq_q * seq_k * dtype_bytes + 4 * batch * heads * seq_q", "S and P", None),
    ("attention_memory", "return 4 * batch * heads * seq_q\n", "return 8 * batch * heads * seq_q\n",
     "the log-sum-exp only", None),
    ("flash_pytorch", "dq[..., i:i + TILE_Q, :] += scale * (ds @ kj)", "dq[..., i:i + TILE_Q, :] += ds @ kj", "dq:",
     None),
    ("flash_pytorch", "acc = alpha[..., None] * acc + p @ v", "acc = acc + p @ v", "out:", None),
    ("flash_pytorch", "l = alpha * l + p.sum(-1)", "l = l + p.sum(-1)", "out:", None),
    ("flash_pytorch", "lse[..., i:i + TILE_Q] = m + torch.log(l)", "lse[..., i:i + TILE_Q] = torch.log(l)",
     "L (saved log-sum-exp)", None),
    ("flash_forward", "H, Sq, Sk, scale * LOG2E,", "H, Sq, Sk, scale,", "out:", _plain),
    ("flash_forward", "EVEN_N=Sk % BLOCK_N == 0", "EVEN_N=Sk % BLOCK_M == 0", "out:", None),
    ("flash_forward", "b, h = bh // H, bh % H", "b, h = bh % H, bh // H", "", None),
], ids=["reference causal bottom-right", "reference scale 1/d", "naive memory with the lse", "flash memory m and l",
        "pytorch dq without the scale", "pytorch acc not rescaled", "pytorch l not rescaled", "pytorch lse without max",
        "kernel scale without log2(e)", "kernel key masks by BLOCK_M", "kernel batch and head swapped"])
def test_wrong_answers_fail_on_every_seed(sol05, eid, old, new, text, pick):
    kit.assert_fails_every_seed(exercises(STEM)[eid], kit.mutant(sol05, STEM, eid, old, new), text, pick=pick)


def test_key_masks_decided_by_block_m_fail_the_causal_kernel_too(sol05):
    ns = kit.mutant(sol05, STEM, "flash_forward", "EVEN_N=Sk % BLOCK_N == 0", "EVEN_N=Sk % BLOCK_M == 0")
    # the causal cell again, after the wrong launcher: its wrapper calls the launcher of its own namespace
    ns = exec_source(kit.source(kit.load("solutions", STEM), "flash_causal"), "<flash_causal>", ns)
    kit.assert_fails_every_seed(exercises(STEM)["flash_causal"], ns, "",
                                pick=lambda c: c.inputs["k"].shape[-2] % 64 == 32 and c.inputs["block_n"] == 64)
