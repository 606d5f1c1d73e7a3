"""Checks of lab 06, compile and graphs: a forward without graph breaks (counted as ``torch._dynamo.explain`` counts,
every layer inside the captured graph, so hiding a break behind ``torch._dynamo.disable``, an eager fallback or
an opaque ``allow_in_graph`` call fails), compilations counted with a backend, one compilation across dynamic
sizes (counted by the check's own backend, every call through the compiled graph), a training step with no
host sync (``gpulab.syncs.SyncDetector``) that still skips non-finite batches, a graph captured once and
replayed (``gpulab.graphs``: CUDA graphs on a GPU, the recording stand-in on a CPU), and a profiler trace read.
No check runs Inductor (``gpulab.compiler.no_inductor``: a learner's torch.compile without a backend is refused
with a message): the compile checks use counting and eager backends, milliseconds per graph. Dynamo runs at its
default settings (``gpulab.compiler.default_settings``): a flag set to hide a break or a recompile is named.
Every hidden set holds the edges a near-miss trips on: inputs already marked dynamic, a loss of +inf (not NaN),
a trace gap of exactly ``min_gap_us`` and a copy ending before the last kernel, a timed call slowed by a device
hiccup (a mean moves, a median does not) and device work queued by the first compiled call; timings must be
differences of the learner's own clock readings, and count_compiles may not use the course's CountingBackend.
Hidden cases: one per rule (a case's name starts with its rule, before ':'), the same rules on every seed.
"""
from __future__ import annotations

import contextlib
import functools
import io
import math

import torch

from gpulab.compare import compare
from gpulab.compiler import BreakyNet, CountingBackend
from gpulab.syncs import new_stats, train_step_with_syncs
from grader.exercise import Case, Exercise
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.variants import diagnose, tensor_match
from grader.runs import run_side

LAB = "06_compile_and_graphs"
RUN = run_side(LAB)  # the learner side: grader/runs/06_compile_and_graphs.py
TITLE = "Compile and graphs: the path from Python to kernels"

OUT = {"dtype": torch.float32, "atol": 1e-4, "rtol": 1e-4}   # float32 results of small MLPs vs float64
_TORCH_MODULES = {"torch", "operator", "builtins", "math", "_operator"}


def _settings_verdict(obs: dict, what: str) -> str | None:
    """A message when the learner's code changed Dynamo's settings while the check ran."""
    if obs.get("settings"):
        return (f"your code changed compiler settings: {', '.join(obs['settings'][:4])}. The check {what} with "
                "Dynamo's defaults, as a fresh process does: a flag that makes a graph break or a recompile "
                "disappear from the count is not a fix. Remove the setting and fix the code.")
    return None


# --- exercise 1: a forward with no graph breaks --------------------------------------------------------------

def _breaks_cases(gen, public):
    def case(rule, flags, big):
        cfg = dict(d_in=randint(gen, 4, 24), d_hidden=randint(gen, 8, 40), d_out=randint(gen, 2, 10),
                   limit=round(uniform(gen, 0.3, 1.5), 3), seed=randint(gen, 0, 2**30), **flags)
        x = randn(gen, randint(gen, 2, 9), cfg["d_in"], scale=4.0 if big else 0.05)
        on = [k for k in ("log", "clip", "numpy_scale") if flags[k]]
        name = f"{rule}{': ' if rule else ''}BreakyNet with {'+'.join(on)}, x {tuple(x.shape)} " \
               f"({'large' if big else 'small'} values)"
        return Case(name, dict(cfg=cfg, x=x))

    every = dict(log=True, clip=True, numpy_scale=True)
    if public:
        return [case("", every, True), case("", every, False), case("", dict(log=False, clip=True, numpy_scale=False),
                                                                     True)]
    return [case("every break, large values", every, True), case("every break, small values", every, False),
            case("the print alone", dict(log=True, clip=False, numpy_scale=False), True),
            case("the branch alone", dict(log=False, clip=True, numpy_scale=False), True),
            case("the NumPy round trip alone", dict(log=False, clip=False, numpy_scale=True), True)]


def ref_smooth(model: BreakyNet, x: torch.Tensor, clip: bool = True, scale: bool = True,
               correction: int = 0, flags: bool = True, per_row: bool = False) -> torch.Tensor:
    """BreakyNet's output computed branch-free (the reference, and the usual mistakes through the knobs)."""
    h = model.fc1(x).relu()
    if (model.clip or not flags) and clip:
        h = h.clamp(max=model.limit)  # clamping below the limit changes nothing: the branch was never needed
    if (model.numpy_scale or not flags) and scale:
        std = h.std(dim=-1, keepdim=True, correction=correction) if per_row else h.std(correction=correction)
        h = h / (std + 1.0)
    return model.fc3(model.fc2(h).relu())


