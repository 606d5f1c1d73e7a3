"""Every lab kernel compiled for each GPU the course supports, without a GPU, through Triton's own path.

``gpulab.aot`` puts a stand-in CUDA driver under Triton for each of ``aot.TARGETS`` (T4 sm_75, A100 sm_80,
A10G sm_86, L4 sm_89, H100 sm_90): specialisation, the autotuner (with the labs' own pruning), the NVIDIA
backend with its bundled ptxas and the launch-time shared-memory check all run as on that GPU; the launch
itself does nothing and the inputs are meta tensors at the benchmarks' full sizes. Each lab is set up
inside ``aot.target(device)``, so the tiles it picks for "this GPU" are the target's.

Each compiled kernel must launch (shared memory within the target's per-CTA limit), spill no registers
(an autotune candidate may, when another candidate of the same call does not: the autotuner times them),
use the target's matrix unit where it multiplies matrices (wgmma on sm_90, mma on sm_80-89, and on sm_75,
where Triton has no tensor-core path for ``tl.dot``, the FMA fallback, whose register spills are listed,
not failed), load 128 bits per instruction where it is memory-bound, and read int8 weights as int8. What a
target cannot run by design (bf16 below sm_80, fp8 below sm_89) is listed with its reason, not failed. The
tables go to stdout and to ``.gpulab/compile_targets.md`` (+ ``.json``, one file per target under
``.gpulab/compile_targets/``); a copy per Triton version is committed under ``benchmarks/results/`` as
``compile_targets_triton-<ver>.md`` and ``.json``.
"""
from __future__ import annotations

import json
import os
import time

import pytest
import torch
import triton
import triton.language as tl

from gpulab import aot, device
from gpulab.paths import ROOT
from grader.checks import load_lab
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook
from tests.test_int8_decode import figure_text, k_loop_figure

LABS = ["02_triton_basics", "03_reductions", "04_matmul", "05_flash_attention", "08_quantization",
        "14_inference_serving", "15_gpu_algorithms"]

# What each kernel must show, by name. Every compiled kernel must be listed (a new kernel gets rules).
TENSOR_CORES = {"matmul_kernel", "matmul_bias_act_kernel", "flash_fwd_kernel", "flash_causal_kernel",
                "flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel", "int8_weight_matmul_kernel"}
MMA_ON_HOPPER = {"int8_weight_matmul_kernel"}  # 16-row tiles: wgmma works on 64 rows per warpgroup
VECTOR_128 = {"vector_add_kernel", "bias_gelu_kernel", "copy_2d_kernel", "softmax_kernel", "softmax_stats_kernel",
              "rmsnorm_kernel", "layernorm_kernel", "rmsnorm_bwd_dx_kernel", "rmsnorm_bwd_dw_kernel",
              "int8_gemv_kernel", "paged_decode_kernel", "topk_rows_kernel"}
INT8_WEIGHTS = {"int8_weight_matmul_kernel", "int8_gemv_kernel"}  # the decode GEMV: no tensor cores by design
AUTOTUNED = {"matmul_kernel", "int8_weight_matmul_kernel"}  # candidates the autotuner times against each other
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

# Element types (as Triton's IR names them) a GPU needs a minimum compute capability for. Defined here
# rather than asked of gpulab: no lab kernel at its benchmark and grading configurations loads either today.
DTYPE_FLOOR = {"bf16": (80, "bf16 needs sm_80 (Ampere)"), "f8E4M3FN": (89, "fp8 needs sm_89 (Ada)"),
               "f8E5M2": (89, "fp8 needs sm_89 (Ada)")}

# Kernels a target runs, but not as well as the rules ask, by design; (target, kernel, config text) -> why.
# Every one is listed in the report beside its row.
EXCEPTIONS: dict[tuple[str, str, str], str] = {}


def expected_matrix_unit(kernel: str, arch: int) -> str:
    """What a kernel that multiplies matrices must compile to on compute capability ``arch``."""
    if arch >= 90:
        return "mma" if kernel in MMA_ON_HOPPER else "wgmma"
    return "mma" if arch >= 80 else "FMA fallback"  # Triton's tl.dot has no tensor-core path below sm_80


