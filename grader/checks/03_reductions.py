"""Checks of lab 03, reductions: row softmax, online-softmax partial states, RMSNorm and LayerNorm.

Every kernel check passes a *poisoned* output followed by a guard region, records which Triton
kernels launched and that the learner's own kernels computed the output, and verifies the inputs
were not modified (lab 02's rules, in ``grader.kit.kernels``). What this lab adds,
from the curriculum's "C:" line:

- **rows wider than one block**: cases pass a small ``BLOCK_N``, so a row spans several blocks and a
  kernel that handles only the first block, or forgets to rescale its running sum when the running
  max grows, fails;
- **large magnitudes**: rows of values near +-1000, where ``exp`` overflows float32 (above ~88.7)
  unless the row max is subtracted first;
- **-inf masked entries**: they get probability 0; a *fully* masked row has an all-zero softmax
  (NaN-free, the convention of FlashAttention-style kernels; ``torch.softmax`` gives NaN there) and
  the online state ``(m, l) = (-inf, 0)``;
- **fp16 inputs with fp32 accumulation**: long fp16 rows with a large mean, whose sum (LayerNorm)
  or sum of squares (RMSNorm) overflows float16's 65504: a kernel that accumulates in fp16 gets inf;
- odd sizes, wrong eps placement, biased vs unbiased variance (diagnosed by name when matched);
- the stretch RMSNorm backward: dx with the gradient through rstd, dweight summed over every row.

Inputs sit at the start of a larger buffer padded with large values, so a load mask that is off by
one (``<=``) reads a value that changes the result rather than memory nobody owns. Some cases pass
**row-padded views** (an (M, N + pad) buffer sliced to (M, N), the gaps holding the same large
values): a kernel that offsets rows by N instead of ``x.stride(0)`` reads them.

Hidden cases are random sizes inside fixed rules: every seed's hidden set holds every rule above
(tests/test_checks_03.py checks it).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from gpulab.compare import compare
from grader.exercise import Benchmark, Case, Exercise, changed_inputs
from grader.kit import kernels
from grader.kit.cases import choice, randint, randn
from grader.kit.helpers import offering
from grader.kit.variants import matching_variant, tensor_match
from grader.runs import run_side

LAB = "03_reductions"
RUN = run_side(LAB)  # the learner side: grader/runs/03_reductions.py
TITLE = "Reductions: softmax and normalization"

# (atol, rtol) for softmax probabilities. Outputs are ~1/N, so dtype-default atols would pass anything:
# fp32 keeps 1e-5 relative; fp16 gets its rounding (2^-11 relative, half an ulp of a subnormal) with 2x room.
SOFTMAX_TOL = {torch.float32: (1e-7, 1e-5), torch.float16: (1e-7, 1e-3)}
STATS_RTOL = 2e-5  # the normaliser l of an (m, l) state, in float32


def _not_multiple(gen, lo, hi, block) -> int:
    """A random integer in [lo, hi] that is not a multiple of ``block`` (the last block is partial)."""
    n = randint(gen, lo, hi)
    return n + 1 if block and n % block == 0 else n


def _row_pad_note(case) -> str:
    pad = case.inputs.get("row_pad", 0)
    if not pad:
        return ""
    n = case.inputs["x"].shape[1]
    return (f"\n  x here is a row-padded view: its rows are x.stride(0) = {n + pad} elements apart, not N = {n} "
            f"(an (M, N + {pad}) buffer sliced to (M, N)). Pass x.stride(0) to the kernel and offset row r by "
            "r * stride_xm.")


def _wide_note(case) -> str:
    n, b = case.inputs["x"].shape[-1], case.inputs.get("block_n")
    if b is None or n <= b:
        return ""
    return (f"\n  Rows here span {-(-n // b)} blocks of BLOCK_N={b} columns: loop over all of them, with a mask on "
            "the last one (`cols < N`, not `<=`).")


_FP16_NOTE = ("\n  float16 input: convert each loaded block to float32 (`x.to(tl.float32)`) and accumulate "
              "sums in float32; store the result in float16.")


# --- 1. row softmax ---------------------------------------------------------------------------------

def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Row softmax in float64. -inf entries get 0; a row of only -inf gives all zeros (not NaN)."""
    x = x.double()
    m = x.amax(dim=1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # fully masked row: exp(-inf - 0) = 0
    e = torch.exp(x - m)
    l = e.sum(dim=1, keepdim=True)
    return torch.where(l > 0, e / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(e))


def _softmax_x(gen, M: int, N: int, dtype, kind: str) -> torch.Tensor:
    if kind == "large":  # exp(x) overflows float32 unless the row max is subtracted
        x = (torch.rand(M, N, generator=gen) * 2 - 1) * 1000
        x[:, -1] = 1000.0  # the max sits in the last block: every earlier block sees its max grow
    else:
        x = randn(gen, M, N, scale=2)
    if kind == "masked":  # some -inf entries in every row, never a whole row
        for r in range(M):
            pattern = r % 3
            if pattern == 0:
                x[r, ::3] = float("-inf")
            elif pattern == 1:
                x[r, : max(N * 3 // 5, 1)] = float("-inf")  # whole leading blocks are -inf
            else:
                x[r, :-1] = float("-inf")  # one finite entry, at the very end
            if N == 1:
                x[r, 0] = 0.5
    if kind == "fully_masked":
        x[M // 2, :] = float("-inf")
        if M > 1:
            x[0, : N // 2] = float("-inf")
    return x.to(dtype)


_SOFTMAX_KINDS = {
    "normal": "",
    "wide": ": rows wider than one block",
    "fp16_long": ": long float16 rows",
    "large": ": values near +-1000 (exp overflows without max subtraction)",
    "masked": ": -inf (masked) entries in every row",
    "fully_masked": ": a fully masked row (all -inf)",
    "padded": ": rows of a row-padded view (stride(0) > N)",
}


def _softmax_cases(gen, public):
    if public:
        specs = [(1, 1, None, "float32", "normal"), (5, 77, None, "float32", "normal"),
                 (6, 1000, 128, "float32", "wide"), (4, 4000, 512, "float16", "fp16_long"),
                 (3, 257, 64, "float32", "large"), (6, 300, 64, "float32", "masked"),
                 (3, 100, 32, "float32", "fully_masked"), (4, 300, 64, "float32", "padded")]
    else:  # every rule, random sizes; blocked rows never a multiple of the block
        b_wide, b_long, b_masked = choice(gen, [64, 128, 256]), choice(gen, [256, 512]), choice(gen, [32, 64])
        specs = [(randint(gen, 1, 12), _not_multiple(gen, 1, 700, 16), None, "float32", "normal"),
                 (randint(gen, 1, 8), _not_multiple(gen, 300, 2500, b_wide), b_wide, "float32", "wide"),
                 (randint(gen, 2, 4), _not_multiple(gen, 2500, 4096, b_long), b_long, "float16", "fp16_long"),
                 (randint(gen, 1, 6), _not_multiple(gen, 65, 800, 64), 64, "float32", "large"),
                 (randint(gen, 3, 8), _not_multiple(gen, 100, 600, b_masked), b_masked, "float32", "masked"),
                 (randint(gen, 2, 6), _not_multiple(gen, 40, 300, 32), 32, "float16", "fully_masked"),
                 (randint(gen, 2, 6), _not_multiple(gen, 65, 400, 64), 64, "float16", "padded")]
    cases = []
    for M, N, block_n, dtype, kind in specs:
        x = _softmax_x(gen, M, N, getattr(torch, dtype), kind)
        blk = "" if block_n is None else f", BLOCK_N={block_n}"
        inputs = dict(x=x, block_n=block_n, kind=kind)
        if kind == "padded":
            inputs["row_pad"] = 13 if public else randint(gen, 1, 40)
        cases.append(Case(f"({M}, {N}) {dtype}{blk}{_SOFTMAX_KINDS[kind]}", inputs))
    return cases


def _softmax_judge(case, obs):
    x, kind = case.inputs["x"], case.inputs["kind"]
    atol, rtol = SOFTMAX_TOL[x.dtype]
    message = kernels.judge_out(case, obs, "softmax", softmax_reference(x), x.dtype, atol=atol, rtol=rtol)
    if getattr(message, "stage", None) != "mismatch":
        return message
    out = obs["out"].double()
    live = ~torch.isneginf(x.double()).all(dim=1)  # rows with at least one finite entry
    sums = out.sum(dim=1)
    off = live & ~((sums - 1).abs() < 1e-2)
    if off.any():
        r = int(off.nonzero()[0])
        message += f"\n  Row {r} of your output sums to {float(sums[r]):.4g}, not 1: its normaliser l is wrong."
    if kind == "padded":
        return message + _row_pad_note(case)
    if kind == "large":
        return message + ("\n  Entries near +-1000: exp(1000) = inf in float32 (exp overflows above ~88.7), and "
                          "inf / inf = NaN. Subtract the row max before exp: softmax(x) = softmax(x - max(x)).")
    if kind in ("masked", "fully_masked"):
        message += ("\n  -inf entries must get probability 0 without NaN: while a block (or lane) has seen only "
                    "-inf, its running max is -inf and exp(-inf - (-inf)) = exp(nan). Subtract 0 instead of a "
                    "-inf max. (Lanes past the end of a row, loaded with other=-inf, see only -inf too.)")
        r = x.shape[0] // 2
        if kind == "fully_masked" and not torch.equal(out[r], torch.zeros_like(out[r])):
            message += (f"\n  Row {r} is entirely -inf (fully masked). This lab's convention: its softmax is all "
                        "zeros (torch.softmax returns NaN there). Guard the max (use 0 when it is -inf) and the "
                        "division (divide only where the sum is > 0).")
        return message
    b, n = case.inputs["block_n"], x.shape[1]
    if b is not None and n > b:
        message += _wide_note(case)
        if torch.isnan(obs["out"][:, b:]).all() and not torch.isnan(obs["out"][:, :b]).all():
            message += f"\n  Columns from {b} on were never written: the kernel handled only the first block."
        else:
            message += ("\n  A one-pass loop must rescale the running sum when the running max grows: "
                        "l = l * exp(m_old - m_new) + sum(exp(x - m_new)).")
    else:
        message += ("\n  Check the mask (`cols < N`, not `<=`: the element after a row is the next row's) and the "
                    "formula exp(x - max) / sum(exp(x - max)).")
    if x.dtype == torch.float16:
        message += _FP16_NOTE
    return message


SOFTMAX_ROWS = Exercise("softmax_rows", 3, ("softmax",), _softmax_cases, RUN._softmax_run, _softmax_judge,
                        title="Row softmax: one program per row, rows of any width",
                        hint="One program per row; loop over the row in blocks of BLOCK_N columns "
                             "with `cols < N` masks and other=-inf. "
                             "Pass 1: running max and a running sum rescaled by exp(m_old - m_new) when the max grows. "
                             "Pass 2: store exp(x - m) / l. Compute in float32; "
                             "use 0 in place of a -inf max and divide only where l > 0.")


# --- 2. online softmax: combinable partial states ----------------------------------------------------

def stats_reference(x: torch.Tensor) -> torch.Tensor:
    """(M, 2) float64: per row, m = max and l = sum(exp(x - m)); (-inf, 0) for a row of only -inf."""
    x = x.double()
    m = x.amax(dim=1)
    m_use = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return torch.stack([m, torch.exp(x - m_use[:, None]).sum(dim=1)], dim=1)


def combine_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    m = torch.maximum(a[:, 0], b[:, 0])
    m_use = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return torch.stack([m, a[:, 1] * torch.exp(a[:, 0] - m_use) + b[:, 1] * torch.exp(b[:, 0] - m_use)], dim=1)


def _stats_compare(got, want, name) -> str | None:
    """m must be exact (a max is one of the inputs); l within STATS_RTOL."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return f"{name}: expected a tensor of shape {tuple(want.shape)} (m, l per row), got {shape}."
    if got.dtype != torch.float32:
        return f"{name}: dtype {got.dtype} but expected torch.float32 (states are kept in float32)."
    f32 = torch.float32
    return (compare(got[:, 0], want[:, 0], atol=0.0, rtol=0.0, dtype=f32, name=f"{name} m (column 0)")
            or compare(got[:, 1], want[:, 1], atol=1e-30, rtol=STATS_RTOL, dtype=f32, name=f"{name} l (column 1)"))


def _stats_x(gen, M, N, dtype, kind):
    if kind == "large":
        x = (torch.rand(M, N, generator=gen) * 2 - 1) * 1000
    else:
        x = randn(gen, M, N, scale=3)
    if kind == "masked":  # row 0: first half -inf; row 1: all -inf; row 2: every other entry -inf
        x[0, : N // 2] = float("-inf")
        x[1 % M, :] = float("-inf")
        if M > 2:
            x[2, ::2] = float("-inf")
    return x.to(dtype)


def _random_splits(gen, N, k):
    cuts = sorted(set(int(c) for c in torch.randint(1, N, (k - 1,), generator=gen))) if N > 1 else []
    return [0, *cuts, N]


def _state_rows(gen, K):
    """K random (m, l) states, some of them (-inf, 0) (a chunk that was all -inf)."""
    m = randn(gen, K, scale=20)
    l = 1 + torch.rand(K, generator=gen) * 50
    empty = torch.rand(K, generator=gen) < 0.2
    m[empty], l[empty] = float("-inf"), 0.0
    return torch.stack([m, l], dim=1)


def _combine_public_states():
    inf = float("-inf")
    a = torch.tensor([[0.0, 1.0], [5.0, 2.5], [inf, 0.0], [inf, 0.0], [1000.0, 3.0], [-3.0, 7.0], [2.0, 1.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 4.0], [3.0, 2.0], [inf, 0.0], [-1000.0, 5.0], [-3.0, 2.0], [30.0, 1.5]])
    c = torch.tensor([[1.0, 2.0], [9.0, 1.0], [inf, 0.0], [inf, 0.0], [999.0, 1.0], [-4.0, 1.0], [16.0, 8.0]])
    return a, b, c


def _stats_cases(gen, public):
    if public:
        specs = [(4, 1000, 128, "float32", "normal", [0, 300, 301, 777, 1000]),
                 (3, 600, 64, "float32", "large", [0, 100, 450, 600]),
                 (3, 512, 64, "float32", "masked", [0, 128, 256, 384, 512]),
                 (4, 2048, 256, "float16", "normal", [0, 512, 1024, 1536, 2048]),
                 (3, 300, 64, "float32", "padded", [0, 77, 300]),
                 (3, 300, 64, "float16", "alloc", [0, 120, 300])]
    else:  # every rule, random sizes
        specs = []
        for kind, dtype, hi in (("normal", "float32", 1500), ("large", "float16", 1500), ("masked", "float32", 1500),
                                ("padded", "float32", 400), ("alloc", "float16", 400)):
            block_n = choice(gen, [32, 64, 128])
            N = _not_multiple(gen, 50, hi, block_n)
            specs.append((randint(gen, 3, 8), N, block_n, dtype, kind, _random_splits(gen, N, randint(gen, 2, 5))))
    cases = []
    for M, N, block_n, dtype, kind, splits in specs:
        x = _stats_x(gen, M, N, getattr(torch, dtype), kind)
        what = {"normal": "", "large": ", values near +-1000", "masked": ", -inf entries and a fully -inf row",
                "padded": ", x a row-padded view (stride(0) > N), the chunks its column slices",
                "alloc": ", out=None: softmax_stats allocates the (M, 2) float32 states itself"}[kind]
        inputs = dict(x=x, block_n=block_n, splits=splits, kind=kind)
        if kind == "padded":
            inputs["row_pad"] = 11 if public else randint(gen, 1, 40)
        chunks = "" if kind == "alloc" else f", chunks at {splits}"
        cases.append(Case(f"({M}, {N}) {dtype}, BLOCK_N={block_n}{chunks}{what}", inputs))
    a, b, c = _combine_public_states() if public else (_state_rows(gen, 9), _state_rows(gen, 9), _state_rows(gen, 9))
    cases.append(Case(f"combine_stats on {a.shape[0]} hand-made states, (-inf, 0) ones included",
                      dict(a=a, b=b, c=c, kind="combine")))
    return cases


_COMBINE_HINT = ("\n  combine_stats: m = max(m_a, m_b); l = l_a * exp(m_a - m) + l_b * exp(m_b - m) (each partial sum "
                 "rescaled to the new max). A state (-inf, 0) is an empty chunk: use 0 in place of a -inf m so "
                 "exp(-inf - (-inf)) never makes a NaN.")


def _stats_alloc_judge(case, obs) -> str | None:
    if not obs["own_launches"]:
        return ("no Triton kernel of yours was launched: softmax_stats must compute its result with your "
                "@triton.jit kernel, not with PyTorch operations.")
    verdict = kernels.bounds_verdict(obs)
    if verdict:
        return verdict
    x, splits = case.inputs["x"], case.inputs["splits"]
    for (lo, hi), got in zip([*RUN._chunks(splits), (0, x.shape[1])], [*obs["chunks"], obs["whole"]]):
        report = _stats_compare(got, stats_reference(x[:, lo:hi]), f"softmax_stats(x[:, {lo}:{hi}]) with out=None")
        if report:
            return report + (f"\n  With out=None, allocate the states yourself: shape ({x.shape[0]}, 2), dtype float32 "
                             f"whatever x's dtype ({x.dtype} here): rows_out(x, out, out_shape=(M, 2), "
                             "out_dtype=torch.float32).")
    report = _stats_compare(obs["folds"][RUN._LEFT_FOLD], stats_reference(x), "combine_stats over the chunk states")
    if report:
        return report + _COMBINE_HINT
    return changed_inputs(case, obs["inputs_after"])


def _stats_judge(case, obs):
    inp = case.inputs
    if obs.get("combine_mutated"):
        return ("combine_stats modified one of its input states; it must return a new tensor and leave a and b "
                "unchanged.")
    if inp["kind"] == "alloc":
        return _stats_alloc_judge(case, obs)
    if inp["kind"] == "combine":
        a, b, c = inp["a"], inp["b"], inp["c"]
        ab = combine_reference(a, b)
        for name, got, want in [("combine_stats(a, b)", obs["ab"], ab),
                                ("combine_stats(b, a)", obs["ba"], ab),
                                ("combine_stats(combine_stats(a, b), c)", obs["left"], combine_reference(ab, c)),
                                ("combine_stats(a, combine_stats(b, c))", obs["right"],
                                 combine_reference(a, combine_reference(b, c)))]:
            report = _stats_compare(got, want, name)
            if report:
                return report + _COMBINE_HINT
        return None
    x, splits = inp["x"], inp["splits"]
    returns = ("softmax_stats must write its result into `out` when `out` is given, and return `out` (the check "
               "passes a (M, 2) float32 buffer pre-filled with NaN).")
    want = stats_reference(x)  # (M, 2): the whole row's (m, l)
    verdict = (kernels.launch_verdict(obs, "softmax_stats")
               or kernels.outside_verdict(obs, "softmax_stats",
                                          lambda o: _stats_compare(o["out"], want, "softmax_stats") is None)
               or kernels.bounds_verdict(obs) or kernels.return_verdict(obs, "softmax_stats", returns))
    if verdict:
        return verdict
    notes = _wide_note(case) + _row_pad_note(case)
    if inp["kind"] == "large":
        notes += "\n  Entries near +-1000: exp(x) overflows float32 unless you subtract the running max first."
    if inp["kind"] == "masked":
        notes += ("\n  A row (or a chunk) of only -inf has the state (-inf, 0); a lane that has seen only -inf "
                  "must not compute exp(-inf - (-inf)) = NaN.")
    notes += ("\n  When the running max grows from m_old to m_new, rescale the running sum: "
              "l = l * exp(m_old - m_new) + exp(x - m_new).")
    report = _stats_compare(obs["whole"], want, f"softmax_stats(x) on the whole {tuple(x.shape)} x")
    if report:
        return report + notes
    for (lo, hi), got in zip(RUN._chunks(splits), obs["chunks"]):
        report = _stats_compare(got, stats_reference(x[:, lo:hi]), f"softmax_stats(x[:, {lo}:{hi}])")
        if report:
            return report + notes
    for order, got in obs["folds"].items():
        report = _stats_compare(got, want, f"combine_stats over the chunk states, {order}")
        if report:
            return (report + "\n  Combining the chunk states in any order must give the whole row's state "
                    "(the combine is associative and commutative)." + _COMBINE_HINT)
    return kernels.final_verdict(case, obs)


SOFTMAX_ONLINE_STATE = Exercise("softmax_online_state", 3, ("softmax_stats", "combine_stats"), _stats_cases,
                                RUN._stats_run, _stats_judge, title="Online softmax: combinable (max, sum) states",
                                hint="softmax_stats: pass 1 of your softmax, storing (m, l) per row in float32. "
                                     "combine_stats: m = max(m_a, m_b), l = l_a * exp(m_a - m) + l_b * exp(m_b - m), "
                                     "with 0 in place of a -inf m.")


# --- 3 and 4. RMSNorm and LayerNorm forward ---------------------------------------------------------

def rmsnorm_reference(x, weight, eps, eps_inside=True):
    x = x.double()
    ms = (x * x).mean(dim=1, keepdim=True)
    rms = torch.sqrt(ms + eps) if eps_inside else torch.sqrt(ms) + eps
    return x / rms * weight.double()


def layernorm_reference(x, weight, bias, eps, unbiased=False, eps_inside=True):
    x = x.double()
    mean = x.mean(dim=1, keepdim=True)
    n = x.shape[1]
    var = ((x - mean) ** 2).sum(dim=1, keepdim=True) / ((n - 1) if unbiased else n)  # n = 1, unbiased: 0/0 = NaN
    std = torch.sqrt(var + eps) if eps_inside else torch.sqrt(var) + eps
    return (x - mean) / std * weight.double() + bias.double()


_NORM_KINDS = {
    "normal": "",
    "tiny": ": very short rows",
    "wide": ": rows wider than one block",
    "fp16_long": ": long float16 rows with a large mean (an fp16 sum overflows at 65504)",
    "eps": ": small values where eps matters, and a constant row",
    "padded": ": rows of a row-padded view (stride(0) > N)",
}


def _norm_x(gen, M, N, dtype, kind, op):
    if kind == "fp16_long":  # RMSNorm: sum of squares ~ N * 68; LayerNorm: sum ~ N * 40. Both > 65504.
        mean, std = (8.0, 2.0) if op == "rmsnorm" else (40.0, 2.0)
        x = mean + randn(gen, M, N, scale=std)
    elif kind == "eps":
        x = randn(gen, M, N, scale=0.3) + (0.0 if op == "rmsnorm" else 1.0)
        x[-1] = 0.0 if op == "rmsnorm" else 2.5  # a constant row: only eps keeps 0 / 0 away
    else:
        x = randn(gen, M, N, scale=2) + 0.5
    return x.to(dtype)


def _norm_cases(op):
    def make(gen, public):
        if public:
            specs = [(1, 1, None, "float32", "tiny"), (6, 7, None, "float32", "tiny"),
                     (7, 333, None, "float32", "normal"), (5, 1500, 256, "float32", "wide"),
                     (4, 4000, 1024, "float16", "fp16_long"), (4, 200, 64, "float32", "eps"),
                     (3, 40, None, "float32", "eps"), (4, 150, 64, "float32", "padded")]
        else:  # every rule, random sizes; blocked rows never a multiple of the block
            b_wide, b_long, b_eps = choice(gen, [128, 256, 512]), choice(gen, [512, 1024]), choice(gen, [64, 128])
            specs = [(randint(gen, 1, 8), randint(gen, 1, 9), None, "float32", "tiny"),
                     (randint(gen, 1, 12), _not_multiple(gen, 10, 900, 16), None, "float16", "normal"),
                     (randint(gen, 1, 6), _not_multiple(gen, 600, 3000, b_wide), b_wide, "float32", "wide"),
                     (randint(gen, 2, 4), _not_multiple(gen, 2500, 4096, b_long), b_long, "float16", "fp16_long"),
                     (randint(gen, 2, 6), _not_multiple(gen, 50, 500, b_eps), b_eps, "float32", "eps"),
                     (randint(gen, 2, 6), randint(gen, 8, 120), None, "float32", "eps"),  # eps on a one-block row too
                     (randint(gen, 2, 6), _not_multiple(gen, 65, 400, 64), 64, "float32", "padded")]
        cases = []
        for M, N, block_n, dtype, kind in specs:
            dt = getattr(torch, dtype)
            x = _norm_x(gen, M, N, dt, kind, op)
            eps = (0.1 if op == "rmsnorm" else 0.05) if kind == "eps" else (1e-6 if op == "rmsnorm" else 1e-5)
            w = (1 + randn(gen, N, scale=0.5)).to(dt)
            inputs = dict(x=x, weight=w, eps=eps, block_n=block_n, kind=kind)
            if kind == "padded":
                inputs["row_pad"] = 9 if public else randint(gen, 1, 40)
            if op == "layernorm":
                inputs["bias"] = randn(gen, N, scale=0.5).to(dt)
            blk = "" if block_n is None else f", BLOCK_N={block_n}"
            cases.append(Case(f"({M}, {N}) {dtype}, eps={eps:g}{blk}{_NORM_KINDS[kind]}", inputs))
        return cases
    return make


def _norm_judge(op):
    def judge(case, obs):
        inp = case.inputs
        x, w, eps = inp["x"], inp["weight"], inp["eps"]
        if op == "rmsnorm":
            expected = rmsnorm_reference(x, w, eps)
            wrong = [("x / (sqrt(mean(x^2)) + eps): eps goes inside the square root, rsqrt(mean(x^2) + eps)",
                      lambda: rmsnorm_reference(x, w, eps, eps_inside=False))]
        else:
            b = inp["bias"]
            expected = layernorm_reference(x, w, b, eps)
            wrong = [("the unbiased variance (sum / (N - 1)): LayerNorm normalises by the biased variance, "
                      "sum((x - mean)^2) / N", lambda: layernorm_reference(x, w, b, eps, unbiased=True)),
                     ("(x - mean) / (sqrt(var) + eps): eps goes inside the square root, rsqrt(var + eps)",
                      lambda: layernorm_reference(x, w, b, eps, eps_inside=False))]
        message = kernels.judge_out(case, obs, op, expected, x.dtype)
        if getattr(message, "stage", None) != "mismatch":
            return message
        mistake = matching_variant(obs["out"], wrong, tensor_match(x.dtype))
        if mistake:
            return message + f"\n  Your output matches {mistake}."
        if inp["kind"] == "fp16_long":
            what = "sum of squares" if op == "rmsnorm" else "row sum"
            message += (f"\n  These float16 rows have a {what} far above float16's maximum (65504): a sum kept in "
                        "float16 overflows to inf.")
        if inp["kind"] == "eps" and torch.isnan(obs["out"]).any():
            message += "\n  A constant row has zero variance: eps inside the square root keeps it finite."
        if inp["kind"] == "wide":
            message += _wide_note(case)
        message += _row_pad_note(case)
        if x.dtype == torch.float16:
            message += _FP16_NOTE
        return message
    return judge


RMSNORM_FORWARD = Exercise("rmsnorm_forward", 2, ("rmsnorm",), _norm_cases("rmsnorm"), partial(RUN._norm_run,
                                                                                               "rmsnorm"),
                           _norm_judge("rmsnorm"), title="RMSNorm forward",
                           hint="Pass 1: sum of x*x in float32 over the row's blocks; rstd = 1 / sqrt(sum / N + eps). "
                                "Pass 2: store x * rstd * weight in x's dtype.")
LAYERNORM_FORWARD = Exercise("layernorm_forward", 3, ("layernorm",), _norm_cases("layernorm"),
                             partial(RUN._norm_run, "layernorm"), _norm_judge("layernorm"), title="LayerNorm forward",
                             hint="Accumulate in float32. mean = sum(x) / N; var = sum((x - mean)^2) / N "
                                  "(biased, as F.layer_norm); rstd = 1 / sqrt(var + eps); "
                                  "y = (x - mean) * rstd * weight + bias.")


# --- 5. stretch: RMSNorm backward ------------------------------------------------------------------

def rmsnorm_backward_reference(x, weight, dy, eps):
    """(dx, dweight) of y = rmsnorm(x, weight, eps) for the upstream gradient dy, by float64 autograd."""
    x64 = x.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    y = x64 / torch.sqrt((x64 * x64).mean(dim=1, keepdim=True) + eps) * w64
    dx, dw = torch.autograd.grad(y, (x64, w64), dy.double())
    return dx, dw


def _rms_bwd_cases(gen, public):
    if public:
        specs = [(1, 1, None, "float32", "tiny"), (6, 7, None, "float32", "tiny"),
                 (5, 1500, 256, "float32", "wide"), (40, 256, None, "float32", "normal"),
                 (3, 3000, 1024, "float16", "fp16_long"), (4, 200, 64, "float32", "eps"),
                 (4, 100, None, "float32", "padded")]
    else:  # every rule, random sizes; blocked rows never a multiple of the block
        b_wide = choice(gen, [128, 256])
        specs = [(randint(gen, 1, 8), randint(gen, 1, 9), None, "float32", "tiny"),
                 (randint(gen, 20, 50), _not_multiple(gen, 10, 300, 16), None, "float32", "normal"),
                 (randint(gen, 1, 6), _not_multiple(gen, 600, 2500, b_wide), b_wide, "float32", "wide"),
                 (randint(gen, 2, 3), _not_multiple(gen, 1500, 3000, 1024), 1024, "float16", "fp16_long"),
                 (randint(gen, 2, 5), _not_multiple(gen, 30, 200, 16), None, "float32", "eps"),
                 (randint(gen, 2, 5), _not_multiple(gen, 30, 200, 16), None, "float32", "padded")]
    cases = []
    for M, N, block_n, dtype, kind in specs:
        dt = getattr(torch, dtype)
        x = _norm_x(gen, M, N, dt, kind, "rmsnorm")
        eps = 0.1 if kind == "eps" else 1e-6
        w = (1 + randn(gen, N, scale=0.5)).to(dt)
        dy = randn(gen, M, N).to(dt)
        blk = "" if block_n is None else f", BLOCK_N={block_n}"
        what = "" if kind == "normal" else _NORM_KINDS[kind]
        inputs = dict(x=x, weight=w, dy=dy, eps=eps, block_n=block_n, kind=kind)
        if kind == "padded":  # x and dy padded differently: each needs its own row stride
            inputs["row_pad"], inputs["dy_row_pad"] = (5, 21) if public else (randint(gen, 1, 20), randint(gen, 21, 40))
            what = ": x and dy row-padded views with different row strides"
        cases.append(Case(f"({M}, {N}) {dtype}, eps={eps:g}{blk}{what or ': many rows for dweight'}", inputs))
    return cases


def _rms_bwd_judge(case, obs):
    inp = case.inputs
    x, w, dy, eps = inp["x"], inp["weight"], inp["dy"], inp["eps"]
    dx_ref, dw_ref = rmsnorm_backward_reference(x, w, dy, eps)
    task = "compute dx and dweight with your @triton.jit kernels, not with PyTorch autograd or operations"
    returns = ("rmsnorm_backward must write into `out = (dx, dweight)` when it is given and return that pair (the "
               "check passes buffers pre-filled with NaN).")
    verdict = (kernels.launch_verdict(obs, "rmsnorm_backward", task)
               or kernels.outside_verdict(obs, "rmsnorm_backward",
                                          lambda o: compare(o["dx"], dx_ref, dtype=x.dtype) is None
                                          and compare(o["dweight"], dw_ref, dtype=w.dtype) is None)
               or kernels.bounds_verdict(obs) or kernels.return_verdict(obs, "rmsnorm_backward", returns))
    if verdict:
        return verdict
    x64, dy64, w64 = x.double(), dy.double(), w.double()
    rstd = 1 / torch.sqrt((x64 * x64).mean(dim=1, keepdim=True) + eps)  # (M, 1)
    report = compare(obs["dx"], dx_ref, dtype=x.dtype, name="dx")
    if report:
        if compare(obs["dx"], rstd * w64 * dy64, dtype=x.dtype) is None:
            report += ("\n  Your dx matches rstd * weight * dy: the gradient through rstd is missing. rstd depends on "
                       "every x of the row: dx = rstd * (w*dy - x * rstd^2 * mean(w*dy*x)).")
        elif inp["kind"] == "fp16_long":
            report += ("\n  These float16 rows have a sum of squares far above float16's maximum (65504): "
                       "accumulate in float32.")
        elif inp["kind"] == "wide":
            report += _wide_note(case)
        elif inp["kind"] == "padded":
            n = x.shape[1]
            report += (f"\n  x and dy here are row-padded views with different row strides: x.stride(0) = "
                       f"{n + inp['row_pad']}, dy.stride(0) = {n + inp['dy_row_pad']}, both more than N = {n}. "
                       "Pass each tensor's own stride(0) and offset its rows with it.")
        return report
    report = compare(obs["dweight"], dw_ref, dtype=w.dtype, name="dweight")
    if report:
        mistake = matching_variant(obs["dweight"], [
            ("Your dweight matches sum(dy * x): each row's term needs its rstd, sum(dy * x * rstd).",
             lambda: (dy64 * x64).sum(dim=0)),
            ("Your dweight is the first row's term only: dweight sums dy * x * rstd over all M rows.",
             lambda: (dy64 * x64 * rstd)[0] if x.shape[0] > 1 else None)], tensor_match(w.dtype))
        return report + "\n  " + (mistake or "dweight[j] = sum over rows r of dy[r, j] * x[r, j] * rstd[r] "
                                   "(a reduction down each column).")
    return kernels.final_verdict(case, obs)


RMSNORM_BACKWARD = Exercise("rmsnorm_backward", 2, ("rmsnorm_backward",), _rms_bwd_cases, RUN._rms_bwd_run,
                            _rms_bwd_judge,
                            title="Stretch: RMSNorm backward (dx and dweight)",
                            hint="Kernel 1, one program per row: sum(x*x) and sum(w*dy*x) in one pass, "
                                 "store rstd per row, then dx = rstd * (w*dy - x * rstd^2 * sum(w*dy*x) / N). "
                                 "Kernel 2, one program per block of columns: loop over the rows, "
                                 "accumulating dy * x * rstd[row]; sum over rows at the end.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.bench.gbps", "gpulab.bench.pct_of_peak", "gpulab.bench.tflops",
           "gpulab.peaks.measured_peaks", "gpulab.plots.roofline")
EXERCISES = [offering(ex, OFFERED) for ex in (SOFTMAX_ROWS, SOFTMAX_ONLINE_STATE, RMSNORM_FORWARD, LAYERNORM_FORWARD,
                                          RMSNORM_BACKWARD)]


# --- benchmarks (python -m grader bench) -----------------------------------------------------------

# FLOPs per element, counted as the lesson does: softmax max, subtract, exp, add, multiply;
# RMSNorm square-add, multiply by rstd, by weight; LayerNorm add, subtract, square-add, rstd, weight, bias.
FLOPS_PER_ELEMENT = {"softmax": 5, "rmsnorm": 4, "layernorm": 7}


def reduction_bytes(op: str, M: int, N: int, dtype_bytes: int) -> int:
    """Minimum bytes moved by one pass of ``op`` over an (M, N) input: read x once, write y once,
    plus the weight (and bias) vectors."""
    vectors = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}[op]
    return (2 * M * N + vectors * N) * dtype_bytes


def _bench_make(op, full_shape):
    def make(device, tiny):
        M, N = (16, 256) if tiny else full_shape
        dtype = torch.float32 if device == "cpu" else torch.float16
        x = torch.randn(M, N, device=device, dtype=dtype)
        d = {"x": x, "out": torch.empty_like(x), "bytes": reduction_bytes(op, M, N, x.element_size()),
             "flops": FLOPS_PER_ELEMENT[op] * M * N}
        if op != "softmax":
            d["weight"] = torch.randn(N, device=device, dtype=dtype)
            d["bias"] = torch.randn(N, device=device, dtype=dtype)
        return d
    return make


def _eager_rmsnorm(d, eps=1e-6):
    x = d["x"]
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * d["weight"]


# Each softmax moves 1 GiB (read + write), as the copy that measures the peak does: a 64 MB softmax
# runs for ~20 us on an H100, too short to compare with a bandwidth measured over 2 GiB.
BENCHMARKS = [
    Benchmark("softmax 65536x4096 fp16 vs torch", "softmax", _bench_make("softmax", (65536, 4096)),
              lambda fn, d: fn(d["x"], out=d["out"]), lambda d: torch.softmax(d["x"], dim=-1)),
    Benchmark("softmax 131072x2048 fp16 vs torch", "softmax", _bench_make("softmax", (131072, 2048)),
              lambda fn, d: fn(d["x"], out=d["out"]), lambda d: torch.softmax(d["x"], dim=-1)),
    Benchmark("rmsnorm 16384x4096 fp16 vs eager", "rmsnorm", _bench_make("rmsnorm", (16384, 4096)),
              lambda fn, d: fn(d["x"], d["weight"], eps=1e-6, out=d["out"]), _eager_rmsnorm),
    Benchmark("rmsnorm 16384x4096 fp16 vs F.rms_norm", "rmsnorm", _bench_make("rmsnorm", (16384, 4096)),
              lambda fn, d: fn(d["x"], d["weight"], eps=1e-6, out=d["out"]),
              lambda d: F.rms_norm(d["x"], (d["x"].shape[1],), d["weight"], 1e-6)),
    Benchmark("layernorm 16384x4096 fp16 vs F", "layernorm", _bench_make("layernorm", (16384, 4096)),
              lambda fn, d: fn(d["x"], d["weight"], d["bias"], eps=1e-5, out=d["out"]),
              lambda d: F.layer_norm(d["x"], (d["x"].shape[1],), d["weight"], d["bias"], 1e-5)),
]
