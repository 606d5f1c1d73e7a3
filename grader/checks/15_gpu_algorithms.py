"""Checks of lab 15, GPU algorithms beyond neural nets: streaming top-K (a heap of k entries, not the stream: Python's
peak allocation on a long stream; batched torch merges; a Triton kernel that computes every row's top k itself, its
wrapper running no PyTorch op but allocation and views, rows x.stride(0) apart; exact on ties: the lower index wins,
across chunk boundaries, -0.0 equal to 0.0; values in the input's dtype), k-means with distances as one matmul (equal
to a reference assignment, ties to the lower centroid, never the (N, K, D) differences; Lloyd's iterations from a
seeded start) and its roofline cost, recall@k (true neighbours past the k-th ignored), an IVF index built from the
k-means, gradient-boosted trees' histograms and best split, and a prefetching loop's transfer contract (read from a
recording of its calls, gpulab.prefetch: each batch pinned once, before or in the loop; no pinned buffer rewritten
while a copy may read it; the wait on the copy stream). Across GPUs: a top-K over shards on real gloo ranks (shards by
torch.tensor_split's rule, global indices, an all-gather of p k candidates or a binomial merge tree of ceil(log2 p)
rounds, the bytes of candidates each rank received; one launch per case, several score vectors in it, and a one-rank
probe first so that a stub or an answer returning no top-k starts no ranks), and a multi-GPU IVF latency model (shard
or replicate: host transfers, the slowest shard's probe, the merge; every term compared). Wrong answers are named by
the mistake they match. Hidden cases: one per rule, the same rules on every seed, named by their inputs alone and
shuffled (grader.kit.neutral).
"""
from __future__ import annotations

import torch

from gpulab.compare import compare
from gpulab.peaks import Peaks
from grader.exercise import Benchmark, Case, Exercise
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.kernels import judge_kernel, torch_ops_verdict
from grader.kit.neutral import neutral
from grader.kit.variants import diagnose
from grader.runs import run_side

LAB = "15_gpu_algorithms"
RUN = run_side(LAB)  # the learner side: grader/runs/15_gpu_algorithms.py
TITLE = "GPU algorithms: top-K, k-means, vector search, trees, pipelines"

_YOURS_IS, _YOURS_COUNTS = "\n  Yours is {}.", "\n  Yours counts {}."


def _ints(gen, *shape, lo=0, hi=3) -> torch.Tensor:
    """Small whole numbers as float32: many exact ties, and sums and products computed exactly."""
    return torch.randint(lo, hi + 1, shape, generator=gen).float()


