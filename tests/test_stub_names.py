"""A half-finished exercise names what still raises: every stub of an exercise with several names its function,
method or class, and the "not attempted" message of lab 14's KV-cache exercise names `max_batch` once
`kv_cache_bytes` is written."""
from __future__ import annotations

import re

import pytest

from grader.checks import exercises, lab_stems
from grader.exercise import evaluate
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook
from grader.release import release_notebook
from tests.conftest import ROOT

STUB = re.compile(r'raise NotImplementedError\("(exercise `[^`]+`[^"]*): replace this line with your code\."\)')


@pytest.mark.parametrize("stem", lab_stems())
def test_every_stub_of_an_exercise_with_several_names_its_own_definition(stem):
    lab = release_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    for eid, source in answer_cells(lab).items():
        whats = STUB.findall(source)
        if len(whats) > 1:
            assert all(re.fullmatch(rf"exercise `{eid}`, (function|method|class) `[\w.]+`", w) for w in whats), whats


def test_the_not_attempted_message_names_the_function_still_raising():
    stem = "14_inference_serving"
    solution = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    lab_answers = answer_cells(release_notebook(ROOT / "solutions" / f"{stem}.ipynb"))
    solved = answer_cells(solution)["kv_cache_bytes"].split("\ndef max_batch")[0]  # kv_cache_bytes written ...
    stubbed = "\ndef max_batch" + lab_answers["kv_cache_bytes"].split("\ndef max_batch")[1]  # ... max_batch not
    ns = exec_source(export_source(solution, {"kv_cache_bytes": solved + stubbed}), f"<labs/{stem}.ipynb>")
    result = evaluate(exercises(stem)["kv_cache_bytes"], ns, "cpu")
    assert result.status in ("not_attempted", "failed") and result.score < result.points
    assert "function `max_batch`" in result.message and "function `kv_cache_bytes`" not in result.message
