"""Every lab kernel compiled for an H100 (sm_90) without a GPU, through Triton's own path (issue 12).

``gpulab.aot`` puts a stand-in CUDA driver under Triton: specialisation, the autotuner, the NVIDIA
backend with its bundled ptxas and the launch-time shared-memory check all run as on an H100; the
launch itself does nothing and the inputs are meta tensors at the benchmarks' full sizes. Each
compiled kernel must launch (shared memory within 232,448 B), spill no registers, use tensor cores
where it multiplies matrices, load 128 bits per instruction where it is memory-bound, and read int8
weights as int8. The table goes to stdout and to ``.gpulab/compile_sm90.md``; a copy per Triton
version is committed under ``benchmarks/results/``.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import triton
import triton.language as tl

from gpulab import aot
from gpulab.paths import ROOT
from grader.checks import load_lab
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook
from tests.test_int8_decode import figure_text, k_loop_figure

LABS = ["02_triton_basics", "03_reductions", "04_matmul", "05_flash_attention", "08_quantization",
        "14_inference_serving", "15_gpu_algorithms"]

# What each kernel must show, by name. Every compiled kernel must be listed (a new kernel gets rules).
TENSOR_CORES = {"matmul_kernel", "matmul_bias_act_kernel", "flash_fwd_kernel", "flash_causal_kernel",
                "flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel", "int8_weight_matmul_kernel"}
VECTOR_128 = {"vector_add_kernel", "bias_gelu_kernel", "copy_2d_kernel", "softmax_kernel", "softmax_stats_kernel",
              "rmsnorm_kernel", "layernorm_kernel", "rmsnorm_bwd_dx_kernel", "rmsnorm_bwd_dw_kernel",
              "int8_gemv_kernel", "paged_decode_kernel", "topk_rows_kernel"}
INT8_WEIGHTS = {"int8_weight_matmul_kernel", "int8_gemv_kernel"}  # the decode GEMV: no tensor cores by design
EXPECTED = {
    "02_triton_basics": {"vector_add_kernel", "bias_gelu_kernel", "copy_2d_kernel"},
    "03_reductions": {"softmax_kernel", "softmax_stats_kernel", "rmsnorm_kernel", "layernorm_kernel",
                      "rmsnorm_bwd_dx_kernel", "rmsnorm_bwd_dw_kernel"},
    "04_matmul": {"matmul_kernel", "matmul_bias_act_kernel"},
    "05_flash_attention": {"flash_fwd_kernel", "flash_causal_kernel", "flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel"},
    "08_quantization": {"int8_weight_matmul_kernel", "int8_gemv_kernel"},
    "14_inference_serving": {"paged_decode_kernel"},  # one query row per program: no tensor cores by design
    "15_gpu_algorithms": {"topk_rows_kernel"},  # one row per program, K max/argmin passes: no tensor cores by design
}


def rule_failures(r: aot.KernelRecord) -> list[str]:
    """What is wrong with one compiled kernel for an H100 (empty when nothing is)."""
    problems = []
    if r.error:
        problems.append(f"does not launch: {r.error}")
    if r.shared > aot.H100.smem_per_block:
        problems.append(f"{r.shared:,} B of shared memory > {aot.H100.smem_per_block:,} B")
    if r.spills:
        problems.append(f"spills {r.spills} registers to local memory")
    if r.kernel in TENSOR_CORES and not r.tensor_cores:
        problems.append("no tensor-core instruction (wgmma/mma) in its PTX")
    if r.kernel in VECTOR_128 and r.vector_bits < 128:
        problems.append(f"widest global load is {r.vector_bits}-bit, not 128-bit")
    if r.kernel in INT8_WEIGHTS and not r.int8_loads:
        problems.append(f"loads {', '.join(r.loads)} from global memory, no int8 weights")
    return [f"{r.kernel} [{r.config_text()}]: {p}" for p in problems]


def h100_namespace(stem: str) -> dict:
    """The solution's answers as a GPU run defines them (``DEVICE == "cuda"``: its GPU configs and
    tiles), with kernels decorated for the interpreter; ``gpulab.aot`` compiles them for sm_90."""
    nb = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    source = export_source(nb, answer_cells(nb), parameters={"DEVICE": "cpu", "SEED": 0})
    setup = "DEVICE = gpulab.setup(DEVICE, SEED)"
    assert source.count(setup) == 1, f"{stem}: the setup line changed; update h100_namespace"
    source = source.replace(setup, setup + '\nDEVICE = "cuda"  # the GPU configurations, compiled by gpulab.aot')
    return exec_source(source, f"<solutions/{stem}.ipynb for sm_90>")


def meta(*shape, dtype=torch.float16, **kwargs):
    return torch.empty(shape, dtype=dtype, device="meta", **kwargs)


def _flash_backward(ns, head_dim, causal):
    def call():
        q, k, v = (meta(4, 16, 4096, head_dim, requires_grad=True) for _ in range(3))
        out = ns["flash_attention_autograd"](q, k, v, causal=causal)
        out.backward(torch.empty_like(out))
    return call


def extra_calls(stem: str, ns: dict) -> list[tuple[str, callable]]:
    """Kernels no benchmark launches, at full size: (label, call)."""
    if stem == "02_triton_basics":
        return [("copy_2d 8192x8192 fp16", lambda: ns["copy_2d"](meta(8192, 8192)))]
    if stem == "03_reductions":
        return [("softmax 1024x65536 (wide rows)", lambda: ns["softmax"](meta(1024, 65536))),
                ("softmax_stats 16384x4096", lambda: ns["softmax_stats"](meta(16384, 4096))),
                ("rmsnorm_backward 16384x4096", lambda: ns["rmsnorm_backward"](meta(16384, 4096), meta(4096),
                                                                                meta(16384, 4096)))]
    if stem == "05_flash_attention":
        return [(f"flash backward D={d} S=4k{' causal' if c else ''}", _flash_backward(ns, d, c))
                for d in (64, 128) for c in (False, True)] + [
            (f"tune_tiles candidate {cfg} D={d}", _flash_with_tiles(ns, d, cfg))
            for d in (64, 128) for cfg in ns["TILE_CANDIDATES"][d]]
    return []


def _flash_with_tiles(ns, head_dim, tiles):
    """The forward at section 7's tuning size with one of the tiles tune_tiles tries."""
    def call():
        saved = ns["GPU_TILES"][head_dim]
        ns["GPU_TILES"][head_dim] = tiles
        try:
            q, k, v = (meta(4, 16, 4096, head_dim) for _ in range(3))
            ns["flash_attention"](q, k, v)
        finally:
            ns["GPU_TILES"][head_dim] = saved
    return call


