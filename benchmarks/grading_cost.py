"""What grading costs, per lab, on this machine: wall time and peak memory of one submission's grade.

    python benchmarks/grading_cost.py [--labs 01_performance_model ...] [--out benchmarks/results]

For every lab it grades the solution (full marks expected) and the untouched lab (0 expected), each with
``python -m grader grade --device cpu`` in a process of its own, as an instructor's ``cohort`` does, and
the solution once more with ``--no-notebook-run`` (what skipping the rebuilt-notebook run saves). While a
grade runs, its process tree is sampled every 0.1 s: the judge's resident memory (the grader's own
process) and the worker tree's (every process below it: the sandbox, the workers, the notebook's kernel).
Sampling misses peaks shorter than its interval, so the peaks are lower bounds.

Writes ``grading_cost_cpu.json`` and ``grading_cost_cpu.md`` with the machine, its load average before and
after (a quiet machine is one whose load stays well under its core count) and a row per lab and mode.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script
from gpulab.paths import ROOT  # noqa: E402

MODES = {  # mode -> (notebook folder, extra grader options)
    "solution": ("solutions", []),
    "solution, no notebook run": ("solutions", ["--no-notebook-run"]),
    "untouched lab": ("labs", []),
}
GOAL_S = 60.0  # every lab's solution should grade within a minute on a quiet 2-core machine


def tree_rss(pid: int) -> tuple[int, int]:
    """(judge, workers): resident bytes of process ``pid`` and of all its descendants together."""
    import psutil

    try:
        judge = psutil.Process(pid)
        own = judge.memory_info().rss
        below = 0
        for child in judge.children(recursive=True):
            try:
                below += child.memory_info().rss
            except psutil.Error:  # it ended between the listing and the reading
                pass
        return own, below
    except psutil.Error:
        return 0, 0


def grade_once(stem: str, mode: str, seed: int) -> dict:
    """Grade one notebook of ``stem`` in ``mode`` in a child process; its time, peaks and score."""
    folder, options = MODES[mode]
    notebook = ROOT / folder / f"{stem}.ipynb"
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "grader", "grade", str(notebook), "--lab", stem, "--device", "cpu",
                   "--seed", str(seed), "--out", out, *options]
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        judge_peak = workers_peak = 0
        while child.poll() is None:
            judge, workers = tree_rss(child.pid)
            judge_peak, workers_peak = max(judge_peak, judge), max(workers_peak, workers)
            time.sleep(0.1)
        wall = time.perf_counter() - start
        try:
            result = json.loads((Path(out) / "result.json").read_text())
        except (OSError, ValueError):
            result = {"status": f"no result (exit {child.returncode})"}
    return {"lab": stem, "mode": mode, "wall_s": round(wall, 1), "grade_s": result.get("duration_s"),
            "score": result.get("score"), "max_score": result.get("max_score"), "status": result.get("status"),
            "notebook_run": (result.get("notebook_run") or {}).get("status"),
            "judge_peak_mib": round(judge_peak / 2**20), "workers_peak_mib": round(workers_peak / 2**20)}


def markdown(report: dict) -> str:
    """The report as a Markdown table, one row per lab, with the solution's goal verdict."""
    rows = {}
    for r in report["rows"]:
        rows.setdefault(r["lab"], {})[r["mode"]] = r
    lines = [f"# Grading cost per lab ({report['machine']})", "",
             f"Measured {report['date']} by `{report['script']}`; load average {report['load_before']:.2f} before, "
             f"{report['load_after']:.2f} after. Wall seconds of `python -m grader grade --device cpu` (one "
             "submission, its sandboxed workers and the rebuilt-notebook run); peak resident memory of the judge "
             "and of its worker tree, sampled every 0.1 s (lower bounds).", "",
             "| lab | solution s | score | no notebook run s | untouched s | untouched score | judge MiB | "
             f"workers MiB | solution <= {GOAL_S:.0f} s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for lab, modes in rows.items():
        sol, fast, bare = (modes.get(m, {}) for m in MODES)

        def cell(r, key):
            return "" if r.get(key) is None else f"{r[key]:g}"

        peaks = [r for r in (sol, fast, bare) if r]
        verdict = "" if not sol else ("yes" if sol["wall_s"] <= GOAL_S else "**no**")
        lines.append(f"| {lab} | {cell(sol, 'wall_s')} | {cell(sol, 'score')}/{cell(sol, 'max_score')} | "
                     f"{cell(fast, 'wall_s')} | {cell(bare, 'wall_s')} | {cell(bare, 'score')} | "
                     f"{max(r['judge_peak_mib'] for r in peaks)} | {max(r['workers_peak_mib'] for r in peaks)} | "
                     f"{verdict} |")
    total = sum(modes["solution"]["wall_s"] for modes in rows.values() if "solution" in modes)
    lines += ["", f"One learner's {len(rows)} labs (solutions, with the notebook run): {total / 60:.1f} min on this "
              "machine, one submission at a time."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="*", help="lab stems (default: every lab in solutions/)")
    parser.add_argument("--modes", nargs="*", choices=list(MODES), default=list(MODES))
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    labs = args.labs or sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    report = {"schema": 1, "script": "benchmarks/grading_cost.py", "device": "cpu",
              "machine": f"{platform.machine()} x{os.cpu_count()} cores, python {platform.python_version()}",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "load_before": os.getloadavg()[0], "goal_s": GOAL_S, "rows": []}
    for stem in labs:
        for mode in args.modes:
            row = grade_once(stem, mode, args.seed)
            print(json.dumps(row), flush=True)
            report["rows"].append(row)
    report["load_after"] = os.getloadavg()[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grading_cost_cpu.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "grading_cost_cpu.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
