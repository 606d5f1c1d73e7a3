"""Checks of lab 07, mixed precision: format limits from the bit layout (bias, IEEE vs finite-only fp8),
what a cast loses (underflow, subnormals, overflow, with and without a loss scale), a dynamic loss scaler
replayed step by step against ``torch.amp.GradScaler`` on the same fp16 gradients (it skips exactly the
overflowing steps, an overflow in any parameter of any param group, grows after exactly ``growth_interval``
clean steps, resets its counter on an overflow, backs off below 1; a GradScaler held anywhere in the scaler,
its code, its kernels or an op recorder switched off earn nothing),
an autocast training step (fp32 master weights, low-precision forward, unscale before clipping, overflowing
steps skipped) and a Kahan sum that stays in the low precision. Wrong answers are named by the mistake they
match. Hidden cases: one per rule (a case's name starts with its rule, before ':'), the same rules on every seed.
"""
from __future__ import annotations

import math

import torch

from gpulab.precision import FORMATS, overflows, replay_scaler
from grader.exercise import Case, Exercise
from grader.kit.cases import choice, randint, uniform
from grader.kit.close import close
from grader.kit.helpers import offering
from grader.kit.variants import diagnose
from grader.runs import run_side

LAB = "07_mixed_precision"
RUN = run_side(LAB)  # the learner side: grader/runs/07_mixed_precision.py
TITLE = "Mixed precision: formats, loss scaling, autocast"


# --- exercise 1: format limits from the bit layout ---------------------------------------------------

# (exponent, mantissa) bits of the named formats: torch's float dtypes (e4m3fnuz and e5m2fnuz share e4m3fn's and
# e5m2's) and tf32. The drawn hidden formats avoid them: a torch.finfo lookup or a typed-in table must fail there.
_KNOWN_LAYOUTS = {(f.exp_bits, f.mantissa_bits) for f in FORMATS.values()}


def ref_format_limits(exp_bits: int, mantissa_bits: int, finite_only: bool = False, *, variant: str = "") -> dict:
    """Largest finite value, smallest normal and subnormal, machine epsilon; ``variant``: a classic mistake."""
    e, m = exp_bits, mantissa_bits
    bias = 2 ** (e - 1) - (0 if variant == "bias" else 1)
    top = 2 ** e - 1 - bias  # the all-ones exponent field, unbiased
    if finite_only and variant != "ieee":  # the all-ones exponent holds numbers; its all-ones mantissa is NaN
        emax, largest = top, 2 - 2.0 ** (1 - m) if variant != "nan as number" else 2 - 2.0 ** -m
    else:                                  # IEEE: the all-ones exponent is inf/NaN
        emax, largest = top - 1, 2 - 2.0 ** -m
    if variant == "no mantissa":
        largest = 1.0
    return {"max": largest * 2.0 ** emax,
            "min_normal": 2.0 ** ((0 if variant == "min_normal" else 1) - bias),
            "min_subnormal": 2.0 ** ((1 - bias) if variant == "no subnormals" else (1 - bias - m)),
            "eps": 2.0 ** (-m - (1 if variant == "unit roundoff" else 0))}


_LIMIT_VARIANTS = [
    ("ieee", "the all-ones exponent reserved for inf/NaN as in IEEE formats; a finite-only format (e4m3fn) "
             "has no inf: its all-ones exponent holds numbers and only the all-ones mantissa there is NaN, so "
             "e4m3fn's max is 448, not 240"),
    ("nan as number", "the all-ones mantissa of the all-ones exponent counted as a number; in e4m3fn it is "
                      "the NaN, so the largest significand is 1.110 (max 448, not 480)"),
    ("min_normal", "min_normal = 2^-bias; the smallest normal exponent field is 1, so 2^(1 - bias)"),
    ("bias", "an exponent bias of 2^(e-1); the bias is 2^(e-1) - 1 (127 for fp32, 15 for fp16)"),
    ("no mantissa", "max = 2^emax: the largest value has every mantissa bit set, (2 - 2^-m) x 2^emax"),
    ("no subnormals", "no subnormals: below min_normal the exponent field 0 gives 0.mantissa x 2^(1 - bias), "
                      "down to 2^(1 - bias - m)"),
    ("unit roundoff", "eps = 2^-(m+1), the unit roundoff (half of epsilon); eps is the gap from 1 to the next "
                      "number, 2^-m"),
]


