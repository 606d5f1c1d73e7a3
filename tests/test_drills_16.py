"""The interview drills (gpulab.drills, notebooks/16_interview_drills.ipynb), driven without a browser: every
interview question has a drill, answers survive in the JSON store, the timer runs on an injected clock, the
rubric appears only when revealed and its ticks are saved, and the progress view counts what was drilled."""
import json
import re

import pytest
from ipywidgets import Textarea

from gpulab import drills
from gpulab.drills import BY_ID, FAMILIES, LAB_TITLES, QUESTIONS, Drill, DrillStore
from grader.notebooks import read_notebook
from tests.conftest import ROOT


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture()
def store(tmp_path):
    return DrillStore(tmp_path / "answers.json")


def test_every_interview_question_has_a_drill_with_a_rubric_and_labs():
    assert {q.family for q in QUESTIONS} == set(FAMILIES)
    assert len(BY_ID) == len(QUESTIONS)
    for q in QUESTIONS:
        assert q.minutes > 0 and len(q.rubric) >= 4 and q.labs, q.qid
        assert set(q.labs) <= set(LAB_TITLES), q.qid
    serving = " ".join(q.prompt for q in QUESTIONS if q.family == "Q-SERVE")
    for case in ("175B", "ResNet-152", "7B", "slower than expected"):
        assert case in serving


def test_every_linked_lab_exists_or_is_one_being_built():
    being_built = {"06_compile_and_graphs", "07_mixed_precision", "09_pruning_distillation", "15_gpu_algorithms"}
    lessons = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(LAB_TITLES) <= lessons | being_built


def test_the_drills_notebook_shows_every_drill_and_the_progress_view():
    nb = read_notebook(ROOT / "notebooks" / "16_interview_drills.ipynb")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for q in QUESTIONS:
        assert f'show_drill("{q.qid}")' in code
    assert "show_progress()" in code and "show_estimation()" in code and "show_project_story()" in code


def test_a_drill_times_saves_reveals_and_self_grades(store):
    clock = FakeClock()
    d = Drill("Q-SERVE-1", store, clock)
    assert d.timer_text().endswith("not started")
    d.start()
    clock.now += 65
    assert d.remaining() == pytest.approx(d.question.minutes * 60 - 65)
    assert d.timer_text() == f"{d.question.minutes - 2:02d}:55 left"
    d.save("TP=8 in a node; weights 175 GB in fp8; replicas from the simulation")
    clock.now += 30
    rubric = d.reveal()
    assert rubric == d.question.rubric
    clock.now += 500  # the clock stopped at the reveal
    assert d.elapsed() == pytest.approx(95)
    record = d.check([0, 2, 2, 99])  # duplicates and out-of-range indices are ignored
    assert record["checked"] == [0, 2] and record["score"] == f"2/{len(rubric)}"
    saved = json.loads(store.path.read_text())["Q-SERVE-1"]
    assert saved["answer"].startswith("TP=8") and saved["revealed"] and saved["elapsed_s"] == 95


def test_over_time_counts_down_past_zero(store):
    clock = FakeClock()
    d = Drill("Q-SERVE-3", store, clock)
    d.start()
    clock.now += d.question.minutes * 60 + 61
    assert d.timer_text() == "-01:01 over time"


def test_a_damaged_store_starts_afresh_and_an_unknown_drill_is_named(store):
    store.path.write_text("{not json")
    assert store.load() == {}
    with pytest.raises(KeyError, match="no drill 'Q-NOPE'"):
        Drill("Q-NOPE", store)


def test_the_widget_saves_the_answer_reveals_the_rubric_and_restores_it(store):
    clock = FakeClock()
    box = drills.drill_widget("Q-PAR-1", store, clock, ticking=False)
    parts = box.parts
    assert parts["rubric"].children == ()  # hidden until revealed
    parts["start"].click()
    assert "left" in parts["timer"].value
    parts["answer"].value = "TP splits matmuls; PP splits layers; bubble (p-1)/(m+p-1)"
    assert store.get("Q-PAR-1")["answer"].startswith("TP splits")
    clock.now += 120
    parts["reveal"].click()
    boxes = parts["rubric"].children[1:]
    assert [b.description for b in boxes] == list(BY_ID["Q-PAR-1"].rubric)
    boxes[0].value = boxes[2].value = True
    assert store.get("Q-PAR-1")["checked"] == [0, 2]
    again = drills.drill_widget("Q-PAR-1", store, clock, ticking=False)  # a new session: the answer is back
    assert again.parts["answer"].value.startswith("TP splits")


