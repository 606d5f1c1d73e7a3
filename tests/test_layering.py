"""Layering: the learner-side package stands alone; the checks are found through one entry point."""
import re
import subprocess
import sys

from gpulab.paths import ROOT

IMPORT_GRADER = re.compile(r"^\s*(from\s+grader[\s.]|import\s+grader\b)", re.MULTILINE)


def test_gpulab_never_imports_grader():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "gpulab").glob("*.py"))
                 if IMPORT_GRADER.search(p.read_text())]
    assert offenders == []


def test_importing_gpulab_loads_no_grader_module():
    probe = ("import sys\n"
             "import gpulab, gpulab.feedback, gpulab.progress, gpulab.compare, gpulab.launches, gpulab.dist\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grader'))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_the_checks_entry_point_is_the_grader_door():
    from gpulab.checks_entry import checks

    door = checks()
    assert door.__name__ == "grader.inline"
    labs = door.labs()
    assert labs[0]["lab"] == "01_performance_model" and sum(labs[0]["points"].values()) == 10


def test_one_root():
    definitions = [str(p.relative_to(ROOT)) for folder in ("gpulab", "grader", "tests", "benchmarks")
                   for p in sorted((ROOT / folder).rglob("*.py"))
                   if re.search(r"^ROOT\s*=", p.read_text(), re.MULTILINE)]
    assert definitions == ["gpulab/paths.py"]
