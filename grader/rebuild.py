"""Does the rebuilt lab run top to bottom? The solution's cells with the learner's answers, executed
with papermill inside the grader's sandbox. Reported next to the scores, never instead of them.
Needs papermill (a Jupyter machine); elsewhere it is reported as skipped.

The notebook travels in over stdin and the executed notebook comes back over stdout (``papermill -
-``), so the run reads and writes no file of this machine. Inline ``check`` calls are inert there
(``GPULAB_GRADING=1``): the judge has graded the answers already.
"""
from __future__ import annotations

import copy
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grader import sandbox
from grader.advice import STUB
from grader.notebooks import exercise_id, section_title

OUTPUT_CAP = 64 << 20  # bytes of executed notebook read back; a bigger one is reported as failed
ERROR_CAP = 1500
LOG_CAP = 32 * 1024


def rebuilt_notebook(solution, answers: dict[str, str]):
    """The solution notebook with each answer cell's source replaced by the learner's (a missing
    answer becomes an empty cell)."""
    import nbformat

    nb = nbformat.from_dict(copy.deepcopy(solution))
    for cell in nb.cells:
        eid = exercise_id(cell)
        if eid is not None:
            cell.source = answers.get(eid, "")
        if cell.cell_type == "code":
            cell.metadata = {k: v for k, v in cell.metadata.items() if k in ("tags", "gpulab")}
    return nb


def _cell_name(nb, index: int) -> str:
    """How feedback names a cell: by its exercise, else by the section it sits in (a learner finds a
    heading; cell ids and positions mean nothing to them)."""
    eid = exercise_id(nb.cells[index])
    if eid:
        return f"the cell of exercise `{eid}`"
    section = section_title(nb, index)
    if section:
        return f'the cell under "{section}"'
    number = sum(1 for c in nb.cells[:index + 1] if c.get("cell_type") == "code")
    return f"code cell {number} at the top of the notebook"


def _first_error(executed: dict) -> tuple[int, str] | None:
    """(index in the rebuilt notebook, "Name: value") of the first cell with an error output.

    papermill adds an "injected-parameters" cell and error banners, which the index skips.
    """
    index = 0
    for cell in executed.get("cells", []):
        if not isinstance(cell, dict):
            continue
        tags = cell.get("metadata", {}).get("tags", []) if isinstance(cell.get("metadata"), dict) else []
        if "injected-parameters" in tags or "papermill-error-cell-tag" in tags:
            continue
        for out in cell.get("outputs", []) if isinstance(cell.get("outputs"), list) else []:
            if isinstance(out, dict) and out.get("output_type") == "error":
                return index, f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"
        index += 1
    return None


def _read_back(data: bytes):
    try:
        executed = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return executed if isinstance(executed, dict) and isinstance(executed.get("cells"), list) else None


def _communicate_capped(proc, data: bytes, timeout_s: float) -> tuple[bytes, bytes, bool]:
    """``proc.communicate(data)`` that never holds more than :data:`OUTPUT_CAP` (+1) bytes of stdout
    and :data:`LOG_CAP` of stderr in the judge: a notebook printing gigabytes is stopped, not read.
    Returns ``(stdout, stderr tail, timed_out)``."""
    threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), True
            for key, _ in sel.select(timeout=min(left, 1.0)):
                chunk = key.fileobj.read1(1 << 20) if hasattr(key.fileobj, "read1") else key.fileobj.read(1 << 20)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    out += chunk
                    if len(out) > OUTPUT_CAP:
                        return bytes(out[:OUTPUT_CAP + 1]), bytes(err), False
                else:
                    err += chunk
                    del err[:-LOG_CAP]
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), True
    return bytes(out), bytes(err), False


def _feed(stdin, data: bytes) -> None:
    try:
        stdin.write(data)
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the run ended before reading its notebook: reported from its exit


def run_rebuilt(solution, answers: dict[str, str], device: str, timeout_s: float, log: list | None = None) -> dict:
    """``{"status": "ok" | "failed" | "skipped", "cell": name, "error": text}``.

    ``log``, when given, receives the tail of what papermill and the kernel printed (for grader.log).
    """
    try:
        import nbformat
        import papermill  # noqa: F401 - the sandbox runs its command line
    except ImportError:
        return {"status": "skipped", "error": "papermill is not installed on this machine."}
    nb = rebuilt_notebook(solution, answers)
    code_cells = sum(1 for c in nb.cells if c.cell_type == "code")
    budget = 60 + timeout_s * max(1, code_cells) / 4
    argv = [sys.executable, "-m", "papermill", "-", "-", "-k", "python3", "-p", "DEVICE", device, "-p", "SEED", "0",
            "--no-progress-bar", "--no-log-output", "--execution-timeout", str(int(timeout_s))]
    with tempfile.TemporaryDirectory(prefix="gpulab-nb-") as tmp:
        launch = sandbox.wrap(argv, device=device, cpu_seconds=budget, cwd_outside=Path(tmp))
        try:
            proc = subprocess.Popen(launch.command, cwd=launch.cwd, env=launch.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=launch.preexec,
                                    start_new_session=True)
        except OSError as exc:
            launch.cleanup()
            return {"status": "skipped", "error": f"could not start papermill ({exc})."}
        try:
            out, err, timed_out = _communicate_capped(proc, nbformat.writes(nb).encode(), budget)
        finally:
            sandbox.stop(proc)
            launch.cleanup()
    if log is not None:
        log.append("--- notebook run (papermill) ---\n" + err[-LOG_CAP:].decode("utf-8", "replace"))
    if timed_out:
        return {"status": "failed", "cell": None, "error": f"the notebook did not finish within {budget:g} s."}
    if len(out) > OUTPUT_CAP:
        return {"status": "failed", "cell": None,
                "error": f"the executed notebook is larger than {OUTPUT_CAP >> 20} MiB (a cell printing or "
                         "displaying far too much); print less."}
    executed = _read_back(out)
    failing = _first_error(executed) if executed else None
    if failing is not None:
        index, error = failing
        stub = STUB.search(error) if error.startswith("NotImplementedError") else None
        if stub:  # a locked cell reached an answer still left as released: say which, not the stub's words
            error = f"NotImplementedError: this cell uses exercise `{stub.group(1)}`, which is not written yet."
        return {"status": "failed", "cell": _cell_name(nb, index) if index < len(nb.cells) else f"cell {index}",
                "error": error[:ERROR_CAP]}
    if proc.returncode == 0 and executed is not None:
        return {"status": "ok"}
    reason = err.decode("utf-8", "replace").strip().splitlines()
    return {"status": "failed", "cell": None,
            "error": ("the kernel died or the run was stopped: "
                      + (reason[-1] if reason else "no message"))[:ERROR_CAP]}