def compile_lab(stem: str) -> list[tuple[str, aot.KernelRecord]]:
    """(call label, record) for every kernel the lab's benchmarks and extra calls compile, deduplicated."""
    ns = h100_namespace(stem)
    calls = [(b.name, (lambda b=b, d=b.make("meta", False): b.call(ns[b.entry], d)))
             for b in load_lab(stem).BENCHMARKS]
    rows, seen = [], set()
    for label, call in calls + extra_calls(stem, ns):
        for r in aot.compile_call(call):
            key = (r.kernel, r.config_text(), r.registers, r.shared, r.vector_bits, r.error)
            if key not in seen:
                seen.add(key)
                rows.append((label, r))
    return rows


def markdown(rows: list[tuple[str, str, aot.KernelRecord]], seconds: float) -> str:
    head = ["lab", "first compiled by", "kernel", "config", "regs", "spills", "smem (B)", "threads",
            "CTAs/SM", "limited by", "tensor cores", "widest load", "loads"]
    lines = [f"# Lab kernels compiled for sm_90 (H100): {aot.toolchain()}",
             "",
             f"Made by `tests/test_compile_sm90.py` (`gpulab.aot`: stand-in CUDA driver, Triton's own compile and "
             f"launch checks, meta tensors at the benchmarks' full sizes; "
             f"{seconds:.0f} s). Nothing ran on a GPU: no timing here, only what the compiler produced. CTAs/SM "
             f"follows from registers, threads and shared memory on an H100 (65,536 registers, 228 KiB shared "
             f"memory, 2,048 threads, 32 CTAs per SM).",
             "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stem, label, r in rows:
        cells = [stem, label, r.kernel, r.config_text(), str(r.registers), str(r.spills), f"{r.shared:,}",
                 str(r.threads), str(r.ctas_per_sm), r.limiter or "does not launch", r.tensor_cores or "none",
                 f"{r.vector_bits}-bit", ",".join(r.loads)]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"- {stem} {r.kernel} [{r.config_text()}]: {r.error}" for stem, _, r in rows if r.error]
    gemv = [f"- {label}: {figure_text(k_loop_figure(r))}" for _, label, r in rows if r.kernel == "int8_gemv_kernel"]
    gemv_head = ["", "The decode GEMV's K loop, read from its SASS (issue ceiling: 132 SMs x 4 schedulers x 1.98 GHz "
                 "x 32 threads / instructions per byte; an estimate from the compiled code, not a timing):", ""]
    rows_head = ["", "Row kernels without a loop (one row per program): every SASS instruction issued once per "
                 "thread, over the bytes each thread reads and writes (the benchmark's bytes / (programs x "
                 "threads)); the same issue ceiling:", ""]
    row_kernels = [f"- {label}: {text}" for stem, label, r in rows if (text := straight_line_figure(stem, label, r))]
    return "\n".join(lines + ([""] + errors if errors else []) + (gemv_head + gemv if gemv else [])
                     + (rows_head + row_kernels if row_kernels else [])) + "\n"


