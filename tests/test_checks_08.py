"""Lab 08's checks: the solution passes; the quantization bugs learners write are rejected.

One test (at least) per point of the curriculum's "C:" line for lab 08: zero-point rounding,
clamping at the int8 range edges, the per-channel axis, int8 (not fp32) storage, the STE gradient,
and a kernel that really reads int8 weights (plus launched, poisoned output, inputs unmodified).
"""
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from grader.checks import exercises
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

STEM = "08_quantization"


@pytest.fixture(scope="module")
def sol08():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["quant_params", "quant_roundtrip", "quant_calibrate", "ptq_linear",
                                 "fake_quant_ste", "qat_linear", "fp8_quant", "int8_weight_matmul"])
def test_solution_passes_public_and_hidden_cases(sol08, eid):
    result = grade(STEM, eid, sol08)
    assert result.status == "passed", result.message
    assert result.score == result.points


# --- zero-point: rounded to nearest, stored as an integer -----------------------------------------

def _qparams_with_zero_point(sol08, make_zp):
    def qparams(lo, hi, symmetric, qmin=-128, qmax=127):
        scale, zp = sol08["qparams"](lo, hi, symmetric, qmin, qmax)
        if symmetric:
            return scale, zp
        lo = torch.clamp(torch.as_tensor(lo, dtype=torch.float32), max=0.0)
        return scale, make_zp(qmin, lo / scale)
    return qparams


def test_zero_point_truncated_instead_of_rounded_fails(sol08):
    # int(lo / scale) or .to(torch.int32) truncates toward zero: off by one for half the ranges
    bad = _qparams_with_zero_point(sol08, lambda qmin, r: (qmin - r.to(torch.int32)).to(torch.int32))
    r = grade(STEM, "quant_params", with_answer(sol08, qparams=bad), hidden=False)
    assert r.status == "failed" and "zero_point" in r.message and "rounded down" in r.message


def test_zero_point_not_rounded_fails(sol08):
    bad = _qparams_with_zero_point(sol08, lambda qmin, r: qmin - r)  # a fractional float zero-point
    r = grade(STEM, "quant_params", with_answer(sol08, qparams=bad), hidden=False)
    assert r.status == "failed" and "not rounded" in r.message and "int32" in r.message


def test_range_not_widened_to_include_zero_fails(sol08):
    def qparams(lo, hi, symmetric, qmin=-128, qmax=127):
        lo, hi = torch.as_tensor(lo).float(), torch.as_tensor(hi).float()
        if symmetric:
            return sol08["qparams"](lo, hi, True, qmin, qmax)
        scale = ((hi - lo) / (qmax - qmin)).clamp(min=1e-7)  # ReLU output [0.5, 3.5]: 0 is not representable
        return scale, (qmin - torch.round(lo / scale)).clamp(qmin, qmax).to(torch.int32)
    r = grade(STEM, "quant_params", with_answer(sol08, qparams=qparams), hidden=False)
    assert r.status == "failed" and "include 0" in r.message and "ReLU" in r.message


# --- clamping at the range edges ------------------------------------------------------------------

def _quantize_with_clamp(sol08, clamp):
    along = sol08["_along"]

    def quantize(x, scale, zero_point, axis=None, qmin=-128, qmax=127):
        v = torch.round(x.float() / along(scale.float(), x.ndim, axis)) + along(zero_point, x.ndim, axis)
        return clamp(v, qmin, qmax).to(torch.int8)
    return quantize


def test_clamp_to_128_wraps_and_fails(sol08):
    bad = _quantize_with_clamp(sol08, lambda v, qmin, qmax: v.clamp(qmin, qmax + 1))  # [-128, 128]
    r = grade(STEM, "quant_roundtrip", with_answer(sol08, quantize=bad), hidden=False)
    assert r.status == "failed" and "wrapped around" in r.message and "128 does not fit" in r.message


def test_missing_clamp_fails(sol08):
    bad = _quantize_with_clamp(sol08, lambda v, qmin, qmax: v)
    r = grade(STEM, "quant_roundtrip", with_answer(sol08, quantize=bad), hidden=False)
    assert r.status == "failed" and "saturate" in r.message


def test_hardcoded_int8_range_fails_at_other_edges(sol08):
    bad = _quantize_with_clamp(sol08, lambda v, qmin, qmax: v.clamp(-128, 127))  # ignores qmin / qmax
    r = grade(STEM, "quant_roundtrip", with_answer(sol08, quantize=bad), hidden=False)
    assert r.status == "failed" and "[-8, 7]" in r.message
    assert 0 < r.score < r.points  # the plain int8 cases still earn their share


