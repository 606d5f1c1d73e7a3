"""Cohorts graded for real: 20 submissions with two jobs, broken ones included; shards merge into the same
gradebook; learner folders and archives. tests/test_grader_intake.py covers intake and gradebooks quickly."""
import csv
import io
import subprocess
import sys
import zipfile

import pytest

from grader.cohort import cohort, merge, parse_shard, plan, shard_of
from tests import graderkit as kit
from tests.conftest import ROOT

L1 = "01_performance_model"


def make_cohort(folder, n):
    """n submissions of lab 01: full, empty, partial, wrong, corrupt and crashing ones, in rotation."""
    folder.mkdir()
    wrong = "def amdahl_speedup(p, n):\n    return n\n" + "\n".join(
        kit.source(kit.load("solutions", L1), "scaling").split("\n")[7:])
    kinds = [lambda: kit.load("solutions", L1), lambda: kit.submission(L1),
             lambda: kit.submission(L1, solved=("costs",)), lambda: kit.submission(L1, {"scaling": wrong}),
             None, lambda: kit.submission(L1, {"costs": "import os\nos._exit(3)"}, solved=("roofline",))]
    for i in range(n):
        make = kinds[i % len(kinds)]
        path = folder / f"student{i:02d}.ipynb"
        if make is None:
            path.write_text("{ this is not json")
        else:
            kit.write(make(), path)
    return folder


def rows(csv_text):
    return list(csv.reader(io.StringIO(csv_text)))


def test_parse_shard_and_interleaving(tmp_path):
    assert parse_shard(None) == (1, 1) and parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "x"):
        try:
            parse_shard(bad)
            raise AssertionError(bad)
        except ValueError as exc:
            assert "K/N" in str(exc)
    folder = make_cohort(tmp_path / "c", 5)
    entries = plan(folder, L1, tmp_path / "out")["entries"]
    halves = [[e["submission"] for e in shard_of(entries, (k, 2))] for k in (1, 2)]
    assert halves == [["student00.ipynb", "student02.ipynb", "student04.ipynb"],
                      ["student01.ipynb", "student03.ipynb"]]


@pytest.mark.slow
def test_cohort_of_12_with_two_jobs(tmp_path):
    folder = make_cohort(tmp_path / "subs", 12)  # every kind twice
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grader", "cohort", str(folder), "--lab", L1, "--out", str(out),
                           "--jobs", "2", "--seed", "5", "--no-notebook-run", "--timeout", "20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    table = rows((out / "gradebook.csv").read_text())
    assert table[0] == ["submission", "status", "costs", "roofline", "benchmark", "scaling", "total", "max_score"]
    assert len(table) == 13
    by_name = {r[0][:-len(".ipynb")]: dict(zip(table[0], r)) for r in table[1:]}
    assert by_name["student00"]["submission"] == "student00.ipynb"
    assert [by_name["student00"][c] for c in ("total", "max_score")] == ["10", "10"]   # solution
    assert by_name["student01"]["total"] == "0"                                        # untouched
    assert by_name["student02"]["total"] == "3"                                        # costs only
    assert by_name["student03"]["scaling"] == "0"                                      # wrong scaling
    assert by_name["student04"]["status"] == "invalid"                                 # corrupt
    assert [by_name["student05"][c] for c in ("costs", "roofline")] == ["0", "2"]      # crashed costs
    assert (out / "student05" / "result.json").exists() and (out / "junit.xml").exists()
    assert "grading 01_performance_model" in proc.stderr            # the progress bar


@pytest.mark.slow
def test_sharded_runs_merge_into_the_unsharded_gradebook(tmp_path):
    folder = make_cohort(tmp_path / "subs", 8)
    kw = dict(jobs=2, seed=9, notebook_run=False, timeout_s=20, progress=False)
    cohort(folder, L1, tmp_path / "all", **kw)
    cohort(folder, L1, tmp_path / "s1", shard="1/2", **kw)
    cohort(folder, L1, tmp_path / "s2", shard="2/2", **kw)
    merged = merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "merged")
    assert len(merged) == 8
    assert (tmp_path / "merged" / "gradebook.csv").read_text() == (tmp_path / "all" / "gradebook.csv").read_text()
    proc = subprocess.run([sys.executable, "-m", "grader", "merge", str(tmp_path / "s1"), str(tmp_path / "s2"),
                           "--out", str(tmp_path / "m2")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0
    assert (tmp_path / "m2" / "gradebook.csv").read_text() == (tmp_path / "all" / "gradebook.csv").read_text()


def test_cohort_with_an_unknown_lab_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "cohort", str(tmp_path), "--lab", "99_nope", "--out",
                           str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown lab" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_learner_folders_and_archives_are_graded(tmp_path):
    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    kit.write(kit.load("solutions", L1), subs / "alice" / f"{L1}.ipynb")
    kit.write(kit.submission(L1, solved=("costs",)), tmp_path / "lab.ipynb")
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:
        z.write(tmp_path / "lab.ipynb", "work/LAB.IPYNB")
    results = cohort(subs, L1, tmp_path / "out", seed=3, notebook_run=False, timeout_s=20, progress=False)
    assert [(r["submission"], r["score"]) for r in results] == [(f"alice/{L1}.ipynb", 10.0),
                                                               ("bob.zip/work/LAB.IPYNB", 3.0)]
    assert (tmp_path / "out" / "bob" / "result.json").exists() and not (subs / "work").exists()
