"""``make gpu-check``: the GPU machines' one command, run here as a CPU smoke run on a checkout that was never
pip-installed and has no Jupyter (as on those machines), plus its budget, verdicts and notebook runner.

The offline checkout is made by a ``sitecustomize`` on PYTHONPATH: it removes this venv's editable install of
the project (its import finder and its distribution, with the ``gpulab.checks`` entry point) and blocks the
Jupyter packages, in the judge and in every process it starts outside the sandbox. Inside the sandbox
(bubblewrap's cleared environment) the project is found through the PYTHONPATH the sandbox passes.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_goals  # noqa: E402
import gpu_steps  # noqa: E402

JUPYTER = ["papermill", "nbclient", "ipykernel", "nbformat", "jupyter_client", "IPython", "nbval"]

SITECUSTOMIZE = f'''
import importlib.machinery
import sys

BLOCKED = {JUPYTER!r}


class _NoJupyter:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: the GPU machines have no Jupyter")
        return None


class _NotInstalled(importlib.machinery.PathFinder):
    """The path finder, minus this project's installed distribution (and so its entry points)."""

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs)
                if (d.metadata["Name"] or "").replace("_", "-") != "gpu-systems-lab")


sys.meta_path[:] = [_NoJupyter()] + [_NotInstalled if f is importlib.machinery.PathFinder else f
                                     for f in sys.meta_path if not repr(f).count("__editable__")]
