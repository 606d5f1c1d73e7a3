"""``python -m grader grade``: grade one submission, trusting nothing it contains but its answers.

1. Read the submission; find the lab (``--lab`` or the answer cells' exercise ids); anything
   unreadable or of another lab is ``invalid``, with a message.
2. Take only the answer cells (by exercise id, else by the lab's cell id; the last copy wins, as it
   would when a notebook runs top to bottom) and splice them into the solution's locked cells.
   Tags and metadata of the submission are ignored.
3. Generate hidden cases from a secret per-run seed, here in the judge.
4. Run the answers in child processes (``grader.worker``) with a timeout per exercise; a crash or a
   hang costs only the exercise it happened in, and a fresh worker carries on with the rest.
5. Judge the observations here, and write ``result.json``, ``feedback.md`` and ``junit.xml``.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.checks import exercises, lab_stems
from grader.exercise import Case, ExerciseResult, judge_case, summarize
from grader.notebooks import InvalidNotebook, answer_cells, export_source, exercise_id, read_notebook
from grader.report import write_reports

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 60.0   # seconds per exercise (its answer cell plus all its cases)
STARTUP_ALLOWANCE = 30.0  # importing torch and triton, and the locked setup cells


def solution_path(stem: str) -> Path:
    return ROOT / "solutions" / f"{stem}.ipynb"


def pick_answers(submission, solution, lab_ids: list[str]) -> dict[str, str]:
    """``{exercise_id: source}`` from the submission: by exercise id, else by the lab's cell id."""
    by_cell_id = {c.get("id"): exercise_id(c) for c in solution.cells if exercise_id(c)}
    answers: dict[str, str] = {}
    for cell in submission.cells:
        if cell.get("cell_type") != "code":
            continue
        eid = exercise_id(cell) or by_cell_id.get(cell.get("id"))
        if eid in lab_ids:
            answers[eid] = cell.get("source", "")  # a later copy replaces an earlier one
    return answers


def identify_lab(submission, requested: str | None) -> tuple[str | None, str]:
    """``(stem, "")`` for the submission's lab, or ``(None, reason)`` when it is not gradable."""
    ids = set(answer_cells(submission))
    owners = {stem: len(ids & set(exercises(stem))) for stem in lab_stems()}
    best = max(owners, key=owners.get) if owners else None
    if requested is not None:
        if requested not in lab_stems():
            return None, f"unknown lab {requested!r}; labs: {', '.join(lab_stems())}."
        if owners.get(requested, 0) == 0 and best and owners[best] > 0:
            return None, (f"this notebook holds the exercises of lab {best}, not {requested}: "
                          f"submit labs/{requested}.ipynb.")
        return requested, ""
    if not best or owners[best] == 0:
        return None, "no exercise cells found: this is not a GPU Systems Lab notebook (pass --lab if it is)."
    return best, ""