def by_design(r: aot.KernelRecord, dev: aot.Device) -> str:
    """Why ``dev`` cannot run or cannot run well kernel ``r`` by design ("" when it should)."""
    for dtype in r.loads:
        floor, why = DTYPE_FLOOR.get(dtype, (0, ""))
        if dev.arch < floor:
            return why
    return EXCEPTIONS.get((f"sm_{dev.arch}", r.kernel, r.config_text()), "")


def rule_failures(r: aot.KernelRecord, dev: aot.Device = aot.H100, spills_allowed: bool = False) -> list[str]:
    """What is wrong with one compiled kernel for ``dev`` (an H100 unless told; empty when nothing is).
    ``spills_allowed``: an autotune candidate whose call has a candidate that does not spill."""
    problems = []
    if r.error:
        problems.append(f"does not launch: {r.error}")
    if r.shared > dev.smem_per_block:
        problems.append(f"{r.shared:,} B of shared memory > {dev.smem_per_block:,} B")
    if r.spills and not spills_allowed:
        problems.append(f"spills {r.spills} registers to local memory")
    if r.kernel in TENSOR_CORES and dev.arch >= 90 and not r.tensor_cores:
        problems.append("no tensor-core instruction (wgmma/mma) in its PTX")
    elif r.kernel in TENSOR_CORES and r.matrix_unit != expected_matrix_unit(r.kernel, dev.arch):
        problems.append(f"{r.matrix_unit} where sm_{dev.arch} gives {expected_matrix_unit(r.kernel, dev.arch)}")
    if r.kernel in VECTOR_128 and r.vector_bits < 128:
        problems.append(f"widest global load is {r.vector_bits}-bit, not 128-bit")
    if r.kernel in INT8_WEIGHTS and not r.int8_loads:
        problems.append(f"loads {', '.join(r.loads)} from global memory, no int8 weights")
    return [f"{r.kernel} [{r.config_text()}]: {p}" for p in problems]


def lab_namespace(stem: str, dev: aot.Device = aot.H100) -> dict:
    """The solution's answers as a GPU run defines them (``DEVICE == "cuda"``: its GPU configs and
    tiles, picked for ``dev`` inside ``aot.target``), with kernels decorated for the interpreter;
    ``gpulab.aot`` compiles them for ``dev``."""
    nb = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    source = export_source(nb, answer_cells(nb), parameters={"DEVICE": "cpu", "SEED": 0})
    setup = "DEVICE = gpulab.setup(DEVICE, SEED)"
    assert source.count(setup) == 1, f"{stem}: the setup line changed; update lab_namespace"
    source = source.replace(setup, setup + '\nDEVICE = "cuda"  # the GPU configurations, compiled by gpulab.aot')
    with aot.target(dev):
        return exec_source(source, f"<solutions/{stem}.ipynb for sm_{dev.arch}>")


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
    if stem == "04_matmul":  # the graded fp32 cases on a GPU: twice the bytes per tile of fp16
        return [("autotuned fp32 4096^3", lambda: ns["matmul_autotuned"](meta(4096, 4096, dtype=torch.float32),
                                                                          meta(4096, 4096, dtype=torch.float32)))]
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


def compile_lab(stem: str, dev: aot.Device = aot.H100) -> list[tuple[str, aot.KernelRecord]]:
    """(call label, record) for every kernel the lab's benchmarks and extra calls compile for ``dev``,
    deduplicated; the lab is set up for ``dev`` and every call runs inside ``aot.target(dev)``."""
    ns = lab_namespace(stem, dev)
    calls = [(b.name, (lambda b=b, d=b.make("meta", False): b.call(ns[b.entry], d)))
             for b in load_lab(stem).BENCHMARKS]
    rows, seen = [], set()
    with aot.target(dev):
        for label, call in calls + extra_calls(stem, ns):
            for r in aot.compile_call(call, device=dev):
                key = (r.kernel, r.config_text(), r.registers, r.shared, r.vector_bits, r.error)
                if key not in seen:
                    seen.add(key)
                    rows.append((label, r))
    return rows


