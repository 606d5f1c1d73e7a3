"""Checks of lab 13, pipeline parallelism: schedules as data (GPipe, 1F1B, interleaved 1F1B), a
validator, bubble, activation-memory and message-count measures, and a real pipeline run across
ranks with send/recv.

A schedule is a list of time slots, each a list of steps ``(stage, microbatch, "F" | "B")``
(:mod:`gpulab.schedules`). Observations travel as nested lists of ``[stage, mb, kind]``. An
interleaved schedule (``p`` devices, ``v`` chunks each) uses virtual stages ``0 .. p*v - 1``, placed on
devices by :func:`gpulab.schedules.device_of`; every rule and measure below takes ``v`` (default 1)
and counts per device, so with ``v = 1`` they are the plain ones.
Hidden cases: one per rule, the same rules for every seed (a case's name starts with its rule,
before ':'), random sizes within it; the validator's cases are named neutrally (the judge reads each
schedule's broken rule off the schedule, :func:`rule_broken`).

The pipeline exercise is distributed: ``run`` (learner process) launches one rank per stage with
:func:`grader.runs.ranks.launch_ranks` over gloo; each rank loads its stage's weights from the case, runs
the learner's ``run_stage`` on a reference schedule and returns its losses, its parameters' gradients and
the order in which its stage ran forwards and backwards (recorded with module and tensor hooks).
``judge`` computes the single-process model on the same microbatches, here, and compares; a hang is
explained by the judge (a blocking send in 1F1B, a gradient never sent back).
"""
from __future__ import annotations

import random
import re
from functools import partial

import torch

from gpulab.compare import compare
from gpulab.schedules import Step, as_text, device_of
from grader.exercise import Case, Exercise, Neutral
from grader.kit.cases import randint
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.runs import run_side

LAB = "13_pipeline_parallel"
RUN = run_side(LAB)  # the learner side: grader/runs/13_pipeline_parallel.py
TITLE = "Pipeline parallelism: schedules as data"


# --- schedules: dependencies, placement, references, measures --------------------------------------

def deps(step, n: int) -> list:
    """The steps that must finish in an earlier slot, in a pipeline of ``n`` (virtual) stages:
    F(s, i) needs F(s-1, i); B(s, i) needs F(s, i) and B(s+1, i)."""
    s, i, k = step
    if k == "F":
        return [(s - 1, i, "F")] if s > 0 else []
    return [(s, i, "F")] + ([(s + 1, i, "B")] if s < n - 1 else [])


def all_steps(n: int, m: int) -> list:
    return [(s, i, k) for s in range(n) for i in range(m) for k in ("F", "B")]


def place(orders: list, p: int, v: int = 1) -> list:
    """List-schedule per-device op orders (``p`` devices, ``v`` chunks each): each device runs its
    next op in the first slot after its dependencies finished."""
    done: dict = {}
    pos = [0] * p
    schedule = []
    while any(pos[d] < len(orders[d]) for d in range(p)):
        t = len(schedule)
        slot = [orders[d][pos[d]] for d in range(p) if pos[d] < len(orders[d])
                and all(x in done and done[x] < t for x in deps(orders[d][pos[d]], p * v))]
        if not slot:
            raise RuntimeError("orders deadlock")  # never for the references below
        for step in slot:
            done[step] = t
            pos[device_of(step[0], p)] += 1
        schedule.append(slot)
    return schedule


def ref_gpipe(p: int, m: int) -> list:
    """All forwards (F(s, i) in slot s + i), then all backwards (B(s, i) in slot (m+p-1) + (p-1-s) + i)."""
    schedule = [[] for _ in range(2 * (m + p - 1))]
    for s in range(p):
        for i in range(m):
            schedule[s + i].append((s, i, "F"))
            schedule[m + p - 1 + (p - 1 - s) + i].append((s, i, "B"))
    return schedule


def ref_1f1b(p: int, m: int) -> list:
    """1F1B (PipeDream-flush): stage s runs min(p-s-1, m) warm-up forwards, then alternates one
    forward and one backward, then drains the remaining backwards."""
    orders = []
    for s in range(p):
        w = min(p - 1 - s, m)
        order = [(s, i, "F") for i in range(w)]
        for j in range(m - w):
            order += [(s, w + j, "F"), (s, j, "B")]
        order += [(s, j, "B") for j in range(m - w, m)]
        orders.append(order)
    return place(orders, p)


def interleaved_orders(p: int, m: int, v: int, warmup=None) -> list:
    """Megatron-LM's interleaved 1F1B as per-device op orders (m a multiple of p). Device d's k-th
    forward: microbatch group k // (p v), chunk (k // p) % v, microbatch group * p + k % p (p
    microbatches through chunk 0, the same p through chunk 1, ...); its k-th backward the same with the
    chunks reversed. ``warmup(d)`` forwards first (default (p - d - 1) + (v - 1) p), then F/B pairs,
    then the remaining backwards."""
    def step(d, k, kind):
        group, c, j = k // (p * v), (k // p) % v, k % p
        chunk = c if kind == "F" else v - 1 - c
        return (chunk * p + d, group * p + j, kind)

    total = m * v  # microbatch-chunks per device
    orders = []
    for d in range(p):
        w = min((p - d - 1) + (v - 1) * p if warmup is None else warmup(d), total)
        order = [step(d, k, "F") for k in range(w)]
        for k in range(total - w):
            order += [step(d, w + k, "F"), step(d, k, "B")]
        order += [step(d, k, "B") for k in range(total - w, total)]
        orders.append(order)
    return orders


def ref_interleaved(p: int, m: int, v: int) -> list:
    """Interleaved 1F1B, 2(v m + p - 1) slots of one chunk each; with v = 1 it is :func:`ref_1f1b`."""
    return place(interleaved_orders(p, m, v), p, v)


def memory_bound(p: int, m: int, v: int = 1) -> list:
    """The most microbatch-chunks device d holds in (interleaved) 1F1B: its warm-up + 1 = v p - d,
    at most v m (so min(p - d, m) when v = 1)."""
    return [min(v * p - d, v * m) for d in range(p)]


def ref_bubble(schedule, p: int) -> float:
    """Idle device-slots / total device-slots (p x number of slots)."""
    busy = len({(device_of(s, p), t) for t, slot in enumerate(schedule) for s, _, _ in slot})
    total = p * len(schedule)
    return (total - busy) / total if total else 0.0


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    return (p - 1) / (v * m + p - 1)


def ref_peaks(schedule, p: int) -> list:
    """Per device: the most microbatch-chunks forwarded but not yet backwarded at any slot's end."""
    count, peak = [0] * p, [0] * p
    for slot in schedule:
        for s, _, k in slot:
            d = device_of(s, p)
            count[d] += 1 if k == "F" else -1
            peak[d] = max(peak[d], count[d])
    return peak


