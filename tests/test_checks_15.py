"""Lab 15's checks: the solution passes; the mistakes these algorithms really get are rejected with a message that
names them: top-K with the higher index winning ties, indices local to a chunk, torch.topk's arbitrary tie order, a
stream kept whole; a kernel with the wrong tie rule or an unmasked load; k-means with the cross term's sign flipped,
||c||^2 missing, argmax for argmin, distances without ||x||^2, NaN for an empty cluster, an unseeded start; the
roofline's factor 2 and distance traffic; recall computed as precision or with the wrong denominator; IVF probing
the wrong lists; histogram bins off by one at the edges, counts for hessians; splits without lambda, with the wrong
hessian sum or one bin early; a pipeline that copies after compute, synchronises every step, blocks, skips pinning,
the copy stream or the wait, or waits too late.
Also: a kernel doing a share of the top-k (a copy, one row) next to PyTorch sorting, too few programs, a zero
padding, rows assumed contiguous; a pipeline waiting on the wrong stream, pinning twice, or rewriting a pinned
buffer a copy may still read. Pinning every batch before the loop is allowed (each batch pinned once). And: a heap
that holds the whole stream, float64 values, exact keys that rank -0.0 below 0.0, the (N, K, D) differences,
recall against every column of truth or as a percentage, an exhaustive IVF search or int32 ids, splits without the
parent's score or with the last of equal gains. Across ranks: a sharded top-K with local indices, ceil(k / p)
candidates per shard, only the values gathered, shard boundaries off by one or dropping the remainder, bytes without
the indices or the p factor, a merge tree one round short for p = 3, no broadcast of the result (graded on the public
case, 3 gloo ranks: each launch costs seconds); a latency model with the mean over GPUs, no merge, no host transfers,
the layouts swapped, batch / p queries, p k candidates merged, or an index that always fits."""
import heapq

import pytest
import torch
import triton
import triton.language as tl

from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from grader.kit.neutral import failed_rules, in_written_order, rules_differ
from tests import graderkit as kit
from tests import mutants
from tests.conftest import HIDDEN_SEED, grade, solution_namespace, with_answer

STEM, EX = "15_gpu_algorithms", exercises("15_gpu_algorithms")
CHECKS = load_lab(STEM)


def rules_failed(result) -> list:
    """The rules of the cases ``result`` (a grade: public cases, and hidden ones from HIDDEN_SEED) did not pass."""
    return failed_rules(EX[result.id], result, HIDDEN_SEED)


def public(stem: str, eid: str, ns: dict, n: int | None = None):
    """``eid`` on its first ``n`` public cases, in the order the generator writes them: a message, quickly."""
    return evaluate(EX[eid], ns, "cpu", in_written_order(EX[eid])[:n])


@pytest.fixture(scope="module")
def sol15():
    return solution_namespace(STEM)




def _messages(result) -> str:
    """Every case's message: a mistake may be named on a later case than the first one that fails."""
    return "\n".join(c.message for c in result.cases)




slow = pytest.mark.slow  # starts gloo ranks: a few seconds of process start-up per launch


@pytest.mark.parametrize("eid", [pytest.param(e, marks=slow) if e == "sharded_topk" else e for e in EX])
def test_the_solution_earns_every_point(sol15, eid):
    graded = grade(STEM, eid, sol15)
    assert graded.status == "passed" and graded.score == EX[eid].points, graded.message


def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM)


def test_the_reference_top_k_orders_ties_by_index():
    v, i = CHECKS.ref_topk(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]]), 3)
    assert i.tolist() == [[1, 2, 4]] and v.tolist() == [[3.0, 3.0, 3.0]]
    assert CHECKS.ref_topk(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]]), 2, ties="higher")[1].tolist() == [[4, 2]]


# --- top-K: the heap ----------------------------------------------------------------------------------

def _heap(bug):
    def heap_topk(chunks, k):
        if bug == "whole":  # BUG: every value in a list, sorted once
            values = [v for chunk in chunks for v in chunk.tolist()]
            return sorted(((v, i) for i, v in enumerate(values)), key=lambda p: (-p[0], p[1]))[:k]
        heap, offset = [], 0
        for chunk in chunks:
            for j, v in enumerate(chunk.tolist()):
                index = j if bug == "local" else offset + j
                item = (v, index) if bug == "ties" else (v, -index)   # BUG "ties": (value, index) evicts the lower
                if len(heap) < k:
                    heapq.heappush(heap, item)
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)
            offset += len(chunk)
        pairs = [(v, i if bug == "ties" else -i) for v, i in sorted(heap, reverse=True)]
        return pairs[::-1] if bug == "ascending" else pairs
    return heap_topk