def straight_line_figure(stem: str, label: str, r: aot.KernelRecord) -> str:
    """Instructions per byte and issue ceiling of a memory-bound kernel with no loop, at a benchmark's size."""
    bench = next((b for b in load_lab(stem).BENCHMARKS if b.name == label), None)
    if bench is None or r.kernel not in VECTOR_128 or r.grid is None or r.error or aot.main_loop(r.sass()):
        return ""
    nbytes = bench.make("meta", False).get("bytes")
    if not nbytes:
        return ""
    per_thread = nbytes / (r.grid[0] * r.grid[1] * r.grid[2] * r.threads)
    count = len(aot.instructions(r.sass()))
    ceiling = aot.issue_ceiling_bytes_per_s(count / per_thread)
    return (f"{r.kernel} [{r.config_text()}]: {count} instructions per {per_thread:g} bytes per thread = "
            f"{count / per_thread:.1f} per byte, {sum('BAR' in t for t in aot.instructions(r.sass()))} barriers: "
            f"issue ceiling {ceiling / 1e12:.2f} TB/s = {100 * ceiling / 3.35e12:.0f}% of an H100's 3.35 TB/s, "
            f"{100 * ceiling / 4.8e12:.0f}% of an H200's 4.8 TB/s")


@pytest.mark.slow
def test_every_lab_kernel_compiles_for_h100():
    start = time.perf_counter()
    rows, failures = [], []
    for stem in LABS:
        compiled = compile_lab(stem)
        rows += [(stem, label, r) for label, r in compiled]
        names = {r.kernel for _, r in compiled}
        if names != EXPECTED[stem]:
            failures.append(f"{stem}: compiled {sorted(names)}, expected {sorted(EXPECTED[stem])}")
        for _, r in compiled:
            failures += rule_failures(r)
    report = markdown(rows, time.perf_counter() - start)
    out = ROOT / ".gpulab" / "compile_sm90.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(report)
    print(report)
    assert not failures, "\n".join(failures)


# --- each rule fails on a plausible wrong kernel ----------------------------------------------------

@pytest.fixture(scope="module")
def ns04():
    return h100_namespace("04_matmul")


