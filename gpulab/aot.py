"""What the compiler made of your kernel: compile Triton kernels for a GPU you do not have (lesson 04).

On a CPU your kernels run in Triton's interpreter, which says nothing about registers, shared memory
or tensor cores. This module compiles them for a real GPU instead: a stand-in CUDA driver reports one
of :data:`TARGETS` (an H100, ``sm_90``, unless you pick another: a T4, an A100, an A10G, an L4) with
its device limits and launches nothing, and everything else is Triton's own path:
argument specialisation, the autotuner, the NVIDIA backend with its bundled ``ptxas``, and the
launch-time check that a kernel's shared memory fits the device. Inputs are tensors on PyTorch's
``meta`` device: they have shapes, strides and dtypes but no memory, so full-size inputs cost nothing.

    from gpulab import aot
    x = torch.empty(4096, 4096, device="meta", dtype=torch.float16)
    records = aot.compile_call(softmax, x)      # a lab's wrapper: every kernel it launches
    aot.show(records)                           # registers, shared memory, occupancy, tensor cores
    aot.show(aot.compile_call(softmax, x, device=aot.T4))   # the same wrapper on a T4 (sm_75)

Each :class:`KernelRecord` holds what ``ptxas`` and the PTX say (registers, spills, shared memory,
``wgmma``/``mma``, or the FMA fallback of ``tl.dot`` on a T4; the widest global load, int8 loads) and
the occupancy that follows on the target. Code that picks tiles for "this GPU" (``gpulab.device``'s
:func:`~gpulab.device.shared_memory_per_block`) sees the target inside :func:`target` and
:func:`stand_in` blocks, so a whole lab can be set up and compiled for each GPU in turn.
Nothing here is a measurement: how fast a kernel runs is only known by timing it on a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import subprocess
import tempfile
import types
import warnings
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Device:
    """The limits of one GPU model that decide whether and how many CTAs (blocks) fit on an SM."""

    name: str
    arch: int                      # compute capability * 10: 90 is sm_90
    sms: int
    regs_per_sm: int               # 32-bit registers in an SM's register file
    regs_per_block: int
    max_regs_per_thread: int
    reg_alloc_unit: int            # registers are given to a warp in units of this many
    smem_per_sm: int               # bytes of shared memory an SM can give to its CTAs
    smem_per_block: int            # the most one CTA may ask for (the launch limit)
    smem_reserved_per_block: int   # the system's own share of shared memory per CTA
    smem_alloc_unit: int
    threads_per_sm: int
    threads_per_block: int
    blocks_per_sm: int
    warp_size: int = 32

    def properties(self) -> dict:
        """``triton.runtime.driver.active.utils.get_device_properties(device)`` for this GPU."""
        return {"max_shared_mem": self.smem_per_block, "max_num_regs": self.regs_per_block,
                "multiprocessor_count": self.sms, "warpSize": self.warp_size,
                "sm_clock_rate": 1_980_000, "mem_clock_rate": 2_619_000, "mem_bus_width": 5120}


# NVIDIA H100 SXM5 (CUDA C Programming Guide, compute capability 9.0 limits): 228 KiB of shared memory
# per SM, of which one CTA may use 227 KiB (232,448 bytes), plus 1 KiB the system keeps per CTA.
H100 = Device(name="NVIDIA H100 (sm_90, stand-in driver: nothing runs)", arch=90, sms=132,
              regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
              smem_per_sm=228 * 1024, smem_per_block=227 * 1024, smem_reserved_per_block=1024,
              smem_alloc_unit=128, threads_per_sm=2048, threads_per_block=1024, blocks_per_sm=32)

# The other generations learners reach, each with a representative part's SM count (CUDA C Programming
# Guide, "Technical Specifications per Compute Capability"; SM counts from each part's datasheet). From 8.0 on
# the driver keeps 1 KiB of shared memory per CTA; a 7.5 part (T4) tops out at 64 KiB per CTA.
T4 = Device(name="NVIDIA T4 (sm_75, stand-in driver: nothing runs)", arch=75, sms=40,
            regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
            smem_per_sm=64 * 1024, smem_per_block=64 * 1024, smem_reserved_per_block=0,
            smem_alloc_unit=256, threads_per_sm=1024, threads_per_block=1024, blocks_per_sm=16)
A100 = Device(name="NVIDIA A100 (sm_80, stand-in driver: nothing runs)", arch=80, sms=108,
              regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
              smem_per_sm=164 * 1024, smem_per_block=163 * 1024, smem_reserved_per_block=1024,
              smem_alloc_unit=128, threads_per_sm=2048, threads_per_block=1024, blocks_per_sm=32)
A10G = Device(name="NVIDIA A10G (sm_86, stand-in driver: nothing runs)", arch=86, sms=80,
              regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
              smem_per_sm=100 * 1024, smem_per_block=99 * 1024, smem_reserved_per_block=1024,
              smem_alloc_unit=128, threads_per_sm=1536, threads_per_block=1024, blocks_per_sm=16)
L4 = Device(name="NVIDIA L4 (sm_89, stand-in driver: nothing runs)", arch=89, sms=58,
            regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, reg_alloc_unit=256,
            smem_per_sm=100 * 1024, smem_per_block=99 * 1024, smem_reserved_per_block=1024,
            smem_alloc_unit=128, threads_per_sm=1536, threads_per_block=1024, blocks_per_sm=24)

# Every compile target the course supports, by its ``sm_XX`` name, oldest first.
TARGETS = {f"sm_{d.arch}": d for d in (T4, A100, A10G, L4, H100)}


# --- occupancy ------------------------------------------------------------------------------------

def occupancy(registers: int, threads: int, shared: int, device: Device = H100) -> tuple[int, str]:
    """(CTAs per SM, what limits it) for a kernel using ``registers`` per thread, ``threads`` per CTA
    and ``shared`` bytes of shared memory per CTA, by the rules of CUDA's occupancy calculator.

    Each limit gives a number of CTAs: the SM's threads (2048 on an H100), its CTA slots (32), its
    register file (65,536 registers, given to each warp in units of 256) and its shared memory
    (228 KiB, each CTA also holding 1 KiB for the system). The smallest wins (ties are all named,
    ``"threads & registers"``). 0 CTAs: it cannot launch.
    """
    warps = math.ceil(threads / device.warp_size)
    regs_per_warp = math.ceil(registers * device.warp_size / device.reg_alloc_unit) * device.reg_alloc_unit
    smem = math.ceil(shared / device.smem_alloc_unit) * device.smem_alloc_unit + device.smem_reserved_per_block
    limits = {
        "threads": device.threads_per_sm // (warps * device.warp_size),
        "blocks": device.blocks_per_sm,
        "registers": (device.regs_per_sm // regs_per_warp) // warps if regs_per_warp else device.blocks_per_sm,
        # a T4 keeps no shared memory per CTA for the system: a kernel without any is not limited by it
        "shared memory": (device.smem_per_sm // smem if smem else math.inf) if shared <= device.smem_per_block else 0,
    }
    ctas = min(limits.values())
    return ctas, " & ".join(name for name, value in limits.items() if value == ctas)


# --- what the PTX says ----------------------------------------------------------------------------

_LD_GLOBAL = re.compile(r"\bld\.global((?:\.[\w:]+)*)")
_CP_ASYNC = re.compile(r"\bcp\.async\.c[ag]\.shared\.global\s*\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")
_TT_LOAD_TYPE = re.compile(r"\btt\.load\b[^\n]*!tt\.ptr<(\w+)>")


def global_load_bits(ptx: str) -> int:
    """The widest global load in ``ptx``, in bits per thread and instruction (128 for
    ``ld.global.v4.b32`` or a 16-byte ``cp.async``); 0 if the kernel loads nothing from global memory."""
    widest = 0
    for suffixes in _LD_GLOBAL.findall(ptx):
        parts = suffixes.split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
        bits = next((int(p[1:]) for p in parts if re.fullmatch(r"[bsuf]\d+", p)), 0)
        widest = max(widest, lanes * bits)
    for nbytes in _CP_ASYNC.findall(ptx):
        widest = max(widest, int(nbytes, 0) * 8)
    return widest


def tensor_core_instructions(ptx: str) -> str:
    """``"wgmma"`` (Hopper's warpgroup MMA), ``"mma"`` (the warp-level ``mma.sync`` of Ampere) or ``""``."""
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if re.search(r"\bmma\.sync\b", ptx):
        return "mma"
    return ""


def multiplies_tiles(ttir: str) -> bool:
    """True when the kernel's Triton IR holds a ``tt.dot`` (a ``tl.dot`` of tiles)."""
    return re.search(r"\btt\.dot\b", ttir) is not None


def loaded_dtypes(ttir: str) -> tuple[str, ...]:
    """Element types the kernel loads from global memory, from its Triton IR (``("f16", "i8")``)."""
    return tuple(sorted(set(_TT_LOAD_TYPE.findall(ttir))))


# --- what the SASS says about a loop ----------------------------------------------------------------

_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?(0x[0-9a-f]+)")
SCHEDULERS_PER_SM = 4  # warp schedulers per SM (Volta to Hopper): each issues one warp instruction per clock


def instructions(sass: str) -> list[str]:
    """Every instruction of ``sass`` in address order, ``NOP`` padding left out."""
    return [text.strip() for _, text in _SASS_LINE.findall(sass) if not text.strip().startswith("NOP")]


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest loop in ``sass`` (a backward branch's target up to the branch,
    ``NOP`` padding left out): for a kernel that walks K, one K step."""
    lines = [(int(addr, 16), text.strip()) for addr, text in _SASS_LINE.findall(sass)]
    loops = []
    for addr, text in lines:
        target = _BRANCH.search(text)
        if target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            loops.append([t for a, t in lines if start <= a <= addr and not t.startswith("NOP")])
    return max(loops, key=len, default=[])


def issue_ceiling_bytes_per_s(instructions_per_byte: float, device: Device = H100) -> float:
    """The bandwidth at which issuing the instructions becomes the limit: every SM's schedulers issue one
    warp instruction (32 threads) per clock, so bytes/s = SMs x 4 x clock x 32 / instructions per byte
    and thread. A kernel cannot stream memory faster than this, whatever its loads do."""
    clock_hz = device.properties()["sm_clock_rate"] * 1e3
    return device.sms * SCHEDULERS_PER_SM * clock_hz * device.warp_size / instructions_per_byte


# --- the record -----------------------------------------------------------------------------------

@dataclass
class KernelRecord:
    """One compiled kernel: its configuration and what the compiler made of it for ``device``.

    ``tensor_cores`` is ``"wgmma"``, ``"mma"`` or ``""``; ``dot`` says whether the kernel multiplies
    tiles with ``tl.dot`` at all: a ``dot`` without tensor-core instructions runs on the CUDA cores
    (:attr:`matrix_unit` says ``"FMA fallback"``, what Triton does below ``sm_80``, on a T4).
    ``spills`` is Triton's ``n_spills``: a thread's local memory (spilled registers and stack frame,
    from the cubin) in 32-bit words, as ``cuFuncGetAttribute(LOCAL_SIZE_BYTES) / 4`` on a GPU;
    ``vector_bits`` is the widest global load; ``error`` is Triton's launch-time refusal (for example
    too much shared memory), in which case registers and occupancy are unknown (None).
    """

    kernel: str
    config: dict
    shared: int
    threads: int
    tensor_cores: str
    vector_bits: int
    loads: tuple
    registers: int | None = None
    spills: int | None = None
    ctas_per_sm: int | None = None
    limiter: str = ""
    grid: tuple | None = None
    error: str = ""
    dot: bool = False
    device: Device = field(default=H100, repr=False)
    ptx: str = field(default="", repr=False)
    ttgir: str = field(default="", repr=False)
    cubin: bytes = field(default=b"", repr=False)

    @property
    def int8_loads(self) -> bool:
        """True when the kernel reads int8 (i8) data from global memory."""
        return "i8" in self.loads

    @property
    def matrix_unit(self) -> str:
        """``"wgmma"``, ``"mma"``, ``"FMA fallback"`` (a ``tl.dot`` on the CUDA cores) or ``"none"`` (no ``tl.dot``)."""
        return self.tensor_cores or ("FMA fallback" if self.dot else "none")

    @property
    def fits(self) -> bool:
        """True when Triton would launch it: no launch-time error."""
        return not self.error

    @property
    def warps_per_sm(self) -> int | None:
        return None if self.ctas_per_sm is None else self.ctas_per_sm * self.threads // self.device.warp_size

    def sass(self) -> str:
        """The machine code ``ptxas`` made (SASS), disassembled by Triton's bundled ``cuobjdump``."""
        return disassemble(self.cubin)

    def config_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.config.items())

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, "config": self.config, "registers": self.registers, "spills": self.spills,
                "shared": self.shared, "threads": self.threads, "tensor_cores": self.tensor_cores,
                "matrix_unit": self.matrix_unit,
                "vector_bits": self.vector_bits, "loads": list(self.loads), "int8_loads": self.int8_loads,
                "ctas_per_sm": self.ctas_per_sm, "limiter": self.limiter, "grid": self.grid, "error": self.error}


