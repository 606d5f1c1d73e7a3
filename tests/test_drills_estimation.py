"""The drills' checked estimation (gpulab.drills.estimation, gpulab.drills.units): at least 20 questions, each
computed by its formula from stated inputs, checked within its stated relative tolerance; every question passes its
own answer and fails the answers learners actually write when they slip: a factor of 2 either way, ms for s, bits for
bytes, a time for a size; GB for GiB passes or fails exactly as the question says."""
import math

import pytest

from gpulab import datasheet as ds
from gpulab import drills
from gpulab.drills.estimation import BY_ESTIMATE, ESTIMATES, EstimateRun, check_answer, human
from gpulab.drills.units import UNITS, parse_quantity

BASE = {"B": "B", "s": "s", "FLOP/B": "FLOP/B", "1": "x", "B/s": "B/s", "tokens/s": "tokens/s"}
IDS = [e.qid for e in ESTIMATES]


class FakeClock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_there_are_at_least_20_questions_covering_the_napkin_math():
    assert len(ESTIMATES) >= 20 and len(BY_ESTIMATE) == len(ESTIMATES)
    topics = " ".join(e.qid for e in ESTIMATES)
    for needed in ("KV-TOKEN", "KV-SEQ", "DECODE", "AR-NVLINK", "AR-IB", "ZERO-DDP", "ZERO-1", "ZERO-3", "BUBBLE",
                   "MFU", "PCIE", "GPU-MTBF", "YOUNG-DALY", "GEMM-AI", "RIDGE", "FLASH", "INT8", "TP-BYTES"):
        assert needed in topics, needed


@pytest.mark.parametrize("qid", IDS)
def test_each_answer_is_its_formula_over_its_stated_inputs(qid):
    e = BY_ESTIMATE[qid]
    names = {g.name for g in e.givens}
    used = set(__import__("re").findall(r"\b[a-z_][a-z0-9_]*\b", e.formula)) - {"sqrt"}
    assert used == names, f"{qid}: the formula uses {used}, the question states {names}"
    for g in e.givens:
        assert "{" + g.name + "}" in e.text, f"{qid}: input {g.name} is not stated in the question"
    assert math.isfinite(e.value) and e.value > 0
    assert 0 < e.tol < 0.5, "a factor of 2 must fail"
    assert f"±{e.tol:.0%}" in e.prompt()
    solution = e.solution()
    assert e.formula in solution and human(e.value, e.unit) in solution


@pytest.mark.parametrize("qid", IDS)
def test_the_exact_answer_passes_and_a_factor_of_two_fails(qid):
    e = BY_ESTIMATE[qid]
    assert check_answer(e, f"{e.answer!r} {e.unit}").ok
    assert check_answer(e, f"{e.answer!r}").ok  # a bare number is read in the question's unit
    assert check_answer(e, f"{e.value:.4e} {BASE[UNITS[e.unit][0]]}").ok  # base units, scientific notation
    for wrong in (2 * e.answer, e.answer / 2):
        verdict = check_answer(e, f"{wrong!r} {e.unit}")
        assert not verdict.ok and "not within" in verdict.message, (qid, wrong)
        assert not check_answer(e, f"{wrong!r}").ok


@pytest.mark.parametrize("qid", IDS)
def test_unit_mistakes_fail_or_pass_as_the_question_states(qid):
    e = BY_ESTIMATE[qid]
    dimension = UNITS[e.unit][0]
    if dimension == "B":  # GB for GiB: within the tolerance or not, as the prompt says
        sibling = {"KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB"}
        sibling.update({v: k for k, v in sibling.items()})
        mixed = check_answer(e, f"{e.answer!r} {sibling[e.unit]}")
        inside = "inside the tolerance" in e.prompt()
        assert mixed.ok == inside and (inside or "outside the tolerance" in e.prompt()), qid
        bits = e.unit[:-1] + "b"  # Gb for GB: a factor of 8
        assert not check_answer(e, f"{e.answer!r} {bits}").ok, qid
        wrong_kind = check_answer(e, "3 ms")
        assert not wrong_kind.ok and "is a time" in wrong_kind.message and "a size in bytes" in wrong_kind.message
    if dimension == "s":  # the number right, the unit a thousand times off
        other = {"ms": "s", "us": "ms", "s": "ms", "min": "s", "h": "min"}[e.unit]
        assert not check_answer(e, f"{e.answer!r} {other}").ok, qid
        wrong_kind = check_answer(e, "12 GB")
        assert not wrong_kind.ok and "a size in bytes" in wrong_kind.message and "a time" in wrong_kind.message


