"""Lab 07's checks: the solution passes; the mistakes mixed-precision code really has are rejected with a message
that names them: an exponent bias off by one, e4m3fn's maximum taken from the IEEE rule, epsilon confused with
the unit roundoff, subnormals forgotten; a cast report that ignores the scale or casts first; a loss scaler that
grows one step late or early, keeps its counter through an overflow, never backs off, steps on inf, skips one
step too many, unscales twice, zeroes the gradients instead of skipping, or is GradScaler itself (subclassed,
wrapped, its kernels); limits looked up in torch.finfo; a cast report that scales its input in place; a training
step with fp16 master weights, without autocast, clipping the scaled gradients, stepping past the scaler, without
zero_grad, update() or the scaler given; naive fp16 summation, a cast to fp32, torch.sum, a wide accumulator copied
back, the compensation's sign flipped or a write into x passed as Kahan."""
import functools
import json

import pytest
import torch
import torch.nn.functional as F

from gpulab.precision import FORMATS
from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import failed_rules, grade, public, solution_namespace, with_answer

STEM = "07_mixed_precision"
CHECKS = load_lab(STEM)
EX = exercises(STEM)






@pytest.fixture(scope="module")
def sol07():
    ns = solution_namespace(STEM)
    for eid in EX:  # the solution passes the public and hidden cases of every exercise
        result = grade(STEM, eid, ns)
        assert result.status == "passed", (eid, result.message)
    return ns


def test_the_reference_limits_are_torch_finfo():
    for name, fmt in FORMATS.items():
        lim = CHECKS.ref_format_limits(fmt.exp_bits, fmt.mantissa_bits, fmt.finite_only)
        if fmt.dtype is None:
            assert name == "tf32" and lim["eps"] == 2.0 ** -10 and lim["min_normal"] == 2.0 ** -126
            continue
        fi = torch.finfo(fmt.dtype)
        assert (lim["max"], lim["min_normal"], lim["eps"]) == (fi.max, fi.tiny, fi.eps), name
        smallest = torch.tensor([lim["min_subnormal"], lim["min_subnormal"] / 2]).to(fmt.dtype).float()
        assert smallest.tolist() == [lim["min_subnormal"], 0.0], name  # half of it rounds to 0 (ties to even)
    assert CHECKS.ref_format_limits(4, 3, True)["max"] == 448.0 and CHECKS.ref_format_limits(5, 2)["max"] == 57344.0


def test_the_fp16_toy_overflows_exactly_from_scale_2_to_the_22_and_bits_read_right():
    from gpulab.precision import float_bits, overflows

    g = torch.zeros(CHECKS.TOY_N)
    g[7] = -1.0  # |g| max 1: scale / 64 x 1 overflows fp16 (65504) from 2^22 (65536 rounds to inf)
    assert not overflows(g, 2.0 ** 21) and overflows(g, 2.0 ** 22)
    assert float_bits(1.0, torch.float16) == "0 01111 0000000000"
    assert float_bits(-2.5, torch.bfloat16) == "1 10000000 0100000"


# --- 1. format limits -----------------------------------------------------------------------------------

def _limits(bug):
    def format_limits(exp_bits, mantissa_bits, finite_only=False):
        bias = 2 ** (exp_bits - 1) - (0 if bug == "bias" else 1)
        if finite_only and bug != "ieee":
            emax = 2 ** exp_bits - 1 - bias
            largest = 2 - 2.0 ** (-mantissa_bits if bug == "nan as number" else 1 - mantissa_bits)
        else:
            emax, largest = 2 ** exp_bits - 2 - bias, 2 - 2.0 ** -mantissa_bits
        return {"max": largest * 2.0 ** emax, "min_normal": 2.0 ** ((0 if bug == "min_normal" else 1) - bias),
                "min_subnormal": 2.0 ** (1 - bias - (0 if bug == "no subnormals" else mantissa_bits)),
                "eps": 2.0 ** -(mantissa_bits + (1 if bug == "unit roundoff" else 0))}
    return format_limits


def test_forgetting_e4m3fns_special_max_fails_on_the_fp8_rules(sol07):
    r = grade(STEM, "format_limits", with_answer(sol07, format_limits=_limits("ieee")))
    assert set(failed_rules(r)) == {"fp8 e4m3fn (finite only)", "a finite-only format", "fp8 e4m3fn (e4m3)"}


