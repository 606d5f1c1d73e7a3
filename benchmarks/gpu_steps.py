"""The steps of ``benchmarks/gpu_check.py``: each runs in a process of its own and returns a JSON-able dict.

Every figure a step returns was measured in that step; what it could not measure it says, in words.
Needs only torch, Triton and NumPy (papermill/nbclient only where a notebook runs and they are there).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpulab.paths import ROOT

KERNEL_LABS = ["08_quantization", "03_reductions", "04_matmul", "02_triton_basics", "05_flash_attention",
               "14_inference_serving", "15_gpu_algorithms"]  # most informative first: the goals in doubt
TWO_FLUSHES_MAX_BYTES = 512 << 20  # rows this small are timed with both L2 flushes (see gpulab.bench)


# --- environment and peaks --------------------------------------------------------------------------

def environment(device: str, tiny: bool) -> dict:
    """Versions, the GPU and its limits, and this device's measured peaks (copy bandwidth, matmul rate)."""
    import torch

    import gpulab
    from gpulab.peaks import measured_peaks

    gpulab.setup(device, 0)
    info = gpulab.describe()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update({"capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
                     "memory_gib": props.total_memory / 2**30, "cuda": torch.version.cuda,
                     "l2_bytes": getattr(props, "L2_cache_size", None)})
        info["nvidia_smi"] = _command(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                                       "power.limit", "--format=csv,noheader"])
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = None
    info["jupyter"] = {name: _importable(name) for name in ("papermill", "nbclient", "ipykernel", "nbformat",
                                                             "matplotlib")}
    peaks = measured_peaks(device, refresh=True)
    info["peaks"] = {"name": peaks.name, "copy_gbps": peaks.copy_gbps, "matmul_tflops": peaks.matmul_tflops,
                     "matmul_dtype": peaks.matmul_dtype}
    return info


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a broken or blocked package is as good as none
        return False


