"""What this GPU can do, and what a cell does instead when it cannot (lesson 00; used in labs 04 to 09).

The course was written on an H100 (compute capability 9.0). Learners also run it on Colab's T4 (7.5),
Kaggle's two T4s, L4 (8.9), A10G (8.6), A100 (8.0) and RTX cards. Each hardware feature a lesson relies
on starts at one generation:

    bf16              >= sm_80   bfloat16 tensor cores (Ampere)
    fp8               >= sm_89   fp8 tensor cores (Ada, Hopper)
    sparse_2_4        >= sm_80   2:4 sparse tensor cores (torch.sparse.to_sparse_semi_structured)
    tensor_core_dot   >= sm_80   Triton's tl.dot on tensor cores (on sm_75 it runs as FMAs on the CUDA cores)
    wgmma             == sm_90   Hopper's warpgroup MMA (Blackwell replaced it)
    tma               >= sm_90   the Tensor Memory Accelerator (bulk async copies)

A cell that needs one asks :func:`available` first; on a GPU without it, it prints why and what to do
instead (fp16, a formula, the compile report of lesson 04) and the cell skips that part, never a traceback:

    from gpulab.capability import available
    if available("fp8"):
        ...  # the fp8 matmul

On the CPU nothing changes: the cells' own CPU paths run as before, so :func:`available` answers True
there (it only ever speaks about a CUDA GPU). The grader uses the same table: an exercise that declares
``requires="bf16"`` is skipped, not failed, on a GPU without it (``grader.exercise.capability_skip``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    """One hardware feature: the compute capabilities that have it, and what a lesson does without it."""

    name: str
    what: str                      # the feature in words
    first: tuple[int, int]         # the first compute capability that has it
    last_major: int | None = None  # the last major version that has it (wgmma: 9 only), None: every later one
    instead: str = ""              # the alternative a cell offers on an older GPU

    @property
    def since(self) -> str:
        """``"sm_89+"`` (or ``"sm_90 only"``)."""
        sm = f"sm_{self.first[0]}{self.first[1]}"
        return f"{sm} only" if self.last_major == self.first[0] else f"{sm}+"

    def supported_by(self, capability: tuple[int, int]) -> bool:
        """True when a GPU of compute ``capability`` ``(major, minor)`` has the feature."""
        if tuple(capability) < self.first:
            return False
        return self.last_major is None or capability[0] <= self.last_major


FEATURES = {f.name: f for f in (
    Feature("bf16", "bfloat16 tensor cores", (8, 0),
            instead="use torch.float16 (with a GradScaler when training: lab 07): this GPU's tensor cores run "
                    "fp16 at their full rate; bf16's numerics (range, eps) run anywhere with DEVICE = 'cpu'"),
    Feature("fp8", "fp8 tensor cores (float8_e4m3fn / float8_e5m2 matmuls)", (8, 9),
            instead="the fp8 casts and their scaling run on CPU tensors on any machine (lab 08); the speed follows "
                    "from a formula: fp8 doubles the fp16 tensor-core rate (H100 datasheet: 1979 vs 989 TFLOP/s)"),
    Feature("sparse_2_4", "2:4 sparse tensor cores (to_sparse_semi_structured)", (8, 0),
            instead="the 2:4 masks and their accuracy run anywhere (lab 09); the speed-up is at most 2x the dense "
                    "math rate (datasheet), less end to end"),
    Feature("tensor_core_dot", "Triton's tl.dot on tensor cores (mma)", (8, 0),
            instead="tl.dot still runs, as FMAs on the CUDA cores: results are right, matmul timings are far below "
                    "tensor-core rates; the compile report of lesson 04 (gpulab.aot, targets sm_80 and sm_90) shows "
                    "the mma/wgmma instructions an Ampere or Hopper build gets"),
    Feature("wgmma", "Hopper's warpgroup MMA (wgmma)", (9, 0), last_major=9,
            instead="the compile report of lesson 04 (gpulab.aot compiles for sm_90 without a GPU) shows the wgmma "
                    "instructions; on this GPU Triton emits mma.sync (sm_80+) or FMAs (sm_75)"),
    Feature("tma", "the Tensor Memory Accelerator (TMA bulk copies)", (9, 0),
            instead="the compile report of lesson 04 (gpulab.aot, target sm_90) shows what an H100 build does; on "
                    "this GPU loads go through cp.async (sm_80+) or plain loads"),
)}


def _feature(name: str) -> Feature:
    try:
        return FEATURES[name]
    except KeyError:
        raise ValueError(f"unknown feature {name!r}; known: {', '.join(FEATURES)}.") from None


def sm(capability: tuple[int, int]) -> str:
    """``(7, 5)`` -> ``"sm_75"``."""
    return f"sm_{capability[0]}{capability[1]}"


def device_capability(device: str | None = None) -> tuple[int, int] | None:
    """The compute capability ``(major, minor)`` of GPU 0 when the run uses CUDA, else ``None`` (CPU)."""
    import torch

    from gpulab.device import current_device

    device = device or current_device()
    if device != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))


def supports(feature: str, capability: tuple[int, int]) -> bool:
    """True when a GPU of compute ``capability`` has ``feature`` (a key of :data:`FEATURES`)."""
    return _feature(feature).supported_by(capability)


def missing(feature: str, device: str | None = None) -> str | None:
    """Why this run's GPU lacks ``feature`` (``"needs fp8 (sm_89+), this GPU is sm_75"``); ``None`` when it has
    it or the run is on the CPU (the CPU paths of the cells decide for themselves)."""
    f = _feature(feature)
    capability = device_capability(device)
    if capability is None or f.supported_by(capability):
        return None
    return f"needs {f.name} ({f.since}), this GPU is {sm(capability)}"


def available(feature: str, device: str | None = None, quiet: bool = False) -> bool:
    """The one call a cell makes before using ``feature``: True when it can run here.

    False on a CUDA GPU without it, after printing the reason and the alternative (unless ``quiet``),
    so the cell skips that part cleanly. True on the CPU: the course's CPU paths stay as they are.
    """
    why = missing(feature, device)
    if why is None:
        return True
    if not quiet:
        f = FEATURES[feature]
        print(f"Skipped on this GPU: {f.what} {why}.\nInstead: {f.instead}.")
    return False


def half_dtype(device: str | None = None):
    """The 16-bit type this GPU trains in (lessons 07 and 10): ``torch.bfloat16`` where it has bf16 (sm_80+),
    else ``torch.float16`` (a T4), with no message: the cell's numbers change, not its lesson."""
    import torch

    return torch.bfloat16 if missing("bf16", device) is None else torch.float16