def ref_sends(schedule, p: int) -> int:
    """Point-to-point messages between devices: an activation after F(s, i) to stage s + 1 and a
    gradient after B(s, i) to stage s - 1, counted when that stage is on another device."""
    n = 1 + max((s for slot in schedule for s, _, _ in slot), default=-1)
    sends = 0
    for slot in schedule:
        for s, _, k in slot:
            to = s + 1 if k == "F" else s - 1
            sends += 0 <= to < n and device_of(to, p) != device_of(s, p)
    return sends


def _name(step) -> str:
    return str(Step(*step))


def violations(schedule, p: int, m: int, v: int = 1, device=device_of) -> list:
    """Every rule a schedule breaks: ``[(message, {names of the steps involved})]`` in slot order.
    ``p`` devices holding ``v`` chunks each (``p * v`` virtual stages), placed by ``device(stage, p)``."""
    n = p * v
    where = "device" if v > 1 else "stage"
    what = f"{p}-device pipeline with {v} chunks each" if v > 1 else f"{p}-stage pipeline"
    found = []
    first: dict = {}
    for t, slot in enumerate(schedule):
        on_device: dict = {}
        for step in slot:
            s, i, k = step
            if k not in ("F", "B") or not (0 <= s < n) or not (0 <= i < m):
                found.append((f"slot {t}: {k}({s}, {i}) is not a step of a {what} and {m} "
                              "microbatches", {f"{k}({s},{i})"}))
                continue
            d = device(s, p)
            if d in on_device:
                found.append((f"slot {t}: {where} {d} runs two steps, {_name(on_device[d])} and {_name(step)}",
                              {_name(on_device[d]), _name(step)}))
            on_device.setdefault(d, step)
            if step in first:
                found.append((f"slot {t}: {_name(step)} runs a second time (first in slot {first[step]})",
                              {_name(step)}))
            else:
                first[step] = t
    for step in all_steps(n, m):
        if step not in first:
            later = [d for d in all_steps(n, m) if step in deps(d, n)]
            found.append((f"{_name(step)} never runs", {_name(step)} | {_name(d) for d in later}))
    for step, t in sorted(first.items(), key=lambda kv: kv[1]):
        for d in deps(step, n):
            if d in first and first[d] >= t:
                found.append((f"slot {t}: {_name(step)} runs before {_name(d)} finished (slot {first[d]})",
                              {_name(step), _name(d)}))
    return found


def random_valid(gen, p: int, m: int, idle: float = 0.25, v: int = 1) -> list:
    """A random valid schedule: each slot, every device runs a random ready step or idles."""
    rng = random.Random(randint(gen, 0, 2**31 - 1))
    left = {d: [(c * p + d, i, k) for c in range(v) for i in range(m) for k in ("F", "B")] for d in range(p)}
    done: dict = {}
    schedule = []
    while any(left.values()):
        t = len(schedule)
        slot = []
        for d in range(p):
            ready = [x for x in left[d] if all(y in done and done[y] < t for y in deps(x, p * v))]
            if ready and rng.random() > idle:
                slot.append(rng.choice(ready))
        for x in slot:
            done[x] = t
            left[device_of(x[0], p)].remove(x)
        schedule.append(slot)
    if not schedule[-1]:
        schedule.pop()
    return schedule


def _picture(schedule, p: int, v: int = 1) -> str:
    if len(schedule) > 40 or p > 6:
        return ""
    return "\n" + as_text(schedule, p, v)


# --- GPipe (and what both generators must do) ---------------------------------------------------

def _pm_cases(fixed, gen, public):
    """The cases of a schedule generator: ``fixed`` (p, m) pairs, or one per rule of p against m."""
    if public:
        return [Case(f"p={p} stages, m={m} microbatches", dict(p=p, m=m)) for p, m in fixed]
    p_few, p_many, p_same = randint(gen, 3, 6), randint(gen, 2, 6), randint(gen, 2, 6)
    rules = [("one stage", 1, randint(gen, 1, 12)),
             ("one microbatch", randint(gen, 2, 6), 1),
             ("fewer microbatches than stages", p_few, randint(gen, 2, p_few - 1)),
             ("as many microbatches as stages", p_same, p_same),
             ("more microbatches than stages", p_many, randint(gen, p_many + 1, 12))]
    return [Case(f"{rule}: p={p} stages, m={m} microbatches", dict(p=p, m=m)) for rule, p, m in rules]


def _generator_judge(what, rule):
    """The judge of a schedule generator: valid, the right length (so the bubble equals the formula),
    then the schedule's own ``rule(schedule, p, m)``."""
    def judge(case, obs):
        p, m = case.inputs["p"], case.inputs["m"]
        schedule = RUN._tuples(obs["schedule"])
        bad = violations(schedule, p, m)
        if bad:
            return f"your {what} schedule is not valid: {bad[0][0]}.{_picture(schedule, p)}"
        want = 2 * (m + p - 1)
        if len(schedule) != want:
            return (f"your {what} schedule takes {len(schedule)} slots; with one slot per forward and per backward "
                    f"it needs exactly 2(m + p - 1) = {want} (no empty slots before, between or after), so its "
                    f"bubble is {ref_bubble(schedule, p):.4f} instead of (p-1)/(m+p-1) = "
                    f"{bubble_formula(p, m):.4f}. An off-by-one in the slot formulas?{_picture(schedule, p)}")
        return rule(schedule, p, m)
    return judge


def _gpipe_cases(gen, public):
    return _pm_cases([(2, 4), (4, 8), (4, 2), (3, 1), (1, 3)], gen, public)


def _gpipe_rule(schedule, p, m):
    last_f, first_b = {}, {}
    for t, slot in enumerate(schedule):
        for s, i, k in slot:
            if k == "F":
                last_f[s] = (t, i)
            elif s not in first_b:
                first_b[s] = (t, i)
    for s in range(p):
        if first_b[s][0] < last_f[s][0]:
            return (f"stage {s} runs B({s}, {first_b[s][1]}) in slot {first_b[s][0]} before its last forward "
                    f"F({s}, {last_f[s][1]}) in slot {last_f[s][0]}: GPipe runs all forwards, then all "
                    f"backwards.{_picture(schedule, p)}")
    return None


GPIPE = Exercise("gpipe_schedule", 2, ("gpipe_schedule",), _gpipe_cases, partial(RUN._generator_run, "gpipe_schedule"),
                 _generator_judge("GPipe", _gpipe_rule), title="GPipe: all forwards, then all backwards",
                 hint="F(s, i) can run in slot s + i at the earliest. The backwards start once the last stage "
                      "finished its last forward (slot m + p - 2) and flow back up: B(s, i) in slot "
                      "(m + p - 1) + (p - 1 - s) + i.")


# --- validator ----------------------------------------------------------------------------------

_DEPENDENCY_RULES = ("a forward in the same slot as the forward it needs", "a forward before the forward it needs",
                     "a backward in the same slot as the backward it needs",
                     "a backward before the backward it needs")
_OUTSIDE_RULES = ("a stage outside the pipeline", "a microbatch outside the range", "a step of unknown kind")
# every rule a validator checks, each broken alone by _mutate
_MUTATIONS = ("backward before its forward", "two steps on one stage in one slot", "a missing step",
              "a duplicated step") + _DEPENDENCY_RULES + _OUTSIDE_RULES