def test_the_progress_view_counts_what_was_drilled(store, capsys):
    Drill("Q-OPT-1", store, FakeClock()).save("quantization, pruning, distillation, fusion")
    rows = {r["qid"]: r for r in drills.progress_rows(store)}
    assert rows["Q-OPT-1"]["drilled"] and not rows["Q-HW-1"]["drilled"]
    drills.show_progress(store)
    assert f"drilled 1/{len(QUESTIONS)}" in capsys.readouterr().out


def test_outside_a_notebook_a_drill_prints_its_question(capsys):
    drills.show_drill("Q-MLOPS-1")
    out = capsys.readouterr().out
    assert "Q-MLOPS-1" in out and "16_capstone_design" in out


def test_a_later_session_keeps_the_time_the_drill_took(store):
    clock = FakeClock()
    d = Drill("Q-DIST-1", store, clock)
    d.start()
    clock.now += 600
    d.save("ZeRO-3: 16 bytes per parameter / 64")
    d.reveal()
    again = Drill("Q-DIST-1", store, clock)  # a new kernel: the learner edits the answer and reveals the rubric again
    again.save("ZeRO-3: 16 bytes per parameter / 64, plus activations")
    again.reveal()
    assert store.get("Q-DIST-1")["elapsed_s"] == 600 and store.get("Q-DIST-1")["answer"].endswith("activations")
    assert {r["qid"]: r for r in drills.progress_rows(store)}["Q-DIST-1"]["minutes"] == 10.0


# Drills 2.0: follow-ups after the first answer, calibration samples, the scenario drills, the project story.

SEED_SCENARIOS = {  # each seed scenario of the drills' brief -> its drill, and words its prompt must hold
    "streaming top-K, then multi-GPU": ("Q-HW-4", ("streaming top-K", "20 minutes", "8 GPUs")),
    "ANN recall high, multi-GPU latency slow": ("Q-SERVE-5", ("nearest-neighbour", "high recall", "multi-GPU latency")),
    "fair CPU vs multi-GPU GBDT benchmark": ("Q-HW-5", ("gradient-boosted trees", "CPU", "multiple GPUs", "fair")),
    "CI gating releases on performance thresholds": ("Q-MLOPS-3", ("CI", "gates releases", "performance thresholds")),
    "performance harness across A100, H100, multi-node": ("Q-MLOPS-4", ("A100", "H100", "multi-node")),
    "real-time video enhancement under strict latency": ("Q-SERVE-6", ("real-time video enhancement", "latency")),
    "mixed precision and convergence": ("Q-E2E-3", ("mixed precision", "convergence", "detect", "mitigate")),
    "data pipeline cutting host-device transfers": ("Q-HW-6", ("data pipeline", "host-device transfers")),
    "fault-tolerant serving, N+1, mixed 8-GPU nodes": ("Q-SERVE-7", ("fault-tolerant", "N+1", "8-GPU nodes")),
    "tell me about a project": ("Q-STORY-1", ("Tell me about a project", "baseline", "measure")),
}


def test_every_drill_has_follow_ups_and_a_strong_and_a_weak_sample():
    for q in QUESTIONS:
        assert 2 <= len(q.followups) <= 3, q.qid
        assert len(q.strong) >= 2 and q.weak and q.gap, q.qid
        assert len(" ".join(q.strong)) > 2 * len(q.weak), q.qid  # the strong one says more than the weak one
        strong = " ".join(q.strong)
        assert re.search(r"\d", strong) and "lab " in strong, f"{q.qid}: a strong answer has numbers and cites a lab"
        assert "lab " not in q.weak, f"{q.qid}: the weak answer shows the gap: no measurement"


def test_every_seed_scenario_maps_to_a_drill():
    for scenario, (qid, words) in SEED_SCENARIOS.items():
        assert qid in BY_ID, scenario
        for word in words:
            assert word.lower() in BY_ID[qid].prompt.lower(), (scenario, word)
    assert "lab 15, multi-GPU search" in " ".join(BY_ID["Q-SERVE-5"].rubric)