def _command(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"


# --- kernel benchmarks --------------------------------------------------------------------------------

def kernel_benchmarks(stem: str, device: str, tiny: bool) -> dict:
    """Every benchmark row of a lab, with the solution's kernels: output checked against the baseline at the
    row's size, then both timed by the course's timer; rows <= 512 MB also with a clean (read) L2 flush and
    by host clock; the autotuners' choices recorded."""
    from gpulab.peaks import measured_peaks
    from grader.bench import load_answers
    from grader.checks import load_lab

    _, ns = load_answers(ROOT / "solutions" / f"{stem}.ipynb", stem, device)
    peaks = measured_peaks(device)
    rows = []
    for b in load_lab(stem).BENCHMARKS:
        start = time.perf_counter()
        try:
            rows.append(_benchmark_row(b, ns[b.entry], device, tiny, peaks))
        except Exception as exc:  # noqa: BLE001 - one broken row must not cost the others
            rows.append({"name": b.name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        rows[-1]["seconds"] = time.perf_counter() - start
        if device == "cuda":
            import torch
            torch.cuda.empty_cache()
    return {"lab": stem, "rows": rows, "autotuned": _autotuner_choices(ns)}


def _benchmark_row(b, fn, device: str, tiny: bool, peaks) -> dict:
    from gpulab.bench import benchmark, gbps, host_clock, pct_of_peak, tflops

    inputs = b.make(device, tiny)
    mine_out = _detach(b.call(fn, inputs))  # the baseline may write into the same `out` buffer
    ok, how = compare_outputs(mine_out, b.baseline(inputs))
    row = {"name": b.name, "tiny": tiny, "output_ok": ok, "output_check": how}
    if not ok:
        return row  # a wrong kernel's time proves nothing
    repeats = 1 if tiny else 20
    mine = benchmark(lambda: b.call(fn, inputs), device=device, repeats=repeats, warmup=1)
    base = benchmark(lambda: b.baseline(inputs), device=device, repeats=repeats, warmup=1)
    row.update({"ms": mine.median_ms, "baseline_ms": base.median_ms,
                "speedup_vs_baseline": base.median_ms / mine.median_ms,
                "timer": "do_bench, L2 zeroed (gpulab.bench.benchmark)" if device == "cuda" else "CPU perf_counter"})
    nbytes = inputs.get("bytes") or 0
    if device == "cuda" and nbytes <= TWO_FLUSHES_MAX_BYTES:
        read = benchmark(lambda: b.call(fn, inputs), device=device, flush="read")
        base_read = benchmark(lambda: b.baseline(inputs), device=device, flush="read")
        row.update({"ms_read_flush": read.median_ms, "baseline_ms_read_flush": base_read.median_ms,
                    "ms_host_clock": host_clock(lambda: b.call(fn, inputs), calls=50).median_ms})
    if nbytes:
        row["gbps"] = gbps(nbytes, row["ms"])
        row["pct_of_copy"] = pct_of_peak(row["gbps"], peaks.copy_gbps)
        if "ms_read_flush" in row:
            row["pct_of_copy_read_flush"] = pct_of_peak(gbps(nbytes, row["ms_read_flush"]), peaks.copy_gbps)
    if inputs.get("flops"):
        row["tflops"] = tflops(inputs["flops"], row["ms"])
        row["pct_of_matmul"] = pct_of_peak(row["tflops"], peaks.matmul_tflops)
    if b.info is not None:
        row.update(b.info())
    return row


def _detach(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_detach(o) for o in out)
    return out


def _first_tensor(out):
    import torch

    while isinstance(out, (tuple, list)) and out:
        out = out[0]  # (out, lse) of attention, (values, indices) of top-k: the first is the answer
    return out if isinstance(out, torch.Tensor) else None


def compare_outputs(mine, expected) -> tuple[bool, str]:
    """(ok, what was compared): the first tensor of each, relative to the baseline's largest magnitude
    (fp16: 1e-2, fp32: 1e-4), integers within 1 on at most 0.1% of the elements (rounding ties)."""
    import torch

    a, b = _first_tensor(mine), _first_tensor(expected)
    if a is None or b is None:
        return False, f"no tensor to compare ({type(mine).__name__} vs {type(expected).__name__})"
    if a.shape != b.shape:
        return False, f"shape {tuple(a.shape)} vs baseline {tuple(b.shape)}"
    if not a.dtype.is_floating_point:
        diff = (a.long() - b.long()).abs()
        worst, share = int(diff.max()) if diff.numel() else 0, float((diff > 0).float().mean()) if diff.numel() else 0.0
        return worst <= 1 and share <= 1e-3, f"integers: max difference {worst}, {share:.2%} differ"
    half = {torch.float16, torch.bfloat16} & {a.dtype, b.dtype}
    tol = 1e-2 if half else 1e-4
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return False, "non-finite values in the output"
    scale = float(b.abs().max()) or 1.0
    err = float((a - b).abs().max()) / scale
    return err <= tol, f"max error {err:.2e} of the baseline's largest magnitude (tolerance {tol:g})"


def _autotuner_choices(ns: dict) -> dict:
    """``{kernel: [(key, config), ...]}`` for every autotuned kernel the lab defines and ran."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return {}
    found = {}
    for name, obj in ns.items():
        if isinstance(obj, Autotuner) and getattr(obj, "cache", None):
            found[name] = [[str(key), str(config)] for key, config in obj.cache.items()]
    return found


# --- exercises: public cases in process, hidden cases through the grader --------------------------------

def exercises(stem: str, device: str, tiny: bool, out_dir: Path, timeout_s: float) -> dict:
    """Each exercise's public cases (the inline check) timed one by one, then ``python -m grader grade`` of the
    solution on ``device`` (hidden cases from a fresh seed, sandboxed), its result.json kept."""
    from gpulab.feedback import check_result
    from grader.bench import load_answers
    from grader.checks import exercises as exercise_ids

    _, ns = load_answers(ROOT / "solutions" / f"{stem}.ipynb", stem, device)
    public = []
    for ex in exercise_ids(stem):
        start = time.perf_counter()
        try:
            result = check_result(ex, ns, device, strict=False, quiet=True, record=False)
            public.append({"id": ex, "status": result.status, "message": result.message[:300]})
        except Exception as exc:  # noqa: BLE001 - recorded, the next exercise still runs
            public.append({"id": ex, "status": "error", "message": f"{type(exc).__name__}: {exc}"[:300]})
        public[-1]["seconds"] = time.perf_counter() - start
    return {"lab": stem, "public": public, "grade": grade(stem, device, out_dir, timeout_s)}


def grade(stem: str, device: str, out_dir: Path, timeout_s: float) -> dict:
    """``python -m grader grade solutions/<stem>.ipynb --device <device>`` in a fresh process."""
    out = out_dir / f"grade_{stem}"
    argv = [sys.executable, "-m", "grader", "grade", f"solutions/{stem}.ipynb", "--device", device,
            "--out", str(out), "--seed", "1"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=_env())
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": time.perf_counter() - start, "limit_s": timeout_s}
    report = {"command": " ".join(argv[1:]), "exit": proc.returncode, "seconds": time.perf_counter() - start,
              "output_tail": (proc.stdout + proc.stderr)[-2000:]}
    result_file = out / "result.json"
    if result_file.exists():
        result = json.loads(result_file.read_text())
        report.update({key: result.get(key) for key in ("status", "score", "max_score", "duration_s", "isolation")})
        report["exercises"] = [{k: e.get(k) for k in ("id", "status", "score", "points", "message", "duration_s")
                                if k in e} for e in result.get("exercises", [])]
    return report


def _env() -> dict:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p)}


# --- the CUDA-only paths the lessons describe ---------------------------------------------------------------

def lesson_paths(device: str, tiny: bool) -> dict:
    """Each CUDA-only path a lesson describes, run once: what it did or why not."""
    if device != "cuda":
        return {name: {"status": "not run", "why": "needs CUDA"} for name in PATHS}
    results = {}
    for name, probe in PATHS.items():
        start = time.perf_counter()
        try:
            results[name] = {"status": "ok", **probe()}
        except Exception as exc:  # noqa: BLE001 - each path is reported on its own
            results[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
        results[name]["seconds"] = time.perf_counter() - start
    return results


def _small_mlp():
    import torch

    layers = [torch.nn.Linear(256, 256, device="cuda", dtype=torch.float16) for _ in range(16)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
    return model, torch.randn(8, 256, device="cuda", dtype=torch.float16)


def _cuda_graphs() -> dict:
    """Lesson 06: a 16-layer MLP, eager vs CUDA-graph replay, by the course's timer, by host clock and by
    Triton's do_bench_cudagraph: how much the per-call L2 flush hides of the launch cost."""
    import torch
    import triton.testing

    from gpulab.bench import benchmark, host_clock

    model, x = _small_mlp()
    with torch.no_grad():
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_x)
        graph.replay()
        torch.cuda.synchronize()
        same = bool(torch.allclose(static_out, model(x), atol=1e-2))

        def eager():
            return model(x)
        timings = {"eager_ms_do_bench": benchmark(eager).median_ms,
                   "graph_ms_do_bench": benchmark(graph.replay).median_ms,
                   "eager_ms_host_clock": host_clock(eager).median_ms,
                   "graph_ms_host_clock": host_clock(graph.replay).median_ms,
                   "eager_ms_do_bench_cudagraph": triton.testing.do_bench_cudagraph(eager)}
    timings["graph_speedup_do_bench"] = timings["eager_ms_do_bench"] / timings["graph_ms_do_bench"]
    timings["graph_speedup_host_clock"] = timings["eager_ms_host_clock"] / timings["graph_ms_host_clock"]
    return {"replay_matches_eager": same, **timings}


def _l2_flush_effect() -> dict:
    """The zeroing flush's dirty lines: one small memory-bound row timed after each flush."""
    import torch

    from gpulab.bench import benchmark

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    v = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    rows = {"rmsnorm_4096x4096": lambda: torch.nn.functional.rms_norm(x, (4096,)),
            "gemv_int8_as_fp16_4096": lambda: v @ w.t().half()}
    return {name: {flush: benchmark(fn, flush=flush).median_ms for flush in ("zero", "read", "none")}
            for name, fn in rows.items()}


def _sync_debug() -> dict:
    """Lesson 06: sync debug mode turns a hidden host sync (``.item()``) into an error."""
    import torch

    x = torch.ones(4, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            x.sum().item()
            raised = False
        except RuntimeError:
            raised = True
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"item_raised_in_error_mode": raised}


def _sparsity_2_4() -> dict:
    """Lesson 09: a 2:4 sparse fp16 matmul on the sparse tensor cores vs dense."""
    import torch
    from torch.sparse import to_sparse_semi_structured

    from gpulab.bench import benchmark

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    w = w * torch.tensor([1, 1, 0, 0], device="cuda", dtype=w.dtype).repeat(4096, 1024)  # 2 of every 4 kept
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    sparse = to_sparse_semi_structured(w)
    same = bool(torch.allclose(torch.mm(sparse, x), torch.mm(w, x), rtol=1e-2, atol=1e-1))
    dense_ms, sparse_ms = benchmark(torch.mm, w, x).median_ms, benchmark(torch.mm, sparse, x).median_ms
    return {"matches_dense": same, "dense_ms": dense_ms, "sparse_ms": sparse_ms, "speedup": dense_ms / sparse_ms}


def _pinned_copies() -> dict:
    """Lesson 15: host-to-device bandwidth, pageable vs pinned, 256 MiB."""
    import torch

    from gpulab.bench import benchmark, gbps

    pageable = torch.empty(256 << 20, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    pageable_ms = benchmark(lambda: pageable.to("cuda")).median_ms
    pinned_ms = benchmark(lambda: pinned.to("cuda", non_blocking=True)).median_ms
    return {"pageable_gbps": gbps(pageable.numel(), pageable_ms), "pinned_gbps": gbps(pinned.numel(), pinned_ms)}


def _profiler_trace() -> dict:
    """Lesson 06: a CUDA profiler trace of the MLP records its kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, x = _small_mlp()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(x)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    return {"cuda_events": len(kernels), "events": len(prof.events())}


def _sdpa_backend() -> dict:
    """Lesson 05: which SDPA backends run fp16 attention at D = 64 and 128."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    found = {}
    for d in (64, 128):
        q = torch.randn(1, 8, 1024, d, device="cuda", dtype=torch.float16)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
                found[f"D={d} {backend.name}"] = "runs"
            except RuntimeError as exc:
                found[f"D={d} {backend.name}"] = f"refused: {str(exc)[:120]}"
    return found


def _nccl_rank(rank: int, world_size: int, place_on_gpu: bool) -> dict:
    """One rank of :func:`_nccl_ranks`: an all-reduce of a tensor on ``rank_device()`` (or, to see NCCL's
    refusal and launch's advice, on the CPU)."""
    import torch
    import torch.distributed as dist

    from gpulab.dist import rank_device

    dev = rank_device() if place_on_gpu else torch.device("cpu")
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    return {"device": str(dev), "sum": t[0].item()}


def _nccl_ranks() -> dict:
    """Lessons and labs 11-13 on GPUs: ``launch`` over NCCL, one rank per visible GPU (one on a one-GPU
    machine): ``rank_device()`` is each rank's GPU and the all-reduce sums; then a CPU tensor in the same
    collective, which NCCL refuses, to see that ``launch`` adds its advice."""
    try:
        import cloudpickle  # launch ships functions with it; an offline machine has it only from --wheels
    except ImportError:
        return {"status": "not run", "why": "needs cloudpickle: carry its wheel with --wheels"}
    import torch

    from gpulab.dist import RankError, launch

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this script's module
    world = torch.cuda.device_count()
    ranks = launch(_nccl_rank, world, True, backend="nccl", timeout_s=60)
    out = {"world_size": world, "devices": [r["device"] for r in ranks],
           "sums_correct": all(r["sum"] == world * (world + 1) / 2 for r in ranks)}
    try:
        launch(_nccl_rank, world, False, backend="nccl", timeout_s=60)
        out["cpu_tensor_refused"] = False
    except RankError as exc:
        out["cpu_tensor_refused"] = True
        out["advice_given"] = "rank_device()" in str(exc)
        out["nccl_words"] = next((ln for ln in exc.report.splitlines() if "Error" in ln), "")[:200]
    if not out["sums_correct"] or not out.get("advice_given", True):  # a problem for the summary, with the facts
        raise AssertionError(f"NCCL ranks did not behave as lessons 11-13 say: {out}")
    return out


PATHS = {"nccl_ranks": _nccl_ranks, "cuda_graphs": _cuda_graphs, "l2_flush_effect": _l2_flush_effect,
         "sync_debug_mode": _sync_debug, "sparsity_2_4": _sparsity_2_4, "pinned_copies": _pinned_copies,
         "profiler_trace": _profiler_trace, "sdpa_backend": _sdpa_backend}


# --- notebooks ----------------------------------------------------------------------------------------

def notebook(path: str, device: str, out_dir: Path, timeout_s: float) -> dict:
    """Run a notebook top to bottom with ``DEVICE`` set: papermill when it is importable, else its code cells in
    order in a fresh ``python`` (no Jupyter: IPython magics and shell lines are skipped, and that is said)."""
    start = time.perf_counter()
    try:
        import papermill  # noqa: F401
        runner = "papermill"
    except ImportError:
        runner = "plain python (no papermill): code cells in order"
    target = out_dir / "notebooks" / Path(path).name
    target.parent.mkdir(parents=True, exist_ok=True)
    if runner == "papermill":
        argv = [sys.executable, "-m", "papermill", str(ROOT / path), str(target), "-p", "DEVICE", device, "--cwd",
                str((ROOT / path).parent)]
    else:
        script = target.with_suffix(".py")
        skipped = write_script(ROOT / path, script, device)
        argv = [sys.executable, str(script)]
    env = {**_env(), "GPULAB_DEVICE": device, "MPLBACKEND": "Agg", "GPULAB_STRICT": "1"}
    try:
        proc = subprocess.run(argv, cwd=(ROOT / path).parent, capture_output=True, text=True, timeout=timeout_s,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"notebook": path, "runner": runner, "status": "timeout", "seconds": time.perf_counter() - start}
    report = {"notebook": path, "runner": runner, "status": "ok" if proc.returncode == 0 else "failed",
              "seconds": time.perf_counter() - start, "output_tail": (proc.stdout + proc.stderr)[-3000:]}
    if runner != "papermill":
        report["skipped_lines"] = skipped
    return report


def write_script(nb_path: Path, script: Path, device: str) -> int:
    """The notebook's code cells as one script, ``DEVICE`` set after the parameters cell; returns how many
    IPython-only lines (``%magic``, ``!shell``) were turned into comments."""
    nb = json.loads(nb_path.read_text())
    parts = ["# generated from " + nb_path.name + " by benchmarks/gpu_steps.py",
             "try:\n    from IPython.display import display\nexcept ImportError:\n    display = print"]
    skipped = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = []
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith(("%", "!")):
                lines.append("# (IPython only, skipped) " + line)
                skipped += 1
            else:
                lines.append(line)
        parts.append(f"# --- cell {cell.get('id')}\n" + "\n".join(lines))
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            parts.append(f"DEVICE = {device!r}  # injected parameter")
    script.write_text("\n\n".join(parts) + "\n")
    return skipped
