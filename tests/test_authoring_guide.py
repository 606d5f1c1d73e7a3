"""grader/README.md's worked example runs: its solution passes its own check, and each wrong answer
in its tests fails with the message the guide promises."""
import importlib.util
import re
import sys

import pytest

from tests.conftest import ROOT

BLOCK = re.compile(r"```python\n# file: (\w+)\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    blocks = dict((kind, code) for kind, code in BLOCK.findall((ROOT / "grader" / "README.md").read_text()))
    assert set(blocks) == {"solution", "runs", "checks", "test"}, sorted(blocks)
    folder = tmp_path_factory.mktemp("guide")
    # The run side is its own module, grader.runs.NN_name, as it would be in grader/runs/NN_name.py.
    runs = _load(folder / "runs_NN_name.py", "grader.runs.NN_name", blocks["runs"])
    sys.modules["grader.runs.NN_name"] = runs
    # The rest in one real file: @triton.jit reads its kernels' source from it.
    try:
        return _load(folder / "worked_example.py", "worked_example",
                     blocks["solution"] + "\n\n" + blocks["checks"] + "\n\n" + blocks["test"])
    finally:
        sys.modules.pop("grader.runs.NN_name", None)


def _load(path, name, source):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_run_side_is_learner_side_code():
    blocks = dict(BLOCK.findall((ROOT / "grader" / "README.md").read_text()))
    assert "grader.kit" not in blocks["runs"] and "grader.checks" not in blocks["runs"]
    assert "def _scaled_add_run" not in blocks["checks"] and "RUN._scaled_add_run" in blocks["checks"]


def test_the_example_declares_one_exercise_with_the_stated_points(example):
    assert [(ex.id, ex.points) for ex in example.EXERCISES] == [("scaled_add", 2)]
    hidden = {c.name.split(":")[0] for c in example.SCALED_ADD.cases(seed=3, public=False)}
    assert hidden == {"one partial block", "a ragged tail"}


@pytest.mark.parametrize("name", ["test_the_solution_passes", "test_a_store_without_mask_writes_past_the_end",
                                  "test_alpha_ignored_is_named", "test_pytorch_doing_the_work_earns_nothing"])
def test_the_guides_wrong_answer_tests_hold(example, name):
    getattr(example, name)()
