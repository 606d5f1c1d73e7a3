"""Record the GPU profiler trace lab 06 reads: a small launch-bound model, eager and as a CUDA-graph replay.

Writes two files per run into --out (default benchmarks/results/):
- ``profile_trace_<device>_<name>.trace.json.gz``: the Chrome trace of ten eager steps then ten replays
  (open it in Perfetto or chrome://tracing; lab 06's ``trace_summary`` reads it);
- ``profile_trace_<device>_<name>.json``: the summary: top kernels by total time, device busy fraction and
  idle gaps of each phase, the step times. Numbers come only from the run.

Usage: ``python benchmarks/profile_trace.py`` on a GPU machine (only torch, triton and numpy needed), then commit
both files. ``--tiny --device cpu`` proves the script works on a CPU (no kernels: its trace holds CPU operators
only, and nothing is committed).
"""
from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpulab.graphs import graph_api  # noqa: E402
from grader.checks import load_lab  # noqa: E402

CHECKS = load_lab("06_compile_and_graphs")


def record(device: str, width: int, layers: int, batch: int, steps: int) -> tuple[dict, dict]:
    """(chrome trace dict, step times in ms) of `steps` eager calls then `steps` graph replays."""
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    x = torch.randn(batch, width, device=device)
    api = graph_api(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        static_in = x.clone()
        with api.warmup():
            for _ in range(3):
                model(static_in)
        g = api.graph()
        with api.capture(g):
            static_out = model(static_in)
        times = {}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            for phase, step in (("eager", lambda: model(x)), ("graph", lambda: (static_in.copy_(x), g.replay()))):
                sync()
                start = time.perf_counter()
                with record_function(phase):
                    for _ in range(steps):
                        step()
                    sync()
                times[phase] = (time.perf_counter() - start) * 1e3 / steps
        assert torch.allclose(static_out, model(x), atol=1e-4)
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text()), times


def summarize(trace: dict) -> dict:
    """The reading lab 06 teaches, per phase (the events inside each record_function range)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for phase in ("eager", "graph"):
        marks = [e for e in events if e.get("name") == phase and e.get("cat") in ("user_annotation",
                                                                                   "gpu_user_annotation")]
        if not marks:
            continue
        lo = min(m["ts"] for m in marks)
        hi = max(m["ts"] + m["dur"] for m in marks)
        inside = [e for e in events if lo <= e["ts"] <= hi]
        if any(e.get("cat") in CHECKS.DEVICE_CATS for e in inside):
            s = CHECKS.ref_trace_summary({"traceEvents": inside}, 5, 5.0)
            out[phase] = {"top": s["top"], "busy": s["busy"], "gaps": len(s["gaps"]),
                          "kernels": sum(e.get("cat") == "kernel" for e in inside)}
        else:
            out[phase] = {"cpu_ops": sum(e.get("cat") == "cpu_op" for e in inside)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small sizes, to prove the script works on a CPU")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    width, layers, batch, steps = (32, 4, 2, 3) if args.tiny else (256, 16, 8, 10)
    trace, times = record(args.device, width, layers, batch, steps)
    name = torch.cuda.get_device_name().replace(" ", "_") if args.device == "cuda" else platform.machine()
    stem = f"profile_trace_{args.device}_{name}" + ("_tiny" if args.tiny else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / f"{stem}.trace.json.gz", "wt") as f:
        json.dump(trace, f)
    summary = {"device": args.device, "name": name, "torch": torch.__version__, "tiny": args.tiny,
               "model": {"width": width, "layers": layers, "batch": batch, "steps": steps},
               "step_ms": times, "phases": summarize(trace)}
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("device", "step_ms", "phases")}, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
