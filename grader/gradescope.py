"""``python -m grader gradescope``: an autograder bundle for one lab on Gradescope.

Gradescope builds a container image from the bundle once (``setup.sh``: Python, bubblewrap, torch and
the course), then for every submission places the learner's files in ``/autograder/submission``,
runs ``/autograder/run_autograder`` and shows ``/autograder/results/results.json`` (its documented
format: https://gradescope-autograders.readthedocs.io/en/latest/specs/).

The bundle carries the course's own files (``grader/``, ``gpulab/``, the lab's solution,
``pyproject.toml`` ...), so grading never needs the network, and a ``gradescope.json`` with the
lab and the grading options. ``run_autograder`` calls :func:`autograde` (this module's ``main``),
which finds the one notebook, grades it with :func:`grader.grade.grade_to_dir` (the same sandboxed
grader as ``python -m grader grade``) and converts the ``result.json`` with :func:`results_json`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from gpulab.paths import ROOT
from grader.report import sanitize_result, table

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's documented values
CONFIG = "gradescope.json"
# What grading needs from the course: the packages, the build files, and data the checks read.
COURSE_FILES = ("grader", "gpulab", "pyproject.toml", "README.md", "LICENSE", "benchmarks/results")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
_HEADLINE = re.compile(r"^(\d+/\d+ cases passed\.)\s+(.*)$", re.S)
# When a learner sees a failing case's details, for each visibility but "visible" (which keeps them in one test).
_WHEN = {"hidden": "to your instructor only", "after_due_date": "after the due date",
         "after_published": "once grades are published"}
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root and with network access, when it builds the autograder's image.
# It installs Python 3.11+, bubblewrap (the grader's sandbox) and the course with its dependencies
# into /autograder/venv. Pick an Ubuntu 22.04 or 24.04 base image in the assignment's settings.
set -euo pipefail
SOURCE="${{GRADESCOPE_SOURCE:-/autograder/source}}"
VENV="${{GPULAB_VENV:-/autograder/venv}}"
# Where torch comes from: the CPU wheels by default (Gradescope's machines have no GPU). For a GPU
# image set it empty (PyPI's CUDA wheels), or build the bundle with --device cuda.
TORCH_INDEX_URL="${{TORCH_INDEX_URL-{torch_index}}}"
TORCH_SPEC="${{TORCH_SPEC:-torch}}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -y
apt-get install -y --no-install-recommends bubblewrap python3 python3-venv python3-pip
PY=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    apt-get install -y --no-install-recommends python3.11 python3.11-venv
    PY=python3.11
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [ -n "$TORCH_INDEX_URL" ]; then
    "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
else
    "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
fi
"$VENV/bin/python" -m pip install --quiet -e "$SOURCE"
chmod +x "$SOURCE/run_autograder"
# Where Gradescope's container refuses bubblewrap its namespaces, the grader still runs each answer as an
# unprivileged user id of its own: what only root may read (the solution, the checks) stays out of its reach.
chmod -R go-rwx "$SOURCE/solutions" "$SOURCE/grader/checks" "$SOURCE/grader/kit"
"$VENV/bin/python" -c "import torch, grader.grade; print('grader ready, torch', torch.__version__)"
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission (working directory /autograder). It grades the one
# .ipynb in submission/ with the course's sandboxed grader and writes results/results.json.
# Every path can be moved with an environment variable (a test lays out a temporary /autograder).
set -uo pipefail
AUTOGRADER="${GRADESCOPE_ROOT:-/autograder}"
SOURCE="${GRADESCOPE_SOURCE:-$AUTOGRADER/source}"
SUBMISSION="${GRADESCOPE_SUBMISSION:-$AUTOGRADER/submission}"
RESULTS="${GRADESCOPE_RESULTS:-$AUTOGRADER/results}"
PYTHON="${GPULAB_PYTHON:-$AUTOGRADER/venv/bin/python}"   # setup.sh made this venv

mkdir -p "$RESULTS"
rm -f "$RESULTS/results.json"
(cd "$SOURCE" && PYTHONPATH="$SOURCE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m grader.gradescope \\
    --config "$SOURCE/gradescope.json" --submission "$SUBMISSION" --results "$RESULTS")
if [ ! -s "$RESULTS/results.json" ]; then
    # The grader itself could not run (see this run's stdout): still give Gradescope a valid result.
    cat > "$RESULTS/results.json" <<'EOF'
{"score": 0.0, "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
 "output": "The autograder failed on the course's side (not in your notebook); please tell your instructor."}
EOF
fi
exit 0
"""


