"""Lab 10's checks: the solution passes; plausible wrong answers are rejected for every C: point of
the curriculum (gradients identical to the plain block, saved bytes drop by the expected factor,
FLOP counts show the recomputation, dropout masks reproduced) and for the ZeRO/offload formulas."""
import importlib
import json
import subprocess
import sys

import pytest
import torch

from gpulab.models import RECOMPUTE_CANDIDATES, make_block
from grader.checks import exercises
from tests import graderkit as kit
from tests.conftest import ROOT, grade, solution_namespace, with_answer

STEM = "10_memory_checkpointing"
checks = importlib.import_module(f"grader.checks.{STEM}")


@pytest.fixture(scope="module")
def sol10():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["saved_bytes", "activation_formula", "checkpoint_function", "selective_checkpoint",
                                 "recompute_plan", "zero_memory", "offload_model"])
def test_solution_passes_public_and_hidden_cases(sol10, eid):
    result = grade(STEM, eid, sol10)
    assert result.status == "passed", result.message


# --- the references agree with measurement ------------------------------------------------------------

@pytest.mark.parametrize("cfg", [(2, 16, 32, 2, 128, 0.1, torch.float32), (1, 9, 24, 3, 50, 0.0, torch.float32),
                                 (3, 8, 48, 4, 100, 0.3, torch.bfloat16), (2, 5, 16, 1, 64, 0.5, torch.float64)])
def test_reference_formula_matches_saved_tensors_hooks_for_every_recompute_choice(sol10, cfg):
    b, s, h, a, f, p, dtype = cfg
    block = make_block(h, a, f, p, dtype=dtype)
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    e = x.element_size()
    assert checks.ref_saved_bytes(block, x, exclude=list(block.parameters())) == \
        checks.ref_block_activation_bytes(b, s, h, a, f, p, e)
    for cand in RECOMPUTE_CANDIDATES:
        measured = checks.ref_saved_bytes(lambda x: sol10["selective_forward"](block, x, cand), x,
                                          exclude=list(block.parameters()))
        assert measured == checks.ref_recompute_cost(b, s, h, a, f, p, e, cand)[0], cand


# --- 1. the saved-tensor meter ----------------------------------------------------------------------------

def _meter(dedupe: bool, honour_exclude: bool):
    def saved_tensor_bytes(fn, *args, exclude=()):
        skip = {t.untyped_storage().data_ptr() for t in exclude} if honour_exclude else set()
        seen, total = {}, [0]

        def pack(t):
            if t.untyped_storage().data_ptr() not in skip:
                total[0] += t.nbytes
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*args)
        return sum(seen.values()) if dedupe else total[0]
    return saved_tensor_bytes


def test_meter_counting_every_saved_tensor_fails(sol10):
    r = grade(STEM, "saved_bytes", with_answer(sol10, saved_tensor_bytes=_meter(dedupe=False, honour_exclude=True)),
              hidden=False)
    assert r.status == "failed" and "storage* once" in r.message


def test_meter_counting_parameters_fails(sol10):
    r = grade(STEM, "saved_bytes", with_answer(sol10, saved_tensor_bytes=_meter(dedupe=True, honour_exclude=False)),
              hidden=False)
    assert r.status == "failed" and "exclude" in r.message


# --- 2. the activation formula ------------------------------------------------------------------------------

def _formula(stats=True, mask_bytes=1, dedupe_p=True):
    def block_activation_bytes(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, stats_bytes=None):
        e, st = dtype_bytes, dtype_bytes if stats_bytes is None else stats_bytes
        t, h, f, P = batch * seq, d_model, d_ff, batch * n_heads * seq * seq
        total = t * (8 * h + 2 * f) * e + P * e + (4 * t * st if stats else 0)
        if dropout > 0:
            total += P * (mask_bytes + e) + 2 * t * h * mask_bytes
        elif not dedupe_p:
            total += P * e
        return total
    return block_activation_bytes


def test_korthikanti_formula_taken_literally_fails(sol10):
    korthikanti = lambda b, s, h, a, f, p, e, stats_bytes=None: 34 * s * b * h + 5 * a * s * s * b  # noqa: E731
    r = grade(STEM, "activation_formula", with_answer(sol10, block_activation_bytes=korthikanti), hidden=False)
    assert r.status == "failed" and "Korthikanti" in r.message


