"""Layering: the learner-side package stands alone; the checks are found through one entry point."""
import re
import subprocess
import sys

from gpulab.paths import ROOT

IMPORT_GRADER = re.compile(r"^\s*(from\s+grader[\s.]|import\s+grader\b)", re.MULTILINE)


def test_gpulab_never_imports_grader():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "gpulab").glob("*.py"))
                 if IMPORT_GRADER.search(p.read_text())]
    assert offenders == []


def test_importing_gpulab_loads_no_grader_module():
    probe = ("import sys\n"
             "import gpulab, gpulab.feedback, gpulab.progress, gpulab.compare, gpulab.launches, gpulab.dist\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grader'))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_the_checks_entry_point_is_the_grader_door():
    from gpulab.checks_entry import checks

    door = checks()
    assert door.__name__ == "grader.inline"
    labs = door.labs()
    assert labs[0]["lab"] == "01_performance_model" and sum(labs[0]["points"].values()) == 10


def test_one_root():
    definitions = [str(p.relative_to(ROOT)) for folder in ("gpulab", "grader", "tests", "benchmarks")
                   for p in sorted((ROOT / folder).rglob("*.py"))
                   if re.search(r"^ROOT\s*=", p.read_text(), re.MULTILINE)]
    assert definitions == ["gpulab/paths.py"]


# --- the grader's two sides: what the sandbox holds knows no answer ---------------------------------

# The judge's modules: none of them may be imported by code that runs beside the learner's.
JUDGE_MODULES = ("grader.checks", "grader.kit", "grader.grade", "grader.report", "grader.cohort", "grader.rebuild",
                 "grader.release", "grader.inline", "grader.cli", "grader.bench", "grader.sandbox", "grader.cgroups")


def _learner_side_files():
    from grader.sandbox import RUN_SIDE

    files = []
    for rel in RUN_SIDE:
        path = ROOT / rel
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def _imported_modules(tree) -> set:
    import ast

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_sandbox_holds_only_the_learner_side():
    from grader.sandbox import RUN_SIDE

    assert "grader/runs" in RUN_SIDE
    assert not any(rel.startswith(("grader/checks", "grader/kit", "solutions")) for rel in RUN_SIDE)


def test_learner_side_code_imports_no_judge_module():
    import ast

    offenders = []
    for path in _learner_side_files():
        for module in _imported_modules(ast.parse(path.read_text())):
            if module.startswith(JUDGE_MODULES):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_learner_side_code_defines_or_reaches_no_reference():
    """No ``ref_*`` function (the judges' references) is defined in, or named from, the learner side."""
    import ast

    offenders = []
    for path in _learner_side_files():
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                    else node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else "")
            if name.startswith(("ref_", "_ref_")):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert offenders == []


def test_loading_every_run_side_loads_no_judge_module():
    probe = ("import sys\n"
             "from grader.runs import run_side\n"
             "from grader.checks import lab_stems\n"
             "stems = lab_stems()\n"
             "for m in [m for m in sys.modules if m.startswith('grader.checks')]: del sys.modules[m]\n"
             "import grader.worker, grader.exercise, grader.notebooks\n"
             "for stem in stems: run_side(stem)\n"
             f"print(sorted(m for m in sys.modules if m.startswith({JUDGE_MODULES!r}) and m != 'grader.checks'))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_every_exercise_runs_a_function_of_its_labs_run_side():
    from grader.checks import exercises, lab_stems
    from grader.grade import run_reference

    for stem in lab_stems():
        for ex in exercises(stem).values():
            entries, run = run_reference(ex)  # refuses anything outside grader/runs
            fn = getattr(run, "func", run)
            assert fn.__module__ == f"grader.runs.{stem}" or fn.__module__.startswith("grader.runs."), (stem, ex.id)