# the same rules where they differ for an interleaved schedule (v >= 2 chunks per device): two chunks of
# one device in one slot, and a chunk's forward before the previous virtual stage's (on another device)
_INTERLEAVED_MUTATIONS = ("two chunks on one device in one slot", "a chunk's forward before the previous chunk's")


def _where(schedule, step):
    return next(t for t, slot in enumerate(schedule) for x in slot if tuple(x) == step)


def _window(sched, step, n, m):
    """The slots strictly between ``step``'s last dependency and its first dependent (``n`` stages)."""
    after = max([_where(sched, d) for d in deps(step, n)], default=-1)
    users = [x for x in all_steps(n, m) if step in deps(x, n)]
    before = min([_where(sched, x) for x in users], default=len(sched))
    return after, before


def _mutate(schedule, p, m, kind, rng, v=1):
    """A copy of a valid schedule that breaks exactly one rule, ``kind`` (one of :data:`_MUTATIONS`
    or :data:`_INTERLEAVED_MUTATIONS`), so that a validator missing that one check accepts it."""
    sched = [list(slot) for slot in schedule]
    ops = [x for slot in sched for x in slot]
    if kind == "two chunks on one device in one slot":
        # move a step into a slot where another chunk of its device runs, its dependencies still holding
        moves = []
        for x in ops:
            lo, hi = _window(sched, x, p * v, m)
            moves += [(x, t) for t in range(lo + 1, hi)
                      if any(device_of(y[0], p) == device_of(x[0], p) and y[0] != x[0] for y in sched[t])]
        x, t = rng.choice(moves)  # the cases' sizes always leave one (tests check every seed)
        sched[_where(sched, x)].remove(x)
        sched[t].append(x)
        return _mutate_finish(sched, rng)
    if kind == "a chunk's forward before the previous chunk's":
        # F(c p, i), chunk c >= 1 of device 0, in a new slot just before F(c p - 1, i) on device p - 1
        x = (rng.randrange(1, v) * p, rng.randrange(m), "F")
        dep = (x[0] - 1, x[1], "F")
        sched[_where(sched, x)].remove(x)
        sched.insert(_where(sched, dep), [x])
        return _mutate_finish(sched, rng)
    if kind == "backward before its forward":
        # swap F(p-1, i) and B(p-1, i): on the last stage nothing else depends on their order
        i = rng.randrange(m)
        s = p - 1
        tf, tb = _where(sched, (s, i, "F")), _where(sched, (s, i, "B"))
        sched[tf][sched[tf].index((s, i, "F"))] = (s, i, "B")
        sched[tb][sched[tb].index((s, i, "B"))] = (s, i, "F")
    elif kind == "two steps on one stage in one slot":
        # move a step into a slot where its stage is busy, but where its dependencies still hold
        moves = []
        for x in ops:
            lo, hi = _window(sched, x, p, m)
            moves += [(x, t) for t in range(lo + 1, hi) if any(y[0] == x[0] and y != x for y in sched[t])]
        if not moves:  # e.g. m = 1: no room, so add a second stage-0 step where stage 0 already runs one
            tf, tb = _where(sched, (0, 0, "F")), _where(sched, (0, 0, "B"))
            sched[tb].remove((0, 0, "B"))
            sched[tf].append((0, 0, "B"))
            return _mutate_finish(sched, rng)
        x, t = rng.choice(moves)
        sched[_where(sched, x)].remove(x)
        sched[t].append(x)
    elif kind == "a missing step":
        x = (0, rng.randrange(m), "B")  # nothing depends on a backward of stage 0
        sched[_where(sched, x)].remove(x)
    elif kind == "a duplicated step":
        x = rng.choice(ops)
        sched.append([x])  # again, in a new last slot: every dependency still holds
    elif kind in _DEPENDENCY_RULES:  # needs p >= 2
        i = rng.randrange(m)
        if kind.startswith("a forward"):  # F(s, i) needs F(s-1, i)
            s = rng.randrange(1, p)
            x, dep = (s, i, "F"), (s - 1, i, "F")
        else:                  # B(s, i) needs B(s+1, i)
            s = rng.randrange(0, p - 1)
            x, dep = (s, i, "B"), (s + 1, i, "B")
        t = _where(sched, dep)
        sched[_where(sched, x)].remove(x)  # x runs after dep: removing it leaves t where it is
        if "same slot" in kind:
            # a new slot right after dep's holds both (stages s and s +- 1: no collision); every other
            # dependency still points to an earlier slot
            sched[t].remove(dep)
            sched.insert(t + 1, [dep, x])
        else:
            # a new slot right before dep's; a backward's own forward ran before B(s+1, i), so earlier still
            sched.insert(t, [x])
    elif kind == "a stage outside the pipeline":
        sched.append([(p, rng.randrange(m), rng.choice("FB"))])
    elif kind == "a microbatch outside the range":
        sched.append([(rng.randrange(p), m, rng.choice("FB"))])
    elif kind == "a step of unknown kind":
        sched.append([(rng.randrange(p), rng.randrange(m), "W")])  # e.g. a weight-gradient step of ZB-H1
    else:
        raise ValueError(kind)
    return _mutate_finish(sched, rng)


def _mutate_finish(sched, rng):
    for slot in sched:
        rng.shuffle(slot)
    return sched


def rule_broken(schedule, p: int, m: int, v: int = 1) -> str | None:
    """The rule (one of :data:`_MUTATIONS` or :data:`_INTERLEAVED_MUTATIONS`) an invalid schedule breaks, or
    None for a valid one: read from the schedule itself (judge-side), since a case says nothing about it.
    Where a mutation breaks two rules at once, the first in this order wins: a step outside the pipeline,
    two steps on one device, a repeated step, a missing step, a dependency."""
    n = p * v
    first: dict = {}
    for slot in schedule:
        for s, i, k in slot:
            if k not in ("F", "B"):
                return "a step of unknown kind"
            if not 0 <= s < n:
                return "a stage outside the pipeline"
            if not 0 <= i < m:
                return "a microbatch outside the range"
        stages = [s for s, _, _ in slot]
        devices = [device_of(s, p) for s in stages]
        if len(set(devices)) < len(devices):
            chunks = any(stages[a] != stages[b] for a in range(len(stages)) for b in range(a)
                         if devices[a] == devices[b])
            return "two chunks on one device in one slot" if v > 1 and chunks else "two steps on one stage in one slot"
    for t, slot in enumerate(schedule):
        for step in slot:
            if tuple(step) in first:
                return "a duplicated step"
            first[tuple(step)] = t
    if any(step not in first for step in all_steps(n, m)):
        return "a missing step"
    for step, t in sorted(first.items(), key=lambda kv: kv[1]):
        for d in deps(step, n):
            if first[d] >= t:
                if step[2] == "B" and d[2] == "F":
                    return "backward before its forward"
                if v > 1 and step[2] == "F":
                    return "a chunk's forward before the previous chunk's"
                which = "a forward" if step[2] == "F" else "a backward"
                when = "in the same slot as" if first[d] == t else "before"
                return f"{which} {when} the {'forward' if step[2] == 'F' else 'backward'} it needs"
    return None


