"""Release: solution regions become stubs; malformed regions are errors naming the cell."""
import os
import subprocess
import sys

import nbformat
import pytest

from grader import cli
from grader import release as release_module
from grader.release import (
    KERNELSPEC,
    LANGUAGE_INFO,
    ReleaseError,
    committed_text,
    release,
    release_notebook,
    strip_regions,
)
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
    assert release(tmp_path, check=True).changed == ["labs/99_demo.ipynb"]
    assert release(tmp_path).changed == ["labs/99_demo.ipynb"]
    lab = nbformat.read(tmp_path / "labs" / "99_demo.ipynb", 4)
    assert lab.cells[0].source.startswith("> **Generated** from `solutions/99_demo.ipynb`")
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert lab.cells[1].metadata["gpulab"] == {"exercise": "demo", "points": 1}
    assert lab.metadata["kernelspec"] == KERNELSPEC and lab.metadata["language_info"] == LANGUAGE_INFO
    assert release(tmp_path, check=True).changed == []
    (tmp_path / "labs" / "99_demo.ipynb").write_text("{}")
    assert release(tmp_path, check=True).changed == ["labs/99_demo.ipynb"]
    orphan = nbformat.v4.new_notebook(metadata={"gpulab": {"generated_from": "solutions/00_gone.ipynb"}})
    nbformat.write(orphan, tmp_path / "labs" / "00_orphan.ipynb")
    assert "labs/00_orphan.ipynb (no solution)" in release(tmp_path, check=True).changed
    assert "labs/00_orphan.ipynb (no solution; removed)" in release(tmp_path, force=True).changed
    assert not (tmp_path / "labs" / "00_orphan.ipynb").exists()


# A learner's work in labs/ is never at risk from a documented command ---------------------------

def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _released_demo(tmp_path, commit: bool):
    """A project in ``tmp_path`` with one solution and its released lab (committed to git if asked)."""
    code = nbformat.v4.new_code_cell(SOLUTION_CELL, id="a")
    code.metadata["gpulab"] = {"exercise": "demo", "points": 1}
    _write(tmp_path, [nbformat.v4.new_markdown_cell("# T", id="t"), code])
    release(tmp_path)
    if commit:
        _git(tmp_path, "init", "-q")
        _git(tmp_path, "add", "solutions", "labs")
        _git(tmp_path, "commit", "-q", "-m", "release")
    return tmp_path / "labs" / "99_demo.ipynb"


def _save_answers(lab_path, source=SOLUTION_CELL, outputs=True):
    """What JupyterLab saves after a learner typed ``source`` into the answer cell and ran it."""
    lab = nbformat.read(lab_path, 4)
    lab.cells[1].source = source
    if outputs:
        lab.cells[1].execution_count = 1
        lab.cells[1].outputs = [nbformat.v4.new_output("stream", text="ok")]
    nbformat.write(lab, lab_path)
    return lab_path.read_text()


def _edit_solution(tmp_path, old, new):
    path = tmp_path / "solutions" / "99_demo.ipynb"
    path.write_text(path.read_text().replace(old, new))


def test_check_accepts_saved_answers_when_the_committed_lab_is_current(tmp_path):
    lab = _released_demo(tmp_path, commit=True)
    saved = _save_answers(lab)
    assert release(tmp_path, check=True).changed == []
    assert lab.read_text() == saved
    _edit_solution(tmp_path, "Doubles x.", "Twice x.")  # the solution moved on: now labs/ is stale
    assert release(tmp_path, check=True).changed == ["labs/99_demo.ipynb"]
    assert lab.read_text() == saved


def test_check_outside_git_compares_with_the_working_copy(tmp_path):
    lab = _released_demo(tmp_path, commit=False)
    assert release(tmp_path, check=True).changed == []
    _save_answers(lab)
    assert release(tmp_path, check=True).changed == ["labs/99_demo.ipynb"]


@pytest.mark.parametrize("outputs", [True, False], ids=["answers-and-outputs", "answers-only"])
def test_release_keeps_a_lab_with_answers_unless_forced(tmp_path, outputs):
    lab = _released_demo(tmp_path, commit=True)
    _edit_solution(tmp_path, "Doubles x.", "Twice x.")
    saved = _save_answers(lab, source=SOLUTION_CELL.replace("2 * x", "x + x"), outputs=outputs)
    report = release(tmp_path)
    assert report.changed == [] and list(report.kept) == ["labs/99_demo.ipynb"]
    assert lab.read_text() == saved
    assert release(tmp_path, force=True).changed == ["labs/99_demo.ipynb"]
    assert "Twice x." in lab.read_text() and "x + x" not in lab.read_text()


