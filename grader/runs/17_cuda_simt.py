"""The learner side of lab 17_cuda_simt: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answers, launches their kernels in NVIDIA's
CUDA simulator (recording every memory access), compiles their CUDA C++ with nvcc, and returns plain
observations; it knows no answer (references and verdicts are in ``grader/checks/17_cuda_simt.py``).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from grader.exercise import borrowed, entry

# The simulator runs each thread of a block as an OS thread, and the grading sandbox caps a worker's threads
# (grader.sandbox.PROCESSES): blocks stay at 128 threads or fewer.
BLOCK_THREADS = 64            # the reduction's and the histogram's blocks (the lab's THREADS)
HISTOGRAM_BLOCKS = 2
TILE, ROWS = 32, 4            # the transpose's tile and its (TILE, ROWS) block of threads: 128 of them


def _plain(value):
    """Numbers, tuples and lists as plain Python values (NumPy scalars from the learner's code too)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _accesses(recorder) -> dict:
    return {"accesses": [dataclasses.astuple(a) for a in recorder.accesses], "shapes": list(recorder.shapes)}


# --- 1 · indexing and sectors ---------------------------------------------------------------------

def _indexing_run(ns, case, device):
    x = case.inputs
    index, lanes, sectors = (entry(ns, n) for n in ("global_index_2d", "warp_lane", "sectors_per_request"))
    return {"index": [_plain(index(b, d, t)) for b, d, t in x["launches"]],
            "warp_lane": [_plain(lanes(t, d)) for t, d in x["threads"]],
            "sectors": [_plain(sectors(list(a), e)) for a, e in x["requests"]]}


# --- 2 · block reduction: a CUDA Python kernel in the simulator, and its CUDA C++ twin ---------------

def _block_reduce_run(ns, case, device):
    from gpulab.cuda_cpp import compile_report
    from gpulab.simt import recording

    kernel = entry(ns, "block_sum_kernel")
    source = entry(ns, "block_sum_source")()
    x = case.inputs["x"].numpy()
    blocks = math.ceil(len(x) / BLOCK_THREADS)
    partial = np.full(blocks, np.nan, dtype=np.float32)  # poisoned: a block that writes nothing shows
    with recording() as rec:
        kernel[blocks, BLOCK_THREADS](x, partial)
    reports = compile_report(source, case.inputs["arch"])
    return {"partial": partial.tolist(), **_accesses(rec),
            "compiled": {name: r.as_dict() for name, r in reports.items()}}


# --- 3 · warp shuffles and votes, lane by lane -----------------------------------------------------

def _warp_shuffle_run(ns, case, device):
    from gpulab.warp import Warp

    x = case.inputs
    sums, maxes, votes = [], [], []
    for v in x["sum_values"]:
        warp = Warp()
        sums.append({"lanes": np.asarray(entry(ns, "warp_sum")(warp, np.array(v)), dtype=float).tolist(),
                     "calls": warp.calls})
    for v in x["max_values"]:
        warp = Warp()
        maxes.append({"lanes": np.asarray(entry(ns, "warp_max_all")(warp, np.array(v)), dtype=float).tolist(),
                      "calls": warp.calls})
    for active, pred in x["votes"]:
        warp = Warp(active)
        votes.append({"vote": _plain(tuple(entry(ns, "vote")(warp, np.array(pred, dtype=bool)))),
                      "calls": warp.calls})
    return {"sum": sums, "max": maxes, "vote": votes}


def _warp_softmax_run(ns, case, device):
    from gpulab.warp import Warp

    out = []
    for row in case.inputs["rows"]:
        warp = Warp()
        got = np.asarray(entry(ns, "softmax_row")(warp, np.array(row, dtype=np.float64)), dtype=float)
        out.append({"row": got.tolist(), "calls": warp.calls})
    return {"rows": out}


# --- 4 · bank conflicts and the tiled transpose -----------------------------------------------------

def _bank_conflicts_run(ns, case, device):
    from gpulab.simt import recording

    degree = entry(ns, "bank_conflict_degree")
    kernel = entry(ns, "transpose_kernel")
    x = case.inputs["x"].numpy()
    n, m = x.shape
    out = np.full((m, n), np.nan, dtype=np.float32)  # poisoned: an element never written shows
    with recording() as rec:
        kernel[(math.ceil(m / TILE), math.ceil(n / TILE)), (TILE, ROWS)](x, out)
    return {"degrees": [_plain(degree(list(a))) for a in case.inputs["layouts"]], "out": out.tolist(),
            **_accesses(rec)}


# --- 5 · histogram with shared-memory privatisation ---------------------------------------------------

def _histogram_run(ns, case, device):
    from gpulab.simt import recording

    kernel = entry(ns, "histogram_kernel")
    x = case.inputs["x"].numpy()
    hist = np.zeros(case.inputs["bins"], dtype=np.int32)
    with recording() as rec:
        kernel[HISTOGRAM_BLOCKS, BLOCK_THREADS](x, hist)
    return {"hist": hist.tolist(), **_accesses(rec)}


# --- 6 · occupancy ------------------------------------------------------------------------------------

def _occupancy_run(ns, case, device):
    from gpulab.aot import occupancy as course_calculator
    from gpulab.cuda_cpp import TARGETS

    fn = entry(ns, "occupancy")
    found = borrowed(fn, forbidden=(course_calculator,))
    if found:
        return {"borrowed": found}
    got = []
    for k in case.inputs["kernels"]:
        r = fn(k["registers"], k["shared"], k["threads"], TARGETS[k["arch"]])
        got.append({key: _plain(r.get(key)) if isinstance(r, dict) else None
                    for key in ("blocks_per_sm", "warps_per_sm", "limiter")})
    return {"results": got}


# --- 7 · fix this kernel's occupancy ------------------------------------------------------------------

def _fix_occupancy_run(ns, case, device):
    from gpulab.cuda_cpp import compile_report

    source, threads = entry(ns, "smooth_fast")()
    return {"threads": _plain(threads),
            "compiled": {arch: {name: r.as_dict() for name, r in compile_report(source, arch).items()}
                         for arch in case.inputs["archs"]}}


# --- 8 · an RAII device buffer, compiled and unit-tested on the host ---------------------------------

# The test program around the learner's DeviceBuffer<T, Alloc>: an allocator that counts, refuses on
# request and knows which pointers it handed out; each scenario prints what happened, never a verdict.
RAII_HARNESS_HEAD = r"""
#include <cstddef>
#include <cstdio>
#include <new>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>

struct CountingAlloc {
    static inline int allocs = 0, frees = 0, bad_frees = 0, refuse_next = 0;
    static inline std::set<void*> live;
    static void* allocate(std::size_t bytes) {
        if (refuse_next) { refuse_next = 0; throw std::bad_alloc(); }
        void* p = ::operator new(bytes == 0 ? 1 : bytes);
        ++allocs;
        live.insert(p);
        return p;
    }
    static void release(void* p) noexcept {
        if (p == nullptr) return;
        if (live.erase(p) == 0) { ++bad_frees; return; }  // freed twice, or never allocated
        ++frees;
        ::operator delete(p);
    }
};
"""

RAII_HARNESS_MAIN = r"""
using Buf = DeviceBuffer<float, CountingAlloc>;
static void report(const char* scenario) {
    std::printf("%s allocs=%d frees=%d bad_frees=%d live=%zu\n", scenario, CountingAlloc::allocs,
                CountingAlloc::frees, CountingAlloc::bad_frees, CountingAlloc::live.size());
    CountingAlloc::allocs = CountingAlloc::frees = CountingAlloc::bad_frees = 0;
    CountingAlloc::live.clear();  // each scenario starts clean (a leak is reported once)
}
int main() {
    std::printf("traits copy_constructible=%d copy_assignable=%d nothrow_move_constructible=%d "
                "nothrow_move_assignable=%d\n", (int)std::is_copy_constructible_v<Buf>,
                (int)std::is_copy_assignable_v<Buf>, (int)std::is_nothrow_move_constructible_v<Buf>,
                (int)std::is_nothrow_move_assignable_v<Buf>);
    { Buf b(16); std::printf("sized size=%zu data=%d\n", (size_t)b.size(), (int)(b.data() != nullptr)); }
    report("scope");
    { Buf a(8); Buf b(std::move(a)); std::printf("moved source_data=%d target_data=%d\n",
                                                 (int)(a.data() != nullptr), (int)(b.data() != nullptr)); }
    report("move_construct");
    { Buf a(8); Buf b(4); b = std::move(a); }
    report("move_assign");
    try { Buf a(8); throw std::runtime_error("after the allocation"); } catch (const std::runtime_error&) {}
    report("exception");
    int caught = 0;
    try { CountingAlloc::refuse_next = 1; Buf a(8); } catch (const std::bad_alloc&) { caught = 1; }
    std::printf("refusal caught=%d\n", caught);
    report("refused");
}
"""


def _raii_buffer_run(ns, case, device):
    from gpulab.cuda_cpp import run_host_program

    source = entry(ns, "device_buffer_source")()
    out = run_host_program(RAII_HARNESS_HEAD + source + RAII_HARNESS_MAIN)
    return {"lines": out.splitlines()}