@pytest.mark.parametrize("bug, says", [
    ("ties", "the higher index winning ties"),
    ("local", "they are counted inside each chunk"),
    ("ascending", "the pairs smallest first"),
    ("whole", "heap_topk held the stream (15000 values), not a heap of k = 5 entries"),
])
def test_a_wrong_heap_is_named(sol15, bug, says):
    r = public(STEM, "heap_topk", with_answer(sol15, heap_topk=_heap(bug)))
    assert r.status == "failed" and says in _messages(r), _messages(r)


# --- top-K: batched merges --------------------------------------------------------------------------

def _streaming(bug, sol):
    def streaming_topk(chunks, k):
        if bug == "whole":  # BUG: keeps the whole stream, then one top-k
            chunks = list(chunks)
            x = torch.cat(chunks, 1)
            return sol["exact_topk"](x, torch.arange(x.shape[1]).expand_as(x), k)
        best_v = best_i = None
        offset = 0
        for chunk in chunks:
            r, c = chunk.shape
            idx = torch.arange(c).expand(r, c) + (0 if bug == "local" else offset)
            if best_v is not None:
                chunk, idx = torch.cat([best_v, chunk], 1), torch.cat([best_i, idx], 1)
            kk = min(k, chunk.shape[1])
            if bug == "signed zeros":  # BUG: the exact keys without + 0.0: -0.0 ranks below 0.0
                bits = chunk.view(torch.int32)
                keys = (torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long() << 32) | (0xFFFFFFFF - idx)
                pos = keys.topk(kk, dim=1).indices
                best_v, best_i = chunk.gather(1, pos), idx.gather(1, pos)
            elif bug == "topk":  # BUG: torch.topk on the values, ties in any order
                best_v, pos = torch.topk(chunk, kk, dim=1)
                best_i = idx.gather(1, pos)
            else:
                best_v, best_i = sol["exact_topk"](chunk, idx, kk)
            offset += c
        return (best_v.double() if bug == "float64" else best_v), best_i
    return streaming_topk


@pytest.mark.parametrize("bug, says", [
    ("topk", "torch.topk does not promise which of equal values"),
    ("local", "counted inside each chunk"),
    ("whole", "kept 1 chunk(s) alive"),
    ("float64", "values must be torch.float32 like the input, got torch.float64"),
    ("signed zeros", "the indices differ among equal values"),
])
def test_a_wrong_streaming_top_k_is_named(sol15, bug, says):
    r = public(STEM, "streaming_topk", with_answer(sol15, streaming_topk=_streaming(bug, sol15)))
    assert r.status == "failed" and says in r.message, r.message


def test_streaming_ties_to_the_higher_column_is_named(sol15):
    def streaming_topk(chunks, k):  # BUG: the higher column wins ties
        x = None
        for chunk in chunks:
            x = chunk if x is None else torch.cat([x, chunk], 1)
        return CHECKS.ref_topk(x, k, ties="higher")
    r = public(STEM, "streaming_topk", with_answer(sol15, streaming_topk=streaming_topk), 1)
    assert r.status == "failed" and "matches the higher index winning ties" in r.message, r.message


# --- top-K: the Triton kernel ------------------------------------------------------------------------------

@triton.jit
def _topk_kernel_bug(x_ptr, val_ptr, idx_ptr, n_cols, stride_x, stride_v, stride_i,
                     K: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    if BUG == 2:  # BUG: no mask on the load
        x = tl.load(x_ptr + row * stride_x + cols)
        x = tl.where(cols < n_cols, x, float("-inf"))
    elif BUG == 3:  # BUG: the padding is 0, larger than negative values
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=0.0)
    else:
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=float("-inf"))
    for j in tl.static_range(K):
        m = tl.max(x, axis=0)
        if BUG == 1:  # BUG: the highest column holding the maximum
            i = tl.max(tl.where(x == m, cols, -1), axis=0)
        else:
            i = tl.min(tl.where(x == m, cols, BLOCK_N), axis=0)
        tl.store(val_ptr + row * stride_v + j, m)
        tl.store(idx_ptr + row * stride_i + j, i.to(tl.int64))
        x = tl.where(cols == i, float("-inf"), x)


def _topk_rows(bug):
    def topk_rows(x, k, values=None, indices=None):
        r, n = x.shape
        values = torch.empty(r, k) if values is None else values
        indices = torch.empty(r, k, dtype=torch.int64) if indices is None else indices
        _topk_kernel_bug[(r,)](x, values, indices, n, x.stride(0), values.stride(0), indices.stride(0),
                               K=k, BLOCK_N=triton.next_power_of_2(n), BUG=bug)
        return values, indices
    return topk_rows


