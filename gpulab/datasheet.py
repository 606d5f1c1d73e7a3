"""An H100 SXM's datasheet figures, the one place lessons take them from (lessons 01, 04, 05, 08, 12, 13).

Datasheet peaks are upper bounds no kernel reaches; the course judges kernels against peaks it
measures (:mod:`gpulab.peaks`). These figures only place a lesson's numbers on a real GPU's scale
(its ridge point, a decode step's weight-read floor), so they are written once, here, with their source.
Source: NVIDIA H100 Tensor Core GPU datasheet, SXM5 column; dense (no sparsity) tensor-core rates.
"""
from __future__ import annotations

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
