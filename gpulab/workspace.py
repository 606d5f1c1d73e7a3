"""Your workspace: personal copies of the lessons, labs and drills, where all your work lives (lesson 00).

``make lab`` calls :func:`prepare` before JupyterLab opens ``workspace/notebooks/00_start_here.ipynb``.
The course's own notebooks (``notebooks/``, ``labs/``) are tracked by git and never touched by your
work, so ``git pull`` updates them and ``make test`` passes whatever you ran or saved. ``workspace/``
is git-ignored:

- a notebook is copied there on first use and never overwritten: your answers, outputs and verdicts
  stay;
- a lesson or lab new in the course appears in the workspace at the next ``make lab``;
- to take the course's new version of a notebook you already started,
  ``python -m gpulab.workspace --update 07_mixed_precision`` keeps yours beside it as
  ``07_mixed_precision.mine-<date>.ipynb`` and copies the new one in.

Read-only folders the notebooks read by relative path (``benchmarks/``) are linked into the workspace,
so ``../benchmarks/...`` works from ``workspace/labs`` as it does from ``labs``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from gpulab.paths import ROOT

FOLDERS = ("notebooks", "labs")  # copied, notebook by notebook
LINKED = ("benchmarks",)  # read by relative path from the notebooks: linked, never copied


def workspace_dir() -> Path:
    """``workspace/`` at the project root, or ``$GPULAB_WORKSPACE`` (relative paths: from the root)."""
    return ROOT / os.environ.get("GPULAB_WORKSPACE", "workspace")


def prepare(workspace: Path | None = None, root: Path = ROOT) -> list[str]:
    """Copy every course notebook that the workspace lacks; return the new copies (relative paths)."""
    workspace = Path(workspace) if workspace is not None else workspace_dir()
    copied = []
    for folder in FOLDERS:
        for source in sorted((root / folder).glob("*.ipynb")):
            target = workspace / folder / source.name
            if target.exists():
                continue  # yours: never overwritten
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(f"{folder}/{source.name}")
    for folder in LINKED:
        link = workspace / folder
        if not link.exists() and not link.is_symlink() and (root / folder).is_dir():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(root / folder, link.parent), target_is_directory=True)
    return copied


def _course_notebook(name: str, root: Path) -> tuple[str, Path]:
    """``("labs", root/labs/07_x.ipynb)`` for ``"07_x"``, ``"labs/07_x"`` or ``"labs/07_x.ipynb"``."""
    stem = Path(name).name.removesuffix(".ipynb")
    folders = [Path(name).parent.name] if Path(name).parent.name in FOLDERS else list(FOLDERS)
    if "notebooks" in folders and "labs" in folders:
        folders = ["labs", "notebooks"]  # a stem shared by a lesson and a lab: the lab is the one you work in
    for folder in folders:
        path = root / folder / f"{stem}.ipynb"
        if path.exists():
            return folder, path
    raise SystemExit(f"no course notebook called {name!r}: give a stem like 07_mixed_precision, or "
                     f"notebooks/07_mixed_precision for the lesson")


def update(name: str, workspace: Path | None = None, root: Path = ROOT) -> str:
    """Replace your copy of ``name`` with the course's version, keeping yours beside it; say what was done."""
    workspace = Path(workspace) if workspace is not None else workspace_dir()
    folder, source = _course_notebook(name, root)
    target = workspace / folder / source.name
    kept = ""
    if target.exists():
        mine = target.with_name(f"{source.stem}.mine-{time.strftime('%Y-%m-%d-%H%M%S')}.ipynb")
        target.rename(mine)
        kept = f"; your copy is now {mine.relative_to(workspace)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return f"{folder}/{source.name}: the course's current version{kept}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.workspace",
                                     description="Make your workspace (copies of the course's notebooks, never "
                                                 "overwritten) or take a new version of one notebook.")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the workspace folder (default: workspace/ at the project root)")
    parser.add_argument("--update", nargs="+", metavar="NAME", default=[],
                        help="take the course's new version of these notebooks (yours is kept as *.mine-<date>)")
    args = parser.parse_args(argv)
    workspace = None if args.dir is None else (args.dir if args.dir.is_absolute() else Path.cwd() / args.dir)
    for name in args.update:
        print(f"gpulab workspace: {update(name, workspace)}")
    copied = prepare(workspace)
    where = workspace or workspace_dir()
    if copied:
        print(f"gpulab workspace: {len(copied)} notebooks copied into {where} (your work lives there; the course's "
              f"own notebooks stay untouched, so `git pull` updates them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
