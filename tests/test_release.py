"""Release: solution regions become stubs; malformed regions are errors naming the cell."""
import subprocess
import sys

import nbformat
import pytest

from grader.release import ReleaseError, release, release_notebook, strip_regions
from tests.conftest import ROOT

SOLUTION_CELL = '''def f(x):
    """Doubles x."""
    ### BEGIN SOLUTION
    ### HINT: multiply by two.
    return 2 * x
    ### END SOLUTION'''


def test_region_becomes_a_stub_keeping_signature_docstring_and_hint():
    out, n = strip_regions(SOLUTION_CELL, markdown=False, where="t", eid="double")
    assert n == 1
    assert out.startswith('def f(x):\n    """Doubles x."""')
    assert "    # Hint: multiply by two." in out
    assert '    raise NotImplementedError("exercise `double`: replace this line with your code.")' in out
    assert "2 * x" not in out
    ns = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError):
        ns["f"](1)


def test_markdown_region_becomes_answer_space():
    out, _ = strip_regions("Q?\n### BEGIN SOLUTION\nsecret\n### END SOLUTION", markdown=True, where="t")
    assert out == "Q?\n_Your answer here._"


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n### END SOLUTION", "nested"),
    ("x = 1\n### BEGIN SOLUTION\ny = 2", "never closed"),
    ("### END SOLUTION", "without a"),
])
def test_malformed_regions_are_errors(source, problem):
    with pytest.raises(ReleaseError, match=problem):
        strip_regions(source, markdown=False, where="lab.ipynb, cell 3 (id abc)")


def _write(tmp_path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    (tmp_path / "solutions").mkdir(exist_ok=True)
    path = tmp_path / "solutions" / "99_demo.ipynb"
    nbformat.write(nb, path)
    return path


def test_error_names_notebook_and_cell(tmp_path):
    path = _write(tmp_path, [nbformat.v4.new_markdown_cell("# T"),
                             nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1", id="bad-cell")])
    with pytest.raises(ReleaseError, match=r"99_demo.ipynb, cell 1 \(id bad-cell\).*never closed"):
        release_notebook(path)


def test_answer_cell_without_region_is_an_error(tmp_path):
    cell = nbformat.v4.new_code_cell("x = 1", id="a")
    cell.metadata["gpulab"] = {"exercise": "demo", "points": 1}
    path = _write(tmp_path, [nbformat.v4.new_markdown_cell("# T"), cell])
    with pytest.raises(ReleaseError, match="has no '### BEGIN SOLUTION' region"):
        release_notebook(path)


def test_release_writes_banner_clears_outputs_and_check_detects_staleness(tmp_path):
    code = nbformat.v4.new_code_cell(SOLUTION_CELL, id="a", execution_count=3,
                                     outputs=[nbformat.v4.new_output("stream", text="hi")])
    code.metadata["gpulab"] = {"exercise": "demo", "points": 1}
    _write(tmp_path, [nbformat.v4.new_markdown_cell("# T", id="t"), code])
    assert release(tmp_path, check=True) == ["labs/99_demo.ipynb"]
    assert release(tmp_path) == ["labs/99_demo.ipynb"]
    lab = nbformat.read(tmp_path / "labs" / "99_demo.ipynb", 4)
    assert lab.cells[0].source.startswith("> **Generated** from `solutions/99_demo.ipynb`")
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert lab.cells[1].metadata["gpulab"] == {"exercise": "demo", "points": 1}
    assert release(tmp_path, check=True) == []
    (tmp_path / "labs" / "99_demo.ipynb").write_text("{}")
    assert release(tmp_path, check=True) == ["labs/99_demo.ipynb"]
    (tmp_path / "labs" / "00_orphan.ipynb").write_text("{}")
    assert "labs/00_orphan.ipynb (no solution)" in release(tmp_path, check=True)


def test_repository_labs_are_in_sync_with_solutions():
    proc = subprocess.run([sys.executable, "-m", "grader", "release", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
