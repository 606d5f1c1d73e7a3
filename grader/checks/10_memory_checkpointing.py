"""Checks of lab 10, where memory goes: saved-tensor accounting, activation checkpointing as a
``torch.autograd.Function``, selective recomputation, ZeRO/FSDP memory and the offload cost model.

The block under test is :class:`gpulab.models.TransformerBlock` (its docstring lists every tensor
autograd saves). Memory is measured as the bytes of distinct storages packed by
``torch.autograd.graph.saved_tensors_hooks`` during the forward pass, parameters excluded; FLOPs
with :func:`gpulab.launches.count_flops` (matmuls only, which is all the block's FLOPs).
Hidden cases: one per rule, the same rules for every seed (a case's name starts with its rule,
before ':'), random sizes within it.
"""
from __future__ import annotations

import torch

from gpulab.compare import compare
from gpulab.models import RECOMPUTE_CANDIDATES as CANDIDATES
from gpulab.models import make_block
from grader.exercise import Benchmark, Case, Exercise, Neutral
from grader.kit.cases import choice, randint, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "10_memory_checkpointing"
RUN = run_side(LAB)  # the learner side: grader/runs/10_memory_checkpointing.py
TITLE = "Where memory goes: activations, checkpointing, ZeRO and offload"

FORMULA_RTOL = 1e-6  # memory and time formulas in float bytes and seconds: any order of the operations passes


# --- 1. saved bytes, measured ----------------------------------------------------------------------


def ref_saved_bytes(fn, *args, exclude=()) -> int:
    """Bytes of the distinct storages autograd saves while ``fn(*args)`` runs (storages of
    ``exclude``, the parameters, left out). Each packed tensor is kept alive until the count is
    done, so no address is reused by a later tensor."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    total = sum(seen.values())
    del out
    return total


def distinct_bytes(packs, skip=()) -> int:
    """Bytes of the distinct storages among the run side's ``(data_ptr, nbytes)`` packs, ``skip`` left out."""
    skip = set(skip)
    seen = {ptr: nbytes for ptr, nbytes in packs if ptr not in skip}
    return sum(seen.values())


def _saved(obs, which: str) -> int:
    """Bytes the plain (``which="plain"``) or checkpointed call saved for backward, parameters excluded."""
    return distinct_bytes(obs[f"packs_{which}"], obs["param_ptrs"])


def _saved_cases(gen, public):
    if public:
        return [Case("x * x saves x twice: count it once", dict(kind="square", n=16, m=8, seed=1)),
                Case("a matmul of two overlapping views of one matrix", dict(kind="views", n=8, m=4, seed=2)),
                Case("relu(linear(x, w)).exp(), w excluded", dict(kind="linear", n=8, m=16, seed=3)),
                Case("the lesson's block (b=2, s=16, h=32, dropout 0.1)",
                     dict(kind="block", n=2, m=16, d_model=32, n_heads=2, dropout=0.1, seed=4))]
    rules = {"square": "x * x saves x twice", "views": "a matmul of two overlapping views",
             "linear": "a parameter to exclude", "block": "the lesson's block"}
    cases = []
    for kind, rule in rules.items():
        spec = dict(kind=kind, n=randint(gen, 1, 12), m=randint(gen, 2, 24), seed=randint(gen, 0, 999))
        if kind == "block":
            spec.update(d_model=choice(gen, (16, 32, 48)), n_heads=choice(gen, (1, 2, 4)),
                        dropout=choice(gen, (0.0, 0.1)), m=randint(gen, 4, 24))
        cases.append(Case(f"{rule}: random sizes n={spec['n']} m={spec['m']}", spec))
    return cases


def _saved_judge(case, obs):
    fn, args, exclude = RUN._scenario(case.inputs["kind"], case.inputs)
    want = ref_saved_bytes(fn, *args, exclude=exclude)
    got = obs["bytes"]
    if not isinstance(got, (int, float)):
        return f"saved_tensor_bytes must return a number of bytes, got {got}."
    if got == want:
        return None
    if got > want:
        hint = (" You count more than autograd keeps: count each *storage* once (several saved tensors can "
                "be views of one buffer, or the same tensor), and skip the storages of `exclude`.")
    elif got == 0:
        hint = " Nothing was counted: is your pack hook installed while fn runs (a `with` block around the call)?"
    else:
        hint = (" You count less than autograd keeps: count each storage at its full size, "
                "`t.untyped_storage().nbytes()`, not only the view's `t.nbytes`.")
    return f"saved_tensor_bytes = {got} bytes, expected {want} for {case.name}.{hint}"


SAVED_BYTES = Exercise("saved_bytes", 2, ("saved_tensor_bytes",), _saved_cases, RUN._saved_run, _saved_judge,
                       title="Measuring what autograd saves",
                       hint="Inside `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):` every tensor "
                            "saved for backward passes through pack. Key by t.untyped_storage().data_ptr(), count "
                            "untyped_storage().nbytes() once per key, and return t from pack so it stays alive.")


