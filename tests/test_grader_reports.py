"""Reports and cohorts against hostile or broken submissions: any text a submission controls is
sanitized, one submission's failure never costs the gradebook, CSV cells never run as formulas,
result folders stay inside --out, and unreadable notebooks are `invalid`, never a crash."""
import csv
import io
import json
import os
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import grader.grade
from grader.cohort import _text_cell, cohort, gradebook_csv, merge, result_dir, submissions
from grader.notebooks import MAX_DEPTH, InvalidNotebook, read_notebook
from grader.report import feedback_markdown, junit_xml, sanitize_result, sanitize_text, table, write_reports
from tests import graderkit as kit
from tests.conftest import ROOT

L1 = "01_performance_model"
IDS1 = ["costs", "roofline", "benchmark", "scaling"]
HOSTILE = "bad \x1b[2J\x00\x07 \ud800 \u202eevil\r\nline two\tTAB"
# characters that must never reach a report: control characters but \n and \t, lone surrogates
FORBIDDEN = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, 0x9b, 0xd800, 0xdfff, 0x202e)]


def crafted(name, message=HOSTILE, status="graded"):
    """A schema-1 result as grade would return it, carrying hostile text in every free field."""
    if status != "graded":
        return {"schema": 1, "lab": L1, "submission": name, "status": status, "message": message,
                "score": 0.0, "max_score": 0.0, "device": "cpu", "duration_s": 0.1, "exercises": []}
    exercises = [{"id": eid, "points": 2.0, "score": 2.0 if i == 1 else 0.0,
                  "status": ["failed", "passed", "error", "crashed"][i], "message": message}
                 for i, eid in enumerate(IDS1)]
    return {"schema": 1, "lab": L1, "submission": name, "device": "cpu", "status": "graded", "score": 2.0,
            "max_score": 8.0, "duration_s": 1.0, "exercises": exercises, "learner_output": message * 3,
            "notebook_run": {"status": "failed", "cell": "abc", "error": message}}


def assert_clean(text):
    bad = sorted({hex(ord(c)) for c in text if c in FORBIDDEN})
    assert not bad, f"unsafe characters {bad} in {text[:200]!r}"


def rows(csv_text):
    return list(csv.reader(io.StringIO(csv_text)))


# 1. one sanitizer for every learner-derived string ---------------------------------------------

def test_sanitize_text_replaces_surrogates_escapes_controls_and_caps_length():
    assert sanitize_text("a\ud800b") == "a\ufffdb"
    assert sanitize_text("\ud83d\ude00") == "\U0001F600"  # a surrogate pair is one character, kept
    assert sanitize_text("\x1b[2J\x00\x07 ok\r\nnext\tcol\rX") == "\\x1b[2J\\x00\\x07 ok\nnext\tcol\\rX"
    assert sanitize_text("\u202eevil \x85 \ufffe") == "\\u202eevil \\x85 \\ufffe"
    assert sanitize_text("a\tb\nc", single_line=True) == "a\\tb\\nc"
    assert sanitize_text(3.5) == "3.5"
    long = sanitize_text("x" * 50_000, limit=100)
    assert len(long) == 100 and long.startswith("x" * 80) and long.endswith("[truncated]")
    assert len(sanitize_text("\x00" * 90, limit=100)) == 100  # escaping lengthens; the cap still holds
    for text in (HOSTILE, long, "plain", "\x00" * 90):
        once = sanitize_text(text, limit=100)
        assert sanitize_text(once, limit=100) == once  # applying it twice changes nothing


