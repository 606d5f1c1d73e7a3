"""Lab 11's checks: the solution passes; summed gradients, unbroadcast buffers and frozen parameters,
gradients all-reduced twice, all-reduces after backward (or blocking, or launched only once backward
is over), buckets ignoring their limit, a ring without its all-gather phase (or sending whole
tensors), a sharded optimizer keeping the whole state, a bucket left unlaunched because a parameter got
no gradient, a param group added after construction left without owners and a hung rank are all
rejected; so are a per-parameter DDP that blocks in its hook, all-reduces after backward, flattens
everything into one all-reduce, ignores its process_group or forgets a parameter without gradient,
and an FSDP that all-reduces its gradients, never frees what it gathered (or lets autograd keep it),
sums instead of averaging, drops the padding tail, divides by the world instead of its group, or lets
the optimizer step on full parameters. The solution itself trains right with an unused parameter and
with a late param group.

Each distributed case is one launch of real gloo ranks (2 to 4 processes importing torch: about
2-3 s of CPU per rank), so wrong answers are graded on the public case only, and every test that
starts ranks is marked `slow` (still part of `make test`; `-m "not slow"` skips them). Wrong
answers are defined in this module, which is pickled by value so the ranks need not import the tests.
"""
import math
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import HIDDEN_SEED, grade, solution_namespace, with_answer

STEM = "11_data_parallel"
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def sol11():
    return solution_namespace(STEM)


slow = pytest.mark.slow  # starts ranks: a few seconds of process start-up per launch


@pytest.mark.parametrize("eid", ["collective_cost", pytest.param("ring_all_reduce", marks=slow),
                                 pytest.param("ddp_from_scratch", marks=slow),
                                 pytest.param("ddp_overlap", marks=slow), "bucket_assignment",
                                 pytest.param("bucketed_ddp", marks=slow),
                                 pytest.param("sharded_optimizer", marks=slow), pytest.param("fsdp", marks=slow)])
def test_solution_passes_public_and_hidden_cases(sol11, eid):
    result = grade(STEM, eid, sol11)
    assert result.status == "passed", result.message


# --- collective costs and buckets (no ranks needed) ------------------------------------------------

def test_ring_all_reduce_costed_as_one_reduce_scatter_fails(sol11):
    real = sol11["collective_time"]

    def collective_time(op, nbytes, world_size, alpha, beta, algo="ring"):
        if op == "all_reduce" and algo == "ring":
            return real("reduce_scatter", nbytes, world_size, alpha, beta, algo)
        return real(op, nbytes, world_size, alpha, beta, algo)
    r = grade(STEM, "collective_cost", with_answer(sol11, collective_time=collective_time))
    assert r.status == "failed" and "reduce-scatter plus an all-gather" in r.message


def test_tree_with_fractional_log_fails(sol11):
    real = sol11["collective_time"]

    def collective_time(op, nbytes, world_size, alpha, beta, algo="ring"):
        t = real(op, nbytes, world_size, alpha, beta, algo)
        if algo == "tree" and op == "broadcast" and world_size > 1:
            t *= math.log2(world_size) / math.ceil(math.log2(world_size))
        return t
    r = grade(STEM, "collective_cost", with_answer(sol11, collective_time=collective_time), hidden=False)
    assert r.status == "failed" and "ceil(log2 p)" in r.message


def test_bus_bandwidth_without_the_factor_fails(sol11):
    r = grade(STEM, "collective_cost", with_answer(sol11, bus_bandwidth=lambda op, n, p, s: n / s), hidden=False)
    assert r.status == "failed" and "2(p-1)/p for all-reduce" in r.message


def test_buckets_ignoring_the_size_limit_fail(sol11):
    r = grade(STEM, "bucket_assignment", with_answer(
        sol11, assign_buckets=lambda sizes, mb: [list(reversed(range(len(sizes))))] if sizes else []))
    assert r.status == "failed" and "the limit is" in r.message


