"""Checks of lab 11, data parallelism: collective costs, a ring all-reduce from send/recv, DDP from
scratch, DDP overlapping backward (one asynchronous all-reduce per parameter, then buckets), and a
ZeRO-1 sharded optimizer.

Distributed exercises run the learner's code on real ranks (:func:`gpulab.dist.launch`, gloo, CPU
tensors), one launch per case: ``run`` ships the learner's function or class by value to fresh
processes, each rank builds its model and data from the case's seeds, and returns plain
observations (tensors, the collectives it issued, from :func:`gpulab.commlog.record_collectives`).
``judge`` recomputes everything single-process, here, from the same seeds: the gradients of the
mean loss over the *global* batch, rank 0's initial state, the bucket rule, the optimizer's state
size. Nothing is timed.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from gpulab.compare import compare
from grader.exercise import Case, Exercise, Neutral
from grader.kit.cases import choice, randint, uniform
from grader.kit.close import ACCUMULATED, close
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "11_data_parallel"
RUN = run_side(LAB)  # the learner side: grader/runs/11_data_parallel.py
TITLE = "Data parallelism: collectives, ring all-reduce, DDP, bucketing, ZeRO-1, FSDP"

# A ring all-reduce against the float64 sum of every rank's input: tighter than ACCUMULATED's rtol,
# because a float32 tensor is summed only p times.
RING_TOL = dict(rtol=1e-5, atol=1e-5)


def _differs(got, want, name: str = "output", atol: float | None = None) -> str | None:
    """:func:`gpulab.compare.compare` at the tolerance of float32 results after several steps."""
    default_atol, rtol = ACCUMULATED[torch.float32]
    return compare(got, want, atol=atol or default_atol, rtol=rtol, name=name)


def _adam_atol(x) -> float:
    """Parameters after Adam steps: each step moves a weight by about ``lr`` whatever its gradient, so a
    gradient summed in another order (ranks, buckets) moves it by a different fraction of ``lr`` where that
    gradient is near Adam's eps. Measured: 5e-6 at lr 0.01 on a correct answer; a wrong one is off by ~lr."""
    return max(ACCUMULATED[torch.float32][0], 1e-3 * x["lr"])


# --- 1. collective costs: the alpha-beta model ---------------------------------------------------

def ref_collective_time(op: str, nbytes: float, p: int, alpha: float, beta: float, algo: str) -> float:
    """Time of one collective in the alpha-beta model (see the lab's table)."""
    if p == 1:
        return 0.0
    steps = math.ceil(math.log2(p))
    frac = (p - 1) / p
    if algo == "ring":
        return {"all_reduce": 2 * (p - 1) * alpha + 2 * frac * nbytes * beta,
                "reduce_scatter": (p - 1) * alpha + frac * nbytes * beta,
                "all_gather": (p - 1) * alpha + frac * nbytes * beta,
                "broadcast": (p - 1) * alpha + nbytes * beta}[op]
    return {"all_reduce": 2 * steps * (alpha + nbytes * beta),
            "reduce_scatter": steps * alpha + frac * nbytes * beta,
            "all_gather": steps * alpha + frac * nbytes * beta,
            "broadcast": steps * (alpha + nbytes * beta)}[op]