def test_statistics_defaulting_to_4_bytes_fail_for_2_byte_activations(sol10):
    real = sol10["block_activation_bytes"]

    def block_activation_bytes(b, s, h, a, f, p, e, stats_bytes=None):
        return real(b, s, h, a, f, p, e, 4 if stats_bytes is None else stats_bytes)  # BUG: float32 statistics
    r = grade(STEM, "activation_formula", with_answer(sol10, block_activation_bytes=block_activation_bytes))
    failed = [c for c in r.cases if c.status != "passed"]
    assert failed and all("left out" in c.name and "float32" not in c.name for c in failed), [c.name for c in failed]
    assert any(c.name.startswith("bfloat16") for c in failed) and any(c.name.startswith("float64") for c in failed)
    assert "stats_bytes=None means" in failed[0].message and "dtype_bytes each" in failed[0].message


@pytest.mark.parametrize("wrong, phrase", [(dict(stats=False), "mean and rstd"),
                                           (dict(mask_bytes=4), "1 byte per element"),
                                           (dict(dedupe_p=False), "counted once")])
def test_formula_mistakes_are_named(sol10, wrong, phrase):
    r = grade(STEM, "activation_formula", with_answer(sol10, block_activation_bytes=_formula(**wrong)), hidden=False)
    assert r.status == "failed" and phrase in r.message, r.message


# --- 3. checkpointing: the four C: points ---------------------------------------------------------------------

def _checkpoint(rng="restore", recompute_times=1, keep_graph=False, input_grads=True, param_grads=True):
    """A checkpoint with one deliberate bug, selected by the arguments."""

    class Ckpt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fn, *args):
            ctx.fn = fn
            ctx.rng = torch.get_rng_state()
            ctx.save_for_backward(*args)
            if keep_graph:  # BUG: "no need to recompute": keeps every activation alive
                ctx.inputs = [a.detach().requires_grad_() for a in args]
                with torch.enable_grad():
                    ctx.out = fn(*ctx.inputs)
                return ctx.out.detach()
            out = fn(*args)
            if rng == "after":  # BUG: the state after fn ran: the recompute draws different masks
                ctx.rng = torch.get_rng_state()
            return out

        @staticmethod
        def backward(ctx, *grads):
            if keep_graph:
                torch.autograd.backward(ctx.out, grads)
                return (None, *[a.grad for a in ctx.inputs])
            inputs = [a.detach().requires_grad_() for a in ctx.saved_tensors]
            if rng == "no_fork":  # BUG: the masks are right, but the caller's stream is reset to ctx.rng
                torch.set_rng_state(ctx.rng)
            with torch.random.fork_rng():
                for _ in range(recompute_times - 1):  # BUG: an extra "sanity" recompute of the output
                    torch.set_rng_state(ctx.rng)
                    with torch.no_grad():
                        ctx.fn(*inputs)
                if rng in ("restore", "after"):
                    torch.set_rng_state(ctx.rng)
                with torch.enable_grad():
                    out = ctx.fn(*inputs)
            if param_grads:
                torch.autograd.backward(out, grads)
                got = [a.grad for a in inputs]
            else:  # BUG: only the inputs' gradients, the parameters get nothing
                got = list(torch.autograd.grad(out, inputs, grads))
            return (None, *(got if input_grads else [None] * len(inputs)))

    return lambda fn, *args: Ckpt.apply(fn, *args)


def test_a_correct_variant_of_the_test_checkpoint_passes(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint()))
    assert r.status == "passed", r.message


def test_recompute_without_restoring_the_rng_gets_other_dropout_masks(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(rng="none")), hidden=False)
    assert r.status == "failed" and "gradients differ" in r.message and "RNG state" in r.message
    assert 0 < r.score < r.points  # the case without dropout still passes


def test_rng_state_restored_outside_fork_rng_moves_the_callers_stream(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(rng="no_fork")))
    assert r.status == "failed" and r.score == 0, r.message
    assert "caller's random number generator" in r.message and "fork_rng" in r.message


