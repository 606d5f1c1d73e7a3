"""The benchmark scripts run end to end on the CPU at tiny sizes (their numbers are not checked)."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def test_foundation_benchmark_runs_tiny_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/foundation.py", "--tiny", "--device", "cpu",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = tmp_path.glob("foundation_cpu_*_tiny.json")
    data = json.loads(result.read_text())
    names = [r["name"] for r in data["results"]]
    assert "vector_add fp32 (lab 02 solution)" in names and "fused bias_gelu tanh (lab 02)" in names
    assert all(r["gbps"] > 0 for r in data["results"])
