"""The judge's limits: a deadline per submission, finished cells not re-run, a CPU share per worker,
a budget for what comes back from the box, a minimal environment for bubblewrap, the NVIDIA device
nodes only on CUDA, and learner text that never becomes Markdown, HTML or a formula."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader import grade as grading
from grader import sandbox
from grader.checks import exercises
from grader.grade import grade
from tests import graderkit as kit

L1 = "01_performance_model"
COSTS_RIGHT = kit.source(kit.load("solutions", L1), "costs")
SANDBOXED = pytest.mark.skipif(sandbox.isolation()["mode"] != "bwrap", reason="needs bubblewrap")


def run(tmp_path, nb, name="s.ipynb", **kw):
    kw.setdefault("seed", 11)
    kw.setdefault("notebook_run", False)
    kw.setdefault("timeout_s", 30)
    return grade(kit.write(nb, tmp_path / name), lab=L1, **kw)


# --- A deadline per submission; finished cells are not paid for again ---------------------------

ENTRIES = {eid: ex.entries for eid, ex in exercises(L1).items()}
SLEEPER_CELL = "import time\ntime.sleep({nap})\n"
# every function hangs, using no CPU
SLEEPER_ANSWERS = {eid: "".join(f"def {name}(*a, **k):\n    time.sleep(10 ** 6)\n" for name in names)
                   for eid, names in ENTRIES.items()}


def sleeper(nap: float) -> dict:
    """Lab 01 answers whose every cell sleeps ``nap`` seconds (just under the timeout) and whose every
    function hangs."""
    return kit.submission(L1, {eid: SLEEPER_CELL.format(nap=nap) + src for eid, src in SLEEPER_ANSWERS.items()})


@pytest.mark.slow
def test_a_sleeping_hanging_submission_ends_at_its_deadline_and_its_peer_keeps_full_marks(tmp_path):
    """Without the deadline this costs about n * (n * t + t) (lab 01 at t = 4 s: about 75 s; fewer since
    finished cells are not re-run, still about a minute, past the 45 s deadline). The honest peer has the same
    deadline."""
    from grader.cohort import cohort

    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    kit.write(sleeper(3.5), folder / "sleeper.ipynb")
    kit.write(kit.load("solutions", L1), folder / "honest.ipynb")
    deadline = 45
    results = cohort(folder, L1, out, jobs=2, progress=False, seed=3, notebook_run=False, timeout_s=4,
                     deadline_s=deadline)
    by_name = {r["submission"]: r for r in results}
    assert by_name["honest.ipynb"]["score"] == by_name["honest.ipynb"]["max_score"] == 10
    slow = by_name["sleeper.ipynb"]
    # the deadline is checked every 0.1 s; then one kill, one clean-up and the verdicts
    assert slow["duration_s"] < deadline + 15, slow["duration_s"]
    assert slow["score"] == 0 and {e["status"] for e in slow["exercises"]} == {"timeout"}
    assert any("deadline" in e["message"] for e in slow["exercises"])
    assert json.loads((out / "sleeper" / "result.json").read_text())["deadline_s"] == deadline


def test_the_notebook_run_fits_in_what_is_left_of_the_deadline():
    solution = grading.read_notebook(grading.solution_path(L1))
    cells = sum(1 for c in solution.cells if c.get("cell_type") == "code")
    assert grading._notebook_timeout(solution, 60, 10_000) == 60
    shortened = grading._notebook_timeout(solution, 60, 70)
    assert shortened is not None and 60 + shortened * cells / 4 <= 70
    assert grading._notebook_timeout(solution, 60, 30) is None


def test_a_submission_past_its_deadline_runs_nothing_more(tmp_path):
    r = run(tmp_path, kit.submission(L1, solved=("costs", "roofline")), deadline_s=0, notebook_run=True)
    e = kit.by_id(r)
    assert e["costs"]["status"] == "timeout" and "deadline" in e["costs"]["message"] and r["score"] == 0
    assert r["notebook_run"]["status"] == "skipped" and "deadline" in r["notebook_run"]["error"]


CELLS = {
    "a": "import math\ndef helper(x):\n    return math.sqrt(x)\n",
    "b": "import time\ntime.sleep(50)\ndef b():\n    pass\n",
    "c": "def c(x):\n    return helper(x)\n",
    "d": "from os.path import *\n",
    "e": "import time\ndef e():\n    return time.time()\n",
}


def test_a_fresh_worker_runs_only_the_cells_the_remaining_exercises_need():
    order = list(CELLS)
    # c uses a's helper; d may define anything; b is slow and nobody uses it; e imports time itself
    assert grading.cells_to_run(order, CELLS, ["c", "e"], set()) == ["a", "c", "d", "e"]
    assert grading.cells_to_run(order, CELLS, ["e"], {"d"}) == ["e"]
    assert grading.cells_to_run(order, CELLS, order, set()) == order
    assert grading.cells_to_run(order, {**CELLS, "a": "def helper(:"}, ["c"], set()) == ["c", "d"]


def test_finished_cells_are_not_re_run_after_a_hang(tmp_path, monkeypatch):
    """Each worker hangs in its first exercise: the next one re-runs no finished exercise's cell."""
    plans, jobs = [], []

    def hanging_worker(job, plan, runs, *args):
        import pickle

        plans.append(plan)
        jobs.append(pickle.loads(job))
        return grading.WorkerRun(how="timeout", marker=f"run {runs[0]}")

    monkeypatch.setattr(grading, "_run_worker", hanging_worker)
    answers = {eid: SLEEPER_CELL.format(nap=1) + src for eid, src in SLEEPER_ANSWERS.items()}
    r = run(tmp_path, kit.submission(L1, answers))
    assert [len(p) for p in plans] == [1 + 4 + 4, 1 + 3 + 3, 1 + 2 + 2, 1 + 1 + 1]
    assert plans[1] == ["setup", "exec roofline", "exec benchmark", "exec scaling", "run roofline",
                        "run benchmark", "run scaling"]
    assert {e["status"] for e in r["exercises"]} == {"timeout"}
    assert jobs[0]["seeds"] == jobs[3]["seeds"] == {n: grading.exercise_seed(11, n)
                                                    for n in ["setup", "costs", "roofline", "benchmark", "scaling"]}


