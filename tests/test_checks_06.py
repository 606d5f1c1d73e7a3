"""Lab 06's checks: the solution passes; the mistakes compile-and-graphs code really has are rejected with a message
that names them: a forward that keeps its breaks, deletes the branch instead of making it branch-free, takes
Bessel's std, or hides a break (torch._dynamo.disable, an eager fallback, a flag that captures .item() or reorders a
print, an is_compiling() branch, a custom op); compilations counted per call, per shape, without reset or ignoring
`dynamic`; Inductor refused in every check; a wrapper that recompiles for the batch of one, falls back to eager,
returns padding, changes a compiler setting, calls the graph around Dynamo's guards or guesses a bucket; a training
step with .item(), an `if` on a tensor or a print, one that updates with NaN gradients or counts a skipped loss; a
graph runner that captures on every call, rebinds its buffers, runs eagerly or writes into the caller's examples; a
trace reader that does not add kernels up, counts host events, ignores copies or does not merge overlapping streams;
a timer on its own clock or without warm-up."""
import json
import time

import pytest
import torch

from gpulab.compiler import BreakyNet, CountingBackend
from gpulab.syncs import train_step_with_syncs
from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import failed_rules, grade, public, solution_namespace, with_answer

STEM = "06_compile_and_graphs"
CHECKS = load_lab(STEM)
EX = exercises(STEM)


@pytest.fixture(scope="module")
def sol06():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only waits on a busy CPU (60 ms vs 0.6 ms a step)
    yield solution_namespace(STEM)
    torch.set_num_threads(threads)




@pytest.mark.parametrize("eid", list(EX))
def test_solution_passes_public_and_hidden_cases(sol06, eid):
    result = grade(STEM, eid, sol06)
    assert result.status == "passed", result.message


# --- 1. graph breaks ---------------------------------------------------------------------------------------------

def _forward(clip=True, correction=0):
    def smooth_forward(model, x):
        h = model.fc1(x).relu()
        if model.clip and clip:
            h = h.clamp(max=model.limit)
        if model.numpy_scale:
            h = h / (h.std(correction=correction) + 1.0)
        return model.fc3(model.fc2(h).relu())
    return smooth_forward


def test_the_model_as_is_keeps_its_breaks(sol06):
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=lambda model, x: model(x)), 1)
    assert r.status == "failed" and "still has 3 graph break(s)" in r.message, r.message


def test_deleting_the_branch_instead_of_clamping_is_named(sol06):
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=_forward(clip=False)), 1)
    assert r.status == "failed" and "the `if` was deleted, not made branch-free" in r.message, r.message


def test_bessels_std_is_named(sol06):
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=_forward(correction=1)), 1)
    assert r.status == "failed" and "Bessel's correction" in r.message, r.message


def test_disabling_dynamo_hides_the_breaks_and_fails(sol06):
    hidden = torch._dynamo.disable(lambda model, x: model(x))
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=hidden), 1)
    assert r.status == "failed" and "only 0 of the model's 3 Linear layers ran inside" in r.message, r.message


def test_an_eager_fallback_around_a_compiled_attempt_fails(sol06):
    def smooth_forward(model, x):  # "it compiles whenever it can": the breaks are still there, in eager
        try:
            return torch.compile(model, fullgraph=True, backend="eager")(x)
        except Exception:
            return model(x)
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    assert r.status != "passed" and r.score == 0, r.message


def test_disabling_only_the_numpy_part_still_counts_its_breaks(sol06):
    @torch._dynamo.disable
    def numpy_scale(h):
        return h / (float(torch.from_numpy(h.detach().numpy()).std(correction=0)) + 1.0)

    def smooth_forward(model, x):
        h = model.fc1(x).relu().clamp(max=model.limit)
        return model.fc3(model.fc2(numpy_scale(h)).relu())
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    assert r.status == "failed" and "graph break(s) (target 0)" in r.message, r.message


def test_capturing_scalar_outputs_does_not_count_as_a_fix(sol06):
    def smooth_forward(model, x):  # relies on capture_scalar_outputs=True to swallow the .item() break
        torch._dynamo.config.capture_scalar_outputs = True
        h = model.fc1(x).relu()
        if h.abs().max().item() > model.limit:
            h = h.clamp(max=model.limit)
        h = h / (h.std(correction=0) + 1.0)
        return model.fc3(model.fc2(h).relu())
    try:
        r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    finally:
        torch._dynamo.config.capture_scalar_outputs = False
    assert r.status == "failed" and "graph break" in r.message, r.message


