"""Where the drills' answers live: one JSON file, written at every change (drills notebook of lesson 16).

``{qid: record}`` in ``workspace/notebooks/16_interview_drills.answers.json``, beside your copy of the drills notebook
(git-ignored; ``GPULAB_DRILLS`` moves it). A drill's record holds ``answer``, ``started``, ``elapsed_s``,
``revealed``, ``checked``, ``score``, ``followups`` (your answers to them, in order) and ``saved``; an estimation
question's (``E-...``) holds ``answer``, ``ok``, ``attempts`` and ``seconds``. An answer survives a closed notebook or
a crashed kernel, and the progress view reads it back after a restart.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpulab.paths import ROOT

ANSWERS = "16_interview_drills.answers.json"


def drills_file() -> Path:
    """The answers' JSON file: beside the drills notebook in your workspace (:mod:`gpulab.workspace`), or
    ``$GPULAB_DRILLS``. Answers saved before the workspace existed (beside ``notebooks/``) stay where they are."""
    if "GPULAB_DRILLS" in os.environ:
        return Path(os.environ["GPULAB_DRILLS"])
    from gpulab.workspace import workspace_dir

    path = workspace_dir() / "notebooks" / ANSWERS
    legacy = ROOT / "notebooks" / ANSWERS
    return legacy if legacy.exists() and not path.exists() else path


class DrillStore:
    """The saved drills, ``{qid: record}``; every change is written to :func:`drills_file` at once."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else drills_file()

    def load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # nothing saved yet, or a damaged file: start afresh rather than fail the drill

    def get(self, qid: str) -> dict:
        return dict(self.load().get(qid, {}))

    def update(self, qid: str, **fields) -> dict:
        data = self.load()
        record = dict(data.get(qid, {}), **fields, saved=time.strftime("%Y-%m-%d %H:%M:%S"))
        data[qid] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)  # atomic: a crash mid-write never loses the earlier answers
        return record
