"""Cohort intake and gradebooks: how submissions are found (folders, platform names, archives), the
roster, shards that merge only when complete, overrides, written-answer scores, late policy, the course
and Canvas gradebooks and released feedback. Grading itself is replaced by a stand-in that reads the
scores from the file, so these tests are quick; tests/test_grader_cohort.py grades for real."""
import csv
import io
import json
import os
import zipfile

import pytest

import grader.grade
import grader.intake
from grader.adjustments import read_overrides, read_scores
from grader.cli import main
from grader.cohort import IncompleteShards, NoSubmissions, cohort, merge
from grader.gradebook import canvas_csv, course, feedback_sections
from grader.intake import find_submissions, one_per_learner
from grader.late import late_hours, parse_policy
from grader.roster import assign, read_roster

L1 = "01_performance_model"
IDS = ["costs", "roofline", "benchmark", "scaling"]
POINTS = {"costs": 3.0, "roofline": 2.0, "benchmark": 3.0, "scaling": 2.0}


def fake_grade(path, lab=None, log_path=None, **kwargs):
    """Stands in for the sandboxed grader: the "notebook" is JSON naming its scores, ``{"costs": 3}``."""
    try:
        scores = json.loads(path.read_text())
        assert isinstance(scores, dict)
    except (ValueError, AssertionError):
        return {"schema": 1, "lab": lab, "submission": path.name, "status": "invalid", "message": "not JSON",
                "score": 0.0, "max_score": 0.0, "device": "cpu", "duration_s": 0.0, "exercises": []}
    exs = [{"id": i, "points": p, "score": float(scores.get(i, 0)), "status": "passed" if scores.get(i) else "failed",
            "message": ""} for i, p in POINTS.items()]
    return {"schema": 1, "lab": lab, "submission": path.name, "status": "graded",
            "score": sum(e["score"] for e in exs), "max_score": 10.0, "device": "cpu", "duration_s": 0.0,
            "exercises": exs}


@pytest.fixture(autouse=True)
def stand_in_grader(monkeypatch):
    monkeypatch.setattr(grader.grade, "grade", fake_grade)


