"""Cases that say nothing of their answer.

A case generator may tag each case with the rule it exercises (``Case("rule: details", inputs)``): the rules
make one case per rule on every seed easy to write and to test. But a case travels to the learner's process
whole, name included, and a name such as "communication: 16 ranks" is the answer of a diagnosis exercise. So an
exercise's ``make_cases`` is ``neutral(generator)``: the generator's cases in an order drawn from the seed, each
renamed ``"case 3: details"`` (``"example 3: ..."`` for the public ones). The rule stays here, on the judge's
side: :func:`case_rules` regenerates it from the seed for tests and reports.

The details (after the last ``": "`` of a tagged name) must describe the inputs only; a test checks that no
rule is left in a neutral name.
"""
from __future__ import annotations

from functools import partial

import torch

from grader.exercise import PUBLIC_SEED, Case


def split_name(name: str) -> tuple[str, str]:
    """``(rule, details)`` of a tagged case name ``"rule: details"``; ``("", name)`` for an untagged one."""
    rule, _, details = name.rpartition(": ")
    return rule, details


def _tagged(generator, gen: torch.Generator, public: bool) -> list[tuple[str, int, Case]]:
    """``(rule, place in the generator's list, neutral case)``: the generator's cases, shuffled by ``gen`` (a
    case's place says nothing either: the grader may run them in order), renamed by their place and inputs."""
    cases = list(generator(gen, public))
    order = torch.randperm(len(cases), generator=gen).tolist()  # the same seed, the same order
    word = "example" if public else "case"
    out = []
    for place, i in enumerate(order, 1):
        rule, details = split_name(cases[i].name)
        out.append((rule, i, Case(f"{word} {place}: {details}" if details else f"{word} {place}", cases[i].inputs)))
    return out


def _neutral_cases(generator, gen: torch.Generator, public: bool) -> list[Case]:
    return [case for _, _, case in _tagged(generator, gen, public)]


def neutral(generator):
    """An exercise's ``make_cases``: ``generator(gen, public)``'s cases, shuffled and neutrally named."""
    return partial(_neutral_cases, generator)


def case_rules(ex, seed: int, public: bool = False) -> dict:
    """``{neutral case name: rule}`` of ``ex``'s cases drawn from ``seed`` (judge-side: tests and reports)."""
    return {case.name: rule for rule, _, case in _drawn(ex, seed, public)}


def _drawn(ex, seed: int, public: bool) -> list:
    return _tagged(ex.make_cases.args[0], torch.Generator().manual_seed(seed), public)


def in_written_order(ex, seed: int = PUBLIC_SEED, public: bool = True) -> list[Case]:
    """``ex``'s neutral cases in the order its generator writes them (tests pick "the first public case")."""
    return [case for _, _, case in sorted(_drawn(ex, seed, public), key=lambda tagged: tagged[1])]


def failed_rules(ex, result, seed: int) -> list:
    """The rules of ``result``'s cases that did not pass: public cases drawn from the public seed, hidden ones
    from ``seed`` (judge-side: a test asks which rule a wrong answer breaks)."""
    rules = {**case_rules(ex, PUBLIC_SEED, True), **case_rules(ex, seed, False)}
    return [rules[c.name] for c in result.cases if c.status != "passed"]


def hidden_rules(ex, seed: int) -> list:
    """The sorted rules of ``ex``'s hidden set drawn from ``seed``."""
    return sorted(case_rules(ex, seed).values())


def rules_differ(ex, seeds=(1, 2, 3, 20261122, 987654321)) -> str | None:
    """What is wrong with ``ex``'s hidden sets, or None: every set holds one case per rule, every rule named,
    and the same rules on every seed (a regrade cannot change a score)."""
    first = hidden_rules(ex, seeds[0])
    if not all(first) or len(set(first)) != len(first):
        return f"{ex.id}: one case per named rule, got {first}"
    for seed in seeds[1:]:
        if hidden_rules(ex, seed) != first:
            return f"{ex.id}: seed {seed} draws the rules {hidden_rules(ex, seed)}, seed {seeds[0]} {first}"
    return None
