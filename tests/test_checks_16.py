"""Lab 16's checks: the solution passes; the mistakes system-design answers really make are rejected with a message
that names them: optimizer states, activations in flight or the bubble forgotten, TP priced on NVLink across nodes,
a ring all-reduce without its factor 2, a feasibility test that accepts TP across nodes or rejects a published
layout, a planner that is not the fastest, a serving plan that forgets the KV cache or misses the p99, PP credited
with lower latency, batching that ignores the wait to fill a batch, the network blamed for a slow rank, Young/Daly
without the factor 2 or with one GPU's MTBF, a re-shard that drops the padding tail, a straggler test fooled by one
hiccup, a divergence diagnosis that blames the biggest layer, MLOps anti-patterns and a canary promoted on too few
requests; a serving plan judged by the p99 of a handful of tail samples, without a spare replica, blind to the load
retries add, packed into one failure domain, or upgraded below its target; a benchmark review that misses an unfair
choice; a performance gate on a single run, with a fixed 5% threshold, or across SKUs."""
import dataclasses
import math
import sys
import types

import pytest
import torch

from gpulab.bench import percentile
from gpulab.planning import (
    CLUSTERS,
    GPT3_175B,
    GPT3_175B_ASSUMED,
    MIXTRAL_8X7B,
    PUBLISHED,
    SERVE_175B,
    Layout,
    MoESpec,
    all_to_all_time,
    fcfs_pool,
    group_link,
    kv_bytes_per_token,
    make_fleet,
    ring_allreduce_time,
    simulate_replicas,
)
from gpulab.reliability import BOTTLENECKS, CAUSES, make_divergence_trace, make_step_times
from gpulab.serving import make_trace
from grader.checks import exercises, load_lab
from grader.exercise import Case, evaluate
from grader.kit.neutral import case_rules, failed_rules, in_written_order, rules_differ
from grader.notebooks import answer_cells, exec_source, export_source, read_notebook
from tests import graderkit as kit
from tests import mutants
from tests.conftest import HIDDEN_SEED, ROOT, grade, solution_namespace

STEM = "16_capstone_design"
CHECKS, EX = load_lab(STEM), exercises(STEM)
H100_512 = CLUSTERS["H100-80GB x 8192 (RoCE 400G)"].with_gpus(512)


def rules_failed(result) -> list:
    """The rules of the cases ``result`` (public cases, and hidden ones from HIDDEN_SEED) did not pass."""
    return failed_rules(EX[result.id], result, HIDDEN_SEED)


@pytest.fixture(scope="module")
def sol16():
    return solution_namespace(STEM)


def with_answer(ns: dict, **replacements) -> dict:
    """The solution's namespace with some answers replaced, its other functions re-bound to it: a planner
    calling a replaced layout_problems calls the wrong one, as it would in a learner's notebook."""
    out = dict(ns, **replacements)
    for name, value in out.items():
        if isinstance(value, types.FunctionType) and value.__globals__ is ns and name not in replacements:
            out[name] = types.FunctionType(value.__code__, out, value.__name__, value.__defaults__,
                                           value.__closure__)
    return out


def _public(eid, ns, n=None):
    return evaluate(EX[eid], ns, "cpu", in_written_order(EX[eid])[:n])  # the first n public cases: quick


@pytest.mark.parametrize("eid", list(EX))
def test_the_solution_passes_every_public_and_hidden_case(sol16, eid):
    assert (result := grade(STEM, eid, sol16)).status == "passed", result.message


def test_solution_scores_full_marks_and_the_generated_lab_zero(sol16):
    lab = read_notebook(ROOT / "labs" / f"{STEM}.ipynb")
    lab_ns = exec_source(export_source(lab, answer_cells(lab)), f"<labs/{STEM}.ipynb>")
    for eid, ex in EX.items():
        assert evaluate(ex, lab_ns, "cpu").score == 0, eid
    assert sum(evaluate(ex, sol16, "cpu").score for ex in EX.values()) == sum(ex.points for ex in EX.values())


def test_the_published_layouts_are_feasible_and_close_to_the_models_best():
    for spec, seq, batch, cluster, layout, _ in PUBLISHED.values():
        assert CHECKS.ref_layout_problems(spec, seq, batch, layout, cluster) == []
        _, best = CHECKS.ref_plan_training(spec, seq, batch, cluster)
        assert CHECKS.ref_step_time(spec, seq, batch, layout, cluster)["total"] <= CHECKS.KNOWN_GOOD * best


# --- memory, step time, feasibility, the planner -------------------------------------------------------

def _memory(bug):
    def training_memory(spec, seq_len, layout):
        share = spec.n_params / (layout.tp * layout.pp)
        weights = 2 * share / (layout.dp if layout.zero >= 3 else 1)
        grads = 2 * share / (layout.dp if layout.zero >= 2 else 1)
        optimizer = 0.0 if bug == "no optimizer" else 12 * share / (layout.dp if layout.zero >= 1 else 1)
        sbh = seq_len * layout.micro_batch * spec.d_model
        in_flight = 1 if bug == "one microbatch" else layout.pp
        kept = (2 if layout.recompute else 34) * sbh / layout.tp
        activations = in_flight * math.ceil(spec.n_layers / layout.pp) * kept + (
            34 * sbh / layout.tp if layout.recompute else 0.0)
        return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": activations,
                "total": weights + grads + optimizer + activations}
    return training_memory


@pytest.mark.parametrize("bug, says", [("no optimizer", "no optimizer states"),
                                       ("one microbatch", "pp microbatches in flight"),
                                       ("adam 16", "16 is the whole model state"),
                                       ("ZeRO-3 shards the gradients", "ZeRO-2"),
                                       ("recompute ignored", "each layer keeps only its input")])
def test_a_wrong_memory_model_is_named(sol16, bug, says):
    wrong = _memory(bug) if bug in ("no optimizer", "one microbatch") else _memory_review(bug)  # (defined below)
    r = _public("training_memory", with_answer(sol16, training_memory=wrong))
    assert r.status == "failed" and says in r.message, r.message


def _step_time(sol, bug):
    def step_time(spec, seq_len, global_batch, layout, cluster):
        out = dict(sol["step_time"](spec, seq_len, global_batch, layout, cluster))
        m = global_batch // (layout.dp * layout.micro_batch)
        if bug == "no bubble":
            out["bubble"] = 0.0
        if bug == "tp on nvlink":  # BUG: the TP group priced on NVLink whatever its size
            act = 2 * seq_len * layout.micro_batch * spec.d_model
            out["tp_comm"] = math.ceil(spec.n_layers / layout.pp) * m * (6 if layout.recompute else 4) * \
                ring_allreduce_time(act, layout.tp, cluster.intra_alpha, cluster.intra_bytes_per_s)
            out["bubble"] = (out["compute"] + out["tp_comm"] + out["pp_comm"]) * (layout.pp - 1) / m
        if bug == "dp no factor 2":
            alpha, bw = group_link(cluster, layout.tp, layout.dp)
            out["dp_comm"] = (layout.dp - 1) * alpha + (layout.dp - 1) / layout.dp * 2 * spec.n_params / (
                layout.tp * layout.pp) / bw if layout.dp > 1 else 0.0
        out["total"] = sum(v for k, v in out.items() if k != "total")
        return out
    return step_time


@pytest.mark.parametrize("bug, says", [("no bubble", "no pipeline bubble"),
                                       ("tp on nvlink", "TP on NVLink although its group spans nodes"),
                                       ("dp no factor 2", "without its factor 2")])
def test_a_wrong_step_time_is_named(sol16, bug, says):
    r = _public("step_time", with_answer(sol16, step_time=_step_time(sol16, bug)))
    assert r.status == "failed" and says in r.message, r.message


