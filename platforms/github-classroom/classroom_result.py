"""Print a grader ``result.json`` as GitHub Classroom's runner result: base64 of ``{"version": 1, "status",
"max_score", "tests": [...]}``, one test per exercise with its own points (partial credit included), the
format ``classroom-resources/autograding-grading-reporter`` reads from ``<RUNNER>_RESULTS`` and sums.

    python platforms/github-classroom/classroom_result.py grades/result.json --lab LAB [--fail-under PERCENT]

``status`` is ``pass`` when the submission was graded and, with ``--fail-under``, scored at least that
percentage of the points; otherwise ``fail`` (the reporter then marks the run failed). A submission that could
not be graded scores 0 in every exercise of ``--lab``, so GitHub Classroom still records 0 of the lab's points.
Run it with the course on ``PYTHONPATH`` (``grade_locally.sh`` does).
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path


def runner_result(result: dict, points: dict, fail_under: float | None = None) -> dict:
    """The reporter's runner result for one ``result.json`` (schema 1); ``points`` is ``{exercise id: points}``
    of the lab, in order (it gives an ungraded submission's exercises)."""
    graded = result.get("status") == "graded"
    exercises = result["exercises"] if graded else [
        {"id": eid, "points": p, "score": 0.0, "status": "not graded", "message": result.get("message", "")}
        for eid, p in points.items()]
    max_score = float(sum(ex["points"] for ex in exercises))
    enough = fail_under is None or (max_score > 0 and 100.0 * result["score"] / max_score >= fail_under)
    tests = [{"name": ex["id"], "status": "pass" if ex["status"] == "passed" else "fail",
              "message": f"{ex['status']}: {ex['message']}", "test_code": f"python -m grader grade ({ex['id']})",
              "filename": "", "line_no": 0, "duration": 0, "score": float(ex["score"])} for ex in exercises]
    return {"version": 1, "status": "pass" if graded and enough else "fail", "max_score": max_score, "tests": tests}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A grader result.json as GitHub Classroom's runner result (base64).")
    parser.add_argument("result", help="the result.json that `python -m grader grade` wrote")
    parser.add_argument("--lab", required=True, help="the lab graded, e.g. 01_performance_model")
    parser.add_argument("--fail-under", type=float, default=None, metavar="PERCENT",
                        help="status fail below PERCENT of the points (default: pass whenever graded)")
    args = parser.parse_args(argv)
    from grader.checks import exercises

    result = json.loads(Path(args.result).read_text(encoding="utf-8"))
    points = {eid: float(ex.points) for eid, ex in exercises(args.lab).items()}
    encoded = json.dumps(runner_result(result, points, args.fail_under), ensure_ascii=True).encode()
    print(base64.b64encode(encoded).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
