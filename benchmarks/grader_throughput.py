"""Grader throughput on this machine: seconds to grade one lab-02 submission (the solution), and the
grader's own overhead beyond the learner code's run time.

    python benchmarks/grader_throughput.py [--repeats 3] [--out benchmarks/results]

Learner time is measured by running the same answers on the same hidden cases in this process
(``grader.exercise.evaluate``) after a warm-up; overhead = grade time (without the notebook run) -
learner time. The rebuilt-notebook run (papermill) is timed separately. Both include the sandbox
(bubblewrap, when installed: the JSON records which isolation was used and the machine's load).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script
from gpulab.paths import ROOT  # noqa: E402

STEM = "02_triton_basics"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    import gpulab
    from grader.bench import load_answers
    from grader.checks import exercises
    from grader.exercise import evaluate
    from grader.grade import grade

    gpulab.setup("cpu", 0, quiet=True)
    submission = ROOT / "solutions" / f"{STEM}.ipynb"
    seed = 1234
    _, ns = load_answers(submission, STEM, "cpu")
    learner = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        for ex in exercises(STEM).values():
            evaluate(ex, ns, "cpu", ex.cases(seed=seed, public=True) + ex.cases(seed=seed, public=False))
        if i:  # the first pass warms Triton's interpreter caches, as the worker's own first calls do not
            learner.append(time.perf_counter() - start)
    no_nb, with_nb = [], []
    for _ in range(args.repeats):
        r = grade(submission, lab=STEM, seed=seed, notebook_run=False)
        assert r["score"] == r["max_score"], r
        no_nb.append(r["duration_s"])
        r = grade(submission, lab=STEM, seed=seed, notebook_run=True)
        assert r["notebook_run"]["status"] == "ok", r["notebook_run"]
        with_nb.append(r["duration_s"])
    med = statistics.median
    report = {"schema": 1, "script": "benchmarks/grader_throughput.py", "lab": STEM, "device": "cpu",
              "machine": f"{platform.machine()} x{os.cpu_count()} cores, python {platform.python_version()}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "isolation": r["isolation"]["mode"], "load_average_1min": os.getloadavg()[0],
              "repeats": args.repeats, "learner_code_s": med(learner), "grade_s": med(no_nb),
              "grade_with_notebook_run_s": med(with_nb), "overhead_s": med(no_nb) - med(learner),
              "samples": {"learner_code_s": learner, "grade_s": no_nb, "grade_with_notebook_run_s": with_nb}}
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grader_throughput_cpu.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
