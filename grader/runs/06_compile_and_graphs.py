"""The learner side of lab 06_compile_and_graphs: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/06_compile_and_graphs.py``).
"""
from __future__ import annotations

import contextlib
import io

import torch

from gpulab.compiler import BreakyNet, CountingBackend, default_settings, graph_ops, no_inductor, op_module
from gpulab.graphs import eager_ops, graph_api
from gpulab.syncs import SyncDetector, make_classifier, new_stats
from grader.exercise import entry, to_cpu


@contextlib.contextmanager
def _quiet_fresh_dynamo():
    """A clean Dynamo (no cached graphs, every setting at its default), no Inductor and no printing; yields the
    list of the settings the block changed (filled at its end), and restores them all."""
    torch._dynamo.reset()
    with default_settings() as changed, no_inductor(), contextlib.redirect_stdout(io.StringIO()):
        yield changed
    torch._dynamo.reset()


def _breaks_run(ns, case, device):
    fn, cfg = entry(ns, "smooth_forward"), case.inputs["cfg"]
    model, x = BreakyNet(**cfg).to(device), case.inputs["x"].to(device)
    with _quiet_fresh_dynamo() as changed:
        explained = torch._dynamo.explain(lambda x: fn(model, x))(x)
        ops = [(graph_ops(gm), [op_module(n.target) for n in gm.graph.nodes if n.op == "call_function"])
               for gm in explained.graphs]
        torch._dynamo.reset()
        # the output of the compiled program (what explain counted) and of the eager call: both must be right
        outs = {"compiled": torch.compile(lambda x: fn(model, x), backend=CountingBackend())(x), "eager": fn(model, x)}
    return {"breaks": int(explained.graph_break_count), "graphs": int(explained.graph_count),
            "reasons": [str(r.reason).split("\n")[0][:160] for r in explained.break_reasons][:4],
            "ops": [names for names, _ in ops], "modules": sorted({m for _, mods in ops for m in mods}),
            "outs": {k: to_cpu(v) if isinstance(v, torch.Tensor) else type(v).__name__ for k, v in outs.items()},
            "settings": changed}


FUNCTIONS = {  # row-wise functions of x (N, D) float32 -> (N, D) float32: padding rows never changes other rows
    "gelu_mlp": lambda x: torch.nn.functional.gelu(x * 1.5 + 0.25) * x,
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]) * 2.0 + 1.0,
    "softmax": lambda x: torch.softmax(x * 0.5, dim=-1) + x.tanh(),
}


def _seen_before(fn, shapes) -> None:
    """Compile ``fn`` once, eagerly, on a shape none of ``shapes`` has: as in a notebook that used ``fn`` before,
    Dynamo now remembers a size, and only a count that starts from torch._dynamo.reset() is right."""
    first = list(shapes[0])
    torch.compile(fn, backend="eager")(torch.randn(max(s[0] for s in shapes) + 7, *first[1:]))


def marked(inputs: list, dynamic_dim0: bool) -> list:
    """``inputs``, their batch dimension marked dynamic when ``dynamic_dim0`` (as compile_once's callers do)."""
    for x in inputs if dynamic_dim0 else ():
        torch._dynamo.mark_dynamic(x, 0)
    return inputs


@contextlib.contextmanager
def _course_counter_calls():
    """Yield a list that receives one entry per call of gpulab's CountingBackend (the course's own counter, the
    answer to count_compiles) inside the block, subclasses included."""
    calls, original = [], CountingBackend.__call__

    def counted(self, gm, example_inputs):
        calls.append(type(self).__name__)
        return original(self, gm, example_inputs)

    CountingBackend.__call__ = counted
    try:
        yield calls
    finally:
        CountingBackend.__call__ = original