def test_rng_state_saved_at_the_wrong_time_is_caught(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(rng="after")), hidden=False)
    assert r.status == "failed" and "gradients differ" in r.message and "dropout" in r.message


def test_checkpoint_that_keeps_the_activations_fails_the_saved_bytes_check(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(keep_graph=True)), hidden=False)
    assert r.status == "failed" and r.score == 0 and "kept" in r.message and "torch.no_grad()" in r.message


def test_recomputing_twice_shows_in_the_flop_count(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(recompute_times=2)), hidden=False)
    assert r.status == "failed" and "2.00 forward passes extra" in r.message


def test_torch_non_reentrant_checkpoint_is_told_it_stops_early(sol10):
    import torch.utils.checkpoint as tcp
    r = grade(STEM, "checkpoint_function", with_answer(
        sol10, checkpoint=lambda fn, *args: tcp.checkpoint(fn, *args, use_reentrant=False)), hidden=False)
    assert r.status == "failed" and "stops recomputing" in r.message


def test_missing_input_gradients_are_caught(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(input_grads=False)), hidden=False)
    assert r.status == "failed" and "input gradient" in r.message


def test_missing_parameter_gradients_are_caught(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=_checkpoint(param_grads=False)), hidden=False)
    assert r.status == "failed" and "parameter gradient" in r.message


def test_no_checkpoint_at_all_fails(sol10):
    r = grade(STEM, "checkpoint_function", with_answer(sol10, checkpoint=lambda fn, *args: fn(*args)), hidden=False)
    assert r.status == "failed" and r.score == 0 and "kept" in r.message


# --- 4. selective checkpointing ---------------------------------------------------------------------------------

def test_checkpointing_the_whole_attention_for_attn_core_fails(sol10):
    real = sol10["selective_forward"]

    def selective_forward(block, x, recompute=frozenset()):
        recompute = set(recompute)
        if "attn_core" in recompute:  # BUG: recomputes the projections and LN1 as well
            recompute = (recompute - {"attn_core"}) | {"attn"}
        return real(block, x, frozenset(recompute))
    r = grade(STEM, "selective_checkpoint", with_answer(sol10, selective_forward=selective_forward), hidden=False)
    assert r.status == "failed" and "attn_core" in r.message and "bytes saved" in r.message


def test_ignoring_the_recompute_choice_fails(sol10):
    ignore = lambda block, x, recompute=(): block(x)  # noqa: E731
    r = grade(STEM, "selective_checkpoint", with_answer(sol10, selective_forward=ignore))
    assert r.status == "failed" and "bytes saved" in r.message
    assert r.score == 0  # recompute={} passes, but block(x) itself earns nothing there


# --- 5. the recompute planner -----------------------------------------------------------------------------------

def test_cost_that_drops_the_checkpoint_inputs_fails(sol10):
    real = sol10["recompute_cost"]

    def recompute_cost(b, s, h, a, f, p, e, recompute, stats_bytes=None):
        saved, flops = real(b, s, h, a, f, p, e, recompute, stats_bytes)
        if "attn_core" in recompute and "block" not in recompute and "attn" not in recompute:
            saved -= 3 * b * s * h * e  # BUG: forgets that q, k, v stay saved as the checkpoint's inputs
        return saved, flops
    r = grade(STEM, "recompute_plan", with_answer(sol10, recompute_cost=recompute_cost), hidden=False)
    assert r.status == "failed" and "inputs stay" in r.message


def test_plan_minimising_bytes_instead_of_flops_fails(sol10):
    cost = sol10["recompute_cost"]

    def plan_recompute(b, s, h, a, f, p, e, budget, stats_bytes=None):
        fits = [c for c in RECOMPUTE_CANDIDATES if cost(b, s, h, a, f, p, e, c, stats_bytes)[0] <= budget]
        return frozenset(min(fits, key=lambda c: cost(b, s, h, a, f, p, e, c, stats_bytes)[0])) if fits else None
    r = grade(STEM, "recompute_plan", with_answer(sol10, plan_recompute=plan_recompute), hidden=False)
    assert r.status == "failed" and "fewest extra FLOPs" in r.message


# --- 6. ZeRO and FSDP --------------------------------------------------------------------------------------------

