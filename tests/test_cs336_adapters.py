"""Stanford CS336 assignment 2's tests, through thin adapters onto this project's solutions.

CS336's tests call learner code through ``tests/adapters.py``: one small function per piece, so the
tests survive any layout a learner chooses. The adapters below are those functions, with the
course's names and signatures (2025: ``get_ddp_individual_parameters``, ``get_ddp_bucketed`` and
their ``on_after_backward`` / ``on_train_batch_start`` hooks; 2026: ``get_ddp``), each mapping onto a
class of our solutions as it is: no reshaping, no re-implementation. A learner who finished labs 05
and 11 can paste them into the course's ``adapters.py``. The tests beneath exercise them the way the
course's tests do (its sizes, tolerances, toy models and training loops), on CPU: FlashAttention-2 in
PyTorch and in Triton (Triton's interpreter here, the GPU elsewhere), DDP, bucketed DDP and the
sharded optimizer and FSDP on 2 gloo ranks, one launch for all of them. The course's FSDP test trains
its own ``cs336_basics`` Transformer; here a small model built like it, from its own Embedding and Linear
classes (not torch.nn's), stands in for it, trained the same way in float32 and with float16 compute.
"""
from __future__ import annotations

import functools
import sys
from copy import deepcopy

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from gpulab.dist import launch
from tests.conftest import solution_namespace

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks need not import the tests


@functools.cache
def _lab(stem: str) -> dict:
    return solution_namespace(stem)


# Lab 11's classes, filled in before ranks start: cloudpickle ships them with the adapters.
LAB11: dict = {}


# --- the adapters (CS336's tests/adapters.py) -----------------------------------------------------

def get_flashattention_autograd_function_pytorch() -> type:
    """FlashAttention-2 in plain PyTorch: lab 05, exercise 3."""
    return _lab("05_flash_attention")["FlashAttentionPyTorch"]


def get_flashattention_autograd_function_triton() -> type:
    """FlashAttention-2 on Triton kernels: lab 05, exercises 4 and 6."""
    return _lab("05_flash_attention")["FlashAttentionFunction"]


def get_ddp_individual_parameters(module: nn.Module) -> nn.Module:
    """One asynchronous all-reduce per parameter, launched from its gradient hook: lab 11's ddp_overlap."""
    return LAB11["DDPIndividualParameters"](module)


def ddp_individual_parameters_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


get_ddp = get_ddp_individual_parameters                       # the 2026 names
ddp_on_after_backward = ddp_individual_parameters_on_after_backward