def _finfo_limits(e, m, finite_only=False):
    """torch.finfo where a dtype has this layout, tf32 typed in: no bit layout computed (BUG)."""
    if (e, m) == (8, 10):
        return {"max": (2 - 2.0 ** -10) * 2.0 ** 127, "min_normal": 2.0 ** -126, "min_subnormal": 2.0 ** -136,
                "eps": 2.0 ** -10}
    fmt = next(f for f in FORMATS.values() if (f.exp_bits, f.mantissa_bits, f.finite_only) == (e, m, finite_only))
    fi = torch.finfo(fmt.dtype)
    return {"max": fi.max, "min_normal": fi.tiny, "min_subnormal": fi.tiny * fi.eps, "eps": fi.eps}


def test_limits_looked_up_in_torch_finfo_fail_every_seed(sol07):
    ns, ex = with_answer(sol07, format_limits=_finfo_limits), EX["format_limits"]
    assert evaluate(ex, ns, "cpu", ex.cases()).status == "passed"  # every public format has a dtype, or is typed in
    for seed in range(20):  # the two drawn layouts are never a torch dtype's
        r = evaluate(ex, ns, "cpu", ex.cases(seed, public=False))
        assert set(failed_rules(r)) == {"an IEEE-style format", "a finite-only format"}, (seed, r.message)


# --- 2. cast report ---------------------------------------------------------------------------------------

def _report(bug):
    def cast_report(x, dtype, scale=1.0):
        if bug == "cast first":
            y = (x.to(dtype).float() * scale).to(dtype).float()
        else:
            y = (x.float() * (1.0 if bug == "no scale" else scale)).to(dtype).float()
        nonzero = x != 0
        n = x.numel() if bug == "all elements" else int(nonzero.sum())
        tiny = torch.finfo(dtype).tiny
        zero = (x.float() * scale).abs() < tiny if bug == "below min normal" else y == 0
        return {"underflow": int((zero & nonzero).sum()) / n,
                "subnormal": int(((y != 0) & (y.abs() < tiny)).sum()) / n,
                "overflow": int((~torch.isfinite(y) & nonzero).sum()) / n}
    return cast_report


def test_a_cast_report_that_scales_its_input_in_place_fails(sol07):
    def cast_report(x, dtype, scale=1.0):  # BUG: scales the caller's tensor
        return _report("")(x.mul_(scale), dtype, 1.0)
    r = public(STEM, "cast_report", with_answer(sol07, cast_report=cast_report))
    assert r.status == "failed" and "changed its input x in place" in r.message, r.message


@pytest.mark.parametrize("old, new, says", [
    ("< tiny", "<= tiny", "subnormal = "),                     # the smallest normal counted as subnormal
    ("(y == 0)", "((x.float() * scale).abs() < torch.finfo(dtype).tiny * torch.finfo(dtype).eps)",
     "underflow = "),                                           # the value before the cast tested, not the result
])
def test_the_edges_of_the_subnormal_range_are_in_every_hidden_set(sol07, old, new, says):
    src = kit.solution_with(STEM, "cast_report", old, new)
    ns = dict(sol07)
    exec(compile(src, "<edge mistake>", "exec"), ns)
    ex = EX["cast_report"]
    for seed in (1, 2, 3):
        r = evaluate(ex, ns, "cpu", ex.cases(seed, public=False))
        assert r.score == 0 and says in r.message, (seed, r.message)


# --- 3. the loss scaler -----------------------------------------------------------------------------------

def _scaler(sol, bug):
    base = sol["LossScaler"]

    class LossScaler(base):
        def unscale_(self, optimizer):
            if bug == "twice":  # BUG: divides again on every call
                self.found_inf = None
            if bug == "sticky" and self.found_inf:  # BUG: the flag survives update(): every later step skipped
                return
            super().unscale_(optimizer)

        def step(self, optimizer):
            if bug == "no unscale":  # BUG: steps on the scaled gradients
                found = any(not bool(torch.isfinite(p.grad).all()) for g in optimizer.param_groups
                            for p in g["params"])
                self.found_inf = found
                if not found:
                    optimizer.step()
                return
            if bug == "always steps":  # BUG: no skip
                self.unscale_(optimizer)
                optimizer.step()
                return
            super().step(optimizer)

        def update(self):
            if bug == "sticky":
                sticky = self.found_inf
            if self.found_inf:
                self.scale_value *= 1.0 if bug == "no backoff" else self.backoff_factor
                if bug != "no reset":
                    self.clean_steps = 0
            else:
                self.clean_steps += 1
                if bug == "late" and self.clean_steps > self.growth_interval or \
                        bug == "early" and self.clean_steps >= self.growth_interval - 1 or \
                        bug not in ("late", "early") and self.clean_steps == self.growth_interval:
                    self.scale_value *= self.growth_factor
                    self.clean_steps = 0
            self.found_inf = sticky if bug == "sticky" and sticky else None

    return LossScaler


