"""The inline ``check``: run an exercise's public cases on the learner's code, show the verdict.

In a notebook the verdict is plain HTML (with its text as the plain fallback) and its hint sits folded
under "Show hint" (hints before solutions): no widget, so a saved notebook shows its verdicts after a
restart, a day later or in any notebook viewer, with no kernel running. Outside a notebook (a script,
a terminal) the same verdict prints as text. With ``GPULAB_STRICT=1`` (set by the test suite) a failed
check raises, so a solution notebook whose check fails cannot pass CI.
"""
from __future__ import annotations

import html
import os
import sys


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def display_rich(text: str, html_text: str) -> None:
    """Show ``html_text`` in a notebook (with ``text`` as its plain fallback), else print ``text``."""
    if _in_notebook():
        from IPython.display import display

        display({"text/plain": text, "text/html": html_text}, raw=True)
    else:
        print(text)


# Each verdict in words, with the symbol beside it: browsers without an emoji font draw the symbols
# as empty boxes, and a pass must never look like a fail.
LABEL = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "not_attempted": "TODO",
         "timeout": "TIMEOUT", "crashed": "CRASH"}
_ICON = {"passed": "✅", "failed": "❌", "error": "💥", "not_attempted": "✏️",
         "timeout": "⏱️", "crashed": "💥"}
_COLOR = {"passed": "#2e7d32", "not_attempted": "#6d6d6d"}  # every other verdict: red


def verdict(status: str) -> str:
    """``"PASS ✅"``: the verdict word, then its symbol."""
    return f"{LABEL.get(status, status.upper())} {_ICON.get(status, '?')}"


def split_message(message: str) -> tuple[str, str]:
    """``(shown, folded)``: a case message before and after its full traceback, which the verdict
    folds away (the checks put the learner's frames and the exception first)."""
    from gpulab.checks_entry import checks

    shown, mark, folded = message.partition("\n" + checks().FOLDED_MARK + "\n")
    return shown, folded if mark else ""


def format_text(result, hint: str) -> str:
    lines = [f"{verdict(result.status)} {result.id}: {result.status} "
             f"({result.score:g}/{result.points:g} points on the public cases)"]
    previous = None
    for case in result.cases:
        lines.append(f"  [{LABEL.get(case.status, case.status.upper())}] {case.name}")
        shown = split_message(case.message)[0] if case.status != "passed" else ""
        if shown and shown == previous:
            lines.append("         (the same error as the case above)")
        elif shown:
            lines.extend("         " + m for m in shown.splitlines()[:12])
        previous = shown or previous
    if result.status != "passed" and hint:
        lines.append(f"  Hint: {hint}")
    return "\n".join(lines)


# Messages wrap at spaces, never inside a word (JupyterLab breaks <pre> text anywhere by default); a
# token longer than the line (a path) may still break, rather than widen the output.
_PRE = "margin:0 0 0 2em;white-space:pre-wrap;word-break:normal;overflow-wrap:break-word"


def _case_html(case, previous: str | None) -> str:
    if case.status == "passed":
        return ""
    shown, folded = split_message(case.message)
    if shown == previous:
        return "<div style='margin-left:2em'><i>the same error as the case above</i></div>"
    out = f"<pre style='{_PRE}'>{html.escape(shown)}</pre>"
    if folded:
        out += (f"<details style='margin-left:2em'><summary>full traceback</summary>"
                f"<pre style='{_PRE}'>{html.escape(folded)}</pre></details>")
    return out


def format_html(result, hint: str = "") -> str:
    """The verdict as self-contained HTML: it is stored in the notebook and shows after a restart, or in any
    notebook viewer, with no kernel. A failed verdict's hint is folded in a ``<details>`` until asked for."""
    color = _COLOR.get(result.status, "#c62828")
    rows, previous = [], None
    for case in result.cases:
        case_color = _COLOR.get(case.status, "#c62828")
        # One line per case (the mark, then the case name at full width), its message below.
        rows.append(f"<div><b class='gpulab-mark' style='color:{case_color};white-space:nowrap'>"
                    f"{verdict(case.status)}</b> {html.escape(case.name)}</div>{_case_html(case, previous)}")
        if case.status != "passed":
            previous = split_message(case.message)[0]
    hint_html = ""
    if result.status != "passed" and hint:
        hint_html = (f"<details class='gpulab-hint'><summary><b>Show hint</b></summary>"
                     f"<i>Hint: {html.escape(hint)}</i></details>")
    return (f"<div class='gpulab-verdict' style='border-left:4px solid {color};padding-left:8px'>"
            f"<b style='color:{color}'>{verdict(result.status)}</b> "
            f"<b>{html.escape(result.id)}</b>: <span style='color:{color}'>{result.status}</span> "
            f"({result.score:g}/{result.points:g} points on the public cases)"
            f"{''.join(rows)}{hint_html}</div>")


class CheckFailed(AssertionError):
    """Raised by :func:`check` in strict mode (``GPULAB_STRICT=1``) when an exercise does not pass."""


def check(exercise_id: str, namespace: dict | None = None, device: str | None = None,
          strict: bool | None = None, quiet: bool = False, record: bool = True):
    """Run the public cases of exercise ``exercise_id`` against your code and show the result.

    ``namespace`` defaults to the calling notebook's globals, where your functions live.
    Shows the verdict (unless ``quiet``) and returns nothing, so a notebook cell shows only the
    verdict; use :func:`check_result` for the result object.
    """
    if os.environ.get("GPULAB_GRADING") == "1":
        # Inside the grader's sandbox the checks are not there (the judge runs them itself).
        print(f"{exercise_id}: checked by the grader")
        return
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    check_result(exercise_id, namespace, device, strict, quiet, record)


def check_result(exercise_id: str, namespace: dict, device: str | None = None,
                 strict: bool | None = None, quiet: bool = False, record: bool = True):
    """:func:`check`, returning the exercise's result (``id, points, score, status, message, cases``)."""
    from gpulab import progress
    from gpulab.checks_entry import checks
    from gpulab.device import current_device

    stem, result, hint = checks().run_public(exercise_id, namespace, device or current_device())
    if record:  # the progress view of lesson 00
        progress.record(stem, result.id, result.status)
    text = format_text(result, hint)
    if quiet:
        pass
    else:
        display_rich(text, format_html(result, hint))
    if strict is None:
        strict = os.environ.get("GPULAB_STRICT") == "1"
    if strict and result.status != "passed":
        raise CheckFailed(text)
    return result