def test_buckets_closing_when_reaching_the_limit_fail(sol11):
    def assign_buckets(sizes, mb):  # ">=" instead of ">"
        out, cur, tot = [], [], 0
        for i in reversed(range(len(sizes))):
            cur.append(i)
            tot += sizes[i]
            if tot >= mb * 2**20:
                out.append(cur)
                cur, tot = [], 0
        return out + ([cur] if cur else [])
    r = grade(STEM, "bucket_assignment", with_answer(sol11, assign_buckets=assign_buckets), hidden=False)
    assert r.status == "failed" and "not >=" in r.message


def test_buckets_in_registration_order_fail(sol11):
    real = sol11["assign_buckets"]

    def assign_buckets(sizes, mb):
        n = len(sizes)
        return [[n - 1 - i for i in b] for b in real(sizes[::-1], mb)]
    r = grade(STEM, "bucket_assignment", with_answer(sol11, assign_buckets=assign_buckets), hidden=False)
    assert r.status == "failed" and "reverse order of registration" in r.message


# --- ring all-reduce ------------------------------------------------------------------------------

def ring_without_all_gather(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), p))
    for s in range(p - 1):
        send_i, recv_i = (rank - s) % p, (rank - s - 1) % p
        buf = torch.empty_like(chunks[recv_i])
        req = dist.isend(chunks[send_i], (rank + 1) % p)
        dist.recv(buf, (rank - 1) % p)
        req.wait()
        chunks[recv_i] += buf
    return tensor  # BUG: each rank holds only its own reduced chunk


def ring_that_hangs(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    buf = torch.empty_like(tensor)
    if rank == 0:
        dist.recv(buf, p - 1)  # BUG: nobody sends to rank 0 ...
    time.sleep(60 if rank else 0)  # ... and the others stay alive: a true hang
    return tensor


def naive_all_to_all(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for k in range(1, p):  # send the whole tensor to every other rank: (p-1) n bytes
        buf = torch.empty_like(tensor)
        req = dist.isend(tensor, (rank + k) % p)
        dist.recv(buf, (rank - k) % p)
        req.wait()
        total += buf
    tensor.copy_(total)
    return tensor


@slow
def test_ring_missing_the_all_gather_phase_fails(sol11):
    r = grade(STEM, "ring_all_reduce", with_answer(sol11, ring_all_reduce=ring_without_all_gather), hidden=False)
    assert r.status == "failed" and "all-gather phase is missing" in r.message


@slow
def test_sending_whole_tensors_is_not_a_ring(sol11):
    r = grade(STEM, "ring_all_reduce", with_answer(sol11, ring_all_reduce=naive_all_to_all), hidden=False)
    assert r.status == "failed" and "that is not a ring" in r.message


@slow
def test_a_hung_rank_ends_within_its_timeout_with_a_clear_message(sol11, monkeypatch):
    monkeypatch.setattr(load_lab(STEM).RUN, "LAUNCH_TIMEOUT_S", 5.0)
    start = time.monotonic()
    r = grade(STEM, "ring_all_reduce", with_answer(sol11, ring_all_reduce=ring_that_hangs), hidden=False)
    assert time.monotonic() - start < 5 + 40
    assert r.status == "error" and "a rank hung" in r.message and "timed out" in r.message


# --- DDP -------------------------------------------------------------------------------------------

class DDPNoBuffers(nn.Module):
    def __init__(self, module, process_group=None):
        super().__init__()
        self.module = module
        for p in module.parameters():  # BUG: buffers never broadcast
            dist.broadcast(p.data, src=0)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()


class DDPTrainableOnly(DDPNoBuffers):
    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module = module
        for t in [*module.buffers(), *(p for p in module.parameters() if p.requires_grad)]:  # BUG: frozen skipped
            dist.broadcast(t.data, src=0)


class DDPSum(DDPNoBuffers):
    def __init__(self, module, process_group=None):
        nn.Module.__init__(self)
        self.module = module
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)  # BUG: sum, not average


@slow
def test_ddp_not_broadcasting_buffers_fails(sol11):
    r = grade(STEM, "ddp_from_scratch", with_answer(sol11, DDP=DDPNoBuffers), hidden=False)
    assert r.status == "failed" and "buffer `input_scale` on rank 1" in r.message


@slow
def test_ddp_not_broadcasting_frozen_parameters_fails(sol11):
    r = grade(STEM, "ddp_from_scratch", with_answer(sol11, DDP=DDPTrainableOnly), hidden=False)
    assert r.status == "failed" and "frozen parameter `frozen_shift`" in r.message


class DDPTwice(DDPSum):
    def finish_gradient_synchronization(self):
        for _ in range(2):  # BUG: right gradients (the average of equal averages), twice the traffic
            for p in self.module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()


@slow
def test_ddp_all_reducing_each_gradient_twice_fails_the_byte_count(sol11):
    r = grade(STEM, "ddp_from_scratch", with_answer(sol11, DDP=DDPTwice), hidden=False)
    assert r.status == "failed" and "exactly once per step" in r.message


@slow
def test_ddp_summing_gradients_fails(sol11):
    r = grade(STEM, "ddp_from_scratch", with_answer(sol11, DDP=DDPSum), hidden=False)
    assert r.status == "failed" and "summed" in r.message


class DDPAllReduceOverEveryone(nn.Module):
    """Broadcasts within its process_group, but all-reduces over every rank."""

    def __init__(self, module, process_group=None):
        super().__init__()
        self.module, self.process_group = module, process_group
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src, group=process_group)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)  # BUG: no group=self.process_group
                p.grad /= dist.get_world_size(self.process_group)