# --- what each lab can and cannot show on a GPU --------------------------------------------------------

# (lab, feature, what the lab shows with it). A lab absent here runs in full on every supported GPU.
LAB_FEATURES = (
    ("04 matmul", "tensor_core_dot", "tensor-core matmul timings"),
    ("04/05 matmul, attention", "wgmma", "wgmma and TMA in your own kernels (the compile report shows an H100 build)"),
    ("07 mixed precision", "bf16", "bf16 autocast training and bf16 matmul timings"),
    ("08 quantization", "fp8", "fp8 tensor-core matmuls (the fp8 casts run anywhere)"),
    ("09 pruning", "sparse_2_4", "2:4 sparse matmul timings"),
)


def lab_support(capability: tuple[int, int] | None, gpus: int = 1) -> list[tuple[str, bool, str]]:
    """``[(lab, runs, note)]`` for a GPU of compute ``capability`` (``None``: no GPU), ``gpus`` of them.

    ``note`` says what the lab shows, or why not and what it does instead.
    """
    rows = []
    for lab, feature, shows in LAB_FEATURES:
        f = FEATURES[feature]
        if capability is None:
            rows.append((lab, False, f"{shows}: {f.since}; no GPU here, the CPU path runs"))
        elif f.supported_by(capability):
            rows.append((lab, True, shows))
        else:
            rows.append((lab, False, f"needs {f.since}: {f.instead}"))
    if gpus >= 2:
        rows.append(("11-13 distributed", True, f"{gpus} GPUs: the demonstrations run up to {min(gpus, 4)} ranks "
                                                "over NCCL, one per GPU (grading stays on gloo CPU ranks)"))
    else:
        rows.append(("11-13 distributed", False, "NCCL needs a GPU per rank: the ranks run over gloo on the CPU "
                                                 "(Kaggle's two T4s run two ranks over NCCL)"))
    return rows


