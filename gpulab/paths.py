"""Where the project lives on disk: one ``ROOT`` for every module, script and test that needs it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the project folder (holds gpulab/, grader/, labs/ ...)
