"""The grader's command line (the contract is fixed in design.md)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _release(args) -> int:
    from grader.release import ReleaseError, release

    try:
        changed = release(check=args.check)
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print("labs/ is stale; run `python -m grader release` and commit the result:\n  "
                  + "\n  ".join(changed), file=sys.stderr)
            return 1
        print("labs/ is up to date with solutions/.")
        return 0
    print("\n".join(f"wrote {c}" for c in changed) or "labs/ already up to date.")
    return 0


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
                          timeout_s=args.timeout, notebook_run=not args.no_notebook_run)
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
        results = cohort(args.folder, args.lab, args.out, jobs=args.jobs, shard=args.shard,
                         device=_device(args.device), seed=args.seed, timeout_s=args.timeout,
                         notebook_run=not args.no_notebook_run)
    except (KeyError, ValueError) as exc:
        print(f"cohort failed: {exc}", file=sys.stderr)
        return 2
    graded = [r for r in results if r["status"] == "graded"]
    print(f"graded {len(graded)} of {len(results)} submissions; gradebook: {Path(args.out) / 'gradebook.csv'}")
    return 0


def _merge(args) -> int:
    from grader.cohort import merge

    try:
        results = merge(args.dirs, args.out)
    except ValueError as exc:
        print(f"merge failed: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(results)} results into {Path(args.out) / 'gradebook.csv'}")
    return 0


def _bench(args) -> int:
    from grader.bench import bench_notebook

    return bench_notebook(args.notebook, lab=args.lab, device=_device(args.device), out=args.out)


def _device(requested: str) -> str:
    from gpulab.device import pick_device

    return pick_device(requested)


def _grading_options(p) -> None:
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=None, help="hidden-case seed (default: secret, per run)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per exercise (default 60)")
    p.add_argument("--no-notebook-run", action="store_true",
                   help="skip running the rebuilt notebook top to bottom (faster; scores are unaffected)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("release", help="generate labs/ from solutions/")
    p.add_argument("--check", action="store_true", help="exit 1 if labs/ is stale, write nothing")
    p.set_defaults(func=_release)
    p = sub.add_parser("export", help="a notebook's answer cells and the code they need, as a module")
    p.add_argument("notebook")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--lab", help="lab stem, if the file name is not the lab's")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="set DEVICE in the exported module")
    p.set_defaults(func=_export)
    p = sub.add_parser("grade", help="grade one submission")
    p.add_argument("notebook")
    p.add_argument("--lab", help="lab stem (default: found from the answer cells)")
    p.add_argument("--out", help="output folder (default grades/<submission>)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PERCENT",
                   help="exit 1 when the score is below PERCENT of the maximum")
    _grading_options(p)
    p.set_defaults(func=_grade)
    p = sub.add_parser("cohort", help="grade every .ipynb of a folder")
    p.add_argument("folder")
    p.add_argument("--lab", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--shard", help="K/N: grade the K-th of N interleaved slices (1-based)")
    _grading_options(p)
    p.set_defaults(func=_cohort)
    p = sub.add_parser("merge", help="combine cohort shard folders into one gradebook")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_merge)
    p = sub.add_parser("bench", help="time a notebook's kernels against PyTorch on this device")
    p.add_argument("notebook")
    p.add_argument("--lab")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", help="folder for bench.json")
    p.set_defaults(func=_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