def toolchain(device: Device = H100) -> str:
    """The compilers that made the records: ``"Triton 3.9.0, ptxas 13.4"``."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    return f"Triton {triton.__version__}, ptxas {get_ptxas(device.arch).version}"


# --- the stand-in driver --------------------------------------------------------------------------

def resource_usage(cubin: bytes) -> dict:
    """``{"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}`` of a cubin, read by Triton's bundled
    ``cuobjdump --dump-resource-usage`` (what ``cuFuncGetAttribute`` would report on a GPU)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", path],
                              capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return dict(zip(("REG", "STACK", "SHARED", "LOCAL"), map(int, found.groups())))


def disassemble(cubin: bytes) -> str:
    """SASS of a cubin (``cuobjdump -sass``)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", path],
                              capture_output=True, text=True, check=True).stdout


class _Utils:
    """The part of Triton's ``CudaUtils`` the launch path calls, answered for ``device``."""

    def __init__(self, device: Device):
        self.device = device

    def get_device_properties(self, _device):
        return self.device.properties()

    def get_device_capability(self, _device):
        return divmod(self.device.arch, 10)

    def load_binary(self, name, cubin, shared, _device):
        """(module, function, n_regs, n_spills, n_max_threads) as the CUDA driver would return them."""
        usage = resource_usage(cubin)
        regs = usage["REG"]
        unit = self.device.reg_alloc_unit
        per_warp = math.ceil(max(regs, 1) * self.device.warp_size / unit) * unit
        max_threads = min(self.device.threads_per_block, self.device.regs_per_block // per_warp * self.device.warp_size)
        return 0, 0, regs, (usage["LOCAL"] + usage["STACK"]) // 4, max_threads

    def unload_module(self, _module):
        pass


class _NoOpLauncher:
    """Takes the place of Triton's CUDA launcher: records the grid of each launch, runs nothing."""

    def __init__(self, src, metadata):
        self.grids = []

    def __call__(self, grid_x, grid_y, grid_z, *args):
        self.grids.append((grid_x, grid_y, grid_z))


def _no_op_bench(kernel_call, quantiles=None, **_):
    """The autotuner's benchmarker: compile (and pretend to launch) the config; every config 'takes' 1 ms."""
    kernel_call()
    return [1.0] * len(quantiles) if quantiles else 1.0


def _stand_in_driver(device: Device):
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class StandInDriver(DriverBase):
        """A CUDA driver for a GPU that is not there: Triton compiles for it, launches do nothing."""

        def __init__(self):
            self.utils = _Utils(device)
            self.launcher_cls = _NoOpLauncher

        @staticmethod
        def is_active():
            return False

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError("the stand-in driver builds no launcher")

        def get_current_target(self):
            return GPUTarget("cuda", device.arch, device.warp_size)

        def get_active_torch_device(self):
            import torch
            return torch.device("meta")

        def get_current_device(self):
            return 0

        def set_current_device(self, _device):
            pass

        def get_current_stream(self, _device=None):
            return 0

        def get_device_capability(self, _device=None):
            return divmod(device.arch, 10)

        def get_benchmarker(self):
            return _no_op_bench

    return StandInDriver()


# --- compiling kernels the interpreter owns -------------------------------------------------------

def scope_interpreter_patches() -> None:
    """Make Triton's interpreter undo the language patches of a nested ``@triton.jit`` call.

    To interpret a kernel, Triton patches ``triton.language`` (``tl.core.mul`` and friends) and
    restores it afterwards, except for a call to another jit function from inside a kernel
    (``tl.sum``, ``tl.cdiv``, your own helpers): ``InterpretedFunction.__call__`` never restores those
    patches (Triton 3.6 to 3.9). Interpreting still works, but compiling a kernel later in the same
    process fails. Called by :func:`gpulab.device.use_interpreter`; calling it again does nothing.
    """
    from triton.runtime import interpreter

    leaky_call = interpreter.InterpretedFunction.__call__
    if getattr(leaky_call, "_gpulab_scoped", False):
        return

    def scoped_call(self, *args, **kwargs):
        scopes, patch_lang = [], interpreter._patch_lang

        def patch_and_remember(fn):
            scope = patch_lang(fn)
            scopes.append(scope)
            return scope

        interpreter._patch_lang = patch_and_remember
        try:
            return leaky_call(self, *args, **kwargs)
        finally:
            interpreter._patch_lang = patch_lang
            for scope in reversed(scopes):
                scope.restore()

    scoped_call._gpulab_scoped = True
    interpreter.InterpretedFunction.__call__ = scoped_call


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


class _Session:
    """Compiled-mode copies of the kernels a call launches, and what they compiled to."""

    def __init__(self):
        self.copies: dict[int, object] = {}   # id(original kernel) -> its compiled-mode JITFunction
        self.keep: list = []                   # the originals, so that their ids stay unique
        self.patched: list = []                # (owner, attribute, original value) to restore

    def jit_copy(self, kernel, own_globals: bool = True):
        """A fresh ``JITFunction`` of ``kernel`` (an interpreted or JIT kernel) whose global helper
        kernels are copies too: it compiles for the stand-in target, leaving ``kernel`` untouched.

        ``own_globals=False`` keeps the function's module globals (Triton's own library, which
        :func:`stand_in` patches in place for the duration of the block)."""
        from triton.runtime.jit import JITFunction

        if id(kernel) in self.copies:
            return self.copies[id(kernel)]
        fn = kernel.fn
        scope = dict(fn.__globals__) if own_globals else fn.__globals__
        new_fn = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        new_fn.__qualname__, new_fn.__module__ = fn.__qualname__, fn.__module__
        new_fn.__kwdefaults__ = fn.__kwdefaults__
        new_fn.__doc__, new_fn.__annotations__ = fn.__doc__, dict(fn.__annotations__)  # constexpr lives there
        options = dict(getattr(kernel, "kwargs", {}))  # an InterpretedFunction keeps jit's keyword arguments
        for name in ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline",
                     "launch_metadata"):
            if hasattr(kernel, name) and name not in options:
                options[name] = getattr(kernel, name)
        if isinstance(kernel, JITFunction):
            options["repr"] = kernel._repr
        copy = JITFunction(new_fn, **options)
        self.copies[id(kernel)] = copy
        self.keep.append(kernel)
        if own_globals:
            for name in _code_names(fn.__code__):  # helper @triton.jit functions the kernel calls
                if _is_kernel(scope.get(name)):
                    scope[name] = self.jit_copy(scope[name])
        return copy

    def patch_triton_language(self):
        """In a process that imported Triton in interpreter mode, ``tl.sum``, ``tl.max``, ``tl.sigmoid``
        ... and the matching tensor methods are interpreted functions too: swap in compiled-mode copies
        (as Triton itself would have made them) until :meth:`restore`."""
        import sys

        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        for name, module in list(sys.modules.items()):
            if name.startswith("triton.language") and module is not None:
                for attr, value in list(vars(module).items()):
                    if isinstance(value, InterpretedFunction):
                        self._swap(module, attr, self.jit_copy(value, own_globals=False))
        for attr, value in list(vars(tl.core.tensor).items()):
            # the interpreter's tensor methods are plain wrappers closing over an interpreted function
            cells = [c.cell_contents for c in getattr(value, "__closure__", None) or ()]
            wrapped = [c for c in cells if isinstance(c, InterpretedFunction) and c.fn.__name__ == attr]
            if wrapped:
                self._swap(tl.core.tensor, attr, self.jit_copy(wrapped[0], own_globals=False))

    def _swap(self, owner, attr, value):
        self.patched.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def restore(self):
        for _, kernel in self.compiled():
            kernel.module = None  # no CUDA module to unload when Triton frees the kernel
        while self.patched:
            owner, attr, value = self.patched.pop()
            setattr(owner, attr, value)

    def compiled(self):
        """Every (JITFunction copy, CompiledKernel) this session compiled, in compile order."""
        for copy in self.copies.values():
            caches = getattr(copy, "device_caches", {})
            if 0 in caches:
                for kernel in caches[0][0].values():
                    yield copy, kernel


def _is_kernel(obj) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(obj, (InterpretedFunction, JITFunction))


_active_session: _Session | None = None
_targets: list[Device] = []  # the GPUs of the enclosing target() and stand_in() blocks, innermost last


def current_target() -> Device | None:
    """The GPU the enclosing :func:`target` or :func:`stand_in` block compiles for, or None outside them."""
    return _targets[-1] if _targets else None


@contextlib.contextmanager
def target(device: Device):
    """Within this block, code that asks which GPU it is on (``gpulab.device.shared_memory_per_block``,
    and through it ``tuning_configs``, ``prune_configs`` and ``pick_tiles``) is told ``device``.

    Set up a lab inside the block (its tiles are then picked for ``device``) and compile it there with
    ``compile_call(..., device=device)``: the whole session sees one GPU. Blocks nest; nothing else
    changes (kernels still run in the interpreter between compiles)."""
    _targets.append(device)
    try:
        yield device
    finally:
        _targets.pop()


@contextlib.contextmanager
def stand_in(device: Device = H100):
    """Within this block, Triton kernels compile for ``device`` and launch nothing.

    Interpreted kernels (a CPU notebook's) and JIT kernels alike are launched through compiled-mode
    copies, so the kernels you run outside the block are not changed. Yields the session; prefer
    :func:`compile_call`, which returns the records.
    """
    global _active_session
    from triton import knobs
    from triton.compiler import compiler as triton_compiler
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if _active_session is not None:
        raise RuntimeError("aot.stand_in blocks do not nest.")
    session = _Session()
    original_jit_run, original_interpreted_run, original_autotune_run = (
        JITFunction.run, InterpretedFunction.run, Autotuner.run)

    def jit_run(self, *args, **kwargs):
        if id(self) in {id(c) for c in session.copies.values()}:
            return original_jit_run(self, *args, **kwargs)
        return session.jit_copy(self).run(*args, **kwargs)

    def interpreted_run(self, *args, **kwargs):
        return session.jit_copy(self).run(*args, **kwargs)

    def autotune_run(self, *args, **kwargs):
        # Tune afresh (every config compiles), never write fake timings to Triton's autotune cache.
        saved = self.cache, self.cache_results, self.__dict__.pop("do_bench", None)
        self.cache, self.cache_results = {}, False
        try:
            return original_autotune_run(self, *args, **kwargs)
        finally:
            self.cache, self.cache_results = saved[0], saved[1]
            self.__dict__.pop("do_bench", None)
            if saved[2] is not None:
                self.__dict__["do_bench"] = saved[2]

    saved_driver, saved_interpret = driver._active, knobs.runtime.interpret
    saved_env = os.environ.get("TRITON_INTERPRET")
    JITFunction.run, InterpretedFunction.run, Autotuner.run = jit_run, interpreted_run, autotune_run
    driver.set_active(_stand_in_driver(device))
    knobs.runtime.interpret = False
    os.environ["TRITON_INTERPRET"] = "0"  # code that asks gpulab.interpreted() picks its GPU settings
    triton_compiler.max_shared_mem.cache_clear()  # Triton caches the limit per device number
    _active_session = session
    _targets.append(device)
    try:
        session.patch_triton_language()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
            yield session
    finally:
        session.restore()
        _targets.pop()
        _active_session = None
        JITFunction.run, InterpretedFunction.run, Autotuner.run = (
            original_jit_run, original_interpreted_run, original_autotune_run)
        driver.set_active(saved_driver)
        knobs.runtime.interpret = saved_interpret
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
        triton_compiler.max_shared_mem.cache_clear()


def _launch_error(kernel) -> str:
    """Triton's own launch-time refusal of ``kernel`` (a CompiledKernel), or ``""``.

    Triton runs its checks (shared memory, threads) when a kernel is first launched; one that was
    compiled but not launched (an autotuner's losing config) is checked here the same way."""
    from triton.runtime.errors import OutOfResources

    if kernel.module is None and kernel._run is None:
        try:
            kernel._init_handles()
        except OutOfResources as exc:
            return str(exc)
    run = kernel._run
    if isinstance(run, functools.partial) and run.args and isinstance(run.args[0], Exception):
        return str(run.args[0])  # _init_handles stored the error it raised
    return ""


def _record(copy, kernel, device: Device) -> KernelRecord:
    meta = kernel.metadata
    names = copy.arg_names
    constexpr = {p.name for p in copy.params if p.is_constexpr}
    config = {}
    for key, value in getattr(kernel.src, "constants", {}).items():
        name = names[key[0]] if isinstance(key, tuple) and len(key) == 1 else key
        if name in constexpr:
            config[name] = getattr(value, "value", value)
    config["num_warps"], config["num_stages"] = meta.num_warps, meta.num_stages
    ptx, ttir = kernel.asm.get("ptx", ""), kernel.asm.get("ttir", "")
    record = KernelRecord(kernel=kernel.name, config=config, shared=meta.shared,
                          threads=meta.num_warps * device.warp_size * getattr(meta, "num_ctas", 1),
                          tensor_cores=tensor_core_instructions(ptx), vector_bits=global_load_bits(ptx),
                          loads=loaded_dtypes(ttir), dot=multiplies_tiles(ttir), device=device, ptx=ptx,
                          ttgir=kernel.asm.get("ttgir", ""), cubin=kernel.asm.get("cubin", b""))
    record.error = _launch_error(kernel)
    if not record.error:
        record.registers, record.spills = kernel.n_regs, kernel.n_spills
        record.ctas_per_sm, record.limiter = occupancy(kernel.n_regs, record.threads, meta.shared, device)
    if isinstance(kernel._run, _NoOpLauncher) and kernel._run.grids:
        record.grid = kernel._run.grids[-1]
    return record


def compile_call(fn, *args, device: Device = H100, **kwargs) -> list[KernelRecord]:
    """Call ``fn(*args, **kwargs)`` with every Triton kernel it launches compiled for ``device``
    (an H100 by default) and launched nowhere; return one record per compiled kernel and config.

    ``fn`` is usually a lab's wrapper (``softmax``, ``matmul_autotuned`` ...). Pass tensors on the
    ``meta`` device (``torch.empty(shape, dtype=..., device="meta")``); other tensors are replaced by
    meta tensors of the same shape, strides and dtype. The outputs are meta tensors too: nothing is
    computed. A launch Triton refuses (too much shared memory) does not raise: its record says why.
    """
    from triton.runtime.errors import OutOfResources

    args, kwargs = _to_meta(args), _to_meta(kwargs)
    with stand_in(device) as session:
        try:
            fn(*args, **kwargs)
        except OutOfResources:
            pass  # recorded below, with the kernel it concerns
        return [_record(copy, kernel, device) for copy, kernel in session.compiled()]


def compile_kernel(kernel, grid, *args, device: Device = H100, **kwargs) -> list[KernelRecord]:
    """Compile ``kernel[grid](*args, **kwargs)`` for ``device``; see :func:`compile_call`.

    ``kernel`` is a ``@triton.jit`` function, or one wrapped by ``triton.autotune`` (every config
    is compiled). Constexprs, ``num_warps`` and ``num_stages`` go in ``kwargs`` as for a launch."""
    return compile_call(lambda *a, **k: kernel[grid](*a, **k), *args, device=device, **kwargs)


def _to_meta(value):
    import torch

    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, tuple):
        return tuple(_to_meta(v) for v in value)
    if isinstance(value, list):
        return [_to_meta(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


# --- showing it -----------------------------------------------------------------------------------

COLUMNS = ("kernel", "config", "regs", "spills", "smem (B)", "threads", "CTAs/SM", "limited by",
           "tensor cores", "widest load", "loads")


def _row(r: KernelRecord) -> list[str]:
    blank = "-"
    return [r.kernel, r.config_text(),
            blank if r.registers is None else str(r.registers),
            blank if r.spills is None else str(r.spills),
            f"{r.shared:,}", str(r.threads),
            blank if r.ctas_per_sm is None else str(r.ctas_per_sm),
            r.limiter or ("does not launch" if r.error else blank),
            r.matrix_unit, f"{r.vector_bits}-bit" if r.vector_bits else blank,
            ",".join(r.loads) or blank]


def table(records: list[KernelRecord], markdown: bool = True) -> str:
    """The records as a Markdown table (or aligned text with ``markdown=False``); errors listed below."""
    rows = [list(COLUMNS)] + [_row(r) for r in records]
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows[1:]]
    else:
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"{r.kernel} [{r.config_text()}]: {r.error}" for r in records if r.error]
    return "\n".join(lines)


