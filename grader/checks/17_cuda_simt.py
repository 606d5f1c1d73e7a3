"""Checks of lab 17, CUDA C++ and the SIMT model: indexing, sectors, a block reduction, warp shuffles,
a one-warp softmax, bank conflicts, a histogram, occupancy, a kernel's occupancy fixed, an RAII buffer.

Kernels written in CUDA Python run in NVIDIA's CUDA simulator (numba-cuda), which records every memory
access (``gpulab.simt``); the verdicts here read that record: a race (two threads of a block touching
one shared element between the same two barriers, one writing), shared memory read before any thread
wrote it, a warp request's 32-byte sectors and bank conflicts. CUDA C++ is compiled by NVIDIA's nvcc
(``gpulab.cuda_cpp``) and judged from ``ptxas``'s and ``cuobjdump``'s report; host C++ is compiled into a
test program that runs on the CPU. Lane-level answers run on ``gpulab.warp``, the Programming Guide's
semantics of shuffles and votes.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict, namedtuple

import numpy as np
import torch

from gpulab.aot import occupancy as ref_occupancy
from gpulab.cuda_cpp import TARGETS
from gpulab.paths import ROOT
from gpulab.warp import FULL_MASK, Warp
from grader.exercise import Case, Exercise
from grader.kit.cases import choice, randint, uniform
from grader.kit.helpers import offering
from grader.kit.neutral import neutral
from grader.runs import run_side

LAB = "17_cuda_simt"
RUN = run_side(LAB)  # the learner side: grader/runs/17_cuda_simt.py
TITLE = "CUDA C++ and the SIMT model"
COMPILE_TABLE = ROOT / "benchmarks" / "results" / "17_cuda_simt_compile.json"  # nvcc's reports of the course kernels

# One recorded access, as gpulab.simt.Access sends it (its fields, in order; imported here without numba)
Access = namedtuple("Access", ("block", "thread", "epoch", "order", "space", "array", "kind", "index", "itemsize"))


# --- what a recorded launch shows (judge side) ------------------------------------------------------

def _log(obs) -> list:
    return [Access(*a) for a in obs["accesses"]]


def _race(accesses, shapes) -> str | None:
    """A message for the first shared element two threads of one block touch between the same two
    barriers, at least one writing (atomics only race with plain accesses)."""
    touched: dict = defaultdict(lambda: {"w": set(), "r": set(), "a": set()})
    for a in accesses:
        if a.space == "shared":
            touched[(a.block, a.epoch, a.array, a.index)][a.kind].add(a.thread)
    for (block, epoch, array, index), by in sorted(touched.items()):
        writers, others = by["w"], by["r"] | by["a"]
        clash = None
        if len(writers) > 1:
            clash = sorted(writers)[:2], "both write"
        elif writers and others - writers:
            clash = [next(iter(writers)), min(others - writers)], "one writes, the other reads it"
        elif by["a"] and by["r"] - by["a"]:
            clash = [min(by["a"]), min(by["r"] - by["a"])], "one updates it atomically, the other reads it"
        if clash:
            (t1, t2), what = clash
            name = _element(shapes, array, index)
            return (f"race on shared memory: threads {t1} and {t2} of block {block} both touch {name} between "
                    f"barrier {epoch} and the next ({what}). A thread may only read what another wrote after a "
                    "cuda.syncthreads() that both pass: add the missing barrier.")
    return None


def _element(shapes, array, index) -> str:
    shape = tuple(shapes[array][1]) if array < len(shapes) else ()
    where = tuple(int(i) for i in np.unravel_index(index, shape)) if shape else (index,)
    return f"shared array #{array}{list(where)}"


def _uninitialised(accesses, shapes) -> str | None:
    """A message for a shared element read (or updated atomically) before any thread of the block wrote it."""
    first_write: dict = {}
    for a in accesses:
        if a.space == "shared" and a.kind == "w":
            key = (a.block, a.array, a.index)
            first_write[key] = min(first_write.get(key, a.epoch), a.epoch)
    for a in sorted(accesses):
        written = first_write.get((a.block, a.array, a.index), a.epoch + 1)
        if a.space == "shared" and a.kind in "ra" and written > a.epoch:
            return (f"thread {a.thread} of block {a.block} reads {_element(shapes, a.array, a.index)} before any "
                    "thread of the block wrote it: shared memory starts with garbage (the simulator fills it with "
                    "NaN). Initialise it, then cuda.syncthreads().")
    return None


def _requests(accesses, space: str) -> dict:
    """{(block, epoch, warp, kind, array, order): {lane: byte address}}: one warp request each."""
    groups: dict = defaultdict(dict)
    for a in accesses:
        if a.space == space:
            groups[(a.block, a.epoch, a.thread // 32, a.kind, a.array, a.order)][a.thread % 32] = a.index * a.itemsize
    return groups


def ref_sectors(addresses, elem_bytes: int) -> int:
    """32-byte sectors one warp request touches (``None``: a lane not taking part)."""
    return len({s for a in addresses if a is not None for s in range(a // 32, (a + elem_bytes - 1) // 32 + 1)})


def ref_bank_degree(addresses) -> int:
    """Wavefronts one shared-memory request needs: per bank (4-byte word % 32), the distinct words asked."""
    banks: dict = defaultdict(set)
    for a in addresses:
        if a is not None:
            banks[(a // 4) % 32].add(a // 4)
    return max((len(w) for w in banks.values()), default=0)


def _uncoalesced(accesses) -> str | None:
    for key, lanes in sorted(_requests(accesses, "global").items()):
        itemsize = next(a.itemsize for a in accesses if a.space == "global" and a.array == key[4])
        got = ref_sectors(list(lanes.values()), itemsize)
        need = math.ceil(len(lanes) * itemsize / 32) + 1  # a contiguous run, possibly misaligned
        if got > need:
            verb = {"r": "loads", "w": "stores", "a": "atomics"}[key[3]]
            return (f"uncoalesced global {verb}: warp {key[2]} of block {key[0]} touches {got} sectors "
                    f"({32 * got} bytes moved) for {len(lanes) * itemsize} useful bytes. Consecutive lanes "
                    "(threadIdx.x) must access consecutive addresses: the column index follows threadIdx.x.")
    return None


def _conflicted(accesses, shapes) -> str | None:
    worst, where = 1, None
    for key, lanes in _requests(accesses, "shared").items():
        degree = ref_bank_degree(list(lanes.values()))
        if degree > worst:
            worst, where = degree, key
    if where is None:
        return None
    shape = tuple(shapes[where[4]][1])
    verb = "reads" if where[3] == "r" else "writes"
    msg = (f"shared-memory bank conflicts: warp {where[2]}'s {verb} of a tile of shape {shape} are {worst}-way "
           f"conflicted ({worst} wavefronts instead of 1).")
    if len(shape) == 2 and shape[1] % 32 == 0 and shape[1] > shape[0]:
        msg += f" A row of {shape[1]} words is still a multiple of the 32 banks: pad by one word, ({shape[0]}, " \
               f"{shape[0] + 1})."
    elif len(shape) == 2:
        msg += f" Reading a column walks {shape[1]} words per step: pad each row by one word ({shape[0]}, " \
               f"{shape[1] + 1}) so consecutive rows start in consecutive banks."
    return msg


def _simulated(obs) -> str | None:
    """The race, uninitialised-read verdicts every simulated kernel gets."""
    accesses = _log(obs)
    return _race(accesses, obs["shapes"]) or _uninitialised(accesses, obs["shapes"])


# --- 1 · indexing and sectors -------------------------------------------------------------------------

def _aligned(gen) -> int:
    return 128 * randint(gen, 0, 1000)


def _request(rule: str, gen) -> tuple:
    """(32 lane addresses, element bytes) of one warp request of a kind."""
    base = _aligned(gen)
    if rule == "contiguous float32":
        return [base + 4 * i for i in range(32)], 4
    if rule == "strided float32":
        stride = randint(gen, 2, 33)
        return [base + 4 * stride * i for i in range(32)], 4
    if rule == "misaligned float32":
        return [base + 4 * randint(gen, 1, 7) + 4 * i for i in range(32)], 4
    if rule == "8-byte elements":
        return [base + 8 * i for i in range(32)], 8
    if rule == "lanes not taking part":
        k = randint(gen, 3, 29)
        return [base + 4 * 8 * i if i < k else None for i in range(32)], 4
    if rule == "every lane one address":
        return [base + 4 * randint(gen, 0, 31)] * 32, 4
    if rule == "a column of a row-major matrix":
        width = randint(gen, 33, 4096)
        return [base + 2 * width * i for i in range(32)], 2
    raise KeyError(rule)


REQUEST_RULES = ("contiguous float32", "strided float32", "misaligned float32", "8-byte elements",
                 "lanes not taking part", "every lane one address", "a column of a row-major matrix")


def _indexing_cases(gen, public):
    def launches(k):
        out = []
        for _ in range(k):
            dim = (choice(gen, [8, 16, 32, 64]), choice(gen, [1, 2, 4, 8, 16]))
            out.append(((randint(gen, 0, 9), randint(gen, 0, 9)), dim,
                        (randint(gen, 0, dim[0] - 1), randint(gen, 0, dim[1] - 1))))
        return out

    def threads(k):
        out = []
        for _ in range(k):
            dim = (choice(gen, [4, 8, 16, 32, 48]), choice(gen, [2, 3, 4, 8]), choice(gen, [1, 2, 3]))
            out.append(((randint(gen, 0, dim[0] - 1), randint(gen, 0, dim[1] - 1), randint(gen, 0, dim[2] - 1)),
                        dim))
        return out

    if public:
        return [Case("a 2-D launch of 16 x 16 blocks, float32 requests",
                     dict(launches=[((2, 1), (16, 16), (3, 5)), ((0, 3), (32, 8), (31, 7))],
                          threads=[((5, 1, 0), (32, 2, 1)), ((3, 2, 1), (16, 4, 2))],
                          requests=[_request("contiguous float32", gen), _request("strided float32", gen)]))]
    return [Case(f"{rule}: {3} launches, {3} threads", dict(launches=launches(3), threads=threads(3),
                                                           requests=[_request(rule, gen)]))
            for rule in REQUEST_RULES]


def _indexing_judge(case, obs):
    x = case.inputs
    for (b, d, t), got in zip(x["launches"], obs["index"]):
        want = (b[1] * d[1] + t[1], b[0] * d[0] + t[0])
        if got is None or tuple(got) != want:
            msg = (f"global_index_2d(block_idx={b}, block_dim={d}, thread_idx={t}) = {got}, "
                   f"expected (row, col) = {want}.")
            if got is not None and tuple(got) == want[::-1]:
                msg += " Row and column are swapped: x (the fast axis) indexes columns, y rows."
            return msg
    for (t, d), got in zip(x["threads"], obs["warp_lane"]):
        linear = t[0] + d[0] * (t[1] + d[1] * t[2])
        want = (linear // 32, linear % 32)
        if got is None or tuple(got) != want:
            return (f"warp_lane(thread_idx={t}, block_dim={d}) = {got}, expected {want}: threads are numbered "
                    f"x + blockDim.x * (y + blockDim.y * z) = {linear}, and a warp is 32 consecutive numbers.")
    for (addresses, e), got in zip(x["requests"], obs["sectors"]):
        want = ref_sectors(addresses, e)
        if got != want:
            active = [a for a in addresses if a is not None]
            msg = (f"sectors_per_request for lanes at {_short(addresses)} ({e}-byte elements) = {got!r}, "
                   f"expected {want} (the {want} distinct 32-byte sectors the lanes touch).")
            if got == math.ceil(len(active) * e / 32) and got != want:
                msg += " You counted the useful bytes / 32; count the sectors the addresses really fall in."
            elif got == len({a // 128 for a in active}):
                msg += " You counted 128-byte cache lines; memory moves 32-byte sectors."
            elif got == ref_sectors([a if a is not None else 0 for a in addresses], e):
                msg += " Lanes marked None do not take part: skip them."
            return msg
    return None


def _short(addresses) -> str:
    shown = ", ".join("None" if a is None else str(a) for a in addresses[:4])
    return f"[{shown}, ...]"


INDEXING = Exercise("indexing", 2, ("global_index_2d", "warp_lane", "sectors_per_request"), _indexing_cases,
                    RUN._indexing_run, _indexing_judge, title="Threads, warps and sectors",
                    hint="col = blockIdx.x * blockDim.x + threadIdx.x; warp = linear thread id // 32; "
                         "a sector is 32 bytes: count the distinct addr // 32 of the lanes taking part.")


# --- 2 · block reduction --------------------------------------------------------------------------------

def _block_reduce_cases(gen, public):
    threads = RUN.BLOCK_THREADS
    if public:
        sizes = [("a ragged tail", 200, "sm_90"), ("whole blocks", 128, "sm_90")]
    else:
        sizes = [("a ragged tail", threads * randint(gen, 1, 2) + randint(gen, 1, threads - 1), "sm_80"),
                 ("one partial block", randint(gen, 2, threads - 1), "sm_90"),
                 ("whole blocks", threads * randint(gen, 1, 3), "sm_90")]
    return [Case(f"{rule}: n={n}, compiled for {arch}",
                 dict(x=torch.randint(-50, 50, (n,), generator=gen).float() / 4, arch=arch))
            for rule, n, arch in sizes]


def _block_reduce_judge(case, obs):
    problem = _simulated(obs)
    if problem:
        return problem
    x = case.inputs["x"].double()
    threads = RUN.BLOCK_THREADS
    want = [float(x[b * threads:(b + 1) * threads].sum()) for b in range(math.ceil(len(x) / threads))]
    got = obs["partial"]
    for b, (g, w) in enumerate(zip(got, want)):
        if not (abs(g - w) <= 1e-4 * (1 + abs(w))):
            last = b == len(want) - 1
            msg = f"block {b} wrote {g}, expected {w} (the sum of x[{b * threads}:{min(len(x), (b + 1) * threads)}])."
            if math.isnan(g):
                msg += " It wrote nothing: thread 0 of each block writes partial[blockIdx.x]."
            elif last and len(x) % threads and abs(g - (w - float(x[-1]))) < 1e-4 * (1 + abs(w)):
                msg += " The last element is missing: the tail guard must be `i < n`, not `i < n - 1`."
            elif last and len(x) % threads:
                msg += " This is the ragged tail block: threads past the end must contribute 0."
            return msg
    return _block_sum_compiled(case, obs)


def _block_sum_compiled(case, obs):
    arch = case.inputs["arch"]
    report = obs["compiled"].get("block_sum")
    if report is None:
        return (f"block_sum_source() compiled for {arch}, but it defines no kernel named block_sum (kernels found: "
                f"{sorted(obs['compiled'])}). Declare it `extern \"C\" __global__ void block_sum(...)`.")
    ops = report["sass"]
    if not any(op.startswith("SHFL") for op in ops):
        return (f"nvcc's SASS of block_sum for {arch} has no SHFL instruction: finish the reduction within one warp "
                "with __shfl_down_sync (offsets 16, 8, 4, 2, 1) instead of more shared-memory steps and barriers.")
    if not any(op.startswith("BAR") for op in ops):
        return (f"block_sum for {arch} has no barrier (BAR) in its SASS: the shared-memory tree needs "
                "__syncthreads() between its steps.")
    if report["spill_stores"] or report["spill_loads"]:
        return f"block_sum spills registers for {arch} ({report['spill_stores']} bytes stored): keep it simple."
    return None


BLOCK_REDUCE = Exercise("block_reduce", 3, ("block_sum_kernel", "block_sum_source"), _block_reduce_cases,
                        RUN._block_reduce_run, _block_reduce_judge,
                        title="A block reduction, in the simulator and in C++",
                        hint="Load (0 past the end), barrier, halve the stride each step with a barrier after each; "
                             "in C++ stop the tree at 32 and finish with __shfl_down_sync.")


# --- 3 · warp shuffles and votes ------------------------------------------------------------------------

def ref_warp_sum(v) -> np.ndarray:
    warp = Warp()
    for offset in (16, 8, 4, 2, 1):
        v = v + warp.shfl_down_sync(FULL_MASK, v, offset)
    return v


def _votes(rule: str, gen) -> tuple:
    pred = [bool(randint(gen, 0, 1)) for _ in range(32)]
    if rule == "full warp":
        active = [True] * 32
    elif rule == "a tail warp":
        k = randint(gen, 3, 30)
        active = [i < k for i in range(32)]
    elif rule == "divergent lanes":
        active = [bool(randint(gen, 0, 1)) or i == 0 for i in range(32)]
        pred = [p or not a for p, a in zip(pred, active)]  # inactive lanes' predicates are true: they must not count
        pred[0] = False
    elif rule == "no lane votes yes":
        active = [i < randint(gen, 8, 32) for i in range(32)]
        pred = [not a for a in active]
    else:
        raise KeyError(rule)
    return active, pred


VOTE_RULES = ("full warp", "a tail warp", "divergent lanes", "no lane votes yes")


def _warp_shuffle_cases(gen, public):
    def values(scale):
        return [float(v) for v in (torch.randint(-scale, scale, (32,), generator=gen))]

    rules = ("full warp", "a tail warp") if public else VOTE_RULES
    return [Case(f"{rule}: integer lane values", dict(sum_values=[values(100)], max_values=[values(1000)],
                                                      votes=[_votes(rule, gen)]))
            for rule in rules]


def _warp_shuffle_judge(case, obs):
    x = case.inputs
    for v, got in zip(x["sum_values"], obs["sum"]):
        want, lanes = ref_warp_sum(np.array(v)), np.array(got["lanes"])
        if lanes.shape != (32,) or not np.array_equal(lanes, want):
            return _sum_message(v, lanes, want, got["calls"])
    for v, got in zip(x["max_values"], obs["max"]):
        lanes = np.array(got["lanes"])
        if lanes.shape != (32,) or not np.all(lanes == max(v)):
            wrong = int(np.argmax(lanes != max(v))) if lanes.shape == (32,) else 0
            msg = (f"warp_max_all: lane {wrong} holds {lanes[wrong] if lanes.shape == (32,) else lanes}, expected "
                   f"the warp's max {max(v)} in every lane.")
            if any(c[0] == "shfl_down_sync" for c in got["calls"]):
                msg += " shfl_down leaves the result in lane 0 only; a butterfly (shfl_xor_sync) gives it to all."
            return msg
    for (active, pred), got in zip(x["votes"], obs["vote"]):
        yes = [i for i in range(32) if active[i] and pred[i]]
        want = [len(yes), yes[0] if yes else -1]
        if list(got["vote"]) != want:
            msg = f"vote with active lanes {_lanes(active)} = {got['vote']}, expected (count, leader) = {tuple(want)}."
            if got["vote"][0] == sum(pred):
                msg += " You counted lanes that are not active: ballot only sets bits of active lanes in the mask."
            return msg
        masks = {c[1] for c in got["calls"] if c[0] == "ballot_sync"}
        if not masks:
            return "vote must ask the warp with warp.ballot_sync(mask, pred) (one instruction, no loop over lanes)."
    return None


def _lanes(active) -> str:
    mask = sum(1 << i for i, a in enumerate(active) if a)
    return f"{mask:#010x}"


def _sum_message(v, lanes, want, calls) -> str:
    if lanes.shape != (32,):
        return f"warp_sum must return 32 lane values, got shape {lanes.shape}."
    wrong = int(np.argmax(~np.isclose(lanes, want, equal_nan=False)))
    msg = f"warp_sum: lane {wrong} holds {lanes[wrong]}, expected {want[wrong]} (lane 0: the sum {sum(v)})."
    offsets = [c[2] for c in calls if c[0] == "shfl_down_sync"]
    if np.isnan(lanes).any():
        msg += " A NaN is an undefined value: a lane read a lane outside the mask."
    elif lanes[0] == 2 * sum(v) or 32 in offsets:
        msg += " The first offset was 32: shfl_down by 32 leaves every lane its own value, so it doubled the sum."
    elif offsets and offsets != [16, 8, 4, 2, 1]:
        msg += f" Your offsets were {offsets}; the tree halves them: 16, 8, 4, 2, 1."
    elif any(c[0] != "shfl_down_sync" for c in calls):
        msg += " Use shfl_down_sync (lane i reads lane i + offset); other shuffles move other lanes' values."
    return msg


WARP_SHUFFLE = Exercise("warp_shuffle", 3, ("warp_sum", "warp_max_all", "vote"), _warp_shuffle_cases,
                        RUN._warp_shuffle_run, _warp_shuffle_judge, title="Shuffles and ballots, lane by lane",
                        hint="Tree: v += shfl_down_sync(FULL_MASK, v, offset) for 16, 8, 4, 2, 1. Butterfly: "
                             "shfl_xor_sync. Vote: ballot_sync(warp.activemask(), pred), then popcount and lowest bit.")


# --- 4 · one warp per row: softmax ----------------------------------------------------------------------

def _warp_softmax_cases(gen, public):
    if public:
        shapes = [("one element per lane", 32, 3.0), ("a ragged row", 70, 3.0)]
    else:
        shapes = [("shorter than a warp", randint(gen, 1, 31), 3.0),
                  ("several elements per lane", randint(gen, 33, 200), 3.0),
                  ("large values", randint(gen, 40, 100), uniform(gen, 500.0, 1000.0))]
    return [Case(f"{rule}: n={n}", dict(rows=[(torch.randn(n, generator=gen, dtype=torch.float64) * s).tolist()]))
            for rule, n, s in shapes]


def _warp_softmax_judge(case, obs):
    for row, got in zip(case.inputs["rows"], obs["rows"]):
        r = np.array(row)
        want = np.exp(r - r.max()) / np.exp(r - r.max()).sum()
        out = np.array(got["row"])
        if out.shape != want.shape:
            return f"softmax_row returned shape {out.shape} for a row of {len(row)}; expected {want.shape}."
        if not np.all(np.isfinite(out)):
            return (f"softmax_row of a row with values up to {r.max():.0f} returned inf/NaN: exp overflowed. "
                    "Subtract the row's max (reduced across the warp) before exp.")
        if not np.allclose(out, want, rtol=1e-9, atol=1e-12):
            i = int(np.argmax(np.abs(out - want)))
            msg = f"softmax_row: element {i} (lane {i % 32}) = {out[i]:.6g}, expected {want[i]:.6g}."
            if any(c[0] == "shfl_down_sync" for c in got["calls"]):
                msg += (" After a shfl_down tree only lane 0 holds the max and the sum: use shfl_xor_sync so every "
                        "lane does.")
            return msg
        if len([c for c in got["calls"] if c[0].startswith("shfl")]) < 10:
            return ("softmax_row must reduce across the warp's lanes with shuffles: a butterfly of 5 "
                    "shfl_xor_sync for the max and 5 for the sum (each lane owns row[lane], row[lane + 32], ...).")
    return None


WARP_SOFTMAX = Exercise("warp_softmax", 2, ("softmax_row",), _warp_softmax_cases, RUN._warp_softmax_run,
                        _warp_softmax_judge, title="Softmax with one warp per row",
                        hint="Each lane reduces its own elements, then 5 shfl_xor_sync steps for the max; "
                             "exp(x - max); the same butterfly for the sum; divide.")


# --- 5 · bank conflicts and a tiled transpose -----------------------------------------------------------

def _layout(rule: str, gen) -> list:
    """32 lane byte addresses of one shared-memory request."""
    if rule == "a column of an unpadded tile":
        width = choice(gen, [32, 64, 96])
        return [4 * width * i for i in range(32)]
    if rule == "a column of a padded tile":
        width = choice(gen, [33, 65, 17])
        return [4 * width * i for i in range(32)]
    if rule == "a row":
        return [4 * (randint(gen, 0, 31) * 33 + i) for i in range(32)]
    if rule == "one word for every lane":
        return [4 * randint(gen, 0, 1000)] * 32
    if rule == "a stride of two words":
        return [8 * i for i in range(32)]
    if rule == "lanes not taking part":
        k = randint(gen, 2, 20)
        return [4 * 32 * i if i < k else None for i in range(32)]
    if rule == "half-precision elements":
        width = choice(gen, [64, 66])
        return [2 * width * i for i in range(32)]
    raise KeyError(rule)


LAYOUT_RULES = ("a column of an unpadded tile", "a column of a padded tile", "a row", "one word for every lane",
                "a stride of two words", "lanes not taking part", "half-precision elements")


def _bank_conflicts_cases(gen, public):
    if public:
        x = torch.arange(32 * 40, dtype=torch.float32).reshape(32, 40) / 8
        return [Case("a 32 x 40 matrix and two layouts",
                     dict(x=x, layouts=[_layout("a column of an unpadded tile", gen), _layout("a row", gen)]))]
    n, m = randint(gen, 33, 48), randint(gen, 17, 31)
    return [Case(f"a ragged transpose: {n} x {m}, and layouts: {', '.join(LAYOUT_RULES)}",
                 dict(x=torch.randn(n, m, generator=gen), layouts=[_layout(r, gen) for r in LAYOUT_RULES]))]


def _bank_conflicts_judge(case, obs):
    for addresses, got in zip(case.inputs["layouts"], obs["degrees"]):
        want = ref_bank_degree(addresses)
        if got != want:
            active = [a for a in addresses if a is not None]
            msg = (f"bank_conflict_degree for lanes at byte addresses {_short(addresses)} = {got!r}, expected {want}.")
            if got == max(np.bincount([(a // 4) % 32 for a in active])):
                msg += " Lanes reading the same 4-byte word share it (a broadcast): count distinct words per bank."
            elif got == max(np.bincount([a % 32 for a in active])):
                msg += " A bank holds 4-byte words: the bank of byte address a is (a // 4) % 32."
            return msg
    accesses = _log(obs)
    problem = _race(accesses, obs["shapes"]) or _uninitialised(accesses, obs["shapes"])
    if problem:
        return problem
    x = case.inputs["x"]
    out = np.array(obs["out"], dtype=np.float32)
    want = x.numpy().T
    if out.shape != want.shape or not np.array_equal(out, want):
        bad = np.argwhere(~(out == want))
        i, j = (int(v) for v in bad[0]) if len(bad) else (0, 0)
        msg = (f"transpose of a {tuple(x.shape)} matrix: out[{i}, {j}] = {out[i, j]}, "
               f"expected x[{j}, {i}] = {want[i, j]}.")
        if np.isnan(out[i, j]):
            msg += " It was never written: the tail tiles need blocks too, and the guards must let their threads store."
        return msg
    return _uncoalesced(accesses) or _conflicted(accesses, obs["shapes"])


BANK_CONFLICTS = Exercise("bank_conflicts", 3, ("bank_conflict_degree", "transpose_kernel"), _bank_conflicts_cases,
                          RUN._bank_conflicts_run, _bank_conflicts_judge, title="Bank conflicts and a tiled transpose",
                          hint="Bank = (address // 4) % 32; same word = broadcast. Transpose: load a tile row-wise, "
                               "barrier, store it column-wise from a tile padded to TILE + 1 columns.")


# --- 6 · histogram with privatisation ------------------------------------------------------------------

def _histogram_cases(gen, public):
    sizes = [("a few hundred values", 300)] if public else [
        ("fewer values than threads", randint(gen, 20, 120)), ("skewed values", randint(gen, 200, 400))]
    cases = []
    for rule, n in sizes:
        x = torch.randint(0, 16, (n,), generator=gen, dtype=torch.int32)
        if rule == "skewed values":
            x = torch.where(torch.rand(n, generator=gen) < 0.6, torch.tensor(3, dtype=torch.int32), x)
        cases.append(Case(f"{rule}: n={n}, 16 bins", dict(x=x, bins=16)))
    return cases


def _histogram_judge(case, obs):
    problem = _simulated(obs)
    if problem:
        return problem
    want = torch.bincount(case.inputs["x"].long(), minlength=case.inputs["bins"]).tolist()
    if obs["hist"] != want:
        return f"histogram = {obs['hist']}, expected {want}."
    accesses = _log(obs)
    global_atomics = sum(1 for a in accesses if a.space == "global" and a.kind == "a")
    shared_atomics = sum(1 for a in accesses if a.space == "shared" and a.kind == "a")
    limit = RUN.HISTOGRAM_BLOCKS * case.inputs["bins"]
    if not shared_atomics or global_atomics > limit:
        return (f"the histogram is right but not privatised: {global_atomics} atomics on global memory for "
                f"{len(case.inputs['x'])} values. Count into a shared-memory histogram per block (cuda.atomic.add "
                f"on it), then add each block's {case.inputs['bins']} bins to global memory: at most {limit} "
                "global atomics.")
    return None


HISTOGRAM = Exercise("histogram", 2, ("histogram_kernel",), _histogram_cases, RUN._histogram_run, _histogram_judge,
                     title="A histogram with shared-memory privatisation",
                     hint="Zero a shared int32[NBINS], barrier, atomic.add into it over a grid-stride loop, "
                          "barrier, then one atomic.add per bin into the global histogram.")


# --- 7 · occupancy ------------------------------------------------------------------------------------------

def compile_table() -> list:
    """The committed reports of the course's kernels (``benchmarks/results/17_cuda_simt_compile.json``)."""
    return json.loads(COMPILE_TABLE.read_text())["kernels"]


