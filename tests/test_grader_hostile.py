"""Hostile submissions: each earns exactly what it honestly earned, and nothing ends in a traceback."""
import json
import subprocess
import sys
import time

import pytest

from grader.grade import grade
from tests import graderkit as kit
from tests.conftest import ROOT

L1, L2 = "01_performance_model", "02_triton_basics"
ALL1 = ("costs", "roofline", "benchmark", "scaling")
ALL2 = ("vector_add", "bias_gelu", "copy_2d", "fusion_bytes")


def run(tmp_path, nb, lab=None, name="s.ipynb", **kw):
    kw.setdefault("seed", 11)
    kw.setdefault("notebook_run", False)
    kw.setdefault("timeout_s", 30)
    return grade(kit.write(nb, tmp_path / name), lab=lab, **kw)


def test_untouched_lab_is_all_not_attempted(tmp_path):
    r = run(tmp_path, kit.submission(L2), lab=L2)
    assert r["status"] == "graded" and r["score"] == 0 and r["max_score"] == 8
    assert all(e["status"] == "not_attempted" and e["score"] == 0 for e in r["exercises"])


def test_solution_earns_full_marks_and_runs_top_to_bottom(tmp_path):
    r = run(tmp_path, kit.load("solutions", L2), notebook_run=True)
    assert r["lab"] == L2 and r["score"] == r["max_score"] == 8
    assert r["notebook_run"]["status"] == "ok"


def test_one_exercise_solved_earns_exactly_its_points(tmp_path):
    r = run(tmp_path, kit.submission(L1, solved=("roofline",)))
    assert r["score"] == 2
    assert [e["status"] for e in r["exercises"]] == ["not_attempted", "passed", "not_attempted", "not_attempted"]


def test_wrong_answer_fails_with_shape_dtype_and_first_mismatches(tmp_path):
    wrong = kit.solution_with(L2, "bias_gelu", "y = 0.5 * z * (1.0 + tanh_u)", "y = z * (1.0 + tanh_u)")
    r = run(tmp_path, kit.submission(L2, {"bias_gelu": wrong}, solved=("vector_add",)))
    e = kit.by_id(r)["bias_gelu"]
    assert e["status"] == "failed" and 0 < e["score"] < 3  # the erf cases still pass
    assert "for shape (" in e["message"] and "torch.float" in e["message"] and "at [" in e["message"]
    assert kit.by_id(r)["vector_add"]["status"] == "passed"


def test_syntax_error_costs_only_its_exercise(tmp_path):
    r = run(tmp_path, kit.submission(L1, {"costs": "def elementwise_cost(:\n    pass"}, solved=("roofline", "scaling")))
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and "SyntaxError" in e["costs"]["message"]
    assert e["roofline"]["status"] == e["scaling"]["status"] == "passed" and r["score"] == 4


def test_infinite_loop_times_out_within_the_bound(tmp_path):
    loop = "def amdahl_speedup(p, n):\n    while True:\n        pass\n" \
           "def strong_scaling_efficiency(t1, tn, n):\n    return t1 / (n * tn)\n" \
           "def weak_scaling_efficiency(t1, tn):\n    return t1 / tn\n"
    start = time.perf_counter()
    r = run(tmp_path, kit.submission(L1, {"scaling": loop}, solved=("costs", "roofline")), timeout_s=4)
    assert time.perf_counter() - start < 4 + 60  # one timeout, plus two worker start-ups
    e = kit.by_id(r)
    assert e["scaling"]["status"] == "timeout" and e["scaling"]["score"] == 0
    assert e["costs"]["status"] == "passed" and e["roofline"]["status"] == "passed" and r["score"] == 5


def test_infinite_loop_at_cell_level_times_out_too(tmp_path):
    r = run(tmp_path, kit.submission(L1, {"costs": "while True:\n    pass"}, solved=("scaling",)), timeout_s=4)
    assert kit.by_id(r)["costs"]["status"] == "timeout" and kit.by_id(r)["scaling"]["status"] == "passed"


CRASHERS = {
    "sys.exit() in the cell": "import sys\nsys.exit()",
    "SystemExit(0) in the cell": "raise SystemExit(0)",
    "os._exit(0) in the cell": "import os\nos._exit(0)",
    "segfault in the cell": "import ctypes\nctypes.string_at(0)",
}


