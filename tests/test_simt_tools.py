"""The tools of lesson 17: the warp model against the CUDA C++ Programming Guide's own examples and rules, the
simulator's access record, and nvcc from the PyPI wheel."""
import numpy as np
import pytest

from gpulab.warp import FULL_MASK, Warp, WarpError

LANE = np.arange(32)
cuda = None  # numba.cuda, in NVIDIA's simulator once a test imports gpulab.simt


# --- gpulab.warp: the Programming Guide's examples ("Warp Shuffle Functions", examples) -------------------

def test_broadcast_of_a_single_value_across_a_warp():
    # if (laneId == 0) value = arg; value = __shfl_sync(0xffffffff, value, 0);
    value = np.where(LANE == 0, 42.0, 0.0)
    assert (Warp().shfl_sync(FULL_MASK, value, 0) == 42).all()


def test_inclusive_plus_scan_across_sub_partitions_of_8_threads():
    # value = 31 - laneId; for (i = 1; i <= 4; i *= 2) { n = __shfl_up_sync(0xffffffff, value, i, 8);
    #                                                    if ((laneId & 7) >= i) value += n; }
    warp, value = Warp(), (31 - LANE).astype(float)
    for i in (1, 2, 4):
        n = warp.shfl_up_sync(FULL_MASK, value, i, 8)
        value = np.where((LANE & 7) >= i, value + n, value)
    want = np.concatenate([np.cumsum(31 - LANE[s:s + 8]) for s in range(0, 32, 8)])
    assert (value == want).all()


def test_reduction_across_a_warp_by_xor_butterfly():
    # value = 31 - laneId; for (i = 16; i >= 1; i /= 2) value += __shfl_xor_sync(0xffffffff, value, i, 32);
    warp, value = Warp(), (31 - LANE).astype(float)
    for i in (16, 8, 4, 2, 1):
        value = value + warp.shfl_xor_sync(FULL_MASK, value, i, 32)
    assert (value == 496).all()


def test_shuffles_past_a_segment_return_the_lanes_own_value():
    warp, v = Warp(), LANE.astype(float)
    assert (warp.shfl_down_sync(FULL_MASK, v, 4)[28:] == v[28:]).all()            # lane + 4 > 31: own value
    assert (warp.shfl_up_sync(FULL_MASK, v, 2, 8)[[8, 9]] == [8, 9]).all()        # lane - 2 leaves its segment of 8
    xor = warp.shfl_xor_sync(FULL_MASK, v, 16, 16)  # an earlier segment may be read, a later one gives its own value
    assert (xor[:16] == v[:16]).all() and (xor[16:] == v[:16]).all()
    assert (warp.shfl_sync(FULL_MASK, v, 17, 16)[16:] == 17).all()                # src_lane % width in its own segment
    assert (warp.shfl_sync(FULL_MASK, v, 17, 16)[:16] == 1).all()


def test_ballot_counts_only_active_lanes_in_the_mask():
    warp = Warp(active=[lane % 2 == 0 for lane in range(32)])
    assert warp.activemask() == 0x55555555
    assert warp.ballot_sync(warp.activemask(), np.ones(32, bool)) == 0x55555555


def test_masks_that_break_the_rules_are_refused_and_silent_sources_are_undefined():
    tail = Warp(active=[lane < 20 for lane in range(32)])
    with pytest.raises(WarpError, match="names lane 20"):
        tail.shfl_down_sync(FULL_MASK, LANE.astype(float), 1)
    with pytest.raises(WarpError, match="lane 19 executes it but its bit is not set"):
        tail.ballot_sync(0x7FFFF, np.ones(32, bool))
    out = tail.shfl_down_sync(tail.activemask(), LANE.astype(float), 16)
    assert out[3] == 19 and np.isnan(out[4]) and np.isnan(out[25])  # lane 4 reads lane 20, which did not take part


# --- gpulab.simt: the access record -------------------------------------------------------------------------------

def test_the_record_finds_a_race_and_atomics_once_each():
    global cuda  # the simulator swaps a kernel's global `cuda` for its own module
    from gpulab.simt import cuda, recording

    @cuda.jit
    def kernel(x, out, hist):
        s = cuda.shared.array(32, dtype=np.float32)
        t = cuda.threadIdx.x
        s[t] = x[t]
        out[t] = s[31 - t]  # no barrier: a race
        cuda.atomic.add(hist, 0, 1)

    x, out, hist = np.arange(32, dtype=np.float32), np.zeros(32, np.float32), np.zeros(1, np.int32)
    with recording() as rec:
        kernel[1, 32](x, out, hist)
    shared = [a for a in rec.accesses if a.space == "shared"]
    assert {(a.kind, a.epoch) for a in shared} == {("w", 0), ("r", 0)}
    reads = {a.thread: a.index for a in shared if a.kind == "r"}
    assert reads[0] == 31 and hist[0] == 32
    atomics = [a for a in rec.accesses if a.kind == "a"]
    assert len(atomics) == 32 and {a.space for a in atomics} == {"global"}
    assert rec.shapes[[a.array for a in shared][0]] == ("shared", (32,), "float32")


# --- gpulab.cuda_cpp: nvcc from the wheel ---------------------------------------------------------------------------

def test_nvcc_comes_from_the_pypi_wheel_and_reports_resources():
    from gpulab.cuda_cpp import CompileError, compile_report, nvcc

    assert "site-packages" in str(nvcc()) and "nvidia" in str(nvcc())
    source = ('extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {\n'
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] += a * x[i];\n}\n")
    report = compile_report(source, "sm_90")["axpy"]
    assert 0 < report.registers <= 32 and report.spills == 0 and report.uses("FFMA") and not report.uses("SHFL")
    with pytest.raises(CompileError, match="kernel.cu"):
        compile_report(source.replace("threadIdx.x;", "threadIdx.x"), "sm_90")


def test_the_judge_reads_accesses_with_the_simulator_record_s_fields():
    from gpulab.simt import FIELDS
    from grader.checks import load_lab

    assert load_lab("17_cuda_simt").Access._fields == FIELDS