def test_a_forward_that_cheats_only_when_compiling_fails(sol06):
    def smooth_forward(model, x):  # the clean forward where Dynamo looks, the breaky model everywhere else
        if torch.compiler.is_compiling():
            return _forward(clip=False)(model, x)
        return model(x)
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    assert r.status == "failed" and "smooth_forward(model, x), compiled" in r.message, r.message
    assert "is_compiling" in r.message and "the `if` was deleted" in r.message, r.message


def _keeps_the_print(model, x):
    h = model.fc1(x).relu()
    if model.log:
        print("hidden mean", h.mean())
    return _forward()(model, x)


def test_a_flag_that_reorders_the_print_does_not_count_as_a_fix(sol06):
    def smooth_forward(model, x):  # sets the flag itself, while the check runs
        torch._dynamo.config.reorderable_logging_functions.add(print)
        return _keeps_the_print(model, x)
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    assert r.status == "failed" and "changed compiler settings: torch._dynamo.config.reorderable_logging_functions" \
        in r.message, r.message
    assert print not in torch._dynamo.config.reorderable_logging_functions  # undone after the check
    torch._dynamo.config.reorderable_logging_functions.add(print)  # set in an earlier cell: Dynamo's defaults count
    try:
        r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=_keeps_the_print), 1)
    finally:
        torch._dynamo.config.reorderable_logging_functions.discard(print)
    assert r.status == "failed" and "still has 1 graph break(s)" in r.message, r.message


@pytest.mark.parametrize("knobs, says", [(dict(flags=False), "the model's flags ignored"),
                                         (dict(per_row=True), "a std per row")])
def test_a_forward_that_ignores_the_flags_or_takes_a_std_per_row_is_named(sol06, knobs, says):
    wrong = lambda model, x: CHECKS.ref_smooth(model, x, **knobs)  # noqa: E731
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=wrong))
    assert r.status == "failed" and says in r.message, r.message


def test_a_custom_op_wrapping_the_numpy_std_fails(sol06):
    import numpy as np

    @torch.library.custom_op("lab06_test::np_std", mutates_args=())
    def np_std(h: torch.Tensor) -> torch.Tensor:  # the NumPy round trip, hidden in an opaque operator
        return torch.tensor(float(np.std(h.detach().cpu().numpy())), dtype=h.dtype)

    np_std.register_fake(lambda h: h.new_empty(()))

    def smooth_forward(model, x):
        h = model.fc1(x).relu().clamp(max=model.limit) if model.clip else model.fc1(x).relu()
        if model.numpy_scale:
            h = h / (np_std(h) + 1.0)
        return model.fc3(model.fc2(h).relu())
    r = public(STEM, "graph_breaks", with_answer(sol06, smooth_forward=smooth_forward), 1)
    assert r.status == "failed" and "from ['torch.ops.lab06_test'] as an opaque node" in r.message, r.message


def test_reference_equals_the_breaky_model():
    for flags in ({}, {"log": False}, {"clip": False}, {"numpy_scale": False}):
        model = BreakyNet(d_in=5, d_hidden=7, d_out=3, seed=4, **flags).double()
        for scale in (0.05, 4.0):
            x = torch.randn(6, 5, dtype=torch.float64) * scale
            with torch.no_grad():
                assert torch.allclose(CHECKS.ref_smooth(model, x), model(x), atol=1e-12)


# --- 2. counting compilations -------------------------------------------------------------------------------------

def test_counting_calls_is_named(sol06):
    r = public(STEM, "count_compiles", with_answer(sol06, count_compiles=lambda fn, inputs, dynamic=None: len(inputs)))
    assert r.status == "failed" and "Yours counts the number of calls" in r.message, r.message


def test_counting_distinct_shapes_is_named(sol06):
    def count_compiles(fn, inputs, dynamic=None):
        return len({tuple(x.shape) for x in inputs})
    r = public(STEM, "count_compiles", with_answer(sol06, count_compiles=count_compiles))
    assert r.status == "failed" and "the number of distinct shapes" in r.message, r.message


