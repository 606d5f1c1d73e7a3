"""Datasheet figures, the one place lessons take them from: an H100 SXM's (lessons 01, 04, 05, 08, 12, 13)
and, in :data:`PARTS`, the other GPUs learners reach (T4, A10G, L4, A100, H200; lesson 00).

Datasheet peaks are upper bounds no kernel reaches; the course judges kernels against peaks it
measures (:mod:`gpulab.peaks`). These figures only place a lesson's numbers on a real GPU's scale
(its ridge point, a decode step's weight-read floor), so they are written once, here, with their source.
Source: NVIDIA H100 Tensor Core GPU datasheet, SXM5 column; dense (no sparsity) tensor-core rates.
Each :class:`Part` names its own source.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.peaks import Peaks

H100_NAME = "H100 SXM (datasheet, not measured)"
H100_FP16_FLOPS = 989e12      # FLOP/s, dense fp16/bf16 tensor cores
H100_TF32_FLOPS = 495e12      # FLOP/s, dense tf32 tensor cores
H100_FP8_FLOPS = 1979e12      # FLOP/s, dense fp8 tensor cores
H100_FP32_FLOPS = 67e12       # FLOP/s, fp32 without tensor cores
H100_HBM_BYTES_PER_S = 3.35e12  # HBM3 bandwidth
H100_HBM_BYTES = 80e9         # memory capacity
H100_L2_BYTES = 50 * 2**20    # L2 cache
H100_SMS = 132                # streaming multiprocessors
H100_NVLINK_BYTES_PER_S = 450e9  # NVLink 4, per direction
H100_RIDGE = H100_FP16_FLOPS / H100_HBM_BYTES_PER_S  # FLOP/B where fp16 matmul turns compute-bound (~295)


def h100_peaks() -> Peaks:
    """The datasheet figures as :class:`gpulab.peaks.Peaks`, to draw an H100's roofline (fp16)."""
    return Peaks(device="cuda", name=H100_NAME, copy_gbps=H100_HBM_BYTES_PER_S / 1e9,
                 matmul_tflops=H100_FP16_FLOPS / 1e12, matmul_dtype="float16", copy_bytes=0, matmul_size=0)


# --- the parts learners reach (lesson 00's "your GPU vs an H100") ---------------------------------------

@dataclass(frozen=True)
class Part:
    """Datasheet figures of one GPU model. SMs and shared memory come from :data:`gpulab.aot.TARGETS`
    (``target``), the compile limits the course already keeps; the figures here are the rest."""

    name: str
    target: str                  # a key of gpulab.aot.TARGETS: its compile limits (SMs, shared memory)
    hbm_bytes_per_s: float       # memory bandwidth
    fp16_flops: float | None     # dense fp16 tensor-core FLOP/s (fp32 accumulate); None: not published
    memory_bytes: float
    tensor_cores: str            # the tensor-core generation
    source: str
    match: tuple = ()            # words of torch.cuda.get_device_name() that name this part


PARTS = (
    Part("T4", "sm_75", 320e9, 65e12, 16e9, "2nd gen (Turing)",
         "NVIDIA T4 Tensor Core GPU datasheet (mixed precision FP16/FP32)", ("T4",)),
    Part("A10G", "sm_86", 600e9, None, 24e9, "3rd gen (Ampere)",
         "AWS EC2 G5 instance specifications (memory, bandwidth); NVIDIA publishes no A10G datasheet",
         ("A10G",)),
    Part("L4", "sm_89", 300e9, 121e12, 24e9, "4th gen (Ada)", "NVIDIA L4 Tensor Core GPU datasheet (dense)",
         ("L4",)),
    Part("A100 SXM 80GB", "sm_80", 2039e9, 312e12, 80e9, "3rd gen (Ampere)",
         "NVIDIA A100 Tensor Core GPU datasheet, SXM 80GB column (dense)", ("A100",)),
    Part("H100 SXM", "sm_90", H100_HBM_BYTES_PER_S, H100_FP16_FLOPS, H100_HBM_BYTES, "4th gen (Hopper)",
         "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column (dense)", ("H100",)),
    Part("H200 SXM", "sm_90", 4.8e12, 989e12, 141e9, "4th gen (Hopper)",
         "NVIDIA H200 Tensor Core GPU datasheet, SXM column (dense)", ("H200",)),
)


def part_named(device_name: str) -> Part | None:
    """The datasheet entry of a GPU from its ``torch.cuda.get_device_name()`` (``"Tesla T4"``), if known."""
    words = device_name.replace("-", " ").split()
    return next((p for p in PARTS if any(m in words for m in p.match)), None)
