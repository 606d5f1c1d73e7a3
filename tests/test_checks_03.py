"""Lab 03's checks: the solution passes; each plausible reduction bug is rejected with a message that
names it: rows wider than one block, no max subtraction (overflow at +-1000), -inf masks and fully
masked rows, an off-by-one mask, a forgotten online rescale, fp16 accumulation, eps outside the
square root, the unbiased variance, PyTorch instead of a kernel, ignored `out`, mutated inputs.

The wrong kernels are one softmax kernel and one norm kernel with a flag per bug, so each test reads
as "the right kernel, except ...". Loads are always masked (at worst one element too far, which the
checks' padded inputs make safe): an unmasked load in the interpreter can crash the process.
"""
import pytest
import torch
import triton
import triton.language as tl

from grader.checks import exercises
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

STEM = "03_reductions"


@pytest.fixture(scope="module")
def sol03():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["softmax_rows", "softmax_online_state", "rmsnorm_forward", "layernorm_forward",
                                 "rmsnorm_backward"])
def test_solution_passes_public_and_hidden_cases(sol03, eid):
    result = grade(STEM, eid, sol03)
    assert result.status == "passed", result.message


# --- a softmax kernel with a switch per bug -----------------------------------------------------------

@triton.jit
def _softmax_variant(x_ptr, out_ptr, N, stride_xm, stride_om, BLOCK_N: tl.constexpr, SUB_MAX: tl.constexpr,
                     RESCALE: tl.constexpr,
                     GUARD_LANES: tl.constexpr, GUARD_ROW: tl.constexpr, LOAD_LE: tl.constexpr,
                     STORE_LE: tl.constexpr, LOOP: tl.constexpr, ACC: tl.constexpr, STATS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    m_lane = tl.full([BLOCK_N], float("-inf"), ACC)
    l_lane = tl.zeros([BLOCK_N], ACC)
    end = N if LOOP else 1  # LOOP=False: only the first block of the row
    for start in range(0, end, BLOCK_N):
        if LOAD_LE:
            mask = start + cols <= N  # BUG: one element past the row
        else:
            mask = start + cols < N
        x = tl.load(x_ptr + row * stride_xm + start + cols, mask=mask, other=float("-inf")).to(ACC)
        if SUB_MAX:
            m_new = tl.maximum(m_lane, x)
        else:
            m_new = tl.zeros([BLOCK_N], ACC)  # BUG: exp(x) with no shift
        if GUARD_LANES:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new).to(ACC)
        else:
            m_use = m_new  # BUG: exp(-inf - (-inf)) = NaN for a lane that saw only -inf
        p = tl.exp((x - m_use).to(tl.float32))  # exp is float32-only in Triton
        if RESCALE:
            l_lane = (l_lane * tl.exp((m_lane - m_use).to(tl.float32)) + p).to(ACC)
        else:
            l_lane = (l_lane + p).to(ACC)  # BUG: the sum so far keeps its old max
        m_lane = m_new
    m = tl.max(m_lane, axis=0)
    m_use = tl.where(m == float("-inf"), 0.0, m) if GUARD_ROW else m
    l = tl.sum((l_lane * tl.exp((m_lane - m_use).to(tl.float32))).to(ACC), axis=0)
    if STATS:
        tl.store(out_ptr + row * 2, m.to(tl.float32))
        tl.store(out_ptr + row * 2 + 1, l.to(tl.float32))
    else:
        inv = 1.0 / tl.where(l > 0.0, l, 1.0) if GUARD_ROW else 1.0 / l
        for start in range(0, end, BLOCK_N):
            mask = start + cols < N
            if STORE_LE:
                mask = start + cols <= N  # BUG: writes one element past the row
            x = tl.load(x_ptr + row * stride_xm + start + cols, mask=mask & (start + cols < N + 1),
                        other=float("-inf")).to(ACC)
            y = tl.exp((x - m_use.to(ACC)).to(tl.float32)) * inv.to(tl.float32)
            tl.store(out_ptr + row * stride_om + start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


RIGHT = dict(SUB_MAX=True, RESCALE=True, GUARD_LANES=True, GUARD_ROW=True, LOAD_LE=False, STORE_LE=False,
             LOOP=True, FP16_ACC=False)


def _softmax_with(stats=False, **bugs):
    flags = {**RIGHT, **bugs}
    fp16_acc = flags.pop("FP16_ACC")

    def fn(x, out=None, BLOCK_N=None):
        M, N = x.shape
        out = (torch.empty((M, 2) if stats else (M, N), dtype=torch.float32 if stats else x.dtype, device=x.device)
               if out is None else out)
        block = BLOCK_N or max(16, triton.next_power_of_2(N))
        acc = tl.float16 if fp16_acc and x.dtype == torch.float16 else tl.float32
        _softmax_variant[(M,)](x, out, N, x.stride(0), out.stride(0), BLOCK_N=block, ACC=acc, STATS=stats, **flags)
        return out
    return fn


def _softmax_case(sol03, **bugs):
    return grade(STEM, "softmax_rows", with_answer(sol03, softmax=_softmax_with(**bugs)), hidden=False)


def test_the_switchable_kernel_is_right_with_no_bug_switched_on(sol03):
    assert _softmax_case(sol03).status == "passed"


def test_no_max_subtraction_overflows_on_large_inputs(sol03):
    r = _softmax_case(sol03, SUB_MAX=False)
    assert r.status == "failed" and "+-1000" in r.message and "Subtract the row max" in r.message


def test_only_the_first_block_of_a_wide_row_fails(sol03):
    r = _softmax_case(sol03, LOOP=False)
    assert r.status == "failed" and "rows wider than one block" in r.message
    assert "Columns from 128 on were never written" in r.message


def test_forgetting_the_online_rescale_fails_on_wide_rows(sol03):
    r = _softmax_case(sol03, RESCALE=False)
    assert r.status == "failed" and "rows wider than one block" in r.message
    assert "rescale the running sum" in r.message


def test_mask_off_by_one_on_loads_reads_past_the_row(sol03):
    r = _softmax_case(sol03, LOAD_LE=True)
    assert r.status == "failed" and "elements differ" in r.message


def test_mask_off_by_one_on_stores_writes_past_the_end(sol03):
    r = _softmax_case(sol03, STORE_LE=True)
    assert r.status == "failed" and "past the end" in r.message


def test_unguarded_minus_inf_lanes_give_nan_on_masked_rows(sol03):
    r = _softmax_case(sol03, GUARD_LANES=False)
    assert r.status == "failed" and "sums to" in r.message  # the padding lanes of a short row are -inf too
    masked = next(c for c in r.cases if "-inf (masked) entries" in c.name)
    assert masked.status == "failed" and "exp(-inf - (-inf))" in masked.message


def test_fully_masked_row_must_be_zeros_not_nan(sol03):
    r = _softmax_case(sol03, GUARD_ROW=False)
    assert r.status == "failed"
    failed = [c for c in r.cases if c.status != "passed"]
    assert [c.name for c in failed] == [
        "(3, 100) float32, BLOCK_N=32: a fully masked row (all -inf)"]
    assert "its softmax is all zeros" in failed[0].message


def test_fp16_arithmetic_fails_on_long_fp16_rows(sol03):
    # Loads left in fp16: x - m and the running sums in fp16 (exp itself is float32-only in Triton).
    # The sum alone in fp16 stays within ~1e-3 (its terms are <= 1); the norms' checks show overflow.
    r = _softmax_case(sol03, FP16_ACC=True)
    assert r.status == "failed" and "long float16 rows" in r.message and "accumulate sums in float32" in r.message


def test_pytorch_softmax_earns_nothing(sol03):
    def softmax(x, out=None, BLOCK_N=None):
        y = torch.softmax(x.float(), dim=1).nan_to_num(0.0).to(x.dtype)
        return y if out is None else out.copy_(y)
    r = grade(STEM, "softmax_rows", with_answer(sol03, softmax=softmax), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def test_ignoring_out_is_caught(sol03):
    real = sol03["softmax"]
    ignores_out = lambda x, out=None, BLOCK_N=None: real(x, BLOCK_N=BLOCK_N)  # noqa: E731
    r = grade(STEM, "softmax_rows", with_answer(sol03, softmax=ignores_out), hidden=False)
    assert r.status == "failed" and "`out`" in r.message


def test_softmax_in_place_on_the_input_is_caught(sol03):
    real = sol03["softmax"]

    def softmax(x, out=None, BLOCK_N=None):
        real(x, out=x, BLOCK_N=BLOCK_N)  # overwrites x
        return out.copy_(x)
    r = grade(STEM, "softmax_rows", with_answer(sol03, softmax=softmax), hidden=False)
    assert r.status == "failed" and "was modified" in r.message


# --- online softmax state ---------------------------------------------------------------------------

def _stats_case(sol03, **answers):
    return grade(STEM, "softmax_online_state", with_answer(sol03, **answers), hidden=False)


def test_combine_without_rescale_is_rejected(sol03):
    def combine_stats(a, b):
        return torch.stack([torch.maximum(a[:, 0], b[:, 0]), a[:, 1] + b[:, 1]], dim=1)  # BUG: no rescale
    r = _stats_case(sol03, combine_stats=combine_stats)
    assert r.status == "failed" and r.score == 0 and "combine_stats" in r.message and "rescaled" in r.message


def test_combine_with_nan_on_empty_states_is_rejected(sol03):
    def combine_stats(a, b):
        m = torch.maximum(a[:, 0], b[:, 0])  # BUG: m = -inf for two empty parts gives exp(nan)
        return torch.stack([m, a[:, 1] * torch.exp(a[:, 0] - m) + b[:, 1] * torch.exp(b[:, 0] - m)], dim=1)
    r = _stats_case(sol03, combine_stats=combine_stats)
    assert r.status == "failed" and "(-inf, 0)" in r.message


def test_combine_rescaling_only_the_left_state_is_rejected(sol03):
    def combine_stats(a, b):  # BUG: assumes b's sum is already taken at the new max (true in some loops only)
        m = torch.maximum(a[:, 0], b[:, 0])
        m_use = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        return torch.stack([m, a[:, 1] * torch.exp(a[:, 0] - m_use) + b[:, 1]], dim=1)
    r = _stats_case(sol03, combine_stats=combine_stats)
    assert r.status == "failed" and "combine_stats" in r.message


def test_combine_mutating_its_input_is_caught(sol03):
    real = sol03["combine_stats"]

    def combine_stats(a, b):
        c = real(a, b)
        a[:, 1] = c[:, 1]  # writes into its input
        return c
    r = _stats_case(sol03, combine_stats=combine_stats)
    assert r.status == "failed" and r.score == 0
    assert all("modified" in c.message for c in r.cases)


def test_stats_kernel_without_rescale_is_rejected(sol03):
    r = _stats_case(sol03, softmax_stats=_softmax_with(stats=True, RESCALE=False))
    assert r.status == "failed" and "softmax_stats(x)" in r.message and "rescale the running sum" in r.message


def test_stats_kernel_without_max_subtraction_overflows(sol03):
    r = _stats_case(sol03, softmax_stats=_softmax_with(stats=True, SUB_MAX=False))
    large = next(c for c in r.cases if "values near +-1000" in c.name)
    assert large.status == "failed" and "exp(x) overflows float32" in large.message


def test_stats_kernel_right_with_the_switchable_kernel(sol03):
    assert _stats_case(sol03, softmax_stats=_softmax_with(stats=True)).status == "passed"


def test_stats_in_pytorch_earns_nothing(sol03):
    def softmax_stats(x, out=None, BLOCK_N=None):
        m = x.float().amax(1)
        s = torch.stack([m, torch.exp(x.float() - m.nan_to_num(neginf=0.0)[:, None]).sum(1)], dim=1)
        return s if out is None else out.copy_(s)
    r = _stats_case(sol03, softmax_stats=softmax_stats)
    assert r.status == "failed" and "no Triton kernel" in r.message


# --- a norm kernel with a switch per bug -------------------------------------------------------------

@triton.jit
def _norm_variant(x_ptr, w_ptr, b_ptr, out_ptr, N, stride_xm, stride_om, eps, BLOCK_N: tl.constexpr,
                  LAYER: tl.constexpr,
                  ACC: tl.constexpr, EPS_INSIDE: tl.constexpr, UNBIASED: tl.constexpr, LOOP: tl.constexpr,
                  STORE_MASK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    end = N if LOOP else 1
    s = tl.zeros([BLOCK_N], ACC)
    for start in range(0, end, BLOCK_N):
        s += tl.load(x_ptr + row * stride_xm + start + cols, mask=start + cols < N, other=0.0).to(ACC)
    mean = tl.sum(s, axis=0) / N if LAYER else 0.0
    q = tl.zeros([BLOCK_N], ACC)
    for start in range(0, end, BLOCK_N):
        mask = start + cols < N
        x = tl.load(x_ptr + row * stride_xm + start + cols, mask=mask, other=0.0).to(ACC)
        xc = tl.where(mask, x - mean, 0.0).to(ACC)
        q += xc * xc
    var = tl.sum(q, axis=0) / ((N - 1) if UNBIASED else N)
    if EPS_INSIDE:
        rstd = 1.0 / tl.sqrt((var + eps).to(tl.float32))
    else:
        rstd = 1.0 / (tl.sqrt(var.to(tl.float32)) + eps)  # BUG: eps outside the square root
    for start in range(0, end, BLOCK_N):
        mask = start + cols < N
        x = tl.load(x_ptr + row * stride_xm + start + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        if LAYER:
            y += tl.load(b_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        if STORE_MASK:
            tl.store(out_ptr + row * stride_om + start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(out_ptr + row * stride_om + start + cols, y.to(out_ptr.dtype.element_ty))  # BUG: no mask


NORM_RIGHT = dict(FP16_ACC=False, EPS_INSIDE=True, UNBIASED=False, LOOP=True, STORE_MASK=True)


def _norm_with(layer, **bugs):
    flags = {**NORM_RIGHT, **bugs}
    fp16_acc = flags.pop("FP16_ACC")

    def launch(x, w, b, eps, out, BLOCK_N):
        out = torch.empty_like(x) if out is None else out
        block = BLOCK_N or max(16, triton.next_power_of_2(x.shape[1]))
        acc = tl.float16 if fp16_acc and x.dtype == torch.float16 else tl.float32
        _norm_variant[(x.shape[0],)](x, w, w if b is None else b, out, x.shape[1], x.stride(0), out.stride(0), eps,
                                     BLOCK_N=block,
                                     LAYER=layer, ACC=acc, **flags)
        return out
    if layer:
        return lambda x, weight, bias, eps=1e-5, out=None, BLOCK_N=None: launch(x, weight, bias, eps, out, BLOCK_N)
    return lambda x, weight, eps=1e-6, out=None, BLOCK_N=None: launch(x, weight, None, eps, out, BLOCK_N)


def _rms_case(sol03, **bugs):
    return grade(STEM, "rmsnorm_forward", with_answer(sol03, rmsnorm=_norm_with(False, **bugs)), hidden=False)


def _ln_case(sol03, **bugs):
    return grade(STEM, "layernorm_forward", with_answer(sol03, layernorm=_norm_with(True, **bugs)), hidden=False)


def test_the_switchable_norm_kernels_are_right_with_no_bug_switched_on(sol03):
    assert _rms_case(sol03).status == "passed"
    assert _ln_case(sol03).status == "passed"


@pytest.mark.parametrize("layer", [False, True], ids=["rmsnorm", "layernorm"])
def test_fp16_accumulation_overflows_on_long_rows_with_a_large_mean(sol03, layer):
    r = (_ln_case if layer else _rms_case)(sol03, FP16_ACC=True)
    assert r.status == "failed" and "large mean" in r.message and "overflows to inf" in r.message
    failed = [c.name for c in r.cases if c.status != "passed"]
    assert all("float16" in name for name in failed)


def test_rmsnorm_eps_outside_the_sqrt_is_named(sol03):
    r = _rms_case(sol03, EPS_INSIDE=False)
    assert r.status == "failed" and "eps goes inside the square root" in r.message


def test_layernorm_eps_outside_the_sqrt_is_named(sol03):
    r = _ln_case(sol03, EPS_INSIDE=False)
    assert r.status == "failed" and "eps goes inside the square root" in r.message


def test_layernorm_unbiased_variance_is_named(sol03):
    r = _ln_case(sol03, UNBIASED=True)
    assert r.status == "failed" and "unbiased variance" in r.message


@pytest.mark.parametrize("layer", [False, True], ids=["rmsnorm", "layernorm"])
def test_norm_over_the_first_block_only_fails_wide_rows(sol03, layer):
    r = (_ln_case if layer else _rms_case)(sol03, LOOP=False)
    assert r.status == "failed" and "rows wider than one block" in r.message and "span 6 blocks" in r.message


def test_norm_store_without_mask_writes_past_the_end(sol03):
    r = _rms_case(sol03, STORE_MASK=False)
    assert r.status == "failed" and "past the end" in r.message


def test_eager_layernorm_earns_nothing(sol03):
    def layernorm(x, weight, bias, eps=1e-5, out=None, BLOCK_N=None):
        y = torch.nn.functional.layer_norm(x.float(), (x.shape[1],), weight.float(), bias.float(), eps).to(x.dtype)
        return y if out is None else out.copy_(y)
    r = grade(STEM, "layernorm_forward", with_answer(sol03, layernorm=layernorm), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


# --- stretch: RMSNorm backward -------------------------------------------------------------------------

@triton.jit
def _rms_bwd_variant(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_ptr, M, N, stride_xm, stride_dym, eps, BLOCK_N: tl.constexpr,
                     RSTD_TERM: tl.constexpr, DW_RSTD: tl.constexpr, DW_ALL_ROWS: tl.constexpr):
    """One program per block of columns, rows in a loop: slow but simple (whole rows: BLOCK_N >= N)."""
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for row in range(0, M):
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        dx = rstd * w * dy
        if RSTD_TERM:
            dx -= x * rstd * rstd * rstd * tl.sum(w * dy * x, axis=0) / N
        tl.store(dx_ptr + row * N + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        term = dy * x * rstd if DW_RSTD else dy * x  # BUG when off: rstd forgotten in dweight
        if DW_ALL_ROWS:
            dw += term
        elif row == 0:
            dw += term  # BUG: only the first row's term
    tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=mask)


def _rms_bwd_with(**bugs):
    flags = {**dict(RSTD_TERM=True, DW_RSTD=True, DW_ALL_ROWS=True), **bugs}

    def rmsnorm_backward(x, weight, dy, eps=1e-6, out=None, BLOCK_N=None):
        dx, dw = (torch.empty_like(x), torch.empty_like(weight)) if out is None else out
        _rms_bwd_variant[(1,)](x, weight, dy, dx, dw, x.shape[0], x.shape[1], x.stride(0), dy.stride(0), eps,
                               BLOCK_N=max(16, triton.next_power_of_2(x.shape[1])), **flags)
        return dx, dw
    return rmsnorm_backward


def _bwd_case(sol03, **bugs):
    return grade(STEM, "rmsnorm_backward", with_answer(sol03, rmsnorm_backward=_rms_bwd_with(**bugs)), hidden=False)


def test_the_switchable_backward_is_right_with_no_bug_switched_on(sol03):
    assert _bwd_case(sol03).status == "passed"


def test_backward_without_the_rstd_gradient_is_named(sol03):
    r = _bwd_case(sol03, RSTD_TERM=False)
    assert r.status == "failed" and "the gradient through rstd is missing" in r.message


def test_dweight_without_rstd_is_named(sol03):
    r = _bwd_case(sol03, DW_RSTD=False)
    assert r.status == "failed" and "needs its rstd" in r.message


def test_dweight_from_one_row_is_named(sol03):
    r = _bwd_case(sol03, DW_ALL_ROWS=False)
    assert r.status == "failed" and "first row's term only" in r.message


def test_backward_by_autograd_earns_nothing(sol03):
    def rmsnorm_backward(x, weight, dy, eps=1e-6, out=None, BLOCK_N=None):
        xx, ww = x.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
        y = xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + eps) * ww
        dx, dw = torch.autograd.grad(y, (xx, ww), dy.float())
        return out[0].copy_(dx), out[1].copy_(dw)
    r = grade(STEM, "rmsnorm_backward", with_answer(sol03, rmsnorm_backward=rmsnorm_backward), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


# --- row-padded inputs: rows are x.stride(0) apart, not N ---------------------------------------------

def _padded_cases(eid, seeds=(1, 2)):
    """The row-padded cases of ``eid``: the public one and those of a few hidden seeds."""
    ex = exercises(STEM)[eid]
    cases = ex.cases() + [c for seed in seeds for c in ex.cases(seed=seed, public=False)]
    return [c for c in cases if c.inputs.get("row_pad")]


def _wrong_solution(sol03, eid, old, new):
    """The solution with one piece of its answer to ``eid`` replaced (a plausible bug)."""
    return kit.mutant(sol03, STEM, eid, old, new)


@pytest.mark.parametrize("eid, old, new", [
    ("softmax_rows", "(x, out, N, x.stride(0), out.stride(0)", "(x, out, N, N, out.stride(0)"),
    ("softmax_online_state", "(x, out, N, x.stride(0), out.stride(0)", "(x, out, N, N, out.stride(0)"),
    ("rmsnorm_forward", "(x, weight, out, N, x.stride(0), out.stride(0)", "(x, weight, out, N, N, out.stride(0)"),
    ("layernorm_forward", "(x, weight, bias, out, N, x.stride(0), out.stride(0)",
     "(x, weight, bias, out, N, N, out.stride(0)"),
], ids=["softmax", "softmax_stats", "rmsnorm", "layernorm"])
def test_rows_offset_by_n_instead_of_the_stride_fail_on_padded_rows(sol03, eid, old, new):
    wrong = _wrong_solution(sol03, eid, old, new)
    cases = _padded_cases(eid)
    assert len(cases) == 3
    r = evaluate(exercises(STEM)[eid], wrong, "cpu", cases)
    assert r.score == 0 and all(c.status == "failed" for c in r.cases), r.message
    assert "row-padded view" in r.message and "x.stride(0)" in r.message


def test_backward_with_x_row_stride_for_dy_fails(sol03):
    wrong = _wrong_solution(sol03, "rmsnorm_backward", "x.stride(0), dy.stride(0), dx.stride(0)",
                            "x.stride(0), x.stride(0), dx.stride(0)")
    r = evaluate(exercises(STEM)["rmsnorm_backward"], wrong, "cpu", _padded_cases("rmsnorm_backward"))
    assert r.score == 0 and "different row strides" in r.message, r.message


# --- hidden cases hold every rule, on every seed ---------------------------------------------------------

def _rules(case) -> set:
    """The rules a case exercises, read from its inputs (not its name)."""
    x = case.inputs
    if x.get("kind") == "combine":
        return {"combine: hand-made states"}
    t = x["x"]
    rules = {f"kind {x['kind']}", f"{x['kind']} in {str(t.dtype).replace('torch.', '')}"}
    block, N = x.get("block_n"), t.shape[1]
    if block and N > block:
        rules.add("rows wider than BLOCK_N")
    if N % (block or 16) and N > 1:
        rules.add("a partial last block")
    if x.get("row_pad"):
        rules.add("row-padded view" + (" (dy padded differently)" if x.get("dy_row_pad") != x.get("row_pad") and
                                       "dy_row_pad" in x else ""))
    if torch.isneginf(t).any():
        rules.add("-inf entries")
    if t.abs().max() > 500:
        rules.add("large magnitudes")
    return rules


@pytest.mark.parametrize("eid", ["softmax_rows", "softmax_online_state", "rmsnorm_forward", "layernorm_forward",
                                 "rmsnorm_backward"])
def test_every_seed_hides_cases_of_every_rule(eid):
    ex = exercises(STEM)[eid]
    seen = [set().union(*map(_rules, ex.cases(seed=seed, public=False))) for seed in (1, 2, 3, 20261122, 4242)]
    assert all(s == seen[0] for s in seen), [s ^ seen[0] for s in seen]
    assert {"rows wider than BLOCK_N", "a partial last block"} <= seen[0]
    assert any(r.startswith("row-padded view") for r in seen[0])
    public = set().union(*map(_rules, ex.cases()))
    assert {r for r in public if r.startswith("kind")} == {r for r in seen[0] if r.startswith("kind")}


# --- out=None in float16: the states are float32 whatever x's dtype -------------------------------------

def test_stats_allocated_in_x_dtype_fail_on_float16(sol03):
    # BUG: the default `out` in x's dtype (right for float32 inputs; the check always passed `out` before)
    wrong = _wrong_solution(sol03, "softmax_online_state",
                            "out = rows_out(x, out, out_shape=(x.shape[0], 2), out_dtype=torch.float32)",
                            "out = torch.empty((x.shape[0], 2), dtype=x.dtype, device=x.device) "
                            "if out is None else out")
    ex = exercises(STEM)["softmax_online_state"]
    cases = [c for seed in (None, 1, 2) for c in (ex.cases() if seed is None else ex.cases(seed=seed, public=False))
             if c.inputs.get("kind") == "alloc"]
    assert len(cases) == 3
    r = evaluate(ex, wrong, "cpu", cases)
    assert r.score == 0 and "dtype torch.float16 but expected torch.float32" in r.message, r.message
    assert "out_dtype=torch.float32" in r.message
    assert evaluate(ex, sol03, "cpu", cases).status == "passed"


# --- the contract: do-nothing answers earn nothing; every hidden set holds the same rules ----------------

EIDS = ["softmax_rows", "softmax_online_state", "rmsnorm_forward", "layernorm_forward", "rmsnorm_backward"]


def _rule(case) -> str:
    """The rule of a case, read from its inputs (names carry random sizes)."""
    x = case.inputs
    t = x.get("x")
    return f"{x['kind']} {'states' if t is None else t.dtype} BLOCK_N {'given' if x.get('block_n') else 'none'}"


@pytest.mark.slow
@pytest.mark.parametrize("eid", EIDS)
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(exercises(STEM)[eid], kernels=True)


@pytest.mark.parametrize("eid", EIDS)
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid], rule=_rule)


# --- more wrong answers, each failing on every seed ------------------------------------------------------

def _kind(*kinds):
    return lambda c: c.inputs.get("kind") in kinds


EPS_OUTSIDE = "eps goes inside the square root"


@pytest.mark.parametrize("eid, old, new, text, pick", [
    ("softmax_rows", 'other=float("-inf")).to(tl.float32)', 'other=0.0).to(tl.float32)', "elements differ",
     _kind("normal", "masked")),
    ("softmax_online_state", 'm_use = tl.where(m == float("-inf"), 0.0, m)\n    l = tl.sum',
     'm_use = m\n    l = tl.sum', "l (column 1)", _kind("masked")),
    ("rmsnorm_forward", "tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "1.0 / (tl.sqrt(tl.sum(x * x, axis=0) / N) + eps)",
     EPS_OUTSIDE, _kind("eps")),
    ("rmsnorm_forward", "tl.rsqrt(tl.sum(acc, axis=0) / N + eps)", "1.0 / (tl.sqrt(tl.sum(acc, axis=0) / N) + eps)",
     EPS_OUTSIDE, _kind("eps")),
    ("rmsnorm_forward", "tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK_N + eps)",
     "elements differ", _kind("tiny", "normal")),
    ("rmsnorm_forward", "w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)",
     "w = tl.load(w_ptr + cols).to(tl.float32)", "past the end of `w_ptr`", _kind("tiny", "normal")),
    ("layernorm_forward", "xc = tl.where(mask, x - mean, 0.0)  # padding", "xc = x - mean  # padding",
     "elements differ", _kind("tiny", "normal")),
    ("layernorm_forward", "rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)",
     "rstd = 1.0 / (tl.sqrt(tl.sum(xc * xc, axis=0) / N) + eps)", EPS_OUTSIDE, _kind("eps")),
    ("rmsnorm_backward", "c = tl.sum(sum_dot, axis=0) / N * rstd * rstd", "c = tl.sum(sum_dot, axis=0) * rstd * rstd",
     "dx:", _kind("tiny", "normal")),
    ("rmsnorm_backward", "mask = (rows[:, None] < M) & (cols[None, :] < N)", "mask = cols[None, :] < N", "past the end",
     _kind("tiny", "normal")),
    ("rmsnorm_backward", "rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / N + eps)",
     "rstd = 1.0 / (tl.sqrt(tl.sum(sum_sq, axis=0) / N) + eps)", "dx:", _kind("eps")),
], ids=["softmax pads with 0 not -inf", "stats unguarded -inf max", "rms eps outside sqrt, one block",
        "rms eps outside sqrt, wide rows", "rms mean over BLOCK_N", "rms weight load unmasked",
        "layernorm padding lanes in the variance", "layernorm eps outside sqrt, one block", "dx without / N",
        "dweight without a row mask", "backward eps outside sqrt"])
def test_wrong_answers_fail_on_every_seed(sol03, eid, old, new, text, pick):
    kit.assert_fails_every_seed(exercises(STEM)[eid], kit.mutant(sol03, STEM, eid, old, new), text, pick=pick)