def case_rules(case) -> list:
    """The rules the schedules of a ``validate_schedule`` case break (judge-side), sorted; [] if all are valid."""
    x = case.inputs
    return sorted(r for plain in x["schedules"] if (r := rule_broken(RUN._tuples(plain), x["p"], x["m"], x["v"])))


def _with_idle(gen, p, m, v=1) -> list:
    """A random valid schedule with an empty slot somewhere: what an invalid schedule is shown beside."""
    sched = random_valid(gen, p, m, v=v)
    sched.insert(randint(gen, 0, len(sched)), [])
    return sched


def _validator_case(gen, rng, sizes: str, schedules: list, p, m, v=1) -> tuple:
    """``(sizes, inputs)`` of a case: its schedules in an order drawn from ``rng``, each beside a valid random
    one (so that accepting or rejecting everything earns nothing), and nothing said of which is which."""
    if len(schedules) == 1:
        schedules = schedules + [_with_idle(gen, p, m, v)]
    rng.shuffle(schedules)
    return sizes, dict(schedules=[RUN._plain(s) for s in schedules], p=p, m=m, v=v)


def _interleaved_validator_cases(gen, rng, public) -> list:
    """A valid interleaved schedule and one invalid one per interleaved rule (p >= 2, v >= 2)."""
    def sizes():
        if public:
            return 2, 4, 2
        p = randint(gen, 2, 4)
        return p, p * randint(gen, 1, 2), randint(gen, 2, 3)

    p, m, v = sizes()
    cases = [_validator_case(gen, rng, f"p={p} v={v} m={m}", [ref_interleaved(p, m, v)], p, m, v=v)]
    for kind in _INTERLEAVED_MUTATIONS:
        p, m, v = sizes()
        base = ref_interleaved(p, m, v)
        cases.append(_validator_case(gen, rng, f"p={p} v={v} m={m}", [_mutate(base, p, m, kind, rng, v)], p, m, v=v))
    return cases


def _rule_sizes(gen, kind) -> tuple[int, int]:
    """(p, m) for a case of rule ``kind``: a stage dependency needs two stages, a collision two microbatches."""
    p = randint(gen, 2 if kind in _DEPENDENCY_RULES else 1, 5)
    m = randint(gen, 2 if kind == "two steps on one stage in one slot" else 1, 6)
    return p, m


def _validator_cases(gen, public):
    """Pairs of schedules: two valid ones (accepting them earns nothing: a Neutral), or one invalid schedule
    per rule beside a valid one, in a drawn order. A case passes only if the validator accepts its valid
    schedule and rejects its invalid one naming the step, so neither accepting nor rejecting everything earns
    a point. Names and inputs are neutral: the judge reads the broken rule off the schedule (:func:`rule_broken`),
    and the hidden cases come in a drawn order."""
    rng = random.Random(randint(gen, 0, 2**31 - 1))
    cases = []
    if public:
        g = ref_gpipe(3, 4)
        cases.append(_validator_case(gen, rng, "p=3 m=4", [g], 3, 4))
        cases.append(_validator_case(gen, rng, "p=4 m=6", [ref_1f1b(4, 6)], 4, 6))
        bases = [(3, 4, g), (4, 6, ref_1f1b(4, 6)), (3, 4, random_valid(gen, 3, 4)), (2, 3, ref_gpipe(2, 3)),
                 (4, 3, ref_1f1b(4, 3)), (3, 2, ref_gpipe(3, 2))]
        for n, kind in enumerate(_MUTATIONS):
            p, m, base = bases[n % len(bases)]
            cases.append(_validator_case(gen, rng, f"p={p} m={m}", [_mutate(base, p, m, kind, rng)], p, m))
        cases += _interleaved_validator_cases(gen, rng, public)
        return [Case(f"schedules {n + 1} ({sizes})", inputs) for n, (sizes, inputs) in enumerate(cases)]
    # hidden: the same valid kinds, and every rule
    p, m = randint(gen, 1, 5), randint(gen, 1, 6)
    cases.append(_validator_case(gen, rng, f"p={p} m={m}", [ref_gpipe(p, m)], p, m))
    p, m = randint(gen, 1, 5), randint(gen, 1, 6)
    cases.append(_validator_case(gen, rng, f"p={p} m={m}", [ref_1f1b(p, m)], p, m))
    for kind in _MUTATIONS:
        p, m = _rule_sizes(gen, kind)
        base = [ref_gpipe, ref_1f1b, lambda p, m: random_valid(gen, p, m)][randint(gen, 0, 2)](p, m)
        cases.append(_validator_case(gen, rng, f"p={p} m={m}", [_mutate(base, p, m, kind, rng)], p, m))
    cases += _interleaved_validator_cases(gen, rng, public)
    rng.shuffle(cases)
    return [Case(f"schedules {n + 1}: {sizes}", inputs) for n, (sizes, inputs) in enumerate(cases)]


_STEP_NAME = re.compile(r"([A-Za-z]+)\((-?\d+),(-?\d+)\)")  # a step named in a message, spaces removed
_MAX_OTHER_STEPS = 3  # steps a rejection may name beside the offending ones (e.g. the slot's other step)


def _judge_rejection(schedule, bad, got, p, m, v, what) -> str | None:
    """The verdict on one invalid schedule: rejected with a ValueError that names an offending step."""
    rule = rule_broken(schedule, p, m, v)
    if got["verdict"] == "accepted":
        return f"your validator accepted an invalid schedule ({rule}): {bad[0][0]}.{what}{_picture(schedule, p, v)}"
    if got["verdict"] == "crashed":
        return (f"invalid schedule ({rule}): your validator should raise ValueError naming the problem, "
                f"but raised {got['message']}")
    names = set().union(*(involved for _, involved in bad))
    said = got["message"].replace(" ", "")
    others = {f"{k}({s},{i})" for k, s, i in _STEP_NAME.findall(said)} - names
    if len(others) > _MAX_OTHER_STEPS:  # a message listing every step names the offending one by chance
        return (f"your validator rejected the schedule ({rule}), but its message names {len(others)} steps that "
                f"break no rule: name the offending step, e.g. '{bad[0][0]}'; yours: {got['message'][:200]!r}")
    if rule in _OUTSIDE_RULES:
        return None  # any ValueError will do
    if not any(n.replace(" ", "") in said for n in names):
        return (f"your validator rejected the schedule, but its message does not name the offending step. "
                f"Expected one of {', '.join(sorted(names))} in the message (written F(stage, microbatch) or "
                f"B(stage, microbatch)), e.g. '{bad[0][0]}'; yours: {got['message']!r}")
    return None