def _last_marker(job: Path) -> str:
    try:
        lines = (job / "progress").read_text().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _run_worker(job: Path, timeout_s: float) -> tuple[str, str]:
    """Run one worker until it finishes, dies, or spends more than ``timeout_s`` on one step.

    The clock restarts at every progress marker, so each exercise gets its own ``timeout_s``
    (the locked setup gets :data:`STARTUP_ALLOWANCE`). Returns (``"exited" | "timeout"``, marker).
    """
    log = open(job / "worker.log", "ab")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    env.pop("GPULAB_STRICT", None)
    proc = subprocess.Popen([sys.executable, "-m", "grader.worker", str(job)], cwd=job, env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    marker, since, how = "", time.monotonic(), "exited"
    try:
        while proc.poll() is None:
            time.sleep(0.05)
            now = _last_marker(job)
            if now != marker:
                marker, since = now, time.monotonic()
            limit = STARTUP_ALLOWANCE if marker in ("", "setup") else timeout_s
            if time.monotonic() - since > limit:
                how = "timeout"
                break
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: threads, children, everything
            except ProcessLookupError:
                pass
            proc.wait()
        log.close()
    return how, _last_marker(job)


def run_answers(stem: str, setup_source: str, answers: dict[str, str], cases: dict[str, list[Case]],
                device: str, timeout_s: float, work: Path) -> tuple[dict, dict, str]:
    """Run every exercise in workers. Returns ({eid: outcomes}, {eid: status override}, learner output)."""
    import torch

    order = list(exercises(stem))
    done: dict[str, list] = {}
    fatal: dict[str, tuple[str, str]] = {}  # eid -> (status, message) when the worker died in it
    output = []
    attempt = 0
    while True:
        remaining = [e for e in order if e not in done and e not in fatal]
        if not remaining:
            break
        attempt += 1
        job = work / f"worker{attempt}"
        job.mkdir()
        spec = {"lab": stem, "device": device, "setup_source": setup_source,
                "answers": [(e, answers[e]) for e in order if e in answers], "exercises": order,
                "skip": [e for e in order if e in done or e in fatal],
                "cases": {e: [{"name": c.name, "inputs": c.inputs} for c in cases[e]] for e in order}}
        torch.save(spec, job / "job.pt")
        how, last = _run_worker(job, timeout_s)
        for eid in remaining:
            path = job / f"{eid}.pt"
            if path.exists():
                try:
                    done[eid] = torch.load(path, weights_only=True)
                except Exception as exc:
                    fatal[eid] = ("error", "the answer returned something that is not plain numbers, strings "
                                           f"or tensors ({type(exc).__name__}); return the documented types.")
        if (job / "output.txt").exists():
            output.append((job / "output.txt").read_text(errors="replace"))
        if last == "done":
            break
        culprit = last.split()[-1] if last.startswith(("exec ", "run ")) else None
        if culprit is None or culprit in done or culprit in fatal:
            # died in the locked setup: nothing the learner wrote is to blame, but nothing ran
            for eid in remaining:
                if eid not in done:
                    fatal[eid] = ("error", f"the lab's setup did not complete ({how}); see the grader log.")
            break
        if how == "timeout":
            fatal[culprit] = ("timeout", f"did not finish within {timeout_s:g} s (an infinite loop, or far "
                                         "too slow); the run was stopped.")
        else:
            fatal[culprit] = ("crashed", "the process ended while running this exercise (sys.exit, os._exit, "
                                         "a segfault, or running out of memory).")
    return done, fatal, "\n".join(output)


def grade(path, lab: str | None = None, device: str = "cpu", seed: int | None = None,
          timeout_s: float = DEFAULT_TIMEOUT, notebook_run: bool = True) -> dict:
    """Grade one submission and return the ``result.json`` dict (schema 1). Never raises for bad input."""
    start = time.perf_counter()
    path = Path(path)
    base = {"schema": 1, "lab": lab, "submission": path.name, "device": device}
    try:
        submission = read_notebook(path)
    except InvalidNotebook as exc:
        return {**base, "status": "invalid", "message": str(exc), "score": 0.0, "max_score": 0.0,
                "duration_s": round(time.perf_counter() - start, 2), "exercises": []}
    stem, reason = identify_lab(submission, lab)
    if stem is None:
        return {**base, "status": "invalid", "message": reason, "score": 0.0, "max_score": 0.0,
                "duration_s": round(time.perf_counter() - start, 2), "exercises": []}
    lab_exercises = exercises(stem)
    solution = read_notebook(solution_path(stem))
    answers = pick_answers(submission, solution, list(lab_exercises))
    setup_source = export_source(solution, {}, parameters={"DEVICE": device, "SEED": 0})
    seed = secrets.randbits(31) if seed is None else seed
    cases = {eid: ex.cases(seed=seed, public=True) + ex.cases(seed=seed, public=False)
             for eid, ex in lab_exercises.items()}
    with tempfile.TemporaryDirectory(prefix="gpulab-grade-") as tmp:
        done, fatal, output = run_answers(stem, setup_source, answers, cases, device, timeout_s, Path(tmp))
    results: list[ExerciseResult] = []
    for eid, ex in lab_exercises.items():
        if eid not in answers:
            results.append(ExerciseResult(eid, ex.points, 0.0, "not_attempted",
                                          "no answer cell for this exercise in the submission."))
        elif eid in fatal:
            status, message = fatal[eid]
            results.append(ExerciseResult(eid, ex.points, 0.0, status, message))
        else:
            outcomes = done.get(eid, [])
            if len(outcomes) != len(cases[eid]):
                results.append(ExerciseResult(eid, ex.points, 0.0, "error", "incomplete results from the run."))
                continue
            results.append(summarize(ex, [judge_case(ex, c, o) for c, o in zip(cases[eid], outcomes)]))
    result = {**base, "lab": stem, "status": "graded",
              "score": round(sum(r.score for r in results), 4),
              "max_score": float(sum(ex.points for ex in lab_exercises.values())),
              "duration_s": None, "exercises": [r.as_dict() for r in results],
              "learner_output": output[-4000:]}
    if notebook_run:
        from grader.rebuild import run_rebuilt

        result["notebook_run"] = run_rebuilt(solution, answers, device, timeout_s)
    result["duration_s"] = round(time.perf_counter() - start, 2)
    return result


def grade_to_dir(path, out_dir, **kwargs) -> dict:
    """:func:`grade`, then write ``result.json``, ``feedback.md`` and ``junit.xml`` into ``out_dir``."""
    result = grade(path, **kwargs)
    write_reports(result, Path(out_dir))
    return result
