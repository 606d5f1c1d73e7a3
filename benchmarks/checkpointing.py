"""Checkpointing benchmark (lab 10): what each recompute choice saves and costs on a stack of
transformer blocks, using lab 10's *solution* (`selective_forward`, `saved_tensor_bytes`,
`recompute_cost`).

For every choice in `gpulab.models.RECOMPUTE_CANDIDATES` (nothing, the attention core, the MLP, ...,
the whole block) it records, per training step (forward + backward):
- the bytes autograd saves (`saved_tensors_hooks`) and the formula's prediction;
- on a GPU: the memory held after forward and the peak during backward, from
  `torch.cuda.memory_allocated` / `torch.cuda.max_memory_allocated` (above the parameters, their
  gradients and the input); on a CPU these are not available and are written as null;
- matmul FLOPs (`FlopCounterMode`) and the time (`gpulab.bench.benchmark`, median and p95).

    python benchmarks/checkpointing.py                      # on a GPU: full sizes, JSON in benchmarks/results/
    python benchmarks/checkpointing.py --tiny --out /tmp    # on a CPU: proves the script runs; times mean nothing

Needs only torch, triton and numpy.
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

STEM = "10_memory_checkpointing"
FULL = dict(layers=4, batch=4, seq=2048, d_model=2048, n_heads=16, dropout=0.1)   # bf16 on a GPU: ~8 GB plain
TINY = dict(layers=2, batch=2, seq=32, d_model=64, n_heads=2, dropout=0.1)        # fp32 on a CPU


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--tiny", action="store_true", help="small sizes: a CPU smoke run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import gpulab
    from gpulab.bench import benchmark
    from gpulab.models import RECOMPUTE_CANDIDATES, make_block
    from grader.bench import load_answers

    device = gpulab.setup(args.device, 0)
    cuda = device == "cuda"
    _, ns = load_answers(ROOT / "solutions" / f"{STEM}.ipynb", STEM, device)
    selective_forward, saved_tensor_bytes, recompute_cost = (
        ns["selective_forward"], ns["saved_tensor_bytes"], ns["recompute_cost"])

    cfg = TINY if args.tiny else FULL
    dtype = torch.bfloat16 if cuda else torch.float32
    L, b, s, h, a, p = (cfg[k] for k in ("layers", "batch", "seq", "d_model", "n_heads", "dropout"))
    blocks = torch.nn.ModuleList([make_block(h, a, None, p, seed=i, device=device, dtype=dtype) for i in range(L)])
    params = list(blocks.parameters())
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    e = x.element_size()
    stats_bytes = 4 if cuda else e  # LayerNorm mean/rstd: fp32 on CUDA, the input's dtype on a CPU

    def forward(x, cand):
        for block in blocks:
            x = selective_forward(block, x, cand)   # (b, s, h)
        return x

    def step(cand):
        forward(x, cand).float().square().mean().backward()

    step(())  # allocates the gradients once, so every measurement below starts from the same state
    rows = []
    for cand in RECOMPUTE_CANDIDATES:
        name = ",".join(cand) or "none"
        row = {"recompute": name,
               "saved_bytes": saved_tensor_bytes(lambda x: forward(x, cand), x, exclude=params),
               "formula_bytes": L * recompute_cost(b, s, h, a, 4 * h, p, e, cand, stats_bytes=stats_bytes)[0],
               "held_after_forward_bytes": None, "peak_bytes": None}
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = forward(x, cand)
            torch.cuda.synchronize()
            row["held_after_forward_bytes"] = torch.cuda.memory_allocated() - base
            out.float().square().mean().backward()
            torch.cuda.synchronize()
            row["peak_bytes"] = torch.cuda.max_memory_allocated() - base
            del out
        with FlopCounterMode(display=False) as counter:
            step(cand)
        row["flops"] = counter.get_total_flops()
        timing = benchmark(lambda: step(cand), device=device, warmup=2, repeats=5 if args.tiny else 20)
        row.update(ms=timing.median_ms, p95_ms=timing.p95_ms)
        rows.append(row)

    plain = rows[0]
    print(f"{L} blocks, b={b} s={s} h={h} a={a} {str(dtype).split('.')[-1]} dropout {p} on {device}"
          + ("   [tiny sizes: CPU times say nothing about a GPU]" if args.tiny else ""))
    print(f"{'recompute':16s}{'saved MiB':>11}{'formula':>9}{'peak MiB':>10}{'GFLOP':>9}{'ms':>9}{'x time':>8}")
    for r in rows:
        peak = f"{r['peak_bytes'] / 2**20:10.1f}" if r["peak_bytes"] is not None else f"{'n/a':>10}"
        print(f"{r['recompute']:16s}{r['saved_bytes'] / 2**20:11.2f}{r['formula_bytes'] / 2**20:9.2f}{peak}"
              f"{r['flops'] / 1e9:9.2f}{r['ms']:9.2f}{r['ms'] / plain['ms']:8.2f}")

    info = gpulab.describe()
    device_name = info["gpu"] if cuda else (info["cpu"] or "cpu")
    report = {"schema": 1, "script": "benchmarks/checkpointing.py", "lab": STEM, "device": device,
              "device_name": device_name, "tiny": args.tiny, "dtype": str(dtype).split(".")[-1], "config": cfg,
              "memory_source": "torch.cuda.max_memory_allocated" if cuda else "saved_tensors_hooks only",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": info["torch"], "triton": info["triton"], "python": platform.python_version(),
              "results": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()[:40]
    path = out_dir / f"checkpointing_{device}_{slug}{'_tiny' if args.tiny else ''}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
