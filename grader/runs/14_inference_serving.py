"""The learner side of lab 14_inference_serving: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/14_inference_serving.py``).
"""
from __future__ import annotations

import torch

from gpulab.compare import padded
from gpulab.peaks import Peaks
from gpulab.serving import ModelSpec, Request
from gpulab.tiny_lm import LMConfig, make_lm
from grader.exercise import entry, to_cpu
from grader.runs.observe import observe_out


def _lm_run(ns, case, device):
    fn, x = entry(ns, "forward_cached"), case.inputs
    model = make_lm(LMConfig(**x["cfg"]), x["seed"], device=device)
    processed = []  # positions each block's q/k/v projection saw, per call
    for block in model.blocks:
        def counted(h, positions, _project=block.project_qkv):
            processed.append(int(h.shape[1]))
            return _project(h, positions)
        block.project_qkv = counted
    tokens, cache, past, logits, shapes, per_call = x["tokens"].to(device), None, 0, [], [], []
    with torch.no_grad():
        for t in x["chunks"]:
            processed.clear()
            ret = fn(model, tokens[:, past:past + t], cache)
            if not isinstance(ret, (tuple, list)) or len(ret) != 2:
                return {"bad_return": type(ret).__name__}
            out, cache = ret
            logits.append(to_cpu(out))
            per_call.append(max(processed, default=0))
            try:
                shapes.append([[tuple(kv[0].shape), tuple(kv[1].shape)] for kv in cache])
            except (TypeError, IndexError, AttributeError):
                return {"logits": logits, "bad_cache": type(cache).__name__}
            past += t
    return {"logits": logits, "shapes": shapes, "processed": per_call,
            "cache": [[to_cpu(kv[0]), to_cpu(kv[1])] for kv in cache]}


def _bytes_run(ns, case, device):
    x, spec = case.inputs, ModelSpec(**case.inputs["spec"])
    return {"bytes": entry(ns, "kv_cache_bytes")(spec, x["batch"], x["seq_len"], x["kv_bytes"]),
            "max_batch": entry(ns, "max_batch")(spec, x["seq_len"], x["gpu_bytes"], x["weight_bytes"], x["kv_bytes"])}


def _step_run(ns, case, device):
    x = case.inputs
    got = entry(ns, "step_roofline")(ModelSpec(**x["spec"]), x["batch"], x["new_tokens"], x["context"],
                                     x["dtype_bytes"], Peaks(**x["peaks"]))
    if not isinstance(got, dict):
        return {"bad_return": type(got).__name__}
    return {k: (got[k] if isinstance(got[k], (int, float, str)) else repr(got[k])) for k in
            ("flops", "bytes", "intensity", "seconds", "bound") if k in got}


def _paged_run(ns, case, device):
    x = case.inputs
    mgr = entry(ns, "BlockManager")(x["num_blocks"], x["block_size"])
    seqs, log = {}, []  # every sequence appended to so far, in order (a dict as an ordered set)
    for op in x["ops"]:
        if op[0] == "append":
            seqs[op[1]] = None
            try:
                result = [[int(b), int(o)] for b, o in mgr.append(op[1], op[2])]
            except MemoryError:
                result = "MemoryError"
        else:
            mgr.free(op[1])
            result = None
        tables = {}
        for s in seqs:
            try:
                tables[s] = [int(b) for b in mgr.block_table(s)]
            except (KeyError, IndexError, ValueError):
                tables[s] = None
        log.append({"result": result, "free": int(mgr.num_free()), "tables": tables})
    return {"log": log}


def _sched_run(ns, case, device):
    x = case.inputs
    sched = entry(ns, "Scheduler")(x["num_blocks"], x["block_size"], x["max_batch"])
    reqs = sorted((Request(**r) for r in x["requests"]), key=lambda r: (r.arrival, r.rid))
    done, batches, added = {r.rid: 0 for r in reqs}, [], 0
    for t in range(sum(r.max_new_tokens for r in reqs) + max(r.arrival for r in reqs) + 5):  # a right answer's steps
        while added < len(reqs) and reqs[added].arrival <= t:
            sched.add(reqs[added])
            added += 1
        batches.append([int(getattr(i, "rid", i)) for i in sched.step()])
        for rid in batches[-1]:
            if rid in done:
                done[rid] += 1
        if added == len(reqs) and all(done[r.rid] >= r.max_new_tokens for r in reqs):
            break
    return {"batches": batches}


TRIALS = 2000   # verification steps per case: enough to reject every wrong variant at P_FAIL


def _spec_run(ns, case, device):
    fn, p, q = entry(ns, "speculative_verify"), case.inputs["p"], case.inputs["q"]
    k, vocab = q.shape
    gen = torch.Generator().manual_seed(case.inputs["seed"])
    drafts = torch.multinomial(q, TRIALS, replacement=True, generator=gen).T  # (TRIALS, k), row i ~ q[i]
    first, second, bonus, accepted = torch.zeros(vocab), torch.zeros(vocab), torch.zeros(vocab), torch.zeros(k + 1)
    for draft in drafts:
        out = fn(draft.clone(), q.clone(), p.clone(), gen)
        try:
            out = [int(t) for t in out]
        except (TypeError, ValueError):
            return {"invalid": f"returned {out!r}; expected a list of token ids"}
        n = len(out) - 1  # drafts accepted
        if not 0 <= n <= k or out[:n] != draft[:n].tolist() or not all(0 <= t < vocab for t in out):
            return {"invalid": f"returned {out} for the draft tokens {draft.tolist()}"}
        accepted[n] += 1
        first[out[0]] += 1
        if n >= 1 and k >= 2:
            second[out[1]] += 1
        if n == k:
            bonus[out[-1]] += 1
    return {"first": first, "second": second, "bonus": bonus, "accepted": accepted}


_KERNEL_INPUTS = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")


def _kernel_run(ns, case, device):
    x, fn = case.inputs, entry(ns, "paged_decode_attention")
    t = {n: padded(x[n], device) for n in _KERNEL_INPUTS}
    return observe_out(lambda out: fn(*(t[n] for n in _KERNEL_INPUTS), scale=x["scale"], out=out),
                       tuple(x["q"].shape), x["q"].dtype, device, inputs=t)