def ref_topk(values: torch.Tensor, k: int, *, ties: str = "lower") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of each row of ``values`` (R, N): (values, indices), largest first, equal values by index
    (``ties="lower"``: the lower index first, the rule; ``"higher"``: the mistake)."""
    n = values.shape[1]
    flipped = values.flip(1) if ties == "higher" else values
    order = torch.sort(flipped, dim=1, descending=True, stable=True).indices[:, :k]
    idx = (n - 1 - order) if ties == "higher" else order
    return values.gather(1, idx), idx


def _tie_note(got_v, got_i, want_v, want_i) -> str | None:
    """The values are right and the indices differ only among equal values: the tie rule."""
    if got_v.shape == want_v.shape and torch.equal(got_v, want_v) and not torch.equal(got_i, want_i):
        return ("\n  Your values are right, but the indices differ among equal values: the lower index must win (first "
                "in the result, and the place at the k-th value). torch.topk does not promise which of equal values "
                "it returns; sort stably, or make the keys unique (value, then index) before topk.")
    return None


def _chunked_name(rule, sizes, k, extra=""):
    sizes = f"{len(sizes)} x [{sizes[0]}]" if len(set(sizes)) == 1 and len(sizes) > 4 else sizes
    return f"{rule}{': ' if rule else ''}chunks of {sizes} columns, k={k}{extra}"


# --- exercise 1: streaming top-K with a heap (CPU) -------------------------------------------------------------

# What a heap of k entries and the chunk at hand may take in Python objects: a (value, index) pair with its two
# numbers is under 200 bytes; the slack covers the interpreter's own allocations. A list of the whole stream needs
# more than 10x that in the long cases.
HEAP_BYTES, HEAP_SLACK = 200, 200_000


def _heap_cases(gen, public):
    def case(rule, sizes, k, values):
        return Case(_chunked_name(rule, sizes, k), dict(chunks=list(values.split(sizes)), k=k))

    if public:
        return [case("", [5, 5, 5], 4, _ints(gen, 15, hi=2)), case("", [3, 4, 2, 6], 6, _ints(gen, 15, hi=3)),
                case("", [8], 3, randn(gen, 8)), case("", [4, 4], 8, _ints(gen, 8, lo=-2, hi=1)),
                case("", [500] * 30, 5, randn(gen, 15000))]
    small = [randint(gen, 1, 4) for _ in range(randint(gen, 4, 7))]
    return [case("ties at the k-th place", [6, 6, 6], randint(gen, 2, 5), _ints(gen, 18, hi=2)),
            case("k wider than a chunk", small, randint(gen, max(small) + 1, sum(small)), _ints(gen, sum(small), hi=5)),
            case("distinct values", [7, 9, 5], randint(gen, 1, 6), randn(gen, 21)),
            case("negative values", [5, 5], randint(gen, 2, 6), _ints(gen, 10, lo=-4, hi=-1)),
            case("the whole stream", [3, 3], 6, _ints(gen, 6, hi=1)),
            case("a long stream", [500] * 30, randint(gen, 3, 8), randn(gen, 15000))]


def _heap_judge(case, obs):
    chunks, k = case.inputs["chunks"], case.inputs["k"]
    if "bad" in obs:
        return f"heap_topk must return a list of (value, index) pairs, got {obs['bad']}."
    values = torch.cat(chunks)[None]
    want = [(float(v), int(i)) for v, i in zip(*(t[0] for t in ref_topk(values, k)))]
    got = [tuple(p) for p in obs["pairs"]]
    if got == want:
        n, widest = sum(len(c) for c in chunks), max(len(c) for c in chunks)
        if obs["kept"] or obs["peak"] > HEAP_BYTES * (k + widest) + HEAP_SLACK and n > 4 * widest:
            return (f"heap_topk held the stream ({n} values), not a heap of k = {k} entries: Python allocated "
                    f"{obs['peak'] / 1e6:.1f} MB at its peak (a list of every value, or every chunk kept). Keep only "
                    "the k best (value, -index) so far, and go through each chunk as it arrives.")
        return None
    widest = max(len(c) for c in chunks)
    if got and all(0 <= i < widest for _, i in got) and any(i >= widest for _, i in want):
        return (f"heap_topk returned indices {[i for _, i in got]}, all below the widest chunk's length ({widest}): "
                "they are counted inside each chunk. Add the chunk's offset (the number of values before it).")
    variants = [
        ("the higher index winning ties: a min-heap of (value, index) evicts the lower index first; push (value, "
         "-index)", [(float(v), int(i)) for v, i in zip(*(t[0] for t in ref_topk(values, k, ties="higher")))]),
        ("the pairs smallest first: return them largest first", want[::-1])]
    return diagnose(f"heap_topk returned {got[:8]}{' ...' if len(got) > 8 else ''}, expected {want[:8]}"
                    f"{' ...' if len(want) > 8 else ''} (value descending; equal values: the lower index first).",
                    got, variants, lambda a, b: a == b, _YOURS_IS.replace("is", "has"))


HEAP_TOPK = Exercise("heap_topk", 2, ("heap_topk",), neutral(_heap_cases), RUN._heap_run, _heap_judge,
                     title="Streaming top-K on the CPU: a heap of k entries",
                     hint="Keep a min-heap of k entries (value, -index): its root is the one to evict next (the "
                          "smallest value; among equal values the higher index). Offset each chunk's indices by the "
                          "values before it; return sorted(heap, reverse=True) as (value, index).")


# --- exercise 2: streaming top-K with batched torch merges ---------------------------------------------------------

def _signed_zeros(gen, rows, cols) -> torch.Tensor:
    """A few ones among 0.0 and -0.0 (equal values: the lower column wins whatever the sign)."""
    ones = (torch.rand(rows, cols, generator=gen) < 0.25).float()
    negative = torch.rand(rows, cols, generator=gen) < 0.5
    return torch.where(negative & (ones == 0), torch.full_like(ones, -0.0), ones)


def _stream_cases(gen, public):
    def case(rule, rows, sizes, k, values):
        return Case(_chunked_name(rule, sizes, k, f", {rows} rows"), dict(chunks=list(values.split(sizes, 1)), k=k))

    if public:
        return [case("", 3, [6, 6, 6], 5, _ints(gen, 3, 18, hi=3)), case("", 2, [2, 3, 2], 5, _ints(gen, 2, 7, hi=2)),
                case("", 4, [16, 16], 4, randn(gen, 4, 32)), case("", 1, [5, 1, 5], 3, _ints(gen, 1, 11, lo=-3, hi=0)),
                case("", 2, [4, 4, 4], 8, _signed_zeros(gen, 2, 12))]
    sizes = [randint(gen, 1, 4) for _ in range(randint(gen, 3, 6))]
    return [case("ties at the k-th place", 4, [8, 8, 8], randint(gen, 3, 7), _ints(gen, 4, 24, hi=2)),
            case("ties across chunk boundaries", 3, sizes, randint(gen, max(sizes) + 1, sum(sizes)),
                 _ints(gen, 3, sum(sizes), hi=1)),
            case("distinct values", 3, [12, 9, 15], randint(gen, 1, 8), randn(gen, 3, 36)),
            case("negative values", 2, [5, 5, 5], randint(gen, 2, 6), _ints(gen, 2, 15, lo=-5, hi=-1)),
            case("one chunk", 2, [10], randint(gen, 1, 10), _ints(gen, 2, 10, hi=4)),
            case("zeros of both signs", 2, [4, 4, 4], randint(gen, 6, 10), _signed_zeros(gen, 2, 12))]


def _pair_judge(case, obs, name, values, k):
    """Values and indices against the reference, the classic mistakes named."""
    if "bad" in obs:
        return f"{name} must return (values, indices), got {obs['bad']}."
    want_v, want_i = ref_topk(values, k)
    got_v, got_i = obs["values"], obs["indices"]
    if not isinstance(got_i, torch.Tensor) or got_i.dtype != torch.int64:
        return f"{name}: indices must be an int64 tensor, got {getattr(got_i, 'dtype', type(got_i).__name__)}."
    if not isinstance(got_v, torch.Tensor) or got_v.dtype != values.dtype:
        return f"{name}: values must be {values.dtype} like the input, got {getattr(got_v, 'dtype', type(got_v))}."
    if tuple(got_v.shape) != tuple(want_v.shape) or tuple(got_i.shape) != tuple(want_i.shape):
        return f"{name}: values {tuple(got_v.shape)} and indices {tuple(got_i.shape)}, expected (rows, k) = " \
               f"{tuple(want_v.shape)}."
    report = compare(got_v.float(), want_v, dtype=torch.float32, name="values")
    if report is None and torch.equal(got_i, want_i):
        return None
    report = report or compare(got_i.double(), want_i.double(), atol=0, rtol=0, name="indices")
    higher_v, higher_i = ref_topk(values, k, ties="higher")
    return diagnose(report, (got_v, got_i), [("the higher index winning ties", (higher_v, higher_i))],
                    lambda a, b: torch.equal(a[0].float(), b[0]) and torch.equal(a[1], b[1]),
                    "\n  Yours matches {} instead.") + (_tie_note(got_v.float(), got_i, want_v, want_i) or "")


def _stream_judge(case, obs):
    chunks, k = case.inputs["chunks"], case.inputs["k"]
    values = torch.cat(chunks, 1)
    if "bad" not in obs and isinstance(obs["indices"], torch.Tensor) and obs["indices"].shape == (values.shape[0], k):
        widest, want_i = max(c.shape[1] for c in chunks), ref_topk(values, k)[1]
        if obs["indices"].max() < widest <= want_i.max() and not torch.equal(obs["indices"], want_i):
            return ("streaming_topk returned column indices counted inside each chunk (all below the widest chunk's "
                    "width): add the chunk's offset, the number of columns before it.")
    verdict = _pair_judge(case, obs, "streaming_topk", values, k)
    if verdict is None and obs["kept"] > 0:
        return (f"streaming_topk kept {obs['kept']} chunk(s) alive besides the current one: a streaming top-k holds "
                "only its running (rows, k) values and indices and the chunk at hand (no list of all chunks, no "
                "torch.cat of the whole stream).")
    return verdict


STREAMING_TOPK = Exercise("streaming_topk", 3, ("streaming_topk",), neutral(_stream_cases), RUN._stream_run,
                          _stream_judge, title="Streaming top-K in batches: torch.topk merges, exact on ties",
                          hint="Keep running (R, k) values and global column indices; for each chunk, concatenate "
                               "them with the chunk (indices offset + arange(C)) and keep the top k. torch.topk may "
                               "return any of equal values: make the keys unique (the float's bits as an ordered int, "
                               "shifted left 32, then 0xFFFFFFFF - index) or use torch.sort(stable=True).")


# --- exercise 3: per-row top-K in a Triton kernel ---------------------------------------------------------------

def _kernel_cases(gen, public):
    def case(rule, r, n, k, values, pad=0):
        wide = f", rows {n + pad} apart (a slice of a wider tensor)" if pad else ""
        return Case(f"{rule}{': ' if rule else ''}{r} rows x {n} columns, k={k}{wide}", dict(x=values, k=k, pad=pad))

    if public:
        return [case("", 4, 64, 4, _ints(gen, 4, 64, hi=3)), case("", 3, 100, 5, randn(gen, 3, 100)),
                case("", 2, 37, 1, _ints(gen, 2, 37, lo=-3, hi=0)), case("", 5, 20, 8, _ints(gen, 5, 20, hi=1)),
                case("", 3, 24, 3, randn(gen, 3, 24), pad=8)]
    n, odd = randint(gen, 50, 300), 2 * randint(gen, 20, 60) + 1
    return [case("ties", 3, n, randint(gen, 3, 8), _ints(gen, 3, n, hi=2)),
            case("a width that is not a power of two", 3, odd, randint(gen, 2, 8), randn(gen, 3, odd)),
            case("k = 1", 4, 90, 1, randn(gen, 4, 90)),
            case("negative values", 3, 48, randint(gen, 2, 8), _ints(gen, 3, 48, lo=-6, hi=-1)),
            case("k close to the width", 2, 9, randint(gen, 6, 9), _ints(gen, 2, 9, hi=3)),
            case("rows of a wider tensor", 3, 40, randint(gen, 2, 6), randn(gen, 3, 40), pad=randint(gen, 1, 24))]


def triton_block(n: int) -> int:
    """The block a one-program-per-row kernel loads: triton.next_power_of_2(n)."""
    return 1 << (n - 1).bit_length()


def _kernel_judge(case, obs):
    x, k = case.inputs["x"], case.inputs["k"]
    n_cols = x.shape[1]
    if obs["own_launches"]:  # a kernel that copies or does a share (one row, the maximum), PyTorch the rest
        verdict = torch_ops_verdict(obs["torch_ops"], "topk_rows", "every row's top k (values, indices and "
                                    "the tie rule) is computed in your kernel")
        if verdict:
            return verdict

    def check(outputs):
        got = {"values": outputs.get("values"), "indices": outputs.get("indices")}
        if got["values"] is None or got["indices"] is None:
            return "topk_rows must fill both `values` and `indices`."
        report = _pair_judge(case, got, "topk_rows", x, k)
        unwritten = got["values"].isnan().all(1).nonzero()[:, 0].tolist()
        if report and unwritten:
            report += (f"\n  Rows {unwritten} of `values` were never written (still the poison): launch one program "
                       "per row, grid (R,), and index the row with tl.program_id(0).")
        elif report and case.inputs.get("pad"):
            report += (f"\n  This input's rows are x.stride(0) = {n_cols + case.inputs['pad']} elements apart, not "
                       f"N = {n_cols}: if your kernel assumes N, pass x.stride(0) and use it for the row offset.")
        elif report and n_cols < triton_block(n_cols) and bool((x < 0).any()):
            zeros = torch.cat([x, torch.zeros(x.shape[0], triton_block(n_cols) - n_cols)], 1)
            v, _ = ref_topk(zeros, k)
            if torch.equal(got["values"], v):
                report += ("\n  Your values match the row padded with zeros: a masked load's `other` must be "
                           "-inf, or the padding beats negative values.")
        return report

    return judge_kernel(case, obs, "topk_rows", check,
                        returns="topk_rows must write into `values` and `indices` when they are given, and return "
                                "(values, indices) (the check passes buffers pre-filled with poison).")


TOPK_KERNEL = Exercise("topk_kernel", 4, ("topk_rows",), neutral(_kernel_cases), RUN._kernel_run, _kernel_judge,
                       title="Triton: per-row top-K for a small K",
                       hint="One program per row: load the row (masked, other=-inf); K times: m = max(x); i = "
                            "min(where(x == m, cols, BLOCK_N)) (the lowest column holding it); store m and i; x = "
                            "where(cols == i, -inf, x). tl.static_range(K) unrolls the loop.")


# --- exercise 4: the k-means assignment as one matmul -------------------------------------------------------------

def ref_assign(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, squared distances) in float64, from the differences themselves; ties to the lower centroid."""
    d2 = ((x.double()[:, None] - c.double()[None]) ** 2).sum(-1)   # (N, K)
    labels = d2.argmin(1)
    return labels, d2.gather(1, labels[:, None])[:, 0]


def _assign_cases(gen, public):
    def case(rule, x, c):
        return Case(f"{rule}{': ' if rule else ''}{x.shape[0]} points, {c.shape[0]} centroids, {x.shape[1]} dims",
                    dict(x=x, c=c))

    if public:
        return [case("", _ints(gen, 40, 3, lo=-3, hi=3), _ints(gen, 5, 3, lo=-3, hi=3)),
                case("", randn(gen, 64, 8), randn(gen, 6, 8)), case("", randn(gen, 30, 2, scale=5), randn(gen, 1, 2))]
    return [case("exact ties", _ints(gen, 60, 2, lo=-2, hi=2), _ints(gen, randint(gen, 4, 8), 2, lo=-2, hi=2)),
            case("float points", randn(gen, randint(gen, 50, 200), 16), randn(gen, randint(gen, 3, 12), 16)),
            case("points far from the origin", randn(gen, 80, 4) + 20, randn(gen, 5, 4) + 20),
            case("one centroid", randn(gen, 20, 3), randn(gen, 1, 3))]


