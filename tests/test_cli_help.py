"""`python -m grader --help`: every option explained, defaults shown, nothing outside the project."""
import argparse
import re
import subprocess
import sys

import pytest

from grader.cli import build_parser
from tests.conftest import ROOT


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """Options and arguments of ``parser`` without help text, or whose default the help hides."""
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help:
            problems.append(f"{name}: no help text")
        elif action.default not in (None, False) and str(action.default) not in parser.format_help():
            problems.append(f"{name}: default {action.default!r} not shown")
    return problems


@pytest.mark.parametrize("command", list(_commands()))
def test_every_option_has_help_and_its_default(command):
    assert undocumented(_commands()[command]) == []


def test_the_check_finds_an_option_without_help_or_default():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=7)
    parser.add_argument("--device", default="cpu", help="where it runs")
    assert undocumented(parser) == ["--jobs: no help text", "--device: default 'cpu' not shown"]


def test_help_points_only_to_files_in_the_project():
    texts = [build_parser().format_help()] + [p.format_help() for p in _commands().values()]
    for text in texts:
        for name in set(re.findall(r"[\w./-]+\.md\b", text)) - {"feedback.md"}:  # grade writes feedback.md
            assert (ROOT / name).exists(), f"help mentions {name}, which is not in the project"


def test_release_help_warns_that_it_rewrites_labs():
    text = subprocess.run([sys.executable, "-m", "grader", "release", "--help"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert "REWRITES the files in labs/" in text and "--force" in text and "mv labs/" in text
