"""The learner side of lab 15_gpu_algorithms: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/15_gpu_algorithms.py``).
"""
from __future__ import annotations

import tracemalloc
import weakref

import torch

from gpulab.compare import padded
from gpulab.launches import record_allocations
from gpulab.peaks import Peaks
from gpulab.prefetch import RecordingTransfers
from grader.exercise import entry, to_cpu
from grader.runs.observe import observe_kernel, wrapper_torch_ops
from grader.runs.ranks import launch_ranks, probe_on_one_rank

LAUNCH_TIMEOUT_S = 30.0   # per launch: the process group's timeout; a hung rank ends after it


def _one_at_a_time(chunks: list):
    """A generator handing out ``chunks`` (which it empties: only the consumer can keep one alive), and a dict whose
    "kept" is the most chunks kept alive at once besides the current one and the one before it."""
    alive, state = [], {"kept": 0}   # weak references to the chunks handed out

    def stream():
        for j in range(len(chunks)):
            chunk, chunks[j] = chunks[j], None
            state["kept"] = max(state["kept"], sum(r() is not None for r in alive[:max(0, j - 1)]))
            alive.append(weakref.ref(chunk))
            yield chunk
            del chunk

    return stream(), state


def _heap_run(ns, case, device):
    stream, state = _one_at_a_time([c.clone() for c in case.inputs["chunks"]])
    tracemalloc.start()   # Python objects only: a list of every value shows, a heap of k entries does not
    try:
        got = entry(ns, "heap_topk")(stream, case.inputs["k"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        return {"pairs": [(float(v), int(i)) for v, i in got], "kept": state["kept"], "peak": peak}
    except (TypeError, ValueError):
        return {"bad": f"{type(got).__name__}: {str(got)[:80]}"}


def _stream_run(ns, case, device):
    stream, state = _one_at_a_time([c.to(device, copy=True) for c in case.inputs["chunks"]])
    got = entry(ns, "streaming_topk")(stream, case.inputs["k"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return {"bad": type(got).__name__}
    return {"values": to_cpu(got[0]), "indices": to_cpu(got[1]), "kept": state["kept"]}


def _kernel_run(ns, case, device):
    x, k, pad, fn = case.inputs["x"], case.inputs["k"], case.inputs.get("pad", 0), entry(ns, "topk_rows")
    r, n = x.shape
    # A row-strided view: NaN between the rows, so a kernel that assumes rows n apart reads them.
    base = padded(torch.cat([x, torch.full((r, pad), float("nan"))], 1), device)   # (R, N + pad)
    view = base[:, :n]                                                                # (R, N), stride(0) = N + pad
    call = observe_kernel(lambda values, indices: fn(view, k, values=values, indices=indices),
                          {"values": ((r, k), torch.float32), "indices": ((r, k), torch.int64)}, device,
                          inputs={"x": base}, watch=lambda bufs: wrapper_torch_ops())
    obs = {**call.as_obs(), "torch_ops": call.watched}
    obs["inputs_after"] = {"x": obs["inputs_after"]["x"][:, :n]}   # the (R, N) the learner was given
    return obs


def _assign_run(ns, case, device):
    x, c = case.inputs["x"].to(device), case.inputs["c"].to(device)
    with record_allocations() as made:
        got = entry(ns, "kmeans_assign")(x, c)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return {"bad": type(got).__name__}
    return {"labels": to_cpu(got[0]), "dist2": to_cpu(got[1]), "biggest": made.biggest}


def _lloyd_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "kmeans")(x["x"].to(device), x["k"], x["iters"], x["seed"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return {"bad": type(got).__name__}
    return {"centroids": to_cpu(got[0]), "labels": to_cpu(got[1])}


def _cost_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "kmeans_step_cost")(x["n"], x["k"], x["d"], x["dtype_bytes"], x["fused"], Peaks(**x["peaks"]))
    if not isinstance(got, dict):
        return {"bad": type(got).__name__}
    return {key: (got[key] if isinstance(got[key], (int, float, str)) else repr(got[key])) for key in
            ("flops", "bytes", "intensity", "seconds", "bound") if key in got}


def _recall_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "recall_at_k")(x["found"].to(device), x["truth"].to(device), x["k"])
    return {"recall": got if isinstance(got, (int, float)) else float(got) if isinstance(got, torch.Tensor)
            and got.numel() == 1 else repr(got)[:80]}


def _ivf_run(ns, case, device):
    x = {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in case.inputs.items()}
    lists = entry(ns, "build_ivf")(x["x"], x["centroids"])
    got = entry(ns, "ivf_search")(x["x"], x["centroids"], lists, x["queries"], x["k"], x["nprobe"])
    try:
        lists = [to_cpu(torch.as_tensor(lst)).long() for lst in lists]
    except (TypeError, ValueError, RuntimeError):
        lists = repr(type(lists))
    return {"lists": lists, "ids": to_cpu(got)}


def _hist_run(ns, case, device):
    x = {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in case.inputs.items()}
    bins = entry(ns, "bin_features")(x["x"], x["edges"])
    got = entry(ns, "grad_histograms")(x["bins"], x["grad"], x["hess"], x["n_bins"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return {"binned": to_cpu(bins), "bad": type(got).__name__}
    return {"binned": to_cpu(bins), "G": to_cpu(got[0]), "H": to_cpu(got[1])}


def _split_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "best_split")(x["G"].to(device), x["H"].to(device), x["lam"], x["gamma"])
    try:
        return {"split": [int(got[0]), int(got[1]), float(got[2])]}
    except (TypeError, ValueError, IndexError):
        return {"bad": repr(got)[:80]}


def _pipe_run(ns, case, device):
    batches = case.inputs["batches"]
    io = RecordingTransfers(batches)
    results = entry(ns, "prefetch_loop")(batches, io.step(lambda x: x.sum(0)), io)
    try:
        results = [to_cpu(r) for r in results]
    except TypeError:
        results = repr(results)[:80]
    return {"log": io.log, "results": results}


def _plain_topk(got) -> dict:
    """A sharded top-k's ``(values, indices, bytes)`` as plain data, or ``{"bad": what came back}``."""
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got[:2]):
        return {"bad": f"{type(got).__name__}: {str(got)[:80]}"}
    try:
        nbytes = float(got[2])
    except (TypeError, ValueError, RuntimeError):
        return {"bad": f"a byte count of {str(got[2])[:40]}"}
    return {"values": to_cpu(got[0]).clone(), "indices": to_cpu(got[1]).clone(), "bytes": nbytes}


def _sharded_rank(rank, world_size, shard_range, sharded_topk, x, probe=None):
    """Every configuration of the case on this rank: the learner's shard of the scores, its sharded top-k, and the
    collectives it issued. ``probe``: a dict the one-rank probe fills with its first result (then it stops)."""
    from gpulab.commlog import record_collectives

    out = []
    for cfg in x["configs"]:
        scores = cfg["scores"]
        bounds = shard_range(scores.shape[0], rank, world_size)
        try:
            start, stop = (int(b) for b in bounds)
        except (TypeError, ValueError):
            out.append({"bad": f"shard_range returned {str(bounds)[:80]}"})
            break
        with record_collectives() as log:
            got = sharded_topk(scores[start:stop].clone(), start, cfg["k"], cfg["method"])
        out.append({"range": [start, stop], **_plain_topk(got), "comm": log.as_dicts()})
        if probe is not None:
            probe["first"] = out[0]
            return out
    return out


def _sharded_run(ns, case, device):
    shard_range, sharded_topk = entry(ns, "shard_range"), entry(ns, "sharded_topk")
    # A one-rank run here first: a stub raises NotImplementedError before any process starts, and an answer that
    # returns no top-k at all (None, a list...) is answered without starting the case's ranks.
    first: dict = {}
    probe_on_one_rank(_sharded_rank, shard_range, sharded_topk, case.inputs, first)
    if "bad" in first.get("first", {}):
        return {"bad": first["first"]["bad"]}
    ranks = launch_ranks(("sharded_topk", shard_range, sharded_topk), _sharded_rank, case.inputs["world"],
                         shard_range, sharded_topk, case.inputs, timeout_s=LAUNCH_TIMEOUT_S)
    return {"ranks": ranks}


def _latency_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "ivf_latency")(x["layout"], x["batch"], dict(x["system"]))
    if not isinstance(got, dict):
        return {"bad": f"{type(got).__name__}: {str(got)[:80]}"}
    return {key: (value if isinstance(value, (bool, int, float)) else float(value)
                  if isinstance(value, torch.Tensor) and value.numel() == 1 else repr(value)[:80])
            for key, value in got.items() if isinstance(key, str)}
