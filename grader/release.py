"""``python -m grader release``: generate ``labs/`` from ``solutions/``.

Release is a short, ordered list of transforms on each solution notebook:
1. check every solution region (``### BEGIN SOLUTION`` ... ``### END SOLUTION``): none nested,
   none unclosed, and every answer cell has one;
2. replace each code region with a stub that raises ``NotImplementedError`` and keeps the
   ``### HINT:`` lines as comments (signature and docstring sit outside the region and stay);
   replace each markdown region with a space for the learner's answer;
3. clear outputs and execution counts;
4. put the "generated" banner on top of the first cell.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from grader.notebooks import exercise_id, read_notebook

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
ROOT = Path(__file__).resolve().parent.parent
BANNER = ("> **Generated** from `solutions/{name}` by `python -m grader release`. Course maintainers: "
          "edit the solution, not this file. Learners: work here, replacing every "
          "`raise NotImplementedError`.\n\n")


class ReleaseError(ValueError):
    """A solution notebook cannot be released; the message names the notebook and cell."""


def _stub_code(region: list[str], indent: str, eid: str | None) -> list[str]:
    hints = [line.strip()[len(HINT):].strip() for line in region if line.strip().startswith(HINT)]
    out = [f"{indent}# Hint: {h}" for h in hints]
    what = f"exercise `{eid}`" if eid else "this part"
    out.append(f'{indent}raise NotImplementedError("{what}: replace this line with your code.")')
    return out


def strip_regions(source: str, *, markdown: bool, where: str, eid: str | None = None) -> tuple[str, int]:
    """Replace every solution region in ``source``; return the new source and the region count."""
    lines = source.split("\n")
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    count = 0
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
            out.extend(["_Your answer here._"] if markdown else _stub_code(region, indent, eid))
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise ReleaseError(f"{where}: '{BEGIN}' is never closed by '{END}'.")
    return "\n".join(out), count


def release_notebook(solution_path: Path) -> nbformat.NotebookNode:
    """The generated lab notebook for one solution notebook (nothing is written)."""
    nb = nbformat.from_dict(copy.deepcopy(read_notebook(solution_path)))
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
    nb.metadata["gpulab"] = {"generated_from": f"solutions/{solution_path.name}"}
    return nb


def render(nb) -> str:
    return nbformat.writes(nb) + "\n"


def release(root: Path = ROOT, check: bool = False) -> list[str]:
    """Write (or with ``check`` only compare) ``labs/`` for every solution. Returns stale/written names."""
    solutions = sorted((root / "solutions").glob("*.ipynb"))
    labs_dir = root / "labs"
    changed = []
    for path in solutions:
        text = render(release_notebook(path))
        target = labs_dir / path.name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            changed.append(f"labs/{path.name}")
            if not check:
                labs_dir.mkdir(exist_ok=True)
                target.write_text(text, encoding="utf-8")
    expected = {p.name for p in solutions}
    for orphan in sorted(labs_dir.glob("*.ipynb")):
        if orphan.name not in expected:
            changed.append(f"labs/{orphan.name} (no solution)")
            if not check:
                orphan.unlink()
    return changed