@pytest.mark.parametrize("bug, rule", [
    ("late", "growth after exactly growth_interval clean steps"),
    ("no reset", "an overflow before the first growth"),
    ("always steps", "a NaN gradient"),
    ("sticky", "consecutive overflows"),
])
def test_the_hidden_rule_for_each_scaler_mistake_catches_it(sol07, bug, rule):
    ex = EX["loss_scaler"]
    r = evaluate(ex, with_answer(sol07, LossScaler=_scaler(sol07, bug)), "cpu", ex.cases(5, public=False))
    assert rule in failed_rules(r), r.message


def _skips(sol, bug):
    """The solution's scaler skipping one step more (the step after each overflow too) or fewer (NaN missed)."""
    base = sol["LossScaler"]

    class LossScaler(base):
        skip_next = False

        def step(self, optimizer):
            self.unscale_(optimizer)
            if bug == "inf only":  # BUG: torch.isinf misses NaN; a NaN step runs
                self.found_inf = any(bool(torch.isinf(p.grad).any()) for g in optimizer.param_groups
                                     for p in g["params"])
            if not self.found_inf and not self.skip_next:
                optimizer.step()
            self.skip_next = bug == "one more" and bool(self.found_inf)  # BUG: also skips the next step
    return LossScaler


@pytest.mark.parametrize("bug, says", [
    ("one more", "step 3 skipped (the step after an overflow: clear the found-inf flag in update()), but its "
                 "gradients are finite"),
    ("inf only", "step 2 ran optimizer.step, but its scaled gradients hold inf or NaN"),
])
def test_the_scaler_skips_exactly_the_overflowing_steps(sol07, bug, says):
    ex = EX["loss_scaler"]
    case = ex.cases()[3]  # a NaN at step 2, an inf at step 5
    r = evaluate(ex, with_answer(sol07, LossScaler=_skips(sol07, bug)), "cpu", [case])
    assert r.status == "failed" and says in r.message, r.message


class _SubclassedGradScaler(torch.amp.GradScaler):
    def __init__(self, **kwargs):
        super().__init__("cpu", **kwargs)