def _breaks_judge(case, obs):
    cfg, x = case.inputs["cfg"], case.inputs["x"].double()
    model = BreakyNet(**cfg).double()
    n_linear = 3
    linears = sum(names.count("linear") for names in obs["ops"])
    settings = _settings_verdict(obs, "counts graph breaks")
    if settings:
        return settings
    if linears < n_linear:
        return (f"only {linears} of the model's {n_linear} Linear layers ran inside the captured graph "
                f"({obs['graphs']} graph(s)): the rest ran in eager Python. torch._dynamo.disable, a try/except "
                "that falls back to eager, or work done outside the compiled function hides a break from the count "
                "without removing it. Make the whole forward traceable.")
    if obs["breaks"] > 0:
        reasons = "\n    ".join(obs["reasons"])
        return (f"smooth_forward still has {obs['breaks']} graph break(s) (target 0), {obs['graphs']} graphs. "
                f"Dynamo's reasons (as torch._dynamo.explain lists them):\n    {reasons}\n  Remove each: no print "
                "of a tensor, no .item() feeding an if (make it branch-free: torch.where / clamp), no NumPy (use the "
                "torch op).")
    foreign = [m for m in obs["modules"] if m not in _TORCH_MODULES]
    if foreign:
        return (f"the captured graph calls Python code from {foreign} as an opaque node (allow_in_graph or a "
                "custom op wrapping the break): the compiler cannot see inside it. Write the forward in torch ops.")
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        want = model(x)
        for how, got in obs["outs"].items():
            report = compare(got, want, name=f"smooth_forward(model, x), {how}", **OUT)
            if report:
                return _breaks_mistake(report + (" The compiled program and the eager call must compute the same: "
                                                 "no torch.compiler.is_compiling() branches." if how == "compiled"
                                                 else ""), got, model, x)
    return None


def _breaks_mistake(report: str, got, model: BreakyNet, x: torch.Tensor) -> str:
    """The message for a wrong output, naming the usual mistake it matches."""
    with torch.no_grad():
        return diagnose(report, got, [
            ("the forward without the clip: the `if` was deleted, not made branch-free (h.clamp(max=limit) "
             "is the same whether or not the max is above the limit)", lambda: ref_smooth(model, x, clip=False)),
            ("the forward without the NumPy scale: keep it, as h / (h.std(correction=0) + 1)",
             lambda: ref_smooth(model, x, scale=False)),
            ("a std with Bessel's correction: np.std is the population std, torch.std's default divides by n - 1 "
             "(use correction=0)", lambda: ref_smooth(model, x, correction=1)),
            ("the model's flags ignored: clip only if model.clip, scale only if model.numpy_scale (Python flags "
             "are fine in a graph: Dynamo specialises on them)", lambda: ref_smooth(model, x, flags=False)),
            ("a std per row: np.std of the whole array is one number over every element (h.std(correction=0), "
             "no dim)", lambda: ref_smooth(model, x, per_row=True)),
        ], tensor_match(**OUT))


GRAPH_BREAKS = Exercise(
    "graph_breaks", 3, ("smooth_forward",), _breaks_cases, RUN._breaks_run, _breaks_judge,
    title="A forward without graph breaks",
    hint="Keep model.fc1/fc2/fc3; drop the print; replace `if max > limit: clamp` by an unconditional clamp; "
         "replace the NumPy std by h.std(correction=0). torch._dynamo.explain(fn)(x).graph_break_count must be 0.")


# --- exercise 2: counting compilations -------------------------------------------------------------------------

KEY_OP = {"gelu_mlp": "gelu", "layer_norm": "layer_norm", "softmax": "softmax"}


@functools.lru_cache(maxsize=256)
def ref_count_compiles(name: str, shapes: tuple, dynamic=None, reset: bool = True, marked: bool = False) -> int:
    """Compilations of torch.compile(FUNCTIONS[name], dynamic=dynamic) called on inputs of `shapes` in turn (their
    batch dimension marked dynamic if ``marked``), counted by a backend (a count depends on the shapes only:
    cached); ``reset=False``: without a reset after :func:`_seen_before` (the mistake)."""
    fn, inputs = RUN.FUNCTIONS[name], RUN.marked([torch.randn(*s) for s in shapes], marked)
    with RUN._quiet_fresh_dynamo():
        if not reset:
            RUN._seen_before(fn, shapes)
        counter = CountingBackend()
        compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
        for x in inputs:
            compiled(x)
        return counter.compiles


def _count_cases(gen, public):
    def case(rule, shapes, dynamic=None, marked=False):
        name = choice(gen, sorted(RUN.FUNCTIONS))
        label = ", ".join("x".join(map(str, s)) for s in shapes)
        return Case(f"{rule}{': ' if rule else ''}{name}, dynamic={dynamic}, shapes {label}"
                    f"{', dim 0 marked dynamic' if marked else ''}",
                    dict(fn=name, shapes=[list(s) for s in shapes], dynamic=dynamic, marked=marked))

    d = lambda: randint(gen, 3, 9)  # noqa: E731
    if public:
        return [case("", [(4, 8), (4, 8), (6, 8), (9, 8), (9, 8)]), case("", [(3, 8), (5, 8), (7, 8)], dynamic=False),
                case("", [(4, 8), (1, 8), (6, 8)], dynamic=True)]
    width = d()
    rows = lambda k: sorted({randint(gen, 2, 40) for _ in range(8)})[:k]  # noqa: E731
    growing = rows(4)
    return [case("growing batches, one repeated", [(n, width) for n in growing[:1] + growing]),
            case("a batch of one among others", [(growing[0], width), (1, width)] + [(n, width) for n in growing[1:]]),
            case("dynamic=False: one graph per shape", [(n, width) for n in growing[:3]], dynamic=False),
            case("dynamic=True", [(n, width) for n in growing[:3]], dynamic=True),
            case("a new rank", [(growing[0], width), (2, growing[0], width)]),
            case("inputs marked dynamic", [(n, width) for n in growing[:3]], marked=True)]


