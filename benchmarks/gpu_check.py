"""The GPU check: one command that proves the course on a GPU, within a time budget (``make gpu-check``).

    python benchmarks/gpu_check.py                          # on a GPU: the default 540 s budget
    python benchmarks/gpu_check.py --budget 1200 --out DIR  # more time, results in DIR
    python benchmarks/gpu_check.py --continue --out DIR     # a second command: the steps the first did not reach
    python benchmarks/gpu_check.py --device cpu --tiny      # a CPU smoke run (part of the test suite)

Needs python3 with torch, Triton and NumPy, the project on PYTHONPATH and nothing else: no venv, no pip, no
Jupyter, no install of this project (notebooks run under papermill when it is importable, otherwise as
their code cells in order in a fresh ``python``, and the summary says which). ``--wheels DIR`` unpacks
the wheels carried in DIR (papermill, nbclient, ipykernel, matplotlib ...) into ``.gpulab/wheels`` and
puts them on the notebooks' path, without pip.

The steps run most informative first, each in a process of its own: the environment and measured peaks;
every kernel benchmark of labs 02-05, 08, 14 and 15 (output checked against the baseline, then timed);
the exercises of those labs (public cases, then a real sandboxed ``python -m grader grade``); the
CUDA-only lesson paths; then notebooks, most suspect first. A step starts only when its estimate fits
in what is left of the budget, and is stopped when the budget ends or at three times its estimate. The
run writes ``gpu_check.json`` and ``gpu_check.md`` (a verdict per performance goal) to ``--out``; a figure
appears there only when this run measured it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script
from gpulab.paths import ROOT  # noqa: E402

OVERRUN = 3  # a step may take this many times its estimate before it is stopped
DEFAULT_BUDGET_S = 540  # one 10-minute command, with a minute for start-up and the copy back
TINY_BUDGET_S = 240


@dataclass(frozen=True)
class Step:
    name: str           # "bench:08_quantization", "exercises:02_triton_basics", "notebook:notebooks/06_....ipynb"
    estimate_s: float   # on an H100/H200 (or, with --tiny, on a CPU): what the budget must hold to start it

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def arg(self) -> str:
        return self.name.split(":", 1)[1] if ":" in self.name else ""


# Most suspect first: CUDA-only code paths no CPU run reaches (graphs, streams, profiler, multi-rank on one
# GPU), then the kernel labs, then the rest. Estimates: GPU minutes, from the notebooks' GPU run times.
NOTEBOOKS = ["solutions/06_compile_and_graphs.ipynb", "notebooks/06_compile_and_graphs.ipynb",
             "notebooks/10_memory_checkpointing.ipynb", "solutions/15_gpu_algorithms.ipynb",
             "solutions/08_quantization.ipynb", "solutions/05_flash_attention.ipynb",
             "solutions/09_pruning_distillation.ipynb", "solutions/11_data_parallel.ipynb",
             "solutions/12_tensor_parallel.ipynb", "solutions/13_pipeline_parallel.ipynb",
             "solutions/14_inference_serving.ipynb", "solutions/04_matmul.ipynb", "solutions/03_reductions.ipynb",
             "solutions/07_mixed_precision.ipynb", "solutions/10_memory_checkpointing.ipynb",
             "solutions/02_triton_basics.ipynb", "solutions/01_performance_model.ipynb",
             "notebooks/00_start_here.ipynb"]

BENCH_ESTIMATE = {"08_quantization": 90, "03_reductions": 60, "04_matmul": 150, "02_triton_basics": 30,
                  "05_flash_attention": 150, "14_inference_serving": 40, "15_gpu_algorithms": 40}


def plan(device: str, tiny: bool) -> list[Step]:
    """The steps in the order they run."""
    from gpu_steps import KERNEL_LABS

    if tiny:  # the CPU smoke run: one of each kind, at CPU estimates
        return [Step("environment", 30), Step("bench:02_triton_basics", 40), Step("exercises:02_triton_basics", 60),
                Step("lesson-paths", 20), Step("notebook:solutions/01_performance_model.ipynb", 60)]
    steps = [Step("environment", 40)]
    steps += [Step(f"bench:{stem}", BENCH_ESTIMATE[stem]) for stem in KERNEL_LABS]
    steps.append(Step("exercises:02_triton_basics", 90))  # the real sandboxed grade of one kernel lab, early
    steps.append(Step("lesson-paths", 60))
    steps += [Step(f"exercises:{stem}", 120) for stem in KERNEL_LABS if stem != "02_triton_basics"]
    rest = sorted(str(p.relative_to(ROOT)) for folder in ("solutions", "notebooks")
                  for p in (ROOT / folder).glob("*.ipynb"))
    steps += [Step(f"notebook:{path}", 150) for path in NOTEBOOKS + [p for p in rest if p not in NOTEBOOKS]]
    return steps


# --- running one step (in its own process) --------------------------------------------------------------

def run_step(name: str, device: str, tiny: bool, out_dir: Path, limit_s: float) -> dict:
    import gpu_steps

    import gpulab

    step = Step(name, 0)
    if step.kind == "environment":
        return gpu_steps.environment(device, tiny)
    gpulab.setup(device, 0)
    if step.kind == "bench":
        return gpu_steps.kernel_benchmarks(step.arg, device, tiny)
    if step.kind == "exercises":
        return gpu_steps.exercises(step.arg, device, tiny, out_dir, limit_s)
    if step.kind == "lesson-paths":
        return gpu_steps.lesson_paths(device, tiny)
    if step.kind == "notebook":
        return gpu_steps.notebook(step.arg, device, out_dir, limit_s)
    raise ValueError(f"unknown step {name!r}")


def _step_file(out_dir: Path, name: str) -> Path:
    return out_dir / "steps" / ("".join(c if c.isalnum() or c in "-_." else "_" for c in name) + ".json")


def step_main(args) -> int:
    """The child side: run one step, write its JSON (the error and traceback when it raises)."""
    out_dir = Path(args.out)
    try:
        result, status = run_step(args.step, args.device, args.tiny, out_dir, args.limit), "done"
    except Exception as exc:  # noqa: BLE001 - the parent records it and goes on
        result, status = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}, "error"
    path = _step_file(out_dir, args.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status, "result": result}, indent=1, default=str))
    return 0


# --- the budget ---------------------------------------------------------------------------------------

class Budget:
    """Seconds left; a step starts only when its estimate fits. ``seconds=0``: no limit."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.seconds, self.clock, self.start = seconds, clock, clock()

    def left(self) -> float:
        return float("inf") if not self.seconds else self.seconds - (self.clock() - self.start)

    def admits(self, step: Step) -> bool:
        return step.estimate_s <= self.left()


