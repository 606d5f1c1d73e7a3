"""Lab 17's checks: the solution passes; the mistakes CUDA code really gets are rejected with a message that names
them: row and column swapped, warps numbered by the wrong dimension, sectors counted as useful bytes or as cache
lines or with idle lanes; a missing __syncthreads() (a race, whatever the schedule), a tail guard one short, a C++
reduction without its shuffle finish; shuffle offsets starting at 32 or climbing, shfl_down where a butterfly is
needed, a full mask on a tail warp, a ballot counted by hand; a softmax without its max or reduced to lane 0; bank
conflicts counted without broadcasts or by byte, an unpadded tile, a tile padded to 64 words, a naive transpose
(uncoalesced stores); a histogram with only global atomics, or without its barriers or its zeroing; occupancy
without the register granularity, the block limit or the reserved 1 KiB, or the course's calculator; a kernel
still spilling, or unable to launch; a device buffer that copies, frees twice after a move, or leaks on move-assign.

Kernels run in NVIDIA's CUDA simulator, C++ compiles with nvcc (cached by content, so each source compiles once
per target); wrong answers are tried on the public cases only, where that is enough to name them.
"""
import json
import math

import numpy as np
import pytest

from grader.checks import exercises, load_lab
from tests import graderkit as kit
from tests.conftest import ROOT, grade, public, solution_namespace, with_answer

STEM, EX = "17_cuda_simt", exercises("17_cuda_simt")
CHECKS = load_lab(STEM)


@pytest.fixture(scope="module")
def sol17():
    return solution_namespace(STEM)


# numba.cuda in NVIDIA's simulator, set by the `sim` fixture: the simulator swaps a kernel's *global* `cuda`
cuda = None


@pytest.fixture(scope="module")
def sim():
    global cuda
    from gpulab.simt import cuda as simulated

    cuda = simulated


def _messages(result) -> str:
    return "\n".join(c.message for c in result.cases)


@pytest.mark.parametrize("eid", list(EX))
def test_the_solution_earns_every_point(sol17, eid):
    graded = grade(STEM, eid, sol17)
    assert graded.status == "passed" and graded.score == EX[eid].points, graded.message


def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM, first_case_only=True)


@pytest.mark.parametrize("eid", list(EX))
def test_do_nothing_answers_score_zero(eid):
    kit.assert_do_nothing_scores_zero(EX[eid])


@pytest.mark.parametrize("eid", [e for e in EX if e != "occupancy"])
def test_every_seed_hides_the_same_rules(eid):
    kit.assert_same_rules_every_seed(EX[eid])


def test_occupancy_cases_are_neutral_and_hold_every_rule_on_every_seed():
    from grader.kit.neutral import rules_differ

    assert rules_differ(EX["occupancy"]) is None
    assert all(c.name.startswith("case ") for c in EX["occupancy"].cases(seed=1, public=False))


# --- 1 · indexing and sectors ---------------------------------------------------------------------

def test_row_and_column_swapped_is_named(sol17):
    def swapped(b, d, t):
        return b[0] * d[0] + t[0], b[1] * d[1] + t[1]
    r = public(STEM, "indexing", with_answer(sol17, global_index_2d=swapped))
    assert r.status == "failed" and "Row and column are swapped" in r.message


def test_warps_numbered_with_the_wrong_dimension_fail(sol17):
    def wrong(t, d):
        linear = t[0] + d[1] * (t[1] + d[0] * t[2])
        return linear // 32, linear % 32
    r = public(STEM, "indexing", with_answer(sol17, warp_lane=wrong))
    assert r.status == "failed" and "x + blockDim.x * (y + blockDim.y * z)" in r.message