def estimate_failures(r: aot.KernelRecord, label: str, dev: aot.Device) -> list[str]:
    """An autotuned kernel's shared memory as compiled must stay within the estimate its lab prunes with
    (``gpulab.device.pipeline_shared_bytes``), or pruning could keep a config that does not fit; and the
    autotuner, pruning through the stand-in driver, must have compiled only configs whose estimate fits."""
    if r.kernel not in AUTOTUNED:
        return []
    config = triton.Config({k: v for k, v in r.config.items() if k.startswith("BLOCK")},
                           num_warps=r.config["num_warps"], num_stages=r.config["num_stages"])
    a_bytes = 4 if "fp32" in label else 2
    estimate = device.pipeline_shared_bytes(config, a_bytes, 1 if r.kernel in INT8_WEIGHTS else a_bytes)
    problems = []
    if r.shared > estimate:
        problems.append(f"{r.shared:,} B of shared memory > its estimate {estimate:,} B")
    if estimate > dev.smem_per_block:
        problems.append(f"compiled although its estimate, {estimate:,} B, exceeds {dev.smem_per_block:,} B")
    return [f"{r.kernel} [{r.config_text()}]: {p}" for p in problems]


FMA_SPILLS = ("FMA fallback: without tensor cores each tl.dot holds its operand tiles in registers across the "
              "whole K dimension, so tiles sized for tensor cores spill on sm_75; correct, and slow by design")


def target_failures(rows: list[tuple[str, str, aot.KernelRecord]], dev: aot.Device) -> tuple[list, dict]:
    """(failures, {row index: why it is an exception}) for one target's rows (lab, label, record)."""
    failures, notes = [], {}
    fma = dev.arch < 80  # Triton's tl.dot has no tensor-core path here
    calm = {(label, r.kernel) for _, label, r in rows if r.kernel in AUTOTUNED and r.spills == 0 and not r.error}
    for i, (_, label, r) in enumerate(rows):
        if r.spills and r.dot and fma:
            notes[i] = f"{FMA_SPILLS} ({r.spills} registers)"
        elif r.kernel in AUTOTUNED and r.spills and (label, r.kernel) in calm:
            notes[i] = "an autotune candidate that spills: the autotuner times it against one that does not"
        why = by_design(r, dev)
        if why:
            notes[i] = why
            continue
        failures += rule_failures(r, dev, spills_allowed=i in notes) + estimate_failures(r, label, dev)
    for stem, label, r in rows:
        if r.kernel in AUTOTUNED and (label, r.kernel) not in calm and not (r.dot and fma):
            failures.append(f"{stem} {label}: every {r.kernel} candidate spills or fails on sm_{dev.arch}")
    return sorted(set(failures)), notes


TARGET_NOTES = {
    75: "64 KiB of shared memory per CTA; Triton's tl.dot has no tensor-core path here: 'FMA fallback' "
        "(CUDA cores) is expected for every kernel that multiplies matrices",
    80: "163 KiB of shared memory per CTA; tl.dot on the tensor cores (mma.sync)",
    86: "99 KiB of shared memory per CTA; tl.dot on the tensor cores (mma.sync)",
    89: "99 KiB of shared memory per CTA; tl.dot on the tensor cores (mma.sync); fp8 supported",
    90: "227 KiB of shared memory per CTA; tl.dot on the tensor cores (wgmma; mma for 16-row tiles)",
}


def target_markdown(dev: aot.Device, target: dict) -> list[str]:
    head = ["lab", "first compiled by", "kernel", "config", "regs", "spills", "smem (B)", "threads",
            "CTAs/SM", "limited by", "tensor cores", "widest load", "loads", "note"]
    lines = [f"## sm_{dev.arch}: {dev.name.split(' (')[0]}", "",
             f"{TARGET_NOTES[dev.arch]}. Per SM: {dev.regs_per_sm:,} registers, {dev.smem_per_sm // 1024} KiB "
             f"shared memory, {dev.threads_per_sm:,} threads, {dev.blocks_per_sm} CTAs. {target['toolchain']}; "
             f"{target['seconds']:.0f} s of wall clock to compile here (with whatever Triton had cached).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = target["rows"]
    for row in rows:
        cells = [row["lab"], row["label"], row["kernel"], row["config_text"], str(row["registers"]),
                 str(row["spills"]), f"{row['shared']:,}", str(row["threads"]), str(row["ctas_per_sm"]),
                 row["limiter"] or "does not launch", row["matrix_unit"], f"{row['vector_bits']}-bit",
                 ",".join(row["loads"]), row["note"]]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"- {row['lab']} {row['kernel']} [{row['config_text']}]: {row['error']}" for row in rows if row["error"]]
    return lines + ([""] + errors if errors else []) + [""]


