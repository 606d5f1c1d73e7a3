"""Cases carry inputs only: a case's name and inputs travel into the learner's process, so neither may say
what the expected outcome is. Checked on every lab's public cases and on hidden cases of several seeds:

- no outcome word (expected, answer, broken, valid, wrong, should, pass, fail ...) in a case name, an
  input key or a string among the inputs;
- no input that is a near copy of another input (an unbroken twin next to a broken schedule: the
  difference is the answer; a reference's result next to the input it was computed from);
- no case named after its answer: where the solution answers with labels (``"memory"``,
  ``"bad_batch"``), no case name holds its own case's label.

A word that describes the inputs, not the outcome, is listed in :data:`DESCRIBES_INPUT` with why.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from grader.checks import exercises, lab_stems
from grader.exercise import Case, run_case
from tests.conftest import solution_namespace

SEEDS = (1, 2, 20261122)  # hidden sets; the public set uses its own seed
OUTCOME_WORDS = frozenset({
    "expected", "expect", "expects", "expecting", "answer", "answers", "broken", "valid", "invalid",
    "correct", "incorrect", "wrong", "should", "pass", "passes", "passed", "fail", "fails", "failed", "failing",
})
# (lab, exercise, word): the word describes what the inputs are, and every case of that kind has the same
# outcome, so it tells the learner nothing the exercise's text does not.
DESCRIBES_INPUT = {
    ("04_matmul", "matmul_autotune", "valid"): "every configs case asks for valid configs (the rule, not a verdict)",
    ("08_quantization", "quant_roundtrip", "wrong"): "names the mistake the case catches (a wrong axis)",
    ("13_pipeline_parallel", "bubble_fraction", "valid"): "the schedule is an input; the answer is a number",
    ("13_pipeline_parallel", "peak_activations", "valid"): "the schedule is an input; the answer is a number",
}
# Labs whose cases still reveal outcomes; their checks are being rewritten. Empty this as each lands
# (strict: a lab that passes again fails here until it leaves the list).
KNOWN_OFFENDERS = {
}
# The same for case names that hold the solution's own answer (a label) for that case.
NAMED_AFTER_ANSWER = {
}
# Labs whose answers run on several ranks: their observations are tensors, no labels, and running
# their solutions once more costs minutes.
NO_LABELS = {"11_data_parallel": "ranks", "12_tensor_parallel": "ranks"}


def words(text: str) -> set[str]:
    """The lower-case words of ``text``, splitting snake_case, camelCase and punctuation."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def strings(value, depth: int = 0):
    """Every string in ``value`` (dict keys too), a few levels deep."""
    if isinstance(value, str):
        yield value
    elif depth < 6 and isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k, depth + 1)
            yield from strings(v, depth + 1)
    elif depth < 6 and isinstance(value, (list, tuple)):
        for v in value[:256]:
            yield from strings(v, depth + 1)


def _varied(seq) -> bool:
    return len({repr(x) for x in seq}) > 1


