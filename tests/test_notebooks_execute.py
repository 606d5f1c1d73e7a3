"""Every lesson and solution re-executes top to bottom (papermill), with every check passing.

``GPULAB_STRICT=1`` makes a failed inline check raise, so a solution whose check fails fails here.
``GPULAB_DEVICE`` picks the device (``make test-gpu`` sets ``cuda``). Run times are written to
``.gpulab/notebook_times.json``; they are reported, never asserted.
"""
import json
import os
import time

import pytest

from tests.conftest import ROOT

NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")])


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setenv("GPULAB_STRICT", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    device = os.environ.get("GPULAB_DEVICE", "cpu")
    start = time.perf_counter()
    papermill.execute_notebook(str(path), str(tmp_path / path.name), parameters={"DEVICE": device},
                               kernel_name="python3", cwd=str(path.parent), progress_bar=False,
                               execution_timeout=600)
    seconds = time.perf_counter() - start
    times = ROOT / ".gpulab" / f"notebook_times_{device}.json"
    times.parent.mkdir(exist_ok=True)
    try:
        data = json.loads(times.read_text())
    except (OSError, ValueError):
        data = {}
    data[f"{path.parent.name}/{path.name}"] = round(seconds, 1)
    times.write_text(json.dumps(data, indent=1, sort_keys=True))