def show(records: list[KernelRecord]) -> None:
    """Print the records as a table with a few lines on how to read it (for notebooks)."""
    if not records:
        print("No Triton kernel was compiled: did the call launch one?")
        return
    device = records[0].device
    print(f"Compiled for {device.name} by {toolchain(device)}. Per SM: {device.regs_per_sm:,} registers, "
          f"{device.smem_per_sm // 1024} KiB shared memory ({device.smem_per_block:,} B per CTA at most), "
          f"{device.threads_per_sm} threads, {device.blocks_per_sm} CTAs.")
    print(table(records, markdown=False))
    print("regs: registers per thread; spills: registers spilled to (slow) local memory; CTAs/SM: how many "
          "copies of the kernel share one SM, and the resource that caps it; tensor cores: wgmma (Hopper) "
          "or mma (Ampere to Ada) instructions in the PTX, 'FMA fallback' when a tl.dot runs on the CUDA cores "
          "(a T4); widest load: bits per thread per global load "
          "instruction (128 = fully vectorised). Nothing here is a timing.")


def report(fn, *args, device: Device = H100, **kwargs) -> list[KernelRecord] | None:
    """:func:`compile_call` then :func:`show`: the cell a lab runs after its kernels pass.

    Prints a note instead when ``fn`` (or an exercise it calls) is not implemented yet, and inside
    the grader's sandbox (``GPULAB_GRADING=1``), where the table would only cost time."""
    if os.environ.get("GPULAB_GRADING") == "1":
        print("compile report: skipped while grading")
        return None
    try:
        records = compile_call(fn, *args, device=device, **kwargs)
    except NotImplementedError:
        print("Not implemented yet: finish the exercises above, then run this cell again.")
        return None
    show(records)
    return records