def _limits_cases(gen, public):
    def case(rule, e, m, finite_only=False, name=""):
        label = name or f"{e} exponent bits, {m} mantissa bits{', finite only' if finite_only else ''}"
        return Case(f"{rule}{': ' if rule else ''}{label}", dict(e=e, m=m, finite_only=finite_only))

    def named(rule, name):
        f = FORMATS[name]
        return case(rule, f.exp_bits, f.mantissa_bits, f.finite_only, f"{name} (e{f.exp_bits}m{f.mantissa_bits})")

    def unknown(e_range, m_range):
        """(e, m) of no named format: only the bit layout gives its limits."""
        while True:
            e, m = randint(gen, *e_range), randint(gen, *m_range)
            if (e, m) not in _KNOWN_LAYOUTS:
                return e, m

    if public:
        return [named("", n) for n in ("fp32", "fp16", "bf16", "tf32", "fp8 e5m2", "fp8 e4m3fn")]
    return [named("fp16", "fp16"), named("bf16", "bf16"), named("fp8 e4m3fn (finite only)", "fp8 e4m3fn"),
            case("an IEEE-style format", *unknown((3, 8), (1, 12))),
            case("a finite-only format", *unknown((3, 6), (2, 5)), True)]


def _judge_fields(fn_name: str, obs: dict, want: dict, variants: list, whole: bool, note: str = "") -> str | None:
    """The first field of ``obs`` that differs from ``want``, named by the first variant (a callable returning
    the mistake's dict) that matches it: on that field, or on every field if ``whole``."""
    if "bad" in obs:
        return f"{fn_name} returned a {obs['bad']}; return a dict with the keys {', '.join(want)}."
    same = lambda got, ref, keys: all(got[k] is not None and close(got[k], ref[k]) for k in keys)  # noqa: E731
    for key in want:
        if not same(obs, want, [key]):
            return diagnose(f"{key} = {obs[key]!r}, expected {want[key]!r}{note}.", obs, variants,
                            lambda got, ref: same(got, ref, list(want) if whole else [key]), "\n  Yours matches {}.")
    return None


def _limits_judge(case, obs):
    e, m, finite_only = case.inputs["e"], case.inputs["m"], case.inputs["finite_only"]
    variants = [(why, lambda v=v: ref_format_limits(e, m, finite_only, variant=v)) for v, why in _LIMIT_VARIANTS]
    return _judge_fields("format_limits", obs, ref_format_limits(e, m, finite_only), variants, whole=False,
                         note=f" (bias {2 ** (e - 1) - 1})")


FORMAT_LIMITS = Exercise("format_limits", 2, ("format_limits",), _limits_cases, RUN._limits_run, _limits_judge,
                         title="Format limits from the bit layout",
                         hint="bias = 2^(e-1) - 1; IEEE: emax = 2^e - 2 - bias, max = (2 - 2^-m) 2^emax; finite "
                              "only: emax = 2^e - 1 - bias, max = (2 - 2^(1-m)) 2^emax; min_normal = 2^(1-bias), "
                              "min_subnormal = 2^(1-bias-m), eps = 2^-m.")


# --- exercise 2: what a cast loses --------------------------------------------------------------------


def ref_cast_report(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0, *, variant: str = "") -> dict:
    """Fractions of the nonzero entries of ``x`` that ``(x * scale).to(dtype)`` flushes to 0, leaves subnormal,
    or turns into inf/NaN; ``variant``: a classic mistake."""
    x = x.float()
    if variant == "cast first":
        y = (x.to(dtype).float() * scale).to(dtype).float()
    else:
        y = (x * (1.0 if variant == "no scale" else scale)).to(dtype).float()
    scaled = x * scale
    nonzero = x != 0
    n = x.numel() if variant == "all elements" else int(nonzero.sum())
    tiny = torch.finfo(torch.float32 if variant == "float32 tiny" else dtype).tiny
    zero = (scaled.abs() < tiny) if variant == "below min normal" else (y == 0)
    if not n:
        return dict.fromkeys(RUN.REPORT, 0.0)
    kept = nonzero if variant == "zeros subnormal" else (y != 0)
    return {"underflow": int((zero & nonzero).sum()) / n,
            "subnormal": int((kept & (y.abs() < tiny) & torch.isfinite(y)).sum()) / n,
            "overflow": int((~torch.isfinite(y) & nonzero).sum()) / n}


_REPORT_VARIANTS = [
    ("no scale", "the scale ignored: multiply by scale before the cast"),
    ("cast first", "casting before scaling: what underflowed in the cast stays 0 whatever the scale; scale in "
                   "float32, then cast"),
    ("all elements", "fractions of all the elements; count over the nonzero ones (a zero cannot underflow)"),
    ("below min normal", "everything below min normal counted as underflow; subnormals are not 0, count only "
                         "values the cast turns into 0"),
    ("zeros subnormal", "the values flushed to 0 counted as subnormal too: a subnormal is nonzero (0 < |y| < tiny)"),
    ("float32 tiny", "float32's smallest normal (1.2e-38): use torch.finfo(dtype).tiny of the target dtype"),
]


def _gradients(gen, n, lo, hi, zeros=0.0):
    """n values with log10 |x| uniform in [lo, hi], random signs, a fraction ``zeros`` exactly 0."""
    mag = 10 ** (lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64))
    x = (mag * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)).float()
    return torch.where(torch.rand(n, generator=gen) < zeros, 0.0, x)