def test_reports_of_a_hostile_result_are_valid_utf8_json_xml_and_markdown(tmp_path):
    result = crafted("eve\x1b[2J\ud800.ipynb", HOSTILE + "\n```\n# injected heading\n````")
    write_reports(result, tmp_path / "r")
    for name in ("result.json", "feedback.md", "junit.xml"):
        assert_clean((tmp_path / "r" / name).read_bytes().decode("utf-8"))  # strict UTF-8
    written = json.loads((tmp_path / "r" / "result.json").read_text(encoding="utf-8"))
    assert list(written) == list(result)  # the schema's keys, in order
    assert [list(e) for e in written["exercises"]] == [list(e) for e in result["exercises"]]
    assert written["submission"] == "eve\\x1b[2J\ufffd.ipynb"
    assert written["score"] == 2.0 and written["exercises"][1]["status"] == "passed"
    assert written["exercises"][0]["message"].startswith("bad \\x1b[2J\\x00\\x07 \ufffd \\u202eevil\nline two\tTAB")
    assert_clean(json.dumps(written, ensure_ascii=False))
    suite = ET.parse(tmp_path / "r" / "junit.xml").getroot()
    assert suite.get("tests") == "4" and suite.get("failures") == "1" and suite.get("errors") == "2"
    assert suite.find("testcase/failure").text.startswith("bad \\x1b[2J")
    feedback = (tmp_path / "r" / "feedback.md").read_text(encoding="utf-8")
    # the message's own ``` and ```` cannot close the block around it: its headings stay text
    assert "\n`````\nbad " in feedback and "\n# injected heading" in feedback
    assert feedback.count("\n`````\n") == 2 * 3 + 2 * 1  # 3 failed exercises + the notebook run
    text = table(result)
    assert_clean(text.replace("\n", ""))
    assert text.splitlines()[0] == "eve\\x1b[2J\ufffd.ipynb  lab 01_performance_model  status graded"
    assert text.splitlines()[2].endswith("FAIL     bad \\x1b[2J\\x00\\x07 \ufffd \\u202eevil")


def test_junit_of_any_text_parses():
    nasty = "".join(chr(c) for c in range(0, 0x250)) + "\ud800\udfff\ufffe\uffff]]><![CDATA[&\"'"
    results = [crafted(nasty + ".ipynb", nasty), crafted("x.ipynb", nasty, status="invalid")]
    root = ET.fromstring(junit_xml(results, suite=nasty).encode("utf-8"))
    assert len(root.findall("testcase")) == 5 and root.get("errors") == "3"
    assert root.findall("testcase")[-1].find("error").get("message").startswith("\\x00\\x01")


def test_invalid_results_feedback_keeps_the_message_in_a_code_block():
    md = feedback_markdown(crafted("x.ipynb", "not JSON\n# fake heading", status="invalid"))
    assert md.splitlines()[2:7] == ["**Not graded** (invalid):", "", "```", "not JSON", "# fake heading"]


def test_feedback_titles_each_exercise_and_no_report_holds_a_machine_path(tmp_path):
    where = f'File "{ROOT}/grader/runs/x.py", line 3, writing /tmp/gpulab-grade-k2/work/out.bin'
    result = crafted("alice.ipynb", where)
    result["exercises"][0]["title"] = "FLOPs and bytes (of *four* op families)"
    write_reports(result, tmp_path / "r")
    feedback = (tmp_path / "r" / "feedback.md").read_text(encoding="utf-8")
    assert "## ` costs ` · FLOPs and bytes \\(of \\*four\\* op families\\): failed" in feedback
    assert "## ` scaling `: crashed" in feedback  # a result without titles keeps the plain heading
    written = json.loads((tmp_path / "r" / "result.json").read_text(encoding="utf-8"))
    assert written["exercises"][0]["message"] == 'File "<course>/grader/runs/x.py", line 3, writing <tmp>/out.bin'
    assert written["exercises"][0]["title"] == "FLOPs and bytes (of *four* op families)"
    for name in ("result.json", "feedback.md", "junit.xml"):
        text = (tmp_path / "r" / name).read_text(encoding="utf-8")
        assert str(ROOT) not in text and "/tmp/" not in text
    assert result["exercises"][0]["message"] == where  # the caller's result is left alone


def test_sanitize_result_leaves_the_input_alone():
    result = crafted("a\x00.ipynb")
    clean = sanitize_result(result)
    assert result["submission"] == "a\x00.ipynb" and clean["submission"] == "a\\x00.ipynb"
    assert clean["exercises"][0]["points"] == 2.0 and clean["exercises"] is not result["exercises"]


# 2. a failing submission never loses the gradebook ----------------------------------------------

def fake_grade(by_name):
    """A stand-in for grader.grade.grade returning crafted results (or raising) per file name."""
    def grade(path, lab=None, **kwargs):
        made = by_name[Path(path).name]
        if isinstance(made, Exception):
            raise made
        return made
    return grade


