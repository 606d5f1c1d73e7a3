"""Gradebooks: one lab's (``gradebook.csv`` and ``gradebook.json``, written by ``cohort`` and ``merge``),
the course's across labs, and Canvas's import format.

A lab's row per learner starts from the autograder's scores (``result.json``), then applies, in order:
the instructor's overrides of exercises, the written-answer scores, the late penalty, and a ``total``
override (the final word). Every step is shown: ``autograded`` keeps the machine's total, ``overrides``
says what was changed by hand and why, ``penalty`` and ``late_by`` (hours) the lateness.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from grader.adjustments import read_overrides, read_scores
from grader.late import late_hours, parse_policy, read_times
from grader.report import sanitize_text

# Placed after the autograder's feedback.md; everything from it on is rewritten on every gradebook build.
INSTRUCTOR_MARK = "<!-- from your instructor -->"


def text_cell(value) -> str:
    """A CSV cell that a spreadsheet shows as text, never runs as a formula (OWASP CSV injection), also
    after leading spaces a spreadsheet may drop (`` =cmd|' /C calc'!A0``)."""
    text = str(value)
    return "'" + text if text.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")) else text


def number_cell(value) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return ""


def _skipped_points(lab: str, result: dict | None) -> float:
    """The points of ``result``'s exercises skipped for the grading GPU's capability: they leave its maximum.
    Taken from the lab's own exercises (a result file only names which were skipped)."""
    if not result or result.get("status") != "graded":
        return 0.0
    from grader.checks import exercises

    points = {i: ex.points for i, ex in exercises(lab).items()}
    skipped = {s.get("id") for s in result.get("skipped_for_capability") or [] if isinstance(s, dict)}
    return float(sum(points[i] for i in skipped if i in points))


def lab_rows(lab: str, ids: list[str], max_score: float, entries: list[dict], results: dict[str, dict],
             missing: list[dict], settings: dict) -> tuple[list[str], list[dict], list[str]]:
    """The written-answer questions, one row per learner (sorted), from the cohort's ``entries``
    (graded submissions), their ``results`` (by learner) and the roster's ``missing`` learners, and the
    learners that overrides or scores name but no row holds (a typo, or another shard's)."""
    overrides = read_overrides(settings["overrides"], lab, ids) if settings.get("overrides") else {}
    questions, written = read_scores(settings["scores"], lab) if settings.get("scores") else ([], {})
    times = read_times(settings["times"]) if settings.get("times") else {}
    policy = parse_policy(settings.get("late_policy"))
    due = settings.get("due")
    rows = []
    for person in [*entries, *({**m, "missing": True} for m in missing)]:
        learner = person["learner"]
        result = results.get(learner) if not person.get("missing") else None
        scores = {e.get("id"): float(e.get("score") or 0.0) for e in (result or {}).get("exercises", [])}
        scores = {i: scores.get(i, 0.0) for i in ids}
        autograded = float(result.get("score") or 0.0) if result else 0.0
        row_max = max_score - _skipped_points(lab, result)
        total, changes = autograded, []
        for o in overrides.get(learner, []):
            if o.target != "total":
                changes.append({"target": o.target, "was": scores[o.target], "points": o.points, "comment": o.comment})
                total += o.points - scores[o.target]
                scores[o.target] = o.points
        answers = written.get(learner, [])
        total += sum(w.points for w in answers if w.points is not None)
        submitted_at, source = _submission_time(person, times)
        late = late_hours(submitted_at, due) if due and submitted_at else None
        penalty = policy.penalty(late, total, row_max) if late else 0.0
        total -= penalty
        for o in overrides.get(learner, []):
            if o.target == "total":
                changes.append({"target": "total", "was": round(total, 4), "points": o.points, "comment": o.comment})
                total = o.points
        rows.append({
            "learner": learner, "submission": person.get("submission", ""), "folder": person.get("folder", ""),
            "status": result["status"] if result else "missing", "exercises": scores,
            "written": [{"question": w.question, "points": w.points, "comment": w.comment} for w in answers],
            "autograded": autograded, "penalty": penalty, "total": round(total, 4), "max_score": row_max,
            "submitted_at": submitted_at, "time_source": source, "due": due or "",
            "late_by": late, "late_policy": settings.get("late_policy") or "none", "overrides": changes,
            "notes": person.get("notes", []), **{k: person.get(k, "") for k in IDENTITY_KEYS}})
    known = {r["learner"] for r in rows}
    unknown = sorted((set(overrides) | set(written)) - known)
    # in submission order, as gradebooks always were; roster learners without a submission last
    return questions, sorted(rows, key=lambda r: (not r["submission"], r["submission"], r["learner"])), unknown


IDENTITY_KEYS = ("email", "sis_id", "canvas_id", "sis_login_id", "name", "section")


def _submission_time(person: dict, times: dict[str, str]) -> tuple[str, str]:
    """When ``person`` submitted (ISO, UTC) and where that comes from: ``--times``, else nbgrader's
    timestamp.txt, else the file's mtime; nothing for a learner without a submission."""
    if person["learner"] in times:
        return times[person["learner"]], "times file"
    if person.get("stamp_at"):
        return person["stamp_at"], "nbgrader timestamp"
    if not person.get("missing") and person.get("mtime_at"):
        return person["mtime_at"], "file mtime"
    return "", ""