@pytest.mark.parametrize("code", list(CRASHERS.values()), ids=list(CRASHERS))
def test_process_enders_in_a_cell_cost_only_that_exercise(tmp_path, code):
    r = run(tmp_path, kit.submission(L1, {"costs": code}, solved=("roofline", "scaling")))
    e = kit.by_id(r)
    assert e["costs"]["status"] in ("crashed", "error") and e["costs"]["score"] == 0
    assert e["roofline"]["status"] == e["scaling"]["status"] == "passed" and r["score"] == 4


@pytest.mark.parametrize("body", ["import sys; sys.exit(0)", "raise SystemExit(0)", "import os; os._exit(0)",
                                  "import ctypes; ctypes.string_at(0)"])
def test_process_enders_inside_the_function_are_crashed(tmp_path, body):
    code = kit.solution_with(L1, "scaling", "return 1.0 / ((1.0 - p) + p / n)", body)
    r = run(tmp_path, kit.submission(L1, {"scaling": code}, solved=("costs",)))
    e = kit.by_id(r)
    assert e["scaling"]["status"] == "crashed" and e["scaling"]["score"] == 0
    assert e["costs"]["status"] == "passed" and r["score"] == 3


MONKEYPATCHES = {
    "torch.allclose": "import torch\ntorch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n",
    "torch.testing": "import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None\n",
    "check modules": ("import gpulab.compare, grader.exercise, grader.checks\n"
                      "gpulab.compare.compare = lambda *a, **k: None\n"
                      "for ex in grader.checks.exercises('02_triton_basics').values():\n"
                      "    object.__setattr__(ex, 'judge', lambda case, obs: None)\n"
                      "grader.exercise.judge_case = lambda *a, **k: None\n"),
}


@pytest.mark.parametrize("patch", list(MONKEYPATCHES.values()), ids=list(MONKEYPATCHES))
def test_monkeypatching_the_checker_earns_nothing(tmp_path, patch):
    wrong = kit.solution_with(L2, "vector_add", "x + y, mask=mask", "x - y, mask=mask")
    r = run(tmp_path, kit.submission(L2, {"vector_add": patch + wrong}))
    e = kit.by_id(r)["vector_add"]
    assert e["status"] == "failed" and e["score"] == 0


def test_submitted_tags_and_metadata_are_ignored(tmp_path):
    wrong = "def bias_gelu_bytes(M, N, dtype_bytes, fused):\n    return 0\n"
    nb = kit.submission(L2, {"fusion_bytes": wrong})
    nb["metadata"].update({"execution": {"timeout": 1}, "papermill": {"allow_errors": True},
                           "nbgrader": {"grade": False}})
    for cell in nb["cells"]:
        cell.setdefault("metadata", {})["tags"] = ["skip-execution", "raises-exception", "nbval-ignore-output",
                                                    "nbval-skip"]
        cell["metadata"]["nbgrader"] = {"points": 100}
        if cell["metadata"].get("gpulab"):
            cell["metadata"]["gpulab"]["points"] = 100
    r = run(tmp_path, nb)
    e = kit.by_id(r)["fusion_bytes"]
    assert e["status"] == "failed" and e["points"] == 1 and r["max_score"] == 8


def test_deleted_reordered_and_duplicated_cells(tmp_path):
    sol = kit.load("solutions", L1)
    nb = kit.deepcopy(sol)
    del nb["cells"][kit.answer_index(nb, "costs")]                 # deleted: not attempted
    roofline = nb["cells"].pop(kit.answer_index(nb, "roofline"))
    nb["cells"].append(roofline)                                  # moved to the end: still graded
    scaling = kit.deepcopy(nb["cells"][kit.answer_index(nb, "scaling")])
    bad = kit.deepcopy(scaling)
    bad["source"] = "def amdahl_speedup(p, n):\n    return n\n"
    nb["cells"].insert(kit.answer_index(nb, "scaling"), bad)      # a wrong earlier copy ...
    nb["cells"].append(scaling)                                   # ... and the right one last: the last wins
    r = run(tmp_path, nb, lab=L1)
    e = kit.by_id(r)
    assert e["costs"]["status"] == "not_attempted"
    assert e["roofline"]["status"] == "passed" and e["scaling"]["status"] == "passed"
    assert r["score"] == 2 + 3 + 2