def test_stage2_keeping_full_gradients_fails(sol10):
    real = sol10["zero_memory"]

    def zero_memory(n, N, stage, *args, **kwargs):
        return real(n, N, 1 if stage == 2 else stage, *args, **kwargs)  # BUG: stage 2 = stage 1
    r = grade(STEM, "zero_memory", with_answer(sol10, zero_memory=zero_memory), hidden=False)
    assert r.status == "failed" and "grads" in r.message and "stage 2" in r.message


def test_forgetting_the_fp32_master_weights_fails(sol10):
    def zero_memory(n, N, stage, param_dtype=torch.bfloat16, grad_dtype=torch.bfloat16, optimizer="adam",
                    master_weights=True):
        p = torch.empty((), dtype=param_dtype).element_size()
        g = torch.empty((), dtype=grad_dtype).element_size()
        k = 4 * {"adam": 2, "adamw": 2, "momentum": 1, "sgd": 0}[optimizer]  # BUG: no master copy
        params = p * n / (N if stage >= 3 else 1)
        grads = g * n / (N if stage >= 2 else 1)
        opt = k * n / (N if stage >= 1 else 1)
        return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}
    r = grade(STEM, "zero_memory", with_answer(sol10, zero_memory=zero_memory), hidden=False)
    assert r.status == "failed" and "optimizer" in r.message and "master copy" in r.message


def test_fsdp_without_the_gathered_unit_fails(sol10):
    real = sol10["zero_memory"]

    def fsdp_memory(n, N, unit, *args, **kwargs):
        return dict(real(n, N, 3, *args, **kwargs), gathered=0.0)
    r = grade(STEM, "zero_memory", with_answer(sol10, fsdp_memory=fsdp_memory), hidden=False)
    assert r.status == "failed" and "gathered" in r.message


# --- 7. offload ---------------------------------------------------------------------------------------------------

def test_offload_counting_only_the_gradients_fails(sol10):
    r = grade(STEM, "offload_model", with_answer(
        sol10, offload_bytes=lambda n, N, what, param_dtype=torch.bfloat16, grad_dtype=torch.bfloat16: 2 * n / N),
        hidden=False)
    assert r.status == "failed" and "offload_bytes" in r.message


def test_offload_time_adding_overlapped_transfers_fails(sol10):
    def offload_step_time(compute_s, nbytes, pcie_gbps, overlap=True):
        t = nbytes / (pcie_gbps * 1e9)
        return {"transfer_s": t, "step_s": compute_s + t, "hidden": t <= compute_s}  # BUG: never overlaps
    r = grade(STEM, "offload_model", with_answer(sol10, offload_step_time=offload_step_time), hidden=False)
    assert r.status == "failed" and "step_s" in r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set ---------------------------------

@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_answers_that_compute_nothing_score_zero(eid):
    ex = exercises(STEM)[eid]
    kit.assert_do_nothing_scores_zero(ex)


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid])


# --- the GPU benchmark script runs on a CPU at tiny sizes -------------------------------------------------------------

def test_checkpointing_benchmark_runs_tiny_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/checkpointing.py", "--tiny", "--device", "cpu",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = tmp_path.glob("checkpointing_cpu_*_tiny.json")
    data = json.loads(result.read_text())
    rows = {r["recompute"]: r for r in data["results"]}
    assert set(rows) == {",".join(c) or "none" for c in RECOMPUTE_CANDIDATES}
    assert all(r["saved_bytes"] == r["formula_bytes"] for r in rows.values())
    assert rows["block"]["saved_bytes"] < rows["none"]["saved_bytes"] and data["tiny"] is True



@pytest.mark.slow
def test_the_untouched_lab_graded_scores_zero(tmp_path):
    """The generated lab, as a learner receives it, through the grader itself: every exercise not attempted."""
    from grader.grade import grade as grade_submission

    result = grade_submission(kit.write(kit.submission(STEM), tmp_path / f"{STEM}.ipynb"), lab=STEM, seed=1)
    assert result["score"] == 0 and result["exercises"], result.get("message")
    assert {e["status"] for e in result["exercises"]} == {"not_attempted"}, result["exercises"]
