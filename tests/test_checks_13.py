"""Lab 13's checks: the solution passes; off-by-one GPipe slots, a 1F1B that runs a backward before its
forward or holds m activations, validators missing a rule, a wrong bubble or peak count, pipeline
runners that drop gradients, ignore the schedule, forget the 1/m or hang, interleaved schedules that
break a dependency, put two steps on a device, confuse the placement, do not interleave, warm up once
too often or drop microbatches, and wrong message counts are all rejected."""
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.schedules import Step
from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

# Wrong runners defined here are shipped to the ranks by value (the ranks need not import this file).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEM = "13_pipeline_parallel"
CHECKS = load_lab(STEM)


@pytest.fixture(scope="module")
def sol13():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["gpipe_schedule", "validate_schedule", "one_f_one_b_schedule",
                                 "bubble_fraction", "peak_activations", "pipeline_run", "interleaved_schedule",
                                 "p2p_sends"])
def test_solution_passes_public_and_hidden_cases(sol13, eid):
    result = grade(STEM, eid, sol13)
    assert result.status == "passed", result.message


def test_references_agree_with_the_formulas():
    for p in range(1, 7):
        for m in range(1, 13):
            for make in (CHECKS.ref_gpipe, CHECKS.ref_1f1b):
                sched = make(p, m)
                assert CHECKS.violations(sched, p, m) == []
                assert len(sched) == 2 * (m + p - 1)
                assert CHECKS.ref_bubble(sched, p) == pytest.approx((p - 1) / (m + p - 1))
            assert CHECKS.ref_peaks(CHECKS.ref_gpipe(p, m), p) == [m] * p
            assert CHECKS.ref_peaks(CHECKS.ref_1f1b(p, m), p) == [min(p - s, m) for s in range(p)]


def test_interleaved_reference_agrees_with_the_formulas():
    for p in range(1, 6):
        for v in range(1, 5):
            for m in (p, 2 * p, 3 * p):
                sched = CHECKS.ref_interleaved(p, m, v)
                assert CHECKS.violations(sched, p, m, v) == []
                assert len(sched) == 2 * (v * m + p - 1)
                assert CHECKS.ref_bubble(sched, p) == pytest.approx((p - 1) / (v * m + p - 1))
                assert CHECKS.ref_peaks(sched, p) == [v * p - d for d in range(p)]
                assert CHECKS.ref_sends(sched, p) == (2 * m * (p * v - 1) if p > 1 else 0)
                if v == 1:
                    assert sched == CHECKS.ref_1f1b(p, m)


# --- generators -------------------------------------------------------------------------------------

def _gpipe_forwards_one_slot_late(p, m):
    sched = [[] for _ in range(2 * (m + p - 1) + 1)]
    for s in range(p):
        for i in range(m):
            sched[s + i + 1].append(Step(s, i, "F"))  # BUG: the first forward waits one slot
            sched[(m + p) + (p - 1 - s) + i].append(Step(s, i, "B"))
    return sched


def _gpipe_backwards_one_slot_early(p, m):
    sched = [[] for _ in range(2 * (m + p - 1))]
    for s in range(p):
        for i in range(m):
            sched[s + i].append(Step(s, i, "F"))
            sched[(m + p - 2) + (p - 1 - s) + i].append(Step(s, i, "B"))  # BUG: starts during the last forward
    return sched


def test_gpipe_off_by_one_slots_are_rejected(sol13):
    r = grade(STEM, "gpipe_schedule", with_answer(sol13, gpipe_schedule=_gpipe_forwards_one_slot_late))
    assert r.status == "failed" and "2(m + p - 1)" in r.message and "off-by-one" in r.message
    r = grade(STEM, "gpipe_schedule", with_answer(sol13, gpipe_schedule=_gpipe_backwards_one_slot_early))
    assert r.status == "failed" and "not valid" in r.message


def test_interleaved_f_and_b_is_not_gpipe(sol13):
    r = grade(STEM, "gpipe_schedule", with_answer(sol13, gpipe_schedule=sol13["one_f_one_b_schedule"]),
              hidden=False)
    assert r.status == "failed" and "all forwards, then all backwards" in r.message