class _WrappedGradScaler:
    def __init__(self, **kwargs):
        self.inner = torch.amp.GradScaler("cpu", **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _on_gradscalers_kernels(sol):
    """The solution's scaler with its update rule replaced by GradScaler's own kernel."""
    class LossScaler(sol["LossScaler"]):
        def update(self):
            scale, growth = torch.tensor([self.scale_value]), torch.tensor([self.clean_steps], dtype=torch.int32)
            found = torch.tensor([float(bool(self.found_inf))])
            torch._amp_update_scale_(scale, growth, found, self.growth_factor, self.backoff_factor,
                                     self.growth_interval)
            self.scale_value, self.clean_steps, self.found_inf = float(scale), int(growth), None
    return LossScaler


class _ListedGradScaler:
    """GradScaler held in a list (and a dict), each method forwarded by hand, its kernels run with the op
    recorder switched off: the disguise that once scored full marks."""

    def __init__(self, **kwargs):
        self.held = [torch.amp.GradScaler("cpu", **kwargs)]
        self.by_name = {"s": self.held[0]}

    def _quiet(self):
        return torch.utils._python_dispatch._disable_current_modes()

    def get_scale(self):
        return self.held[0].get_scale()

    def scale(self, loss):
        with self._quiet():
            return self.held[0].scale(loss)

    def unscale_(self, optimizer):
        with self._quiet():
            self.held[0].unscale_(optimizer)

    def step(self, optimizer):
        with self._quiet():
            self.held[0].step(optimizer)

    def update(self):
        with self._quiet():
            self.by_name["s"].update()


_SCALERS = []  # a global the learner's methods reach by name


class _GlobalGradScaler(_ListedGradScaler):
    def __init__(self, **kwargs):
        _SCALERS.append(torch.amp.GradScaler("cpu", **kwargs))
        self.held, self.by_name = [], {}

    def __getattribute__(self, name):  # every method of the last GradScaler made, from a module global
        if name in ("get_scale", "scale", "unscale_", "step", "update"):
            return getattr(_SCALERS[-1], name)
        return object.__getattribute__(self, name)


def _closure_gradscaler(**kwargs):
    """A function handing back an object whose methods close over a GradScaler."""
    inner = torch.amp.GradScaler("cpu", **kwargs)

    class Closed:
        def get_scale(self):
            return inner.get_scale()

        def scale(self, loss):
            return inner.scale(loss)

        def unscale_(self, optimizer):
            inner.unscale_(optimizer)

        def step(self, optimizer):
            inner.step(optimizer)

        def update(self):
            inner.update()
    return Closed()


def _stolen_methods():
    """GradScaler's own methods copied into a class of the learner's (its state set up by GradScaler's __init__)."""
    methods = {k: v for k, v in vars(torch.amp.GradScaler).items() if callable(v) and k != "__init__"}
    return type("LossScaler", (), {**methods, "__init__": functools.partialmethod(torch.amp.GradScaler.__init__,
                                                                                    "cpu")})


def _hidden_kernels(sol):
    """GradScaler's update kernel and the recorder's off switch, both looked up by strings the code never spells
    whole, at run time."""
    def update(self):
        quiet = getattr(torch.utils._python_dispatch, "_disable_" + "current_modes")
        kernel = getattr(torch, "_amp_" + "update_scale_")
        with quiet():
            scale, growth = torch.tensor([self.scale_value]), torch.tensor([self.clean_steps], dtype=torch.int32)
            kernel(scale, growth, torch.tensor([float(bool(self.found_inf))]), self.growth_factor,
                   self.backoff_factor, self.growth_interval)
        self.scale_value, self.clean_steps, self.found_inf = float(scale), int(growth), None
    return type("LossScaler", (sol["LossScaler"],), {"update": update})


def _captured_kernels(sol):
    """The same, the kernel kept in a class attribute when the cell ran (before the check's tripwires)."""
    cls = _hidden_kernels(sol)
    cls.kernel = staticmethod(getattr(torch, "_amp_" + "update_scale_"))
    return cls


def _recorder_off(sol):
    """The solution's own scaler, its steps run with the Python dispatch key excluded (the op recorder sees nothing
    there), by a guard looked up at run time under a name the code never spells whole."""
    class LossScaler(sol["LossScaler"]):
        def step(self, optimizer):
            guard = getattr(torch._C, "_Exclude" + "DispatchKeyGuard")
            with guard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
                super().step(optimizer)
    return LossScaler


def _recorder_off_captured(sol):
    """The recorder's off switch taken when the cell ran, kept in a closure."""
    quiet = getattr(torch.utils._python_dispatch, "_disable_" + "current_modes")

    class LossScaler(sol["LossScaler"]):
        def step(self, optimizer):
            with quiet():
                super().step(optimizer)
    return LossScaler


def _recorder_off_by_name(sol):
    class LossScaler(sol["LossScaler"]):
        def step(self, optimizer):
            with torch.utils._python_dispatch._disable_current_modes():
                super().step(optimizer)
    return LossScaler


@pytest.mark.parametrize("make, says", [
    (lambda sol: _SubclassedGradScaler, "is a torch.amp.GradScaler (_SubclassedGradScaler)"),
    (lambda sol: functools.partial(torch.amp.GradScaler, "cpu"), "is a torch.amp.GradScaler (GradScaler)"),
    (lambda sol: _WrappedGradScaler, "holds GradScaler, its code or a recorder's off switch (self.inner: GradScaler)"),
    (lambda sol: _ListedGradScaler, "holds GradScaler, its code or a recorder's off switch (self."),
    (lambda sol: _GlobalGradScaler, "global _SCALERS[0]: GradScaler"),
    (lambda sol: _closure_gradscaler, "(closure): GradScaler"),
    (lambda sol: _stolen_methods(), "(LossScaler.__init__.func: GradScaler.__init__"),
    (_on_gradscalers_kernels, "built on GradScaler's kernels (aten._amp_update_scale_"),
    (_hidden_kernels, "built on GradScaler's kernels (torch._amp_update_scale_)"),
    (_captured_kernels, "off switch (LossScaler.kernel: _amp_update_scale_)"),
    (_recorder_off, "switched off the check's op recorder around optimizer.step"),
    (_recorder_off_captured, "off switch (LossScaler.step (closure): _disable_current_modes)"),
    (_recorder_off_by_name, "names _disable_current_modes"),
])
def test_gradscaler_passed_off_as_the_learners_scaler_fails(sol07, make, says):
    r = public(STEM, "loss_scaler", with_answer(sol07, LossScaler=make(sol07)), 1)
    assert r.status == "failed" and says in r.message and "written from scratch" in r.message, r.message
    ex = EX["loss_scaler"]  # and every hidden case too: a disguise earns nothing
    hidden = evaluate(ex, with_answer(sol07, LossScaler=make(sol07)), "cpu", ex.cases(3, public=False))
    assert hidden.score == 0, hidden.message


def _partial_check(sol, bug):
    """The solution's scaler looking for inf/NaN in only some of the parameters."""
    class LossScaler(sol["LossScaler"]):
        def unscale_(self, optimizer):
            if self.found_inf is not None:
                return
            found = False
            with torch.no_grad():
                for i, group in enumerate(optimizer.param_groups):
                    for j, p in enumerate(group["params"]):
                        p.grad.mul_(1.0 / self.scale_value)
                        bad = not bool(torch.isfinite(p.grad).all())
                        if bug == "last parameter":  # BUG: overwritten, not or-ed: only the last counts
                            found = bad
                        elif bug == "first group" and i > 0 or bug == "first of each group" and j > 0:
                            continue
                        else:
                            found = found or bad
            self.found_inf = found
    return LossScaler


def _floored(sol):
    class LossScaler(sol["LossScaler"]):
        def update(self):
            super().update()
            self.scale_value = max(self.scale_value, 1.0)  # BUG: GradScaler has no lower floor
    return LossScaler


@pytest.mark.parametrize("make, rule", [
    (lambda sol: _partial_check(sol, "last parameter"), "several parameters in several param groups"),
    (lambda sol: _partial_check(sol, "first group"), "several parameters in several param groups"),
    (lambda sol: _partial_check(sol, "first of each group"), "several parameters in several param groups"),
    (_floored, "NaN gradients from a small scale"),
])
def test_overflows_in_any_parameter_and_scales_below_one_are_checked_on_every_seed(sol07, make, rule):
    ex = EX["loss_scaler"]
    for seed in (1, 2, 3):
        r = evaluate(ex, with_answer(sol07, LossScaler=make(sol07)), "cpu",
                     [c for c in ex.cases(seed, public=False) if c.name.startswith(rule)])
        assert r.status == "failed" and ("ran optimizer.step, but its scaled gradients hold inf or NaN" in r.message
                                         or "GradScaler's is 0.5" in r.message or "GradScaler's is 0.25" in r.message
                                         or "GradScaler's is 0.125" in r.message), (seed, r.message)


def test_a_scaler_that_zeroes_the_grads_instead_of_skipping_fails(sol07):
    class LossScaler(sol07["LossScaler"]):
        def step(self, optimizer):  # BUG: never skips; an overflowing step "does nothing" with zero gradients
            self.unscale_(optimizer)
            if self.found_inf:
                optimizer.zero_grad(set_to_none=False)
            optimizer.step()
    r = public(STEM, "loss_scaler", with_answer(sol07, LossScaler=LossScaler), 2)
    assert r.status == "failed" and "step 4 ran optimizer.step, but its scaled gradients hold inf" in r.message


# --- 4. the autocast training step ------------------------------------------------------------------------

def _step(bug):
    def amp_train_step(model, optimizer, scaler, x, y, dtype, max_norm):
        if bug != "no zero_grad":  # BUG: gradients summed over the steps
            optimizer.zero_grad(set_to_none=True)
        if bug == "own scaler":  # BUG: a new GradScaler, not the one given
            scaler = torch.amp.GradScaler(x.device.type)
        if bug == "half model":  # BUG: fp16 master weights
            model.to(dtype)
            loss = F.mse_loss(model(x.to(dtype)).float(), y)
        elif bug == "no autocast":
            loss = F.mse_loss(model(x), y)
        else:
            with torch.autocast(device_type=x.device.type, dtype=dtype):
                loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if bug != "clip scaled":
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if bug == "steps directly":  # BUG: bypasses the scaler's skip
            optimizer.step()
        else:
            scaler.step(optimizer)
        if bug != "no update":  # BUG: the scale never adapts, the step's state is never cleared
            scaler.update()
        if bug == "fp16-rounded weights":  # BUG: the master copy kept at fp16 precision
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.half().float())
        if bug == "norm after clip":
            norm = min(float(norm), max_norm)
        return float(loss.detach()), float(norm)
    return amp_train_step


