"""Writing a grade: ``result.json`` (schema 1, fixed), ``feedback.md`` for the learner, JUnit XML
for CI, and a table for the terminal.

Everything a submission can influence (its file name, exception messages, printed output) is
passed through :func:`sanitize_text` once per report, so no learner text can break a report's
format, the terminal, or the file encoding; in ``feedback.md`` it is moreover only ever shown as
code (a code span or a fenced block), so no name or message becomes HTML, a link or an image.
The run's seed and limits stay in ``result.json`` (the instructor's); feedback and JUnit show
neither. No report holds a path of the grading machine (:func:`hide_paths`).
"""
from __future__ import annotations

import functools
import json
import os
import re
import site
import sys
import sysconfig
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

_MARK = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
         "crashed": "CRASH", "not_attempted": "TODO"}

MAX_TEXT = 20_000  # characters kept of one message or of the learner's output
MAX_NAME = 255     # characters kept of one name (a file name is at most 255 bytes anyway)
_CUT = " … [truncated]"
# Control characters (C0 but tab and newline, DEL, C1), bidirectional overrides (they reorder what
# a terminal shows) and U+FFFE/U+FFFF (not allowed in XML): shown escaped, as Python writes them.
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufffe\uffff"
_UNSAFE_TEXT = re.compile(f"[{_UNSAFE}]")
_UNSAFE_NAME = re.compile(f"[\t\n{_UNSAFE}]")
# Fields of a result that are names, kept on one line.
_NAME_KEYS = frozenset({"lab", "submission", "status", "device", "id", "cell"})


def sanitize_text(value, limit: int = MAX_TEXT, single_line: bool = False) -> str:
    """``value`` as text that is safe in JSON, UTF-8, XML, Markdown, CSV and a terminal.

    Lone surrogates become U+FFFD; ``\\r\\n`` becomes ``\\n``; other control characters are shown
    escaped (``\\x1b``), as are tab and newline when ``single_line``; the result has at most
    ``limit`` characters. Applying it twice changes nothing.
    """
    text = value if isinstance(value, str) else str(value)
    truncated = len(text) > limit
    text = text[:limit]  # escaping only lengthens, so nothing past ``limit`` can be kept
    if not text.isascii():
        # utf-16 pairs up surrogates that form a character and replaces the lone ones
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    text = text.replace("\r\n", "\n")
    text = (_UNSAFE_NAME if single_line else _UNSAFE_TEXT).sub(lambda m: ascii(m.group())[1:-1], text)
    if truncated or len(text) > limit:
        text = text[:max(0, limit - len(_CUT))] + _CUT
    return text


def _map_strings(result: dict, text, name) -> dict:
    """A copy of a result with ``text(s)`` applied to every free-text string and ``name(s)`` to names."""

    def clean(value, key=None):
        if isinstance(value, str):
            return name(value) if key in _NAME_KEYS else text(value)
        if isinstance(value, dict):
            return {k: clean(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, key) for v in value]
        return value

    return clean(result)


def sanitize_result(result: dict) -> dict:
    """A copy of a result with every string passed through :func:`sanitize_text` (names on one line)."""
    return _map_strings(result, sanitize_text, lambda s: sanitize_text(s, MAX_NAME, single_line=True))