_MANTISSA = {"float16": 10, "bfloat16": 7, "float8_e5m2": 2}  # stored fraction bits: min subnormal = tiny 2^-m


def _on_the_edges(gen, x, dtype, scale):
    """``x`` with a few entries that land exactly on the edges after scaling: +-tiny (the smallest normal: not
    subnormal), and 3/4 of the smallest subnormal (rounds up to it: not an underflow), so a test with <= tiny or
    one on the value before the cast fails on every seed."""
    fi = torch.finfo(RUN._DTYPES[dtype])
    edges = torch.tensor([fi.tiny, -fi.tiny, 0.75 * fi.tiny * 2.0 ** -_MANTISSA[dtype]],
                         dtype=torch.float64) / scale
    x = x.clone()
    x[torch.randperm(x.numel(), generator=gen)[:len(edges)]] = edges.float()
    return x


def _report_cases(gen, public):
    def case(rule, x, dtype, scale):
        if rule:
            x = _on_the_edges(gen, x, dtype, scale)
        return Case(f"{rule}{': ' if rule else ''}{x.numel()} values, |x| from {x[x != 0].abs().min():.1e} to "
                    f"{x.abs().max():.1e}, {dtype}, scale {scale:g}", dict(x=x, dtype=dtype, scale=scale))

    if public:
        return [case("", _gradients(gen, 2000, -10, -2), "float16", 1.0),
                case("", _gradients(gen, 2000, -10, -2), "bfloat16", 1.0),
                case("", _gradients(gen, 2000, -10, -2, 0.2), "float16", 1024.0),
                case("", _gradients(gen, 2000, -3, 2), "float16", 2.0 ** 16)]
    n = randint(gen, 1000, 3000)
    return [case("small gradients in fp16", _gradients(gen, n, uniform(gen, -11, -9), -3), "float16", 1.0),
            case("the same range in bf16", _gradients(gen, n, uniform(gen, -11, -9), -3), "bfloat16", 1.0),
            case("a loss scale", _gradients(gen, n, -10, -3, 0.1), "float16", 2.0 ** randint(gen, 8, 16)),
            case("a large scale", _gradients(gen, n, -4, 1), "float16", 2.0 ** randint(gen, 14, 18)),
            case("exact zeros in the input (ReLU gradients)", _gradients(gen, n, -9, -4, uniform(gen, .2, .5)),
                 "float16", 1.0),
            case("fp8 e5m2", _gradients(gen, n, -8, 2), "float8_e5m2", 2.0 ** randint(gen, 0, 6))]


def _report_judge(case, obs):
    x, dtype = case.inputs["x"], RUN._DTYPES[case.inputs["dtype"]]
    if obs.pop("mutated", False):
        return ("cast_report changed its input x in place (x *= scale, x.mul_): the caller's gradients must not "
                "move. Scale a copy: y = (x.float() * scale).to(dtype).")
    variants = [(why, lambda v=v: ref_cast_report(x, dtype, case.inputs["scale"], variant=v))
                for v, why in _REPORT_VARIANTS]
    return _judge_fields("cast_report", obs, ref_cast_report(x, dtype, case.inputs["scale"]), variants, whole=True,
                         note=f" (a fraction of the {int((x != 0).sum())} nonzero values)")


CAST_REPORT = Exercise("cast_report", 2, ("cast_report",), _report_cases, RUN._report_run, _report_judge,
                       title="What a cast loses: underflow, subnormals, overflow",
                       hint="y = (x.float() * scale).to(dtype); over the nonzero x: underflow y == 0, subnormal "
                            "0 < |y| < torch.finfo(dtype).tiny, overflow not torch.isfinite(y).")


# --- exercise 3: a dynamic loss scaler ------------------------------------------------------------------

TOY_N = 64  # the toy parameter's size: a gradient g overflows at scale s when |s / 64 x g| > 65504 in fp16


def _stream(gen, steps, spikes=None):
    """``steps`` gradients (TOY_N,) float32 in [-1, 1], each with one entry of |1| (its max), so the toy overflows
    exactly when scale >= 2^22; ``spikes``: {step: "inf" (one entry x 1e6) or "nan"}, or {step: (kind, (lo, hi))}
    to put the spike among the entries lo..hi-1 (one parameter of a split toy)."""
    grads = []
    for t in range(steps):
        g = 2 * torch.rand(TOY_N, generator=gen) - 1
        g[randint(gen, 0, TOY_N - 1)] = choice(gen, [-1.0, 1.0])
        spike = (spikes or {}).get(t)
        kind, (lo, hi) = spike if isinstance(spike, tuple) else (spike, (0, TOY_N))
        if kind:
            g[randint(gen, lo, hi - 1)] = 1e6 if kind == "inf" else float("nan")
        grads.append(g)
    return grads


