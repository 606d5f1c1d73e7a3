"""The grader's command line: ``python -m grader <command>``.

Commands and options are a fixed contract (instructors' scripts rely on them); README.md, "For
instructors", describes each command and the ``result.json`` it writes.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def _release(args) -> int:
    from grader.release import ReleaseError, release

    try:
        report = release(check=args.check, force=args.force)
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if report.changed:
            print("labs/ is stale (it matches neither solutions/ nor the committed labs); run "
                  "`python -m grader release` and commit the result:\n  "
                  + "\n  ".join(report.changed), file=sys.stderr)
            return 1
        print("labs/ is up to date with solutions/.")
        return 0
    print("\n".join(f"wrote {c}" for c in report.changed) or "labs/ already up to date.")
    if report.kept:
        print(_kept_message(report.kept), file=sys.stderr)
        return 1
    return 0


def _kept_message(kept: dict[str, str]) -> str:
    lines = ["release did NOT overwrite these labs, because they hold your work:"]
    for path, reason in kept.items():
        lines.append(f"  {path}: {reason}")
    example = next(iter(kept))
    lines += ["To keep your work and get the new lab, move your file aside, then run release again:",
              f"  mv {example} {example[:-len('.ipynb')]}.mine.ipynb",
              "  python -m grader release",
              "To throw your work away and overwrite: python -m grader release --force"]
    return "\n".join(lines)


def _export(args) -> int:
    from grader.notebooks import InvalidNotebook, answer_cells, export_source, read_notebook
    from grader.release import ROOT

    try:
        nb = read_notebook(args.notebook)
    except InvalidNotebook as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    stem = args.lab or Path(args.notebook).stem
    solution = ROOT / "solutions" / f"{stem}.ipynb"
    if not solution.exists():
        print(f"export failed: no lab {stem!r} (no solutions/{stem}.ipynb); pass --lab STEM.",
              file=sys.stderr)
        return 2
    params = {"DEVICE": args.device} if args.device else None
    source = export_source(read_notebook(solution), answer_cells(nb), parameters=params,
                           title=f"Lab {stem} from {Path(args.notebook).name}")
    Path(args.output).write_text(source, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


def _grade(args) -> int:
    from grader.grade import grade_to_dir
    from grader.report import table

    out = Path(args.out) if args.out else Path("grades") / Path(args.notebook).stem
    result = grade_to_dir(args.notebook, out, lab=args.lab, device=_device(args.device), seed=args.seed,
                          timeout_s=args.timeout, deadline_s=args.deadline, notebook_run=not args.no_notebook_run)
    print(table(result))
    print(f"wrote {out}/result.json, feedback.md, junit.xml")
    if result["status"] != "graded":
        return 2
    if args.fail_under is not None and result["max_score"] and \
            100.0 * result["score"] / result["max_score"] < args.fail_under:
        return 1
    return 0


def _cohort(args) -> int:
    from grader.cohort import cohort

    try:
        results = cohort(args.folder, args.lab, args.out, jobs=args.jobs, shard=args.shard, roster=args.roster,
                         say=print, dry_run=args.dry_run, **_gradebook_settings(args), device=_device(args.device),
                         seed=args.seed, timeout_s=args.timeout, deadline_s=args.deadline,
                         notebook_run=not args.no_notebook_run)
    except (KeyError, ValueError) as exc:
        print(f"cohort failed: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("dry run: nothing graded; check the intake above, then run again without --dry-run.")
        return 0
    graded = [r for r in results if r["status"] == "graded"]
    print(f"graded {len(graded)} of {len(results)} submissions; gradebook: {Path(args.out) / 'gradebook.csv'}")
    return 0


def _gradebook_settings(args) -> dict:
    return {"overrides": args.overrides, "scores": args.scores, "due": args.due, "late_policy": args.late_policy,
            "times": args.times}


def _merge(args) -> int:
    from grader.cohort import merge

    try:
        results = merge(args.dirs, args.out, allow_incomplete=args.allow_incomplete, say=print,
                        **_gradebook_settings(args))
    except ValueError as exc:
        print(f"merge failed: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(results)} results into {Path(args.out) / 'gradebook.csv'}")
    return 0


def _gradescope(args) -> int:
    from grader.gradescope import write_bundle

    try:
        out = write_bundle(args.lab, args.output, device=args.device, seed=args.seed, timeout_s=args.timeout,
                           deadline_s=args.deadline, notebook_run=not args.no_notebook_run, details=args.details)
    except (KeyError, ValueError) as exc:
        print(f"gradescope failed: {exc}", file=sys.stderr)
        return 2
    from grader.checks import exercises

    points = sum(ex.points for ex in exercises(args.lab).values())
    print(f"wrote {out}: upload it as the assignment's autograder (zip a folder's contents, not the folder); "
          f"set the assignment's points to {points:g}, the lab's maximum, and its autograder timeout to at least "
          f"{math.ceil(args.deadline / 60) + 2} minutes (--deadline plus start-up).")
    return 0


def _gradebook(args) -> int:
    from grader.gradebook import canvas_csv, course, course_csv

    try:
        labs, people = course(args.dirs)
    except ValueError as exc:
        print(f"gradebook failed: {exc}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(course_csv(labs, people), encoding="utf-8")
    print(f"wrote {args.out}: {len(people)} learners, {len(labs)} labs")
    if args.canvas:
        text, left_out = canvas_csv(labs, people)
        Path(args.canvas).write_text(text, encoding="utf-8")
        print(f"wrote {args.canvas} (Canvas: Grades > Import)")
        if left_out:
            print(f"left out of {args.canvas}, having no canvas_id, sis_id or sis_login_id in the roster: "
                  f"{', '.join(left_out)}", file=sys.stderr)
    return 0


def _release_feedback(args) -> int:
    from grader.gradebook import release_feedback

    try:
        written = release_feedback(args.folder, args.to)
    except ValueError as exc:
        print(f"release-feedback failed: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} feedback files into {args.to}")
    return 0


def _answers(args) -> int:
    from grader.answers import write_answers

    try:
        written = write_answers(args.folder, args.lab, args.out)
    except (KeyError, ValueError) as exc:
        print(f"answers failed: {exc}", file=sys.stderr)
        return 2
    pages = [p for p in written if p.suffix == ".html"]
    print(f"wrote {len(pages)} review pages (HTML and Markdown) and {written[-1]} into {args.out}")
    return 0


def _bench(args) -> int:
    from grader.bench import bench_notebook

    return bench_notebook(args.notebook, lab=args.lab, device=_device(args.device), out=args.out)


def _device(requested: str) -> str:
    from gpulab.device import pick_device

    return pick_device(requested)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default, except where there is none to show (no value, a plain flag);
    descriptions keep their line breaks."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _grading_options(p) -> None:
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                   help="where the answers run; auto picks cuda when a GPU is visible")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the hidden cases and of the answers' random generators (default: a secret one "
                        "per run, recorded in result.json); pass it again to regrade identically")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds allowed per exercise")
    p.add_argument("--deadline", type=float, default=1200.0, metavar="S",
                   help="seconds allowed per submission, all exercises and the notebook run together; "
                        "exercises still running then score 0 as timeout")
    p.add_argument("--no-notebook-run", action="store_true",
                   help="skip running the rebuilt notebook top to bottom (faster; scores are unaffected)")


def _gradebook_options(p, merge: bool = False) -> None:
    shards = " (default: as the shards were graded)" if merge else ""
    p.add_argument("--overrides", metavar="FILE.csv",
                   help="your changes by hand: learner, exercise (or total), points, comment; never written by "
                        "the grader, applied on every run" + shards)
    p.add_argument("--scores", metavar="FILE",
                   help="written-answer scores (CSV, or YAML): learner, question, points, comment; a column "
                        "interview:<question> each" + shards)
    p.add_argument("--due", metavar="ISO8601", help="due time, e.g. 2026-03-01T23:59:00+01:00 (no zone: UTC)" + shards)
    p.add_argument("--late-policy", metavar="POLICY",
                   help="none, zero, percent-per-day:P, optionally after grace:HOURS, (e.g. grace:2,percent-per-day:10)"
                        + (shards or " (default: none, lateness recorded only)"))
    p.add_argument("--times", metavar="FILE.csv",
                   help="submission times: learner, submitted_at (ISO 8601); default: each file's mtime" + shards)


RELEASE_HELP = """\
Regenerate labs/NN_name.ipynb from every solutions/NN_name.ipynb.