def test_release_keeps_notes_in_a_new_cell_and_in_the_interview_answer(tmp_path):
    lab = _released_demo(tmp_path, commit=False)
    nb = nbformat.read(lab, 4)
    nb.cells.append(nbformat.v4.new_markdown_cell("my notes", id="mine"))
    nbformat.write(nb, lab)
    _edit_solution(tmp_path, "Doubles x.", "Twice x.")
    assert list(release(tmp_path).kept) == ["labs/99_demo.ipynb"]
    assert "my notes" in lab.read_text()


def test_release_overwrites_its_own_output_even_before_it_is_committed(tmp_path):
    lab = _released_demo(tmp_path, commit=True)
    _edit_solution(tmp_path, "Doubles x.", "Twice x.")
    assert release(tmp_path).changed == ["labs/99_demo.ipynb"]
    _edit_solution(tmp_path, "Twice x.", "Two times x.")  # a second edit, nothing committed between
    assert release(tmp_path).changed == ["labs/99_demo.ipynb"]
    assert "Two times x." in lab.read_text()


def test_release_leaves_a_learners_own_notebooks_and_copies_alone(tmp_path):
    lab = _released_demo(tmp_path, commit=False)
    copy = tmp_path / "labs" / "99_demo.mine.ipynb"
    copy.write_text(_save_answers(lab))
    mine = tmp_path / "labs" / "scratch.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), mine)
    release(tmp_path, force=True)
    assert copy.exists() and mine.exists()
    assert release(tmp_path, check=True).changed == []


def test_cli_release_names_the_kept_lab_and_how_to_keep_the_work(tmp_path, monkeypatch, capsys):
    lab = _released_demo(tmp_path, commit=True)
    _edit_solution(tmp_path, "Doubles x.", "Twice x.")
    saved = _save_answers(lab)
    monkeypatch.setattr(release_module, "ROOT", tmp_path)
    assert cli.main(["release"]) == 1
    err = capsys.readouterr().err
    assert "labs/99_demo.ipynb: it has outputs" in err
    assert "mv labs/99_demo.ipynb labs/99_demo.mine.ipynb" in err and "--force" in err
    assert lab.read_text() == saved
    assert cli.main(["release", "--check"]) == 1  # stale: the committed lab predates the edit
    assert lab.read_text() == saved


def test_the_repository_release_check_passes_with_answers_saved_in_labs(tmp_path):
    """`make test` runs `release --check` on the real project: a learner's saved lab must pass it
    and stay byte for byte as it was (run on a clone, so the real labs/ is never touched)."""
    if committed_text(ROOT, "labs/02_triton_basics.ipynb") is None:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    lab = clone / "labs" / "02_triton_basics.ipynb"
    assert release(clone, check=True).changed == [], "the committed labs/ is stale"
    nb = nbformat.read(lab, 4)
    sol = nbformat.read(clone / "solutions" / "02_triton_basics.ipynb", 4)
    first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("gpulab", {}).get("exercise"))
    nb.cells[first].source = sol.cells[first].source
    nb.cells[first].outputs = [nbformat.v4.new_output("stream", text="ok")]
    nbformat.write(nb, lab)
    saved = lab.read_text()
    proc = subprocess.run([sys.executable, "-c", "import sys; from grader import release as r; "
                           "sys.exit(1 if r.release(sys.argv[1], check=True).changed else 0)", str(clone)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert lab.read_text() == saved
    assert "02_triton_basics" in "".join(release(clone).kept)
    assert lab.read_text() == saved


def test_repository_labs_are_in_sync_with_solutions():
    proc = subprocess.run([sys.executable, "-m", "grader", "release", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_points_are_declared_once_in_the_checks_and_copied_by_release(tmp_path):
    """A solution whose points drifted from grader/checks is reported by --check and fixed by release."""
    import shutil

    from grader.checks import exercises

    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "01_performance_model.ipynb"
    shutil.copy(ROOT / "solutions" / path.name, path)
    nb = nbformat.read(path, 4)
    cell = next(c for c in nb.cells if c.metadata.get("gpulab", {}).get("exercise"))
    eid = cell.metadata["gpulab"]["exercise"]
    cell.metadata["gpulab"]["points"] = 99
    path.write_text(nbformat.writes(nb) + "\n")
    assert f"solutions/{path.name} (points differ from grader/checks/01_performance_model.py)" in \
        release(tmp_path, check=True).changed
    release(tmp_path)
    for folder in ("solutions", "labs"):
        cell = next(c for c in nbformat.read(tmp_path / folder / path.name, 4).cells
                    if c.metadata.get("gpulab", {}).get("exercise") == eid)
        assert cell.metadata["gpulab"]["points"] == exercises("01_performance_model")[eid].points
    assert release(tmp_path, check=True).changed == []
