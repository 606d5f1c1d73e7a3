"""What a GPU supports, and how the course degrades on an older one, tested with faked device properties
(nothing here has a GPU): capability queries, the grader's skip of an exercise this GPU cannot run, the
distributed backend for a faked number of GPUs, and lesson 00's "your GPU vs an H100" table."""
from __future__ import annotations

import json
import types

import pytest
import torch

from gpulab import capability, datasheet, dist
from gpulab.aot import TARGETS
from gpulab.paths import ROOT

# What torch.cuda.get_device_properties reports on Colab's T4 and on an H100 SXM (names and limits as the CUDA
# programming guide and the parts' datasheets give them; the memory is what such a card reports, about).
T4 = types.SimpleNamespace(name="Tesla T4", major=7, minor=5, multi_processor_count=40, total_memory=15 * 2**30,
                           shared_memory_per_block_optin=64 * 1024)
H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                             total_memory=79 * 2**30, shared_memory_per_block_optin=227 * 1024)


def fake_gpu(monkeypatch, props, count: int = 1) -> None:
    """Make torch report ``count`` GPUs like ``props``, and the run a CUDA run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (props.major, props.minor))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props.name)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr("gpulab.device._current", "cuda")


@pytest.mark.parametrize("feature, first_yes, last_no", [
    ("bf16", (8, 0), (7, 5)), ("fp8", (8, 9), (8, 6)), ("sparse_2_4", (8, 0), (7, 5)),
    ("tensor_core_dot", (8, 0), (7, 5)), ("wgmma", (9, 0), (8, 9)), ("tma", (9, 0), (8, 9))])
def test_each_feature_starts_at_its_generation(feature, first_yes, last_no):
    assert capability.supports(feature, first_yes)
    assert not capability.supports(feature, last_no)
    assert capability.supports(feature, (12, 0)) == (feature != "wgmma")  # Blackwell has no wgmma


def test_unknown_feature_names_the_known_ones():
    with pytest.raises(ValueError, match="bf16"):
        capability.supports("fp4", (9, 0))


def test_on_the_cpu_everything_stays_as_it_was(capsys):
    assert capability.device_capability("cpu") is None
    assert all(capability.available(f, "cpu") for f in capability.FEATURES)
    assert capability.missing("fp8", "cpu") is None
    assert capsys.readouterr().out == ""


def test_a_t4_skips_fp8_with_the_reason_and_the_alternative(monkeypatch, capsys):
    fake_gpu(monkeypatch, T4)
    assert capability.missing("fp8") == "needs fp8 (sm_89+), this GPU is sm_75"
    assert capability.available("fp8") is False
    out = capsys.readouterr().out
    assert "needs fp8 (sm_89+), this GPU is sm_75" in out and "Instead:" in out and "Traceback" not in out
    assert capability.available("bf16", quiet=True) is False and capsys.readouterr().out == ""
    assert "compile report" in capability.FEATURES["wgmma"].instead


def test_an_h100_has_everything(monkeypatch, capsys):
    fake_gpu(monkeypatch, H100)
    assert all(capability.available(f) for f in capability.FEATURES)
    assert capsys.readouterr().out == ""


# --- the grader ------------------------------------------------------------------------------------------

def test_lab_07_declares_bf16_where_its_cases_autocast_on_the_device():
    from grader.checks import exercises

    declared = {(stem, eid): ex.requires for stem in ("07_mixed_precision", "08_quantization",
                                                      "09_pruning_distillation")
                for eid, ex in exercises(stem).items() if ex.requires}
    assert declared == {("07_mixed_precision", "amp_train_step"): "bf16"}
    assert all(r in capability.FEATURES for r in declared.values())


def test_the_inline_check_says_why_instead_of_failing(monkeypatch):
    from grader.checks import exercises
    from grader.exercise import evaluate

    fake_gpu(monkeypatch, T4)
    result = evaluate(exercises("07_mixed_precision")["amp_train_step"], {}, "cuda")
    assert result.status == "not_attempted" and result.points == 0 and result.skipped.endswith("sm_75")
    assert "--device cpu" in result.cases[0].message


def test_grading_on_a_t4_skips_the_bf16_exercise_and_lowers_the_maximum(monkeypatch, tmp_path):
    import grader.grade as grade_module
    from grader.checks import exercises
    from grader.report import write_reports

    fake_gpu(monkeypatch, T4)
    ran = {}

    def no_workers(stem, setup, answers, cases, *args, **kwargs):  # nothing can run on a faked GPU
        ran.update(cases)
        return {}, {eid: ("error", "not run in this test") for eid in cases}, "", ""

    monkeypatch.setattr(grade_module, "run_answers", no_workers)
    result = grade_module.grade(ROOT / "solutions" / "07_mixed_precision.ipynb", device="cuda", notebook_run=False)
    lab = exercises("07_mixed_precision")
    assert "amp_train_step" not in ran and set(ran) == set(lab) - {"amp_train_step"}
    assert result["max_score"] == sum(ex.points for ex in lab.values()) - lab["amp_train_step"].points
    assert result["skipped_for_capability"] == [{"id": "amp_train_step", "requires": "bf16",
                                                 "device_capability": "sm_75", "points": 3.0}]
    entry = next(e for e in result["exercises"] if e["id"] == "amp_train_step")
    assert entry["skipped"] == "needs bf16 (sm_80+), this GPU is sm_75"
    assert entry["status"] == "not_attempted" and entry["points"] == 0.0 and entry["score"] == 0.0
    assert all(e["status"] in ("passed", "failed", "error", "timeout", "crashed", "not_attempted")
               for e in result["exercises"])
    write_reports(result, tmp_path)
    feedback = (tmp_path / "feedback.md").read_text()
    assert "Skipped for this GPU" in feedback and "needs bf16 (sm_80+), this GPU is sm_75" in feedback
    assert "## `` amp_train_step ``" not in feedback  # no failure section for it
    assert json.loads((tmp_path / "result.json").read_text())["skipped_for_capability"][0]["id"] == "amp_train_step"
    assert "needs bf16" in (tmp_path / "junit.xml").read_text()
    from grader.report import table
    assert any("amp_train_step" in line and "SKIP" in line for line in table(result).splitlines())


def test_grading_on_the_cpu_skips_nothing(monkeypatch):
    import grader.grade as grade_module

    monkeypatch.setattr(grade_module, "run_answers", lambda *a, **k: ({}, {}, "", ""))
    result = grade_module.grade(ROOT / "solutions" / "07_mixed_precision.ipynb", device="cpu", notebook_run=False)
    assert "skipped_for_capability" not in result
    assert not any("skipped" in e for e in result["exercises"])


# --- labs 11-13: nccl with a GPU per rank, gloo otherwise ------------------------------------------------

@pytest.mark.parametrize("gpus, device, world, backend", [
    (2, "cuda", 2, "nccl"), (1, "cuda", 2, "gloo"), (2, "cuda", 4, "gloo"), (2, "cpu", 2, "gloo")])
def test_the_backend_follows_the_visible_gpus(monkeypatch, gpus, device, world, backend):
    fake_gpu(monkeypatch, T4, count=gpus)
    assert dist.pick_backend(world, device) == backend
    note = dist.backend_note(world, device)
    assert note.startswith(f"backend {backend}:")
    if backend == "gloo" and device == "cuda":
        assert f"{gpus} GPU" in note and "one GPU per rank" in note


def test_a_forced_gloo_says_so(monkeypatch):
    fake_gpu(monkeypatch, T4, count=2)
    assert "asks for gloo" in dist.backend_note(2, "cuda", backend="gloo")


@pytest.mark.parametrize("gpus, device, preferred, world, backend", [
    (2, "cuda", 4, 2, "nccl"),   # Kaggle's two T4s: one rank per GPU
    (8, "cuda", 4, 4, "nccl"),   # a node with more GPUs than the demonstration needs
    (1, "cuda", 4, 4, "gloo"),   # Colab's one T4 cannot all-reduce with anyone: CPU processes
    (2, "cpu", 4, 4, "gloo")])   # DEVICE = "cpu" on a GPU machine keeps everything on the CPU
def test_a_demonstration_is_sized_to_the_gpus_there_are(monkeypatch, gpus, device, preferred, world, backend):
    fake_gpu(monkeypatch, T4, count=gpus)
    assert dist.demo_world(preferred, device) == world
    assert dist.pick_backend(dist.demo_world(preferred, device), device) == backend


def test_a_rank_puts_its_tensors_on_its_gpu_under_nccl_and_on_the_cpu_otherwise(monkeypatch):
    assert dist.rank_device() == torch.device("cpu")  # no process group at all
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    assert dist.rank_device() == torch.device("cpu")
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # launch gives rank 1 GPU 1
    assert dist.rank_device() == torch.device("cuda", 1)


@pytest.mark.parametrize("error", [
    "RuntimeError: No backend type associated with device type cpu",  # a CPU tensor in an NCCL collective
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"])
def test_a_tensor_on_the_wrong_device_gets_a_next_step(error):
    advice = dist._device_advice(f"Traceback ...\n{error}")
    assert "rank_device()" in advice and ".to(" in advice
    assert dist._device_advice("RuntimeError: shapes cannot be multiplied") == ""


# --- your GPU vs an H100 ------------------------------------------------------------------------------------

def test_the_datasheet_parts_take_their_limits_from_the_compile_targets():
    assert {p.target for p in datasheet.PARTS} <= set(TARGETS)
    assert datasheet.part_named("Tesla T4").name == "T4"
    assert datasheet.part_named("NVIDIA A100-SXM4-80GB").target == "sm_80"
    assert datasheet.part_named("NVIDIA L40S") is None
    h100 = datasheet.part_named("NVIDIA H100 80GB HBM3")
    assert (h100.fp16_flops, h100.hbm_bytes_per_s) == (datasheet.H100_FP16_FLOPS, datasheet.H100_HBM_BYTES_PER_S)


def test_the_table_for_a_faked_t4(monkeypatch):
    fake_gpu(monkeypatch, T4)
    table = capability.gpu_table()
    mine = next(line for line in table.splitlines() if "this GPU" in line)
    assert "Tesla T4" in mine and "sm_75" in mine and "| 40 |" in mine and "64 KiB" in mine
    assert "320 GB/s (datasheet)" in mine and "2nd gen (Turing)" in mine
    assert "| H100 SXM (datasheet) | sm_90 | 132 |" in table and "227 KiB" in table
    assert "| 07 mixed precision | no: needs sm_80+" in table
    assert "| 11-13 distributed | no:" in table


def test_the_table_for_a_faked_h100_pair(monkeypatch):
    fake_gpu(monkeypatch, H100, count=2)
    table = capability.gpu_table()
    assert "2 GPUs visible" in table and "NVIDIA H100 80GB HBM3 (this GPU)" in table
    assert "| 08 quantization | yes:" in table and "| 04/05 matmul, attention | yes:" in table
    assert "| 11-13 distributed | yes: 2 GPUs" in table


def test_the_table_without_a_gpu_says_so():
    table = capability.gpu_table("cpu")
    assert table.startswith("**No GPU here**") and "this GPU" not in table
    assert table.count("(datasheet) |") == len(datasheet.PARTS)


# --- corrected claims, with their numbers ------------------------------------------------------------------

def _cell(path: str, cell_id: str) -> str:
    nb = json.loads((ROOT / path).read_text())
    return "".join(next(c for c in nb["cells"] if c["id"] == cell_id)["source"])


def test_bf16_has_about_2_4_significant_digits_as_lab_07s_table_prints():
    import math

    from gpulab.precision import FORMATS

    digits = f"{(FORMATS['bf16'].mantissa_bits + 1) * math.log10(2):.1f}"  # the lab's limits table, digits column
    text = _cell("notebooks/07_mixed_precision.ipynb", "gpu-intro")
    assert digits == "2.4" and f"about {digits} significant decimal digits" in text
    assert "3 significant digits" not in text


def test_int8_to_float_conversion_is_an_eighth_of_the_fma_rate():
    from gpulab.aot import H100

    text = " ".join(_cell("solutions/08_quantization.ipynb", "gemv-intro").split())
    assert "quarter-rate" not in text and "16 per clock per SM, an eighth of the 128 fp32 FMAs" in text
    conversions = H100.sms * 16 * H100.properties()["sm_clock_rate"] * 1e3  # per second, at the aot clock
    assert f"about {conversions / 1e12:.1f} T conversions/s" in text
    assert f"{datasheet.H100_HBM_BYTES_PER_S / 1e12:.2f} TB/s" in text and conversions > datasheet.H100_HBM_BYTES_PER_S


def test_structured_pruning_speeds_up_at_least_by_the_flop_ratio_on_a_cpu():
    for path, cell_id in (("solutions/09_pruning_distillation.ipynb", "interview-model"),
                          ("notebooks/09_pruning_distillation.ipynb", "interview-model")):
        text = " ".join(_cell(path, cell_id).split())
        assert "at least by the FLOP ratio" in text and "caches" in text
        assert "by about the share of FLOPs removed" not in text and "falls with the FLOPs on any hardware" not in text


@pytest.mark.parametrize("path", ["notebooks/00_start_here.ipynb", "notebooks/06_compile_and_graphs.ipynb",
                                  "notebooks/07_mixed_precision.ipynb", "solutions/06_compile_and_graphs.ipynb",
                                  "solutions/07_mixed_precision.ipynb"])
def test_gpu_run_times_are_labelled_estimates(path):
    text = " ".join(_cell(path, "title").split())
    run_time = text[text.lower().index("run time"):]
    assert "on a GPU (estimated" in run_time


def test_lesson_10_trains_in_fp16_on_a_t4_and_in_bf16_from_an_a100_on(monkeypatch):
    assert capability.half_dtype("cpu") is torch.bfloat16  # the CPU paths keep float32 themselves
    fake_gpu(monkeypatch, T4)
    assert capability.half_dtype() is torch.float16
    fake_gpu(monkeypatch, H100)
    assert capability.half_dtype() is torch.bfloat16
