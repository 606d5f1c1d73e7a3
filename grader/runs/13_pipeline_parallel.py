"""The learner side of lab 13_pipeline_parallel: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/13_pipeline_parallel.py``).
"""
from __future__ import annotations

import numbers

import torch

from grader.exercise import borrowed, entry
from grader.runs.ranks import RanksHung, launch_ranks

LAUNCH_TIMEOUT_S = 20.0  # per launch; a hung pipeline ends with RanksHung after about this long
SUB_GROUPS = "in the pipelines over sub-groups"  # begins the message of a rank's error there


def _plain(schedule) -> list:
    """The learner's schedule as plain nested lists ``[[[stage, mb, kind], ...], ...]``."""
    return [[[int(s), int(i), str(k)] for s, i, k in slot] for slot in schedule]


def _tuples(schedule) -> list:
    return [[(int(s), int(i), str(k)) for s, i, k in slot] for slot in schedule]


def _generator_run(name, ns, case, device):
    """The run side of a schedule generator ``name``: its schedule for the case's p and m."""
    return {"schedule": _plain(entry(ns, name)(case.inputs["p"], case.inputs["m"]))}


def _validate(fn, plain_schedule, p, m, v=1) -> dict:
    try:
        ret = fn(_tuples(plain_schedule), p, m) if v == 1 else fn(_tuples(plain_schedule), p, m, v)
    except ValueError as exc:
        return {"verdict": "rejected", "message": str(exc)[:500]}
    except NotImplementedError:
        raise  # the stub: not attempted
    except Exception as exc:  # noqa: BLE001 - any other exception is the learner's bug, reported
        return {"verdict": "crashed", "message": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"verdict": "accepted", "returned": repr(ret)[:100]}


def _validator_run(ns, case, device):
    x = case.inputs
    fn = entry(ns, "validate_schedule")
    return {"verdicts": [_validate(fn, schedule, x["p"], x["m"], x["v"]) for schedule in x["schedules"]]}


def _bubble_run(ns, case, device):
    x = case.inputs
    formula = entry(ns, "bubble_formula")
    if borrowed(formula):  # lab 16's gpulab.planning.bubble_fraction(p, m) models this formula
        return {"borrowed": borrowed(formula)}
    return {"measured": float(entry(ns, "bubble_fraction")(_tuples(x["schedule"]), x["p"])),
            "formula": float(formula(x["p"], x["m"]) if x["v"] == 1 else formula(x["p"], x["m"], x["v"]))}


def _peaks_run(ns, case, device):
    x = case.inputs
    return {"peaks": [int(n) for n in entry(ns, "peak_activations")(_tuples(x["schedule"]), x["p"])]}


def build_stage(s: int, p: int, d_in: int, hidden: int, d_out: int):
    """Stage ``s`` of the lab's MLP: Linear + Tanh, and a final Linear to ``d_out`` on the last stage."""
    from torch import nn

    layers = [nn.Linear(d_in if s == 0 else hidden, hidden), nn.Tanh()]
    if s == p - 1:
        layers.append(nn.Linear(hidden, d_out))
    return nn.Sequential(*layers)


def _pipeline_rank(rank, world_size, run_stage, inputs):
    """One rank of the check: its stage, the learner's ``run_stage`` on each run, what it observed; then, with
    ``inputs["groups"]``, ``run_stage(..., process_group=...)`` in the pipeline of its sub-group
    (``inputs["sub"][g]``: that pipeline's weights and run), under a default device that is not the tensors'."""
    import torch.distributed as dist

    launched = world_size == inputs["p"]  # not the single-rank probe for a stub
    groups = inputs.get("groups") if launched else None
    # every rank creates every group, at once, before the ranks' paces diverge
    handles = [dist.new_group(members) for members in groups or []]
    results = [_stage_run(rank, world_size, run_stage, inputs, run) for run in inputs["runs"]]
    if not groups:
        return {"runs": results, "sub": None}
    g = next(g for g, members in enumerate(groups) if rank in members)
    members, sub = groups[g], inputs["sub"][g]
    # torch's default device elsewhere ("meta") than the tensors' (CPU): a buffer made without device= lands
    # there and fails, as one on the CPU does beside CUDA tensors on a GPU
    try:
        with torch.device("meta"):
            return {"runs": results, "sub": _stage_run(members.index(rank), len(members), run_stage, sub,
                                                       sub["runs"][0], process_group=handles[g])}
    except Exception as exc:  # noqa: BLE001 - said to come from this part, for the judge's advice
        raise RuntimeError(f"{SUB_GROUPS}: {type(exc).__name__}: {str(exc)[:500]}") from None


def _stage_run(s, p, run_stage, inputs, run, **kwargs) -> dict:
    """Stage ``s`` of a ``p``-stage pipeline (weights from ``inputs``) running ``run_stage`` on ``run``: its
    losses, its parameters' gradients and the order in which it ran forwards and backwards."""
    with torch.device("cpu"):  # the stage itself is built on the CPU whatever the default device
        stage = build_stage(s, p, inputs["d_in"], inputs["hidden"], inputs["d_out"])
        with torch.no_grad():
            for prm, w in zip(stage.parameters(), inputs["weights"][s]):
                prm.copy_(w)
        xs, ys = [x.clone() for x in run["x"]], [y.clone() for y in run["y"]]
    order = []  # "F" and "B" in the order the stage ran them

    def on_forward(module, args, out):
        order.append("F")
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: order.append("B"))

    stage.register_forward_hook(on_forward)
    losses = run_stage(stage, _tuples(run["schedule"]), xs, ys, inputs["hidden"], **kwargs)
    if losses is not None and not isinstance(losses, (list, tuple)):
        losses = "not a list: " + type(losses).__name__
    elif losses is not None:
        losses = [float(v) for v in losses]
    return {"losses": losses, "order": "".join(order),
            "grads": [None if prm.grad is None else prm.grad.detach().clone() for prm in stage.parameters()]}


def _pipeline_run(ns, case, device):
    fn = entry(ns, "run_stage")
    # The probe: a stub raises at once, so no process starts to find out (a real answer fails here,
    # harmlessly: no process group, and an empty schedule).
    try:
        per_rank = launch_ranks((_pipeline_rank, fn), _pipeline_rank, case.inputs["p"], fn, case.inputs,
                                timeout_s=LAUNCH_TIMEOUT_S, probe=lambda: fn(None, [], [], [], 1))
    except RanksHung as exc:  # the judge explains what makes a pipeline hang
        return {"hung": exc.summary}
    except NotImplementedError:
        raise  # not attempted
    except RuntimeError as exc:  # in the sub-groups' pipelines, or a buffer on torch's default device: explained
        if "meta" not in str(exc) and SUB_GROUPS not in str(exc):
            raise
        return {"error": str(exc)[-1500:]}  # the end: the rank's exception
    return {"ranks": per_rank}


def _interleaved_run(ns, case, device):
    x = case.inputs
    try:
        schedule = entry(ns, "interleaved_schedule")(x["p"], x["m"], x["v"])
    except ValueError as exc:
        return {"error": str(exc)[:300]}
    return {"schedule": _plain(schedule)}


def _sends_run(ns, case, device):
    x = case.inputs
    sends = entry(ns, "p2p_sends")(_tuples(x["schedule"]), x["p"])
    return {"sends": int(sends) if isinstance(sends, numbers.Integral) and not isinstance(sends, bool) else sends}
