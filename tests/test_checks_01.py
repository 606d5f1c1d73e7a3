"""Lab 01's checks: the solution passes, and the wrong answers learners write are rejected."""
import statistics
import time

import pytest

from gpulab.device import synchronize
from tests import graderkit as kit
from tests.conftest import grade, with_answer

STEM = "01_performance_model"


@pytest.mark.parametrize("eid", ["costs", "roofline", "benchmark", "scaling"])
def test_solution_passes_public_and_hidden_cases(sol01, eid):
    result = grade(STEM, eid, sol01)
    assert result.status == "passed", result.message
    assert result.score == result.points


def _costs_wrong(sol01, **fns):
    return grade(STEM, "costs", with_answer(sol01, **fns))


def test_matmul_flops_without_the_factor_two_fails(sol01):
    r = _costs_wrong(sol01, matmul_cost=lambda M, N, K, b: (M * N * K, (M * K + K * N + M * N) * b))
    assert r.status == "failed" and "matmul_cost: flops" in r.message


def test_matmul_bytes_forgetting_the_output_fails(sol01):
    r = _costs_wrong(sol01, matmul_cost=lambda M, N, K, b: (2 * M * N * K, (M * K + K * N) * b))
    assert r.status == "failed" and "matmul_cost: bytes" in r.message


def test_causal_attention_as_half_the_pairs_fails(sol01):
    def approx(B, H, Sq, Sk, D, b, causal=False):
        pairs = Sq * Sk / 2 if causal else Sq * Sk
        return 4 * B * H * pairs * D, B * H * (2 * Sq + 2 * Sk) * D * b
    r = _costs_wrong(sol01, attention_cost=approx)
    assert r.status == "failed" and "attention_cost: flops" in r.message


def test_costs_returning_one_number_fails_with_a_clear_message(sol01):
    r = _costs_wrong(sol01, softmax_cost=lambda rows, cols, b: 5 * rows * cols)
    assert r.status == "failed" and "must return a pair" in r.message


def test_roofline_time_as_a_sum_fails(sol01):
    r = grade(STEM, "roofline", with_answer(sol01, roofline_time=lambda f, b, pf, pb: f / pf + b / pb))
    assert r.status == "failed" and "overlap" in r.message


def test_bound_inverted_fails(sol01):
    r = grade(STEM, "roofline", with_answer(
        sol01, bound=lambda f, b, pf, pb: "compute" if b / pb > f / pf else "memory"))
    assert r.status == "failed" and "bound" in r.message


def _timer(sync_after: bool, warmup_used: bool, sync_before: bool = True):
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):
        for _ in range(warmup if warmup_used else 0):
            fn(*args)
        samples = []
        for _ in range(repeats):
            if sync_before:
                synchronize(device)
            start = time.perf_counter()
            fn(*args)
            if sync_after:
                synchronize(device)
            samples.append((time.perf_counter() - start) * 1e3)
        samples.sort()
        return {"median_ms": statistics.median(samples), "p95_ms": samples[int(0.95 * (len(samples) - 1))],
                "p99_ms": samples[-1]}
    return benchmark


def test_timer_without_synchronisation_fails(sol01):
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer(sync_after=False, warmup_used=True)))
    assert r.status == "failed" and "synchronize" in r.message


def test_timer_without_warmup_fails(sol01):
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer(sync_after=True, warmup_used=False)))
    assert r.status == "failed" and "warmup" in r.message


def test_timer_syncing_only_before_the_call_fails(sol01):
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer(sync_after=False, warmup_used=True,
                                                                      sync_before=True)))
    assert r.status == "failed"


def test_timer_returning_the_mean_with_the_cold_calls_fails(sol01):
    def mean_timer(fn, *args, device=None, warmup=3, repeats=20):
        start = time.perf_counter()
        for _ in range(warmup + repeats):
            fn(*args)
        synchronize(device)
        mean = (time.perf_counter() - start) * 1e3 / (warmup + repeats)
        return {"median_ms": mean, "p95_ms": mean, "p99_ms": mean}
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=mean_timer))
    assert r.status == "failed"


def test_amdahl_with_p_and_serial_part_swapped_fails(sol01):
    r = grade(STEM, "scaling", with_answer(sol01, amdahl_speedup=lambda p, n: 1 / (p + (1 - p) / n)))
    assert r.status == "failed" and "amdahl_speedup" in r.message


