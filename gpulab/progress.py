"""Where a learner stands across labs (lesson 00): the inline checks record their results here.

Results live in ``.gpulab/progress.json`` at the project root (``GPULAB_PROGRESS`` moves it);
nothing here is used for grading.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpulab.paths import ROOT


def progress_file() -> Path:
    return Path(os.environ.get("GPULAB_PROGRESS", ROOT / ".gpulab" / "progress.json"))


def load() -> dict:
    """``{exercise_id: {"status": ..., "lab": ..., "time": ...}}``; empty if nothing recorded yet."""
    path = progress_file()
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record(lab: str, exercise_id: str, status: str) -> None:
    """Remember the latest inline-check status of one exercise (best effort, never raises)."""
    data = load()
    data[exercise_id] = {"lab": lab, "status": status, "time": time.strftime("%Y-%m-%d %H:%M")}
    try:
        path = progress_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass


def table() -> list[dict]:
    """One row per lab: its exercises, how many passed, points earned of points available."""
    from gpulab.checks_entry import checks

    data = load()
    rows = []
    for lab in checks().labs():
        points = lab["points"]  # {exercise_id: points}
        passed = [eid for eid in points if data.get(eid, {}).get("status") == "passed"]
        rows.append({"lab": lab["lab"], "title": lab["title"], "exercises": len(points), "passed": len(passed),
                     "points": sum(points[eid] for eid in passed), "max_points": sum(points.values())})
    return rows


def show() -> None:
    """Display the progress table (HTML with bars in Jupyter, text elsewhere)."""
    from gpulab.feedback import display_rich

    rows = table()
    text = ["lab                       passed   points"]
    html = ["<table><tr><th>lab</th><th>exercises passed</th><th>points</th><th></th></tr>"]
    for r in rows:
        frac = r["points"] / r["max_points"] if r["max_points"] else 0.0
        text.append(f"{r['lab']:<26}{r['passed']:>2}/{r['exercises']:<5}{r['points']:>5g}/{r['max_points']:g}")
        html.append(f"<tr><td>{r['lab']}: {r['title']}</td><td>{r['passed']}/{r['exercises']}</td>"
                    f"<td>{r['points']:g}/{r['max_points']:g}</td><td><div style='width:120px;"
                    f"background:#eee'><div style='width:{120 * frac:.0f}px;height:10px;"
                    f"background:#4caf50'></div></div></td></tr>")
    html.append("</table>")
    display_rich("\n".join(text), "".join(html))
