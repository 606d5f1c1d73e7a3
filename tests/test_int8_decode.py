"""Lab 08's decode GEMV (``int8_gemv``, beside the tiled ``int8_weight_matmul``).

On the CPU: correct for M = 1..16 rows, odd sizes, float32 and float16, and a plausible wrong GEMV
fails the same comparison. Compiled for an H100 (``gpulab.aot``) at K = N = 4096 and 8192: one row for
one token (no padded 16-row tile), enough programs for 132 SMs, int8 weights read 128 bits at a time and
dequantized without int-to-float instructions; the tiled kernel shows the opposite on each point.

Its K loop, read from the SASS: no barrier, and few enough instructions per weight byte that issuing
them allows >= 95% of the H100's (and H200's) memory bandwidth. A GEMV that reduces across the block
in every K step (the first design) has barriers there and an issue ceiling below the bandwidth.
"""
import re

import pytest
import torch
import triton
import triton.language as tl

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

def _decode_records(entry: str, kn: int = 4096):
    from tests.test_compile_targets import lab_namespace

    ns = lab_namespace("08_quantization")  # the GPU configurations
    x = torch.empty(1, kn, device="meta", dtype=torch.float16)  # one token
    w = torch.empty(kn, kn, device="meta", dtype=torch.int8)
    s = torch.empty(kn, device="meta", dtype=torch.float32)
    return aot.compile_call(ns[entry], x, w, s)


H100_COPY, H200_COPY = 3.35e12, 4.8e12  # datasheet HBM bytes/s (a measured copy is lower: these are conservative)


def k_loop_figure(r: aot.KernelRecord) -> dict:
    """One K step of a GEMV kernel, from its SASS: instructions, barriers, int8 weight bytes per thread, and
    the bandwidth at which issuing those instructions is the limit, as a share of the HBM bandwidth."""
    body = aot.main_loop(r.sass())
    weight_bytes = r.config["BLOCK_N"] * r.config["BLOCK_K"] / r.threads
    per_byte = len(body) / weight_bytes
    ceiling = aot.issue_ceiling_bytes_per_s(per_byte)
    return {"instructions": len(body), "barriers": sum("BAR" in t for t in body), "weight_bytes": weight_bytes,
            "per_byte": per_byte, "ceiling_tb_s": ceiling / 1e12, "pct_h100": 100 * ceiling / H100_COPY,
            "pct_h200": 100 * ceiling / H200_COPY,
            # one K step's weight loads of every resident thread, issued before its products need them
            "in_flight_kib": (r.ctas_per_sm or 0) * r.threads * weight_bytes / 1024}


# Little's law: bytes in flight per SM = bandwidth x latency / SMs; 600 ns of loaded DRAM latency is an
# estimate (no GPU measured it here), so H200's 4.8 TB/s needs about 4.8e12 x 600e-9 / 132 = 21 KiB per SM.
IN_FLIGHT_KIB = 4.8e12 * 600e-9 / 132 / 1024


def figure_text(f: dict) -> str:
    return (f"{f['instructions']} instructions per {f['weight_bytes']:g} weight bytes per thread = "
            f"{f['per_byte']:.1f} per byte, {f['barriers']} barriers per K step: issue ceiling "
            f"{f['ceiling_tb_s']:.2f} TB/s = {f['pct_h100']:.0f}% of an H100's 3.35 TB/s, "
            f"{f['pct_h200']:.0f}% of an H200's 4.8 TB/s; {f['in_flight_kib']:.0f} KiB of weight loads in "
            f"flight per SM")


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
@pytest.mark.parametrize("kn", [4096, 8192])
def test_the_gemv_compiles_to_a_decode_kernel_for_h100(kn):
    (r,) = _decode_records("int8_gemv", kn)  # one configuration, chosen from M: no autotuning
    assert decode_problems(r) == [], r.config_text()
    f = k_loop_figure(r)
    print(f"int8_gemv_kernel K=N={kn} [{r.config_text()}] ({aot.toolchain()}): {figure_text(f)}")
    assert f["barriers"] == 0 and f["pct_h100"] >= 95 and f["pct_h200"] >= 95, figure_text(f)
    assert f["in_flight_kib"] >= IN_FLIGHT_KIB, figure_text(f)


@triton.jit
def _gemv_reducing_every_step(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # The first design: the K sum of every step reduced across the block inside the loop.
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=rm[:, None] < M, other=0.0).to(tl.float32)
        q = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :])  # (BLOCK_N, BLOCK_K) int8
        bits = (q.to(tl.uint8, bitcast=True).to(tl.uint32) ^ 0x80) | 0x4B000000
        w = bits.to(tl.float32, bitcast=True) - 8388736.0
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=rm[:, None] < M)


@pytest.mark.slow
def test_a_gemv_reducing_in_every_k_step_misses_the_bandwidth():
    x, w = torch.empty(1, 4096, device="meta", dtype=torch.float16), torch.empty(4096, 4096, device="meta",
                                                                                  dtype=torch.int8)
    out, s = torch.empty(1, 4096, device="meta", dtype=torch.float16), torch.empty(4096, device="meta")
    (r,) = aot.compile_kernel(_gemv_reducing_every_step, (1024,), x, w, s, out, 1, 4096, 4096, 4096, 4096, 4096,
                              BLOCK_M=1, BLOCK_N=4, BLOCK_K=512, num_warps=4)
    f = k_loop_figure(r)
    assert f["barriers"] > 0 and f["pct_h100"] < 95, figure_text(f)


@pytest.mark.slow
def test_the_tiled_kernel_is_not_one():
    records = _decode_records("int8_weight_matmul")
    assert records and all(len(decode_problems(r)) >= 2 for r in records)  # every autotuner config
    assert all(r.config["BLOCK_M"] == 16 and re.search(r"\bI2F", r.sass()) for r in records)