def _problems(sol, bug):
    def layout_problems(spec, seq_len, global_batch, layout, cluster):
        if bug == "layers must divide" and spec.n_layers % layout.pp:
            return ["layers do not split evenly"]  # BUG: Llama 3 405B ran 126 layers on 16 stages
        found = sol["layout_problems"](spec, seq_len, global_batch, layout, cluster)
        if bug == "tp across nodes":
            found = [p for p in found if "crosses nodes" not in p]
        return found
    return layout_problems


def test_feasibility_that_allows_tp_across_nodes_is_named(sol16):
    r = _public("layout_problems", with_answer(sol16, layout_problems=_problems(sol16, "tp across nodes")))
    assert r.status == "failed" and "Yours accepts TP groups across nodes" in r.message, r.message


def test_feasibility_that_forgets_optimizer_states_is_named(sol16):
    r = _public("layout_problems", with_answer(sol16, training_memory=_memory("no optimizer")))
    assert r.status == "failed" and "Yours accepts no optimizer states" in r.message, r.message


def test_feasibility_that_rejects_a_published_layout_is_named(sol16):
    r = _public("layout_problems", with_answer(sol16, layout_problems=_problems(sol16, "layers must divide")))
    assert r.status == "failed" and "the layout the published run used" in r.message, r.message


def test_a_planner_that_is_not_the_fastest_fails(sol16):
    def plan_training(spec, seq_len, global_batch, cluster):  # BUG: always the deepest pipeline that fits
        for pp in (64, 32, 16, 8):
            layout = Layout(cluster.n_gpus // (8 * pp), 8, pp, 1, 1, True)
            if not sol16["layout_problems"](spec, seq_len, global_batch, layout, cluster):
                return layout, "the deepest pipeline that fits, to save memory"
        raise AssertionError
    r = _public("plan_training", with_answer(sol16, plan_training=plan_training))
    assert r.status == "failed" and "Search every tp" in r.message, r.message


def test_a_planner_without_the_bubble_is_caught(sol16):
    r = _public("plan_training", with_answer(sol16, step_time=_step_time(sol16, "no bubble")))
    assert r.status == "failed" and ("Search every tp" in r.message or "missing something" in r.message), r.message


def test_a_planner_whose_model_rejects_the_published_layout_fails(sol16):
    r = _public("plan_training", with_answer(sol16, layout_problems=_problems(sol16, "layers must divide")))
    assert r.status == "failed" and "rejects the published layout" in r.message, r.message


def test_a_plan_without_an_explanation_fails(sol16):
    def plan_training(spec, seq_len, global_batch, cluster):
        return sol16["plan_training"](spec, seq_len, global_batch, cluster)[0], ""
    r = _public("plan_training", with_answer(sol16, plan_training=plan_training), 1)
    assert r.status == "failed" and "explanation is missing" in r.message, r.message


# --- serving ------------------------------------------------------------------------------------------------

def _serving_memory(bug):
    def serving_memory(spec, tp, batch, context, weight_bytes, kv_bytes):
        weights = spec.n_params * weight_bytes / tp
        heads = {"no kv": 0, "kv not split": spec.n_kv_heads, "query heads": math.ceil(spec.n_heads / tp)}[bug]
        kv = batch * context * 2 * spec.n_layers * heads * spec.head_dim * kv_bytes
        return {"weights": weights, "kv": kv, "total": weights + kv}
    return serving_memory


@pytest.mark.parametrize("bug, says", [("no kv", "no KV cache"), ("kv not split", "TP splits the key/value heads"),
                                       ("query heads", "only the n_kv_heads key/value heads are cached")])
def test_wrong_serving_memory_is_named(sol16, bug, says):
    r = _public("serving_memory", with_answer(sol16, serving_memory=_serving_memory(bug)))
    assert r.status == "failed" and says in r.message, r.message


def test_a_serving_plan_that_forgets_the_kv_cache_is_named(sol16):
    r = _public("plan_serving", with_answer(sol16, serving_memory=_serving_memory("no kv")))
    assert r.status == "failed" and "Yours forgets the KV cache" in r.message, r.message


def test_a_serving_plan_that_misses_the_p99_fails(sol16):
    def plan_serving(spec, work, cluster):  # BUG: replicas from throughput alone, no queueing headroom
        plan = dict(sol16["plan_serving"](spec, work, cluster))
        plan["replicas"] = max(1, plan["replicas"] // 2)
        return plan
    r = _public("plan_serving", with_answer(sol16, plan_serving=plan_serving), 1)
    assert r.status == "failed" and "over the 0.5 s target" in r.message, r.message


def test_a_serving_plan_with_tp_across_nodes_fails(sol16):
    def plan_serving(spec, work, cluster):
        return {"tp": 16, "replicas": 8, "max_batch": 64}
    r = _public("plan_serving", with_answer(sol16, plan_serving=plan_serving), 1)
    assert r.status == "failed" and "inside a node" in r.message, r.message


def test_a_serving_plan_with_too_many_gpus_fails(sol16):
    def plan_serving(spec, work, cluster):
        plan = dict(sol16["plan_serving"](spec, work, cluster))
        plan["replicas"] *= 2
        return plan
    r = _public("plan_serving", with_answer(sol16, plan_serving=plan_serving), 1)
    assert r.status == "failed" and "Search for the fewest replicas" in r.message, r.message


def _four(sol, bug):
    def four_gpu_options(spec, cluster, work, batch):
        out = {k: dict(v) for k, v in sol["four_gpu_options"](spec, cluster, work, batch).items()}
        if bug == "pp faster":  # BUG: a pipeline of 4 stages credited with a 4x shorter token latency
            out["pp"]["latency_s"] /= 4
        if bug == "tp free":
            out["tp"] = {"latency_s": out["replicas"]["latency_s"] / 4,
                         "tokens_per_s": out["replicas"]["tokens_per_s"]}
        return out
    return four_gpu_options


@pytest.mark.parametrize("bug, says", [("pp faster", "PP does not cut latency"),
                                       ("tp free", "TP without its all-reduces")])
def test_a_wrong_four_gpu_comparison_is_named(sol16, bug, says):
    r = _public("four_gpu_options", with_answer(sol16, four_gpu_options=_four(sol16, bug)))
    assert r.status == "failed" and says in r.message, r.message


def test_batching_without_the_fill_wait_is_named(sol16):
    def resnet_batch(t_fixed, t_per_item, rate, slo):
        best = {"batch": 0, "latency_s": 0.0, "items_per_s": 0.0}
        for b in range(1, 257):
            run = t_fixed + b * t_per_item
            if run <= slo and b / run >= rate:  # BUG: the first image's wait for the others is forgotten
                best = {"batch": b, "latency_s": run, "items_per_s": b / run}
        return best
    r = _public("resnet_batch", with_answer(sol16, resnet_batch=resnet_batch))
    assert r.status == "failed" and "no wait for the batch to fill" in r.message, r.message


def test_blaming_the_network_for_a_slow_rank_is_named(sol16):
    def diagnose_deployment(profile):  # BUG: shares first; the ranks waiting for a slow one look network-bound
        step = float(profile["step_ms"].mean())
        if float(profile["nccl_ms"].mean()) > 0.4 * step:
            return {"bottleneck": "communication", "rank": -1}
        return sol16["diagnose_deployment"](profile)
    r = _public("diagnose_deployment", with_answer(sol16, diagnose_deployment=diagnose_deployment))
    assert r.status == "failed" and "compare the ranks' kernel times before blaming the network" in r.message


# --- reliability ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, says", [
    (lambda c, m, n: math.sqrt(c * m / n), "factor 2 is missing"),
    (lambda c, m, n: math.sqrt(2 * c * m), "one GPU's MTBF")])
def test_a_wrong_young_daly_is_named(sol16, fn, says):
    r = _public("checkpoint_interval", with_answer(sol16, checkpoint_interval=fn))
    assert r.status == "failed" and says in r.message, r.message