def test_the_test_kernel_without_its_bug_passes(sol15):
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=_topk_rows(0)))
    assert r.status == "passed", r.message


def test_a_kernel_breaking_ties_upward_is_named(sol15):
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=_topk_rows(1)), 1)
    assert r.status == "failed" and "matches the higher index winning ties" in r.message, r.message


def test_an_unmasked_load_is_caught_on_a_ragged_width(sol15):
    r = grade(STEM, "topk_kernel", with_answer(sol15, topk_rows=_topk_rows(2)))
    assert r.status == "failed" and "a width that is not a power of two" in rules_failed(r), r.message
    assert "outside" in r.message or "out of bounds" in r.message or "past" in r.message, r.message


@triton.jit
def _copy_rows_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    tl.store(y_ptr + row * stride_y + cols, tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols),
             mask=cols < n_cols)


def _torch_finishes(share):
    """A wrapper whose kernel does a share of the work (a copy, the first row, the top-1) and PyTorch the rest."""
    def topk_rows(x, k, values=None, indices=None):
        r, n = x.shape
        if share == "copy":  # the kernel copies x to scratch, a stable sort finds the top k
            scratch = torch.empty(r, n)
            _copy_rows_kernel[(r,)](x, scratch, n, x.stride(0), scratch.stride(0), BLOCK_N=triton.next_power_of_2(n))
            order = torch.sort(scratch, dim=1, descending=True, stable=True).indices[:, :k]
            values.copy_(scratch.gather(1, order))
            indices.copy_(order)
            return values, indices
        _topk_rows(0)(x[:1], k, values[:1], indices[:1])          # "first row": the kernel does row 0 only
        if share == "re-sorted":  # the kernel does every row, then torch.topk "tidies" its output
            _topk_rows(0)(x, k, values, indices)
            values.copy_(values.topk(k, dim=1).values)
        else:
            v, i = CHECKS.ref_topk(x[1:], k)
            values[1:], indices[1:] = v, i
        return values, indices
    return topk_rows


@pytest.mark.parametrize("share", ["copy", "first row", "re-sorted"])
def test_a_kernel_doing_a_share_next_to_pytorch_earns_nothing(sol15, share):
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=_torch_finishes(share)), 2)
    assert r.score == 0 and "ran PyTorch operations outside your kernel" in r.message, r.message


def test_a_grid_of_too_few_programs_is_named(sol15):
    def topk_rows(x, k, values=None, indices=None):  # BUG: grid (R // 2,)
        _topk_rows(0)(x[:max(x.shape[0] // 2, 1)], k, values, indices)
        return values, indices
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=topk_rows), 1)
    assert r.status == "failed" and "were never written (still the poison)" in r.message, r.message


def test_a_kernel_padding_with_zeros_and_one_assuming_contiguous_rows_are_named(sol15):
    def padding(x, k, values=None, indices=None):  # BUG: other=0.0 beats negative values
        return _topk_rows(3)(x, k, values, indices)

    def contiguous(x, k, values=None, indices=None):  # BUG: rows assumed N apart
        r, n = x.shape
        _topk_kernel_bug[(r,)](x, values, indices, n, n, values.stride(0), indices.stride(0),
                               K=k, BLOCK_N=triton.next_power_of_2(n), BUG=0)
        return values, indices
    r = grade(STEM, "topk_kernel", with_answer(sol15, topk_rows=padding))
    assert rules_failed(r) == ["negative values"] and "padded with zeros" in _messages(r), _messages(r)
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=contiguous))
    assert [c.status for c in r.cases][-1] == "failed" and "pass x.stride(0)" in r.cases[-1].message, _messages(r)


def test_pytorch_doing_the_top_k_earns_nothing(sol15):
    def topk_rows(x, k, values=None, indices=None):
        v, i = CHECKS.ref_topk(x, k)
        values.copy_(v)
        indices.copy_(i)
        return values, indices
    r = public(STEM, "topk_kernel", with_answer(sol15, topk_rows=topk_rows))
    assert r.score == 0 and "no Triton kernel was launched" in r.message


# --- k-means ---------------------------------------------------------------------------------------------

def _assign(bug):
    def kmeans_assign(x, c):
        if bug == "broadcast":  # BUG: the (N, K, D) differences, no matmul
            d2 = ((x[:, None] - c[None]) ** 2).sum(-1)
            labels = d2.argmin(1)
            return labels, d2.gather(1, labels[:, None])[:, 0]
        xx, cc, cross = (x * x).sum(1, keepdim=True), (c * c).sum(1), x @ c.T
        d2 = {"sign": xx + 2 * cross + cc, "no c norm": xx - 2 * cross}.get(bug, xx - 2 * cross + cc)
        labels = d2.argmax(1) if bug == "argmax" else d2.argmin(1)
        dist = d2.gather(1, labels[:, None])[:, 0]
        if bug == "no x norm":  # BUG: ||x||^2 dropped from the distances too
            dist = dist - xx[:, 0]
        return labels, dist.clamp_min(0) if bug != "no x norm" else dist
    return kmeans_assign


