"""Checks of lab 02, Triton basics: vector add, fused bias+GELU, strided 2-D copy, fusion bytes.

Every kernel check observes the learner's wrapper with ``grader.kit.kernels``: a *poisoned* output
buffer followed by a guard region and padded inputs (so unwritten elements and out-of-bounds
accesses both show, at any block size), the learner's own Triton kernels launched and really
computing the output (so a PyTorch one-liner earns nothing), and the inputs not modified.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.exercise import Benchmark, Case, Exercise
from grader.kit.cases import randint, randn
from grader.kit.helpers import offering
from grader.kit.kernels import judge_out
from grader.kit.variants import diagnose, tensor_match
from grader.runs import run_side

LAB = "02_triton_basics"
RUN = run_side(LAB)  # the learner side: grader/runs/02_triton_basics.py
TITLE = "Triton basics: programs, masks, fusion"


# --- vector add ---------------------------------------------------------------------------------

def _vector_add_cases(gen, public):
    sizes = [(1, "float32"), (1000, "float32"), (4096, "float32"), (98_307, "float16")]
    if not public:
        sizes = [(randint(gen, 1, (1 << 17) - 1), d) for d in ("float32", "float16")] * 2
    cases = [Case(f"n={n} {dtype}", dict(x=randn(gen, n).to(getattr(torch, dtype)),
                                         y=randn(gen, n).to(getattr(torch, dtype)), layout="contiguous"))
             for n, dtype in sizes]
    n = 777 if public else randint(gen, 100, 4999)
    cases.append(Case(f"n={n} float32, non-contiguous x and y (stride 2): handle or reject",
                      dict(x=randn(gen, 2 * n), y=randn(gen, 2 * n), layout="strided")))
    return cases


def _vector_add_judge(case, obs):
    x = RUN._layout(case.inputs["x"], case.inputs["layout"])
    y = RUN._layout(case.inputs["y"], case.inputs["layout"])
    return judge_out(case, obs, "vector_add", x.double() + y.double(), x.dtype,
                     may_reject=case.inputs["layout"] != "contiguous")


VECTOR_ADD = Exercise("vector_add", 2, ("vector_add",), _vector_add_cases, RUN._vector_add_run, _vector_add_judge,
                      title="Vector add: programs and masks",
                      hint="Launch triton.cdiv(n, BLOCK) programs and mask every load and store with offs < n.")


# --- fused bias + GELU ----------------------------------------------------------------------------

def gelu_reference(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU(x + bias) in float64, the form given by ``approximate`` ("none" = erf, or "tanh")."""
    return F.gelu(x.double() + bias.double(), approximate=approximate)


def _bias_gelu_cases(gen, public):
    shapes = [(1, 1, "none", "float32"), (3, 77, "tanh", "float32"), (64, 1000, "none", "float32"),
              (17, 300, "tanh", "float16"), (33, 130, "none", "float16")]
    if not public:
        shapes = [(randint(gen, 1, 79), randint(gen, 1, 1499), approx, dtype)
                  for approx in ("none", "tanh") for dtype in ("float32", "float16")]
    cases = []
    for m, n, approx, dtype in shapes:
        x, bias = randn(gen, m, n, scale=2.5).to(getattr(torch, dtype)), randn(gen, n).to(getattr(torch, dtype))
        cases.append(Case(f"({m}, {n}) {dtype} approximate={approx!r}",
                          dict(x=x, bias=bias, approximate=approx, layout="contiguous")))
    cases.append(Case("(40, 24) float32 approximate='tanh', x transposed (non-contiguous): handle or reject",
                      dict(x=randn(gen, 24, 40, scale=2.5), bias=randn(gen, 24), approximate="tanh",
                           layout="transposed")))
    return cases


def _bias_gelu_judge(case, obs):
    x, bias, approx = RUN._layout(case.inputs["x"],
                                  case.inputs["layout"]), case.inputs["bias"], case.inputs["approximate"]
    message = judge_out(case, obs, "bias_gelu", gelu_reference(x, bias, approx), x.dtype,
                        may_reject=case.inputs["layout"] != "contiguous")
    if x.dtype != torch.float32:  # the two forms differ by 5e-4 at most: within float16's tolerance
        return message
    other = "tanh" if approx == "none" else "none"
    form = "erf" if approx == "none" else "tanh"
    return diagnose(message, obs.get("out"), [(f"approximate={other!r}", lambda: gelu_reference(x, bias, other))],
                    tensor_match(x.dtype), f"\n  Your output matches {{}} instead: use the {form} form here.")


BIAS_GELU = Exercise("bias_gelu", 3, ("bias_gelu",), _bias_gelu_cases, RUN._bias_gelu_run, _bias_gelu_judge,
                     title="Fused bias + GELU (erf and tanh forms)",
                     hint="Load x in its dtype, compute in float32, store in x's dtype. "
                          "erf form: 0.5*z*(1+erf(z/sqrt(2))); "
                          "tanh form: 0.5*z*(1+tanh(sqrt(2/pi)*(z+0.044715*z^3))), "
                          "with tanh(u) = 2*sigmoid(2u)-1.")


# --- strided 2-D copy -----------------------------------------------------------------------------