@slow
def test_ddp_all_reducing_over_every_rank_instead_of_its_group_fails(sol11):
    ex = exercises(STEM)["ddp_from_scratch"]
    cases = ex.cases() + ex.cases(HIDDEN_SEED, public=False)  # 2 ranks each a group; 4 ranks in pairs
    r = evaluate(ex, with_answer(sol11, DDP=DDPAllReduceOverEveryone), "cpu", cases)
    assert r.score == 0 and all(c.status == "failed" for c in r.cases), r.message
    assert all("averaged over all" in c.message and "ignored the process_group" in c.message for c in r.cases)


# --- DDP with one asynchronous all-reduce per parameter ----------------------------------------------

def _overlap_variant(sol11, *, blocking=False, after_backward=False, flat=False, everyone=False, no_unused=False):
    """The solution's DDPIndividualParameters, broken in one way."""
    base = sol11["DDPIndividualParameters"]

    class Broken(base):
        def _grad_ready(self, p):
            if blocking:
                dist.all_reduce(p.grad, group=self.process_group)  # BUG: blocks backward until it is done
                self._handles.append((p, _Done()))
            elif after_backward or flat:
                pass  # BUG: nothing launched during backward
            elif everyone:
                self._handles.append((p, dist.all_reduce(p.grad, async_op=True)))  # BUG: no group=
            else:
                super()._grad_ready(p)

        def finish_gradient_synchronization(self):
            if no_unused:  # BUG: a parameter without a gradient is never all-reduced
                self.trainable = [p for p in self.trainable if p.grad is not None]
            if after_backward:
                for p in self.trainable:
                    super()._grad_ready(p)
            if flat:  # BUG: one all-reduce of every gradient, after backward
                grads = [p.grad for p in self.trainable]
                buffer = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(buffer, group=self.process_group)
                for g, v in zip(grads, buffer.split([g.numel() for g in grads])):
                    g.copy_(v.view_as(g))
                    self._handles.append((next(p for p in self.trainable if p.grad is g), _Done()))
            super().finish_gradient_synchronization()
    return Broken


@slow
@pytest.mark.parametrize("mistake, message", [("blocking", "async_op=True"), ("after_backward", "after backward"),
                                              ("flat", "one all-reduce per parameter")])
def test_overlap_blocking_late_or_flat_all_reduces_fail(sol11, mistake, message):
    broken = _overlap_variant(sol11, **{mistake: True})
    r = grade(STEM, "ddp_overlap", with_answer(sol11, DDPIndividualParameters=broken), hidden=False)
    assert r.status == "failed" and message in r.message, r.message


@slow
def test_overlap_ignoring_its_process_group_fails(sol11):
    r = grade(STEM, "ddp_overlap", with_answer(sol11, DDPIndividualParameters=_overlap_variant(sol11, everyone=True)),
              hidden=False)  # each rank a group of its own
    assert r.status == "failed" and "ignored the process_group" in r.message, r.message