def _validator_judge(case, obs):
    x = case.inputs
    p, m, v = x["p"], x["m"], x["v"]
    what = (f" (interleaved: validate_schedule(schedule, p={p}, m={m}, v={v}), virtual stages 0..{p * v - 1}, "
            f"virtual stage s on device s % p)") if v > 1 else ""
    invalid = []
    for plain, got in zip(x["schedules"], obs["verdicts"]):  # the valid ones first: each must be accepted
        schedule = RUN._tuples(plain)
        bad = violations(schedule, p, m, v)
        assert bool(bad) == (rule_broken(schedule, p, m, v) is not None), "internal: the two rule readers disagree"
        if bad:
            invalid.append((schedule, bad, got))
        elif got["verdict"] != "accepted":
            return (f"this schedule is valid{what}, but your validator {got['verdict']} it: "
                    f"{got['message']}{_picture(schedule, p, v)}")
    if not invalid:
        return Neutral("valid schedules accepted (not scored: accepting is what a validator that checks nothing "
                       "does; the invalid schedules earn the points)")
    for schedule, bad, got in invalid:
        if message := _judge_rejection(schedule, bad, got, p, m, v, what):
            return message
    return None


VALIDATE = Exercise("validate_schedule", 3, ("validate_schedule",), _validator_cases,
                    RUN._validator_run, _validator_judge, title="Validate any schedule",
                    hint="Record the slot of every step (a repeat is an error), then check: kinds and ranges, one "
                         "step per device per slot (device_of(stage, p); the stage itself when v = 1), every step "
                         "of the p * v stages present, and each dependency in a strictly earlier slot. Name the "
                         "step in the message as F(stage, microbatch) or B(stage, microbatch).")


# --- 1F1B ---------------------------------------------------------------------------------------

def _1f1b_cases(gen, public):
    return _pm_cases([(2, 4), (4, 8), (4, 2), (3, 3), (1, 3)], gen, public)


def _1f1b_rule(schedule, p, m):
    peaks = ref_peaks(schedule, p)
    for s in range(p):
        bound = min(p - s, m)
        if peaks[s] > bound:
            return (f"stage {s} holds up to {peaks[s]} microbatches' activations at once; 1F1B holds at most "
                    f"min(p - s, m) = {bound} on stage s (so p = {p} instead of m = {m} on stage 0): after "
                    f"p - s - 1 warm-up forwards, every forward is followed by a backward.{_picture(schedule, p)}")
    return None


ONE_F_ONE_B = Exercise("one_f_one_b_schedule", 3, ("one_f_one_b_schedule",), _1f1b_cases,
                       partial(RUN._generator_run, "one_f_one_b_schedule"), _generator_judge("1F1B", _1f1b_rule),
                       title="1F1B: one forward, one backward",
                       hint="Write each stage's op order first: min(p - s - 1, m) warm-up forwards, then pairs "
                            "(next forward, oldest backward), then the remaining backwards. Then place_orders puts the "
                            "orders in slots: each slot, a device runs its next op if that op's dependencies "
                            "finished in an earlier slot.")


# --- bubble fraction ----------------------------------------------------------------------------

def _with_idle_slot(gen, p, m):
    """A random valid schedule with at least one empty slot, so its bubble is never 0 (not even for
    p = 1, whose GPipe or 1F1B schedule has none: an answer returning 0 must not pass it)."""
    sched = random_valid(gen, p, m, idle=0.4)
    sched.insert(randint(gen, 0, len(sched) - 1), [])
    return sched


def _measure_cases(gen, public):
    """The schedules bubble_fraction and peak_activations measure."""
    if public:
        specs = [("GPipe", 4, 8, ref_gpipe(4, 8)), ("1F1B", 4, 8, ref_1f1b(4, 8)), ("GPipe", 3, 1, ref_gpipe(3, 1)),
                 ("1F1B", 5, 3, ref_1f1b(5, 3)), ("random valid", 3, 4, random_valid(gen, 3, 4, idle=0.4)),
                 ("one stage with idle slots", 1, 4, _with_idle_slot(gen, 1, 4))]
        cases = [Case(f"{name} p={p} m={m}", dict(schedule=RUN._plain(sched), p=p, m=m, v=1))
                 for name, p, m, sched in specs]
        return cases + [Case("interleaved 1F1B p=4 v=2 m=8", dict(schedule=RUN._plain(ref_interleaved(4, 8, 2)),
                                                                   p=4, m=8, v=2))]
    p_many, p_few, p_any = randint(gen, 2, 5), randint(gen, 3, 6), randint(gen, 2, 6)
    m_many, m_few = randint(gen, p_many + 1, 10), randint(gen, 1, p_few - 1)
    specs = [("GPipe", p_any, randint(gen, 1, 10), ref_gpipe),
             ("1F1B, more microbatches than stages", p_many, m_many, ref_1f1b),
             ("1F1B, fewer microbatches than stages", p_few, m_few, ref_1f1b),
             ("a random valid schedule with idle slots", randint(gen, 2, 6), randint(gen, 1, 10),
              lambda p, m: _with_idle_slot(gen, p, m)),
             ("one stage with idle slots", 1, randint(gen, 1, 10), lambda p, m: _with_idle_slot(gen, p, m))]
    cases = [Case(f"{name}: p={p} m={m}", dict(schedule=RUN._plain(make(p, m)), p=p, m=m, v=1))
             for name, p, m, make in specs]
    p, v = randint(gen, 2, 4), randint(gen, 2, 4)
    m = p * randint(gen, 1, 3)
    return cases + [Case(f"interleaved 1F1B: p={p} v={v} m={m}",
                         dict(schedule=RUN._plain(ref_interleaved(p, m, v)), p=p, m=m, v=v))]


def _bubble_judge(case, obs):
    if obs.get("borrowed"):
        return f"bubble_formula is {obs['borrowed']}, a course helper: write your own (p-1)/(v m+p-1)."
    x = case.inputs
    p, m, v = x["p"], x["m"], x["v"]
    schedule = RUN._tuples(x["schedule"])
    want = ref_bubble(schedule, p)
    where = "device" if v > 1 else "stage"
    if not close(obs["measured"], want):
        busy = len({(device_of(s, p), t) for t, slot in enumerate(schedule) for s, _, _ in slot})
        return (f"bubble_fraction = {obs['measured']!r}, expected {want:.6g}: {p * len(schedule) - busy} idle "
                f"{where}-slots out of p x slots = {p} x {len(schedule)} = {p * len(schedule)}."
                f"{_picture(schedule, p, v)}")
    if not close(obs["formula"], bubble_formula(p, m, v)):
        if v == 1:
            return (f"bubble_formula({p}, {m}) = {obs['formula']!r}, expected (p-1)/(m+p-1) = "
                    f"{bubble_formula(p, m):.6g}.")
        msg = (f"bubble_formula({p}, {m}, v={v}) = {obs['formula']!r}, expected (p-1)/(v m+p-1) = "
               f"{bubble_formula(p, m, v):.6g} (interleaved: the fill and drain are p - 1 chunk slots, "
               f"among v m + p - 1).")
        if close(obs["formula"], bubble_formula(p, m)):
            msg += " You returned the plain 1F1B value: use v."
        return msg
    return None


