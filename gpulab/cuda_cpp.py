"""CUDA C++ without a GPU: compile kernels with NVIDIA's ``nvcc`` and read what the compiler made (lesson 17).

The course compiles CUDA C++ with the ``nvcc`` of NVIDIA's PyPI wheel ``nvidia-cuda-nvcc`` (installed by
``make setup`` with the test extras), driving the system's C++ compiler, never with whatever ``nvcc`` a
machine has on its ``PATH``: one pinned, pip-installable compiler gives every learner and the grader the
same registers and spills. The report of each kernel comes from NVIDIA's own tools: ``ptxas -v``
(registers, shared memory, spills, barriers) and ``cuobjdump -sass`` (the machine code: does the
reduction's finish really use ``SHFL``?). ``cuobjdump`` is the copy bundled with Triton.

    from gpulab import cuda_cpp
    reports = cuda_cpp.compile_report(SOURCE, "sm_90")   # {kernel name: KernelReport}
    print(cuda_cpp.resource_table([*reports.values()]))

Compiles are cached by content hash (source, target, flags, compiler version) under
``~/.cache/gpulab/nvcc`` (``GPULAB_CACHE`` moves it), so a notebook or a test session compiles each
kernel once per target. Nothing here runs a kernel: :func:`load_inline` builds one for a real GPU
with PyTorch's ``torch.utils.cpp_extension.load_inline``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpulab.aot import H100, Device

# NVIDIA A100 (compute capability 8.0 limits, CUDA C Programming Guide): 164 KiB of shared memory per
# SM, of which one block may use 163 KiB (166,912 bytes), plus 1 KiB the system keeps per block.
A100 = Device(name="NVIDIA A100 (sm_80)", arch=80, sms=108,
              regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
              smem_per_sm=164 * 1024, smem_per_block=163 * 1024, smem_reserved_per_block=1024,
              smem_alloc_unit=128, threads_per_sm=2048, threads_per_block=1024, blocks_per_sm=32)
TARGETS = {"sm_80": A100, "sm_90": H100}  # the GPUs the course supports, by nvcc target


class NvccMissing(RuntimeError):
    """NVIDIA's ``nvcc`` wheel is not installed."""


@dataclass(frozen=True)
class KernelReport:
    """What ``ptxas`` and ``cuobjdump`` say about one compiled kernel (a ``__global__`` function).

    ``registers`` per thread; ``shared`` bytes of static shared memory per block; ``stack`` bytes of
    per-thread stack (local arrays live there); ``spill_stores``/``spill_loads`` bytes of registers
    spilled to local memory (which is DRAM, cached in L1/L2); ``sass`` counts each SASS opcode
    (``{"SHFL.DOWN": 5, "BAR.SYNC.DEFER_BLOCKING": 2, ...}``).
    """

    name: str
    arch: str
    registers: int
    shared: int
    stack: int
    spill_stores: int
    spill_loads: int
    barriers: int
    sass: dict = field(default_factory=dict)

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def uses(self, opcode: str) -> bool:
        """True when some SASS instruction starts with ``opcode`` (``"SHFL"`` matches ``SHFL.DOWN``)."""
        return any(op == opcode or op.startswith(opcode + ".") for op in self.sass)

    def as_dict(self) -> dict:
        return asdict(self)


@functools.cache
def nvcc() -> Path:
    """The ``nvcc`` of NVIDIA's PyPI wheel (``nvidia-cuda-nvcc``), found inside site-packages."""
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for found in sorted(Path(root).glob("*/bin/nvcc")):  # nvidia/cu13/bin (13.x), nvidia/cuda_nvcc/bin (12.x)
            return found
    raise NvccMissing("NVIDIA's nvcc wheel is not installed: run `make setup` (or "
                      "`pip install nvidia-cuda-nvcc`) and restart the kernel.")


