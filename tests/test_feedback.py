"""The inline check: verdict text and HTML, strict mode, progress records."""
import re

import pytest

from gpulab import progress
from gpulab.feedback import CheckFailed, check, check_result, format_html, format_text
from grader.checks import find_exercise
from grader.exercise import evaluate
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook
from tests.conftest import ROOT


def _wrong_scaling():
    return {"amdahl_speedup": lambda p, n: 1 / (p + (1 - p) / n),
            "strong_scaling_efficiency": lambda t1, tn, n: t1 / (n * tn),
            "weak_scaling_efficiency": lambda t1, tn: t1 / tn}


def test_text_verdict_shows_failed_cases_message_and_hint(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    check("scaling", namespace=_wrong_scaling(), strict=False)
    out = capsys.readouterr().out
    assert "FAIL ❌ scaling: failed" in out and "[FAIL]" in out and "expected 5.92593" in out
    assert "Hint: Amdahl" in out
    assert progress.load()["scaling"]["status"] == "failed"


def test_strict_mode_raises(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    monkeypatch.setenv("GPULAB_STRICT", "1")
    with pytest.raises(CheckFailed, match="scaling: failed"):
        check("scaling", namespace=_wrong_scaling(), quiet=True)


def test_missing_functions_are_not_attempted_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    result = check_result("scaling", {}, strict=False, quiet=True)
    assert result.status == "not_attempted" and "define `amdahl_speedup`" in result.message


def test_unknown_exercise_names_the_problem():
    with pytest.raises(KeyError, match="no exercise called 'scalling'"):
        check("scalling", namespace={})


def test_a_verdict_is_html_and_text_a_saved_notebook_shows_without_a_kernel(tmp_path, monkeypatch):
    """No widget: JupyterLab saves no widget state, so a widget verdict would read "model not found" later."""
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    shown = []
    monkeypatch.setattr("gpulab.feedback._in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    check("scaling", namespace=_wrong_scaling(), strict=False)
    (bundle,) = shown
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("FAIL") and "Hint: Amdahl" in bundle["text/plain"]
    page = bundle["text/html"]
    hint = page[page.index("<details class='gpulab-hint'>"):]
    assert hint.startswith("<details class='gpulab-hint'><summary><b>Show hint</b></summary>") and "Amdahl" in hint
    assert "Amdahl" not in page[:page.index("<details class='gpulab-hint'>")]  # folded until asked for
    assert "word-break:normal" in page  # messages wrap between words


def test_a_passed_verdict_has_no_hint(tmp_path, monkeypatch, sol01):
    result = _scaling_result(sol01, tmp_path, monkeypatch)
    assert "gpulab-hint" not in format_html(result, "a hint")


def test_progress_table_counts_points(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    progress.record("01_performance_model", "costs", "passed")
    row = next(r for r in progress.table() if r["lab"] == "01_performance_model")
    assert row["passed"] == 1 and row["points"] == 3 and row["max_points"] == 10


def _scaling_result(ns, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    return check_result("scaling", ns, strict=False, quiet=True)


def test_verdicts_are_words_not_only_symbols(tmp_path, monkeypatch, sol01):
    """Without an emoji font the symbols are empty boxes: the words must tell pass from fail."""
    failed = _scaling_result(_wrong_scaling(), tmp_path, monkeypatch)
    passed = _scaling_result(sol01, tmp_path, monkeypatch)
    todo = _scaling_result({}, tmp_path, monkeypatch)
    for result, word in ((failed, "FAIL"), (passed, "PASS"), (todo, "TODO")):
        no_emoji = re.sub(r"[^\x00-\x7f]", "", format_text(result, "a hint"))
        assert no_emoji.startswith(f"{word}  scaling: ")
        html_text = re.sub(r"<[^>]+>|[^\x00-\x7f]", "", format_html(result))
        assert html_text.startswith(f"{word}  scaling: ")
    assert "[FAIL]" in format_text(failed, "") and "[PASS]" in format_text(passed, "")


def _typo_namespace(filename: str) -> dict:
    """Lab 02's solution with the one-letter typo `tl.arrange` in the vector-add kernel."""
    nb = read_notebook(ROOT / "solutions" / "02_triton_basics.ipynb")
    answers = answer_cells(nb)
    answers["vector_add"] = answers["vector_add"].replace("tl.arange(0, BLOCK)", "tl.arrange(0, BLOCK)")
    return exec_source(export_source(nb, answers), filename)


@pytest.mark.parametrize("filename", ["/tmp/ipykernel_4242/1234567.py", "<answer cell vector_add>"],
                         ids=["jupyter-cell", "grader-answer-cell"])
def test_a_typo_in_a_kernel_shows_the_learners_line_and_the_cause_first(filename):
    _, ex = find_exercise("vector_add")
    result = evaluate(ex, _typo_namespace(filename), "cpu", ex.cases()[:2])
    message = result.cases[0].message
    lines = message.splitlines()
    assert lines[0] == "AttributeError: module 'triton.language' has no attribute 'arrange'"
    assert lines[1] == "Your code:"
    shown = message[:message.index("internal frames hidden")]
    assert "tl.arrange(0, BLOCK)" in shown and f'File "{filename}"' in shown
    assert "triton/runtime" not in shown and "grader/" not in shown
    assert re.search(r"^\(\d+ internal frames hidden\)$", message, re.M)

    text = format_text(result, ex.hint)
    assert "Traceback (most recent call last)" not in text and "triton/runtime" not in text
    assert "(the same error as the case above)" in text
    html_text = format_html(result)
    folded = html_text[html_text.index("<details"):]
    assert "Traceback (most recent call last)" in folded and "InterpreterError" in folded
    assert "Traceback (most recent call last)" not in html_text[:html_text.index("<details")]
