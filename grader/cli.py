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
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
