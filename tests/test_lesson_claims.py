"""What the lessons claim stays true: GPU run times are labelled until measured, and lab 14's batching
lesson counts the KV cache every sequence reads (formula checks on the course's own model table)."""
import json
import re

import pytest

from gpulab.datasheet import H100_HBM_BYTES, H100_HBM_BYTES_PER_S
from gpulab.serving import MODELS
from tests.conftest import ROOT

NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")])
TIME = re.compile(r"\d+\s?(?:s|min|minutes?)\b|\b(?:a|under a|about a) (?:minute|few seconds)|the same")


def run_time_claims(path) -> list[str]:
    """The clauses of a notebook's "Run time" paragraph that state a time on a GPU."""
    first = "".join(json.loads(path.read_text())["cells"][0]["source"])
    match = re.search(r"\*\*Run time:?\*\*:?(.*?)(?:\n\n|$)", first, re.S)
    if not match:
        return []
    clauses = re.split(r";|(?<=\.)\s", " ".join(match.group(1).split()))
    return [c for c in clauses if "GPU" in c and TIME.search(c)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_gpu_run_times_are_labelled(path):
    """No GPU has run the course yet: a GPU run time is an estimate, or names the GPU it was measured on,
    or says nothing runs on the GPU."""
    unlabelled = [c for c in run_time_claims(path)
                  if not re.search(r"estimat|measured on (an? )?[A-Z]|nothing runs on the GPU|stay on the CPU|"
                                   r"nothing here uses the GPU|runs the ranks", c)]
    assert not unlabelled, f"label these GPU run times as estimates: {unlabelled}"


def test_an_unlabelled_gpu_time_is_caught(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": "# X\n\n**Run time:** about 15 s on a 2-core CPU, under "
                     "10 s on a GPU.\n"}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert run_time_claims(tmp_path / "x.ipynb") == ["about 15 s on a 2-core CPU, under 10 s on a GPU."]


def test_batching_amortises_the_weight_read_only():
    """Llama-2-7B (MHA, fp16): KV reads equal the weight reads from B ~ 13 at 2k context; B=256 at 1k holds
    ~138 GB of KV (more than an 80 GB GPU) and, on the H100 roofline, yields ~24x the tokens/s, not 256x."""
    llama = MODELS["Llama-2-7B"]
    weights = 2 * llama.n_params
    per_token = 2 * llama.n_layers * llama.n_kv_heads * llama.head_dim * 2
    assert per_token == 2**19  # 0.5 MiB per token
    assert round(weights / (2048 * per_token)) == 13
    kv_256 = 256 * 1025 * per_token
    assert 130e9 < kv_256 < 145e9 and kv_256 + weights > H100_HBM_BYTES
    step = [(weights + b * 1025 * per_token) / H100_HBM_BYTES_PER_S for b in (1, 256)]  # memory-bound steps
    assert 20 < 256 * step[0] / step[1] < 28
    solution = (ROOT / "solutions" / "14_inference_serving.ipynb").read_text()
    lesson = (ROOT / "notebooks" / "14_inference_serving.ipynb").read_text()
    for text in (solution, lesson):
        assert "grows almost linearly with the batch while the step stays" not in text
        assert "only the weight read" in text or "the weight read only" in text
    assert "does not fit one 80 GB GPU" in solution  # the roofline rows flag a KV cache that does not fit