def _split_toy(gen):
    """Sizes of the toy split into two param groups of two parameters each, ``[[a, b], [c, d]]``, and the entries
    of each parameter: an overflow in any one of them must be found (not only in the first or the last)."""
    cuts = sorted(randint(gen, 4, TOY_N - 4) for _ in range(3))
    while len(set(cuts)) < 3 or min(b - a for a, b in zip([0, *cuts], [*cuts, TOY_N])) < 4:
        cuts = sorted(randint(gen, 4, TOY_N - 4) for _ in range(3))
    bounds = list(zip([0, *cuts], [*cuts, TOY_N]))
    return [[hi - lo for lo, hi in bounds[:2]], [hi - lo for lo, hi in bounds[2:]]], bounds


def _scaler_cases(gen, public):
    def case(rule, grads, init_scale, interval, growth=2.0, backoff=0.5, unscale_first=False, groups=None):
        name = (f"{rule}{': ' if rule else ''}{len(grads)} steps, init_scale 2^{int(math.log2(init_scale))}, "
                f"growth_interval {interval}, growth x{growth:g}, backoff x{backoff:g}"
                f"{', unscale_() called before step()' if unscale_first else ''}"
                f"{f', parameters in groups of sizes {groups}' if groups else ''}")
        return Case(name, dict(grads=torch.stack(grads), init_scale=init_scale, interval=interval, growth=growth,
                               backoff=backoff, unscale_first=unscale_first, groups=groups))

    def split(steps, spiked, kinds):
        """A stream over the split toy with one spike in parameter ``p`` at step ``t`` for each (t, p)."""
        groups, bounds = _split_toy(gen)
        return _stream(gen, steps, {t: (kind, bounds[p]) for (t, p), kind in zip(spiked, kinds)}), groups

    if public:
        grads, groups = split(8, [(1, 3), (4, 1)], ["inf", "nan"])
        return [case("", _stream(gen, 8), 2.0 ** 8, 3),
                case("", _stream(gen, 10, {4: "inf"}), 2.0 ** 10, 3),
                case("", _stream(gen, 12), 2.0 ** 25, 2),
                case("", _stream(gen, 8, {2: "nan", 5: "inf"}), 2.0 ** 12, 2, unscale_first=True),
                case("", grads, 2.0 ** 12, 2, groups=groups)]
    k = randint(gen, 3, 5)
    t = randint(gen, 3, 6)
    # a spike in each of the four parameters in turn: the first, the last, the last of the first group, the first
    # of the second group (a check of only the first/last parameter, or of one group, misses one of them)
    grads, groups = split(10, [(1, 0), (3, 3), (5, 1), (7, 2)], ["inf", "nan", "inf", "inf"])
    nans = {s: "nan" for s in range(1, 6)}
    return [case("growth after exactly growth_interval clean steps", _stream(gen, 3 * k + 1),
                 2.0 ** randint(gen, 4, 12), k),
            case("an overflow before the first growth", _stream(gen, 3 * k, {k - 1: "inf"}), 2.0 ** 10, k),
            case("a large initial scale", _stream(gen, 12), 2.0 ** randint(gen, 24, 27), randint(gen, 2, 3)),
            case("a NaN gradient", _stream(gen, 9, {t: "nan"}), 2.0 ** 12, 2),
            case("consecutive overflows", _stream(gen, 10, {t - 1: "inf", t: "inf", t + 1: "nan"}), 2.0 ** 14, 2),
            case("growth interval 1", _stream(gen, 9, {t: "inf"}), 2.0 ** 6, 1),
            case("other growth and backoff factors", _stream(gen, 10, {t: "inf"}), 2.0 ** 12, 2, 4.0, 0.25),
            case("unscale_() before step()", _stream(gen, 8, {t: "inf"}), 2.0 ** 12, 2, unscale_first=True),
            case("several parameters in several param groups", grads, 2.0 ** randint(gen, 10, 14), 2, groups=groups),
            case("NaN gradients from a small scale", _stream(gen, 8, nans), 2.0 ** randint(gen, 0, 2), 2)]


def ref_scales(grads, init_scale, interval, growth=2.0, backoff=0.5, *, variant: str = "") -> list:
    """The scale of every step and the one after the last, by the update rule (``variant``: a classic mistake)."""
    scale, clean, out = init_scale, 0, []
    for g in grads:
        out.append(scale)
        if overflows(g, scale):
            scale *= 1.0 if variant == "no backoff" else backoff
            clean = clean + 1 if variant == "overflow counted" else clean if variant == "no reset" else 0
        else:
            clean += 1
            if clean >= interval + (1 if variant == "late" else -1 if variant == "early" else 0) and variant != "never":
                scale, clean = scale * growth, 0
    return out + [scale]