BUBBLE = Exercise("bubble_fraction", 2, ("bubble_fraction", "bubble_formula"), _measure_cases, RUN._bubble_run,
                  _bubble_judge, title="Bubble fraction: measured vs (p-1)/(m+p-1)",
                  hint="Idle stage-slots / (p x len(schedule)); a stage is busy in a slot when one of the slot's "
                       "steps belongs to it.")


# --- peak in-flight activations -------------------------------------------------------------------


def _peaks_judge(case, obs):
    x = case.inputs
    p, m = x["p"], x["m"]
    schedule = RUN._tuples(x["schedule"])
    want = ref_peaks(schedule, p)
    got = obs["peaks"]
    if got == want:
        return None
    msg = f"peak_activations = {got}, expected {want} (one count per stage)."
    if len(got) == p and got == [m] * p and want != got:
        msg += (f" You counted every forward (m = {m}); a backward frees its microbatch's activations, so "
                f"in 1F1B stage 0 holds at most p = {p}: count +1 at F, -1 at B, keep the maximum.")
    if x["v"] > 1:
        per_stage = ref_peaks(schedule, p * x["v"])  # each virtual stage as if it were a device
        if got == per_stage or got == per_stage[:p]:
            msg += (" You counted per virtual stage; count per device (device_of(stage, p): device d holds "
                    "stages d, d + p, ...), adding the chunks' in-flight microbatches.")
        msg = msg.replace("one count per stage", "one count per device, in microbatch-chunks")
    return msg + _picture(schedule, p, x["v"])


PEAKS = Exercise("peak_activations", 2, ("peak_activations",), _measure_cases, RUN._peaks_run, _peaks_judge,
                 title="Peak in-flight activations per stage",
                 hint="Walk the slots in order; per device (device_of(stage, p), the stage itself when v = 1), +1 "
                      "at each F (its activations are saved), -1 at each B (freed); return the maximum per device.")


# --- a real pipeline across ranks -----------------------------------------------------------------


def _pipeline_case(gen, name, p, runs, mb=None, d_in=None, hidden=None, d_out=None):
    mb = mb or randint(gen, 1, 4)
    d_in, hidden, d_out = d_in or randint(gen, 2, 6), hidden or randint(gen, 3, 8), d_out or randint(gen, 1, 3)
    weights = []
    for s in range(p):
        fan = d_in if s == 0 else hidden
        w = [torch.randn(hidden, fan, generator=gen) / fan ** 0.5, torch.randn(hidden, generator=gen) * 0.1]
        if s == p - 1:
            w += [torch.randn(d_out, hidden, generator=gen) / hidden ** 0.5, torch.randn(d_out, generator=gen) * 0.1]
        weights.append(w)
    spec = []
    for kind, m in runs:
        schedule = ref_gpipe(p, m) if kind == "GPipe" else ref_1f1b(p, m)
        spec.append(dict(kind=kind, m=m, schedule=RUN._plain(schedule),
                         x=[torch.randn(mb, d_in, generator=gen) for _ in range(m)],
                         y=[torch.randn(mb, d_out, generator=gen) for _ in range(m)]))
    return Case(name, dict(p=p, d_in=d_in, hidden=hidden, d_out=d_out, weights=weights, runs=spec))


def _with_groups(gen, case: Case, groups: list, name: str | None = None) -> Case:
    """``case`` (4 ranks), then two pipelines of 2 stages over the sub-groups ``groups``, each with its own
    weights and microbatches (1F1B), run with ``run_stage(..., process_group=...)``: a runner that ignores the
    group talks to the other pipeline's ranks."""
    sub = [_pipeline_case(gen, "", len(members), [("1F1B", randint(gen, 2, 5))]).inputs for members in groups]
    name = name or f"{case.name}; then two pipelines over sub-groups {groups}"
    return Case(name, dict(case.inputs, groups=groups, sub=sub))


def _pipeline_cases(gen, public):
    if public:
        return [_pipeline_case(gen, "2 ranks: GPipe m=3, then 1F1B m=4", 2, [("GPipe", 3), ("1F1B", 4)],
                               mb=2, d_in=4, hidden=6, d_out=2),
                _with_groups(gen, _pipeline_case(gen, "4 ranks: 1F1B m=6, then GPipe m=2", 4,
                                                 [("1F1B", 6), ("GPipe", 2)], mb=3, d_in=5, hidden=8, d_out=3),
                             [[0, 2], [1, 3]])]
    # one launch per case (~3 s of process start-up each): the runs over every rank, then (4 ranks) sub-groups
    p = randint(gen, 2, 4)
    runs = [("1F1B", randint(gen, 1, 7)), ("GPipe", randint(gen, 1, 5))]
    if randint(gen, 0, 1):
        runs.reverse()
    case = _pipeline_case(gen, f"GPipe and 1F1B runs: {p} ranks, " + ", ".join(f"{k} m={m}" for k, m in runs),
                          p, runs)
    groups = [[0, 2], [1, 3]] if randint(gen, 0, 1) else [[0, 3], [1, 2]]
    sub = _with_groups(gen, _pipeline_case(gen, "", 4, []), groups,
                       f"two pipelines over sub-groups: 4 ranks, groups {groups}")
    return [case, sub]


_PARAM_NAMES = ["first Linear weight", "first Linear bias", "output Linear weight", "output Linear bias"]


def reference_pipeline(inputs: dict, run: dict) -> tuple[list, list]:
    """Single-process model on the same microbatches, in float64: (losses, grads per stage)."""
    import torch.nn.functional as F

    p = inputs["p"]
    stages = [RUN.build_stage(s, p, inputs["d_in"], inputs["hidden"], inputs["d_out"]).double() for s in range(p)]
    with torch.no_grad():
        for s, stage in enumerate(stages):
            for prm, w in zip(stage.parameters(), inputs["weights"][s]):
                prm.copy_(w.double())
    m = run["m"]
    losses = []
    total = 0.0
    for x, y in zip(run["x"], run["y"]):
        h = x.double()
        for stage in stages:
            h = stage(h)
        loss = F.mse_loss(h, y.double())
        losses.append(float(loss.detach()))
        total = total + loss / m
    total.backward()
    return losses, [[prm.grad for prm in stage.parameters()] for stage in stages]


def _pipeline_judge(case, obs):
    x = case.inputs
    p = x["p"]
    if "hung" in obs:
        return ("the pipeline hung and was stopped: " + obs["hung"] + "\n  A rank waited for a message that "
                "never came (a recv with no matching send, or a send with no matching recv). In 1F1B two "
                "neighbours send to each other in the same slot (an activation up, a "
                "gradient down): with blocking dist.send both wait for a recv that never starts. Send with "
                "dist.isend (wait on the handles at the end), receive with dist.recv, and make every recv "
                "match a send of the neighbour, in the same order." + (_GROUP_HINT if x.get("groups") else ""))
    if "error" in obs:
        hints = (_GROUP_HINT if RUN.SUB_GROUPS in obs["error"] else "") + (
            _PLACEMENT_HINT if "meta" in obs["error"] else "")
        where = f" {RUN.SUB_GROUPS}" if RUN.SUB_GROUPS in obs["error"] else ""
        return f"a rank raised an exception{where}.{hints}\n{obs['error'][:800]}"
    ranks = obs["ranks"]
    for r_idx, run in enumerate(x["runs"]):
        if bad := _judge_pipeline_run(x, run, [ranks[s]["runs"][r_idx] for s in range(p)]):
            return bad
    for g, members in enumerate(x.get("groups") or []):
        sub = x["sub"][g]
        if bad := _judge_pipeline_run(sub, sub["runs"][0], [ranks[r]["sub"] for r in members]):
            return (f"run_stage(..., process_group=dist.new_group({members})), the pipeline of that group (its stage s "
                    f"on its rank s): {bad}{_GROUP_HINT}")
    return None


