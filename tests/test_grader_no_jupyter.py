"""GPU machines have no Jupyter: `grade` and `bench` must work with only torch, triton and numpy.

A ``sitecustomize`` on PYTHONPATH makes every Jupyter-side package unimportable, in the judge and
in its worker processes alike.
"""
import json
import os
import subprocess
import sys

from tests.conftest import ROOT

BLOCKED = ["nbformat", "papermill", "nbclient", "IPython", "ipywidgets", "ipykernel", "jupyter_client",
           "matplotlib", "tqdm", "nbval", "jupyterlab", "cloudpickle"]

SITECUSTOMIZE = f'''
import sys
BLOCKED = {BLOCKED!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: this test machine has no Jupyter")
        return None
sys.meta_path.insert(0, _Block())
'''


def _env(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))


def test_grade_and_bench_without_jupyter(tmp_path):
    env = _env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import nbformat"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked" in probe.stderr
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", "solutions/02_triton_basics.ipynb", "--out",
                           str(out), "--seed", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["score"] == result["max_score"] == 8
    assert result["notebook_run"]["status"] == "skipped"
    proc = subprocess.run([sys.executable, "-m", "grader", "bench", "solutions/02_triton_basics.ipynb", "--device",
                           "cpu"], cwd=ROOT, env=dict(env, GPULAB_CACHE=str(tmp_path / "cache")),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vector_add fp32 vs torch.add" in proc.stdout