def _matmul_records(ns, blocks, num_warps, num_stages, n=4096, dtype=torch.float16):
    a, b = meta(n, n, dtype=dtype), meta(n, n, dtype=dtype)
    c = meta(n, n, dtype=dtype)
    bm, bn, bk = blocks
    grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)
    return aot.compile_kernel(ns["matmul_kernel"], grid, a, b, c, n, n, n, n, 1, n, 1, n, 1, BLOCK_M=bm,
                              BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=num_warps, num_stages=num_stages)


@pytest.mark.slow
def test_too_much_shared_memory_is_refused_by_tritons_launch_check(ns04):
    (r,) = _matmul_records(ns04, (256, 256, 128), num_warps=8, num_stages=4)
    assert r.shared > aot.H100.smem_per_block and r.error and "shared memory" in r.error
    assert r.ctas_per_sm is None and any("does not launch" in p for p in rule_failures(r))


@pytest.mark.slow
def test_register_spills_are_caught(ns04):
    (r,) = _matmul_records(ns04, (256, 256, 32), num_warps=4, num_stages=2)  # a 256x256 fp32 tile on 128 threads
    assert r.spills > 0 and any("spills" in p for p in rule_failures(r))


@triton.jit
def _matmul_without_dot(a_ptr, b_ptr, c_ptr, N, BLOCK: tl.constexpr):
    # A wrong way to multiply tiles: one outer product per k on the CUDA cores instead of tl.dot.
    # (A broadcast-and-sum over a 3-D tile is no counter-example: Triton 3.6 turns it into mma.)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), tl.float32)
    for k in range(0, N):
        a = tl.load(a_ptr + offs * N + k).to(tl.float32)  # column k of the A tile
        b = tl.load(b_ptr + k * N + offs).to(tl.float32)  # row k of the B tile
        acc += a[:, None] * b[None, :]
    tl.store(c_ptr + offs[:, None] * N + offs[None, :], acc.to(tl.float16))


@pytest.mark.slow
def test_a_matmul_without_tensor_cores_is_caught():
    x = meta(1024, 1024)
    (r,) = aot.compile_kernel(_matmul_without_dot, (16,), x, x, x, 1024, BLOCK=64)
    r.kernel = "matmul_kernel"  # judged by the matmul rules
    assert r.tensor_cores == "" and any("tensor-core" in p for p in rule_failures(r))


@pytest.mark.slow
def test_strided_loads_are_caught():
    ns = h100_namespace("02_triton_basics")
    src = meta(8192, 16384)[:, ::2]  # every other column: no two elements a thread reads are adjacent
    (r,) = aot.compile_call(ns["copy_2d"], src)
    assert r.vector_bits < 128 and any("128-bit" in p for p in rule_failures(r))


@pytest.mark.slow
def test_fp16_weights_in_the_int8_kernel_are_caught(ns04):
    # Dequantizing the weights before the kernel (an fp16 matmul) reads 2 bytes per weight, not 1.
    (r,) = _matmul_records(ns04, (16, 64, 128), num_warps=4, num_stages=3)
    r.kernel = "int8_weight_matmul_kernel"
    assert not r.int8_loads and any("int8" in p for p in rule_failures(r))


# --- the pieces, without compiling --------------------------------------------------------------------

def test_occupancy_follows_the_h100_limits():
    assert aot.occupancy(24, 128, 0) == (16, "threads")          # 2048 threads / 128
    assert aot.occupancy(32, 128, 0) == (16, "threads & registers")  # 1024 regs per warp: 64 warps, 4 per CTA
    assert aot.occupancy(255, 128, 0) == (2, "registers")       # 255 -> 256 regs x 32 = 8192 per warp: 8 warps
    assert aot.occupancy(128, 256, 0) == (2, "registers")       # 4096 regs per warp: 16 warps, 8 per CTA
    assert aot.occupancy(33, 128, 0) == (12, "registers")       # 33 -> 40 regs per thread (units of 256 per warp)
    assert aot.occupancy(32, 128, 100_000) == (2, "shared memory")  # (100,096 + 1,024) per CTA in 233,472
    assert aot.occupancy(32, 128, 116_736) == (1, "shared memory")
    assert aot.occupancy(16, 32, 0) == (32, "blocks")
    assert aot.occupancy(32, 128, 232_449) == (0, "shared memory")  # over the per-CTA limit: no launch