# --- Deterministic regrades ------------------------------------------------------------------------

COIN_FLIPS = ("import random\nimport numpy as np\nimport torch\n"
              + COSTS_RIGHT.replace("def elementwise_cost(", "def _right_elementwise_cost(") +
              "\ndef elementwise_cost(*args, **kwargs):\n"
              "    flips = random.random() + float(np.random.rand()) + float(torch.rand(()))\n"
              "    right = _right_elementwise_cost(*args, **kwargs)\n"
              "    return right if flips < 1.5 else tuple(2 * v for v in right)\n")
# Another answer cell draws as often as the operating system says: a different number each run (the
# lab's setup seeds the generators once; what an exercise draws then depends on what ran before it).
DRAWS_SOME = ("import os, random\nimport numpy as np\nimport torch\n"
              "for _ in range(os.urandom(1)[0] + 1):\n"
              "    random.random(), np.random.rand(), torch.rand(())\n")


def test_exercise_seeds_are_stable_distinct_and_do_not_reveal_the_run_seed():
    assert grading.exercise_seed(7, "costs") == grading.exercise_seed(7, "costs")
    seeds = {grading.exercise_seed(s, e) for s in (7, 8) for e in ("setup", "costs", "scaling")}
    assert len(seeds) == 6 and all(0 <= s < 2**31 for s in seeds) and 7 not in seeds


@pytest.mark.slow
def test_three_grades_with_one_seed_give_identical_exercises_and_record_the_seed(tmp_path):
    """An answer that draws from random, NumPy and torch without seeding them grades the same, however
    much another answer cell drew before it."""
    assert "def elementwise_cost(" in COSTS_RIGHT
    from grader.grade import grade_to_dir

    scaling = DRAWS_SOME + kit.source(kit.load("solutions", L1), "scaling")
    nb = kit.write(kit.submission(L1, {"costs": COIN_FLIPS, "scaling": scaling}), tmp_path / "s.ipynb")
    results = [grade_to_dir(nb, tmp_path / f"out{i}", seed=7, notebook_run=False, timeout_s=30) for i in range(3)]
    assert all(r["exercises"] == results[0]["exercises"] for r in results)
    costs = kit.by_id(results[0])["costs"]
    assert costs["status"] in ("passed", "failed")  # it drew, and drew the same each time
    for i in range(3):
        assert json.loads((tmp_path / f"out{i}" / "result.json").read_text())["seed"] == 7
        for learner_file in ("feedback.md", "junit.xml"):
            assert "seed" not in (tmp_path / f"out{i}" / learner_file).read_text().lower()


