"""``python -m grader answers``: the written interview answers of a cohort, laid out for an instructor.

Every lab ends with "## In the interview": the questions it serves, a cell for the learner's answer
and a model outline. The autograder cannot score prose, so this command collects the answers of
every submission into one review page per question (``q1.html`` and ``q1.md``, ...), learners side
by side under the lab's model outline, an index of the questions with how many learners answered each
(``index.html``, ``index.md``), and a blank ``scores.csv`` (``learner,question,points,comment``,
one row per learner and question) for the instructor to fill in; ``merge --scores scores.csv`` folds
it into the gradebook.

Question ids (``q1``, ``q2``, ...) come from the solution, in the order its interview section asks
them, so they do not depend on what a submission did to its cells. A learner answers all of a lab's
questions in one cell; a part of it that starts with a question's label (``**Q-OPT.**`` or ``q2:``,
as the lab prints them) is shown on that question's page, the whole answer otherwise.
"""
from __future__ import annotations

import csv
import html
import io
import re
from dataclasses import dataclass
from pathlib import Path

from grader.notebooks import InvalidNotebook, headings, read_notebook
from grader.report import _code_span, _fenced, sanitize_text

HEADING = "In the interview"
MAX_ANSWER = 20_000  # characters of one learner's answer shown
# A question as the labs ask it: **Q-OPT.** *"..."*, - **Q-OPT** *"..."*, - **Q-DIST / Q-PAR**: "...".
_ASKED = re.compile(r"\*\*(Q-[A-Z0-9]+(?:\s*/\s*Q-[A-Z0-9]+)*)\.?\*\*:?")


@dataclass(frozen=True)
class Question:
    id: str        # q1, q2, ... in the solution's order
    label: str     # the lab's label, e.g. "Q-OPT" (several questions may share one)
    text: str      # the question as the lab asks it


@dataclass(frozen=True)
class Interview:
    """What the solution's interview section holds: its questions, its rubric (the model outline),
    and which of its cells are the learner's to write (their ids and the text they start with)."""

    questions: tuple
    rubric: str
    answer_cells: dict   # {cell id: its placeholder text}
    locked: frozenset    # ids of the section's other cells
    locked_text: frozenset  # their text (a notebook saved without cell ids still has it)


@dataclass(frozen=True)
class Answer:
    learner: str
    text: str            # the whole answer, placeholder removed ("" when none)
    problem: str = ""    # why no answer could be read (an unreadable notebook)


def interview_cells(nb) -> list:
    """The cells from the "## In the interview" heading to the end of the notebook (none without one)."""
    start = next((i for i, c in enumerate(nb.cells)
                  if c.get("cell_type") == "markdown" and HEADING in headings(c.get("source", ""))), None)
    return [] if start is None else nb.cells[start:]


def read_interview(solution) -> Interview:
    """The questions, rubric and answer cells of a solution notebook's interview section."""
    cells = interview_cells(solution)
    if not cells:
        raise ValueError(f'this lab\'s solution has no "## {HEADING}" section.')
    asked = cells[0].get("source", "").split("\n", 1)[-1]
    found = list(_ASKED.finditer(asked))
    questions = []
    for n, match in enumerate(found, start=1):
        end = found[n].start() if n < len(found) else len(asked)
        text = asked[match.end():end].split("\n\n", 1)[0]
        questions.append(Question(f"q{n}", re.sub(r"\s+", "", match.group(1)).replace("/", " / "),
                                  _unmarked(" ".join(text.split()).rstrip("- ").strip())))
    if not questions:  # a section that asks in prose: one question, the whole text
        questions.append(Question("q1", "", " ".join(asked.split())))
    answer_cells = {c.get("id"): c.get("source", "") for c in cells[1:] if str(c.get("id", "")).endswith("answer")}
    outline = [c.get("source", "") for c in cells[1:] if c.get("cell_type") == "markdown" and "Model outline" in
               c.get("source", "")]
    rubric = "\n\n".join(re.sub(r"</?details>|<summary>.*?</summary>", "", o, flags=re.S).strip() for o in outline)
    others = [c for c in cells if c.get("id") not in answer_cells]
    return Interview(tuple(questions), rubric or "(this lab has no model outline: its questions above carry "
                                                  "what a good answer covers)", answer_cells,
                     frozenset(c.get("id") for c in others), frozenset(c.get("source", "").strip() for c in others))


def _unmarked(question: str) -> str:
    """A question without the emphasis marks around its quote (``*"Why ...?"*`` -> ``"Why ...?"``)."""
    return question.replace('*"', '"').replace('"*', '"')