# --- 2. the activation formula (and what each piece of the block saves and costs) --------------------

def _parts(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, stats_bytes=None) -> dict:
    """The saved bytes of each piece of :class:`gpulab.models.TransformerBlock` (see its docstring)."""
    e = dtype_bytes
    st = dtype_bytes if stats_bytes is None else stats_bytes
    t, h, f = batch * seq, d_model, d_ff
    P = batch * n_heads * seq * seq                      # elements of one (b, a, s, s) tensor
    drop = dropout > 0
    core = P * e + (P * (e + 1) if drop else 0)          # softmax out [+ dropout mask + dropout out]
    return {
        "x": t * h * e,                                                        # block input (LN1)
        "attn_core": core,
        "attn": 2 * t * st + t * h * e + 3 * t * h * e + core + t * h * e + (t * h if drop else 0),
        "x1": t * h * e,                                                       # LN2's input
        "mlp": 2 * t * st + t * h * e + 2 * t * f * e + (t * h if drop else 0),
    }


def ref_block_activation_bytes(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, stats_bytes=None) -> int:
    p = _parts(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, stats_bytes)
    return p["x"] + p["attn"] + p["x1"] + p["mlp"]


def ref_forward_flops(batch, seq, d_model, n_heads, d_ff) -> dict:
    """Matmul FLOPs of one forward pass of each piece (2 per multiply-add)."""
    t, h, f = batch * seq, d_model, d_ff
    core = 4 * batch * seq * seq * h                     # q kᵀ and P v
    attn = 2 * t * h * 3 * h + core + 2 * t * h * h       # QKV, core, output projection
    mlp = 4 * t * h * f                                   # FC1 and FC2
    return {"attn_core": core, "attn": attn, "mlp": mlp, "block": attn + mlp}


def _normalize(recompute) -> frozenset:
    rec = frozenset(recompute)
    if "block" in rec:
        return frozenset({"block"})
    if "attn" in rec:
        rec = rec - {"attn_core"}
    return rec


def ref_recompute_cost(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, recompute, stats_bytes=None):
    """(saved bytes, extra forward FLOPs in backward) of a block whose ``recompute`` pieces are checkpointed."""
    rec = _normalize(recompute)
    parts = _parts(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, stats_bytes)
    flops = ref_forward_flops(batch, seq, d_model, n_heads, d_ff)
    if rec == {"block"}:
        return parts["x"], flops["block"]
    saved = parts["x"] + parts["attn"] + parts["x1"] + parts["mlp"]
    return saved - sum(parts[r] for r in rec), sum(flops[r] for r in rec)


def _formula_cases(gen, public):
    if public:
        return [
            Case("b=2 s=16 h=32 a=2 f=128 dropout=0.1 float32",
                 dict(batch=2, seq=16, d_model=32, n_heads=2, d_ff=128, dropout=0.1, dtype="float32", measure=True)),
            Case("b=1 s=16 h=32 a=2 f=128 no dropout float32",
                 dict(batch=1, seq=16, d_model=32, n_heads=2, d_ff=128, dropout=0.0, dtype="float32", measure=True)),
            Case("b=3 s=8 h=48 a=4 f=100 dropout=0.2 bfloat16 (CPU: LayerNorm statistics in bfloat16)",
                 dict(batch=3, seq=8, d_model=48, n_heads=4, d_ff=100, dropout=0.2, dtype="bfloat16",
                      stats_bytes=2, measure=True)),
            Case("GPT-3 175B layer: b=1 s=2048 h=12288 a=96 f=49152 dropout=0.1 bf16 on a GPU (stats fp32)",
                 dict(batch=1, seq=2048, d_model=12288, n_heads=96, d_ff=49152, dropout=0.1, dtype="bfloat16",
                      stats_bytes=4, measure=False)),
            Case("b=2 s=8 h=32 a=2 f=64 dropout=0.1 bfloat16, stats_bytes left out: the statistics take the "
                 "dtype's 2 bytes", dict(batch=2, seq=8, d_model=32, n_heads=2, d_ff=64, dropout=0.1,
                                         dtype="bfloat16", measure=True))]
    rules = [("float32 with dropout", "float32", (0.1, 0.5)),  # stats_bytes left out: the dtype's bytes
             ("float32 without dropout", "float32", (0.0,)),
             ("bfloat16, stats_bytes left out", "bfloat16", (0.0, 0.1)),
             ("float64, stats_bytes left out", "float64", (0.0, 0.5))]
    cases = []
    for rule, dtype, dropouts in rules:
        a = choice(gen, (1, 2, 4))
        x = dict(batch=randint(gen, 1, 3), seq=randint(gen, 2, 24), d_model=a * choice(gen, (8, 12, 16)),
                 n_heads=a, d_ff=randint(gen, 8, 96), dropout=choice(gen, dropouts), dtype=dtype, measure=True)
        cases.append(Case(f"{rule}: b={x['batch']} s={x['seq']} h={x['d_model']} a={a} f={x['d_ff']} "
                          f"dropout={x['dropout']}", x))
    a = choice(gen, (16, 32, 64))
    gpu = dict(batch=randint(gen, 1, 8), seq=choice(gen, (1024, 2048, 4096)), d_model=a * 128, n_heads=a,
               d_ff=randint(gen, 2, 4) * a * 128, dropout=choice(gen, (0.0, 0.1)), dtype="bfloat16",
               stats_bytes=4, measure=False)
    cases.append(Case(f"bfloat16 on a GPU, float32 statistics: b={gpu['batch']} s={gpu['seq']} "
                      f"h={gpu['d_model']} a={a} f={gpu['d_ff']} dropout={gpu['dropout']}", gpu))
    return cases