def test_1f1b_with_a_backward_before_its_forward_is_invalid(sol13):
    real = sol13["one_f_one_b_schedule"]

    def one_f_one_b_schedule(p, m):  # BUG: the last stage runs "1B1F": each backward before its forward
        sched = [[tuple(x) for x in slot] for slot in real(p, m)]
        where = {x: (t, j) for t, slot in enumerate(sched) for j, x in enumerate(slot)}
        for i in range(m):
            (tf, jf), (tb, jb) = where[(p - 1, i, "F")], where[(p - 1, i, "B")]
            sched[tf][jf], sched[tb][jb] = (p - 1, i, "B"), (p - 1, i, "F")
        return sched

    r = grade(STEM, "one_f_one_b_schedule", with_answer(sol13, one_f_one_b_schedule=one_f_one_b_schedule))
    assert r.status == "failed" and "not valid" in r.message and "runs before F(" in r.message
    assert r.score == 0


def test_gpipe_passed_off_as_1f1b_breaks_the_activation_bound(sol13):
    r = grade(STEM, "one_f_one_b_schedule", with_answer(sol13, one_f_one_b_schedule=sol13["gpipe_schedule"]))
    assert r.status == "failed" and "holds at most" in r.message and "p = 2 instead of m = 4" in r.message


def test_1f1b_with_one_warmup_forward_too_many_is_rejected(sol13):
    def one_f_one_b_schedule(p, m):
        orders = []
        for s in range(p):
            w = min(p - s, m)  # BUG: p - s warm-up forwards instead of p - s - 1
            order = [(s, i, "F") for i in range(w)]
            for j in range(m - w):
                order += [(s, w + j, "F"), (s, j, "B")]
            order += [(s, j, "B") for j in range(m - w, m)]
            orders.append(order)
        return CHECKS.place(orders, p)

    r = grade(STEM, "one_f_one_b_schedule", with_answer(sol13, one_f_one_b_schedule=one_f_one_b_schedule))
    assert r.status == "failed" and "holds at most" in r.message


# --- validator --------------------------------------------------------------------------------------

def _validator(skip: str = "", first_seen_wins: bool = False, message: str | None = None, same_slot_ok: bool = False,
               by_stage: bool = False):
    """The solution's rules, with one left out (``skip``) or another flaw."""
    def validate_schedule(schedule, p, m, v=1):
        def fail(text):
            raise ValueError(message or text)
        slot_of = {}
        for t, slot in enumerate(schedule):
            on_device = {}
            for s, i, k in slot:
                if k not in ("F", "B") or not 0 <= s < p * v or not 0 <= i < m:
                    fail(f"slot {t}: {k}({s}, {i}) is outside the pipeline")
                d = s if by_stage else s % p  # BUG if by_stage: two chunks of one device may share a slot
                if d in on_device and skip != "collision":
                    fail(f"slot {t}: device {d} runs {on_device[d]} and {k}({s}, {i})")
                on_device[d] = f"{k}({s}, {i})"
                if first_seen_wins:
                    slot_of.setdefault((s, i, k), t)  # BUG: a repeated step is silently ignored
                elif (s, i, k) in slot_of:
                    fail(f"{k}({s}, {i}) twice")
                else:
                    slot_of[(s, i, k)] = t
        if skip != "missing":
            for s in range(p * v):
                for i in range(m):
                    for k in "FB":
                        if (s, i, k) not in slot_of:
                            fail(f"{k}({s}, {i}) never runs")
        for (s, i, k), t in slot_of.items():
            needs = []
            if k == "F" and s > 0 and skip != "stage":
                needs.append((s - 1, i, "F"))
            if k == "B" and skip != "forward":
                needs.append((s, i, "F"))
            if k == "B" and s < p * v - 1 and skip != "stage":
                needs.append((s + 1, i, "B"))
            for d in needs:
                if d in slot_of and (slot_of[d] > t if same_slot_ok else slot_of[d] >= t):  # BUG if same_slot_ok
                    fail(f"{k}({s}, {i}) runs before {d[2]}({d[0]}, {d[1]})")
    return validate_schedule


_STAGE_RULES = ["a forward in the same slot as the forward it needs", "a forward before the forward it needs",
                "a backward in the same slot as the backward it needs", "a backward before the backward it needs"]


@pytest.mark.parametrize("skip, rules", [
    ("forward", ["backward before its forward"]),
    ("collision", ["two steps on one stage in one slot", "two chunks on one device in one slot"]),
    ("missing", ["a missing step"]), ("stage", _STAGE_RULES + ["a chunk's forward before the previous chunk's"])])