_SCALE_VARIANTS = [
    ("late", "growth after growth_interval + 1 clean steps (off by one): grow when the count of clean steps "
             "reaches growth_interval, then reset the count"),
    ("early", "growth after growth_interval - 1 clean steps (off by one)"),
    ("no reset", "the clean-step counter not reset on an overflow: an overflow starts the count again at 0"),
    ("overflow counted", "an overflowing step counted as clean: reset the counter to 0 on an overflow"),
    ("no backoff", "no backoff: multiply the scale by backoff_factor on every overflow"),
    ("never", "a scale that never grows: multiply it by growth_factor after growth_interval clean steps"),
]


def _borrowed_scaler(evidence: dict) -> str | None:
    """What of GradScaler (or of a course helper) the run side found in a learner's scaler, if anything."""
    if evidence["is"]:
        return f"is a torch.amp.GradScaler ({evidence['is']})"
    if evidence["holds"]:
        return f"holds GradScaler, its code or a recorder's off switch ({'; '.join(evidence['holds'][:3])})"
    if evidence["kernels"]:
        return f"is built on GradScaler's kernels ({', '.join(evidence['kernels'])})"
    if evidence["names"]:
        return f"names {', '.join(evidence['names'])} in its code"
    if evidence["unrecorded_steps"]:
        return ("switched off the check's op recorder around optimizer.step (the recorder saw none of SGD's "
                "operations)")
    if evidence["library_methods"]:
        return (f"not the author of its {', '.join(evidence['library_methods'])}: those methods are library code, "
                "or come from elsewhere through __getattr__")
    if evidence["gpulab"]:
        return f"reaches {evidence['gpulab']} (a course helper, or GradScaler)"
    return None


def _scaler_judge(case, obs):
    x = case.inputs
    borrowed = _borrowed_scaler(obs["evidence"])
    if borrowed:
        return (f"your LossScaler {borrowed}: the exercise is the scaler written from scratch (the check "
                "compares it with GradScaler, so GradScaler itself proves nothing). Keep the scale, the clean-step "
                "count and found_inf yourself, with plain tensor operations, in methods of your own class.")
    grads = list(x["grads"])
    ref = replay_scaler(torch.amp.GradScaler("cpu", init_scale=x["init_scale"], growth_factor=x["growth"],
                                             backoff_factor=x["backoff"], growth_interval=x["interval"]),
                        grads, unscale_first=x["unscale_first"], groups=x["groups"])
    got_scales, want_scales = obs["scale"] + obs["after"][-1:], ref["scale"] + ref["after"][-1:]
    skipped = [t for t, s in enumerate(ref["stepped"]) if not s]
    table = f"\n  GradScaler's scales: {[f'{s:g}' for s in want_scales]}, skipped steps {skipped}."
    for t in range(len(grads)):
        if not close(got_scales[t], want_scales[t]):
            msg = (f"the scale of step {t} is {got_scales[t]:g}, GradScaler's is {want_scales[t]:g}.\n  Your scales: "
                   f"{[f'{s:g}' for s in got_scales]}." + table)
            variants = [(why, ref_scales(grads, x["init_scale"], x["interval"], x["growth"], x["backoff"],
                                         variant=v)) for v, why in _SCALE_VARIANTS]
            return diagnose(msg, got_scales, variants, lambda g, w: all(map(close, g, w)) and len(g) == len(w),
                            "\n  Yours match {}.")
        if obs["stepped"][t] != ref["stepped"][t]:
            if ref["stepped"][t]:
                after = " (the step after an overflow: clear the found-inf flag in update())" * (t - 1 in skipped)
                return (f"step {t} skipped{after}, but its gradients are finite at scale {want_scales[t]:g}: skip "
                        f"only the steps whose scaled gradients hold inf or NaN." + table)
            return (f"step {t} ran optimizer.step, but its scaled gradients hold inf or NaN at scale "
                    f"{want_scales[t]:g}: skip the step (leave the weights alone) and back off." + table)
        got_p, want_p = obs["param"][t], ref["param"][t]
        if not torch.allclose(got_p, want_p, rtol=1e-5, atol=1e-7, equal_nan=True):
            step = (1 - want_p) if t == 0 else ref["param"][t - 1] - want_p  # the update SGD made with true grads
            done = (1 - got_p) if t == 0 else ref["param"][t - 1] - got_p
            ratio = float(done.norm() / step.norm()) if float(step.norm()) > 0 else float("nan")
            # float32 weights near 1 resolve a tiny update coarsely: a factor within 1.5 of the scale names it
            near = lambda r, target: r > 0 and abs(math.log(r / target)) < math.log(1.5)  # noqa: E731
            why = ""
            if near(ratio, want_scales[t]):
                why = "\n  Your update is the scale times too big: unscale the gradients (divide by the scale) first."
            elif near(ratio, 1 / want_scales[t]):
                why = ("\n  Your update is the scale times too small: the gradients were unscaled twice (step() after "
                       "unscale_() must not divide again).")
            return f"after step {t} the weights differ from GradScaler's (update ratio {ratio:.3g}).{why}"
    if not close(got_scales[-1], want_scales[-1]):
        return f"the scale after the last update is {got_scales[-1]:g}, GradScaler's is {want_scales[-1]:g}." + table
    return None