def test_a_grade_without_a_seed_records_the_one_it_drew(tmp_path):
    r = run(tmp_path, kit.submission(L1), seed=None)
    assert isinstance(r["seed"], int) and r["deadline_s"] == grading.DEFAULT_DEADLINE


# --- What comes back from the box ------------------------------------------------------------------

def _frame(kind: bytes, payload: bytes) -> bytes:
    return grading.HEADER.pack(kind, len(payload)) + payload


def test_frames_spool_observations_skip_what_is_over_budget_and_refuse_floods(monkeypatch):
    monkeypatch.setattr(grading, "SPOOL_FROM", 50)
    frames = grading._Frames(grading.Budget(left=100))
    got = frames.feed(_frame(b"O", b"x" * 60) + _frame(b"O", b"y" * 200)[:30])
    got += frames.feed(_frame(b"O", b"y" * 200)[30:] + _frame(b"M", b"n run a") + _frame(b"O", b"z" * 10))
    (k1, spool, n1), (k2, skipped, n2), (k3, marker, _), (k4, small, n4) = got
    assert (k1, n1, k2, n2, k3, k4, n4) == (b"O", 60, b"O", 200, b"M", b"O", 10)
    spool.seek(0)  # a temporary file, from SPOOL_FROM bytes on
    assert spool.read() == b"x" * 60 and skipped is None and bytes(marker) == b"n run a" and small == b"z" * 10
    spool.close()
    with pytest.raises(grading._Refused, match="tampered"):
        grading._Frames(grading.Budget(left=100)).feed(_frame(b"X", b""))
    for payload in (b"z" * (128 << 10), b""):  # large output frames, or a stream of empty ones
        flood = grading._Frames(grading.Budget(left=100))
        with pytest.raises(grading._Refused, match="flood"):
            for _ in range(grading.CHATTER_CAP // max(len(payload), grading.FRAME_COST) + 1):
                flood.feed(_frame(b"T", payload))


RETURNS_BIG = ("\nimport torch\n_calls_{name} = [0]\n_own_{name} = {name}\n"
               "def {name}(*a, **k):\n"
               "    _calls_{name}[0] += 1\n"
               "    right = _own_{name}(*a, **k)\n"
               "    return (torch.ones(30 << 20), right) if _calls_{name}[0] <= {n} else right\n")


def big_answers(per_exercise: dict) -> dict:
    """Lab 01's right answers, but the first ``n`` calls of each exercise's first function also return a
    tensor of 120 MiB (the run side passes what they return through)."""
    sol = kit.load("solutions", L1)
    return {eid: kit.source(sol, eid) + RETURNS_BIG.format(name=ENTRIES[eid][0], n=n)
            for eid, n in per_exercise.items()}


def test_observations_beyond_the_budget_are_refused_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(grading, "OBSERVATION_BUDGET", 64 << 20)
    r = run(tmp_path, kit.submission(L1, big_answers({"costs": 1}), solved=("scaling",)))
    e = kit.by_id(r)
    assert e["costs"]["status"] == "error" and e["costs"]["score"] == 0
    assert "MiB of results, more than the 64 MiB a whole submission may send back" in e["costs"]["message"]
    assert e["scaling"]["status"] == "passed"


JUDGE_PEAK = """
import json, resource, sys
from grader.grade import grade
r = grade(sys.argv[1], lab="01_performance_model", seed=3, notebook_run=False, timeout_s=120)
print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "exercises": r["exercises"]}))
"""
# README, "Limits of a grade": the judge's own footprint (an honest submission's peak) plus the budget
# of what a submission may send back, plus 64 MiB for decoding one observation
MARGIN_MIB = 64


def judge_peak(tmp_path, nb, name) -> dict:
    """The peak RSS of a judge process grading ``nb`` (the workers are its children, not counted)."""
    path = kit.write(nb, tmp_path / name)
    done = subprocess.run([sys.executable, "-c", JUDGE_PEAK, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(grading.__file__).parent.parent)}, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_judge_stays_small_when_a_submission_returns_ten_times_120_mib(tmp_path):
    """One exercise returns 120 MiB (within the budget: held), two more 5 and 4 times that (refused)."""
    honest = judge_peak(tmp_path, kit.load("solutions", L1), "honest.ipynb")
    hog = judge_peak(tmp_path, kit.submission(L1, big_answers({"costs": 1, "roofline": 5, "scaling": 4})),
                     "hog.ipynb")
    bound = honest["peak_mib"] + (grading.OBSERVATION_BUDGET >> 20) + MARGIN_MIB
    assert hog["peak_mib"] < bound, (hog["peak_mib"], honest["peak_mib"])
    e = kit.by_id(hog)
    assert e["costs"]["status"] == "failed"  # the 120 MiB came back, and was judged
    assert "MiB of results" in e["roofline"]["message"] and "MiB of results" in e["scaling"]["message"]


# --- CPU share ------------------------------------------------------------------------------------

def test_each_worker_gets_a_cpu_share_where_a_group_can_be_made():
    group = sandbox._new_group() if sandbox._group_kind() else None
    if group is None or not group.cpu:
        pytest.skip("no cpu control group here: workers run at nice %d" % sandbox.NICE)
    try:
        folder = next(f for f in group.folders if (f / "cpu.shares").exists() or (f / "cpu.weight").exists())
        share = (folder / ("cpu.shares" if group.kind == "v1" else "cpu.weight")).read_text().strip()
        assert int(share) == (1024 if group.kind == "v1" else sandbox.CPU_WEIGHT)
    finally:
        group.remove()
    assert "cpu weight" in sandbox.limits_summary("cpu")["cpu_share"]


def test_without_a_cpu_group_workers_run_at_a_lower_priority():
    apply = sandbox._limits("cpu", 10, False, None)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], preexec_fn=apply,
                          capture_output=True, text=True, timeout=60)
    assert int(done.stdout) == os.nice(0) + sandbox.NICE


