"""Lab 14's checks: the solution passes; the mistakes serving code really has are rejected with a message
that names them: a RoPE offset not advanced, K and V swapped, a missing or unshifted causal mask, a cache
of repeated heads; GQA bytes counted with the query heads, the factor 2 forgotten, weights not
subtracted; weights read once per sequence; over-allocating, leaking or unchecked block managers; a
scheduler admitting past the budget, serving newest first (starvation), skipping ahead or never
retiring; speculative decoding resampling from the draft, always accepting or dropping the bonus token;
a kernel reading logical blocks, missing the last block's mask or mapping heads wrongly."""
import math

import pytest
import torch
import triton
import triton.language as tl

from gpulab.serving import BudgetExceeded, Request, make_trace, simulate
from gpulab.tiny_lm import LMConfig, make_lm
from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from grader.kit.neutral import case_rules, failed_rules, in_written_order, rules_differ
from tests import graderkit as kit
from tests import mutants
from tests.conftest import HIDDEN_SEED, grade, solution_namespace, with_answer

STEM = "14_inference_serving"
CHECKS = load_lab(STEM)
EX = exercises(STEM)


def rules_failed(result) -> list:
    """The rules of the cases ``result`` (a grade: public cases, and hidden ones from HIDDEN_SEED) did not pass."""
    return failed_rules(EX[result.id], result, HIDDEN_SEED)


def public(stem: str, eid: str, ns: dict, n: int | None = None):
    """``eid`` on its first ``n`` public cases, in the order the generator writes them: a message, quickly."""
    return evaluate(EX[eid], ns, "cpu", in_written_order(EX[eid])[:n])


@pytest.fixture(scope="module")
def sol14():
    return solution_namespace(STEM)






@pytest.mark.parametrize("eid", list(EX))
def test_solution_passes_public_and_hidden_cases(sol14, eid):
    result = grade(STEM, eid, sol14)
    assert result.status == "passed", result.message


def test_the_references_agree_with_the_model_and_the_statistics():
    model = make_lm(LMConfig(vocab=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48), seed=3,
                    dtype=torch.float64)
    tokens = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        logits, cache = CHECKS.reference_cached(model, tokens, [4, 2, 1, 1, 1])
        assert torch.allclose(logits, model(tokens), atol=1e-10)
    assert cache[0][0].shape == (2, 2, 9, 8)
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert CHECKS.chi2_pvalue(torch.tensor([500.0, 300.0, 200.0]), probs) > 0.99
    assert CHECKS.chi2_pvalue(torch.tensor([400.0, 400.0, 200.0]), probs) < 1e-6
    assert CHECKS.chi2_pvalue(torch.tensor([5.0, 0.0, 5.0]), torch.tensor([0.5, 0.5, 0.0])) == 0.0
    assert torch.allclose(CHECKS.accept_count_probs(torch.tensor([0.5, 0.5])).float(), torch.tensor([0.5, 0.25, 0.25]))


# --- the KV-cached forward --------------------------------------------------------------------------

def _forward_cached(bug: str = ""):
    """The solution's forward_cached with one plausible bug."""
    def forward_cached(model, tokens, cache=None):
        b, t = tokens.shape
        past = 0 if cache is None else cache[0][0].shape[2]
        positions = torch.arange(t) if bug == "positions" else torch.arange(past, past + t)  # BUG: offset
        keep = torch.ones(t, past + t, dtype=torch.bool).tril(0 if bug == "unshifted" else past)
        if bug == "no mask":
            keep[:] = True
        x = model.embed(tokens)
        new_cache = []
        for i, block in enumerate(model.blocks):
            q, k, v = block.project_qkv(x, positions)
            group = q.shape[1] // k.shape[1]
            if bug == "repeated heads":  # BUG: repeats for the query heads before caching
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
                group = 1
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            new_cache.append((v, k) if bug == "swapped" else (k, v))
            kh, vh = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = q @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
            x = x + block.project_out(scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vh)
            x = x + block.feed_forward(x)
        if bug == "not extended" and cache is not None:
            new_cache = cache
        return model.logits(x), new_cache
    return forward_cached