_GROUP_HINT = ("\n  After its runs over every rank, this case runs run_stage(..., process_group=...) in pipelines over "
               "sub-groups: with a process_group, your stage is dist.get_rank(process_group), p = "
               "dist.get_world_size(process_group), and a neighbour's rank for send and recv is global: "
               "dist.get_global_rank(process_group, s + 1).")
_PLACEMENT_HINT = ("\n  The check ran run_stage over a process group with torch's default device set elsewhere "
                   "('meta') than the tensors' (as on a GPU, where torch.empty(...) without device= makes a CPU "
                   "tensor beside CUDA ones): make every buffer on the tensors' device, e.g. torch.empty(..., "
                   "device=microbatches[i].device).")


def _judge_pipeline_run(x, run, got) -> str | None:
    """One run of a ``p``-stage pipeline (``x``: its weights and sizes): ``got[s]``, what stage s observed."""
    p = x["p"]
    what = f"{run['kind']} m={run['m']}"
    want_losses, want_grads = reference_pipeline(x, run)
    last = got[p - 1]["losses"]
    if not isinstance(last, list) or len(last) != run["m"]:
        return (f"{what}: the last stage must return the list of the m = {run['m']} microbatch losses, "
                f"got {last!r}.")
    losses = torch.tensor(last, dtype=torch.float64)
    want = torch.tensor(want_losses, dtype=torch.float64)
    report = compare(losses, want, name=f"{what}: losses", dtype=torch.float64, atol=1e-5, rtol=1e-4)
    if report:
        if torch.allclose(losses * run["m"], want, rtol=1e-4, atol=1e-6):
            report += "\n  They are the losses divided by m: return each microbatch's unscaled loss."
        return report
    for s in range(p):
        for j, (g, w) in enumerate(zip(got[s]["grads"], want_grads[s])):
            name = f"{what}: stage {s} {_PARAM_NAMES[j]} gradient"
            if g is None:
                return (f"{name} is None: the backward never reached stage {s}. Stage {s + 1} must send the "
                        f"gradient of its input (x.grad) back to stage {s}, which then calls "
                        "output.backward(grad)." if s < p - 1 else
                        f"{name} is None: call backward on the loss (divided by m) at every B step.")
            if not isinstance(g, torch.Tensor) or g.shape != w.shape:
                return f"{name}: expected a tensor of shape {tuple(w.shape)}, got {g!r}."
            report = compare(g.double(), w, name=name, dtype=torch.float64, atol=1e-5, rtol=1e-4)
            if report:
                if float(g.abs().max()) == 0.0:
                    report += (f"\n  All zero: stage {s} never got a real gradient. Stage {s + 1} must send "
                               f"x.grad of its input back to stage {s}, which calls output.backward(grad).")
                elif torch.allclose(g.double(), w * run["m"], rtol=1e-4, atol=1e-6):
                    report += "\n  m times too large: backpropagate loss / m so the microbatches average."
                return report
    for s in range(p):
        want_order = "".join(k for slot in run["schedule"] for st, _, k in slot if st == s)
        got_order = got[s]["order"]
        if got_order != want_order:
            return (f"{what}: rank {s} ran its stage's forwards and backwards in the order {got_order}, but "
                    f"the schedule says {want_order}. Execute schedule[t] slot after slot, only the steps "
                    f"whose stage is your rank.")
    return None


PIPELINE = Exercise("pipeline_run", 5, ("run_stage",),
                    _pipeline_cases, RUN._pipeline_run, _pipeline_judge, title="A real pipeline across ranks",
                    hint="Keep each microbatch's input and output until its B. F: stage 0 reads the microbatch, "
                         "others dist.recv the activation (then requires_grad_()); the last stage computes the loss, "
                         "the others isend the output. B: the last stage backprops loss / m; the others recv the "
                         "output's gradient and call output.backward(grad); all but stage 0 isend input.grad back. "
                         "Wait on every isend.")


# --- interleaved 1F1B: virtual stages ---------------------------------------------------------------