def test_a_validator_missing_one_rule_accepts_that_invalid_schedule(sol13, skip, rules):
    ex = exercises(STEM)["validate_schedule"]
    for seed in (None, 1, 2, 3):  # the public cases, and every hidden set
        cases = ex.cases() if seed is None else ex.cases(seed, public=False)
        r = evaluate(ex, with_answer(sol13, validate_schedule=_validator(skip)), "cpu", cases)
        assert r.status == "failed", r.message
        failed = [case for case, c in zip(cases, r.cases) if c.status != "passed"]
        assert sorted(rule for case in failed for rule in CHECKS.case_rules(case)) == sorted(rules), \
            [c.name for c in failed]
        assert all("accepted an invalid schedule" in c.message for c in r.cases if c.status != "passed")


def test_a_validator_allowing_a_dependency_in_the_same_slot_fails_on_every_seed(sol13):
    ex = exercises(STEM)["validate_schedule"]
    same_slot = [r for r in _STAGE_RULES if "same slot" in r]
    for seed in (None, 1, 2, 3, 4, 5):
        cases = ex.cases() if seed is None else ex.cases(seed, public=False)
        r = evaluate(ex, with_answer(sol13, validate_schedule=_validator(same_slot_ok=True)), "cpu", cases)
        failed = [rule for case, c in zip(cases, r.cases) if c.status != "passed" for rule in CHECKS.case_rules(case)]
        assert sorted(failed) == sorted(same_slot), failed
        assert "accepted an invalid schedule" in r.message and "runs before" in r.message


def test_a_validator_checking_collisions_per_virtual_stage_accepts_two_chunks_on_one_device(sol13):
    ex = exercises(STEM)["validate_schedule"]
    for seed in (None, 1, 2):
        cases = ex.cases() if seed is None else ex.cases(seed, public=False)
        r = evaluate(ex, with_answer(sol13, validate_schedule=_validator(by_stage=True)), "cpu", cases)
        failed = [(case, c) for case, c in zip(cases, r.cases) if c.status != "passed"]
        assert [CHECKS.case_rules(case) for case, _ in failed] == [["two chunks on one device in one slot"]], \
            [c.name for _, c in failed]
        assert "device" in failed[0][1].message and "runs two steps" in failed[0][1].message


def test_a_validator_without_v_rejects_a_valid_interleaved_schedule(sol13):
    plain = _validator()
    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=lambda s, p, m: plain(s, p, m)),
              hidden=False)
    assert r.status == "failed" and any("this schedule is valid (interleaved" in c.message for c in r.cases)


def test_a_validator_accepting_duplicate_steps_fails(sol13):
    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=_validator(first_seen_wins=True)),
              hidden=False)
    assert r.status == "failed" and "accepted an invalid schedule (a duplicated step)" in r.message


def test_a_validator_that_accepts_everything_scores_zero(sol13):
    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=lambda schedule, p, m: None))
    assert r.status == "failed" and r.score == 0


def test_validator_cases_are_neutral_and_break_every_rule_on_every_seed():
    """A case holds schedules and sizes only, named by neither verdict nor rule; the judge reads the rules off
    the schedules, and every hidden set breaks each rule once (beside all-valid cases)."""
    ex = exercises(STEM)["validate_schedule"]
    every_rule = sorted(CHECKS._MUTATIONS + CHECKS._INTERLEAVED_MUTATIONS)
    for seed in (None, 1, 2, 3, 20261122):
        cases = ex.cases() if seed is None else ex.cases(seed, public=False)
        assert all(set(c.inputs) == {"schedules", "p", "m", "v"} and len(c.inputs["schedules"]) == 2 for c in cases)
        assert all(c.name.startswith("schedules ") and "valid" not in c.name for c in cases)
        assert sorted(rule for c in cases for rule in CHECKS.case_rules(c)) == every_rule
        assert sum(not CHECKS.case_rules(c) for c in cases) == 3