@slow
def test_overlap_leaving_an_unused_parameter_out_fails(sol11):
    ex, cases = _hidden_case("ddp_overlap", "a trainable parameter forward never uses")
    r = evaluate(ex, with_answer(sol11, DDPIndividualParameters=_overlap_variant(sol11, no_unused=True)), "cpu",
                 cases)
    assert r.status == "failed" and "must all-reduce it all the same, as zeros" in r.message, r.message


# --- bucketed DDP ---------------------------------------------------------------------------------

def _bucketed_variant(sol11, *, after_backward=False, one_bucket=False, blocking=False, from_last_hook=False):
    """The solution's BucketedDDP, broken in one way."""
    base = sol11["BucketedDDP"]

    class Broken(base):
        def __init__(self, module, bucket_size_mb=25.0, process_group=None):
            super().__init__(module, 1e9 if one_bucket else bucket_size_mb, process_group)
            self._seen = 0

        def _grad_ready(self, b):
            if after_backward:
                return  # BUG: nothing launched during backward: finish_gradient_synchronization() does it
            if from_last_hook:  # BUG: waits for every gradient, then launches all buckets at once
                self._seen += 1
                if self._seen == sum(len(bucket) for bucket in self.buckets):
                    self._seen = 0
                    for k in range(len(self.buckets)):
                        for _ in self.buckets[k]:
                            super()._grad_ready(k)
                return
            return super()._grad_ready(b)

        def _launch(self, b):
            if not blocking:
                return super()._launch(b)
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
            dist.all_reduce(flat)  # BUG: blocking all-reduce inside backward
            self._inflight.append((b, flat, _Done()))
    return Broken


class _Done:
    def wait(self):
        return True


@slow
def test_all_reduce_after_backward_instead_of_overlapped_fails(sol11):
    r = grade(STEM, "bucketed_ddp", with_answer(sol11, BucketedDDP=_bucketed_variant(sol11, after_backward=True)),
              hidden=False)
    assert r.status == "failed" and "after backward" in r.message


@slow
def test_all_reduce_launched_only_once_backward_is_over_fails(sol11):
    r = grade(STEM, "bucketed_ddp", with_answer(sol11, BucketedDDP=_bucketed_variant(sol11, from_last_hook=True)),
              hidden=False)
    assert r.status == "failed" and "no all-reduce started during backward" in r.message


@slow
def test_bucketed_ddp_ignoring_the_size_limit_fails(sol11):
    r = grade(STEM, "bucketed_ddp", with_answer(sol11, BucketedDDP=_bucketed_variant(sol11, one_bucket=True)),
              hidden=False)
    assert r.status == "failed" and "bucket size limit was ignored" in r.message


@slow
def test_blocking_all_reduce_in_the_hook_fails(sol11):
    r = grade(STEM, "bucketed_ddp", with_answer(sol11, BucketedDDP=_bucketed_variant(sol11, blocking=True)),
              hidden=False)
    assert r.status == "failed" and "async_op=True" in r.message


# --- ZeRO-1 ----------------------------------------------------------------------------------------

class FullStateOptimizer(torch.optim.Optimizer):
    """Every rank steps every parameter: right numbers, no memory saved."""

    def __init__(self, params, optimizer_cls, process_group=None, **kwargs):
        super().__init__(params, kwargs)
        self.inner = optimizer_cls(self.param_groups, **kwargs)

    def step(self, closure=None):
        self.inner.step()


@slow
def test_sharded_optimizer_keeping_full_state_fails(sol11):
    r = grade(STEM, "sharded_optimizer", with_answer(sol11, ShardedOptimizer=FullStateOptimizer), hidden=False)
    assert r.status == "failed" and "every rank holds optimizer state for the whole model" in r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set ------------------------

@pytest.mark.parametrize("eid", ["collective_cost", "bucket_assignment"])
def test_answers_that_compute_nothing_score_zero(eid):
    ex = exercises(STEM)[eid]
    kit.assert_do_nothing_scores_zero(ex)


