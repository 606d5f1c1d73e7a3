"""Feedback a learner can act on: every exercise names its title, hint and section; a cell that did not
run is blamed once, in the terms of the exercises it broke; no path of the grading machine reaches a
report; a notebook-run failure names an exercise or a section."""
import json

import pytest

from grader.grade import grade_to_dir
from grader.notebooks import read_notebook, section_title
from grader.rebuild import _cell_name
from grader.report import hide_paths
from tests import graderkit as kit
from tests.conftest import ROOT, scaled

L14 = "14_inference_serving"
SECTION_KV = '"2 · How big is the cache?"'


def graded(tmp_path, nb, name="s.ipynb"):
    """Grade ``nb`` (lab 14: plain-Python answers, quick) and return (result.json, feedback.md) as written."""
    out = tmp_path / name.replace(".ipynb", "")
    grade_to_dir(kit.write(nb, tmp_path / name), out, lab=L14, seed=5, notebook_run=False, timeout_s=scaled(30))
    written = (out / "result.json").read_text(encoding="utf-8")
    return json.loads(written), (out / "feedback.md").read_text(encoding="utf-8"), written


@pytest.fixture(scope="module")
def syntax_cascade(tmp_path_factory):
    """A syntax error in the cell defining `kv_cache_bytes`; `decode_roofline` (right) calls it; the
    cell of `speculative_decoding` deleted; the rest untouched."""
    broken = kit.solution_with(L14, "kv_cache_bytes", "def max_batch(spec", "def max_batch(spec,,")
    nb = kit.submission(L14, {"kv_cache_bytes": broken}, solved=("decode_roofline",))
    del nb["cells"][kit.answer_index(nb, "speculative_decoding")]
    return graded(tmp_path_factory.mktemp("cascade"), nb)


def test_a_cascade_is_named_once_in_the_broken_exercises_terms(syntax_cascade):
    result, feedback, _ = syntax_cascade
    e = kit.by_id(result)
    assert e["kv_cache_bytes"]["status"] == "error" and e["decode_roofline"]["status"] == "error"
    cause = e["kv_cache_bytes"]["message"]
    assert cause.startswith(f"Your cell for this exercise (under {SECTION_KV}) has a syntax error at line 9")
    assert cause.count("SyntaxError: invalid syntax") == 2 and "def max_batch(spec,," in cause
    effect = e["decode_roofline"]["message"]
    assert effect.startswith("Exercise `decode_roofline` could not run because your cell defining `kv_cache_bytes` "
                             f"(exercise `kv_cache_bytes`, section {SECTION_KV}) has a syntax error at line 9")
    assert "Fix that cell first" in effect
    # no second copy of the error: no traceback, no NameError, no line of the broken cell
    assert "Traceback" not in effect and "NameError" not in effect and "def max_batch" not in effect
    assert feedback.count("def max_batch(spec,,") == 1


def test_every_exercise_has_its_title_and_hint(syntax_cascade):
    from grader.checks import exercises

    result, feedback, _ = syntax_cascade
    for entry in result["exercises"]:
        ex = exercises(L14)[entry["id"]]
        assert entry["title"] == ex.title
        assert entry["message"].endswith(f"Hint: {ex.hint}")
        assert f"## ` {ex.id} ` · " in feedback


def test_not_attempted_says_which_exercise_where_and_what_to_try(syntax_cascade):
    result, feedback, _ = syntax_cascade
    e = kit.by_id(result)
    paged = e["paged_kv"]["message"]
    assert e["paged_kv"]["status"] == "not_attempted"
    assert paged.startswith("Not attempted yet: exercise `paged_kv` (A paged KV cache: blocks and block tables), "
                            f'under "4 · A paged KV cache" in labs/{L14}.ipynb.')
    assert "method `BlockManager.__init__`" in paged and "Hint: Keep a list of free block ids" in paged
    deleted = e["speculative_decoding"]["message"]
    assert deleted.startswith("Not attempted: the submission has no cell for exercise `speculative_decoding`")
    assert '"6 · Speculative decoding"' in deleted and "copy it back" in deleted
    assert "replace this line with your code" not in feedback


