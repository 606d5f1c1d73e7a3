"""grader.kit.kernels and gpulab.launches: what one observed call of a kernel wrapper records, the
interpreter's bounds check, the guard regions that stand in for it on a GPU, the ablated run, and
the verdict ladder."""
import pytest
import torch
import triton
import triton.language as tl

import grader.kit.kernels as kc
import grader.runs.observe as observe
from gpulab import launches
from gpulab.compare import GUARD, MAX_BLOCK, compare, guard_elements, padded
from tests.conftest import ROOT


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _add_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


@triton.jit
def _copy_unmasked(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def _observe(fn, n=1000, dtype=torch.float32, pad=None, **kw):
    gen = torch.Generator().manual_seed(0)
    x, y = (padded(torch.randn(n, generator=gen).to(dtype), guard=pad) for _ in range(2))
    want = x.double() + y.double()
    call = observe.observe_kernel(lambda out: fn(x, y, out), {"out": ((n,), dtype)}, "cpu", inputs={"x": x, "y": y},
                                  **kw)
    return call, want


def _launch(kernel, block=256):
    def fn(x, y, out):
        kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
        return out
    return fn


def test_a_right_kernel_is_observed_as_right():
    call, want = _observe(_launch(_add))
    obs = call.as_obs()
    assert obs["launches"] == ["_add"] and obs["own_launches"] == ["_add"] and obs["returned_out"]
    assert obs["guard"] is None and obs["oob_read"] is None and obs["written_outside"] == []
    assert compare(obs["out"], want, dtype=torch.float32) is None
    assert torch.isnan(obs["ablated"]["out"]).all()  # without the kernel, nothing was written


def test_the_interpreter_never_touches_memory_outside_the_storages():
    # x has one element in a storage of one element: an unmasked 1024-wide load would read 4 KiB of
    # whatever follows it (or fault). The watch turns those lanes off: they read 0, and are reported.
    x, out = torch.full((1,), 5.0), torch.full((1024,), -1.0)
    with launches.watch_launches() as seen:
        _copy_unmasked[(1,)](x, out, BLOCK=1024)
    assert out[0] == 5.0 and bool((out[1:] == 0).all())
    assert seen.first_out_of_bounds(writes=True) is None
    report = seen.first_out_of_bounds(writes=False)
    assert "read 1023 element(s) past the end of `x_ptr`, which has 1 element (the first at index 1)" in report


@triton.jit
def _fill_unmasked(out_ptr, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.full((BLOCK,), 1.0, tl.float32))


def test_writes_past_the_storage_are_not_performed():
    out = torch.zeros(1024)
    with launches.watch_launches() as seen:
        _fill_unmasked[(1,)](out, BLOCK=MAX_BLOCK)  # would write 4 MiB past `out` (the heap, then a fault)
    assert bool((out == 1).all())
    assert "wrote 1047552 element(s) past the end of `out_ptr`" in seen.first_out_of_bounds(writes=True)


def test_guard_regions_are_long_where_nothing_checks_the_accesses():
    assert guard_elements("cpu") == GUARD and guard_elements("cuda") == MAX_BLOCK


def test_without_the_bounds_check_the_guard_regions_hold_the_largest_block(monkeypatch):
    # On a GPU kernels are compiled and nothing checks their accesses: the padding after every input
    # and the guard region after every output must hold everything a block of MAX_BLOCK can touch.
    plain = launches.watch_launches
    monkeypatch.setattr(observe, "watch_launches", lambda **kw: plain(**{**kw, "check_bounds": False}))
    call, _ = _observe(_launch(_add_unmasked, MAX_BLOCK), n=1, pad=MAX_BLOCK, guard=MAX_BLOCK)
    assert call.out_of_bounds.startswith("out: the kernel wrote 1048575 element(s) past the end of the tensor")
    assert call.out_of_bounds_read is None  # nobody watched the reads: they stayed inside the padding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_an_unmasked_store_is_reported_with_the_kernel_and_its_argument(dtype):
    call, _ = _observe(_launch(_add_unmasked, 1024), n=1000, dtype=dtype)
    assert call.out_of_bounds == ("kernel `_add_unmasked` wrote 24 element(s) past the end of `out_ptr` (the `out` "
                                  "tensor), which has 1000 elements (the first at index 1000). A store is missing its "
                                  "mask `offs < n`.")


def test_version_counter_moves_for_pytorch_writes_not_for_kernel_writes():
    def fn(x, y, out):
        _launch(_add)(x, y, out)
        return out
    assert _observe(fn)[0].written_outside == []

    def torch_too(x, y, out):
        _launch(_add)(x, y, out)
        out.mul_(1.0)
        return out
    assert _observe(torch_too)[0].written_outside == ["out"]


def test_a_kernel_writing_scratch_that_pytorch_finishes_is_not_called_outside_work():
    # Honest two-stage work: the kernel fills a scratch tensor, PyTorch copies it. Under ablation the
    # fresh scratch holds poison (never the first call's values left in reused memory), so `out` is wrong.
    def fn(x, y, out):
        scratch = torch.empty_like(x)
        _launch(_add)(x, y, scratch)
        return out.copy_(scratch)
    call, want = _observe(fn)
    obs = call.as_obs()
    assert compare(obs["out"], want, dtype=torch.float32) is None and torch.isnan(obs["ablated"]["out"]).all()
    assert kc.outside_verdict(obs, "fn", lambda o: compare(o["out"], want, dtype=torch.float32) is None) is None


def test_ablation_leaves_the_learners_own_tensors_alone():
    table = torch.arange(1000.0)  # a learner's cached tensor, passed to the kernel

    def fn(x, y, out):
        _launch(_add)(x, table, out)
        return out
    _observe(fn)
    assert torch.equal(table, torch.arange(1000.0))


def test_own_kernels_are_the_learners():
    import os

    import gpulab

    assert launches.is_own_kernel(_add)  # a file outside gpulab, grader and the installation

    def relabelled(filename):
        k = triton.jit(_add.fn)
        k.fn = _add.fn.__class__(_add.fn.__code__.replace(co_filename=filename), _add.fn.__globals__, "_add")
        return k
    assert launches.is_own_kernel(relabelled("<answer cell vector_add>"))
    assert not launches.is_own_kernel(relabelled("<lab setup>"))
    assert not launches.is_own_kernel(relabelled(os.path.join(os.path.dirname(gpulab.__file__), "x.py")))
    assert not launches.is_own_kernel(relabelled(str(ROOT / "grader" / "checks" / "x.py")))
    assert not launches.is_own_kernel(relabelled(os.path.join(os.path.dirname(torch.__file__), "x.py")))
    assert not launches.is_own_kernel(relabelled("/tmp/torchinductor_me/ab/cab.py"))


def test_record_launches_still_lists_names_and_checks_nothing():
    x = torch.full((1,), 5.0)
    out = torch.zeros(2)
    with launches.record_launches() as names:
        _copy_unmasked[(1,)](x[:1], out[:1], BLOCK=1)
    assert names == ["_copy_unmasked"]


# --- the ladder -----------------------------------------------------------------------------------

def _obs(**kw):
    want = torch.ones(3)
    base = {"out": want.clone(), "output_names": ["out"], "launches": ["k"], "own_launches": ["k"], "guard": None,
            "oob_read": None, "returned_out": True, "written_outside": [], "rejected": None, "inputs_after": {},
            "ablated": {"out": torch.full((3,), float("nan"))}}
    return {**base, **kw}, want


def _judge(obs, want):
    from grader.exercise import Case

    return kc.judge_kernel(Case("c", {}), obs, "fn", lambda o: compare(o["out"], want, dtype=torch.float32, name="fn"))


@pytest.mark.parametrize("change, stage, phrase", [
    ({}, None, None),
    ({"launches": [], "own_launches": []}, "no_launch", "no Triton kernel was launched: fn must compute"),
    ({"own_launches": []}, "not_own", "(`k`) are not yours"),
    ({"ablated": {"out": torch.ones(3)}}, "outside", "even when your kernels do not run"),
    ({"guard": "out: the kernel wrote 1 element(s) past the end"}, "out_of_bounds", "past the end"),
    ({"returned_out": False}, "not_returned", "and return `out`"),
    ({"out": torch.zeros(3), "oob_read": "kernel `k` read 1 element(s) past the end of `x_ptr`"}, "mismatch",
     "Also, kernel `k` read"),
    ({"oob_read": "kernel `k` read 1 element(s) past the end of `x_ptr`."}, "out_of_bounds_read", "is right, but"),
])
def test_the_ladder_gives_one_verdict_per_rung(change, stage, phrase):
    obs, want = _obs(**change)
    verdict = _judge(obs, want)
    if stage is None:
        assert verdict is None
    else:
        assert verdict.stage == stage and phrase in verdict, verdict


def test_zero_outputs_are_never_called_outside_work():
    obs, _ = _obs(out=torch.zeros(3), ablated={"out": torch.zeros(3)})  # a wrapper that zero-fills first
    assert _judge(obs, torch.zeros(3)) is None


def test_the_ablated_run_sees_the_inputs_as_they_were_before_the_call():
    # A wrapper that computes in place into its input, then copies: its kernel did the work, the
    # ablated run must not find the previous call's result in x; and x stays as the call left it.
    def fn(x, y, out):
        _launch(_add)(x, y, x)
        return out.copy_(x)
    call, want = _observe(fn)
    obs = call.as_obs()
    assert compare(obs["out"], want, dtype=torch.float32) is None
    assert compare(obs["ablated"]["out"], want, dtype=torch.float32) is not None
    assert compare(obs["inputs_after"]["x"], want, dtype=torch.float32) is None  # x holds x + y: modified


def test_a_backward_that_lets_autograd_do_the_work_earns_nothing():
    # Lab 05's stretch: a no-op kernel launched in backward, the gradients from PyTorch autograd.
    from grader.checks import exercises
    from grader.exercise import evaluate

    @triton.jit
    def nothing(ptr):
        pass

    def scores(q, k, causal, scale):
        s = scale * q.float() @ k.float().transpose(-1, -2)  # (B, H, Sq, Sk)
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        return s

    def attention(q, k, v, causal, scale):
        return (torch.softmax(scores(q, k, causal, scale), -1) @ v.float()).to(q.dtype)

    class Cheat(torch.autograd.Function):  # FlashAttentionFunction.apply(q, k, v, causal=False, scale=None)
        @staticmethod
        def forward(ctx, q, k, v, causal=False, scale=None):
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            ctx.causal, ctx.scale = causal, scale
            out = attention(q, k, v, causal, scale)
            lse = torch.logsumexp(scores(q, k, causal, scale), -1)  # (B, H, Sq)
            ctx.save_for_backward(q, k, v, out, lse)  # what a real forward saves
            return out

        @staticmethod
        def backward(ctx, dout):
            nothing[(1,)](dout)  # a launch for show
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors[:3]]
                grads = torch.autograd.grad(attention(*leaves, ctx.causal, ctx.scale), leaves, dout)
            return (*grads, None, None)

    def flash_attention_autograd(q, k, v, causal=False, scale=None):
        return Cheat.apply(q, k, v, causal, scale)

    ex = exercises("05_flash_attention")["flash_backward"]
    ns = {"flash_attention_autograd": flash_attention_autograd, "FlashAttentionFunction": Cheat}
    r = evaluate(ex, ns, "cpu", ex.cases()[:2])
    assert r.status == "failed" and r.score == 0 and "even when your kernels do not run" in r.message, r.message