LOSS_SCALER = Exercise("loss_scaler", 4, ("LossScaler",), _scaler_cases, RUN._scaler_run, _scaler_judge,
                       title="A dynamic loss scaler, step by step against GradScaler",
                       hint="scale(loss) = loss * scale. unscale_: multiply every grad by 1/scale in place, "
                            "found_inf = any grad not finite. step: unscale_ unless done, optimizer.step() only if "
                            "not found_inf. update: on found_inf scale *= backoff, clean = 0; else clean += 1 and "
                            "when clean == growth_interval: scale *= growth, clean = 0. Then forget found_inf.")


# --- exercise 4: an autocast training step ---------------------------------------------------------------


def ref_amp_step(model, optimizer, scaler, x, y, dtype, max_norm, *, variant: str = ""):
    """The reference step; ``variant`` "clip scaled": clipping before unscale_ (the classic mistake); "no zero_grad":
    gradients accumulated across steps."""
    if variant != "no zero_grad":
        optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if variant != "clip scaled":
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach()), float(norm)


def _train_cases(gen, public):
    def case(rule, dtype, init_scale, max_norm, opt="sgd", steps=3):
        name = (f"{rule}{': ' if rule else ''}{dtype}, {opt}, max_norm {max_norm:g}, " +
                (f"GradScaler init_scale 2^{int(math.log2(init_scale))}" if dtype == "float16" else "no scaler") +
                f", {steps} steps")
        return Case(name, dict(dtype=dtype, init_scale=init_scale, max_norm=max_norm, opt=opt, steps=steps,
                               seed=randint(gen, 0, 2 ** 30)))

    if public:
        return [case("", "float16", 2.0 ** 12, 0.1), case("", "bfloat16", 1.0, 0.1),
                case("", "float16", 2.0 ** 40, 0.1, steps=2), case("", "float16", 2.0 ** 10, 100.0, "adamw")]
    return [case("fp16 with loss scaling, a small max_norm", "float16", 2.0 ** randint(gen, 8, 14),
                 uniform(gen, .02, .2)),
            case("bf16, no loss scaling", "bfloat16", 1.0, uniform(gen, .02, .2)),
            case("a large initial scale", "float16", 2.0 ** randint(gen, 36, 44), 0.1, steps=2),
            case("a large max_norm", "float16", 2.0 ** randint(gen, 10, 14), 1e3),
            case("AdamW", "float16", 2.0 ** randint(gen, 8, 12), uniform(gen, .05, .2), "adamw")]