def test_a_validator_that_checks_no_rule_but_reads_its_case_scores_almost_nothing(sol13):
    """Checks nothing; finds its case through the caller's frames and rejects the longer of its two schedules,
    naming every step (invalid schedules are often longer): the valid companion is often longer still."""
    def validate_schedule(schedule, p, m, v=1):
        case = None
        f = sys._getframe(1)
        while f is not None:
            if hasattr(f.f_locals.get("case"), "inputs"):
                case = f.f_locals["case"]
                break
            f = f.f_back
        steps = [tuple(x) for slot in schedule for x in slot]
        others = [[tuple(x) for slot in s for x in slot] for s in case.inputs["schedules"]] if case else [steps]
        if len(steps) == max(len(o) for o in others) and any(len(o) != len(steps) for o in others):
            raise ValueError(" ".join(f"{k}({s}, {i})" for s, i, k in steps))

    ex = exercises(STEM)["validate_schedule"]
    cases = ex.cases() + ex.cases(1, public=False) + ex.cases(2, public=False)
    r = evaluate(ex, with_answer(sol13, validate_schedule=validate_schedule), "cpu", cases)
    assert r.status == "failed" and r.score == 0, r.score


def test_a_rejection_listing_every_step_does_not_name_the_offending_one(sol13):
    real = sol13["validate_schedule"]

    def validate_schedule(schedule, p, m, v=1):
        try:
            real(schedule, p, m, v)
        except ValueError:  # BUG: the message lists the whole schedule
            raise ValueError("invalid: " + " ".join(f"{k}({s}, {i})" for slot in schedule for s, i, k in slot))

    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=validate_schedule), hidden=False)
    assert r.status == "failed" and "steps that break no rule" in r.message, r.message


def test_a_validator_that_rejects_everything_scores_zero(sol13):
    def validate_schedule(schedule, p, m):
        raise ValueError("invalid: " + " ".join(f"{k}({s}, {i})" for slot in schedule for s, i, k in slot))
    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=validate_schedule))
    assert r.status == "failed" and r.score == 0 and "this schedule is valid" in r.message


def test_a_message_that_names_no_step_is_not_clear_enough(sol13):
    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=_validator(message="invalid schedule")),
              hidden=False)
    assert r.status == "failed" and "does not name the offending step" in r.message


def test_rejecting_an_idle_slot_rejects_a_valid_schedule(sol13):
    real = sol13["validate_schedule"]

    def validate_schedule(schedule, p, m):
        if any(len(slot) == 0 for slot in schedule):
            raise ValueError("empty slot")  # BUG: idle slots are allowed
        real(schedule, p, m)

    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=validate_schedule), hidden=False)
    assert r.status == "failed" and "this schedule is valid" in r.message


def test_a_validator_crashing_with_key_error_is_not_a_clean_rejection(sol13):
    def validate_schedule(schedule, p, m):
        slot_of = {tuple(x): t for t, slot in enumerate(schedule) for x in slot}
        for (s, i, k), t in slot_of.items():
            if k == "F" and slot_of[(s, i, "B")] <= t:  # KeyError when B(s, i) is missing
                raise ValueError(f"B({s}, {i}) before F({s}, {i})")

    r = grade(STEM, "validate_schedule", with_answer(sol13, validate_schedule=validate_schedule), hidden=False)
    crashed = [c for c in r.cases if "should raise ValueError" in c.message]
    assert r.status == "failed" and crashed and "KeyError" in crashed[0].message


# --- bubble and peaks -------------------------------------------------------------------------------

def test_a_wrong_bubble_formula_is_rejected(sol13):
    r = grade(STEM, "bubble_fraction", with_answer(sol13, bubble_formula=lambda p, m, v=1: (p - 1) / m if m else 0.0))
    assert r.status == "failed" and "(p-1)/(m+p-1)" in r.message


def test_a_bubble_counting_only_fully_idle_slots_is_rejected(sol13):
    def bubble_fraction(schedule, p):  # BUG: a slot counts as bubble only when every stage idles
        return sum(1 for slot in schedule if not slot) / len(schedule)
    r = grade(STEM, "bubble_fraction", with_answer(sol13, bubble_fraction=bubble_fraction))
    assert r.status == "failed" and "idle stage-slots" in r.message


def test_a_bubble_formula_without_v_is_rejected_on_interleaved_schedules(sol13):
    r = grade(STEM, "bubble_fraction", with_answer(sol13, bubble_formula=lambda p, m, v=1: (p - 1) / (m + p - 1)))
    assert r.status == "failed" and "plain 1F1B value: use v" in r.message
    assert [c.name for c in r.cases if c.status != "passed"] == [c.name for c in r.cases if "interleaved" in c.name]