def _measured_block_bytes(x: dict) -> int:
    block = make_block(x["d_model"], x["n_heads"], x["d_ff"], x["dropout"], dtype=RUN._DTYPES[x["dtype"]])
    inp = torch.randn(x["batch"], x["seq"], x["d_model"], dtype=RUN._DTYPES[x["dtype"]], requires_grad=True)
    return ref_saved_bytes(block, inp, exclude=tuple(block.parameters()))


def _formula_judge(case, obs):
    x = case.inputs
    got = obs["bytes"]
    if not isinstance(got, (int, float)):
        return f"block_activation_bytes must return a number of bytes, got {got}."
    want = _measured_block_bytes(x) if x["measure"] else ref_block_activation_bytes(
        *RUN._formula_args(x), stats_bytes=x.get("stats_bytes"))
    if got == want:
        return None
    how = "measured with saved_tensors_hooks" if x["measure"] else "from the exact count"
    b, s, h, a, f, p, e = RUN._formula_args(x)
    t, P = b * s, b * a * s * s
    st = x.get("stats_bytes") or e
    # the answers of the usual mistakes -> what to say
    hints = {
        want - 4 * t * st: "You left out LayerNorm's saved mean and rstd (2 per token per LayerNorm).",
        34 * s * b * h + 5 * a * s * s * b: "That is Korthikanti's 34sbh + 5as²b (2-byte activations, f = 4h, "
        "no LayerNorm statistics): count this block's tensors (its d_ff, its dtype, its dropout) from the "
        "table in the docstring.",
    }
    if x.get("stats_bytes") is None and e != 4:
        hints[want + 4 * t * (4 - e)] = ("stats_bytes=None means the statistics have the activations' dtype: "
                                         "dtype_bytes each (as LayerNorm keeps them on a CPU), not 4.")
    elif x.get("stats_bytes") is not None and x["stats_bytes"] != e:
        hints[want + 4 * t * (e - x["stats_bytes"])] = ("stats_bytes was given: the LayerNorm statistics take "
                                                        "stats_bytes each, not dtype_bytes.")
    if p > 0:
        hints[want + P * (e - 1) + 2 * t * h * (e - 1)] = \
            "Dropout masks are torch.bool: 1 byte per element, not the activation dtype."
        hints[want - P * (e + 1) - 2 * t * h] = "With dropout > 0, count the masks and dropout(P) as well."
    else:
        hints[want + P * e] = ("Without dropout, dropout(P) is P itself: one tensor saved by two ops, "
                               "counted once.")
    hint = hints.get(got, "Go through the docstring's table op by op: which tensors, how many elements, "
                          "which dtype.")
    return f"block_activation_bytes = {got}, expected {want} ({how}). {hint}"


ACTIVATION_FORMULA = Exercise("activation_formula", 3, ("block_activation_bytes",),
                              _formula_cases, RUN._formula_run, _formula_judge,
                              title="Activation bytes of a transformer block, by formula",
                              hint="Follow TransformerBlock's docstring table: t(8h + 2f)e for the (b, s, ·) "
                                   "tensors, b·a·s² elements per attention matrix, 1-byte masks, 2 statistics "
                                   "per token per LayerNorm.")


# --- 3. checkpointing as an autograd.Function ------------------------------------------------------


def _ckpt_cases(gen, public):
    if public:
        base = dict(batch=2, seq=16, d_model=32, n_heads=2, kind="block", seed=7)
        return [Case("block, no dropout", dict(base, dropout=0.0)),
                Case("block, dropout 0.2 (the masks must be reproduced)", dict(base, dropout=0.2, seed=8)),
                Case("fn(x, y) = block.mlp(x) * y, dropout 0.1: two inputs, both need gradients",
                     dict(base, dropout=0.1, kind="two_inputs", seed=9))]
    cases = []
    rules = ("block without dropout", "block with dropout", "two inputs, both need gradients, dropout")
    for i, (rule, kind) in enumerate(zip(rules, ("block", "block", "two_inputs"))):
        a = choice(gen, (1, 2, 4))
        cases.append(Case(f"{rule}: random sizes", dict(
            batch=randint(gen, 1, 3), seq=randint(gen, 8, 24), d_model=a * choice(gen, (8, 16)), n_heads=a,
            dropout=choice(gen, (0.1, 0.3)) if i else 0.0, kind=kind, seed=randint(gen, 0, 999))))
    return cases


