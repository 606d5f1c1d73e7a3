"""Gradescope: results.json follows Gradescope's documented format, and the bundle grades a submission laid
out as Gradescope lays it out (setup.sh skipped: the test's own Python stands in for its venv)."""
import json
import os
import subprocess
import sys
import zipfile

import pytest

from grader.gradescope import find_notebook, results_json
from tests import graderkit as kit
from tests.conftest import ROOT, scaled

L1 = "01_performance_model"
# https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output format")
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
TOP = {"score": (int, float), "execution_time": (int, float), "output": str, "output_format": str,
       "test_output_format": str, "test_name_format": str, "visibility": str, "stdout_visibility": str,
       "extra_data": dict, "tests": list, "leaderboard": list}
TEST = {"score": (int, float), "max_score": (int, float), "status": str, "name": str, "name_format": str,
        "number": str, "output": str, "output_format": str, "tags": list, "visibility": str, "extra_data": dict}


def gradescope_problems(results) -> list[str]:
    """What in ``results`` breaks Gradescope's documented results.json format (empty: nothing)."""
    if not isinstance(results, dict):
        return ["results.json must hold a JSON object"]
    problems = []

    def check(obj, fields, where):
        for key, value in obj.items():
            if key not in fields:
                problems.append(f"{where}: unknown field {key!r}")
            elif not isinstance(value, fields[key]) or isinstance(value, bool):
                problems.append(f"{where}: {key} has type {type(value).__name__}")
        for key in ("visibility", "stdout_visibility"):
            if key in obj and obj[key] not in VISIBILITY:
                problems.append(f"{where}: {key} {obj[key]!r} is not one of {sorted(VISIBILITY)}")
        for key in ("output_format", "test_output_format", "test_name_format", "name_format"):
            if key in obj and obj[key] not in FORMATS:
                problems.append(f"{where}: {key} {obj[key]!r} is not one of {sorted(FORMATS)}")
        if obj.get("status", "passed") not in ("passed", "failed"):
            problems.append(f"{where}: status {obj['status']!r} is not passed or failed")

    check(results, TOP, "results")
    tests = results.get("tests", [])
    for i, test in enumerate(tests if isinstance(tests, list) else []):
        if isinstance(test, dict):
            check(test, TEST, f"tests[{i}]")
        else:
            problems.append(f"tests[{i}] is not an object")
    if "score" not in results and not all(isinstance(t, dict) and "score" in t for t in tests):
        problems.append("score is required at the top level unless every test has one")
    return problems


def result(exercises, status="graded", **extra):
    return {"schema": 1, "lab": L1, "submission": "a.ipynb", "status": status, "score": sum(e["score"] for e in
            exercises), "max_score": sum(e["points"] for e in exercises), "device": "cpu", "duration_s": 3.6,
            "exercises": exercises, **extra}


PARTIAL = {"id": "scaling", "points": 2.0, "score": 0.5, "status": "failed",
           "message": "3/12 cases passed. Case 'strong scaling 7': expected 3.1, got 8"}
PASSED = {"id": "costs", "points": 3.0, "score": 3.0, "status": "passed", "message": "all 11 cases passed."}
TODO = {"id": "roofline", "points": 2.0, "score": 0.0, "status": "not_attempted",
        "message": "no answer cell for this exercise in the submission."}


def test_the_validator_finds_what_gradescope_rejects():
    assert gradescope_problems({"score": 1, "tests": []}) == []
    bad = {"score": "10", "visibility": "public", "tests": [{"name": "x", "status": "ok", "visibility": "later"}],
           "colour": 1}
    assert sorted(gradescope_problems(bad)) == sorted([
        "results: score has type str", "results: visibility 'public' is not one of "
        "['after_due_date', 'after_published', 'hidden', 'visible']", "results: unknown field 'colour'",
        "tests[0]: visibility 'later' is not one of ['after_due_date', 'after_published', 'hidden', 'visible']",
        "tests[0]: status 'ok' is not passed or failed"])
    assert gradescope_problems({"tests": [{"name": "x"}]}) == [
        "score is required at the top level unless every test has one"]