class WrapperDoingNothing(nn.Module):
    def __init__(self, module, *args, **kwargs):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        pass


class FSDPDoingNothing(WrapperDoingNothing):
    def gather_full_params(self):
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}


class OptimizerDoingNothing(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, process_group=None, **kwargs):
        super().__init__(params, kwargs)

    def step(self, closure=None):
        pass


@slow
@pytest.mark.parametrize("eid, answer", [("ring_all_reduce", {"ring_all_reduce": lambda tensor: tensor}),
                                         ("ddp_from_scratch", {"DDP": WrapperDoingNothing}),
                                         ("ddp_overlap", {"DDPIndividualParameters": WrapperDoingNothing}),
                                         ("bucketed_ddp", {"BucketedDDP": WrapperDoingNothing}),
                                         ("sharded_optimizer", {"ShardedOptimizer": OptimizerDoingNothing}),
                                         ("fsdp", {"FSDP": FSDPDoingNothing})])
def test_distributed_answers_that_compute_nothing_score_zero(sol11, eid, answer):
    r = grade(STEM, eid, with_answer(sol11, **answer), hidden=False)  # one launch
    # A rank of a do-nothing answer may finish early and gloo then reports a broken pipe on its peer
    # (seen once under load): an error, which earns nothing too.
    assert r.status in ("failed", "error") and r.score == 0, r.message


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid])


# --- the solution itself: a parameter without a gradient, a param group added later -----------------

class ModelWithUnusedParameters(nn.Module):
    """Registration order: `unused` (no forward uses it), first.*, `extra` (used only when the caller
    asks), second.*; every value from ``seed``, so replicas differ until broadcast."""

    def __init__(self, seed):
        super().__init__()
        self.unused = nn.Parameter(torch.empty(5))
        self.first = nn.Linear(4, 8)
        self.extra = nn.Parameter(torch.empty(8))
        self.second = nn.Linear(8, 2)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))

    def forward(self, x, use_extra=False):
        h = torch.relu(self.first(x))
        return self.second(h * self.extra if use_extra else h)


def _unused_batch(step, rank):
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(100 * step + rank))


def _unused_rank(rank, world_size, cls, bucket_mb, extra_ranks):
    """Two SGD steps of ``cls(model, bucket_mb)``: no rank uses `unused`, the ranks ``extra_ranks`` use `extra`."""
    model = ModelWithUnusedParameters(seed=rank)
    ddp = cls(model, bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(2):
        opt.zero_grad()
        ddp(_unused_batch(step, rank), use_extra=rank in extra_ranks).pow(2).mean().backward()
        ddp.finish_gradient_synchronization()
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"grads": grads, "final": {n: p.detach().clone() for n, p in model.named_parameters()}}


@slow
@pytest.mark.parametrize("bucket_mb, extra_ranks", [(25.0, (0, 1)),  # one bucket; `unused` has no gradient
                                                    (0.0, (1,))])    # a bucket each; `extra` only on rank 1
def test_solution_bucketed_ddp_averages_every_bucket_when_a_parameter_gets_no_gradient(sol11, bucket_mb,
                                                                                      extra_ranks):
    from gpulab.dist import launch

    ranks = launch(_unused_rank, 2, sol11["BucketedDDP"], bucket_mb, extra_ranks, backend="gloo", timeout_s=20)
    model = ModelWithUnusedParameters(seed=0)  # single process: the mean of both ranks' losses
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        opt.zero_grad()
        sum(model(_unused_batch(step, r), use_extra=r in extra_ranks).pow(2).mean() for r in range(2)).div(2).backward()
        for r, o in enumerate(ranks):
            for name, p in model.named_parameters():
                got = o["grads"][step][name]
                if p.grad is None:  # no rank used it: no gradient, or zeros, but the same on every rank
                    assert got is None or not got.any(), (r, step, name)
                    assert (got is None) == (ranks[0]["grads"][step][name] is None), (step, name)
                else:
                    assert got is not None, f"rank {r}, step {step}: `{name}` has no averaged gradient"
                    torch.testing.assert_close(got, p.grad, msg=lambda m: f"rank {r}, step {step}, `{name}`: {m}")
        opt.step()
    for name, p in model.named_parameters():
        assert torch.equal(ranks[0]["final"][name], ranks[1]["final"][name]), f"the replicas drifted apart: `{name}`"
        torch.testing.assert_close(ranks[0]["final"][name], p.detach())


