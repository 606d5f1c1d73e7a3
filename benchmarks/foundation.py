"""Foundation benchmarks (labs 01 and 02): measured peaks, then vector add and bias+GELU from the
lab 02 *solution*, as % of measured copy bandwidth, and fused vs unfused (eager PyTorch) speed-up.

    python benchmarks/foundation.py                # on a GPU: full sizes, JSON under benchmarks/results/
    python benchmarks/foundation.py --tiny --out /tmp   # on a CPU: proves the script runs; numbers mean nothing

Needs only torch, triton and numpy (GPU machines have no Jupyter): the solution notebook is read as
JSON by the grader's notebook-free path.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_solution(stem: str, device: str) -> dict:
    from grader.notebooks import answer_cells, exec_source, export_source, read_notebook

    nb = read_notebook(ROOT / "solutions" / f"{stem}.ipynb")
    source = export_source(nb, answer_cells(nb), parameters={"DEVICE": device})
    return exec_source(source, f"<solutions/{stem}.ipynb>")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tiny", action="store_true", help="small sizes: a CPU smoke run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    import gpulab

    device = gpulab.setup(args.device, 0)
    import torch
    import torch.nn.functional as F

    from gpulab.bench import benchmark, gbps, pct_of_peak
    from gpulab.peaks import measure_peaks

    lab02 = load_solution("02_triton_basics", device)
    peaks = measure_peaks(device)
    n = 1 << 12 if args.tiny else 1 << 28            # vector add: 3 x 1 GiB fp32 on a GPU
    M, N = (16, 256) if args.tiny else (16384, 16384)  # bias+GELU: 512 MiB fp16 input on a GPU
    dtype = torch.float32 if device == "cpu" else torch.float16
    rows = []

    def record(name, nbytes, timing, baseline=None):
        bw = gbps(nbytes, timing.median_ms)
        row = {"name": name, "bytes": nbytes, **timing.as_dict(), "gbps": bw,
               "pct_of_copy": pct_of_peak(bw, peaks.copy_gbps)}
        if baseline is not None:
            row["speedup_vs_baseline"] = baseline.median_ms / timing.median_ms
        rows.append(row)
        print(f"{name:34s} {timing.median_ms:9.4f} ms  {bw:8.1f} GB/s  {row['pct_of_copy']:5.1f}% of copy"
              + (f"  {row['speedup_vs_baseline']:.2f}x vs baseline" if baseline is not None else ""))

    a = torch.randn(n, device=device)
    b = torch.randn(n, device=device)
    out = torch.empty_like(a)
    t_torch = benchmark(torch.add, a, b, out=out, device=device)
    record("torch.add fp32 (baseline)", 3 * n * 4, t_torch)
    record("vector_add fp32 (lab 02 solution)", 3 * n * 4,
           benchmark(lab02["vector_add"], a, b, out, device=device), t_torch)
    del a, b, out

    x = torch.randn(M, N, device=device, dtype=dtype)
    bias = torch.randn(N, device=device, dtype=dtype)
    out = torch.empty_like(x)
    eb = x.element_size()
    for approx in ("none", "tanh"):
        t_eager = benchmark(lambda: F.gelu(x + bias, approximate=approx), device=device)
        record(f"eager gelu(x + b) {approx} (baseline)", lab02["bias_gelu_bytes"](M, N, eb, False), t_eager)
        t_fused = benchmark(lab02["bias_gelu"], x, bias, approx, out, device=device)
        record(f"fused bias_gelu {approx} (lab 02)", lab02["bias_gelu_bytes"](M, N, eb, True), t_fused, t_eager)

    result = {"schema": 1, "script": "benchmarks/foundation.py", "tiny": args.tiny,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device, "device_name": peaks.name, "torch": torch.__version__,
              "triton": gpulab.describe()["triton"], "python": platform.python_version(),
              "peaks": {"copy_gbps": peaks.copy_gbps, "matmul_tflops": peaks.matmul_tflops,
                        "matmul_dtype": peaks.matmul_dtype, "copy_bytes": peaks.copy_bytes,
                        "matmul_size": peaks.matmul_size},
              "sizes": {"vector_add_n": n, "bias_gelu_shape": [M, N], "dtype": str(dtype)},
              "results": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in peaks.name).strip("-").lower()[:40]
    path = out_dir / f"foundation_{device}_{slug}{'_tiny' if args.tiny else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"peaks: copy {peaks.copy_gbps:.1f} GB/s, matmul {peaks.matmul_tflops:.2f} TFLOP/s; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
