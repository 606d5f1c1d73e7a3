"""Hostile submissions: each earns exactly what it honestly earned, and nothing ends in a traceback."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from grader.grade import grade
from tests import graderkit as kit
from tests.conftest import ROOT, scaled

L1, L2 = "01_performance_model", "02_triton_basics"
ALL1 = ("costs", "roofline", "benchmark", "scaling")
ALL2 = ("vector_add", "bias_gelu", "copy_2d", "fusion_bytes")


def run(tmp_path, nb, lab=None, name="s.ipynb", **kw):
    kw.setdefault("seed", 11)
    kw.setdefault("notebook_run", False)
    kw.setdefault("timeout_s", scaled(30))  # enough for a right answer on a busy machine
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
    "check modules": ("import gpulab.compare, grader.exercise\n"
                      "gpulab.compare.compare = lambda *a, **k: None\n"
                      "try:  # the checks are not in the sandbox; patch them where they are\n"
                      "    import grader.checks\n"
                      "    for ex in grader.checks.exercises('02_triton_basics').values():\n"
                      "        object.__setattr__(ex, 'judge', lambda case, obs: None)\n"
                      "except ImportError:\n"
                      "    pass\n"
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
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(bad), "--lab", L1,
                           "--out", str(tmp_path / "o")],
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


# --- The sandbox: learner code cannot read, forge, harm or outlive (issue: grader trust) -----------

from grader import sandbox  # noqa: E402

SANDBOXED = pytest.mark.skipif(sandbox.isolation()["mode"] != "bwrap",
                               reason="needs bubblewrap: without it these attacks would harm this machine")


def test_the_sandbox_is_available_where_ci_requires_it():
    """CI (``.ci/run``) installs bubblewrap and sets GPULAB_SANDBOX_TEST=required: no silent skip there."""
    if os.environ.get("GPULAB_SANDBOX_TEST") != "required":
        pytest.skip("GPULAB_SANDBOX_TEST is not 'required' (set by .ci/run)")
    assert sandbox.isolation()["mode"] == "bwrap", sandbox.isolation()["detail"]
COSTS_RIGHT = kit.source(kit.load("solutions", L1), "costs")
COSTS_WRONG = COSTS_RIGHT.replace("return", "return 2 *", 1)


def _survivors(marker: str) -> list[str]:
    """Command lines of processes still alive that carry ``marker``."""
    found = []
    for cmdline in __import__("pathlib").Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text)
    return found


def test_result_records_the_isolation_used(tmp_path):
    r = run(tmp_path, kit.submission(L1, solved=("roofline",)))
    assert r["isolation"]["mode"] == sandbox.isolation()["mode"]
    assert r["isolation"]["limits"]["file_bytes"] == sandbox.FILE_BYTES


@SANDBOXED
def test_solutions_and_checks_are_not_readable(tmp_path):
    steal = ("import json, pathlib\n"
             f"nb = json.loads(pathlib.Path({str(ROOT / 'solutions' / (L1 + '.ipynb'))!r}).read_text())\n"
             "exec(''.join(c['source']) for c in nb['cells']\n"
             "     if c.get('metadata', {}).get('gpulab', {}).get('exercise') == 'costs')\n")
    reference = "from grader.checks import load_lab\nglobals().update(vars(load_lab('01_performance_model')))\n"
    r = run(tmp_path, kit.submission(L1, {"costs": steal, "scaling": reference}))
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and "No such file" in e["costs"]["message"]
    assert e["scaling"]["status"] == "error" and "No module named 'grader.checks'" in e["scaling"]["message"]
    assert r["score"] == 0


FORGE_FRAMES = ("import os, struct, torch, io\n"
                "def frame(kind, payload):\n"
                "    return struct.pack('>cQ', kind, len(payload)) + payload\n"
                "fake = io.BytesIO(); torch.save([{'status': 'ok', 'obs': {}}] * 50, fake)\n"
                "for fd in range(3, 40):\n"
                "    for data in (frame(b'O', b'roofline\\0' + fake.getvalue()), frame(b'M', b'done')):\n"
                "        try:\n"
                "            os.write(fd, data)\n"
                "        except OSError:\n"
                "            pass\n"
                "for name in ('roofline.pt', 'costs.pt', 'done', 'progress', '../roofline.pt'):\n"
                "    try:\n"
                "        torch.save([{'status': 'ok', 'obs': {}}] * 50, name)\n"
                "    except OSError:\n"
                "        pass\n")


def test_forged_observations_and_done_markers_earn_nothing(tmp_path):
    r = run(tmp_path, kit.submission(L1, {"costs": FORGE_FRAMES + COSTS_WRONG}, solved=("scaling",)))
    e = kit.by_id(r)
    assert e["costs"]["status"] == "failed" and e["costs"]["score"] == 0
    assert e["roofline"]["status"] == "not_attempted" and e["roofline"]["score"] == 0
    assert e["scaling"]["status"] == "passed" and r["score"] == 2


def test_an_import_hook_planted_by_an_answer_does_not_reach_the_harness(tmp_path):
    hook = ("import sys, types, importlib.abc, importlib.machinery\n"
            "class Evil(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.startswith(('grader', 'gpulab')):\n"
            "            return importlib.machinery.ModuleSpec(name, self)\n"
            "    def create_module(self, spec):\n"
            "        return None\n"
            "    def exec_module(self, module):\n"
            "        module.judge_case = module.compare = module.run_case = lambda *a, **k: None\n"
            "sys.meta_path.insert(0, Evil())\n"
            "for name in [m for m in sys.modules if m.startswith(('grader', 'gpulab'))]:\n"
            "    del sys.modules[name]\n")
    wrong = kit.solution_with(L2, "vector_add", "x + y, mask=mask", "x - y, mask=mask")
    r = run(tmp_path, kit.submission(L2, {"vector_add": hook + wrong}))
    e = kit.by_id(r)["vector_add"]
    assert e["status"] == "failed" and e["score"] == 0


@SANDBOXED
def test_grader_sources_cannot_be_rewritten(tmp_path):
    target = ROOT / "grader" / "report.py"
    before = target.read_bytes()
    write = (f"open({str(target)!r}, 'a').write('\\nraise SystemExit(\"pwned\")\\n')\n")
    r = run(tmp_path, kit.submission(L1, {"costs": write + COSTS_RIGHT}, solved=("scaling",)))
    assert target.read_bytes() == before
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and e["costs"]["score"] == 0
    assert "Permission denied" in e["costs"]["message"] or "Read-only file system" in e["costs"]["message"]
    assert e["scaling"]["status"] == "passed"


@SANDBOXED
def test_no_process_outlives_grading_and_results_stay_untouched(tmp_path):
    out = tmp_path / "out"
    marker = f"gpulab-orphan-{tmp_path.name}"
    spawn = ("import subprocess, os\n"
             f"target = {str(out / 'result.json')!r}\n"
             "for i in range(50):\n"
             f"    subprocess.Popen(['sh', '-c', 'sleep 4; echo pwned > ' + target + '; sleep 60 # {marker}'],\n"
             "                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
             "if os.fork() == 0:\n"
             "    os.setsid()\n"
             "    if os.fork() == 0:\n"
             f"        os.execvp('sleep', ['sleep', '60', '{marker}'])\n"
             "    os._exit(0)\n")
    from grader.grade import grade_to_dir

    nb = kit.write(kit.submission(L1, {"costs": spawn + COSTS_RIGHT}), tmp_path / "s.ipynb")
    r = grade_to_dir(nb, out, seed=3, notebook_run=False, timeout_s=30)
    assert kit.by_id(r)["costs"]["status"] == "passed"
    time.sleep(5)
    assert _survivors(marker) == []
    assert json.loads((out / "result.json").read_text())["score"] == 3


@SANDBOXED
@pytest.mark.parametrize("kill", ["os.kill(os.getppid(), signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)",
                                  "os.killpg(0, signal.SIGKILL)"])
def test_killing_the_judge_or_peers_costs_only_the_exercise(tmp_path, kill):
    code = f"import os, signal\n{kill}\n" + COSTS_RIGHT
    r = run(tmp_path, kit.submission(L1, {"costs": code}, solved=("scaling",)))
    e = kit.by_id(r)
    assert e["costs"]["score"] == 0 and e["costs"]["status"] in ("crashed", "error")
    assert e["scaling"]["status"] == "passed" and r["score"] == 2


@SANDBOXED
def test_the_instructors_environment_is_not_visible(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_INSTRUCTOR_TOKEN", "tok-s3cr3t-42")
    leak = "import os\nprint(dict(os.environ))\nraise ValueError(repr(dict(os.environ)))\n"
    r = run(tmp_path, kit.submission(L1, {"costs": leak}))
    assert "tok-s3cr3t-42" not in json.dumps(r)
    assert kit.by_id(r)["costs"]["status"] == "error"


def test_a_fifo_named_like_an_observation_does_not_block_the_judge(tmp_path):
    fifo = ("import os\n"
            "for name in ('costs.pt', 'roofline.pt', 'progress', 'done', 'output.txt'):\n"
            "    try:\n"
            "        os.mkfifo(name)\n"
            "    except OSError:\n"
            "        pass\n")
    start = time.perf_counter()
    r = run(tmp_path, kit.submission(L1, {"costs": fifo + COSTS_RIGHT}), timeout_s=10)
    assert time.perf_counter() - start < 60
    assert kit.by_id(r)["costs"]["status"] == "passed" and r["score"] == 3


def test_spamming_progress_markers_cannot_outlive_the_deadline(tmp_path):
    spam = ("import os, struct, threading, time\n"
            "def spam():\n"
            "    while True:\n"
            "        for text in (b'setup', b'exec costs', b'run costs', b'exec roofline', b'run roofline'):\n"
            "            for fd in range(3, 20):\n"
            "                try:\n"
            "                    os.write(fd, struct.pack('>cQ', b'M', len(text)) + text)\n"
            "                except OSError:\n"
            "                    pass\n"
            "        time.sleep(0.2)\n"
            "threading.Thread(target=spam, daemon=True).start()\n"
            + COSTS_RIGHT +
            "\ndef elementwise_cost(*a, **k):\n"
            "    while True:\n"
            "        time.sleep(0.01)\n")
    start = time.perf_counter()
    r = run(tmp_path, kit.submission(L1, {"costs": spam}, solved=("scaling",)), timeout_s=3)
    assert time.perf_counter() - start < 60
    e = kit.by_id(r)
    assert e["costs"]["score"] == 0 and e["costs"]["status"] == "timeout"
    assert e["scaling"]["status"] == "passed"  # frames without the worker's nonce are ignored


@SANDBOXED
@pytest.mark.parametrize("hog, words", [
    ("blob = bytearray(40 << 30)", "MemoryError"),
    ("open('big.bin', 'wb').write(b'x' * (600 << 20))", "File too large"),
    ("[open(f'f{i}.bin', 'wb').write(b'x' * (200 << 20)) for i in range(8)]", "No space left"),
])
def test_memory_and_disk_are_bounded(tmp_path, hog, words):
    r = run(tmp_path, kit.submission(L1, {"costs": hog + "\n" + COSTS_RIGHT}, solved=("scaling",)))
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and words in e["costs"]["message"] and e["costs"]["score"] == 0
    assert e["scaling"]["status"] == "passed"


@SANDBOXED
def test_a_fork_bomb_is_bounded_and_leaves_no_process(tmp_path):
    marker = f"gpulab-bomb-{tmp_path.name}"
    bomb = ("import os\n"
            "n = 0\n"
            "try:\n"
            "    while n < 100_000:\n"
            "        if os.fork() == 0:\n"
            f"            os.execvp('sleep', ['sleep', '120', '{marker}'])\n"
            "        n += 1\n"
            "except OSError as exc:\n"
            "    raise RuntimeError(f'fork failed after {n} processes') from exc\n")
    start = time.perf_counter()
    # The process limit must stop the bomb before the exercise's timeout does; a busy machine forks slowly.
    r = run(tmp_path, kit.submission(L1, {"costs": bomb}, solved=("scaling",)), timeout_s=scaled(20))
    assert time.perf_counter() - start < scaled(120)
    e = kit.by_id(r)
    assert e["costs"]["score"] == 0 and "fork failed after" in e["costs"]["message"]
    assert e["scaling"]["status"] == "passed"
    assert _survivors(marker) == []


HEAP_CORRUPTION = ("import ctypes\n"
                   "_victims = [bytearray(64) for _ in range(1000)]\n"
                   "def amdahl_speedup(p, n):\n"
                   "    for v in _victims[::7]:  # scribble over object headers: the crash comes later, or not\n"
                   "        ctypes.memset(id(v) - 64, 0xff, 256)\n"
                   "    return 1.0 / ((1.0 - p) + p / n)\n"
                   "def strong_scaling_efficiency(t1, tn, n):\n"
                   "    return t1 / (n * tn)\n"
                   "def weak_scaling_efficiency(t1, tn):\n"
                   "    return t1 / tn\n")


def test_three_gradings_give_identical_exercise_lists(tmp_path):
    """Heap corruption, a crash and honest answers: the same statuses and scores every time."""
    answers = {"scaling": HEAP_CORRUPTION,
               "roofline": kit.solution_with(L1, "roofline", "return", "import os; os._exit(3)\n    return", )}
    nb = kit.submission(L1, answers, solved=("benchmark",))
    lists = [run(tmp_path, nb, name=f"s{i}.ipynb", seed=7)["exercises"] for i in range(3)]
    assert all(lst == lists[0] for lst in lists)
    statuses = {e["id"]: e["status"] for e in lists[0]}
    assert statuses["benchmark"] == "passed" and statuses["roofline"] == "crashed"


@pytest.fixture
def no_sandbox(monkeypatch):
    monkeypatch.setenv("GPULAB_SANDBOX", "off")
    sandbox.isolation.cache_clear()
    yield
    monkeypatch.undo()
    sandbox.isolation.cache_clear()


def test_without_bubblewrap_grading_works_and_says_so(tmp_path, no_sandbox, capsys):
    r = run(tmp_path, kit.submission(L1, solved=("roofline",)))
    assert r["score"] == 2 and r["isolation"]["mode"] == "none"
    assert "weak isolation" in capsys.readouterr().err


def test_vector_add_without_masks_grades_the_same_five_times(tmp_path):
    """The measured case: no masks at the default BLOCK=1024 once scored 0/8 or 1/8 at random."""
    no_mask = (kit.source(kit.load("solutions", L2), "vector_add")
               .replace("x_ptr + offs, mask=mask", "x_ptr + offs").replace("y_ptr + offs, mask=mask", "y_ptr + offs")
               .replace("x + y, mask=mask", "x + y"))
    assert "mask=mask" not in no_mask
    nb = kit.submission(L2, {"vector_add": no_mask}, solved=("fusion_bytes",))
    lists = [run(tmp_path, nb, name=f"m{i}.ipynb", seed=5)["exercises"] for i in range(5)]
    assert all(lst == lists[0] for lst in lists)
    e = {x["id"]: x for x in lists[0]}
    assert e["vector_add"]["status"] == "failed" and e["vector_add"]["score"] < 2
    assert "mask" in e["vector_add"]["message"] or "out of bounds" in e["vector_add"]["message"]
    assert e["fusion_bytes"]["status"] == "passed"


@SANDBOXED
def test_a_cohort_survives_a_submission_that_attacks_its_peers(tmp_path):
    """One submission kills what it can, spawns orphans aimed at the gradebook and a peer's result:
    every other result stands, the gradebook is whole, nothing survives the run."""
    from grader.cohort import cohort

    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    marker = f"gpulab-cohort-{tmp_path.name}"
    attack = ("import os, signal, subprocess\n"
              f"for target in ({str(out / 'gradebook.csv')!r}, {str(out / 'honest' / 'result.json')!r}):\n"
              f"    subprocess.Popen(['sh', '-c', 'sleep 3; echo pwned > ' + target + '; sleep 60 # {marker}'],\n"
              "                     start_new_session=True)\n"
              "for pid in range(2, 400):\n"
              "    try:\n"
              "        os.kill(pid, signal.SIGKILL) if pid != os.getpid() else None\n"
              "    except OSError:\n"
              "        pass\n")
    kit.write(kit.submission(L1, {"costs": attack + COSTS_RIGHT}), folder / "attacker.ipynb")
    kit.write(kit.submission(L1, solved=("costs", "scaling")), folder / "honest.ipynb")
    results = cohort(folder, L1, out, jobs=2, progress=False, seed=3, notebook_run=False, timeout_s=30)
    time.sleep(4)
    assert _survivors(marker) == []
    assert {r["submission"]: r["score"] for r in results}["honest.ipynb"] == 5
    assert json.loads((out / "honest" / "result.json").read_text())["score"] == 5
    book = (out / "gradebook.csv").read_text()
    assert "pwned" not in book and "honest.ipynb" in book and "attacker.ipynb" in book


# --- Found by red-teaming the sandboxed grader ---------------------------------------------------

FORGE_PASSED = ("import os, io, struct, sys, torch\n"
                "def _frame(k, p):\n"
                "    os.write(3, struct.pack('>cQ', k, len(p)) + p)\n"
                "def _forge():\n"
                "    f = sys._getframe()\n"
                "    while f and 'job' not in f.f_locals:\n"
                "        f = f.f_back\n"
                "    job = f.f_locals['job']\n"
                "    for i, e in enumerate(job['run']):\n"
                "        if i:\n"
                "            _frame(b'M', f'run {e}'.encode())\n"
                "        b = io.BytesIO(); torch.save([{'status': 'passed'}] * len(job['cases'][e]), b)\n"
                "        _frame(b'O', e.encode() + b'\\0' + b.getvalue())\n"
                "    _frame(b'M', b'done'); os._exit(0)\n"
                "def elementwise_cost(*a, **k):\n"
                "    _forge()\n"
                "softmax_cost = matmul_cost = attention_cost = elementwise_cost\n")


def test_observations_forged_as_passed_earn_nothing(tmp_path):
    nb = kit.submission(L1, {"costs": FORGE_PASSED, "roofline": "pass", "benchmark": "pass", "scaling": "pass"})
    r = run(tmp_path, nb)
    assert r["score"] == 0
    assert all(e["status"] in ("error", "failed", "not_attempted", "crashed") for e in r["exercises"])


def test_a_shared_reference_bomb_is_rejected_quickly(tmp_path):
    bomb = ("def _dag(d):\n"
            "    x = [0]\n"
            "    for _ in range(d):\n"
            "        x = [x, x]\n"
            "    return x\n"
            "def elementwise_cost(*a, **k):\n"
            "    return (_dag(40), 0)\n"
            "softmax_cost = matmul_cost = attention_cost = elementwise_cost\n")
    start = time.perf_counter()
    r = run(tmp_path, kit.submission(L1, {"costs": bomb}, solved=("scaling",)))
    assert time.perf_counter() - start < 60
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and "too large" in e["costs"]["message"] and e["costs"]["score"] == 0
    assert e["scaling"]["status"] == "passed"


def test_a_flood_of_output_frames_is_capped(tmp_path):
    flood = ("import os, struct\n"
             "def elementwise_cost(*a, **k):\n"
             "    if not globals().get('_done'):\n"
             "        globals()['_done'] = 1\n"
             "        chunk = struct.pack('>cQ', b'T', 256 * 1024) + b'A' * (256 * 1024)\n"
             "        for _ in range(1000):\n"
             "            os.write(3, chunk)\n"
             "    return (0, 0)\n"
             "softmax_cost = matmul_cost = attention_cost = elementwise_cost\n")
    r = run(tmp_path, kit.submission(L1, {"costs": flood}, solved=("scaling",)))
    assert kit.by_id(r)["costs"]["score"] == 0 and kit.by_id(r)["scaling"]["status"] == "passed"
    assert len(r["learner_output"]) <= 4000


def test_a_profile_hook_planted_by_one_answer_does_not_crash_another(tmp_path):
    hook = ("import sys, os\n"
            "sys.setprofile(lambda fr, ev, arg: os._exit(1) if 'scaling' in fr.f_code.co_name else None)\n")
    r = run(tmp_path, kit.submission(L1, {"costs": hook + COSTS_WRONG}, solved=("scaling",)))
    e = kit.by_id(r)
    assert e["scaling"]["status"] == "passed" and e["costs"]["score"] == 0


@SANDBOXED
def test_children_share_one_memory_cap(tmp_path):
    """RLIMIT_AS is per process: four children of 3 GiB each would take 12 GiB without the group."""
    if sandbox.limits_summary("cpu")["control_group"] is None:
        pytest.skip("this machine lets the grader make no control group")
    hog = ("import subprocess, sys\n"
           "procs = [subprocess.Popen([sys.executable, '-c', \"b = b'1' * (3 << 30); import time; time.sleep(3)\"])\n"
           "         for _ in range(4)]\n"
           "raise RuntimeError(f'children exited with {[p.wait() for p in procs]}')\n")
    # 90 s: on a busy machine the kernel may reclaim for a while before the group's OOM kill comes
    r = run(tmp_path, kit.submission(L1, {"costs": hog}, solved=("scaling",)), timeout_s=90)
    e = kit.by_id(r)
    assert e["costs"]["score"] == 0 and "-9" in e["costs"]["message"], e["costs"]["message"]
    assert e["scaling"]["status"] == "passed"
    assert r["isolation"]["limits"]["worker_memory_bytes"] == sandbox.WORKER_MEMORY


@SANDBOXED
def test_the_tmpfs_comes_before_every_bind():
    """A project cloned under /tmp must stay visible in the box (the tmpfs once hid it)."""
    launch = sandbox.wrap(["python"], device="cpu", cpu_seconds=10)
    launch.cleanup()  # nothing was started: remove its control group
    command = launch.command
    tmpfs = command.index("--tmpfs")
    assert command[tmpfs + 1] == "/tmp"
    assert all(i > tmpfs for i, arg in enumerate(command) if arg in ("--ro-bind", "--bind", "--dev-bind"))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs a root grader and setpriv")
def test_without_bubblewrap_a_root_grader_still_drops_the_worker_to_its_own_user(tmp_path, no_sandbox):
    """A container that forbids namespaces (Gradescope's) grades with no box: the worker still runs as an
    unprivileged user id, so a file only root may read (the instructor's solutions) is out of its reach."""
    secret = tmp_path / "solution.ipynb"
    secret.write_text("the answer")
    secret.chmod(0o600)
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    probe = ("import os, sys\nprint(os.getuid())\ntry:\n    print(open(sys.argv[1]).read())\n"
             "except PermissionError:\n    print('denied')\nopen('written', 'w').write('ok')")
    launch = sandbox.wrap([sys.executable, "-c", probe, str(secret)], device="cpu", cpu_seconds=30, cwd_outside=work)
    try:
        done = subprocess.run(launch.command, cwd=launch.cwd, env=launch.env, preexec_fn=launch.preexec,
                              capture_output=True, text=True, timeout=60)
    finally:
        launch.cleanup()
    uid, verdict = done.stdout.split()[:2]
    assert int(uid) != 0 and verdict == "denied", done.stdout + done.stderr
    assert (work / "written").read_text() == "ok"  # its scratch folder stays writable
    assert "unprivileged user id" in sandbox.isolation()["detail"]
