"""``python -m grader release``: generate ``labs/`` from ``solutions/``.

Release is a short, ordered list of transforms on each solution notebook:
1. check every solution region (``### BEGIN SOLUTION`` ... ``### END SOLUTION``): none nested,
   none unclosed, and every answer cell has one;
2. replace each code region with a stub that raises ``NotImplementedError`` and keeps the
   ``### HINT:`` lines as comments (signature and docstring sit outside the region and stay);
   replace each markdown region with a space for the learner's answer;
3. clear outputs and execution counts;
4. put the "generated" banner on top of the first cell; store the kernelspec JupyterLab writes and
   a digest of the cells, by which a later release tells a learner's edits from its own output.

Points are declared once, in the lab's ``grader/checks/NN_name.py``: release copies each exercise's
points into the answer cell's metadata, in ``labs/`` and in ``solutions/`` alike (``--check`` reports
a solution whose copy differs), so the notebooks never disagree with the grade.

Writing never destroys a learner's work: a lab that holds answers or outputs is kept unless
``force``. ``check`` compares with the committed lab (git HEAD) as well as the working copy, so
answers saved in ``labs/`` do not make the check fail.
"""
from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from gpulab.paths import ROOT
from grader.notebooks import InvalidNotebook, exercise_id, read_notebook

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
BANNER = ("> **Generated** from `solutions/{name}` by `python -m grader release`. Course maintainers: "
          "edit the solution, not this file. Learners: work here, replacing every "
          "`raise NotImplementedError`.\n\n")


# What JupyterLab 4 writes into a notebook it opens with ipykernel: the kernelspec from the kernel's
# kernel.json and the language_info of its kernel_info reply. Storing exactly this keeps opening a
# notebook from marking it modified (and autosave from rewriting a tracked file). "version" is the
# course environment's Python (3.11.7); on another Python only that field changes.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3", "version": "3.11.7"}


class ReleaseError(ValueError):
    """A solution notebook cannot be released; the message names the notebook and cell."""


def _stub_code(region: list[str], indent: str, eid: str | None, where_in: str | None = None) -> list[str]:
    hints = [line.strip()[len(HINT):].strip() for line in region if line.strip().startswith(HINT)]
    out = [f"{indent}# Hint: {h}" for h in hints]
    what = f"exercise `{eid}`" if eid else "this part"
    if where_in:  # several stubs in one exercise: say which one still raises
        what += f", {where_in}"
    out.append(f'{indent}raise NotImplementedError("{what}: replace this line with your code.")')
    return out


def _enclosing(lines: list[str], indent: str) -> str | None:
    """``"function `f`"``, ``"method `C.f`"`` or ``"class `C`"``: the definitions around a region that
    starts at ``indent``, after ``lines`` (the cell so far)."""
    names, kind, level = [], None, len(indent)
    for line in reversed(lines):
        stripped = line.lstrip()
        depth = len(line) - len(stripped)
        if not stripped or depth >= level:
            continue
        level = depth
        for word, what in (("def ", "function"), ("async def ", "function"), ("class ", "class")):
            if stripped.startswith(word):
                names.insert(0, stripped[len(word):].split("(")[0].split(":")[0].strip())
                kind = kind or what
        if level == 0:
            break
    if not names:
        return None
    if kind == "function" and len(names) > 1:
        kind = "method"
    return f"{kind} `{'.'.join(names)}`"


def strip_regions(source: str, *, markdown: bool, where: str, eid: str | None = None) -> tuple[str, int]:
    """Replace every solution region in ``source``; return the new source and the region count."""
    lines = source.split("\n")
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    count = 0
    several = sum(line.strip().startswith(BEGIN) for line in lines) > 1
    for number, line in enumerate(lines, start=1):
        marker = line.strip()
        if marker.startswith(BEGIN):
            if region is not None:
                raise ReleaseError(f"{where}: nested '{BEGIN}' at line {number}; close the first region first.")
            region, indent = [], line[: len(line) - len(line.lstrip())]
            count += 1
        elif marker.startswith(END):
            if region is None:
                raise ReleaseError(f"{where}: '{END}' at line {number} without a '{BEGIN}' before it.")
            where_in = _enclosing(out, indent) if several and not markdown else None
            out.extend(["_Your answer here._"] if markdown else _stub_code(region, indent, eid, where_in))
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise ReleaseError(f"{where}: '{BEGIN}' is never closed by '{END}'.")
    return "\n".join(out), count


def with_declared_points(nb: nbformat.NotebookNode, stem: str, where: str) -> nbformat.NotebookNode:
    """``nb`` with each answer cell's ``points`` set from the lab's check file (in place)."""
    from grader.checks import exercises, lab_stems

    if stem not in lab_stems():
        return nb  # a lab without checks yet (or a test's demo): nothing declares its points
    declared = exercises(stem)
    for i, cell in enumerate(nb.cells):
        eid = exercise_id(cell)
        if eid is None:
            continue
        if eid not in declared:
            raise ReleaseError(f"{where}, cell {i}: exercise {eid!r} is not declared in grader/checks/{stem}.py.")
        cell.metadata["gpulab"]["points"] = declared[eid].points
    return nb