def _count_judge(case, obs):
    shapes, dynamic, got = case.inputs["shapes"], case.inputs["dynamic"], obs["count"]
    settings = _settings_verdict(obs, "counts compilations")
    if settings:
        return settings
    if obs.get("course_counter"):
        return ("count_compiles compiled with gpulab.compiler.CountingBackend, the course's own counter: the "
                "exercise is that backend. Write it: a function (gm, example_inputs) that appends gm to a list and "
                "returns gm.forward.")
    if not isinstance(got, int) or isinstance(got, bool):
        return f"count_compiles must return the number of compilations as an int, got {got!r}."
    marked = bool(case.inputs.get("marked"))
    want = ref_count_compiles(case.inputs["fn"], tuple(tuple(s) for s in shapes), dynamic, True, marked)
    if got == want:
        return None
    message = f"count_compiles returned {got!r}; Dynamo compiled {want} time(s) for these shapes."
    key = (case.inputs["fn"], tuple(tuple(s) for s in shapes))
    return diagnose(message, got, [
        ("compilations without a torch._dynamo.reset() first: the check compiled fn once before calling you (as a "
         "notebook that used fn earlier does), and Dynamo remembered its size",
         lambda: ref_count_compiles(*key, dynamic, False, marked)),
        (f"compilations with `dynamic` ignored: pass dynamic={dynamic} on to torch.compile",
         lambda: ref_count_compiles(*key, None, True, marked) if dynamic is not None else None),
        ("compilations of copies of the inputs: a copy (x.clone(), torch.randn_like) loses the dynamic mark of "
         "dim 0, so Dynamo specialises on the first size; call the compiled function on the tensors given",
         lambda: ref_count_compiles(*key, dynamic) if marked else None),
        ("the number of calls: count in the backend, which Dynamo calls once per compilation, not per call",
         len(shapes)),
        ("the number of distinct shapes: after one recompile, automatic dynamic shapes make a generic graph "
         "(sizes 0 and 1 still get their own)", len({tuple(s) for s in shapes})),
        ("recompiles only (compilations minus the first)", want - 1),
    ], lambda g, w: g == w, "\n  Yours counts {}.")


COUNT_COMPILES = Exercise(
    "count_compiles", 2, ("count_compiles",), _count_cases, RUN._count_run, _count_judge,
    title="Counting compilations with a backend",
    hint="torch._dynamo.reset(); a backend(gm, example_inputs) that appends gm to a list and returns gm.forward; "
         "compiled = torch.compile(fn, backend=backend, dynamic=dynamic); call it on each input; count the list.")


# --- exercise 3: one compilation across sizes -------------------------------------------------------------------

def _once_cases(gen, public):
    def case(rule, rows, width):
        name = choice(gen, sorted(RUN.FUNCTIONS))
        return Case(f"{rule}{': ' if rule else ''}{name}, rows {rows}, width {width}",
                    dict(fn=name, rows=rows, width=width, seed=randint(gen, 0, 2**30)))

    if public:
        return [case("", [4, 6, 9, 12], 8), case("", [8, 3, 5], 8), case("", [5, 1, 7], 8)]
    sizes = sorted({randint(gen, 2, 64) for _ in range(10)})
    width = randint(gen, 3, 12)
    # growing past any bucket sized from the public cases (at most 12 rows)
    return [case("growing batches", sizes[:3] + [randint(gen, 100, 300)], width),
            case("shrinking batches", sizes[:4][::-1], width),
            case("a batch of one", [sizes[0], 1, sizes[1], 1], width),
            case("repeated sizes", [sizes[0], sizes[1], sizes[0], sizes[1]], width)]