def put(path, content="{}", mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def table(path):
    return list(csv.DictReader(io.StringIO(path.read_text())))


def by_learner(path):
    """Rows by learner (the file's stem when the gradebook has no learner column)."""
    return {r.get("learner") or r["submission"].rsplit(".", 1)[0]: r for r in table(path)}


def run(tmp_path, folder, *extra):
    return cohort(folder, L1, tmp_path / "out", progress=False, **dict(extra))


# ---- intake ---------------------------------------------------------------------------------------

def test_intake_finds_flat_nested_platform_and_any_case_and_skips_the_rest(tmp_path):
    subs = tmp_path / "subs"
    put(subs / "alice.ipynb")
    put(subs / "BOB.IPYNB")
    put(subs / "carol_12345_678_01_performance_model.ipynb")          # Canvas's flat name
    put(subs / "dave" / "01_performance_model.ipynb")                  # JupyterHub / nbgrader
    put(subs / "erin" / "ps1" / "lab.ipynb")                           # deeper
    put(subs / "dave" / ".ipynb_checkpoints" / "01_performance_model-checkpoint.ipynb")
    put(subs / ".hidden.ipynb")
    put(subs / "__MACOSX" / "._alice.ipynb")
    put(subs / "notes.txt")
    intake = find_submissions(subs, tmp_path / "unpack")
    assert [(f.learner, f.submission) for f in intake.found] == [
        ("BOB", "BOB.IPYNB"), ("alice", "alice.ipynb"),
        ("carol_12345_678_01_performance_model", "carol_12345_678_01_performance_model.ipynb"),
        ("dave", "dave/01_performance_model.ipynb"), ("erin", "erin/ps1/lab.ipynb")]
    skipped = dict(intake.skipped)
    assert "checkpoints" in skipped["dave/.ipynb_checkpoints/"]
    assert skipped[".hidden.ipynb"] == "hidden" and "macOS" in skipped["__MACOSX/"]
    assert "not a notebook" in skipped["notes.txt"]


def test_intake_unpacks_archives_into_the_output_folder_only(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    with zipfile.ZipFile(subs / "alice.zip", "w") as z:                # one learner's archive
        z.writestr("work/01_performance_model.ipynb", "{}")
        z.writestr("__MACOSX/work/._01_performance_model.ipynb", "x")
    with zipfile.ZipFile(subs / "bulk.zip", "w") as z:                 # a platform's bulk download
        z.writestr("bob_1_2_lab.ipynb", "{}")
        z.writestr("carol/lab.ipynb", "{}")
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w") as zi:
            zi.writestr("lab.ipynb", "{}")
        z.writestr("dave.zip", inner.getvalue())
    before = sorted(p.name for p in subs.rglob("*"))
    intake = find_submissions(subs, tmp_path / "out" / "_unpacked")
    assert [(f.learner, f.submission) for f in intake.found] == [
        ("alice", "alice.zip/work/01_performance_model.ipynb"), ("bob_1_2_lab", "bulk.zip/bob_1_2_lab.ipynb"),
        ("carol", "bulk.zip/carol/lab.ipynb"), ("dave", "bulk.zip/dave.zip/lab.ipynb")]
    assert all((tmp_path / "out" / "_unpacked") in f.path.parents for f in intake.found)
    assert sorted(p.name for p in subs.rglob("*")) == before          # nothing written next to the submissions
    assert "macOS" in dict(intake.skipped)["alice.zip/__MACOSX/work/._01_performance_model.ipynb"]


def test_intake_refuses_path_traversal_symlinks_and_oversized_entries(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    with zipfile.ZipFile(subs / "evil.zip", "w") as z:
        z.writestr("../../escaped.ipynb", "{}")
        z.writestr("/abs.ipynb", "{}")
        link = zipfile.ZipInfo("link.ipynb")
        link.external_attr = 0o120777 << 16
        z.writestr(link, "/etc/passwd")
        z.writestr("big.ipynb", "x" * 5000)
        z.writestr("ok.ipynb", "{}")
    with zipfile.ZipFile(subs / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("huge.ipynb", "0" * 100_000)
    (subs / "broken.zip").write_bytes(b"PK not really")
    monkeypatch.setattr(grader.intake, "MAX_MEMBER_BYTES", 4000)
    intake = find_submissions(subs, tmp_path / "out" / "_unpacked")
    assert [f.submission for f in intake.found] == ["evil.zip/ok.ipynb"]
    skipped = dict(intake.skipped)
    assert "leaves the archive" in skipped["evil.zip/../../escaped.ipynb"]
    assert "leaves the archive" in skipped["evil.zip//abs.ipynb"]
    assert "symbolic link" in skipped["evil.zip/link.ipynb"]
    assert "size cap" in skipped["evil.zip/big.ipynb"] and "size cap" in skipped["bomb.zip/huge.ipynb"]
    assert "cannot be read" in skipped["broken.zip"]
    assert not list(tmp_path.rglob("escaped.ipynb")) and not list(tmp_path.rglob("huge.ipynb"))


def test_one_submission_per_learner_prefers_the_lab_then_the_newest(tmp_path):
    subs = tmp_path / "subs"
    put(subs / "alice" / "scratch.ipynb", mtime=2_000_000)
    put(subs / "alice" / "01_performance_model.ipynb", mtime=1_000_000)
    put(subs / "bob" / "a.ipynb", mtime=1_000_000)
    put(subs / "bob" / "b.ipynb", mtime=2_000_000)
    kept, skipped = one_per_learner(find_submissions(subs, tmp_path / "u").found, L1)
    assert [k.submission for k in kept] == ["alice/01_performance_model.ipynb", "bob/b.ipynb"]
    assert {s for s, _ in skipped} == {"alice/scratch.ipynb", "bob/a.ipynb"}


def test_cohort_with_no_submissions_fails_clearly(tmp_path, capsys):
    subs = tmp_path / "subs"
    put(subs / "notes.txt")
    put(subs / "alice.py")
    with pytest.raises(NoSubmissions, match="found no submissions"):
        run(tmp_path, subs)
    code = main(["cohort", str(subs), "--lab", L1, "--out", str(tmp_path / "o"), "--no-notebook-run"])
    err = capsys.readouterr()
    assert code == 2 and "found no submissions" in err.err and "intake.csv" in err.err
    assert "skipped alice.py: not a notebook" in err.out
    assert {r["file"]: r["action"] for r in table(tmp_path / "o" / "intake.csv")} == {"alice.py": "skipped",
                                                                                      "notes.txt": "skipped"}


def test_output_folder_inside_the_submissions_is_not_graded(tmp_path):
    subs = tmp_path / "subs"
    put(subs / "alice.ipynb", {"costs": 3})
    run(tmp_path, subs)
    cohort(subs, L1, subs / "grades", progress=False)
    results = cohort(subs, L1, subs / "grades", progress=False)       # again: its own output is not a submission
    assert [r["submission"] for r in results] == ["alice.ipynb"]


# ---- roster --------------------------------------------------------------------------------------

ROSTER = """learner,submission,email,sis_id,canvas_id,name,section
alice,,alice@uni.edu,S1,101,"Smith, Alice",A
bob,bob_*,bob@uni.edu,S2,102,"Jones, Bob",A
carol,,carol@uni.edu,S3,103,"Lee, Carol",B
dave,,,,,,
"""


def test_roster_places_submissions_reports_strangers_and_lists_the_missing(tmp_path, capsys):
    subs = tmp_path / "subs"
    put(subs / "alice" / "01_performance_model.ipynb", {"costs": 3})
    put(subs / "bob_777_1_01_performance_model.ipynb", {"costs": 3, "roofline": 2})
    put(subs / "zed_9_9_01_performance_model.ipynb", {"scaling": 2})
    put(subs / "x_103_5_lab.ipynb", {"benchmark": 3})                   # Canvas id of carol
    roster = put(tmp_path / "roster.csv", ROSTER)
    results = run(tmp_path, subs, ("roster", roster), ("say", print))
    assert len(results) == 4
    rows = by_learner(tmp_path / "out" / "gradebook.csv")
    assert rows["alice"]["total"] == "3" and rows["bob"]["total"] == "5" and rows["carol"]["total"] == "3"
    assert rows["dave"]["status"] == "missing" and rows["dave"]["total"] == "0" and rows["dave"]["costs"] == "0"
    stranger = rows["zed_9_9_01_performance_model"]
    assert stranger["total"] == "2" and stranger["notes"] == "not on the roster"
    out = capsys.readouterr().out
    assert "not on the roster" in out and "no submission from 1 roster learners: dave" in out
    intake = {(r["learner"], r["action"]) for r in table(tmp_path / "out" / "intake.csv")}
    assert ("dave", "missing") in intake and ("bob", "graded") in intake


def test_roster_errors_name_the_line(tmp_path):
    with pytest.raises(ValueError, match="lines 2 and 3: learner 'a' appears twice"):
        read_roster(put(tmp_path / "r.csv", "learner\na\na\n"))
    with pytest.raises(ValueError, match="no column learner"):
        read_roster(put(tmp_path / "r.csv", "student\na\n"))


def test_a_submission_matching_two_roster_rows_is_reported(tmp_path):
    put(tmp_path / "s" / "ab.ipynb")
    people = read_roster(put(tmp_path / "r.csv", "learner,submission\na,a*\nb,*b*\n"))
    placed, unplaced = assign(find_submissions(tmp_path / "s", tmp_path / "u").found, people)
    assert unplaced == [("ab.ipynb", "matches the roster rows of a, b")]


# ---- shards --------------------------------------------------------------------------------------

def make_subs(tmp_path, n=6):
    subs = tmp_path / "subs"
    for i in range(n):
        put(subs / f"s{i}.ipynb", {"costs": i % 4, "scaling": 2})
    return subs


def test_merge_refuses_missing_duplicated_or_foreign_shards(tmp_path, capsys):
    subs = make_subs(tmp_path)
    for k in (1, 2, 3):
        cohort(subs, L1, tmp_path / f"s{k}", shard=f"{k}/3", progress=False)
    cohort(subs, L1, tmp_path / "all", progress=False)
    with pytest.raises(IncompleteShards, match="shard 2 of 3 is missing"):
        merge([tmp_path / "s1", tmp_path / "s3"], tmp_path / "m")
    with pytest.raises(IncompleteShards, match=r"shard 1/3 is given twice"):
        merge([tmp_path / "s1", tmp_path / "s1", tmp_path / "s2", tmp_path / "s3"], tmp_path / "m")
    with pytest.raises(IncompleteShards, match="split the cohort differently"):
        merge([tmp_path / "s1", tmp_path / "s2", tmp_path / "s3", tmp_path / "all"], tmp_path / "m")
    put(subs / "late.ipynb")
    cohort(subs, L1, tmp_path / "s3b", shard="3/3", progress=False)
    with pytest.raises(IncompleteShards, match="different sets of submissions"):
        merge([tmp_path / "s1", tmp_path / "s2", tmp_path / "s3b"], tmp_path / "m")
    code = main(["merge", str(tmp_path / "s1"), str(tmp_path / "s3"), "--out", str(tmp_path / "m")])
    assert code == 2 and "shard 2 of 3 is missing" in capsys.readouterr().err
    assert len(merge([tmp_path / "s1", tmp_path / "s3"], tmp_path / "m", allow_incomplete=True)) == 4
    merge([tmp_path / "s1", tmp_path / "s2", tmp_path / "s3"], tmp_path / "m")
    for name in ("gradebook.csv", "cohort.json"):
        assert (tmp_path / "m" / name).read_text() == (tmp_path / "all" / name).read_text()


# ---- overrides, written answers, late ------------------------------------------------------------

def test_overrides_are_applied_shown_and_survive_a_regrade(tmp_path):
    subs = make_subs(tmp_path, 3)
    overrides = put(tmp_path / "overrides.csv", "learner,exercise,points,comment\n"
                    "s1,costs,3,your derivation was right\ns2,total,9.5,regraded by hand\ns0,costs,1,\n")
    text = overrides.read_text()
    run(tmp_path, subs, ("overrides", overrides))
    rows = by_learner(tmp_path / "out" / "gradebook.csv")
    assert rows["s1"]["costs"] == "3" and rows["s1"]["autograded"] == "3" and rows["s1"]["total"] == "5"
    assert rows["s1"]["overrides"] == "costs 1 -> 3 (your derivation was right)"
    assert rows["s2"]["total"] == "9.5" and "total 4 -> 9.5" in rows["s2"]["overrides"]
    assert rows["s0"]["costs"] == "1" and rows["s0"]["total"] == "3"
    feedback = (tmp_path / "out" / "s1" / "feedback.md").read_text()
    assert "## Adjusted by your instructor" in feedback and "your derivation was right" in feedback
    run(tmp_path, subs, ("overrides", overrides))                      # a regrade
    assert overrides.read_text() == text
    assert feedback == (tmp_path / "out" / "s1" / "feedback.md").read_text()   # the section is not doubled
    assert by_learner(tmp_path / "out" / "gradebook.csv")["s1"]["total"] == "5"


def test_overrides_and_scores_refuse_bad_rows(tmp_path):
    with pytest.raises(ValueError, match="line 2: 'cost' is not an exercise"):
        read_overrides(put(tmp_path / "o.csv", "learner,exercise,points\na,cost,1\n"), L1, IDS)
    with pytest.raises(ValueError, match="line 2: points 'ten' is not a number"):
        read_overrides(put(tmp_path / "o.csv", "learner,exercise,points\na,costs,ten\n"), L1, IDS)
    with pytest.raises(ValueError, match="line 3: a / q1 is scored already"):
        read_scores(put(tmp_path / "s.csv", "learner,question,points,comment\na,q1,1,\na,q1,2,\n"), L1)
    assert read_overrides(put(tmp_path / "o.csv", "learner,exercise,points,lab\na,nope,1,02_triton_basics\n"),
                          L1, IDS) == {}


def test_written_answer_scores_become_columns_totals_and_feedback(tmp_path):
    subs = make_subs(tmp_path, 2)
    scores = put(tmp_path / "scores.csv", "learner,question,points,comment,lab\n"
                 "s0,why-roofline,2,clear and correct,01_performance_model\n"
                 "s0,amdahl-limit,,,01_performance_model\n"
                 "s1,why-roofline,1,missed the ridge point,\n"
                 "s1,other,5,,02_triton_basics\n")
    run(tmp_path, subs, ("scores", scores))
    table_ = table(tmp_path / "out" / "gradebook.csv")
    assert list(table_[0]) == ["submission", "status", *IDS, "total", "max_score", "interview:why-roofline",
                              "interview:amdahl-limit", "autograded"]
    rows = by_learner(tmp_path / "out" / "gradebook.csv")
    assert rows["s0"]["interview:why-roofline"] == "2" and rows["s0"]["interview:amdahl-limit"] == ""
    assert rows["s0"]["total"] == "4" and rows["s1"]["total"] == "4"   # 2 + 2 and 3 + 1
    feedback = (tmp_path / "out" / "s1" / "feedback.md").read_text()
    assert "## Written answers" in feedback and "`why-roofline`: 1 point: missed the ridge point" in feedback
    s0 = (tmp_path / "out" / "s0" / "feedback.md").read_text()
    assert "`amdahl-limit`: not scored yet" in s0


def test_written_answer_scores_from_yaml(tmp_path):
    pytest.importorskip("yaml")
    path = put(tmp_path / "scores.yaml", "- {learner: a, question: q1, points: 2, comment: good}\n"
                                         "- {learner: a, question: q2, points: null}\n")
    questions, scores = read_scores(path, L1)
    assert questions == ["q1", "q2"] and [w.points for w in scores["a"]] == [2.0, None]


def test_late_policies():
    assert parse_policy(None).penalty(30, 8, 10) == 0
    assert parse_policy("zero").penalty(0.1, 8, 10) == 8
    assert parse_policy("percent-per-day:10").penalty(30, 8, 10) == 2          # two started days
    assert parse_policy("percent-per-day:10").penalty(24 * 20, 8, 10) == 8     # never below 0
    assert parse_policy("grace:2,percent-per-day:10").penalty(1.5, 8, 10) == 0
    assert parse_policy("grace:2,zero").penalty(2.5, 8, 10) == 8
    for bad in ("ten", "percent-per-day:x", "grace:-1,zero", "zero:3", "grace:2"):
        with pytest.raises(ValueError, match="late-policy"):
            parse_policy(bad)
    assert late_hours("2026-03-02T01:00:00Z", "2026-03-01T23:00:00Z") == 2
    assert late_hours("2026-03-01T23:00:00+01:00", "2026-03-01T23:00:00Z") == 0


def test_due_dates_with_times_file_or_mtime(tmp_path):
    subs = tmp_path / "subs"
    due = 1_767_225_600                                                # 2026-01-01T00:00:00Z
    put(subs / "early.ipynb", {"costs": 3, "roofline": 2}, mtime=due - 3600)
    put(subs / "late.ipynb", {"costs": 3, "roofline": 2}, mtime=due + 30 * 3600)
    put(subs / "told.ipynb", {"costs": 3, "roofline": 2}, mtime=due + 100 * 3600)
    times = put(tmp_path / "times.csv", "learner,submitted_at\ntold,2025-12-31T23:00:00Z\n")
    run(tmp_path, subs, ("due", "2026-01-01T00:00:00Z"), ("late_policy", "percent-per-day:10"), ("times", times))
    rows = by_learner(tmp_path / "out" / "gradebook.csv")
    assert rows["early"]["penalty"] == "0" and rows["early"]["time_source"] == "file mtime"
    assert rows["late"]["late_by"] == "30" and rows["late"]["penalty"] == "2" and rows["late"]["total"] == "3"
    assert rows["late"]["submitted_at"] == "2026-01-02T06:00:00Z"
    assert rows["told"]["time_source"] == "times file" and rows["told"]["total"] == "5"
    assert "30 hours late; 2 points deducted" in (tmp_path / "out" / "late" / "feedback.md").read_text()
    with pytest.raises(ValueError, match="needs --due"):
        run(tmp_path, subs, ("late_policy", "zero"))
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        run(tmp_path, subs, ("due", "next friday"))


def test_merge_reuses_the_shards_settings_and_rereads_the_overrides(tmp_path):
    subs = make_subs(tmp_path, 4)
    overrides = put(tmp_path / "o.csv", "learner,exercise,points,comment\ns1,costs,3,\n")
    for k in (1, 2):
        cohort(subs, L1, tmp_path / f"s{k}", shard=f"{k}/2", progress=False, overrides=overrides)
    put(overrides, "learner,exercise,points,comment\ns1,costs,3,\ns2,total,10,excellent\n")
    merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "m")
    rows = by_learner(tmp_path / "m" / "gradebook.csv")
    assert rows["s1"]["total"] == "5" and rows["s2"]["total"] == "10"


# ---- course gradebook, Canvas, released feedback -------------------------------------------------

def test_course_gradebook_canvas_csv_and_released_feedback(tmp_path, capsys):
    subs = tmp_path / "subs"
    put(subs / "alice" / "01_performance_model.ipynb", {"costs": 3})
    put(subs / "bob_1_2_lab.ipynb", {"costs": 3, "roofline": 2})
    put(subs / "stranger.ipynb", {"costs": 1})
    roster = put(tmp_path / "roster.csv", ROSTER)
    scores = put(tmp_path / "scores.csv", "learner,question,points,comment\nbob,q1,2,nice\ncarol,q1,1,\n")
    cohort(subs, L1, tmp_path / "lab01", roster=roster, scores=scores, progress=False)
    labs, people = course([tmp_path / "lab01"])
    assert labs == [{"lab": L1, "max_score": 10.0}]
    assert main(["gradebook", str(tmp_path / "lab01"), "--out", str(tmp_path / "course.csv"),
                 "--canvas", str(tmp_path / "canvas.csv")]) == 0
    rows = by_learner(tmp_path / "course.csv")
    assert rows["alice"][L1] == "3" and rows["bob"][L1] == "7" and rows["carol"][L1] == "1"
    assert rows["alice"]["email"] == "alice@uni.edu" and rows["dave"][L1] == "0"
    canvas = list(csv.reader(io.StringIO((tmp_path / "canvas.csv").read_text())))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", L1]
    assert canvas[1][0] == "Points Possible" and canvas[1][-1] == "10"
    assert ["Jones, Bob", "102", "S2", "", "A", "7"] in canvas
    assert "dave, stranger" in capsys.readouterr().err                 # no id: left out, and said so
    assert main(["release-feedback", str(tmp_path / "lab01"), "--to", str(tmp_path / "fb")]) == 0
    assert sorted(p.name for p in (tmp_path / "fb").iterdir()) == ["alice.md", "bob.md", "carol.md", "dave.md",
                                                                   "stranger.md"]
    assert "nice" in (tmp_path / "fb" / "bob.md").read_text()
    carol = (tmp_path / "fb" / "carol.md").read_text()
    assert "No submission of yours was received" in carol and "## Written answers" in carol


def test_canvas_csv_keeps_learner_text_from_running_as_a_formula():
    people = [{"learner": "x", "scores": {L1: 1.0}, "email": "", "sis_id": "=1+1", "canvas_id": "", "sis_login_id": "",
               "name": "@SUM(A1)", "section": ""}]
    text, left_out = canvas_csv([{"lab": L1, "max_score": 10.0}], people)
    assert "'@SUM(A1),,'=1+1" in text and left_out == []


def test_feedback_sections_are_empty_when_nothing_was_added():
    row = {"late_by": None, "overrides": [], "written": [], "penalty": 0.0}
    assert feedback_sections(row) == ""


def test_overrides_for_learners_not_in_the_gradebook_are_reported(tmp_path, capsys):
    subs = make_subs(tmp_path, 2)
    overrides = put(tmp_path / "o.csv", "learner,exercise,points,comment\nS1,costs,3,typo in the name\n")
    run(tmp_path, subs, ("overrides", overrides), ("say", print))
    assert "name learners not in this gradebook (a typo?): S1" in capsys.readouterr().out


def test_merge_treats_a_result_folder_outside_the_shard_as_damage(tmp_path):
    subs = make_subs(tmp_path, 2)
    cohort(subs, L1, tmp_path / "s1", progress=False)
    meta = json.loads((tmp_path / "s1" / "cohort.json").read_text())
    meta["entries"][0]["folder"] = "../../elsewhere"
    (tmp_path / "s1" / "cohort.json").write_text(json.dumps(meta))
    with pytest.raises(IncompleteShards, match="no cohort.json"):
        merge([tmp_path / "s1"], tmp_path / "m")


def test_names_with_control_characters_are_shown_escaped(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    with zipfile.ZipFile(subs / "bulk.zip", "w") as z:
        z.writestr("\x1b[2Jeve/lab.ipynb", "{}")
        z.writestr("mallory.ipynb", "{}")
        z.writestr("\x1b]0;x\x07.txt", "")
    intake = find_submissions(subs, tmp_path / "u")
    assert intake.found[0].learner == "\\x1b[2Jeve"
    assert all("\x1b" not in name for name, _ in intake.skipped)


def test_the_command_line_wires_every_option(tmp_path, capsys):
    subs = make_subs(tmp_path, 2)
    os.utime(subs / "s0.ipynb", (1_767_225_600, 1_767_225_600))       # 2026-01-01T00:00:00Z: on time
    files = {name: put(tmp_path / f"{name}.csv", text) for name, text in {
        "roster": "learner,submission\nann,s0.ipynb\nben,s1*\ncid,\n",
        "overrides": "learner,exercise,points,comment\nann,roofline,2,\n",
        "scores": "learner,question,points,comment\nben,q1,1,\n",
        "times": "learner,submitted_at\nben,2026-01-03T00:00:00Z\n"}.items()}
    for k in (1, 2):
        assert main(["cohort", str(subs), "--lab", L1, "--out", str(tmp_path / f"s{k}"), "--shard", f"{k}/2",
                     "--roster", str(files["roster"]), "--overrides", str(files["overrides"]),
                     "--scores", str(files["scores"]), "--times", str(files["times"]),
                     "--due", "2026-01-02T00:00:00Z", "--late-policy", "percent-per-day:10", "--no-notebook-run"]) == 0
    rows = by_learner(tmp_path / "s1" / "gradebook.csv")
    assert rows["ann"]["total"] == "4" and rows["cid"]["status"] == "missing"
    rows = by_learner(tmp_path / "s2" / "gradebook.csv")
    assert rows["ben"]["total"] == "3" and rows["ben"]["penalty"] == "1"
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m"),
                 "--late-policy", "zero"]) == 0
    rows = by_learner(tmp_path / "m" / "gradebook.csv")
    assert rows["ann"]["total"] == "4" and rows["ben"]["total"] == "0" and rows["ben"]["penalty"] == "4"
    assert rows["ben"]["interview:q1"] == "1" and rows["ben"]["time_source"] == "times file"
    assert "merged 2 results" in capsys.readouterr().out


def test_nbgrader_timestamps_give_the_submission_time(tmp_path):
    subs = tmp_path / "submitted"
    put(subs / "alice" / "ps1" / "lab.ipynb", {"costs": 3}, mtime=1_800_000_000)
    put(subs / "alice" / "ps1" / "timestamp.txt", "2026-01-01 00:30:00.000000 UTC\n")
    put(subs / "bob" / "ps1" / "lab.ipynb", {"costs": 3}, mtime=1_767_225_000)
    put(subs / "bob" / "timestamp.txt", "last tuesday")
    run(tmp_path, subs, ("due", "2026-01-01T00:00:00Z"))
    rows = by_learner(tmp_path / "out" / "gradebook.csv")
    assert rows["alice"]["submitted_at"] == "2026-01-01T00:30:00Z" and rows["alice"]["late_by"] == "0.5"
    assert rows["alice"]["time_source"] == "nbgrader timestamp"
    assert rows["bob"]["time_source"] == "file mtime" and rows["bob"]["late_by"] == "0"
    intake = {r["file"]: r for r in table(tmp_path / "out" / "intake.csv")}
    assert "not a time nbgrader writes" in intake["bob/timestamp.txt"]["reason"]
    assert "alice/ps1/timestamp.txt" not in intake


@pytest.mark.parametrize("damage", [{"shard": "1/2"}, {"set_sha256": None}, {"lab": 1}, {"missing": [1]},
                                    {"entries": [{"learner": "a"}]}])
def test_merge_refuses_a_damaged_cohort_json(tmp_path, damage):
    subs = make_subs(tmp_path, 2)
    cohort(subs, L1, tmp_path / "s1", progress=False)
    meta = json.loads((tmp_path / "s1" / "cohort.json").read_text())
    (tmp_path / "s1" / "cohort.json").write_text(json.dumps({**meta, **damage}))
    with pytest.raises(IncompleteShards, match="no cohort.json"):
        merge([tmp_path / "s1"], tmp_path / "m")


def test_gradebook_names_a_damaged_gradebook_json(tmp_path, capsys):
    subs = make_subs(tmp_path, 1)
    cohort(subs, L1, tmp_path / "lab01", progress=False)
    book = json.loads((tmp_path / "lab01" / "gradebook.json").read_text())
    book["rows"][0]["folder"] = "../../etc"
    (tmp_path / "lab01" / "gradebook.json").write_text(json.dumps(book))
    assert main(["release-feedback", str(tmp_path / "lab01"), "--to", str(tmp_path / "fb")]) == 2
    assert main(["gradebook", str(tmp_path / "lab01"), "--out", str(tmp_path / "c.csv")]) == 2
    assert "is not a gradebook written by `cohort` or `merge`" in capsys.readouterr().err


def test_a_dry_run_shows_the_intake_and_grades_nothing(tmp_path, capsys, monkeypatch):
    subs = make_subs(tmp_path, 2)
    put(subs / "notes.txt")
    monkeypatch.setattr(grader.grade, "grade", lambda *a, **k: pytest.fail("graded during a dry run"))
    assert main(["cohort", str(subs), "--lab", L1, "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "skipped notes.txt" in out and "found 2 submissions" in out and "dry run: nothing graded" in out
    assert len(table(tmp_path / "o" / "intake.csv")) == 3 and not (tmp_path / "o" / "gradebook.csv").exists()


def test_a_bulk_download_can_be_passed_as_the_zip_it_came_as(tmp_path):
    with zipfile.ZipFile(tmp_path / "submissions.zip", "w") as z:
        z.writestr("alice_1_2_lab.ipynb", json.dumps({"costs": 3}))
        z.writestr("bob_3_4_lab.ipynb", json.dumps({"costs": 1}))
    results = cohort(tmp_path / "submissions.zip", L1, tmp_path / "out", progress=False)
    assert [r["submission"] for r in results] == ["submissions.zip/alice_1_2_lab.ipynb",
                                                  "submissions.zip/bob_3_4_lab.ipynb"]
    assert by_learner(tmp_path / "out" / "gradebook.csv")["alice_1_2_lab"]["total"] == "3"
    with pytest.raises(ValueError, match="neither a folder nor a .zip"):
        cohort(tmp_path / "nothing-here", L1, tmp_path / "out2", progress=False)


def test_a_gradebook_row_loses_only_the_points_skipped_for_the_grading_gpu():
    """A learner graded on a GPU without bf16 is not marked down: the skipped exercise leaves the row's maximum
    (taken from the lab's own points, never from a number the result file claims)."""
    from grader.checks import exercises
    from grader.gradebook import lab_rows

    lab = "07_mixed_precision"
    points = {i: ex.points for i, ex in exercises(lab).items()}
    full = float(sum(points.values()))
    skipped = next(i for i, ex in exercises(lab).items() if getattr(ex, "requires", None))
    result = {"status": "graded", "score": 3.0, "max_score": 1.0, "exercises": [],
              "skipped_for_capability": [{"id": skipped, "requires": "bf16", "device_capability": "sm_75"}]}
    entries = [{"learner": "ann", "submission": "ann.ipynb"}, {"learner": "bob", "submission": "bob.ipynb"}]
    _, rows, _ = lab_rows(lab, list(points), full, entries, {"ann": result, "bob": {**result,
                          "skipped_for_capability": []}}, [], {})
    assert [r["max_score"] for r in rows] == [full - points[skipped], full]