def _count(reset=True, pass_dynamic=True, backend=None, copies=False):
    def count_compiles(fn, inputs, dynamic=None):
        if copies:  # BUG: copies lose the callers' dynamic marks
            inputs = [x.clone() for x in inputs]
        if reset:
            torch._dynamo.reset()
        graphs = []

        def counting(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        compiled = torch.compile(fn, backend=backend or counting, **({"dynamic": dynamic} if pass_dynamic else {}))
        for x in inputs:
            compiled(x)
        return len(graphs)
    return count_compiles


@pytest.mark.parametrize("bug, n, says", [
    (dict(reset=False), 1, "Yours counts compilations without a torch._dynamo.reset() first"),
    (dict(pass_dynamic=False), 2, "Yours counts compilations with `dynamic` ignored: pass dynamic=False"),
])
def test_a_count_without_reset_or_without_dynamic_is_named(sol06, bug, n, says):
    r = evaluate(EX["count_compiles"], with_answer(sol06, count_compiles=_count(**bug)), "cpu",
                 EX["count_compiles"].cases()[n - 1:n])
    assert r.status == "failed" and says in r.message, r.message


def test_counting_with_the_courses_backend_fails(sol06):
    def count_compiles(fn, inputs, dynamic=None):  # the lesson's counter: right counts, not the exercise
        torch._dynamo.reset()
        counter = CountingBackend()
        compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
        for x in inputs:
            compiled(x)
        return counter.compiles
    r = public(STEM, "count_compiles", with_answer(sol06, count_compiles=count_compiles), 1)
    assert r.status == "failed" and "gpulab.compiler.CountingBackend, the course's own counter" in r.message


def test_counting_on_copies_of_marked_inputs_fails_on_every_seed(sol06):
    for r in _hidden("count_compiles", "inputs marked dynamic", sol06, count_compiles=_count(copies=True)):
        assert r.status == "failed" and "Yours counts compilations of copies of the inputs" in r.message, r.message


def test_inductor_is_refused_in_every_check(sol06):
    """torch.compile without a backend would spend ~20 s in Inductor per case: the checks refuse it at once."""
    r = public(STEM, "count_compiles", with_answer(sol06, count_compiles=_count(backend="inductor")), 1)
    assert r.status == "error" and "Inductor is off in this check" in r.message, r.message

    class CompiledRunner:  # CUDA graphs by torch.compile(mode="reduce-overhead"): Inductor too
        def __init__(self, fn, example_inputs, api):
            self.fn = torch.compile(fn, mode="reduce-overhead")

        def __call__(self, *inputs):
            return self.fn(*inputs)
    r = public(STEM, "graph_runner", with_answer(sol06, GraphRunner=CompiledRunner), 1)
    assert r.status == "error" and "Inductor is off in this check" in r.message, r.message


# --- 3. one compilation across sizes -------------------------------------------------------------------------------

def test_plain_compile_recompiles(sol06):
    plain = with_answer(sol06, compile_once=lambda fn, backend: torch.compile(fn, backend=backend))
    r = public(STEM, "compile_once", plain, 1)
    assert r.status == "failed" and "compiled 2 time(s)" in r.message, r.message


def test_dynamic_true_recompiles_for_the_batch_of_one(sol06):
    r = public(STEM, "compile_once", with_answer(
        sol06, compile_once=lambda fn, backend: torch.compile(fn, backend=backend, dynamic=True)))
    assert r.status == "failed" and r.cases[-1].status == "failed", r.message  # (8, 8) also fails: duck sizing
    assert "sizes 0 and 1 are always specialised" in r.cases[-1].message


def test_an_eager_fallback_for_awkward_sizes_fails(sol06):
    def compile_once(fn, backend):
        compiled = torch.compile(fn, backend=backend)

        def call(x):
            if x.shape[0] == 1:
                return fn(x)                      # BUG: the batch of one runs eagerly
            torch._dynamo.mark_dynamic(x, 0)
            return compiled(x)
        return call
    r = public(STEM, "compile_once", with_answer(sol06, compile_once=compile_once))
    assert r.status == "failed" and "ran the compiled graph: the others ran eagerly" in r.message, r.message


def test_padding_left_in_the_result_fails(sol06):
    def compile_once(fn, backend):
        compiled = torch.compile(fn, backend=backend)

        def call(x):
            x = torch.cat([x, x.new_zeros(64 - x.shape[0], x.shape[1])])  # one bucket of 64 rows ...
            return compiled(x)                                            # BUG: ... never sliced back
        return call
    r = public(STEM, "compile_once", with_answer(sol06, compile_once=compile_once), 1)
    assert r.status == "failed" and "slice the padding rows off" in r.message, r.message


def test_ignoring_the_given_backend_fails(sol06):
    r = public(STEM, "compile_once", with_answer(
        sol06, compile_once=lambda fn, backend: torch.compile(fn, backend="eager", dynamic=True)), 1)
    assert r.status == "failed" and "Nothing was compiled with the backend you were given" in r.message, r.message


def _once_with_setting(module, name, value):
    def compile_once(fn, backend):  # BUG: a compiler setting instead of padding
        setattr(module, name, value)
        compiled = torch.compile(fn, backend=backend)

        def call(x):
            torch._dynamo.mark_dynamic(x, 0)
            return compiled(x)
        return call
    return compile_once


@pytest.mark.parametrize("module, name, value", [
    ("torch.fx.experimental._config", "backed_size_oblivious", True),  # size 1 no longer specialised
    ("torch._dynamo.config", "recompile_limit", 1),                    # recompiles fall back to eager
])
def test_a_compiler_setting_in_compile_once_is_named(sol06, module, name, value):
    import importlib

    mod = importlib.import_module(module)
    r = public(STEM, "compile_once", with_answer(sol06, compile_once=_once_with_setting(mod, name, value)), 1)
    assert r.status == "failed" and f"changed compiler settings: {module}.{name}" in r.message, r.message
    assert getattr(mod, name) == mod._config[name].default  # undone after the check


def test_a_bucket_sized_from_the_public_cases_fails_the_growing_batches(sol06):
    def compile_once(fn, backend):
        compiled = torch.compile(fn, backend=backend)

        def call(x):  # BUG: one bucket of 64 rows, a guess from the sizes seen so far
            return compiled(torch.cat([x, x.new_zeros(64 - x.shape[0], x.shape[1])]))[:x.shape[0]]
        return call
    r = grade(STEM, "compile_once", with_answer(sol06, compile_once=compile_once))
    assert r.cases[0].status == "passed" and failed_rules(r) == ["growing batches"], r.message


def test_calling_the_backends_graph_directly_is_named(sol06):
    def compile_once(fn, backend):
        graphs = []
        compiled = torch.compile(fn, backend=lambda gm, ex: graphs.append(backend(gm, ex)) or graphs[-1])

        def call(x):  # BUG: after the first call, bypasses Dynamo (and its guards)
            return compiled(x) if not graphs else graphs[0](x)[0]
        return call
    r = public(STEM, "compile_once", with_answer(sol06, compile_once=compile_once), 1)
    assert r.status == "failed" and "called directly, around Dynamo's guards" in r.message, r.message


# --- 4. the step without syncs ----------------------------------------------------------------------------------------

def test_the_step_with_syncs_fails_and_names_the_line(sol06):
    r = public(STEM, "sync_free_step", with_answer(sol06, train_step=train_step_with_syncs), 1)
    assert r.status == "failed" and "synchronises with the host" in r.message and "Tensor.__bool__" in r.message
    assert "if not torch.isfinite(loss)" in r.message


def _step(item_log=False, format_log=False, skip="where", nan_only=False):
    """The solution's step with one plausible bug."""
    def train_step(model, x, y, lr, max_norm, stats):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        finite = ~torch.isnan(loss) if nan_only else torch.isfinite(loss)  # BUG (nan_only): an inf loss steps
        model.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        with torch.no_grad():
            for p in model.parameters():
                if skip == "where":
                    p.copy_(torch.where(finite, p - lr * p.grad, p))
                elif skip == "mask":   # BUG: NaN * 0 is NaN
                    p -= lr * p.grad * finite
                else:                  # BUG: no skip at all
                    p -= lr * p.grad
            stats["loss"] += loss.detach() if skip == "count all" else torch.where(finite, loss.detach(), 0.0)
            stats["correct"] += torch.where(finite, (logits.argmax(-1) == y).sum(), 0)
            stats["clipped"] += (finite & (norm > max_norm)).long()
            stats["skipped"] += (~finite).long()
        if item_log:
            stats["last"] = loss.item()             # BUG: "just for logging"
        if format_log:
            print(f"loss {loss:.3f}")              # BUG: formatting a tensor reads it
    return train_step


def test_an_item_for_logging_is_a_sync(sol06):
    r = public(STEM, "sync_free_step", with_answer(sol06, train_step=_step(item_log=True)), 1)
    assert r.status == "failed" and "Tensor.item" in r.message and "loss.item()" in r.message, r.message


def test_printing_the_loss_is_a_sync(sol06):
    r = public(STEM, "sync_free_step", with_answer(sol06, train_step=_step(format_log=True)), 1)
    assert r.status == "failed" and "Tensor.__format__" in r.message, r.message


@pytest.mark.parametrize("skip", ["mask", "none"])
def test_updating_with_nan_gradients_is_caught(sol06, skip):
    step = _step(skip="count all" if skip == "none" else skip)
    r = public(STEM, "sync_free_step", with_answer(sol06, train_step=step), 2)
    assert r.status == "failed" and r.cases[0].status == "passed", r.message
    assert "non-finite batch" in r.message or "stats['loss']" in r.message, r.message


def _hidden(eid: str, rule: str, ns: dict, seeds=(1, 2, 3), **answer):
    """The results of ``answer`` (the solution ``ns`` with some entries replaced) on the hidden case of ``rule``
    of each seed."""
    ex = EX[eid]
    return [evaluate(ex, with_answer(ns, **answer), "cpu", [c for c in ex.cases(seed, public=False)
                                                             if c.name.startswith(rule + ":")]) for seed in seeds]


def test_a_step_that_skips_only_nan_losses_fails_on_every_seed(sol06):
    """A loss can be +inf without a NaN anywhere (a row of huge values: its label's log-probability overflows):
    ~torch.isnan(loss) steps on it; torch.isfinite does not."""
    for r in _hidden("sync_free_step", "a batch of huge values", sol06, train_step=_step(nan_only=True)):
        assert r.status == "failed" and ("stats['loss']" in r.message or "parameter" in r.message), r.message


def test_a_skipped_batch_counted_in_the_loss_is_caught(sol06):
    r = public(STEM, "sync_free_step", with_answer(sol06, train_step=_step(skip="count all")), 2)
    assert r.status == "failed" and "stats['loss']" in r.message and "skipped batch adds nothing" in r.message


# --- 5. capture once, replay ----------------------------------------------------------------------------------------

def _runner(recapture=False, rebind=False, eager=False, own_buffers=True):
    class GraphRunner:
        def __init__(self, fn, example_inputs, api):
            self.fn, self.api = fn, api
            self.static_in = [t.clone() for t in example_inputs] if own_buffers else list(example_inputs)
            self._capture()

        def _capture(self):
            self.graph = self.api.graph()
            with self.api.capture(self.graph):
                self.static_out = self.fn(*self.static_in)

        def __call__(self, *inputs):
            if eager:
                return self.fn(*inputs)
            if rebind:
                self.static_in = [x.clone() for x in inputs]   # BUG: new tensors; the graph reads the old ones
            else:
                for s, x in zip(self.static_in, inputs):
                    s.copy_(x)
            if recapture:
                self._capture()                                # BUG: a capture per call
            self.graph.replay()
            return self.static_out
    return GraphRunner


@pytest.mark.parametrize("bug, says", [
    (dict(recapture=True), "more capture(s)"),
    (dict(rebind=True), "the output of the example inputs"),
    (dict(eager=True), "outside the graph"),
    (dict(own_buffers=False), "the example inputs were modified"),
])
def test_a_wrong_graph_runner_is_named(sol06, bug, says):
    r = public(STEM, "graph_runner", with_answer(sol06, GraphRunner=_runner(**bug)), 1)
    assert r.status == "failed" and says in r.message, r.message


def test_a_correct_variant_of_the_runner_passes(sol06):
    assert public(STEM, "graph_runner", with_answer(sol06, GraphRunner=_runner())).status == "passed"


# --- 6. reading a trace ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mistake, says", [
    (dict(aggregate=False), "kernels not added up by name"),
    (dict(top_cats=("kernel", "cpu_op", "cuda_runtime"),
          busy_cats=CHECKS.DEVICE_CATS + ("cpu_op", "cuda_runtime")), "CPU-side events counted as device work"),
    (dict(busy_cats=("kernel",)), "copies ignored"),
    (dict(merge=False), "overlapping kernels (two streams) not merged"),
])
def test_a_wrong_trace_reading_is_named(sol06, mistake, says):
    wrong = lambda trace, k, min_gap_us: CHECKS.ref_trace_summary(trace, k, min_gap_us, **mistake)  # noqa: E731
    r = public(STEM, "trace_summary", with_answer(sol06, trace_summary=wrong))
    assert r.status == "failed" and says in r.message, r.message


