"""platforms/: the GitHub Classroom workflow and the cohort examples (CI matrix, Slurm, Kubernetes) run here as
they would there: each file's own shell lines, with the platform's variables set by the test, on a temporary
repository or cohort; sharded cohorts merge into exactly the gradebook of one unsharded run."""
import base64
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import yaml  # PyYAML comes with JupyterLab (jupyter-events)

from tests import graderkit as kit
from tests.conftest import ROOT, scaled

L1 = "01_performance_model"
PLATFORMS = ROOT / "platforms"
FAST = "--no-notebook-run --timeout 20"  # scores do not depend on the notebook run


def workflow(path) -> dict:
    wf = yaml.safe_load(path.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return wf


def step(steps: list, name: str) -> dict:
    return next(s for s in steps if s.get("name") == name or s.get("id") == name)


def expand(text: str, values: dict) -> str:
    """``text`` with each ``${{ expr }}`` replaced by ``values[expr]`` (every one must be known)."""
    return re.sub(r"\$\{\{\s*(.+?)\s*\}\}", lambda m: str(values[m.group(1)]), text)


def bash(script: str, env: dict, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env={**base, **{k: str(v) for k, v in env.items()}},
                          capture_output=True, text=True, timeout=scaled(timeout))


def classroom_result_module():
    spec = importlib.util.spec_from_file_location("classroom_result",
                                                  PLATFORMS / "github-classroom" / "classroom_result.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- GitHub Classroom ---------------------------------------------------------------------------------------------

def test_the_classroom_workflow_has_what_github_classroom_needs():
    wf = workflow(PLATFORMS / "github-classroom" / "classroom.yml")
    assert wf["name"] == "Autograding Tests" and "push" in wf["on"]
    assert list(wf["jobs"]) == ["run-autograding-tests"]
    steps = wf["jobs"]["run-autograding-tests"]["steps"]
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert [c["with"]["path"] for c in checkouts] == ["submission", "course"]
    assert checkouts[1]["with"]["repository"] == "${{ env.COURSE_REPOSITORY }}"  # the grader is never the learner's
    grade = step(steps, "grade")
    assert grade["run"] == "bash course/platforms/github-classroom/grade_locally.sh"
    reporter = step(steps, "Report the points to GitHub Classroom")
    assert reporter["uses"] == "classroom-resources/autograding-grading-reporter@v1"
    assert reporter["env"] == {"GRADE_RESULTS": "${{ steps.grade.outputs.result }}"}
    assert reporter["with"] == {"runners": "grade"} and reporter["if"] == "${{ !cancelled() }}"
    assert "download.pytorch.org/whl/cpu" in step(steps, "Install the grader (CPU torch, bubblewrap)")["run"]


def test_an_ungraded_submission_still_reports_the_labs_points():
    module = classroom_result_module()
    points = {"costs": 3.0, "roofline": 2.0}
    invalid = {"status": "invalid", "message": "not a notebook", "score": 0.0, "max_score": 0.0, "exercises": []}
    runner = module.runner_result(invalid, points)
    assert runner["status"] == "fail" and runner["max_score"] == 5.0
    assert [(t["name"], t["score"], t["status"]) for t in runner["tests"]] == [("costs", 0.0, "fail"),
                                                                               ("roofline", 0.0, "fail")]
    assert runner["tests"][0]["message"] == "not graded: not a notebook"
    graded = {"status": "graded", "score": 3.0, "max_score": 5.0, "exercises": [
        {"id": "costs", "points": 3.0, "score": 3.0, "status": "passed", "message": "all 11 cases passed."},
        {"id": "roofline", "points": 2.0, "score": 0.0, "status": "failed", "message": "0/4 cases passed. ..."}]}
    assert module.runner_result(graded, points)["status"] == "pass"
    assert module.runner_result(graded, points, fail_under=60)["status"] == "pass"
    assert module.runner_result(graded, points, fail_under=61)["status"] == "fail"


@pytest.mark.slow
def test_the_grade_step_runs_locally_on_a_learner_repository(tmp_path):
    wf = workflow(PLATFORMS / "github-classroom" / "classroom.yml")
    grade = step(wf["jobs"]["run-autograding-tests"]["steps"], "grade")
    notebook = tmp_path / "submission" / wf["env"]["NOTEBOOK"]
    notebook.parent.mkdir(parents=True)
    kit.write(kit.submission(L1, solved=("costs",)), notebook)
    (tmp_path / "course").symlink_to(ROOT)
    env = {k: expand(str(v), {f"env.{n}": val for n, val in wf["env"].items()}) for k, v in grade["env"].items()}
    env = {**wf["env"], **env}  # the workflow's variables reach every step
    env.update(PYTHON=sys.executable, FAIL_UNDER="50", GRADE_ARGS=FAST,
               GITHUB_OUTPUT=tmp_path / "output", GITHUB_STEP_SUMMARY=tmp_path / "summary")
    proc = bash(grade["run"], env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]  # graded, below FAIL_UNDER
    assert (tmp_path / "grades" / "result.json").exists() and "Traceback" not in proc.stderr
    line = (tmp_path / "output").read_text().strip()
    runner = json.loads(base64.b64decode(line.removeprefix("result=")))
    assert runner["version"] == 1 and runner["status"] == "fail" and runner["max_score"] == 10.0
    assert {t["name"]: t["score"] for t in runner["tests"]} == {"costs": 3.0, "roofline": 0.0, "benchmark": 0.0,
                                                                "scaling": 0.0}
    summary = (tmp_path / "summary").read_text()
    assert "**3 / 10** points" in summary and "| ` costs ` | 3 / 3 | passed |" in summary


# --- Cohorts on many machines -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Three submissions (a solution, an untouched lab, a broken file) and their unsharded gradebook."""
    root = tmp_path_factory.mktemp("cohort")
    subs = root / "submissions"
    subs.mkdir()
    kit.write(kit.load("solutions", L1), subs / "student00.ipynb")
    kit.write(kit.submission(L1), subs / "student01.ipynb")
    (subs / "student02.ipynb").write_text("{ this is not json")
    proc = subprocess.run([sys.executable, "-m", "grader", "cohort", str(subs), "--lab", L1, "--out", str(root / "all"),
                           "--seed", "11", *FAST.split()], cwd=ROOT, capture_output=True, text=True,
                          timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return subs, (root / "all" / "gradebook.csv").read_text()


def same_as_unsharded(out, cohort):
    gradebook = (out / "merged" / "gradebook.csv").read_text()
    assert gradebook == cohort[1] and gradebook.count("\n") == 4
    assert sorted(p.name for p in (out / "merged").iterdir() if p.is_dir()) == ["student00", "student01", "student02"]


SHARD_ENV = {"LAB": L1, "SEED": "11", "PYTHON": sys.executable, "GRADE_ARGS": FAST}


def test_merge_refuses_an_unfinished_shard_and_grade_needs_a_seed(tmp_path):
    (tmp_path / "shard-1").mkdir()
    (tmp_path / "shard-1" / "gradebook.csv").write_text("submission,status,total,max_score\n")
    proc = bash("bash platforms/cohort/shard.sh merge 2", {"OUT": tmp_path, "PYTHON": sys.executable}, cwd=ROOT)
    assert proc.returncode == 1 and "shard 2/2 did not finish" in proc.stderr
    proc = bash("bash platforms/cohort/shard.sh grade 1 2", {"OUT": tmp_path, "LAB": L1, "SUBMISSIONS": tmp_path},
                cwd=ROOT)
    assert proc.returncode != 0 and "set SEED to one number for every shard" in proc.stderr
    assert bash("bash platforms/cohort/shard.sh", {}, cwd=ROOT).returncode == 2


@pytest.mark.slow
def test_ci_matrix_shards_merge_into_the_unsharded_gradebook(tmp_path, cohort):
    wf = workflow(PLATFORMS / "ci-matrix" / "grade-cohort.yml")
    jobs = wf["jobs"]
    assert jobs["grade"]["needs"] == "plan" and jobs["merge"]["needs"] == "grade"
    assert jobs["grade"]["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    plan = step(jobs["plan"]["steps"], "plan")
    proc = bash(plan["run"], {"SHARDS": "2", "GITHUB_OUTPUT": tmp_path / "plan"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "plan").read_text().splitlines())
    assert json.loads(outputs["shards"]) == [1, 2] and outputs["seed"].isdigit()

    values = {"inputs.lab": L1, "inputs.submissions": cohort[0], "inputs.shards": "2", "needs.plan.outputs.seed": "11"}
    out = tmp_path / "grades"  # the merge job downloads each shard's artifact into OUT/shard-K, where it was made
    grade = step(jobs["grade"]["steps"], "Grade one shard")
    for shard in (1, 2):
        env = {k: expand(v, {**values, "matrix.shard": shard}) for k, v in grade["env"].items()}
        proc = bash(grade["run"], {**wf["env"], **SHARD_ENV, **env, "OUT": out}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
    merge = step(jobs["merge"]["steps"], "Merge the shards into one gradebook")
    env = {k: expand(v, values) for k, v in merge["env"].items()}
    proc = bash(merge["run"], {**env, "OUT": out, "PYTHON": sys.executable}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same_as_unsharded(out, cohort)


@pytest.mark.slow
def test_slurm_array_tasks_merge_into_the_unsharded_gradebook(tmp_path, cohort):
    script = PLATFORMS / "slurm" / "grade_array.sh"
    env = {**SHARD_ENV, "SUBMISSIONS": cohort[0], "OUT": tmp_path / "grades", "SHARDS": "2"}
    for task in (1, 2):
        proc = bash(f"bash {script}", {**env, "SLURM_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": task}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = bash(f"bash {script}", {**env, "SLURM_JOB_ID": "71", "STEP": "merge"}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same_as_unsharded(tmp_path / "grades", cohort)


def test_slurm_submits_the_array_then_the_merge(tmp_path):
    """Run by hand, grade_array.sh submits itself twice: an array of SHARDS tasks, and the merge after them."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text('#!/bin/sh\necho "$@ SEED=$SEED" >> "$SBATCH_LOG"\n'
                                 'echo $(( $(wc -l < "$SBATCH_LOG") + 100 ))\n')  # job ids 101, 102
    (fake / "sbatch").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "SBATCH_LOG": tmp_path / "log", "SHARDS": "3", "OUT": "/x",
           "SEED": "5"}
    proc = bash(f"bash {PLATFORMS / 'slurm' / 'grade_array.sh'}", env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    array, merge = (tmp_path / "log").read_text().splitlines()
    assert array.startswith("--parsable --array=1-3 --export=ALL ") and array.endswith("grade_array.sh SEED=5")
    assert merge.startswith("--parsable --dependency=afterok:101 --export=ALL,STEP=merge ")
    assert "submitted grading array 101 (3 tasks) and merge job 102" in proc.stdout


@pytest.mark.slow
def test_kubernetes_indexed_pods_merge_into_the_unsharded_gradebook(tmp_path, cohort):
    docs = list(yaml.safe_load_all((PLATFORMS / "kubernetes" / "grade-job.yaml").read_text()))
    grade, merge = (d for d in docs if d["kind"] == "Job")
    assert grade["spec"]["completionMode"] == "Indexed"
    assert grade["metadata"]["labels"] == {"step": "grade"} and merge["metadata"]["labels"] == {"step": "merge"}

    def container(job):
        c = job["spec"]["template"]["spec"]["containers"][0]
        assert c["command"] == ["bash", "-c"] and c["workingDir"] == "/course"
        return c["args"][0], {e["name"]: e["value"] for e in c["env"]}

    run, env = container(grade)
    assert grade["spec"]["completions"] == grade["spec"]["parallelism"] == int(env["SHARDS"])
    assert env["SEED"] == "SEED_VALUE"  # replaced with one secret number when applied (see the file's comment)
    here = {"SUBMISSIONS": cohort[0], "OUT": tmp_path / "grades", "SHARDS": "2", "SEED": "11",
            "PYTHON": sys.executable, "GRADE_ARGS": FAST}
    for index in (0, 1):  # Kubernetes numbers pods from 0, shards count from 1
        proc = bash(run, {**env, **here, "JOB_COMPLETION_INDEX": index}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
    run, env = container(merge)
    proc = bash(run, {**env, **here}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same_as_unsharded(tmp_path / "grades", cohort)