def test_cohort_survives_hostile_text_write_failures_grader_bugs_and_garbage(tmp_path, monkeypatch):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    names = ["ann.ipynb", "bob.ipynb", "cat.ipynb", "dan.ipynb", "eve.ipynb"]
    for name in names:
        (subs / name).write_text("{}")
    monkeypatch.setattr(grader.grade, "grade", fake_grade({
        "ann.ipynb": crafted("ann.ipynb"),                   # surrogate and control characters
        "bob.ipynb": crafted("bob.ipynb", "fine"),           # its folder is blocked by a file
        "cat.ipynb": RuntimeError("boom \ud800\x1b[2J"),     # a grader bug
        "dan.ipynb": None,                                   # garbage instead of a result
        "eve.ipynb": crafted("eve.ipynb", "not JSON", status="invalid")}))
    out.mkdir()
    (out / "bob").write_text("in the way")
    results = cohort(subs, L1, out, jobs=2, progress=False)
    assert [r["submission"] for r in results] == names
    table_ = rows((out / "gradebook.csv").read_text(encoding="utf-8"))
    assert table_[0] == ["submission", "status", *IDS1, "total", "max_score"]
    assert [r[:2] for r in table_[1:]] == [["ann.ipynb", "graded"], ["bob.ipynb", "invalid"],
                                         ["cat.ipynb", "invalid"], ["dan.ipynb", "invalid"],
                                         ["eve.ipynb", "invalid"]]
    assert table_[1][2:] == ["0", "2", "0", "0", "2", "10"]
    by_name = {r["submission"]: r for r in results}
    assert "reports could not be written" in by_name["bob.ipynb"]["message"]
    assert "FileExistsError" in by_name["bob.ipynb"]["message"]
    assert by_name["cat.ipynb"]["message"] == "internal grader error: RuntimeError: boom \ufffd\\x1b[2J"
    assert "TypeError" in by_name["dan.ipynb"]["message"]
    root = ET.parse(out / "junit.xml").getroot()
    assert len(root.findall("testcase")) == 4 + 4 and root.get("name") == f"cohort {L1}"
    ann = json.loads((out / "ann" / "result.json").read_text(encoding="utf-8"))
    assert ann["exercises"][0]["message"].startswith("bad \\x1b[2J\\x00\\x07 \ufffd")
    for path in out.rglob("*"):
        if path.is_file():
            assert_clean(path.read_bytes().decode("utf-8"))
    assert (out / "bob").read_text() == "in the way"


# 3. CSV cells never run as formulas --------------------------------------------------------------

@pytest.mark.parametrize("name,cell", [
    ('=HYPERLINK("http://x.example","click").ipynb', '\'=HYPERLINK("http://x.example","click").ipynb'),
    ("+cmd.ipynb", "'+cmd.ipynb"), ("-2+3.ipynb", "'-2+3.ipynb"), ("@SUM(A1).ipynb", "'@SUM(A1).ipynb"),
    ("alice.ipynb", "alice.ipynb"), ("a=b.ipynb", "a=b.ipynb")])
def test_gradebook_quotes_formula_cells(name, cell):
    table_ = rows(gradebook_csv([crafted(name, "m")], L1))
    assert table_[1][0] == cell and table_[1][1] == "graded"


def test_tab_and_carriage_return_cells_are_quoted_too():
    assert _text_cell("\tx") == "'\tx" and _text_cell("\r=1") == "'\r=1" and _text_cell("ok") == "ok"
    # a tab or CR in a name is escaped by the sanitizer before it reaches a cell
    assert rows(gradebook_csv([crafted("\t=1.ipynb", "m")], L1))[1][0] == "\\t=1.ipynb"


# 4. result folders: safe, unique, inside --out ---------------------------------------------------

WEIRD = ["...ipynb", "..ipynb", ".ipynb", "a/../../b.ipynb", "..\\..\\c.ipynb", "two words.ipynb",
         "two_words.ipynb", "Two_Words.ipynb", "José.ipynb", "jose.ipynb", "日本.ipynb", "x\x1b\x00y.ipynb",
         "n" * 300 + ".ipynb", "n" * 301 + ".ipynb", "gradebook.csv.ipynb", "junit.xml.ipynb", "alice",
         "alice.ipynb", "-rf.ipynb", "a\ud800.ipynb"]