def learner_answer(nb, interview: Interview) -> str:
    """What the learner wrote in ``nb``'s interview section: its answer cells without their placeholder
    text, and any cell the learner added there (cells the lab already had, such as the measurements
    cell, are not the learner's answer; without the section's heading, the answer cells alone)."""
    # a learner who deleted the section's heading still has the answer cell
    cells = interview_cells(nb) or [c for c in nb.cells if c.get("id") in interview.answer_cells]
    parts = []
    for cell in cells:
        cell_id, text = cell.get("id"), cell.get("source", "")
        if cell_id not in interview.answer_cells and (cell_id in interview.locked
                                                      or text.strip() in interview.locked_text):
            continue
        for placeholder in interview.answer_cells.values():
            text = text.replace(placeholder.strip(), "", 1) if placeholder.strip() else text
        if text.strip():
            parts.append(text.strip() if cell.get("cell_type") != "code" else "\n".join(_fenced(text.strip())))
    return "\n\n".join(parts)


def part_for(answer: str, question: Question, questions: tuple) -> str | None:
    """The part of ``answer`` labelled for ``question`` (a line starting with its id, ``q2``, or with
    its label when no other question shares it), up to the next labelled part; ``None`` when no part is."""
    labels = {}
    for q in questions:
        names = [q.id] + ([q.label] if q.label and sum(o.label == q.label for o in questions) == 1 else [])
        labels[q.id] = "|".join(re.escape(n) for n in names)
    starts = re.compile(r"^[\s>*_#-]*(?:" + "|".join(f"(?P<{q}>{pattern})" for q, pattern in labels.items())
                        + r")\b", re.I | re.M)
    marks = [(m.start(), m.lastgroup) for m in starts.finditer(answer)]
    mine = [i for i, (_, q) in enumerate(marks) if q == question.id]
    if not mine:
        return None
    pieces = [answer[marks[i][0]:marks[i + 1][0] if i + 1 < len(marks) else len(answer)].strip() for i in mine]
    return "\n\n".join(pieces)


def _discover(folder: Path, lab: str, out: Path) -> list[tuple[str, Path]]:
    """``(learner, notebook)`` of every submission, as ``cohort`` finds them (nested folders, archives
    unpacked under ``out``, one submission per learner)."""
    from grader.intake import find_submissions, one_per_learner

    inside = out.resolve().is_relative_to(folder.resolve())  # never read back what this command wrote
    found = find_submissions(folder, out / "_unpacked", exclude=out if inside else None).found
    kept, _ = one_per_learner(found, lab)
    return [(f.learner, Path(f.path)) for f in kept]


def collect(folder, lab: str, out: Path) -> tuple[Interview, list[Answer]]:
    """The lab's interview and every learner's answer, in learner order."""
    from grader.checks import lab_stems
    from grader.grade import solution_path

    if lab not in lab_stems():
        raise KeyError(f"unknown lab {lab!r}; labs: {', '.join(lab_stems())}")
    interview = read_interview(read_notebook(solution_path(lab)))
    answers = []
    for learner, path in sorted(_discover(Path(folder), lab, Path(out)), key=lambda lp: lp[0]):
        learner = sanitize_text(learner, 255, single_line=True)
        try:
            text = learner_answer(read_notebook(path), interview)
        except InvalidNotebook as exc:
            answers.append(Answer(learner, "", f"could not read the notebook: {exc}"))
            continue
        answers.append(Answer(learner, sanitize_text(text, MAX_ANSWER)))
    return interview, answers


def _shown(answer: Answer, question: Question, questions: tuple) -> tuple[str, str]:
    """(what to show of ``answer`` on ``question``'s page, a note on what it is)."""
    if answer.problem:
        return "", answer.problem
    if not answer.text.strip():
        return "", "no answer written"
    part = part_for(answer.text, question, questions)
    if part is not None:
        return part, f"the part labelled {question.id}" + (f" / {question.label}" if question.label else "")
    return answer.text, "the whole answer (not labelled by question)"


def page_markdown(lab: str, question: Question, interview: Interview, answers: list[Answer]) -> str:
    label = f" ({question.label})" if question.label else ""
    out = [f"# {lab} · {question.id}{label}", "", f"> {question.text}", "",
           "## Model outline (the rubric)", "", interview.rubric, "",
           f"## Answers ({len(answers)} learners)", "",
           f"Score each in `scores.csv` (question `{question.id}`).", ""]
    for a in answers:
        text, note = _shown(a, question, interview.questions)
        out += [f"### {_code_span(a.learner)}", "", f"*{note}*", ""]
        if text:
            out += [*_fenced(text), ""]
    return "\n".join(out)