def ref_bus_factor(op: str, p: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor."""
    return {"all_reduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p,
            "all_gather": (p - 1) / p, "broadcast": 1.0}[op]


_FORMULAS = {
    ("all_reduce", "ring"): "2(p-1)·alpha + 2(p-1)/p·n·beta (reduce-scatter, then all-gather)",
    ("reduce_scatter", "ring"): "(p-1)·alpha + (p-1)/p·n·beta",
    ("all_gather", "ring"): "(p-1)·alpha + (p-1)/p·n·beta",
    ("broadcast", "ring"): "(p-1)·alpha + n·beta (pipelined along the ring)",
    ("all_reduce", "tree"): "2·ceil(log2 p)·(alpha + n·beta) (reduce up a binomial tree, broadcast down)",
    ("reduce_scatter", "tree"): "ceil(log2 p)·alpha + (p-1)/p·n·beta (recursive halving)",
    ("all_gather", "tree"): "ceil(log2 p)·alpha + (p-1)/p·n·beta (recursive doubling)",
    ("broadcast", "tree"): "ceil(log2 p)·(alpha + n·beta) (binomial tree)",
}


def _cost_cases(gen, public):
    cases = []
    if public:
        cases += [Case("1 GiB over 8 GPUs, NVLink-like", dict(nbytes=2**30, p=8, alpha=5e-6, beta=1 / 150e9)),
                   Case("4 KiB over 6 ranks (not a power of two), IB-like", dict(nbytes=4096, p=6, alpha=2e-5,
                                                                                  beta=1 / 25e9)),
                   Case("a single rank", dict(nbytes=10**6, p=1, alpha=1e-5, beta=1e-9))]
        for i in range(2):
            cases.append(Case(f"random #{i}", dict(nbytes=float(randint(gen, 1, 2**34)), p=randint(gen, 2, 1024),
                                                   alpha=10 ** uniform(gen, -6.5, -4),
                                                   beta=10 ** -uniform(gen, 9, 12))))
        return cases
    # one case per rule, every seed (the rule is the name before ':'), random sizes and links
    p_odd = randint(gen, 3, 1023)
    p_odd += (p_odd & (p_odd - 1)) == 0  # a power of two plus one is not a power of two
    for rule, p in (("a single rank", 1), ("two ranks", 2), ("a power of two", 2 ** randint(gen, 2, 10)),
                    ("not a power of two", p_odd)):
        nbytes, alpha, beta = float(randint(gen, 1, 2**34)), 10 ** uniform(gen, -6.5, -4), 10 ** -uniform(gen, 9, 12)
        cases.append(Case(f"{rule}: p={p}, n={nbytes:.4g} bytes", dict(nbytes=nbytes, p=p, alpha=alpha, beta=beta)))
    return cases


def _cost_judge(case, obs):
    x = case.inputs
    n, p, a, b = x["nbytes"], x["p"], x["alpha"], x["beta"]
    for op in RUN.OPS:
        for algo in RUN.ALGOS:
            got, want = obs["times"][f"{op}/{algo}"], ref_collective_time(op, n, p, a, b, algo)
            if not close(got, want):
                msg = (f"collective_time({op!r}, n={n:g}, p={p}, alpha={a:.3g}, beta={b:.3g}, algo={algo!r}) = "
                       f"{got:.6g} s, expected {want:.6g} s = {_FORMULAS[op, algo]}.")
                if op == "all_reduce" and algo == "ring" and p > 1 and close(
                        got, ref_collective_time("reduce_scatter", n, p, a, b, "ring")):
                    msg += " That is one reduce-scatter: a ring all-reduce is a reduce-scatter plus an all-gather."
                if algo == "tree" and p > 1 and (p & (p - 1)) and close(
                        got * math.ceil(math.log2(p)) / math.log2(p), want, rel=1e-6):
                    msg += " A tree of p ranks needs ceil(log2 p) rounds, a whole number."
                return msg
    for op in RUN.OPS:
        want = n / obs["seconds"] * ref_bus_factor(op, p)
        if not close(obs["busbw"][op], want):
            return (f"bus_bandwidth({op!r}, n={n:g}, p={p}, seconds={obs['seconds']}) = {obs['busbw'][op]:.6g} B/s, "
                    f"expected algbw * {ref_bus_factor(op, p):.4g} = {want:.6g} B/s (algbw = n / seconds; the "
                    "factor is the fraction of n each rank's link carries: 2(p-1)/p for all-reduce, (p-1)/p for "
                    "reduce-scatter and all-gather, 1 for broadcast).")
    return None


COLLECTIVE_COST = Exercise(
    "collective_cost", 3, ("collective_time", "bus_bandwidth"), _cost_cases, RUN._cost_run, _cost_judge,
    title="Alpha-beta cost of the four collectives, ring and tree",
    hint="Ring: reduce-scatter and all-gather each take p-1 steps moving n/p bytes per step; an all-reduce is both. "
         "Tree: ceil(log2 p) rounds; a binomial tree sends the whole message every round.")


# --- 2. ring all-reduce from send/recv ----------------------------------------------------------


def _ring_cases(gen, public):
    if public:
        return [Case("3 ranks: sizes not divisible by 3, 2-D, int64, fewer elements than ranks",
                     dict(world=3, seed=11, configs=[((1001,), "float32"), ((5, 7), "float64"), ((2,), "float32"),
                                                     ((12,), "int64")]))]
    world = choice(gen, [2, 4])
    configs = [((randint(gen, 1, 3000),), "float32"), ((randint(gen, 2, 9), randint(gen, 2, 9)), "float64"),
               ((randint(gen, 1, 40),), "int64"), ((world * randint(gen, 1, 50),), "float32"),
               ((randint(gen, 1, world - 1),), "float32")]
    return [Case(f"uneven sizes, 2-D, int64, fewer elements than ranks: {world} ranks",
                 dict(world=world, seed=randint(gen, 0, 10**6), configs=configs))]


def _ring_judge(case, obs):
    x = case.inputs
    p, ranks = x["world"], obs["ranks"]
    for i, (shape, dtype) in enumerate(x["configs"]):
        what = f"shape {tuple(shape)} {dtype} on {p} ranks"
        inputs = [RUN._ring_input(x["seed"], r, i, shape, dtype) for r in range(p)]
        want = sum(t.double() if dtype != "int64" else t for t in inputs)
        want = want.to(RUN._DTYPES[dtype])
        numel = want.numel()
        for r in range(p):
            o = ranks[r][i]
            if o["collectives"]:
                return (f"{what}: ring_all_reduce called {', '.join(o['collectives'])}; build it from "
                        "point-to-point dist.send/dist.recv (or isend/irecv) only.")
            got = o["returned"]
            if not isinstance(got, torch.Tensor):
                return f"{what}: ring_all_reduce must return the tensor, got {got}."
            if bad := compare(o["inplace"], want, name=f"rank {r}'s tensor after the call", **RING_TOL):
                a, w = o["inplace"].reshape(-1).double(), want.reshape(-1).double()
                ok = int(torch.isclose(a, w, **RING_TOL).sum())
                if 0 < ok < numel and p > 1 and ok <= 2 * math.ceil(numel / p):
                    return (f"{what}: on rank {r} only {ok} of {numel} elements hold the full sum, about 1/{p} of "
                            "them: the chunk this rank reduced. The all-gather phase is missing: after the p-1 "
                            "reduce-scatter steps, run p-1 more steps that pass each reduced chunk around the "
                            f"ring.\n{bad}")
                if torch.equal(o["inplace"], inputs[r]) and compare(got, want, **RING_TOL) is None:
                    return (f"{what}: the result was returned but the input tensor was not updated: "
                            "ring_all_reduce works in place, like dist.all_reduce.")
                return f"{what}: wrong sum.\n{bad}"
            if got.shape != want.shape or not torch.equal(got, o["inplace"]):
                return f"{what}: rank {r} returned a tensor that differs from its (updated) input; return `tensor`."
            if not torch.equal(o["inplace"], ranks[0][i]["inplace"]):
                return (f"{what}: ranks 0 and {r} hold different sums (they agree only to rounding). In a ring "
                        "all-reduce each chunk is reduced once, on one rank, then copied: every rank ends with "
                        "the same bits.")
            elem = want.element_size()
            bound = 2 * (p - 1) * math.ceil(numel / p) * elem
            if o["send_bytes"] > bound:
                return (f"{what}: rank {r} sent {o['send_bytes']} bytes; a ring all-reduce sends 2(p-1) chunks of "
                        f"about n/p elements: at most {bound} bytes (2(p-1)/p · n · {elem} bytes). Sending whole "
                        "tensors to every rank costs (p-1)·n: that is not a ring.")
    return None


RING_ALL_REDUCE = Exercise(
    "ring_all_reduce", 4, ("ring_all_reduce",), _ring_cases, partial(RUN._launch_run, "ring_all_reduce",
                                                                     RUN._ring_rank), _ring_judge,
    title="Ring all-reduce from send/recv", hint="Split the flat tensor into p chunks (torch.tensor_split handles "
                                                 "uneven sizes). Step s of the reduce-scatter: send chunk "
                                                 "(rank - s) % p to the right, receive chunk (rank - s - 1) % p from "
                                                 "the left and add it. Then p-1 all-gather steps copy instead of add. "
                                                 "isend + recv + wait avoids a deadlock.")


# --- shared by the DDP checks: the model, the data, single-process references ---------------------


def _reference_training(x, opt_fn, lr_schedule=None) -> dict:
    """Single-process training on the whole batch: rank 0's model, ``steps`` steps.

    Returns the initial state, the gradients of each step and the parameters after each step."""
    import torch.nn.functional as F

    model = RUN._toy_model(x, x["seed"])
    init = {k: v.clone() for k, v in model.state_dict().items()}
    first, later = RUN._late_split(x, [p for p in model.parameters() if p.requires_grad])
    opt = opt_fn(first)
    grads, params = [], []
    for step in range(x["steps"]):
        if step == 1 and later:
            opt.add_param_group({"params": later})
        if lr_schedule is not None:
            for g in opt.param_groups:
                g["lr"] = lr_schedule(step)
        opt.zero_grad()
        xb, yb = RUN._step_batch(x, step)
        F.mse_loss(model(xb), yb).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return {"init": init, "grads": grads, "params": params, "model": model, "opt": opt}


def _judge_init(ranks, init, wrapper: str, src: str = "src=0") -> str | None:
    """Every rank's state right after the wrapper's construction must equal rank 0's initial state."""
    for r, o in enumerate(ranks):
        if not o["module_is"]:
            return f"`{wrapper}(model).module` must be the wrapped model itself."
        if not o["same_params"]:
            return (f"{wrapper}(model).parameters() must be exactly the model's parameters (got {o['n_params']}, "
                    f"the model has {o['n_model_params']}): the wrapper adds no parameters of its own.")
        for name, want in init.items():
            got = o["state0"].get(name)
            if got is None or not torch.equal(got, want):
                kind = o["kinds"].get(name, "parameter")
                if r == 0:
                    return (f"rank 0's {kind} `{name}` changed in {wrapper}(...): rank 0 is the source; broadcast "
                            f"from {src}.")
                if kind == "buffer":
                    return (f"buffer `{name}` on rank {r} differs from rank 0's after {wrapper}(...): broadcast "
                            "the buffers too (module.buffers(): BatchNorm statistics, registered buffers), not only "
                            "the parameters.")
                if kind == "frozen parameter":
                    return (f"frozen parameter `{name}` (requires_grad=False) on rank {r} differs from rank 0's "
                            f"after {wrapper}(...): broadcast every parameter, trainable or not.")
                return (f"parameter `{name}` on rank {r} differs from rank 0's after {wrapper}(...): broadcast all "
                        "parameters from rank 0 in __init__, so every replica starts identical.")
    return None


def _judge_grads(ranks, ref_grads, world: int, where: str) -> str | None:
    for step, want in enumerate(ref_grads):
        for name, w in want.items():
            g0 = ranks[0]["grads"][step].get(name)
            for r, o in enumerate(ranks):
                g = o["grads"][step].get(name)
                if g is None:
                    return f"{where}, step {step}: rank {r} has no gradient for `{name}`."
                if _differs(g, w) is None:
                    continue
                if _differs(g, w * world) is None:
                    return (f"{where}, step {step}: the gradient of `{name}` is {world} (world size) times the "
                            "single-process gradient: the gradients were summed. Divide by the world size: "
                            "data parallelism averages them, so a step equals one step on the global batch.")
                if g0 is not None and not torch.allclose(g, g0, rtol=1e-5, atol=1e-7):
                    return (f"{where}, step {step}: ranks 0 and {r} hold different gradients for `{name}` after "
                            "finish_gradient_synchronization(): the gradients were not all-reduced.")
                report = _differs(g, w, name="grad")
                return (f"{where}, step {step}: gradient of `{name}` on rank {r} differs from single-process "
                        f"training on the whole batch (mean loss).\n{report}")
    return None


def _judge_final(ranks, numbers, ref, prefix: str = "") -> str | None:
    """Each rank's parameters after training (rank ``numbers[i]`` is ``ranks[i]``) against ``ref``'s."""
    for r, o in zip(numbers, ranks):
        for name, w in ref["params"][-1].items():
            if bad := _differs(o["final"][name], w, name=f"{prefix}rank {r}'s `{name}` after training"):
                return bad
    return None


# --- 3. DDP from scratch ---------------------------------------------------------------------------


def _ddp_case(gen, world, name, public):
    hidden = [16, 24] if public else [randint(gen, 4, 24) for _ in range(randint(gen, 1, 3))]
    return Case(name, dict(world=world, seed=7 if public else randint(gen, 0, 10**6),
                           data_seed=100 if public else randint(gen, 0, 10**6), d_in=6, hidden=hidden, d_out=3,
                           batch_per_rank=4, steps=3))


def _ddp_cases(gen, public):
    """One launch: DDP over every rank, then, in the same processes, DDP over sub-groups (each group
    trains its own replica on its own data; a DDP ignoring its process_group mixes them)."""
    if public:
        case = _ddp_case(gen, 2, "2 ranks, 3 SGD steps, a buffer and a frozen parameter; then each rank a "
                                 "sub-group of its own", True)
        case.inputs["groups"] = [[0], [1]]
        return [case]
    pairs = choice(gen, [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]])
    case = _ddp_case(gen, 4, f"every rank, then two sub-groups: 4 ranks, groups {pairs}, random widths", False)
    case.inputs["groups"] = pairs
    return [case]


