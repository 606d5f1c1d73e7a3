"""The learner side of lab 11_data_parallel: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/11_data_parallel.py``).
"""
from __future__ import annotations

import torch

from grader.exercise import entry
from grader.runs.ranks import launch_ranks, probe_on_one_rank

LAUNCH_TIMEOUT_S = 30.0   # per launch: the process group's timeout; a hung rank ends after it


OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


ALGOS = ("ring", "tree")


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


def _launch_run(name, rank_fn, ns, case, device):
    """The run side of a distributed exercise: ``rank_fn(rank, world_size, learner's name, case inputs)``
    on the case's ``world`` ranks; a stub is found first on one rank, here."""
    learner = entry(ns, name)
    return {"ranks": launch_ranks((name, learner), rank_fn, case.inputs["world"], learner, case.inputs,
                                  timeout_s=LAUNCH_TIMEOUT_S,
                                  probe=lambda: probe_on_one_rank(rank_fn, learner, case.inputs))}


def _cost_run(ns, case, device):
    x = case.inputs
    t, bw = entry(ns, "collective_time"), entry(ns, "bus_bandwidth")
    times = {f"{op}/{algo}": float(t(op, x["nbytes"], x["p"], x["alpha"], x["beta"], algo=algo))
             for op in OPS for algo in ALGOS}
    seconds = 1e-3
    busbw = {op: float(bw(op, x["nbytes"], x["p"], seconds)) for op in OPS}
    return {"times": times, "busbw": busbw, "seconds": seconds}


def _ring_input(seed: int, rank: int, index: int, shape, dtype: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1000 + index * 10 + rank)
    if dtype == "int64":
        return torch.randint(-1000, 1000, tuple(shape), generator=gen)
    return torch.randn(tuple(shape), generator=gen, dtype=_DTYPES[dtype])


def _ring_rank(rank, world_size, fn, x):
    from gpulab.commlog import POINT_TO_POINT, record_collectives

    out = []
    for i, (shape, dtype) in enumerate(x["configs"]):
        t = _ring_input(x["seed"], rank, i, shape, dtype)
        with record_collectives() as log:
            result = fn(t)
        sends = log.calls(("send", "isend"))
        out.append({"inplace": t.clone(),
                    "returned": result.detach().clone() if isinstance(result, torch.Tensor) else repr(result)[:80],
                    "sends": len(sends), "send_bytes": sum(e.nbytes for e in sends),
                    "collectives": sorted({e.op for e in log.calls() if e.op not in POINT_TO_POINT})})
    return out


def _model_kwargs(x) -> dict:
    return dict(d_in=x["d_in"], hidden=tuple(x["hidden"]), d_out=x["d_out"])


def _toy_model(x, seed: int):
    """The case's ToyMLP from ``seed``. With ``x["unused"]``, plus `unused`, a trainable parameter of that
    many elements that forward never uses (no gradient, no hook call): the first trainable parameter
    registered, so it lands in the last bucket."""
    from gpulab.toy import ToyMLP

    model = ToyMLP(**_model_kwargs(x), seed=seed)
    if x.get("unused"):
        model.unused = torch.nn.Parameter(torch.randn(x["unused"], generator=torch.Generator().manual_seed(seed)))
    return model


def _late_split(x, params) -> tuple[list, list]:
    """The parameters the optimizer starts with, and the last ``x["late"]`` ones, which a training loop
    adds with ``add_param_group`` before step 1 (as when unfreezing the head)."""
    k = x.get("late", 0)
    return params[:len(params) - k], params[len(params) - k:]


def _step_batch(x, step: int):
    from gpulab.toy import toy_batch

    return toy_batch(x["data_seed"] + step, x["batch_per_rank"] * x["world"], x["d_in"], x["d_out"])


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _state_kinds(model) -> dict:
    kinds = {n: "buffer" for n, _ in model.named_buffers()}
    kinds.update({n: "parameter" if p.requires_grad else "frozen parameter" for n, p in model.named_parameters()})
    return kinds