def test_a_bubble_formula_taken_from_the_course_helpers_is_rejected(sol13):
    from gpulab.planning import bubble_fraction  # lab 16's model of (p-1)/(m+p-1)
    r = grade(STEM, "bubble_fraction", with_answer(sol13, bubble_formula=bubble_fraction))
    assert r.status == "failed" and "gpulab.planning.bubble_fraction, a course helper" in r.message, r.message


def test_peak_activations_per_virtual_stage_is_rejected(sol13):
    def peak_activations(schedule, p):  # BUG: one count per (virtual) stage, not per device
        n = 1 + max(s for slot in schedule for s, _, _ in slot)
        live, peak = [0] * n, [0] * n
        for slot in schedule:
            for s, _, k in slot:
                live[s] += 1 if k == "F" else -1
                peak[s] = max(peak[s], live[s])
        return peak
    r = grade(STEM, "peak_activations", with_answer(sol13, peak_activations=peak_activations), hidden=False)
    assert r.status == "failed" and "count per device" in r.message and "interleaved" in r.message


def test_peak_activations_counted_as_m_fails_on_1f1b(sol13):
    def peak_activations(schedule, p):  # BUG: every forward counted, no backward ever frees one
        return [sum(1 for slot in schedule for s, _, k in slot if s == st and k == "F") for st in range(p)]
    r = grade(STEM, "peak_activations", with_answer(sol13, peak_activations=peak_activations))
    assert r.status == "failed" and "stage 0 holds at most p" in r.message
    assert any(c.name.startswith("GPipe") and c.status == "passed" for c in r.cases)  # right for GPipe


# --- the pipeline across ranks ----------------------------------------------------------------------

def _first_case(ns):
    """Only the first public case (2 ranks: GPipe m=3, then 1F1B m=4): one launch."""
    ex = exercises(STEM)["pipeline_run"]
    return evaluate(ex, ns, "cpu", ex.cases()[:1])


def _runner(bug: str):
    """The solution's runner with one bug."""
    def run_stage(stage, schedule, microbatches, targets, hidden, process_group=None):
        group = dist.group.WORLD if bug == "ignores its group" else process_group or dist.group.WORLD
        rank, p = dist.get_rank(group), dist.get_world_size(group)

        def peer(s):  # BUG (group ranks as global): a neighbour's rank in the group taken for its global rank
            return s if bug == "group ranks as global" else dist.get_global_rank(group, s)
        where = {} if bug == "no device" else {"device": microbatches[0].device}  # BUG (no device): torch's default
        m = len(microbatches)
        ins, outs, losses, pending = {}, {}, [0.0] * m, []
        steps = [(s, i, k) for slot in schedule for s, i, k in slot if s == rank]
        if bug == "gpipe order":  # BUG: ignores the schedule, always all forwards first
            steps = sorted(steps, key=lambda x: (x[2] == "B", x[1]))
        for s, i, k in steps:
            if k == "F":
                if rank == 0:
                    x = microbatches[i]
                else:
                    x = torch.empty(microbatches[i].shape[0], hidden, **where)
                    dist.recv(x, src=peer(rank - 1))
                    x.requires_grad_()
                out = stage(x)
                if rank == p - 1:
                    loss = F.mse_loss(out, targets[i])
                    losses[i] = loss.item()
                    out = loss if bug == "no 1/m" else loss / m  # BUG (no 1/m): gradients m times too large
                elif bug == "blocking send":
                    dist.send(out.detach(), dst=peer(rank + 1))  # BUG: blocks while the neighbour sends to us
                else:
                    pending.append((dist.isend(out.detach(), dst=peer(rank + 1)), out))
                ins[i], outs[i] = x, out
            else:
                out, x = outs.pop(i), ins.pop(i)
                if rank == p - 1:
                    out.backward()
                elif bug == "no grad sent":
                    continue  # BUG: the last stage never sends x.grad back, so earlier stages never backprop
                else:
                    g = torch.empty_like(out)
                    dist.recv(g, src=peer(rank + 1))
                    out.backward(g)
                if bug == "last stage keeps its gradient" and rank == p - 1:
                    continue  # BUG: stage p-2 waits in dist.recv for a gradient that never comes
                if rank > 0 and bug != "no grad sent":
                    if bug == "blocking send":
                        dist.send(x.grad, dst=peer(rank - 1))
                    else:
                        pending.append((dist.isend(x.grad, dst=peer(rank - 1)), x.grad))
        for h, _ in pending:
            h.wait()
        return losses if rank == p - 1 else []
    return run_stage


