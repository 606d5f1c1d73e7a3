"""Checks of lab 14, inference serving: a KV-cached forward pass (equal to the model from scratch, n_kv_heads
rotated keys cached, no position recomputed), KV-cache bytes and the batch that fits, a step on the roofline, a
paged block manager, a continuous-batching scheduler (first come, first served under the block budget at every
step), speculative decoding (chi-square tests against the target's distribution) and a Triton decode-attention
kernel over shuffled block tables and stale values. Wrong answers are named by the mistake they match. Hidden
cases: one per rule, the same rules on every seed, named by their inputs alone and shuffled (grader.kit.neutral).
"""
from __future__ import annotations

import math

import torch

from gpulab.compare import compare
from gpulab.peaks import Peaks
from gpulab.serving import MODELS, ModelSpec, Request
from gpulab.tiny_lm import LMConfig, make_lm
from grader.exercise import Benchmark, Case, Exercise
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.kernels import judge_kernel
from grader.kit.neutral import neutral
from grader.kit.variants import diagnose, tensor_match
from grader.runs import run_side

LAB = "14_inference_serving"
RUN = run_side(LAB)  # the learner side: grader/runs/14_inference_serving.py
TITLE = "Inference serving: KV cache, batching, speculation"

_YOURS_COUNTS, _YOURS_IS = "\n  Yours counts {}.", "\n  Yours is {}."  # diagnose(): the mistake a number matches


# --- exercise 1: decoding with a KV cache ----------------------------------------------------------

# compare() settings for logits and caches: cached and uncached passes add the same numbers in different orders
# (a softmax over past + T keys vs T keys, concatenated caches), float32 rounding ~1e-6 of logits of size ~10.
LOGITS = {"dtype": torch.float32, "atol": 1e-4, "rtol": 1e-4}


def _lm_cases(gen, public):
    """Model shape, weights seed, tokens and the chunks they are fed in (prefill chunks, then decode steps of 1)."""
    def case(rule, heads, kv, chunks, batch=None):
        cfg = LMConfig(vocab=randint(gen, 40, 96), d_model=8 * heads * choice(gen, [1, 2]), n_layers=2,
                       n_heads=heads, n_kv_heads=kv, d_ff=randint(gen, 32, 96))
        b = batch or randint(gen, 1, 3)
        tokens = torch.randint(0, cfg.vocab, (b, sum(chunks)), generator=gen)
        name = (f"{rule}{':' if rule else ''} n_heads={heads} n_kv_heads={kv}, batch {b}, "
                f"chunks {'+'.join(map(str, chunks))} tokens")
        return Case(name.strip(), dict(cfg=dict(cfg.__dict__), seed=randint(gen, 0, 2**30), tokens=tokens,
                                       chunks=list(chunks)))

    if public:
        return [case("", 4, 4, [5, 1, 1, 1], 2), case("", 4, 2, [6, 1, 1, 1, 1], 2), case("", 4, 1, [4, 1, 1], 1),
                case("", 4, 2, [3, 4, 1, 1], 2), case("", 2, 1, [1, 1, 1, 1], 3)]
    decode = lambda: [1] * randint(gen, 2, 5)  # noqa: E731
    return [case("multi-head attention", 4, 4, [randint(gen, 2, 8)] + decode()),
            case("grouped-query attention", choice(gen, [4, 8]), 2, [randint(gen, 2, 8)] + decode()),
            case("multi-query attention", 4, 1, [randint(gen, 2, 8)] + decode()),
            case("chunked prefill", 4, 2, [randint(gen, 2, 5), randint(gen, 2, 5)] + decode()),
            case("a one-token prompt", 4, 2, [1] + decode())]


def reference_cached(model, tokens, chunks, *, positions="absolute", mask="shifted", store_swapped=False):
    """(logits (B, sum(chunks), vocab), [(k, v) per block]) of a cached pass, with knobs for the classic mistakes."""
    cache, outs, past = None, [], 0
    for t in chunks:
        pos = torch.arange(past, past + t) if positions == "absolute" else torch.arange(t)
        every = torch.ones(t, past + t, dtype=torch.bool)  # (new queries, all keys): which ones a query sees
        keep = {"shifted": every.tril(past), "unshifted": every.tril(0), "none": every}[mask]
        x, new = model.embed(tokens[:, past:past + t]), []
        for i, block in enumerate(model.blocks):
            q, k, v = block.project_qkv(x, pos)
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            new.append((v, k) if store_swapped else (k, v))
            kh, vh = (kv.repeat_interleave(q.shape[1] // k.shape[1], 1) for kv in (k, v))  # (B, H, past + t, hd)
            scores = q @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])              # (B, H, t, past + t)
            x = x + block.project_out(scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vh)
            x = x + block.feed_forward(x)
        outs.append(model.logits(x))
        cache, past = new, past + t
    return torch.cat(outs, 1), cache


