"""Reading notebooks and finding their parts: answer cells, exported cells, the parameters cell.

Metadata the suite relies on (set in ``solutions/``, never trusted from a submission):
- ``cell.metadata.gpulab.exercise`` / ``.points``: an answer cell;
- ``cell.metadata.gpulab.export``: a locked cell the answers need (imports, setup, helpers);
- the ``parameters`` tag (papermill): ``DEVICE`` and ``SEED``.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path


class Node(dict):
    """A notebook (or cell) as a dict with attribute access, like ``nbformat.NotebookNode``.

    Reading needs only the standard library, so grading and benchmarking work on GPU machines
    that have no Jupyter installed.
    """

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


class InvalidNotebook(ValueError):
    """The file is not a readable notebook; the message says why and what to do."""


MAX_NOTEBOOK_BYTES = 50 * 2**20  # a notebook without outputs is well under 1 MB
MAX_DEPTH = 100  # nesting of lists and dicts; a real notebook nests under 20 deep


def _text(value: str) -> str:
    """``value`` with lone surrogates (a JSON ``"\\ud800"`` escape) replaced by U+FFFD."""
    if value.isascii():
        return value
    return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _node(value, depth: int = 0):
    """JSON data as :class:`Node` objects, strings made valid Unicode; too deep is invalid."""
    if depth > MAX_DEPTH:
        raise RecursionError
    if isinstance(value, dict):
        return Node({_text(k): _node(v, depth + 1) for k, v in value.items()})
    if isinstance(value, list):
        return [_node(v, depth + 1) for v in value]
    if isinstance(value, str):
        return _text(value)
    return value


def _read_bytes(path: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_NOTEBOOK_BYTES`, else InvalidNotebook.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before reading, so a FIFO, a device or a
    directory named ``*.ipynb`` is refused instead of blocking or reading forever.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise InvalidNotebook(f"cannot read {path.name}: {exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise InvalidNotebook(f"{path.name} is {kind}; submit the .ipynb file saved by JupyterLab.")
        if info.st_size > MAX_NOTEBOOK_BYTES:
            raise InvalidNotebook(_too_large(path, info.st_size))
        chunks, size = [], 0
        while size <= MAX_NOTEBOOK_BYTES:  # read to the end, even if the file grows meanwhile
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_NOTEBOOK_BYTES:
            raise InvalidNotebook(_too_large(path, size))
        return b"".join(chunks)
    except OSError as exc:
        raise InvalidNotebook(f"cannot read {path.name}: {exc}") from None
    finally:
        os.close(fd)


def _too_large(path: Path, size: int) -> str:
    return (f"{path.name} is {size / 2**20:.1f} MB, more than the {MAX_NOTEBOOK_BYTES // 2**20} MB a notebook "
            "may have: clear all outputs (Edit > Clear Outputs of All Cells), save, and submit again.")


def read_notebook(path) -> Node:
    """Read an ``.ipynb`` file as nbformat 4, or raise :class:`InvalidNotebook` with a clear reason."""
    path = Path(path)
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (some editors add one) is harmless
    except UnicodeDecodeError as exc:
        raise InvalidNotebook(f"{path.name} is not UTF-8 text (byte {exc.start}): it is not a notebook, or it "
                              "is damaged. Re-download or re-save it from JupyterLab.") from None
    damaged = "the file is damaged. Re-download or re-save it from JupyterLab."
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidNotebook(f"{path.name} is not valid JSON (line {exc.lineno}, column {exc.colno}): "
                              f"{damaged}") from None
    except ValueError as exc:  # e.g. a number of more than 4300 digits
        raise InvalidNotebook(f"{path.name} is not valid JSON ({exc}): {damaged}") from None
    except RecursionError:
        raise InvalidNotebook(f"{path.name} nests lists or objects too deeply to be a notebook: {damaged}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise InvalidNotebook(f"{path.name} is JSON but not a Jupyter notebook (no list of cells).")
    fmt = raw.get("nbformat")
    if fmt != 4:
        shown = repr(fmt)[:40] if isinstance(fmt, (int, float, str, type(None))) else type(fmt).__name__
        raise InvalidNotebook(f"{path.name} is notebook format {shown}; save it from JupyterLab (format 4).")
    try:
        nb = _node(raw)
    except RecursionError:
        raise InvalidNotebook(f"{path.name} nests lists or objects more than {MAX_DEPTH} deep, which no "
                              f"notebook does: {damaged}") from None
    for i, cell in enumerate(nb.cells):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise InvalidNotebook(f"{path.name}: cell {i} is not a valid cell.")
        if not isinstance(cell.get("id", ""), str):
            del cell["id"]  # graders look cells up by id, which must be a string
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(s if isinstance(s, str) else "" for s in source)
        cell["source"] = source if isinstance(source, str) else ""
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"] = Node()
    return nb


def gpulab_meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("gpulab", {})
    return meta if isinstance(meta, dict) else {}


def exercise_id(cell) -> str | None:
    """The exercise id of an answer cell, else ``None``."""
    eid = gpulab_meta(cell).get("exercise")
    return eid if isinstance(eid, str) and eid else None


_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def headings(markdown: str) -> list[str]:
    """The heading lines of a Markdown text, without their ``#`` marks (code blocks skipped)."""
    found, in_code = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and (m := _HEADING.match(line)):
            found.append(m.group(2))
    return found