@pytest.mark.parametrize("bug, says", [
    ("sign", "the cross term's sign flipped"),
    ("no c norm", "the ||c||^2 term is missing"),
    ("argmax", "argmax instead of argmin"),
    ("no x norm", "the distances without ||x||^2"),
    ("broadcast", "kmeans_assign built a (40, 5, 3) tensor"),
])
def test_a_wrong_assignment_is_named(sol15, bug, says):
    r = public(STEM, "kmeans_assign", with_answer(sol15, kmeans_assign=_assign(bug)))
    assert r.status == "failed" and says in r.message, r.message


def test_an_assignment_breaking_ties_upward_fails_on_exact_ties(sol15):
    def kmeans_assign(x, c):  # BUG: the last minimum
        d2 = (x * x).sum(1, keepdim=True) - 2 * x @ c.T + (c * c).sum(1)
        labels = c.shape[0] - 1 - d2.flip(1).argmin(1)
        return labels, d2.gather(1, labels[:, None])[:, 0].clamp_min(0)
    r = grade(STEM, "kmeans_assign", with_answer(sol15, kmeans_assign=kmeans_assign))
    assert r.status == "failed" and "ties going to the higher centroid" in r.message, r.message
    assert "exact ties" in rules_failed(r)


def _kmeans(bug, sol):
    def kmeans(x, k, iters, seed):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        c = x[:k].clone() if bug == "first" else x[perm[:k]].clone()
        labels = sol["kmeans_assign"](x, c)[0]
        for _ in range(iters):
            labels = sol["kmeans_assign"](x, c)[0]
            sums = torch.zeros_like(c).index_add_(0, labels, x)
            counts = torch.bincount(labels, minlength=k)
            if bug == "nan":  # BUG: 0 / 0 for an empty cluster
                c = sums / counts[:, None]
            else:
                c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
        return c, labels if bug == "stale labels" else sol["kmeans_assign"](x, c)[0]
    return kmeans


@pytest.mark.parametrize("bug, says", [
    ("nan", "empty cluster keeps its centroid"),
    ("first", "a start from the first k points"),
    ("stale labels", "the labels of the last assignment, before the final update"),
])
def test_a_wrong_lloyd_is_named(sol15, bug, says):
    r = public(STEM, "kmeans_lloyd", with_answer(sol15, kmeans=_kmeans(bug, sol15)))
    assert r.status == "failed" and says in r.message, r.message


@pytest.mark.parametrize("bug, says", [
    ("flops", "one FLOP per multiply-add"),
    ("fused distances", "the distance matrix, but the kernel is fused"),
    ("no read back", "written but not read back"),
    ("sum", "the sum of the two times"),
])
def test_a_wrong_step_cost_is_named(sol15, bug, says):
    def kmeans_step_cost(n, k, d, dtype_bytes, fused, peaks):
        flops = (1 if bug == "flops" else 2) * n * k * d
        dist = {"fused distances": 8 * n * k, "no read back": 0 if fused else 4 * n * k}.get(bug, 0 if fused else
                                                                                            8 * n * k)
        nbytes = (n * d + k * d) * dtype_bytes + 8 * n + dist
        tc, tm = flops / (peaks.matmul_tflops * 1e12), nbytes / (peaks.copy_gbps * 1e9)
        return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes,
                "seconds": tc + tm if bug == "sum" else max(tc, tm), "bound": "compute" if tc > tm else "memory"}
    r = public(STEM, "kmeans_roofline", with_answer(sol15, kmeans_step_cost=kmeans_step_cost))
    assert r.status == "failed" and says in r.message, r.message


# --- recall and IVF --------------------------------------------------------------------------------------

def _recall(bug):
    def recall_at_k(found, truth, k):
        q = found.shape[0]
        top = found[:, :k]
        if bug == "precision":
            hits = (top[:, :, None] == truth[:, None, :k]).any(-1)
            return hits.sum().item() / max(int((top >= 0).sum()), 1)
        if bug == "denominator m":
            hits = (truth[:, :k, None] == top[:, None, :]).any(-1)
            return hits.sum().item() / (q * found.shape[1])
        if bug == "duplicates":
            return (top[:, :, None] == truth[:, None, :k]).any(-1).sum().item() / (q * k)
        if bug == "sum":
            return (truth[:, :k, None] == top[:, None, :]).any(-1).sum().item() / k
        hits = (truth[:, :, None] == top[:, None, :]).any(-1)   # every column of truth (the "all truth" bug)
        if bug == "all truth":
            return hits.sum().item() / (q * k)
        if bug == "percent":
            return 100 * hits[:, :k].sum().item() / (q * k)
        raise AssertionError(bug)
    return recall_at_k


