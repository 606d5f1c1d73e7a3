"""`python -m grader answers`: a cohort's written interview answers, one review page per question, learner text
escaped, and a blank score sheet with one row per learner and question."""
import csv
import io

import pytest

from grader.answers import part_for, read_interview, write_answers
from grader.checks import lab_stems
from grader.cli import main
from grader.notebooks import read_notebook
from tests import graderkit as kit
from tests.conftest import ROOT

L1 = "01_performance_model"
SCRIPT = "<script>alert('MARK-BOB')</script>"


def with_answer(stem: str, text: str | None) -> dict:
    """The generated lab with ``text`` written into its interview answer cell (``None``: left as released)."""
    nb = kit.load("labs", stem)
    if text is not None:
        cell = next(c for c in nb["cells"] if c.get("id") == "interview-answer")
        cell["source"] = text
    return nb


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """A cohort of three: alice labels her parts, bob writes one unlabelled answer holding a script, carol
    writes nothing. Returns the output folder of `answers`."""
    root = tmp_path_factory.mktemp("answers")
    subs = root / "subs"
    subs.mkdir()
    alice = ("**Q-HW.** Memory-bound below the ridge: MARK-ALICE-1.\n\n"
             "**Q-COMP.** Warm up, synchronise: MARK-ALICE-2.\n\n"
             "q3: profile first, MARK-ALICE-3.")
    kit.write(with_answer(L1, alice), subs / "alice.ipynb")
    kit.write(with_answer(L1, f"All three at once. {SCRIPT} MARK-BOB <b>bold</b> & more"), subs / "bob.ipynb")
    kit.write(with_answer(L1, None), subs / "carol.ipynb")
    assert main(["answers", str(subs), "--lab", L1, "--out", str(root / "out")]) == 0
    return root / "out"


def test_one_page_per_question_in_html_and_markdown(pages):
    names = sorted(p.name for p in pages.iterdir())
    assert names == ["index.html", "index.md", "q1.html", "q1.md", "q2.html", "q2.md", "q3.html", "q3.md",
                     "scores.csv"]
    for q, label, asks in (("q1", "Q-HW", "memory-bound or compute-bound"), ("q2", "Q-COMP", "benchmark a kernel"),
                           ("q3", "Q-E2E", "A training step is slow")):
        for suffix in (".html", ".md"):
            page = (pages / f"{q}{suffix}").read_text(encoding="utf-8")
            assert f"{L1} · {q} ({label})" in page and asks in page
            assert "Model outline" in page and "ridge point of *measured* peaks" in page  # the rubric, on top
            assert page.index("ridge point of *measured* peaks") < page.index("alice")


def test_the_index_links_every_question_and_counts_the_answers(pages):
    index = (pages / "index.md").read_text(encoding="utf-8")
    assert "3 submissions" in index
    for q, label in (("q1", "Q-HW"), ("q2", "Q-COMP"), ("q3", "Q-E2E")):
        row = next(line for line in index.splitlines() if line.startswith(f"| {q} ({label})"))
        # alice labelled every part, bob wrote one unlabelled answer, carol nothing
        assert row.endswith(f"| [{q}.md]({q}.md) | 1 | 1 | 1 | 0 |"), row
    page = (pages / "index.html").read_text(encoding="utf-8")
    assert all(f'<a href="{q}.html">' in page for q in ("q1", "q2", "q3"))
    assert "<td>1</td><td>1</td><td>1</td><td>0</td>" in page


def test_a_labelled_part_shows_on_its_own_page_only(pages):
    for n in (1, 2, 3):
        for suffix in (".html", ".md"):
            page = (pages / f"q{n}{suffix}").read_text(encoding="utf-8")
            assert f"MARK-ALICE-{n}" in page
            assert all(f"MARK-ALICE-{m}" not in page for m in (1, 2, 3) if m != n)
            assert "MARK-BOB" in page  # an unlabelled answer is shown whole on every page
            assert "no answer written" in page  # carol