# --- the per-channel axis -------------------------------------------------------------------------

def test_range_reduced_along_the_channel_axis_fails(sol08):
    def minmax_range(x, axis=None):
        return (x.min(), x.max()) if axis is None else (x.amin(dim=axis), x.amax(dim=axis))  # BUG: reduces the axis
    r = grade(STEM, "quant_params", with_answer(sol08, minmax_range=minmax_range), hidden=False)
    assert r.status == "failed" and "every *other* dimension" in r.message


def test_scales_broadcast_along_the_wrong_axis_fail_on_a_square_matrix(sol08):
    def quantize(x, scale, zero_point, axis=None, qmin=-128, qmax=127):
        if axis is not None:  # BUG: always broadcasts along the last dimension
            scale, zero_point = scale.reshape([1] * (x.ndim - 1) + [-1]), zero_point.reshape([1] * (x.ndim - 1) + [-1])
        return (torch.round(x.float() / scale) + zero_point).clamp(qmin, qmax).to(torch.int8)
    r = grade(STEM, "quant_roundtrip", with_answer(sol08, quantize=quantize), hidden=False)
    assert r.status == "failed" and "Per-channel" in r.message and "square" in r.message


def _quant_linear_class(sol08, from_float):
    base = sol08["QuantLinear"]
    return type("QuantLinear", (base,), {"from_float": classmethod(from_float)})


def test_quant_linear_with_per_input_channel_scales_fails(sol08):
    def from_float(cls, linear, bits=8, per_channel=True):
        w = linear.weight.detach()
        qmax = 2 ** (bits - 1) - 1
        scale = (w.abs().amax(dim=0) / qmax if per_channel else w.abs().amax().reshape(1) / qmax).clamp(min=1e-7)
        s = scale.view(1, -1) if per_channel else scale  # BUG: one scale per column (input channel)
        q = torch.round(w / s).clamp(-qmax - 1, qmax).to(torch.int8)
        obj = cls(q, scale.float(), None if linear.bias is None else linear.bias.detach().clone())
        obj.forward = lambda x: F.linear(x, q.float() * s, obj.bias)
        return obj
    r = grade(STEM, "ptq_linear", with_answer(sol08, QuantLinear=_quant_linear_class(sol08, from_float)), hidden=False)
    assert r.status == "failed" and "per *output* channel" in r.message


# --- stored dtype: really int8 / fp8 --------------------------------------------------------------

def test_quantize_returning_float_codes_fails(sol08):
    real = sol08["quantize"]
    r = grade(STEM, "quant_roundtrip", with_answer(
        sol08, quantize=lambda *a, **k: real(*a, **k).float()), hidden=False)
    assert r.status == "failed" and r.score == 0 and "must really be torch.int8" in r.message


def test_quant_linear_keeping_float_weights_fails(sol08):
    real = sol08["QuantLinear"].from_float.__func__

    def from_float(cls, linear, bits=8, per_channel=True):
        obj = real(cls, linear, bits, per_channel)
        obj.qweight = obj.qweight.float()  # "quantized" values kept in fp32 next to their scales
        return obj
    r = grade(STEM, "ptq_linear", with_answer(sol08, QuantLinear=_quant_linear_class(sol08, from_float)), hidden=False)
    assert r.status == "failed" and r.score == 0 and "torch.int8" in r.message


def test_fp8_values_kept_in_float32_fail(sol08):
    real = sol08["fp8_quantize"]

    def fp8_quantize(x, fmt="e4m3"):
        x8, scale = real(x, fmt)
        return x8.float(), scale  # on the fp8 grid, but 4 bytes each
    r = grade(STEM, "fp8_quant", with_answer(sol08, fp8_quantize=fp8_quantize), hidden=False)
    assert r.status == "failed" and r.score == 0 and "saves nothing" in r.message


def test_fp8_without_scaling_fails(sol08):
    def fp8_quantize(x, fmt="e4m3"):
        dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
        return x.float().to(dtype), torch.tensor(1.0)  # small values underflow to 0
    r = grade(STEM, "fp8_quant", with_answer(sol08, fp8_quantize=fp8_quantize), hidden=False)
    assert r.status == "failed" and "maps the largest |x|" in r.message


# --- calibration -----------------------------------------------------------------------------------