def _train_replica(rank, cls, x, data_rank, data_world, *wrapper_args, **wrapper_kwargs) -> dict:
    """Rank ``rank``'s model (seed + rank: replicas differ until broadcast) wrapped in ``cls``, then
    ``steps`` SGD steps on shard ``data_rank`` of ``data_world`` of each batch.

    Observes the wrapper right after its construction, and per step the gradients after
    ``finish_gradient_synchronization()`` and the ordered events: collectives, ``grad:<name>`` when a
    gradient is accumulated, ``finish`` when finish_gradient_synchronization() is called; then the
    final parameters.
    """
    import torch.nn.functional as F

    from gpulab.commlog import record_collectives
    from gpulab.toy import shard

    torch.manual_seed(1000 + rank)
    model = _toy_model(x, x["seed"] + rank)
    kinds = _state_kinds(model)
    step_log = {"log": None}  # the step's CommLog from forward to finish_gradient_synchronization()

    def mark(name):
        if step_log["log"] is not None:
            step_log["log"].mark(f"grad:{name}")

    for name, p in model.named_parameters():  # registered before the learner's hooks: they run first
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p, name=name: mark(name))
    with record_collectives() as log:
        wrapped = cls(model, *wrapper_args, **wrapper_kwargs)
    obs = {"module_is": getattr(wrapped, "module", None) is model,
           "same_params": [id(p) for p in wrapped.parameters()] == [id(p) for p in model.parameters()],
           "n_params": len(list(wrapped.parameters())), "n_model_params": len(list(model.parameters())),
           "state0": {k: v.detach().clone() for k, v in model.state_dict().items()}, "kinds": kinds,
           "init_comm": log.summary(), "grads": [], "events": []}
    opt = _sgd([p for p in model.parameters() if p.requires_grad])
    for step in range(x["steps"]):
        opt.zero_grad()
        xb, yb = _step_batch(x, step)
        xb, yb = shard(xb, data_rank, data_world), shard(yb, data_rank, data_world)
        with record_collectives() as log:
            step_log["log"] = log
            F.mse_loss(wrapped(xb), yb).backward()
            log.mark("finish")
            wrapped.finish_gradient_synchronization()
            step_log["log"] = None
        obs["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        obs["events"].append([(e.op, e.numel, e.async_op, e.label) for e in log.events])
        opt.step()
    obs["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return obs


def _ddp_rank(rank, world_size, cls, x):
    obs = _train_replica(rank, cls, x, rank, world_size)
    if x.get("groups") and world_size == x["world"]:  # not in the single-rank probe for a stub
        obs["sub"] = _ddp_subgroup_rank(rank, cls, x)
    return obs


def _subgroup_inputs(x, g: int) -> dict:
    """The training of sub-group ``g``: its own size and its own data (so that averaging over every
    rank instead of the group gives other gradients)."""
    return dict(x, world=len(x["groups"][g]), data_seed=x["data_seed"] + 7919 * (g + 1))


def _ddp_subgroup_rank(rank, cls, x):
    """Train again, with ``DDP(model, process_group=...)`` over the sub-group holding this rank."""
    import torch.distributed as dist

    handles = [dist.new_group(members) for members in x["groups"]]  # every rank creates every group, in order
    g = next(g for g, members in enumerate(x["groups"]) if rank in members)
    members, xg = x["groups"][g], _subgroup_inputs(x, g)
    return _train_replica(rank, cls, xg, members.index(rank), len(members), process_group=handles[g])


def _bucket_run(ns, case, device):
    got = entry(ns, "assign_buckets")(list(case.inputs["sizes"]), case.inputs["mb"])
    return {"buckets": [[int(i) for i in b] for b in got]}


def _bucketed_rank(rank, world_size, cls, x):
    return [_train_replica(rank, cls, x, rank, world_size, mb) for mb in x["bucket_mb"]]


def _adam_lr(x):
    return lambda step: x["lr"] * (0.5 if step >= 1 else 1.0)  # a scheduler halves the lr after step 0


def _state_numel(opt_objects) -> int:
    seen, total = set(), 0
    for opt in opt_objects:
        for st in getattr(opt, "state", {}).values():
            if not isinstance(st, dict):
                continue
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and id(v) not in seen:
                    seen.add(id(v))
                    total += v.numel()
    return total


def _sharded_rank(rank, world_size, cls, x):
    import torch.distributed as dist

    launched = world_size == x["world"]  # not the single-rank probe for a stub
    groups = x.get("groups") if launched else None
    # every rank creates every group, at once, before the ranks' paces diverge
    handles = [dist.new_group(members) for members in groups or []]
    obs = _sharded_train(rank, world_size, cls, x, measure=True)
    if groups:
        g = next(g for g, members in enumerate(groups) if rank in members)
        members = groups[g]
        obs["sub"] = _sharded_train(members.index(rank), len(members), cls, _subgroup_inputs(x, g), measure=False,
                                    process_group=handles[g])
    return obs


def _sharded_train(rank, world_size, cls, x, measure: bool, **kwargs) -> dict:
    """``cls(params, Adam, lr=..., **kwargs)`` over one replica of the case's model, ``steps`` steps on shard
    ``rank`` of ``world_size`` of each batch, the gradients averaged over the group (``kwargs``' process_group,
    or every rank) as DDP would; with ``measure``, the optimizer state left alive in this process too."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from gpulab.commlog import record_collectives
    from gpulab.toy import shard

    group = kwargs.get("process_group")
    model = _toy_model(x, x["seed"])  # the same replica everywhere: no DDP here
    params = [p for p in model.parameters() if p.requires_grad]
    first, later = _late_split(x, params)
    with record_collectives() as log:
        opt = cls(first, torch.optim.Adam, lr=x["lr"], **kwargs)
    obs = {"is_optimizer": isinstance(opt, torch.optim.Optimizer),
           "groups_cover": sorted(id(p) for g in getattr(opt, "param_groups", []) for p in g["params"])
           == sorted(id(p) for p in first), "init_comm": log.summary()}
    schedule = _adam_lr(x)
    steps, comm = [], []
    for step in range(x["steps"]):
        if step == 1 and later:  # a training loop unfreezing the last layers
            opt.add_param_group({"params": later})
        for g in opt.param_groups:
            g["lr"] = schedule(step)
        opt.zero_grad()
        xb, yb = _step_batch(x, step)
        F.mse_loss(model(shard(xb, rank, world_size)), shard(yb, rank, world_size)).backward()
        for p in params:  # what DDP would do: average the gradients
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(world_size)
        with record_collectives() as log:
            opt.step()
        comm.append(log.summary())
        steps.append({n: p.detach().clone() for n, p in model.named_parameters()})
    opt.zero_grad()
    obs["zeroed"] = all(p.grad is None or not p.grad.any() for p in params)
    obs["state_numel"] = _live_optimizer_state() if measure else None
    obs["params"], obs["comm"] = steps, comm
    return obs


def _live_optimizer_state() -> int:
    """Elements of optimizer state held by every ``torch.optim.Optimizer`` alive in this process."""
    import gc
    import warnings

    with warnings.catch_warnings():  # isinstance on every live object touches deprecated module attributes
        warnings.simplefilter("ignore")
        return _state_numel([o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)])


def _residency(run_forward, expected: int) -> tuple:
    """Bytes created by ``run_forward()`` and still held once it has returned (:mod:`gpulab.residency`:
    what Python reaches and what autograd saved for backward), and its output. gloo's worker thread
    may hold the tensors of the last collective a moment longer: above ``expected``, a few more looks,
    the least counts."""
    import time

    from gpulab.residency import extra_bytes, live_storages

    before = live_storages()
    out = run_forward()
    held = extra_bytes(live_storages([out]), before)
    for _ in range(3):
        if held <= expected:
            break
        time.sleep(0.05)
        held = min(held, extra_bytes(live_storages([out]), before))
    return held, out


def _fsdp_train(rank, cls, x, data_rank, data_world, measure, **kwargs) -> dict:
    """Rank ``rank``'s model (seed + rank) wrapped in ``cls``; ``steps`` SGD steps on shard ``data_rank`` of
    ``data_world`` of each batch. With ``measure``, first one forward and backward (no step) with the
    bytes held once forward has returned."""
    import torch.nn.functional as F

    from gpulab.commlog import record_collectives
    from gpulab.toy import shard

    torch.manual_seed(1000 + rank)
    model = _toy_model(x, x["seed"] + rank)

    def batch(step):
        xb, yb = _step_batch(x, step)
        return shard(xb, data_rank, data_world), shard(yb, data_rank, data_world)

    obs = {}
    wrapped = cls(model, **kwargs)
    obs["init"] = {n: t.detach().clone() for n, t in wrapped.gather_full_params().items()}
    opt = _sgd([p for p in wrapped.parameters() if p.requires_grad])
    if measure:
        xb, yb = batch(0)
        obs["wrapped"], out = _residency(lambda: wrapped(xb), _plain_residency(x))
        F.mse_loss(out, yb).backward()
        wrapped.finish_gradient_synchronization()
        opt.zero_grad()
    obs["params"], obs["comm"] = [], []
    for step in range(x["steps"]):
        opt.zero_grad()
        xb, yb = batch(step)
        with record_collectives() as log:
            out = wrapped(xb)
            log.phase = "backward"
            F.mse_loss(out, yb).backward()
            log.phase = "finish"
            wrapped.finish_gradient_synchronization()
        opt.step()
        obs["comm"].append(log.as_dicts())
        obs["params"].append({n: t.detach().clone() for n, t in wrapped.gather_full_params().items()})
    obs["param_numel"] = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    obs["state_numel"] = _live_optimizer_state() if measure else None
    if measure:
        obs["placement"] = _fsdp_placement(wrapped)
    return obs


def _outcome(fn) -> str:
    """The device of what ``fn()`` returns, or the exception it raised, in words."""
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the learner's error, reported by the judge
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return str(out.device) if isinstance(out, torch.Tensor) else f"not a tensor: {type(out).__name__}"


def _fsdp_placement(wrapped) -> dict:
    """Where ``_all_gather`` and ``_reduce_scatter`` put their results when torch's default device is not the
    tensors' ("meta" here; on a GPU, a buffer made without device= lands on the CPU while NCCL wants CUDA
    tensors): the tensors' own device, "cpu", when the buffers are made with device=. Every rank calls both."""
    def shard():
        return wrapped.shards[0].detach()

    def full_grad():  # (p * shard numel,) on the shard's device
        return torch.ones(wrapped.world_size * shard().numel(), device=shard().device)

    with torch.device("meta"):  # the default device only: the tensors passed in stay on the CPU
        return {"_all_gather": _outcome(lambda: wrapped._all_gather(shard())),
                "_reduce_scatter": _outcome(lambda: wrapped._reduce_scatter(full_grad()))}


def _fsdp_no_units(cls, x) -> dict:
    """``cls(model, unit_types=(nn.Conv2d,))`` on a model without any Conv2d: nothing to shard. A ValueError or a
    warning is what it should give; every rank does the same."""
    import warnings

    model = _toy_model(x, x["seed"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cls(model, unit_types=(torch.nn.Conv2d,))
        except ValueError as exc:
            return {"raised": str(exc)[:300]}
        except Exception as exc:  # noqa: BLE001 - reported by the judge
            return {"other": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"warned": [str(w.message)[:300] for w in caught]}


def _fsdp_rank(rank, world_size, cls, x):
    import torch.distributed as dist

    launched = world_size == x["world"]  # not the single-rank probe for a stub
    groups = x.get("groups") if launched else None
    # every rank creates every group, at once, before the ranks' paces diverge
    handles = [dist.new_group(members) for members in groups or []]
    obs = _fsdp_train(rank, cls, x, rank, world_size, measure=launched)
    if groups:
        g = next(g for g, members in enumerate(x["groups"]) if rank in members)
        members = x["groups"][g]
        obs["sub"] = _fsdp_train(rank, cls, _subgroup_inputs(x, g), members.index(rank), len(members), False,
                                 process_group=handles[g])
    if launched:
        obs["no_units"] = _fsdp_no_units(cls, x)
    return obs


def _plain_residency(x) -> int:
    """What the unwrapped model holds once forward has returned, measured here: its output and the
    activations autograd saved (nothing else of a plain model's forward outlives it)."""
    from gpulab.residency import extra_bytes, live_storages
    from gpulab.toy import shard

    model = _toy_model(x, x["seed"])
    xb = shard(_step_batch(x, 0)[0], 0, x["world"])
    before = live_storages([*model.parameters(), *model.buffers(), xb], python=False)
    return extra_bytes(live_storages([model(xb)], python=False), before)
