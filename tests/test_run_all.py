"""Run All on an untouched lab reaches its last cell: a cell that needs an unfinished exercise says which
one to finish and the run carries on (gpulab.runall, installed by gpulab.setup).

The guard is tested in an IPython shell; whole labs run in a kernel (nbclient, CPU), as a learner's
Run All does. Four labs run in `make test` (those whose demo cells use their exercises' results
most, one through rank processes); ``GPULAB_RUN_ALL_LABS=1`` runs every lab, and a static check
covers the rest: every lab installs the guard (calls ``gpulab.setup``) before any other code runs.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from grader.checks import lab_stems
from tests.conftest import ROOT

STUB = 'raise NotImplementedError("exercise `{eid}`{where}: replace this line with your code.")'
ALWAYS = ("05_flash_attention", "07_mixed_precision", "12_tensor_parallel", "14_inference_serving")


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    from gpulab import runall

    ip = InteractiveShell()  # a plain shell, not the process-wide singleton
    runall.install(ip)
    runall._missing.clear()
    runall._hit.clear()
    yield ip
    runall._missing.clear()
    runall._hit.clear()


def test_a_cell_stopped_by_a_stub_names_the_exercise_and_the_run_carries_on(shell, capsys):
    assert shell.run_cell("def max_batch(n):\n    " + STUB.format(eid="kv_cache_bytes", where=", function `max_batch`"))
    first = shell.run_cell("B = max_batch(4)\nB")
    assert first.success and first.result is None
    out = capsys.readouterr().out
    assert "TODO: this cell needs exercise `kv_cache_bytes`, function `max_batch`" in out
    later = shell.run_cell("B + 1")  # a later cell using what the stopped cell never assigned
    assert later.success
    assert "needs `B`" in capsys.readouterr().out


def test_a_later_error_is_excused_only_while_the_stub_is_still_there(shell, capsys):
    shell.run_cell("def f(x):\n    " + STUB.format(eid="e", where=""))
    shell.run_cell("R = {}\nR['a'] = f(1)")
    assert shell.run_cell("R['a']").success  # half-filled results, while f is unfinished
    assert "stopped at `KeyError: 'a'`, most likely because exercise `e` is unfinished" in capsys.readouterr().out
    assert not shell.run_cell("@undefined_decorator\ndef g():\n    pass").success  # an answer cell's own error
    shell.run_cell("def f(x):\n    return x")  # the learner writes it
    assert not shell.run_cell("R['a']").success  # now a real error: a traceback, and Run All stops


def test_other_errors_and_the_last_expression_behave_as_always(shell, capsys):
    assert shell.run_cell("1 + 1").result == 2
    assert not shell.run_cell("undefined_name").success
    assert not shell.run_cell("raise NotImplementedError('my own')").success  # not a stub: raised
    assert not shell.run_cell("raise ValueError('x')").success
    assert "TODO" not in capsys.readouterr().out


def test_a_check_still_reports_not_attempted(shell, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "p.json"))
    stub = "    " + STUB.format(eid="scaling", where="")
    shell.run_cell("def amdahl_speedup(p, n):\n" + stub + "\n"
                   "def strong_scaling_efficiency(t1, tn, n):\n" + stub + "\n"
                   "def weak_scaling_efficiency(t1, tn):\n" + stub)
    assert shell.run_cell("from gpulab import check\ncheck('scaling', strict=False)").success
    assert "TODO ✏️ scaling: not_attempted" in capsys.readouterr().out


@pytest.mark.parametrize("stem", lab_stems())
def test_every_lab_installs_the_guard_before_any_other_code(stem):
    nb = json.loads((ROOT / "labs" / f"{stem}.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in json.dumps(nb["cells"][1]["metadata"]) or "DEVICE" in code[0]
    assert re.search(r"gpulab\.setup\(", code[1]), f"labs/{stem}.ipynb: the second code cell must call gpulab.setup"


def _lab_params():
    every = os.environ.get("GPULAB_RUN_ALL_LABS") == "1"
    return [pytest.param(stem, marks=pytest.mark.slow) for stem in lab_stems() if every or stem in ALWAYS]


@pytest.mark.parametrize("stem", _lab_params())
def test_run_all_on_an_untouched_lab_reaches_the_last_cell(stem, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for name in ("GPULAB_STRICT", "GPULAB_GRADING"):  # a learner's kernel has neither
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("GPULAB_PROGRESS", str(tmp_path / "progress.json"))
    path = ROOT / "labs" / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [f"cell {c.get('id')}: {o.get('ename')}: {o.get('evalue', '')[:300]}"
              for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, "\n".join(errors)
    assert all(c.execution_count for c in code), "a cell did not run"
    printed = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    assert "TODO: this cell needs exercise `" in printed  # the demo cells said what to finish