def test_calibration_from_the_last_batch_only_fails(sol08):
    real = sol08["calibrate"]
    r = grade(STEM, "quant_calibrate", with_answer(
        sol08, calibrate=lambda batches, method="minmax", percentile=99.99: real(batches[-1:], method, percentile)),
        hidden=False)
    assert r.status == "failed" and "over *all* batches" in r.message


def test_average_of_per_batch_percentiles_fails(sol08):
    real = sol08["calibrate"]

    def calibrate(batches, method="minmax", percentile=99.99):
        if method == "minmax":
            return real(batches, method, percentile)
        ranges = [real([b], method, percentile) for b in batches]
        return sum(lo for lo, _ in ranges) / len(ranges), sum(hi for _, hi in ranges) / len(ranges)
    r = grade(STEM, "quant_calibrate", with_answer(sol08, calibrate=calibrate), hidden=False)
    assert r.status == "failed" and "not an average of per-batch percentiles" in r.message


# --- the straight-through estimator ---------------------------------------------------------------

def test_fake_quant_through_plain_round_has_zero_gradient_and_fails(sol08):
    def fake_quant(x, scale, zero_point, qmin, qmax):  # no STE: autograd differentiates round()
        return ((torch.round(x / scale) + zero_point).clamp(qmin, qmax) - zero_point) * scale
    r = grade(STEM, "fake_quant_ste", with_answer(sol08, fake_quant=fake_quant), hidden=False)
    assert r.status == "failed" and r.score == 0 and "derivative 0" in r.message


def test_unclipped_ste_passing_gradients_of_clamped_values_fails(sol08):
    real = sol08["fake_quant"]

    def fake_quant(x, scale, zero_point, qmin, qmax):  # identity STE everywhere, even where clamped
        return x + (real(x.detach(), scale, zero_point, qmin, qmax) - x).detach()
    r = grade(STEM, "fake_quant_ste", with_answer(sol08, fake_quant=fake_quant), hidden=False)
    assert r.status == "failed" and r.score == 0 and "outside the clipping range" in r.message


def test_ste_with_a_scaled_gradient_fails(sol08):
    class ScaledSTE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale, zero_point, qmin, qmax):
            code = torch.round(x / scale) + zero_point
            ctx.save_for_backward((code >= qmin) & (code <= qmax), scale)
            return (code.clamp(qmin, qmax) - zero_point) * scale

        @staticmethod
        def backward(ctx, g):
            inside, scale = ctx.saved_tensors
            return g * inside / scale, None, None, None, None  # BUG: d(x / scale)/dx kept
    r = grade(STEM, "fake_quant_ste", with_answer(
        sol08, fake_quant=lambda x, s, z, qmin, qmax: ScaledSTE.apply(x, s, z, qmin, qmax)), hidden=False)
    assert r.status == "failed" and "passes it through unchanged" in r.message


def test_qat_layer_with_a_detached_fake_quant_weight_fails(sol08):
    base = sol08["QATLinear"]

    class DetachedQAT(base):
        def forward(self, x):
            qmax = 2 ** (self.bits - 1) - 1
            s = (self.weight.detach().abs().amax(dim=1, keepdim=True) / qmax).clamp(min=1e-7)
            w = (torch.round(self.weight / s).clamp(-qmax - 1, qmax) * s).detach()  # PTQ in disguise
            return F.linear(x, w, self.bias)
    r = grade(STEM, "qat_linear", with_answer(sol08, QATLinear=DetachedQAT), hidden=False)
    assert r.status == "failed" and r.score == 0 and "received no gradient" in r.message


# --- the weight-only kernel: int8 in the kernel, launched, poisoned output, inputs intact ----------

@triton.jit
def _float_weight_matmul(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out = x @ w.T with a *float* weight: the kernel a learner writes after dequantizing in PyTorch."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K),
                    other=0.0)
        acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _launch_float(x, w, out):
    M, K = x.shape
    N = w.shape[0]
    _float_weight_matmul[(triton.cdiv(M, 16), triton.cdiv(N, 32))](
        x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)


def test_weight_dequantized_in_pytorch_before_the_kernel_fails(sol08):
    def int8_weight_matmul(x, w_q, w_scale, out=None):
        out = torch.empty(x.shape[0], w_q.shape[0], dtype=x.dtype, device=x.device) if out is None else out
        w = (w_q.float() * w_scale[:, None]).to(x.dtype)  # a full float copy of the weight
        _launch_float(x, w, out)
        return out
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and r.score == 0 and "dequantized before the kernel" in r.message