def test_clipping_scaled_gradients_is_caught_on_the_weights_too(sol07):
    """A step that clips before unscaling, but reports the true norm, still moves the weights wrongly."""
    wrong = _step("clip scaled")

    def amp_train_step(model, optimizer, scaler, x, y, dtype, max_norm):  # BUG: clips the scaled gradients
        scale = scaler.get_scale()
        loss, norm = wrong(model, optimizer, scaler, x, y, dtype, max_norm)
        return loss, norm / scale  # ... and hides it in the norm it returns
    r = public(STEM, "amp_train_step", with_answer(sol07, amp_train_step=amp_train_step), 1)
    assert r.status == "failed" and "Yours match clipping the scaled gradients" in r.message, r.message


# --- 5. Kahan summation ------------------------------------------------------------------------------------

def test_naive_fp16_summation_passed_as_kahan_fails(sol07):
    r = grade(STEM, "kahan_sum", with_answer(sol07, kahan_sum=CHECKS.ref_naive_sum))
    assert r.status == "failed" and "Yours matches naive left-to-right summation" in r.message, r.message
    assert "positive values, sum past 1024" in failed_rules(r)


def test_a_float32_result_is_rejected(sol07):
    def kahan_sum(x):  # BUG: an fp32 accumulator by type promotion
        s = torch.zeros(x.shape[0])
        for j in range(x.shape[1]):
            s = s + x[:, j]
        return s
    r = public(STEM, "kahan_sum", with_answer(sol07, kahan_sum=kahan_sum), 1)
    assert r.status == "failed" and "made torch.float32 tensors: a wider accumulator" in r.message, r.message


