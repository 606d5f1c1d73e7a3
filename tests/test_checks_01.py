"""Lab 01's checks: the solution passes, and the wrong answers learners write are rejected."""
import statistics
import time

import pytest

from gpulab.device import synchronize
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