def run_all(steps: list[Step], budget: Budget, device: str, tiny: bool, out_dir: Path, env: dict,
            done: dict | None = None) -> list[dict]:
    """Run ``steps`` in order within ``budget``; one record per step, run or not."""
    records = []
    for step in steps:
        record = {"name": step.name, "estimate_s": step.estimate_s}
        if done and done.get(step.name, {}).get("status") in ("done", "error"):
            records.append({**done[step.name], "from_earlier_run": True})
            continue
        if not budget.admits(step):
            records.append({**record, "status": "not run", "why": f"budget: {max(budget.left(), 0):.0f} s left, "
                                                                    f"the step needs about {step.estimate_s:.0f} s"})
            continue
        # Within a budget, a step that overruns its estimate threefold is stopped: one runaway step must not eat
        # every later one. Without one (--budget 0), nothing is stopped.
        limit = min(budget.left(), OVERRUN * step.estimate_s) if budget.seconds else None
        print(f"[gpu-check] {step.name} (about {step.estimate_s:.0f} s"
              + (f", stopped at {limit:.0f} s)" if limit else ")"), flush=True)
        start = time.monotonic()
        inner = max(limit - 10, 1) if limit else 3600  # what the step's own subprocesses (grade, notebook) get
        argv = [sys.executable, str(Path(__file__).resolve()), "--step", step.name, "--device", device,
                "--out", str(out_dir), "--limit", f"{inner:.0f}"] + (["--tiny"] if tiny else [])
        try:
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
            child = _step_file(out_dir, step.name)
            if child.exists():
                record.update(json.loads(child.read_text()))
            else:
                record.update({"status": "error", "error": f"the step's process exited {proc.returncode} "
                               f"without a result", "output_tail": (proc.stdout + proc.stderr)[-3000:]})
        except subprocess.TimeoutExpired:
            record.update({"status": "timeout", "why": f"stopped after {limit:.0f} s (the budget's end or "
                                                       f"{OVERRUN:g} x its estimate)"})
        record["seconds"] = time.monotonic() - start
        print(f"[gpu-check]   {record['status']} in {record['seconds']:.0f} s", flush=True)
        records.append(record)
    return records


# --- what the run found -------------------------------------------------------------------------------------