def markdown(report: dict) -> str:
    """The combined report of every target compiled so far (``report``: the JSON form)."""
    lines = [f"# Lab kernels compiled for every supported GPU: {report['toolchain']}", "",
             "Made by `tests/test_compile_targets.py` (`gpulab.aot`: a stand-in CUDA driver per target, Triton's "
             "own compile, autotuner and launch checks, meta tensors at the benchmarks' full sizes; each lab set up "
             "for the target, so its tiles and autotune pruning are the target's). Nothing ran on a GPU: no timing "
             "here, only what the compiler produced. CTAs/SM follows from registers, threads and shared memory on "
             "each target. 'FMA fallback': a tl.dot compiled to CUDA-core FMAs (no tensor cores), as Triton does "
             "below sm_80. No lab kernel loads bf16 or fp8 at its benchmark and grading configurations, so no "
             "target is excused from one for its dtypes; the 'note' column lists every other exception with its "
             "reason.", ""]
    for name in aot.TARGETS:
        if name in report["targets"]:
            t = report["targets"][name]
            lines += target_markdown(aot.TARGETS[name], t) + t.get("extra", [])
    return "\n".join(lines) + "\n"


def sm90_figures(rows: list[tuple[str, str, aot.KernelRecord]]) -> list[str]:
    """The decode GEMV's K loop and the loop-free row kernels, read from their SASS for an H100."""
    gemv = [f"- {label}: {figure_text(k_loop_figure(r))}" for _, label, r in rows if r.kernel == "int8_gemv_kernel"]
    gemv_head = ["", "The decode GEMV's K loop, read from its SASS (issue ceiling: 132 SMs x 4 schedulers x 1.98 GHz "
                 "x 32 threads / instructions per byte; an estimate from the compiled code, not a timing):", ""]
    rows_head = ["", "Row kernels without a loop (one row per program): every SASS instruction issued once per "
                 "thread, over the bytes each thread reads and writes (the benchmark's bytes / (programs x "
                 "threads)); the same issue ceiling:", ""]
    row_kernels = [f"- {label}: {text}" for stem, label, r in rows if (text := straight_line_figure(stem, label, r))]
    return (gemv_head + gemv if gemv else []) + (rows_head + row_kernels if row_kernels else []) + [""]


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