@functools.cache
def nvcc_version() -> str:
    """``"13.5"`` for the wheel's ``nvcc``."""
    text = subprocess.run([str(nvcc()), "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"release (\d+\.\d+)", text).group(1)


def _cuobjdump() -> str:
    from triton import knobs

    return knobs.nvidia.cuobjdump.path


def _cache_dir() -> Path:
    root = Path(os.environ.get("GPULAB_CACHE", Path.home() / ".cache" / "gpulab")) / "nvcc"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"gpulab-nvcc-{os.getuid()}"  # a read-only home (the grader's sandbox)
    root.mkdir(parents=True, exist_ok=True)
    return root


class CompileError(RuntimeError):
    """nvcc rejected the source; the message holds its diagnostics."""


def _run_nvcc(source: str, arch: str, flags: tuple, tmp: Path) -> tuple[str, bytes]:
    """(ptxas's verbose report, the cubin) of ``source`` compiled for ``arch``."""
    src, cubin = tmp / "kernel.cu", tmp / "kernel.cubin"
    src.write_text(source)
    cmd = [str(nvcc()), "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", *flags, "-o", str(cubin), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    if done.returncode != 0:
        errors = "\n".join(line.replace(str(src), "kernel.cu") for line in done.stderr.splitlines()
                           if "ptxas info" not in line)
        raise CompileError(f"nvcc could not compile the kernel for {arch}:\n{errors.strip()}")
    return done.stderr, cubin.read_bytes()


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def _parse_ptxas(text: str) -> dict:
    """``{kernel: {registers, shared, stack, spill_stores, spill_loads, barriers}}`` from ``ptxas -v``."""
    out: dict = {}
    name = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            name = m.group(1)
            out[name] = {"registers": 0, "shared": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0, "barriers": 0}
        elif name and (m := _SPILLS.search(line)):
            out[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif name and (m := _USED.search(line)):
            smem, bars = _SMEM.search(line), _BARRIERS.search(line)
            out[name].update(registers=int(m.group(1)), shared=int(smem.group(1)) if smem else 0,
                             barriers=int(bars.group(1)) if bars else 0)
    return out


_SASS_FUNCTION = re.compile(r"^\s*Function : (\w+)", re.M)
_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _sass_by_function(sass: str) -> dict:
    """``{kernel: SASS text}`` from ``cuobjdump -sass``."""
    parts = _SASS_FUNCTION.split(sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _opcode_counts(sass: str) -> dict:
    counts: dict = {}
    for op in _SASS_OPCODE.findall(sass):
        counts[op] = counts.get(op, 0) + 1
    return counts


def _compile(source: str, arch: str, flags: tuple) -> dict:
    """The cached record of one compile: ``{"reports": {...}, "sass": {kernel: text}}``."""
    key = hashlib.sha256(json.dumps([source, arch, list(flags), nvcc_version()]).encode()).hexdigest()[:24]
    path = _cache_dir() / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory(prefix="gpulab-nvcc-") as tmp:
        verbose, cubin = _run_nvcc(source, arch, flags, Path(tmp))
        (Path(tmp) / "k.cubin").write_bytes(cubin)
        sass = subprocess.run([_cuobjdump(), "-sass", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, check=True).stdout
    record = {"reports": _parse_ptxas(verbose), "sass": _sass_by_function(sass)}
    tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_text(json.dumps(record))
    tmp_path.replace(path)  # atomic: two processes compiling at once both end with a whole file
    return record


def compile_report(source: str, arch: str = "sm_90", flags: tuple = ()) -> dict:
    """``{kernel name: KernelReport}`` for every ``__global__`` function of ``source`` compiled for ``arch``
    (``"sm_80"`` or ``"sm_90"``). Declare kernels ``extern "C"`` so their names are not mangled.
    Raises :class:`CompileError` with nvcc's diagnostics when the source does not compile."""
    record = _compile(source, arch, tuple(flags))
    return {name: KernelReport(name, arch, sass=_opcode_counts(record["sass"].get(name, "")), **res)
            for name, res in record["reports"].items()}


def sass(source: str, kernel: str, arch: str = "sm_90") -> str:
    """The SASS (machine code) of one kernel of ``source``, as ``cuobjdump -sass`` prints it."""
    return _compile(source, arch, ())["sass"][kernel]


def resource_table(reports: list) -> str:
    """A Markdown table of :class:`KernelReport` rows: what a kernel costs an SM, per target."""
    rows = ["| kernel | target | registers | shared (B) | stack (B) | spills (B) | SHFL | BAR |",
            "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        rows.append(f"| {r.name} | {r.arch} | {r.registers} | {r.shared} | {r.stack} | {r.spills} | "
                    f"{'yes' if r.uses('SHFL') else 'no'} | {'yes' if r.uses('BAR') else 'no'} |")
    return "\n".join(rows)


def run_host_program(source: str, timeout_s: float = 60.0) -> str:
    """Compile ``source`` (a whole C++ program, ``main`` included) with ``nvcc`` as the host compiler
    driver and run it on the CPU; returns its standard output. For host-side code (RAII wrappers,
    error checks) that needs no GPU to be tested."""
    key = hashlib.sha256(json.dumps([source, nvcc_version()]).encode()).hexdigest()[:24]
    exe = _cache_dir() / f"{key}.exe"
    if not exe.exists():
        with tempfile.TemporaryDirectory(prefix="gpulab-nvcc-") as tmp:
            src = Path(tmp) / "main.cu"
            src.write_text(source)
            built = Path(tmp) / "main"
            done = subprocess.run([str(nvcc()), "-std=c++17", "-O1", "-o", str(built), str(src)],
                                  capture_output=True, text=True, cwd=tmp)
            if done.returncode != 0:
                raise CompileError("nvcc could not compile the program:\n"
                                   + done.stderr.replace(str(src), "main.cu").strip())
            built.replace(exe)
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the program exited with status {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def load_inline(name: str, cuda_source: str, cpp_source: str, functions: list):
    """Build ``cuda_source`` for this machine's GPU and return the module of ``functions`` (host wrappers
    declared in ``cpp_source``), with PyTorch's ``torch.utils.cpp_extension.load_inline``. GPU only."""
    import torch
    from torch.utils.cpp_extension import load_inline as torch_load_inline

    if not torch.cuda.is_available():
        raise RuntimeError("load_inline builds CUDA kernels for a GPU; none is visible here. On a CPU, read "
                           "the kernel's compile report with gpulab.cuda_cpp.compile_report instead.")
    return torch_load_inline(name, cpp_sources=[cpp_source], cuda_sources=[cuda_source], functions=functions,
                             extra_cuda_cflags=["-O3"], verbose=False)


if __name__ == "__main__":  # python -m gpulab.cuda_cpp FILE.cu [sm_80|sm_90]: print a kernel file's report
    text = Path(sys.argv[1]).read_text()
    print(resource_table([*compile_report(text, sys.argv[2] if len(sys.argv) > 2 else "sm_90").values()]))
