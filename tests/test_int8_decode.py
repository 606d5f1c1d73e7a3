"""Lab 08's decode GEMV (``int8_gemv``, beside the tiled ``int8_weight_matmul``).

On the CPU: correct for M = 1..16 rows, odd sizes, float32 and float16, and a plausible wrong GEMV
fails the same comparison. Compiled for an H100 (``gpulab.aot``) at K = N = 4096: one row for one
token (no padded 16-row tile), enough programs for 132 SMs, int8 weights read 128 bits at a time and
dequantized without int-to-float instructions; the tiled kernel shows the opposite on each point.
"""
import re

import pytest
import torch

from gpulab import aot
from tests.conftest import solution_namespace

SHAPES = [(1, 37, 300, torch.float32), (2, 64, 1000, torch.float16), (5, 3, 17, torch.float32),
          (16, 96, 64, torch.float16), (1, 1, 1, torch.float32), (9, 130, 513, torch.float32)]


@pytest.fixture(scope="module")
def sol08():
    return solution_namespace("08_quantization")


def gemv_errors(fn, seed: int = 0) -> list[str]:
    """What ``fn(x, w_q, w_scale)`` gets wrong against float64 on decode shapes (empty: nothing)."""
    gen = torch.Generator().manual_seed(seed)
    errors = []
    for M, N, K, dtype in SHAPES:
        x = torch.randn(M, K, generator=gen).to(dtype)
        w_q = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
        w_q[0, 0], w_q[-1, -1] = -128, 127  # both ends of the int8 range
        w_scale = (torch.rand(N, generator=gen) + 0.5) / 127
        expected = x.double() @ (w_q.double() * w_scale.double()[:, None]).T
        out = fn(x, w_q, w_scale)
        tol = dict(rtol=1e-4, atol=1e-4 * K**0.5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        if out.shape != (M, N) or out.dtype != dtype:
            errors.append(f"M={M} N={N} K={K}: got {tuple(out.shape)} {out.dtype}")
        elif not torch.allclose(out.double(), expected, **tol):
            errors.append(f"M={M} N={N} K={K} {dtype}: max error {(out.double() - expected).abs().max():.3g}")
    return errors


def test_the_gemv_matches_float64_on_decode_shapes(sol08):
    assert gemv_errors(sol08["int8_gemv"]) == []


def test_a_gemv_that_reads_the_codes_as_unsigned_fails():
    # The dequantization trick without its XOR 0x80: every negative code comes out 256 too large.
    def unsigned_gemv(x, w_q, w_scale):
        w = w_q.view(torch.uint8).float() * w_scale[:, None]
        return (x.float() @ w.T).to(x.dtype)
    assert len(gemv_errors(unsigned_gemv)) >= len(SHAPES) - 1  # a 1x1 weight of 127 cannot tell


def test_the_gemv_refuses_prefill_shapes(sol08):
    with pytest.raises(ValueError, match="M <= 16"):
        sol08["int8_gemv"](torch.randn(17, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4))


# --- compiled for an H100 --------------------------------------------------------------------------

def _decode_records(entry: str):
    from tests.test_compile_sm90 import h100_namespace

    ns = h100_namespace("08_quantization")  # the GPU configurations
    x = torch.empty(1, 4096, device="meta", dtype=torch.float16)  # one token
    w = torch.empty(4096, 4096, device="meta", dtype=torch.int8)
    s = torch.empty(4096, device="meta", dtype=torch.float32)
    return aot.compile_call(ns[entry], x, w, s)


def decode_problems(r: aot.KernelRecord) -> list[str]:
    """How a kernel falls short of a decode GEMV at M = 1, K = N = 4096 on an H100."""
    problems = []
    if r.config["BLOCK_M"] != 1:
        problems.append(f"a {r.config['BLOCK_M']}-row tile for one row")
    programs = r.grid[0] * r.grid[1] * r.grid[2]
    if programs < 2 * aot.H100.sms:
        problems.append(f"{programs} programs for {aot.H100.sms} SMs")
    if re.search(r"\bI2F", r.sass()):
        problems.append("int-to-float instructions (I2F) dequantize the weights")
    if r.vector_bits < 128 or not r.int8_loads or r.spills:
        problems.append(f"loads {r.vector_bits}-bit {r.loads}, spills {r.spills}")
    return problems


@pytest.mark.slow
def test_the_gemv_compiles_to_a_decode_kernel_for_h100():
    records = _decode_records("int8_gemv")
    assert len(records) == 3  # every GPU configuration of the autotuner
    for r in records:
        assert decode_problems(r) == [], r.config_text()


@pytest.mark.slow
def test_the_tiled_kernel_is_not_one():
    records = _decode_records("int8_weight_matmul")
    assert records and all(len(decode_problems(r)) >= 2 for r in records)
    assert all(r.config["BLOCK_M"] == 16 and re.search(r"\bI2F", r.sass()) for r in records)