def test_strong_scaling_without_dividing_by_n_fails(sol01):
    r = grade(STEM, "scaling", with_answer(sol01, strong_scaling_efficiency=lambda t1, tn, n: t1 / tn))
    assert r.status == "failed" and "strong_scaling_efficiency" in r.message


# --- hidden cases hold every rule, on every seed ---------------------------------------------------

def _cost_rules(case) -> set:
    x = case.inputs
    shape = "sk<sq" if x["seq_k"] < x["seq_q"] else "sk>sq" if x["seq_k"] > x["seq_q"] else "sk=sq"
    return {f"{'causal' if x['causal'] else 'full'} {shape}", f"{x['dtype_bytes']} bytes"}


def _roofline_rules(case) -> set:
    x = case.inputs
    return {"memory-bound" if x["bytes"] / x["peak_bw"] > x["flops"] / x["peak_flops"] else "compute-bound"}


def _benchmark_rules(case) -> set:
    x = case.inputs
    tiers = sorted(set(x["durations_ms"]))
    return {f"{x['cold_calls']} cold calls", f"{len(x['durations_ms'])} calls in {len(tiers)} tiers"}


RULES = {"costs": _cost_rules, "roofline": _roofline_rules, "benchmark": _benchmark_rules}


@pytest.mark.parametrize("eid", sorted(RULES))
def test_every_seed_hides_cases_of_every_rule(eid):
    from grader.checks import exercises
    ex = exercises(STEM)[eid]
    seen = []
    for seed in (1, 2, 3, 20261122, 987654321):
        seen.append(set().union(*(RULES[eid](c) for c in ex.cases(seed=seed, public=False))))
    assert all(s == seen[0] for s in seen), seen
    expected = {"costs": {f"{c} {s}" for c in ("causal", "full") for s in ("sk<sq", "sk>sq", "sk=sq")}
                | {"1 bytes", "2 bytes", "4 bytes"},
                "roofline": {"memory-bound", "compute-bound"},
                "benchmark": {"3 cold calls", "1 cold calls", "200 calls in 4 tiers"}}[eid]
    assert seen[0] == expected


def _hidden_only(eid, ns, seed):
    from grader.checks import exercises
    from grader.exercise import evaluate
    ex = exercises(STEM)[eid]
    return evaluate(ex, ns, "cpu", ex.cases(seed=seed, public=False))


# --- attention with fewer keys than queries ----------------------------------------------------------

def test_causal_attention_ignoring_seq_k_fails(sol01):
    def self_attention_pairs(B, H, Sq, Sk, D, b, causal=False):
        pairs = Sq * (Sq + 1) // 2 if causal else Sq * Sk  # BUG: seq_q where seq_k belongs (right only if Sk >= Sq)
        return 4 * B * H * pairs * D, B * H * (2 * Sq + 2 * Sk) * D * b
    r = _costs_wrong(sol01, attention_cost=self_attention_pairs)
    assert r.status == "failed" and "min(i + 1, seq_k)" in r.message
    for seed in (1, 2, 3):  # every seed's hidden cases catch it too
        assert _hidden_only("costs", with_answer(sol01, attention_cost=self_attention_pairs), seed).status == "failed"


# --- percentiles consistent with the per-call samples ---------------------------------------------

def _timed_samples(fn, args, device, warmup, repeats):
    for _ in range(warmup):
        fn(*args)
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn(*args)
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def _timer_reporting(summary):
    """A timer that warms up and synchronises right, then summarises its samples with ``summary``."""
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):
        return summary(_timed_samples(fn, args, device, warmup, repeats))
    return benchmark


def _pct(samples, q):
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def test_p95_as_mean_plus_two_std_fails(sol01):
    def summary(s):
        mean, std = statistics.fmean(s), statistics.pstdev(s)
        return {"median_ms": statistics.median(s), "p95_ms": mean + 2 * std, "p99_ms": _pct(s, 99)}
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer_reporting(summary)))
    assert r.status == "failed" and r.score == 0 and "p95_ms" in r.message and "mean + z * std" in r.message


def test_p99_as_the_max_fails(sol01):
    def summary(s):
        return {"median_ms": statistics.median(s), "p95_ms": _pct(s, 95), "p99_ms": max(s)}
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer_reporting(summary)))
    assert r.status == "failed" and r.score == 0 and "p99_ms" in r.message and "the max" in r.message