def _count_run(ns, case, device):
    fn = FUNCTIONS[case.inputs["fn"]]
    inputs = marked([torch.randn(*s, device=device) for s in case.inputs["shapes"]], case.inputs.get("marked"))
    with _quiet_fresh_dynamo() as changed:
        _seen_before(fn, case.inputs["shapes"])
        with _course_counter_calls() as course:
            got = entry(ns, "count_compiles")(fn, inputs, dynamic=case.inputs["dynamic"])
    return {"count": got, "settings": changed, "course_counter": bool(course)}


def _once_inputs(case, device="cpu") -> list:
    gen = torch.Generator().manual_seed(case.inputs["seed"])
    return [torch.randn(n, case.inputs["width"], generator=gen).to(device) for n in case.inputs["rows"]]


def _once_run(ns, case, device):
    fn = FUNCTIONS[case.inputs["fn"]]
    with _quiet_fresh_dynamo() as changed:
        counter = CountingBackend()
        compiled = entry(ns, "compile_once")(fn, counter)
        outs = [to_cpu(compiled(x)) for x in _once_inputs(case, device)]
    return {"outs": outs, "compiles": counter.compiles, "runs": counter.runs, "ops": counter.ops(),
            "unguarded": counter.unguarded, "settings": changed}


def _step_model(case, device="cpu"):
    """The case's classifier; its output layer's weights times the case's ``head_gain`` (logits that can be
    large while the hidden activations are not)."""
    d, h, c = case.inputs["sizes"]
    model = make_classifier(d, h, c, case.inputs["seed"], device)
    with torch.no_grad():
        model[2].weight.mul_(case.inputs.get("head_gain", 1.0))
    return model


def _step_run(ns, case, device):
    fn, x = entry(ns, "train_step"), case.inputs
    model, stats = _step_model(case, device), new_stats(device)
    with _quiet_fresh_dynamo(), SyncDetector() as syncs:
        for xb, yb in zip(x["xs"], x["ys"]):
            fn(model, xb.to(device), yb.to(device), x["lr"], x["max_norm"], stats)
    return {"syncs": [f"{s.call} at {s.where}" for s in syncs.found][:6],
            "params": [to_cpu(p) for p in model.parameters()],
            "stats": {k: to_cpu(v) if isinstance(v, torch.Tensor) else v for k, v in stats.items()}}


def _graph_model(case, dtype=torch.float32, device="cpu"):
    """fn(x[, scale]) = Linear -> GELU -> Linear of x (rows, d), times `scale` (rows, d) when given. The weights
    live on `device` already: a host-to-device copy cannot be captured in a CUDA graph."""
    gen = torch.Generator().manual_seed(case.inputs["seed"])
    d = case.inputs["d"]
    w1 = (torch.randn(d, 2 * d, generator=gen) / d ** 0.5).to(device, dtype)   # drawn in float32 for any dtype
    w2 = (torch.randn(2 * d, d, generator=gen) / (2 * d) ** 0.5).to(device, dtype)
    b1 = torch.randn(2 * d, generator=gen).to(device, dtype)

    def fn(x, scale=None):
        out = torch.nn.functional.gelu(x @ w1 + b1) @ w2   # (rows, d)
        return out if scale is None else out * scale
    return fn


def _graph_inputs(case, k: int) -> list:
    """Call k's inputs (k = 0: the example inputs given at construction)."""
    gen = torch.Generator().manual_seed(case.inputs["seed"] + 1 + k)
    shape = (case.inputs["rows"], case.inputs["d"])
    return [torch.randn(*shape, generator=gen) for _ in range(case.inputs["n_inputs"])]