def test_result_dir_is_a_safe_unique_child_of_out(tmp_path):
    out = tmp_path / "out"
    dirs = [result_dir(out, name) for name in WEIRD]
    assert all(d.parent == out for d in dirs)
    names = [d.name for d in dirs]
    assert len({n.lower() for n in names}) == len(WEIRD)  # unique even on a case-insensitive disk
    for n in names:
        assert n not in (".", "..", "gradebook.csv", "junit.xml") and not n.startswith((".", "-"))
        assert len(n) <= 75 and all(c.isascii() and (c.isalnum() or c in "._-") for c in n)
    assert result_dir(out, "alice.ipynb") == out / "alice"
    assert result_dir(out, "student05.ipynb") == out / "student05"
    assert names[WEIRD.index("José.ipynb")].startswith("jose-")
    assert names[WEIRD.index("two words.ipynb")].startswith("two_words-")


def test_cohort_and_merge_keep_weird_names_inside_out(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    files = ["...ipynb", "..ipynb", "two words.ipynb", "José.ipynb", "x\x1by.ipynb", "n" * 240 + ".ipynb",
             "junit.xml.ipynb", "=1+1.ipynb"]
    for name in files:
        (subs / name).write_text("{}")
    assert sorted(p.name for p in submissions(subs)) == sorted(files)
    monkeypatch.setattr(grader.grade, "grade", lambda path, lab=None, **kw: crafted(Path(path).name, "m"))
    cohort(subs, L1, tmp_path / "all", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all", "subs"]  # nothing written beside --out
    found = sorted((tmp_path / "all").glob("*/result.json"))
    assert len(found) == len(files)
    assert {json.loads(p.read_text())["submission"] for p in found} == {sanitize_text(f, 255, True) for f in files}
    table_ = rows((tmp_path / "all" / "gradebook.csv").read_text())
    assert len(table_) == 1 + len(files) and ["'=1+1.ipynb", "graded"] in [r[:2] for r in table_[1:]]
    ET.parse(tmp_path / "all" / "junit.xml")
    # shards merge into the same folders and the same gradebook
    cohort(subs, L1, tmp_path / "s1", shard="1/2", progress=False)
    cohort(subs, L1, tmp_path / "s2", shard="2/2", progress=False)
    merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "merged")
    listing = lambda d: sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))  # noqa: E731
    assert listing(tmp_path / "merged") == listing(tmp_path / "all")
    assert (tmp_path / "merged" / "gradebook.csv").read_text() == (tmp_path / "all" / "gradebook.csv").read_text()


def test_merge_names_a_damaged_result(tmp_path):
    (tmp_path / "s1" / "alice").mkdir(parents=True)
    (tmp_path / "s1" / "alice" / "result.json").write_text('{"schema": 1')
    with pytest.raises(ValueError, match="cannot read .*alice/result.json"):
        merge([tmp_path / "s1"], tmp_path / "m")
    (tmp_path / "s1" / "alice" / "result.json").write_text('{"schema": 1}')
    with pytest.raises(ValueError, match="is not a grader result"):
        merge([tmp_path / "s1"], tmp_path / "m")


# 5. unreadable notebooks are invalid, with a reason ----------------------------------------------

def nested(depth):
    """A notebook whose one cell's metadata nests ``depth`` lists deep."""
    cell = {"cell_type": "code", "id": "a", "metadata": {"x": "[" * depth + "]" * depth}, "source": ""}
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]}).replace(
        '"' + "[" * depth + "]" * depth + '"', "[" * depth + "]" * depth)


@pytest.mark.parametrize("content,reason", [
    ("{ not json", "is not valid JSON (line 1, column 3)"),
    ("[" * 100_000, "nests lists or objects too deeply"),
    ('{"a":' * 100_000, "nests lists or objects too deeply"),
    (nested(MAX_DEPTH + 5), f"more than {MAX_DEPTH} deep"),
    ('{"nbformat": 4, "cells": [], "x": ' + "1" * 5000 + "}", "is not valid JSON (Exceeds the limit"),
    ("[]", "is JSON but not a Jupyter notebook"),
    ('"text"', "is JSON but not a Jupyter notebook"),
    ('{"nbformat": 4, "cells": {}}', "is JSON but not a Jupyter notebook"),
    ('{"nbformat": 3, "cells": []}', "is notebook format 3;"),
    ('{"nbformat": [[4]], "cells": []}', "is notebook format list;"),
    ('{"nbformat": 4, "cells": [7]}', "cell 0 is not a valid cell"),
    (b"\xff\xfe{}", "is not UTF-8 text (byte 0)"),
])
def test_unreadable_content_is_invalid_notebook(tmp_path, content, reason):
    path = tmp_path / "s.ipynb"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InvalidNotebook) as info:
        read_notebook(path)
    assert reason in str(info.value) and str(info.value).startswith("s.ipynb")