def near_copy(a, b) -> bool:
    """Whether ``b`` is ``a`` with a few elements changed (or unchanged): a tensor of the same shape with
    3/4 of its elements equal, a sequence or a dict with 3/4 of its items equal (half, for a sequence
    that is a permutation of the other). Constant values
    (zeros, a list of ones) are common in honest inputs and never count."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or a.numel() < 8 or not _varied(a.flatten().tolist()[:1024]):
            return False
        return (a.flatten() == b.flatten()).float().mean().item() >= 0.75
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if min(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 2 or not _varied(a):
            return False
        same = sum(repr(x) == repr(y) for x, y in zip(a, b))
        permuted = sorted(map(repr, a)) == sorted(map(repr, b))  # e.g. two steps of a schedule swapped
        return same >= (0.5 if permuted else 0.75) * max(len(a), len(b))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) < 4 or set(a) != set(b):
            return False
        return sum(repr(a[k]) == repr(b[k]) for k in a) >= 0.75 * len(a)
    return False


def twins(inputs: dict, depth: int = 0):
    """Pairs of keys of ``inputs`` (or of dicts nested in it) whose values are near copies."""
    for (k1, v1), (k2, v2) in itertools.combinations(inputs.items(), 2):
        if near_copy(v1, v2):
            yield f"{k1!r} ~ {k2!r}"
    if depth < 2:
        for value in inputs.values():
            nested = [value] if isinstance(value, dict) else value[:32] if isinstance(value, (list, tuple)) else []
            for d in nested:
                if isinstance(d, dict):
                    yield from twins(d, depth + 1)


def revealing(stem: str, eid: str, case: Case) -> list[str]:
    """What in ``case`` names or gives away its expected outcome."""
    allowed = {w for (lab, ex, w) in DESCRIBES_INPUT if (lab, ex) == (stem, eid)}
    found = []
    for w in sorted(words(case.name) & OUTCOME_WORDS - allowed):
        found.append(f"the name says {w!r}")
    for text in strings(case.inputs):
        for w in sorted(words(text) & OUTCOME_WORDS - allowed):
            found.append(f"an input key or value says {w!r} ({text[:40]!r})")
    found += [f"near-copy inputs {pair}" for pair in twins(case.inputs)]
    return found


def offences(stem: str) -> list[str]:
    out = []
    for eid, ex in exercises(stem).items():
        sets = [("public", ex.cases())] + [(f"seed {s}", ex.cases(s, public=False)) for s in SEEDS]
        for where, cases in sets:
            for case in cases:
                out += [f"{eid} [{where}] {case.name[:80]!r}: {why}" for why in revealing(stem, eid, case)]
    return sorted(set(out))


def _lab_param(stem: str, offenders: dict):
    marks = [pytest.mark.xfail(reason=offenders[stem], strict=True)] if stem in offenders else []
    return pytest.param(stem, marks=marks, id=stem)


@pytest.mark.slow
@pytest.mark.parametrize("stem", [_lab_param(s, KNOWN_OFFENDERS) for s in lab_stems()])
def test_cases_say_nothing_about_their_outcome(stem):
    found = offences(stem)
    assert not found, (f"{len(found)} case(s) of {stem} reveal their outcome to the learner's process:\n  "
                       + "\n  ".join(found[:25]))


def labels(value, path: str = ""):
    """``(path, text)`` for every string in an observation (dict keys are paths, not labels)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from labels(v, f"{path}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:64]):
            yield from labels(v, f"{path}/{i}")


def named_after_answer(case_labels: list) -> list[str]:
    """Cases whose name holds their own answer. ``case_labels`` is ``[(case, {path: label})]`` with the
    labels of the solution's observations that are not among the case's inputs; a path counts when
    its label differs between cases (an answer, not a constant like a kernel's name)."""
    values: dict = {}
    for _, found in case_labels:
        for path, text in found.items():
            values.setdefault(path, set()).add(text)
    out = []
    for case, found in case_labels:
        for path, text in found.items():
            pattern = r"(?<![A-Za-z0-9_])" + re.escape(text) + r"(?![A-Za-z0-9_])"
            if len(values[path]) > 1 and len(text) >= 3 and re.search(pattern, case.name, re.IGNORECASE):
                out.append(f"{case.name[:80]!r} holds its answer {text!r} ({path})")
    return out


def answer_labels(ex, ns: dict, case: Case) -> dict:
    """The labels the solution answers ``case`` with, less those the inputs already hold."""
    outcome = run_case(ex, ns, case, "cpu")
    if outcome["status"] != "ok":
        return {}
    given = set(strings(case.inputs))
    return {path: text for path, text in labels(outcome["obs"]) if text not in given}


@pytest.mark.slow
@pytest.mark.parametrize("stem", [_lab_param(s, NAMED_AFTER_ANSWER) for s in lab_stems() if s not in NO_LABELS])
def test_no_case_is_named_after_its_answer(stem):
    ns = solution_namespace(stem)
    found = []
    for eid, ex in exercises(stem).items():
        cases = ex.cases() + ex.cases(SEEDS[0], public=False)
        first = answer_labels(ex, ns, cases[0])
        if not first and not answer_labels(ex, ns, cases[-1]):
            continue  # answers without labels: numbers and tensors
        found += [f"{eid} {why}" for why in named_after_answer([(c, answer_labels(ex, ns, c)) for c in cases])]
    assert not found, f"{stem}: cases named after their answer:\n  " + "\n  ".join(found[:25])


def test_a_case_named_after_its_label_is_found():
    cases = [(Case("random machine #0, memory-bound", {}), {"/bound": "memory"}),
             (Case("random machine #1", {}), {"/bound": "compute", "/kernel": "matmul_kernel"}),
             (Case("matmul_kernel twice", {}), {"/bound": "memory", "/kernel": "matmul_kernel"})]
    assert named_after_answer(cases) == ["'random machine #0, memory-bound' holds its answer 'memory' (/bound)"]


def test_known_offenders_are_labs():
    assert set(KNOWN_OFFENDERS) <= set(lab_stems())
    assert {lab for lab, _, _ in DESCRIBES_INPUT} <= set(lab_stems())


# The detector itself: what it must catch, and honest cases it must leave alone.

SCHEDULE = [(0, "F", 0), (0, "F", 1), (1, "F", 0), (1, "B", 0), (0, "B", 0), (1, "F", 1)]


@pytest.mark.parametrize("case", [
    Case("rule: expect 3 replicas", {"qps": 10.0}),
    Case("case 3", {"schedule": SCHEDULE, "broken": None}),
    Case("case 4", {"schedule": SCHEDULE[:3] + SCHEDULE[4:5] + SCHEDULE[3:4] + SCHEDULE[5:], "base": SCHEDULE}),
    Case("case 5", {"x": torch.arange(16.0), "y_ok": torch.arange(16.0).add(torch.eye(16)[3])}),
    Case("case 6", {"plan": {"tp": 2, "pp": 4, "dp": 8, "mb": 4}, "fixed": {"tp": 2, "pp": 4, "dp": 8, "mb": 2}}),
    Case("should_raise", {"n": 3}),
    Case("n=3", {"mode": "invalid"}),
    Case("n=3", {"configs": [{"a": list(range(8)), "b": list(range(8))}]}),
], ids=lambda c: f"{c.name}/{sorted(c.inputs)}")
def test_the_detector_catches_outcome_names_flags_and_twins(case):
    assert revealing("00_lab", "ex", case)


@pytest.mark.parametrize("case", [
    Case("n=1000 float32, non-contiguous x and y", {"x": torch.randn(1000), "y": torch.randn(1000)}),
    Case("zeros", {"x": torch.zeros(64), "bias": torch.zeros(64), "sizes": [1, 1, 1, 1, 1]}),
    Case("GPT-3 layer, budget = 60% of everything", {"groups": [[0, 1], [2, 3]], "name": "adam"}),
    Case("p=4 m=8", {"schedule": SCHEDULE, "p": 4, "m": 8}),
], ids=lambda c: c.name)
def test_the_detector_leaves_honest_cases_alone(case):
    assert revealing("00_lab", "ex", case) == []