_EARLY_STOP = (" Less than one: torch.utils.checkpoint's non-reentrant variant stops recomputing as soon as it has "
               "what backward needs; this lab asks for your own autograd.Function that reruns fn completely.")
_RNG_HINT = ("With dropout, the recomputation must draw the same masks as the forward pass: save the RNG "
             "state in forward (torch.get_rng_state(), and torch.cuda.get_rng_state() for CUDA inputs) and "
             "restore it before recomputing, inside torch.random.fork_rng() so the caller's RNG is untouched.")


def _judge_output_and_grads(case, obs, what: str, output: str, differs: str) -> str | None:
    """The checkpointed output and every gradient equal the plain function's (checkpoint and selective)."""
    report = compare(obs["out_ckpt"], obs["out_plain"], dtype=obs["out_plain"].dtype, name=output)
    if report:
        return f"{differs}: {report}"
    for name, want in obs["grads_plain"].items():
        got = obs["grads_ckpt"].get(name)
        if want is None:
            continue
        if got is None:
            where = "input" if name.startswith("input") else "parameter"
            fix = ("return the inputs' gradients from backward (one per input of forward, None for fn)"
                   if where == "input" else
                   "recompute with gradients enabled (torch.enable_grad()) and call torch.autograd.backward "
                   "on the recomputed output, so the parameters' .grad fill in")
            return f"{what}: the {where} gradient `{name}` is missing: {fix}."
        report = compare(got, want, dtype=want.dtype, name=f"gradient of {name}")
        if report:
            hint = _RNG_HINT if case.inputs.get("dropout", 0) > 0 else ""
            return f"{what}: gradients differ from the un-checkpointed block. {report}\n  {hint}".rstrip()
    return None


def _ckpt_judge(case, obs):
    message = _judge_output_and_grads(case, obs, "checkpoint", "checkpointed output",
                                      "the forward output differs from fn's own")
    if message:
        return message
    if len(obs["rng_ckpt"]) != len(obs["rng_plain"]) or not all(
            torch.equal(c, p) for c, p in zip(obs["rng_ckpt"], obs["rng_plain"])):
        return ("after forward and backward through your checkpoint, the caller's random number generator is not "
                "where the un-checkpointed function leaves it (the check draws random numbers between forward and "
                "backward, as later layers' dropout does): backward moved the caller's stream. Set the saved RNG "
                "state only inside `with torch.random.fork_rng():`, which gives the caller's state back when the "
                "recomputation is done.")
    allowed = obs["input_bytes"] + 16 * 1024  # the inputs, plus room for an RNG state saved as a tensor
    saved_ckpt, saved_plain = _saved(obs, "ckpt"), _saved(obs, "plain")
    if saved_ckpt > allowed:
        return (f"the checkpointed call kept {saved_ckpt} bytes for backward; the plain block keeps "
                f"{saved_plain} and a checkpoint should keep only its inputs ({obs['input_bytes']} bytes, "
                f"a {saved_plain / obs['input_bytes']:.1f}x drop). Run fn under torch.no_grad() in "
                "forward and save only the inputs (ctx.save_for_backward).")
    extra, fwd = obs["flops_ckpt"] - obs["flops_plain"], obs["flops_forward"]
    if abs(extra - fwd) <= 0.02 * fwd:  # exactly one forward pass more: the recomputation
        return None
    return (f"forward + backward with your checkpoint took {obs['flops_ckpt']:.4g} FLOPs, the plain block "
            f"{obs['flops_plain']:.4g}: {extra / fwd:.2f} forward passes extra, expected exactly one "
            f"(the recomputation in backward).{_EARLY_STOP if extra < fwd else ''}")


CHECKPOINT = Exercise("checkpoint_function", 4, ("checkpoint",), _ckpt_cases, RUN._ckpt_run, _ckpt_judge,
                      title="Activation checkpointing as a torch.autograd.Function",
                      hint="forward: save the inputs and the RNG state, run fn under no_grad. backward: restore "
                           "the RNG state (in fork_rng), recompute fn on detached inputs with grad enabled, "
                           "torch.autograd.backward(out, grads), return (None, *input grads).")


# --- 4. selective checkpointing ---------------------------------------------------------------------