def test_weight_dequantized_in_pytorch_chunk_by_chunk_fails(sol08):
    # each kernel gets a small float chunk, so only the record of PyTorch allocations can tell
    def int8_weight_matmul(x, w_q, w_scale, out=None):
        out = torch.empty(x.shape[0], w_q.shape[0], dtype=x.dtype, device=x.device) if out is None else out
        for r0 in range(0, w_q.shape[0], 32):
            w = (w_q[r0:r0 + 32].float() * w_scale[r0:r0 + 32, None]).to(x.dtype)  # (32, K) float chunk
            _launch_float(x, w, out[:, r0:r0 + 32])
        return out
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and r.score == 0 and "dequantized in PyTorch" in r.message


def test_wasteful_float_copy_next_to_the_int8_kernel_fails(sol08):
    real = sol08["int8_weight_matmul"]

    def int8_weight_matmul(x, w_q, w_scale, out=None):
        w_ref = w_q.to(x.dtype) * w_scale[:, None]  # "just to check": the traffic the kernel was meant to save
        del w_ref
        return real(x, w_q, w_scale, out=out)
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and "floating-point elements in PyTorch" in r.message


def test_pytorch_only_weight_matmul_earns_nothing(sol08):
    def int8_weight_matmul(x, w_q, w_scale, out=None):
        return torch.matmul(x, (w_q.to(x.dtype) * w_scale[:, None].to(x.dtype)).t(), out=out)
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


@triton.jit
def _int8_matmul_store_unmasked_cols(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
        acc = tl.dot(x, w.to(x.dtype), acc)
    acc = acc * tl.load(s_ptr + rn, mask=rn < N, other=0.0)[None, :]
    # BUG: the store masks rows but not columns; the last column block overhangs N
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=rm[:, None] < M)


def test_store_without_column_mask_writes_the_guard_region(sol08):
    def int8_weight_matmul(x, w_q, w_scale, out=None):
        M, K = x.shape
        N = w_q.shape[0]
        out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
        _int8_matmul_store_unmasked_cols[(triton.cdiv(M, 16), triton.cdiv(N, 32))](
            x, w_q, w_scale, out, M, N, K, x.stride(0), w_q.stride(0), out.stride(0),
            BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)
        return out
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and "past the end" in r.message


def test_weight_matmul_ignoring_out_fails(sol08):
    real = sol08["int8_weight_matmul"]
    r = grade(STEM, "int8_weight_matmul", with_answer(
        sol08, int8_weight_matmul=lambda x, w_q, w_scale, out=None: real(x, w_q, w_scale)), hidden=False)
    assert r.status == "failed" and "`out`" in r.message


def test_weight_matmul_modifying_an_input_fails(sol08):
    real = sol08["int8_weight_matmul"]

    def int8_weight_matmul(x, w_q, w_scale, out=None):
        res = real(x, w_q, w_scale, out=out)
        w_scale.mul_(2.0)  # e.g. folding a correction into the caller's scales
        return res
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=int8_weight_matmul), hidden=False)
    assert r.status == "failed" and "`w_scale` was modified" in r.message


def _with_solution_kernel(sol08, grid_n, scale=None):
    kernel = sol08["int8_weight_matmul_kernel"]  # the solution's (autotuned) kernel, launched wrongly

    def int8_weight_matmul(x, w_q, w_scale, out=None):
        M, K = x.shape
        N = w_q.shape[0]
        out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), grid_n(N, meta["BLOCK_N"]))  # noqa: E731
        kernel[grid](x, w_q, w_scale if scale is None else scale(w_scale), out, M, N, K,
                     x.stride(0), w_q.stride(0), out.stride(0))
        return out
    return int8_weight_matmul


def test_grid_rounded_down_leaves_poisoned_outputs(sol08):
    bad = _with_solution_kernel(sol08, lambda n, b: max(1, n // b))
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=bad), hidden=False)
    assert r.status == "failed" and "NaN" in r.message and "never written" in r.message


def test_forgotten_scales_fail(sol08):
    bad = _with_solution_kernel(sol08, triton.cdiv, scale=torch.ones_like)
    r = grade(STEM, "int8_weight_matmul", with_answer(sol08, int8_weight_matmul=bad), hidden=False)
    assert r.status == "failed" and r.score == 0 and "outputs differ" in r.message