# --- The box: bubblewrap's environment, /dev ----------------------------------------------------------

@SANDBOXED
def test_bubblewrap_pid_1_of_the_box_holds_none_of_the_judges_environment(monkeypatch):
    monkeypatch.setenv("GPULAB_JUDGE_SECRET", "judge-s3cr3t-17")
    peek = ("import os, sys\ntry:\n    sys.stdout.write(repr(open('/proc/1/environ', 'rb').read()))\n"
            "except OSError as exc:\n    sys.stdout.write(type(exc).__name__)\nsys.stdout.flush()\n"
            "import time; time.sleep(30)\n")
    launch = sandbox.wrap([sys.executable, "-c", peek], device="cpu", cpu_seconds=60)
    proc = subprocess.Popen(launch.command, env=launch.env, preexec_fn=launch.preexec, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        seen = proc.stdout.read(1)
        environs = []
        for pid in _tree(proc.pid):  # the outer bubblewrap, the box's PID 1, the worker
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes())
            except OSError:
                pass
        assert len(environs) >= 2
        assert all(b"judge-s3cr3t-17" not in env and b"GPULAB_JUDGE_SECRET" not in env for env in environs)
    finally:
        sandbox.stop(proc)
        launch.cleanup()
    assert b"judge-s3cr3t-17" not in seen + proc.stdout.read()


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for child in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in child.read_text().split()]
    return found


NVIDIA = ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]


def _pairs(args: list, flag: str) -> list:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_cuda_gets_the_nvidia_nodes_not_the_hosts_dev(monkeypatch):
    monkeypatch.setattr(sandbox, "_nvidia_nodes", lambda: NVIDIA)
    cuda, cpu = sandbox._devices("cuda"), sandbox._devices("cpu")
    for args in (cuda, cpu):
        assert _pairs(args, "--dev") == ["/dev"] and "/dev" not in _pairs(args, "--dev-bind")
        assert "/dev/shm" in _pairs(args, "--tmpfs") and args.index("--tmpfs") > args.index("--dev")
    assert _pairs(cuda, "--dev-bind") == NVIDIA and _pairs(cpu, "--dev-bind") == []
    if sandbox.isolation()["mode"] == "bwrap":  # and so does the whole command line
        launch = sandbox.wrap(["python"], device="cuda", cpu_seconds=10)
        launch.cleanup()
        assert _pairs(launch.command, "--dev-bind") == NVIDIA and _pairs(launch.command, "--dev") == ["/dev"]


