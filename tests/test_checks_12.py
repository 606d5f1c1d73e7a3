"""Lab 12's checks: the solution passes on 2 and 4 ranks; the tensor-parallel bugs learners write are
rejected: a missing f (wrong input gradient), a bias summed world_size times, a weight split along the
wrong dimension, an extra all-reduce, heads split wrongly, a forgotten group, sizes that do not
divide, and a hang that ends with a clear message.

Each check of a layer is one launch of 4 CPU ranks (a few seconds), so wrong answers are graded on
the public case only. Wrong answers are classes defined inside the tests: cloudpickle ships them
to the ranks by value.
"""
import math
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

STEM = "12_tensor_parallel"


@pytest.fixture(scope="module")
def sol12():
    return solution_namespace(STEM)


@pytest.mark.parametrize("eid", ["tp_regions", "column_parallel", "row_parallel", "tp_mlp", "tp_attention",
                                 "tp_comm_volume", "vocab_parallel_ce", "sequence_parallel",
                                 "moe_routing", "expert_parallel"])
def test_solution_passes_public_and_hidden_cases(sol12, eid):
    result = grade(STEM, eid, sol12)
    assert result.status == "passed", result.message
    assert result.score == result.points


# --- the input gradient: f missing -----------------------------------------------------------------

def _column_without_f(sol):
    class ColumnWithoutF(sol["ColumnParallelLinear"]):
        def forward(self, x):  # BUG: no CopyToParallelRegion, so dL/dx is never all-reduced
            y = F.linear(x, self.weight, self.bias)
            return sol["GatherFromParallelRegion"].apply(y, self.group) if self.gather_output else y
    return ColumnWithoutF


def test_column_parallel_without_f_gives_a_partial_input_gradient(sol12):
    r = grade(STEM, "column_parallel", with_answer(sol12, ColumnParallelLinear=_column_without_f(sol12)),
              hidden=False)
    assert r.status == "failed"
    assert "x.grad is only this rank's partial sum" in r.message and "apply f" in r.message


def test_mlp_stack_missing_its_backward_all_reduce_is_caught_by_the_input_gradient(sol12):
    column = _column_without_f(sol12)

    class MLPWithoutF(sol12["ParallelMLP"]):
        def __init__(self, hidden, ffn_hidden, process_group, bias=True):
            super().__init__(hidden, ffn_hidden, process_group, bias)
            self.fc1 = column(hidden, ffn_hidden, process_group, bias=bias)

    r = grade(STEM, "tp_mlp", with_answer(sol12, ParallelMLP=MLPWithoutF), hidden=False)
    assert r.status == "failed"
    assert "x.grad (the input gradient) is only this rank's partial sum" in r.message


# --- row-parallel bias and split dimension ---------------------------------------------------------

def test_row_parallel_bias_added_before_the_all_reduce_fails(sol12):
    class BiasOnEveryRank(sol12["RowParallelLinear"]):
        def forward(self, x):
            if not self.input_is_parallel:
                x = sol12["ScatterToParallelRegion"].apply(x, self.group)
            y = F.linear(x, self.weight, self.bias)  # BUG: every rank adds the bias, then they are summed
            return sol12["ReduceFromParallelRegion"].apply(y, self.group)

    r = grade(STEM, "row_parallel", with_answer(sol12, RowParallelLinear=BiasOnEveryRank), hidden=False)
    assert r.status == "failed" and "bias 2 times" in r.message