def _headline(message: str) -> tuple[str, str]:
    """``("3/4 cases passed.", "Case 'x': ...")`` for a partial result's message, else ``(message, "")``."""
    match = _HEADLINE.match(message)
    return (match.group(1), match.group(2)) if match else (message, "")


def results_json(result: dict, titles: dict | None = None, details: str = "after_due_date") -> dict:
    """Gradescope's ``results.json`` for one of our ``result.json`` dicts (a pure function).

    One test per exercise: ``name`` is the exercise's title and id (``titles``: ``{id: title}``),
    ``score``/``max_score`` its points, ``output`` the learner's message, always visible. Where some
    cases failed, the message's headline (``"3/4 cases passed."``) stays in that test and the first
    failing case's details go to a second test without points whose visibility is ``details``
    (``"after_due_date"`` by default: the case may be a hidden one); ``details="visible"`` keeps the
    whole message in one test. The seed, limits and isolation go to ``extra_data`` (stored by
    Gradescope, never shown to learners), and the instructor's stdout is hidden from learners.
    """
    if details not in VISIBILITIES:
        raise ValueError(f"details must be one of {', '.join(VISIBILITIES)}, got {details!r}.")
    result = sanitize_result(result)
    titles = titles or {}
    extra = {key: result[key] for key in ("lab", "submission", "status", "device", "seed", "deadline_s",
                                          "timeout_s") if key in result}
    if "isolation" in result:
        extra["isolation"] = result["isolation"].get("mode")
    base = {"score": float(result.get("score") or 0.0), "execution_time": int(round(result.get("duration_s") or 0)),
            "visibility": "visible", "stdout_visibility": "hidden", "extra_data": extra}
    if result["status"] != "graded":
        return {**base, "score": 0.0, "output": f"Not graded: {result.get('message', '')}", "tests": []}
    tests = []
    for ex in result["exercises"]:
        name = f"{titles[ex['id']]} ({ex['id']})" if titles.get(ex["id"]) else ex["id"]
        headline, rest = _headline(ex["message"]) if details != "visible" else (ex["message"], "")
        test = {"name": name, "score": float(ex["score"]), "max_score": float(ex["points"]),
                "status": "passed" if ex["status"] == "passed" else "failed",
                "output": f"{ex['status']}: {headline}", "visibility": "visible"}
        if rest:
            test["output"] += f"\nThe first failing case's details are shown {_WHEN[details]}."
            tests.append(test)
            tests.append({"name": f"{name}: first failing case", "output": rest, "visibility": details})
        else:
            tests.append(test)
    output = [f"Lab {result['lab']}: {result['score']:g} / {result['max_score']:g} points."]
    run = result.get("notebook_run")
    if run and run.get("status") == "failed":
        output.append(f"Your notebook does not run top to bottom (this does not change the scores): it stopped at "
                      f"{run.get('cell') or 'start-up'}: {run.get('error', '')}")
    return {**base, "output": "\n".join(output), "tests": tests}


def invalid_results(message: str) -> dict:
    """Gradescope's ``results.json`` for a submission that could not be graded at all."""
    return {"score": 0.0, "execution_time": 0, "output": f"Not graded: {message}", "visibility": "visible",
            "stdout_visibility": "hidden", "tests": []}


def find_notebook(folder: Path, lab: str) -> tuple[Path | None, str]:
    """``(the one .ipynb under folder, "")``, or ``(None, what to do)`` when there is none or several.
    Among several, the one named after the lab (``labs/STEM.ipynb`` of a whole repository) is the one.

    Any name and any case of ``.ipynb`` counts, in sub-folders too (an uploaded zip); Jupyter's
    checkpoints and macOS's archive metadata do not, nor does a link (a zip can hold one, e.g. to the
    lab's solution in the bundle)."""
    found = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() == ".ipynb" and p.is_file()
                   and not p.is_symlink() and not any(part.startswith(".") or part == "__MACOSX"
                                                      for part in p.relative_to(folder).parts))
    named = [p for p in found if p.stem.lower() == lab.lower()]  # a whole repository: its labs/STEM.ipynb
    if len(found) == 1 or len(named) == 1:
        return (found if len(found) == 1 else named)[0], ""
    if not found:
        return None, f"no notebook (.ipynb) in your submission; upload your labs/{lab}.ipynb."
    names = ", ".join(str(p.relative_to(folder)) for p in found[:10])
    return None, (f"{len(found)} notebooks in your submission ({names}); upload only one, your "
                  f"labs/{lab}.ipynb, or name the one to grade {lab}.ipynb.")