def test_learner_text_is_escaped_in_html(pages):
    page = (pages / "q1.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&#x27;MARK-BOB&#x27;)&lt;/script&gt;" in page and "&amp; more" in page
    markdown = (pages / "q1.md").read_text(encoding="utf-8")
    fenced = markdown[markdown.index("` bob `"):]
    assert fenced.index("```\n") < fenced.index(SCRIPT)  # in a code block: shown, never rendered


def test_the_measurements_cell_and_placeholder_are_not_an_answer(pages):
    page = (pages / "q1.md").read_text(encoding="utf-8")
    carol = page[page.index("` carol `"):]
    assert "peaks.ridge_point" not in page and "_Your answer here._" not in carol


def test_a_notebook_saved_without_cell_ids_gives_only_the_learners_text(tmp_path):
    from grader.answers import learner_answer

    interview = read_interview(read_notebook(ROOT / "solutions" / f"{L1}.ipynb"))
    nb = with_answer(L1, "_Your answer here._\n\nMy own words.")
    for cell in nb["cells"]:
        cell.pop("id", None)
    assert learner_answer(read_notebook(kit.write(nb, tmp_path / "s.ipynb")), interview) == "My own words."
    with_ids = with_answer(L1, "Still here.")
    with_ids["cells"] = [c for c in with_ids["cells"] if c.get("id") != "interview"]  # the heading deleted
    assert learner_answer(read_notebook(kit.write(with_ids, tmp_path / "t.ipynb")), interview) == "Still here."


def test_scores_csv_has_one_blank_row_per_learner_and_question(pages):
    rows = list(csv.reader(io.StringIO((pages / "scores.csv").read_text(encoding="utf-8"))))
    assert rows[0] == ["learner", "question", "points", "comment"]
    assert rows[1:] == [[learner, q, "", ""] for learner in ("alice", "bob", "carol") for q in ("q1", "q2", "q3")]


def test_filled_scores_are_never_overwritten(pages, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "scores.csv").write_text("learner,question,points,comment\nalice,q1,3,good\n")
    subs = tmp_path / "subs"
    subs.mkdir()
    kit.write(with_answer(L1, "x"), subs / "dan.ipynb")
    (subs / "broken.ipynb").write_text("{ not json")
    written = write_answers(subs, L1, out)
    assert (out / "scores.csv").read_text() == "learner,question,points,comment\nalice,q1,3,good\n"
    assert written[-1] == out / "scores.blank.csv"
    assert "could not read the notebook: broken.ipynb is not valid JSON" in (out / "q1.md").read_text()
    assert "broken,q1,," in (out / "scores.blank.csv").read_text()


@pytest.mark.parametrize("stem", lab_stems())
def test_every_lab_has_questions_an_answer_cell_and_a_rubric(stem):
    interview = read_interview(read_notebook(ROOT / "solutions" / f"{stem}.ipynb"))
    assert interview.questions and [q.id for q in interview.questions] == [
        f"q{n}" for n in range(1, len(interview.questions) + 1)]
    assert all(q.text and "**" not in q.text for q in interview.questions)
    assert list(interview.answer_cells) == ["interview-answer"] and interview.rubric


def test_a_shared_label_splits_by_id_only():
    """Lab 17 asks two Q-HW questions: "Q-HW" names neither, "q2" names the second."""
    questions = read_interview(read_notebook(ROOT / "solutions" / "17_cuda_simt.ipynb")).questions
    assert [q.label for q in questions] == ["Q-HW", "Q-HW", "Q-E2E"]
    answer = "Q-HW: occupancy first.\n\nq2: __syncthreads between the steps.\n\nQ-E2E: strided writes."
    assert part_for(answer, questions[0], questions) is None
    assert part_for(answer, questions[1], questions) == "q2: __syncthreads between the steps."
    assert part_for(answer, questions[2], questions) == "Q-E2E: strided writes."


def test_unknown_lab_fails_clearly(tmp_path, capsys):
    assert main(["answers", str(tmp_path), "--lab", "99_nope", "--out", str(tmp_path / "o")]) == 2
    assert "unknown lab '99_nope'" in capsys.readouterr().err


def test_answers_to_gradebook_a_nested_cohort_end_to_end(tmp_path, monkeypatch):
    """A JupyterHub-style cohort (a folder per learner): `answers` writes the review pages and scores.csv, the
    instructor fills it, and `cohort --scores` puts the written-answer points in the gradebook and feedback."""
    import grader.grade
    from tests.test_grader_intake import fake_grade

    subs = tmp_path / "subs"
    for learner, text in (("alice", "q1: bytes over bandwidth, MARK-ALICE"), ("bob", "I would profile. MARK-BOB")):
        (subs / learner).mkdir(parents=True)
        kit.write(with_answer(L1, text), subs / learner / f"{L1}.ipynb")
    assert main(["answers", str(subs), "--lab", L1, "--out", str(tmp_path / "review")]) == 0
    assert "MARK-ALICE" in (tmp_path / "review" / "q1.html").read_text()
    sheet = list(csv.DictReader(io.StringIO((tmp_path / "review" / "scores.csv").read_text())))
    assert {(r["learner"], r["question"]) for r in sheet} >= {("alice", "q1"), ("bob", "q1")}
    for row in sheet:
        row["points"], row["comment"] = ("2", "clear and quantified") if row["learner"] == "alice" else ("0", "")
    with (tmp_path / "scores.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["learner", "question", "points", "comment"])
        writer.writeheader()
        writer.writerows(sheet)

    def three_points(path, lab=None, log_path=None, **kwargs):  # stands in for the sandbox: 3 points each
        scratch = tmp_path / "scratch" / path.parent.name
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / path.name).write_text('{"costs": 3}')
        return fake_grade(scratch / path.name, lab=lab) | {"submission": path.name}

    monkeypatch.setattr(grader.grade, "grade", three_points)
    assert main(["cohort", str(subs), "--lab", L1, "--out", str(tmp_path / "out"),
                 "--scores", str(tmp_path / "scores.csv")]) == 0
    rows = {r["learner"]: r for r in csv.DictReader(io.StringIO((tmp_path / "out" / "gradebook.csv").read_text()))}
    questions = len({r["question"] for r in sheet})
    assert rows["alice"]["interview:q1"] == "2" and float(rows["alice"]["total"]) == 3 + 2 * questions
    assert float(rows["bob"]["total"]) == 3
    feedback = next((tmp_path / "out").rglob("feedback.md"), None)
    assert feedback is not None
    texts = [p.read_text() for p in (tmp_path / "out").rglob("feedback.md")]
    assert any("Written answers" in t and "clear and quantified" in t for t in texts)
