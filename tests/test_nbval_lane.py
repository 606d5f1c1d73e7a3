"""The notebook lane (`make test-notebooks`, part of `make test`) covers every lesson and solution.

The lane itself runs nbval (`pytest --nbval-lax`) over notebooks/ and solutions/; this test checks, quickly,
that `make test` calls it and that nbval collects every notebook the course ships, so a notebook added
to either folder is executed by CI without anyone listing it.
"""
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")])


def make_rule(target: str) -> str:
    """The recipe lines of one Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, f"no `{target}` target in the Makefile"
    return match.group(1)


def test_make_test_runs_the_notebook_lane():
    assert "test-notebooks" in make_rule("test")
    lane = make_rule("test-notebooks")
    assert "$(NBVAL)" in lane and "--dist loadfile" in lane and "GPULAB_STRICT=1" in lane
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^NOTEBOOKS \?= notebooks solutions$", text, re.M)
    assert "--nbval-lax" in text and "tests/nbval_sanitize.cfg" in text


@pytest.mark.slow
def test_nbval_collects_every_lesson_and_solution():
    out = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "--collect-only", "-q",
                          "-p", "no:xdist", "-p", "no:cacheprovider", "notebooks", "solutions"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    missing = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS if p.relative_to(ROOT).as_posix() not in collected]
    assert not missing, f"nbval did not collect: {missing}"


def test_sanitiser_masks_what_varies():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tests" / "nbval_sanitize.cfg")
    rules = [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]

    def sanitise(text: str) -> str:
        for pattern, word in rules:
            text = pattern.sub(word, text)
        return text

    assert sanitise("took 12.5 ms at 1.9 TB/s on NVIDIA H100 80GB HBM3") == \
        sanitise("took 3 ms at 820 GB/s on NVIDIA A100-SXM4-40GB")
    assert sanitise("<Tensor at 0x7f3a2c>") == sanitise("<Tensor at 0x55aa01>")
    assert sanitise("max abs error 0.41") != sanitise("max abs error 0.42")  # answers are not masked