def autograde(config: dict, submission: Path, results: Path) -> dict:
    """Grade the one notebook in ``submission`` as ``config`` says; write ``results/results.json``."""
    from grader.checks import exercises
    from grader.grade import grade_to_dir

    lab = config["lab"]
    notebook, problem = find_notebook(submission, lab)
    if notebook is None:
        print(f"not graded: {problem}")
        gs = invalid_results(problem)
    else:
        from gpulab.device import pick_device

        with tempfile.TemporaryDirectory(prefix="gpulab-gradescope-") as out:
            result = grade_to_dir(notebook, Path(out), lab=lab, device=pick_device(config.get("device", "cpu")),
                                  seed=config.get("seed"), timeout_s=config["timeout_s"],
                                  deadline_s=config["deadline_s"], notebook_run=config.get("notebook_run", True))
            print(table(result))  # the instructor's view (stdout is hidden from learners), seed included
            log = Path(out) / "grader.log"
            if log.exists():
                print("--- grader.log (tail) ---\n" + log.read_text(encoding="utf-8", errors="replace")[-8000:])
        titles = {eid: ex.title for eid, ex in exercises(lab).items()}
        gs = results_json(result, titles, config.get("details", "after_due_date"))
    results.mkdir(parents=True, exist_ok=True)
    tmp = results / "results.json.tmp"
    tmp.write_text(json.dumps(gs, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, results / "results.json")
    return gs


def write_bundle(lab: str, out, device: str = "cpu", seed: int | None = None, timeout_s: float = 60.0,
                 deadline_s: float = 1200.0, notebook_run: bool = True, details: str = "after_due_date") -> Path:
    """Write the autograder for ``lab`` to ``out``: a folder, or a zip when ``out`` ends in ``.zip``
    (files at the zip's root, scripts executable, as Gradescope wants). Returns ``out``."""
    from grader.checks import exercises

    exercises(lab)  # an unknown lab fails here, with the list of labs
    if details not in VISIBILITIES:
        raise ValueError(f"details must be one of {', '.join(VISIBILITIES)}, got {details!r}.")
    out = Path(out)
    config = {"lab": lab, "device": device, "seed": seed, "timeout_s": timeout_s, "deadline_s": deadline_s,
              "notebook_run": notebook_run, "details": details}
    torch_index = TORCH_CPU_INDEX if device == "cpu" else ""
    with tempfile.TemporaryDirectory(prefix="gpulab-bundle-") as tmp:
        stage = Path(tmp) / "bundle"
        stage.mkdir()
        for rel in COURSE_FILES + (f"solutions/{lab}.ipynb",):
            src = ROOT / rel
            if src.is_dir():
                shutil.copytree(src, stage / rel, ignore=_IGNORED)
            elif src.exists():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, stage / rel)
        (stage / CONFIG).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        (stage / "setup.sh").write_text(SETUP_SH.format(torch_index=torch_index), encoding="utf-8")
        (stage / "run_autograder").write_text(RUN_AUTOGRADER, encoding="utf-8")
        for script in ("setup.sh", "run_autograder"):
            (stage / script).chmod(0o755)
        if out.suffix.lower() == ".zip":
            _zip(stage, out)
        else:
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(stage, out)
    return out


def _zip(folder: Path, out: Path) -> None:
    """Zip ``folder``'s contents (not the folder itself) with their Unix permissions."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                info = zipfile.ZipInfo.from_file(path, path.relative_to(folder).as_posix())
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, path.read_bytes())


def main(argv=None) -> int:
    """``run_autograder``'s entry point: never raises, always leaves a ``results.json``."""
    parser = argparse.ArgumentParser(prog="python -m grader.gradescope",
                                     description="Grade a Gradescope submission (run_autograder calls this).")
    parser.add_argument("--config", required=True, help="the bundle's gradescope.json")
    parser.add_argument("--submission", required=True, help="the folder Gradescope put the submission in")
    parser.add_argument("--results", required=True, help="the folder for results.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        config = json.loads(Path(args.config).read_text(encoding="utf-8"))
        autograde(config, Path(args.submission), Path(args.results))
    except Exception as exc:  # a problem of the bundle, not of the submission: say so, keep a valid result
        import traceback

        traceback.print_exc(file=sys.stdout)  # stdout is the instructor's (hidden from learners)
        gs = invalid_results("the autograder failed on the course's side (not in your notebook); please tell "
                             f"your instructor ({type(exc).__name__}).")
        gs["execution_time"] = int(time.perf_counter() - start)
        Path(args.results).mkdir(parents=True, exist_ok=True)
        (Path(args.results) / "results.json").write_text(json.dumps(gs, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
