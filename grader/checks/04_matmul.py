"""Checks of lab 04, matmul: tile intensity, grouped program order, a tiled Triton matmul, autotune
configurations, and a fused bias + activation epilogue.

Every kernel check (observed by ``grader.kit.kernels``) passes a *poisoned* output buffer followed by a
guard region, records which Triton kernels launched (the learner's own, really computing the
output) and which PyTorch operations ran outside them (so a `torch.matmul` or a
PyTorch epilogue is caught), checks the inputs were not modified, and uses sizes that are not
multiples of the tile, fp16 inputs, transposed (strided) views and row-padded views (rows further
apart than the row length), and non-square tiles (BLOCK_M != BLOCK_N, in both orientations, with
grids whose size changes if the two are swapped). In Triton's interpreter it also records the order
in which programs store their tiles, to see that the kernel uses `grouped_pid`.

Hidden cases are random sizes inside fixed rules: every seed's hidden set holds every rule above
(tests/test_checks_04.py checks it).
"""
from __future__ import annotations

import math
import numbers
from functools import partial

import torch
import torch.nn.functional as F

from gpulab.compare import compare
from grader.exercise import Benchmark, Case, Exercise
from grader.kit import kernels
from grader.kit.cases import choice, randint
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.variants import diagnose, tensor_match
from grader.runs import run_side

LAB = "04_matmul"
RUN = run_side(LAB)  # the learner side: grader/runs/04_matmul.py
TITLE = "Matmul: tiling and the matrix units"

# Shared memory one CTA may use on an H100 (227 KiB; its SM has 228 KiB): a config whose pipeline buffers
# do not fit cannot be compiled.
SMEM_BYTES = 227 * 1024
# Non-square tiles (BLOCK_M, BLOCK_N, BLOCK_K) of the kernel checks: a BLOCK_M / BLOCK_N mix-up shows
TILES = ((32, 64, 32), (64, 32, 32))


