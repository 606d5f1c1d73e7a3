"""Timed interview drills: every question the course prepares for, a timer, a saved answer, a rubric revealed for
self-grading, the labs whose measurements an answer should cite, and a progress view (drills notebook of lesson 16).

- :data:`QUESTIONS`: the drills, one :class:`Question` each (``qid`` like ``"Q-SERVE-1"``, its family ``"Q-SERVE"``,
  the prompt, a time limit in minutes, the rubric's points, the lab stems to cite). :data:`FAMILIES` are the
  interview questions of ``shared/curriculum.md`` plus the MLOps ones; every family has at least one drill.
- :class:`DrillStore`: the answers, as JSON (``{qid: {"answer", "started", "elapsed_s", "revealed", "checked",
  "saved"}}``) in ``notebooks/16_interview_drills.answers.json`` beside the drills notebook (``GPULAB_DRILLS``
  moves it). Every change is written at once, so an answer survives a closed notebook or a crashed kernel.
- :class:`Drill`: one drill's logic, on an injectable clock: ``start()``, ``remaining()``, ``save(text)``,
  ``reveal()`` (stops the clock, returns the rubric), ``check(indices)`` (the self-grade). No widget needed:
  tests drive it directly.
- :func:`drill_widget` / :func:`show_drill`: the same drill as ipywidgets (a timer, an answer box, a reveal button,
  the rubric as checkboxes, links); outside a notebook front end, :func:`show_drill` prints the question.
- :func:`progress_rows` / :func:`show_progress`: which drills were done, how long they took, the self-scores.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpulab.paths import ROOT

FAMILIES = ("Q-OPT", "Q-PAR", "Q-E2E", "Q-COMP", "Q-HW", "Q-DIST", "Q-SERVE", "Q-MLOPS")

LAB_TITLES = {  # the stems an answer cites; lessons are notebooks/<stem>.ipynb, graded labs labs/<stem>.ipynb
    "01_performance_model": "timing, roofline, scaling", "02_triton_basics": "Triton, masks, fusion",
    "04_matmul": "tiled matmul", "05_flash_attention": "FlashAttention",
    "06_compile_and_graphs": "compilers, CUDA graphs",
    "07_mixed_precision": "mixed precision", "08_quantization": "quantization",
    "09_pruning_distillation": "pruning, distillation", "10_memory_checkpointing": "memory, checkpointing, ZeRO",
    "11_data_parallel": "data parallelism, collectives", "12_tensor_parallel": "tensor parallelism",
    "13_pipeline_parallel": "pipeline parallelism", "14_inference_serving": "inference serving",
    "15_gpu_algorithms": "GPU algorithms", "16_capstone_design": "capstone: planning and capacity",
    "17_cuda_simt": "CUDA C++, SIMT, occupancy",
}


@dataclass(frozen=True)
class Question:
    """One timed drill: ``rubric`` lists what a strong answer covers; ``labs`` the stems whose numbers it cites."""

    qid: str
    prompt: str
    minutes: int
    rubric: tuple
    labs: tuple

    @property
    def family(self) -> str:
        return self.qid.rsplit("-", 1)[0]


# The drills, one block each: "## <qid> | <minutes> min | labs <lab numbers>", the prompt, then "- " rubric points.
DRILLS_TEXT = """
## Q-OPT-1 | 15 min | labs 08 09 02 05 10 06 07
Walk me through the optimization techniques you would use to make a model train and serve faster. For each: the
goal, how it works, the benefit, the trade-off, a pitfall.
- Quantization: INT8 vs FP8, PTQ (calibration) vs QAT (fake quant), outliers and per-channel scales
- Pruning: unstructured vs structured vs 2:4 (N:M) sparsity, and which of them the hardware speeds up
- Distillation: a student on the teacher's soft targets (temperature), what it keeps and loses
- Fusion: bias+GELU saves memory round trips; FlashAttention never materialises the S x S scores
- Memory: activation checkpointing (memory for one more forward), ZeRO/FSDP sharding, offload, KV cache
- Throughput/latency: mixed precision, CUDA graphs and torch.compile, batching, compute/comm overlap
- Cites a measured number from a lab for at least two techniques