@pytest.mark.parametrize("bug, says", [
    ("precision", "precision: hits over the ids returned"),
    ("denominator m", "a denominator of the ids returned"),
    ("duplicates", "a repeated id counted twice"),
    ("sum", "the sum over queries"),
    ("all truth", "hits against every column of truth"),
    ("percent", "a percentage"),
])
def test_a_wrong_recall_is_named(sol15, bug, says):
    r = grade(STEM, "recall_at_k", with_answer(sol15, recall_at_k=_recall(bug)))
    assert r.status == "failed" and says in r.message, r.message


@pytest.mark.parametrize("mistake, says", [
    ({"probe": "farthest"}, "the nprobe farthest centroids probed"),
    ({"probe": "one"}, "one list probed whatever nprobe is"),
    ({"ties": "higher"}, "ties going to the higher id"),
    ({"local": True}, "positions inside the lists"),
    ({"exhaustive": True}, "every list probed (an exhaustive search)"),
    ({"int32": True}, "ivf_search must return int64 ids"),
])
def test_a_wrong_ivf_search_is_named(sol15, mistake, says):
    def ivf_search(x, centroids, lists, queries, k, nprobe):
        if mistake.get("exhaustive"):
            return CHECKS.ref_ivf(x, centroids, queries, k, len(lists))[1]
        if mistake.get("int32"):
            return CHECKS.ref_ivf(x, centroids, queries, k, nprobe)[1].int()
        return CHECKS.ref_ivf(x, centroids, queries, k, nprobe, **mistake)[1]
    r = grade(STEM, "ivf_search", with_answer(sol15, ivf_search=ivf_search))
    assert r.status == "failed" and says in r.message, r.message


def test_lists_from_the_farthest_centroid_are_caught(sol15):
    def build_ivf(x, centroids):  # BUG: argmax of the distances
        d2 = ((x[:, None] - centroids[None]) ** 2).sum(-1)
        labels = d2.argmax(1)
        return [torch.nonzero(labels == j)[:, 0] for j in range(centroids.shape[0])]
    r = public(STEM, "ivf_search", with_answer(sol15, build_ivf=build_ivf))
    assert r.status == "failed" and "build_ivf: list" in r.message, r.message


# --- gradient-boosted trees -------------------------------------------------------------------------------

def test_bins_with_the_edge_below_are_named(sol15):
    def bin_features(x, edges):  # BUG: x > edge, a value on an edge goes to the lower bin
        return (x[:, :, None] > edges[None]).sum(-1)
    r = grade(STEM, "gbdt_histograms", with_answer(sol15, bin_features=bin_features))
    assert r.status == "failed" and "the edge itself in the lower bin" in r.message, r.message
    assert "values on the edges" in rules_failed(r)


@pytest.mark.parametrize("bug, says", [
    ("swapped", "the other histogram"),
    ("counts", "the row counts per bin"),
])
def test_wrong_histograms_are_named(sol15, bug, says):
    fixed = sol15["grad_histograms"]

    def grad_histograms(bins, grad, hess, n_bins):
        if bug == "counts":  # BUG: hessian 1 for every row
            return fixed(bins, grad, torch.ones_like(hess), n_bins)
        G, H = fixed(bins, grad, hess, n_bins)
        return H, G
    r = public(STEM, "gbdt_histograms", with_answer(sol15, grad_histograms=grad_histograms), 2)
    assert r.status == "failed" and says in r.message, r.message


@pytest.mark.parametrize("mistake, says, rule", [
    ({"no_lam": True}, "gains without lambda", "lambda dominates small hessians"),
    ({"right_h": "parent"}, "the right child's hessian = the whole node's", "lambda dominates small hessians"),
    ({"no_gamma": True}, "gains without subtracting gamma", "gamma"),
    ({"half": False}, "gains without the factor 1/2", "gamma"),
    ({"after": False}, "the split point one bin early", "many bins"),
    ({"parent": False}, "gains without the parent's score", "gamma"),
    ({"last": True}, "the last of equal gains", "equal features"),
])
def test_a_wrong_split_is_named(sol15, mistake, says, rule):
    def best_split(G, H, lam, gamma):
        if mistake.get("last"):
            return tuple(CHECKS._best(CHECKS.ref_gains(G, H, lam, gamma), last=True))
        return tuple(CHECKS._best(CHECKS.ref_gains(G, H, lam, gamma, **mistake)))
    r = grade(STEM, "best_split", with_answer(sol15, best_split=best_split))
    assert r.status == "failed" and says in r.message, r.message
    assert rule in rules_failed(r)