def _lm_judge(case, obs):
    x = case.inputs
    cfg, chunks, b = LMConfig(**x["cfg"]), x["chunks"], x["tokens"].shape[0]
    if "bad_return" in obs:
        return f"forward_cached must return a pair (logits, cache), got {obs['bad_return']}."
    if "bad_cache" in obs:
        return (f"the cache forward_cached returned is a {obs['bad_cache']}: it must be a list with one (k, v) pair "
                "per block, each (B, n_kv_heads, positions so far, head_dim).")
    past = 0
    for step, (t, out, shapes) in enumerate(zip(chunks, obs["logits"], obs["shapes"])):
        past += t
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (b, t, cfg.vocab):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return f"call {step} (a chunk of {t} tokens): logits {got}, expected (B, T, vocab) = {(b, t, cfg.vocab)}."
        if len(shapes) != cfg.n_layers:
            return (f"after call {step} the cache has {len(shapes)} entries; it needs one (k, v) pair per block "
                    f"({cfg.n_layers}).")
        want = (b, cfg.n_kv_heads, past, cfg.head_dim)
        for got_k, got_v in shapes:
            if got_k[:2] + got_k[3:] == (b, cfg.n_heads, cfg.head_dim) and cfg.n_heads != cfg.n_kv_heads:
                return (f"after call {step} the cached keys are {got_k}, with n_heads = {cfg.n_heads} heads: store the "
                        f"n_kv_heads = {cfg.n_kv_heads} key/value heads, before repeating them for the query heads. "
                        "That is the whole point of GQA/MQA: a cache n_heads / n_kv_heads times smaller.")
            if got_k != want or got_v != want:
                return (f"after call {step} (positions 0..{past - 1} seen) the cache holds k {got_k} and v {got_v}; "
                        f"expected (B, n_kv_heads, positions so far, head_dim) = {want}: append the new positions' "
                        "keys and values along dim 2 and return the extended cache.")
    for step, (t, n) in enumerate(zip(chunks, obs["processed"])):
        if n != t:
            return (f"call {step} fed {t} new token(s), but the q/k/v projections ran over {n} positions: compute "
                    "only the new positions and take the earlier keys and values from the cache.")
    model, tokens = make_lm(cfg, x["seed"], dtype=torch.float64), x["tokens"]
    ref = lambda **mistake: reference_cached(model, tokens, chunks, **mistake)  # noqa: E731
    same = tensor_match(**LOGITS)
    with torch.no_grad():
        got, want, ref_cache = torch.cat(obs["logits"], 1), model(tokens), ref()[1]
        report = diagnose(compare(got, want, name="logits (all calls, concatenated)", **LOGITS), got, [
            ("positions restarting at 0 in every call: pass positions past..past+T-1 to project_qkv (RoPE must "
             "rotate each token at its absolute position)", lambda: ref(positions="relative")[0]),
            ("attention with no causal mask inside a chunk: new token i must not see the new tokens after it",
             lambda: ref(mask="none")[0]),
            ("a causal mask not shifted by the cached length: query i of the chunk sits at position past + i and "
             "sees keys 0..past+i (tril(diagonal=past))", lambda: ref(mask="unshifted")[0]),
            ("keys and values swapped in the cache (stored as (v, k))", lambda: ref(store_swapped=True)[0]),
        ], same, "\n  Your logits match {} instead.")
    if report:
        return report
    for i, ((k, v), (rk, rv)) in enumerate(zip(obs["cache"], ref_cache)):
        if same(k, rk) and same(v, rv):
            continue
        if same(k, rv):
            return f"block {i}: the cache pair is (values, keys); store it as (k, v)."
        return (f"block {i}: the cached keys or values differ from the model's (keys after RoPE at their absolute "
                f"positions, values as projected).\n  " + (compare(k, rk, name="k", **LOGITS)
                                                           or compare(v, rv, name="v", **LOGITS)))
    return None


KV_DECODE = Exercise(
    "kv_cache_decode", 4, ("forward_cached",), neutral(_lm_cases), RUN._lm_run, _lm_judge,
    title="Decoding with a KV cache",
    hint="past = cache length; positions = arange(past, past + T); per block: q, k, v = project_qkv(x, positions), k "
         "and v = cat(cached, new) on dim 2, repeat k and v n_heads // n_kv_heads times for attention (not in the "
         "cache), mask with ones(T, past + T).tril(past), then project_out, residual, feed_forward, residual.")


# --- exercise 2: KV-cache bytes and the batch that fits ---------------------------------------------

def ref_kv_cache_bytes(spec: ModelSpec, batch: int, seq_len: int, dtype_bytes: int) -> int:
    """K and V, per layer, per key/value head, per position: 2 L n_kv d_head bytes x batch x seq_len."""
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * dtype_bytes * batch * seq_len


def _bytes_cases(gen, public):
    def case(rule, spec, batch, seq_len, kv_bytes, gpu_gb=80, weight_bytes=2):
        name = (f"{rule}{': ' if rule else ''}{spec.name} (L={spec.n_layers}, heads {spec.n_heads}/{spec.n_kv_heads} "
                f"kv, head_dim {spec.head_dim}, {spec.n_params / 1e9:.1f}B params), batch {batch}, {seq_len} tokens, "
                f"KV {kv_bytes} B/value; {gpu_gb} GB GPU, weights {weight_bytes} B/param")
        return Case(name, dict(spec=dict(spec.__dict__), batch=batch, seq_len=seq_len, kv_bytes=kv_bytes,
                               gpu_bytes=gpu_gb * 1e9, weight_bytes=weight_bytes))

    def spec(kind):  # a random model with MHA, GQA or MQA
        layers, head_dim, heads = randint(gen, 8, 96), choice(gen, [64, 80, 128]), 8 * randint(gen, 1, 12)
        kv, d = {"MHA": heads, "GQA": choice(gen, [2, 4, 8]), "MQA": 1}[kind], heads * head_dim
        return ModelSpec(f"a random {kind} model", layers, d, heads, kv, head_dim, float(12 * layers * d * d))

    if public:
        return [case("", MODELS[name], *sizes) for name, *sizes in [
            ("Llama-2-7B", 1, 4096, 2), ("Llama-2-70B", 8, 4096, 2, 320), ("Mistral-7B", 16, 8192, 1, 80, 1),
            ("Falcon-7B", 4, 2048, 2), ("Llama-2-70B", 1, 4096, 2, 80)]]
    seq = lambda: 256 * randint(gen, 1, 128)  # noqa: E731
    real = MODELS[choice(gen, sorted(MODELS))]
    return [case("multi-head attention", spec("MHA"), randint(gen, 1, 64), seq(), 2),
            case("grouped-query attention", spec("GQA"), randint(gen, 1, 64), seq(), 2),
            case("multi-query attention", spec("MQA"), randint(gen, 1, 64), seq(), 2),
            case("an int8 cache", spec("GQA"), randint(gen, 1, 64), seq(), 1, 80, 1),
            case("a published model", real, randint(gen, 1, 32), seq(), 2, choice(gen, [40, 80, 141])),
            case("weights that do not fit", MODELS["Llama-2-70B"], 1, seq(), 2, choice(gen, [24, 40, 80])),
            # the cache and the weights in different dtypes: each count takes its own bytes per value
            case("an int8 cache beside 16-bit weights", spec("GQA"), randint(gen, 1, 64), seq(), 1, 80, 2),
            case("8-bit weights beside a 16-bit cache", spec("GQA"), randint(gen, 1, 64), seq(), 2, 80, 1)]