def _reshard(bug):
    def reshard_zero(shards, numel, new_world):
        flat = torch.cat(shards) if bug == "old padding kept" else torch.cat(shards)[:numel]
        if bug == "tail dropped":  # BUG: the last rank gets only the elements left, no padding
            return list(torch.tensor_split(flat, new_world))
        size = math.ceil(flat.numel() / new_world)
        padded = torch.full((size * new_world,), 7.0) if bug == "garbage padding" else torch.zeros(size * new_world)
        padded[:flat.numel()] = flat
        return list(padded.view(new_world, size).unbind(0))
    return reshard_zero


@pytest.mark.parametrize("bug, says", [("tail dropped", "drop the padding tail"),
                                       ("old padding kept", "strip the old padding"),
                                       ("garbage padding", "must be zeros")])
def test_a_wrong_reshard_is_named(sol16, bug, says):
    r = _public("reshard_zero", with_answer(sol16, reshard_zero=_reshard(bug)))
    assert r.status == "failed" and says in r.message, r.message


def test_the_reshard_round_trip_equals_the_unsharded_state(sol16):
    flat = torch.randn(1001)
    shards = CHECKS.flat_shards(flat, 8)
    back = sol16["reshard_zero"](sol16["reshard_zero"](shards, 1001, 3), 1001, 8)
    assert all(torch.equal(a, b) for a, b in zip(back, shards))


def test_a_straggler_test_by_the_mean_is_fooled_by_hiccups(sol16):
    def find_stragglers(times):
        means = torch.nanmean(times, dim=0)
        hung = [r for r in range(times.shape[1]) if torch.isnan(times[-3:, r]).all()]
        return {"stragglers": [r for r in range(times.shape[1]) if r not in hung and means[r] > 1.05 * means.median()],
                "hung": hung}
    r = _public("find_stragglers", with_answer(sol16, find_stragglers=find_stragglers))
    assert r.status == "failed" and "one-off hiccup" in r.message, r.message


def test_a_hang_counted_as_a_straggler_is_named(sol16):
    def find_stragglers(times):
        med = torch.nanmedian(times, dim=0).values
        slow = [r for r in range(times.shape[1]) if med[r] > 1.2 * med.median() or torch.isnan(times[-1, r])]
        return {"stragglers": slow, "hung": []}
    r = _public("find_stragglers", with_answer(sol16, find_stragglers=find_stragglers))
    assert r.status == "failed" and "is hung" in r.message, r.message


def test_the_supplied_traces_hold_what_they_promise():
    times = make_step_times(0, 40, 8, stragglers=[2], hung=[5])
    assert CHECKS.ref_find_stragglers(times) == {"stragglers": [2], "hung": [5]}
    for cause in ("bad_batch", "fp16_overflow", "lr_too_high"):
        trace = make_divergence_trace(3, cause)
        got = CHECKS.ref_diagnose_divergence(trace)
        assert got["cause"] == cause and got["layer"] == trace["_truth"][1], (cause, got, trace["_truth"])


def test_blaming_the_layer_with_the_largest_gradient_is_named(sol16):
    def diagnose_divergence(trace):  # BUG: the largest gradient norm, not the largest growth against itself
        found = dict(sol16["diagnose_divergence"](trace))
        found["layer"] = int(torch.nan_to_num(trace["layer_grad_norm"][found["first_spike"] - 1]).argmax())
        return found
    r = _public("diagnose_divergence", with_answer(sol16, diagnose_divergence=diagnose_divergence))
    assert r.status == "failed" and "big layers are not suspects" in r.message, r.message


def test_one_cause_for_every_divergence_is_named(sol16):
    r = _public("diagnose_divergence", with_answer(sol16, diagnose_divergence=lambda trace: dict(
        sol16["diagnose_divergence"](trace), cause="lr_too_high")))
    assert r.status == "failed" and "cause = 'lr_too_high'" in r.message, r.message


# --- MLOps ------------------------------------------------------------------------------------------------------

def test_an_anti_pattern_in_the_checklist_is_named(sol16):
    def mlops_checklist(scenario):
        return list(sol16["mlops_checklist"](scenario)) + ["full_rollout_at_once"]
    r = _public("mlops", with_answer(sol16, mlops_checklist=mlops_checklist))
    assert r.status == "failed" and "anti-pattern" in r.message, r.message


def test_a_serving_checklist_without_drift_is_named(sol16):
    def mlops_checklist(scenario):
        return [i for i in sol16["mlops_checklist"](scenario) if "drift" not in i]
    r = _public("mlops", with_answer(sol16, mlops_checklist=mlops_checklist))
    assert r.status == "failed" and "input distribution" in r.message, r.message


def test_a_canary_promoted_on_too_few_requests_fails(sol16):
    def rollout_decision(baseline, canary, slo):
        decision = sol16["rollout_decision"](baseline, canary, slo)
        return "promote" if decision == "wait" else decision
    r = _public("mlops", with_answer(sol16, rollout_decision=rollout_decision))
    assert r.status == "failed" and "Too few requests: wait" in r.message
    assert "canary too few requests" in rules_failed(r)


def test_a_canary_that_ignores_drift_fails(sol16):
    def rollout_decision(baseline, canary, slo):
        return sol16["rollout_decision"](baseline, dict(canary, psi=0.0), slo)
    r = _public("mlops", with_answer(sol16, rollout_decision=rollout_decision))
    assert r.status == "failed" and "canary input drift" in rules_failed(r), r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set --------------------------------

@pytest.mark.parametrize("eid", list(EX))
def test_do_nothing_answers_earn_nothing_and_hidden_rules_are_stable(eid):
    kit.assert_do_nothing_scores_zero(EX[eid])
    assert rules_differ(EX[eid]) is None


def test_hostile_plans_fail_cleanly_without_simulating_them(sol16):
    r = _public("plan_serving", with_answer(sol16, plan_serving=lambda *a: {"tp": 8, "replicas": 10**7,
                                                                            "max_batch": 1}), 1)
    assert r.status == "failed" and "Search for the fewest replicas" in r.message, r.message
    r = _public("plan_training", with_answer(sol16, plan_training=lambda *a: (Layout(16, 8, 8, zero=7),
                                                                             "ZeRO stage seven shards everything")), 1)
    assert r.status == "failed" and "positive ints" in r.message, r.message


# --- review: wrong answers that passed before, and mistakes now named ------------------------------------------

@pytest.mark.parametrize("drop, rule", [("GB per GPU", "over the 90% headroom"), ("batch", "a batch that does not"),
                                        ("heads", "heads that do not split"), ("stages", "more stages than layers")])
def test_feasibility_that_skips_a_rule_fails(sol16, drop, rule):
    def layout_problems(spec, seq_len, global_batch, layout, cluster):  # BUG: one rule never checked
        found = [p for p in sol16["layout_problems"](spec, seq_len, global_batch, layout, cluster) if drop not in p]
        if drop == "GB per GPU" and sol16["training_memory"](spec, seq_len, layout)["total"] > cluster.gpu_bytes:
            found.append("does not fit in the whole GPU")  # (the whole GPU, no headroom)
        return found
    r = _public("layout_problems", with_answer(sol16, layout_problems=layout_problems))
    assert r.status == "failed" and any(f.startswith(rule) for f in rules_failed(r)), r.message
    if drop == "GB per GPU":
        assert "Your training_memory is right" in r.message and "ONE GPU" in r.message, r.message