def _labels_verdict(name, got, x, c, exact: bool):
    """None if ``got`` are nearest-centroid labels (exactly the reference's where the data is whole numbers; within
    float32 rounding of the nearest otherwise), else a message naming the mistake."""
    want, best = ref_assign(x, c)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.int64:
        return (f"{name}: labels must be an int64 tensor of shape {tuple(want.shape)}, got "
                f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}.")
    if got.min() < 0 or got.max() >= c.shape[0]:
        return f"{name}: labels outside 0..{c.shape[0] - 1}."
    d2 = ((x.double()[:, None] - c.double()[None]) ** 2).sum(-1)
    theirs = d2.gather(1, got[:, None])[:, 0]
    norms = (x.double() ** 2).sum(1) + (c.double() ** 2).sum(1).max()   # what the matmul form cancels
    slack = 0 if exact else 1e-5 * (norms + 1)                          # float32 rounding of it
    wrong = (theirs > best + slack) | (exact and (got != want))
    if not bool(wrong.any()):
        return None
    i = int(wrong.nonzero()[0, 0])
    xd, cd = x.double(), c.double()
    cross = xd @ cd.T
    variants = [("the farthest centroid (argmax instead of argmin)", d2.argmax(1)),
                ("||x||^2 + 2 x.c + ||c||^2: the cross term's sign flipped (it is -2 x.c)",
                 ((xd * xd).sum(1, keepdim=True) + 2 * cross + (cd * cd).sum(1)).argmin(1)),
                ("-2 x.c alone: the ||c||^2 term is missing (only ||x||^2 may be dropped for the argmin)",
                 (-2 * cross).argmin(1)),
                ("ties going to the higher centroid: argmin returns the first minimum, keep it",
                 c.shape[0] - 1 - d2.flip(1).argmin(1))]
    return diagnose(f"{name}: point {i} {x[i].tolist()} is labelled {int(got[i])} (squared distance "
                    f"{float(theirs[i]):.6g}), but centroid {int(want[i])} is nearer or equally near with a lower "
                    f"index (squared distance {float(best[i]):.6g}).", got, variants, lambda a, b: torch.equal(a, b),
                    "\n  Your labels match {} instead.")


def _assign_judge(case, obs):
    x, c = case.inputs["x"], case.inputs["c"]
    if "bad" in obs:
        return f"kmeans_assign must return (labels, dist2), got {obs['bad']}."
    (n, d), k = x.shape, c.shape[0]
    numel, op, shape = obs["biggest"]
    if k > 1 and d > 1 and numel >= n * k * d:  # the matmul form's biggest tensor is (N, K)
        return (f"kmeans_assign built a {tuple(shape)} tensor ({op}): the differences of every point with every "
                "centroid, K times the data. Expand ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2: the cross terms are one "
                "matmul x @ c.T, (N, K).")
    exact = bool((x == x.round()).all() and (c == c.round()).all())
    verdict = _labels_verdict("kmeans_assign", obs["labels"], x, c, exact)
    if verdict:
        return verdict
    labels, best = ref_assign(x, c)
    scale = float((x.double() ** 2).sum(1).max() + (c.double() ** 2).sum(1).max())
    report = compare(obs["dist2"], best, dtype=torch.float32, atol=1e-5 * scale + 1e-5, rtol=1e-4, name="dist2")
    sq_x = (x.double() ** 2).sum(1)
    return diagnose(report, obs["dist2"], [
        ("the distances without ||x||^2: the argmin does not need it, the distances do", best - sq_x),
        ("distances, not squared distances", best.sqrt())],
        lambda a, b: compare(a, b, dtype=torch.float32, atol=1e-5 * scale + 1e-5, rtol=1e-4) is None,
        "\n  Your dist2 matches {} instead.")


KMEANS_ASSIGN = Exercise("kmeans_assign", 3, ("kmeans_assign",), neutral(_assign_cases), RUN._assign_run, _assign_judge,
                         title="k-means: the assignment as one matmul",
                         hint="d2 = (x * x).sum(1, keepdim=True) - 2 * x @ c.T + (c * c).sum(1) (N, K); labels = "
                              "d2.argmin(1) (the first minimum: the lower centroid); dist2 = d2 at the labels, "
                              "clamped at 0.")


# --- exercise 5: Lloyd's iterations from a seeded start ---------------------------------------------------------------

def ref_kmeans(x, k, iters, seed, *, init="seeded", update="mean"):
    """Lloyd's k-means in float64 (the rule), with knobs for the classic mistakes."""
    xd = x.double()
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    c = xd[perm[:k]].clone() if init == "seeded" else xd[:k].clone()
    for _ in range(iters):
        labels = ref_assign(xd, c)[0]
        sums = torch.zeros_like(c).index_add_(0, labels, xd)
        counts = torch.bincount(labels, minlength=k)
        if update == "sum":
            c = torch.where(counts[:, None] > 0, sums, c)
        else:
            c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
    return c, ref_assign(xd, c)[0]


def _lloyd_cases(gen, public):
    def blobs(n, d, centers, spread=0.2):
        mu = randn(gen, centers, d, scale=3)
        return mu[torch.arange(n) % centers] + randn(gen, n, d, scale=spread)

    def case(rule, x, k, iters, seed):
        return Case(f"{rule}{': ' if rule else ''}{x.shape[0]} points in {x.shape[1]} dims, k={k}, {iters} "
                    f"iterations, seed {seed}", dict(x=x, k=k, iters=iters, seed=seed))

    def empty(seed):  # two starting centroids on one point: the higher one never gets a point
        x = blobs(60, 2, 3)
        perm = torch.randperm(60, generator=torch.Generator().manual_seed(seed))
        x[perm[1]] = x[perm[0]]
        return case("an empty cluster", x, 4, 3, seed)

    if public:
        return [case("", randn(gen, 100, 2), 4, 2, 0), case("", blobs(120, 8, 4), 4, 3, 7), empty(1)]
    return [case("separated blobs", blobs(randint(gen, 60, 150), randint(gen, 2, 8), 4), 4, randint(gen, 2, 6),
                 randint(gen, 0, 999)),
            empty(randint(gen, 0, 999)),
            case("no iteration", blobs(40, 3, 3), 3, 0, randint(gen, 0, 999)),
            case("overlapping clusters", randn(gen, randint(gen, 60, 120), 2), randint(gen, 3, 6), 2,
                 randint(gen, 0, 999)),
            case("more centroids than blobs", blobs(80, 2, 2), 5, 4, randint(gen, 0, 999))]


def _lloyd_judge(case, obs):
    x, k, iters, seed = (case.inputs[n] for n in ("x", "k", "iters", "seed"))
    if "bad" in obs:
        return f"kmeans must return (centroids, labels), got {obs['bad']}."
    want, _ = ref_kmeans(x, k, iters, seed)
    got = obs["centroids"]
    if isinstance(got, torch.Tensor) and got.is_floating_point() and bool(got.isnan().any()):
        return ("kmeans returned NaN centroids: a cluster with no point divides 0 by 0. An empty cluster keeps its "
                "centroid (torch.where(counts > 0, sums / counts.clamp_min(1), c)).")
    tol = dict(atol=1e-4, rtol=1e-4, dtype=torch.float32)
    report = compare(got, want, name="centroids", **tol)
    if report:
        return diagnose(report, got, [
            ("a start from the first k points: start from x[randperm(N, generator=torch.Generator().manual_seed(seed))"
             "[:k]]", lambda: ref_kmeans(x, k, iters, seed, init="first")[0]),
            ("centroids moved to the sum of their points, not the mean", lambda: ref_kmeans(x, k, iters, seed,
                                                                                         update="sum")[0]),
            ("one iteration fewer", lambda: ref_kmeans(x, k, max(iters - 1, 0), seed)[0]),
            ("one iteration more", lambda: ref_kmeans(x, k, iters + 1, seed)[0])],
            lambda a, b: compare(a, b, **tol) is None, "\n  Your centroids match {} instead.")
    verdict = _labels_verdict("kmeans", obs["labels"], x, got.double(), exact=False)
    if verdict and isinstance(obs["labels"], torch.Tensor) and iters > 0 and \
            torch.equal(obs["labels"], ref_assign(x, ref_kmeans(x, k, iters - 1, seed)[0])[0]):
        return "kmeans returned the labels of the last assignment, before the final update: assign once more to " \
               "the returned centroids."
    return verdict


KMEANS = Exercise("kmeans_lloyd", 2, ("kmeans",), neutral(_lloyd_cases), RUN._lloyd_run, _lloyd_judge,
                  title="k-means: Lloyd's iterations from a seeded start",
                  hint="c = x[randperm(N, generator=Generator().manual_seed(seed))[:k]]; each iteration: labels = "
                       "kmeans_assign(x, c)[0]; sums = zeros(K, D).index_add_(0, labels, x); counts = bincount(labels, "
                       "minlength=K); c = where(counts > 0, sums / counts, c). Return c and kmeans_assign(x, c)[0].")


# --- exercise 6: the assignment step on the roofline ------------------------------------------------------------

def ref_step_cost(n, k, d, dtype_bytes, fused, peaks: Peaks) -> dict:
    flops = 2 * n * k * d
    nbytes = (n * d + k * d) * dtype_bytes + 8 * n + (0 if fused else 8 * n * k)
    t_c, t_m = flops / (peaks.matmul_tflops * 1e12), nbytes / (peaks.copy_gbps * 1e9)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "seconds": max(t_c, t_m),
            "bound": "compute" if t_c > t_m else "memory"}


def _cost_cases(gen, public):
    h100 = Peaks("cuda", "H100 datasheet", 3350.0, 989.0, "float16", 0, 0)

    def case(rule, n, k, d, nb, fused, peaks=h100):
        return Case(f"{rule}{': ' if rule else ''}n={n} k={k} d={d}, {nb} B/value, {'fused' if fused else 'unfused'}; "
                    f"peaks {peaks.matmul_tflops:g} TFLOP/s, {peaks.copy_gbps:g} GB/s",
                    dict(n=n, k=k, d=d, dtype_bytes=nb, fused=fused, peaks=dict(peaks.__dict__)))

    def peaks():
        return Peaks("cuda", "a GPU", round(uniform(gen, 500, 4000)), round(uniform(gen, 50, 1000)), "float16", 0, 0)

    if public:
        return [case("", 10**6, 1024, 128, 2, True), case("", 10**6, 1024, 128, 2, False),
                case("", 10**6, 16, 128, 4, True), case("", 10**5, 4096, 64, 2, False, peaks())]
    n = lambda: 1000 * randint(gen, 10, 10000)  # noqa: E731
    return [case("few centroids", n(), randint(gen, 2, 32), choice(gen, [32, 64, 128]), 2, True, peaks()),
            case("many centroids, fused", n(), randint(gen, 1024, 65536), choice(gen, [64, 128, 256]), 2, True,
                 peaks()),
            case("distances in memory", n(), randint(gen, 256, 8192), choice(gen, [64, 128]), 2, False, peaks()),
            case("float32 data", n(), randint(gen, 64, 4096), choice(gen, [16, 96, 768]), 4, choice(gen, [True, False]),
                 peaks())]


