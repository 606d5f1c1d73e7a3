"""Install the course into a hosted notebook runtime (Colab, Kaggle) without touching its torch (lesson 00).

Hosted runtimes come with a CUDA build of torch (and the Triton it was built with) preinstalled; reinstalling
torch there downloads gigabytes and can break the runtime's CUDA setup. So this script:

1. keeps torch (and Triton) when ``import torch`` works; only a runtime without torch gets one;
2. installs the course from a checkout with ``pip install -e <checkout> --no-deps``, then only the
   dependencies of ``pyproject.toml`` that are missing;
3. makes ``import gpulab, grader`` work in the running kernel at once, and moves the kernel's working
   directory to the checkout;
4. says what the free tier gives (a T4: no bf16, no fp8, Triton's ``tl.dot`` without tensor cores, 15 GB).

Standard library only: it runs before anything is installed. Two ways to run it:

    python -m gpulab.hosted [CHECKOUT]          # from a checkout (a terminal, or `!python ...` in a cell)
    python path/to/gpulab/hosted.py [CHECKOUT]  # by path

In a notebook cell, run it in the kernel's own process (so the working directory and ``sys.path`` change
there), as lesson 00's first cell does::

    import runpy
    runpy.run_path("/content/gpu-systems-lab/gpulab/hosted.py")["bootstrap"]("/content/gpu-systems-lab")
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

# Installed with torch, as the pair torch was built with: never installed on their own next to a kept torch.
KEPT_WITH_TORCH = ("torch", "triton")

TIERS = """\
What the free tiers give (datasheet figures, not measured):
- Colab (free): one T4 (sm_75, 40 SMs, 16 GB of which about 15 GB usable, 320 GB/s). No bf16 and no fp8
  tensor cores, and Triton's tl.dot runs without tensor cores (FMAs): matmul timings sit far below an
  H100's; the lessons say what they skip and show the compile report for an H100 instead.
- Kaggle: two T4s (Settings > Accelerator > GPU T4 x2): labs 11-13 run two ranks over NCCL, one per GPU.
- Paid tiers: L4 (sm_89: bf16 and fp8), A100 (sm_80: bf16, 2:4 sparse); an H100 runs everything."""


def _name(requirement: str) -> str:
    """``"numpy>=1.26,<2.4"`` -> ``"numpy"`` (the distribution's name, normalised)."""
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _applies(requirement: str) -> bool:
    """False for a requirement whose ``sys_platform`` marker excludes this machine (the only marker the
    course uses); True otherwise."""
    marker = requirement.partition(";")[2]
    found = re.search(r"""sys_platform\s*(==|!=)\s*['"]([^'"]+)['"]""", marker)
    if not found:
        return True
    return (sys.platform == found.group(2)) == (found.group(1) == "==")


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def torch_works(python: str = sys.executable) -> bool:
    """True when ``import torch`` works for ``python`` (checked in a child process: importing torch here
    would load it into the kernel before the course sets Triton up)."""
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


def missing_requirements(checkout: Path, keep_torch: bool) -> list[str]:
    """The requirements of ``checkout``'s ``pyproject.toml`` not installed here at all, torch and Triton left out
    when ``keep_torch`` (a working preinstalled torch is kept, with the Triton it came with). An installed
    package of another version is kept too: the runtime's own packages work together."""
    project = tomllib.loads((Path(checkout) / "pyproject.toml").read_text())["project"]
    wanted = [r for r in project["dependencies"] if _applies(r)]
    if keep_torch:
        wanted = [r for r in wanted if _name(r) not in KEPT_WITH_TORCH]
    return [r.partition(";")[0].strip() for r in wanted if not _installed(_name(r))]


def _pip(args: list[str], pip_args: list[str]) -> None:
    command = [sys.executable, "-m", "pip", "install", "--quiet", *args, *pip_args]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def describe_gpus() -> str:
    """What ``nvidia-smi`` says about this runtime's GPUs, in one line."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    if not out:
        return "No GPU in this runtime: the course runs on the CPU (Colab: Runtime > Change runtime type > T4 GPU)."
    gpus = out.splitlines()
    return f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: " + "; ".join(gpus)


def bootstrap(checkout, pip_args=(), chdir: bool = True) -> Path:
    """Install the course from ``checkout`` into this Python, keeping a working torch; make ``gpulab`` and
    ``grader`` importable in this process; ``chdir`` into the checkout. ``pip_args`` go to every pip call
    (``--no-index``, ``--no-build-isolation`` offline). Returns the checkout's path."""
    checkout = Path(checkout).resolve()
    if not (checkout / "pyproject.toml").is_file() or not (checkout / "gpulab").is_dir():
        raise SystemExit(f"{checkout} is not a checkout of the course (no pyproject.toml and gpulab/ there): "
                         "clone the course's repository first (lesson 00's first cell does).")
    pip_args = list(pip_args)
    keep = torch_works()
    print("torch is installed: kept as it is (never reinstalled)." if keep else
          "torch is missing: installing it with the course's other dependencies.")
    _pip(["-e", str(checkout), "--no-deps"], pip_args)
    missing = missing_requirements(checkout, keep)
    if missing:
        _pip(missing, pip_args)
    else:
        print("Every other dependency is already installed.")
    # An editable install is read when Python starts; this process sees the checkout now through sys.path.
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    importlib.invalidate_caches()
    if chdir:
        os.chdir(checkout)
        print(f"Working directory: {checkout} (the notebooks are in notebooks/, the labs in labs/).")
    print(describe_gpus())
    print(TIERS)
    return checkout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.hosted", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", nargs="?", default=str(Path(__file__).resolve().parent.parent),
                        help="the course's checkout (default: the one this file is in)")
    parser.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                        help="passed to pip (repeat it), e.g. --pip-arg=--no-index")
    args = parser.parse_args(argv)
    bootstrap(args.checkout, args.pip_arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