@pytest.mark.parametrize("old, new, says", [
    # every case has a gap of exactly min_gap_us (times in eighths of a microsecond: the arithmetic is exact)
    ("if start - end >= min_gap_us:", "if start - end > min_gap_us:", "gaps strictly longer than min_gap_us"),
    # every trace ends with a copy that starts inside the last kernel and ends first
    ("busy / (end - first)", "busy / (spans[-1][1] - first)", "expected top"),
])
def test_a_gap_threshold_or_busy_window_off_at_the_edge_fails_on_every_seed(sol06, old, new, says):
    ns = dict(sol06)
    exec(compile(kit.solution_with(STEM, "trace_summary", old, new), "<trace mistake>", "exec"), ns)
    for seed in (1, 2, 3):
        ex = EX["trace_summary"]
        r = evaluate(ex, ns, "cpu", ex.cases(seed, public=False))
        assert r.score == 0 and all(says in c.message for c in r.cases), r.message


def test_a_reader_that_does_not_sort_fails(sol06):
    def trace_summary(trace, k, min_gap_us):  # BUG: takes the events in file order
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") in CHECKS.DEVICE_CATS]
        first, end, busy, gaps = spans[0][0], spans[0][0], 0.0, []
        for start, stop in spans:
            if start - end >= min_gap_us:
                gaps.append((end, start - end))
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        return dict(CHECKS.ref_trace_summary(trace, k, min_gap_us), gaps=gaps, busy=busy / (end - first))
    r = public(STEM, "trace_summary", with_answer(sol06, trace_summary=trace_summary))
    assert r.status == "failed" and r.cases[0].status == "passed" and r.cases[1].status == "failed", r.message


