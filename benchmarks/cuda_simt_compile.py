"""Lab 17's CUDA C++ kernels compiled by nvcc for sm_80 and sm_90: the resource table the lab reads.

Collects every CUDA C++ source of ``notebooks/17_cuda_simt.ipynb`` and ``solutions/17_cuda_simt.ipynb`` (a
string literal of a code cell that defines a ``__global__`` function), compiles each with the nvcc of the
``nvidia-cuda-nvcc`` wheel (``gpulab.cuda_cpp``) and writes what ``ptxas`` and ``cuobjdump`` report to
``results/17_cuda_simt_compile.json`` and ``.md``. A compile report, not a measurement: nothing runs.

    python benchmarks/cuda_simt_compile.py            # rewrite the table
    python benchmarks/cuda_simt_compile.py --check    # exit 1 if the committed table differs
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script

from gpulab.cuda_cpp import compile_report, nvcc_version, resource_table  # noqa: E402
from gpulab.paths import ROOT  # noqa: E402

NOTEBOOKS = ("notebooks/17_cuda_simt.ipynb", "solutions/17_cuda_simt.ipynb")
ARCHS = ("sm_80", "sm_90")
OUT = ROOT / "benchmarks" / "results" / "17_cuda_simt_compile"
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)(?:,\s*\d+)?\)\s*(\w+)\s*\(")


def _is_kernel_file(text: str) -> bool:
    """A kernel source (not a docstring naming one, a host program or a PyTorch wrapper)."""
    return "__global__" in text and "{" in text and "int main(" not in text and "torch::" not in text


def sources(notebook: str) -> list:
    """The CUDA C++ string literals of a notebook's code cells, in order."""
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    found = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"])
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found += [node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_kernel_file(node.value)]
    return found


def table() -> dict:
    """``{"nvcc": version, "kernels": [row, ...]}``: one row per kernel and target."""
    rows = []
    for notebook in NOTEBOOKS:
        for source in sources(notebook):
            threads = {name: int(n) for n, name in _LAUNCH_BOUNDS.findall(source)}
            for arch in ARCHS:
                for name, r in compile_report(source, arch).items():
                    rows.append({"kernel": name, "arch": arch, "threads": threads.get(name), "registers": r.registers,
                                 "shared": r.shared, "stack": r.stack, "spill_stores": r.spill_stores,
                                 "spill_loads": r.spill_loads, "barriers": r.barriers, "shfl": r.uses("SHFL"),
                                 "bar": r.uses("BAR"), "notebook": notebook})
    return {"nvcc": nvcc_version(), "made_by": "python benchmarks/cuda_simt_compile.py", "kernels": rows}


def markdown(data: dict) -> str:
    from gpulab.cuda_cpp import KernelReport

    reports = [KernelReport(r["kernel"], r["arch"], r["registers"], r["shared"], r["stack"], r["spill_stores"],
                            r["spill_loads"], r["barriers"], {op: 1 for op in ("SHFL", "BAR") if r[op.lower()]})
               for r in data["kernels"]]
    return (f"# Lab 17's CUDA C++ kernels, compiled by nvcc {data['nvcc']} (a compile report: nothing ran)\n\n"
            + resource_table(reports) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table differs")
    args = parser.parse_args()
    data = table()
    text = json.dumps(data, indent=1) + "\n"
    if args.check:
        same = OUT.with_suffix(".json").read_text() == text
        print("up to date" if same else "stale: run python benchmarks/cuda_simt_compile.py")
        return 0 if same else 1
    OUT.with_suffix(".json").write_text(text)
    OUT.with_suffix(".md").write_text(markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