def _late_group_model():
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=gen))
    return model


def _late_group_training(opt_fn):
    """Adam on the first layer, then ``add_param_group`` of the last two (another lr): 3 steps.
    Returns the parameters after each step, and the optimizer."""
    model = _late_group_model()
    x, y = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 3)
    opt = opt_fn(list(model[0].parameters()))
    params = []
    for step in range(3):
        if step == 1:
            opt.add_param_group({"params": [*model[2].parameters(), *model[4].parameters()], "lr": 0.005})
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()  # the same batch on every rank: no averaging needed
        opt.step()
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return params, opt


def _late_group_rank(rank, world_size, cls):
    import gc

    params, opt = _late_group_training(lambda ps: cls(ps, torch.optim.Adam, lr=0.01))  # opt alive: counted below
    state = sum(v.numel() for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)
                for s in o.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return {"params": params, "state": state}


@slow
def test_solution_sharded_optimizer_shards_a_param_group_added_later(sol11):
    from gpulab.dist import launch

    ranks = launch(_late_group_rank, 2, sol11["ShardedOptimizer"], backend="gloo", timeout_s=20)
    want, _ = _late_group_training(lambda ps: torch.optim.Adam(ps, lr=0.01))
    for r, o in enumerate(ranks):
        for step, params in enumerate(want):
            for name, w in params.items():
                torch.testing.assert_close(o["params"][step][name], w, msg=lambda m: f"rank {r}, step {step}, "
                                                                                      f"`{name}`: {m}")
    full = 2 * sum(p.numel() for p in _late_group_model().parameters())  # Adam: exp_avg and exp_avg_sq
    assert sum(o["state"] for o in ranks) == full and all(0 < o["state"] < full for o in ranks), \
        [o["state"] for o in ranks]


# --- the check holds learners to the same: hidden cases with an unused parameter, a late param group ----

def _hidden_case(eid, rule):
    ex = exercises(STEM)[eid]
    return ex, [c for c in ex.cases(HIDDEN_SEED, public=False) if c.name.startswith(rule)]


def _bucketed_ignoring_unused(sol11):
    """The solution's BucketedDDP, except that a bucket still waiting at the finish is never launched
    (as before the fix)."""
    class Broken(sol11["BucketedDDP"]):
        def finish_gradient_synchronization(self):
            self._next = len(self.buckets)  # BUG: buckets waiting for a gradient that never came stay unlaunched
            super().finish_gradient_synchronization()
    return Broken


@slow
def test_bucketed_ddp_leaving_the_bucket_of_an_unused_parameter_fails(sol11):
    ex, cases = _hidden_case("bucketed_ddp", "a trainable parameter forward never uses")
    r = evaluate(ex, with_answer(sol11, BucketedDDP=_bucketed_ignoring_unused(sol11)), "cpu", cases)
    assert r.status == "failed" and "its bucket never completes during backward" in r.message, r.message


class ShardedOwnersAtConstructionOnly(torch.optim.Optimizer):
    """Owners given in __init__ only (as the solution before the fix); a later group's parameters are never
    stepped, only broadcast from rank 0 (the code before the fix raised KeyError there)."""

    def __init__(self, params, optimizer_cls, process_group=None, **kwargs):
        super().__init__(params, kwargs)
        rank, world = dist.get_rank(), dist.get_world_size()
        load, self.owner = [0] * world, {}
        for p in sorted((p for g in self.param_groups for p in g["params"]), key=lambda p: -p.numel()):
            r = min(range(world), key=lambda i: load[i])
            self.owner[p], load[r] = r, load[r] + p.numel()
        self.local = optimizer_cls([p for p in self.owner if self.owner[p] == rank], **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        self.local.param_groups[0]["lr"] = self.param_groups[0]["lr"]
        self.local.step()
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner.get(p, 0))  # BUG: a later group's parameters have no owner