def test_percentiles_of_the_whole_loop_divided_by_n_fail(sol01):
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):
        for _ in range(warmup):
            fn(*args)
        synchronize(device)
        per_call = []
        for _ in range(3):  # three timed loops; each "sample" is a loop's time / repeats
            start = time.perf_counter()
            for _ in range(repeats):
                fn(*args)
            synchronize(device)
            per_call.append((time.perf_counter() - start) * 1e3 / repeats)
        return {"median_ms": statistics.median(per_call), "p95_ms": _pct(per_call, 95), "p99_ms": _pct(per_call, 99)}
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=benchmark))
    assert r.status == "failed" and r.score == 0 and "median_ms" in r.message and "the mean" in r.message


def test_percentiles_of_unsorted_samples_fail(sol01):
    def summary(s):
        return {"median_ms": statistics.median(s), "p95_ms": s[int(0.95 * len(s))], "p99_ms": s[int(0.99 * len(s))]}
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=_timer_reporting(summary)))
    assert r.status == "failed" and r.score == 0


@pytest.mark.parametrize("method", ["nearest rank", "statistics.quantiles", "numpy", "perf_counter_ns imported"])
def test_other_correct_timers_pass(sol01, method):
    """Any usual percentile definition is accepted, and so is a clock imported by name."""
    import math

    import numpy as np
    source = '''
from time import perf_counter_ns
def benchmark(fn, *args, device=None, warmup=3, repeats=20):
    for _ in range(warmup):
        fn(*args)
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = perf_counter_ns()
        fn(*args)
        synchronize(device)
        samples.append((perf_counter_ns() - start) / 1e6)
    s = sorted(samples)
    return {"median_ms": s[len(s) // 2], "p95_ms": s[int(0.95 * len(s))], "p99_ms": s[int(0.99 * len(s))]}
'''
    summaries = {
        "nearest rank": lambda s: {k: sorted(s)[math.ceil(q / 100 * len(s)) - 1]
                                   for k, q in (("median_ms", 50), ("p95_ms", 95), ("p99_ms", 99))},
        "statistics.quantiles": lambda s: dict(zip(("median_ms", "p95_ms", "p99_ms"),
                                                   [statistics.quantiles(s, n=100)[q - 1] for q in (50, 95, 99)])),
        "numpy": lambda s: dict(zip(("median_ms", "p95_ms", "p99_ms"), np.percentile(s, [50, 95, 99]).tolist())),
    }
    if method in summaries:
        ns = with_answer(sol01, benchmark=_timer_reporting(summaries[method]))
    else:
        ns = with_answer(sol01)
        exec(source, ns)
    r = grade(STEM, "benchmark", ns)
    assert r.status == "passed", r.message


def test_the_simulated_clock_is_restored_after_the_check():
    from gpulab.simulated import SimulatedClock
    ns = {"perf_counter": time.perf_counter}
    real = time.perf_counter
    with SimulatedClock(start_s=5.0).installed(ns):
        assert ns["perf_counter"]() == pytest.approx(5.0, abs=1e-5) and time.perf_counter() < 5.1
    assert time.perf_counter is real and ns["perf_counter"] is real


def test_a_timer_that_reads_the_schedule_instead_of_measuring_earns_nothing():
    """Found by red-teaming: the simulated kernel once exposed its durations and a writable call count."""
    from grader.checks import exercises
    from grader.exercise import evaluate

    cheat = ("from gpulab.bench import percentile\n"
             "def benchmark(fn, *args, device=None, warmup=3, repeats=100):\n"
             "    fn.calls = warmup + repeats\n"
             "    d = fn.durations_ms\n"
             "    return {'median_ms': percentile(d, 50), 'p95_ms': percentile(d, 95), 'p99_ms': percentile(d, 99)}\n")
    ns: dict = {}
    exec(cheat, ns)
    ex = exercises("01_performance_model")["benchmark"]
    assert evaluate(ex, ns, "cpu", ex.cases(seed=3, public=False)).score == 0


# --- the contract: do-nothing answers earn nothing; every hidden set holds the same rules ----------------

def _ex(eid):
    from grader.checks import exercises
    return exercises(STEM)[eid]