def test_column_parallel_weight_split_along_the_wrong_dimension_fails(sol12):
    class SplitByInputs(torch.nn.Module):
        def __init__(self, in_features, out_features, process_group, bias=True, gather_output=False):
            super().__init__()
            self.group, p = process_group, dist.get_world_size(process_group)
            self.rank = dist.get_rank(process_group)
            self.n = in_features // p
            self.weight = torch.nn.Parameter(torch.empty(out_features, self.n))  # BUG: split the input dim
            self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None

        @torch.no_grad()
        def load_from_full(self, full):
            self.weight.copy_(full.weight[:, self.rank * self.n:(self.rank + 1) * self.n])
            if self.bias is not None:
                self.bias.copy_(full.bias)

        def forward(self, x):
            return F.linear(x[..., self.rank * self.n:(self.rank + 1) * self.n], self.weight, self.bias)

    r = grade(STEM, "column_parallel", with_answer(sol12, ColumnParallelLinear=SplitByInputs), hidden=False)
    assert r.status == "failed" and "wrong dimension" in r.message


# --- counting collectives ----------------------------------------------------------------------------

def test_mlp_with_an_extra_all_reduce_fails_although_its_values_are_right(sol12):
    class ExtraAllReduce(sol12["ParallelMLP"]):
        def forward(self, x):
            y = super().forward(x)
            check = y.detach().clone()          # BUG: "make sure the ranks agree" costs a second all-reduce
            dist.all_reduce(check, group=self.fc1.group)
            return y

    r = grade(STEM, "tp_mlp", with_answer(sol12, ParallelMLP=ExtraAllReduce), hidden=False)
    assert r.status == "failed"
    assert "issued 2 all_reduce in forward, expected 1 all_reduce" in r.message


def test_g_that_also_all_reduces_in_backward_fails(sol12):
    class GBothWays(sol12["ReduceFromParallelRegion"]):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            out = x.clone()
            dist.all_reduce(out, group=group)
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad, group=ctx.group)  # BUG: g's backward is the identity
            return grad, None

    r = grade(STEM, "tp_regions", with_answer(sol12, ReduceFromParallelRegion=GBothWays), hidden=False)
    assert r.status == "failed" and "g's backward is the identity" in r.message


def test_a_collective_on_the_default_group_is_caught(sol12):
    class FOnTheWorld(sol12["CopyToParallelRegion"]):
        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)  # BUG: no group=, so the TP=2 groups sum over all 4 ranks
            return grad, None

    r = grade(STEM, "tp_regions", with_answer(sol12, CopyToParallelRegion=FOnTheWorld), hidden=False)
    assert r.status == "failed" and "ran over 4 ranks" in r.message and "group=process_group" in r.message


# --- attention heads ---------------------------------------------------------------------------------

def test_attention_with_a_contiguous_slice_of_the_fused_qkv_fails(sol12):
    class ContiguousHeads(sol12["ParallelSelfAttention"]):
        @torch.no_grad()
        def load_from_full(self, attn):
            p = self.qkv.p
            self.qkv.weight.copy_(attn.qkv.weight.chunk(p, 0)[self.rank])  # BUG: q rows of all heads on rank 0
            if self.qkv.bias is not None:
                self.qkv.bias.copy_(attn.qkv.bias.chunk(p)[self.rank])
            self.proj.load_from_full(attn.proj)

    r = grade(STEM, "tp_attention", with_answer(sol12, ParallelSelfAttention=ContiguousHeads), hidden=False)
    assert r.status == "failed" and "contiguous slice of the fused" in r.message


# --- sizes that do not divide ------------------------------------------------------------------------

def test_sizes_that_do_not_divide_must_raise_a_value_error():
    floor = solution_namespace(STEM)
    floor["divide"] = lambda n, p, what="size": n // p  # BUG: silently drops the remainder
    r = grade(STEM, "column_parallel", floor, hidden=False)
    assert r.status == "failed" and "was accepted although" in r.message and "ValueError" in r.message


# --- a hang ends with a clear message --------------------------------------------------------------

