"""environment.yml describes the same environment as pyproject.toml; setup files exist."""
import re
import tomllib

from tests.conftest import ROOT


def _names(requirements):
    return {re.split(r"[<>=!;\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {}
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        wanted[_names([req]).pop()] = re.sub(r";.*", "", req).replace(" ", "")
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pip = [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")
           and not line.strip().startswith("- -e")]
    listed = {_names([p]).pop(): p.replace(" ", "") for p in pip}
    assert listed == wanted


def test_python_versions_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    assert "python>=3.11" in (ROOT / "environment.yml").read_text()


def test_readme_opens_with_the_two_commands_and_ci_calls_make_test():
    readme = (ROOT / "README.md").read_text()
    head = readme[:600]
    assert "make lab" in head and "make test" in head
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    make = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "test-gpu:", "setup:"):
        assert target in make


def test_license_is_an_spdx_string_so_setup_prints_no_deprecation_warning():
    """setuptools >= 77 warns (three times per setup) about `license = {text = ...}`, a TOML table."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert pyproject["build-system"]["requires"] == ["setuptools>=77"]  # the first to read SPDX strings


def test_numpy_is_capped_while_triton_3_6_is_allowed():
    """Triton 3.6's interpreter breaks on runtime-bound loops with numpy >= 2.4 (fixed after 3.6)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_names([r]).pop(): r for r in project["dependencies"]}
    assert deps["triton"].startswith("triton>=3.6")
    assert "<2.4" in deps["numpy"]
    assert "numpy>=1.26,<2.4" in (ROOT / "environment.yml").read_text()