def _once_judge(case, obs):
    fn, name, n = RUN.FUNCTIONS[case.inputs["fn"]], case.inputs["fn"], len(case.inputs["rows"])
    settings = _settings_verdict(obs, "counts compilations")
    if settings:
        return settings
    if obs["compiles"] != 1:
        return (f"the backend compiled {obs['compiles']} time(s) for rows {case.inputs['rows']}; the target is 1. "
                + ("Nothing was compiled with the backend you were given: pass it to torch.compile(..., backend=)."
                   if obs["compiles"] == 0 else
                   "Mark the batch dimension dynamic before the first call (torch._dynamo.mark_dynamic(x, 0)), and "
                   "remember that sizes 0 and 1 are always specialised: pad a batch of one to two rows and slice "
                   "the result; or pad every batch to one bucket."))
    if obs["runs"] < n:
        return (f"only {obs['runs']} of the {n} calls ran the compiled graph: the others ran eagerly. Every call "
                "must go through the one compiled graph.")
    if obs.get("unguarded"):
        return (f"{obs['unguarded']} call(s) ran the graph compiled for another shape: the backend's output was called "
                "directly, around Dynamo's guards (they check every input against what the graph assumed). Call the "
                "compiled function, and make that one graph dynamic in the batch dimension.")
    if obs["runs"] > n:
        return (f"the compiled graph ran {obs['runs']} times for {n} calls: call the compiled function once per "
                "call (and never the backend's output directly: Dynamo's guards must see every input).")
    if KEY_OP[name] not in obs["ops"]:
        return (f"the compiled graph does not contain {KEY_OP[name]}: compile the function you were given, "
                f"not a wrapper around part of it (graph ops: {obs['ops'][:12]}).")
    for i, (x, got) in enumerate(zip(RUN._once_inputs(case), obs["outs"])):
        want = fn(x.double())
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return (f"call {i} (rows {x.shape[0]}): the result is {shape}, expected {tuple(want.shape)}: slice the "
                    "padding rows off the result.")
        report = compare(got, want, name=f"call {i} (rows {x.shape[0]})", **OUT)
        if report:
            return report
    return None


COMPILE_ONCE = Exercise(
    "compile_once", 3, ("compile_once",), _once_cases, RUN._once_run, _once_judge,
    title="One compilation across dynamic sizes",
    hint="compiled = torch.compile(fn, backend=backend); in the wrapper: pad a one-row batch to two rows, "
         "torch._dynamo.mark_dynamic(x, 0), call compiled, slice off the padding.")


# --- exercise 4: a training step with no host sync -----------------------------------------------------------