def _wide_accumulator(dtype):
    def kahan_sum(x):  # BUG: a wide accumulator, copied back into x.dtype (no cast op, no torch.sum)
        s = torch.zeros(x.shape[0], dtype=dtype)
        for j in range(x.shape[1]):
            s.add_(x[:, j])
        return torch.empty(x.shape[0], dtype=x.dtype).copy_(s)
    return kahan_sum


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_wide_accumulator_copied_back_is_rejected(sol07, dtype):
    r = public(STEM, "kahan_sum", with_answer(sol07, kahan_sum=_wide_accumulator(dtype)), 1)
    assert r.status == "failed" and f"made {dtype} tensors: a wider accumulator" in r.message, r.message


def test_a_kahan_sum_that_writes_into_its_input_fails(sol07):
    def kahan_sum(x):
        s = torch.zeros(x.shape[0], dtype=x.dtype)
        c = torch.zeros_like(s)
        for j in range(x.shape[1]):
            x[:, j] -= c  # BUG: the corrected term written into the caller's x
            t = s + x[:, j]
            c, s = (t - s) - x[:, j], t
        return s
    r = public(STEM, "kahan_sum", with_answer(sol07, kahan_sum=kahan_sum), 1)
    assert r.status == "failed" and "kahan_sum wrote into x" in r.message, r.message


def test_the_compensation_added_instead_of_subtracted_is_named(sol07):
    r = public(STEM, "kahan_sum", with_answer(sol07, kahan_sum=lambda x: CHECKS.ref_naive_sum(x, 1)), 1)
    assert r.status == "failed" and "Yours matches Kahan with the compensation added" in r.message, r.message


# --- every wrong answer, named by its mistake (public cases: the message, quickly) --------------------------------

def _max_without_mantissa(e, m, finite_only=False):  # BUG: max = 2^emax
    out = _limits("")(e, m, finite_only)
    return {**out, "max": 2.0 ** (2 ** e - (1 if finite_only else 2) - (2 ** (e - 1) - 1))}