def _override_text(change: dict) -> str:
    text = f"{change['target']} {change['was']:g} -> {change['points']:g}"
    return f"{text} ({change['comment']})" if change["comment"] else text


def _stem(submission: str) -> str:
    return submission[:-len(".ipynb")] if submission.lower().endswith(".ipynb") else submission


def lab_csv(ids: list[str], questions: list[str], rows: list[dict], settings: dict | None = None) -> str:
    """``gradebook.csv``: one row per learner. The first columns never change (scripts read them):
    ``submission, status``, one per exercise, ``total, max_score``. Then, only where in use: ``learner``
    (when it is not the file's stem, or some roster learner has no submission), ``interview:<question>``
    per written question, ``autograded`` (the machine's total, when anything changes it), the lateness
    (``penalty, late_by`` in hours, ``submitted_at, time_source``), ``overrides`` and ``notes``."""
    settings = settings or {}
    show_learner = any(r["learner"] != _stem(r["submission"]) for r in rows)
    changed = bool(settings.get("overrides") or questions or settings.get("due"))
    late = bool(settings.get("due"))
    notes = any(r["notes"] for r in rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", "status", *ids, "total", "max_score", *(["learner"] if show_learner else []),
                     *(f"interview:{q}" for q in questions), *(["autograded"] if changed else []),
                     *(["penalty", "late_by", "submitted_at", "time_source"] if late else []),
                     *(["overrides"] if settings.get("overrides") else []), *(["notes"] if notes else [])])
    for r in rows:
        written = {w["question"]: w["points"] for w in r["written"]}
        writer.writerow([text_cell(r["submission"]), text_cell(r["status"]),
                         *(number_cell(r["exercises"][i]) for i in ids),
                         number_cell(r["total"]), number_cell(r["max_score"]),
                         *([text_cell(r["learner"])] if show_learner else []),
                         *(number_cell(written.get(q)) for q in questions),
                         *([number_cell(r["autograded"])] if changed else []),
                         *([number_cell(r["penalty"]), number_cell(r["late_by"]), r["submitted_at"], r["time_source"]]
                           if late else []),
                         *([text_cell("; ".join(map(_override_text, r["overrides"])))]
                           if settings.get("overrides") else []),
                         *([text_cell("; ".join(r["notes"]))] if notes else [])])
    return buf.getvalue()


def _code(text: str) -> str:
    text = sanitize_text(text, 200, single_line=True).replace("`", "'")
    return f"`{text}`"


def _points(value: float) -> str:
    return f"{value:g} point" + ("" if value == 1 else "s")


def feedback_sections(row: dict) -> str:
    """What the instructor added, for the learner's ``feedback.md``: lateness, overrides and written
    answers with their comments, and the final score; empty when nothing was added."""
    out = []
    if row["late_by"]:
        deducted = f"; {_points(row['penalty'])} deducted ({row['late_policy']})" if row["penalty"] else ""
        out += ["## Late submission", "", f"Submitted {row['submitted_at']}, due {row['due']}: "
                f"{row['late_by']:g} hours late{deducted}.", ""]
    if row["overrides"]:
        out += ["## Adjusted by your instructor", ""]
        for c in row["overrides"]:
            what = "Total" if c["target"] == "total" else _code(c["target"])
            comment = f": {sanitize_text(c['comment'], 2000)}" if c["comment"] else ""
            out.append(f"- {what}: {_points(c['points'])} (was {c['was']:g}){comment}")
        out.append("")
    if row["written"]:
        out += ["## Written answers", ""]
        for w in row["written"]:
            points = "not scored yet" if w["points"] is None else _points(w["points"])
            comment = f": {sanitize_text(w['comment'], 2000)}" if w["comment"] else ""
            out.append(f"- {_code(w['question'])}: {points}{comment}")
        out.append("")
    if not out:
        return ""
    return "\n".join([INSTRUCTOR_MARK, "", *out, f"**Final score: {row['total']:g}** "
                      f"(autograded {row['autograded']:g} / {row['max_score']:g}).", ""])


def with_sections(feedback: str, row: dict) -> str:
    """``feedback`` (a feedback.md) with its instructor part replaced by ``row``'s."""
    base = feedback.split(INSTRUCTOR_MARK)[0].rstrip("\n") + "\n"
    sections = feedback_sections(row)
    return base + ("\n" + sections if sections else "")