def test_a_hung_rank_ends_within_its_timeout_with_a_clear_message(sol12, monkeypatch):
    monkeypatch.setattr(load_lab(STEM).RUN, "RANK_TIMEOUT_S", 6.0)

    class DeadlockedGather(sol12["GatherFromParallelRegion"]):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            p, me = dist.get_world_size(group), dist.get_rank(group)
            parts = [x if r == me else torch.empty_like(x) for r in range(p)]
            for r in range(p):
                if r != me:                      # BUG: every rank receives first: nobody ever sends
                    dist.recv(parts[r], src=dist.get_global_rank(group, r), group=group)
                    dist.send(x.contiguous(), dst=dist.get_global_rank(group, r), group=group)
            return torch.cat(parts, -1)

    start = time.monotonic()
    r = grade(STEM, "tp_regions", with_answer(sol12, GatherFromParallelRegion=DeadlockedGather), hidden=True)
    assert r.status == "error", r.message
    assert "hung" in r.message and "same collectives in the same order" in r.message, r.message
    assert all(c.status == "error" for c in r.cases)            # the hidden case answers without a 2nd wait
    assert time.monotonic() - start < 6.0 + 15 + 30


# --- the volume formulas -----------------------------------------------------------------------------

def test_volume_counting_the_ring_traffic_as_the_payload_fails(sol12):
    def with_ring(block, batch, seq, hidden, dtype_bytes, tp_size):
        n = 2 * (tp_size - 1) / tp_size * batch * seq * hidden * dtype_bytes
        return {"forward": n, "backward": n}

    r = grade(STEM, "tp_comm_volume", with_answer(sol12, tp_allreduce_bytes=with_ring))
    assert r.status == "failed" and "tp_allreduce_bytes" in r.message


def test_volume_forgetting_the_recomputed_forward_fails(sol12):
    def no_recompute(batch, seq, hidden, dtype_bytes, tp_size, n_layers, recompute=False):
        return 0 if tp_size == 1 else 4 * n_layers * batch * seq * hidden * dtype_bytes

    r = grade(STEM, "tp_comm_volume", with_answer(sol12, step_allreduce_bytes=no_recompute))
    assert r.status == "failed" and "recompute=True" in r.message


def test_ring_traffic_without_the_factor_two_fails(sol12):
    r = grade(STEM, "tp_comm_volume", with_answer(
        sol12, ring_allreduce_traffic=lambda n, p: (p - 1) / p * n))
    assert r.status == "failed" and "reduce-scatter then an all-gather" in r.message


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch 2.13 renames all_gather_into_tensor
def test_collective_log_counts_payload_bytes_and_group_size():
    from gpulab.commlog import record_collectives

    original = dist.all_reduce
    owns = not dist.is_initialized()  # another test of this process may have made a group already
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    size = dist.get_world_size()
    try:
        with record_collectives() as log:
            dist.all_reduce(torch.ones(3, 5))
            log.phase = "backward"
            dist.all_gather([torch.empty(2) for _ in range(size)], torch.ones(2))
            dist.all_gather_into_tensor(torch.empty(4 * size), torch.ones(4))  # logged once, whatever it calls inside
    finally:
        if owns:
            dist.destroy_process_group()
    assert log.as_dicts() == [{"op": "all_reduce", "phase": "forward", "bytes": 60, "group_size": size},
                         {"op": "all_gather", "phase": "backward", "bytes": 8 * size, "group_size": size},
                         {"op": "all_gather_into_tensor", "phase": "backward", "bytes": 16 * size, "group_size": size}]
    assert log.describe() == (f"forward: all_reduce x1 (60 B); backward: all_gather x1 ({8 * size} B), "
                             f"all_gather_into_tensor x1 ({16 * size} B)")
    assert dist.all_reduce is original  # unpatched on exit
    assert math.isclose(load_lab(STEM).ref_ring_allreduce_traffic(100, 4), 150)


# --- vocab-parallel cross-entropy --------------------------------------------------------------------