# --- 7. measuring a compiler win ------------------------------------------------------------------------------------

def _win(sync=True, mean=False, warm=True, same_input=True, compile_each_call=False, inverted=False,
         first_sync=True):
    """The solution's timer with one plausible bug."""
    def measure_compile_win(fn, compile_fn, x, clock, sync_fn, warmup=3, repeats=20):
        wait = sync_fn if sync else (lambda: None)
        get = (lambda: compile_fn(fn)) if compile_each_call else (lambda c=compile_fn(fn): c)
        start = clock()
        get()(x)
        if first_sync:  # BUG when not: the first call's device work is still queued
            wait()
        compile_s = clock() - start

        def per_call_ms(f):
            for _ in range(warmup if warm else 0):
                f(x)
            samples = []
            for _ in range(repeats):
                arg = x if same_input else torch.randn_like(x)
                wait()
                t0 = clock()
                f(arg)
                wait()
                samples.append((clock() - t0) * 1e3)
            return sum(samples) / len(samples) if mean else sorted(samples)[len(samples) // 2]

        eager, compiled = per_call_ms(fn), per_call_ms(lambda v: get()(v))
        return {"compile_s": compile_s, "eager_ms": eager, "compiled_ms": compiled,
                "speedup": compiled / eager if inverted else eager / compiled}
    return lambda fn, compile_fn, x, clock, sync, **kw: measure_compile_win(fn, compile_fn, x, clock, sync, **kw)


@pytest.mark.parametrize("bug, says", [
    (dict(sync=False), "the timer stopped before the device finished"),
    (dict(warm=False, mean=True), "warm"),
    (dict(same_input=False), "got another input than x"),
    (dict(compile_each_call=True), "compile_fn was called"),
    (dict(inverted=True), "expected eager_ms / compiled_ms"),
    (dict(mean=True), "the mean of the timed calls, and one of them was slowed"),
    (dict(first_sync=False), "the first call's device work (autotuning, the first run) was still queued"),
])
def test_a_dishonest_timer_is_named(sol06, bug, says):
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=_win(**bug)))
    assert r.status == "failed" and says in r.message, r.message
    ex = EX["compile_win"]  # every hidden case too, on every seed
    for seed in (1, 2, 3):
        assert evaluate(ex, with_answer(sol06, measure_compile_win=_win(**bug)), "cpu",
                        ex.cases(seed, public=False)).score == 0