def test_feasibility_against_a_nodes_memory_is_not_blamed_on_the_memory_model(sol16):
    def layout_problems(spec, seq_len, global_batch, layout, cluster):  # BUG: a node's memory, not one GPU's
        found = [p for p in sol16["layout_problems"](spec, seq_len, global_batch, layout, cluster) if "GB" not in p]
        if sol16["training_memory"](spec, seq_len, layout)["total"] > 0.9 * cluster.gpu_bytes * cluster.gpus_per_node:
            found.append("does not fit in the node")
        return found
    r = _public("layout_problems", with_answer(sol16, layout_problems=layout_problems))
    assert r.status == "failed" and "not a node's memory" in r.message and "Yours accepts" not in r.message, r.message


def _memory_review(bug):
    def training_memory(spec, seq_len, layout):
        out = dict(CHECKS.ref_training_memory(spec, seq_len, layout))
        share, dp, z = spec.n_params / (layout.tp * layout.pp), layout.dp, layout.zero
        if bug == "adam 16":
            out["optimizer"] = 16 * share / (dp if z >= 1 else 1)
        if bug == "ZeRO-3 shards the gradients":
            out["grads"] = 2 * share / (dp if z >= 3 else 1)
        if bug == "recompute ignored":
            sbh = seq_len * layout.micro_batch * spec.d_model
            out["activations"] = layout.pp * math.ceil(spec.n_layers / layout.pp) * 34 * sbh / layout.tp
        out["total"] = sum(v for k, v in out.items() if k != "total")
        return out
    return training_memory


def test_a_bubble_taken_as_its_share_of_the_step_is_named(sol16):
    def step_time(spec, seq_len, global_batch, layout, cluster):
        out = dict(sol16["step_time"](spec, seq_len, global_batch, layout, cluster))
        m = global_batch // (layout.dp * layout.micro_batch)
        out["bubble"] = (out["compute"] + out["tp_comm"] + out["pp_comm"]) * (layout.pp - 1) / (m + layout.pp - 1)
        out["total"] = sum(v for k, v in out.items() if k != "total")
        return out
    r = _public("step_time", with_answer(sol16, step_time=step_time))
    assert r.status == "failed" and "the bubble's share of the whole step" in r.message, r.message


def test_serving_weights_per_replica_not_per_gpu_is_named(sol16):
    def serving_memory(spec, tp, batch, context, weight_bytes, kv_bytes):
        out = dict(sol16["serving_memory"](spec, tp, batch, context, weight_bytes, kv_bytes))
        out["weights"] = spec.n_params * weight_bytes  # BUG: not divided by tp
        out["total"] = out["weights"] + out["kv"]
        return out
    r = _public("serving_memory", with_answer(sol16, serving_memory=serving_memory))
    assert r.status == "failed" and "TP gives each GPU 1/tp" in r.message, r.message


def test_a_serving_plan_sized_on_the_median_is_named(sol16):
    def plan_serving(spec, work, cluster):  # BUG: replicas until the median (not the p99) meets the target
        for replicas in range(1, 33):
            if CHECKS.simulate_replicas(spec, cluster, work, 8, replicas, 256)["p50"] <= work.p99_s:
                return {"tp": 8, "replicas": replicas, "max_batch": 256}
    r = _public("plan_serving", with_answer(sol16, plan_serving=plan_serving), 1)
    assert r.status == "failed" and "not the median or the mean" in r.message, r.message


def test_a_dropped_report_is_not_a_hang(sol16):
    def find_stragglers(times):  # BUG: any rank with a NaN last step counts as hung
        out = sol16["find_stragglers"](times)
        hung = [r for r in range(times.shape[1]) if torch.isnan(times[-1, r])]
        return {"stragglers": [r for r in out["stragglers"] if r not in hung], "hung": hung}
    r = _public("find_stragglers", with_answer(sol16, find_stragglers=find_stragglers))
    assert r.status == "failed" and "not a hang" in r.message, r.message


def test_a_checklist_of_everything_but_the_anti_patterns_fails(sol16):
    everything = [i for i in CHECKS.MLOPS_ITEMS if i not in CHECKS.MLOPS_HARMFUL]
    r = _public("mlops", with_answer(sol16, mlops_checklist=lambda scenario: everything))
    assert r.status == "failed" and "belong to another pipeline" in r.message, r.message


@pytest.mark.parametrize("factor", [1.0, 2.0, 5.0])
def test_a_canary_judged_by_a_fixed_multiple_of_the_error_rate_fails(sol16, factor):
    def rollout_decision(baseline, canary, slo):  # BUG: errors over factor x the baseline's rate, no standard error
        if sol16["rollout_decision"](baseline, dict(canary, errors=0), slo) != "promote":
            return sol16["rollout_decision"](baseline, canary, slo)
        rate = baseline["errors"] / baseline["requests"]
        return "rollback" if canary["errors"] / canary["requests"] > factor * rate else "promote"
    r = _public("mlops", with_answer(sol16, rollout_decision=rollout_decision))
    assert r.status == "failed" and "not a fixed multiple of p" in r.message, r.message


def test_stragglers_against_the_mean_of_the_medians_miss_a_slow_group(sol16):
    def find_stragglers(times):  # BUG: a mean, which a group of slow ranks pulls up
        out = sol16["find_stragglers"](times)
        medians = torch.nanmedian(times, dim=0).values
        ok = [r for r in range(times.shape[1]) if r not in out["hung"]]
        return {"stragglers": [r for r in ok if medians[r] > 1.2 * medians[ok].mean()], "hung": out["hung"]}
    r = _public("find_stragglers", with_answer(sol16, find_stragglers=find_stragglers))
    assert r.status == "failed" and "not their mean" in r.message, r.message


def test_a_batch_latency_with_a_full_batch_wait_says_how_latency_is_counted(sol16):
    def resnet_batch(t_fixed, t_per_item, rate, slo):  # BUG: the first image waits b / rate, not (b - 1) / rate
        out = dict(sol16["resnet_batch"](t_fixed, t_per_item, rate, slo))
        out["latency_s"] += 1 / rate if out["batch"] else 0.0
        return out
    r = _public("resnet_batch", with_answer(sol16, resnet_batch=resnet_batch))
    assert r.status == "failed" and "waits for the b - 1 after it" in r.message, r.message


def test_a_serving_plan_from_decode_throughput_alone_is_named(sol16):
    def plan_serving(spec, work, cluster):  # BUG: replicas = decode tokens needed / decode tokens a replica makes
        step = CHECKS.replica_step_time(spec, 8, cluster, work, 0, 64)
        return {"tp": 8, "replicas": math.ceil(work.rate * sum(work.new_tokens) / 2 / (64 / step)), "max_batch": 64}
    r = _public("plan_serving", with_answer(sol16, plan_serving=plan_serving), 1)
    assert r.status == "failed" and "prefill" in r.message and "decode throughput alone" in r.message, r.message


# --- mixture of experts: expert parallelism -------------------------------------------------------------------

def _moe_memory(sol, bug):
    def moe_training_memory(spec, seq_len, layout):
        if bug == "experts not divided by ep":  # BUG: every GPU of the EP group holds all the experts
            return sol["moe_training_memory"](spec, seq_len, dataclasses.replace(layout, ep=1))
        # BUG: the dense formula on all the parameters, as if the experts were a dense MLP
        return sol["training_memory"](spec, seq_len, layout)
    return moe_training_memory


def _moe_time(sol, bug):
    def moe_step_time(spec, seq_len, global_batch, layout, cluster):
        out = dict(sol["moe_step_time"](spec, seq_len, global_batch, layout, cluster))
        m = global_batch // (layout.dp * layout.micro_batch)
        if bug == "no all-to-all":  # BUG: the tokens' trips to their experts cost nothing
            out["a2a_comm"] = 0.0
        if bug == "all parameters active":  # BUG: every expert's FLOPs for every token
            out["compute"] *= spec.n_params / spec.active_params
        out["bubble"] = (out["compute"] + out["tp_comm"] + out["pp_comm"] + out["a2a_comm"]) * (layout.pp - 1) / m
        out["total"] = sum(v for k, v in out.items() if k != "total")
        return out
    return moe_step_time