def _write(path, text: str) -> None:
    """Replace ``path`` at once: another worker may be reading it (the targets run in parallel)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(name: str, target: dict) -> str:
    """Save one target's results and rebuild the combined report from every target saved so far (the
    targets run as separate tests, possibly in separate workers)."""
    out = ROOT / ".gpulab" / "compile_targets"
    out.mkdir(parents=True, exist_ok=True)
    _write(out / f"{name}.json", json.dumps(target, indent=1))
    report = {"toolchain": f"Triton {triton.__version__}", "targets": {}}  # ptxas differs per target
    for path in sorted(out.glob("sm_*.json")):
        saved = json.loads(path.read_text())
        if saved["toolchain"].split(",")[0] == report["toolchain"]:
            report["targets"][path.stem] = saved
    _write(ROOT / ".gpulab" / "compile_targets.json", json.dumps(report, indent=1))
    text = markdown(report)
    _write(ROOT / ".gpulab" / "compile_targets.md", text)
    return text


@pytest.mark.slow
@pytest.mark.parametrize("name", list(aot.TARGETS))
def test_every_lab_kernel_compiles_for(name):
    dev = aot.TARGETS[name]
    start = time.perf_counter()
    rows, failures = [], []
    for stem in LABS:
        compiled = compile_lab(stem, dev)
        rows += [(stem, label, r) for label, r in compiled]
        names = {r.kernel for _, r in compiled}
        if names != EXPECTED[stem]:
            failures.append(f"{stem}: compiled {sorted(names)}, expected {sorted(EXPECTED[stem])}")
    problems, notes = target_failures(rows, dev)
    failures += problems
    target = {"toolchain": aot.toolchain(dev), "device": dev.name, "seconds": time.perf_counter() - start,
              "rows": [{"lab": stem, "label": label, "config_text": r.config_text(), "note": notes.get(i, ""),
                        **r.as_dict()} for i, (stem, label, r) in enumerate(rows)],
              "extra": sm90_figures(rows) if dev is aot.H100 else []}
    print(write_report(name, target))
    print("\n".join(f"exception on {name}: {row['kernel']} [{row['config_text']}]: {row['note']}"
                    for row in target["rows"] if row["note"]))
    assert not failures, "\n".join(failures)


# --- configs and tiles chosen for the device at run time ----------------------------------------------

def _autotuners(dev: aot.Device) -> list[tuple[str, object, dict]]:
    """(label, Autotuner, the kernel's arguments by name) for every autotuned lab kernel, set up for ``dev``."""
    ns04, ns08 = lab_namespace("04_matmul", dev), lab_namespace("08_quantization", dev)
    matmul = ns04["autotuned_matmul_kernel"]()
    wmm = ns08["int8_weight_matmul_kernel"]
    return ([(f"matmul {dt}", matmul, {"a_ptr": meta(64, 64, dtype=dt), "b_ptr": meta(64, 64, dtype=dt)})
             for dt in (torch.float16, torch.float32)]
            + [(f"int8 matmul {dt}", wmm, {"x_ptr": meta(16, 64, dtype=dt), "w_ptr": meta(64, 64, dtype=torch.int8)})
               for dt in (torch.float16, torch.float32)])


@pytest.mark.parametrize("name", list(aot.TARGETS))
def test_no_autotune_config_left_exceeds_the_targets_shared_memory(name, monkeypatch):
    from triton.runtime.driver import driver

    monkeypatch.delenv("GPULAB_GRADING", raising=False)
    dev = aot.TARGETS[name]
    for label, tuner, args in _autotuners(dev):
        with aot.stand_in(dev):  # the stand-in driver reports the target's limit, as a GPU's driver would
            assert device.shared_memory_per_block() == driver.active.utils.get_device_properties(0)["max_shared_mem"]
            kept = tuner.early_config_prune(tuner.configs, args)
        assert kept, label
        element = args.get("a_ptr", args.get("x_ptr")).element_size()
        sizes = {str(c): device.pipeline_shared_bytes(c, element, 1 if "int8" in label else element) for c in kept}
        assert max(sizes.values()) <= dev.smem_per_block, (label, sizes)


def test_a_config_too_big_for_a_t4_is_dropped_there_only(monkeypatch):
    monkeypatch.delenv("GPULAB_GRADING", raising=False)
    label, tuner, args = _autotuners(aot.T4)[0]  # fp16 matmul
    big = tuner.configs[0]  # 128x256x64, 3 stages: 144 KiB of fp16 buffers
    assert device.pipeline_shared_bytes(big) > aot.T4.smem_per_block
    with aot.target(aot.T4):
        on_t4 = tuner.early_config_prune(tuner.configs, args)
    with aot.target(aot.H100):
        on_h100 = tuner.early_config_prune(tuner.configs, args)
    assert big not in on_t4 and on_t4 and big in on_h100
    monkeypatch.setenv("GPULAB_GRADING", "1")  # grading keeps the first two that fit, not the first two
    with aot.target(aot.T4):
        assert tuner.early_config_prune(tuner.configs, args) == on_t4[:2]


def test_pick_tiles_takes_the_largest_entry_the_gpu_holds():
    choices = {227: "H100 tiles", 163: "A100 tiles", 99: "sm_86/89 tiles", 64: "T4 tiles"}
    picked = {}
    for name, dev in aot.TARGETS.items():
        with aot.target(dev):
            picked[name] = device.pick_tiles(choices)
    assert picked == {"sm_75": "T4 tiles", "sm_80": "A100 tiles", "sm_86": "sm_86/89 tiles",
                      "sm_89": "sm_86/89 tiles", "sm_90": "H100 tiles"}
    assert device.pick_tiles(choices) == "H100 tiles"  # the interpreter: no limit
    with aot.target(aot.T4):
        assert device.pick_tiles({227: "H100 only"}) == "H100 only"  # nothing fits: the smallest there is


@pytest.mark.parametrize("name", list(aot.TARGETS))
def test_flash_attention_picks_its_tiles_for_the_target(name):
    dev = aot.TARGETS[name]
    ns = lab_namespace("05_flash_attention", dev)
    for tiles, table in (("GPU_TILES", "TILES_BY_SHARED_KIB"), ("GPU_BWD_TILES", "BWD_TILES_BY_SHARED_KIB"),
                         ("TILE_CANDIDATES", "CANDIDATES_BY_SHARED_KIB")):
        kib = max(k for k in ns[table] if k * 1024 <= dev.smem_per_block)  # the largest entry this GPU holds
        assert ns[tiles] == ns[table][kib], (tiles, name)


def test_the_estimate_rules_catch_an_unpruned_config_and_an_underestimate():
    def record(shared, **blocks):
        config = {**blocks, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
        return aot.KernelRecord(kernel="matmul_kernel", config=config, shared=shared, threads=256,
                                tensor_cores="", vector_bits=128, loads=("f16",), dot=True)

    hopper_tile = record(65_536, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)  # 144 KiB of buffers by the estimate
    assert any("exceeds 65,536 B" in p for p in estimate_failures(hopper_tile, "fp16", aot.T4))
    assert estimate_failures(hopper_tile, "fp16", aot.H100) == []
    underestimated = record(40_000, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)  # the estimate: 3 x 4 KiB
    assert any("> its estimate 12,288 B" in p for p in estimate_failures(underestimated, "fp16", aot.H100))


def test_each_target_expects_its_matrix_unit_and_excuses_only_fma_spills():
    def record(kernel, unit, spills, dot=True):
        return aot.KernelRecord(kernel=kernel, config={"num_warps": 4, "num_stages": 2}, shared=1024, threads=128,
                                tensor_cores=unit, vector_bits=128, loads=("f16",), registers=255, spills=spills,
                                ctas_per_sm=1, dot=dot)

    fma = record("flash_fwd_kernel", "", 0)
    assert any("FMA fallback where sm_80 gives mma" in p for p in rule_failures(fma, aot.A100))
    assert rule_failures(fma, aot.T4) == []
    assert any("mma where sm_90 gives wgmma" in p for p in rule_failures(record("flash_fwd_kernel", "mma", 0)))
    dq, softmax = record("flash_bwd_dq_kernel", "", 76), record("softmax_kernel", "", 8, dot=False)
    rows = [("05", "flash", dq), ("03", "softmax", softmax)]
    failures, notes = target_failures(rows, aot.T4)
    assert notes[0].startswith("FMA fallback") and 1 not in notes  # a tl.dot on CUDA cores: listed, not failed
    assert failures == ["softmax_kernel [num_warps=4 num_stages=2]: spills 8 registers to local memory"]
    failures, notes = target_failures(rows[:1], aot.A10G)  # with tensor cores a spill is a failure
    assert not notes and any("spills 76" in f for f in failures)


# --- each rule fails on a plausible wrong kernel ----------------------------------------------------


@pytest.fixture(scope="module")
def ns04():
    return lab_namespace("04_matmul")


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
    ns = lab_namespace("02_triton_basics")
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


def test_occupancy_follows_each_targets_limits():
    assert aot.occupancy(26, 128, 0, aot.T4) == (8, "threads")  # 1,024 threads per SM; no shared memory kept
    assert aot.occupancy(26, 128, 40_000, aot.T4) == (1, "shared memory")  # 64 KiB per SM
    assert aot.occupancy(26, 128, 65_537, aot.T4) == (0, "shared memory")
    assert aot.occupancy(32, 128, 50_000, aot.A100) == (3, "shared memory")  # (50,048 + 1,024) x 3 in 164 KiB
    assert aot.occupancy(32, 128, 0, aot.A10G) == (12, "threads")  # 1,536 threads per SM


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
    ns = lab_namespace("02_triton_basics")
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