@SANDBOXED
def test_the_box_has_a_private_size_capped_dev_shm():
    probe = "import os\ns = os.statvfs('/dev/shm')\nprint(s.f_blocks * s.f_frsize, sorted(os.listdir('/dev/shm')))"
    launch = sandbox.wrap([sys.executable, "-c", probe], device="cpu", cpu_seconds=60)
    try:
        done = subprocess.run(launch.command, env=launch.env, preexec_fn=launch.preexec, capture_output=True,
                              text=True, timeout=120)
    finally:
        launch.cleanup()
    assert done.stdout.strip() == f"{sandbox.SHM_BYTES} []", done.stderr


# --- Pipes: the worker's stdout is drained with a budget ----------------------------------------------

def test_a_worker_flooding_its_stdout_is_read_only_up_to_the_budget(tmp_path):
    flood = ("import os\n"
             "try:\n"
             "    for _ in range(200):\n"
             "        os.write(1, b'x' * (1 << 20))\n"
             "except OSError:\n"
             "    pass\n")
    out = tmp_path / "out"
    from grader.grade import grade_to_dir

    r = grade_to_dir(kit.write(kit.submission(L1, {"costs": flood + COSTS_RIGHT}, solved=("scaling",)),
                               tmp_path / "s.ipynb"), out, seed=3, notebook_run=False, timeout_s=60)
    assert kit.by_id(r)["costs"]["status"] == "passed" and kit.by_id(r)["scaling"]["status"] == "passed"
    assert "the rest was not read" in (out / "grader.log").read_text()


# --- Learner text in reports --------------------------------------------------------------------------

HOSTILE_NAMES = ['<img src=x onerror=alert(1)>.ipynb', '[click](javascript:alert(1)).ipynb',
                 '`` <script>x</script> ``.ipynb', '# | a | b.ipynb']


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_file_name_is_shown_as_code_in_feedback(name):
    from grader.report import feedback_markdown

    result = {"schema": 1, "lab": L1, "submission": name, "status": "graded", "score": 0.0, "max_score": 1.0,
              "device": "cpu", "duration_s": 1.0, "seed": 5,
              "exercises": [{"id": "costs", "points": 1.0, "score": 0.0, "status": "failed",
                             "message": "<img src=x onerror=alert(2)>"}]}
    heading = feedback_markdown(result).splitlines()[0]
    body = heading[len("# Feedback: "):]
    fence = body[:body.index(" ")]
    assert set(fence) == {"`"} and body == f"{fence} {name} {fence}"
    assert fence not in name  # the name cannot close the code span
    assert "seed" not in feedback_markdown(result).lower()


@pytest.mark.parametrize("name", [" =cmd|' /C calc'!A0.ipynb", "  +1.ipynb", "=1+1.ipynb"])
def test_gradebook_quotes_formulas_after_leading_spaces(name):
    from grader.cohort import _text_cell

    assert _text_cell(name).startswith("'")


def test_the_command_line_defaults_are_the_graders():
    from grader.cli import build_parser

    for argv in (["grade", "x.ipynb"], ["cohort", "in", "--lab", L1, "--out", "o"]):
        args = build_parser().parse_args(argv)
        assert (args.deadline, args.timeout) == (grading.DEFAULT_DEADLINE, grading.DEFAULT_TIMEOUT)
    assert build_parser().parse_args(["grade", "x.ipynb", "--deadline", "90"]).deadline == 90


def test_the_notebook_run_is_read_up_to_its_cap_and_no_further(monkeypatch):
    """A rebuilt notebook that prints without end is stopped at OUTPUT_CAP, never held whole by the judge."""
    import subprocess
    import sys

    from grader import rebuild

    monkeypatch.setattr(rebuild, "OUTPUT_CAP", 1 << 20)
    flood = "import sys\nsys.stdin.read()\nwhile True: sys.stdout.write('x' * 65536)"
    proc = subprocess.Popen([sys.executable, "-c", flood], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err, timed_out = rebuild._communicate_capped(proc, b"notebook", 60)
    finally:
        proc.kill()
        proc.wait()
    assert not timed_out and len(out) == (1 << 20) + 1


def test_the_notebook_run_reads_everything_of_a_normal_run():
    import subprocess
    import sys

    from grader import rebuild

    proc = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdout.write(sys.stdin.read().upper())\n"
                             "sys.stderr.write('log')"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err, timed_out = rebuild._communicate_capped(proc, b"notebook", 60)
    assert (out, err, timed_out) == (b"NOTEBOOK", b"log", False)