def _cost_judge(case, obs):
    x = case.inputs
    n, k, d, nb, fused, peaks = x["n"], x["k"], x["d"], x["dtype_bytes"], x["fused"], Peaks(**x["peaks"])
    if "bad" in obs:
        return f"kmeans_step_cost must return a dict with flops, bytes, intensity, seconds and bound; got {obs['bad']}."
    want = ref_step_cost(n, k, d, nb, fused, peaks)
    missing = [key for key in want if key not in obs]
    if missing:
        return f"kmeans_step_cost's dict lacks {', '.join(missing)}."
    base = (n * d + k * d) * nb
    expected = {
        "flops": (f"2 n k d = {want['flops']:.6g} (a multiply and an add per term of every point-centroid dot "
                  "product).", [("one FLOP per multiply-add: a multiply and an add are 2 FLOPs", n * k * d)],
                  _YOURS_COUNTS),
        "bytes": (f"{want['bytes']:.6g}: x and c once ({base:.4g}), 8 n for the int64 labels" +
                  ("." if fused else f", and the (n, k) float32 distances written and read back ({8 * n * k:.4g})."), [
                      ("the distance matrix, but the kernel is fused: the distances stay on chip",
                       base + 8 * n + 8 * n * k),
                      ("the distance matrix written but not read back (the argmin reads it)", base + 8 * n + 4 * n * k),
                      ("no labels: the int64 labels are written (8 bytes per point)", want["bytes"] - 8 * n),
                      ("the data in float32 whatever dtype_bytes says", want["bytes"] - base + (n * d + k * d) * 4)],
                  _YOURS_COUNTS),
        "intensity": (f"flops / bytes = {want['intensity']:.6g} FLOP/B.", [], _YOURS_IS),
        "seconds": (f"max(flops / peak FLOP/s, bytes / peak bytes/s) = {want['seconds']:.6g}.",
                    [("the sum of the two times: on the roofline the step takes the longer one",
                      want["flops"] / (peaks.matmul_tflops * 1e12) + want["bytes"] / (peaks.copy_gbps * 1e9))],
                    _YOURS_IS)}
    for key, (text, variants, template) in expected.items():
        if not close(obs[key], want[key]):
            return diagnose(f"{key} = {obs[key]!r}, expected {text}", obs[key], variants, close, template)
    if obs["bound"] != want["bound"]:
        return (f"bound = {obs['bound']!r}, expected {want['bound']!r}: intensity {want['intensity']:.1f} FLOP/B vs "
                f"the ridge {peaks.ridge_point:.1f} FLOP/B.")
    return None


KMEANS_COST = Exercise("kmeans_roofline", 2, ("kmeans_step_cost",), neutral(_cost_cases), RUN._cost_run, _cost_judge,
                       title="k-means on the roofline: FLOPs, bytes, intensity",
                       hint="flops = 2 n k d; bytes = (n d + k d) dtype_bytes + 8 n (+ 2 x 4 n k unfused: the "
                            "float32 distances written, then read by the argmin); seconds = max(flops / (TFLOP/s "
                            "1e12), bytes / (GB/s 1e9)); bound: the larger time.")


# --- exercise 7: recall@k -----------------------------------------------------------------------------------------

def _recall_cases(gen, public):
    def case(rule, found, truth, k):
        return Case(f"{rule}{': ' if rule else ''}{found.shape[0]} queries, {found.shape[1]} returned each, k={k}",
                    dict(found=found, truth=truth, k=k))

    def draw(q, m, k, pad=0, dup=False, hit=0.6, beyond=False):
        """``beyond``: some returned ids are true neighbours past the k-th (truth[:, k:]), which recall@k ignores."""
        truth = torch.stack([torch.randperm(50, generator=gen)[:k + 3] for _ in range(q)])
        cols = torch.randint(0, k + 3 if beyond else k, (m,), generator=gen)
        found = torch.where(torch.rand(q, m, generator=gen) < hit, truth[:, cols],
                            torch.randint(50, 99, (q, m), generator=gen))
        found[0, 0] = truth[0, 0]   # at least one hit: a recall of 0 is never right
        if not dup:  # distinct ids per row: replace repeats by ids no query holds
            for row in found:
                seen = set()
                for j, v in enumerate(row.tolist()):
                    row[j] = v if v not in seen else 100 + j
                    seen.add(v)
        if pad:
            found[:, -pad:] = -1
        return found, truth

    if public:
        return [case("", *draw(4, 5, 5, pad=2), 5), case("", *draw(3, 8, 4, beyond=True), 4),
                case("", *draw(5, 6, 6, dup=True), 6)]
    k = randint(gen, 3, 8)
    return [case("-1 padding", *draw(randint(gen, 2, 6), k, k, pad=randint(gen, 1, k - 1)), k),
            case("more returned than k", *draw(randint(gen, 2, 6), k + randint(gen, 2, 5), k), k),
            case("repeated ids", *draw(randint(gen, 2, 6), k, k, dup=True, hit=0.9), k),
            case("truth with more than k columns", *draw(3, k, k, hit=0.6, beyond=True), k)]


def _recall_judge(case, obs):
    found, truth, k = case.inputs["found"], case.inputs["truth"], case.inputs["k"]
    q = found.shape[0]
    hits = (truth[:, :k, None] == found[:, None, :k]).any(-1).sum().item()
    want = hits / (q * k)
    if isinstance(obs["recall"], str):
        return f"recall_at_k must return one number, the mean over all queries and their k true neighbours; got " \
               f"{obs['recall']}."
    if close(obs["recall"], want):
        return None
    top = found[:, :k]
    valid = max(int((top >= 0).sum()), 1)
    counted = sum(v in set(t.tolist()) for r, t in zip(top, truth[:, :k]) for v in r.tolist())  # repeats twice
    every = (truth[:, :k, None] == found[:, None, :]).any(-1).sum().item()
    all_truth = (truth[:, :, None] == found[:, None, :k]).any(-1).sum().item()
    return diagnose(f"recall_at_k = {obs['recall']!r}, expected {want:.6g}: {hits} of the {q} x {k} true neighbours "
                    f"are among the first {k} returned.", obs["recall"], [
                        ("precision: hits over the ids returned (not -1); recall divides by the k true neighbours",
                         hits / valid),
                        (f"hits among all {found.shape[1]} returned ids: recall@k looks at the first k only",
                         every / (q * k)),
                        (f"a denominator of the ids returned ({found.shape[1]} per query), not k",
                         hits / (q * found.shape[1])),
                        ("a repeated id counted twice: count each true neighbour once", counted / (q * k)),
                        ("hits against every column of truth: the true neighbours are its first k, truth[:, :k]",
                         all_truth / (q * k)),
                        ("the sum over queries: average them", hits / k),
                        ("a percentage: return the fraction, between 0 and 1", 100 * want)], close, _YOURS_IS)


RECALL = Exercise("recall_at_k", 2, ("recall_at_k",), neutral(_recall_cases), RUN._recall_run, _recall_judge,
                  title="recall@k, counted right",
                  hint="hits = (truth[:, :k, None] == found[:, None, :k]).any(-1): (Q, k), each true neighbour found "
                       "or not (once, however often it is returned; -1 never matches); recall = hits.sum() / (Q k).")


# --- exercise 8: an IVF index built from the k-means ---------------------------------------------------------------

def ref_ivf(x, centroids, queries, k, nprobe, *, probe="nearest", ties="lower", local=False):
    """(lists, ids (Q, k)) in float64, with knobs for the classic mistakes."""
    xd, cd, qd = x.double(), centroids.double(), queries.double()
    labels = ref_assign(xd, cd)[0]
    lists = [torch.nonzero(labels == j)[:, 0] for j in range(cd.shape[0])]
    d2c = ((qd[:, None] - cd[None]) ** 2).sum(-1)               # (Q, nlist)
    order = torch.sort(-d2c if probe == "farthest" else d2c, dim=1, stable=True).indices
    out = torch.full((qd.shape[0], k), -1, dtype=torch.int64)
    for i, q in enumerate(qd):
        probes = order[i, :1] if probe == "one" else order[i, :nprobe]
        ids = torch.sort(torch.cat([lists[p] for p in probes.tolist()])).values
        d2 = ((xd[ids] - q) ** 2).sum(1)
        d2 = d2.flip(0) if ties == "higher" else d2
        top = torch.sort(d2, stable=True).indices[:k]
        top = len(ids) - 1 - top if ties == "higher" else top
        if local:
            pos = torch.cat([torch.arange(len(lists[p])) for p in probes.tolist()])
            ids = pos[torch.sort(torch.cat([lists[p] for p in probes.tolist()])).indices]
        out[i, :len(top)] = ids[top]
    return lists, out


def _ivf_cases(gen, public):
    def case(rule, n, d, nlist, q, k, nprobe):
        x = _ints(gen, n, d, lo=-3, hi=3)
        centroids = x[torch.randperm(n, generator=gen)[:nlist]]
        for _ in range(10):  # distinct centroids, so every list is the one of a real centroid
            if len({tuple(r) for r in centroids.tolist()}) == nlist:
                break
            centroids = x[torch.randperm(n, generator=gen)[:nlist]]
        return Case(f"{rule}{': ' if rule else ''}{n} points in {d} dims, {nlist} lists, {q} queries, k={k}, "
                    f"nprobe={nprobe}", dict(x=x, centroids=centroids, queries=_ints(gen, q, d, lo=-3, hi=3), k=k,
                                             nprobe=nprobe))

    if public:
        return [case("", 80, 4, 6, 5, 5, 2), case("", 60, 3, 4, 4, 8, 1), case("", 50, 2, 5, 3, 4, 5)]
    return [case("one probe", randint(gen, 60, 120), 4, randint(gen, 4, 8), 4, randint(gen, 3, 6), 1),
            case("a few probes", 100, randint(gen, 3, 5), 8, 4, 5, randint(gen, 2, 4)),
            case("every list probed (brute force)", 60, 3, 5, 3, randint(gen, 3, 8), 5),
            case("lists shorter than k (-1 padding)", 30, 3, 8, 3, randint(gen, 12, 16), 1)]


