"""Foundation benchmarks (labs 01 and 02): this device's peaks measured afresh, then lab 02's
*solution* kernels (vector add, fused bias+GELU) timed against PyTorch in the same run, as % of the
measured copy bandwidth and as speed-up over eager (unfused) PyTorch.

    python benchmarks/foundation.py                       # on a GPU: full sizes, JSON in benchmarks/results/
    python benchmarks/foundation.py --tiny --out /tmp     # on a CPU: proves the script runs; numbers mean nothing

Needs only torch, triton and numpy: the grader's notebook-free path reads the solution.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, importable as a script
from gpulab.paths import ROOT  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--tiny", action="store_true", help="small sizes: a CPU smoke run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    import gpulab
    from gpulab.peaks import measured_peaks
    from grader.bench import format_table, load_answers, run_benchmarks
    from grader.checks import load_lab

    device = gpulab.setup(args.device, 0)
    measured_peaks(device, refresh=True)  # this run's peaks, not a cached figure
    stem, ns = load_answers(ROOT / "solutions" / "02_triton_basics.ipynb", "02_triton_basics", device)
    report = run_benchmarks(load_lab(stem).BENCHMARKS, ns, device, tiny=args.tiny)
    info = gpulab.describe()
    report.update({"schema": 1, "script": "benchmarks/foundation.py", "lab": stem,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "torch": info["torch"], "triton": info["triton"], "python": platform.python_version()})
    print(format_table(report))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in report["device_name"]).strip("-").lower()[:40]
    path = out_dir / f"foundation_{device}_{slug}{'_tiny' if args.tiny else ''}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return 1 if any("error" in r for r in report["results"]) else 0  # the JSON is written either way


if __name__ == "__main__":
    raise SystemExit(main())