@pytest.mark.parametrize("bug, says", [
    ("positions", "positions restarting at 0 in every call"),
    ("swapped", "keys and values swapped in the cache"),
    ("no mask", "no causal mask inside a chunk"),
    ("unshifted", "a causal mask not shifted by the cached length"),
    ("repeated heads", "store the n_kv_heads = 2 key/value heads"),
    ("not extended", "append the new positions' keys and values"),
])
def test_a_wrong_cached_forward_is_named(sol14, bug, says):
    r = public(STEM, "kv_cache_decode", with_answer(sol14, forward_cached=_forward_cached(bug)), 2)  # MHA, then GQA
    assert r.status == "failed" and says in r.message, r.message


def test_a_cache_stored_swapped_but_read_consistently_is_caught_on_the_cache(sol14):
    fixed = _forward_cached()

    def forward_cached(model, tokens, cache=None):  # BUG: the pair is (v, k), consistently
        logits, new = fixed(model, tokens, None if cache is None else [(k, v) for v, k in cache])
        return logits, [(v, k) for k, v in new]

    r = public(STEM, "kv_cache_decode", with_answer(sol14, forward_cached=forward_cached))
    assert r.status == "failed" and "the cache pair is (values, keys)" in r.message


def test_recomputing_every_position_is_not_a_cache(sol14):
    history = {}

    def forward_cached(model, tokens, cache=None):  # BUG: keeps the tokens and reruns the whole prefix
        seen = tokens if cache is None else torch.cat([history["tokens"], tokens], 1)
        history["tokens"] = seen
        logits, new = _forward_cached()(model, seen, None)
        return logits[:, -tokens.shape[1]:], new

    r = public(STEM, "kv_cache_decode", with_answer(sol14, forward_cached=forward_cached))
    assert r.status == "failed" and "the q/k/v projections ran over" in r.message


# --- bytes and the roofline ---------------------------------------------------------------------------

def test_kv_bytes_with_the_query_heads_is_named(sol14):
    def kv_cache_bytes(spec, batch, seq_len, dtype_bytes):  # BUG: n_heads, not n_kv_heads
        return 2 * spec.n_layers * spec.n_heads * spec.head_dim * dtype_bytes * batch * seq_len
    r = grade(STEM, "kv_cache_bytes", with_answer(sol14, kv_cache_bytes=kv_cache_bytes))
    assert r.status == "failed" and "Yours counts n_heads: the query heads" in r.message
    assert set(rules_failed(r)) >= {"grouped-query attention", "multi-query attention"}


def test_kv_bytes_without_the_factor_2_is_named(sol14):
    def kv_cache_bytes(spec, batch, seq_len, dtype_bytes):  # BUG: K only
        return spec.n_layers * spec.n_kv_heads * spec.head_dim * dtype_bytes * batch * seq_len
    r = grade(STEM, "kv_cache_bytes", with_answer(sol14, kv_cache_bytes=kv_cache_bytes))
    assert r.status == "failed" and r.score == 0 and "one of K and V" in r.message


@pytest.mark.parametrize("max_batch, says", [
    (lambda spec, s, gpu, w, kvb: int(gpu // (2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * kvb * s)),
     "subtract the weights first"),
    (lambda spec, s, gpu, w, kvb: int((gpu - spec.n_params * w) // (2 * spec.n_layers * spec.n_kv_heads
                                                                     * spec.head_dim * kvb * s)),
     "return 0 when the weights leave no room"),
])
def test_a_wrong_max_batch_is_named(sol14, max_batch, says):
    r = grade(STEM, "kv_cache_bytes", with_answer(sol14, max_batch=max_batch))
    assert r.status == "failed" and says in r.message, r.message