def _selective_cases(gen, public):
    sets = [(), ("attn_core",), ("mlp",), ("attn",), ("attn_core", "mlp"), ("attn", "mlp"), ("block",)]
    if public:
        base = dict(batch=2, seq=16, d_model=32, n_heads=2, dropout=0.1, kind="block", seed=11)
        return [Case(f"recompute={set(r) or '{}'} (b=2, s=16, h=32, dropout 0.1)", dict(base, recompute=r))
                for r in sets]
    cases = []  # every choice, and one that names a piece twice
    for i, r in enumerate(sets + [("attn", "attn_core")]):
        a = choice(gen, (1, 2, 4))
        cases.append(Case(f"recompute={{{', '.join(sorted(r))}}}: random block", dict(
            batch=randint(gen, 1, 3), seq=randint(gen, 8, 24), d_model=a * choice(gen, (8, 16)), n_heads=a,
            dropout=(0.0, 0.2)[i % 2], kind="block", seed=randint(gen, 0, 999), recompute=r)))
    return cases


def _selective_judge(case, obs):
    msg = _selective_verdict(case, obs)
    if msg is None and not _normalize(case.inputs["recompute"]):  # block(x) itself passes: nothing to score
        return Neutral("nothing to recompute: the plain block's output, gradients and bytes (not scored)")
    return msg


def _selective_verdict(case, obs):
    x = case.inputs
    message = _judge_output_and_grads(case, obs, "selective_forward", "selective_forward output",
                                      "the output differs from block(x)")
    if message:
        return message
    args = (x["batch"], x["seq"], x["d_model"], x["n_heads"], 4 * x["d_model"], x["dropout"], 4)
    want_saved, want_extra = ref_recompute_cost(*args, x["recompute"], stats_bytes=4)
    full, _ = ref_recompute_cost(*args, (), stats_bytes=4)
    if _saved(obs, "ckpt") != want_saved:
        return (f"recompute={set(x['recompute'])}: {_saved(obs, 'ckpt')} bytes saved for backward, expected "
                f"{want_saved} (the plain block keeps {full}). Checkpoint exactly the named pieces with your "
                "`checkpoint`: 'attn_core' wraps block.attn_core(q, k, v), 'attn' block.attention(x), 'mlp' "
                "block.mlp(x1), 'block' the whole block; the residual additions stay outside.")
    extra = obs["flops_ckpt"] - obs["flops_plain"]
    if abs(extra - want_extra) > 0.02 * obs["flops_forward"]:
        return (f"recompute={set(x['recompute'])}: {extra:.4g} extra FLOPs in backward, expected {want_extra:.4g} "
                "(one forward pass of the recomputed pieces only)." + (_EARLY_STOP if extra < want_extra else ""))
    return None


SELECTIVE = Exercise("selective_checkpoint", 3, ("selective_forward",),
                     _selective_cases, RUN._selective_run, _selective_judge,
                     title="Selective checkpointing: recompute only some sublayers",
                     hint="Rebuild block.forward from its pieces (split_heads, attn_core, attn_out, attention, "
                          "mlp) and wrap the chosen ones in checkpoint(...); the residual additions stay outside.")


# --- 5. choosing what to recompute ------------------------------------------------------------------

def ref_plan_recompute(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, budget_bytes, stats_bytes=None):
    """The candidate with the fewest extra FLOPs whose saved bytes fit the budget (ties: fewer bytes)."""
    best = None
    for cand in CANDIDATES:
        saved, extra = ref_recompute_cost(batch, seq, d_model, n_heads, d_ff, dropout, dtype_bytes, cand, stats_bytes)
        if saved <= budget_bytes and (best is None or (extra, saved) < best[0]):
            best = ((extra, saved), frozenset(cand))
    return None if best is None else best[1]