def _copy_2d_cases(gen, public):
    specs = [((33, 65), "contiguous", "float32"), ((65, 33), "transposed", "float32"),
             ((40, 61), "sliced", "float16"), ((1, 1), "contiguous", "float32")]
    if not public:
        specs = [((randint(gen, 1, 119), randint(gen, 1, 119)), layout, dtype)
                 for layout in ("contiguous", "transposed", "sliced") for dtype in ("float32", "float16")]
    cases = []
    for shape, layout, dtype in specs:
        if layout == "sliced" and shape[1] < 2:
            shape = (shape[0], 2)
        base = randn(gen, *shape).to(getattr(torch, dtype))
        view = RUN._layout(base, layout)
        cases.append(Case(f"{layout} source of shape {tuple(view.shape)} strides {view.stride()} {dtype}",
                          dict(src=base, layout=layout)))
    return cases


def _copy_2d_judge(case, obs):
    src = RUN._layout(case.inputs["src"], case.inputs["layout"])
    message = judge_out(case, obs, "copy_2d", src.contiguous(), src.dtype)
    if message and case.inputs["layout"] != "contiguous" and "differ" in message:
        message += "\n  Index the source with its strides: src_ptr + row * stride_row + col * stride_col."
    return message


COPY_2D = Exercise("copy_2d", 2, ("copy_2d",), _copy_2d_cases, RUN._copy_2d_run, _copy_2d_judge,
                   title="Strided 2-D copy",
                   hint="Use 2-D blocks of offsets (rows[:, None], cols[None, :]), the source's strides for loads, "
                        "the output's row-major layout for stores, and a 2-D mask.")


# --- bytes moved by fused vs unfused bias+GELU ----------------------------------------------------

def ref_bias_gelu_bytes(M: int, N: int, dtype_bytes: int, fused: bool) -> int:
    if fused:  # read x and bias once, write the output once
        return (2 * M * N + N) * dtype_bytes
    # eager PyTorch: t = x + bias (read x, bias; write t), then gelu(t) (read t; write out)
    return (4 * M * N + N) * dtype_bytes


def _bytes_cases(gen, public):
    specs = [(4096, 4096, 2), (1, 1, 4), (3, 1000, 4)]
    if not public:
        specs = [(randint(gen, 1, 9999), randint(gen, 1, 9999), [1, 2, 4][i % 3]) for i in range(6)]
    return [Case(f"M={m} N={n} dtype_bytes={b} fused={f}", dict(M=m, N=n, dtype_bytes=b, fused=f))
            for m, n, b in specs for f in (True, False)]


def _bytes_judge(case, obs):
    want = ref_bias_gelu_bytes(**case.inputs)
    got = obs["bytes"]
    if not isinstance(got, (int, float)) or got != want:
        return f"bias_gelu_bytes = {got!r}, expected {want} for {case.inputs}."
    return None


FUSION_BYTES = Exercise("fusion_bytes", 1, ("bias_gelu_bytes",), _bytes_cases, RUN._bytes_run, _bytes_judge,
                        title="Bytes moved: fused vs unfused",
                        hint="Unfused, the intermediate x + bias is written to memory and read back.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.gbps", "gpulab.bench.pct_of_peak", "gpulab.peaks.measured_peaks",
           "gpulab.plots.grouped_bars")
EXERCISES = [offering(ex, OFFERED) for ex in (VECTOR_ADD, BIAS_GELU, COPY_2D, FUSION_BYTES)]


# --- benchmarks (python -m grader bench) -----------------------------------------------------------

def _bench_inputs_add(device, tiny):
    n = 1 << 12 if tiny else 1 << 28  # 3 x 1 GiB of fp32 traffic on a GPU
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    return {"x": x, "y": y, "out": torch.empty_like(x), "bytes": 3 * n * 4}


def _bench_inputs_gelu(approximate):
    def make(device, tiny):
        m, n = (16, 256) if tiny else (16384, 16384)
        dtype = torch.float32 if device == "cpu" else torch.float16
        x = torch.randn(m, n, device=device, dtype=dtype)
        return {"x": x, "bias": torch.randn(n, device=device, dtype=dtype), "out": torch.empty_like(x),
                "approximate": approximate, "bytes": ref_bias_gelu_bytes(m, n, x.element_size(), fused=True)}
    return make


def _bench_gelu_baseline(d):
    return F.gelu(d["x"] + d["bias"], approximate=d["approximate"])


BENCHMARKS = [
    Benchmark("vector_add fp32 vs torch.add", "vector_add", _bench_inputs_add,
              lambda fn, d: fn(d["x"], d["y"], out=d["out"]), lambda d: torch.add(d["x"], d["y"], out=d["out"])),
    Benchmark("bias_gelu erf vs eager gelu(x+b)", "bias_gelu", _bench_inputs_gelu("none"),
              lambda fn, d: fn(d["x"], d["bias"], approximate="none", out=d["out"]), _bench_gelu_baseline),
    Benchmark("bias_gelu tanh vs eager gelu(x+b)", "bias_gelu", _bench_inputs_gelu("tanh"),
              lambda fn, d: fn(d["x"], d["bias"], approximate="tanh", out=d["out"]), _bench_gelu_baseline),
]