def test_a_runner_that_never_sends_gradients_back_leaves_earlier_stages_without_grads(sol13):
    r = _first_case(with_answer(sol13, run_stage=_runner("no grad sent")))
    assert r.status == "failed" and "stage 0" in r.message and "is None" in r.message
    assert "send the gradient of its input" in r.message


def test_a_runner_that_ignores_the_schedule_is_caught(sol13):
    r = _first_case(with_answer(sol13, run_stage=_runner("gpipe order")))
    assert r.status == "failed" and "1F1B m=4" in r.message and "the schedule says" in r.message


def test_a_runner_without_the_1_over_m_has_gradients_m_times_too_large(sol13):
    r = _first_case(with_answer(sol13, run_stage=_runner("no 1/m")))
    assert r.status == "failed" and "m times too large" in r.message


def test_blocking_sends_hang_1f1b_and_end_within_the_timeout_with_a_clear_message(sol13, monkeypatch):
    monkeypatch.setattr(CHECKS.RUN, "LAUNCH_TIMEOUT_S", 6.0)
    start = time.monotonic()
    r = _first_case(with_answer(sol13, run_stage=_runner("blocking send")))
    assert time.monotonic() - start < 6.0 + 40
    assert r.status == "failed" and "hung" in r.message and "dist.isend" in r.message


def test_a_stage_waiting_for_a_gradient_that_is_never_sent_ends_with_a_clear_message(sol13, monkeypatch):
    monkeypatch.setattr(CHECKS.RUN, "LAUNCH_TIMEOUT_S", 6.0)
    start = time.monotonic()
    r = _first_case(with_answer(sol13, run_stage=_runner("last stage keeps its gradient")))
    assert time.monotonic() - start < 6.0 + 40
    assert r.status == "failed" and "hung" in r.message and "never came" in r.message



def _group_case():
    """The public case whose runs are followed by two pipelines over sub-groups [[0, 2], [1, 3]] (one launch)."""
    ex = exercises(STEM)["pipeline_run"]
    return ex, [c for c in ex.cases() if c.inputs.get("groups")]


def test_the_check_runs_pipelines_over_sub_groups_on_every_seed():
    ex = exercises(STEM)["pipeline_run"]
    for seed in (None, 1, 2, 3):
        cases = ex.cases() if seed is None else ex.cases(seed, public=False)
        groups = [c.inputs["groups"] for c in cases if c.inputs.get("groups")]
        assert len(groups) == 1 and sorted(sum(groups[0], [])) == [0, 1, 2, 3] and groups[0][0] != [0, 1]


@pytest.mark.parametrize("bug", ["ignores its group", "group ranks as global"])
def test_a_runner_that_ignores_its_process_group_fails(sol13, monkeypatch, bug):
    """Stage and neighbours taken from the whole world, or a neighbour's group rank used as a global rank: the
    sub-groups' pipelines talk across groups (wrong shapes, or a hang)."""
    monkeypatch.setattr(CHECKS.RUN, "LAUNCH_TIMEOUT_S", 6.0)
    ex, cases = _group_case()
    r = evaluate(ex, with_answer(sol13, run_stage=_runner(bug)), "cpu", cases)
    assert r.status == "failed" and "process_group" in r.message and "dist.get_global_rank" in r.message, r.message


def test_a_runner_whose_receive_buffer_ignores_the_tensors_device_fails(sol13):
    """torch.empty(B, hidden) without device=: right on a CPU, a device mismatch beside CUDA tensors on a GPU; the
    check's sub-group pipelines run with torch's default device elsewhere, so it fails here too."""
    ex, cases = _group_case()
    r = evaluate(ex, with_answer(sol13, run_stage=_runner("no device")), "cpu", cases)
    assert r.status == "failed" and "device=microbatches[i].device" in r.message, r.message
    r = evaluate(ex, with_answer(sol13, run_stage=_runner("")), "cpu", cases)  # the same runner with device=
    assert r.status == "passed", r.message


def test_a_runner_that_computes_nothing_scores_zero(sol13):
    r = _first_case(with_answer(sol13, run_stage=lambda stage, schedule, microbatches, targets, hidden: []))
    assert r.status == "failed" and r.score == 0 and "list of the m = 3 microbatch losses" in r.message