def _vocab_ce(sol, *, gather=False, shift=True, end_inclusive=False):
    """A VocabParallelCrossEntropy with one of the classic mistakes switched on."""
    vocab_range = sol["vocab_range"]

    class VocabCE(sol["VocabParallelCrossEntropy"]):
        @staticmethod
        def forward(ctx, logits_shard, target, group):
            p, r = dist.get_world_size(group), dist.get_rank(group)
            n = logits_shard.shape[-1]
            start, end = vocab_range(n * p, group)
            if gather:  # BUG: all-gathers the (B, S, V) logits the vocab-parallel loss exists to avoid
                parts = [torch.empty_like(logits_shard) for _ in range(p)]
                dist.all_gather(parts, logits_shard.contiguous(), group=group)
                full = torch.cat(parts, -1).requires_grad_(True)
                with torch.enable_grad():
                    loss = F.cross_entropy(full.flatten(0, 1), target.flatten(), reduction="none")
                    (grad,) = torch.autograd.grad(loss.sum(), full)
                ctx.save_for_backward(grad[..., r * n:(r + 1) * n])
                return loss.detach().view(target.shape)
            row_max = logits_shard.max(-1).values
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
            z = logits_shard - row_max.unsqueeze(-1) if shift else logits_shard  # BUG when not shift: exp overflows
            owned = (target >= start) & ((target <= end) if end_inclusive else (target < end))  # BUG: <= end
            local = (target - start).clamp(0, n - 1)
            tgt = torch.where(owned, z.gather(-1, local.unsqueeze(-1)).squeeze(-1), torch.zeros_like(row_max))
            dist.all_reduce(tgt, group=group)
            exp_z = z.exp()
            sum_exp = exp_z.sum(-1)
            dist.all_reduce(sum_exp, group=group)
            grad = exp_z / sum_exp.unsqueeze(-1)
            grad.scatter_add_(-1, local.unsqueeze(-1), -owned.unsqueeze(-1).to(grad.dtype))
            ctx.save_for_backward(grad)
            return sum_exp.log() - tgt

        @staticmethod
        def backward(ctx, grad_loss):
            return ctx.saved_tensors[0] * grad_loss.unsqueeze(-1), None, None
    return VocabCE


def _grade_vocab_ce(sol, **bug):
    return grade(STEM, "vocab_parallel_ce", with_answer(sol, VocabParallelCrossEntropy=_vocab_ce(sol, **bug)),
                 hidden=False)


def test_vocab_ce_variant_without_bugs_passes(sol12):
    r = _grade_vocab_ce(sol12)
    assert r.status == "passed", r.message


def test_vocab_ce_that_gathers_the_logits_fails_although_its_values_are_right(sol12):
    r = _grade_vocab_ce(sol12, gather=True)
    assert r.status == "failed" and "never to gather" in r.message, r.message


def test_vocab_ce_without_the_global_max_overflows_and_fails(sol12):
    r = _grade_vocab_ce(sol12, shift=False)
    assert r.status == "failed" and "not finite" in r.message and "GLOBAL max" in r.message, r.message


def test_vocab_ce_target_mask_including_the_shard_end_fails_on_boundary_targets(sol12):
    r = _grade_vocab_ce(sol12, end_inclusive=True)
    assert r.status == "failed" and "shard edges" in r.message and "end excluded" in r.message, r.message


def test_vocab_range_that_floors_an_indivisible_vocabulary_fails(sol12):
    def floor_range(vocab_size, group):  # BUG: drops the remainder ids silently
        n = vocab_size // dist.get_world_size(group)
        return dist.get_rank(group) * n, (dist.get_rank(group) + 1) * n

    r = grade(STEM, "vocab_parallel_ce", with_answer(sol12, vocab_range=floor_range), hidden=False)
    assert r.status == "failed" and "vocabulary of 10 ids" in r.message and "ValueError" in r.message, r.message