# --- the prefetching loop -----------------------------------------------------------------------------------

def _loop(bug):
    def prefetch_loop(batches, step, io):
        pinned = [io.pin(b) for b in batches] if bug == "pinned first" else []   # allowed: each batch pinned once

        def fetch(i):
            if bug == "pinned first":
                src = pinned[i]
            elif bug == "pinned twice":    # BUG: a pinned copy of a pinned copy
                src = io.pin(io.pin(batches[i]))
            elif bug == "reused buffers" and i >= 2:  # BUG: two pinned buffers rewritten while a copy may read them
                src = pinned[i % 2].copy_(batches[i])
            else:
                src = batches[i] if bug == "pageable" else io.pin(batches[i])
                pinned.append(src)
            return io.to_device(src, non_blocking=bug != "blocking",
                                stream=None if bug == "default stream" else io.copy_stream)

        results = []
        if bug == "serial":  # BUG: copy, then compute, one batch at a time
            for i in range(len(batches)):
                x = fetch(i)
                io.wait(io.copy_stream)
                results.append(step(x))
            return results
        if bug == "all ahead":
            xs = [fetch(i) for i in range(len(batches))]
            io.wait(io.copy_stream)
            return [step(x) for x in xs]
        nxt = fetch(0)
        for i in range(len(batches)):
            if bug not in ("no wait", "late wait"):
                io.wait(None if bug == "wrong stream" else io.copy_stream)
            x = nxt
            if i + 1 < len(batches):
                nxt = fetch(i + 1)
            if bug == "late wait":  # BUG: waits after issuing the next copy
                io.wait(io.copy_stream)
            results.append(step(x))
            if bug == "sync":
                io.synchronize()
        if bug == "pinned first":
            io.synchronize()             # once, after the last step: allowed
        return results
    return prefetch_loop


@pytest.mark.parametrize("bug, says", [
    ("serial", "the copies run after the compute"),
    ("sync", "io.synchronize() was called inside the loop"),
    ("blocking", "non_blocking=False"),
    ("pageable", "copied from pageable memory"),
    ("default stream", "copied on the current stream"),
    ("no wait", "with no io.wait(io.copy_stream) after its copy"),
    ("late wait", "step 0 then waits for batch 1's copy too"),
    ("all ahead", "stay one batch ahead"),
])
def test_a_wrong_pipeline_is_named(sol15, bug, says):
    r = public(STEM, "prefetch_loop", with_answer(sol15, prefetch_loop=_loop(bug)), 1)
    assert r.status == "failed" and says in r.message, r.message


@pytest.mark.parametrize("bug, says", [
    ("wrong stream", "Yours waited on None, not on the stream the copies were issued on"),
    ("pinned twice", "batch 0 was pinned 2 times"),
    ("reused buffers", "the pinned buffer batch 0 was copied from was overwritten (for batch 2)"),
    ("pinned first", None),
])
def test_pinning_and_waiting_mistakes_are_named(sol15, bug, says):
    r = public(STEM, "prefetch_loop", with_answer(sol15, prefetch_loop=_loop(bug)), 1)
    assert (r.status == "passed") if says is None else (r.status == "failed" and says in r.message), r.message


def test_a_pipeline_that_skips_a_batch_is_caught(sol15):
    def prefetch_loop(batches, step, io):  # BUG: computes on the host batches, no copy at all
        return [step(b) for b in batches]
    r = public(STEM, "prefetch_loop", with_answer(sol15, prefetch_loop=prefetch_loop), 1)
    assert r.status == "failed" and "no device copy" in r.message, r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set --------------------------------

@pytest.mark.parametrize("eid", [pytest.param(e, marks=slow) if e == "sharded_topk" else e for e in EX])
def test_no_credit_for_doing_nothing_and_the_same_rules_on_every_seed(eid):  # sharded_topk: a one-rank probe a case
    kit.assert_do_nothing_scores_zero(EX[eid])
    assert rules_differ(EX[eid]) is None


# --- plausible wrong answers, the solution's text changed: each fails on every seed, and says why ------------

