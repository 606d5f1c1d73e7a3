"""Does the rebuilt lab run top to bottom? The solution's cells with the learner's answers, executed
with papermill. Reported next to the scores, never instead of them. Needs papermill (a Jupyter
machine); elsewhere it is reported as skipped."""
from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

from grader.notebooks import exercise_id


def rebuilt_notebook(solution, answers: dict[str, str]):
    """The solution notebook with each answer cell's source replaced by the learner's (or kept as stub-free
    solution code removed: a missing answer becomes an empty cell)."""
    import nbformat

    nb = nbformat.from_dict(copy.deepcopy(solution))
    for cell in nb.cells:
        eid = exercise_id(cell)
        if eid is not None:
            cell.source = answers.get(eid, "")
        if cell.cell_type == "code":
            cell.metadata = {k: v for k, v in cell.metadata.items() if k in ("tags", "gpulab")}
    return nb


def run_rebuilt(solution, answers: dict[str, str], device: str, timeout_s: float) -> dict:
    """``{"status": "ok" | "failed" | "skipped", "cell": id, "error": text}``."""
    try:
        import nbformat
        import papermill
    except ImportError:
        return {"status": "skipped", "error": "papermill is not installed on this machine."}
    nb = rebuilt_notebook(solution, answers)
    env_before = os.environ.pop("GPULAB_STRICT", None)
    try:
        with tempfile.TemporaryDirectory(prefix="gpulab-nb-") as tmp:
            src, dst = Path(tmp) / "rebuilt.ipynb", Path(tmp) / "executed.ipynb"
            nbformat.write(nb, src)
            try:
                papermill.execute_notebook(str(src), str(dst), parameters={"DEVICE": device, "SEED": 0},
                                           kernel_name="python3", cwd=tmp, progress_bar=False,
                                           execution_timeout=int(timeout_s), log_output=False)
                return {"status": "ok"}
            except papermill.PapermillExecutionError as exc:
                executed = nbformat.read(dst, 4) if dst.exists() else nb
                failing = next((c.get("id") for c in executed.cells if c.cell_type == "code" and any(
                    o.get("output_type") == "error" for o in c.get("outputs", []))), None)
                return {"status": "failed", "cell": failing, "error": f"{exc.ename}: {exc.evalue}"[:1500]}
            except Exception as exc:  # a dead kernel, a timeout
                return {"status": "failed", "cell": None, "error": f"{type(exc).__name__}: {exc}"[:1500]}
    finally:
        if env_before is not None:
            os.environ["GPULAB_STRICT"] = env_before