@pytest.mark.parametrize("wrong, named", [
    (lambda addrs, e: math.ceil(len([a for a in addrs if a is not None]) * e / 32), "useful bytes / 32"),
    (lambda addrs, e: len({a // 128 for a in addrs if a is not None}), "128-byte cache lines"),
    (lambda addrs, e: len({(a or 0) // 32 for a in addrs}), "do not take part"),
])
def test_sectors_counted_wrong_are_named(sol17, wrong, named):
    r = grade(STEM, "indexing", with_answer(sol17, sectors_per_request=wrong))
    assert r.status == "failed" and named in _messages(r), _messages(r)


# --- 2 · block reduction ------------------------------------------------------------------------------

def _reduce_with(sol17, bug):
    THREADS = 64

    @cuda.jit
    def kernel(x, partial):
        s = cuda.shared.array(THREADS, dtype=np.float32)
        t = cuda.threadIdx.x
        i = cuda.blockIdx.x * cuda.blockDim.x + t
        n = x.shape[0] - 1 if bug == "tail one short" else x.shape[0]
        s[t] = x[i] if i < n else np.float32(0)
        cuda.syncthreads()
        stride = cuda.blockDim.x // 2
        while stride > 0:
            if t < stride:
                s[t] += s[t + stride]
            if bug != "no barrier in the tree":
                cuda.syncthreads()
            stride //= 2
        if t == 0:
            partial[cuda.blockIdx.x] = s[0]
    return with_answer(sol17, block_sum_kernel=kernel)


def test_a_missing_barrier_is_a_race_whatever_the_output(sol17, sim):
    r = public(STEM, "block_reduce", _reduce_with(sol17, "no barrier in the tree"), n=1)
    assert r.status == "failed" and "race on shared memory" in r.message and "syncthreads" in r.message


def test_a_tail_guard_one_short_is_named(sol17, sim):
    r = public(STEM, "block_reduce", _reduce_with(sol17, "tail one short"), n=1)
    assert r.status == "failed" and "`i < n`, not `i < n - 1`" in r.message


def test_a_cpp_reduction_without_its_shuffle_finish_fails(sol17):
    source = sol17["block_sum_source"]().replace("stride >= 32", "stride > 0").replace(
        "for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);", "")
    r = public(STEM, "block_reduce", with_answer(sol17, block_sum_source=lambda: source), n=1)
    assert r.status == "failed" and "no SHFL instruction" in r.message


def test_a_cpp_kernel_with_a_mangled_name_is_named(sol17):
    source = sol17["block_sum_source"]().replace('extern "C" ', "")
    r = public(STEM, "block_reduce", with_answer(sol17, block_sum_source=lambda: source), n=1)
    assert r.status == "failed" and 'Declare it `extern "C" __global__' in r.message, r.message


# --- 3 · shuffles and ballots ---------------------------------------------------------------------------

def _tree(offsets, kind="shfl_down_sync"):
    def warp_sum(warp, v):
        for o in offsets:
            v = v + getattr(warp, kind)(0xFFFFFFFF, v, o)
        return v
    return warp_sum


@pytest.mark.parametrize("fn, named", [
    (_tree((32, 16, 8, 4, 2)), "The first offset was 32"),
    (_tree((1, 2, 4, 8, 16)), "Your offsets were [1, 2, 4, 8, 16]"),
    (_tree((16, 8, 4, 2, 1), "shfl_xor_sync"), "Use shfl_down_sync"),
])
def test_wrong_shuffle_offsets_or_kinds_are_named(sol17, fn, named):
    r = public(STEM, "warp_shuffle", with_answer(sol17, warp_sum=fn))
    assert r.status == "failed" and named in r.message, r.message


def test_a_max_left_in_lane_0_fails(sol17):
    def down_max(warp, v):
        for o in (16, 8, 4, 2, 1):
            v = np.maximum(v, warp.shfl_down_sync(0xFFFFFFFF, v, o))
        return v
    r = public(STEM, "warp_shuffle", with_answer(sol17, warp_max_all=down_max))
    assert r.status == "failed" and "butterfly (shfl_xor_sync)" in r.message


def test_a_full_mask_on_a_tail_warp_is_an_error(sol17):
    def full_mask_vote(warp, pred):
        ballot = warp.ballot_sync(0xFFFFFFFF, pred)
        return bin(ballot).count("1"), (ballot & -ballot).bit_length() - 1 if ballot else -1
    r = public(STEM, "warp_shuffle", with_answer(sol17, vote=full_mask_vote))
    assert r.status != "passed" and r.score < EX["warp_shuffle"].points
    assert "which is not executing this call" in _messages(r)


def test_a_vote_counted_over_every_lane_fails(sol17):
    def by_hand(warp, pred):
        warp.ballot_sync(warp.activemask(), pred)
        yes = [i for i in range(32) if pred[i]]
        return len(yes), yes[0] if yes else -1
    r = grade(STEM, "warp_shuffle", with_answer(sol17, vote=by_hand))
    assert r.status == "failed" and "counted lanes that are not active" in _messages(r)


# --- 4 · softmax, one warp per row -------------------------------------------------------------------------

def test_a_softmax_without_the_max_overflows(sol17):
    def no_max(warp, row):
        e = np.exp(np.asarray(row))
        total = np.zeros(32)
        for j, value in enumerate(e):
            total[j % 32] += value
        for m in (16, 8, 4, 2, 1):
            total = total + warp.shfl_xor_sync(0xFFFFFFFF, total, m)
            warp.shfl_xor_sync(0xFFFFFFFF, total, m)
        return e / total[0]
    r = grade(STEM, "warp_softmax", with_answer(sol17, softmax_row=no_max))
    assert r.status == "failed" and "exp overflowed" in _messages(r)


def test_a_softmax_reduced_to_lane_0_is_named(sol17):
    def down(warp, row):
        n, k = len(row), -(-len(row) // 32)
        vals = np.full(k * 32, -np.inf)
        vals[:n] = row
        vals = vals.reshape(k, 32)
        m = vals.max(axis=0)
        for o in (16, 8, 4, 2, 1):
            m = np.maximum(m, warp.shfl_down_sync(0xFFFFFFFF, m, o))
        e = np.exp(vals - m)
        s = e.sum(axis=0)
        for o in (16, 8, 4, 2, 1):
            s = s + warp.shfl_down_sync(0xFFFFFFFF, s, o)
        return (e / s).reshape(-1)[:n]
    r = public(STEM, "warp_softmax", with_answer(sol17, softmax_row=down))
    assert r.status == "failed" and "only lane 0 holds" in r.message


def test_a_softmax_without_shuffles_earns_nothing(sol17):
    def numpy_only(warp, row):
        r = np.asarray(row)
        return np.exp(r - r.max()) / np.exp(r - r.max()).sum()
    r = public(STEM, "warp_softmax", with_answer(sol17, softmax_row=numpy_only))
    assert r.score == 0 and "with shuffles" in r.message


# --- 5 · bank conflicts and the transpose ---------------------------------------------------------------------

@pytest.mark.parametrize("wrong, named", [
    (lambda addrs: max(np.bincount([(a // 4) % 32 for a in addrs if a is not None])), "a broadcast"),
    (lambda addrs: max(np.bincount([a % 32 for a in addrs if a is not None])), "(a // 4) % 32"),
])
def test_conflict_degrees_counted_wrong_are_named(sol17, wrong, named):
    r = grade(STEM, "bank_conflicts", with_answer(sol17, bank_conflict_degree=wrong))
    assert r.status == "failed" and named in _messages(r), _messages(r)


def _transpose(width, barrier=True, tiled=True):
    TILE, ROWS = 32, 4

    @cuda.jit
    def kernel(x, out):
        tile = cuda.shared.array((TILE, width), dtype=np.float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        col = cuda.blockIdx.x * TILE + tx
        row = cuda.blockIdx.y * TILE + ty
        if not tiled:  # BUG: no tile: the stores walk a column of out, one row per lane
            for j in range(0, TILE, ROWS):
                if row + j < x.shape[0] and col < x.shape[1]:
                    out[col, row + j] = x[row + j, col]
            return
        for j in range(0, TILE, ROWS):
            if row + j < x.shape[0] and col < x.shape[1]:
                tile[ty + j, tx] = x[row + j, col]
        if barrier:
            cuda.syncthreads()
        col = cuda.blockIdx.y * TILE + tx
        row = cuda.blockIdx.x * TILE + ty
        for j in range(0, TILE, ROWS):
            if row + j < out.shape[0] and col < out.shape[1]:
                out[row + j, col] = tile[tx, ty + j]
    return kernel


@pytest.mark.parametrize("kwargs, named", [
    (dict(width=32), "pad each row by one word (32, 33)"),
    (dict(width=64), "still a multiple of the 32 banks"),
    (dict(width=33, tiled=False), "uncoalesced global stores"),
    (dict(width=33, barrier=False), "race on shared memory"),
])
def test_transposes_with_conflicts_races_or_scattered_stores_are_named(sol17, sim, kwargs, named):
    r = public(STEM, "bank_conflicts", with_answer(sol17, transpose_kernel=_transpose(**kwargs)))
    assert r.status == "failed" and named in r.message, r.message


# --- 6 · histogram ----------------------------------------------------------------------------------------------

def _histogram(bug):
    NBINS = 16

    @cuda.jit
    def kernel(x, hist):
        local = cuda.shared.array(NBINS, dtype=np.int32)
        t = cuda.threadIdx.x
        if bug != "not zeroed":
            for b in range(t, NBINS, cuda.blockDim.x):
                local[b] = 0
        if bug != "no barrier after zeroing":
            cuda.syncthreads()
        i = cuda.blockIdx.x * cuda.blockDim.x + t
        stride = cuda.gridDim.x * cuda.blockDim.x
        while i < x.shape[0]:
            if bug == "global atomics":
                cuda.atomic.add(hist, x[i], 1)
            else:
                cuda.atomic.add(local, x[i], 1)
            i += stride
        if bug != "no barrier before flushing":
            cuda.syncthreads()
        if bug != "global atomics":
            for b in range(t, NBINS, cuda.blockDim.x):
                cuda.atomic.add(hist, b, local[b])
    return kernel


@pytest.mark.parametrize("bug, named", [
    ("global atomics", "not privatised"),
    ("no barrier after zeroing", "race on shared memory"),
    ("no barrier before flushing", "race on shared memory"),
    ("not zeroed", "before any thread of the block wrote it"),
])
def test_histogram_mistakes_are_named(sol17, sim, bug, named):
    r = public(STEM, "histogram", with_answer(sol17, histogram_kernel=_histogram(bug)))
    assert r.status == "failed" and named in r.message, r.message


# --- 7 · occupancy -------------------------------------------------------------------------------------------------

def _calculator(granularity=True, block_limit=True, reserved=True):
    def occupancy(registers, shared_bytes, threads, device):
        warps = math.ceil(threads / 32)
        unit = device.reg_alloc_unit if granularity else 1
        regs_per_warp = math.ceil(registers * 32 / unit) * unit
        smem = math.ceil(shared_bytes / device.smem_alloc_unit) * device.smem_alloc_unit
        smem += device.smem_reserved_per_block if reserved else 0
        limits = {"threads": device.threads_per_sm // (warps * 32),
                  "blocks": device.blocks_per_sm if block_limit else 10**6,
                  "registers": device.regs_per_sm // regs_per_warp // warps,
                  "shared memory": (device.smem_per_sm // smem if smem else 10**6)
                  if shared_bytes <= device.smem_per_block else 0}
        limiter = min(limits, key=limits.get)
        return {"blocks_per_sm": limits[limiter], "warps_per_sm": limits[limiter] * warps, "limiter": limiter}
    return occupancy


@pytest.mark.parametrize("kwargs, named", [
    (dict(granularity=False), "units of 256"),
    (dict(block_limit=False), "at most 32 blocks"),
    (dict(reserved=False), "1 KiB of shared memory for the system"),
])
def test_occupancy_mistakes_are_named(sol17, kwargs, named):
    r = grade(STEM, "occupancy", with_answer(sol17, occupancy=_calculator(**kwargs)))
    assert r.status == "failed" and named in _messages(r), _messages(r)
    assert r.score < EX["occupancy"].points


def test_the_course_calculator_earns_nothing(sol17):
    from gpulab.aot import occupancy as course

    def borrowed(registers, shared_bytes, threads, device):
        blocks, limiter = course(registers, threads, shared_bytes, device)
        return {"blocks_per_sm": blocks, "warps_per_sm": blocks * math.ceil(threads / 32), "limiter": limiter}
    r = public(STEM, "occupancy", with_answer(sol17, occupancy=borrowed))
    assert r.score == 0 and "gpulab.aot.occupancy, a course helper this lab does not offer" in r.message, r.message


def test_the_compile_table_is_what_nvcc_makes_of_the_course_kernels():
    """Every C++ kernel of the lesson and the solution compiles for sm_80 and sm_90 (cached by content), and
    the committed table is what this nvcc reports; another nvcc version may differ, so then only compile."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_simt_compile", ROOT / "benchmarks" / "cuda_simt_compile.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = script.table()
    committed = json.loads((ROOT / "benchmarks" / "results" / "17_cuda_simt_compile.json").read_text())
    assert {(r["kernel"], r["arch"]) for r in data["kernels"]} >= {(k, a) for k in (
        "block_sum", "smooth_slow", "smooth_fast", "transpose_naive", "transpose_padded", "histogram_shared",
        "softmax_warp") for a in ("sm_80", "sm_90")}
    if data["nvcc"] == committed["nvcc"]:
        assert data == committed, "stale: run python benchmarks/cuda_simt_compile.py"
    rows = {(r["kernel"], r["arch"]): r for r in data["kernels"]}
    assert all(rows[("block_sum", a)]["shfl"] and rows[("softmax_warp", a)]["shfl"] for a in ("sm_80", "sm_90"))
    assert all(rows[("smooth_slow", a)]["spill_stores"] > 0 for a in ("sm_80", "sm_90"))


# --- 8 · fix this kernel's occupancy ----------------------------------------------------------------------------------

def _slow_source(sol17) -> str:
    import nbformat

    nb = nbformat.read(ROOT / "solutions" / f"{STEM}.ipynb", as_version=4)
    given = next(c.source for c in nb.cells if c.get("id") == "fix-given")
    ns: dict = {}
    exec(given.split("slow_reports")[0], ns)  # the SMOOTH_SLOW_CU literal only: no compile
    return ns["SMOOTH_SLOW_CU"].replace("smooth_slow", "smooth_fast")


def test_the_given_kernel_renamed_still_spills(sol17):
    source = _slow_source(sol17)
    r = public(STEM, "fix_occupancy", with_answer(sol17, smooth_fast=lambda: (source, 1024)))
    assert r.status == "failed" and "still spills" in r.message


def test_a_kernel_without_the_register_cap_cannot_fit_1024_threads(sol17):
    source = _slow_source(sol17).replace("__launch_bounds__(1024, 1)", "")
    r = public(STEM, "fix_occupancy", with_answer(sol17, smooth_fast=lambda: (source, 1024)))
    assert r.status == "failed" and "block(s) per SM" in r.message, r.message


# --- 9 · an RAII device buffer --------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, named", [
    ("    DeviceBuffer(const DeviceBuffer&) = delete;",
     "    DeviceBuffer(const DeviceBuffer& o) : ptr_(o.ptr_), n_(o.n_) {}", "can be copied"),
    ("ptr_(std::exchange(other.ptr_, nullptr))", "ptr_(other.ptr_)", "frees its memory twice"),
    ("            Alloc::release(ptr_);                               // the buffer this one held\n", "",
     "leaks the buffer the target held"),
])
def test_raii_mistakes_are_named(sol17, old, new, named):
    source = sol17["device_buffer_source"]()
    assert old in source
    r = public(STEM, "raii_buffer", with_answer(sol17, device_buffer_source=lambda: source.replace(old, new)))
    assert r.status == "failed" and named in r.message, r.message


# --- on a GPU: the solution's C++ kernels run for real ---------------------------------------------------------

@pytest.mark.gpu
def test_the_cpp_kernels_compute_on_a_gpu(sol17):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from gpulab.cuda_cpp import load_inline

    fast_source, threads = sol17["smooth_fast"]()
    wrappers = r"""
torch::Tensor block_sums(torch::Tensor x) {
    int n = x.numel(), blocks = (n + 255) / 256;
    auto partial = torch::empty({blocks}, x.options());
    block_sum<<<blocks, 256>>>(x.data_ptr<float>(), partial.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return partial;
}
torch::Tensor smooth(torch::Tensor x, torch::Tensor w, int64_t threads) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    smooth_fast<<<(n + threads - 1) / threads, threads>>>(x.data_ptr<float>(), w.data_ptr<float>(),
                                                         y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""
    module = load_inline("lab17_test", "#include <torch/extension.h>\n#include <c10/cuda/CUDAException.h>\n"
                         + sol17["block_sum_source"]() + fast_source + wrappers,
                         "torch::Tensor block_sums(torch::Tensor x);\n"
                         "torch::Tensor smooth(torch::Tensor x, torch::Tensor w, int64_t threads);",
                         ["block_sums", "smooth"])
    x = torch.randn(100_003, device="cuda")
    torch.testing.assert_close(module.block_sums(x).sum(), x.sum(), rtol=1e-4, atol=1e-2)
    w = torch.randn(97, device="cuda")
    want = torch.nn.functional.conv1d(x.view(1, 1, -1), w.view(1, 1, -1), padding=48).view(-1)  # (n,)
    torch.testing.assert_close(module.smooth(x, w, threads), want, rtol=1e-4, atol=1e-4)
