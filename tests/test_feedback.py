"""The inline check: verdict text, strict mode, the widget's plain-text fallback, progress records."""
import pytest

from gpulab import progress
from gpulab.feedback import CheckFailed, _widget, check, check_result, format_text


def _wrong_scaling():
    return {"amdahl_speedup": lambda p, n: 1 / (p + (1 - p) / n),
            "strong_scaling_efficiency": lambda t1, tn, n: t1 / (n * tn),
            "weak_scaling_efficiency": lambda t1, tn: t1 / tn}


def test_text_verdict_shows_failed_cases_message_and_hint(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    check("scaling", namespace=_wrong_scaling(), strict=False)
    out = capsys.readouterr().out
    assert "scaling: failed" in out and "[FAILED]" in out and "expected 5.92593" in out
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


def test_widget_has_hint_button_and_plain_text_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    from grader.checks import find_exercise

    result = check_result("scaling", _wrong_scaling(), strict=False, quiet=True)
    _, ex = find_exercise("scaling")
    text = format_text(result, ex.hint)
    widget = _widget(result, ex.hint, text)
    bundle = widget._repr_mimebundle_()
    assert bundle["text/plain"] == text
    button = widget.children[1]
    hint = widget.children[2]
    assert hint.layout.display == "none"
    button.click()
    assert hint.layout.display is None and button.disabled


def test_progress_table_counts_points(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    progress.record("01_performance_model", "costs", "passed")
    row = next(r for r in progress.table() if r["lab"] == "01_performance_model")
    assert row["passed"] == 1 and row["points"] == 3 and row["max_points"] == 10