@pytest.mark.parametrize("eid", ["costs", "roofline", "benchmark", "scaling"])
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(_ex(eid))


@pytest.mark.parametrize("eid", ["costs", "roofline", "benchmark", "scaling"])
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(_ex(eid))


# --- an answer that reads its case learns nothing of the verdict -----------------------------------------

def test_no_roofline_case_names_its_bound():
    for seed in (None, 1, 2, 3):
        cases = _ex("roofline").cases() if seed is None else _ex("roofline").cases(seed, public=False)
        assert not any(word in c.name.lower() for c in cases for word in ("memory", "compute", "bound")), \
            [c.name for c in cases]


def test_bound_read_from_the_case_earns_nothing(sol01):
    def bound(flops, nbytes, peak_flops, peak_bw):  # CHEAT: the verdict from the case's name or inputs
        case = kit.read_the_case()
        text = f"{case.name} {sorted(case.inputs)}"
        return "memory" if "memory" in text else "compute" if "compute" in text else "unknown"
    ns = with_answer(sol01, bound=bound)
    for seed in (1, 2, 3):
        assert _hidden_only("roofline", ns, seed).score == 0


def _schedule_percentiles(case):
    from gpulab.bench import percentile
    d = case.inputs["durations_ms"]
    return {"median_ms": percentile(d, 50), "p95_ms": percentile(d, 95), "p99_ms": percentile(d, 99)}


def test_a_timer_that_reads_the_schedule_from_the_case_earns_nothing(sol01):
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):  # CHEAT: calls fn, times nothing
        for _ in range(warmup + repeats):
            fn(*args)
        synchronize(device)
        return _schedule_percentiles(kit.read_the_case())
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=benchmark))
    assert r.score == 0 and "read the clock" in r.message and "too few" in r.message, r.message


def test_a_timer_that_reads_the_clock_without_syncing_and_reports_the_schedule_earns_nothing(sol01):
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):  # CHEAT: clock reads for show
        for _ in range(warmup + repeats):
            time.perf_counter()
            fn(*args)
            time.perf_counter()
        return _schedule_percentiles(kit.read_the_case())
    r = grade(STEM, "benchmark", with_answer(sol01, benchmark=benchmark))
    assert r.score == 0 and "still queued" in r.message, r.message


# --- more wrong answers, each failing on every seed ------------------------------------------------------

def test_timer_without_a_sync_after_the_warmup_fails_on_every_seed(sol01):
    def benchmark(fn, *args, device=None, warmup=3, repeats=20):
        for _ in range(warmup):
            fn(*args)  # BUG: no synchronize here: the first sample starts while the warm-up still runs
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*args)
            synchronize(device)
            samples.append((time.perf_counter() - start) * 1e3)
        return {"median_ms": _pct(samples, 50), "p95_ms": _pct(samples, 95), "p99_ms": _pct(samples, 99)}
    ns = with_answer(sol01, benchmark=benchmark)
    kit.assert_fails_every_seed(_ex("benchmark"), ns, "still queued on the device (after ")
    assert grade(STEM, "benchmark", ns).score == 0


def test_gpulab_s_own_timer_earns_nothing_even_behind_a_wrapper(sol01):
    from gpulab import bench
    from gpulab.bench import benchmark as imported_by_name

    for answer in (bench.benchmark, lambda fn, *a, **k: imported_by_name(fn, *a, **k)):
        r = grade(STEM, "benchmark", with_answer(sol01, benchmark=answer))
        assert r.score == 0 and "gpulab.bench.benchmark" in r.message, r.message


@pytest.mark.parametrize("rank", [lambda s, q: s[q], lambda s, q: sorted(s, reverse=True)[int(q / 100 * len(s))],
                                  lambda s, q: s[len(s) - q]], ids=["index q", "descending", "n - q"])
def test_percentiles_at_a_wrong_rank_fail_on_every_seed(sol01, rank):
    def summary(s):
        s = sorted(s)
        return {"median_ms": statistics.median(s), "p95_ms": rank(s, 95), "p99_ms": rank(s, 99)}
    kit.assert_fails_every_seed(_ex("benchmark"), with_answer(sol01, benchmark=_timer_reporting(summary)),
                                "95th percentile of the 200 per-call times")