# --- your GPU vs an H100 (lesson 00) -----------------------------------------------------------------------

def _gib(n: float) -> str:
    return f"{n / 2**30:.0f} GiB"


def _part_row(part) -> list[str]:
    """A datasheet part's cells; SMs and shared memory from its compile target (gpulab.aot.TARGETS)."""
    from gpulab.aot import TARGETS

    limits = TARGETS[part.target]
    return [f"{part.name} (datasheet)", part.target, str(limits.sms), f"{part.memory_bytes / 1e9:.0f} GB",
            f"{part.hbm_bytes_per_s / 1e9:,.0f} GB/s",
            f"{part.fp16_flops / 1e12:,.0f} TFLOP/s" if part.fp16_flops else "not published",
            f"{limits.smem_per_block // 1024} KiB", part.tensor_cores]


def _device_row(props) -> list[str]:
    """This GPU's cells: what ``torch.cuda.get_device_properties`` reports, the rest from its datasheet."""
    from gpulab.datasheet import part_named

    part = part_named(props.name)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    return [f"**{props.name} (this GPU)**", sm((props.major, props.minor)), str(props.multi_processor_count),
            _gib(props.total_memory),
            f"{part.hbm_bytes_per_s / 1e9:,.0f} GB/s (datasheet)" if part else "unknown part",
            f"{part.fp16_flops / 1e12:,.0f} TFLOP/s (datasheet)" if part and part.fp16_flops else "not known",
            f"{smem // 1024} KiB" if smem else "not reported", part.tensor_cores if part else "see its datasheet"]


def gpu_table(device: str | None = None) -> str:
    """Markdown: this GPU next to the course's known parts (H100 last but one), then what each lab can and cannot
    show on it (lesson 00). Without a GPU, the known parts alone, saying so. Nothing here is measured."""
    import torch

    from gpulab.datasheet import PARTS

    capability = device_capability(device)
    header = ["GPU", "compute", "SMs", "memory", "bandwidth", "fp16 tensor, dense", "shared memory / block",
              "tensor cores"]
    rows = [_part_row(p) for p in PARTS]
    if capability is not None:
        rows.insert(0, _device_row(torch.cuda.get_device_properties(0)))
        gpus = torch.cuda.device_count()
        intro = f"**Your GPU vs an H100.** {gpus} GPU{'s' if gpus != 1 else ''} visible; datasheet peaks, not measured."
    else:
        gpus = 0
        intro = ("**No GPU here** (this run is on the CPU): the parts the course knows, for scale. Datasheet peaks, "
                 "not measured.")
    lines = [intro, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "| lab | on this machine |", "|---|---|"]
    lines += [f"| {lab} | {'yes: ' if runs else 'no: '}{note} |" for lab, runs, note in lab_support(capability, gpus)]
    return "\n".join(lines)


def show_gpu_table(device: str | None = None) -> None:
    """Display :func:`gpu_table` (rendered in Jupyter, plain Markdown text elsewhere)."""
    text = gpu_table(device)
    try:
        from IPython.display import Markdown, display
    except ImportError:
        print(text)
        return
    display(Markdown(text))