def _train_judge(case, obs):
    x = case.inputs
    if "bad" in obs:
        return f"amp_train_step returned a {obs['bad']}; return the pair (loss, grad_norm) as floats."
    if "no_update" in obs:
        return ("GradScaler refused to unscale: the previous step never called scaler.update(). Call it at the end "
                "of every step, after scaler.step(optimizer): it adjusts the scale and clears the step's state.")
    if "fp16_grads" in obs:
        return ("GradScaler refused to unscale float16 gradients: your weights are float16, and the master weights "
                "must stay float32. Do not convert the model (model.half()); run the forward under torch.autocast "
                "and let the optimizer update the fp32 weights.")
    for t, dtypes in enumerate(obs["dtypes"]):
        low = {n: d for n, d in dtypes.items() if d != "torch.float32"}
        if low:
            name, d = next(iter(low.items()))
            return (f"after step {t} the weight {name} is {d}: the master weights must stay float32. Do not convert "
                    f"the model (model.half()); torch.autocast runs the forward in {x['dtype']} on fp32 weights, and "
                    "the optimizer updates the fp32 copy, so updates smaller than a fp16 ulp are not lost.")
    if obs["forward"] != f"torch.{x['dtype']}":
        return (f"the first Linear layer's output is {obs['forward']}, not torch.{x['dtype']}: run the forward and "
                f"the loss under torch.autocast(device_type=x.device.type, dtype=dtype).")
    # The reference runs on the learner's device when the judge has it: the same kernels round the same way
    # (AdamW turns a tiny gradient's sign into a whole step, so a CPU reference could differ from a GPU run).
    device = "cuda" if obs.get("device") == "cuda" and torch.cuda.is_available() else "cpu"
    ref = RUN._record_steps(ref_amp_step, case, device)
    for t in range(x["steps"]):
        if obs["stepped"][t] != ref["stepped"][t]:
            if not ref["stepped"][t]:
                scale = ref["scale"][t - 1] if t else x["init_scale"]
                return (f"step {t} overflowed (inf/NaN in the fp16 gradients at scale {scale:g}) but optimizer.step "
                        "ran: call scaler.step(optimizer) on the scaler you were given (a new GradScaler has a "
                        "scale of its own), which skips such steps.")
            return f"step {t} has finite gradients but optimizer.step did not run: call scaler.step(optimizer)."
        (loss, norm), (want_loss, want_norm) = obs["returned"][t], ref["returned"][t]
        if loss is None or not close(loss, want_loss, rel=1e-2):
            return f"step {t}: loss {loss!r}, expected {want_loss:.6g}: return the unscaled loss of this batch."
        if norm is None or not (close(norm, want_norm, rel=1e-2) or (math.isinf(want_norm) and norm == want_norm)
                                or (math.isnan(want_norm) and math.isnan(norm))):
            scale = ref["scale"][t - 1] if t else x["init_scale"]
            why = ""
            if norm is not None and close(norm, want_norm * scale, rel=1e-2):
                why = ("\n  Yours is the norm of the scaled gradients: call scaler.unscale_(optimizer) before "
                       "clip_grad_norm_, or the clip threshold is compared with gradients `scale` times too big.")
            elif norm is not None and close(norm, min(want_norm, x["max_norm"]), rel=1e-2):
                why = "\n  Yours is the norm after clipping: return what clip_grad_norm_ returns (the norm before)."
            elif norm is not None and close(norm, RUN._record_steps(lambda *a: ref_amp_step(*a, variant="no zero_grad"),
                                                                case, device)["returned"][t][1], rel=1e-2):
                why = ("\n  Yours is the norm of gradients summed over the steps: zero the gradients at the start of "
                       "each step (optimizer.zero_grad(set_to_none=True)).")
            return f"step {t}: grad_norm {norm!r}, expected {want_norm:.6g} (unscaled, before clipping).{why}"
        prev = ref["params"][t - 1] if t else ref["init"]
        bad = _params_differ(obs["params"][t], ref["params"][t], prev)
        if bad:
            scaled = RUN._record_steps(lambda *a: ref_amp_step(*a, variant="clip scaled"), case, device)
            why = ""
            if not _params_differ(obs["params"][t], scaled["params"][t], prev):
                why = ("\n  Yours match clipping the scaled gradients: call scaler.unscale_(optimizer) before "
                       "clip_grad_norm_.")
            elif all(bool((p == p.half().float()).all()) for p in obs["params"][t].values()):
                why = ("\n  Every weight of yours is a float16 value: the master weights were rounded to fp16. Keep "
                       "them float32 and let autocast cast copies for the forward.")
            return f"after step {t} {bad}{why}"
    return None


def _params_differ(got: dict, want: dict, prev: dict) -> str | None:
    """How the weights after a step differ from the reference's, if they do: by more than 0.1% of the reference's
    update since ``prev`` (the reference ran on the same device; rounding the weights to fp16 moves them by
    ~1e-4 of their size, several percent of an update)."""
    for name in sorted(want, key=lambda n: bool(torch.equal(want[n], prev[n]))):  # the weights that moved first
        g, w = got.get(name), want[name]
        if g is None or g.shape != w.shape:
            return f"the weight {name} is missing or has another shape."
        err, update = float((g - w).abs().max()), float((w - prev[name]).abs().max())
        if not err <= 1e-3 * update + 1e-7:  # NaN fails too
            return (f"the weight {name} differs from the reference step by up to {err:.2e} (the reference moved it "
                    f"by up to {update:.2e}).")
    return None


# Its cases run bf16 autocast on the grading device: on a CUDA GPU before sm_80 (a T4) PyTorch emulates bf16 or
# refuses it ("Current CUDA Device does not support bfloat16"), so there the exercise is skipped, not failed. The
# other exercises cast to bf16 or add in bf16 (elementwise, correct on every GPU) or run on CPU tensors.
AMP_STEP = Exercise("amp_train_step", 3, ("amp_train_step",), _train_cases, RUN._train_run, _train_judge,
                    requires="bf16", title="An autocast training step: fp32 master weights, unscale before clip",
                    hint="zero_grad; with torch.autocast(x.device.type, dtype): loss = mse_loss(model(x), y); "
                         "scaler.scale(loss).backward(); scaler.unscale_(optimizer); norm = clip_grad_norm_(...); "
                         "scaler.step(optimizer); scaler.update(); return float(loss), float(norm).")


# --- exercise 5: Kahan summation in the low precision ------------------------------------------------


def ref_ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between ``dtype`` numbers at |v| (float64), normal range."""
    m = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    return 2.0 ** (torch.floor(torch.log2(v.abs().clamp_min(1e-30))) - m)


def kahan_tolerance(x: torch.Tensor) -> torch.Tensor:
    """Kahan's bound per row: one ulp of the result plus 2 u sum |x_i| (u = ulp(1) / 2), float64 (R,)."""
    u = torch.finfo(x.dtype).eps / 2
    return ref_ulp(x.double().sum(1), x.dtype) + 2 * u * x.double().abs().sum(1)