def _bytes_judge(case, obs):
    x = case.inputs
    number = lambda v: None if isinstance(v, bool) or not isinstance(v, (int, float)) else v  # noqa: E731
    spec, b, s, nb = ModelSpec(**x["spec"]), x["batch"], x["seq_len"], x["kv_bytes"]
    want = ref_kv_cache_bytes(spec, b, s, nb)
    got = number(obs["bytes"])
    if got is None or not close(got, want):
        one = want // (2 * spec.n_layers * spec.n_kv_heads * spec.head_dim)
        return diagnose(
            f"kv_cache_bytes = {obs['bytes']!r}, expected 2 x layers x n_kv_heads x head_dim x dtype_bytes x batch "
            f"x seq_len = 2 x {spec.n_layers} x {spec.n_kv_heads} x {spec.head_dim} x {nb} x {b} x {s} = {want}.",
            got, [
                ("n_heads: the query heads. Only the n_kv_heads key/value heads are cached (GQA/MQA)",
                 2 * spec.n_layers * spec.n_heads * spec.head_dim * one),
                ("one of K and V: the cache holds both, a factor 2", want / 2),
                ("d_model per KV head", 2 * spec.n_layers * spec.n_kv_heads * spec.d_model * one),
                ("bits: dtype_bytes is already in bytes", want * 8)], close, _YOURS_COUNTS)
    weights, per_seq = spec.n_params * x["weight_bytes"], ref_kv_cache_bytes(spec, 1, s, nb)
    free = x["gpu_bytes"] - weights
    exact, want, got = free / per_seq, max(0, int(free // per_seq)), number(obs["max_batch"])  # sequences that fit
    if got is not None and (got == want or (abs(exact - round(exact)) < 1e-6 and abs(got - exact) < 1 + 1e-6)):
        return None
    why = (f"the weights ({weights / 1e9:.1f} GB) leave {free / 1e9:.2f} GB, and one sequence of {s} tokens needs "
           f"{per_seq / 1e9:.3f} GB of cache" if free > 0 else
           f"the weights alone ({weights / 1e9:.1f} GB) do not fit in {x['gpu_bytes'] / 1e9:.0f} GB: no sequence fits")
    message = f"max_batch = {obs['max_batch']!r}, expected {want}: {why}."
    if got is not None and got < 0:
        return message + _YOURS_IS.format("a negative count: return 0 when the weights leave no room")
    in_dtype = lambda nbytes, weights: max(0, int((x["gpu_bytes"] - weights) // nbytes))  # noqa: E731
    return diagnose(message, got, [
        ("the KV cache given the whole GPU: subtract the weights first", int(x["gpu_bytes"] // per_seq)),
        ("the cache counted in the weights' bytes per value: the cache takes kv_dtype_bytes, the weights "
         "weight_bytes", in_dtype(ref_kv_cache_bytes(spec, 1, s, x["weight_bytes"]), weights)),
        ("the weights counted in the cache's bytes per value: n_params x weight_bytes",
         in_dtype(per_seq, spec.n_params * nb)),
        ("a count rounded up: a sequence that does not fit entirely does not fit", math.ceil(exact))],
        lambda g, w: g == w, _YOURS_IS)


KV_BYTES = Exercise(
    "kv_cache_bytes", 2, ("kv_cache_bytes", "max_batch"), neutral(_bytes_cases), RUN._bytes_run, _bytes_judge,
    title="KV-cache bytes, and the batch that fits beside the weights",
    hint="Per token: 2 (K and V) x n_layers x n_kv_heads x head_dim x dtype_bytes. max_batch: (gpu_bytes - n_params x "
         "weight_bytes) // (bytes of one sequence of seq_len tokens), and 0 if the weights leave no room.")


# --- exercise 3: a forward step on the roofline ----------------------------------------------------

def ref_step(spec: ModelSpec, batch: int, new_tokens: int, context: int, dtype_bytes: int, peaks: Peaks) -> dict:
    """FLOPs: 2 per parameter and token, plus 4 head_dim per head, layer and attended key; bytes: weights, KV cache."""
    attended = new_tokens * context + new_tokens * (new_tokens + 1) / 2
    flops = 2 * spec.n_params * batch * new_tokens + 4 * spec.n_layers * spec.n_heads * spec.head_dim * batch * attended
    nbytes = spec.n_params * dtype_bytes + ref_kv_cache_bytes(spec, batch, context + new_tokens, dtype_bytes)
    t_compute, t_memory = flops / (peaks.matmul_tflops * 1e12), nbytes / (peaks.copy_gbps * 1e9)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "seconds": max(t_compute, t_memory),
            "bound": "compute" if t_compute > t_memory else "memory"}


def _step_cases(gen, public):
    def case(rule, spec, batch, new_tokens, context, peaks, dtype_bytes=2):
        what = "decode" if new_tokens == 1 else f"prefill of {new_tokens} tokens"
        name = (f"{rule}{': ' if rule else ''}{spec.name}, {what}, batch {batch}, {context} cached tokens; peaks "
                f"{peaks.matmul_tflops:g} TFLOP/s, {peaks.copy_gbps:g} GB/s")
        return Case(name, dict(spec=dict(spec.__dict__), batch=batch, new_tokens=new_tokens, context=context,
                               dtype_bytes=dtype_bytes, peaks=dict(peaks.__dict__)))

    def peaks():  # a random GPU
        return Peaks(device="cuda", name="a GPU", copy_gbps=round(uniform(gen, 500, 4000)),
                     matmul_tflops=round(uniform(gen, 50, 1000)), matmul_dtype="float16", copy_bytes=0, matmul_size=0)

    if public:
        seven, seventy = MODELS["Llama-2-7B"], MODELS["Llama-2-70B"]
        h100 = Peaks("cuda", "H100 datasheet", 3350.0, 989.0, "float16", 0, 0)
        return [case("", seven, 1, 1, 512, h100), case("", seven, 256, 1, 512, h100), case("", seven, 1, 2048, 0, h100),
                case("", seventy, 32, 1, 4096, h100), case("", seven, 4, 512, 1024, peaks())]
    spec = lambda: MODELS[choice(gen, sorted(MODELS))]  # noqa: E731
    return [case("decode at batch 1", spec(), 1, 1, randint(gen, 0, 4096), peaks()),
            case("decode at a large batch", spec(), randint(gen, 128, 1024), 1, randint(gen, 0, 512), peaks()),
            case("decode with a long context", spec(), randint(gen, 8, 64), 1, randint(gen, 16384, 131072), peaks()),
            case("prefill", spec(), randint(gen, 1, 8), randint(gen, 512, 8192), 0, peaks()),
            case("prefill after cached tokens", spec(), randint(gen, 1, 4), randint(gen, 64, 2048),
                 randint(gen, 256, 8192), peaks())]


def _step_judge(case, obs):
    x = case.inputs
    spec, peaks, b, t, nb = ModelSpec(**x["spec"]), Peaks(**x["peaks"]), x["batch"], x["new_tokens"], x["dtype_bytes"]
    want = ref_step(spec, b, t, x["context"], nb, peaks)
    if "bad_return" in obs:
        return f"step_roofline must return a dict with flops, bytes, intensity, seconds and bound; got a " \
               f"{obs['bad_return']}."
    missing = [k for k in want if k not in obs]
    if missing:
        return f"step_roofline's dict lacks {', '.join(missing)}."
    matmul, weights = 2 * spec.n_params * b * t, spec.n_params * nb
    t_c, t_m = want["flops"] / (peaks.matmul_tflops * 1e12), want["bytes"] / (peaks.copy_gbps * 1e9)
    expected = {  # per number: what it should be, the mistakes it may match, and how such a match reads
        "flops": (f"{want['flops']:.6g}: 2 x n_params x batch x new_tokens ({matmul:.4g}) plus attention "
                  f"({want['flops'] - matmul:.4g}; token i of the step attends context + i + 1 keys).", [
                      ("only the matmuls: add attention's 4 x layers x n_heads x head_dim per attended key", matmul),
                      ("attention over the n_kv_heads key/value heads: every query head computes its own scores "
                       "(n_heads)", matmul + (want["flops"] - matmul) * spec.n_kv_heads / spec.n_heads),
                      ("every new token attending all the step's tokens: token i attends context + i + 1 keys (the "
                       "causal half, T (T + 1) / 2)", matmul + (want["flops"] - matmul) * (x["context"] + t) * t
                       / (t * x["context"] + t * (t + 1) / 2))],
                  _YOURS_COUNTS),
        "bytes": (f"{want['bytes']:.6g}: the weights once ({weights:.4g}) plus the KV cache of context + new_tokens "
                  "positions for the batch.", [
                      ("the weights once per sequence: the whole batch shares one read of the weights per step (why "
                       "batching makes decode cheaper)", weights * b + want["bytes"] - weights),
                      ("no KV cache: every cached position's keys and values are read too", weights),
                      ("the KV cache of the new tokens only: the cached positions are read as well",
                       weights + ref_kv_cache_bytes(spec, b, t, nb))], _YOURS_COUNTS),
        "intensity": (f"flops / bytes = {want['intensity']:.6g} FLOP/B.", [], _YOURS_IS),
        "seconds": (f"max(flops / peak FLOP/s, bytes / peak bytes/s) = max({t_c:.4g}, {t_m:.4g}) = "
                    f"{want['seconds']:.6g}; the peaks are in TFLOP/s and GB/s.", [
                        ("the sum of the two times: on the roofline the step takes the longer one (compute and "
                         "memory traffic overlap)", t_c + t_m), ("in milliseconds", want["seconds"] * 1e3)],
                    _YOURS_IS)}
    for key, (text, variants, template) in expected.items():
        if not close(obs[key], want[key]):
            return diagnose(f"{key} = {obs[key]!r}, expected {text}", obs[key], variants, close, template)
    if obs["bound"] == want["bound"]:
        return None
    return (f"bound = {obs['bound']!r}, expected {want['bound']!r}: compute takes {t_c:.4g} s and memory {t_m:.4g} s "
            f"(intensity {want['intensity']:.1f} FLOP/B vs the ridge {peaks.ridge_point:.1f} FLOP/B).")


ROOFLINE = Exercise("decode_roofline", 2, ("step_roofline",), neutral(_step_cases), RUN._step_run, _step_judge,
                    title="Prefill and decode on the roofline", hint=(
                        "flops = 2 n_params B T + 4 L n_heads head_dim B (T context + T(T+1)/2); bytes = n_params "
                        "dtype_bytes + kv_cache_bytes(spec, B, context + T, dtype_bytes); seconds = max(flops / "
                        "(matmul_tflops 1e12), bytes / (copy_gbps 1e9)); bound: the larger one."))


# --- exercise 4: a paged KV cache's block manager ---------------------------------------------------

def _paged_ops(gen, rule: str, num_blocks: int, bs: int) -> list:
    """Operations ``["append", seq, n]`` / ``["free", seq]`` that exercise ``rule`` on a pool of ``num_blocks``."""
    lengths, ops = {}, []
    free_blocks = lambda: num_blocks - sum(math.ceil(n / bs) for n in lengths.values())  # noqa: E731

    def append(seq, n):
        ops.append(["append", seq, n])
        old = lengths.get(seq, 0)
        if math.ceil((old + n) / bs) - math.ceil(old / bs) <= free_blocks():
            lengths[seq] = old + n

    def free(seq):
        ops.append(["free", seq])
        lengths.pop(seq)

    for seq in range(3):  # three sequences with prompts of a block or two
        append(seq, randint(gen, 1, 2 * bs))
    if rule == "one token at a time":
        for _ in range(3 * bs):
            append(randint(gen, 0, 2), 1)
    elif rule == "several tokens per append":
        for _ in range(6):
            append(randint(gen, 0, 2), randint(gen, 2, 2 * bs + 1))
    elif rule == "an append that does not fit changes nothing":
        while free_blocks() > 1:
            append(0, bs)
        room = math.ceil(lengths[1] / bs) * bs - lengths[1]         # free slots in sequence 1's last block
        append(1, room + bs + 1)                                   # needs two blocks, one is free: MemoryError
        append(1, room + 1)                                        # needs the one free block
        append(2, 2 * bs)                                          # needs two blocks, none is free
    elif rule == "free and reuse":
        free(1)
        while free_blocks() > 0:
            append(3, randint(gen, 1, bs))
        free(0)
        append(4, randint(gen, 1, 2 * bs))
        append(0, randint(gen, 1, bs))        # a freed id comes back: a new sequence, from position 0
    elif rule == "a new sequence that does not fit":
        append(5, (free_blocks() + 1) * bs)   # one block too many: MemoryError, no table for sequence 5
        append(5, free_blocks() * bs)         # exactly the free blocks: fits
    return ops


def _paged_cases(gen, public):
    cases = []
    for rule, nb, bs in [("one token at a time", 12, 4), ("several tokens per append", 16, 4),  # public sizes
                         ("an append that does not fit changes nothing", 10, 4), ("free and reuse", 9, 2),
                         ("a new sequence that does not fit", 12, 3)]:
        if not public:
            bs = choice(gen, [1, 2, 4, 8, 16])
            nb = randint(gen, 8, 16) if bs > 1 else randint(gen, 40, 64)
        cases.append(Case(f"{rule}: num_blocks={nb}, block_size={bs}",
                          dict(num_blocks=nb, block_size=bs, ops=_paged_ops(gen, rule, nb, bs))))
    return cases


def _paged_judge(case, obs):
    x, nb, bs = case.inputs, case.inputs["num_blocks"], case.inputs["block_size"]
    lengths, before, free_before = {}, {}, nb  # tokens per sequence; the learner's tables and num_free() so far
    for i, (op, seen) in enumerate(zip(x["ops"], obs["log"])):
        where = f"operation {i}, " + (f"append({op[1]}, {op[2]})" if op[0] == "append" else f"free({op[1]})")
        state = ", ".join(f"sequence {s}: {n} tokens" for s, n in lengths.items()) or "empty"
        failed = seen["result"] == "MemoryError"
        if op[0] == "append":
            _, seq, n = op
            old = lengths.get(seq, 0)
            need = math.ceil((old + n) / bs) - math.ceil(old / bs)
            free = nb - sum(math.ceil(v / bs) for v in lengths.values())
            if need > free and not failed:
                return (f"{where}: it needs {need} more block(s) and only {free} of {nb} are free ({state}); "
                        f"append must raise MemoryError, but returned {seen['result']!r}.")
            if need <= free and failed:
                return (f"{where}: raised MemoryError, but it needs only {need} more block(s) and {free} are free "
                        f"({state}; block_size {bs}: a sequence of L tokens holds ceil(L / block_size) blocks).")
            if need <= free:
                lengths[seq] = old + n
        else:
            lengths.pop(op[1])
        tables = {s: seen["tables"].get(s, seen["tables"].get(str(s))) for s in lengths}
        changed = [s for s in lengths if s in before and tables[s] != before[s]]
        if failed and (changed or seen["free"] != free_before):
            what = (f"sequence {changed[0]}'s block table went from {before[changed[0]]} to {tables[changed[0]]}"
                    if changed else f"num_free() went from {free_before} to {seen['free']}")
            return (f"{where} raised MemoryError, but {what}: a failed append must change nothing (check that "
                    "all the blocks it needs are free before taking any), or the blocks it took are lost.")
        for s, n in lengths.items():
            table, old_table = tables[s], before.get(s)
            if table is None:
                return f"after {where}: block_table({s}) raised, but sequence {s} holds {n} tokens."
            if len(table) != math.ceil(n / bs):
                return (f"after {where}: sequence {s} holds {n} tokens in {len(table)} blocks {table}; with "
                        f"block_size {bs} it needs exactly ceil({n} / {bs}) = {math.ceil(n / bs)}: take a new block "
                        "only when the last one is full (at most one partly filled block per sequence).")
            if any(not 0 <= blk < nb for blk in table):
                return f"after {where}: sequence {s}'s block table {table} names blocks outside 0..{nb - 1}."
            if old_table and table[:len(old_table)] != old_table:
                return (f"after {where}: sequence {s}'s block table changed from {old_table} to {table}: blocks "
                        "that hold its cached keys and values must stay where they are.")
        owners: dict = {}
        for s in lengths:
            for blk in tables[s]:
                if blk in owners:
                    return f"after {where}: block {blk} belongs to sequences {owners[blk]} and {s} at once."
                owners[blk] = s
        if seen["free"] != nb - len(owners):
            return (f"after {where}: num_free() = {seen['free']}, but {len(owners)} of {nb} blocks are in block tables "
                    f"({state}), so {nb - len(owners)} are free. Blocks go back to the pool on free(), and a "
                    "failed append takes none.")
        if op[0] == "append" and not failed:
            _, seq, n = op
            want = [[tables[seq][p // bs], p % bs] for p in range(lengths[seq] - n, lengths[seq])]
            if seen["result"] != want:
                return (f"{where} returned the slots {seen['result']}; tokens {lengths[seq] - n}..{lengths[seq] - 1} "
                        f"of sequence {seq} go to (block_table[p // block_size], p % block_size) = {want}.")
        before, free_before = {s: list(tables[s]) for s in lengths}, seen["free"]
    return None


PAGED_KV = Exercise(
    "paged_kv", 3, ("BlockManager",), neutral(_paged_cases), RUN._paged_run, _paged_judge,
    title="A paged KV cache: blocks and block tables",
    hint="Keep a list of free block ids, and per sequence its block table and length. append: need = ceil((length + "
         "n) / block_size) - len(table); raise MemoryError before changing anything if need > free; slot of token p = "
         "(table[p // block_size], p % block_size). free: give the sequence's blocks back.")


# --- exercise 5: continuous batching under a memory budget -----------------------------------------

def fcfs_batch(live: list, generated: dict, num_blocks: int, block_size: int, max_batch: int) -> list:
    """The reference: the longest prefix of the live requests (oldest first) that fits max_batch and num_blocks."""
    batch, used = [], 0
    for r in live:
        need = math.ceil((r.prompt_len + generated[r.rid]) / block_size)
        if len(batch) == max_batch or used + need > num_blocks:
            break
        batch.append(r.rid)
        used += need
    return batch


def _sched_cases(gen, public):
    """Per rule, a block budget and requests (arrival step, prompt_len, max_new_tokens) that exercise it."""
    cases = []
    for rule in ("light load", "a full batch", "requests that outgrow the budget (preemption)",
                 "a stream of arrivals behind a long request", "a large prompt at the head of the queue"):
        bs, num_blocks, max_batch = choice(gen, [2, 4, 8]), 64, 8
        if rule == "light load":
            specs = [(randint(gen, 0, 12), randint(gen, 1, 3 * bs), randint(gen, 1, 6)) for _ in range(5)]
        elif rule == "a full batch":
            specs = [(randint(gen, 0, 2), randint(gen, 1, bs), randint(gen, 2, 8)) for _ in range(9)]
            max_batch = randint(gen, 2, 4)
        elif rule == "requests that outgrow the budget (preemption)":
            n = randint(gen, 3, 4)
            specs = [(0, randint(gen, bs + 1, 2 * bs), randint(gen, 3 * bs, 4 * bs)) for _ in range(n)]
            num_blocks = 3 * n
        elif rule == "a stream of arrivals behind a long request":
            specs = [(0, randint(gen, 1, bs), randint(gen, 12, 20))] + \
                    [(t, randint(gen, 1, bs), randint(gen, 1, 3)) for t in range(1, 16)]
            max_batch = 2
        else:  # request 0 holds 2 blocks, request 1 needs 5 (up to 6 as it grows): it waits for 0, the small ones too
            specs = [(0, randint(gen, bs + 1, 2 * bs), randint(gen, 6, 9)), (1, 5 * bs, randint(gen, 2, bs))] + \
                    [(2 + i, randint(gen, 1, bs), randint(gen, 1, 3)) for i in range(4)]
            num_blocks = 6
        requests = [dict(rid=i, arrival=a, prompt_len=p, max_new_tokens=m) for i, (a, p, m) in enumerate(specs)]
        name = f"{rule}: {len(requests)} requests, num_blocks={num_blocks}, block_size={bs}, max_batch={max_batch}"
        cases.append(Case(name, dict(num_blocks=num_blocks, block_size=bs, max_batch=max_batch, requests=requests)))
    return cases


def _sched_judge(case, obs):
    x, batches = case.inputs, obs["batches"]
    nb, bs, mb = x["num_blocks"], x["block_size"], x["max_batch"]
    reqs = sorted((Request(**r) for r in x["requests"]), key=lambda r: (r.arrival, r.rid))
    generated, finished_at, live, running = {r.rid: 0 for r in reqs}, {}, [], []
    for t in range(len(batches) + 1):  # replay the trace up to the first step whose batch is not the reference's
        live += [r for r in reqs if r.arrival == t]
        if t == len(batches):
            if live or len(finished_at) < len(reqs):
                return (f"after {len(batches)} steps, requests {sorted(r.rid for r in live)} have not finished: "
                        "step() stopped running them.")
            return None
        got, want = batches[t], fcfs_batch(live, generated, nb, bs, mb)
        if sorted(got) != sorted(want):
            break
        for rid in want:
            generated[rid] += 1
        for r in list(live):
            if generated[r.rid] == r.max_new_tokens:
                live.remove(r)
                finished_at[r.rid] = t
        running = [rid for rid in want if rid not in finished_at]
    # step t is wrong: the live requests, then the first rule the batch breaks
    need = {r.rid: math.ceil((r.prompt_len + generated[r.rid]) / bs) for r in live}
    table = "\n".join(f"    request {r.rid}: arrived at step {int(r.arrival)}, {r.prompt_len} + {generated[r.rid]} "
                      f"tokens, {need[r.rid]} block(s){' (running)' if r.rid in running else ''}"
                      for r in live) or "    (none)"
    head = (f"step {t}: your batch {got}, expected {want} (first come, first served under {nb} blocks of {bs} "
            f"tokens and max_batch {mb}).\n  Live requests, oldest first:\n{table}\n  ")
    for rid in got:
        if rid in finished_at:
            return head + (f"Request {rid} finished at step {finished_at[rid]}: it generated all its tokens, retire "
                           "it (remove it from your queues) in the step it finishes.")
        if rid not in need:
            return head + f"Request {rid} is not a live request (not arrived yet, or unknown)."
    if len(set(got)) != len(got):
        return head + "A request appears twice in the batch."
    if len(got) > mb:
        return head + f"{len(got)} requests run, more than max_batch = {mb}."
    used = sum(need[rid] for rid in got)
    if used > nb:
        return head + (f"Your batch needs {used} blocks, over the budget of {nb}: " + (
            "these requests were all running and grew past it. Preempt the newest running request(s) (drop their "
            "cache; they wait and recompute later) until the rest fit." if all(rid in running for rid in got) else
            "admit a waiting request only if its blocks fit beside the running ones."))
    oldest = live[0].rid
    if oldest not in got:
        return head + (f"Request {oldest}, the oldest, was left out while newer ones ran. Serving newest first "
                       "(LIFO), or preempting the oldest, lets a request wait forever while new ones keep arriving "
                       "(starvation): always serve in arrival order.")
    left_out, extra = [rid for rid in want if rid not in got], [rid for rid in got if rid not in want]
    if left_out and extra:
        return head + (f"Request {left_out[0]} is older than {extra[0]} and fits: first come, first served (preempt "
                       "the newest running requests, admit the oldest waiting ones).")
    if extra:
        blocker = live[len(want)].rid
        return head + (f"Request {blocker} does not fit (it needs {need[blocker]} blocks), so the requests behind it "
                       f"wait too; you let newer, smaller request(s) {extra} past it. Skipping ahead can keep the "
                       "large request waiting forever (starvation): stop at the first request that does not fit.")
    return head + (f"Request {left_out[0]} fits beside the batch (and the batch has room): continuous batching "
                   "admits it now, since an empty slot in a step is throughput lost.")


SCHEDULER = Exercise(
    "continuous_batching", 4, ("Scheduler",), neutral(_sched_cases), RUN._sched_run, _sched_judge,
    title="Continuous batching: admit, decode, retire, preempt under a memory budget", hint=(
        "Keep the live requests in arrival order with their generated counts. step(): walk them oldest first, taking "
        "each while len(batch) < max_batch and its ceil((prompt + generated) / block_size) blocks fit; stop at the "
        "first that does not. Then each batch member generates one token; drop those that reached max_new_tokens."))


# --- exercise 6: speculative decoding's rejection sampling ----------------------------------------

P_FAIL = 1e-6   # a chi-square p-value below this fails; a correct answer fails once in a million cases


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (bins expecting < 5 pooled; 0 if impossible)."""
    counts, probs = counts.double(), probs.double() / probs.double().sum()
    if bool(((probs == 0) & (counts > 0)).any()):
        return 0.0
    expected = probs * counts.sum()
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    obs, exp = counts[expected > 0], expected[expected > 0]
    if len(exp) < 2:
        return 1.0
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((len(exp) - 1) / 2, dtype=torch.float64), stat / 2))


def accept_count_probs(alpha: torch.Tensor) -> torch.Tensor:
    """P(j drafts accepted), j = 0..k, when draft i is accepted with probability alpha[i] (stop at a rejection)."""
    survive = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(alpha.double(), 0)])  # P(>= j accepted)
    return torch.cat([survive[:len(alpha)] * (1 - alpha.double()), survive[len(alpha):]])


def _first_token_variants(p, q):
    a0 = torch.minimum(p[0], q[0])  # first drafts accepted; a rejection (1 - sum(a0)) resamples
    return [("resampling from the draft's q on a rejection (the residual (p - q)+ is what restores p)",
             a0 + (1 - a0.sum()) * q[0]),
            ("resampling from the target's p on a rejection, not from the residual (p - q)+ normalised",
             a0 + (1 - a0.sum()) * p[0]),
            ("accepting every draft token: the draft's q", q[0])]


def _spec_cases(gen, public):
    """Per rule, target p (k+1, vocab) and draft q (k, vocab); the public cases: vocabulary 8, no rule's zeros."""
    cases = []
    for rule, k, sigma in [("one draft token", 1, 0.8), ("a close draft", 4, 0.4), ("a poor draft", 3, 2.0),
                           ("a draft that never proposes some tokens", 3, 0.6),
                           ("tokens the target never emits", 3, 0.6)]:
        rule, vocab = ("", 8) if public else (rule, randint(gen, 5, 10))
        for _ in range(100):  # until every wrong first-token variant is far from p[0] (fails at P_FAIL)
            logits = randn(gen, k + 1, vocab, scale=1.5).double()
            p = logits.softmax(-1)
            q = (logits[:k] + randn(gen, k, vocab, scale=sigma).double()).softmax(-1)
            if rule == "a draft that never proposes some tokens":
                q[:, torch.randperm(vocab, generator=gen)[:2]] = 0
            if rule == "tokens the target never emits":
                p[:, torch.randperm(vocab, generator=gen)[:2]] = 0
            p, q = (p / p.sum(-1, keepdim=True)).float(), (q / q.sum(-1, keepdim=True)).float()
            firsts = [v for _, v in _first_token_variants(p.double(), q.double())]
            if all(float(((v - p[0].double()) ** 2 / p[0].double().clamp_min(1e-3)).sum()) >= 0.04 for v in firsts):
                break
        cases.append(Case(f"{rule}{': ' if rule else ''}k={k} draft tokens, vocabulary {vocab}",
                          dict(p=p, q=q, seed=randint(gen, 0, 2**30))))
    return cases


def _spec_judge(case, obs):
    p, q, k = case.inputs["p"].double(), case.inputs["q"].double(), case.inputs["q"].shape[0]
    if "invalid" in obs:
        return (f"speculative_verify {obs['invalid']}: it must return the accepted draft tokens (a prefix of the "
                f"draft) followed by one more token, 1 to k + 1 = {k + 1} ids in 0..{p.shape[1] - 1}.")
    accept = accept_count_probs(torch.minimum(p[:k], q).sum(-1))  # draft i is accepted with sum(min(p[i], q[i]))
    tests = [("the number of draft tokens you accept", obs["accepted"], accept, [
                 ("accepting every draft token", torch.eye(k + 1, dtype=torch.float64)[k]),
                 ("no bonus token: when all k drafts are accepted, also sample one token from p[k] (the target "
                  "computed it in the same pass)", torch.cat([accept[:k - 1], accept[k - 1:].sum().reshape(1),
                                                               torch.zeros(1, dtype=torch.float64)])),
                 ("accepting draft x with probability p(x), not min(1, p(x) / q(x))",
                  accept_count_probs((p[:k] * q).sum(-1))),
                 ("accepting draft x only when p(x) >= q(x), not with probability min(1, p(x) / q(x))",
                  accept_count_probs((q * (p[:k] >= q)).sum(-1)))]),
             ("the first token you emit", obs["first"], p[0], _first_token_variants(p, q))]
    if k >= 2 and obs["second"].sum() >= 100:
        tests.append(("the second token you emit (when the first draft was accepted)", obs["second"], p[1], []))
    if obs["bonus"].sum() >= 100:
        tests.append(("the bonus token (after all k drafts were accepted)", obs["bonus"], p[k], [
            ("sampling it from the draft's last distribution q[k-1]", q[k - 1])]))
    for what, counts, want, variants in tests:
        pvalue, n = chi2_pvalue(counts, want), float(counts.sum())
        if pvalue >= P_FAIL:
            continue
        label = "accepted" if what.startswith("the number") else "token"
        table = "\n".join(f"    {label} {i}: yours {float(c) / n:.3f}, target {float(w):.3f}"
                          for i, (c, w) in enumerate(zip(counts, want)))
        return diagnose(f"{what} does not follow the target's distribution: chi-square p-value {pvalue:.1e} over "
                        f"{int(counts.sum())} verification steps (fixed seed; a correct answer fails with probability "
                        f"{P_FAIL:g}).\n{table}", counts, variants, lambda c, v: chi2_pvalue(c, v) > 1e-3,
                        "\n  Your frequencies match {}.")
    return None


SPECULATIVE = Exercise("speculative_decoding", 4, ("speculative_verify",), neutral(_spec_cases), RUN._spec_run,
                       _spec_judge,
                       title="Speculative decoding: rejection sampling that keeps the target's distribution", hint=(
                           "For i in 0..k-1: accept draft x = draft_tokens[i] if u < p[i, x] / q[i, x] (u uniform "
                           "from gen); on the first rejection return the accepted ones plus a sample of max(p[i] - "
                           "q[i], 0) normalised. If all k are accepted, add a sample of p[k]."))


# --- exercise 7: decode attention over a paged KV cache (Triton) -----------------------------------

def ref_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, variant: str = ""):
    """Decode attention in float64; ``variant``: a mistake ("logical" blocks, "whole blocks", "head mod")."""
    b, h, d = q.shape
    _, bs, n_kv, _ = k_cache.shape
    out = torch.empty(b, h, d, dtype=torch.float64)
    for s in range(b):
        n = math.ceil(int(seq_lens[s]) / bs) * bs if variant == "whole blocks" else int(seq_lens[s])
        pos = torch.arange(n)  # position p sits at slot p % bs of physical block block_tables[s, p // bs]
        blocks = pos // bs if variant == "logical" else block_tables[s, pos // bs].long()
        for head in range(h):
            kvh = head % n_kv if variant == "head mod" else head // (h // n_kv)
            k, v = (cache[blocks, pos % bs, kvh].double() for cache in (k_cache, v_cache))  # (n, d) each
            out[s, head] = torch.softmax(scale * (k @ q[s, head].double()), 0) @ v
    return out


def _kernel_cases(gen, public):
    def case(rule, b, h, n_kv, d, bs, lens, dtype="float32"):
        """Shuffled physical blocks (unused table entries -1), random stale values in every slot no sequence holds."""
        per_seq = [math.ceil(n / bs) for n in lens]
        num_blocks = sum(per_seq) + randint(gen, 1, 3)
        for _ in range(20):  # until reading logical blocks would give another result
            perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
            tables = torch.full((b, max(per_seq) + randint(gen, 0, 2)), -1, dtype=torch.int32)
            for s, blocks in enumerate(perm[:sum(per_seq)].split(per_seq)):  # each sequence's share of perm
                tables[s, :len(blocks)] = blocks
            if any(int(tables[s, j]) != j for s, nblk in enumerate(per_seq) for j in range(nblk)):
                break
        dt = getattr(torch, dtype)
        inputs = dict(q=randn(gen, b, h, d).to(dt), k_cache=randn(gen, num_blocks, bs, n_kv, d).to(dt),
                      v_cache=randn(gen, num_blocks, bs, n_kv, d).to(dt), block_tables=tables,
                      seq_lens=torch.tensor(lens, dtype=torch.int32), scale=None if randint(gen, 0, 1) else 0.3)
        return Case(f"{rule}{': ' if rule else ''}B={b} n_heads={h} n_kv_heads={n_kv} head_dim={d} block_size={bs} "
                    f"seq_lens={lens} {dtype}, {num_blocks} physical blocks shuffled", inputs)

    def lens(n, whole=False, one=False):
        out = [randint(gen, 2, 6) * 8 if whole else randint(gen, 2, 50) for _ in range(n)]
        if not whole:
            out = [x + 1 if x % 8 == 0 else x for x in out]  # partial last blocks for block_size 8 and 16
        if one:
            out[randint(gen, 0, n - 1)] = 1
        return out

    if public:
        return [case("", 2, 2, 2, 32, 8, [13, 20]), case("", 3, 4, 2, 16, 16, [16, 5, 33]),
                case("", 2, 4, 1, 32, 8, [1, 24], "float16"), case("", 1, 2, 2, 64, 16, [47])]
    return [case("a partial last block", 2, 2, 2, choice(gen, [16, 32]), choice(gen, [8, 16]), lens(2)),
            case("whole blocks", 2, 2, 2, 32, 8, lens(2, whole=True)),
            case("grouped-query heads", 2, 4, 2, 32, choice(gen, [8, 16]), lens(2)),
            case("multi-query", 2, 4, 1, 16, 8, lens(2)),
            case("a one-token sequence", 3, 2, 2, 16, 8, lens(3, one=True)),
            case("float16", 2, 2, 1, 32, 16, lens(2), "float16")]


def _kernel_judge(case, obs):
    x = case.inputs
    args, dtype = [x[n] for n in RUN._KERNEL_INPUTS], x["q"].dtype
    scale = x["scale"] if x["scale"] is not None else 1 / math.sqrt(x["q"].shape[-1])
    ref = lambda s=scale, variant="": ref_paged_attention(*args, s, variant=variant)  # noqa: E731
    want, variants = ref(), [
        ("attention over the logical block index p // block_size: look the physical block up in "
         "block_tables[seq, p // block_size]", lambda: ref(variant="logical")),
        ("attention over every slot of the last block: mask positions >= seq_len (the slots after a "
         "sequence's last token hold stale keys)", lambda: ref(variant="whole blocks")),
        ("key/value head = head % n_kv_heads: query head h shares key/value head h // (n_heads / n_kv_heads)",
         lambda: ref(variant="head mod")),
        ("unscaled scores: multiply q.k by scale", lambda: ref(1.0))]
    return judge_kernel(case, obs, "paged_decode_attention", lambda outputs: diagnose(
        compare(outputs["out"], want, dtype=dtype, name="out"), outputs["out"], variants, tensor_match(dtype)))


PAGED_ATTENTION = Exercise("paged_decode_attention", 4, ("paged_decode_attention",), neutral(_kernel_cases),
                           RUN._kernel_run,
                           _kernel_judge, title="Triton: decode attention over a paged KV cache",
                           hint="One program per (sequence, head). Loop j over cdiv(seq_len, BLOCK_SIZE): block = "
                                "load(block_tables[seq, j]); keys at k_cache[block, slot, head // GROUP, :] for the "
                                "BLOCK_SIZE slots, masked where j * BLOCK_SIZE + slot >= seq_len; scores = sum(k * q) "
                                "* scale (masked to -inf); online softmax (m, l, acc) as in lab 05.")

# The helpers lab 14's setup imports: its answers may call these, and no other gpulab function or class (lab 16's
# planner models this lab's cache sizes and scheduler).
OFFERED = ("gpulab.setup", "gpulab.feedback.check", "gpulab.bench.benchmark", "gpulab.compare.validate",
           "gpulab.peaks.Peaks", "gpulab.peaks.measured_peaks", "gpulab.serving.ModelSpec", "gpulab.serving.Request",
           "gpulab.serving.make_trace", "gpulab.serving.simulate", "gpulab.serving.summarize",
           "gpulab.tiny_lm.LMConfig", "gpulab.tiny_lm.TinyLM", "gpulab.tiny_lm.make_lm")

EXERCISES = [offering(ex, OFFERED)
             for ex in (KV_DECODE, KV_BYTES, ROOFLINE, PAGED_KV, SCHEDULER, SPECULATIVE, PAGED_ATTENTION)]


# --- benchmarks (python -m grader bench) ----------------------------------------------------------

def _bench_make(batch, context):
    def make(device, tiny):
        b, ctx, h, n_kv, d, bs = (2, 40, 2, 1, 16, 8) if tiny else (batch, context, 32, 8, 128, 16)
        per_seq = math.ceil(ctx / bs)
        tables = torch.randperm(b * per_seq, device=device).to(torch.int32).view(b, per_seq)
        k_cache, v_cache = (torch.randn(b * per_seq, bs, n_kv, d, device=device, dtype=torch.float16) for _ in range(2))
        return {"q": torch.randn(b, h, d, device=device, dtype=torch.float16), "k_cache": k_cache, "v_cache": v_cache,
                "block_tables": tables, "seq_lens": torch.full((b,), ctx, dtype=torch.int32, device=device),
                "flops": 4.0 * b * h * ctx * d, "bytes": 2 * (2 * b * ctx * n_kv * d + 2 * b * h * d)}
    return make


def _bench_baseline(inp):
    """PyTorch: gather each sequence's blocks into a dense (B, KV, S, D) cache, then SDPA (its GQA)."""
    k, v = (inp[name][inp["block_tables"].long()].flatten(1, 2).transpose(1, 2) for name in ("k_cache", "v_cache"))
    gqa = inp["k_cache"].shape[2] != inp["q"].shape[1]  # fewer key/value heads than query heads
    return torch.nn.functional.scaled_dot_product_attention(inp["q"][:, :, None], k, v, enable_gqa=gqa)[:, :, 0]


BENCHMARKS = [Benchmark(f"paged decode attention B={b} ctx={ctx} H=32/KV=8 D=128 fp16 vs gather + SDPA",
                        "paged_decode_attention", _bench_make(b, ctx),
                        lambda fn, inp: fn(*(inp[n] for n in RUN._KERNEL_INPUTS)), _bench_baseline)
              for b, ctx in ((8, 4096), (64, 2048))]