def _plan_cases(gen, public):
    if public:
        gpt3 = dict(batch=1, seq=2048, d_model=12288, n_heads=96, d_ff=49152, dropout=0.1, dtype_bytes=2,
                    stats_bytes=4)
        full, _ = ref_recompute_cost(*RUN._plan_args(gpt3), (), stats_bytes=4)
        core_only, _ = ref_recompute_cost(*RUN._plan_args(gpt3), ("attn_core",), stats_bytes=4)
        # named by the budget alone: a name says nothing of the plan that fits
        budgets = (full, core_only, int(0.6 * full), 12288 * 2048 * 2, 1000)
        return [Case(f"GPT-3 layer, budget {budget} bytes", dict(gpt3, budget_bytes=budget)) for budget in budgets]
    cases = []  # random layers
    for i, rule in enumerate(("budget = everything", "budget = exactly one choice's bytes",
                              "budget between the choices", "budget = the input only",
                              "budget below the input: nothing fits", "float32, stats_bytes left out")):
        a = choice(gen, (8, 16, 32, 64))
        cfg = dict(batch=randint(gen, 1, 16), seq=choice(gen, (512, 1024, 2048, 4096, 8192)),
                   d_model=a * choice(gen, (64, 128)), n_heads=a, d_ff=0, dropout=(0.0, 0.1)[i % 2],
                   dtype_bytes=2, stats_bytes=4)
        cfg["d_ff"] = 4 * cfg["d_model"]
        if rule.startswith("float32"):
            cfg.update(dtype_bytes=4, stats_bytes=None)
        saved = {c: ref_recompute_cost(*RUN._plan_args(cfg), c, stats_bytes=cfg["stats_bytes"])[0] for c in CANDIDATES}
        full, least = saved[()], saved[("block",)]  # nothing recomputed; the whole block
        if rule == "budget = everything":
            budget = full
        elif rule == "budget = exactly one choice's bytes":  # fits: saved <= budget
            budget = saved[choice(gen, CANDIDATES[1:-1])]
        elif rule == "budget = the input only":
            budget = least
        elif rule.startswith("budget below the input"):
            budget = least - randint(gen, 1, least // 2)
        else:
            budget = int(uniform(gen, least, full))
        cfg["budget_bytes"] = budget
        name = "float32, stats_bytes left out" if rule.startswith("float32") else f"budget {i + 1}"  # not the plan
        cases.append(Case(f"{name}: b={cfg['batch']} s={cfg['seq']} h={cfg['d_model']} a={a} "
                          f"dropout={cfg['dropout']}, budget {cfg['budget_bytes']} bytes", cfg))
    return cases


def _plan_judge(case, obs):
    x = case.inputs
    for cand in CANDIDATES:
        want = ref_recompute_cost(*RUN._plan_args(x), cand, stats_bytes=x["stats_bytes"])
        got = obs["costs"][",".join(cand)]
        if not isinstance(got, list) or len(got) != 2:
            return f"recompute_cost must return (saved_bytes, extra_flops), got {got}."
        if not close(got[0], want[0]):
            return (f"recompute_cost(..., recompute={set(cand) or '{}'}) saved bytes = {got[0]:.6g}, expected "
                    f"{want[0]}: start from block_activation_bytes and remove what the checkpointed pieces no "
                    "longer keep (their inputs stay: the checkpoint saves them).")
        if not close(got[1], want[1]):
            return (f"recompute_cost(..., recompute={set(cand) or '{}'}) extra FLOPs = {got[1]:.6g}, expected "
                    f"{want[1]}: one forward pass of the recomputed pieces (matmuls, 2 FLOPs per multiply-add).")
    want = ref_plan_recompute(*RUN._plan_args(x), x["budget_bytes"], stats_bytes=x["stats_bytes"])
    got = obs["plan"]
    if (got is None) != (want is None) or (got is not None and set(got) != set(want)):
        return (f"plan_recompute with a budget of {x['budget_bytes']:.4g} bytes returned "
                f"{None if got is None else set(got)}, expected {None if want is None else set(want)}: among the "
                "candidates that fit, take the one with the fewest extra FLOPs (ties: fewer bytes); None if none fits.")
    return None


RECOMPUTE_PLAN = Exercise("recompute_plan", 2, ("recompute_cost", "plan_recompute"), _plan_cases, RUN._plan_run,
                          _plan_judge, title="Choosing what to recompute under a memory budget",
                          hint="A checkpointed piece keeps only its inputs: subtract its internal saved bytes and "
                               "add one forward pass of its FLOPs.")


# --- 6. ZeRO and FSDP --------------------------------------------------------------------------------

def ref_zero_memory(n_params, world_size, stage, param_dtype="bfloat16", grad_dtype="bfloat16",
                    optimizer="adam", master_weights=True) -> dict:
    p, g = RUN._dtype_bytes(param_dtype), RUN._dtype_bytes(grad_dtype)
    states = {"adam": 2, "adamw": 2, "momentum": 1, "sgd": 0}[optimizer]
    master = 4 if master_weights and p != 4 else 0
    k = master + 4 * states
    n, N = n_params, world_size
    params = p * n / N if stage >= 3 else p * n
    grads = g * n / N if stage >= 2 else g * n
    opt = k * n / N if stage >= 1 else k * n
    return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}


def ref_fsdp_memory(n_params, world_size, unit_params, param_dtype="bfloat16", grad_dtype="bfloat16",
                    optimizer="adam", master_weights=True) -> dict:
    out = ref_zero_memory(n_params, world_size, 3, param_dtype, grad_dtype, optimizer, master_weights)
    gathered = unit_params * (RUN._dtype_bytes(param_dtype) + RUN._dtype_bytes(grad_dtype))
    out = dict(out, gathered=gathered)
    out["total"] += gathered
    return out