def test_vocab_ce_max_on_the_default_group_is_caught(sol12):
    class MaxOnTheWorld(sol12["VocabParallelCrossEntropy"]):
        @staticmethod
        def forward(ctx, logits_shard, target, group):
            original = dist.all_reduce

            def first_on_world(t, op=dist.ReduceOp.SUM, group=None, async_op=False):
                dist.all_reduce = original
                return original(t, op=op)  # BUG: the max of the first all-reduce runs over all 4 ranks
            dist.all_reduce = first_on_world
            try:
                return sol12["VocabParallelCrossEntropy"].forward(ctx, logits_shard, target, group)
            finally:
                dist.all_reduce = original

    r = grade(STEM, "vocab_parallel_ce", with_answer(sol12, VocabParallelCrossEntropy=MaxOnTheWorld), hidden=False)
    assert r.status == "failed" and "ran over 4 ranks" in r.message, r.message


# --- sequence parallelism ------------------------------------------------------------------------------

def _sp_block(sol, exit_region=None, norm_after_gather=False):
    """A SequenceParallelMLP whose exit region is ``exit_region`` (default: the solution's), optionally with the
    LayerNorm moved after the all-gather (the solution's classes resolve names in the solution's own globals,
    so a wrong region must be wired into a block here)."""
    gather = sol["GatherFromSequenceParallelRegion"]
    scatter = exit_region or sol["ReduceScatterToSequenceParallelRegion"]

    class Block(sol["SequenceParallelMLP"]):
        def forward(self, x):
            if norm_after_gather:  # BUG: LayerNorm stores the whole sequence on every rank
                h = self.ln(gather.apply(x, self.group))
            else:
                h = gather.apply(self.ln(x), self.group)
            h = F.linear(F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias)), self.fc2.weight)
            h = scatter.apply(h, self.group)
            h = h if self.fc2.bias is None else h + self.fc2.bias
            if self.training and self.dropout > 0:
                h = h * (torch.rand(h.shape, generator=self.generator) >= self.dropout) / (1 - self.dropout)
            return x + h
    return Block


def test_sequence_parallel_exit_as_an_all_reduce_then_a_slice_fails_although_its_values_are_right(sol12):
    class AllReduceThenSlice(sol12["ReduceScatterToSequenceParallelRegion"]):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            out = x.clone(memory_format=torch.contiguous_format)
            dist.all_reduce(out, group=group)  # BUG: all-reduce the whole sequence, then keep this rank's tokens
            return out.chunk(dist.get_world_size(group), 1)[dist.get_rank(group)].contiguous()

    block = _sp_block(sol12, exit_region=AllReduceThenSlice)
    r = grade(STEM, "sequence_parallel", with_answer(sol12, SequenceParallelMLP=block), hidden=False)
    assert r.status == "failed" and "all-reduce followed by a slice" in r.message, r.message


def test_sequence_parallel_layer_norm_on_the_gathered_sequence_fails_on_activation_memory(sol12):
    block = _sp_block(sol12, norm_after_gather=True)
    r = grade(STEM, "sequence_parallel", with_answer(sol12, SequenceParallelMLP=block), hidden=False)
    assert r.status == "failed" and "LayerNorm saved" in r.message and "before the all-gather" in r.message, r.message


def test_sequence_parallel_dropout_with_the_same_rng_on_every_rank_fails(sol12):
    class SameMask(sol12["SequenceParallelMLP"]):
        def __init__(self, hidden, ffn_hidden, process_group, dropout=0.0, bias=True, seed=0):
            super().__init__(hidden, ffn_hidden, process_group, dropout, bias, seed)
            self.generator = torch.Generator().manual_seed(seed)  # BUG: one stream for every rank's tokens

    r = grade(STEM, "sequence_parallel", with_answer(sol12, SequenceParallelMLP=SameMask), hidden=False)
    assert r.status == "failed" and "same RNG state" in r.message, r.message


def test_sequence_parallel_block_variant_without_bugs_passes(sol12):
    r = grade(STEM, "sequence_parallel", with_answer(sol12, SequenceParallelMLP=_sp_block(sol12)), hidden=False)
    assert r.status == "passed", r.message


# --- mixture of experts: routing -------------------------------------------------------------------------

