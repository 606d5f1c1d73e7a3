"""Lab 11's checks: the solution passes; summed gradients, unbroadcast buffers and frozen parameters,
gradients all-reduced twice, all-reduces after backward (or blocking, or launched only once backward
is over), buckets ignoring their limit, a ring without its all-gather phase (or sending whole
tensors), a sharded optimizer keeping the whole state and a hung rank are all rejected.

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
                                 pytest.param("ddp_from_scratch", marks=slow), "bucket_assignment",
                                 pytest.param("bucketed_ddp", marks=slow),
                                 pytest.param("sharded_optimizer", marks=slow)])
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
    monkeypatch.setattr(load_lab(STEM), "LAUNCH_TIMEOUT_S", 5.0)
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
                return  # BUG: nothing launched during backward ...
            if from_last_hook:  # BUG: waits for every gradient, then launches all buckets at once
                self._seen += 1
                if self._seen == sum(len(bucket) for bucket in self.buckets):
                    self._seen = 0
                    for k in range(len(self.buckets)):
                        for _ in self.buckets[k]:
                            super()._grad_ready(k)
                return
            if not blocking:
                return super()._grad_ready(b)
            self._waiting[b] -= 1
            if self._waiting[b] == 0:
                flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
                dist.all_reduce(flat)  # BUG: blocking all-reduce inside backward
                self._inflight.append((b, flat, _Done()))

        def finish_gradient_synchronization(self):
            if after_backward:  # ... everything all-reduced here, after backward
                for b, bucket in enumerate(self.buckets):
                    flat = torch.cat([p.grad.reshape(-1) for p in bucket])
                    self._inflight.append((b, flat, dist.all_reduce(flat, async_op=True)))
            super().finish_gradient_synchronization()
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

    def __init__(self, params, optimizer_cls, **kwargs):
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


class OptimizerDoingNothing(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)

    def step(self, closure=None):
        pass


@slow
@pytest.mark.parametrize("eid, answer", [("ring_all_reduce", {"ring_all_reduce": lambda tensor: tensor}),
                                         ("ddp_from_scratch", {"DDP": WrapperDoingNothing}),
                                         ("bucketed_ddp", {"BucketedDDP": WrapperDoingNothing}),
                                         ("sharded_optimizer", {"ShardedOptimizer": OptimizerDoingNothing})])
def test_distributed_answers_that_compute_nothing_score_zero(sol11, eid, answer):
    r = grade(STEM, eid, with_answer(sol11, **answer), hidden=False)  # one launch
    # A rank of a do-nothing answer may finish early and gloo then reports a broken pipe on its peer
    # (seen once under load): an error, which earns nothing too.
    assert r.status in ("failed", "error") and r.score == 0, r.message


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid])
