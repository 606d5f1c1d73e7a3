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
    """One rank of the check: its stage, the learner's ``run_stage`` on each run, what it observed."""

    results = []
    for run in inputs["runs"]:
        stage = build_stage(rank, world_size, inputs["d_in"], inputs["hidden"], inputs["d_out"])
        with torch.no_grad():
            for prm, w in zip(stage.parameters(), inputs["weights"][rank]):
                prm.copy_(w)
        order = []  # "F" and "B" in the order the stage ran them

        def on_forward(module, args, out):
            order.append("F")
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: order.append("B"))

        stage.register_forward_hook(on_forward)
        losses = run_stage(stage, _tuples(run["schedule"]), [x.clone() for x in run["x"]],
                           [y.clone() for y in run["y"]], inputs["hidden"])
        if losses is not None and not isinstance(losses, (list, tuple)):
            losses = "not a list: " + type(losses).__name__
        elif losses is not None:
            losses = [float(v) for v in losses]
        results.append({"losses": losses, "order": "".join(order),
                        "grads": [None if prm.grad is None else prm.grad.detach().clone()
                                  for prm in stage.parameters()]})
    return results


def _pipeline_run(ns, case, device):
    fn = entry(ns, "run_stage")
    # The probe: a stub raises at once, so no process starts to find out (a real answer fails here,
    # harmlessly: no process group, and an empty schedule).
    try:
        per_rank = launch_ranks((_pipeline_rank, fn), _pipeline_rank, case.inputs["p"], fn, case.inputs,
                                timeout_s=LAUNCH_TIMEOUT_S, probe=lambda: fn(None, [], [], [], 1))
    except RanksHung as exc:  # the judge explains what makes a pipeline hang
        return {"hung": exc.summary}
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
