"""The learner-side process of ``grade``: ``python -m grader.worker JOB_DIR``.

It executes the rebuilt lab (locked cells, then each answer cell on its own, so one broken cell
costs only its exercise), then runs every case of every exercise with ``run_case`` and saves the
plain observations. It never sees a reference or an expected value: the judge (the parent process)
compares. Before each step it writes a marker to ``JOB_DIR/progress``, so when the process dies or
hangs the parent knows which exercise did it.
"""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path

OUTPUT_CAP = 64 * 1024  # bytes of learner output kept; the rest is dropped


class CappedStream(io.TextIOBase):
    """A text stream keeping the first ``cap`` characters written to it (megabytes of print() cost nothing)."""

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap
        self.dropped = 0

    def write(self, s: str) -> int:
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self) -> str:
        text = "".join(self.parts)
        return text + (f"\n[... {self.dropped} more characters of output dropped]" if self.dropped else "")


def _mark(job: Path, text: str) -> None:
    with open(job / "progress", "a", encoding="utf-8") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save(path: Path, obj) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # the judge never reads a half-written file


def main(job_dir: str) -> int:
    job = Path(job_dir)
    import torch  # noqa: F401 - imported before learner code can shadow anything

    spec = torch.load(job / "job.pt", weights_only=False)  # written by the judge: trusted
    capture = CappedStream()
    sys.stdout = sys.stderr = capture
    os.environ.pop("GPULAB_STRICT", None)  # inline checks in answer cells must not raise here
    skip = set(spec["skip"])

    from grader.notebooks import exec_source

    ns: dict = {"__name__": "__lab__"}
    _mark(job, "setup")
    exec_source(spec["setup_source"], "<lab setup>", ns)
    cell_errors: dict[str, str] = {}
    for eid, source in spec["answers"]:
        if eid in skip:
            continue
        _mark(job, f"exec {eid}")
        try:
            exec_source(source, f"<answer cell {eid}>", ns)
        except BaseException as exc:  # SyntaxError, SystemExit, anything: this exercise only
            if isinstance(exc, KeyboardInterrupt):
                raise
            import traceback

            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            cell_errors[eid] = f"the answer cell failed to run: {text}"[:2000]

    # Fresh check code: module-level monkeypatches made by answer cells are discarded.
    for name in [m for m in sys.modules if m == "grader" or m.startswith(("grader.", "gpulab.launches",
                                                                           "gpulab.compare"))]:
        del sys.modules[name]
    from grader.checks import exercises
    from grader.exercise import Case, run_case

    lab = exercises(spec["lab"])
    for eid in spec["exercises"]:
        if eid in skip:
            continue
        _mark(job, f"run {eid}")
        if eid in cell_errors:
            outcomes = [{"status": "error", "message": cell_errors[eid]}] * len(spec["cases"][eid])
        else:
            outcomes = []
            for case in spec["cases"][eid]:
                try:
                    outcomes.append(run_case(lab[eid], ns, Case(case["name"], case["inputs"]), spec["device"]))
                except BaseException as exc:  # SystemExit from inside the learner's function
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    outcomes.append({"status": "crashed",
                                     "message": f"the code ended the process ({type(exc).__name__}: {exc})"})
        _save(job / f"{eid}.pt", outcomes)
    _mark(job, "done")
    (job / "output.txt").write_text(capture.getvalue(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    os._exit(code)  # skip interpreter teardown: learner objects' __del__ must not change the outcome