def _grad_bytes(ref) -> int:
    return sum(g.numel() * g.element_size() for g in ref["grads"][0].values())


def _ddp_judge(case, obs):
    x = case.inputs
    ranks, world = obs["ranks"], x["world"]
    ref = _reference_training(x, RUN._sgd)
    if bad := _judge_init(ranks, ref["init"], "DDP"):
        return bad
    if bad := _judge_grads(ranks, ref["grads"], world, "DDP"):
        return bad
    want = _grad_bytes(ref)
    for step, events in enumerate(ranks[0]["events"]):
        got = sum(4 * numel for op, numel, _, _ in events if op == "all_reduce")
        if got != want:
            return (f"DDP step {step}: all-reduced {got} bytes of float32; the trainable parameters' gradients hold "
                    f"{want} bytes: all-reduce every gradient exactly once per step with dist.all_reduce (frozen "
                    "parameters have no gradient).")
    if bad := _judge_final(ranks, range(world), ref):
        return bad
    return _judge_subgroups(x, ranks) if x.get("groups") else None


def _judge_subgroups(x, ranks, wrapper: str = "DDP") -> str | None:
    """``wrapper`` over each sub-group must train like one process on that group's batch, from the
    state of the group's first rank."""
    refs = [_reference_training(dict(RUN._subgroup_inputs(x, g), seed=x["seed"] + members[0]), RUN._sgd)
            for g, members in enumerate(x["groups"])]
    fix = ("with a process_group, broadcast from its first rank (src=dist.get_global_rank(process_group, 0)), "
           "pass group=process_group to every collective, and divide by dist.get_world_size(process_group).")
    for g, members in enumerate(x["groups"]):
        sub, ref = [ranks[r]["sub"] for r in members], refs[g]
        where = f"{wrapper}(model, process_group=dist.new_group({members}))"
        if bad := _judge_init(sub, ref["init"], wrapper, src="the group's first rank"):
            return f"{where}, ranks numbered within the group: {bad} Remember: {fix}"
        got, want = sub[0]["grads"][0], ref["grads"][0]
        everyone = {n: sum(r["grads"][0][n] for r in refs) / len(refs) for n in want}  # the groups' sizes are equal

        def matches(target, factor=1.0):
            return all(_differs(got.get(n), t * factor) is None for n, t in target.items())
        if matches(everyone) or matches(everyone, x["world"] / len(members)):  # divided by either size
            return (f"{where}, step 0: the gradients are averaged over all {x['world']} ranks, not over the group's "
                    f"{len(members)}: the all-reduce ignored the process_group (the other group trains on other "
                    f"data). Remember: {fix}")
        if matches(want, len(members) / x["world"]):
            return (f"{where}, step 0: the gradients are {x['world'] // len(members)} times too small: they were "
                    f"divided by the world size, {x['world']}, not by the group's size, {len(members)}. "
                    f"Remember: {fix}")
        if bad := _judge_grads(sub, ref["grads"], len(members), where) or _judge_final(sub, members, ref, f"{where}: "):
            return bad
    return None