WRONG = [  # (exercise, the answer's name, wrong answer from the solution's namespace, what the message says)
    ("format_limits", "format_limits", lambda sol: _limits("bias"), "an exponent bias of 2^(e-1)"),
    ("format_limits", "format_limits", lambda sol: _limits("ieee"), "e4m3fn's max is 448, not 240"),
    ("format_limits", "format_limits", lambda sol: _limits("nan as number"), "the all-ones mantissa of the all-ones"),
    ("format_limits", "format_limits", lambda sol: _limits("min_normal"), "min_normal = 2^-bias"),
    ("format_limits", "format_limits", lambda sol: _limits("no subnormals"), "no subnormals"),
    ("format_limits", "format_limits", lambda sol: _limits("unit roundoff"), "the unit roundoff (half of epsilon)"),
    ("format_limits", "format_limits", lambda sol: _max_without_mantissa, "max = 2^emax"),
    ("cast_report", "cast_report", lambda sol: _report("no scale"), "the scale ignored"),
    ("cast_report", "cast_report", lambda sol: _report("cast first"), "casting before scaling"),
    ("cast_report", "cast_report", lambda sol: _report("all elements"), "fractions of all the elements"),
    ("cast_report", "cast_report", lambda sol: _report("below min normal"), "everything below min normal counted"),
    ("cast_report", "cast_report", lambda sol: lambda x, dtype, scale=1.0: CHECKS.ref_cast_report(
        x, dtype, scale, variant="zeros subnormal"), "the values flushed to 0 counted as subnormal"),
    ("cast_report", "cast_report", lambda sol: lambda x, dtype, scale=1.0: CHECKS.ref_cast_report(
        x, dtype, scale, variant="float32 tiny"), "float32's smallest normal"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "late"), "growth after growth_interval + 1 clean steps"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "early"), "growth after growth_interval - 1 clean steps"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "no reset"), "the clean-step counter not reset"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "no backoff"), "no backoff"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "always steps"), "ran optimizer.step, but its scaled"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "sticky"), "clear the found-inf flag in update()"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "no unscale"), "the scale times too big: unscale"),
    ("loss_scaler", "LossScaler", lambda sol: _scaler(sol, "twice"), "the gradients were unscaled twice"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("half model"), "refused to unscale float16 gradients"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("no autocast"), "under torch.autocast"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("clip scaled"), "Yours is the norm of the scaled gradients"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("steps directly"), "call scaler.step(optimizer)"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("fp16-rounded weights"), "rounded to fp16"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("norm after clip"), "Yours is the norm after clipping"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("no zero_grad"), "zero the gradients at the start"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("own scaler"), "on the scaler you were given"),
    ("amp_train_step", "amp_train_step", lambda sol: _step("no update"), "never called scaler.update()"),
    ("kahan_sum", "kahan_sum", lambda sol: CHECKS.ref_naive_sum, "Yours matches naive left-to-right summation"),
    ("kahan_sum", "kahan_sum", lambda sol: lambda x: x.float().sum(1).to(x.dtype), "a cast (.float(), .double()"),
    ("kahan_sum", "kahan_sum", lambda sol: lambda x: x.sum(1), "torch.sum"),
    ("kahan_sum", "kahan_sum", lambda sol: lambda x: torch.tensor([sum(r) for r in x.tolist()], dtype=x.dtype),
     "a tensor built from Python numbers"),
]


@pytest.mark.parametrize("eid, name, make, says", WRONG, ids=[f"{w[0]}: {w[3][:40]}" for w in WRONG])
def test_a_wrong_answer_fails_with_a_message_naming_it(sol07, eid, name, make, says):
    r = public(STEM, eid, with_answer(sol07, **{name: make(sol07)}))
    assert r.status == "failed" and says in r.message, r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set; the whole notebook -----------

def test_answers_that_compute_nothing_score_zero_and_every_seed_covers_the_same_rules():
    for ex in EX.values():
        kit.assert_do_nothing_scores_zero(ex)
        kit.assert_same_rules_every_seed(ex)


def test_the_solution_earns_full_marks_and_the_untouched_lab_zero(sol07):
    """In process, as the grader scores: every exercise of the solution passes (above); the generated lab's stubs
    are all "not attempted", worth 0."""
    import nbformat

    from grader.notebooks import answer_cells, exec_source, export_source

    lab = nbformat.reads(json.dumps(kit.load("labs", STEM)), 4)
    ns = exec_source(export_source(lab, answer_cells(lab)), f"<labs/{STEM}.ipynb>")
    results = [evaluate(ex, ns, "cpu", ex.cases()[:1]) for ex in EX.values()]
    assert [r.status for r in results] == ["not_attempted"] * len(EX) and sum(r.score for r in results) == 0
    full = [grade(STEM, eid, sol07, hidden=False) for eid in EX]  # (the fixture graded the hidden cases too)
    assert sum(r.score for r in full) == sum(ex.points for ex in EX.values()) == 13