def get_ddp_bucketed(module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    # CS336: None means one bucket of unbounded size
    return LAB11["BucketedDDP"](module, float("inf") if bucket_size_mb is None else bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    pass  # BucketedDDP re-arms its buckets at the end of finish_gradient_synchronization


def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """ZeRO-3 over every rank: lab 11's fsdp. The course's Transformer builds its layers from its own
    ``Linear`` and ``Embedding`` classes (``cs336_basics.model``), not torch.nn's: the units are the
    module's own classes of those names (torch.nn's default types would match no module: FSDP refuses)."""
    unit_types = tuple({type(m) for m in module.modules() if type(m).__name__ in ("Linear", "Embedding")})
    return LAB11["FSDP"](module, unit_types=unit_types, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: nn.Module) -> dict:
    return fsdp_model.gather_full_params()


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    return LAB11["ShardedOptimizer"](params, optimizer_cls, **kwargs)


# --- FlashAttention-2 (CS336's tests/test_attention.py) -------------------------------------------

def _attention_and_lse(q, k, v, is_causal=False):
    """The course's reference: masked entries -1e6, softmax, and the log-sum-exp of the scores."""
    n_queries, n_keys, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / d ** 0.5
    if is_causal:
        s = torch.where(torch.arange(n_queries)[None, :, None] >= torch.arange(n_keys)[None, None, :], s, -1e6)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def _make_attn_inputs(device=None):
    torch.random.manual_seed(0)
    batch_size, n_queries, n_keys, d = 4, 128, 128, 64
    q = torch.randn(batch_size, n_queries, d, device=device, requires_grad=True)
    k = torch.randn(batch_size, n_keys, d, device=device, requires_grad=True)
    v = torch.randn(batch_size, n_keys, d, device=device, requires_grad=True)
    do = torch.randn(batch_size, n_queries, d, device=device)
    return q, k, v, do


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _test_flash_forward_pass(impl, device="cpu", is_causal=False):
    q, k, v, _ = _make_attn_inputs(device)
    o = impl(q, k, v, is_causal)
    maybe_ls = [t for t in o.grad_fn.saved_tensors if t.shape == (q.shape[0], q.shape[1])]
    assert len(maybe_ls) == 1, f"expected one saved tensor of shape {(q.shape[0], q.shape[1])}, found {len(maybe_ls)}"
    o_ref, l_ref = _attention_and_lse(*(t.detach().cpu() for t in (q, k, v)), is_causal)
    torch.testing.assert_close(o.detach().cpu(), o_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(maybe_ls[0].cpu(), l_ref, rtol=1e-2, atol=1e-2)


def _test_flash_backward(impl, device, is_causal):
    q, k, v, do = _make_attn_inputs()
    _attention_and_lse(q, k, v, is_causal)[0].backward(do)
    expected = q.grad, k.grad, v.grad
    q, k, v, do = _make_attn_inputs(device)
    impl(q, k, v, is_causal).backward(do)
    for want, got in zip(expected, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_forward_pass_pytorch(is_causal):
    _test_flash_forward_pass(get_flashattention_autograd_function_pytorch().apply, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_backward_pytorch(is_causal):
    _test_flash_backward(get_flashattention_autograd_function_pytorch().apply, "cpu", is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_forward_pass_triton(is_causal):
    _test_flash_forward_pass(get_flashattention_autograd_function_triton().apply, _device(), is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_backward_triton(is_causal):
    _test_flash_backward(get_flashattention_autograd_function_triton().apply, _device(), is_causal)


# --- DDP, bucketed DDP, sharded optimizer (CS336's test_ddp*.py, test_sharded_optimizer.py) --------

class _FC2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x):
        return self.fc(x)


class ToyModel(nn.Module):
    """The course's toy model: a frozen bias and a frozen parameter no forward uses."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = _FC2()
        self.fc3 = nn.Linear(50, 5, bias=False)
        self.relu = nn.ReLU()
        self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


class ToyModelWithTiedWeights(nn.Module):
    """The course's toy model with fc4 sharing fc2's weight."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 10, bias=False)
        self.fc4 = nn.Linear(10, 50, bias=False)
        self.fc5 = nn.Linear(50, 5, bias=False)
        self.fc4.weight = self.fc2.weight
        self.relu = nn.ReLU()

    def forward(self, x):
        for fc in (self.fc1, self.fc2, self.fc3, self.fc4):
            x = self.relu(fc(x))
        return self.fc5(x)


class Linear(nn.Module):
    """The course's own linear layer (``cs336_basics.model.Linear``): a (d_out, d_in) weight, no bias, not an
    ``nn.Linear``."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)

    def forward(self, x):
        return x @ self.weight.T  # (..., d_in) -> (..., d_out)


class Embedding(nn.Module):
    """The course's own embedding (``cs336_basics.model.Embedding``): a (vocab, d) weight, not an ``nn.Embedding``."""

    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, d))

    def forward(self, tokens):
        return self.weight[tokens]  # (B, S) -> (B, S, d)


class TinyLM(nn.Module):
    """Stands in for the course's Transformer in its FSDP test: built, like it, from its own Embedding and Linear
    classes, and a LayerNorm that is no unit (replicated)."""

    def __init__(self, vocab: int = 37, d: int = 24):
        super().__init__()
        self.embed = Embedding(vocab, d)
        self.up, self.down = Linear(d, 3 * d), Linear(3 * d, d)
        self.norm = nn.LayerNorm(d)
        self.head = Linear(d, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)  # (B, S, d)
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(self.norm(h))  # (B, S, vocab)


MODELS = {"ToyModel": ToyModel, "ToyModelWithTiedWeights": ToyModelWithTiedWeights}
# bucket sizes of the course's test (2 buckets, one per parameter, one for all) and None (unbounded)
BUCKETS = [0.0016, 0.0001, 0.01, None]
SCENARIOS = ([f"individual {m}" for m in MODELS] + [f"bucketed {b} {m}" for b in BUCKETS for m in MODELS]
             + [f"sharded {m}" for m in MODELS] + ["fsdp float32", "fsdp float16"])


def validate_ddp_net_equivalence(net) -> list:
    """The course's check that every rank holds the same model state (``net.module``), as failures."""
    problems = []
    for name, t in net.module.state_dict().items():
        gathered = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, t)
        problems += [f"{name} differs between ranks"] if not all(torch.allclose(g, t) for g in gathered) else []
    return problems


def _train_ddp(rank, world_size, model_class, wrap, on_after_backward, on_train_batch_start) -> list:
    """The body of CS336's DDP tests: rank-seeded models, rank 0's broadcast, 5 SGD steps on disjoint
    halves of a 20-example batch, each matching non-parallel training on the whole batch. Returns the
    failed comparisons (collected, not raised, so both ranks go on issuing the same collectives)."""
    problems = []
    torch.manual_seed(rank)  # ranks start different: the wrapper must broadcast rank 0's parameters
    non_parallel_model = model_class()
    ddp_model = wrap(deepcopy(non_parallel_model))
    for (name, p), q in zip(non_parallel_model.named_parameters(), ddp_model.parameters()):
        if torch.allclose(p, q) != (rank == 0 or "no_grad_fixed_param" in name):
            problems.append(f"{name} after the wrapper: rank 0's value expected on every rank")
    problems += validate_ddp_net_equivalence(ddp_model)
    gen = torch.Generator().manual_seed(2025)  # the course loads a fixed (20, 10) / (20, 5) pair
    all_x, all_y = torch.randn(20, 10, generator=gen), torch.randn(20, 5, generator=gen)
    local_bs = all_x.size(0) // world_size
    loss_fn = nn.MSELoss()
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    non_parallel_optimizer = torch.optim.SGD(non_parallel_model.parameters(), lr=0.1)
    for i in range(5):
        on_train_batch_start(ddp_model, ddp_optimizer)
        ddp_optimizer.zero_grad()
        non_parallel_optimizer.zero_grad()
        loss_fn(non_parallel_model(all_x), all_y).backward()
        non_parallel_optimizer.step()
        offset = rank * local_bs
        loss_fn(ddp_model(all_x[offset:offset + local_bs]), all_y[offset:offset + local_bs]).backward()
        on_after_backward(ddp_model, ddp_optimizer)
        ddp_optimizer.step()
        for (name, p), q in zip(non_parallel_model.named_parameters(), ddp_model.parameters()):
            if rank == 0 and not torch.allclose(p, q, atol=1e-4):  # rank 0's baseline started from rank 0's seed
                problems.append(f"step {i}: {name} {(p - q).abs().max().item():.2e} from non-parallel training")
        torch.manual_seed(42 + i)
        shuffle = torch.randperm(all_x.size(0))
        all_x, all_y = all_x[shuffle], all_y[shuffle]
    return problems + validate_ddp_net_equivalence(ddp_model)


def _train_sharded(rank, world_size, model_class) -> list:
    """The body of CS336's sharded-optimizer test: 10 AdamW steps, the same weights as unsharded AdamW."""
    torch.manual_seed(42)
    non_sharded_model = model_class()
    hyper = dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)
    non_sharded_optimizer = torch.optim.AdamW(non_sharded_model.parameters(), **hyper)
    sharded_model = deepcopy(non_sharded_model)
    sharded_optimizer = get_sharded_optimizer(sharded_model.parameters(), torch.optim.AdamW, **hyper)
    for _ in range(10):
        non_sharded_optimizer.zero_grad()
        sharded_optimizer.zero_grad()
        x, y = torch.rand(32, 10), torch.rand(32, 5)
        ((y - non_sharded_model(x)) ** 2).sum().backward()
        ((y - sharded_model(x)) ** 2).sum().backward()
        non_sharded_optimizer.step()
        sharded_optimizer.step()
    return [f"{name}: {(p - q).abs().max().item():.2e} from unsharded AdamW" for (name, p), q in
            zip(non_sharded_model.named_parameters(), sharded_model.parameters()) if not torch.allclose(p, q, atol=0)]


def _train_fsdp(rank, world_size, compute_dtype) -> list:
    """The body of CS336's FSDP test: the same seeded model, wrapped, 5 AdamW steps on this rank's half of
    each batch; the gathered full parameters match non-parallel training on the whole batch (float32
    compute: to 1e-4; float16 compute: to the course's looser 1e-2)."""
    torch.manual_seed(0)
    non_parallel_model = TinyLM()
    fsdp_model = get_fsdp(deepcopy(non_parallel_model), compute_dtype=compute_dtype)
    # Adam moves every weight by about lr whatever its gradient's size, so a gradient near zero whose
    # sign float16 rounding flips costs 2 lr: lr 1e-3 keeps that inside the float16 tolerance.
    hyper = dict(lr=1e-3, weight_decay=0.1)
    non_parallel_optimizer = torch.optim.AdamW(non_parallel_model.parameters(), **hyper)
    fsdp_optimizer = torch.optim.AdamW(fsdp_model.parameters(), **hyper)
    gen = torch.Generator().manual_seed(2025)
    atol = 1e-4 if compute_dtype is None else 1e-2
    problems = []
    for step in range(5):
        tokens = torch.randint(0, 37, (8, 6), generator=gen)  # (B, S), the same on every rank
        targets = torch.randint(0, 37, (8, 6), generator=gen)
        for model, optimizer, rows in ((non_parallel_model, non_parallel_optimizer, slice(None)),
                                       (fsdp_model, fsdp_optimizer, slice(rank * 4, rank * 4 + 4))):
            optimizer.zero_grad()
            logits = model(tokens[rows])  # (b, S, vocab)
            nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets[rows].flatten()).backward()
            if model is fsdp_model:
                fsdp_on_after_backward(fsdp_model, optimizer)
            optimizer.step()
        full = fsdp_gather_full_params(fsdp_model)
        problems += [f"step {step}: {name} {(p - full[name]).abs().max().item():.2e} from non-parallel training"
                     for name, p in non_parallel_model.named_parameters()
                     if not torch.allclose(p, full[name].float(), atol=atol)]
    return problems


def _scenario(rank, world_size, name) -> list:
    kind, *rest = name.split()
    if kind == "fsdp":
        return _train_fsdp(rank, world_size, None if rest[0] == "float32" else torch.float16)
    model_class = MODELS[rest[-1]]
    if kind == "individual":
        return _train_ddp(rank, world_size, model_class, get_ddp_individual_parameters,
                          ddp_individual_parameters_on_after_backward, lambda *a: None)
    if kind == "bucketed":
        bucket_mb = None if rest[0] == "None" else float(rest[0])
        return _train_ddp(rank, world_size, model_class, lambda m: get_ddp_bucketed(m, bucket_mb),
                          ddp_bucketed_on_after_backward, ddp_bucketed_on_train_batch_start)
    return _train_sharded(rank, world_size, model_class)


def _all_scenarios(rank, world_size, lab11) -> dict:
    """Every scenario on these ranks: its failed comparisons (an empty list: passed)."""
    torch.set_num_threads(1)  # tiny models on 2 ranks: extra threads would only wait for each other
    LAB11.update(lab11)
    return {name: _scenario(rank, world_size, name) for name in SCENARIOS}


@pytest.fixture(scope="module")
def ranks_results():
    sol = _lab("11_data_parallel")
    lab11 = {name: sol[name] for name in ("DDPIndividualParameters", "BucketedDDP", "ShardedOptimizer", "FSDP")}
    return launch(_all_scenarios, 2, lab11, backend="gloo", timeout_s=60)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lab11_through_the_course_adapters(ranks_results, scenario):
    failures = {rank: r[scenario] for rank, r in enumerate(ranks_results) if r[scenario]}
    assert not failures, failures


def test_fsdp_with_torch_nn_unit_types_refuses_the_course_model():
    """FSDP's default unit types (nn.Linear, nn.Embedding) match none of the course model's layers: lab 11's FSDP
    raises before any collective instead of silently replicating every parameter."""
    with pytest.raises(ValueError, match="no module of unit_types"):
        _lab("11_data_parallel")["FSDP"](TinyLM())