def _graph_run(ns, case, device):
    cls, api = entry(ns, "GraphRunner"), graph_api(device)
    dev_fn = _graph_model(case, device=device)
    example = [t.to(device) for t in _graph_inputs(case, 0)]
    kept = [t.clone() for t in example]
    with _quiet_fresh_dynamo():
        runner = cls(dev_fn, tuple(example), api)
    after_init = {"captures": api.captures, "replays": api.replays}
    outs, eager = [], []
    for k in range(1, case.inputs["calls"] + 1):
        inputs = [t.to(device) for t in _graph_inputs(case, k)]
        with _quiet_fresh_dynamo(), eager_ops(api) as computed:
            out = runner(*inputs)
        eager += computed
        outs.append(to_cpu(out).clone() if isinstance(out, torch.Tensor) else type(out).__name__)
    return {"init": after_init, "captures": api.captures, "replays": api.replays, "eager": sorted(set(eager)),
            "outs": outs, "example_kept": all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(example, kept))}


def _trace_run(ns, case, device):
    x = case.inputs
    return {"summary": entry(ns, "trace_summary")(x["trace"], x["k"], x["min_gap_us"])}


WARMUP, REPEATS = 3, 5  # what the check asks measure_compile_win for


READINGS = 200  # clock readings reported to the judge: an honest timer of the check's calls takes about 24
HICCUP = WARMUP + 2  # the call (of each function, counting from its first warm one) that a device hiccup slows


class VirtualDevice:
    """An asynchronous device on a virtual clock (seconds): a call costs the host `host_s` at once and queues its
    work; ``sync()`` waits for the queue. The compiled function's first call compiles on the host first
    (`compile_s`), then queues `first_work_s` of device work (autotuning runs candidate kernels on the device), and
    its next WARMUP calls record/autotune (extra work), as ``mode="reduce-overhead"`` does; eager's first WARMUP
    calls initialise caches. With WARMUP calls of warm-up the timed calls are all steady but one: the call HICCUP
    of each function takes `hiccup` times its work (another process on the device), which a median ignores and a
    mean does not. Without warm-up, most of REPEATS are not steady, and even a median shows it."""

    def __init__(self, p: dict, x: torch.Tensor):
        self.p, self.x, self.now, self.free_at = p, x, 0.0, 0.0
        self.calls = {"eager": 0, "compiled": 0, "compile_fn": 0, "other_input": 0, "clock": 0}
        self.readings: list = []  # what clock() returned, the first READINGS of them

    def clock(self) -> float:
        self.calls["clock"] += 1
        if len(self.readings) < READINGS:
            self.readings.append(self.now)
        return self.now

    def sync(self) -> None:
        self.now = max(self.now, self.free_at)

    def _run(self, kind: str, arg, work_s: float) -> torch.Tensor:
        if not (isinstance(arg, torch.Tensor) and arg.shape == self.x.shape and torch.equal(arg, self.x)):
            self.calls["other_input"] += 1
        self.calls[kind] += 1
        self.now += self.p["host_s"]
        self.free_at = max(self.free_at, self.now) + work_s
        return arg * 2.0

    def eager(self, x):
        n = self.calls["eager"]
        slow = self.p["eager_first"] if n < WARMUP else self.p["hiccup"] if n == HICCUP else 1.0
        return self._run("eager", x, self.p["eager_s"] * slow)

    def compile_fn(self, fn):
        self.calls["compile_fn"] += 1

        def compiled(x):
            n = self.calls["compiled"]
            if n == 0:
                self.now += self.p["compile_s"]            # compiling: host time, before any work is queued
                return self._run("compiled", x, self.p["first_work_s"])
            slow = self.p["record"] if n <= WARMUP else self.p["hiccup"] if n == HICCUP + 1 else 1.0
            return self._run("compiled", x, self.p["compiled_s"] * slow)
        return compiled


def _win_run(ns, case, device):
    dev = VirtualDevice(case.inputs["params"], case.inputs["x"])
    got = entry(ns, "measure_compile_win")(dev.eager, dev.compile_fn, case.inputs["x"], clock=dev.clock,
                                            sync=dev.sync, warmup=WARMUP, repeats=REPEATS)
    return {"result": got if isinstance(got, dict) else type(got).__name__, "calls": dev.calls,
            "readings": dev.readings}