def test_q_dist_1_says_fsdp_moves_more_bytes_than_ddp():
    rubric = " ".join(BY_ID["Q-DIST-1"].rubric)
    assert "about 1.5x (extra all-gathers)" not in rubric  # read as cheaper than DDP
    assert "1.5x DDP's bytes" in rubric
    assert "reduce-scatter plus an all-gather" in rubric  # DDP's all-reduce, the 1x the 1.5x is measured against


def test_follow_ups_appear_only_after_the_first_answer_and_push_on_its_numbers(store):
    d = Drill("Q-SERVE-1", store, FakeClock())
    with pytest.raises(RuntimeError, match="submit your first answer"):
        d.followups()
    with pytest.raises(RuntimeError, match="submit your first answer"):
        d.samples()
    with pytest.raises(ValueError, match="write your answer first"):
        d.reveal()
    d.save("TP=8, 6 replicas, decode 6.5 ms per step, p99 494 ms in the simulation")
    d.reveal()
    followups = d.followups()
    assert "494 ms" in followups[0] and "[[" not in " ".join(followups)
    d.save_followup(1, "GQA with 8 KV heads: TP=16 replicates K and V")
    assert store.get("Q-SERVE-1")["followups"] == ["", "GQA with 8 KV heads: TP=16 replicates K and V", ""]
    with pytest.raises(IndexError):
        d.save_followup(7, "no such follow-up")


def test_a_follow_up_without_a_number_to_quote_uses_its_words():
    assert drills.personalise("You said [[%|25%]] MFU: how?", "we ran at 41% MFU on 8 GPUs") == "You said 41% MFU: how?"
    assert drills.personalise("You said [[%|25%]] MFU: how?", "it was slow") == "You said 25% MFU: how?"
    # a plain-number placeholder quotes only the same word: "8 GPUs" is not a replica count
    assert drills.personalise("[[replicas|your N]]", "8 GPUs, 3 replicas") == "3 replicas"
    assert drills.personalise("[[replicas|your N]]", "8 GPUs") == "your N"
    # with a word, the number written nearest to it: the p99, not the first time in the answer
    answer = "decode step 6.5 ms, TTFT 200 ms; the simulated p99 494 ms"
    assert drills.personalise("Your p99 is [[s@p99|your p99]].", answer) == "Your p99 is 494 ms."
    assert drills.personalise("Your p99 is [[s@p99|your p99]].", "decode step 6.5 ms") == "Your p99 is your p99."


def test_every_drill_has_a_follow_up_on_the_learners_own_number():
    for q in QUESTIONS:
        assert any("[[" in f for f in q.followups), q.qid
        with_numbers = drills.personalise(" ".join(q.followups), "")
        assert "[[" not in with_numbers and "]]" not in with_numbers, q.qid


def test_the_widget_reveals_follow_ups_rubric_and_samples_after_submit_and_restores_them(store):
    box = drills.drill_widget("Q-E2E-1", store, FakeClock(), ticking=False)
    parts = box.parts
    assert parts["followups"].children == () and parts["samples"].children == ()
    parts["reveal"].click()  # nothing written yet: nothing revealed
    assert parts["followups"].children == () and "write your answer first" in parts["timer"].value
    parts["answer"].value = "We measured 25% MFU; the profile showed NCCL at 30%"
    parts["reveal"].click()
    follow = parts["followups"].children
    boxes = [c for c in follow if isinstance(c, Textarea)]
    assert len(boxes) == len(BY_ID["Q-E2E-1"].followups)
    assert "25%" in follow[1].value
    boxes[0].value = "6 x params x tokens/s over the dense bf16 peak"
    assert store.get("Q-E2E-1")["followups"][0].startswith("6 x params")
    calibration = parts["samples"].children[0]
    assert "A strong answer" in calibration.children[0].value and "What it lacks" in calibration.children[0].value
    again = drills.drill_widget("Q-E2E-1", store, FakeClock(), ticking=False)  # a restarted kernel
    restored = [c.value for c in again.parts["followups"].children if isinstance(c, Textarea)]
    assert restored[0].startswith("6 x params") and again.parts["rubric"].children
    text, page = drills.drill_record("Q-E2E-1", store.get("Q-E2E-1"))
    assert "follow-up 1: 6 x params" in text and "Follow-up 1" in page