@slow
def test_sharded_optimizer_ignoring_a_param_group_added_later_fails(sol11):
    ex, cases = _hidden_case("sharded_optimizer", "a param group added after step 0")
    r = evaluate(ex, with_answer(sol11, ShardedOptimizer=ShardedOwnersAtConstructionOnly), "cpu", cases)
    assert r.status == "failed" and "joined with opt.add_param_group(...) after step 0" in r.message, r.message


def _sharded_ignoring_its_group(sol11):
    class IgnoresGroup(sol11["ShardedOptimizer"]):
        def __init__(self, params, optimizer_cls, process_group=None, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)  # BUG: shards and broadcasts over every rank
    return IgnoresGroup


@slow
def test_sharded_optimizer_ignoring_its_process_group_fails(sol11):
    ex = exercises(STEM)["sharded_optimizer"]
    for cases in (ex.cases(), [ex.cases(HIDDEN_SEED, public=False)[0]]):  # groups of one rank; two groups of two
        r = evaluate(ex, with_answer(sol11, ShardedOptimizer=_sharded_ignoring_its_group(sol11)), "cpu", cases)
        assert r.status == "failed" and "process_group=dist.new_group(" in r.message, r.message
        assert "broadcast within it" in r.message


# --- FSDP (ZeRO-3) ---------------------------------------------------------------------------------

class _GatherScatter(torch.autograd.Function):
    """All-gather a shard in forward, reduce-scatter the gradient in backward (a tempting FSDP unit)."""

    @staticmethod
    def forward(ctx, fsdp, shard):
        ctx.fsdp = fsdp
        return fsdp._all_gather(shard)

    @staticmethod
    def backward(ctx, grad):
        return None, ctx.fsdp._reduce_scatter(grad)