def test_no_path_of_the_grading_machine_reaches_the_reports(syntax_cascade, tmp_path):
    *_, written = syntax_cascade
    assert str(ROOT) not in written and "site-packages" not in written and "/tmp/" not in written
    # an error with a real traceback (internal frames included) in a submission of its own
    typo = kit.solution_with(L14, "decode_roofline", "kv_cache_bytes(spec, batch", "kv_cache_byte(spec, batch")
    result, feedback, written = graded(tmp_path, kit.submission(L14, {"decode_roofline": typo},
                                                                 solved=("kv_cache_bytes",)))
    message = kit.by_id(result)["decode_roofline"]["message"]
    assert "NameError: name 'kv_cache_byte' is not defined" in message and "Full traceback:" in message
    assert 'File "<course>/grader/' in message
    for text in (written, feedback):
        assert str(ROOT) not in text and "site-packages" not in text and "/tmp/" not in text


def test_an_unwritten_helper_and_a_cell_that_raises_are_named(tmp_path):
    raising = "BLOCK = 16\n\nraise ValueError('not yet')\n" + kit.source(kit.load("solutions", L14), "paged_kv")
    result, _, _ = graded(tmp_path, kit.submission(L14, {"paged_kv": raising}, solved=("decode_roofline",)))
    e = kit.by_id(result)
    assert e["decode_roofline"]["status"] == "not_attempted"
    assert e["decode_roofline"]["message"].startswith(
        "Exercise `decode_roofline` could not run because it calls your function `kv_cache_bytes`, which is not "
        f"written yet (exercise `kv_cache_bytes`, section {SECTION_KV}). Write that one first")
    assert e["paged_kv"]["message"].startswith('Your cell for this exercise (under "4 · A paged KV cache") '
                                               "stopped at line 3 with ValueError: not yet, so none of its cases "
                                               "could run.")
    assert "line 3\n    raise ValueError('not yet')\nValueError: not yet" in e["paged_kv"]["message"]


@pytest.mark.parametrize("text,shown", [
    (f'File "{ROOT}/grader/runs/x.py", line 3', 'File "<course>/grader/runs/x.py", line 3'),
    ('File "/opt/conda/lib/python3.12/site-packages/torch/nn/functional.py"',
     'File "<site-packages>/torch/nn/functional.py"'),
    ('File "/usr/lib/python3.11/json/decoder.py", line 9', 'File "<python>/json/decoder.py", line 9'),
    ("No such file or directory: '/tmp/gpulab-grade-x1y2/work/data.bin'",
     "No such file or directory: '<tmp>/data.bin'"),
    ("cwd is /tmp/work.", "cwd is <tmp>/work."),
    ("/tmp", "<tmp>"),
    ("x = a/tmp/b and <answer cell costs>, line 4", "x = a/tmp/b and <answer cell costs>, line 4"),
])
def test_machine_paths_become_names(text, shown):
    assert hide_paths(text) == shown
    assert hide_paths(shown) == shown


def test_notebook_run_failures_name_the_exercise_or_the_section():
    nb = read_notebook(ROOT / "solutions" / "02_triton_basics.ipynb")
    index = {c.get("id"): i for i, c in enumerate(nb.cells)}
    answer = next(i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("gpulab", {}).get("exercise")
                  == "bias_gelu")
    assert _cell_name(nb, answer) == "the cell of exercise `bias_gelu`"
    after = answer + 1  # the check cell below it: a locked cell, named by its section
    assert _cell_name(nb, after) == f'the cell under "{section_title(nb, after)}"'
    assert section_title(nb, after).startswith("2 · ")
    assert _cell_name(nb, index["parameters"]) == 'the cell under "Lab 02 · Triton basics: programs, masks, fusion"'


