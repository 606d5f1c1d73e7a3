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
    assert [r["name"] for r in data["results"]] == ["vector_add fp32 vs torch.add", "bias_gelu erf vs eager gelu(x+b)",
                                                    "bias_gelu tanh vs eager gelu(x+b)"]
    assert all(r["gbps"] > 0 and r["baseline_ms"] > 0 for r in data["results"])
    assert data["peaks"]["copy_gbps"] > 0 and data["tiny"] is True