def test_one_test_per_exercise_with_the_failing_case_after_the_due_date():
    r = result([PASSED, TODO, PARTIAL], seed=42, timeout_s=20.0, isolation={"mode": "bwrap", "detail": "..."})
    gs = results_json(r, {"costs": "FLOPs and bytes", "scaling": "Amdahl"})
    assert gradescope_problems(gs) == []
    assert gs["score"] == 3.5 and gs["execution_time"] == 4 and gs["stdout_visibility"] == "hidden"
    assert gs["extra_data"]["seed"] == 42 and gs["extra_data"]["isolation"] == "bwrap"
    assert "42" not in json.dumps([gs["output"], gs["tests"]])  # the seed is the instructor's
    names = [t["name"] for t in gs["tests"]]
    assert names == ["FLOPs and bytes (costs)", "roofline", "Amdahl (scaling)", "Amdahl (scaling): first failing case"]
    costs, roofline, scaling, details = gs["tests"]
    assert (costs["score"], costs["max_score"], costs["status"]) == (3.0, 3.0, "passed")
    assert roofline["output"] == "not_attempted: no answer cell for this exercise in the submission."
    assert scaling["visibility"] == "visible" and scaling["score"] == 0.5 and scaling["status"] == "failed"
    assert scaling["output"].startswith("failed: 3/12 cases passed.") and "strong scaling" not in scaling["output"]
    assert "after the due date" in scaling["output"]
    assert details == {"name": "Amdahl (scaling): first failing case", "visibility": "after_due_date",
                       "output": "Case 'strong scaling 7': expected 3.1, got 8"}


def test_details_visible_keeps_the_whole_message_in_one_test():
    gs = results_json(result([PARTIAL]), details="visible")
    assert gradescope_problems(gs) == [] and len(gs["tests"]) == 1
    assert gs["tests"][0]["output"] == "failed: " + PARTIAL["message"]
    with pytest.raises(ValueError, match="after_due_date"):
        results_json(result([PARTIAL]), details="later")


def test_an_invalid_submission_scores_zero_with_its_message():
    gs = results_json(result([], status="invalid", message="not a notebook: Expecting value"))
    assert gradescope_problems(gs) == []
    assert gs["score"] == 0.0 and gs["tests"] == [] and gs["output"] == "Not graded: not a notebook: Expecting value"


def test_learner_text_is_sanitized():
    evil = dict(PARTIAL, message="3/12 cases passed. Case 'x': \x1b[2J\ud800 gone")
    gs = results_json(result([evil]), details="visible")
    assert "\x1b" not in gs["tests"][0]["output"] and "\\x1b" in gs["tests"][0]["output"]
    json.dumps(gs).encode("utf-8")  # no lone surrogate left


def test_the_one_notebook_is_found_whatever_its_name(tmp_path):
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "lab-checkpoint.ipynb").write_text("{}")
    assert find_notebook(tmp_path, L1) == (None, f"no notebook (.ipynb) in your submission; upload your "
                                                 f"labs/{L1}.ipynb.")
    (tmp_path / "solution.ipynb").symlink_to(ROOT / "solutions" / f"{L1}.ipynb")  # a link earns nothing
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "My Lab.IPYNB").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    assert find_notebook(tmp_path, L1) == (tmp_path / "sub" / "My Lab.IPYNB", "")
    (tmp_path / "other.ipynb").write_text("{}")
    path, problem = find_notebook(tmp_path, L1)
    assert path is None and problem.startswith("2 notebooks in your submission (other.ipynb, sub/My Lab.IPYNB)")
    (tmp_path / "labs").mkdir()  # a whole repository: the lab's own notebook is the one
    (tmp_path / "labs" / f"{L1}.ipynb").write_text("{}")
    assert find_notebook(tmp_path, L1) == (tmp_path / "labs" / f"{L1}.ipynb", "")


def test_an_unknown_lab_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "gradescope", "--lab", "99_nope", "-o", str(tmp_path / "b")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown lab" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    proc = subprocess.run([sys.executable, "-m", "grader", "gradescope", "--lab", L1, "-o", str(out), "--timeout", "20",
                           "--no-notebook-run"], cwd=ROOT, capture_output=True, text=True, timeout=scaled(60))
    assert proc.returncode == 0, proc.stderr
    assert "set the assignment's points to 10" in proc.stdout
    return out


