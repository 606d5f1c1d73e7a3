"""Every lab's BENCHMARKS run end to end on the CPU at tiny sizes (GPU sizes need a GPU; numbers unchecked)."""
import pytest

from grader.bench import run_benchmarks
from grader.checks import lab_stems, load_lab
from tests.conftest import solution_namespace

LABS = [s for s in lab_stems() if getattr(load_lab(s), "BENCHMARKS", None)]


@pytest.mark.slow
@pytest.mark.parametrize("stem", LABS)
def test_benchmarks_run_tiny_on_cpu(stem):
    report = run_benchmarks(load_lab(stem).BENCHMARKS, solution_namespace(stem), "cpu", tiny=True, repeats=1)
    assert report["results"]
    for row in report["results"]:
        assert "skipped" not in row, row
        assert row["ms"] > 0 and row["baseline_ms"] > 0
        assert ("gbps" in row) or ("tflops" in row), row


def test_a_failing_row_is_recorded_and_the_others_still_run():
    import torch

    from grader.bench import Benchmark, format_table

    def make(device, tiny):
        return {"x": torch.ones(64), "bytes": 512}

    def broken(x):
        raise RuntimeError("out of memory (pretend)")

    benches = [Benchmark("broken", "broken", make, lambda fn, d: fn(d["x"]), lambda d: d["x"] + 1),
               Benchmark("fine", "fine", make, lambda fn, d: fn(d["x"]), lambda d: d["x"] + 1,
                         info=lambda: {"baseline_flash_impl": "FA2"})]
    report = run_benchmarks(benches, {"broken": broken, "fine": lambda x: x * 2}, "cpu", tiny=True, repeats=1)
    broken_row, fine_row = report["results"]
    assert broken_row == {"name": "broken", "error": "RuntimeError: out of memory (pretend)"}
    assert fine_row["ms"] > 0 and fine_row["baseline_flash_impl"] == "FA2"
    assert "FAILED: RuntimeError" in format_table(report)


def test_peaks_are_medians_like_the_kernels(monkeypatch):
    from gpulab import peaks
    from gpulab.bench import summarize

    monkeypatch.setattr(peaks, "benchmark", lambda *a, **k: summarize([1.0, 2.0, 2.0, 2.0, 9.0]))
    p = peaks.measure_peaks("cpu")
    assert p.copy_gbps == pytest.approx(2 * p.copy_bytes / 2e-3 / 1e9)  # the 2 ms median, not the 1 ms best
    assert p.matmul_tflops == pytest.approx(2 * p.matmul_size**3 / 2e-3 / 1e12)