def test_ptx_readers():
    assert aot.global_load_bits("@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];") == 128
    assert aot.global_load_bits("ld.global.L1::evict_last.v2.b16 { %rs1, %rs2 }, [ %rd1 ];") == 32
    assert aot.global_load_bits("cp.async.cg.shared.global [ %r24 + 0 ], [ %rd14 + 0 ], 0x10, %r25;") == 128
    assert aot.global_load_bits("ld.shared.v4.b32 { %r1, %r2, %r3, %r4 }, [ %r5 ];") == 0
    assert aot.tensor_core_instructions("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 ...") == "wgmma"
    assert aot.tensor_core_instructions("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ...") == "mma"
    assert aot.tensor_core_instructions("fma.rn.f32 %f1, %f2, %f3, %f4;") == ""
    ttir = "%w = tt.load %ptrs, %mask : tensor<64x32x!tt.ptr<i8>>\n%x = tt.load %p : tensor<16x64x!tt.ptr<f16>>"
    assert aot.loaded_dtypes(ttir) == ("f16", "i8")


@pytest.mark.slow
def test_kernels_still_run_in_the_interpreter_afterwards():
    ns = h100_namespace("02_triton_basics")
    x = meta(1 << 20, dtype=torch.float32)
    (r,) = aot.compile_call(ns["vector_add"], x, x)
    assert r.vector_bits == 128 and r.grid == (1024, 1, 1)  # the no-op launch saw the wrapper's grid
    x = torch.arange(1000, dtype=torch.float32)
    assert torch.equal(ns["vector_add"](x, x), 2 * x)  # still the interpreter, on the CPU
    from triton import knobs
    assert knobs.runtime.interpret


def test_report_says_what_to_do_before_the_exercise_is_done(capsys):
    def stub(x):
        raise NotImplementedError("vector_add")
    assert aot.report(stub, meta(16)) is None
    assert "finish the exercises above" in capsys.readouterr().out


def test_report_is_skipped_inside_the_grader(monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_GRADING", "1")
    assert aot.report(lambda: pytest.fail("must not compile while grading")) is None
    assert "skipped while grading" in capsys.readouterr().out


_LEAK_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
if {use_setup}:
    import gpulab
    gpulab.setup("cpu", 0)
else:
    os.environ["TRITON_INTERPRET"] = "1"  # the interpreter, without gpulab's repair
import torch, triton, triton.language as tl
from gpulab import aot

@triton.jit
def scale_by_sum(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(x_ptr + offs, x * tl.sum(x, 0), mask=offs < n)  # tl.sum: a nested jit function

scale_by_sum[(1,)](torch.ones(8), 8, BLOCK=8)  # interpreted first, as in a notebook
(r,) = aot.compile_kernel(scale_by_sum, (1,), torch.empty(1024, device="meta"), 1024, BLOCK=1024)
print("compiled", r.registers)
"""


@pytest.mark.slow
@pytest.mark.parametrize("use_setup", [True, False])
def test_compiling_after_the_interpreter_ran_a_nested_jit_call(use_setup, tmp_path):
    """Triton's interpreter leaks the patches of a nested jit call; gpulab.setup scopes them."""
    import subprocess
    import sys

    script = tmp_path / "leak.py"  # a file: Triton reads a kernel's source
    script.write_text(_LEAK_SCRIPT.format(root=str(ROOT), use_setup=use_setup))
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}  # a cached kernel would skip the compiler
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    if use_setup:
        assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-2000:]
    else:  # the leak Triton leaves: tl.core's builtins still point at the interpreter
        assert run.returncode != 0 and "CompilationError" in run.stderr, run.stderr[-2000:]