def test_the_compile_counted_in_the_average_is_named(sol06):
    def measure_compile_win(fn, compile_fn, x, clock, sync, warmup=3, repeats=20):
        compiled = compile_fn(fn)
        out = {}
        for name, f in (("compiled", compiled), ("eager", fn)):
            sync()
            start = clock()
            for _ in range(repeats):            # BUG: the first compiled call (the compile) is in the average
                f(x)
            sync()
            out[name] = (clock() - start) * 1e3 / repeats
        return {"compile_s": out["compiled"] * repeats / 1e3, "eager_ms": out["eager"],
                "compiled_ms": out["compiled"], "speedup": out["eager"] / out["compiled"]}
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=measure_compile_win))
    assert r.status == "failed" and "includes the compile" in r.message, r.message


def test_a_timer_on_its_own_clock_or_without_warm_up_is_named(sol06):
    def perf_counter_timer(fn, compile_fn, x, clock, sync, **kw):  # BUG: the real clock, not the one given
        return sol06["measure_compile_win"](fn, compile_fn, x, clock=time.perf_counter, sync=sync, **kw)

    def no_warmup(fn, compile_fn, x, clock, sync, warmup=3, repeats=20):  # BUG: a median does not replace warm-up
        return sol06["measure_compile_win"](fn, compile_fn, x, clock=clock, sync=sync, warmup=0, repeats=repeats)
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=perf_counter_timer), 1)
    assert r.status == "failed" and "never read the clock it was given" in r.message, r.message
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=no_warmup), 1)
    assert r.status == "failed" and "includes the compile or the first calls" in r.message, r.message


