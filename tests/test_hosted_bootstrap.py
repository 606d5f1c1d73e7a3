"""The hosted-runtime bootstrap (``gpulab.hosted``, lesson 00's first cell on Colab and Kaggle), run the way it
runs there: a fresh environment that already has torch (a venv made with ``--system-site-packages`` that sees the
project's packages, as a hosted runtime sees its preinstalled ones), a checkout addressed by path, no network."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gpulab import hosted
from gpulab.paths import ROOT

OFFLINE = ["--no-index", "--no-build-isolation"]  # nothing to download: setuptools comes from the environment


def _checkout(dest: Path) -> Path:
    """A copy of the working tree's files (tracked and new, as git lists them): a clone, without the network."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _runtime(dest: Path) -> Path:
    """A new venv that sees the project's packages (torch among them) as a hosted runtime sees its own: through a
    path entry, so the project's own editable install of the course is not active there. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run(python: Path, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_the_bootstrap_keeps_the_preinstalled_torch_and_installs_the_checkout(tmp_path):
    checkout = _checkout(tmp_path / "gpu-systems-lab")
    python = _runtime(tmp_path / "runtime")
    torch_before = _run(python, "import torch; print(torch.__file__)", tmp_path).strip()

    # As lesson 00's cell runs it: by path, in the kernel's own process, which must end in the checkout.
    out = _run(python, f"import os, runpy; runpy.run_path({str(checkout / 'gpulab' / 'hosted.py')!r})['bootstrap']"
                       f"({str(checkout)!r}, {OFFLINE!r}); print('cwd', os.getcwd()); import gpulab, grader; "
                       "print('now', gpulab.__file__)", tmp_path)
    assert "torch is installed: kept" in out and "Every other dependency is already installed." in out
    assert f"cwd {checkout}" in out and f"now {checkout / 'gpulab'}" in out
    assert hosted.describe_gpus() in out and "What the free tiers give" in out and "two T4s" in out

    # A fresh process (a restarted kernel), anywhere: the editable install points at the checkout; torch unchanged.
    after = _run(python, "import gpulab, grader, torch; print(gpulab.__file__); print(grader.__file__); "
                         "print(torch.__file__)", tmp_path).split()
    assert after == [str(checkout / "gpulab" / "__init__.py"), str(checkout / "grader" / "__init__.py"), torch_before]
    purelib = Path(_run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path).strip())
    assert not (purelib / "torch").exists() and not list(purelib.glob("torch-*.dist-info"))


@pytest.mark.slow
def test_the_bootstrap_runs_as_a_module_and_by_path(tmp_path):
    for argv in (["-m", "gpulab.hosted", "--help"], [str(ROOT / "gpulab" / "hosted.py"), "--help"]):
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "--pip-arg" in done.stdout, done.stderr


def test_only_missing_requirements_are_installed_and_never_torch(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.4", '
                                             '"triton>=3.6; sys_platform == \'linux\'", "numpy>=1.26,<2.4", '
                                             '"winonly; sys_platform == \'win32\'", "tqdm>=4.60"]\n')
    monkeypatch.setattr(hosted, "_installed", lambda name: name == "numpy")
    assert hosted.missing_requirements(tmp_path, keep_torch=True) == ["tqdm>=4.60"]
    expected = ["torch>=2.4", "tqdm>=4.60"] if sys.platform != "linux" else ["torch>=2.4", "triton>=3.6", "tqdm>=4.60"]
    assert hosted.missing_requirements(tmp_path, keep_torch=False) == expected


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a checkout of the course"):
        hosted.bootstrap(tmp_path)