def _zero_cases(gen, public):
    paper = dict(n_params=7.5e9, world_size=64, param_dtype="bfloat16", grad_dtype="bfloat16", optimizer="adam",
                 master_weights=True, unit_params=0)
    if public:
        cases = [Case(f"ZeRO paper: 7.5B params, 64 GPUs, mixed-precision Adam, stage {s}", dict(paper, stage=s))
                 for s in (0, 1, 2, 3)]
        cases.append(Case("fp32 params with momentum SGD (no separate master copy), 8 GPUs, stage 2", dict(
            n_params=1.3e9, world_size=8, param_dtype="float32", grad_dtype="float32", optimizer="momentum",
            master_weights=True, stage=2, unit_params=0)))
        cases.append(Case("FSDP full shard: 70B over 64 GPUs, largest unit 0.86B params", dict(
            paper, n_params=70e9, stage="fsdp", unit_params=0.86e9)))
        return cases
    half = choice(gen, ("bfloat16", "float16"))
    rules = [  # (rule, stage, param dtype, grad dtype, optimizer, master weights)
        ("stage 0, mixed-precision Adam", 0, half, half, "adam", True),
        ("stage 1, mixed-precision AdamW", 1, half, half, "adamw", True),
        ("stage 2, float32 gradients", 2, half, "float32", "adam", True),
        ("stage 2, float32 parameters with momentum (no separate master copy)", 2, "float32", "float32",
         "momentum", True),
        ("stage 3, no master weights, plain SGD", 3, half, half, "sgd", False),
        ("FSDP full shard", "fsdp", half, half, choice(gen, ("adam", "momentum")), True)]
    cases = []
    for rule, stage, param_dtype, grad_dtype, optimizer, master in rules:
        n = float(randint(gen, 1, 400)) * 1e9
        world = choice(gen, (2, 8, 16, 64, 256, 1024))
        cases.append(Case(f"{rule}: {n / 1e9:g}B params, {world} GPUs", dict(
            n_params=n, world_size=world, param_dtype=param_dtype, grad_dtype=grad_dtype, optimizer=optimizer,
            master_weights=master, stage=stage, unit_params=n / randint(gen, 8, 100))))
    return cases


_ZERO_HINTS = {
    "params": "Parameters are sharded only at stage 3 (and in FSDP's full shard).",
    "grads": "Gradients are sharded from stage 2 on (reduce-scatter instead of all-reduce): each GPU keeps "
             "1/N of them.",
    "optimizer": "Optimizer state per parameter: the fp32 master copy (4 bytes, when the parameters are not "
                 "fp32 already) plus 4 bytes per Adam moment (2) or momentum buffer (1); sharded from stage 1 on.",
    "gathered": "FSDP also holds one unit's full parameters and full gradients while that unit computes.",
    "total": "total is the sum of the other entries.",
}


def _zero_judge(case, obs):
    x = case.inputs
    want = RUN._zero_call(x, ref_zero_memory, ref_fsdp_memory)
    fn = "fsdp_memory" if x["stage"] == "fsdp" else "zero_memory"
    got = obs["mem"]
    if not isinstance(got, dict):
        return f"{fn} must return a dict of bytes per GPU, got {got}."
    for key in sorted(want, key=lambda k: k == "total"):  # the parts first, their sum last
        value = want[key]
        if key not in got:
            return f"{fn} must return the keys {sorted(want)}; `{key}` is missing."
        if not close(got[key], value, FORMULA_RTOL):
            return (f"{fn}: {key} = {got[key]:.6g} bytes per GPU, expected {value:.6g} "
                    f"({value / 1e9:.3g} GB) for {case.name}. {_ZERO_HINTS[key]}")
    return None


ZERO_MEMORY = Exercise("zero_memory", 3, ("zero_memory", "fsdp_memory"), _zero_cases, RUN._zero_run, _zero_judge,
                       title="ZeRO stages and FSDP: model-state memory per GPU",
                       hint="ZeRO paper: (2 + 2 + K)Ψ bytes with K = 12 for mixed-precision Adam; stage 1 divides "
                            "the K part by N, stage 2 also the gradients, stage 3 also the parameters.")


# --- 7. offload cost model -------------------------------------------------------------------------------

def ref_offload_bytes(n_params, world_size, what, param_dtype="bfloat16", grad_dtype="bfloat16"):
    p, g = RUN._dtype_bytes(param_dtype), RUN._dtype_bytes(grad_dtype)
    shard = n_params / world_size
    return (g + p) * shard if what == "optimizer" else (2 * p + g) * shard


def ref_offload_step_time(compute_s, nbytes, pcie_gbps, overlap=True) -> dict:
    transfer = nbytes / (pcie_gbps * 1e9)
    step = max(compute_s, transfer) if overlap else compute_s + transfer
    return {"transfer_s": transfer, "step_s": step, "hidden": bool(overlap and transfer <= compute_s)}