This REWRITES the files in labs/. A lab that holds a learner's work (answers typed into it, or
outputs of cells that were run) is not overwritten: release names it and exits 1. Move such a file
aside to keep it (mv labs/X.ipynb labs/X.mine.ipynb), or pass --force to overwrite it and lose the
work. --check writes nothing: it exits 1 when the generated labs match neither labs/ nor the labs
committed in git."""

GRADESCOPE_HELP = """\
Write a Gradescope autograder for one lab: setup.sh (installs Python, bubblewrap, torch and the
course into /autograder/venv), run_autograder (grades the one .ipynb of a submission with the
sandboxed grader, writes results/results.json: one test per exercise), gradescope.json (these
options) and the course files grading needs, so grading works offline.

--device cpu (the default) installs torch's CPU wheels; --device cuda or auto installs PyPI's CUDA
wheels and grades on the GPU when one is visible. --seed fixes the hidden cases for every learner:
leave it out for a secret seed per submission (recorded in results.json's extra_data)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grader", formatter_class=_HelpFormatter,
        description="Release labs, grade submissions, and time kernels for GPU Systems Lab.",
        epilog="Each command has its own help, e.g. `python -m grader grade --help`. README.md "
               "(section \"For instructors\") describes the commands and result.json. Run the grader with the "
               "project's Python, `.venv/bin/python -m grader ...` (`make setup` creates it): the system Python "
               "lacks PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help, description=None):
        return sub.add_parser(name, help=help, description=description or help, formatter_class=_HelpFormatter)

    p = command("release", "generate labs/ from solutions/ (rewrites labs/; see --force)", RELEASE_HELP)
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if labs/ is stale (CI and `make test` run this)")
    p.add_argument("--force", action="store_true",
                   help="also overwrite labs that hold a learner's answers or outputs (that work is lost)")
    p.set_defaults(func=_release)

    p = command("export", "a notebook's answer cells and the code they need, as an importable module")
    p.add_argument("notebook", help="the submission (.ipynb)")
    p.add_argument("-o", "--output", required=True, help="the module to write (.py)")
    p.add_argument("--lab", help="lab stem, e.g. 02_triton_basics (default: the notebook's file name)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   help="set DEVICE in the exported module (default: the solution's, \"auto\")")
    p.set_defaults(func=_export)

    p = command("grade", "grade one submission: result.json, feedback.md, junit.xml")
    p.add_argument("notebook", help="the submission (.ipynb)")
    p.add_argument("--lab", help="lab stem, e.g. 02_triton_basics (default: found from the answer cells)")
    p.add_argument("--out", help="output folder (default: grades/<submission name>)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PERCENT",
                   help="exit 1 when the score is below PERCENT of the maximum (default: exit 0 whenever graded)")
    _grading_options(p)
    p.set_defaults(func=_grade)

    p = command("cohort", "grade every .ipynb of a folder: one result per submission, gradebook.csv")
    p.add_argument("folder", help="folder of submissions (.ipynb files, a folder per learner, .zip archives), "
                                   "or a platform's bulk download (.zip)")
    p.add_argument("--lab", required=True, help="lab stem, e.g. 02_triton_basics")
    p.add_argument("--out", required=True, help="output folder: a result folder per submission, gradebook.csv")
    p.add_argument("--jobs", type=int, default=2, help="submissions graded at the same time")
    p.add_argument("--shard", metavar="K/N",
                   help="grade only every N-th submission from the K-th (1-based); combine shards with "
                        "`merge` (default: all submissions)")
    _grading_options(p)

    p.add_argument("--roster", metavar="FILE.csv",
                   help="the class list: columns learner, submission (path or glob, optional), email, sis_id, "
                        "canvas_id ...; learners without a submission appear as missing")
    p.add_argument("--dry-run", action="store_true",
                   help="find the submissions, place them on the roster and write intake.csv, but grade nothing")
    _gradebook_options(p)
    p.set_defaults(func=_cohort)

    p = command("merge", "combine cohort shard folders into one gradebook")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="the --out folders of the cohort shards")
    p.add_argument("--out", required=True, help="folder for the merged results and gradebook.csv")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="merge even when shards are missing, given twice or from different submission sets")
    _gradebook_options(p, merge=True)
    p.set_defaults(func=_merge)

    p = command("gradescope", "build a Gradescope autograder for one lab (a folder, or a .zip)", GRADESCOPE_HELP)
    p.add_argument("--lab", required=True, help="lab stem, e.g. 01_performance_model")
    p.add_argument("-o", "--output", required=True,
                   help="where to write the bundle: a folder, or a zip when it ends in .zip")
    p.add_argument("--details", default="after_due_date",
                   choices=["visible", "after_due_date", "after_published", "hidden"],
                   help="when learners see the first failing case's details (it may be a hidden case); the score "
                        "and the cases-passed count of each exercise are always visible")
    _grading_options(p)
    p.set_defaults(func=_gradescope)

    p = command("gradebook", "a course gradebook across labs from cohort/merge folders, and Canvas's import CSV")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="one cohort or merge --out folder per lab")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="the course gradebook: a row per learner, "
                                                                    "a column per lab")
    p.add_argument("--canvas", metavar="FILE.csv", help="also write Canvas's gradebook import file")
    p.set_defaults(func=_gradebook)

    p = command("release-feedback", "one feedback file per learner, for upload, from a cohort/merge folder")
    p.add_argument("folder", help="a cohort or merge --out folder")
    p.add_argument("--to", required=True, metavar="DIR", help="where to write <learner>.md")
    p.set_defaults(func=_release_feedback)


    p = command("answers", "the written interview answers of a folder of submissions: a review page per "
                           "question and a blank scores.csv")
    p.add_argument("folder", help="folder of submissions (.ipynb), as for cohort")
    p.add_argument("--lab", required=True, help="lab stem, e.g. 02_triton_basics")
    p.add_argument("--out", required=True,
                   help="output folder: a page per question (q1.html, q2.html, ..., and the same in Markdown) and "
                        "scores.csv (learner,question,points,comment) to fill in for merge --scores")
    p.set_defaults(func=_answers)

    p = command("bench", "time a notebook's kernels against PyTorch on this device")
    p.add_argument("notebook", help="the submission or solution (.ipynb)")
    p.add_argument("--lab", help="lab stem, e.g. 02_triton_basics (default: found from the answer cells)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to time; auto picks cuda when a GPU is visible")
    p.add_argument("--out", help="folder for bench.json (default: print only)")
    p.set_defaults(func=_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