def release_notebook(solution_path: Path) -> nbformat.NotebookNode:
    """The generated lab notebook for one solution notebook (nothing is written)."""
    nb = nbformat.from_dict(copy.deepcopy(read_notebook(solution_path)))
    with_declared_points(nb, solution_path.stem, solution_path.name)
    for i, cell in enumerate(nb.cells):
        where = f"{solution_path.name}, cell {i} (id {cell.get('id', '?')})"
        eid = exercise_id(cell)
        source, count = strip_regions(cell.source, markdown=cell.cell_type == "markdown",
                                      where=where, eid=eid)
        if eid and count == 0:
            raise ReleaseError(f"{where}: answer cell of exercise {eid!r} has no '{BEGIN}' region.")
        cell.source = source
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        raise ReleaseError(f"{solution_path.name}: the first cell must be the markdown title cell.")
    nb.cells[0].source = BANNER.format(name=solution_path.name) + nb.cells[0].source
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = copy.deepcopy(LANGUAGE_INFO)
    nb.metadata["gpulab"] = {"generated_from": f"solutions/{solution_path.name}",
                             "cells_digest": cells_digest(nb)}
    return nb


def render(nb) -> str:
    return nbformat.writes(nb) + "\n"


def cells_digest(nb) -> str:
    """A digest of every cell's id, type and source: what a learner changes by working in a lab."""
    def text(source):  # stored files split sources into lines
        return "".join(source) if isinstance(source, list) else source

    cells = [[c.get("id"), c.get("cell_type"), text(c.get("source", ""))] for c in nb["cells"]]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def committed_text(root: Path, relpath: str) -> str | None:
    """``relpath`` as committed at git HEAD; ``None`` outside a git checkout or when not committed."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "show", f"HEAD:./{relpath}"],
                              capture_output=True, encoding="utf-8", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _digest_of(text: str | None) -> str | None:
    try:
        return cells_digest(json.loads(text)) if text else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def learner_work(path: Path, known_texts: list[str | None]) -> str | None:
    """Why the lab at ``path`` holds a learner's work (answers or outputs), or ``None`` if it does not.

    Its cells are untouched when their digest is one a release wrote: the digest stored in the file
    itself, or that of a known generated version (``known_texts``: the new one, the committed one).
    """
    try:
        nb = read_notebook(path)
    except InvalidNotebook as exc:
        return f"it cannot be read as a notebook ({exc})"
    if any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code"):
        return "it has outputs (its cells were run)"
    stored = nb.get("metadata", {}).get("gpulab", {}).get("cells_digest")
    if cells_digest(nb) not in {stored, *map(_digest_of, known_texts)} - {None}:
        return "its cells differ from the generated lab (your answers or notes)"
    return None


def _generated_from(path: Path) -> str | None:
    """The solution a file in ``labs/`` was generated from (``None`` for a learner's own notebook)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("gpulab", {})
    except (OSError, ValueError, AttributeError):
        return None
    source = meta.get("generated_from") if isinstance(meta, dict) else None
    return source if isinstance(source, str) else None


@dataclass
class ReleaseReport:
    """What :func:`release` found: ``changed`` labs (stale with ``check``, else written or removed)
    and ``kept`` labs holding a learner's work that it refused to overwrite (``{path: reason}``)."""

    changed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def release(root: Path | None = None, check: bool = False, force: bool = False) -> ReleaseReport:
    """Write (or with ``check`` only compare) ``labs/`` for every solution.

    ``check``: a lab is stale when the generated text matches neither the working copy nor the
    committed file (git HEAD), so a learner's saved answers do not make it stale. Writing keeps a
    lab that holds a learner's work (see :func:`learner_work`) unless ``force``.
    """
    root = ROOT if root is None else Path(root)
    solutions = sorted((root / "solutions").glob("*.ipynb"))
    labs_dir = root / "labs"
    report = ReleaseReport()
    for path in solutions:
        solution_text = path.read_text(encoding="utf-8")
        synced = render(with_declared_points(nbformat.reads(solution_text, as_version=4), path.stem, path.name))
        if synced != solution_text:
            if check:
                report.changed.append(f"solutions/{path.name} (points differ from grader/checks/{path.stem}.py)")
            else:
                path.write_text(synced, encoding="utf-8")
                report.changed.append(f"solutions/{path.name} (points from grader/checks/{path.stem}.py)")
        text = render(release_notebook(path))
        rel = f"labs/{path.name}"
        target = root / rel
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if text == current:
            continue
        committed = committed_text(root, rel)
        if check:
            if text != committed:
                report.changed.append(rel)
            continue
        work = learner_work(target, [text, committed]) if current is not None and not force else None
        if work:
            report.kept[rel] = work
            continue
        labs_dir.mkdir(exist_ok=True)
        target.write_text(text, encoding="utf-8")
        report.changed.append(rel)
    for orphan in sorted(labs_dir.glob("*.ipynb")):
        source = _generated_from(orphan)
        if source is None or (root / source).exists():
            continue  # a learner's own notebook, or a copy of a lab that still exists
        rel = f"labs/{orphan.name}"
        if check:
            report.changed.append(f"{rel} (no solution)")
            continue
        work = None if force else learner_work(orphan, [committed_text(root, rel)])
        if work:
            report.kept[rel] = work
            continue
        orphan.unlink()
        report.changed.append(f"{rel} (no solution; removed)")
    return report