@triton.jit
def _int8_matmul_fp16_accumulator(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)  # BUG: the running sum keeps 11 bits
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
        acc = tl.dot(x, w.to(x.dtype), acc, out_dtype=tl.float16)  # Triton 3.6 needs out_dtype to match acc
    acc = acc * tl.load(s_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("block_k", [64, 256])
def test_float16_accumulator_fails_the_cancelling_cases(sol08, block_k):
    def int8_weight_matmul(x, w_q, w_scale, out=None):
        M, K = x.shape
        N = w_q.shape[0]
        out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
        _int8_matmul_fp16_accumulator[(triton.cdiv(M, 16), triton.cdiv(N, 32))](
            x, w_q, w_scale, out, M, N, K, x.stride(0), w_q.stride(0), out.stride(0),
            BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k)
        return out
    ex = exercises(STEM)["int8_weight_matmul"]
    cases = [c for seed in (None, 1, 2) for c in (ex.cases() if seed is None else ex.cases(seed, public=False))
             if c.name.startswith("partial sums that cancel")]
    assert len(cases) == 3
    r = evaluate(ex, with_answer(sol08, int8_weight_matmul=int8_weight_matmul), "cpu", cases)
    assert r.score == 0 and all(c.status == "failed" for c in r.cases), r.message
    assert "outputs differ" in r.message and "accumulate in float32" in r.message


# --- the 1-D per-channel path ----------------------------------------------------------------------

def test_range_of_a_1d_tensor_per_channel_reduced_to_one_value_fails(sol08):
    def minmax_range(x, axis=None):
        if axis is None:
            return x.min(), x.max()
        dims = [d for d in range(x.ndim) if d != axis]  # BUG: for a 1-D tensor dims = [], which reduces everything
        return x.amin(dim=dims), x.amax(dim=dims)
    r = grade(STEM, "quant_params", with_answer(sol08, minmax_range=minmax_range))
    failed = [c for c in r.cases if c.status != "passed"]
    assert failed and all("1-D" in c.name for c in failed), [c.name for c in failed]
    assert "every *other* dimension" in failed[0].message and "shape ()" in failed[0].message


def test_per_channel_scales_reshaped_for_2d_weights_only_fail(sol08):
    def quantize(x, scale, zero_point, axis=None, qmin=-128, qmax=127):
        if axis == 0:  # BUG: (C, 1) broadcasts along axis 0 of a matrix only
            scale, zero_point = scale.view(-1, 1), zero_point.view(-1, 1)
        return (torch.round(x.float() / scale) + zero_point).clamp(qmin, qmax).to(torch.int8)
    r = grade(STEM, "quant_roundtrip", with_answer(sol08, quantize=quantize), hidden=False)
    failed = {c.name.split(":")[0]: c for c in r.cases if c.status != "passed"}
    assert set(failed) == {"per-channel on a 1-D tensor", "per-channel axis=0 of a 3-D cube (7, 7, 7)"}, set(failed)
    assert "returned shape (37, 37)" in failed["per-channel on a 1-D tensor"].message
    for seed in (1, 2, 3):  # and in every hidden set
        ex = exercises(STEM)["quant_roundtrip"]
        r = evaluate(ex, with_answer(sol08, quantize=quantize), "cpu", ex.cases(seed, public=False))
        assert any(c.name.startswith("per-channel on a 1-D tensor") and c.status != "passed" for c in r.cases)


# --- answers that compute nothing earn nothing; every rule in every hidden set ----------------------

@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_answers_that_compute_nothing_score_zero(eid):
    ex = exercises(STEM)[eid]
    kit.assert_do_nothing_scores_zero(ex)


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid])


def test_the_solution_earns_full_marks_and_the_untouched_lab_zero(sol08):
    """In process, as the grader scores: the generated lab's stubs are all "not attempted", worth 0; the solution
    earns every point on the public cases (the hidden ones are graded above)."""
    import json

    import nbformat

    from grader.notebooks import answer_cells, exec_source, export_source

    ex_all = exercises(STEM)
    lab = nbformat.reads(json.dumps(kit.load("labs", STEM)), 4)
    ns = exec_source(export_source(lab, answer_cells(lab)), f"<labs/{STEM}.ipynb>")
    results = [evaluate(ex, ns, "cpu", ex.cases()[:1]) for ex in ex_all.values()]
    assert [r.status for r in results] == ["not_attempted"] * len(ex_all) and sum(r.score for r in results) == 0
    full = [grade(STEM, eid, sol08, hidden=False) for eid in ex_all]
    assert sum(r.score for r in full) == sum(ex.points for ex in ex_all.values())