'''


def offline_env(tmp_path) -> dict:
    """The environment of a checkout never pip-installed, without Jupyter: the project on PYTHONPATH only."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k not in ("GPULAB_DEVICE", "TRITON_INTERPRET")}
    return dict(env, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), GPULAB_CACHE=str(tmp_path / "cache"))


def test_the_offline_environment_hides_the_install_and_jupyter(tmp_path):
    probe = ("import importlib.metadata as m, gpulab;"
             "print(len(m.entry_points(group='gpulab.checks')), gpulab.__file__);"
             "import papermill")
    proc = subprocess.run([sys.executable, "-c", probe], env=offline_env(tmp_path), capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.stdout.split() == ["0", str(ROOT / "gpulab" / "__init__.py")], proc.stderr[-2000:]
    assert "blocked" in proc.stderr


def bubblewrap_works() -> bool:
    from grader.sandbox import isolation

    return shutil.which("bwrap") is not None and isolation()["mode"] == "bwrap"


@pytest.mark.slow
def test_lab_02_grades_full_marks_from_a_checkout_never_installed(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", "solutions/02_triton_basics.ipynb", "--out",
                           str(out), "--seed", "3"], cwd=ROOT, env=offline_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["score"] == result["max_score"] > 0, result["exercises"]
    assert result["isolation"]["mode"] == ("bwrap" if bubblewrap_works() else "none")


def test_the_inline_checks_fall_back_to_the_grader_beside_gpulab(monkeypatch):
    import grader.inline
    from gpulab import checks_entry

    monkeypatch.setattr(checks_entry, "entry_points", lambda group: [])  # not installed
    checks_entry.checks.cache_clear()
    try:
        assert checks_entry.checks() is grader.inline
        checks_entry.checks.cache_clear()
        monkeypatch.setattr(checks_entry, "DOOR", "grader.no_such_module")  # and no grader on the path either
        with pytest.raises(checks_entry.ChecksMissing, match="PYTHONPATH"):
            checks_entry.checks()
    finally:
        checks_entry.checks.cache_clear()


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_the_box_finds_the_project_on_pythonpath(monkeypatch, mode):
    from grader import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: {"mode": mode, "detail": ""})
    assert sandbox.environment("cpu")["PYTHONPATH"] == str(ROOT)


@pytest.mark.slow
def test_gpu_check_tiny_runs_on_the_cpu_from_a_checkout_never_installed(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PYTHON={sys.executable}",
                           f"ARGS=--device cpu --tiny --budget 0 --out {out}"], cwd=ROOT, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert [s["name"] for s in report["steps"]] == [s.name for s in gpu_check.plan("cpu", True)]
    assert all(s["status"] == "done" for s in steps.values()), [(s["name"], s["status"]) for s in steps.values()]
    bench = steps["bench:02_triton_basics"]["result"]["rows"]
    assert bench and all(row["output_ok"] for row in bench)
    exercises = steps["exercises:02_triton_basics"]["result"]
    assert {e["status"] for e in exercises["public"]} == {"passed"}  # the checks, without their entry point
    grade = exercises["grade"]
    assert grade["score"] == grade["max_score"] > 0
    if bubblewrap_works():
        assert grade["isolation"]["mode"] == "bwrap"
    notebook = steps["notebook:solutions/01_performance_model.ipynb"]["result"]
    assert notebook["status"] == "ok" and notebook["runner"].startswith("plain python"), notebook
    assert {v["verdict"] for v in report["goals"]} == {"not measured"}  # no GPU figure from a CPU run
    assert report["problems"] == [] and report["not_run"] == []
    md = (out / "gpu_check.md").read_text()
    assert "## Performance goals" in md and "tiny sizes on the CPU: no GPU figure" in md


# --- the budget ------------------------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_step_that_does_not_fit_the_budget_never_starts(tmp_path, monkeypatch):
    clock = FakeClock()
    started = []

    def fake_run(argv, timeout, **kwargs):
        name = argv[argv.index("--step") + 1]
        started.append(name)
        assert timeout == min(100 - clock.now, 3 * {"a": 40, "c": 30}[name])  # the budget's end or 3 x estimate
        clock.now += 50  # every step takes 50 s
        path = gpu_check._step_file(tmp_path, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"status": "done", "result": {}}))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    steps = [gpu_check.Step("a", 40), gpu_check.Step("b", 80), gpu_check.Step("c", 30), gpu_check.Step("d", 30)]
    records = gpu_check.run_all(steps, gpu_check.Budget(100, clock), "cpu", True, tmp_path, {})
    assert started == ["a", "c"]  # b needs 80 s of the 50 left; d needs 30 of the 0 left
    assert [r["status"] for r in records] == ["done", "not run", "done", "not run"]
    assert "needs about 80 s" in records[1]["why"] and "seconds" not in records[1]


def test_continue_keeps_finished_steps_and_runs_the_rest(tmp_path, monkeypatch):
    started = []

    def fake_run(argv, timeout, **kwargs):
        started.append(argv[argv.index("--step") + 1])
        assert timeout is None  # no budget: nothing is stopped
        return subprocess.CompletedProcess(argv, 1, "", "boom")  # no result file: an error record

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    done = {"a": {"name": "a", "status": "done", "result": {"x": 1}}, "b": {"name": "b", "status": "not run"}}
    records = gpu_check.run_all([gpu_check.Step("a", 1), gpu_check.Step("b", 1)], gpu_check.Budget(0), "cpu",
                                True, tmp_path, {}, done)
    assert started == ["b"]
    assert records[0]["from_earlier_run"] and records[1]["status"] == "error" and "boom" in records[1]["output_tail"]


def test_the_gpu_plan_runs_environment_then_benchmarks_first():
    plan = gpu_check.plan("cuda", False)
    assert plan[0].name == "environment" and plan[1].name == "bench:08_quantization"
    names = [s.name for s in plan]
    assert names.index("exercises:02_triton_basics") < names.index("lesson-paths") < names.index(
        "notebook:solutions/06_compile_and_graphs.ipynb")
    assert all((ROOT / s.arg).exists() for s in plan if s.kind == "notebook")


# --- verdicts: never a figure that was not measured ---------------------------------------------------------

def test_every_goal_names_a_benchmark_row():
    from grader.checks import load_lab

    for goal in gpu_goals.GOALS:
        assert goal.row in {b.name for b in load_lab(goal.lab).BENCHMARKS}, goal


def test_verdicts():
    goal = gpu_goals.Goal("08_quantization", "gemv", "pct_of_copy", 80)
    row = {"name": "gemv", "output_ok": True, "output_check": "ok", "tiny": False, "pct_of_copy": 83.0}
    assert gpu_goals.verdict(goal, {"gemv": row}, {})["verdict"] == "met"
    assert gpu_goals.verdict(goal, {"gemv": {**row, "pct_of_copy": 70.0}}, {})["verdict"] == "missed"
    wrong = gpu_goals.verdict(goal, {"gemv": {**row, "output_ok": False}}, {})
    assert wrong["verdict"] == "wrong output" and "measured" not in wrong
    missing = gpu_goals.verdict(goal, {}, {"08_quantization": "its benchmark step not run: budget"})
    assert missing == {"lab": "08_quantization", "row": "gemv", "goal": ">= 80% of copy bandwidth",
                       "verdict": "not measured", "why": "its benchmark step not run: budget"}


def test_the_summary_of_a_run_that_measured_nothing_holds_no_figure():
    records = [{"name": "environment", "estimate_s": 40, "status": "not run", "why": "budget: 0 s left"},
               {"name": "bench:08_quantization", "estimate_s": 90, "status": "timeout", "why": "stopped", "seconds": 9}]
    report = {"device": "cuda", "tiny": False, "date": "today", "budget_s": 10, "seconds": 10, "steps": records,
              "goals": gpu_check.goal_verdicts(records), "problems": gpu_check.problems(records),
              "not_run": ["environment"]}
    md = gpu_check.markdown(report)
    goals = md.split("## Performance goals")[1].split("## Steps")[0]
    assert "| met |" not in goals and "| missed |" not in goals
    assert goals.count("not measured") == len(gpu_goals.GOALS)
    assert "Environment step did not run" in md and "--continue" in md
    assert report["problems"] == ["bench:08_quantization: timeout: stopped"]


# --- the pieces ---------------------------------------------------------------------------------------

def test_outputs_are_compared_with_the_baselines():
    import torch

    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    assert gpu_steps.compare_outputs(x.clone(), x)[0]
    assert gpu_steps.compare_outputs((x.half(), torch.zeros(64)), x)[0]  # (out, lse): the first is compared
    assert not gpu_steps.compare_outputs(x * 1.01, x)[0]  # fp32 holds to 1e-4 of the largest value
    assert not gpu_steps.compare_outputs(x.T, x)[0]
    q = torch.randint(-128, 128, (10_000,), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    off = q.clone()
    off[0] = off[0] + 1 if off[0] < 127 else off[0] - 1
    assert gpu_steps.compare_outputs(off, q)[0]  # one rounding tie in 10,000
    assert not gpu_steps.compare_outputs(q + 1, q)[0]


def test_a_notebook_without_jupyter_runs_as_its_code_cells(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# t"]},
                    {"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]},
                     "source": ["DEVICE = 'auto'"]},
                    {"cell_type": "code", "id": "m", "metadata": {},
                     "source": ["%matplotlib inline\n", "x = 1\n", "!ls\n", "print(DEVICE, x)"]}]}
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps(nb))
    script = tmp_path / "t.py"
    assert gpu_steps.write_script(path, script, "cuda") == 2
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.stdout.strip() == "cuda 1", proc.stderr


def test_carried_wheels_unpack_without_pip(tmp_path):
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "tiny-1.0-py3-none-any.whl", "w") as z:
        z.writestr("tiny/__init__.py", "VALUE = 7\n")
    with zipfile.ZipFile(wheels / "numpy-2.2.6-cp312-cp312-manylinux2014_x86_64.whl", "w") as z:
        z.writestr("numpy/__init__.py", "raise ImportError('the carried numpy shadowed the machine's own')\n")
    site = tmp_path / "site"
    assert gpu_check.unpack_wheels(wheels, site) == ["tiny-1.0-py3-none-any.whl"]
    assert not (site / "numpy").exists()
    proc = subprocess.run([sys.executable, "-c", "import tiny; print(tiny.VALUE)"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(site)))
    assert proc.stdout.strip() == "7"