def _fsdp_variant(sol11, mistake):
    """The solution's FSDP, broken in one way."""
    base = sol11["FSDP"]

    class Broken(base):
        def __init__(self, module, process_group=None, **kwargs):
            try:
                super().__init__(module, process_group, **kwargs)
            except ValueError:
                if mistake != "silent_without_units":
                    raise
                nn.Module.__init__(self)  # BUG: no unit matched; every parameter silently stays replicated
                self.module = module
            if mistake == "drop_tail":  # BUG: shards of numel // p elements: the last numel % p belong to none
                self.numels = {}
                for i, layout in enumerate(self.layouts):
                    full, numel = base._all_gather(self, self.shards[i]), sum(n for *_, n in layout)
                    k = numel // self.world_size
                    self.shards[i] = nn.Parameter(full[self.rank * k:(self.rank + 1) * k].clone())
                    self.numels[k] = numel
            if mistake == "full_optimizer":  # BUG: the optimizer steps on full copies of the parameters
                self.full = nn.ParameterList(nn.Parameter(base._all_gather(self, s)) for s in self.shards)
            if mistake == "kept_by_autograd":  # BUG: forward records a graph that saves the gathered vector
                for i, m in enumerate(self.units):
                    m.forward = lambda *inputs, i=i: self._kept(i, inputs)

        def _kept(self, i, inputs):
            out = self._run_unit(i, _GatherScatter.apply(self, self.shards[i]), inputs)  # F.linear saves its weight
            self._free(i)  # drops the module's views only: autograd still holds the full vector until backward
            return out

        def _all_gather(self, shard, dtype=None):
            if mistake == "default_device":
                shard = shard.detach().to(dtype or self.compute_dtype or shard.dtype)
                full = torch.empty(self.world_size * shard.numel(), dtype=shard.dtype)  # BUG: no device=
                dist.all_gather(list(full.chunk(self.world_size)), shard, group=self.process_group)
                return full
            full = super()._all_gather(shard, dtype)
            if mistake == "drop_tail":  # the gathered vector padded after the fact, to make the views fit
                full = torch.nn.functional.pad(full, (0, self.numels[shard.numel()] - full.numel()))
            return full

        def _reduce_scatter(self, full_grad):
            p, rank = self.world_size, dist.get_rank(self.process_group)
            if mistake == "all_reduce":  # BUG: every rank receives the whole summed gradient
                full_grad = full_grad.clone()
                dist.all_reduce(full_grad, group=self.process_group)
                return full_grad.chunk(p)[rank].div(p)
            if mistake == "drop_tail":
                full_grad = full_grad[:full_grad.numel() // p * p]
            if mistake == "summed":
                return super()._reduce_scatter(full_grad).mul_(p)  # BUG: not divided by p
            if mistake == "global_size":
                return super()._reduce_scatter(full_grad).mul_(p / dist.get_world_size())  # BUG: not the group's
            return super()._reduce_scatter(full_grad)

        def _free(self, i):
            if mistake != "never_free":  # BUG when never_free: the views keep the gathered vector alive
                super()._free(i)

        def forward(self, *args, **kwargs):
            if mistake == "full_optimizer":  # the shards cut again from the updated full copies
                with torch.no_grad():
                    for s, f in zip(self.shards, self.full):
                        s.copy_(f.chunk(self.world_size)[self.rank])
            return super().forward(*args, **kwargs)

        def finish_gradient_synchronization(self):
            super().finish_gradient_synchronization()
            if mistake == "full_optimizer":
                for s, f in zip(self.shards, self.full):
                    f.grad, s.grad = base._all_gather(self, s.grad), None

        def gather_full_params(self):
            if mistake == "full_optimizer":
                with torch.no_grad():
                    for s, f in zip(self.shards, self.full):
                        s.copy_(f.chunk(self.world_size)[self.rank])
            return super().gather_full_params()
    return Broken


@slow
@pytest.mark.parametrize("mistake, message", [
    ("all_reduce", "FSDP reduce-scatters each layer's gradient"),
    ("never_free", "gathered parameters were not freed after their layer's forward"),
    ("kept_by_autograd", "saved by autograd for backward"),
    ("summed", "as if the gradients were summed"),
    ("drop_tail", "Pad the flat vector with zeros"),
    ("full_optimizer", "the optimizer must step on this rank's shards only"),
    ("silent_without_units", "built zero units and said nothing"),
    ("default_device", "device=shard.device")])
def test_fsdp_mistakes_fail(sol11, mistake, message):
    r = grade(STEM, "fsdp", with_answer(sol11, FSDP=_fsdp_variant(sol11, mistake)), hidden=False)
    assert r.status == "failed" and message in r.message, r.message


@slow
def test_fsdp_dividing_by_the_world_instead_of_its_group_fails(sol11):
    r = grade(STEM, "fsdp", with_answer(sol11, FSDP=_fsdp_variant(sol11, "global_size")), hidden=False)
    assert r.status == "failed" and "divide by the group's size" in r.message, r.message  # groups of one rank


def test_a_bucket_that_completes_with_the_last_gradient_is_not_late():
    """Two buckets, the second holding a parameter without gradient: the first completes only with the
    last gradient, so launching it then is all the overlap there is (a seed of the grader drew this)."""
    lab = load_lab(STEM)
    events = [("mark", 0, False, "grad:b"), ("mark", 0, False, "grad:a"), ("all_reduce", 5, True, ""),
              ("mark", 0, False, "finish"), ("all_reduce", 3, True, "")]
    assert lab._judge_schedule(events, [[2, 1], [0]], [3, 2, 3], may_wait=1) is None


def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM)



def test_adam_steps_are_judged_on_the_scale_of_lr():
    """Graded with seed 1234, a correct ShardedOptimizer once lost a case: one weight 0.0258034 against plain
    Adam's 0.0258084 (its gradient, summed in another order, sat near Adam's eps). Adam moves a weight by about
    lr a step, so the check allows 1e-3 lr; a wrong update (lr ignored, a step missed) is off by ~lr."""
    check = load_lab(STEM)
    x = {"lr": 0.01}
    want = torch.full((16, 16), 0.0258084)
    noisy = want.clone()
    noisy[15, 11] = 0.0258034
    assert check._differs(noisy, want, atol=check._adam_atol(x)) is None
    assert check._differs(noisy, want) is not None  # the float32 default alone rejected it
    assert check._differs(want + x["lr"] / 2, want, atol=check._adam_atol(x)) is not None