def problems(records: list[dict]) -> list[str]:
    """Everything that went wrong, one line each (a step that did not run for lack of budget is no problem)."""
    found = []
    for rec in records:
        name, result = rec["name"], rec.get("result") or {}
        if rec["status"] in ("error", "timeout"):
            found.append(f"{name}: {rec['status']}: {rec.get('why') or (rec.get('result') or {}).get('error', '')}")
        for row in result.get("rows", []) if isinstance(result, dict) else []:
            if "error" in row:
                found.append(f"{name}: {row['name']}: {row['error']}")
            elif not row.get("output_ok"):
                found.append(f"{name}: {row['name']}: output differs from the baseline: {row.get('output_check')}")
        if rec["name"].startswith("exercises:") and rec["status"] == "done":
            for ex in result.get("public", []):
                if ex["status"] != "passed":
                    found.append(f"{name}: public cases of {ex['id']}: {ex['status']}: {ex['message']}")
            g = result.get("grade", {})
            if g.get("score") is None or g.get("score") != g.get("max_score"):
                found.append(f"{name}: grade {g.get('status')} {g.get('score')}/{g.get('max_score')}")
        if rec["name"].startswith("notebook:") and rec["status"] == "done" and result.get("status") != "ok":
            found.append(f"{name}: {result.get('status')}: {(result.get('output_tail') or '')[-300:]}")
        if rec["name"] == "lesson-paths" and rec["status"] == "done":
            found += [f"lesson path {k}: {v['error']}" for k, v in result.items() if v.get("status") == "error"]
    return found


def goal_verdicts(records: list[dict]) -> list[dict]:
    from gpu_goals import GOALS, verdict

    rows, why_missing = {}, {}
    for rec in records:
        if rec["name"].startswith("bench:"):
            lab = rec["name"].split(":", 1)[1]
            if rec["status"] == "done":
                rows.update({row["name"]: row for row in rec["result"]["rows"]})
            else:
                why = rec.get("why") or (rec.get("result") or {}).get("error", "")
                why_missing[lab] = f"its benchmark step {rec['status']}: {why}"
    planned = {rec["name"].split(":", 1)[1] for rec in records if rec["name"].startswith("bench:")}
    for goal in GOALS:
        if goal.lab not in planned:
            why_missing[goal.lab] = "its benchmark step is not in this run's plan (--tiny or --only)"
    return [verdict(goal, rows, why_missing) for goal in GOALS]


def _num(value, fmt: str = ".3g") -> str:
    return "not measured" if value is None else format(value, fmt)


def markdown(report: dict) -> str:
    env = next((r.get("result") for r in report["steps"] if r["name"] == "environment" and r["status"] == "done"), None)
    lines = [f"# GPU check: {report['device']}{' (tiny CPU smoke run: no GPU figures)' if report['tiny'] else ''}",
             "", f"{report['date']}, budget {report['budget_s'] or 'unlimited'} s, used {report['seconds']:.0f} s. "
             f"Written by `benchmarks/gpu_check.py`; every figure below was measured in this run.", ""]
    if env:
        peaks = env.get("peaks", {})
        lines += [f"Device: {env.get('gpu') or env.get('cpu')}; torch {env.get('torch')}, Triton {env.get('triton')}, "
                  f"NumPy {env.get('numpy')}, Python {env.get('python')}. Measured peaks: copy "
                  f"{_num(peaks.get('copy_gbps'), '.1f')} GB/s, matmul {_num(peaks.get('matmul_tflops'), '.2f')} "
                  f"TFLOP/s ({peaks.get('matmul_dtype')}). Jupyter packages: "
                  + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in env.get("jupyter", {}).items()), ""]
    else:
        lines += ["Environment step did not run: no device facts or peaks.", ""]
    lines += ["## Performance goals", "", "| lab | benchmark | goal | verdict | measured / why |",
              "|---|---|---|---|---|"]
    for v in report["goals"]:
        lines.append(f"| {v['lab']} | {v['row']} | {v['goal']} | {v['verdict']} | "
                     f"{_num(v['measured'], '.3g') if 'measured' in v else v.get('why', '')} |")
    lines += ["", "## Steps", "", "| step | status | seconds | estimate (s) | note |", "|---|---|---|---|---|"]
    for r in report["steps"]:
        note = r.get("why") or (r.get("result") or {}).get("error", "") if r["status"] != "done" else ""
        lines.append(f"| {r['name']} | {r['status']} | {_num(r.get('seconds'), '.0f')} | {r['estimate_s']:.0f} | "
                     f"{str(note)[:160]} |")
    for r in report["steps"]:
        if r["name"].startswith("bench:") and r["status"] == "done":
            lines += ["", f"## {r['name']}", "", "| row | output | ms | baseline ms | x baseline | % copy | "
                      "ms (read flush) | ms (host clock) |", "|---|---|---|---|---|---|---|---|"]
            for row in r["result"]["rows"]:
                if "error" in row:
                    lines.append(f"| {row['name']} | FAILED: {row['error'][:120]} | | | | | | |")
                    continue
                lines.append(f"| {row['name']} | {'ok' if row['output_ok'] else 'WRONG'}: {row['output_check']} | "
                             f"{_num(row.get('ms'))} | {_num(row.get('baseline_ms'))} | "
                             f"{_num(row.get('speedup_vs_baseline'))} | {_num(row.get('pct_of_copy'), '.0f')} | "
                             f"{_num(row.get('ms_read_flush'))} | {_num(row.get('ms_host_clock'))} |")
            for kernel, choices in r["result"].get("autotuned", {}).items():
                lines.append(f"\nAutotuner `{kernel}`: " + "; ".join(f"{k} -> {c}" for k, c in choices))
        if r["name"].startswith("exercises:") and r["status"] == "done":
            res = r["result"]
            g = res.get("grade", {})
            lines += ["", f"## {r['name']}", "", f"Grade: {g.get('status')}, {g.get('score')}/{g.get('max_score')} in "
                      f"{_num(g.get('seconds'), '.0f')} s (isolation: {(g.get('isolation') or {}).get('mode')}).", "",
                      "| exercise | public cases | seconds | hidden cases (grader) |", "|---|---|---|---|"]
            hidden = {e["id"]: e for e in g.get("exercises", [])}
            for ex in res.get("public", []):
                h = hidden.get(ex["id"], {})
                lines.append(f"| {ex['id']} | {ex['status']} | {ex['seconds']:.1f} | {h.get('status', 'not run')} |")
        if r["name"] == "lesson-paths" and r["status"] == "done":
            lines += ["", "## CUDA-only lesson paths", ""]
            lines += [f"- {k}: {json.dumps(v, default=str)}" for k, v in r["result"].items()]
        if r["name"].startswith("notebook:") and r["status"] == "done":
            res = r["result"]
            lines.append(f"\n{r['name']}: {res.get('status')} in {_num(res.get('seconds'), '.0f')} s "
                         f"({res.get('runner')})")
    lines += ["", "## Problems", ""] + ([f"- {p}" for p in report["problems"]] or ["none"])
    if report["not_run"]:
        device = f" --device {report['device']}" if report["device"] != "cuda" else ""
        lines += ["", f"Not run: {len(report['not_run'])} steps. Next command: "
                  f"`python benchmarks/gpu_check.py --continue --out <this folder>{device}`."]
    return "\n".join(lines) + "\n"