def _moe_problems(sol, drop):
    def moe_layout_problems(spec, seq_len, global_batch, layout, cluster):  # BUG: one EP rule never checked
        if drop == "dense" and not isinstance(spec, MoESpec):
            return sol["layout_problems"](spec, seq_len, global_batch, layout, cluster)
        return [p for p in sol["moe_layout_problems"](spec, seq_len, global_batch, layout, cluster) if drop not in p]
    return moe_layout_problems


# (exercise checked, the answer replaced, its wrong version, what the message must say)
MOE_MISTAKES = {
    "expert memory not divided by ep": ("moe_training_memory", "moe_training_memory",
                                        lambda sol: _moe_memory(sol, "experts not divided by ep"),
                                        "the experts not divided by ep"),
    "experts counted as a dense MLP": ("moe_training_memory", "moe_training_memory",
                                       lambda sol: _moe_memory(sol, "experts as dense"), "training_memory"),
    "feasibility on expert memory not divided by ep": ("moe_layout_problems", "moe_training_memory",
                                                       lambda sol: _moe_memory(sol, "experts not divided by ep"),
                                                       "Is your expert memory divided by ep?"),
    "all-to-all omitted": ("moe_step_time", "moe_step_time", lambda sol: _moe_time(sol, "no all-to-all"),
                           "no all-to-all"),
    "all experts in the FLOPs": ("moe_step_time", "moe_step_time",
                                 lambda sol: _moe_time(sol, "all parameters active"), "6 x active_params per token"),
    "ep not dividing dp accepted": ("moe_layout_problems", "moe_layout_problems",
                                    lambda sol: _moe_problems(sol, "does not divide DP"), "that does not divide DP"),
    "dense model given ep > 1": ("moe_layout_problems", "moe_layout_problems", lambda sol: _moe_problems(sol, "dense"),
                                 "Yours gives a dense model EP > 1"),
}


@pytest.mark.parametrize("mistake", list(MOE_MISTAKES))
def test_a_moe_mistake_is_named(sol16, mistake):
    eid, name, wrong, says = MOE_MISTAKES[mistake]
    r = _public(eid, with_answer(sol16, **{name: wrong(sol16)}))
    assert r.status == "failed" and says in r.message, r.message


def test_a_moe_planner_without_ep_in_its_search_fails(sol16):
    def plan_moe_training(spec, seq_len, global_batch, cluster):  # BUG: plan_training's search, EP left at 1
        best = min((lay for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) for lay in
                    [Layout(cluster.n_gpus // (tp * pp), tp, pp, mb, z, r) for mb in (1, 2, 4, 8) for z in range(4)
                     for r in (False, True)]
                    if not sol16["moe_layout_problems"](spec, seq_len, global_batch, lay, cluster)),
                   key=lambda lay: sol16["moe_step_time"](spec, seq_len, global_batch, lay, cluster)["total"])
        return best, "the fastest layout without expert parallelism"
    r = _public("plan_moe_training", with_answer(sol16, plan_moe_training=plan_moe_training))
    assert r.status == "failed" and "Yours kept EP=1" in r.message, r.message


def test_the_moe_model_is_mixtral_and_all_to_all_is_pairwise():
    assert abs(MIXTRAL_8X7B.active_params / 1e9 - 12.9) < 0.1  # Mixtral's reported active parameters
    assert all_to_all_time(1e9, 1, 1e-6, 1e9) == 0.0
    assert math.isclose(all_to_all_time(8e9, 8, 0.0, 1e9), 7.0)  # each rank sends 7/8 of its 8 GB at 1 GB/s


# --- prefill and decode: mixed or disaggregated ----------------------------------------------------------------

def _split(sol, bug):
    def prefill_decode_split(spec, work, cluster, tp, decode_batch, n_requests=300, seed=0):
        out = dict(sol["prefill_decode_split"](spec, work, cluster, tp, decode_batch, n_requests, seed))
        if bug == "prefill memory-bound":  # BUG: a prefill priced as one read of the weights
            out["ttft_s"] = spec.n_params * work.weight_bytes / (tp * cluster.hbm_bytes_per_s)
        if bug == "decode compute-bound":  # BUG: a decode step priced by its FLOPs
            out["tpot_s"] = 2 * spec.n_params * decode_batch / (tp * cluster.peak_flops * cluster.mfu)
        if bug == "no kv transfer":  # BUG: the cache appears on the decode replica for free
            out["kv_transfer_s"] = 0.0
        if bug == "p99 from the mean":  # BUG: the mean TTFT of the same simulation reported as its p99
            trace = make_trace(seed, n_requests, work.rate, work.prompt_len, work.new_tokens)
            prefill = [2 * spec.n_params * r.prompt_len / (tp * cluster.peak_flops * cluster.mfu) for r in trace]
            kv = kv_bytes_per_token(spec, work.kv_bytes)
            ttfts = [t + cluster.inter_alpha + r.prompt_len * kv / tp / cluster.inter_bytes_per_s for t, r in
                     zip(fcfs_pool([r.arrival for r in trace], prefill, out["prefill_replicas"]), trace)]
            out["p99_ttft_s"] = sum(ttfts) / len(ttfts)
        return out
    return prefill_decode_split


@pytest.mark.parametrize("bug, says", [("prefill memory-bound", "prefill as memory-bound"),
                                       ("decode compute-bound", "decode as compute-bound"),
                                       ("no kv transfer", "no KV transfer"),
                                       ("p99 from the mean", "the mean TTFT")])
def test_a_wrong_prefill_decode_split_is_named(sol16, bug, says):
    r = _public("prefill_decode_split", with_answer(sol16, prefill_decode_split=_split(sol16, bug)), 1)
    assert r.status == "failed" and says in r.message, r.message


def test_disaggregation_trades_the_decode_stall_for_a_kv_transfer(sol16):
    split = sol16["prefill_decode_split"](GPT3_175B, SERVE_175B, CLUSTERS["H100-80GB x 8192 (RoCE 400G)"], 8, 32)
    assert split["ttft_s"] > 5 * split["tpot_s"] > 5 * split["kv_transfer_s"] > 0  # prefill >> decode step > transfer
    assert split["p99_ttft_s"] > split["ttft_s"]  # queueing for a prefill replica adds to the longest prefill


# --- answers that read the case instead of solving it ------------------------------------------------------

def _case_in_caller():
    """The case the grader's run function holds, found up the answer's call stack."""
    frame = sys._getframe(2)
    while frame is not None and not isinstance(frame.f_locals.get("case"), Case):
        frame = frame.f_back
    return frame.f_locals["case"]


def test_a_diagnosis_read_from_the_case_name_earns_nothing(sol16):
    seen = []

    def spying(profile):  # the case is within reach of the answer: its name must say nothing
        seen.append(_case_in_caller().name)
        return sol16["diagnose_deployment"](profile)
    assert grade(STEM, "diagnose_deployment", {"diagnose_deployment": spying}).status == "passed"
    cases = len(EX["diagnose_deployment"].cases()) + len(EX["diagnose_deployment"].cases(HIDDEN_SEED, False))
    assert len(seen) == cases and all(n.startswith(("case", "example")) for n in seen), seen

    def diagnose_deployment(profile):
        name = _case_in_caller().name
        found = [b for b in BOTTLENECKS if b in name or b.replace("_", " ") in name]
        return {"bottleneck": found[0], "rank": int(profile["kernel_ms"].argmax())}  # IndexError: nothing found
    r = grade(STEM, "diagnose_deployment", {"diagnose_deployment": diagnose_deployment})
    assert r.score == 0, r.message