## Q-OPT-2 | 10 min | labs 08 14 07
You must serve a 7B LLM at half the memory. How do you quantize it, and how do you know it still works?
- Weight-only int8/int4 vs W8A8 vs FP8: what each saves (bytes read per decode step) and needs
- Calibration data and per-channel / per-group scales; activation outliers (SmoothQuant-style shift)
- PTQ first, QAT only if accuracy drops; evaluate on the task, not just perplexity
- Decode is memory-bound: the speed-up follows the bytes, not the FLOPs
- KV-cache quantization as a separate lever for long contexts

## Q-PAR-1 | 12 min | labs 12 13 11 16
Tensor parallelism vs pipeline parallelism: how does each work, what does it communicate, when do you use which,
and what limits it?
- TP: column- then row-parallel linears, 2 all-reduces per layer in the forward (2 in the backward)
- PP: layers split into stages, activations sent point to point; GPipe vs 1F1B schedules
- Bubble (p-1)/(m+p-1), mitigated by more microbatches and interleaved stages
- TP inside an NVLink node, PP across nodes: message size and frequency decide
- Bottlenecks: per-layer all-reduce latency; stage imbalance; activation memory of in-flight microbatches
- Hybrid 3D: TP x PP x DP (plus sequence/expert parallelism), with a worked layout
- Cites measurements: lab 13's measured bubble against (p-1)/(m+p-1), lab 16's planner layout for GPT-3 175B

## Q-E2E-1 | 15 min | labs 01 06 07 10 11 16
A large training job runs at 25% MFU. Optimize it end to end: what do you measure first and what do you try
next?
- Measure first: a per-step profile split into compute, memory-bound kernels, communication, idle
- Precision: bf16 (or fp16 with loss scaling), FP8 where supported; fp32 accumulation
- Kernels: fusion, FlashAttention, custom Triton kernels; coalescing; no host syncs in the step
- Parallelism: DP/TP/PP/EP chosen from memory and the links (a planner, not guesswork)
- Communication: overlap all-reduce with backward, gradient bucketing, NCCL tuning, topology
- Memory: checkpointing and ZeRO to fit larger microbatches; the data loader keeps up

## Q-E2E-2 | 12 min | labs 14 08 06
Optimize LLM inference end to end, once for an online (latency) service and once for batch (throughput) jobs.
- Online: TTFT and time per output token, p99 not mean; batch: tokens/s per GPU and cost
- Prefill is compute-bound, decode memory-bound: different levers for each
- KV cache with paging, continuous batching, chunked prefill or prefill/decode disaggregation
- Quantization (weights, KV), speculative decoding, CUDA graphs for decode steps
- Batch jobs: the largest batch memory allows, sorted lengths, offline scheduling

## Q-COMP-1 | 12 min | labs 06 01
What happens between `model(x)` in PyTorch and kernels running on the GPU, with and without torch.compile? How
would you show a compiler win is real?
- Eager: one kernel launch per op, Python overhead per op
- TorchDynamo captures bytecode into FX graphs, with guards; graph breaks fall back to eager
- AOTAutograd traces the joint forward/backward; Inductor lowers to Triton kernels or library calls
- Static vs dynamic shapes: guards, recompiles, bucketing or mark_dynamic
- Benchmark: warm-up (compile excluded), device synchronisation, p50/p95/p99, memory, utilisation

## Q-HW-1 | 10 min | labs 01 02 04 15 07
Is this kernel memory-bound or compute-bound, and what would you change? Explain the metrics you use.
- Arithmetic intensity (FLOP/byte) against the ridge point of the roofline
- Achieved bandwidth or FLOP/s as a share of a measured peak
- Occupancy, coalescing, tiling for reuse (matmul), fusion to cut bytes
- Throughput vs latency; strong vs weak scaling and Amdahl's law
- Mixed precision and accumulation; determinism; reproducible benchmarks
- GPU-friendly algorithms (batched k-means, top-k, vector search); fewer host-device transfers