# --- interleaved 1F1B ---------------------------------------------------------------------------------

def _interleaved_from(step_of=None, warmup=None, total=None, deps_across_chunks=True, check_m=True):
    """The solution's interleaved_schedule with one piece changed: ``step_of(d, k, kind, p, v)`` (which
    Step is device d's k-th op), ``warmup(d, p, v)``, ``total(m, v, p)`` (ops of each kind per device), a
    placement that ignores the dependency across chunks, or m rounded down to a multiple of p."""
    def interleaved_schedule(p, m, v):
        if check_m and m % p:
            raise ValueError("m must be a multiple of p")
        m -= m % p  # (without the check: silently drops the last m % p microbatches)

        def step(d, k, kind):
            if step_of is not None:
                return step_of(d, k, kind, p, v)
            group, c, j = k // (p * v), (k // p) % v, k % p
            return Step((c if kind == "F" else v - 1 - c) * p + d, group * p + j, kind)

        n_ops = v * m if total is None else total(m, v, p)
        orders = []
        for d in range(p):
            w = min((p - d - 1) + (v - 1) * p if warmup is None else warmup(d, p, v), n_ops)
            order = [step(d, k, "F") for k in range(w)]
            for k in range(n_ops - w):
                order += [step(d, w + k, "F"), step(d, k, "B")]
            order += [step(d, k, "B") for k in range(n_ops - w, n_ops)]
            orders.append(order)
        if deps_across_chunks:
            return CHECKS.place(orders, p, v)
        # BUG: chunk c > 0 of device 0 starts without waiting for chunk c - 1 of device p - 1
        done, pos, sched = {}, [0] * p, []
        while any(pos[d] < len(orders[d]) for d in range(p)):
            t = len(sched)
            slot = []
            for d in range(p):
                if pos[d] < len(orders[d]):
                    x = orders[d][pos[d]]
                    needs = [y for y in CHECKS.deps(x, p * v) if not (x[2] == "F" and x[0] % p == 0)]
                    if all(y in done and done[y] < t for y in needs):
                        slot.append(x)
            for x in slot:
                done[x] = t
                pos[x[0] % p] += 1
            sched.append(slot)
        return sched
    return interleaved_schedule


def _grade_interleaved(sol13, fn, hidden=False):
    return grade(STEM, "interleaved_schedule", with_answer(sol13, interleaved_schedule=fn), hidden=hidden)


def _messages(r):
    return " | ".join(c.message for c in r.cases if c.status != "passed")


def _depth_first(d, k, kind, p, v):
    """Device d's k-th op taking each microbatch through all of the device's chunks before the next one."""
    i, c = k // v, k % v
    return Step((c if kind == "F" else v - 1 - c) * p + d, i, kind)


def test_interleaved_forward_before_the_previous_chunks_is_a_dependency_violation(sol13):
    # BUG: depth-first orders, placed without waiting for the previous chunk on the last device
    r = _grade_interleaved(sol13, _interleaved_from(step_of=_depth_first, deps_across_chunks=False))
    assert r.status == "failed" and "not valid" in r.message and "runs before F(" in r.message
    assert "circles the devices v times" in _messages(r)


def test_a_deeper_1f1b_puts_two_steps_on_one_device(sol13):
    def interleaved_schedule(p, m, v):  # BUG: 1F1B over p v stages, as if each had a device of its own
        if m % p:
            raise ValueError("m must be a multiple of p")
        return sol13["one_f_one_b_schedule"](p * v, m)

    r = _grade_interleaved(sol13, interleaved_schedule)
    assert r.status == "failed" and "not valid" in r.message and "runs two steps" in r.message