def _interleaved_cases(gen, public):
    """(p, m, v) per rule; m a multiple of p, except the case that must raise ValueError."""
    if public:
        sizes = [("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 3, 6, 3),
                 ("as many microbatches as devices", 4, 4, 2), ("one device", 1, 3, 2),
                 ("one chunk (plain 1F1B)", 2, 4, 1), ("m not a multiple of p", 4, 6, 2)]
    else:
        p_many, p_same, p_one, p_bad = (randint(gen, 2, 4) for _ in range(4))
        sizes = [("more microbatches than devices", p_many, p_many * randint(gen, 2, 3), randint(gen, 2, 4)),
                 ("as many microbatches as devices", p_same, p_same, randint(gen, 2, 3)),
                 ("one device", 1, randint(gen, 1, 5), randint(gen, 2, 3)),
                 ("one chunk (plain 1F1B)", p_one, p_one * randint(gen, 1, 3), 1),
                 ("m not a multiple of p", p_bad, p_bad * randint(gen, 1, 2) + randint(gen, 1, p_bad - 1),
                  randint(gen, 2, 3))]
    return [Case(f"{rule}: p={p} devices, v={v} chunks, m={m} microbatches", dict(p=p, m=m, v=v))
            for rule, p, m, v in sizes]


def _device_major(stage, p, v):
    """The confused placement: device d holding the consecutive virtual stages d v .. d v + v - 1."""
    return stage // v


def _interleaved_invalid(schedule, p, m, v, bad) -> str:
    """Why an interleaved schedule is invalid, with the likely mistake."""
    msg = f"your interleaved schedule is not valid: {bad[0][0]}."
    collisions = [b for b, _ in bad if "runs two steps" in b]
    device_major = violations(schedule, p, m, v, device=lambda s, p: _device_major(s, p, v))
    if collisions and not any("runs two steps" in b for b, _ in device_major):
        return (msg + " Every slot has one step per device if device d holds virtual stages d*v .. d*v+v-1 "
                "(device-major, device = stage // v), but Megatron places chunk c of device d at virtual "
                "stage c*p + d (chunk-major: device = stage % p = device_of(stage, p)), so that a microbatch "
                "goes round all p devices once per chunk. Write Step(c * p + d, mb, kind)."
                + _picture(schedule, p, v))
    first = bad[0][0]
    if collisions and v > 1:
        msg += (" Virtual stages s, s + p, s + 2p, ... share device s % p, which runs one chunk's step per "
                "slot: order each device's steps and place them one per slot (place_orders).")
    if "runs before F(" in first and v > 1:
        s = int(first.split(": F(")[1].split(",")[0]) if ": F(" in first else -1
        if s > 0 and s % p == 0:
            msg += (f" Virtual stage {s} (chunk {s // p} of device 0) takes its input from virtual stage {s - 1} "
                    f"(chunk {s // p - 1} of device {p - 1}): a microbatch circles the devices v times, and each "
                    f"chunk's forward waits for the previous virtual stage's, also across devices.")
    if "never runs" in first:
        ran = sum(len(slot) for slot in schedule)
        msg += (f" Each device runs v*m = {v * m} forwards and as many backwards (every chunk on every "
                f"microbatch): {2 * v * m * p} steps in all, yours has {ran}.")
    return msg + _picture(schedule, p, v)


def _interleaved_judge(case, obs):
    x = case.inputs
    p, m, v = x["p"], x["m"], x["v"]
    if m % p:
        if "error" in obs:
            return None
        return (f"m = {m} is not a multiple of p = {p}: Megatron's interleaved schedule sends microbatches "
                f"round the devices in groups of p, so it requires m % p == 0. Raise ValueError saying so "
                f"(and what to change) instead of returning a schedule.")
    if "error" in obs:
        return f"interleaved_schedule({p}, {m}, {v}) raised ValueError({obs['error']!r}), but m is a multiple of p."
    schedule = RUN._tuples(obs["schedule"])
    bad = violations(schedule, p, m, v)
    if bad:
        return _interleaved_invalid(schedule, p, m, v, bad)
    want = 2 * (v * m + p - 1)
    if len(schedule) != want:
        return (f"your schedule is valid but takes {len(schedule)} slots; interleaved 1F1B takes "
                f"2(v m + p - 1) = {want} (one chunk per slot), so its bubble is {ref_bubble(schedule, p):.4f} "
                f"instead of (p-1)/(v m+p-1) = {bubble_formula(p, m, v):.4f} (plain 1F1B: (p-1)/(m+p-1) = "
                f"{bubble_formula(p, m):.4f}). Is it interleaved? Each device runs chunk 0 on a group of p "
                f"microbatches, then chunk 1 on the same p, ..., then the next group; warm-up "
                f"(p - d - 1) + (v - 1) p forwards, then one forward one backward.{_picture(schedule, p, v)}")
    peaks, bound = ref_peaks(schedule, p), memory_bound(p, m, v)
    for d in range(p):
        if peaks[d] > bound[d]:
            return (f"device {d} holds up to {peaks[d]} microbatch-chunks' activations at once; interleaved 1F1B "
                    f"holds at most its warm-up + 1 = v p - d = {bound[d]} (with (p - d - 1) + (v - 1) p warm-up "
                    f"forwards on device d, then every forward followed by a backward). Too many warm-up "
                    f"forwards (an off-by-one?) only add memory here: the schedule is no shorter."
                    f"{_picture(schedule, p, v)}")
    return None


INTERLEAVED = Exercise("interleaved_schedule", 4, ("interleaved_schedule",), _interleaved_cases,
                       RUN._interleaved_run, _interleaved_judge, title="Interleaved 1F1B: virtual stages",
                       hint="Raise ValueError unless m % p == 0. Per device d, its k-th forward is chunk (k // p) % v "
                            "on microbatch (k // (p v)) p + k % p, i.e. virtual stage chunk * p + d; its k-th "
                            "backward the same with the chunk reversed (v - 1 - chunk). Order: (p - d - 1) + "
                            "(v - 1) p warm-up forwards, then (F, B) pairs, then the last backwards. Then place "
                            "the orders slot by slot as in 1F1B, one step per device.")


# --- messages between devices ---------------------------------------------------------------------

def _sends_cases(gen, public):
    if public:
        specs = [("plain 1F1B", 4, 8, 1), ("interleaved", 4, 8, 2), ("one device, several chunks", 1, 2, 3),
                 ("GPipe", 3, 2, 1), ("interleaved", 2, 4, 3)]
    else:
        p1, p2 = randint(gen, 2, 5), randint(gen, 2, 4)
        specs = [("plain 1F1B", p1, randint(gen, 1, 8), 1), ("interleaved", p2, p2 * randint(gen, 1, 3),
                                                               randint(gen, 2, 4)),
                 ("one device, several chunks", 1, randint(gen, 1, 6), randint(gen, 2, 4)),
                 ("GPipe", randint(gen, 2, 5), randint(gen, 1, 6), 1)]
    cases = []
    for rule, p, m, v in specs:
        sched = ref_gpipe(p, m) if rule == "GPipe" else ref_interleaved(p, m, v) if v > 1 else ref_1f1b(p, m)
        sep = " " if public else ": "
        cases.append(Case(f"{rule}{sep}p={p} v={v} m={m}", dict(schedule=RUN._plain(sched), p=p, m=m, v=v)))
    return cases


def _sends_judge(case, obs):
    x = case.inputs
    p, m, v = x["p"], x["m"], x["v"]
    want = ref_sends(RUN._tuples(x["schedule"]), p)
    got = obs["sends"]
    if isinstance(got, bool) or not isinstance(got, int) or got != want:
        msg = (f"p2p_sends = {got!r}, expected {want} (an int): an activation after each F(s, i) to stage s + 1 "
               f"and a gradient after each B(s, i) to stage s - 1, counted when that stage is on another device.")
        n = p * v
        if got == 2 * m * (n - 1) and want != got:
            msg += (f" You counted every stage boundary; with p = {p} device, neighbouring chunks on one device "
                    f"hand over in memory: no message.")
        elif got == want // 2:
            msg += " You counted one direction only: the gradients travel back too."
        elif v > 1 and got == 2 * m * (p - 1):
            msg += (f" That is plain 1F1B's 2 m (p - 1); interleaved, every one of the p v - 1 = {n - 1} "
                    f"virtual-stage boundaries crosses devices.")
        return msg
    return None


SENDS = Exercise("p2p_sends", 2, ("p2p_sends",), _sends_cases, RUN._sends_run, _sends_judge,
                 title="Point-to-point messages: what interleaving costs",
                 hint="n = highest stage + 1. For each step: F(s, i) sends to s + 1 if s + 1 < n, B(s, i) to s - 1 if "
                      "s > 0; count it when device_of of the two stages differ.")


# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.dist.launch", "gpulab.schedules.Step", "gpulab.schedules.as_text", "gpulab.schedules.device_of",
           "gpulab.schedules.gantt")
EXERCISES = [offering(ex, OFFERED) for ex in (GPIPE, VALIDATE, ONE_F_ONE_B, BUBBLE, PEAKS, PIPELINE, INTERLEAVED,
                                          SENDS)]


# Nothing to time here on one machine: pipeline timings need several GPUs (see the lesson).
BENCHMARKS: list = []