# --- wheels carried for Jupyter --------------------------------------------------------------------------------

PREINSTALLED = ("numpy", "torch", "triton", "nvidia")  # the machine's own builds: a carried copy must not shadow them


def unpack_wheels(folder: Path, target: Path) -> list[str]:
    """Unpack every ``*.whl`` in ``folder`` into ``target`` (a wheel is a zip of importable files): Jupyter
    without pip or a registry. Wheels of the preinstalled packages are left out (``target`` comes before
    site-packages on the path). Returns the names of the wheels unpacked."""
    names = []
    for wheel in sorted(folder.glob("*.whl")):
        if wheel.name.split("-")[0].lower().startswith(PREINSTALLED):
            print(f"[gpu-check] {wheel.name}: left out, this machine has its own")
            continue
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        names.append(wheel.name)
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke subset at small sizes")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S}, {TINY_BUDGET_S} with --tiny; "
                             "0: no limit)")
    parser.add_argument("--out", default=str(ROOT / ".gpulab" / "gpu_check"))
    parser.add_argument("--only", default="", help="comma-separated step name prefixes (bench:,lesson-paths)")
    parser.add_argument("--continue", dest="resume", action="store_true",
                        help="keep the steps an earlier run in --out finished; run the rest")
    parser.add_argument("--wheels", default="", help="a folder of carried wheels (papermill, nbclient, ipykernel ...)")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=600, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        return step_main(args)

    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    budget_s = args.budget if args.budget is not None else (TINY_BUDGET_S if args.tiny else DEFAULT_BUDGET_S)
    env = dict(os.environ)
    paths = [str(ROOT)]
    if args.wheels:
        site = ROOT / ".gpulab" / "wheels"
        print(f"[gpu-check] unpacked {len(unpack_wheels(Path(args.wheels), site))} wheels into {site}")
        paths.append(str(site))
    env["PYTHONPATH"] = ":".join(paths + [p for p in [env.get("PYTHONPATH", "")] if p])
    steps = plan(args.device, args.tiny)
    if args.only:
        steps = [s for s in steps if any(s.name.startswith(p) for p in args.only.split(","))]
    done = {}
    previous = out_dir / "gpu_check.json"
    if args.resume and previous.exists():
        done = {r["name"]: r for r in json.loads(previous.read_text())["steps"]}
    start = time.monotonic()
    records = run_all(steps, Budget(budget_s), args.device, args.tiny, out_dir, env, done)
    report = {"schema": 1, "script": "benchmarks/gpu_check.py", "device": args.device, "tiny": args.tiny,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "budget_s": budget_s, "seconds": time.monotonic() - start,
              "plan": [asdict(s) for s in steps], "steps": records}
    report["goals"] = goal_verdicts(records)
    report["problems"] = problems(records)
    report["not_run"] = [r["name"] for r in records if r["status"] == "not run"]
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out_dir / 'gpu_check.json'} and gpu_check.md")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
