"""Every notebook follows the fixed format of design.md; labs' stubs raise NotImplementedError.

Labs are tested as `python -m grader release` generates them (`test_release.py` keeps the committed
labs/ equal to that), never from the working copy, where a learner's saved answers live.
"""
import json
import re

import nbformat
import pytest

from grader.checks import exercises, lab_stems
from grader.exercise import evaluate
from grader.notebooks import answer_cells, exec_source, exercise_id, export_source, is_parameters, read_notebook
from grader.release import KERNELSPEC, LANGUAGE_INFO, release_notebook, render
from tests.conftest import ROOT

SOURCES = sorted(p for folder in ("notebooks", "solutions") for p in (ROOT / folder).glob("*.ipynb"))
NOTEBOOKS = SOURCES + [ROOT / "labs" / p.name for p in SOURCES if p.parent.name == "solutions"]
IDS = [f"{p.parent.name}/{p.name}" for p in NOTEBOOKS]


def stored_text(path) -> str:
    """The file's text; for labs/, the text release generates from the solution."""
    if path.parent.name == "labs":
        return render(release_notebook(ROOT / "solutions" / path.name))
    return path.read_text()


def load(path):
    """The notebook with each source as one string; for labs/ the generated one."""
    return nbformat.reads(stored_text(path), 4) if path.parent.name == "labs" else read_notebook(path)


def test_there_are_notebooks():
    assert {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")} >= {"00_start_here", "01_performance_model",
                                                                      "02_triton_basics"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_without_outputs_with_stable_ids(path):
    raw = json.loads(stored_text(path))
    assert raw["nbformat"] == 4
    ids = [c.get("id") for c in raw["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), "every cell needs a unique id"
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"cell {cell['id']} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_kernelspec_is_the_one_jupyterlab_writes(path):
    """JupyterLab writes the kernel's kernelspec and language_info into a notebook it opens; any
    difference marks the notebook modified and autosave rewrites a tracked file."""
    meta = json.loads(stored_text(path))["metadata"]
    assert meta["kernelspec"] == KERNELSPEC
    assert meta["language_info"] == LANGUAGE_INFO


def test_kernelspec_matches_the_installed_ipykernel():
    """KERNELSPEC and LANGUAGE_INFO are what this environment's ipykernel announces (its kernel.json,
    its kernel_info reply), the Python version aside: that one is the course environment's."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert {"display_name": spec.display_name, "language": spec.language, "name": "python3"} == KERNELSPEC
    info = dict(IPythonKernel.language_info)
    info.pop("version")
    assert {k: v for k, v in LANGUAGE_INFO.items() if k != "version"} == info
    assert LANGUAGE_INFO["version"].startswith("3.11.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_cell_parameters_setup_and_interview(path):
    nb = load(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown"
    text = first.source.lower()
    for needed in ("# ", "prerequisite", "gpu", "cpu", "run time"):
        assert needed in text, f"first cell lacks {needed!r}"
    params = [c for c in nb.cells if is_parameters(c)]
    assert len(params) == 1
    assert re.search(r'^DEVICE = "auto"', params[0].source, re.M) and re.search(r"^SEED = 0", params[0].source, re.M)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    setup_at = next(i for i, s in enumerate(code) if "gpulab.setup(DEVICE, SEED)" in s)
    triton_at = [i for i, s in enumerate(code) if re.search(r"^\s*(import triton|from triton)", s, re.M)]
    assert all(i >= setup_at for i in triton_at), "gpulab.setup must come before `import triton`"
    headings = [c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert headings and headings[-1].startswith("## In the interview")


@pytest.mark.parametrize("stem", lab_stems())
def test_every_exercise_has_exactly_one_answer_cell_with_its_points(stem):
    nb = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    cells = [c for c in nb.cells if exercise_id(c)]
    assert [exercise_id(c) for c in cells] == list(exercises(stem))
    for cell in cells:
        assert cell.metadata["gpulab"]["points"] == exercises(stem)[exercise_id(cell)].points


def test_exercise_ids_are_unique_across_labs():
    ids = [eid for stem in lab_stems() for eid in exercises(stem)]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("stem", lab_stems())
def test_every_stub_in_labs_raises_not_implemented_cleanly(stem):
    nb = load(ROOT / "labs" / f"{stem}.ipynb")
    ns = exec_source(export_source(nb, answer_cells(nb)), f"<labs/{stem}.ipynb>")
    for eid, ex in exercises(stem).items():
        result = evaluate(ex, ns, "cpu")
        assert result.status == "not_attempted", (eid, result.message)
        assert result.score == 0
        assert "replace this line with your code" in result.message