def test_capacity_rounded_down_fails(sol12):
    r = grade(STEM, "moe_routing", with_answer(sol12, expert_capacity=lambda T, E, k, cf: int(cf * T * k / E)))
    assert r.status == "failed" and "that is the floor" in r.message, r.message


def _token_major_route(router_logits, top_k, capacity):
    """BUG: fills the slots token by token, so a token's 2nd choice beats the next token's 1st."""
    T, E = router_logits.shape
    weight, index = router_logits.softmax(-1).topk(top_k, dim=-1)
    seen = F.one_hot(index.reshape(-1), E).cumsum(0)
    position = (seen.gather(1, index.reshape(-1, 1)).squeeze(1) - 1).view(T, top_k)
    return index, weight, torch.where(position < capacity, position, torch.full_like(position, -1))


def test_route_dropping_the_wrong_tokens_fails(sol12):
    r = grade(STEM, "moe_routing", with_answer(sol12, route=_token_major_route))
    assert r.status == "failed" and "dropped the wrong choices" in r.message, r.message
    assert "token by token" in r.message


def test_route_with_softmax_after_top_k_fails(sol12):
    def softmax_after(router_logits, top_k, capacity):
        index, _, slot = sol12["route"](router_logits, top_k, capacity)
        return index, router_logits.topk(top_k, dim=-1).values.softmax(-1), slot  # BUG: renormalised weights

    r = grade(STEM, "moe_routing", with_answer(sol12, route=softmax_after))
    assert r.status == "failed" and "softmax AFTER top-k" in r.message, r.message


def test_load_balancing_loss_without_the_num_experts_factor_fails(sol12):
    def no_factor(router_logits, expert_index, num_experts):
        return sol12["load_balancing_loss"](router_logits, expert_index, num_experts) / num_experts  # BUG

    r = grade(STEM, "moe_routing", with_answer(sol12, load_balancing_loss=no_factor))
    assert r.status == "failed" and "num_experts factor is missing" in r.message, r.message


def test_load_balancing_loss_recomputing_the_index_from_the_logits_fails(sol12):
    def own_index(router_logits, expert_index, num_experts):
        mine = router_logits.topk(expert_index.shape[1], dim=-1).indices  # BUG: ignores the index it is given
        return sol12["load_balancing_loss"](router_logits, mine, num_experts)

    ex = exercises(STEM)["moe_routing"]
    for seed in (1, 2, 3):
        r = evaluate(ex, with_answer(sol12, load_balancing_loss=own_index), "cpu", ex.cases(seed, public=False))
        assert r.status == "failed" and r.score == 0 and "load_balancing_loss" in r.message, r.message


def test_route_ignoring_the_capacity_or_filling_token_by_token_fails_every_case_on_every_seed(sol12):
    def no_capacity(router_logits, top_k, capacity):
        index, weight, slot = sol12["route"](router_logits, top_k, router_logits.shape[0] * top_k)  # BUG: no drops
        return index, weight, slot

    ex = exercises(STEM)["moe_routing"]
    for seed in (1, 2, 3, 4):
        for route, said in ((no_capacity, "dropped the wrong choices"), (_token_major_route, "dropped the wrong")):
            r = evaluate(ex, with_answer(sol12, route=route), "cpu", ex.cases(seed, public=False))
            k2 = [c for c in r.cases if "top-2" in c.name]
            assert all(said in c.message for c in (r.cases if route is no_capacity else k2)), r.message


def test_all_to_all_bytes_counting_only_the_kept_tokens_fails(sol12):
    def kept_only(tokens, hidden, num_experts, top_k, capacity_factor, dtype_bytes):
        return tokens * top_k * hidden * dtype_bytes  # BUG: the buffer has E * capacity rows, empty slots included

    r = grade(STEM, "moe_routing", with_answer(sol12, moe_all_to_all_bytes=kept_only))
    assert r.status == "failed" and "empty slots" in r.message, r.message


# --- expert parallelism ----------------------------------------------------------------------------------