def _ivf_judge(case, obs):
    x, c, q, k, nprobe = (case.inputs[n] for n in ("x", "centroids", "queries", "k", "nprobe"))
    ref = lambda **mistake: ref_ivf(x, c, q, k, nprobe, **mistake)  # noqa: E731
    lists, want = ref()
    got_lists = obs["lists"]
    if not isinstance(got_lists, list) or len(got_lists) != len(lists):
        return f"build_ivf must return a list of {len(lists)} id tensors (one per centroid), got {str(got_lists)[:80]}."
    for j, (g, w) in enumerate(zip(got_lists, lists)):
        if not torch.equal(g, w):
            return (f"build_ivf: list {j} holds {g.tolist()[:12]}, expected {w.tolist()[:12]} (the ids, ascending, of "
                    "the points whose nearest centroid is j; ties to the lower centroid).")
    got = obs["ids"]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return f"ivf_search must return ids of shape (Q, k) = {tuple(want.shape)}, got " \
               f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}."
    if got.dtype != torch.int64:
        return f"ivf_search must return int64 ids (what torch.sort's indices and the lists hold), got {got.dtype}."
    if torch.equal(got, want):
        return None
    row = int((got != want).any(1).nonzero()[0, 0])
    return diagnose(f"ivf_search, query {row}: ids {got[row].tolist()}, expected {want[row].tolist()} (the k nearest "
                    f"among the lists of the {nprobe} nearest centroids, nearest first, ties to the lower id, -1 where "
                    "fewer were found).", got, [
                        ("the nprobe farthest centroids probed: take the nearest", lambda: ref(probe="farthest")[1]),
                        ("one list probed whatever nprobe is", lambda: ref(probe="one")[1]),
                        ("every list probed (an exhaustive search): probe only the nprobe nearest",
                         lambda: ref_ivf(x, c, q, k, c.shape[0])[1]),
                        ("ties going to the higher id", lambda: ref(ties="higher")[1]),
                        ("positions inside the lists, not the points' ids", lambda: ref(local=True)[1])],
                    lambda a, b: torch.equal(a, b), "\n  Your ids match {} instead.")


IVF = Exercise("ivf_search", 3, ("build_ivf", "ivf_search"), neutral(_ivf_cases), RUN._ivf_run, _ivf_judge,
               title="Vector search: an IVF index from the k-means",
               hint="build_ivf: labels = kmeans_assign(x, centroids)[0]; list j = nonzero(labels == j). ivf_search: "
                    "per query, the nprobe nearest centroids (a stable sort of the distances), the union of their "
                    "lists (ids ascending), exact squared distances, a stable sort, the first k, -1 padding.")


# --- exercise 9: gradient-boosted trees' histograms -------------------------------------------------------------------

def _hist_cases(gen, public):
    def case(rule, n, f, n_bins, logistic=True):
        edges = torch.sort(_ints(gen, f, n_bins - 1, lo=-20, hi=20) / 4, dim=1).values
        edges = edges + torch.arange(n_bins - 1) * 1e-3            # strictly increasing
        on_edge = edges[torch.arange(f), torch.randint(0, n_bins - 1, (n, f), generator=gen)]  # (N, F) values on edges
        x = torch.where(torch.rand(n, f, generator=gen) < 0.4, on_edge, randn(gen, n, f, scale=3))
        p = torch.rand(n, generator=gen)
        grad = p - (torch.rand(n, generator=gen) < 0.5).float()
        hess = p * (1 - p) if logistic else torch.ones(n)
        bins = torch.randint(0, n_bins, (n, f), generator=gen)
        return Case(f"{rule}{': ' if rule else ''}{n} rows, {f} features, {n_bins} bins",
                    dict(x=x, edges=edges, bins=bins, grad=grad, hess=hess, n_bins=n_bins))

    if public:
        return [case("", 50, 3, 8), case("", 40, 2, 4), case("", 30, 4, 16, logistic=False)]
    return [case("values on the edges", randint(gen, 40, 100), randint(gen, 2, 5), choice(gen, [4, 8, 16])),
            case("one feature", randint(gen, 20, 60), 1, choice(gen, [8, 32])),
            case("more bins than rows", randint(gen, 5, 12), 3, 32),
            case("squared loss (hessian 1)", randint(gen, 30, 80), 3, 8, logistic=False)]


def ref_histograms(bins, grad, hess, n_bins):
    f = bins.shape[1]
    G, H = torch.zeros(f, n_bins, dtype=torch.float64), torch.zeros(f, n_bins, dtype=torch.float64)
    for j in range(f):
        G[j].index_add_(0, bins[:, j], grad.double())
        H[j].index_add_(0, bins[:, j], hess.double())
    return G, H


def _hist_judge(case, obs):
    x, edges, bins, grad, hess, nb = (case.inputs[n] for n in ("x", "edges", "bins", "grad", "hess", "n_bins"))
    want = (x[:, :, None] >= edges[None]).sum(-1)
    got = obs["binned"]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.equal(got.long(), want):
        where = "" if not isinstance(got, torch.Tensor) or got.shape != want.shape else \
            f" (first at row {int((got.long() != want).any(1).nonzero()[0, 0])})"
        return diagnose(f"bin_features differs from the rule bin b holds edges[b - 1] <= x < edges[b]{where}.", got, [
            ("bins with the edge itself in the lower bin (x > edge): a value equal to an edge belongs to the bin "
             "above it (searchsorted(..., right=True))", (x[:, :, None] > edges[None]).sum(-1)),
            ("bins shifted by one: bin 0 holds the values below the first edge", want + 1)],
            lambda a, b: isinstance(a, torch.Tensor) and torch.equal(a.long(), b),
            "\n  Your bins match {} instead.")
    if "bad" in obs:
        return f"grad_histograms must return (G, H), got {obs['bad']}."
    G, H = ref_histograms(bins, grad, hess, nb)
    tol = dict(atol=1e-4, rtol=1e-4, dtype=torch.float32)
    for name, got_t, want_t in (("G", obs["G"], G), ("H", obs["H"], H)):
        report = compare(got_t, want_t, name=name, **tol)
        if report:
            counts = ref_histograms(bins, torch.ones_like(grad), torch.ones_like(hess), nb)[0]
            return diagnose(report, got_t, [
                ("the other histogram: G sums the gradients, H the hessians", H if name == "G" else G),
                ("the row counts per bin: sum the hessians, they are 1 only for squared loss", counts),
                ("the bins of feature 0 used for every feature", lambda: ref_histograms(
                    bins[:, :1].expand_as(bins), grad, hess, nb)[0 if name == "G" else 1])],
                lambda a, b: compare(a, b, **tol) is None, f"\n  Your {name} matches {{}} instead.")
    return None


HISTOGRAMS = Exercise("gbdt_histograms", 3, ("bin_features", "grad_histograms"), neutral(_hist_cases), RUN._hist_run,
                      _hist_judge,
                      title="Gradient-boosted trees: binning and gradient histograms",
                      hint="bin_features: (x[:, :, None] >= edges[None]).sum(-1), the number of edges <= x. "
                           "grad_histograms: a flat slot f * n_bins + bins[:, f] per (row, feature); "
                           "zeros(F * n_bins).index_add_(0, slots, grad expanded to (N, F)), the same for hess.")


# --- exercise 10: the best split ---------------------------------------------------------------------------------

def ref_gains(G, H, lam, gamma, *, no_lam=False, no_gamma=False, half=True, right_h="rest", after=True,
              parent=True):
    """Gain of every split (F, B - 1) in float64, with knobs for the classic mistakes."""
    G, H = G.double(), H.double()
    GL, HL = G.cumsum(1)[:, :-1], H.cumsum(1)[:, :-1]
    if not after:  # the split point taken one bin early: bins 0..b-1 on the left, reported at b
        GL = torch.cat([torch.zeros_like(GL[:, :1]), GL[:, :-1]], 1)
        HL = torch.cat([torch.zeros_like(HL[:, :1]), HL[:, :-1]], 1)
    Gt, Ht = G.sum(1, keepdim=True), H.sum(1, keepdim=True)
    HR = Ht - HL if right_h == "rest" else Ht.expand_as(HL)
    lam_ = 0.0 if no_lam else lam
    score = lambda g, h: g * g / (h + lam_)  # noqa: E731
    gain = (score(GL, HL) + score(Gt - GL, HR) - (score(Gt, Ht) if parent else 0.0)) * (0.5 if half else 1.0)
    return gain - (0.0 if no_gamma else gamma)


