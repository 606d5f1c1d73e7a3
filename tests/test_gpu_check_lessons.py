"""GPU-only cells that no CPU run executes, checked on the CPU where their logic allows: lab 05's tile tuning
leaves the tiles of the other kernels alone, lab 15's timed loop orders its copy stream after the compute
stream, lesson 10 reads its peaks before the timer allocates."""
import contextlib
import json
import re

import torch

from tests.conftest import ROOT


def cell(path: str, cell_id: str) -> str:
    nb = json.loads((ROOT / path).read_text())
    return "".join(next(c for c in nb["cells"] if c.get("id") == cell_id)["source"])


def test_tune_tiles_leaves_the_tiles_of_the_causal_and_graded_kernels_alone():
    source = cell("solutions/05_flash_attention.ipynb", "measure")
    defs = source[source.index("@contextlib.contextmanager"):source.index("def sweep(")]
    gpu_tiles = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3)}
    candidates = {64: [(64, 64, 4, 3), (128, 32, 4, 3)], 128: [(64, 32, 4, 4)]}
    seen = []

    class Timing:
        def __init__(self, ms):
            self.median_ms = ms

    def benchmark(fn, *args):
        seen.append(gpu_tiles[64])  # the tiles the timed call ran with
        return Timing({(64, 64, 4, 3): 2.0, (128, 32, 4, 3): 1.0}[gpu_tiles[64]])

    ns = {"contextlib": contextlib, "torch": torch, "GPU_TILES": gpu_tiles, "TILE_CANDIDATES": candidates,
          "DEVICE": "cpu", "benchmark": benchmark, "flash_attention": None}
    exec(defs, ns)
    assert ns["tune_tiles"](64, seq=16, b=1, h=1) == (128, 32, 4, 3)  # the faster candidate
    assert seen == candidates[64]  # each timed with its own tiles
    assert gpu_tiles == {64: (128, 64, 4, 3), 128: (128, 64, 8, 3)}  # and nothing left behind


def test_the_timed_prefetch_loop_orders_the_copy_stream_after_the_compute_stream():
    source = cell("solutions/15_gpu_algorithms.ipynb", "pipe-run")
    overlapped = source[source.index("def overlapped():"):]
    wait = overlapped.index("io.copy_stream.wait_stream(torch.cuda.current_stream())")
    assert wait < overlapped.index("prefetch_loop(")


def test_lesson_10_reads_each_peak_before_timing_on_a_gpu_sized_stack():
    source = cell("notebooks/10_memory_checkpointing.ipynb", "ckpt-gpu")
    loop = source[source.index("for name, f in"):]
    assert loop.index("max_memory_allocated()") < loop.index("benchmark(")
    assert loop.index("reset_peak_memory_stats()") < loop.index("max_memory_allocated()")
    hidden, tokens = (int(n) for n in re.search(r"make_block\((\d+), .*?\n.*?torch\.randn\(8, (\d+),", source,
                                                 re.S).groups())
    assert hidden >= 1024 and tokens >= 1024  # activations of hundreds of MiB, not a few