@functools.lru_cache(maxsize=None)
def _machine_paths() -> tuple:
    """``(pattern, replacement)`` for the folders of the grading machine, most specific first."""
    from gpulab.paths import ROOT

    packages = {*site.getsitepackages(), site.getusersitepackages(),
                *(sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib"))}
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix,
              *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib"))}
    named = [(p, "<site-packages>") for p in packages] + [(p, "<python>") for p in python] + \
        [(str(ROOT), "<course>"), (os.path.expanduser("~"), "~")]
    named = sorted(((os.path.normpath(p), r) for p, r in named if p and len(os.path.normpath(p)) > 1),
                   key=lambda pr: -len(pr[0]))
    start, end = r"(?<![\w.~>/-])", r"(?![\w.-])"  # whole path components only
    rules = [(re.compile(start + re.escape(p) + end), r) for p, r in named]
    # any other Python's packages (the box, a conda env), then temporary folders: their last component
    rules.append((re.compile(start + r"/[^\s'\"`:;,()]*?/(?:site|dist)-packages" + end), "<site-packages>"))
    rules.append((re.compile(start + r"/[^\s'\"`:;,()]*?/lib/python\d\.\d+" + end), "<python>"))
    temps = sorted({"/tmp", "/var/tmp", "/dev/shm", "/private/tmp", tempfile.gettempdir()}, key=len, reverse=True)
    rules.append((re.compile(start + "(?:" + "|".join(map(re.escape, temps)) + r")((?:/[^\s'\"`:;,()\[\]]+)*)"
                             + end), lambda m: "<tmp>/" + m.group(1).rsplit("/", 1)[-1] if m.group(1) else "<tmp>"))
    return tuple(rules)


def hide_paths(text: str) -> str:
    """``text`` without the grading machine's folders: the course's checkout becomes ``<course>``, Python's
    packages ``<site-packages>``, its installation ``<python>``, a temporary file ``<tmp>/name`` and the
    home folder ``~``. They mean nothing to a learner and say more than they need about the machine."""
    for pattern, replacement in _machine_paths():
        text = pattern.sub(replacement, text)
    return text


def _hide_paths_in(result: dict) -> dict:
    """A copy of a result whose free text (messages, errors, output) holds no machine path."""
    return _map_strings(result, hide_paths, lambda s: s)


def _plain(text: str) -> str:
    """Course text (an exercise's title) as literal Markdown: its punctuation escaped, on one line."""
    return re.sub(r"([\\`*_{}\[\]<>()#+\-.!|~])", r"\\\1", " ".join(text.split()))


def _code_span(text: str, in_table: bool = False) -> str:
    """``text`` (one line) as a Markdown code span: shown literally, whatever it holds (``<img ...>``,
    ``[x](javascript:...)``, backticks); in a table, ``|`` is escaped so the cell stays one cell."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text.replace('|', chr(92) + '|') if in_table else text} {fence}"


def _fenced(text: str) -> list[str]:
    """``text`` as a Markdown code block whose fence is longer than any run of backticks inside,
    so the text cannot close it and turn into Markdown."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def table(result: dict) -> str:
    """A plain-text table of one result, for the terminal."""
    result = sanitize_result(result)
    lines = [f"{result['submission']}  lab {result.get('lab')}  status {result['status']}"]
    if result["status"] != "graded":
        lines.append(f"  {result.get('message', '')}")
        return "\n".join(lines)
    lines.append(f"  {'exercise':<22}{'points':>12}  status   message")
    for ex in result["exercises"]:
        msg = ex["message"].splitlines()[0] if ex["message"] else ""
        mark = "SKIP" if ex.get("skipped") else _MARK.get(ex["status"], "?")  # skipped: this GPU lacks a feature
        lines.append(f"  {ex['id']:<22}{ex['score']:>6g}/{ex['points']:<5g}  {mark:<7}  "
                     f"{msg[:90]}")
    seed = f", seed {result['seed']}" if "seed" in result else ""  # the terminal is the instructor's
    lines.append(f"  {'total':<22}{result['score']:>6g}/{result['max_score']:<5g}  ({result['duration_s']} s on "
                 f"{result['device']}{seed})")
    run = result.get("notebook_run")
    if run:
        lines.append(f"  notebook top to bottom: {run['status']}" +
                     (f" at {run.get('cell') or 'start-up'}: {run.get('error', '')[:100]}"
                      if run["status"] == "failed" else ""))
    return "\n".join(lines)


def feedback_markdown(result: dict) -> str:
    result = sanitize_result(result)
    out = [f"# Feedback: {_code_span(result['submission'])}", ""]
    if result["status"] != "graded":
        out += [f"**Not graded** ({result['status']}):", "", *_fenced(result.get("message", "")), ""]
        return "\n".join(out)
    out += [f"Lab **{result['lab']}**: **{result['score']:g} / {result['max_score']:g}** points "
            f"(device {result['device']}).", "", "| exercise | points | status |", "|---|---|---|"]
    for ex in result["exercises"]:
        out.append(f"| {_code_span(ex['id'], in_table=True)} | {ex['score']:g} / {ex['points']:g} | "
                   f"{'skipped for this GPU' if ex.get('skipped') else ex['status']} |")
    out.append("")
    out += _skipped_note(result)
    for ex in result["exercises"]:
        if ex["status"] != "passed" and not ex.get("skipped"):
            title = f" · {_plain(ex['title'])}" if ex.get("title") else ""
            out += [f"## {_code_span(ex['id'])}{title}: {ex['status']}", "", *_fenced(ex["message"]), ""]
    run = result.get("notebook_run")
    if run and run["status"] == "failed":
        out += ["## The notebook does not run top to bottom", "",
                (f"It stopped at {run['cell']} (this does not change the scores above):" if run.get("cell") else
                 "The notebook's kernel died or ran out of time before any cell failed (this does not change "
                 "the scores above); see grader.log:"), "",
                *_fenced(run.get("error", "")), ""]
    return "\n".join(out)


def _skipped_note(result: dict) -> list[str]:
    """feedback.md's paragraph on the exercises this GPU could not grade (left out of the maximum)."""
    skipped = [ex for ex in result["exercises"] if ex.get("skipped")]
    if not skipped:
        return []
    out = ["## Skipped for this GPU (not counted in the maximum)", "",
           "These exercises need a GPU feature this one lacks, so they were not graded and their points are left "
           "out of the maximum: your GPU costs you nothing. Grade them with `--device cpu`, or on a GPU that has "
           "the feature, to get their points.", ""]
    return out + [f"- {_code_span(ex['id'])}: {_code_span(ex['skipped'])}" for ex in skipped] + [""]


def junit_xml(results: list[dict], suite: str = "gpulab") -> str:
    """One test case per exercise of every graded submission; invalid submissions are one error each."""
    cases = []
    failures = errors = 0
    for r in map(sanitize_result, results):
        cls = quoteattr(f"{r.get('lab')}.{Path(r['submission']).stem}")
        if r["status"] != "graded":
            errors += 1
            error = quoteattr(r.get("message", ""))
            cases.append(f'  <testcase classname={cls} name="submission"><error message={error}/>'
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
                body = f"<skipped message={quoteattr(ex.get('skipped') or 'not attempted')}/>"
            cases.append(f"  <testcase classname={cls} name={quoteattr(ex['id'])}>{body}</testcase>")
    suite = sanitize_text(suite, MAX_NAME, single_line=True)
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name={quoteattr(suite)} tests="{len(cases)}" '
            f'failures="{failures}" errors="{errors}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def write_reports(result: dict, out_dir: Path) -> None:
    """Write ``result.json``, ``feedback.md`` and ``junit.xml`` of one (sanitized) result into ``out_dir``;
    every one of them may reach the learner, so none holds a path of this machine (:func:`hide_paths`)."""
    result = _hide_paths_in(sanitize_result(result))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (out_dir / "feedback.md").write_text(feedback_markdown(result), encoding="utf-8")
    (out_dir / "junit.xml").write_text(junit_xml([result]), encoding="utf-8")