def run_autograder(bundle, root, files: dict):
    """Lay out ``root`` as Gradescope does (source/, submission/, results/, run_autograder), put ``files``
    ({name: notebook dict or raw text}) in submission/, run the bundle; return results.json and stdout."""
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    (root / "submission").mkdir()
    for name, content in files.items():
        path = root / "submission" / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GRADESCOPE_ROOT=str(root), GPULAB_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=scaled(240))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert gradescope_problems(results) == []
    return results, proc.stdout + proc.stderr


def test_the_bundle_carries_what_grading_needs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "gradescope.json", "pyproject.toml", f"solutions/{L1}.ipynb",
            "grader/grade.py", "gpulab/paths.py"} <= names
    assert not any(n.startswith("solutions/") and n != f"solutions/{L1}.ipynb" for n in names)
    assert not any("__pycache__" in n for n in names)
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    with zipfile.ZipFile(bundle) as zf:
        setup = zf.read("setup.sh").decode()
        config = json.loads(zf.read("gradescope.json"))
    assert "bubblewrap" in setup and "--index-url" in setup and "https://download.pytorch.org/whl/cpu" in setup
    assert config == {"lab": L1, "device": "cpu", "seed": None, "timeout_s": 20.0, "deadline_s": 1200.0,
                      "notebook_run": False, "details": "after_due_date"}
    subprocess.run(["bash", "-n", "/dev/stdin"], input=setup, text=True, check=True)  # it parses


@pytest.mark.slow
def test_full_partial_and_broken_submissions(bundle, tmp_path):
    full, out = run_autograder(bundle, tmp_path / "full", {"Alice Lab.IPYNB": kit.load("solutions", L1)})
    assert full["score"] == 10.0 and [t["score"] for t in full["tests"]] == [3.0, 2.0, 3.0, 2.0]
    assert all(t["status"] == "passed" and t["visibility"] == "visible" for t in full["tests"])
    assert f"seed {full['extra_data']['seed']}" in out  # the instructor's stdout (hidden from learners)

    wrong = kit.solution_with(L1, "scaling", "return 1.0 / ((1.0 - p) + p / n)", "return n")  # a plausible slip
    partial, _ = run_autograder(bundle, tmp_path / "partial", {"lab.ipynb": kit.submission(
        L1, {"scaling": wrong}, solved=("costs",))})
    by_name = {t["name"]: t for t in partial["tests"]}
    assert partial["score"] == 3.0
    assert by_name["FLOPs and bytes of four op families (costs)"]["score"] == 3.0
    assert by_name["Roofline time and bound (roofline)"]["status"] == "failed"
    scaling = by_name["Amdahl and scaling efficiency (scaling)"]
    assert scaling["score"] == 0.0 and scaling["max_score"] == 2.0 and "cases passed." in scaling["output"]
    assert by_name["Amdahl and scaling efficiency (scaling): first failing case"]["visibility"] == "after_due_date"

    broken, out = run_autograder(bundle, tmp_path / "broken", {"lab.ipynb": "{ this is not json"})
    assert broken["score"] == 0.0 and broken["tests"] == [] and broken["output"].startswith("Not graded:")
    assert "Traceback" not in json.dumps(broken) + out


@pytest.mark.slow
def test_no_notebook_or_several_give_a_clear_result(bundle, tmp_path):
    none, out = run_autograder(bundle, tmp_path / "none", {"answers.py": "print(1)"})
    assert none["score"] == 0.0 and f"upload your labs/{L1}.ipynb" in none["output"]
    two, _ = run_autograder(bundle, tmp_path / "two", {"a.ipynb": "{}", "b.IPYNB": "{}"})
    assert two["score"] == 0.0 and "2 notebooks in your submission (a.ipynb, b.IPYNB)" in two["output"]
    assert "Traceback" not in out


def test_a_missing_python_still_leaves_a_valid_result(bundle, tmp_path):
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(tmp_path / "source")
    (tmp_path / "submission").mkdir()
    env = dict(os.environ, GRADESCOPE_ROOT=str(tmp_path), GPULAB_PYTHON=str(tmp_path / "no-venv" / "python"))
    proc = subprocess.run(["bash", str(tmp_path / "source" / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert gradescope_problems(results) == [] and results["score"] == 0.0
    assert "tell your instructor" in results["output"]