## Q-HW-2 | 15 min | labs 17 02 04
Write a CUDA C++ kernel that sums a large float array, with its launch, then tell me how you would check it and
make it faster.
- Indexing: blockIdx.x * blockDim.x + threadIdx.x, a grid-stride loop, the tail guarded (i < n, 0 past the end)
- Shared-memory tree with __syncthreads() after the load and after every step; never a barrier in a divergent branch
- Warp-level finish with __shfl_down_sync (offsets 16 to 1; the full mask only when all 32 lanes execute it)
- One atomicAdd per block or a second pass; float order changes the sum, so compare within a tolerance
- Host side: an RAII device buffer, cudaGetLastError after the launch, errors at the sync, events for timing
- Cites lab 17's compile report: SHFL and BAR in block_sum's SASS, its registers, no spills

## Q-HW-3 | 12 min | labs 17 04 01
Given a kernel with poor occupancy, walk through your profiling and optimization steps.
- First ask whether occupancy is the problem: achieved vs theoretical occupancy and stall reasons (Nsight Compute)
- Find the limiter from the compile report (registers, shared memory, block size) and the occupancy calculation
- Registers: fewer live values, no __launch_bounds__ that forces spills (spills are local-memory traffic)
- Shared memory: smaller tiles or fewer stages; block size: smaller blocks so several fit on an SM
- Re-measure time and DRAM throughput: more occupancy can lose to more ILP in a compute-bound kernel
- Cites lab 17's smooth_slow vs smooth_fast: registers, spills and blocks per SM from nvcc's report

## Q-DIST-1 | 12 min | labs 10 11 16
Design distributed training of a 13B model on 64 GPUs: DDP, FSDP or ZeRO? Show the memory and the communication.
- Model state 16 bytes per parameter; ZeRO-1/2/3 divide optimizer, gradients, weights by N
- Communication: DDP all-reduce 2x the gradients; ZeRO-3/FSDP about 1.5x (extra all-gathers)
- Overlap and bucketing; prefetching the next FSDP unit
- Activations: checkpointing, microbatch size; when TP within the node helps
- Sharded checkpoints; restart on a different GPU count
- Cites lab 16's memory per GPU by ZeRO stage (training_memory) and lab 11's measured all-reduce bytes

## Q-DIST-2 | 12 min | labs 16 11 07
A 2000-GPU run fails every few hours and diverged twice. What do you build and what do you look at?
- Job MTBF = one GPU's MTBF / N; checkpoint every sqrt(2 C M) (Young/Daly); async, sharded saves
- Elastic restart: re-shard the checkpoint to the new world size; resume data order and LR schedule
- Stragglers and hangs: per-rank step times (medians), NCCL timeouts, a watchdog, stack dumps
- Divergence: first spike, per-layer gradient norms against their own history, loss scale, batch ids
- Fixes: skip/replay a bad batch, lower LR or longer warm-up, clipping, bf16, QK-norm
- Cites lab 16's checkpoint interval for 16384 GPUs and its diagnosis of the supplied divergence traces