MUTANTS = [  # (exercise, the solution's text, the mistake, what the message says)
    ("heap_topk", ("item = (v, -(offset + j))", "[(v, -neg) for v, neg in sorted(heap, reverse=True)]"),
     ("item = (v, offset + j)", "[(v, i) for v, i in sorted(heap, key=lambda e: (-e[0], e[1]))]"),
     "equal values: the lower index first"),
    ("heap_topk", "item = (v, -(offset + j))", "item = (v, -j)", "Add the chunk's offset"),
    ("heap_topk", ("if len(heap) < k:", "[(v, -neg) for v, neg in sorted(heap, reverse=True)]"),
     ("if True:", "[(v, -neg) for v, neg in sorted(heap, reverse=True)][:k]"), "not a heap of k"),
    ("streaming_topk", "pos = torch.topk(keys, k, dim=1).indices", "pos = torch.topk(values, k, dim=1).indices",
     "indices"),
    ("streaming_topk", "bits = (values + 0.0).view(torch.int32)", "bits = values.view(torch.int32)", "indices"),
    ("streaming_topk", "idx = torch.arange(offset, offset + c,", "idx = torch.arange(0, c,", "add the chunk's offset"),
    ("kmeans_assign", "labels = d2.argmin(1)", "labels = d2.shape[1] - 1 - d2.flip(1).argmin(1)",
     "ties going to the higher centroid"),
    ("kmeans_assign", "d2 = (x * x).sum(1, keepdim=True) - 2 * x @ c.T + (c * c).sum(1)",
     "d2 = ((x[:, None] - c[None]) ** 2).sum(-1)", "one matmul"),
    ("kmeans_assign", ".clamp_min(0)    #", ".clamp_min(0).sqrt()    #", "dist2"),
    ("kmeans_lloyd", "torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)",
     "sums / counts[:, None]", "An empty cluster keeps its centroid"),
    ("kmeans_lloyd", "sums / counts.clamp_min(1)[:, None], c)",
     "sums / counts.clamp_min(1)[:, None], torch.zeros_like(c))", "centroids"),
    ("kmeans_lloyd", "return c, kmeans_assign(x, c)[0]", "return c, labels", "assign once more"),
    ("kmeans_lloyd", "for _ in range(iters):", "for _ in range(max(iters - 1, 0)):", "centroids"),
    ("kmeans_lloyd", "c = x[perm[:k].to(x.device)].clone()", "c = x[:k].clone()", "centroids"),
    ("kmeans_roofline", " + 8 * n + (", " + (", "Yours counts no labels"),
    ("kmeans_roofline", " + 8 * n + (", " + 4 * n + (", "8 n for the int64 labels"),
    ("kmeans_roofline", "2 * 4 * n * k", "4 * n * k", "not read back"),
    ("kmeans_roofline", "flops = 2 * n * k * d", "flops = n * k * d", "a multiply and an add are 2 FLOPs"),
    ("kmeans_roofline", "max(t_compute, t_memory)", "t_compute + t_memory", "the sum of the two times"),
    ("kmeans_roofline", "(n * d + k * d) * dtype_bytes", "(n * d) * dtype_bytes", "x and c once"),
    ("kmeans_roofline", "2 * 4 * n * k", "2 * dtype_bytes * n * k", "float32 distances"),
    ("recall_at_k", "/ (truth.shape[0] * k)", "/ (truth.shape[0] * k) * 100", "a percentage"),
    ("recall_at_k", "found[:, None, :k]", "found[:, None, :]", "recall@k looks at the first k only"),
    ("recall_at_k", "truth[:, :k, None]", "truth[:, :, None]", "every column of truth"),
    ("recall_at_k", "(truth[:, :k, None] == found[:, None, :k]).any(-1)",
     "(truth[:, :k, None] == found[:, None, :k]).sum(-1)", "counted twice"),
    ("ivf_search", "[:, :nprobe]", "[:, :]", "every list probed"),
    ("ivf_search", "dtype=torch.int64, device=x.device)", "dtype=torch.int32, device=x.device)", "int64 ids"),
    ("ivf_search", "[:, :nprobe]", "[:, :max(1, nprobe - 1)]", "nearest centroids"),
    ("ivf_search", "torch.full((queries.shape[0], k), -1,", "torch.full((queries.shape[0], k), 0,",
     "-1 where fewer were found"),
    ("ivf_search", "+ (centroids * centroids).sum(1)", "", "nearest centroids"),
    ("gbdt_histograms", "x[:, :, None] >= edges[None]", "x[:, :, None] > edges[None]", "the bin above it"),
    ("gbdt_histograms", "index_add_(0, flat, hess", "index_add_(0, flat, grad", "H:"),
    ("gbdt_histograms", "index_add_(0, flat, hess[:, None].expand(n, f).reshape(-1))",
     "index_add_(0, flat, torch.ones(n * f))", "H:"),
    ("best_split", " - score(Gt, Ht)) / 2", ") / 2", "without the parent's score"),
    ("best_split", ") / 2 - gamma", ") - gamma", "without the factor 1/2"),
    ("best_split", "/ 2 - gamma", "/ 2", "without subtracting gamma"),
    ("best_split", "best = int(gain.reshape(-1).argmax())",
     "best = int(gain.numel() - 1 - gain.reshape(-1).flip(0).argmax())", "the last of equal gains"),
    ("best_split", "score = lambda g, h: g * g / (h + lam)", "score = lambda g, h: g * g / h.clamp_min(1e-12)",
     "without lambda"),
    ("ivf_latency", 'probe = max(s["slowdown"])', 'probe = sum(s["slowdown"]) / p', "the mean over GPUs"),
    ("ivf_latency", 'merge = s["link_latency_s"] + (p - 1) * batch * s["k"] * 12 / s["link_bytes_per_s"]',
     "merge = 0.0", "no merge"),
    ("ivf_latency", ('h2d = s["host_latency_s"] + queries * s["d"] * 4 / s["pcie_bytes_per_s"]',
                     'd2h = s["host_latency_s"] + queries * s["k"] * 12 / s["pcie_bytes_per_s"]'),
     ("h2d = 0.0", "d2h = 0.0"), "no host transfers"),
    ("ivf_latency", 'shard = layout == "shard"', 'shard = layout == "replicate"', "the layouts swapped"),
    ("ivf_latency", "-(-batch // p)", "batch / p", "ceil(batch / p) queries"),
    ("ivf_latency", "(p - 1) * batch", "p * batch", "(p - 1) batch k x 12"),
    ("ivf_latency", "vectors * s[\"d\"] * s[\"value_bytes\"] <= s[\"hbm_bytes\"]", "True", "fits ="),
]


