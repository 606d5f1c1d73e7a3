"""Lab 02's checks: the solution passes; missing masks, bad grids, PyTorch shortcuts, ignored strides,
the wrong GELU form and a miscounted byte total are all rejected."""
import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import grade, with_answer

STEM = "02_triton_basics"


@pytest.mark.parametrize("eid", ["vector_add", "bias_gelu", "copy_2d", "fusion_bytes"])
def test_solution_passes_public_and_hidden_cases(sol02, eid):
    result = grade(STEM, eid, sol02)
    assert result.status == "passed", result.message


@triton.jit
def _add_store_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x + y)  # BUG: no mask, the last block writes past the end


@triton.jit
def _add_flat(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _launcher(kernel, grid_fn, check_contiguous=False):
    def vector_add(x, y, out=None, BLOCK=256):
        out = torch.empty_like(x) if out is None else out
        kernel[(grid_fn(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
        return out
    return vector_add


def test_store_without_mask_writes_the_guard_region(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_store_unmasked, triton.cdiv)),
              hidden=False)
    assert r.status == "failed" and "past the end" in r.message


def test_grid_rounded_down_leaves_the_tail_unwritten(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_flat, lambda n, b: max(n // b, 1))),
              hidden=False)
    assert r.status == "failed" and "NaN" in r.message


def test_strided_input_indexed_as_flat_is_wrong(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_flat, triton.cdiv)), hidden=False)
    assert r.status == "failed" and "non-contiguous" in r.message


def test_pytorch_instead_of_a_kernel_earns_nothing(sol02):
    def vector_add(x, y, out=None):
        out = torch.empty_like(x) if out is None else out
        return torch.add(x, y, out=out)
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def test_ignoring_out_is_caught(sol02):
    real = sol02["vector_add"]
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=lambda x, y, out=None: real(x, y)), hidden=False)
    assert r.status == "failed" and "`out`" in r.message


def test_mutating_an_input_is_caught(sol02):
    real = sol02["vector_add"]

    def vector_add(x, y, out=None):
        res = real(x, y, out=out)
        if x.is_contiguous():
            real(x, y, out=x)  # overwrites x
        return res
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "failed" and "was modified" in r.message


def test_tanh_gelu_where_erf_is_asked_fails_and_says_so(sol02):
    real = sol02["bias_gelu"]
    r = grade(STEM, "bias_gelu", with_answer(
        sol02, bias_gelu=lambda x, bias, approximate="none", out=None: real(x, bias, "tanh", out=out)), hidden=False)
    assert r.status == "failed" and "approximate='tanh' instead" in r.message


@triton.jit
def _gelu_store_unmasked(x_ptr, b_ptr, out_ptr, N, stride_xm, stride_om, APPROX_TANH: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    z = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32) + \
        tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty))  # BUG: no mask


def test_bias_gelu_without_column_mask_fails(sol02):
    def bias_gelu(x, bias, approximate="none", out=None):
        out = torch.empty_like(x) if out is None else out
        _gelu_store_unmasked[(x.shape[0], triton.cdiv(x.shape[1], 128))](
            x, bias, out, x.shape[1], x.stride(0), out.stride(0), APPROX_TANH=False, BLOCK_N=128)
        return out
    r = grade(STEM, "bias_gelu", with_answer(sol02, bias_gelu=bias_gelu), hidden=False)
    assert r.status == "failed"


@triton.jit
def _copy_assuming_contiguous(src_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]  # BUG: ignores the source's strides
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def test_copy_ignoring_strides_fails_with_a_stride_hint(sol02):
    def copy_2d(src, out=None):
        M, N = src.shape
        out = torch.empty((M, N), dtype=src.dtype, device=src.device) if out is None else out
        _copy_assuming_contiguous[(triton.cdiv(M, 32), triton.cdiv(N, 32))](src, out, M, N, BLOCK_M=32, BLOCK_N=32)
        return out
    r = grade(STEM, "copy_2d", with_answer(sol02, copy_2d=copy_2d), hidden=False)
    assert r.status == "failed" and "strides" in r.message
    assert 0 < r.score < r.points  # the contiguous cases still earn their share


def test_unfused_bytes_without_the_intermediate_fails(sol02):
    r = grade(STEM, "fusion_bytes", with_answer(
        sol02, bias_gelu_bytes=lambda M, N, b, fused: (2 * M * N + N) * b))
    assert r.status == "failed"


def test_rejecting_every_input_earns_nothing(sol02):
    def vector_add(x, y, out=None):
        raise ValueError("not supported")
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "error" and r.score == 0 and "not supported" in r.message