def write_lab(out: Path, lab: str, ids: list[str], questions: list[str], rows: list[dict], settings: dict) -> None:
    """``gradebook.csv``, ``gradebook.json`` (every column, always; read by ``gradebook`` and
    ``release-feedback``) and the instructor's part of every learner's ``feedback.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradebook.csv").write_text(lab_csv(ids, questions, rows, settings), encoding="utf-8")
    book = {"schema": 1, "lab": lab, "exercises": ids, "questions": questions, "rows": rows}
    (out / "gradebook.json").write_text(json.dumps(book, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        feedback = out / row["folder"] / "feedback.md" if row["folder"] else None
        if feedback and feedback.exists():
            feedback.write_text(with_sections(feedback.read_text(encoding="utf-8"), row), encoding="utf-8")


def read_lab(folder) -> dict:
    path = Path(folder) / "gradebook.json"
    try:
        book = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path} ({type(exc).__name__}: {exc}); pass folders written by "
                         "`cohort` or `merge`.") from None
    if not (isinstance(book, dict) and isinstance(book.get("lab"), str) and isinstance(book.get("rows"), list)
            and all(_is_row(r) for r in book["rows"])):
        raise ValueError(f"{path} is not a gradebook written by `cohort` or `merge`; run `merge` (or `cohort`) "
                         "again to rewrite it.")
    return book


def _is_row(row) -> bool:
    """Enough of a gradebook.json row for the course gradebook and released feedback (its result folder
    one plain name, as cohort makes them)."""
    if not isinstance(row, dict):
        return False
    return (isinstance(row.get("learner"), str) and (row.get("folder") == "" or plain_name(row.get("folder")))
            and all(isinstance(row.get(k), (int, float)) for k in ("total", "max_score", "autograded", "penalty")))


def plain_name(name) -> bool:
    """A result folder's name as cohort makes them: one path component, never ``..``."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def course(folders: list) -> tuple[list[dict], list[dict]]:
    """Labs (``lab``, ``max_score``) in the order given, and one row per learner: identity and
    ``scores`` by lab (a lab where the learner has no row is absent)."""
    labs, people = [], {}
    for folder in folders:
        book = read_lab(folder)
        if any(lab["lab"] == book["lab"] for lab in labs):
            raise ValueError(f"lab {book['lab']} is given twice ({folder}); pass one folder per lab.")
        max_score = max((r["max_score"] for r in book["rows"]), default=0.0)
        labs.append({"lab": book["lab"], "max_score": max_score})
        for r in book["rows"]:
            person = people.setdefault(r["learner"], {"learner": r["learner"], "scores": {},
                                                      **{k: "" for k in IDENTITY_KEYS}})
            for k in IDENTITY_KEYS:
                person[k] = person[k] or r.get(k, "")
            person["scores"][book["lab"]] = r["total"]
    return labs, sorted(people.values(), key=lambda p: p["learner"])


def course_csv(labs: list[dict], people: list[dict]) -> str:
    """One row per learner, one column per lab (its total; empty where the learner is not in that lab's
    gradebook), then the course total and maximum."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["learner", *IDENTITY_KEYS, *(lab["lab"] for lab in labs), "total", "max_score"])
    course_max = sum(lab["max_score"] for lab in labs)
    for p in people:
        writer.writerow([text_cell(p["learner"]), *(text_cell(p[k]) for k in IDENTITY_KEYS),
                         *(number_cell(p["scores"].get(lab["lab"])) for lab in labs),
                         number_cell(sum(p["scores"].values())), number_cell(course_max)])
    return buf.getvalue()


CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def canvas_csv(labs: list[dict], people: list[dict]) -> tuple[str, list[str]]:
    """Canvas's gradebook import file (Grades > Import): ``Student, ID, SIS User ID, SIS Login ID,
    Section``, one column per lab (a new column creates an assignment; rename a header to the Canvas
    assignment's own name to fill an existing one), and a ``Points Possible`` row as in Canvas's
    export. Learners with neither a Canvas ID nor an SIS ID cannot be matched: they are left out
    and returned by name."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*CANVAS_HEADER, *(lab["lab"] for lab in labs)])
    writer.writerow(["Points Possible", "", "", "", "", *(number_cell(lab["max_score"]) for lab in labs)])
    left_out = []
    for p in people:
        if not (p["canvas_id"] or p["sis_id"] or p["sis_login_id"]):
            left_out.append(p["learner"])
            continue
        writer.writerow([text_cell(p["name"] or p["learner"]), text_cell(p["canvas_id"]), text_cell(p["sis_id"]),
                         text_cell(p["sis_login_id"]), text_cell(p["section"]),
                         *(number_cell(p["scores"].get(lab["lab"])) for lab in labs)])
    return buf.getvalue(), left_out


def release_feedback(folder, to) -> list[Path]:
    """One Markdown file per learner of a cohort's (or merge's) ``folder`` into ``to``, named after the
    learner: the autograder's feedback with the instructor's part, or, for a learner with no
    submission, a note saying so (with any written-answer scores or overrides)."""
    from grader.cohort import learner_dir

    folder, to = Path(folder), Path(to)
    book = read_lab(folder)
    to.mkdir(parents=True, exist_ok=True)
    written = []
    for row in book["rows"]:
        source = folder / row["folder"] / "feedback.md" if row["folder"] else None
        if source and source.exists():
            text = with_sections(source.read_text(encoding="utf-8"), row)
        else:
            text = (f"# Feedback: lab {book['lab']}\n\nNo submission of yours was received for this lab; "
                    "it scores 0 unless your instructor says otherwise below.\n\n" + feedback_sections(row))
        target = to / (learner_dir(to, row["learner"]).name + ".md")
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written
