"""Model answers quote the learner's own measurements, never typed-in GPU figures.

The "In the interview" section of every lesson and solution shows numbers in two ways only:
- printed by a code cell from the variables the notebook computed (the learner's measurements);
- written in the text, when the same sentence labels the figure as a **datasheet** figure or the
  result of a **formula** (a byte count, Amdahl's law, the alpha-beta model ...).
Any other number with a unit of speed or time (GB/s, TFLOP/s, ms, %, a 2x speed-up ...) is a
typed-in figure: a claim that nothing measured on the learner's machine, so the test fails on it.
"""
import io
import re
import tokenize

import pytest

from grader.notebooks import read_notebook
from tests.conftest import ROOT

NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions") for p in (ROOT / folder).glob("*.ipynb"))

UNIT = r"(?:\s?(?:[GTP]B/s|[GMTP]FLOP/s|µs|us|ms|%)|x\b|\s?×)"  # "2x" but not "8 x 8" (a layout)
FIGURE = re.compile(r"(?<![\w.^])[~≈]?\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:\.\d+)?)?" + UNIT)
LABELS = ("datasheet", "formula")
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(*_`])|\n\s*[-*]\s+|\n\n")


def interview_cells(nb) -> list:
    """The cells from the "## In the interview" heading to the end of the notebook."""
    start = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and c.source.startswith("## In the interview"))
    return nb.cells[start:]


def typed_in_figures(text: str) -> list[str]:
    """The sentences of ``text`` that quote a figure with a unit and do not label it."""
    bad = []
    for sentence in SENTENCE_END.split(text):
        if FIGURE.search(sentence) and not any(label in sentence.lower() for label in LABELS):
            bad.append(" ".join(sentence.split()))
    return bad


def string_literals(code: str) -> list[str]:
    """The text of a code cell's string literals, without f-string replacement fields."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [re.sub(r"\{[^{}]*\}", "", t.string) for t in tokens if t.type == tokenize.STRING]


def typed_in_figures_of(nb) -> list[str]:
    bad = []
    for cell in interview_cells(nb):
        texts = [cell.source] if cell.cell_type == "markdown" else string_literals(cell.source)
        for text in texts:
            bad += [f"cell {cell.get('id')}: {s}" for s in typed_in_figures(text)]
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_interview_quotes_no_typed_in_measurement(path):
    assert typed_in_figures_of(read_notebook(path)) == []


@pytest.mark.parametrize("sentence", [
    "Your fused kernel ran at 2.9 TB/s, about 88% of the copy bandwidth.",
    "On a GPU the fused kernel is ~2x faster.",
    "Your unsynchronised timer read ~0 ms.",
    "FlashAttention reaches 350 TFLOP/s on an H100.",
])
def test_a_typed_in_figure_is_caught(sentence):
    assert typed_in_figures(f"- **Fusion.** {sentence} Then fuse more.") != []


@pytest.mark.parametrize("sentence", [
    "Tensor cores run ~15x the fp32 rate (H100 SXM datasheet: 989 vs 67 TFLOP/s).",
    "Fusing removes a write and a read: about 2x less traffic (formula).",
    "Your table shows the fused kernel's % of copy bandwidth.",
    "64 GPUs as 8 x 8: TP inside each node.",
])
def test_labelled_or_measured_figures_pass(sentence):
    assert typed_in_figures(sentence) == []


def test_a_planted_figure_in_a_solution_fails_the_check():
    nb = read_notebook(ROOT / "solutions" / "02_triton_basics.ipynb")
    model = next(c for c in interview_cells(nb) if c.cell_type == "markdown" and "Model outline" in c.source)
    model.source += "\n- On an H100 your fused kernel ran at 3.1 TB/s, 92% of copy.\n"
    assert typed_in_figures_of(nb) == ["cell interview-model: On an H100 your fused kernel ran at 3.1 TB/s, "
                                       "92% of copy."]


def test_typed_in_figures_in_printed_strings_are_caught_too():
    code = 'print(f"fused {t:.3f} ms")\nprint("on an H100 this ran at 3.1 TB/s")\n'
    assert [s for text in string_literals(code) for s in typed_in_figures(text)] == [
        '"on an H100 this ran at 3.1 TB/s"']
