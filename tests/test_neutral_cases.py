"""Labs 14-16 name their cases by place and inputs only (grader.kit.neutral): a case travels to the learner's
process whole, so its name must not say what the answer is, and its place in the list must not either."""
import pytest

from grader.checks import exercises
from grader.kit.neutral import case_rules, split_name
from tests.conftest import HIDDEN_SEED

STEMS = ("14_inference_serving", "15_gpu_algorithms", "16_capstone_design")


@pytest.mark.parametrize("stem", STEMS)
def test_case_names_carry_a_place_and_inputs_only(stem):
    for eid, ex in exercises(stem).items():
        for seed, public in ((0, True), (HIDDEN_SEED, True), (HIDDEN_SEED, False)):
            word = "example" if public else "case"
            for place, name in enumerate(case_rules(ex, seed, public), 1):
                assert split_name(name)[0] == f"{word} {place}" or name == f"{word} {place}", (eid, name)


@pytest.mark.parametrize("stem", STEMS)
def test_a_rule_has_no_fixed_place_in_the_hidden_set(stem):
    """The hidden sets are shuffled by their seed: counting calls tells an answer nothing."""
    for eid, ex in exercises(stem).items():
        orders = {tuple(case_rules(ex, seed).values()) for seed in (1, 2, 3, 4, 5, HIDDEN_SEED)}
        assert len(orders) > 1 or len(ex.cases(1, public=False)) == 1, eid
