"""The interview drills (gpulab.drills, notebooks/16_interview_drills.ipynb), driven without a browser: every
interview question has a drill, answers survive in the JSON store, the timer runs on an injected clock, the
rubric appears only when revealed and its ticks are saved, and the progress view counts what was drilled."""
import json

import pytest

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
    assert "show_progress()" in code


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