def _step(bug):
    def step_roofline(spec, batch, new_tokens, context, dtype_bytes, peaks):
        r = dict(CHECKS.ref_step(spec, batch, new_tokens, context, dtype_bytes, peaks))
        t_c, t_m = r["flops"] / (peaks.matmul_tflops * 1e12), r["bytes"] / (peaks.copy_gbps * 1e9)
        if bug == "weights per sequence":
            r["bytes"] += spec.n_params * dtype_bytes * (batch - 1)
        elif bug == "sum":
            r["seconds"] = t_c + t_m
        elif bug == "matmuls only":
            r["flops"] = 2 * spec.n_params * batch * new_tokens
        return r
    return step_roofline


@pytest.mark.parametrize("bug, says", [
    ("weights per sequence", "the whole batch shares one read of the weights"),
    ("sum", "the sum of the two times"),
    ("matmuls only", "only the matmuls"),
])
def test_a_wrong_roofline_step_is_named(sol14, bug, says):
    r = grade(STEM, "decode_roofline", with_answer(sol14, step_roofline=_step(bug)))
    assert r.status == "failed" and says in r.message, r.message


# --- the block manager --------------------------------------------------------------------------------

def _block_manager(sol, bug):
    base = sol["BlockManager"]

    class BlockManager(base):
        def append(self, seq_id, n_tokens=1):
            length = self.lengths.get(seq_id, 0)
            table = self.tables.setdefault(seq_id, [])
            if bug == "a block per append":
                need = -(-n_tokens // self.block_size)
            else:
                need = -(-(length + n_tokens) // self.block_size) - len(table)
            if bug == "reallocates" and need > 0:  # BUG: grows like a contiguous buffer, all blocks anew
                self.free_blocks[:0] = table  # handed out last
                table.clear()
                need = -(-(length + n_tokens) // self.block_size)
            if bug != "partial allocation" and need > len(self.free_blocks):
                raise MemoryError
            for _ in range(need):
                if not self.free_blocks:
                    raise MemoryError  # BUG (partial allocation): the blocks taken so far are lost
                table.append(self.free_blocks.pop())
            self.lengths[seq_id] = length + n_tokens
            offset = 1 if bug == "offset" else 0
            return [(table[p // self.block_size], (p + offset) % self.block_size) for p in range(length,
                                                                                                length + n_tokens)]

        def free(self, seq_id):
            if bug != "free keeps the blocks":
                self.free_blocks.extend(self.tables[seq_id])
            del self.tables[seq_id], self.lengths[seq_id]

    return BlockManager


@pytest.mark.parametrize("bug, says, rule", [
    ("a block per append", "take a new block only when the last one is full", "one token at a time"),
    ("partial allocation", "a failed append must change nothing", "an append that does not fit changes nothing"),
    ("free keeps the blocks", "Blocks go back to the pool on free()", "free and reuse"),
    ("offset", "go to (block_table[p // block_size], p % block_size)", "one token at a time"),
    ("reallocates", "blocks that hold its cached keys and values must stay", "one token at a time"),
])
def test_a_wrong_block_manager_is_caught(sol14, bug, says, rule):
    r = grade(STEM, "paged_kv", with_answer(sol14, BlockManager=_block_manager(sol14, bug)))
    assert r.status == "failed" and says in r.message, r.message
    assert rule in rules_failed(r)


def test_a_block_manager_that_never_runs_out_is_caught(sol14):
    base = sol14["BlockManager"]

    class BlockManager(base):  # BUG: no capacity check, ids past the pool
        def append(self, seq_id, n_tokens=1):
            if not self.free_blocks:
                self.free_blocks.append(10**6 + len(self.lengths))
            try:
                return super().append(seq_id, n_tokens)
            except MemoryError:
                self.free_blocks += list(range(10**6, 10**6 + 64))
                return super().append(seq_id, n_tokens)

    r = grade(STEM, "paged_kv", with_answer(sol14, BlockManager=BlockManager))
    assert r.status == "failed" and "append must raise MemoryError" in r.message


# --- the scheduler -------------------------------------------------------------------------------------

def _scheduler(sol, bug):
    base = sol["Scheduler"]

    class Scheduler(base):
        def __init__(self, num_blocks, block_size, max_batch):
            super().__init__(10**9 if bug == "no budget" else num_blocks, block_size, max_batch)
            self.running = []

        def step(self):
            order = sorted(self.live, key=lambda r: (r.arrival, r.rid), reverse=bug == "newest first")
            if bug == "never preempts":  # BUG: running requests stay, whatever their blocks
                order = self.running + [r for r in order if r not in self.running]
            batch, used = [], 0
            for r in order:
                need = -(-(r.prompt_len + self.generated[r.rid]) // self.block_size)
                if r in self.running and bug == "never preempts":
                    batch.append(r)
                    used += need
                    continue
                if len(batch) == self.max_batch or used + need > self.num_blocks:
                    if bug == "skips ahead":
                        continue
                    break
                batch.append(r)
                used += need
            for r in batch:
                self.generated[r.rid] += 1
                if self.generated[r.rid] == r.max_new_tokens and bug != "never retires":
                    self.live.remove(r)
            self.running = [r for r in batch if r in self.live]
            return [r.rid for r in batch]

    return Scheduler


@pytest.mark.parametrize("bug, says, rule", [
    ("no budget", "over the budget", "requests that outgrow the budget (preemption)"),
    ("never preempts", "Preempt the newest running request(s)", "requests that outgrow the budget (preemption)"),
    ("newest first", "(starvation)", "a stream of arrivals behind a long request"),
    ("skips ahead", "stop at the first request that does not fit", "a large prompt at the head of the queue"),
    ("never retires", "retire it", "light load"),
])
def test_a_wrong_scheduler_is_caught_where_it_matters(sol14, bug, says, rule):
    r = grade(STEM, "continuous_batching", with_answer(sol14, Scheduler=_scheduler(sol14, bug)))
    assert r.status == "failed", r.message
    rules = case_rules(EX["continuous_batching"], HIDDEN_SEED)
    failed = [c for c in r.cases if rules.get(c.name) == rule]
    assert failed and failed[0].status == "failed" and says in failed[0].message, [c.message for c in failed]


def test_the_simulated_server_refuses_a_batch_over_the_budget(sol14):
    trace = [Request(i, 0.0, 20, 4) for i in range(4)]  # 2 blocks of 16 each, all along
    step_time = lambda prefill, decode: 1e-3  # noqa: E731
    ok = simulate(sol14["Scheduler"](4, 16, 8), trace, step_time, num_blocks=4, block_size=16, max_batch=8)
    assert all(blocks <= 4 for _, _, blocks, _ in ok.steps) and ok.preemptions == 0
    with pytest.raises(BudgetExceeded, match="the budget is 4"):
        simulate(_scheduler(sol14, "no budget")(4, 16, 8), trace, step_time, num_blocks=4, block_size=16,
                 max_batch=8)
    assert make_trace(5, 10, 2.0) == make_trace(5, 10, 2.0) and make_trace(5, 10, 2.0)[0].arrival == 0.0


# --- speculative decoding ---------------------------------------------------------------------------

def _verify(bug):
    def speculative_verify(draft_tokens, q, p, gen):
        out = []
        for i in range(len(draft_tokens)):
            x = int(draft_tokens[i])
            u = torch.rand(1, generator=gen).item()
            accept = {"always accepts": True, "accepts with p(x)": u < p[i, x]}.get(bug, u * q[i, x] < p[i, x])
            if accept:
                out.append(x)
                continue
            dist = {"resamples from q": q[i], "resamples from p": p[i]}.get(bug, (p[i] - q[i]).clamp_min(0))
            out.append(int(torch.multinomial(dist, 1, generator=gen)))
            return out
        if bug != "no bonus token":
            out.append(int(torch.multinomial(q[-1] if bug == "bonus from q" else p[-1], 1, generator=gen)))
        return out
    return speculative_verify


@pytest.mark.parametrize("bug, says", [
    ("resamples from q", "match resampling from the draft's q on a rejection"),
    ("resamples from p", "match resampling from the target's p on a rejection"),
    ("always accepts", "match accepting every draft token"),
    ("accepts with p(x)", "match accepting draft x with probability p(x)"),
    ("no bonus token", "match no bonus token"),
    ("bonus from q", "match sampling it from the draft's last distribution"),
])
def test_a_wrong_rejection_sampler_fails_the_statistical_test(sol14, bug, says):
    r = public(STEM, "speculative_decoding", with_answer(sol14, speculative_verify=_verify(bug)), 1)
    assert r.status == "failed" and says in r.message and "chi-square p-value" in r.message, r.message


def test_resampling_from_the_draft_fails_on_every_rule(sol14):
    ex = EX["speculative_decoding"]
    r = evaluate(ex, with_answer(sol14, speculative_verify=_verify("resamples from q")), "cpu", ex.cases(3, False))
    assert r.score == 0


def test_a_sampler_that_returns_tokens_that_are_not_the_drafts_is_rejected(sol14):
    def speculative_verify(draft_tokens, q, p, gen):  # BUG: samples every token from p (no drafts kept)
        return [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(len(draft_tokens) + 1)]
    r = public(STEM, "speculative_decoding", with_answer(sol14, speculative_verify=speculative_verify), 2)
    assert r.status == "failed" and "a prefix of the draft" in r.message


# --- the paged decode-attention kernel --------------------------------------------------------------

@triton.jit
def _paged_kernel_bug(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale,
                      stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb, stride_ob, stride_oh,
                      GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BUG: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + seq * stride_qb + head * stride_qh + d).to(tl.float32)
    n = tl.load(lens_ptr + seq)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    if BUG == 3:  # BUG: key/value head head % n_kv_heads
        kv_head = (head % (tl.num_programs(1) // GROUP)) * stride_kh
    else:
        kv_head = (head // GROUP) * stride_kh
    for j in range(0, tl.cdiv(n, BLOCK_SIZE)):
        if BUG == 1:  # BUG: the logical block index, no block-table lookup
            block = j
        else:
            block = tl.load(table_ptr + seq * stride_tb + j).to(tl.int64)
        valid = j * BLOCK_SIZE + slots < n
        if BUG == 2:  # BUG: no mask on the last, partly filled block
            valid = slots < BLOCK_SIZE
        offs = block * stride_kb + kv_head + slots[:, None] * stride_ks + d[None, :]
        k = tl.load(k_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + d, (acc / l).to(out_ptr.dtype.element_ty))


def _paged_attention(bug):
    def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, out=None):
        b, h, d = q.shape
        _, block_size, n_kv, _ = k_cache.shape
        out = torch.empty_like(q) if out is None else out
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        _paged_kernel_bug[(b, h)](q, k_cache, v_cache, block_tables, seq_lens, out, scale,
                                  q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                  block_tables.stride(0), out.stride(0), out.stride(1),
                                  GROUP=h // n_kv, BLOCK_SIZE=block_size, HEAD_DIM=d, BUG=bug)
        return out
    return paged_decode_attention


def test_the_test_kernel_without_its_bug_passes(sol14):
    r = public(STEM, "paged_decode_attention", with_answer(sol14, paged_decode_attention=_paged_attention(0)))
    assert r.status == "passed", r.message


@pytest.mark.parametrize("bug, says, rule", [
    (1, "matches attention over the logical block index", "a partial last block"),
    (2, "matches attention over every slot of the last block", "a partial last block"),
    (3, "matches key/value head = head % n_kv_heads", "grouped-query heads"),
])
def test_a_wrong_paged_kernel_is_named(sol14, bug, says, rule):
    r = grade(STEM, "paged_decode_attention", with_answer(sol14, paged_decode_attention=_paged_attention(bug)))
    assert r.status == "failed" and says in r.message, r.message
    assert rule in rules_failed(r)


def test_pytorch_doing_the_attention_earns_nothing(sol14):
    def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, out=None):
        want = CHECKS.ref_paged_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                          scale or 1 / math.sqrt(q.shape[-1]))
        return out.copy_(want)
    r = public(STEM, "paged_decode_attention", with_answer(sol14, paged_decode_attention=paged_decode_attention))
    assert r.score == 0 and "no Triton kernel was launched" in r.message


# --- answers that compute nothing earn nothing; every rule in every hidden set -------------------------

def test_the_untouched_lab_scores_zero():
    kit.assert_untouched_lab_scores_zero(STEM)


@pytest.mark.parametrize("eid", list(EX))
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(EX[eid])


@pytest.mark.parametrize("eid", list(EX))
def test_every_hidden_set_covers_the_same_rules(eid):
    assert rules_differ(EX[eid]) is None


def _delegating_scheduler():
    """A Scheduler that hands its work to a course helper (lab 16's batcher) held in an attribute."""
    from gpulab import planning

    class Scheduler:
        def __init__(self, num_blocks, block_size, max_batch):
            self.inner = planning._OldestFirst(max_batch)

        def add(self, request):
            self.inner.add(request)

        def step(self):
            return self.inner.step()
    return Scheduler


def _spoofed_scheduler():
    """A course helper under the learner's module name: where its code lives still says gpulab."""
    from gpulab.planning import _OldestFirst

    members = {k: v for k, v in vars(_OldestFirst).items() if k not in ("__dict__", "__weakref__")}
    spoofed = type("Scheduler", (), members)
    spoofed.__module__ = "__main__"
    return spoofed


@pytest.mark.parametrize("how", ["delegating", "spoofed module", "subclass"])
def test_a_scheduler_reaching_the_course_helpers_earns_nothing(sol14, how):
    """No gpulab helper computes this policy; one that batches for lab 16's planner, handed in, held or
    renamed, earns nothing."""
    from gpulab.planning import _OldestFirst

    scheduler = {"delegating": _delegating_scheduler, "spoofed module": _spoofed_scheduler,
                 "subclass": lambda: type("Scheduler", (_OldestFirst,), {})}[how]()
    r = grade(STEM, "continuous_batching", with_answer(sol14, Scheduler=scheduler))
    assert r.score == 0 and "a course helper this lab does not offer" in r.message, r.message
    assert "gpulab" in r.message and "write your own" in r.message


def test_kv_bytes_from_lab_16s_helper_earns_nothing(sol14):
    from gpulab.planning import kv_bytes_per_token

    def kv_cache_bytes(spec, batch, seq_len, dtype_bytes):  # lab 16's helper is this exercise
        return kv_bytes_per_token(spec, dtype_bytes) * batch * seq_len
    r = grade(STEM, "kv_cache_bytes", with_answer(sol14, kv_cache_bytes=kv_cache_bytes))
    assert r.score == 0 and "gpulab.planning.kv_bytes_per_token, a course helper" in r.message, r.message


def test_the_gpulab_helpers_no_longer_hold_the_policy():
    """The batcher lab 16's planner simulates with ignores the memory budget (its replicas are sized so that
    memory never binds), so it is not this exercise's answer."""
    import gpulab.planning

    assert not hasattr(gpulab.planning, "FCFSBatcher")


# --- plausible wrong answers, the solution's text changed: each fails on every seed, and says why ------------

MUTANTS = [  # (exercise, the solution's text, the mistake, what the message says)
    ("kv_cache_bytes", "kv_cache_bytes(spec, 1, seq_len, kv_dtype_bytes)",
     "kv_cache_bytes(spec, 1, seq_len, weight_bytes)", "the cache counted in the weights' bytes"),
    ("kv_cache_bytes", "free = gpu_bytes - spec.n_params * weight_bytes",
     "free = gpu_bytes - spec.n_params * kv_dtype_bytes", "the weights counted in the cache's bytes"),
    ("kv_cache_bytes", "spec.n_kv_heads * spec.head_dim", "spec.n_heads * spec.head_dim", "the query heads"),
    ("kv_cache_bytes", "return 2 * spec.n_layers", "return spec.n_layers", "a factor 2"),
    ("kv_cache_bytes", "free = gpu_bytes - spec.n_params * weight_bytes", "free = gpu_bytes", "subtract the weights"),
    ("kv_cache_bytes", "return max(0, int(free // kv_cache_bytes(spec, 1, seq_len, kv_dtype_bytes)))",
     "return int(free // kv_cache_bytes(spec, 1, seq_len, kv_dtype_bytes))", "a negative count"),
    ("kv_cache_bytes", "int(free // kv_cache_bytes(spec, 1, seq_len, kv_dtype_bytes))",
     "round(free / kv_cache_bytes(spec, 1, seq_len, kv_dtype_bytes))", "max_batch"),
    ("decode_roofline", "4 * spec.n_layers * spec.n_heads * spec.head_dim",
     "4 * spec.n_layers * spec.n_kv_heads * spec.head_dim", "every query head computes its own scores"),
    ("decode_roofline", "new_tokens * (new_tokens + 1) / 2", "new_tokens * new_tokens", "the causal half"),
    ("decode_roofline", "attended = new_tokens * context + new_tokens * (new_tokens + 1) / 2",
     "attended = new_tokens * context", "token i of the step attends context + i + 1 keys"),
    ("decode_roofline", "kv_cache_bytes(spec, batch, context + new_tokens, dtype_bytes)",
     "kv_cache_bytes(spec, batch, context, dtype_bytes)", "context + new_tokens positions"),
    ("decode_roofline", "max(t_compute, t_memory)", "t_compute + t_memory", "the sum of the two times"),
    ("decode_roofline", "+ 4 * spec.n_layers", "+ 2 * spec.n_layers", "plus attention"),
    ("paged_kv", "need = -(-(length + n_tokens) // self.block_size) - len(table)",
     "need = (length + n_tokens) // self.block_size + 1 - len(table)", "take a new block only when"),
    ("paged_kv", "if need > len(self.free_blocks):", "if need >= len(self.free_blocks):", "raised MemoryError, but"),
    ("paged_kv", "        del self.lengths[seq_id]\n", "", "operation"),
    ("continuous_batching", "need = -(-(r.prompt_len + self.generated[r.rid]) // self.block_size)",
     "need = -(-r.prompt_len // self.block_size)", "over the budget"),
    ("continuous_batching", "need = -(-(r.prompt_len + self.generated[r.rid]) // self.block_size)",
     "need = -(-(r.prompt_len + self.generated[r.rid] + 1) // self.block_size)", "fits beside the batch"),
    ("continuous_batching", "                break  # no skipping ahead", "                continue  # no skipping",
     "stop at the first request that does not fit"),
    ("continuous_batching", "if len(batch) == self.max_batch or", "if len(batch) > self.max_batch or",
     "more than max_batch"),
    ("continuous_batching", "for r in self.live:\n            need", "for r in reversed(self.live):\n            need",
     "(starvation)"),
    ("continuous_batching", "if self.generated[r.rid] == r.max_new_tokens:",
     "if self.generated[r.rid] > r.max_new_tokens:", "retire it"),
    ("speculative_decoding", "item() * float(q[i, x]) < float(p[i, x])", "item() < float(p[i, x])",
     "with probability p(x)"),
    ("speculative_decoding", "torch.multinomial(p[-1], 1", "torch.multinomial(q[-1], 1", "the bonus token"),
    ("speculative_decoding", "(p[i] - q[i]).clamp_min(0)", "(p[i] - q[i]).abs()", "the first token you emit"),
    ("speculative_decoding", "residual = (p[i] - q[i]).clamp_min(0)", "residual = p[i]", "not from the residual"),
    ("speculative_decoding", "torch.multinomial(p[-1], 1", "torch.multinomial(p[-2], 1", "the bonus token"),
]


@pytest.mark.parametrize("eid, old, new, says", MUTANTS, ids=mutants.ids(MUTANTS))
def test_a_plausible_mistake_fails_on_every_seed_and_says_why(sol14, eid, old, new, says):
    mutants.assert_fails_on_every_seed(EX[eid], mutants.mutated(STEM, sol14, eid, old, new), says)
