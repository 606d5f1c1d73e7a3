"""``python -m grader bench NB``: time a notebook's kernels and the PyTorch baseline in one run.

Each lab may define ``BENCHMARKS`` (a list of :class:`grader.exercise.Benchmark`) in its check module. Rates are
reported as achieved GB/s or TFLOP/s and as % of this device's measured peaks (lesson 01). Needs
only torch, triton and numpy. Learner code runs in this process: bench is a tool for the learner's
own code, not a grade.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from grader.exercise import Benchmark


def run_benchmarks(benchmarks: list[Benchmark], ns: dict, device: str, tiny: bool = False,
                   repeats: int = 20) -> dict:
    """Time every benchmark whose entry ``ns`` defines; returns ``{"peaks": ..., "results": [...]}``.

    ``repeats`` applies off the GPU (on CUDA, ``do_bench`` decides); a smoke test passes 1.
    A benchmark that fails records its error in its row and the others still run. Kernels and
    baselines are timed by their median, as the peaks are.
    """
    from gpulab.peaks import measured_peaks

    peaks = measured_peaks(device)
    rows = []
    for b in benchmarks:
        if b.entry not in ns:
            rows.append({"name": b.name, "skipped": f"`{b.entry}` is not defined"})
            continue
        try:
            rows.append(_run_one(b, ns[b.entry], device, tiny, repeats, peaks))
        except NotImplementedError:
            rows.append({"name": b.name, "skipped": f"`{b.entry}` is not implemented yet"})
        except Exception as exc:  # noqa: BLE001 - one broken row must not cost the others (or the JSON)
            rows.append({"name": b.name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            _free_device_memory(device)
    return {"device": device, "device_name": peaks.name, "tiny": tiny,
            "peaks": {"copy_gbps": peaks.copy_gbps, "matmul_tflops": peaks.matmul_tflops,
                      "matmul_dtype": peaks.matmul_dtype}, "results": rows}


def _run_one(b: Benchmark, fn: Callable, device: str, tiny: bool, repeats: int, peaks) -> dict:
    """One row: the learner's call and the baseline, by median time, with rates and % of the peaks."""
    from gpulab.bench import benchmark, gbps, pct_of_peak, tflops

    inputs = b.make(device, tiny)
    mine = benchmark(lambda: b.call(fn, inputs), device=device, repeats=repeats, warmup=min(3, repeats))
    base = benchmark(lambda: b.baseline(inputs), device=device, repeats=repeats, warmup=min(3, repeats))
    row = {"name": b.name, "ms": mine.median_ms, "p95_ms": mine.p95_ms, "baseline_ms": base.median_ms,
           "speedup_vs_baseline": base.median_ms / mine.median_ms}
    if inputs.get("bytes"):
        row["gbps"] = gbps(inputs["bytes"], mine.median_ms)
        row["pct_of_copy"] = pct_of_peak(row["gbps"], peaks.copy_gbps)
    if inputs.get("flops"):
        row["tflops"] = tflops(inputs["flops"], mine.median_ms)
        row["pct_of_matmul"] = pct_of_peak(row["tflops"], peaks.matmul_tflops)
    if b.info is not None:
        row.update(b.info())
    return row


def _free_device_memory(device: str) -> None:
    """Give a finished row's buffers back, so one large row cannot starve the next."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def format_table(report: dict) -> str:
    lines = [f"{report['device_name']} ({report['device']}): copy {report['peaks']['copy_gbps']:.1f} GB/s, "
             f"matmul {report['peaks']['matmul_tflops']:.2f} TFLOP/s"
             + ("   [tiny sizes: CPU interpreter timings say nothing about a GPU]" if report["tiny"] else ""),
             f"{'benchmark':36s}{'ms':>10}{'GB/s':>10}{'% copy':>8}{'TFLOP/s':>9}{'vs torch':>10}"]
    for r in report["results"]:
        if "skipped" in r or "error" in r:
            why = 'skipped' if 'skipped' in r else 'FAILED'
            lines.append(f"{r['name']:36s}  {why}: {r.get('skipped') or r['error']}")
            continue
        lines.append(f"{r['name']:36s}{r['ms']:>10.4f}{r.get('gbps', float('nan')):>10.1f}"
                     f"{r.get('pct_of_copy', float('nan')):>7.0f}%{r.get('tflops', float('nan')):>9.2f}"
                     f"{r['speedup_vs_baseline']:>9.2f}x")
    return "\n".join(lines)


def load_answers(path, lab: str | None, device: str) -> tuple[str, dict]:
    """Execute a notebook's answer cells (with the lab's locked cells) here; returns (lab, namespace)."""
    from grader.checks import lab_stems
    from grader.grade import identify_lab, pick_answers, solution_path
    from grader.notebooks import exec_source, export_source, read_notebook

    nb = read_notebook(path)
    stem, reason = identify_lab(nb, lab)
    if stem is None:
        raise ValueError(reason)
    assert stem in lab_stems()
    from grader.checks import exercises

    solution = read_notebook(solution_path(stem))
    source = export_source(solution, pick_answers(nb, solution, list(exercises(stem))),
                           parameters={"DEVICE": device, "SEED": 0})
    return stem, exec_source(source, f"<{Path(path).name}>")


def bench_notebook(path, lab: str | None, device: str, out: str | None = None, tiny: bool | None = None) -> int:
    from grader.checks import load_lab
    from grader.notebooks import InvalidNotebook

    tiny = device != "cuda" if tiny is None else tiny
    try:
        stem, ns = load_answers(path, lab, device)
    except (InvalidNotebook, ValueError) as exc:
        print(f"bench failed: {exc}")
        return 2
    benchmarks = getattr(load_lab(stem), "BENCHMARKS", [])
    if not benchmarks:
        print(f"lab {stem} has no benchmarks.")
        return 0
    report = run_benchmarks(benchmarks, ns, device, tiny)
    report["lab"], report["notebook"] = stem, Path(path).name
    print(format_table(report))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench.json").write_text(json.dumps(report, indent=1))
        print(f"wrote {Path(out) / 'bench.json'}")
    return 1 if any("error" in r for r in report["results"]) else 0  # written first, then the verdict