def _kernel(arch, registers, shared, threads) -> dict:
    return dict(arch=arch, registers=registers, shared=shared, threads=threads)


def _occupancy_rule(rule: str, arch: str, gen) -> dict:
    dev = TARGETS[arch]
    if rule == "register allocation granularity":
        while True:  # registers go to a warp in units of 256: 8 per thread
            regs, threads = randint(gen, 33, 120), choice(gen, [128, 256, 384])
            rounded = _kernel(arch, regs, 0, threads)
            exact = (dev.regs_per_sm // (regs * 32)) // (threads // 32)
            if regs % 8 and ref_occupancy(regs, threads, 0, dev)[0] != min(exact, dev.threads_per_sm // threads):
                return rounded
    if rule == "the block-slot limit":
        return _kernel(arch, randint(gen, 8, 32), 4 * randint(gen, 0, 256), randint(gen, 1, 32))
    if rule == "shared memory with the reserved 1 KiB":
        k = randint(gen, 2, 7)
        while True:
            smem = (dev.smem_per_sm // k) // dev.smem_alloc_unit * dev.smem_alloc_unit - 128 * randint(gen, 0, 3)
            if dev.smem_per_sm // (smem + dev.smem_reserved_per_block) < dev.smem_per_sm // smem:
                return _kernel(arch, 32, smem, 128)
    if rule == "threads":
        return _kernel(arch, randint(gen, 16, 32), 0, choice(gen, [384, 640, 768]))
    if rule == "too much shared memory to launch":
        return _kernel(arch, 32, dev.smem_per_block + 128 * randint(gen, 1, 8), 256)
    raise KeyError(rule)


OCCUPANCY_RULES = ("register allocation granularity", "the block-slot limit", "shared memory with the reserved 1 KiB",
                   "threads", "too much shared memory to launch")


def _occupancy_cases(gen, public):
    if public:
        kernels = [_kernel(r["arch"], r["registers"], r["shared"], r["threads"]) for r in compile_table()]
        return [Case("the course's compiled kernels (nvcc reports)", dict(kernels=kernels)),
                Case("45 registers per thread, 256 threads", dict(kernels=[_kernel("sm_90", 45, 0, 256)]))]
    return [Case(f"{rule}: sm_80 and sm_90", dict(kernels=[_occupancy_rule(rule, a, gen) for a in ("sm_80", "sm_90")]))
            for rule in OCCUPANCY_RULES]


def _occupancy_judge(case, obs):
    if obs.get("borrowed"):
        return (f"occupancy uses the course's own calculator ({obs['borrowed']}): write the rules yourself from "
                "the device's limits.")
    for k, got in zip(case.inputs["kernels"], obs["results"]):
        dev = TARGETS[k["arch"]]
        blocks, limiter = ref_occupancy(k["registers"], k["threads"], k["shared"], dev)
        warps = blocks * math.ceil(k["threads"] / 32)
        what = (f"{k['registers']} registers/thread, {k['shared']} B shared/block, {k['threads']} threads/block on "
                f"{k['arch']}")
        if got["blocks_per_sm"] != blocks:
            return f"occupancy({what}): blocks_per_sm = {got['blocks_per_sm']!r}, expected {blocks}." + \
                _occupancy_hint(k, dev, got["blocks_per_sm"])
        if got["warps_per_sm"] != warps:
            return f"occupancy({what}): warps_per_sm = {got['warps_per_sm']!r}, expected {warps} ({blocks} blocks)."
        if got["limiter"] not in limiter.split(" & "):
            return f"occupancy({what}): limiter = {got['limiter']!r}, expected {limiter!r}."
    return None


def _occupancy_hint(k, dev, got) -> str:
    warps = math.ceil(k["threads"] / 32)
    smem = math.ceil(k["shared"] / dev.smem_alloc_unit) * dev.smem_alloc_unit
    variants = {  # the mistake, and the device that makes it
        " Registers are given to each warp in units of 256 (8 per thread): round registers * 32 up to 256 first.":
            _replace(dev, reg_alloc_unit=1),
        f" An SM holds at most {dev.blocks_per_sm} blocks, however small they are.":
            _replace(dev, blocks_per_sm=10**6),
        " Each block also holds 1 KiB of shared memory for the system: add it to the block's shared memory.":
            _replace(dev, smem_reserved_per_block=0),
    }
    for hint, wrong in variants.items():
        if k["shared"] or wrong.smem_reserved_per_block:  # no shared memory at all: no limit to divide by
            if got == ref_occupancy(k["registers"], k["threads"], k["shared"], wrong)[0]:
                return hint
    if k["shared"] > dev.smem_per_block and got:
        return f" {k['shared']} B is over the {dev.smem_per_block} B a block may have: it cannot launch (0 blocks)."
    return f" Limits: threads {dev.threads_per_sm // (warps * 32)}, blocks {dev.blocks_per_sm}, shared memory " \
           f"{dev.smem_per_sm // (smem + dev.smem_reserved_per_block)} blocks."


def _replace(dev, **changes):
    return dataclasses.replace(dev, **changes)


# The rules name the limiting resource, the answer: the learner sees "case 3: sm_80 and sm_90" (grader.kit.neutral).
OCCUPANCY = Exercise("occupancy", 3, ("occupancy",), neutral(_occupancy_cases), RUN._occupancy_run, _occupancy_judge,
                     title="An occupancy calculator",
                     hint="Per limit, how many blocks fit: threads, block slots, registers (per warp, rounded up to "
                          "256), shared memory (rounded up to 128, plus 1 KiB per block). The smallest wins.")


# --- 8 · fix this kernel's occupancy ---------------------------------------------------------------------------

def _fix_occupancy_cases(gen, public):
    return [Case("compiled for both targets: sm_80 and sm_90", dict(archs=["sm_80", "sm_90"]))]


def _fix_occupancy_judge(case, obs):
    threads = obs["threads"]
    if not isinstance(threads, int) or not 32 <= threads <= 1024 or threads % 32:
        return (f"smooth_fast() must return (source, threads per block) with a multiple of 32 up to 1024; "
                f"got {threads!r}.")
    for arch in case.inputs["archs"]:
        report = obs["compiled"][arch].get("smooth_fast")
        if report is None:
            return f"the source defines no kernel named smooth_fast for {arch} (found {sorted(obs['compiled'][arch])})."
        ops = report["sass"]
        for needed, what in (("LDG", "loads x from global memory"), ("STG", "stores y"),
                             ("BAR", "shares the tile through shared memory with a barrier"),
                             ("FFMA", "computes the filter")):
            if not any(op.startswith(needed) for op in ops):
                return (f"smooth_fast for {arch} no longer {what} (no {needed} in its SASS): fix occupancy, "
                        "keep the work.")
        if report["spill_stores"] or report["spill_loads"]:
            return (f"smooth_fast still spills on {arch}: {report['spill_stores']} bytes stored, "
                    f"{report['spill_loads']} loaded, with {report['registers']} registers. Do not keep all 97 "
                    "products live (accumulate as you go), and do not cap registers with __launch_bounds__(..., 1) "
                    "minimum blocks.")
        if report["stack"]:
            return (f"smooth_fast on {arch} keeps a {report['stack']}-byte per-thread array in local memory (stack): "
                    "accumulate in a register instead.")
        blocks, limiter = ref_occupancy(report["registers"], threads, report["shared"], TARGETS[arch])
        warps = blocks * threads // 32
        if blocks < 2 or warps < TARGETS[arch].threads_per_sm // 64:
            return (f"smooth_fast on {arch}: {report['registers']} registers x {threads} threads, {report['shared']} B "
                    f"shared -> {blocks} block(s) per SM ({warps} warps), limited by {limiter}. Aim for at least "
                    "2 blocks and half the SM's warps: smaller blocks, fewer registers.")
    return None


FIX_OCCUPANCY = Exercise("fix_occupancy", 3, ("smooth_fast",), _fix_occupancy_cases, RUN._fix_occupancy_run,
                         _fix_occupancy_judge, title="Fix this kernel's occupancy",
                         hint="Drop __launch_bounds__(1024, 1), use 256 threads, accumulate the 97 taps in one "
                              "register.")


# --- 9 · an RAII device buffer ----------------------------------------------------------------------------------

def _raii_buffer_cases(gen, public):
    return [Case("host scenarios: scope, moves, an exception, a refused allocation", {})]


def _scenarios(lines) -> dict:
    """``{"scope": {"allocs": 1, ...}, ...}`` from the test program's ``name key=value ...`` lines."""
    out = {}
    for line in lines:
        name, *pairs = line.split()
        out[name] = {k: int(v) for k, v in (p.split("=") for p in pairs if "=" in p)}
    return out


def _raii_buffer_judge(case, obs):
    got = _scenarios(obs["lines"])
    missing = [s for s in ("traits", "sized", "scope", "moved", "move_construct", "move_assign", "exception",
                           "refusal", "refused") if s not in got]
    if missing:
        return f"the test program stopped before the {missing[0]!r} scenario; it printed: {obs['lines']}"
    traits = got["traits"]
    if traits["copy_constructible"] or traits["copy_assignable"]:
        return ("DeviceBuffer can be copied: two buffers would own one allocation and free it twice. Delete the copy "
                "constructor and the copy assignment (`= delete`).")
    if not (traits["nothrow_move_constructible"] and traits["nothrow_move_assignable"]):
        return ("the moves must be `noexcept` (they only swap pointers), or containers such as std::vector copy "
                "instead of moving.")
    if got["sized"] != {"size": 16, "data": 1}:
        return f"DeviceBuffer(16): size() and data() gave {got['sized']}; expected size 16 and a non-null pointer."
    for name, what in (("scope", "a buffer leaving its scope"), ("exception", "a buffer unwound by an exception")):
        if got[name]["frees"] != got[name]["allocs"] or got[name]["live"]:
            return f"{what} leaks: {got[name]}. The destructor must release what the constructor allocated."
    moved = got["move_construct"]
    if moved["bad_frees"] or got["moved"]["source_data"]:
        return ("moving a buffer frees its memory twice (or the moved-from buffer still holds the pointer): "
                f"{moved}. Take the pointer and leave nullptr behind: ptr_ = std::exchange(other.ptr_, nullptr).")
    assign = got["move_assign"]
    if assign["bad_frees"]:
        return f"move assignment frees a pointer twice: {assign}. Null the source after taking its pointer."
    if assign["frees"] != assign["allocs"] or assign["live"]:
        return (f"move assignment leaks the buffer the target held: {assign}. Release the old allocation before "
                "taking the other's.")
    refused = got["refused"]
    if not got["refusal"]["caught"]:
        return "a refused allocation must throw out of the constructor (std::bad_alloc), not be swallowed."
    if refused["bad_frees"] or refused["frees"] or refused["live"]:
        return (f"when the allocation throws, the constructor never finished, so nothing may be freed: {refused}. "
                "Allocate in the constructor, release only in the destructor.")
    return None


RAII_BUFFER = Exercise("raii_buffer", 2, ("device_buffer_source",), _raii_buffer_cases, RUN._raii_buffer_run,
                       _raii_buffer_judge, title="An RAII device buffer (host C++)",
                       hint="Constructor allocates, destructor releases; copies deleted; noexcept moves take the "
                            "pointer with std::exchange(other.ptr_, nullptr); move assignment releases the old one.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.cuda_cpp.compile_report", "gpulab.cuda_cpp.load_inline", "gpulab.cuda_cpp.resource_table",
           "gpulab.warp.Warp")
EXERCISES = [offering(ex, OFFERED) for ex in (INDEXING, BLOCK_REDUCE, WARP_SHUFFLE, WARP_SOFTMAX, BANK_CONFLICTS,
                                          HISTOGRAM, OCCUPANCY, FIX_OCCUPANCY, RAII_BUFFER)]
BENCHMARKS: list = []