def _overflowing_row(gen, case: Case) -> tuple:
    """A row (d,) of huge finite values and its label, for the case's model: every logit finite, but the label's
    logit so far below the largest that its log-probability overflows to -inf, so the loss is +inf, not NaN (an
    isnan test lets it through). The row's scale is the middle of the range where that holds (a GPU's float32
    rounding differs a little)."""
    model, d = RUN._step_model(case), case.inputs["sizes"][0]
    scales = 2.0 ** (torch.arange(1600, 2048, dtype=torch.float64) / 16)   # (Q,) 2^100 .. 2^128
    for _ in range(500):
        v = randn(gen, d, scale=2.0)
        with torch.no_grad():
            logits = model((v.double()[None] * scales[:, None]).float())    # (Q, classes)
            label = torch.full((len(scales),), int(logits[0].argmin()))
            loss = torch.nn.functional.cross_entropy(logits, label, reduction="none")
        good = (torch.isfinite(logits).all(1) & (loss == math.inf)).nonzero().flatten()
        if len(good) >= 6:
            return (v.double() * scales[int(good[len(good) // 2])]).float(), int(label[0])
    raise RuntimeError("no overflowing row for this model")  # not met in 10^4 draws


def _step_cases(gen, public):
    def case(rule, steps, bad_at=(), max_norm=None, overflow_at=None):
        d, h, c, b = randint(gen, 4, 16), randint(gen, 8, 32), randint(gen, 2, 6), randint(gen, 4, 12)
        xs = [randn(gen, b, d, scale=2.0) for _ in range(steps)]
        for i in bad_at:
            xs[i][randint(gen, 0, b - 1), randint(gen, 0, d - 1)] = choice(gen, [float("inf"), float("nan")])
        ys = [torch.randint(0, c, (b,), generator=gen) for _ in range(steps)]
        norm = max_norm if max_norm is not None else round(uniform(gen, 0.3, 3.0), 3)
        what = f"{steps} steps, batch {b}" + (f", non-finite batch at step {list(bad_at)}" if bad_at else "")
        inputs = dict(sizes=[d, h, c], seed=randint(gen, 0, 2**30), xs=xs, ys=ys, lr=0.1, max_norm=norm)
        if overflow_at is not None:
            inputs["head_gain"] = 16.0
            row = randint(gen, 0, b - 1)
            xs[overflow_at][row], ys[overflow_at][row] = _overflowing_row(gen, Case("", inputs))
            what += f", a row of huge values at step {overflow_at}, output layer x16"
        return Case(f"{rule}{': ' if rule else ''}{what}, max_norm {norm}", inputs)

    if public:
        return [case("", 3), case("", 4, bad_at=(1,)), case("", 2, max_norm=0.01)]
    return [case("clean steps", randint(gen, 2, 4)), case("a non-finite batch", 4, bad_at=(randint(gen, 0, 3),)),
            case("the first batch non-finite", 3, bad_at=(0,)), case("every step clipped", 3, max_norm=0.001),
            case("nothing clipped", 3, max_norm=1e6), case("a batch of huge values", 3, overflow_at=randint(gen, 0, 2))]


def _step_judge(case, obs):
    if obs["syncs"]:
        found = "\n    ".join(obs["syncs"])
        return (f"the step synchronises with the host ({len(obs['syncs'])} found):\n    {found}\n  Keep every value "
                "on the device: accumulate statistics as tensors (stats['loss'] += loss.detach()), replace an `if` "
                "on a tensor by torch.where, and print nothing inside the step.")
    x = case.inputs
    model, stats = RUN._step_model(case), new_stats()
    with contextlib.redirect_stdout(io.StringIO()):
        for xb, yb in zip(x["xs"], x["ys"]):
            train_step_with_syncs(model, xb, yb, x["lr"], x["max_norm"], stats)
    for name, want in stats.items():
        got = obs["stats"].get(name)
        ok = isinstance(got, torch.Tensor) and got.numel() == 1 and close(float(got), float(want), 1e-4, 1e-5)
        if not ok:
            hint = {"loss": "the sum of the losses of the steps taken (a skipped batch adds nothing)",
                    "correct": "correct predictions of the steps taken",
                    "clipped": "steps taken whose gradient norm was above max_norm",
                    "skipped": "batches whose loss was not finite"}[name]
            return (f"stats['{name}'] = {got!r}, expected {float(want):g}: {hint}. Update the 0-d tensors in place "
                    "(stats[name] += ...) with torch.where(finite, value, 0).")
    for i, (got, want) in enumerate(zip(obs["params"], model.parameters())):
        report = compare(got, want.detach(), name=f"parameter {i} after the steps", dtype=torch.float32,
                         atol=1e-5, rtol=1e-4)
        if report:
            return report + ("\n  A non-finite batch must leave the parameters unchanged: update with "
                             "torch.where(finite, p - lr * grad, p), never with a NaN gradient."
                             if not torch.isfinite(got).all() or any(
                                 not torch.isfinite(xb).all() for xb in x["xs"]) else "")
    return None


SYNC_FREE_STEP = Exercise(
    "sync_free_step", 3, ("train_step",), _step_cases, RUN._step_run, _step_judge,
    title="A training step with no host sync",
    hint="finite = torch.isfinite(loss); zero_grad, backward, norm = clip_grad_norm_(...); update each p with "
         "torch.where(finite, p - lr * p.grad, p); stats[...] += torch.where(finite, value, 0) as tensors.")


# --- exercise 5: capture once, replay ---------------------------------------------------------------------------

def _graph_cases(gen, public):
    def case(rule, n_inputs, calls):
        rows, d = randint(gen, 2, 8), randint(gen, 3, 12)
        name = f"{rule}{': ' if rule else ''}{n_inputs} input(s) ({rows}, {d}), {calls} calls"
        return Case(name, dict(rows=rows, d=d, n_inputs=n_inputs, calls=calls, seed=randint(gen, 0, 2**30)))

    if public:
        return [case("", 1, 3), case("", 2, 4)]
    return [case("one input", 1, randint(gen, 2, 5)), case("two inputs", 2, randint(gen, 2, 5)),
            case("many calls", 1, 8)]


def _graph_judge(case, obs):
    calls = case.inputs["calls"]
    if obs["init"]["captures"] != 1:
        return (f"GraphRunner(...) captured {obs['init']['captures']} graph(s) when constructed: capture exactly one, "
                "in __init__ (with api.capture(g): static_out = fn(*static_inputs)).")
    if obs["captures"] != 1:
        return (f"{obs['captures'] - 1} more capture(s) during {calls} calls: a call must replay the graph captured "
                "in __init__, never capture again (a capture costs as much as the eager run it records, and more).")
    if obs["eager"]:
        return (f"__call__ ran {', '.join(obs['eager'][:6])} outside the graph: the call computed eagerly. Copy the "
                "inputs into the static buffers, g.replay(), return the static output.")
    if obs["replays"] - obs["init"]["replays"] != calls:
        return (f"{obs['replays'] - obs['init']['replays']} replay(s) for {calls} calls: replay once per call.")
    if not obs["example_kept"]:
        return ("the example inputs were modified: they became your static buffers and each call copied into them. "
                "Allocate your own static input buffers (clone the examples) in __init__.")
    fn = RUN._graph_model(case, torch.float64)
    stale = fn(*[t.double() for t in RUN._graph_inputs(case, 0)])
    for k, got in enumerate(obs["outs"], start=1):
        want = fn(*[t.double() for t in RUN._graph_inputs(case, k)])
        report = compare(got, want, name=f"call {k}", **OUT)
        if report:
            return diagnose(report, got, [
                ("the output of the example inputs: the replay read the static buffers captured in __init__, "
                 "and the new inputs never reached them. Copy into the buffers (static.copy_(x)); rebinding "
                 "a name to a new tensor does not move the graph's pointers", stale)],
                tensor_match(**OUT))
    return None


GRAPH_RUNNER = Exercise(
    "graph_runner", 3, ("GraphRunner",), _graph_cases, RUN._graph_run, _graph_judge,
    title="Capture once, replay with static buffers",
    hint="__init__: static inputs = clones; `with api.warmup():` run fn once; g = api.graph(); `with "
         "api.capture(g): self.out = fn(*static)`. __call__: static[i].copy_(x[i]); g.replay(); return self.out.")


# --- exercise 6: reading a profiler trace -------------------------------------------------------------------

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def ref_trace_summary(trace: dict, k: int, min_gap_us: float, *, top_cats=("kernel",), busy_cats=DEVICE_CATS,
                      aggregate: bool = True, merge: bool = True) -> dict:
    """The top-k kernels by total time, the idle gaps of the device (no kernel, copy or memset on any stream)
    of at least min_gap_us, and the busy fraction of the device window. Knobs: the usual mistakes."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    totals: dict = {}
    for i, e in enumerate(events):
        if e.get("cat") in top_cats:
            key = e["name"] if aggregate else (e["name"], i)
            totals[key] = totals.get(key, 0.0) + e["dur"]
    top = sorted(((key if aggregate else key[0], t) for key, t in totals.items()), key=lambda kv: (-kv[1], kv[0]))[:k]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in busy_cats)
    gaps, busy, end = [], 0.0, spans[0][0]
    for start, stop in spans:
        if start - end >= min_gap_us:
            gaps.append((end, start - end))
        if merge:
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        else:
            busy += stop - start
            end = stop
    return {"top": top, "gaps": gaps, "busy": busy / (end - spans[0][0])}


def _trace_cases(gen, public):
    names = ["sgemm_128x64_nn", "vectorized_elementwise_kernel<gelu>", "reduce_kernel<sum>", "softmax_warp_forward",
             "triton_poi_fused_add_mul_0", "triton_red_fused_layer_norm_1", "cutlass_80_tensorop_s1688gemm"]

    def case(rule, n_kernels, gap_scale, streams=1, memcpy=False, cpu=True, shuffle=False, flows=True):
        # times in eighths of a microsecond: sums and differences are exact, so a gap can equal min_gap_us exactly
        eighth = lambda v: round(v * 8) / 8  # noqa: E731
        k, min_gap = randint(gen, 2, 4), round(uniform(gen, 5.0, 15.0) * 4) / 4
        events, t = [], eighth(uniform(gen, 1000, 2000))
        for i in range(n_kernels):
            t += eighth(uniform(gen, 0.5, 3.0) * gap_scale if randint(gen, 0, 3) == 0 else uniform(gen, 0.0, 2.0))
            dur = eighth(uniform(gen, 2.0, 60.0))
            events.append({"ph": "X", "cat": "kernel", "name": choice(gen, names), "ts": t, "dur": dur,
                           "pid": 0, "tid": 7 + (i % streams)})
            t += dur if streams == 1 or i % streams == streams - 1 else -eighth(dur * uniform(gen, 0.2, 0.9))
            if memcpy and i % 5 == 2:
                events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                               "ts": t + 0.5, "dur": eighth(gap_scale * 2), "pid": 0, "tid": 7})
                t += eighth(gap_scale * 2) + 0.5
        # the last kernel starts exactly min_gap_us after the device falls idle: a gap "of at least" min_gap_us
        end = max(e["ts"] + e["dur"] for e in events)
        last = {"ph": "X", "cat": "kernel", "name": choice(gen, names), "ts": end + min_gap,
                "dur": eighth(uniform(gen, 8.0, 60.0)), "pid": 0, "tid": 7}
        # and a copy that starts inside it and ends first: the last event to start is not the last to end
        copy = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": last["ts"] + 1.0,
                "dur": eighth(uniform(gen, 1.0, last["dur"] - 2.0)), "pid": 0, "tid": 9}
        events += [last, copy]
        n_kernels += 1
        if cpu:
            for e in list(events)[:n_kernels // 2]:
                events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": e["ts"] - 30,
                               "dur": 400.0, "pid": 1, "tid": 1})
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": e["ts"] - 20,
                               "dur": 5.0, "pid": 1, "tid": 1})
        if flows:
            events += [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "ts": 1000.0, "pid": 1, "tid": 1},
                       {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "ts": 1001.0, "pid": 0, "tid": 7}]
        if shuffle:
            order = torch.randperm(len(events), generator=gen).tolist()
            events = [events[i] for i in order]
        name = f"{rule}{': ' if rule else ''}{len(events)} events, {streams} stream(s), top {k}, gaps >= {min_gap} us"
        return Case(name, dict(trace={"traceEvents": events}, k=k, min_gap_us=min_gap))

    if public:
        return [case("", 12, 40.0), case("", 16, 30.0, memcpy=True, shuffle=True),
                case("", 18, 25.0, streams=2)]
    return [case("repeated kernels", 20, 30.0, cpu=False, flows=False), case("cpu ops and flow events", 14, 30.0),
            case("unsorted events", 16, 30.0, shuffle=True), case("a copy inside a gap", 20, 30.0, memcpy=True),
            case("two streams overlapping", 20, 30.0, streams=2), case("launch-bound: mostly idle", 12, 200.0)]


def _same_summary(got, want) -> bool:
    try:
        top = [(str(n), float(t)) for n, t in got["top"]]
        gaps = [(float(s), float(length)) for s, length in got["gaps"]]
        busy = float(got["busy"])
    except (TypeError, KeyError, ValueError):
        return False
    return ([n for n, _ in top] == [n for n, _ in want["top"]]
            and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) for (_, a), (_, b) in zip(top, want["top"]))
            and len(gaps) == len(want["gaps"])
            and all(math.isclose(a, b, abs_tol=1e-6) and math.isclose(c, d, abs_tol=1e-6)
                    for (a, c), (b, d) in zip(gaps, want["gaps"]))
            and math.isclose(busy, want["busy"], rel_tol=1e-6, abs_tol=1e-9))


def _trace_judge(case, obs):
    x = case.inputs
    def ref(min_gap_us=x["min_gap_us"], **mistake):
        return ref_trace_summary(x["trace"], x["k"], min_gap_us, **mistake)

    want, got = ref(), obs["summary"]
    if not isinstance(got, dict) or not {"top", "gaps", "busy"} <= set(got):
        return f"trace_summary must return a dict with 'top', 'gaps' and 'busy'; got {type(got).__name__}."
    if _same_summary(got, want):
        return None
    shown = {key: got.get(key) for key in ("top", "gaps", "busy")}
    message = (f"trace_summary gave {str(shown)[:400]};\n  expected top {want['top']}, {len(want['gaps'])} gap(s) "
               f"{[(round(s, 3), round(n, 3)) for s, n in want['gaps']][:5]}, busy {want['busy']:.4f}.")
    return diagnose(message, got, [
        ("kernels not added up by name: a kernel launched many times is one line of the top list, its total time",
         lambda: ref(aggregate=False)),
        ("CPU-side events counted as device work: keep the device categories (cat 'kernel'; for gaps also "
         "'gpu_memcpy' and 'gpu_memset')", lambda: ref(top_cats=("kernel", "cpu_op", "cuda_runtime"),
                                                       busy_cats=DEVICE_CATS + ("cpu_op", "cuda_runtime"))),
        ("copies ignored: a memcpy or memset keeps the device busy, so it is not an idle gap",
         lambda: ref(busy_cats=("kernel",))),
        ("overlapping kernels (two streams) not merged: the device is idle only when no stream runs anything",
         lambda: ref(merge=False)),
        ("gaps strictly longer than min_gap_us: a gap of exactly min_gap_us counts (at least, >=)",
         lambda: ref(min_gap_us=math.nextafter(x["min_gap_us"], math.inf))),
    ], _same_summary, "\n  Yours matches {} instead.")


TRACE_SUMMARY = Exercise(
    "trace_summary", 2, ("trace_summary",), _trace_cases, RUN._trace_run, _trace_judge,
    title="Reading a profiler trace: top kernels and idle gaps",
    hint="Keep ph == 'X' events; top: sum dur per name over cat 'kernel', sort descending, first k; gaps: sort the "
         "device events (kernel, gpu_memcpy, gpu_memset) by ts, track the end of the busy union, record gaps >= "
         "min_gap_us as (start, length); busy = union length / (last end - first start).")


# --- exercise 7: measuring a compiler win honestly -------------------------------------------------------------


def _win_cases(gen, public):
    def case(rule, win=True, compile_range=(0.5, 30.0)):
        eager = uniform(gen, 0.5e-3, 5e-3)
        p = dict(eager_s=eager, compiled_s=eager * (uniform(gen, 0.25, 0.8) if win else uniform(gen, 1.1, 1.6)),
                 compile_s=uniform(gen, *compile_range), host_s=eager * 0.005, eager_first=uniform(gen, 5, 20),
                 record=uniform(gen, 3, 10), hiccup=uniform(gen, 6, 12))
        p["first_work_s"] = p["compile_s"] * uniform(gen, 0.2, 0.5)  # autotuning's benchmarks, on the device
        x = randn(gen, 4, 8)
        # the name says nothing of the timings: they are what the learner measures
        return Case(f"{rule}{': ' if rule else ''}x {tuple(x.shape)}, warmup {RUN.WARMUP}, repeats {RUN.REPEATS}",
                    dict(params=p, x=x))

    if public:
        return [case(""), case("", win=False)]
    return [case("a first function"), case("a second function", win=False),
            case("a third function", compile_range=(60.0, 300.0))]


def _unmeasured(readings: list, **values) -> str | None:
    """The first of ``values`` (seconds) that is no difference of two of the clock ``readings``, if any."""
    spans = [b - a for i, a in enumerate(readings) for b in readings[i + 1:]]
    for name, value in values.items():
        if not any(abs(value - s) <= 1e-9 + 1e-9 * abs(s) for s in spans):
            return name
    return None


def _win_judge(case, obs):
    p, calls, got = case.inputs["params"], obs["calls"], obs["result"]
    if not isinstance(got, dict) or not {"compile_s", "eager_ms", "compiled_ms", "speedup"} <= set(got):
        return f"measure_compile_win must return a dict with compile_s, eager_ms, compiled_ms, speedup; got {got!r}."
    if not calls["clock"]:
        return ("measure_compile_win never read the clock it was given: time with clock() and sync() (the "
                "arguments; the check's device runs on a virtual clock), not time.perf_counter directly.")
    if calls["compile_fn"] != 1:
        return (f"compile_fn was called {calls['compile_fn']} times: compile once, and time the function it returns "
                "(each call of compile_fn is a new compilation).")
    if calls["other_input"]:
        return (f"{calls['other_input']} call(s) got another input than x: time eager and compiled on the same "
                "input, or the comparison measures the inputs, not the compiler.")
    try:
        compile_s, eager, compiled, speedup = (float(got[k]) for k in ("compile_s", "eager_ms", "compiled_ms",
                                                                       "speedup"))
    except (TypeError, ValueError):
        return f"measure_compile_win returned non-numbers: {got!r}."
    want_eager, want_compiled = p["eager_s"] * 1e3, p["compiled_s"] * 1e3
    if eager < 0.5 * want_eager or compiled < 0.5 * want_compiled:
        return (f"eager_ms {eager:.4f} and compiled_ms {compiled:.4f} are far below the work per call "
                f"({want_eager:.4f} and {want_compiled:.4f} ms): the timer stopped before the device finished. "
                "Call sync() before reading the clock (and before starting it).")
    want_first = p["compile_s"] + p["first_work_s"]
    if not close(compile_s, want_first, 0.02, 1e-6):
        why = ("\n  Yours stops at the end of the host's part: the first call's device work (autotuning, the first "
               "run) was still queued when you read the clock. sync() after the first call, then read it."
               if close(compile_s, p["compile_s"] + p["host_s"], 0.02, 1e-6) else "")
        return (f"compile_s = {compile_s:.4f}, expected the first call of the compiled function, synchronised: "
                f"{want_first:.4f} s ({p['compile_s']:.4f} s of compiling on the host, then its work on the device). "
                f"Time that first call on its own.{why}")
    mean = lambda work: work * (RUN.REPEATS - 1 + p["hiccup"]) / RUN.REPEATS * 1e3  # noqa: E731
    if close(eager, mean(p["eager_s"]), 0.02, 1e-9) or close(compiled, mean(p["compiled_s"]), 0.02, 1e-9):
        return (f"eager_ms {eager:.4f}, compiled_ms {compiled:.4f}: the mean of the timed calls, and one of them was "
                f"slowed {p['hiccup']:.1f} times by the device (another process, a clock change). Report the median "
                f"of the samples (warm calls take {want_eager:.4f} and {want_compiled:.4f} ms): one outlier moves a "
                "mean, not a median.")
    if compiled > 1.5 * want_compiled:
        return (f"compiled_ms = {compiled:.4f}, but a warm compiled call takes {want_compiled:.4f} ms: your timing "
                "includes the compile or the first calls (graph recording, autotuning). Warm up with `warmup` calls "
                "after the first, then time.")
    if eager > 1.5 * want_eager:
        return (f"eager_ms = {eager:.4f}, but a warm eager call takes {want_eager:.4f} ms: warm eager up too (its "
                "first call initialises caches and libraries), then time.")
    if not close(eager, want_eager, 0.02, 1e-9) or not close(compiled, want_compiled, 0.02, 1e-9):
        return (f"eager_ms {eager:.4f} vs expected {want_eager:.4f}, compiled_ms {compiled:.4f} vs "
                f"{want_compiled:.4f}: time each warm call between two sync() calls and take the median.")
    measured = _unmeasured(obs.get("readings", []), compile_s=compile_s, eager_ms=eager / 1e3,
                           compiled_ms=compiled / 1e3)
    if measured:
        return (f"{measured} is not a time between two of your clock() readings: measure each value with the clock "
                "and sync() you were given (a median of an odd number of samples is one of them), never compute it "
                "from anything else.")
    if not close(speedup, eager / compiled, 0.01, 1e-9):
        return f"speedup = {speedup:.4f}, expected eager_ms / compiled_ms = {eager / compiled:.4f}."
    return None


COMPILE_WIN = Exercise(
    "compile_win", 2, ("measure_compile_win",), _win_cases, RUN._win_run, _win_judge,
    title="Measuring a compiler win honestly",
    hint="compiled = compile_fn(fn); sync(); t = clock(); compiled(x); sync(); compile_s = clock() - t; then warm "
         "both up, and time each call between sync()s on the same x; medians in ms; speedup = eager / compiled.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.compiler.BreakyNet", "gpulab.compiler.CountingBackend",
           "gpulab.compiler.graph_ops", "gpulab.graphs.graph_api", "gpulab.measurements.show_measurements",
           "gpulab.syncs.SyncDetector", "gpulab.syncs.make_classifier", "gpulab.syncs.new_stats",
           "gpulab.syncs.train_step_with_syncs")
EXERCISES = [offering(ex, OFFERED) for ex in (GRAPH_BREAKS, COUNT_COMPILES, COMPILE_ONCE, SYNC_FREE_STEP,
                                          GRAPH_RUNNER, TRACE_SUMMARY, COMPILE_WIN)]
BENCHMARKS: list = []