def test_a_rollout_read_from_the_case_name_earns_nothing(sol16):
    words = {"healthy": "promote", "within noise": "promote", "too few": "wait", "over": "rollback",
             "more errors": "rollback", "drift": "rollback"}

    def rollout_decision(baseline, canary, slo):
        name = _case_in_caller().name
        return next(decision for word, decision in words.items() if word in name)  # StopIteration: nothing found
    r = grade(STEM, "mlops", with_answer(sol16, rollout_decision=rollout_decision))
    rules = {**case_rules(EX["mlops"], 0, True), **case_rules(EX["mlops"], HIDDEN_SEED)}
    canaries = [c for c in r.cases if rules[c.name].startswith("canary")]
    assert canaries and all(c.status != "passed" for c in canaries), [(c.name, c.status) for c in canaries]


def test_hidden_case_names_name_no_answer():
    """A classification's answer (a bottleneck, a cause, a decision) never appears in its cases' names."""
    answers = {"diagnose_deployment": BOTTLENECKS, "diagnose_divergence": CAUSES,
               "mlops": ("promote", "rollback", "wait", "healthy", "noise", "drift", "errors", "latency")}
    for eid, words in answers.items():
        for seed, public in ((0, True), (HIDDEN_SEED, False), (3, False)):
            for case in EX[eid].cases(seed, public):
                assert not any(w in case.name or w.replace("_", " ") in case.name for w in words), case.name


# --- plausible wrong answers, one line of the solution changed: each fails on every seed, and says why ------

MUTANTS = [  # (exercise, the solution's text, the mistake, what the message says)
    ("training_memory", "12 * share / sharded(1)", "8 * share / sharded(1)", "12 bytes per parameter"),
    ("training_memory", "layout.zero >= stage", "layout.zero > stage", "divided by dp from ZeRO-2 on"),
    ("training_memory", "(34 * sbh / layout.tp if layout.recompute else 0.0)", "0.0", "recomputation peak"),
    ("training_memory", "layout.pp * layers * kept", "layers * kept", "pp microbatches in flight"),
    ("training_memory", "math.ceil(spec.n_layers / layout.pp)", "spec.n_layers // layout.pp", "ceil(L / pp)"),
    ("training_memory", "math.ceil(spec.n_layers / layout.pp)", "spec.n_layers / layout.pp", "ceil(L / pp)"),
    ("step_time", "(8 if layout.recompute else 6)", "6", "8 x with recomputation"),
    ("step_time", "per_layer = 6 if layout.recompute else 4", "per_layer = 4", "6 with recomputation"),
    ("step_time", "bubble = (compute + tp + pp)", "bubble = (compute)", "(compute + tp_comm + pp_comm)"),
    ("step_time", "(layout.pp - 1) / m", "(layout.pp - 1) / (m + layout.pp - 1)", "(pp - 1) / m"),
    ("step_time", "2 * m * (alpha + act / bw)", "m * (alpha + act / bw)", "one send forward and one backward"),
    ("step_time", "2 * m * (alpha + act / bw)", "2 * m * (act / bw)", "2 m (alpha + bytes"),
    ("step_time", "group_link(cluster, layout.tp, layout.dp)", "group_link(cluster, 1, layout.dp)", "dp ranks"),
    ("step_time", "dp *= 1.5 if layout.zero == 3 else 1.0", "dp *= 1.0", "ZeRO-3"),
    ("step_time", "tp = math.ceil(spec.n_layers / layout.pp) * m", "tp = spec.n_layers * m", "ceil(L / pp)"),
    ("layout_problems", "HEADROOM * cluster.gpu_bytes", "cluster.gpu_bytes", "0.9 x gpu_bytes"),
    ("layout_problems", "layout.tp > cluster.gpus_per_node", "False", "spans nodes"),
    ("layout_problems", "spec.n_heads % layout.tp", "0", "heads do not split"),
    ("layout_problems", "layout.pp > spec.n_layers", "False", "stages for 96 layers"),
    ("layout_problems", "global_batch % (layout.dp * layout.micro_batch)", "global_batch % layout.dp",
     "not a multiple of dp x micro_batch"),
    ("layout_problems", "!= cluster.n_gpus", "> cluster.n_gpus", "not the 1024 GPUs"),
    ("plan_training", "for pp in [d for d in range(1, rest + 1) if rest % d == 0]",
     "for pp in [d for d in (1, 2, 4, 8, 16) if rest % d == 0]",
     "AttributeError: 'NoneType' object has no attribute 'dp'"),
    ("plan_serving", 'mem["total"] <= HEADROOM * cluster.gpu_bytes', 'mem["total"] <= cluster.gpu_bytes',
     "not the 90% a plan may use"),
    ("moe_training_memory", "expert_dp = layout.dp // layout.ep  # ranks", "expert_dp = layout.dp  # ranks",
     "expected"),
    ("moe_training_memory", "share = spec.expert_params / (layout.tp * layout.pp * layout.ep)",
     "share = spec.expert_params / (layout.tp * layout.pp)", "expected"),
    ("moe_step_time", "per_layer = 6 if layout.recompute else 4  ", "per_layer = 4  ", "6 with recomputation"),
    ("moe_step_time", "* spec.top_k * spec.d_model", "* spec.d_model", "top_k"),
    ("moe_step_time", 'out["bubble"] = pipelined *', 'out["bubble"] = (pipelined - out["a2a_comm"]) *',
     "the all-to-alls"),
    ("moe_step_time", "expert_dp = layout.dp // layout.ep\n", "expert_dp = layout.dp\n", "dp_comm"),
    ("moe_layout_problems", "if layout.dp % layout.ep:", "if False:", "does not divide DP"),
    ("moe_layout_problems", "if spec.num_experts % layout.ep:", "if False:", "experts do not split"),
    ("moe_layout_problems", "total > HEADROOM * cluster.gpu_bytes", "total > cluster.gpu_bytes", "> 90% of 80 GB"),
    ("serving_memory", "math.ceil(spec.n_kv_heads / tp)", "spec.n_kv_heads / tp", "ceil(n_kv_heads / tp)"),
    ("serving_memory", "math.ceil(spec.n_kv_heads / tp)", "math.ceil(spec.n_heads / tp)", "query heads"),
    ("prefill_decode_split", "math.ceil((prefill_load + decode_load) / SERVE_UTILISATION)",
     "math.ceil(prefill_load / SERVE_UTILISATION) + math.ceil(decode_load / SERVE_UTILISATION)",
     "mixed replicas share both loads"),
    ("prefill_decode_split", "tpot + prefill(longest)", "prefill(longest)", "tpot_s + ttft_s"),
    ("prefill_decode_split", "percentile(ttfts, 99)", "percentile(ttfts, 50)", "p99_ttft_s"),
    ("prefill_decode_split", "return cluster.inter_alpha + prompt", "return prompt", "inter_alpha"),
    ("prefill_decode_split", "/ cluster.inter_bytes_per_s", "/ cluster.intra_bytes_per_s", "inter_bytes_per_s"),
    ("four_gpu_options", "cycle = 4 * (t1 / 4 + hop)", "cycle = t1", "four_gpu_options['pp']"),
    ("resnet_batch", "if latency <= slo and b / run >= rate:", "if latency <= slo:", "no throughput check"),
    ("resnet_batch", "latency <= slo", "latency < slo", "a target met exactly"),
    ("resnet_batch", "range(1, 257)", "range(1, 65)", "expected 256"),
    ("diagnose_deployment", "1.5 * float(kernel.median())", "1.5 * float(kernel.mean())", "the median rank's"),
    ("diagnose_deployment", "1.5 * float(kernel.median())", "2.0 * float(kernel.median())", "stage_imbalance"),
    ("diagnose_deployment", 'step = float(profile["step_ms"].mean())', 'step = float(profile["step_ms"].max())',
     "mean shares of the step"),
    ("reshard_zero", "dtype=flat.dtype", "dtype=torch.float32", "keep torch.bfloat16"),
    ("find_stragglers", "torch.nanmedian(times, dim=0).values", "torch.nanmean(times, dim=0)",
     "use each rank's median"),
    ("find_stragglers", "if r not in hung and float", "if float", "is hung: report it once"),
    ("find_stragglers", "torch.isnan(times[-3:, r]).all()", "torch.isnan(times[-3:, r]).any()", "not a hang"),
    ("diagnose_divergence", "norms[last] / torch.median(norms[:max(last, 1)], dim=0).values", "norms[last]",
     "big layers are not suspects"),
    ("diagnose_divergence", "1.5 * float(torch.median(loss[t - 20:t]))", "1.5 * float(torch.mean(loss[t - 20:t]))",
     "StopIteration"),
    ("diagnose_divergence", "1.5 * float(torch.median(loss[t - 20:t]))", "1.5 * float(torch.nanmedian(loss[:t]))",
     "StopIteration"),
    ("diagnose_divergence", "if first_nan >= 0 and scale[first_nan] * 8 <= scale[max(0, first_nan - 10)]:",
     "if first_nan >= 0 and first_nan == spike:", "loss scale down 8x"),
    ("mlops", "limit = p + 3 *", "limit = p + 2 *", "the error limit p + 3 sqrt"),
    ("mlops", 'canary["psi"] >= 0.25', 'canary["psi"] >= 0.1', "PSI 0."),
    ("mlops", 'canary["psi"] >= 0.25', 'canary["psi"] > 0.25', "PSI 0.25"),
    ("mlops", '/ canary["requests"])', '/ baseline["requests"])', "the error limit"),
    ("p99_upper_bound", "    return math.inf", "    return xs[-1]", "return math.inf"),
    ("p99_upper_bound", "if covered >= confidence:", "if covered >= 0.5:", "the bound is rank"),
    ("retry_load", "sum(p_error ** i for i in range(max_retries + 1))", "1 + max_retries * p_error", "1 + r p"),
    ("retry_load", "attempts += 1 - hedge_quantile", "attempts += hedge_quantile", "1 - q, get one"),
    ("retry_load", "attempts = min(attempts, 1 + budget)", "attempts = attempts", "no retry budget"),
    ("place_replicas", "rack = min(open_racks, key=lambda r: used[r])", "rack = open_racks[0]",
     "spread the replicas over the racks"),
    ("place_replicas", 'if node["gpu"] == gpu and node["free"] >= tp:', 'if node["free"] >= tp:',
     "on H100 nodes only"),
    ("failover_cost", "contexts = [prompt + generated for", "contexts = [prompt for", "the prompt alone"),
    ("failover_cost", 'detect = health["interval_s"] * health["failures"]', 'detect = health["interval_s"]',
     "after one failed probe"),
    ("failover_cost", "max(new - generated for", "max(new for", "the whole output"),
    ("benchmark_design", 'not set(STAGES) <= set(design["timed"])', '"compute" not in design["timed"]',
     "It misses: end_to_end"),
    ("benchmark_design", 'design["cpu_threads"] < design["cpu_cores"]', "False", "It misses: tuned_baseline"),
    ("ci_gate", "elif len(runs) < MIN_RUNS:", "elif False:", "one run is noise"),
    ("ci_gate", " and slower > MIN_EFFECT * float(b.mean())", "", "MIN_EFFECT"),
    ("ci_gate", "baseline.get(sku, [])", "next(iter(baseline.values()))", "its own baseline"),
    ("plan_fault_tolerant", "upper(mid - 1) <= work.p99_s", "upper(mid) <= work.p99_s", "no spare replica"),
    ("plan_fault_tolerant", "rate=work.rate * load_factor", "rate=work.rate", "rate x load_factor"),
    ("plan_fault_tolerant", '"max_unavailable": unavailable}', '"max_unavailable": unavailable + 1}',
     "drops below the target"),
]


