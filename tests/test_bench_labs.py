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