def test_device_major_placement_is_diagnosed(sol13):
    real = _interleaved_from()

    def interleaved_schedule(p, m, v):  # BUG: the right timing, chunk c of device d written as stage d v + c
        sched = real(p, m, v)
        return [[Step((s % p) * v + s // p, i, k) for s, i, k in slot] for slot in sched]

    r = _grade_interleaved(sol13, interleaved_schedule)
    assert r.status == "failed" and "device-major" in r.message and "c*p + d" in r.message


def test_a_valid_schedule_that_does_not_interleave_has_too_large_a_bubble(sol13):
    def interleaved_schedule(p, m, v):  # BUG: 1F1B of the p v stages, each slot serialised per device
        if m % p:
            raise ValueError("m must be a multiple of p")
        out = []
        for slot in sol13["one_f_one_b_schedule"](p * v, m):
            by_device = {}
            for x in slot:
                by_device.setdefault(x[0] % p, []).append(x)
            for j in range(max(len(xs) for xs in by_device.values())):
                out.append([xs[j] for xs in by_device.values() if len(xs) > j])
        return out

    r = _grade_interleaved(sol13, interleaved_schedule)
    assert r.status == "failed" and "valid but takes" in r.message and "Is it interleaved?" in r.message
    assert "plain 1F1B: (p-1)/(m+p-1)" in r.message


def test_one_warmup_forward_too_many_breaks_the_memory_bound(sol13):
    r = _grade_interleaved(sol13, _interleaved_from(warmup=lambda d, p, v: (p - d) + (v - 1) * p))
    assert r.status == "failed" and "microbatch-chunks' activations at once" in r.message
    assert "v p - d" in r.message


def test_megatrons_doubled_warmup_costs_memory_here(sol13):
    r = _grade_interleaved(sol13, _interleaved_from(warmup=lambda d, p, v: 2 * (p - d - 1) + (v - 1) * p))
    assert r.status == "failed" and "only add memory" in r.message


def test_missing_microbatches_are_caught(sol13):
    # BUG: the group loop stops one group early: v (m - p) ops of each kind per device instead of v m
    r = _grade_interleaved(sol13, _interleaved_from(total=lambda m, v, p: v * (m - p)))
    assert r.status == "failed" and "never runs" in r.message and "every chunk on every microbatch" in r.message


def test_m_not_a_multiple_of_p_must_raise(sol13):
    r = _grade_interleaved(sol13, _interleaved_from(check_m=False), hidden=True)
    failed = [c for c in r.cases if c.status != "passed"]
    assert [c.name.split(":")[0] for c in failed] == ["m not a multiple of p"] * 2
    assert "Raise ValueError" in failed[0].message


def test_raising_for_a_good_m_is_rejected(sol13):
    def interleaved_schedule(p, m, v):
        raise ValueError("m must be a multiple of p")
    r = _grade_interleaved(sol13, interleaved_schedule)
    assert r.status == "failed" and "but m is a multiple of p" in r.message


# --- messages between devices ------------------------------------------------------------------------

def test_counting_every_boundary_ignores_chunks_on_one_device(sol13):
    def p2p_sends(schedule, p):  # BUG: a message at every stage boundary, even inside one device
        n = 1 + max(s for slot in schedule for s, _, _ in slot)
        return sum(1 for slot in schedule for s, _, k in slot if (s < n - 1 if k == "F" else s > 0))
    r = grade(STEM, "p2p_sends", with_answer(sol13, p2p_sends=p2p_sends))
    assert r.status == "failed" and "hand over in memory" in r.message
    assert all(c.name.startswith("one device") for c in r.cases if c.status != "passed")


def test_counting_forward_sends_only_is_half(sol13):
    def p2p_sends(schedule, p):  # BUG: the gradients going back are not counted
        n = 1 + max(s for slot in schedule for s, _, _ in slot)
        return sum(1 for slot in schedule for s, _, k in slot if k == "F" and s < n - 1 and (s + 1) % p != s % p)
    r = grade(STEM, "p2p_sends", with_answer(sol13, p2p_sends=p2p_sends), hidden=False)
    assert r.status == "failed" and "one direction only" in r.message


def test_counting_devices_instead_of_virtual_stages_misses_the_interleaved_messages(sol13):
    def p2p_sends(schedule, p):  # BUG: 2 m (p - 1), as in plain 1F1B
        m = 1 + max(i for slot in schedule for _, i, _ in slot)
        return 2 * m * (p - 1)
    r = grade(STEM, "p2p_sends", with_answer(sol13, p2p_sends=p2p_sends), hidden=False)
    assert r.status == "failed" and "plain 1F1B's 2 m (p - 1)" in r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set ------------------------

def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM)  # the pipeline's stub raises in the probe: no rank starts



@pytest.mark.parametrize("eid", [e for e in exercises(STEM) if e != "pipeline_run"])  # ranks: the test above
def test_answers_that_compute_nothing_score_zero(eid):
    ex = exercises(STEM)[eid]
    kit.assert_do_nothing_scores_zero(ex)


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid], ("random", "hidden"))