## Q-SERVE-1 | 15 min | labs 14 16 12 08
Serve a 175B model at 100 requests/s with p99 latency under 500 ms on 8-GPU nodes.
- Weights: 350 GB in bf16, 175 GB in fp8: TP=8 inside a node (never across nodes)
- KV cache per token and the concurrency (Little's law) that must fit beside the weights
- Decode step floor: weight bytes per GPU / HBM bandwidth, plus 2 all-reduces per layer
- Prefill vs decode: chunked prefill or separate prefill replicas so decodes do not stall
- Continuous batching; replicas from a queueing model or simulation, with headroom for p99
- What to monitor: TTFT, per-token latency, p99, queue length, KV occupancy
- Cites lab 16's simulated plan (replicas x TP, its p99 from the simulation, not a mean) and KV GB per GPU

## Q-SERVE-2 | 10 min | labs 16 08 06 02
Design a ResNet-152 image-classification service with a latency target.
- Dynamic batching with a maximum wait: batch size bounded by the target, not by memory
- Fusion (conv + batch-norm + ReLU folded, TensorRT-style), fewer launches
- INT8 with calibration (or FP8); check accuracy per class
- CUDA graphs, several model instances or streams per GPU, GPU-side preprocessing
- Throughput per GPU at the target, replicas for the load

## Q-SERVE-3 | 8 min | labs 14 12 13 16
A 7B LLM on 4 GPUs at low latency: TP, PP or replicas?
- It fits one GPU: replicas give the most throughput at one GPU's latency
- TP=4 cuts each decode step's weight reads by 4, plus 2 all-reduces per layer on NVLink
- PP does not reduce a token's latency; it adds throughput only with microbatches in flight
- Choose by the latency target: TP for the lowest per-token latency, replicas otherwise
- Cites lab 16's four_gpu_options latencies and tokens/s for the three choices

## Q-SERVE-4 | 10 min | labs 16 06 11 01
A multi-GPU deployment is much slower than expected. Debug it methodically.
- Reproduce and measure: per-rank timelines (Nsight Systems, PyTorch profiler)
- Compare ranks first: one slow rank makes the others wait inside NCCL
- Split the step: kernels vs NCCL vs CPU gaps vs host-device copies
- Check the partition and the communication pattern (TP across nodes? overlap?)
- Check memory (fragmentation, KV pressure, swapping) and batch size; fix one thing, re-measure

## Q-MLOPS-1 | 12 min | labs 16 14
Design the production pipeline around an LLM service: what do you monitor, how do you version models, and how do
you roll out a new one?
- Monitor latency percentiles (TTFT, p99), throughput, GPU and KV-cache utilisation, errors
- Drift: live inputs vs training data (PSI per feature), prediction and quality drift
- A registry of immutable, versioned artifacts (weights, tokenizer, engine, config, data, code)
- Shadow traffic, then a canary slice compared with the baseline on enough requests
- Automatic rollback on an SLO or guardrail breach; rollback is a pointer change

## Q-MLOPS-2 | 10 min | labs 16
How do you run an A/B test of a new model, and how do you detect data drift in production?
- Randomisation unit, sample size from the effect you must detect, a pre-registered metric
- Guardrail metrics (latency, errors) and a significance test; beware peeking and novelty effects
- Drift: PSI or KS per feature, prediction distribution, delayed labels
- Responses: alert, investigate, retrain with review; never retrain blindly on every alert
"""


def parse_drills(text: str) -> list[Question]:
    """:data:`DRILLS_TEXT`'s blocks as :class:`Question` objects (a continuation line starts with two spaces)."""
    questions = []
    for block in text.strip().split("\n## "):
        head, *lines = block.removeprefix("## ").splitlines()
        qid, minutes, labs = (part.strip() for part in head.split("|"))
        stems = tuple(next(stem for stem in LAB_TITLES if stem[:2] == n) for n in labs.split()[1:])
        prompt = " ".join(line for line in lines if not line.startswith(("- ", "  ")))
        rubric = []
        for line in lines:
            if line.startswith("- "):
                rubric.append(line[2:])
            elif line.startswith("  "):
                rubric[-1] += " " + line.strip()
        questions.append(Question(qid, prompt, int(minutes.split()[0]), tuple(rubric), stems))
    return questions


QUESTIONS = parse_drills(DRILLS_TEXT)
BY_ID = {q.qid: q for q in QUESTIONS}


def drills_file() -> Path:
    """The answers' JSON file: beside the drills notebook, or ``$GPULAB_DRILLS``."""
    return Path(os.environ.get("GPULAB_DRILLS", ROOT / "notebooks" / "16_interview_drills.answers.json"))


class DrillStore:
    """The saved drills, ``{qid: record}``; every change is written to :func:`drills_file` at once."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else drills_file()

    def load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # nothing saved yet, or a damaged file: start afresh rather than fail the drill

    def get(self, qid: str) -> dict:
        return dict(self.load().get(qid, {}))

    def update(self, qid: str, **fields) -> dict:
        data = self.load()
        record = dict(data.get(qid, {}), **fields, saved=time.strftime("%Y-%m-%d %H:%M:%S"))
        data[qid] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)  # atomic: a crash mid-write never loses the earlier answers
        return record


class Drill:
    """One drill on a clock (``clock()`` in seconds; :func:`time.monotonic` by default)."""

    def __init__(self, qid: str, store: DrillStore | None = None, clock: Callable[[], float] = time.monotonic):
        if qid not in BY_ID:
            raise KeyError(f"no drill {qid!r}; the drills are {', '.join(BY_ID)}")
        self.question, self.store, self.clock = BY_ID[qid], store or DrillStore(), clock
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    @property
    def record(self) -> dict:
        return self.store.get(self.question.qid)

    def start(self) -> None:
        self.started_at, self.stopped_at = self.clock(), None
        self.store.update(self.question.qid, started=time.strftime("%Y-%m-%d %H:%M:%S"), revealed=False)

    def elapsed(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.stopped_at if self.stopped_at is not None else self.clock()) - self.started_at

    def remaining(self) -> float:
        """Seconds left (negative once over time)."""
        return self.question.minutes * 60 - self.elapsed()

    def timer_text(self) -> str:
        left = self.remaining()
        sign, left = ("-", -left) if left < 0 else ("", left)
        state = "not started" if self.started_at is None else ("over time" if sign else "left")
        return f"{sign}{int(left) // 60:02d}:{int(left) % 60:02d} {state}"

    def _timing(self) -> dict:
        """The time taken, when this session timed the drill; {} otherwise, so that editing an answer or revealing
        the rubric again in a later session keeps the time recorded when the drill was done."""
        return {} if self.started_at is None else {"elapsed_s": round(self.elapsed(), 1)}

    def save(self, answer: str) -> None:
        self.store.update(self.question.qid, answer=answer, **self._timing())

    def reveal(self) -> tuple:
        """Stop the clock and return the rubric."""
        if self.started_at is not None and self.stopped_at is None:
            self.stopped_at = self.clock()
        self.store.update(self.question.qid, revealed=True, **self._timing())
        return self.question.rubric

    def check(self, indices) -> dict:
        """Record which rubric points the answer covered (self-graded); returns the record."""
        rubric = self.question.rubric
        checked = sorted({int(i) for i in indices if 0 <= int(i) < len(rubric)})
        return self.store.update(self.question.qid, checked=checked, score=f"{len(checked)}/{len(rubric)}")


def lab_links(question: Question) -> str:
    """Markdown links to the lessons (beside the drills notebook) and labs whose numbers the answer cites."""
    return "; ".join(f"[{stem}]({stem}.ipynb) ({LAB_TITLES.get(stem, '')}, lab: [../labs/{stem}.ipynb]"
                     f"(../labs/{stem}.ipynb))" for stem in question.labs)


def _in_notebook() -> bool:
    from gpulab.feedback import _in_notebook as front_end

    return front_end()


def drill_widget(qid: str, store: DrillStore | None = None, clock: Callable[[], float] = time.monotonic,
                 ticking: bool = True):
    """The drill as an ipywidgets box: Start (the timer counts down in a background thread when ``ticking``), an
    answer box saved on every change, Reveal rubric (stops the clock; the rubric appears as checkboxes, saved
    as ticked), and the links. Returns the box; ``box.drill`` is the :class:`Drill` behind it."""
    import ipywidgets as w

    drill = Drill(qid, store, clock)
    q, saved = drill.question, drill.record
    timer = w.HTML(f"<b>{q.minutes} min</b> — press Start")
    answer = w.Textarea(value=saved.get("answer", ""), placeholder="Your answer: outline first, numbers next.",
                        layout=w.Layout(width="100%", height="180px"))
    start, reveal = w.Button(description="Start", button_style="primary"), w.Button(description="Reveal rubric")
    rubric_box = w.VBox([])

    def tick():
        timer.value = f"<b>{drill.timer_text()}</b>"

    def run_clock():
        while drill.started_at is not None and drill.stopped_at is None:
            tick()
            time.sleep(1.0)
        tick()

    def on_start(_):
        drill.start()
        tick()
        if ticking:
            threading.Thread(target=run_clock, daemon=True).start()

    def on_answer(change):
        drill.save(change["new"])

    def on_reveal(_):
        drill.save(answer.value)
        ticked = set(drill.record.get("checked", []))
        boxes = [w.Checkbox(value=i in ticked, description=point, indent=False, layout=w.Layout(width="100%"))
                 for i, point in enumerate(drill.reveal())]
        for box in boxes:
            box.observe(lambda _: drill.check([i for i, b in enumerate(boxes) if b.value]), names="value")
        rubric_box.children = [w.HTML("<b>Rubric</b>: tick what your answer covered.")] + boxes
        tick()

    start.on_click(on_start)
    reveal.on_click(on_reveal)
    answer.observe(on_answer, names="value")
    header = w.HTML(f"<h4>{q.qid} · {q.minutes} min</h4><p>{q.prompt}</p>")
    links = w.HTML("<p>Cite your measurements from: " + ", ".join(
        f"<a href='{stem}.ipynb' target='_blank'>{stem}</a>" for stem in q.labs) + "</p>")
    box = w.VBox([header, w.HBox([start, timer]), answer, reveal, rubric_box, links])
    box.drill, box.parts = drill, dict(start=start, answer=answer, reveal=reveal, rubric=rubric_box, timer=timer)
    return box


def show_drill(qid: str) -> None:
    """Display drill ``qid`` as a widget in a notebook; elsewhere print the question and where to look."""
    if _in_notebook():
        from IPython.display import display

        display(drill_widget(qid))
        return
    q = BY_ID[qid]
    print(f"{q.qid} ({q.minutes} min): {q.prompt}\n  cite: {', '.join(q.labs)}\n"
          f"  (open this notebook in JupyterLab for the timer, the answer box and the rubric)")


def progress_rows(store: DrillStore | None = None) -> list[dict]:
    """One row per drill: family, whether it was drilled (an answer saved), minutes taken, self-score."""
    data = (store or DrillStore()).load()
    rows = []
    for q in QUESTIONS:
        rec = data.get(q.qid, {})
        rows.append({"qid": q.qid, "family": q.family, "drilled": bool(rec.get("answer", "").strip()),
                     "revealed": bool(rec.get("revealed")), "minutes": round(rec.get("elapsed_s", 0) / 60, 1),
                     "limit": q.minutes, "score": rec.get("score", "")})
    return rows


def show_progress(store: DrillStore | None = None) -> None:
    """The progress view: which drills are done, by family (HTML table in Jupyter, text elsewhere)."""
    from gpulab.feedback import display_rich

    rows = progress_rows(store)
    done = sum(r["drilled"] for r in rows)
    text = [f"drilled {done}/{len(rows)}", "drill       done  minutes  self-score"]
    html = [f"<p><b>Drilled {done} of {len(rows)}</b></p><table><tr><th>drill</th><th>done</th>"
            "<th>minutes (limit)</th><th>self-score</th></tr>"]
    for r in rows:
        mark = "yes" if r["drilled"] else "-"
        text.append(f"{r['qid']:<11} {mark:<5} {r['minutes']:>4}/{r['limit']:<3} {r['score']}")
        html.append(f"<tr><td>{r['qid']}</td><td>{'✅' if r['drilled'] else ''}</td>"
                    f"<td>{r['minutes']} ({r['limit']})</td><td>{r['score']}</td></tr>")
    html.append("</table>")
    display_rich("\n".join(text), "".join(html))