DDP_FROM_SCRATCH = Exercise(
    "ddp_from_scratch", 4, ("DDP",), _ddp_cases, partial(RUN._launch_run, "DDP", RUN._ddp_rank), _ddp_judge,
    title="DDP from scratch: broadcast, then average gradients",
    hint="In __init__, dist.broadcast every parameter AND buffer from rank 0. After backward, all-reduce each gradient "
         "and divide by the world size.")


# --- 3b. DDP with one asynchronous all-reduce per parameter -----------------------------------------

def _overlap_cases(gen, public):
    """DDP's cases (every rank, then sub-groups), and in the hidden set a parameter without gradient."""
    if public:
        return _ddp_cases(gen, public)
    unused = _ddp_case(gen, 2, "a trainable parameter forward never uses: 2 ranks, random widths", False)
    unused.inputs.update(steps=2, unused=randint(gen, 1, 8))
    return [*_ddp_cases(gen, public), unused]


def _judge_per_parameter(events, sizes, names, may_wait: int) -> str | None:
    """One step's events against one asynchronous all-reduce per trainable parameter (``sizes``:
    their element counts), launched from its hook during backward (``may_wait`` at the finish)."""
    launches = [(k, e) for k, e in enumerate(events) if e[0] == "all_reduce"]
    finish = next(k for k, e in enumerate(events) if e[3] == "finish")
    grad_marks = [k for k, e in enumerate(events) if e[3].startswith("grad:")]
    if not launches:
        return ("no dist.all_reduce call was recorded; all-reduce each gradient with "
                "dist.all_reduce(p.grad, async_op=True).")
    if sorted(e[1] for _, e in launches) != sorted(sizes):
        if len(launches) < len(sizes):
            return (f"{len(launches)} all-reduce(s) of {sorted(e[1] for _, e in launches)} elements for "
                    f"{len(sizes)} trainable parameters: this wrapper all-reduces each gradient on its own, from "
                    "its own hook, as soon as it is ready (one all-reduce per parameter; buckets come in section 5).")
        return (f"all-reduces of {sorted(e[1] for _, e in launches)} elements; the trainable parameters {names} hold "
                f"{sorted(sizes)}: all-reduce each gradient exactly once per step (frozen parameters have none).")
    return _judge_overlap(launches, finish, grad_marks, may_wait, len(sizes) - may_wait > 1, "gradient",
                          "of its parameter",
                          "it")


def _overlap_judge(case, obs):
    x = case.inputs
    ranks, world = obs["ranks"], x["world"]
    ref = _reference_training(x, RUN._sgd)
    names = [n for n, p in ref["model"].named_parameters() if p.requires_grad]
    sizes = [p.numel() for p in ref["model"].parameters() if p.requires_grad]
    unused = "unused" in names
    if bad := _judge_init(ranks, ref["init"], "DDPIndividualParameters"):
        return bad
    if bad := _judge_grads(ranks, ref["grads"], world, "DDPIndividualParameters"):
        return f"{bad}\n{_UNUSED_PARAMETER}" if unused else bad
    for r, o in enumerate(ranks):
        for step, events in enumerate(o["events"]):
            if bad := _judge_per_parameter(events, sizes, names, int(unused)):
                missing = unused and sum(e[0] == "all_reduce" for e in events) < len(sizes)
                return (f"DDPIndividualParameters, rank {r}, step {step}: {bad}"
                        + (f"\n{_UNUSED_PARAMETER}" if missing else ""))
    if bad := _judge_final(ranks, range(world), ref):
        return bad
    return _judge_subgroups(x, ranks, "DDPIndividualParameters") if x.get("groups") else None


_UNUSED_PARAMETER = ("`unused` is a trainable parameter that forward never uses: it gets no gradient and its hook "
                     "never runs. finish_gradient_synchronization() must all-reduce it all the same, as zeros, so "
                     "that every rank issues the same all-reduces and ends with the same gradients.")

DDP_OVERLAP = Exercise(
    "ddp_overlap", 4, ("DDPIndividualParameters",), _overlap_cases, partial(RUN._launch_run,
                                                                            "DDPIndividualParameters", RUN._ddp_rank),
    _overlap_judge, title="DDP overlapped with backward: one asynchronous all-reduce per parameter",
    hint="Broadcast as DDP; p.register_post_accumulate_grad_hook(hook) on each trainable parameter; the hook calls "
         "dist.all_reduce(p.grad, group=..., async_op=True) and keeps the handle; finish_gradient_synchronization() "
         "waits on each handle and divides by the group's size.")


# --- 4. bucket assignment ----------------------------------------------------------------------------

def ref_assign_buckets(sizes_bytes, bucket_size_mb) -> list:
    """Reverse registration order; a bucket closes as soon as its bytes exceed the limit (> cap)."""
    cap = bucket_size_mb * 2**20
    buckets, current, total = [], [], 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        total += sizes_bytes[i]
        if total > cap:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