def _advised(answers: dict, messages: dict) -> dict:
    """:func:`grader.advice.advise` on a lab-14 result whose exercises failed with ``messages``."""
    from grader.advice import advise

    entries = [{"id": eid, "points": 2.0, "score": 0.0, "status": status, "message": message}
               for eid, (status, message) in messages.items()]
    result = {"exercises": entries}
    advise(result, L14, read_notebook(ROOT / "solutions" / f"{L14}.ipynb"), answers)
    return kit.by_id(result)


def test_a_missing_cell_and_a_renamed_function_are_named():
    solution = kit.load("solutions", L14)
    e = _advised({"decode_roofline": kit.source(solution, "decode_roofline"), "paged_kv": "class Blocks: pass"}, {
        "kv_cache_bytes": ("not_attempted", "no answer cell for this exercise in the submission."),
        "decode_roofline": ("error", "1/3 cases passed. Case 'a': NameError: name 'kv_cache_bytes' is not defined"),
        "paged_kv": ("not_attempted", "define `BlockManager` (run its cell first)."),
    })
    assert e["decode_roofline"]["message"].startswith(
        "Exercise `decode_roofline` could not run because your cell defining `kv_cache_bytes` (exercise "
        f"`kv_cache_bytes`, section {SECTION_KV}) is missing from the submission.")
    assert e["paged_kv"]["message"].startswith(
        "Your cell for exercise `paged_kv` (A paged KV cache: blocks and block tables, under \"4 · A paged KV "
        f"cache\" in labs/{L14}.ipynb) ran but does not define `BlockManager`: the check calls it by that name")
    assert e["paged_kv"]["title"] == "A paged KV cache: blocks and block tables"


def test_a_cell_that_hung_is_named_by_the_exercises_that_needed_it():
    solution = kit.load("solutions", L14)
    e = _advised({"kv_cache_bytes": "import time\ntime.sleep(1e9)\n" + kit.source(solution, "kv_cache_bytes"),
                  "decode_roofline": kit.source(solution, "decode_roofline")}, {
        "kv_cache_bytes": ("timeout", "did not finish within 60 s ... (while its answer cell ran)"),
        "decode_roofline": ("error", "0/3 cases passed. Case 'a': NameError: name 'kv_cache_bytes' is not defined"),
    })
    assert e["kv_cache_bytes"]["message"].startswith("did not finish within 60 s")
    assert e["decode_roofline"]["message"].startswith(
        "Exercise `decode_roofline` could not run because your cell defining `kv_cache_bytes` (exercise "
        f"`kv_cache_bytes`, section {SECTION_KV}) hung while it ran.")


@pytest.mark.slow
def test_a_real_notebook_run_names_the_section_of_the_cell_that_stopped(tmp_path):
    """The lab as released: the first cell that calls a stub is a locked one, named by its section."""
    from grader.grade import grade

    result = grade(kit.write(kit.submission("02_triton_basics"), tmp_path / "s.ipynb"), lab="02_triton_basics",
                   seed=3, timeout_s=scaled(30))
    run = result["notebook_run"]
    if run["status"] == "skipped":
        pytest.skip(run["error"])
    assert run["status"] == "failed" and run["cell"].startswith('the cell under "') and "code cell" not in run["cell"]
    assert run["error"].startswith("NotImplementedError: this cell uses exercise `")
    assert run["error"].endswith("`, which is not written yet.")
    broken = kit.submission("02_triton_basics", {"vector_add": "raise RuntimeError('MARK-CELL')"})
    result = grade(kit.write(broken, tmp_path / "b.ipynb"), lab="02_triton_basics", seed=3, timeout_s=scaled(30))
    assert result["notebook_run"]["cell"] == "the cell of exercise `vector_add`"
    assert result["notebook_run"]["error"] == "RuntimeError: MARK-CELL"