def test_timings_computed_from_the_virtual_devices_settings_fail(sol06):
    """The check's device runs in the learner's process, its settings with it: numbers taken from them, not
    measured with the clock given, earn nothing."""
    def measure_compile_win(fn, compile_fn, x, clock, sync, warmup=3, repeats=20):
        p = fn.__self__.p  # the device's settings, through the bound method it handed over
        compile_fn(fn)
        clock()
        return {"compile_s": p["compile_s"] + p["first_work_s"], "eager_ms": p["eager_s"] * 1e3 + p["host_s"] * 1e3,
                "compiled_ms": p["compiled_s"] * 1e3 + p["host_s"] * 1e3,
                "speedup": (p["eager_s"] + p["host_s"]) / (p["compiled_s"] + p["host_s"])}
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=measure_compile_win))
    assert r.status == "failed" and "is not a time between two of your clock() readings" in r.message, r.message


def test_a_correct_variant_of_the_timer_passes(sol06):
    r = public(STEM, "compile_win", with_answer(sol06, measure_compile_win=_win()))
    assert r.status == "passed", r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set -------------------------------------

@pytest.mark.parametrize("eid", [pytest.param("graph_breaks", marks=pytest.mark.slow), "count_compiles",
                                 "compile_once", "sync_free_step", "graph_runner", "trace_summary", "compile_win"])
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(EX[eid])


@pytest.mark.parametrize("eid", list(EX))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(EX[eid])


# --- the GPU trace script runs on a CPU at tiny sizes ------------------------------------------------------------

def test_profile_trace_script_runs_tiny_on_cpu(tmp_path):
    import gzip
    import importlib.util
    import json

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("profile_trace", ROOT / "benchmarks" / "profile_trace.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    (summary,) = tmp_path.glob("profile_trace_cpu_*_tiny.json")
    data = json.loads(summary.read_text())
    assert data["tiny"] is True and set(data["step_ms"]) == {"eager", "graph"}
    assert data["phases"]["eager"]["cpu_ops"] > data["phases"]["graph"]["cpu_ops"]  # a replay runs no layer's op
    with gzip.open(next(tmp_path.glob("*.trace.json.gz")), "rt") as f:
        assert json.load(f)["traceEvents"]


def test_the_solution_earns_full_marks_and_the_untouched_lab_zero(sol06):
    """In process, as the grader scores: the generated lab's stubs are all "not attempted", worth 0; the solution
    earns every point (on the public cases here; the hidden ones are graded above)."""
    import nbformat

    from grader.notebooks import answer_cells, exec_source, export_source

    lab = nbformat.reads(json.dumps(kit.load("labs", STEM)), 4)
    ns = exec_source(export_source(lab, answer_cells(lab)), f"<labs/{STEM}.ipynb>")
    results = [evaluate(ex, ns, "cpu", ex.cases()[:1]) for ex in EX.values()]
    assert [r.status for r in results] == ["not_attempted"] * len(EX) and sum(r.score for r in results) == 0
    full = [public(STEM, eid, sol06) for eid in EX]
    assert sum(r.score for r in full) == sum(ex.points for ex in EX.values()) == 18
