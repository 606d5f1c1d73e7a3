"""The project-story drill's outline, built from your own lab measurements (drills notebook of lesson 16).

Each lesson (and some labs) ends with a "Your measurements" table (:func:`gpulab.measurements.show_measurements`);
saving the notebook in your workspace keeps that table in its outputs. :func:`project_story` reads those saved
tables and fills a story from one lab: the baseline, the profile that located the bottleneck, the change, the
measured gain. A lab measured on a GPU is preferred; with nothing saved yet, it says which lab to run first.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

TITLE = "Your measurements"  # the first line of every lesson's table


@dataclass(frozen=True)
class Recipe:
    """A story one lab can tell: ``profile`` and ``gain`` are row names of that lab's table (``*`` matches any
    text, for rows named by size)."""

    lab: str
    project: str
    baseline: str
    profile: str
    change: str
    gain: str


RECIPES = (
    Recipe("02_triton_basics", "a fused bias+GELU kernel", "eager PyTorch bias+GELU: two kernels, each a full "
           "round trip through memory", "bias+GELU * fp16 bytes", "one Triton kernel: one read, one write",
           "bias+GELU * fp16 time"),
    Recipe("05_flash_attention", "attention without the S x S matrix", "naive attention writing S and P to memory",
           "HBM traffic naive / flash (D=128)", "FlashAttention-style tiling with an online softmax",
           "D=128 *S=*"),
    Recipe("08_quantization", "an int8 decode GEMV", "fp16 weights at batch 1: decode reads every weight per token",
           "GEMV K=N=* bytes", "int8 weights dequantized inside the kernel, per-channel scales", "GEMV K=N=* time"),
    Recipe("06_compile_and_graphs", "removing launch overhead", "eager PyTorch: one launch per op",
           "fresh trace: share of the window in aten::linear", "torch.compile (Inductor) fusing the small ops",
           "eager vs compiled (same inputs, warm)"),
    Recipe("10_memory_checkpointing", "fitting a bigger batch", "every activation kept for the backward",
           "checkpoint every block: saved bytes", "activation checkpointing per block (one more forward)",
           "peak memory plain / checkpointed"),
    Recipe("14_inference_serving", "continuous batching", "static batches: a batch waits for its longest request",
           "tiny model step, batch 1 vs largest", "continuous batching: finished sequences leave, new ones join",
           "static vs continuous (max_batch 32)"),
    Recipe("15_gpu_algorithms", "a faster input pipeline", "pageable host memory copied on the compute stream",
           "pipeline model, 5 batches", "pinned buffers, non_blocking copies overlapping compute",
           "host to device, pageable vs pinned (GPU)"),
)


@dataclass(frozen=True)
class Table:
    """A saved measurements table: ``rows`` ``{name: value}`` and whether it came from a GPU run."""

    rows: dict
    on_gpu: bool

    def find(self, pattern: str) -> tuple[str, str] | None:
        return next(((n, v) for n, v in self.rows.items() if fnmatch.fnmatchcase(n, pattern)), None)


def parse_table(text: str) -> dict:
    """The rows of a printed table (``format_measurements``'s layout: two spaces, the name padded with spaces, two
    spaces, the value); a name never holds two spaces in a row, so the first two end it."""
    table = {}
    for line in text.splitlines()[1:]:
        name, sep, value = line.removeprefix("  ").partition("  ")
        if sep and name.strip():
            table[name.strip()] = value.strip()
    return table


def saved_table(notebook: Path) -> Table | None:
    """The measurements table saved in ``notebook``'s outputs, or None if it was not run and saved."""
    try:
        cells = json.loads(Path(notebook).read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    for cell in cells:
        texts = ["".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
        joined = "".join(texts)
        if f"{TITLE}\n" in joined:  # the table, up to the blank line before a note
            table = parse_table(joined[joined.index(f"{TITLE}\n"):].split("\n\n")[0])
            device = table.get("device", "")
            on_gpu = "CPU run" not in joined and not device.lower().startswith("cpu")
            return Table(table, on_gpu)
    return None


@dataclass(frozen=True)
class Story:
    """The outline: ``lines`` to tell, ``lab`` it came from (None when nothing is measured), ``on_gpu``."""

    lab: str | None
    on_gpu: bool
    lines: tuple

    def text(self) -> str:
        return "\n".join(self.lines)


def project_story(workspace: Path | None = None) -> Story:
    """The best story your saved tables can tell: a GPU-measured lab first, in :data:`RECIPES`' order."""
    from gpulab.workspace import workspace_dir

    workspace = Path(workspace) if workspace is not None else workspace_dir()
    found = []
    for recipe in RECIPES:
        for folder in ("notebooks", "labs"):  # the lesson's table, else the graded lab's
            table = saved_table(workspace / folder / f"{recipe.lab}.ipynb")
            if table and table.find(recipe.profile) and table.find(recipe.gain):
                found.append((recipe, table))
                break
    if not found:
        first = RECIPES[0].lab
        return Story(None, False, (
            "Nothing measured yet to build your story from.",
            f"Run lab {first[:2]} first: open notebooks/{first}.ipynb in your workspace, run it to its 'Your "
            "measurements' table (on a GPU for timings worth telling) and save the notebook; then run this cell "
            "again.",))
    recipe, table = next(((r, t) for r, t in found if t.on_gpu), found[0])
    profile, gain = table.find(recipe.profile), table.find(recipe.gain)
    lines = [f"Project: {recipe.project} (lab {recipe.lab[:2]}, notebooks/{recipe.lab}.ipynb).",
             f"Baseline: {recipe.baseline}.",
             f"Profile: {profile[0]}: {profile[1]}.",
             f"Change: {recipe.change}.",
             f"Measured gain: {gain[0]}: {gain[1]}.",
             "Then say: the device, how many runs and their spread, what it cost, and what you would do next."]
    if not table.on_gpu:
        lines.append(f"(These are CPU-run numbers: run lab {recipe.lab[:2]} on a GPU and save it for a story with "
                     "GPU timings.)")
    return Story(recipe.lab, table.on_gpu, tuple(lines))


def show_project_story(workspace: Path | None = None) -> None:
    """Print (or, in Jupyter, show) the outline from :func:`project_story`."""
    import html

    from gpulab.feedback import display_rich

    story = project_story(workspace)
    page = "<div class='gpulab-story'><b>Your project story</b><ul>" + "".join(
        f"<li>{html.escape(line)}</li>" for line in story.lines) + "</ul></div>"
    display_rich("Your project story\n" + story.text(), page)