def _pow2(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


# --- 1. arithmetic intensity of a tile ------------------------------------------------------------

def ref_tile_intensity(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, K: int, dtype_bytes: int):
    """(flops, bytes_loaded, intensity) of one program's loop over K (see the exercise's docstring)."""
    steps = -(-K // BLOCK_K)  # cdiv: the last, partial step still loads (and multiplies) whole tiles
    flops = 2 * BLOCK_M * BLOCK_N * BLOCK_K * steps
    nbytes = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * dtype_bytes * steps
    return flops, nbytes, flops / nbytes


def _intensity_cases(gen, public):
    specs = [(128, 128, 64, 4096, 2), (64, 256, 32, 1000, 2), (16, 16, 16, 16, 4), (128, 256, 64, 8192, 1),
             (32, 32, 32, 200, 4)]
    if not public:  # BLOCK_M != BLOCK_N; K a multiple of BLOCK_K, not one, or below it; every dtype size
        specs = []
        for i in range(8):
            bm, bn, bk = 1 << randint(gen, 4, 8), 1 << randint(gen, 4, 7), 1 << randint(gen, 4, 7)
            bn = bn * 2 if bn >= bm else bn
            if i % 2:
                bm, bn = bn, bm
            K = [bk * randint(gen, 2, 100), bk * randint(gen, 1, 100) + randint(gen, 1, bk - 1),
                 randint(gen, 1, bk - 1)][i % 3]
            specs.append((bm, bn, bk, K, [1, 2, 4][i % 3 if i < 6 else i % 2]))
    return [Case(f"BLOCK_M={m} BLOCK_N={n} BLOCK_K={k} K={K} dtype_bytes={b}",
                 dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, K=K, dtype_bytes=b)) for m, n, k, K, b in specs]


def _intensity_judge(case, obs):
    x = case.inputs
    got = obs["got"]
    if not isinstance(got, list) or len(got) != 3:
        return f"tile_intensity must return a tuple (flops, bytes_loaded, intensity), got {got!r}."
    flops, nbytes, intensity = ref_tile_intensity(**x)
    for name, value, want in (("flops", got[0], flops), ("bytes_loaded", got[1], nbytes)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            return (f"{name} must be an exact integer (int), got {value!r}: use integer arithmetic "
                    f"(// and triton.cdiv), not /.")
        if value != want:
            msg = f"{name} = {value}, expected {want} for {x}."
            steps = -(-x["K"] // x["BLOCK_K"])
            one_step = (x["BLOCK_M"] * x["BLOCK_K"] + x["BLOCK_K"] * x["BLOCK_N"]) * x["dtype_bytes"]
            if name == "bytes_loaded" and value == one_step and steps > 1:
                msg += (f"\n  That is one K step's loads. The loop runs cdiv(K, BLOCK_K) = {steps} steps and "
                        "loads a fresh A tile and B tile at every step: they are re-loaded, not kept.")
            elif x["K"] % x["BLOCK_K"] and value == want // steps * (x["K"] // x["BLOCK_K"]):
                msg += "\n  The last, partial K step still runs: count cdiv(K, BLOCK_K) steps, not K // BLOCK_K."
            return msg
    if not close(got[2], intensity):
        return f"intensity = {got[2]!r}, expected flops / bytes_loaded = {intensity:.6g} FLOP/B for {x}."
    return None


TILE_INTENSITY = Exercise("tile_intensity", 1, ("tile_intensity",), _intensity_cases, RUN._intensity_run,
                          _intensity_judge, title="Arithmetic intensity of a tile",
                          hint="Per K step a program loads a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile "
                               "of B and does 2 x BLOCK_M x BLOCK_N x BLOCK_K FLOPs; "
                               "the loop runs cdiv(K, BLOCK_K) steps.")


# --- 2. grouped (swizzled) program order -----------------------------------------------------------

def ref_grouped_pid(pid: int, num_pid_m: int, num_pid_n: int, GROUP_M: int) -> tuple[int, int]:
    """The tile (pid_m, pid_n) of program ``pid`` in grouped order (Triton's matmul tutorial)."""
    width = GROUP_M * num_pid_n                      # programs in one group of GROUP_M tile rows
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)       # the last group may have fewer rows
    return first_m + (pid % width) % size_m, (pid % width) // size_m


def _short_last_group(gen) -> tuple:
    """(num_pid_m, num_pid_n, GROUP_M): k whole groups, then a last group of r >= 2 rows, r not dividing
    the k * GROUP_M * num_pid_n programs before it, so that there ``(pid % width) % r`` and ``pid % r`` differ."""
    g = randint(gen, 3, 6)
    r = choice(gen, [r for r in range(2, g) if g % r])
    k, n = randint(gen, 1, 4), randint(gen, 2, 24)
    while (k * g * n) % r == 0:
        k, n = randint(gen, 1, 4), randint(gen, 2, 24)
    return k * g + r, n, g


def _order_cases(gen, public):
    specs = [(5, 4, 2), (8, 8, 4), (7, 3, 3), (6, 6, 1), (3, 5, 8), (1, 9, 8), (9, 1, 4), (10, 7, 4), (5, 3, 3)]
    if not public:  # a short last group, whole groups, GROUP_M above num_pid_m, one column, GROUP_M=1; random
        g2, m3 = randint(gen, 2, 6), randint(gen, 1, 6)
        specs = [_short_last_group(gen),
                 (g2 * randint(gen, 1, 4), randint(gen, 2, 24), g2),
                 (m3, randint(gen, 2, 24), m3 + randint(gen, 1, 4)),
                 (randint(gen, 2, 24), 1, randint(gen, 2, 10)),
                 (randint(gen, 2, 24), randint(gen, 2, 24), 1)]
        specs += [(randint(gen, 1, 24), randint(gen, 1, 24), randint(gen, 1, 10)) for _ in range(3)]
    return [Case(f"num_pid_m={m} num_pid_n={n} GROUP_M={g}", dict(num_pid_m=m, num_pid_n=n, GROUP_M=g))
            for m, n, g in specs]


def _order_judge(case, obs):
    x = case.inputs
    pairs = obs["pairs"]
    for pid, got in enumerate(pairs):
        want = list(ref_grouped_pid(pid, **x))
        if got != want:
            shown = f"({got[0]}, {got[1]})" if isinstance(got, list) else got
            msg = (f"grouped_pid({pid}, num_pid_m={x['num_pid_m']}, num_pid_n={x['num_pid_n']}, "
                   f"GROUP_M={x['GROUP_M']}) = {shown}, expected ({want[0]}, {want[1]}).")
            first_m = pid // (x["GROUP_M"] * x["num_pid_n"]) * x["GROUP_M"]
            if x["num_pid_m"] - first_m < x["GROUP_M"]:
                msg += (f"\n  Program {pid} is in the last group, which has only {x['num_pid_m'] - first_m} tile "
                        f"row(s), not GROUP_M = {x['GROUP_M']}: its size is min(num_pid_m - first_pid_m, GROUP_M).")
            return msg
    if sorted(map(tuple, pairs)) != sorted((m, n) for m in range(x["num_pid_m"]) for n in range(x["num_pid_n"])):
        return "the mapping must visit every tile exactly once."
    return None


GROUPED_ORDER = Exercise("grouped_order", 2, ("grouped_pid",), _order_cases, RUN._order_run, _order_judge,
                         title="Grouped (swizzled) program order",
                         hint="A group is GROUP_M tile rows x all num_pid_n columns = GROUP_M * num_pid_n programs; "
                              "inside a group go down the column first. "
                              "The last group has min(num_pid_m - first_pid_m, GROUP_M) rows.")


# --- the matmul kernels of sections 3 to 5: inputs, one observed call, the judge ---------------------


def _stored(a, b, layout):
    """Base tensors stored so that ``_layout`` gives the logical (M, K) a and (K, N) b."""
    a_base = a.t().contiguous() if layout in ("a_t", "both_t") else a
    b_base = b.t().contiguous() if layout in ("b_t", "both_t") else b
    if layout == "b_sliced":
        b_base = torch.stack([b, torch.zeros_like(b)], dim=2).reshape(b.shape[0], 2 * b.shape[1])
    if layout == "a_rows":
        a_base = torch.cat([a, torch.full((a.shape[0], RUN.ROW_PAD), float("nan"), dtype=a.dtype)], dim=1)
    if layout == "b_rows":
        b_base = torch.cat([b, torch.full((b.shape[0], RUN.ROW_PAD), float("nan"), dtype=b.dtype)], dim=1)
    return a_base, b_base


_LAYOUT_TEXT = {"contiguous": "", "a_t": ", a transposed", "b_t": ", b transposed",
                "both_t": ", a and b transposed", "b_sliced": ", b every other column of a wider matrix",
                "a_rows": f", a row-padded (rows K + {RUN.ROW_PAD} apart)",
                "b_rows": f", b row-padded (rows N + {RUN.ROW_PAD} apart)"}


def _operands(gen, M, N, K, dtype, layout, kind="randn"):
    if kind == "cancel":  # big partial sums that cancel: fp16 accumulation loses them
        half = K // 2
        a1 = torch.rand(M, half, generator=gen) + 0.5
        a = torch.cat([a1, a1], dim=1)
        offset = torch.cat([torch.full((half, N), 4.0), torch.full((K - half, N), -4.0)])
        b = torch.randn(K, N, generator=gen) + offset
    else:
        a, b = torch.randn(M, K, generator=gen), torch.randn(K, N, generator=gen)
    return _stored(a.to(dtype), b.to(dtype), layout)


def _matmul_case(gen, M, N, K, dtype, layout="contiguous", blocks=(*TILES[0], 4), kind="randn",
                 order=False, name=None, **extra):
    dt = getattr(torch, dtype)
    a_base, b_base = _operands(gen, M, N, K, dt, layout, kind)
    text = name or f"({M}, {N}, {K}) {dtype}{_LAYOUT_TEXT[layout]}"
    if blocks is not None:
        text += "; tile {}x{}x{}, GROUP_M={}".format(*blocks)
    return Case(text, dict(a=a_base, b=b_base, layout=layout, blocks=list(blocks) if blocks else None,
                           order=order, kind=kind, **extra))


def _not_multiple(gen, lo, hi, block) -> int:
    """A random integer in [lo, hi] that is not a multiple of ``block`` (a partial last tile)."""
    n = randint(gen, lo, hi)
    return n - 1 if n % block == 0 else n


def _judge_matmul(case, obs, name: str) -> str | None:
    """The ladder of a matmul kernel, with this lab's rules inserted: no PyTorch arithmetic next to
    the kernel, exactly one launch."""
    a, b = RUN._layout(case.inputs["a"], case.inputs["b"], case.inputs["layout"])
    expected = a.double() @ b.double()
    if case.inputs.get("epilogue"):
        expected = _apply_epilogue(expected, case)
    verdict = kernels.launch_verdict(obs, name)
    if verdict:
        return verdict
    if obs["torch_ops"]:
        ops = ", ".join(dict.fromkeys(obs["torch_ops"]))
        return (f"{name} ran PyTorch arithmetic outside your kernel ({ops}): every FLOP, the epilogue "
                "included, must happen inside the one Triton kernel.")
    if len(obs["launches"]) > 1:
        return (f"{name} launched {len(obs['launches'])} Triton kernels ({', '.join(obs['launches'])}); "
                "it must be exactly 1 launch: fuse the work into one kernel, so the "
                "output tile is written once, straight from the accumulator.")
    atol, rtol = _tolerance(a.dtype, a.shape[1], obs.get("device", "cpu"))
    verdict = (kernels.outside_verdict(obs, name, lambda o: compare(o["out"], expected, dtype=a.dtype, atol=atol,
                                                                    rtol=rtol) is None)
               or kernels.bounds_verdict(obs) or kernels.return_verdict(obs, name))
    if verdict:
        if verdict.stage == "out_of_bounds":
            return verdict + " In a matmul, mask the store with (rows < M) & (cols < N)."
        return verdict
    report = compare(obs["out"], expected, dtype=a.dtype, atol=atol, rtol=rtol, name=name)
    if report:
        return kernels.mismatch_verdict(report + _diagnose(case, obs, a, b, atol, rtol), obs)
    return kernels.final_verdict(case, obs)


def _tolerance(dtype, K, device):
    """(atol, rtol) for a matmul output. fp16: the dtype's tolerance (fp32 accumulation leaves only the
    final rounding). fp32: a little looser than elementwise (K products summed); on a GPU, tl.dot may
    round fp32 inputs to TF32 (10-bit mantissa) on the tensor cores, so allow TF32-sized errors there."""
    if dtype == torch.float16:
        return 2e-3, 2e-3
    if str(device).startswith("cuda"):
        return 2.5e-3 * math.sqrt(max(K, 1)), 1e-2
    return 1e-4, 1e-4


def _diagnose(case, obs, a, b, atol, rtol) -> str:
    """A hint for the usual mistakes, found by comparing with what each mistake would produce."""
    bk = case.inputs["blocks"][2] if case.inputs["blocks"] else 0  # unknown when autotuned
    K = a.shape[1]
    out = obs["out"]
    extra = case.inputs.get("epilogue")

    def close_to(t):
        t = _apply_epilogue(t, case) if extra else t
        return compare(out, t, dtype=a.dtype, atol=atol, rtol=rtol) is None

    if bk and K % bk and K > bk and close_to(a[:, : K - K % bk].double() @ b[: K - K % bk].double()):
        return (f"\n  Your result equals the product over the first {K - K % bk} of K = {K} columns: the K loop "
                f"drops the last K % BLOCK_K = {K % bk}. Loop over range(0, K, BLOCK_K) (cdiv(K, BLOCK_K) steps) "
                "and mask the K dimension of both loads (offs_k < K - k), with other=0.")
    if case.inputs["layout"] != "contiguous":
        return (f"\n  This case passes strided views (a has strides {tuple(a.stride())}, b has strides "
                f"{tuple(b.stride())}): index A with a.stride(0), a.stride(1) and B with b.stride(0), "
                "b.stride(1), never with strides computed from the shape.")
    if a.dtype == torch.float16 and not torch.isnan(out).any():
        return ("\n  fp16 inputs: the errors look like rounding. Accumulate in float32 (tl.zeros(..., "
                "dtype=tl.float32) and tl.dot's default fp32 output) and convert to fp16 only when storing.")
    return ""


def _apply_epilogue(t, case):
    t = t + case.inputs["bias"].double()
    return torch.relu(t) if case.inputs["epilogue"] == "relu" else F.gelu(t)


# --- 3. tiled matmul --------------------------------------------------------------------------------

def _matmul_cases(gen, public):
    if public:
        return [
            _matmul_case(gen, 64, 64, 64, "float32"),
            _matmul_case(gen, 97, 75, 130, "float32", name="(97, 75, 130) float32: M, N, K not multiples of the tile"),
            _matmul_case(gen, 1, 1, 1, "float32"),
            _matmul_case(gen, 80, 72, 100, "float16"),
            _matmul_case(gen, 64, 64, 192, "float16", kind="cancel",
                         name="(64, 64, 192) float16, partial sums up to ~400 that cancel (accumulate in fp32)"),
            _matmul_case(gen, 65, 70, 90, "float32", "a_t"),
            _matmul_case(gen, 50, 66, 40, "float16", "both_t"),
            _matmul_case(gen, 33, 40, 50, "float32", "b_sliced"),
            _matmul_case(gen, 130, 100, 70, "float32", blocks=(16, 64, 64, 2), order=True,
                         name="(130, 100, 70) float32, programs must follow grouped_pid"),
            _matmul_case(gen, 100, 30, 70, "float32", "a_rows", blocks=(*TILES[0], 4), shape="tall"),
            _matmul_case(gen, 30, 100, 50, "float16", "b_rows", blocks=(*TILES[1], 4), shape="wide"),
        ]
    cases = []
    for i, layout in enumerate(["contiguous", "a_t", "b_t", "both_t", "b_sliced", "a_rows", "b_rows"]):
        bm, bn, bk = TILES[i % 2]
        M, N, K = _not_multiple(gen, 1, 130, bm), _not_multiple(gen, 1, 130, bn), _not_multiple(gen, 1, 160, bk)
        cases.append(_matmul_case(gen, M, N, K, ["float32", "float16"][i % 2], layout, blocks=(bm, bn, bk, 4)))
    cases += _swapped_grid_cases(gen)
    M, N, K = randint(gen, 17, 64), randint(gen, 17, 64), 2 * randint(gen, 64, 100)
    cases.append(_matmul_case(gen, M, N, K, "float16", kind="cancel", blocks=(*TILES[1], 4),
                              name=f"({M}, {N}, {K}) float16, partial sums that cancel (accumulate in fp32)"))
    M, N, K = randint(gen, 40, 130), randint(gen, 40, 130), randint(gen, 1, 64)
    blocks = [(16, 32, 32), (32, 16, 64)][randint(gen, 0, 1)]
    cases.append(_matmul_case(gen, M, N, K, "float16", blocks=(*blocks, randint(gen, 2, 4)), order=True,
                              name=f"({M}, {N}, {K}) float16, programs must follow grouped_pid"))
    return cases


def _swapped_grid_cases(gen) -> list:
    """A tall and a wide output, tiles in both orientations: swapping BLOCK_M and BLOCK_N anywhere
    (grid, tile offsets, program mapping) leaves output tiles unwritten or wrong in one of them."""
    (bm, bn, bk), (bm2, bn2, bk2) = TILES
    M, N, K = randint(gen, 97, 128), randint(gen, 17, 32), _not_multiple(gen, 20, 100, bk)
    tall = _matmul_case(gen, M, N, K, "float32", blocks=(bm, bn, bk, randint(gen, 1, 4)),
                        name=f"({M}, {N}, {K}) float32, tall output", shape="tall")
    M, N, K = randint(gen, 17, 32), randint(gen, 97, 128), _not_multiple(gen, 20, 100, bk2)
    wide = _matmul_case(gen, M, N, K, "float16", blocks=(bm2, bn2, bk2, randint(gen, 1, 4)),
                        name=f"({M}, {N}, {K}) float16, wide output", shape="wide")
    return [tall, wide]


def _matmul_judge(case, obs):
    message = _judge_matmul(case, obs, "matmul")
    if message or not case.inputs.get("order"):
        return message
    return _judge_order(case, obs)


def _judge_order(case, obs) -> str | None:
    bm, bn, _, g = case.inputs["blocks"]
    num_m, num_n = obs["num_pid"]
    reference = [list(ref_grouped_pid(p, num_m, num_n, g)) for p in range(num_m * num_n)]
    own = obs["own_order"]
    if obs.get("tiles") is None:  # compiled mode: the order cannot be observed, read the source instead
        if obs.get("calls_grouped_pid") is False:
            return ("matmul_kernel does not call grouped_pid (through grouped_pid_jit): map the program id to "
                    "its tile with pid_m, pid_n = grouped_pid_jit(pid, num_pid_m, num_pid_n, GROUP_M).")
        return None
    tiles = obs["tiles"]
    if tiles == own or tiles == reference:
        return None
    row_major = [[p // num_n, p % num_n] for p in range(num_m * num_n)]
    msg = (f"programs 0, 1, 2 ... stored tiles {tiles[:8]} ... for a {num_m} x {num_n} grid of tiles with "
           f"GROUP_M={g}; grouped_pid gives {(own if isinstance(own, list) else reference)[:8]} ...")
    if tiles == row_major:
        msg += " Your kernel visits tiles in row-major order."
    return msg + (" Map each program to its tile with pid_m, pid_n = grouped_pid_jit(pid, num_pid_m, num_pid_n, "
                  "GROUP_M), the same function as section 2, so neighbouring programs share A and B tiles in L2.")


MATMUL_TILED = Exercise("matmul_tiled", 4, ("matmul",), _matmul_cases, partial(RUN._matmul_run, "matmul"),
                        _matmul_judge,
                        title="Tiled matmul with fp32 accumulation",
                        hint="acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32); for k in range(0, K, BLOCK_K): "
                             "load A and B tiles with masks on rows/cols AND on k, acc = tl.dot(a, b, acc), "
                             "advance the pointers by BLOCK_K * stride; "
                             "store acc.to(output dtype) under the (rows < M) & (cols < N) mask.")


# --- 4. autotune configurations -----------------------------------------------------------------------

def _autotune_cases(gen, public):
    cases = [Case("matmul_configs('cuda') and matmul_configs('cpu') are valid", dict(kind="configs"))]
    if public:
        cases += [_matmul_case(gen, 97, 75, 130, "float16", blocks=None,
                               name="matmul_autotuned (97, 75, 130) float16"),
                  _matmul_case(gen, 70, 65, 90, "float32", "both_t", blocks=None,
                               name="matmul_autotuned (70, 65, 90) float32, a and b transposed")]
    else:
        for i, layout in enumerate(["contiguous", "a_t"]):
            M, N, K = randint(gen, 1, 130), randint(gen, 1, 130), randint(gen, 1, 160)
            dtype = ["float16", "float32"][i]
            cases.append(_matmul_case(gen, M, N, K, dtype, layout, blocks=None,
                                      name=f"matmul_autotuned ({M}, {N}, {K}) {dtype}{_LAYOUT_TEXT[layout]}"))
    return cases


def _config_problem(cfg: dict, device: str) -> str | None:
    if cfg.get("type") != "Config":
        return f"every entry must be a triton.Config, got a {cfg.get('type')}"
    kw = cfg["kwargs"]
    missing = [k for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M") if k not in kw]
    if missing:
        return f"{cfg['text']} lacks {', '.join(missing)} (the kernel's constexpr parameters)"
    extra = [k for k in kw if k not in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
    if extra:
        return f"{cfg['text']} sets {', '.join(extra)}, which matmul_kernel does not take"
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if not _pow2(kw[k]) or not 16 <= kw[k] <= 256:
            return (f"{cfg['text']}: {k} = {kw[k]!r} must be a power of two between 16 and 256 "
                    "(tl.arange needs powers of two; tl.dot needs at least 16)")
    if not isinstance(kw["GROUP_M"], int) or isinstance(kw["GROUP_M"], bool) or kw["GROUP_M"] < 1:
        return f"{cfg['text']}: GROUP_M = {kw['GROUP_M']!r} must be a positive integer"
    if not _pow2(cfg["num_warps"]) or cfg["num_warps"] > 16:
        return f"{cfg['text']}: num_warps = {cfg['num_warps']!r} must be 1, 2, 4, 8 or 16"
    if not isinstance(cfg["num_stages"], int) or cfg["num_stages"] < 1:
        return f"{cfg['text']}: num_stages = {cfg['num_stages']!r} must be a positive integer"
    if device == "cuda":
        smem = cfg["num_stages"] * (kw["BLOCK_M"] * kw["BLOCK_K"] + kw["BLOCK_K"] * kw["BLOCK_N"]) * 2
        if smem > SMEM_BYTES:
            return (f"{cfg['text']} needs num_stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x 2 bytes = "
                    f"{smem // 1024} KiB of shared memory for fp16 pipeline buffers, more than the 227 KiB one CTA "
                    "may use on an H100 (its SM has 228 KiB)")
    if device == "cpu" and max(kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]) > 64:
        return (f"{cfg['text']}: on the CPU keep the tiles small (at most 64) so the interpreter stays fast "
                "and masks are exercised")
    return None


def _autotune_judge(case, obs):
    if case.inputs.get("kind") == "configs":
        for dev in ("cuda", "cpu"):
            d = obs[dev]
            if "error" in d:
                return f"matmul_configs({dev!r}) {d['error']}."
            if not d["configs"]:
                return f"matmul_configs({dev!r}) returned an empty list: autotune needs at least one config."
            for cfg in d["configs"]:
                problem = _config_problem(cfg, dev)
                if problem:
                    return f"matmul_configs({dev!r}): {problem}."
        if len(obs["cpu"]["configs"]) != 1:
            return (f"matmul_configs('cpu') returned {len(obs['cpu']['configs'])} configs: return exactly one. "
                    "The autotuner times every config on first use, and in the interpreter each costs seconds.")
        if len(obs["cuda"]["configs"]) < 2:
            return ("matmul_configs('cuda') returned a single config: give the autotuner a few candidates "
                    "(tile shapes, num_warps, num_stages) to choose from.")
        return None
    if "skipped" in obs:
        return obs["skipped"]
    if obs["launches"] and "Autotuner" not in obs["kinds"]:
        return ("matmul_autotuned launched a plain kernel: launch autotuned_matmul_kernel() with a grid that "
                "reads the tile sizes from the chosen config, grid = lambda META: (cdiv(M, META['BLOCK_M']) * "
                "cdiv(N, META['BLOCK_N']),), and pass no BLOCK_* arguments.")
    return _judge_matmul(case, obs, "matmul_autotuned")


MATMUL_AUTOTUNE = Exercise("matmul_autotune", 2, ("matmul_configs", "matmul_autotuned"), _autotune_cases,
                           RUN._autotune_run, _autotune_judge, title="Autotune configurations",
                           hint="triton.Config({'BLOCK_M': 128, 'BLOCK_N': 128, 'BLOCK_K': 64, 'GROUP_M': 8}, "
                                "num_warps=8, num_stages=3); on 'cpu' return one config with 32x32x32 tiles. "
                                "The grid is a function of META.")


# --- 5. fused epilogue --------------------------------------------------------------------------------

def _epilogue_cases(gen, public):
    # Cases alternate TILES[0] and TILES[1]; the first is a tall output, the second a wide one.
    if public:
        specs = [(130, 30, 96, "float32", "relu", "contiguous"), (30, 77, 100, "float16", "gelu", "contiguous"),
                 (64, 64, 64, "float16", "relu", "a_t"), (33, 70, 45, "float32", "gelu", "b_t")]
    else:
        specs = [(randint(gen, 97, 128), randint(gen, 17, 32), randint(gen, 1, 160), "float32", "relu", "contiguous"),
                 (randint(gen, 17, 32), randint(gen, 97, 128), randint(gen, 1, 160), "float16", "gelu", "a_t")]
        for i, (act, layout) in enumerate([("gelu", "b_rows"), ("relu", "both_t")]):
            bm, bn, _ = TILES[i % 2]
            specs.append((_not_multiple(gen, 1, 130, bm), _not_multiple(gen, 1, 130, bn), randint(gen, 1, 160),
                          ["float32", "float16"][i % 2], act, layout))
    cases = []
    for i, (M, N, K, dtype, act, layout) in enumerate(specs):
        dt = getattr(torch, dtype)
        shape = {0: dict(shape="tall"), 1: dict(shape="wide")}.get(i, {})
        c = _matmul_case(gen, M, N, K, dtype, layout, blocks=(*TILES[i % 2], 4),
                         name=f"({M}, {N}, {K}) {dtype}{_LAYOUT_TEXT[layout]}, {act}",
                         bias=(2 * torch.randn(N, generator=gen)).to(dt), epilogue=act, **shape)
        cases.append(c)
    return cases


def _epilogue_judge(case, obs):
    message = _judge_matmul(case, obs, "matmul_bias_act")
    if not message or "differ" not in message:
        return message
    a, b = RUN._layout(case.inputs["a"], case.inputs["b"], case.inputs["layout"])
    bias, act = case.inputs["bias"].double(), case.inputs["epilogue"]
    t = a.double() @ b.double() + bias
    other = "gelu" if act == "relu" else "relu"
    atol, rtol = _tolerance(a.dtype, a.shape[1], obs.get("device", "cpu"))
    variants = [(f"activation={other!r}", lambda: torch.relu(t) if other == "relu" else F.gelu(t)),
                ("no bias", lambda: torch.relu(t - bias) if act == "relu" else F.gelu(t - bias)),
                ("no activation", t),
                ("tanh-approximated GELU", lambda: F.gelu(t, approximate="tanh"))]
    return diagnose(message, obs.get("out"), variants, tensor_match(a.dtype, atol=atol, rtol=rtol),
                    "\n  Your output matches the {} version instead.")


MATMUL_EPILOGUE = Exercise("matmul_epilogue", 3, ("matmul_bias_act",), _epilogue_cases,
                           partial(RUN._matmul_run, "matmul_bias_act"), _epilogue_judge,
                           title="Fused epilogue: bias + activation",
                           hint="After the K loop, add the bias (loaded once per column block, in fp32) to acc, "
                                "apply the activation on acc, then store: one kernel, no PyTorch arithmetic.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.pct_of_peak", "gpulab.bench.tflops",
           "gpulab.launches.record_launches", "gpulab.peaks.measured_peaks", "gpulab.plots.grouped_bars")
EXERCISES = [offering(ex, OFFERED) for ex in (TILE_INTENSITY, GROUPED_ORDER, MATMUL_TILED, MATMUL_AUTOTUNE,
                                          MATMUL_EPILOGUE)]


# --- benchmarks (python -m grader bench) -----------------------------------------------------------

def _bench_make(size_full, epilogue=False):
    def make(device, tiny):
        n = 64 if tiny else size_full
        dtype = torch.float32 if device == "cpu" else torch.float16
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        d = {"a": a, "b": b, "out": torch.empty(n, n, device=device, dtype=dtype),
             "flops": 2 * n**3, "bytes": 3 * n * n * a.element_size()}
        if epilogue:  # Hopper-sized tiles on a GPU (the wrapper's defaults are the checks' 32x32x32)
            d["bias"] = torch.randn(n, device=device, dtype=dtype)
            d["blocks"] = {} if tiny else dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)
        return d
    return make


BENCHMARKS = [
    Benchmark("autotuned fp16 4096^3 vs torch.mm", "matmul_autotuned", _bench_make(4096),
              lambda fn, d: fn(d["a"], d["b"], out=d["out"]), lambda d: torch.matmul(d["a"], d["b"], out=d["out"])),
    Benchmark("autotuned fp16 8192^3 vs torch.mm", "matmul_autotuned", _bench_make(8192),
              lambda fn, d: fn(d["a"], d["b"], out=d["out"]), lambda d: torch.matmul(d["a"], d["b"], out=d["out"])),
    Benchmark("bias+relu epilogue 4096^3 vs eager", "matmul_bias_act", _bench_make(4096, epilogue=True),
              lambda fn, d: fn(d["a"], d["b"], d["bias"], activation="relu", out=d["out"], **d["blocks"]),
              lambda d: torch.relu(torch.addmm(d["bias"], d["a"], d["b"]))),
]