def test_directories_fifos_huge_and_missing_files_are_invalid(tmp_path):
    (tmp_path / "dir.ipynb").mkdir()
    with pytest.raises(InvalidNotebook, match="dir.ipynb is a folder"):
        read_notebook(tmp_path / "dir.ipynb")
    with pytest.raises(InvalidNotebook, match="cannot read gone.ipynb"):
        read_notebook(tmp_path / "gone.ipynb")
    with open(tmp_path / "huge.ipynb", "wb") as f:
        f.truncate(60 * 2**20)  # sparse: no disk space used
    with pytest.raises(InvalidNotebook, match=r"huge.ipynb is 60.0 MB, more than the 50 MB .* clear all outputs"):
        read_notebook(tmp_path / "huge.ipynb")
    os.mkfifo(tmp_path / "fifo.ipynb")
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_raised(read_notebook, tmp_path / "fifo.ipynb")),
                              daemon=True)
    reader.start()
    reader.join(10)  # a plain open() of a FIFO blocks until a writer comes: it must not
    assert not reader.is_alive() and "fifo.ipynb is not a regular file" in outcome[0]


def _raised(fn, *args):
    try:
        fn(*args)
    except InvalidNotebook as exc:
        return str(exc)
    return "no error"


def test_lone_surrogates_bom_and_non_string_cell_ids_are_made_harmless(tmp_path):
    nb = kit.submission(L1)
    nb["cells"][0]["source"] = "title \\ud800 end"  # a JSON escape of a lone surrogate
    nb["cells"][1]["id"] = ["not", "a", "string"]
    path = tmp_path / "s.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(nb).replace("\\\\ud800", "\\ud800").encode())
    read = read_notebook(path)
    assert read.cells[0].source == "title \ufffd end" and "id" not in read.cells[1]
    assert read.cells[2].id == nb["cells"][2]["id"]


@pytest.mark.parametrize("content,reason", [("[" * 100_000, "too deeply"), (None, "is a folder"),
                                            ("x" * 10, "not valid JSON")])
def test_grade_reports_broken_files_as_invalid(tmp_path, content, reason):
    path = tmp_path / "s.ipynb"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    r = grader.grade.grade(path, lab=L1, notebook_run=False)
    assert r["status"] == "invalid" and reason in r["message"] and r["score"] == 0 and r["exercises"] == []


# end to end: real grading of hostile output ------------------------------------------------------

def test_real_cohort_with_hostile_text_and_names(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    hostile = 'print("\\x1b[2J\\x07 bell")\nraise ValueError("bad \\x1b[31m\\x00 " + chr(0xd800))'
    kit.write(kit.submission(L1, {"costs": hostile}, solved=("roofline",)), subs / "=HYPERLINK(1).ipynb")
    kit.write(kit.load("solutions", L1), subs / "...ipynb")
    (subs / "deep.ipynb").write_text("[" * 100_000)
    results = cohort(subs, L1, out, jobs=2, seed=3, notebook_run=False, timeout_s=30, progress=False)
    assert [r["status"] for r in results] == ["graded", "graded", "invalid"]
    table_ = rows((out / "gradebook.csv").read_text(encoding="utf-8"))
    assert [r[0] for r in table_[1:]] == ["...ipynb", "'=HYPERLINK(1).ipynb", "deep.ipynb"]
    assert [r[-2] for r in table_[1:]] == ["10", "2", "0"]
    ET.parse(out / "junit.xml")
    assert sorted(p.parent.parent for p in out.glob("*/result.json")) == [out] * 3
    hurt = json.loads((result_dir(out, "=HYPERLINK(1).ipynb") / "result.json").read_text())
    costs = kit.by_id(hurt)["costs"]
    assert costs["status"] == "error" and "ValueError: bad \\x1b[31m\\x00 \ufffd" in costs["message"]
    for path in out.rglob("*"):
        if path.is_file():
            assert_clean(path.read_bytes().decode("utf-8"))