def test_the_text_fallback_answers_a_drill_and_its_follow_ups(store, capsys):
    drills.show_drill("Q-HW-4")
    assert "answer_drill('Q-HW-4'" in capsys.readouterr().out
    followups = drills.answer_drill("Q-HW-4", "a min-heap of size K; merge 64 KB per query", store)
    out = capsys.readouterr().out
    assert followups[0] in out and "A strong answer" in out and "what it lacks" in out
    assert "64 KB" in followups[0]
    drills.answer_followup("Q-HW-4", 2, "ties by the lower global index", store)
    assert store.get("Q-HW-4")["followups"][1] == "ties by the lower global index"


def test_the_progress_view_counts_follow_ups_and_estimation_after_a_restart(store, capsys):
    drills.answer_drill("Q-OPT-2", "int8 weights, per-channel scales", store)
    drills.answer_followup("Q-OPT-2", 1, "the KV cache is 64 GiB", store)
    drills.check_estimate("E-ZERO-DDP", "208 GB", store)
    drills.check_estimate("E-BUBBLE", "40%", store)
    capsys.readouterr()
    drills.show_progress(DrillStore(store.path))  # a new store on the same file: what a restarted kernel reads
    out = capsys.readouterr().out
    followups_total = sum(len(q.followups) for q in QUESTIONS)
    assert f"drilled 1/{len(QUESTIONS)}; follow-ups answered 1/{followups_total}" in out
    assert f"estimation answered 2/{len(drills.ESTIMATES)}, 1 right" in out


def _saved_lesson(path, rows, note=None):
    """A lesson saved with its measurements table in the outputs, as JupyterLab writes it."""
    from gpulab.measurements import format_measurements

    text = format_measurements(rows) + "\n" + (f"\n({note})\n" if note else "")
    cell = {"cell_type": "code", "id": "interview-measurements", "metadata": {}, "execution_count": 3,
            "source": "show_measurements(table)",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_the_project_story_says_which_lab_to_run_first_when_nothing_is_measured(tmp_path):
    story = drills.project_story(tmp_path)
    assert story.lab is None and "Run lab 02 first" in story.text() and "02_triton_basics" in story.text()


def test_the_project_story_is_built_from_the_learners_saved_measurements(tmp_path):
    _saved_lesson(tmp_path / "notebooks" / "02_triton_basics.ipynb", [
        ("device", "cpu: x86_64; Triton interpreter"),
        ("bias+GELU 8192x8192 fp16 bytes", "fused 256 MiB vs eager 512 MiB (2.00x)"),
        ("bias+GELU 256x256 fp16 time", "fused 9.100 ms vs eager 0.120 ms (0.01x)")])
    story = drills.project_story(tmp_path)
    assert story.lab == "02_triton_basics" and not story.on_gpu
    assert "fused 256 MiB vs eager 512 MiB" in story.text() and "fused 9.100 ms" in story.text()
    assert "CPU-run numbers" in story.text()
    _saved_lesson(tmp_path / "labs" / "08_quantization.ipynb", [  # a GPU run wins over a CPU one; a lab counts too
        ("GEMV K=N=8192 bytes", "fp16 134 MB, int8 67 MB, dequantized first 201 MB"),
        ("GEMV K=N=8192 time", "int8 31.0 us vs fp16 52.0 us (1.68x)")])
    story = drills.project_story(tmp_path)
    assert story.lab == "08_quantization" and story.on_gpu and "int8 31.0 us vs fp16 52.0 us" in story.text()
    assert "Baseline:" in story.text() and "Profile:" in story.text() and "Change:" in story.text()


def test_every_story_recipe_names_rows_its_lesson_prints():
    from gpulab.drills.story import RECIPES

    for recipe in RECIPES:
        nb = read_notebook(ROOT / "notebooks" / f"{recipe.lab}.ipynb")
        source = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and "show_measurements(" in c.source)
        for pattern in (recipe.profile, recipe.gain):
            for piece in pattern.split("*"):
                assert piece.strip() in source, (recipe.lab, pattern)