@pytest.mark.parametrize("name, answer, text", [
    ("amdahl p and n swapped", dict(amdahl_speedup=lambda p, n: 1 / ((1 - n) + n / p)), "amdahl_speedup"),
    ("amdahl arguments in the wrong order", dict(amdahl_speedup=lambda n, p: 1 / ((1 - p) + p / n)), "amdahl_speedup"),
    ("amdahl without the serial part", dict(amdahl_speedup=lambda p, n: n * p), "amdahl_speedup"),
    ("strong efficiency inverted", dict(strong_scaling_efficiency=lambda t1, tn, n: n * tn / t1),
     "strong_scaling_efficiency"),
    ("weak efficiency inverted", dict(weak_scaling_efficiency=lambda t1, tn: tn / t1), "weak_scaling_efficiency"),
])
def test_wrong_scaling_laws_fail_on_every_seed(sol01, name, answer, text):
    kit.assert_fails_every_seed(_ex("scaling"), with_answer(sol01, **answer), text)


@pytest.mark.parametrize("name, answer, text", [
    ("intensity as bytes per flop", dict(arithmetic_intensity=lambda f, b: b / f), "arithmetic_intensity"),
    ("time as the smaller of the two", dict(roofline_time=lambda f, b, pf, pb: min(f / pf, b / pb)), "overlap"),
    ("ridge as bandwidth over compute", dict(bound=lambda f, b, pf, pb: "memory" if f / b < pb / pf else "compute"),
     "ridge point"),
    ("bound with a suffix", dict(bound=lambda f, b, pf, pb: ("memory" if b / pb > f / pf else "compute") + "-bound"),
     "expected"),
])
def test_wrong_rooflines_fail_on_every_seed(sol01, name, answer, text):
    kit.assert_fails_every_seed(_ex("roofline"), with_answer(sol01, **answer), text)


def _attention(B, H, Sq, Sk, D, b, causal=False, strict=False, bytes_without_output=False):
    pairs = sum(min(i + (0 if strict else 1), Sk) for i in range(Sq)) if causal else Sq * Sk
    return 4 * B * H * pairs * D, B * H * ((Sq if bytes_without_output else 2 * Sq) + 2 * Sk) * D * b


@pytest.mark.parametrize("name, answer, text", [
    ("a strict causal mask", dict(attention_cost=lambda *a, **k: _attention(*a, **k, strict=True)),
     "attention_cost: flops"),
    ("attention bytes without the output", dict(attention_cost=lambda *a, **k: _attention(
        *a, **k, bytes_without_output=True)), "attention_cost: bytes"),
    ("softmax read twice", dict(softmax_cost=lambda r, c, b: (5 * r * c, 3 * r * c * b)), "softmax_cost: bytes"),
    ("elementwise flops ignoring flops_per_element", dict(
        elementwise_cost=lambda n, b, n_inputs=1, flops_per_element=1: (n, n * (n_inputs + 1) * b)),
     "elementwise_cost: flops"),
])
def test_wrong_costs_fail_on_every_seed(sol01, name, answer, text):
    kit.assert_fails_every_seed(_ex("costs"), with_answer(sol01, **answer), text)


def _synced_once_after_the_loop(fn, *args, device=None, warmup=3, repeats=20):
    for _ in range(warmup):
        fn(*args)
    synchronize(device)
    samples = []
    for _ in range(repeats):  # BUG: the clock is read per call, the device synchronised once at the end
        start = time.perf_counter()
        fn(*args)
        samples.append((time.perf_counter() - start) * 1e3)
    synchronize(device)
    return {"median_ms": _pct(samples, 50), "p95_ms": _pct(samples, 95), "p99_ms": _pct(samples, 99)}


@pytest.mark.parametrize("timer, text", [
    (_timer(sync_after=False, warmup_used=True, sync_before=False), "synchronize"),
    (_timer(sync_after=True, warmup_used=False), "warmup"),
    (_timer(sync_after=False, warmup_used=True, sync_before=True), "synchronize"),
    (_synced_once_after_the_loop, "synchronize"),
], ids=["never synchronised", "no warm-up", "synchronised before the call only", "synchronised once, at the end"])
def test_timer_mistakes_fail_on_every_seed(sol01, timer, text):
    kit.assert_fails_every_seed(_ex("benchmark"), with_answer(sol01, benchmark=timer), text)
