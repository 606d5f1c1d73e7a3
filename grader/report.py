"""Writing a grade: ``result.json`` (schema 1, fixed), ``feedback.md`` for the learner, JUnit XML
for CI, and a table for the terminal."""
from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

_MARK = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
         "crashed": "CRASH", "not_attempted": "TODO"}


def table(result: dict) -> str:
    """A plain-text table of one result, for the terminal."""
    lines = [f"{result['submission']}  lab {result.get('lab')}  status {result['status']}"]
    if result["status"] != "graded":
        lines.append(f"  {result.get('message', '')}")
        return "\n".join(lines)
    lines.append(f"  {'exercise':<22}{'points':>12}  status   message")
    for ex in result["exercises"]:
        msg = ex["message"].splitlines()[0] if ex["message"] else ""
        lines.append(f"  {ex['id']:<22}{ex['score']:>6g}/{ex['points']:<5g}  {_MARK.get(ex['status'], '?'):<7}  "
                     f"{msg[:90]}")
    lines.append(f"  {'total':<22}{result['score']:>6g}/{result['max_score']:<5g}  ({result['duration_s']} s on "
                 f"{result['device']})")
    run = result.get("notebook_run")
    if run:
        lines.append(f"  notebook top to bottom: {run['status']}" +
                     (f" at cell {run.get('cell')}: {run.get('error', '')[:100]}" if run["status"] == "failed" else ""))
    return "\n".join(lines)


def feedback_markdown(result: dict) -> str:
    out = [f"# Feedback: {result['submission']}", ""]
    if result["status"] != "graded":
        out += [f"**Not graded** ({result['status']}): {result.get('message', '')}", ""]
        return "\n".join(out)
    out += [f"Lab **{result['lab']}**: **{result['score']:g} / {result['max_score']:g}** points "
            f"(device {result['device']}).", "", "| exercise | points | status |", "|---|---|---|"]
    for ex in result["exercises"]:
        out.append(f"| `{ex['id']}` | {ex['score']:g} / {ex['points']:g} | {ex['status']} |")
    out.append("")
    for ex in result["exercises"]:
        if ex["status"] != "passed":
            out += [f"## `{ex['id']}`: {ex['status']}", "", "```", ex["message"], "```", ""]
    run = result.get("notebook_run")
    if run and run["status"] == "failed":
        out += ["## The notebook does not run top to bottom", "",
                f"Cell `{run.get('cell')}` failed (this does not change the scores above):", "", "```",
                run.get("error", ""), "```", ""]
    return "\n".join(out)


def junit_xml(results: list[dict], suite: str = "gpulab") -> str:
    """One test case per exercise of every graded submission; invalid submissions are one error each."""
    cases = []
    failures = errors = 0
    for r in results:
        cls = quoteattr(f"{r.get('lab')}.{Path(r['submission']).stem}")
        if r["status"] != "graded":
            errors += 1
            cases.append(f'  <testcase classname={cls} name="submission"><error message={quoteattr(r.get("message", ""))}/>'
                         "</testcase>")
            continue
        for ex in r["exercises"]:
            body = ""
            if ex["status"] == "failed":
                failures += 1
                body = f"<failure message={quoteattr(ex['message'][:200])}>{escape(ex['message'])}</failure>"
            elif ex["status"] in ("error", "timeout", "crashed"):
                errors += 1
                body = f"<error type={quoteattr(ex['status'])} message={quoteattr(ex['message'][:200])}/>"
            elif ex["status"] == "not_attempted":
                body = "<skipped message=\"not attempted\"/>"
            cases.append(f"  <testcase classname={cls} name={quoteattr(ex['id'])}>{body}</testcase>")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name={quoteattr(suite)} tests="{len(cases)}" '
            f'failures="{failures}" errors="{errors}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def write_reports(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "feedback.md").write_text(feedback_markdown(result))
    (out_dir / "junit.xml").write_text(junit_xml([result]))