def test_the_checker_reads_the_answers_learners_write():
    assert parse_quantity("208").number == 208 and parse_quantity("208").unit == ""
    assert (parse_quantity("208 GB").number, parse_quantity("208 GB").unit) == (208, "GB")
    assert parse_quantity("2.1e11").number == 2.1e11
    assert parse_quantity("1.5k").number == 1500
    assert parse_quantity("3 ms").to("s") == pytest.approx(3e-3)
    assert parse_quantity("400 Gb/s").to("GB/s") == pytest.approx(50)
    assert parse_quantity("1,024 KiB").to("B") == 2**20
    assert parse_quantity("~15x").number == 15
    with pytest.raises(ValueError, match="not understood"):
        parse_quantity("12 parsecs")
    with pytest.raises(ValueError, match="could not read"):
        parse_quantity("a lot")


def test_the_known_answers_of_the_brief():
    assert BY_ESTIMATE["E-ZERO-DDP"].answer == pytest.approx(208)  # 16 B/param, 13B -> 208 GB
    assert check_answer(BY_ESTIMATE["E-ZERO-DDP"], "208 GB").ok
    assert BY_ESTIMATE["E-RIDGE"].answer == pytest.approx(ds.H100_FP16_FLOPS / ds.H100_HBM_BYTES_PER_S)
    assert BY_ESTIMATE["E-BUBBLE"].answer == pytest.approx(100 * 7 / 39)
    assert BY_ESTIMATE["E-KV-TOKEN"].value == 2 * 32 * 32 * 128 * 2
    assert BY_ESTIMATE["E-GEMM-AI"].answer == pytest.approx(4096 / 3)
    # FSDP moves 1.5x DDP's bytes: three (p-1)/p collectives against DDP's two
    fsdp = BY_ESTIMATE["E-FSDP-BYTES"].value
    assert fsdp / (2 * 63 / 64 * 13e9 * 2) == pytest.approx(1.5)
    # the all-gather of one 13B unit at 400 Gb/s does not hide behind its forward compute
    assert BY_ESTIMATE["E-FSDP-GATHER"].value > 2 * BY_ESTIMATE["E-UNIT-COMPUTE"].value


def test_a_percentage_given_as_a_fraction_fails_with_a_hint():
    verdict = check_answer(BY_ESTIMATE["E-MFU"], "0.315")
    assert not verdict.ok and "a fraction?" in verdict.message
    assert check_answer(BY_ESTIMATE["E-MFU"], "0.315 x").ok  # a fraction written as one is converted


def test_a_slip_by_8_or_1000_is_named():
    e = BY_ESTIMATE["E-AR-IB"]
    assert "bits for bytes" in check_answer(e, f"{e.answer / 8!r} ms").message
    assert "unit's prefix" in check_answer(e, f"{e.answer!r} us").message


def test_the_timer_is_shown_never_judged(tmp_path):
    store = drills.DrillStore(tmp_path / "a.json")
    clock = FakeClock()
    run = EstimateRun("E-RIDGE", store, clock)
    run.start()
    clock.now += 100
    verdict = run.check("295 FLOP/B")
    assert verdict.ok and "over the 30 s target; not judged" in run.timer_note()
    assert store.get("E-RIDGE") | {"saved": None} == {"answer": "295 FLOP/B", "ok": True, "attempts": 1,
                                                     "seconds": 100.0, "saved": None}
    run.check("a lot")  # unreadable: not an attempt
    assert store.get("E-RIDGE")["attempts"] == 1


def test_the_estimation_widget_checks_shows_the_solution_and_restores(tmp_path):
    store = drills.DrillStore(tmp_path / "a.json")
    box = drills.estimation_widget(store, FakeClock(), ticking=False)
    parts = box.parts
    first = ESTIMATES[0]
    assert first.qid in parts["header"].value and parts["solution"].value == ""
    parts["answer"].value = f"{2 * first.answer!r} {first.unit}"
    parts["check"].click()
    assert "❌" in parts["verdict"].value and first.formula in parts["solution"].value
    parts["next"].click()
    assert ESTIMATES[1].qid in parts["header"].value and parts["answer"].value == ""
    parts["timed"].value = True
    parts["answer"].value = f"{ESTIMATES[1].answer!r}"
    parts["check"].click()
    assert "✅" in parts["verdict"].value and "not judged" in parts["verdict"].value
    again = drills.estimation_widget(store, FakeClock(), ticking=False)  # a restarted kernel
    assert "Saved answer" in again.parts["verdict"].value and again.parts["solution"].value
    data = again._repr_mimebundle_()
    data = data[0] if isinstance(data, tuple) else data
    assert f"2/{len(ESTIMATES)} answered, 1 right" in data["text/plain"]


def test_the_text_fallback_checks_and_prints_the_solution(tmp_path, capsys):
    store = drills.DrillStore(tmp_path / "a.json")
    assert drills.check_estimate("E-ZERO-3", "3.3 GB", store)
    out = capsys.readouterr().out
    assert "right" in out and "params * state_bytes / gpus" in out
    assert not drills.check_estimate("E-ZERO-3", "6.5 GB", store)
    drills.show_estimation()
    assert "check_estimate(" in capsys.readouterr().out