def _grade_expert_parallel(**entries):
    """The solution's ExpertParallelMoE with some names it looks up replaced (public case): in a fresh namespace,
    since the layer resolves them in the globals it was defined in."""
    ns = solution_namespace(STEM)
    ns.update(entries)
    return grade(STEM, "expert_parallel", ns, hidden=False)


def test_expert_parallel_layer_with_the_wrong_drop_order_fails():
    r = _grade_expert_parallel(route=_token_major_route)
    assert r.status == "failed" and "drops the wrong tokens" in r.message, r.message


def test_expert_parallel_exchange_built_from_all_gather_fails_although_its_values_are_right(sol12):
    class GatherExchange(sol12["AllToAll"]):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            p, me = dist.get_world_size(group), dist.get_rank(group)
            everyone = [torch.empty_like(x) for _ in range(p)]
            dist.all_gather(everyone, x.contiguous(), group=group)  # BUG: every rank receives every buffer
            return torch.cat([e.chunk(p)[me] for e in everyone])

        @staticmethod
        def backward(ctx, grad):
            return GatherExchange.forward(ctx, grad, ctx.group), None

    r = _grade_expert_parallel(AllToAll=GatherExchange)
    assert r.status == "failed" and "expected 2 all_to_all" in r.message, r.message


def test_expert_parallel_exchange_without_a_backward_exchange_fails(sol12):
    class NoBackwardExchange(sol12["AllToAll"]):
        @staticmethod
        def backward(ctx, grad):
            return grad, None  # BUG: the gradients stay on the rank that computed them

    r = _grade_expert_parallel(AllToAll=NoBackwardExchange)
    assert r.status == "failed" and ("x.grad" in r.message or "expert" in r.message), r.message


def test_expert_parallel_token_index_without_device_fails():
    """torch.arange(T) without device=: right on a CPU, a device mismatch beside CUDA tokens on a GPU; the check runs
    forward with torch's default device elsewhere, so it fails here too."""
    from tests import graderkit as kit

    ns = solution_namespace(STEM)
    exec(kit.solution_with(STEM, "expert_parallel", "torch.arange(T, device=x.device)", "torch.arange(T)"), ns)  # BUG
    r = grade(STEM, "expert_parallel", ns, hidden=False)
    assert r.status == "failed" and "device=x.device" in r.message, r.message


def test_moe_routing_do_nothing_answers_score_zero():
    from grader.checks import exercises
    from tests.graderkit import assert_do_nothing_scores_zero

    assert_do_nothing_scores_zero(exercises(STEM)["moe_routing"])


# --- the contract: the untouched lab scores zero, answers that compute nothing too, same rules every seed ---

def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM)  # a layer's stub raises in the probe: no rank starts


def test_tp_comm_volume_do_nothing_answers_score_zero():
    from tests.graderkit import assert_do_nothing_scores_zero

    assert_do_nothing_scores_zero(exercises(STEM)["tp_comm_volume"])


@pytest.mark.parametrize("eid", sorted(exercises(STEM)))
def test_every_hidden_set_covers_the_same_rules(eid):
    from tests.graderkit import assert_same_rules_every_seed

    assert_same_rules_every_seed(exercises(STEM)[eid], ())


def test_tp_allreduce_bytes_counting_a_single_rank_fails_on_every_seed(sol12):
    def counts_one_rank(block, batch, seq, hidden, dtype_bytes, tp_size):
        return sol12["tp_allreduce_bytes"](block, batch, seq, hidden, dtype_bytes, max(tp_size, 2))  # BUG: TP=1

    ex = exercises(STEM)["tp_comm_volume"]
    for seed in (1, 2, 3):
        r = evaluate(ex, with_answer(sol12, tp_allreduce_bytes=counts_one_rank), "cpu", ex.cases(seed, public=False))
        failed = [c.name.split(":")[0] for c in r.cases if c.status != "passed"]
        assert failed == ["TP=1"] and "with one rank nothing is all-reduced" in r.message, r.message