def _bucket_cases(gen, public):
    mb = 2**20
    cases = []
    if public:
        cases += [Case("the example of the lab", dict(sizes=[400, 40, 300, 30, 200, 20], mb=250 / mb)),
                  Case("four 100-byte parameters, a 200-byte limit",
                       dict(sizes=[100, 100, 100, 100], mb=200 / mb)),
                  Case("a 5000-byte parameter among 10-byte ones, a 15-byte limit",
                       dict(sizes=[10, 5000, 10, 10], mb=15 / mb)),
                  Case("25 MB, a transformer-like list", dict(sizes=[4 * 50257 * 768] + [4 * 768 * 2304, 4 * 2304,
                                                                                         4 * 768 * 768, 4 * 768] * 4,
                                                              mb=25)),
                  Case("nothing to bucket", dict(sizes=[], mb=1.0))]
        for i in range(2):
            n = randint(gen, 1, 40)
            sizes = [4 * randint(gen, 1, 5000) for _ in range(n)]
            cap = randint(gen, 1, max(2, sum(sizes) // 2))
            if i % 3 == 0:  # land exactly on a running sum: "exceeds" and "reaches" differ there
                cap = sum(sizes[-randint(gen, 1, n):])
            cases.append(Case(f"random #{i}", dict(sizes=sizes, mb=cap / mb)))
        return cases
    # one case per rule, every seed, random sizes; named by number (a name says nothing of the buckets)
    for n_rule, rule in enumerate(("a limit some bucket reaches exactly", "a parameter larger than the limit",
                                   "one bucket, the limit above the total", "many small buckets",
                                   "any sizes and limit", "nothing to bucket")):
        n = randint(gen, 2, 40)
        sizes = [4 * randint(gen, 1, 5000) for _ in range(n)]
        cap = randint(gen, 1, max(2, sum(sizes) // 2))
        if rule.startswith("a limit some bucket reaches"):  # "exceeds" and "reaches" differ there
            cap = sum(sizes[-randint(gen, 1, n - 1):])
        elif rule.startswith("a parameter larger"):
            sizes[randint(gen, 0, n - 2)] = 4 * (cap // 4 + randint(gen, 1, 5000))
        elif rule.startswith("one bucket"):
            cap = sum(sizes) + randint(gen, 0, 1000)
        elif rule.startswith("many small"):
            cap = randint(gen, 1, max(2, max(sizes) // 2))
        elif rule == "nothing to bucket":
            sizes = []
        cases.append(Case(f"limit {n_rule + 1}: {len(sizes)} parameters, limit {cap} bytes",
                          dict(sizes=sizes, mb=cap / mb)))
    return cases


def _bucket_judge(case, obs):
    sizes, mb = case.inputs["sizes"], case.inputs["mb"]
    want, got = ref_assign_buckets(sizes, mb), obs["buckets"]
    if got == want:
        return Neutral("no parameters, no buckets (not scored)") if not sizes else None
    cap = mb * 2**20
    flat = [i for b in got for i in b]
    if sorted(flat) != list(range(len(sizes))):
        return f"every index 0..{len(sizes) - 1} must appear in exactly one bucket; got {got}."
    if len(got) == 1 and len(want) > 1:
        return (f"one bucket of {sum(sizes)} bytes, but the limit is {cap:.0f} bytes: close a bucket as soon as its "
                f"size exceeds bucket_size_mb * 2**20 bytes. Expected {want}.")
    sizes_got = [sum(sizes[i] for i in b) for b in got]
    if flat != [i for b in want for i in b]:
        return (f"got {got}, expected {want}: walk the parameters in reverse order of registration (the order "
                "backward produces their gradients), last index first.")
    return (f"sizes {sizes} bytes, limit {cap:.0f} bytes: got buckets {got} ({sizes_got} bytes), expected {want} "
            f"({[sum(sizes[i] for i in b) for b in want]} bytes). Rule: add the next parameter to the open bucket; "
            "close the bucket right after the parameter that makes its total exceed the limit (> limit, not >=); "
            "the last bucket may be smaller.")


BUCKET_ASSIGNMENT = Exercise(
    "bucket_assignment", 2, ("assign_buckets",), _bucket_cases, RUN._bucket_run, _bucket_judge,
    title="Gradient buckets by size", hint="for i in reversed(range(n)): add i; if the bucket's "
                                           "bytes > bucket_size_mb * 2**20: close it.")


# --- 5. bucketed DDP, all-reduce overlapped with backward ------------------------------------------


def _bucketed_cases(gen, public):
    if public:
        case = _ddp_case(gen, 2, "2 ranks; limits giving 6, 3, 2 and 1 buckets", True)
        # parameter bytes of hidden [16, 24], in reverse order: 12, 288, 96, 1536, 64, 384
        case.inputs["bucket_mb"] = [0.0, 300 / 2**20, 1000 / 2**20, 1.0]
        return [case]
    world = randint(gen, 3, 4)
    case = _ddp_case(gen, world, f"a random limit, then the last three parameters' bytes: {world} ranks, random "
                                 "widths", False)
    case.inputs["steps"] = 2
    sizes = [p.numel() * 4 for p in RUN._toy_model(case.inputs, 0).parameters() if p.requires_grad]
    case.inputs["bucket_mb"] = [randint(gen, 1, sum(sizes) // 2) / 2**20, sum(sizes[-3:]) / 2**20]
    # `unused` gets no gradient: its bucket (the last) never completes in backward; one bucket for all
    # puts it with every other gradient, which must be averaged all the same
    unused = _ddp_case(gen, 2, "a trainable parameter forward never uses: 2 ranks, random widths, a random limit, "
                               "then one bucket for all", False)
    unused.inputs.update(steps=2, unused=randint(gen, 1, 8))
    sizes = [p.numel() * 4 for p in RUN._toy_model(unused.inputs, 0).parameters() if p.requires_grad]
    unused.inputs["bucket_mb"] = [randint(gen, 1, sum(sizes) // 2) / 2**20, sum(sizes) / 2**20]
    return [case, unused]


def _judge_schedule(events, buckets, sizes, may_wait: int = 0) -> str | None:
    """One step's events (collectives and gradient marks, in order) against the buckets of ``sizes``
    (elements per trainable parameter): one async all-reduce per bucket, launched during backward,
    except ``may_wait`` buckets (those holding a parameter without a gradient), launched at the finish."""
    launches = [(k, e) for k, e in enumerate(events) if e[0] == "all_reduce"]
    numels = sorted(e[1] for _, e in launches)
    want_numels = sorted(sum(sizes[i] for i in b) for b in buckets)
    finish = next(k for k, e in enumerate(events) if e[3] == "finish")
    grad_marks = [k for k, e in enumerate(events) if e[3].startswith("grad:")]
    rule = (f"{len(buckets)} bucket(s) of {[sum(sizes[i] for i in b) for b in buckets]} elements "
            f"(parameters in reverse order, a bucket closes once its bytes exceed the limit)")
    if not launches:
        return "no dist.all_reduce call was recorded; all-reduce each bucket with dist.all_reduce(flat, async_op=True)."
    if numels != want_numels:
        if len(numels) == 1 and len(want_numels) > 1:
            return f"one all-reduce of every gradient, but the limit gives {rule}: the bucket size limit was ignored."
        if len(numels) == len(sizes) and len(want_numels) < len(sizes):
            return (f"one all-reduce per parameter ({len(numels)}), expected one per bucket: {rule}. Flatten each "
                    "bucket's gradients into one buffer.")
        return f"all-reduce sizes {numels} elements, expected one per bucket: {rule}; use your assign_buckets."
    # a bucket holding a parameter without gradient completes only at the finish: it cannot start early
    return _judge_overlap(launches, finish, grad_marks, may_wait, len(buckets) - may_wait > 1, "bucket",
                          "of its last gradient", "its last gradient")


def _judge_overlap(launches, finish: int, grad_marks, may_wait: int, several: bool, unit: str,
                   hook: str, ready: str) -> str | None:
    """The all-reduces (``(position, event)`` in one step's events) of a wrapper overlapping backward:
    asynchronous, launched from the hooks before ``finish`` (but ``may_wait`` of them), the first
    one before the last gradient mark when ``several`` of them can start during backward."""
    if not all(e[2] for _, e in launches):
        return ("an all-reduce was blocking; launch each with async_op=True from the hook and wait() on the handles "
                f"in finish_gradient_synchronization(), so backward goes on computing while the {unit} is on the "
                "wire.")
    late = [k for k, _ in launches if k > finish]
    if len(late) > may_wait:
        return (f"{len(late)} of {len(launches)} all-reduces started in finish_gradient_synchronization(), after "
                f"backward: launch each {unit} from the post-accumulate-grad hook {hook} "
                "(register_post_accumulate_grad_hook), so communication overlaps the rest of backward.")
    if several and grad_marks and launches[0][0] > grad_marks[-1]:
        return ("no all-reduce started during backward: the first launch came after the last gradient was computed. "
                f"Launch a {unit}'s all-reduce as soon as {ready} is accumulated.")
    return None


_UNUSED_ADVICE = ("`unused` is a trainable parameter that forward never uses: it gets no gradient and its hook never "
                  "runs, so its bucket never completes during backward. finish_gradient_synchronization() must "
                  "launch every bucket not launched yet, counting a missing gradient as zeros, so that the other "
                  "gradients of that bucket are averaged too.")


def _bucketed_judge(case, obs):
    x = case.inputs
    ref = _reference_training(x, RUN._sgd)
    sizes = [p.numel() for p in ref["model"].parameters() if p.requires_grad]
    trainable = [n for n, p in ref["model"].named_parameters() if p.requires_grad]
    unused = [i for i, n in enumerate(trainable) if n == "unused"]  # none, or the first trainable parameter
    for c, mb in enumerate(x["bucket_mb"]):
        ranks = [o[c] for o in obs["ranks"]]
        where = f"bucket_size_mb={mb * 2**20:.0f} bytes / 2**20"
        if bad := _judge_init(ranks, ref["init"], "BucketedDDP"):
            return bad
        if bad := _judge_grads(ranks, ref["grads"], x["world"], where):
            return f"{bad}\n{_UNUSED_ADVICE}" if unused else bad
        buckets = ref_assign_buckets([4 * s for s in sizes], mb)
        may_wait = sum(any(i in b for i in unused) for b in buckets)
        for r, o in enumerate(ranks):
            for step, events in enumerate(o["events"]):
                if bad := _judge_schedule(events, buckets, sizes, may_wait):
                    missing = unused and sum(e[0] == "all_reduce" for e in events) < len(buckets)
                    return f"{where}, rank {r}, step {step}: {bad}" + (f"\n{_UNUSED_ADVICE}" if missing else "")
    return None


BUCKETED_DDP = Exercise(
    "bucketed_ddp", 5, ("BucketedDDP",), _bucketed_cases, partial(RUN._launch_run, "BucketedDDP", RUN._bucketed_rank),
    _bucketed_judge,
    title="Bucketed DDP: all-reduce overlapped with backward",
    hint="Count the gradients each bucket still waits for; in the post-accumulate-grad hook of its last one, flatten "
         "the bucket and dist.all_reduce(flat, async_op=True); in finish_gradient_synchronization wait, divide by the "
         "world size, copy back, reset the counters.")


# --- 6. ZeRO-1 sharded optimizer ---------------------------------------------------------------------


def _sharded_cases(gen, public):
    """Every rank, then (in the same processes) ShardedOptimizer(..., process_group=...) over sub-groups that
    train on different data: an optimizer that broadcasts over every rank mixes the groups' parameters."""
    base = dict(d_in=16, hidden=[16, 16, 16, 16], d_out=16, batch_per_rank=4, lr=0.01, steps=3)
    if public:
        return [Case("2 ranks, Adam, 10 parameters, lr halved after step 0; then each rank a sub-group of its own",
                     dict(base, world=2, seed=3, data_seed=30, groups=[[0], [1]]))]
    pairs = choice(gen, ([[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]))
    cases = [Case(f"Adam, lr halved after step 0, then two sub-groups: 4 ranks, groups {pairs}, random seeds",
                  dict(base, world=4, seed=randint(gen, 0, 10**6), data_seed=randint(gen, 0, 10**6), groups=pairs))]
    late = 2 * randint(gen, 1, 2)  # the last one or two layers' weights and biases
    return cases + [Case(f"a param group added after step 0: 2 ranks, the last {late} parameters, random seeds",
                         dict(base, world=2, late=late, seed=randint(gen, 0, 10**6),
                              data_seed=randint(gen, 0, 10**6)))]


def _sharded_judge(case, obs):
    x = case.inputs
    world, ranks = x["world"], obs["ranks"]
    for r, o in enumerate(ranks):
        if not o["is_optimizer"]:
            return "ShardedOptimizer must subclass torch.optim.Optimizer (schedulers and training loops rely on it)."
        if not o["groups_cover"]:
            return ("ShardedOptimizer.param_groups must hold every parameter passed in, on every rank (call "
                    "super().__init__(params, defaults)); only the optimizer *state* is sharded.")
    ref = _reference_training(x, _adam(x), RUN._adam_lr(x))
    if bad := _judge_sharded_params(x, ranks, ref):
        return bad
    if bad := _judge_sharded_state(ranks, ref, world):
        return bad
    for g, members in enumerate(x.get("groups") or []):
        xg = RUN._subgroup_inputs(x, g)
        sub = [ranks[r]["sub"] for r in members]
        if bad := _judge_sharded_params(xg, sub, _reference_training(xg, _adam(x), RUN._adam_lr(x))):
            return (f"ShardedOptimizer(params, Adam, process_group=dist.new_group({members})), ranks numbered within "
                    f"the group: {bad}\nWith a process_group, shard over the group's ranks "
                    "(dist.get_rank(process_group), dist.get_world_size(process_group)) and broadcast within it: "
                    "dist.broadcast(p, src=dist.get_global_rank(process_group, owner), group=process_group) (the other "
                    "group holds other parameters).")
    return None


def _adam(x):
    return lambda params: torch.optim.Adam(params, lr=x["lr"])


def _judge_sharded_params(x, ranks, ref) -> str | None:
    """Every rank's parameters after each step equal plain Adam's on the whole batch (``ref``)."""
    names = [n for n, p in ref["model"].named_parameters() if p.requires_grad]
    added = RUN._late_split(x, names)[1]
    fixed_lr = _reference_training(x, _adam(x))
    for step in range(x["steps"]):
        for r, o in enumerate(ranks):
            for name, w in ref["params"][step].items():
                got = o["params"][step][name]
                if bad := _differs(got, w, name=f"rank {r}'s `{name}` after step {step}", atol=_adam_atol(x)):
                    if _differs(got, fixed_lr["params"][step][name], atol=_adam_atol(x)) is None:
                        return (f"step {step}: the learning rate set in param_groups (as a scheduler does) was "
                                "ignored: copy each group's hyperparameters to your local optimizer before it steps.")
                    if name in added:
                        return (f"step {step}: `{name}` joined with opt.add_param_group(...) after step 0 and is "
                                "not updated as plain Adam would: give the new group's parameters owners (the same "
                                "rule), add them to their owner's local optimizer, and broadcast them in step() "
                                f"like the others.\n{bad}")
                    if r > 0 and torch.equal(got, ref["init"][name]):
                        return (f"step {step}: `{name}` on rank {r} never changed: the updated parameters must be "
                                "broadcast from the rank that owns them to all others.")
                    return f"step {step}: {bad}"
    return None


def _judge_sharded_state(ranks, ref, world) -> str | None:
    """The optimizer state is split over the ranks, balanced; step() only broadcasts; zero_grad() clears."""
    full = RUN._state_numel([ref["opt"]])
    per_rank = [o["state_numel"] for o in ranks]
    biggest = max(p.numel() for p in ref["model"].parameters() if p.requires_grad)
    per_elem = full / sum(p.numel() for p in ref["model"].parameters() if p.requires_grad)
    if sum(per_rank) != full:
        if min(per_rank) >= full:
            return (f"every rank holds optimizer state for the whole model ({per_rank} elements per rank; the full "
                    f"Adam state is {full}): each rank must keep the state of its own shard only, about "
                    f"{full / world:.0f}.")
        return (f"optimizer state per rank {per_rank} elements sums to {sum(per_rank)}, the full Adam state is {full}: "
                "each parameter's state must live on exactly one rank (its owner).")
    limit = full / world + per_elem * biggest
    if max(per_rank) > limit:
        return (f"optimizer state per rank {per_rank} elements: too unbalanced; about {full / world:.0f} each is "
                f"possible (at most {limit:.0f} with whole parameters per rank). Balance the shards by size.")
    param_bytes = sum(4 * p.numel() for p in ref["model"].parameters() if p.requires_grad)
    for step, comm in enumerate(ranks[0]["comm"]):
        if "all_reduce" in comm:
            return (f"step {step}: ShardedOptimizer.step() called dist.all_reduce: the gradients are already "
                    "averaged (by DDP); step() updates this rank's shard, then broadcasts the updated parameters.")
        moved = sum(comm.get(op, (0, 0))[1] for op in ("broadcast", "all_gather", "all_gather_into_tensor"))
        if moved > 2 * param_bytes:
            return (f"step {step}: step() moved {moved} bytes for {param_bytes} bytes of parameters: send each updated "
                    "parameter once, from its owner.")
    for r, o in enumerate(ranks):
        if not o["zeroed"]:
            return f"rank {r}: zero_grad() left gradients non-zero; it must clear every parameter's gradient."
    return None


SHARDED_OPTIMIZER = Exercise(
    "sharded_optimizer", 4, ("ShardedOptimizer",), _sharded_cases, partial(RUN._launch_run, "ShardedOptimizer",
                                                                           RUN._sharded_rank),
    _sharded_judge, title="ZeRO-1: a sharded optimizer",
    hint="super().__init__(params, kwargs); give each parameter an owner rank (balance by numel); build optimizer_cls "
         "over your own parameters only; in step(): copy the group hyperparameters, step locally, then "
         "dist.broadcast(p, src=owner) for every parameter.")


# --- 7. FSDP (ZeRO-3): parameters sharded, gathered per layer, gradients reduce-scattered --------------

GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")


def _fsdp_case(name, world, seed, data_seed, hidden, d_in, d_out, **extra):
    return Case(name, dict(dict(world=world, seed=seed, data_seed=data_seed, d_in=d_in, hidden=hidden, d_out=d_out,
                                batch_per_rank=2, steps=3), **extra))


def _unit_numels(x) -> list:
    dims = [x["d_in"], *x["hidden"], x["d_out"]]
    return [b * (a + 1) for a, b in zip(dims[:-1], dims[1:])]  # weight (b, a) and bias (b,)


def _fsdp_cases(gen, public):
    if public:  # units of 135, 384 and 125 elements: two of them need one element of padding on 2 ranks
        return [_fsdp_case("2 ranks, 3 SGD steps, layers of 135, 384 and 125 parameters (padding); then each rank a "
                           "sub-group of its own", 2, 5, 50, [15, 24], 8, 5, groups=[[0], [1]])]
    world = 4
    while True:  # widths of at least 12 (a layer's parameters outweigh the activations held beside them)
        hidden, d_out = [randint(gen, 12, 28) for _ in range(randint(gen, 1, 2))], randint(gen, 4, 9)
        numels = _unit_numels(dict(d_in=8, hidden=hidden, d_out=d_out))
        if any(n % world for n in numels):
            break
    pairs = choice(gen, [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]])
    return [_fsdp_case(f"every rank, then two sub-groups: 4 ranks, groups {pairs}, layers of {numels} parameters "
                       "(a padding tail)", 4, randint(gen, 0, 10**6), randint(gen, 0, 10**6), hidden, 8, d_out,
                       groups=pairs, steps=2)]


def _judge_fsdp_params(got, want, where: str) -> str | None:
    """Full parameters (``gather_full_params()``) against the reference's."""
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            return (f"{where}: gather_full_params() has no `{name}`; it returns every parameter of the wrapped module "
                    "by its name in module.named_parameters().")
        if bad := _differs(g, w, name=f"`{name}`"):
            return f"{where}: {bad}"
    return None


def _padding_tail(got, want, x, world) -> str | None:
    """The layers whose flat vector (weight then bias) differs only in its last ``numel % world`` elements."""
    for i, numel in enumerate(_unit_numels(x)):
        tail = numel % world
        flat_got = torch.cat([got[f"layers.{i}.{n}"].reshape(-1) for n in ("weight", "bias")])
        flat_want = torch.cat([want[f"layers.{i}.{n}"].reshape(-1) for n in ("weight", "bias")])
        wrong = ~torch.isclose(flat_got, flat_want, rtol=1e-5, atol=1e-6)
        if tail and wrong.any() and not wrong[:numel - tail].any():
            return (f"layer {i} has {numel} parameters, not a multiple of {world} ranks: its last {tail} element(s) "
                    f"came back wrong ({flat_got[numel - tail:].tolist()} instead of "
                    f"{flat_want[numel - tail:].tolist()}). Pad the flat vector with zeros to ceil(numel / p) * p "
                    "elements before cutting p equal shards, and drop the padding only when viewing the gathered "
                    "vector as parameters.")
    return None


def _judge_fsdp_training(x, ranks, numbers, ref, where: str) -> str | None:
    world = len(ranks)
    for r, o in zip(numbers, ranks):
        if bad := _judge_fsdp_params(o["init"], ref["init_params"], f"{where}, rank {r}, right after wrapping"):
            return (_padding_tail(o["init"], ref["init_params"], x, world) or
                    f"{bad}\nBroadcast every parameter and buffer from the group's first rank before sharding.")
    summed = _reference_training(x, lambda ps: torch.optim.SGD(ps, lr=0.1 * world, momentum=0.9))
    for step in range(x["steps"]):
        for r, o in zip(numbers, ranks):
            got = o["params"][step]
            if bad := _judge_fsdp_params(got, ref["params"][step], f"{where}, rank {r}, after step {step}"):
                if all(n in got and _differs(got[n], w) is None for n, w in summed["params"][step].items()):
                    return (f"{where}, step {step}: the parameters moved as if the gradients were summed over the "
                            f"{world} ranks: divide the reduce-scattered gradient by the group's size, so that a step "
                            "equals one step on the global batch.")
                return bad
    return None


def _judge_fsdp_comm(x, ranks) -> str | None:
    world, numels = x["world"], _unit_numels(x)
    padded = sorted(4 * (-(-n // world) * world) for n in numels)
    psi = 4 * sum(numels)
    for r, o in enumerate(ranks):
        for step, calls in enumerate(o["comm"]):
            where = f"rank {r}, step {step}"

            def sizes(ops, phase=None):
                return sorted(c["bytes"] for c in calls if c["op"] in ops and (phase is None or c["phase"] == phase))
            reduced = sum(sizes(("all_reduce",)))
            if reduced:
                return (f"{where}: {reduced} bytes went through dist.all_reduce; FSDP reduce-scatters each layer's "
                        "gradient (dist.reduce_scatter or reduce_scatter_tensor): each rank receives only the sum of "
                        "its own shard, half an all-reduce's traffic, and never holds the full gradient.")
            if sizes(SCATTERS, "backward") != padded:
                return (f"{where}: reduce-scatters in backward of {sizes(SCATTERS, 'backward')} bytes; expected one "
                        f"per layer, of its padded flat gradient: {padded} bytes.")
            for phase, why in (("forward", "just before its forward"),
                               ("backward", "again in backward, since forward freed it")):
                if sizes(GATHERS, phase) != padded:
                    return (f"{where}: all-gathers in {phase} of {sizes(GATHERS, phase)} bytes; expected one per "
                            f"layer {why}, of its padded flat parameters: {padded} bytes.")
            moved = sum(c["bytes"] for c in calls)
            if moved != 3 * sum(padded):
                return (f"{where}: {moved} bytes of collectives, expected 3 x {sum(padded)} (two all-gathers and one "
                        f"reduce-scatter of the padded parameters; DDP would all-reduce {psi}).")
    return None


def _judge_fsdp_memory(x, ranks) -> str | None:
    world, numels = x["world"], _unit_numels(x)
    shard_numel = sum(-(-n // world) for n in numels)
    smallest, plain = 4 * min(numels), RUN._plain_residency(x)
    for r, o in enumerate(ranks):
        held = o["wrapped"] - plain
        if held >= smallest / 2:
            return (f"rank {r}: once forward has returned, it holds {held} bytes more than the unwrapped model does, "
                    f"while its layers hold {[4 * n for n in numels]} bytes of parameters: gathered parameters were "
                    "not freed after their layer's forward (a reference kept: in a cache, on the module, or saved by "
                    f"autograd for backward). Resident parameters between layers must be about 1/{world} of the "
                    f"model, {4 * shard_numel} bytes: free the full vector after each layer and all-gather it again "
                    "in backward.")
        if o["param_numel"] > shard_numel:
            return (f"rank {r}: FSDP(...).parameters() holds {o['param_numel']} trainable elements; the shards hold "
                    f"{shard_numel} (the model {sum(numels)}): the optimizer must step on this rank's shards only.")
        if o["state_numel"] > shard_numel:
            return (f"rank {r}: the optimizer holds {o['state_numel']} elements of state (SGD momentum), about the "
                    f"whole model ({sum(numels)}); over the shards it would hold {shard_numel}: the optimizer must "
                    "step on this rank's shards only.")
    return None


def _fsdp_judge(case, obs):
    x, ranks = case.inputs, obs["ranks"]
    ref = _reference_training(x, RUN._sgd)
    ref["init_params"] = {n: ref["init"][n] for n, _ in ref["model"].named_parameters()}
    if bad := _judge_fsdp_training(x, ranks, range(x["world"]), ref, "FSDP"):
        return bad
    if bad := _judge_fsdp_memory(x, ranks) or _judge_fsdp_comm(x, ranks):
        return bad
    for g, members in enumerate(x.get("groups") or []):
        xg = RUN._subgroup_inputs(x, g)
        sub = _reference_training(dict(xg, seed=x["seed"] + members[0]), RUN._sgd)
        sub["init_params"] = {n: sub["init"][n] for n, _ in sub["model"].named_parameters()}
        if bad := _judge_fsdp_training(xg, [ranks[r]["sub"] for r in members], members, sub,
                                       f"FSDP(model, process_group=dist.new_group({members}))"):
            return (f"{bad}\nWith a process_group: broadcast from its first rank, shard over "
                    "dist.get_world_size(process_group) ranks at dist.get_rank(process_group), pass "
                    "group=process_group to every collective and divide by the group's size.")
    return _judge_fsdp_placement(ranks[0]) or _judge_fsdp_no_units(ranks[0])


def _judge_fsdp_placement(o) -> str | None:
    """_all_gather and _reduce_scatter make their buffers on the tensors' device, not torch's default one."""
    for method, where in o["placement"].items():
        if where != "cpu":
            return (f"FSDP.{method} with torch's default device elsewhere than the shard's (the check sets it to "
                    f"'meta'; on a GPU it stays 'cpu' while the shards are CUDA tensors, which NCCL needs): {where}. "
                    "Make every communication buffer on the tensors' device: torch.empty(..., dtype=..., "
                    "device=shard.device) (full_grad.device in _reduce_scatter).")
    return None


def _judge_fsdp_no_units(o) -> str | None:
    """FSDP with unit_types matching no module must not silently replicate everything."""
    got = o["no_units"]
    if "raised" in got or got.get("warned"):
        return None
    if "other" in got:
        return (f"FSDP(model, unit_types=(nn.Conv2d,)) on a model without any Conv2d raised {got['other']}: raise a "
                "ValueError that says no module matched unit_types (nothing would be sharded).")
    return ("FSDP(model, unit_types=(nn.Conv2d,)) on a model without any Conv2d built zero units and said nothing: "
            "every parameter stays replicated, which is not what FSDP was asked for. Raise a ValueError (or warn) "
            "when no module of `module` is an instance of unit_types, before any collective.")


FSDP_EXERCISE = Exercise(
    "fsdp", 6, ("FSDP",), _fsdp_cases, partial(RUN._launch_run, "FSDP", RUN._fsdp_rank), _fsdp_judge,
    title="FSDP (ZeRO-3): shard the parameters, gather them per layer, reduce-scatter the gradients",
    hint="Per unit: flatten, pad to a multiple of p, keep chunk `rank`. An autograd.Function per unit: forward "
         "all-gathers, runs the unit under no_grad and frees; backward all-gathers again, recomputes the unit with "
         "a graph, reduce-scatters the flat gradient and divides by p.")


# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.commlog.CommLog", "gpulab.commlog.record_collectives", "gpulab.dist.launch",
           "gpulab.measurements.show_measurements", "gpulab.toy.ToyMLP", "gpulab.toy.shard", "gpulab.toy.toy_batch")
EXERCISES = [offering(ex, OFFERED) for ex in (COLLECTIVE_COST, RING_ALL_REDUCE, DDP_FROM_SCRATCH, DDP_OVERLAP,
                                          BUCKET_ASSIGNMENT, BUCKETED_DDP, SHARDED_OPTIMIZER, FSDP_EXERCISE)]

# No BENCHMARKS: `grader bench` times one function in one process, and collectives need several
# ranks; on CPU (gloo) their timings say nothing about NCCL. The lesson measures volumes instead.
BENCHMARKS: list = []