@pytest.mark.parametrize("eid, old, new, says", MUTANTS, ids=mutants.ids(MUTANTS))
def test_a_plausible_mistake_fails_on_every_seed_and_says_why(sol16, eid, old, new, says):
    mutants.assert_fails_on_every_seed(EX[eid], mutants.mutated(STEM, sol16, eid, old, new), says)


# --- the course helpers an answer may call: those lab 16's setup imports, no others ---------------------------

def test_an_answer_calling_a_helper_the_lab_does_not_offer_earns_nothing(sol16):
    from gpulab.planning import bubble_fraction  # lab 13's exercise, modelled for the lesson

    def step_time(spec, seq_len, global_batch, layout, cluster):
        out = dict(sol16["step_time"](spec, seq_len, global_batch, layout, cluster))
        out["bubble"] = bubble_fraction(layout.pp, global_batch // (layout.dp * layout.micro_batch)) * out["compute"]
        return out
    r = grade(STEM, "step_time", with_answer(sol16, step_time=step_time))
    assert r.score == 0 and "gpulab.planning.bubble_fraction, a course helper this lab does not offer" in r.message


def test_a_renamed_helper_earns_nothing():
    """Course code under the learner's module name is still course code: where it lives decides."""
    from gpulab.planning import ring_allreduce_time

    spoofed = types.FunctionType(ring_allreduce_time.__code__, {}, "checkpoint_interval")
    spoofed.__module__ = "__main__"
    r = grade(STEM, "checkpoint_interval", {"checkpoint_interval": spoofed})
    assert r.score == 0 and "gpulab:" in r.message and "does not offer" in r.message, r.message


# --- the published layouts: what the papers' tables say ------------------------------------------------------

def test_the_megatron_row_is_its_table_1_row_and_the_175b_layout_is_labelled_an_assumption():
    """Narayanan et al. (arXiv:2104.04473), Table 1 has no 175B row: its nearest is 145.6B (96 heads, hidden 12288,
    80 layers) with TP 8, PP 8, 1536 GPUs, batch 2304; Section 5.1's GPT-3 estimate (1024 GPUs, batch 1536) states
    no layout."""
    spec, seq, batch, cluster, layout, source = PUBLISHED["GPT 145.6B (Megatron-LM)"]
    assert (spec.n_params, spec.n_layers, spec.d_model, spec.n_heads) == (145.6e9, 80, 12288, 96)
    assert (layout.tp, layout.pp, cluster.n_gpus, batch, seq) == (8, 8, 1536, 2304, 2048)
    assert layout.dp * layout.tp * layout.pp == cluster.n_gpus
    assert "Table 1: 145.6B parameters, TP 8, PP 8, 1536 GPUs, batch 2304, sequence 2048" in source
    assert not any("175B" in src for *_, src in PUBLISHED.values())
    spec, seq, batch, cluster, layout, source = GPT3_175B_ASSUMED
    assert (spec.n_params, cluster.n_gpus, batch, layout.tp, layout.pp) == (175e9, 1024, 1536, 8, 8)
    assert source.startswith("an assumption") and "Section 5.1" in source and "state no layout" in source


# --- fault-tolerant serving -------------------------------------------------------------------------------------

def test_a_p99_from_a_handful_of_tail_samples_is_no_bound(sol16):
    r = grade(STEM, "p99_upper_bound", with_answer(sol16, p99_upper_bound=lambda xs, c=0.95: percentile(xs, 99)))
    assert r.status == "failed" and "Yours is the sample p99" in r.message, r.message
    r = grade(STEM, "p99_upper_bound", with_answer(sol16, p99_upper_bound=lambda xs, c=0.95: max(xs)))
    assert r.status == "failed" and any("return math.inf" in c.message for c in r.cases), r.message


def test_the_section_6_plan_misses_the_target_once_its_tail_is_bounded():
    """300 requests put the 175B plan under 500 ms; its bound on TAIL_SAMPLES requests, and one replica down, do not."""
    best = CHECKS.ref_plan_serving(GPT3_175B, SERVE_175B, H100_512)
    tp, replicas, max_batch = best[1:]
    assert simulate_replicas(GPT3_175B, H100_512, SERVE_175B, tp, replicas, max_batch)["p99"] <= SERVE_175B.p99_s
    assert CHECKS._upper(GPT3_175B, H100_512, SERVE_175B, tp, replicas - 1, max_batch) > SERVE_175B.p99_s
    assert CHECKS.ref_plan_fault_tolerant(GPT3_175B, SERVE_175B, H100_512, tp, max_batch) > replicas


def _ft_grade(sol, **answers):
    return _public("plan_fault_tolerant", with_answer(sol, **answers))


@pytest.mark.slow
def test_a_plan_on_the_sample_p99_of_300_requests_fails(sol16):
    def plan_fault_tolerant(spec, work, cluster, tp, max_batch, load_factor=1.0):  # N+1, on section 6's p99
        offered = dataclasses.replace(work, rate=work.rate * load_factor)

        def p99(replicas):
            return simulate_replicas(spec, cluster, offered, tp, replicas, max_batch)["p99"]
        r = next(r for r in range(2, 33) if p99(r - 1) <= work.p99_s)
        return {"replicas": r, "upper_all": p99(r), "upper_one_down": p99(r - 1), "max_unavailable": 1}
    r = _ft_grade(sol16, plan_fault_tolerant=plan_fault_tolerant)
    assert r.status == "failed" and "rests on 3 samples" in r.message, r.message


def test_a_plan_that_ignores_the_retry_load_fails_only_where_retries_add_load(sol16):
    ns = mutants.mutated(STEM, sol16, "plan_fault_tolerant", "rate=work.rate * load_factor", "rate=work.rate")
    r = _ft_grade(ns)
    assert r.status == "failed" and rules_failed(r) == ["retries that double the load"], r.message


def test_retries_that_double_the_load_are_priced(sol16):
    assert sol16["retry_load"](1.0, 1) == 2.0 and sol16["retry_load"](1.0, 3, None, 0.1) == pytest.approx(1.1)
    def retries_once(p_error, max_retries, hedge_quantile=None, budget=None):
        return 1.0 + p_error
    r = grade(STEM, "retry_load", with_answer(sol16, retry_load=retries_once))
    assert r.status == "failed" and "expected" in r.message, r.message


def _first_fit(nodes, replicas, tp, gpu):
    """Packs replicas into the first nodes with room: two per node when they fit, one rack before the next."""
    placed = []
    for node in nodes:
        if node["gpu"] == gpu:
            placed += [node["name"]] * (node["free"] // tp)
    return placed[:replicas] if len(placed) >= replicas else None


def _one_per_node_in_order(nodes, replicas, tp, gpu):
    placed = [n["name"] for n in nodes if n["gpu"] == gpu and n["free"] >= tp]
    return placed[:replicas] if len(placed) >= replicas else None


@pytest.mark.parametrize("fn, says", [(_first_fit, "two replicas on one node"),
                                      (_one_per_node_in_order, "spread the replicas over the racks")])
def test_replicas_in_one_failure_domain_fail(sol16, fn, says):
    r = grade(STEM, "place_replicas", with_answer(sol16, place_replicas=fn))
    assert r.status == "failed" and says in r.message, r.message


def test_the_fleet_is_heterogeneous_and_the_public_placement_spreads_over_racks(sol16):
    fleet = make_fleet(0, racks=6, nodes_per_rack=8)
    assert {n["gpu"] for n in fleet} == {"H100", "A100"} and len({n["free"] for n in fleet}) > 2
    placed = sol16["place_replicas"](fleet, 13, 8, "H100")
    assert len(set(placed)) == 13 and CHECKS._fullest_rack(fleet, placed) == 3


# --- benchmark design and the CI gate ---------------------------------------------------------------------------

def _gate_single_run(baseline, candidate):
    """Decides on whatever runs there are: one candidate run against the baseline's noise."""
    out = {}
    for sku, runs in candidate.items():
        b = torch.tensor(baseline[sku], dtype=torch.float64) if sku in baseline else None
        if b is None:
            out[sku] = "no_baseline"
            continue
        slower = sum(runs) / len(runs) - float(b.mean())
        out[sku] = "regression" if slower > 3 * float(b.std()) / math.sqrt(len(b)) else "pass"
    return out


def _gate_fixed_5_percent(baseline, candidate):
    out = {}
    for sku, runs in candidate.items():
        if len(baseline.get(sku, [])) < 5:
            out[sku] = "no_baseline"
        elif len(runs) < 5:
            out[sku] = "rerun"
        else:
            b = sum(baseline[sku]) / len(baseline[sku])
            out[sku] = "regression" if sum(runs) / len(runs) > 1.05 * b else "pass"
    return out


def _gate_pooled_over_skus(baseline, candidate):
    pooled = [t for runs in baseline.values() for t in runs]  # one baseline for every SKU
    out = {}
    for sku, runs in candidate.items():
        if len(runs) < 5:
            out[sku] = "rerun"
            continue
        b, c = torch.tensor(pooled, dtype=torch.float64), torch.tensor(runs, dtype=torch.float64)
        slower = float(c.mean() - b.mean())
        noise = 3 * math.sqrt(float(b.var()) / len(b) + float(c.var()) / len(c))
        out[sku] = "regression" if slower > noise and slower > 0.01 * float(b.mean()) else "pass"
    return out


@pytest.mark.parametrize("fn, says", [(_gate_single_run, "one run is noise"),
                                      (_gate_fixed_5_percent, "a fixed 5% threshold"),
                                      (_gate_pooled_over_skus, "its own baseline")])
def test_a_wrong_ci_gate_is_named(sol16, fn, says):
    r = grade(STEM, "ci_gate", with_answer(sol16, ci_gate=fn))
    assert r.status == "failed" and any(says in c.message for c in r.cases), r.message


def test_a_fixed_threshold_fails_both_ways(sol16):
    r = grade(STEM, "ci_gate", with_answer(sol16, ci_gate=_gate_fixed_5_percent))
    assert {"a real regression on a quiet SKU", "a shift within a noisy SKU's noise"} <= set(rules_failed(r))


def test_a_benchmark_review_that_misses_a_rule_is_named(sol16):
    def lenient(design):  # checks the stages but trusts any report
        return [p for p in sol16["benchmark_problems"](design) if p != "repeats_with_ci"]
    r = grade(STEM, "benchmark_design", with_answer(sol16, benchmark_problems=lenient))
    assert r.status == "failed" and "It misses: repeats_with_ci" in r.message, r.message


def test_an_unfair_design_of_your_own_fails(sol16):
    def fair_benchmark(cpu_cores):
        return dict(sol16["fair_benchmark"](cpu_cores), timed=["compute"], cpu_threads=1)
    r = grade(STEM, "benchmark_design", with_answer(sol16, fair_benchmark=fair_benchmark))
    assert r.status == "failed" and "breaks ['end_to_end', 'tuned_baseline']" in r.message, r.message



def test_the_bound_needs_299_samples_and_is_the_maximum_of_300(sol16):
    """1 - 0.99^n >= 0.95 first holds at n = 299: below it no sample bounds the p99; at 300 only the maximum does."""
    xs = [float(i) for i in range(1, 2001)]
    assert sol16["p99_upper_bound"](xs[:298]) == math.inf == CHECKS.ref_p99_upper_bound(xs[:298])[0]
    assert sol16["p99_upper_bound"](xs[:299]) == 299.0 and sol16["p99_upper_bound"](xs[:300]) == 300.0
    assert 1980 < sol16["p99_upper_bound"](xs) == CHECKS.ref_p99_upper_bound(xs)[0] < 2000