def test_answer_cell_matched_by_cell_id_when_its_metadata_is_gone(tmp_path):
    nb = kit.submission(L1, solved=("scaling",))
    nb["cells"][kit.answer_index(nb, "scaling")]["metadata"] = {}
    r = run(tmp_path, nb, lab=L1)
    assert kit.by_id(r)["scaling"]["status"] == "passed"




def test_nan_wrong_dtype_wrong_shape_and_mutation_fail(tmp_path):
    answers = {
        "fusion_bytes": "def bias_gelu_bytes(M, N, dtype_bytes, fused):\n    return float('nan')\n",
        "copy_2d": kit.solution_with(L2, "copy_2d", "grid = (triton.cdiv(M, BLOCK_M)",
                                        "out = torch.empty((M, N), dtype=torch.float64, device=src.device)\n"
                                        "    grid = (triton.cdiv(M, BLOCK_M)"),
        "vector_add": kit.solution_with(L2, "vector_add", "    return out\n",
                                        "    x.add_(1.0)\n    return out\n"),
        "bias_gelu": kit.solution_with(L2, "bias_gelu", "    return out\n", "    return out.view(-1)\n"),
    }
    r = run(tmp_path, kit.submission(L2, answers))
    e = kit.by_id(r)
    assert e["fusion_bytes"]["status"] == "failed" and "nan" in e["fusion_bytes"]["message"]
    assert e["copy_2d"]["status"] in ("failed", "error") and e["copy_2d"]["score"] == 0
    assert e["vector_add"]["status"] == "failed" and "modified" in e["vector_add"]["message"]
    assert e["bias_gelu"]["status"] == "failed" and e["bias_gelu"]["score"] == 0
    assert r["score"] == 0


def test_pytorch_op_instead_of_the_kernel_earns_nothing(tmp_path):
    cheat = ("import torch.nn.functional as F\n"
             "def bias_gelu(x, bias, approximate='none', out=None):\n"
             "    res = F.gelu(x.float() + bias.float(), approximate=approximate).to(x.dtype)\n"
             "    return res if out is None else out.copy_(res)\n")
    r = run(tmp_path, kit.submission(L2, {"bias_gelu": cheat}))
    e = kit.by_id(r)["bias_gelu"]
    assert e["status"] == "failed" and e["score"] == 0 and "no Triton kernel" in e["message"]


def test_megabytes_of_output_are_capped(tmp_path):
    noisy = "print('x' * 5_000_000)\n" + kit.source(kit.load("solutions", L1), "scaling")
    r = run(tmp_path, kit.submission(L1, {"scaling": noisy}))
    assert kit.by_id(r)["scaling"]["status"] == "passed"
    assert len(r["learner_output"]) <= 4000 and len(json.dumps(r)) < 20_000


def test_corrupt_json_is_invalid_with_a_clear_message(tmp_path):
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [ {"cell_type": "code", ')
    r = grade(path, lab=L1)
    assert r["status"] == "invalid" and "not valid JSON" in r["message"] and r["score"] == 0


def test_another_labs_notebook_is_invalid(tmp_path):
    r = run(tmp_path, kit.submission(L1, solved=ALL1), lab=L2)
    assert r["status"] == "invalid" and "lab 01_performance_model, not 02_triton_basics" in r["message"]


def test_a_random_notebook_is_invalid(tmp_path):
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "a", "metadata": {}, "source": "print(1)", "outputs": [], "execution_count": None}]}
    r = run(tmp_path, nb)
    assert r["status"] == "invalid" and "not a GPU Systems Lab notebook" in r["message"]


def test_cli_writes_reports_and_never_prints_a_traceback(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_bytes(b"\x00\x01 not a notebook")
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(bad), "--lab", L1, "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["status"] == "invalid"
    assert (tmp_path / "o" / "feedback.md").exists() and (tmp_path / "o" / "junit.xml").exists()


def test_cli_fail_under(tmp_path):
    nb = kit.write(kit.submission(L1, solved=("roofline",)), tmp_path / "half.ipynb")
    args = [sys.executable, "-m", "grader", "grade", str(nb), "--out", str(tmp_path / "o"), "--seed", "3",
            "--no-notebook-run"]
    assert subprocess.run(args, cwd=ROOT, capture_output=True).returncode == 0
    proc = subprocess.run(args + ["--fail-under", "50"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "roofline" in proc.stdout
    junit = (tmp_path / "o" / "junit.xml").read_text()
    assert 'tests="4"' in junit and "<skipped" in junit