@pytest.mark.parametrize("eid, old, new, says", MUTANTS, ids=mutants.ids(MUTANTS))
def test_a_plausible_mistake_fails_on_every_seed_and_says_why(sol15, eid, old, new, says):
    mutants.assert_fails_on_every_seed(EX[eid], mutants.mutated(STEM, sol15, eid, old, new), says)


def test_an_answer_calling_a_helper_the_lab_does_not_offer_earns_nothing(sol15):
    from gpulab.bench import percentile  # a course helper lab 15 does not offer

    def recall_at_k(found, truth, k):
        percentile([1.0], 50)
        return sol15["recall_at_k"](found, truth, k)
    r = grade(STEM, "recall_at_k", with_answer(sol15, recall_at_k=recall_at_k))
    assert r.score == 0 and "gpulab.bench.percentile, a course helper this lab does not offer" in r.message


# --- across GPUs: a top-K over shards on real ranks ----------------------------------------------------------

def test_the_merge_bytes_follow_the_tree():
    assert [CHECKS.ref_merge_bytes(3, 1, "tree", r) for r in range(3)] == [24, 12, 12]
    assert [CHECKS.ref_merge_bytes(4, 2, "tree", r) for r in range(4)] == [48, 24, 48, 24]
    assert CHECKS.ref_merge_bytes(3, 5, "gather", 2) == 3 * 5 * 12
    assert CHECKS.ref_shard_ranges(10, 4) == [[0, 3], [3, 6], [6, 8], [8, 10]]


SHARDED_MUTANTS = [  # (the solution's text, the mistake, what the message says); graded on the public case (3 ranks)
    ("ids = torch.arange(start, start + shard.shape[0]", "ids = torch.arange(0, shard.shape[0]",
     "indices counted inside each shard"),
    ("exact_topk(shard[None], ids[None], k)",   # the all-gather's p ceil(k / p) candidates are still >= k
     'exact_topk(shard[None], ids[None], -(-k // world) if method == "gather" else k)', "candidates from each shard"),
    ("dist.all_gather(all_i, index)", "all_i = [index] * world", "Your all-gather moved only the values"),
    ("start + base + (rank < extra)", "start + base + (rank <= extra)", "torch.tensor_split's rule"),
    ("start + base + (rank < extra)", "start + base", "belong to no shard"),
    ("index.numel() * index.element_size()", "0", "Yours counts the values alone"),
    ("return values, index, world * per_rank", "return values, index, per_rank", "or one rank's k candidates"),
    ("while d < world:", "while 2 * d <= world:", "a tree of floor(log2 p) rounds"),
    (("dist.broadcast(values, 0)", "dist.broadcast(index, 0)"), ("pass", "pass"),
     "the result of the merge must reach every rank"),
]


@slow
@pytest.mark.parametrize("old, new, says", SHARDED_MUTANTS, ids=[str(m[2])[:40] for m in SHARDED_MUTANTS])
def test_a_wrong_sharded_topk_is_named(sol15, old, new, says):
    r = public(STEM, "sharded_topk", mutants.mutated(STEM, sol15, "sharded_topk", old, new))
    assert r.status == "failed" and says in r.message, r.message