def _best(gain, last: bool = False):
    """(feature, bin, gain) of the first maximum of the (F, B - 1) gains (``last``: the last one, the mistake)."""
    flat = gain.reshape(-1).flip(0).argmax() if last else gain.reshape(-1).argmax()
    flat = gain.numel() - 1 - int(flat) if last else int(flat)
    return [flat // gain.shape[1], flat % gain.shape[1], float(gain.reshape(-1)[flat])]


def _split_cases(gen, public):
    def case(rule, f, b, lam, gamma, dup=False, small_h=False):
        G = randn(gen, f, b, scale=2)
        H = torch.rand(f, b, generator=gen) * (0.05 if small_h else 2) + (0.0 if small_h else 0.1)
        if dup:  # every feature the same histogram: the lowest feature must win
            G, H = G[:1].expand(f, b).clone(), H[:1].expand(f, b).clone()
        return Case(f"{rule}{': ' if rule else ''}{f} features, {b} bins, lambda={lam}, gamma={gamma}",
                    dict(G=G, H=H, lam=lam, gamma=gamma))

    if public:
        return [case("", 3, 8, 1.0, 0.0), case("", 4, 16, 0.5, 0.2), case("", 2, 4, 1.0, 0.0, dup=True),
                case("", 3, 8, 5.0, 0.0, small_h=True)]
    lam = lambda: round(uniform(gen, 0.5, 5), 2)  # noqa: E731
    return [case("lambda dominates small hessians", randint(gen, 2, 6), 16, round(lam() + 2, 2), 0.0, small_h=True),
            case("gamma", randint(gen, 2, 6), choice(gen, [8, 16]), lam(), round(uniform(gen, 0.1, 1), 2)),
            case("equal features", randint(gen, 2, 4), 8, lam(), 0.0, dup=True),
            case("many bins", 2, 64, lam(), 0.0)]


def _split_judge(case, obs):
    G, H, lam, gamma = (case.inputs[n] for n in ("G", "H", "lam", "gamma"))
    if "bad" in obs:
        return f"best_split must return (feature, bin, gain), got {obs['bad']}."
    want, got = _best(ref_gains(G, H, lam, gamma)), obs["split"]
    if got[:2] == want[:2] and close(got[2], want[2], rel=1e-4, abs_tol=1e-5):
        return None
    same = lambda a, b: a[:2] == b[:2] and close(a[2], b[2], rel=1e-4, abs_tol=1e-5)  # noqa: E731
    variant = lambda **m: _best(ref_gains(G, H, lam, gamma, **m))  # noqa: E731
    return diagnose(f"best_split = (feature {got[0]}, bin {got[1]}, gain {got[2]:.6g}), expected (feature {want[0]}, "
                    f"bin {want[1]}, gain {want[2]:.6g}).", got, [
                        ("gains without lambda: GL^2 / (HL + lambda), the same on the right and for the parent",
                         variant(no_lam=True)),
                        ("the right child's hessian = the whole node's (HR = H - HL)", variant(right_h="parent")),
                        ("gains without subtracting gamma", variant(no_gamma=True)),
                        ("gains without the factor 1/2", variant(half=False)),
                        ("gains without the parent's score: subtract G^2 / (H + lambda) of the whole node",
                         variant(parent=False)),
                        ("the last of equal gains: the first maximum (lowest feature, then bin) wins",
                         _best(ref_gains(G, H, lam, gamma), last=True)),
                        ("the split point one bin early: splitting after bin b puts bins 0..b on the left (cumsum up "
                         "to b included)", variant(after=False))], same, _YOURS_IS.replace("is", "uses"))


BEST_SPLIT = Exercise("best_split", 3, ("best_split",), neutral(_split_cases), RUN._split_run, _split_judge,
                      title="Gradient-boosted trees: the best split from the histograms",
                      hint="GL, HL = G.cumsum(1)[:, :-1], H.cumsum(1)[:, :-1]; GR = G.sum(1) - GL, HR = H.sum(1) - HL; "
                           "gain = (GL^2/(HL+lam) + GR^2/(HR+lam) - G^2/(H+lam)) / 2 - gamma; the first argmax of the "
                           "flattened (F, B - 1) gains gives (feature, bin).")


# --- exercise 11: a prefetching loop's transfer contract ----------------------------------------------------------

def _pipe_cases(gen, public):
    def case(rule, n):
        return Case(f"{rule}{': ' if rule else ''}{n} batches", dict(batches=[randn(gen, 4, 3) for _ in range(n)]))

    if public:
        return [case("", 4), case("", 2), case("", 1)]
    return [case("one batch", 1), case("two batches", 2), case("a longer stream", randint(gen, 5, 9))]


def _pipe_judge(case, obs):
    batches, log = case.inputs["batches"], [tuple(e) for e in obs["log"]]
    n, results = len(batches), obs["results"]
    steps = [e for e in log if e[0] == "step"]
    if len(steps) != n:
        return f"prefetch_loop called step {len(steps)} times for {n} batches: call it once per batch."
    if not isinstance(results, list) or len(results) != n or not all(
            isinstance(r, torch.Tensor) and r.shape == b.sum(0).shape and torch.allclose(r, b.sum(0))
            for r, b in zip(results, batches)):
        return "prefetch_loop must return [step(x) for each batch, in order], each x the device copy of its batch."
    for event in log:
        if event[0] == "overwrite":
            _, earlier, later = event
            return (f"the pinned buffer batch {earlier} was copied from was overwritten (for batch {later}) before "
                    "the host knew that copy had finished: a non_blocking copy reads pinned memory later, on the copy "
                    "engine, so rewriting it is a race. Pin each batch: io.pin(batches[i]).")
    pins = [e[1] for e in log if e[0] == "pin"]
    twice = next((i for i in range(n) if pins.count(i) > 1), None)
    if twice is not None:
        return (f"batch {twice} was pinned {pins.count(twice)} times: io.pin allocates page-locked memory and copies "
                "the batch into it each time. Pin each batch once and copy that pinned tensor.")
    for _, i, ready, source in steps:
        if source != i:
            what = "no device copy (io.to_device)" if source is None else f"the copy of batch {source}"
            return f"step {i} was given {what}: give it the device copy of batch {i}."
    copies = {e[1]: (p, e) for p, e in enumerate(log) if e[0] == "copy"}
    at = {e[1]: p for p, e in enumerate(log) if e[0] == "step"}
    for i, (p, (_, _, pinned, non_blocking, stream)) in sorted(copies.items()):
        if not pinned:
            return (f"batch {i} was copied from pageable memory: copy io.pin(batch). A copy from pageable memory goes "
                    "through a staging buffer, and the host waits for it even with non_blocking=True.")
        if not non_blocking:
            return f"batch {i} was copied with non_blocking=False: the host waits for every such copy, so nothing " \
                   "overlaps. Pass non_blocking=True."
        if stream != "copy":
            return (f"batch {i} was copied on the {stream} stream: issue copies on io.copy_stream, or they queue "
                    "behind the compute on the same stream and cannot overlap it.")
    for i in range(n - 1):
        if copies[i + 1][0] > at[i]:
            return (f"the copy of batch {i + 1} was issued after step {i}: the copies run after the compute, not "
                    f"beside it. Issue the copy of batch i + 1 before calling step on batch i (one batch ahead).")
        if i + 2 < n and copies[i + 2][0] < at[i]:
            return (f"the copy of batch {i + 2} was issued before step {i}: stay one batch ahead (double buffering); "
                    "more batches in flight hold more device memory and overlap nothing more.")
    for _, i, ready, _ in steps:
        if not ready:
            others = sorted({e[1] for e in log if e[0] == "wait" and e[1] != "copy"})
            wrong = (f" Yours waited on {', '.join(others)}, not on the stream the copies were issued on: "
                     "io.wait(io.copy_stream).") if others else ""
            return (f"step {i} used batch {i} with no io.wait(io.copy_stream) after its copy was issued: on a GPU the "
                    "compute could read the batch before it has arrived (a race). Wait before using it." + wrong)
    for i in range(n - 1):
        between = log[copies[i + 1][0] + 1:at[i]]
        if ("wait", "copy") in between:
            return (f"a wait on the copy stream came after the copy of batch {i + 1} was issued and before step {i}: "
                    f"step {i} then waits for batch {i + 1}'s copy too, and nothing overlaps. Wait first, then issue "
                    "the next copy.")
    syncs = [p for p, e in enumerate(log) if e[0] == "sync"]
    if syncs and syncs[0] < at[n - 1]:
        return ("io.synchronize() was called inside the loop: each call drains the GPU's queue and makes the host wait "
                "for it, so the next copy cannot be queued ahead. Synchronise at most once, after the last step.")
    return None


PREFETCH = Exercise("prefetch_loop", 3, ("prefetch_loop",), neutral(_pipe_cases), RUN._pipe_run, _pipe_judge,
                    title="A data pipeline that overlaps copies with compute",
                    hint="fetch(i) = io.to_device(io.pin(batches[i]), non_blocking=True, stream=io.copy_stream). Fetch "
                         "batch 0; then for each i: io.wait(io.copy_stream); x = the fetched batch; fetch batch i + 1 "
                         "(if any); results.append(step(x)). No io.synchronize() in the loop.")

# --- exercise 12: top-K over shards on several ranks --------------------------------------------------------------

CANDIDATE_BYTES = 4 + 8   # one candidate on the wire: a float32 score and its int64 global index


def ref_shard_ranges(n: int, world: int) -> list:
    """``[start, stop)`` of every rank's shard: torch.tensor_split's rule, the first ``n % world`` shards one longer."""
    sizes = [n // world + (r < n % world) for r in range(world)]
    starts = [sum(sizes[:r]) for r in range(world)]
    return [[a, a + s] for a, s in zip(starts, sizes)]


def _best_of(values: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best candidates: value descending, equal values by the lower id."""
    by_id = torch.sort(ids, stable=True).indices
    values, ids = values[by_id], ids[by_id]
    top = torch.sort(values, descending=True, stable=True).indices[:k]
    return values[top], ids[top]


def ref_sharded_topk(scores, k, world, *, local=False, per_shard=None, ranks=None):
    """The merge of every shard's top-k, with knobs for the classic mistakes: ``local`` indices counted inside each
    shard, ``per_shard`` candidates from each shard instead of k, only the shards of ``ranks`` merged."""
    cands = []
    for r, (a, b) in enumerate(ref_shard_ranges(scores.shape[0], world)):
        if ranks is None or r in ranks:
            cands.append(_best_of(scores[a:b], torch.arange(b - a) + (0 if local else a), per_shard or k))
    return _best_of(torch.cat([v for v, _ in cands]), torch.cat([i for _, i in cands]), k)


def tree_rounds(world: int) -> int:
    """Rounds of a binomial merge tree over ``world`` ranks: ceil(log2 world)."""
    return (world - 1).bit_length()


def ref_merge_bytes(world: int, k: int, method: str, rank: int, *, value_bytes: int = 4, indices: bool = True,
                    whole: bool = True, broadcast: bool = True) -> float:
    """Bytes of candidates (values and global indices) that reach ``rank`` in the merge. "gather": the p k values
    and p k indices the all-gather writes on every rank (its own chunk included, as the collective's output holds
    it). "tree": k of each for every round in which the rank receives its partner's candidates, and the broadcast
    result on every rank but 0. Knobs: the classic miscounts."""
    per = k * (value_bytes + (8 if indices else 0))
    if method == "gather":
        return (world if whole else 1) * per
    received, d = 0, 1
    while d < world:
        if rank % (2 * d) == d:     # sends its candidates to rank - d, and is done
            break
        if rank + d < world:
            received += per
        d *= 2
    return received + (per if rank and broadcast else 0)


def _sharded_cases(gen, public):
    def configs(world):
        out = []
        for method in ("gather", "tree"):
            n = world * randint(gen, 3, 6) + randint(gen, 1, world - 1)      # uneven shards
            out.append(dict(scores=_ints(gen, n, hi=2), k=randint(gen, 2, n // world), method=method))
            n = world * randint(gen, 3, 6) + randint(gen, 1, world - 1)
            scores = randn(gen, n)
            last = ref_shard_ranges(n, world)[-1][0]
            scores[last:] += 10.0                                             # the best values all on the last rank
            out.append(dict(scores=scores, k=randint(gen, 2, n // world), method=method))
        return out

    def case(rule, world):
        cfgs = configs(world)
        sizes = sorted(c["scores"].shape[0] for c in cfgs)
        ks = sorted(c["k"] for c in cfgs)
        return Case(f"{rule}{': ' if rule else ''}{world} ranks, {len(cfgs)} score vectors of {sizes[0]} to "
                    f"{sizes[-1]} float32 values, k from {ks[0]} to {ks[-1]}, merged by gather and by tree",
                    dict(world=world, configs=cfgs))

    if public:
        return [case("", 3)]
    return [case("a power of two", 4), case("not a power of two", 3)]


def _shard_range_verdict(n, world, got) -> str | None:
    want = ref_shard_ranges(n, world)
    if got == want:
        return None
    covered = [0] * n
    for a, b in got:
        for j in range(max(a, 0), min(b, n)):
            covered[j] += 1
    missing = [j for j, c in enumerate(covered) if c == 0]
    twice = [j for j, c in enumerate(covered) if c > 1]
    why = (f" Scores {missing[:6]} belong to no shard." if missing else "") + \
          (f" Scores {twice[:6]} are in two shards." if twice else "")
    return (f"shard_range({n}, rank, {world}) gave the shards {got}, expected {want}: contiguous, in rank order, "
            f"the first n % p = {n % world} shards one longer (torch.tensor_split's rule).{why} Start of shard r: "
            "r (n // p) + min(r, n % p).")


def _gathered_values_only(o, world, k) -> bool:
    gathers = [e for e in o["comm"] if e["op"].startswith("all_gather")]
    return bool(gathers) and sum(e["bytes"] for e in gathers) == world * k * 4


def _sharded_judge(case, obs):
    x = case.inputs
    world = x["world"]
    if "bad" in obs:
        return f"sharded_topk must return (values (k,), indices (k,), bytes moved); got {obs['bad']}."
    for c, cfg in enumerate(x["configs"]):
        scores, k, method = cfg["scores"], cfg["k"], cfg["method"]
        what = f"{method}, {scores.shape[0]} scores on {world} ranks, k={k}"
        outs = [rank_out[c] for rank_out in obs["ranks"]]
        bad = next((o["bad"] for o in outs if "bad" in o), None)
        if bad:
            return f"{what}: sharded_topk must return (values (k,), indices (k,), bytes moved); got {bad}."
        verdict = _shard_range_verdict(scores.shape[0], world, [o["range"] for o in outs])
        if verdict:
            return verdict
        want_v, want_i = ref_sharded_topk(scores, k, world)
        for rank, o in enumerate(outs):
            verdict = _sharded_result_verdict(what, rank, o, (want_v, want_i), scores, k, world, method)
            if verdict:
                return verdict
    for c, cfg in enumerate(x["configs"]):   # the byte counts once every result is right: the result matters most
        k, method = cfg["k"], cfg["method"]
        what = f"{method}, {cfg['scores'].shape[0]} scores on {world} ranks, k={k}"
        for rank, o in enumerate(rank_out[c] for rank_out in obs["ranks"]):
            want = ref_merge_bytes(world, k, method, rank)
            if not close(o["bytes"], want):
                per = f"k = {k} values (4 bytes) and k indices (8 bytes): {k * CANDIDATE_BYTES} bytes"
                rule = (f"the all-gather's output on every rank: p = {world} chunks of {per}" if method == "gather"
                        else f"{per} per round in which rank {rank} receives (a binomial tree of "
                             f"ceil(log2 p) = {tree_rounds(world)} rounds), plus the broadcast result on ranks "
                             "other than 0")
                mistakes = [("the values alone: the int64 indices travel too (8 bytes each)", dict(indices=False)),
                             ("one rank's k candidates: the all-gather writes p of them on every rank",
                              dict(whole=False)),
                             ("no broadcast: ranks other than 0 receive the k results at the end",
                              dict(broadcast=False))]
                # With p = 3, p k 4 = k 12: the values alone and one rank's candidates are the same number.
                named = [label for label, knob in mistakes
                         if close(o["bytes"], ref_merge_bytes(world, k, method, rank, **knob))]
                return (f"{what}: rank {rank} says it moved {o['bytes']:g} bytes, expected {want:g}: {rule}." +
                        (f"\n  Yours counts {'; or '.join(named)}." if named else ""))
    return None


def _sharded_result_verdict(what, rank, o, want, scores, k, world, method) -> str | None:
    got_v, got_i = o["values"], o["indices"]
    want_v, want_i = want
    if got_v.dtype != scores.dtype or got_i.dtype != torch.int64 or got_v.shape != (k,) or got_i.shape != (k,):
        return (f"{what}: rank {rank} returned values {got_v.dtype} {tuple(got_v.shape)} and indices {got_i.dtype} "
                f"{tuple(got_i.shape)}, expected float32 ({k},) and int64 ({k},).")
    if torch.equal(got_v, want_v) and torch.equal(got_i, want_i):
        return None
    message = (f"{what}: rank {rank} returned values {got_v.tolist()} at indices {got_i.tolist()}, expected "
               f"{want_v.tolist()} at {want_i.tolist()} (the global top-k: value descending, equal values by the "
               "lower global index, on every rank).")
    if method == "gather" and torch.equal(got_v, want_v) and _gathered_values_only(o, world, k):
        return message + ("\n  Your all-gather moved only the values (p k x 4 bytes): the other ranks' indices never "
                          "arrived. Gather the global indices too (a second all_gather), so the merge knows where "
                          "each value came from.")
    variants = [
        ("indices counted inside each shard: add the shard's start, so the indices are global",
         lambda: ref_sharded_topk(scores, k, world, local=True)),
        (f"ceil(k / p) = {-(-k // world)} candidates from each shard: a shard may hold the whole top-k, so each "
         "sends its own top k", lambda: ref_sharded_topk(scores, k, world, per_shard=-(-k // world))),
        (f"a tree of floor(log2 p) rounds: with p = {world} not a power of two, ranks "
         f"{list(range(1 << (world.bit_length() - 1), world))} never merged in; take ceil(log2 p) rounds",
         lambda: ref_sharded_topk(scores, k, world, ranks=range(1 << (world.bit_length() - 1)))
         if world & (world - 1) else None),
        ("this rank's own top-k: the result of the merge must reach every rank (broadcast it)",
         lambda: ref_sharded_topk(scores, k, world, ranks=[rank]) if rank else None)]
    return diagnose(message, (got_v, got_i), variants, lambda a, b: torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]),
                    "\n  Yours matches {} instead.") + (_tie_note(got_v, got_i, want_v, want_i) or "")


SHARDED_TOPK = Exercise("sharded_topk", 3, ("shard_range", "sharded_topk"), neutral(_sharded_cases),
                        RUN._sharded_run, _sharded_judge,
                        title="Top-K over shards: local top-k, then an all-gather or a merge tree",
                        hint="shard_range: start = r (n // p) + min(r, n % p), stop = start + n // p + (r < n % p). "
                             "sharded_topk: local top k with exact_topk, indices + start; gather: all_gather values "
                             "and indices, exact_topk of the p k; tree: for d = 1, 2, 4 ... < p, rank % 2d == d sends "
                             "to rank - d, rank % 2d == 0 receives from rank + d (if it exists) and merges; then "
                             "broadcast from rank 0.")


# --- exercise 13: a multi-GPU IVF latency model ---------------------------------------------------------------------

QUERY_BYTES = 4   # a float32 query value


def ref_ivf_latency(layout: str, batch: int, s: dict, *, straggler: str = "max", merge: bool = True,
                    host: bool = True, swapped: bool = False) -> dict:
    """One batch of ``batch`` queries through a multi-GPU IVF index (the lab's model), with knobs for the classic
    mistakes: the mean over GPUs instead of the slowest, no merge, no host transfers, the layouts swapped."""
    p = s["gpus"]
    shard = (layout == "shard") != swapped
    queries = batch if shard else -(-batch // p)                  # per GPU: every query, or the busiest replica's
    vectors = s["n"] / p if shard else s["n"]                     # vectors on one GPU
    scanned = queries * s["nprobe"] / s["nlist"] * vectors * s["d"] * s["value_bytes"]
    slow = max(s["slowdown"]) if straggler == "max" else sum(s["slowdown"]) / p
    probe = slow * scanned / s["hbm_bytes_per_s"]
    gathered = (p - 1) * batch * s["k"] * CANDIDATE_BYTES
    merge_s = s["link_latency_s"] + gathered / s["link_bytes_per_s"] if shard and p > 1 and merge else 0.0
    h2d = s["host_latency_s"] + queries * s["d"] * QUERY_BYTES / s["pcie_bytes_per_s"] if host else 0.0
    d2h = s["host_latency_s"] + queries * s["k"] * CANDIDATE_BYTES / s["pcie_bytes_per_s"] if host else 0.0
    latency = h2d + probe + merge_s + d2h
    return {"h2d_s": h2d, "probe_s": probe, "merge_s": merge_s, "d2h_s": d2h, "latency_s": latency,
            "throughput_qps": batch / latency, "fits": vectors * s["d"] * s["value_bytes"] <= s["hbm_bytes"]}


LATENCY_KEYS = ("h2d_s", "probe_s", "merge_s", "d2h_s", "latency_s", "throughput_qps", "fits")
_LATENCY_RULES = {
    "h2d_s": "host_latency_s + (queries on one GPU) d x 4 / pcie_bytes_per_s: every GPU of a shard gets the whole "
             "batch, a replica ceil(batch / p) queries",
    "probe_s": "max(slowdown) x (queries on one GPU) x nprobe / nlist x (vectors on one GPU) x d x value_bytes / "
               "hbm_bytes_per_s: n / p vectors on a shard, n on a replica; the slowest GPU sets the pace",
    "merge_s": "link_latency_s + (p - 1) batch k x 12 / link_bytes_per_s for a sharded index over p > 1 GPUs (the "
               "other shards' k candidates per query, a float32 score and an int64 id each, reach one GPU); 0 for "
               "replicas",
    "d2h_s": "host_latency_s + (queries on one GPU) k x 12 / pcie_bytes_per_s",
    "latency_s": "h2d_s + probe_s + merge_s + d2h_s",
    "throughput_qps": "batch / latency_s",
    "fits": "(vectors on one GPU) d value_bytes <= hbm_bytes",
}


def _system(gen, p, *, link=None, slow=True, big=False):
    """A seeded random machine and index: p GPUs, one of them slower when ``slow``."""
    slowdown = [1.0] * p
    if slow:
        slowdown[randint(gen, 0, p - 1)] = round(uniform(gen, 1.2, 3.0), 3)
    d, vb = choice(gen, [64, 96, 128, 256, 768]), choice(gen, [1, 2, 4])
    hbm = round(uniform(gen, 16, 192)) * 1e9
    n = (round(hbm * uniform(gen, 1.2, 1.8) / (d * vb)) // p) * p if big else 1000 * randint(gen, 1000, 100_000)
    return dict(n=n, d=d, value_bytes=vb, nlist=choice(gen, [1024, 4096, 16384, 65536]),
                nprobe=randint(gen, 1, 256), k=randint(gen, 1, 100), gpus=p,
                hbm_bytes_per_s=round(uniform(gen, 0.9, 5.0), 2) * 1e12, hbm_bytes=hbm,
                link_bytes_per_s=link or round(uniform(gen, 100, 900)) * 1e9,
                link_latency_s=round(uniform(gen, 2, 30), 1) * 1e-6,
                pcie_bytes_per_s=round(uniform(gen, 16, 64)) * 1e9, host_latency_s=round(uniform(gen, 5, 30), 1) * 1e-6,
                slowdown=slowdown)


def _latency_cases(gen, public):
    def case(rule, layout, batch, s):
        slow, gpus = max(s["slowdown"]), f"{s['gpus']} GPU{'s' * (s['gpus'] > 1)}"
        return Case(f"{rule}{': ' if rule else ''}{layout}, batch {batch}, {gpus}, n={s['n']:.4g} d={s['d']} "
                    f"{s['value_bytes']} B/value, nlist={s['nlist']} nprobe={s['nprobe']} k={s['k']}"
                    f"{f', one GPU {slow:g}x slower' if slow > 1 else ''}", dict(layout=layout, batch=batch, system=s))

    if public:
        h100 = dict(n=100_000_000, d=128, value_bytes=2, nlist=16384, nprobe=32, k=10, gpus=4,
                    hbm_bytes_per_s=3.35e12, hbm_bytes=80e9, link_bytes_per_s=450e9, link_latency_s=10e-6,
                    pcie_bytes_per_s=64e9, host_latency_s=10e-6, slowdown=[1.0, 1.0, 1.0, 1.5])
        return [case("", "shard", 64, h100), case("", "replicate", 64, h100), case("", "shard", 1, h100),
                case("", "replicate", 512, dict(h100, slowdown=[1.0] * 4))]
    p = lambda: randint(gen, 2, 8)  # noqa: E731
    return [case("a straggler behind a sharded index", "shard", randint(gen, 8, 256), _system(gen, p())),
            case("a straggler among replicas", "replicate", randint(gen, 8, 256), _system(gen, p())),
            case("one query", "shard", 1, _system(gen, p())),
            case("a batch that does not divide", "replicate", 8 * randint(gen, 2, 64) + 1, _system(gen, 8)),
            case("a merge over a network", "shard", randint(gen, 64, 1024),
                 _system(gen, p(), link=round(uniform(gen, 12, 50)) * 1e9)),
            case("an index larger than one GPU", "replicate", randint(gen, 16, 128),
                 _system(gen, p(), big=True)),
            case("one GPU", choice(gen, ["shard", "replicate"]), randint(gen, 1, 64), _system(gen, 1, slow=False))]


def _same(key: str, got, want) -> bool:
    """A term of the model equal to the reference's: a number within :func:`close`, ``fits`` a bool (or 0/1)."""
    if key == "fits":
        return isinstance(got, (bool, int, float)) and got in (0, 1) and bool(got) == want
    return close(got, want)


def _latency_judge(case, obs):
    x = case.inputs
    layout, batch, s = x["layout"], x["batch"], x["system"]
    if "bad" in obs:
        return f"ivf_latency must return a dict with {', '.join(LATENCY_KEYS)}; got {obs['bad']}."
    missing = [key for key in LATENCY_KEYS if key not in obs]
    if missing:
        return f"ivf_latency's dict lacks {', '.join(missing)} (it needs {', '.join(LATENCY_KEYS)})."
    want = ref_ivf_latency(layout, batch, s)
    for key in LATENCY_KEYS:
        if _same(key, obs[key], want[key]):
            continue
        message = (f"ivf_latency({layout!r}, batch={batch}): {key} = {obs[key]!r}, expected {want[key]!r} = "
                   f"{_LATENCY_RULES[key]}.")
        variants = [("the layouts swapped: a shard holds n / p vectors and sees every query, a replica holds all n "
                     "and gets ceil(batch / p) queries", ref_ivf_latency(layout, batch, s, swapped=True)),
                    ("the mean over GPUs: a batch waits for its slowest GPU (the max of the slowdowns)",
                     ref_ivf_latency(layout, batch, s, straggler="mean")),
                    ("no merge: a sharded index gathers the other shards' k candidates per query on one GPU",
                     ref_ivf_latency(layout, batch, s, merge=False)),
                    ("no host transfers: the queries cross PCIe to the GPUs and the results come back",
                     ref_ivf_latency(layout, batch, s, host=False))]
        return diagnose(message, obs, variants, lambda got, var: all(_same(k, got[k], var[k]) for k in LATENCY_KEYS),
                        "\n  Yours matches {} instead.")
    return None


IVF_LATENCY = Exercise("ivf_latency", 3, ("ivf_latency",), neutral(_latency_cases), RUN._latency_run,
                       _latency_judge, title="A multi-GPU IVF latency model: shard or replicate",
                       hint="queries = batch (shard) or ceil(batch / p) (replicate); vectors = n / p or n; probe = "
                            "max(slowdown) x queries x nprobe / nlist x vectors x d x value_bytes / HBM bandwidth; "
                            "merge (shard, p > 1) = link latency + (p - 1) batch k 12 / link bandwidth; each host "
                            "transfer = host latency + bytes / PCIe bandwidth; throughput = batch / latency.")

# The helpers lab 15's setup imports: its answers may call these, and no other gpulab function or class.
OFFERED = ("gpulab.setup", "gpulab.feedback.check", "gpulab.bench.benchmark", "gpulab.datasheet.h100_peaks",
           "gpulab.peaks.Peaks", "gpulab.peaks.measured_peaks", "gpulab.prefetch.CudaTransfers",
           "gpulab.prefetch.RecordingTransfers", "gpulab.vectors.make_blobs")

EXERCISES = [offering(ex, OFFERED) for ex in (HEAP_TOPK, STREAMING_TOPK, TOPK_KERNEL, KMEANS_ASSIGN, KMEANS,
                                             KMEANS_COST, RECALL, IVF, HISTOGRAMS, BEST_SPLIT, PREFETCH,
                                             SHARDED_TOPK, IVF_LATENCY)]


# --- benchmarks (python -m grader bench) ------------------------------------------------------------------------

def _bench_make(rows, cols, k):
    def make(device, tiny):
        r, n = (4, 64) if tiny else (rows, cols)
        return {"x": torch.randn(r, n, device=device), "k": k, "flops": 0.0, "bytes": 4.0 * r * n + 12.0 * r * k}
    return make


BENCHMARKS = [Benchmark(f"per-row top-{k} of {r} x {n} float32 vs torch.topk", "topk_rows", _bench_make(r, n, k),
                        lambda fn, inp: fn(inp["x"], inp["k"]), lambda inp: torch.topk(inp["x"], inp["k"], dim=1))
              for r, n, k in ((16384, 1024, 8), (4096, 8192, 4))]