def ref_naive_sum(x: torch.Tensor, compensation_sign: int = 0) -> torch.Tensor:
    """Left to right in x.dtype, no compensation (the mistake); ``compensation_sign=1``: Kahan with the
    compensation added to the next term instead of subtracted (the other mistake)."""
    s = c = torch.zeros(x.shape[0], dtype=x.dtype)
    for j in range(x.shape[1]):
        y = x[:, j] + c if compensation_sign else x[:, j]
        t = s + y
        c, s = (t - s) - y, t
    return s


def _kahan_cases(gen, public):
    def case(rule, x):
        return Case(f"{rule}{': ' if rule else ''}{tuple(x.shape)} {str(x.dtype)[6:]}, values in "
                    f"[{float(x.min()):.3g}, {float(x.max()):.3g}]", dict(x=x))

    def rand(r, n, lo, hi, dtype=torch.float16):
        return (lo + (hi - lo) * torch.rand(r, n, generator=gen)).to(dtype)

    if public:
        return [case("", rand(4, 2048, 0, 1)), case("", rand(3, 1024, -0.25, 1)),
                case("", rand(4, 512, 0, 1, torch.bfloat16))]
    big_first = rand(3, randint(gen, 600, 1000), 0, 0.1)
    big_first[:, 0] = 1000.0
    return [case("positive values, sum past 1024", rand(3, randint(gen, 1500, 2500), 0, 1)),
            case("mixed signs, positive mean", rand(3, randint(gen, 800, 1500), -0.25, 1)),
            case("bfloat16", rand(3, randint(gen, 300, 700), 0, 1, torch.bfloat16)),
            case("a large value first", big_first),
            case("one column", rand(4, 1, -1, 1))]


def _kahan_judge(case, obs):
    x = case.inputs["x"]
    if obs.get("mutated"):
        return ("kahan_sum wrote into x (x[:, j] -= c, or another in-place op on a column view): the caller's data "
                "must not change. Keep the corrected term in a new tensor: y = x[:, j] - c.")
    if obs["forbidden"]:
        used = ", ".join(RUN._FORBIDDEN.get(op, op) for op in obs["forbidden"])
        return (f"kahan_sum used {used}: keep every operation in {x.dtype} (elementwise +, - on columns). The "
                "point is that the compensation recovers the accuracy without a wider accumulator.")
    if obs.get("dtypes"):
        return (f"kahan_sum made {', '.join(obs['dtypes'])} tensors: a wider accumulator (torch.zeros(..., "
                f"dtype=torch.float32), or type promotion when a float32 tensor meets {x.dtype} columns). Keep "
                f"every tensor in {x.dtype}: the compensation, not a wider type, recovers the accuracy.")
    got = obs["out"]
    if not isinstance(got, torch.Tensor) or got.shape != (x.shape[0],) or got.dtype != x.dtype:
        what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else got
        return f"kahan_sum returned {what}; expected ({x.shape[0]},) {x.dtype}: one sum per row, in the input's dtype."
    exact, tol = x.double().sum(1), kahan_tolerance(x)
    err = (got.double() - exact).abs()
    if bool((err <= tol).all()):
        return None
    row = int((err / tol).argmax())
    ulp = float(ref_ulp(exact[row:row + 1], x.dtype)[0])
    msg = (f"row {row}: your sum {float(got[row]):.6g}, the exact sum {float(exact[row]):.6g}: an error of "
           f"{float(err[row]) / ulp:.1f} ulps, over Kahan's bound of {float(tol[row]) / ulp:.1f} ulps here (one ulp "
           "plus 2u sum|x|).")
    naive = ("naive left-to-right summation: carry the compensation c (the low-order bits each addition lost, "
             "c = (t - s) - y) and subtract it from the next term", lambda: ref_naive_sum(x))
    flipped = ("Kahan with the compensation added to the next term: c = (t - s) - y is the error negated, so "
               "y = x_j - c", lambda: ref_naive_sum(x, compensation_sign=1))
    return diagnose(msg, got, [naive, flipped], torch.equal, "\n  Yours matches {}.")


KAHAN = Exercise("kahan_sum", 2, ("kahan_sum",), _kahan_cases, RUN._kahan_run, _kahan_judge,
                 title="Stretch: Kahan summation in fp16",
                 hint="s = c = zeros(R, dtype); for each column xj: y = xj - c; t = s + y; c = (t - s) - y; s = t. "
                      "No casts, no torch.sum.")

# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.measurements.show_measurements", "gpulab.precision.matmul_tflops",
           "gpulab.precision.replay_scaler", "gpulab.toy.ToyMLP", "gpulab.toy.toy_batch")
EXERCISES = [offering(ex, OFFERED) for ex in (FORMAT_LIMITS, CAST_REPORT, LOSS_SCALER, AMP_STEP, KAHAN)]
BENCHMARKS: list = []