def section_title(nb, index: int) -> str | None:
    """The heading a learner sees above cell ``index`` of ``nb`` (e.g. ``"3 · RMSNorm forward"``): the
    last Markdown heading before it, ``None`` when none comes before it."""
    for cell in reversed(nb.cells[:index]):
        if cell.get("cell_type") == "markdown":
            found = headings(cell.get("source", ""))
            if found:
                return found[-1]
    return None


def is_parameters(cell) -> bool:
    return cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", [])


def answer_cells(nb) -> dict[str, str]:
    """``{exercise_id: source}`` for the answer cells of ``nb`` (the first cell of each id wins)."""
    answers: dict[str, str] = {}
    for cell in nb.cells:
        eid = exercise_id(cell)
        if cell.get("cell_type") == "code" and eid and eid not in answers:
            answers[eid] = cell.get("source", "")
    return answers


_MAGIC = re.compile(r"^(\s*)([%!].*)$", re.MULTILINE)


def strip_magics(source: str) -> str:
    """Comment out IPython magics and shell escapes, which are not Python."""
    return _MAGIC.sub(r"\1# (notebook only) \2", source)


def export_source(solution_nb, answers: dict[str, str], *, title: str = "",
                  parameters: dict | None = None) -> str:
    """A Python module: the solution's parameters and exported cells, with ``answers`` spliced in.

    Cells appear in the solution's order. An exercise missing from ``answers`` keeps no code, so
    its names are simply undefined (the check reports it as not attempted). ``parameters`` are
    assigned right after the parameters cell, as papermill injects them.
    """
    parts = [f'"""{title or "Exported lab"}: generated by `python -m grader export`; do not edit."""']
    for cell in solution_nb.cells:
        if cell.get("cell_type") != "code":
            continue
        eid = exercise_id(cell)
        if eid is not None:
            if eid in answers:
                parts.append(f"# --- answer: {eid} ---\n{strip_magics(answers[eid])}")
        elif is_parameters(cell) or gpulab_meta(cell).get("export"):
            parts.append(strip_magics(cell.get("source", "")))
            if is_parameters(cell) and parameters:
                parts.append("# injected parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
    return "\n\n".join(parts) + "\n"


def exec_source(source: str, filename: str, namespace: dict | None = None) -> dict:
    """Execute module ``source`` and return its namespace.

    The source is registered with ``linecache`` (as IPython does for cells) because Triton reads a
    kernel's source through ``inspect`` when it is decorated.
    """
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns = {"__name__": "__lab__"} if namespace is None else namespace
    exec(compile(source, filename, "exec"), ns)
    return ns
