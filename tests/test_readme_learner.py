"""The README says what a newcomer needs and only what is true: sections the CLI points to exist, the workspace and
updating the course are explained, and the claims the project once got wrong stay corrected."""
from __future__ import annotations

import re

from grader.cli import build_parser
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
HEADINGS = {m.strip() for m in re.findall(r"^#+ (.+)$", README, re.M)}


def test_the_sections_the_grader_help_names_exist():
    text = " ".join(build_parser().format_help().split())
    named = re.findall(r'section "([^"]+)"', text)
    assert named and all(name in HEADINGS for name in named), (named, HEADINGS)
    assert ".venv/bin/python -m grader" in text


def test_a_newcomer_finds_setup_the_workspace_and_updates():
    assert {"Your workspace", "Updating the course"} <= HEADINGS
    assert "python3-venv" in README and "workspace/labs/" in README
    assert "python -m gpulab.workspace --update" in README and "python -m gpulab.peaks --refresh" in README
    assert re.search(r"`make\s+test` took \d+ to \d+ minutes", README)
    assert "GPULAB_TEST_TIMEOUT_SCALE" in README


def test_corrected_claims_stay_corrected():
    assert "which is what CI does" not in README  # .ci/run runs plain `make test`
    assert "Every number from 00" not in README  # 00 is a lesson, not a lab
    make = (ROOT / "Makefile").read_text()
    assert "gpulab/jupyter/lab" in make  # JupyterLab saves widget state
    assert "$(KERNEL_CONFIG)" in make.split("\nlab:")[1].splitlines()[0]  # no TCP warning on every kernel start
    assert "gpulab.workspace" in make and "/lab/tree/$(WORKSPACE)/notebooks/00_start_here.ipynb" in make


def test_the_kernel_config_drops_only_the_tcp_warning():
    import logging

    namespace = {}
    exec((ROOT / "gpulab" / "jupyter" / "ipython_kernel_config.py").read_text(), namespace)
    (hush,) = [f for f in logging.getLogger("IPKernelApp").filters if type(f).__name__ == "_QuietLocalTCP"][-1:]
    record = logging.LogRecord("IPKernelApp", logging.WARNING, "", 0, "Kernel is running over TCP without "
                               "encryption. All communication ...", None, None)
    assert not hush.filter(record)
    record.msg = "Parent appears to have exited, shutting down."
    assert hush.filter(record)
    logging.getLogger("IPKernelApp").removeFilter(hush)