_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:110em}
.rubric,.answer{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.9em}
.rubric{background:#f4f7f0;border-left:4px solid #6a9f3d;padding:.8em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(28em,1fr));gap:1em}
.card{border:1px solid #ccc;border-radius:6px;padding:.6em .9em;overflow-wrap:anywhere}
.card h3{margin:.2em 0}.note{color:#666;font-style:italic;font-size:.85em}.empty{background:#fbf3f3}"""


def page_html(lab: str, question: Question, interview: Interview, answers: list[Answer]) -> str:
    """The review page: every learner's text is escaped (an answer holding ``<script>`` shows as text)."""
    e = html.escape
    label = f" ({e(question.label)})" if question.label else ""
    cards = []
    for a in answers:
        text, note = _shown(a, question, interview.questions)
        body = f'<div class="answer">{e(text)}</div>' if text else ""
        cards.append(f'<div class="card{"" if text else " empty"}"><h3>{e(a.learner)}</h3>'
                     f'<div class="note">{e(note)}</div>{body}</div>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(lab)} · {e(question.id)}</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>{e(lab)} · {e(question.id)}{label}</h1>\n"
            f"<blockquote>{e(question.text)}</blockquote>\n<h2>Model outline (the rubric)</h2>\n"
            f'<div class="rubric">{e(interview.rubric)}</div>\n<h2>Answers ({len(answers)} learners)</h2>\n'
            f"<p>Score each in <code>scores.csv</code> (question <code>{e(question.id)}</code>).</p>\n"
            f'<div class="grid">\n' + "\n".join(cards) + "\n</div>\n</body></html>\n")


def _tally(question: Question, interview: Interview, answers: list[Answer]) -> dict:
    """How the cohort answered ``question``: ``{note kind: learners}`` (labelled, whole, none, unreadable)."""
    counts = {"labelled": 0, "whole answer": 0, "no answer": 0, "unreadable": 0}
    for a in answers:
        text, note = _shown(a, question, interview.questions)
        kind = ("unreadable" if a.problem else "no answer" if not text else
                "labelled" if note.startswith("the part labelled") else "whole answer")
        counts[kind] += 1
    return counts


def index_markdown(lab: str, interview: Interview, answers: list[Answer]) -> str:
    """The table of contents: one row per question, with its page and how many learners answered it."""
    out = [f"# {lab} · written interview answers", "",
           f"{len(answers)} submissions. One page per question (the model outline on top, then every learner); "
           "score them in `scores.csv`.", "",
           "| question | asks | page | labelled part | whole answer | no answer | unreadable |",
           "|---|---|---|---|---|---|---|"]
    for q in interview.questions:
        c = _tally(q, interview, answers)
        label = f"{q.id} ({q.label})" if q.label else q.id
        asks = q.text.replace("|", "\\|")[:120]
        out.append(f"| {label} | {asks} | [{q.id}.md]({q.id}.md) | {c['labelled']} | {c['whole answer']} | "
                   f"{c['no answer']} | {c['unreadable']} |")
    return "\n".join(out) + "\n"


def index_html(lab: str, interview: Interview, answers: list[Answer]) -> str:
    e = html.escape
    rows = []
    for q in interview.questions:
        c = _tally(q, interview, answers)
        label = f"{e(q.id)} ({e(q.label)})" if q.label else e(q.id)
        rows.append(f'<tr><td><a href="{e(q.id)}.html">{label}</a></td><td>{e(q.text)}</td>'
                    + "".join(f"<td>{c[k]}</td>" for k in ("labelled", "whole answer", "no answer", "unreadable"))
                    + "</tr>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(lab)} · interview answers</title>'
            f"<style>{_STYLE}\ntd,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}"
            "table{border-collapse:collapse}</style></head><body>\n"
            f"<h1>{e(lab)} · written interview answers</h1>\n<p>{len(answers)} submissions. One page per question "
            "(the model outline on top, then every learner); score them in <code>scores.csv</code>.</p>\n"
            "<table><tr><th>question</th><th>asks</th><th>labelled part</th><th>whole answer</th><th>no answer</th>"
            "<th>unreadable</th></tr>\n" + "\n".join(rows) + "\n</table>\n</body></html>\n")


def scores_csv(questions: tuple, answers: list[Answer]) -> str:
    """The blank score sheet: ``learner,question,points,comment``, one row per learner and question."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["learner", "question", "points", "comment"])
    for a in answers:
        for q in questions:
            writer.writerow([_as_text(a.learner), q.id, "", ""])
    return buf.getvalue()


def _as_text(value: str) -> str:
    """A CSV cell a spreadsheet shows as text and never runs as a formula (a learner id like ``=cmd``)."""
    return "'" + value if value.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")) else value


def write_answers(folder, lab: str, out) -> list[Path]:
    """Write the review pages of ``lab``'s interview questions and ``scores.csv`` into ``out``; return them."""
    out = Path(out)
    interview, answers = collect(folder, lab, out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for q in interview.questions:
        for suffix, page in ((".md", page_markdown), (".html", page_html)):
            path = out / f"{q.id}{suffix}"
            path.write_text(page(lab, q, interview, answers), encoding="utf-8")
            written.append(path)
    for name, text in (("index.md", index_markdown(lab, interview, answers)),
                       ("index.html", index_html(lab, interview, answers))):
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    scores = out / "scores.csv"
    if scores.exists() and _filled(scores):
        scores = out / "scores.blank.csv"  # never overwrite the instructor's scores
    scores.write_text(scores_csv(interview.questions, answers), encoding="utf-8")
    return [*written, scores]


def _filled(path: Path) -> bool:
    """Whether a score sheet holds any points or comments."""
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    except (OSError, UnicodeDecodeError, csv.Error):
        return True
    return any((r.get("points") or "").strip() or (r.get("comment") or "").strip() for r in rows)
