"""The workspace: a learner's work lives in git-ignored copies, the course's tracked notebooks never change, and
the course updates under the work (gpulab.workspace, `make lab`); drills and their progress read without a kernel."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gpulab import drills, workspace
from tests.conftest import ROOT


def _course(tmp_path):
    root = tmp_path / "course"
    for folder in ("notebooks", "labs", "benchmarks/results"):
        (root / folder).mkdir(parents=True)
    (root / "notebooks" / "00_start_here.ipynb").write_text("lesson v1")
    (root / "labs" / "07_mixed_precision.ipynb").write_text("lab v1")
    (root / "notebooks" / "07_mixed_precision.ipynb").write_text("lesson 07 v1")
    (root / "benchmarks" / "results" / "r.json").write_text("{}")
    return root


def test_first_use_copies_the_course_then_never_overwrites_your_work(tmp_path):
    root, ws = _course(tmp_path), tmp_path / "ws"
    assert sorted(workspace.prepare(ws, root)) == ["labs/07_mixed_precision.ipynb", "notebooks/00_start_here.ipynb",
                                                  "notebooks/07_mixed_precision.ipynb"]
    (ws / "labs" / "07_mixed_precision.ipynb").write_text("my answers")
    (root / "labs" / "07_mixed_precision.ipynb").write_text("lab v2")  # the course moves on (git pull)
    (root / "labs" / "08_quantization.ipynb").write_text("new lab")
    assert workspace.prepare(ws, root) == ["labs/08_quantization.ipynb"]  # new labs arrive, yours stay
    assert (ws / "labs" / "07_mixed_precision.ipynb").read_text() == "my answers"
    assert (ws / "labs" / "../benchmarks/results/r.json").read_text() == "{}"  # ../benchmarks works as from labs/


def test_update_takes_the_new_version_and_keeps_yours_beside_it(tmp_path):
    root, ws = _course(tmp_path), tmp_path / "ws"
    workspace.prepare(ws, root)
    (ws / "labs" / "07_mixed_precision.ipynb").write_text("my answers")
    (root / "labs" / "07_mixed_precision.ipynb").write_text("lab v2")
    message = workspace.update("07_mixed_precision", ws, root)  # a shared stem: the lab
    assert message.startswith("labs/07_mixed_precision.ipynb: the course's current version; your copy is now")
    assert (ws / "labs" / "07_mixed_precision.ipynb").read_text() == "lab v2"
    (mine,) = (ws / "labs").glob("07_mixed_precision.mine-*.ipynb")
    assert mine.read_text() == "my answers"
    workspace.update("notebooks/07_mixed_precision", ws, root)
    assert len(list((ws / "notebooks").glob("07_mixed_precision.mine-*.ipynb"))) == 1
    with pytest.raises(SystemExit, match="no course notebook called '99_nothing'"):
        workspace.update("99_nothing", ws, root)


def test_the_workspace_and_the_drill_answers_are_ignored_by_git():
    for path in ("workspace/notebooks/00_start_here.ipynb", "workspace/notebooks/16_interview_drills.answers.json",
                 "workspace/labs/07_mixed_precision.ipynb", "notebooks/16_interview_drills.answers.json"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path


def test_drill_answers_live_in_the_workspace(monkeypatch, tmp_path):
    monkeypatch.delenv("GPULAB_DRILLS", raising=False)
    monkeypatch.setenv("GPULAB_WORKSPACE", str(tmp_path / "ws"))
    if not (ROOT / "notebooks" / drills.ANSWERS).exists():  # a checkout with answers from before keeps them there
        assert drills.drills_file() == tmp_path / "ws" / "notebooks" / drills.ANSWERS


def test_a_drill_shows_its_saved_answer_without_a_kernel(tmp_path):
    store = drills.DrillStore(tmp_path / "a.json")
    store.update("Q-PAR-1", answer="TP inside the node <NVLink>", elapsed_s=420.0, score="4/6")
    box = drills.drill_widget("Q-PAR-1", store, ticking=False)
    bundle = box._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data  # live in JupyterLab
    page = data["text/html"]
    assert "TP inside the node &lt;NVLink&gt;" in page and "7.0 of 12 min, self-score 4/6" in page
    assert "your answer" in data["text/plain"] and "TP inside the node <NVLink>" in data["text/plain"]


def test_the_drills_progress_view_has_words_beside_every_symbol(tmp_path, monkeypatch):
    store = drills.DrillStore(tmp_path / "a.json")
    store.update("Q-PAR-1", answer="an answer")
    shown = []
    monkeypatch.setattr("gpulab.feedback._in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    drills.show_progress(store)
    page = shown[0]["text/html"]
    assert "<td>yes ✅</td>" in page and "<td>not yet</td>" in page
    for symbol in ("✅", "❌", "✏️", "⏱️", "💥"):
        for i in [i for i in range(len(page)) if page.startswith(symbol, i)]:
            assert page[i - 2:i].strip(), f"{symbol} stands alone"


@pytest.mark.slow
def test_running_and_saving_lessons_changes_no_tracked_file(tmp_path, monkeypatch):
    """Lessons 00 and 16 run and saved in the workspace (as `make lab` opens them), a drill answered: the tracked
    notebooks stay as shipped (format and release checks pass) and `git status` does not change."""
    import nbformat
    from nbclient import NotebookClient

    from grader.release import release

    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    before = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    ws = ROOT / "workspace" / f".test-{os.getpid()}"  # inside the checkout, where `make lab` puts it
    for name in ("GPULAB_STRICT", "GPULAB_DRILLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAB_WORKSPACE", str(ws))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        workspace.prepare(ws)
        for name in ("00_start_here.ipynb", "16_interview_drills.ipynb"):
            path = ws / "notebooks" / name
            nb = nbformat.read(path, as_version=4)
            nb.cells.append(nbformat.v4.new_code_cell(
                "from gpulab.drills import Drill\nDrill('Q-OPT-1').save('my answer')"))  # a drill, answered
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            nbformat.write(nb, path)  # saved, outputs and all
        saved = json.loads((ws / "notebooks" / drills.ANSWERS).read_text())
        assert saved["Q-OPT-1"]["answer"] == "my answer"
        after = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        assert after == before
        assert release(check=True).changed == []
        for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            assert not any(c.get("outputs") or c.get("execution_count") for c in cells), path
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        if (ROOT / "workspace").is_dir() and not any((ROOT / "workspace").iterdir()):
            (ROOT / "workspace").rmdir()  # made by this test only