def _offload_cases(gen, public):
    # transfer_bytes feeds offload_step_time on its own, so one mistake is not counted twice
    if public:
        opt = dict(n_params=7e9, world_size=8, what="optimizer", param_dtype="bfloat16", grad_dtype="bfloat16",
                   pcie_gbps=25.0, overlap=True, transfer_bytes=3.5e9)
        return [Case("7B, 8 GPUs, optimizer offload, PCIe 25 GB/s, 0.5 s of compute", dict(opt, compute_s=0.5)),
                Case("7B, 8 GPUs, optimizer offload, 0.05 s of compute", dict(opt, compute_s=0.05)),
                Case("70B, 64 GPUs, parameter offload, PCIe 50 GB/s, no overlap", dict(
                    n_params=70e9, world_size=64, what="params", param_dtype="bfloat16", grad_dtype="float32",
                    pcie_gbps=50.0, compute_s=0.2, overlap=False, transfer_bytes=8.75e9))]
    cases = []
    # named by what is offloaded, never by whether the transfer hides (the answer's "hidden")
    for rule, what, timing in (("optimizer offload 1", "optimizer", "hidden"),
                               ("optimizer offload 2", "optimizer", "shows"),
                               ("parameter offload", "params", "hidden"),
                               ("parameter offload, no overlap", "params", "serial")):
        pcie = choice(gen, (12.0, 25.0, 50.0))
        transfer_bytes = float(randint(gen, 1, 100)) * 1e8
        transfer_s = transfer_bytes / (pcie * 1e9)
        # up to twice the transfer time when it hides, down to a tenth of it otherwise
        compute_s = transfer_s * (1 + uniform(gen, 0.0, 1.0) * (1 if timing == "hidden" else -0.9))
        cases.append(Case(f"{rule}: PCIe {pcie:g} GB/s, {compute_s:.3g} s of compute", dict(
            n_params=float(randint(gen, 1, 200)) * 1e9, world_size=choice(gen, (1, 8, 64, 512)), what=what,
            param_dtype=choice(gen, ("bfloat16", "float32")), grad_dtype=choice(gen, ("bfloat16", "float32")),
            pcie_gbps=pcie, compute_s=compute_s, overlap=timing != "serial", transfer_bytes=transfer_bytes)))
    return cases


def _offload_judge(case, obs):
    x = case.inputs
    want = ref_offload_bytes(x["n_params"], x["world_size"], x["what"], x["param_dtype"], x["grad_dtype"])
    if not isinstance(obs["bytes"], float) or not close(obs["bytes"], want, FORMULA_RTOL):
        how = ("each step sends this GPU's gradient shard down and gets its updated parameter shard back"
               if x["what"] == "optimizer" else
               "the parameter shard comes up twice (forward and backward) and the gradient shard goes down once")
        return f"offload_bytes = {obs['bytes']}, expected {want:.6g} bytes per GPU per step: {how}."
    t = ref_offload_step_time(x["compute_s"], x["transfer_bytes"], x["pcie_gbps"], x["overlap"])
    got = obs["time"]
    if not isinstance(got, dict):
        return f"offload_step_time must return a dict, got {got}."
    for key in ("transfer_s", "step_s"):
        if not close(got.get(key), t[key], FORMULA_RTOL):
            return (f"offload_step_time: {key} = {got.get(key)}, expected {t[key]:.6g} s for {case.name} "
                    "(bandwidth in GB/s = 1e9 bytes/s; overlapped, the step takes the longer of compute and "
                    "transfer; not overlapped, their sum).")
    if got.get("hidden") != t["hidden"]:
        return f"offload_step_time: hidden = {got.get('hidden')}, expected {t['hidden']} for {case.name}."
    return None


OFFLOAD_MODEL = Exercise("offload_model", 2, ("offload_bytes", "offload_step_time"),
                         _offload_cases, RUN._offload_run, _offload_judge,
                         title="CPU offload: PCIe traffic and when it hides",
                         hint="Transfer time = bytes / (GB/s * 1e9). Overlapped with compute, the step takes the "
                              "longer of the two, and the transfer is hidden when it is not longer than the compute.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.models.TransformerBlock", "gpulab.models.make_block")
EXERCISES = [offering(ex, OFFERED) for ex in (SAVED_BYTES, ACTIVATION_FORMULA, CHECKPOINT, SELECTIVE, RECOMPUTE_PLAN,
                                          ZERO_MEMORY, OFFLOAD_MODEL)]


# --- benchmarks (python -m grader bench) ---------------------------------------------------------------

def _bench_make(device, tiny):
    b, s, h, a = (2, 32, 64, 2) if tiny else (4, 2048, 2048, 16)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    block = make_block(h, a, None, 0.1, device=device, dtype=dtype)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    flops = 3 * ref_forward_flops(b, s, h, a, 4 * h)["block"]  # forward + backward of the plain block
    return {"block": block, "x": x, "flops": flops}


def _bench_step(out):
    out.sum().backward()


BENCHMARKS = [
    Benchmark("block, full checkpoint vs plain", "checkpoint", _bench_make,
              lambda fn, d: _bench_step(fn(d["block"], d["x"])), lambda d: _bench_step(d["block"](d["x"]))),
    Benchmark("block, attn_core recompute vs plain", "selective_forward", _bench_make,
              lambda fn, d: _bench_step(fn(d["block"], d["x"], frozenset({"attn_core"}))),
              lambda d: _bench_step(d["block"](d["x"]))),
]
