"""Lab 09's checks: the solution passes; the mistakes pruning and distillation code really has are rejected
with a message that names them: a sparsity off by one (int() truncation, `<=` or `<` against the k-th
magnitude when magnitudes tie), per-layer and global confused, signed values ranked; rows zeroed instead of
removed, the next layer not shrunk or shrunk with the wrong columns; N:M groups along the wrong dim or per
row; pruned weights resurrected by the optimizer's state; a distillation loss without T^2, with the KL
swapped, the temperature on one side, the wrong reduction or a teacher that receives gradients. Also: a quantile
threshold, exactly k pruned but not the smallest; fc1's rows and fc2's columns in different orders, L1 or max
norms, float64 layers; reduction='sum', T instead of T^2, log-probabilities without log_target=True, probabilities
as kl_div's input, the soft cross-entropy for the KL, nll_loss on raw logits, a float64 loss."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

STEM = "09_pruning_distillation"
CHECKS, EX = load_lab(STEM), exercises(STEM)
sol09 = pytest.fixture(scope="module")(lambda: solution_namespace(STEM))


def _public(eid, ns):
    """The public cases only: enough to see a wrong answer's message, quickly."""
    return grade(STEM, eid, ns, hidden=False)


@pytest.mark.parametrize("eid", list(EX))
def test_solution_passes_public_and_hidden_cases(sol09, eid):
    result = grade(STEM, eid, sol09)
    assert result.status == "passed", result.message


def test_the_solution_earns_full_marks_and_the_untouched_lab_zero(sol09):
    import nbformat

    from grader.notebooks import answer_cells, exec_source, export_source
    from grader.release import release_notebook, render
    from tests.conftest import ROOT

    lab = nbformat.reads(render(release_notebook(ROOT / "solutions" / f"{STEM}.ipynb")), 4)
    ns = exec_source(export_source(lab, answer_cells(lab)), f"<labs/{STEM}.ipynb>")
    for eid, ex in EX.items():
        assert evaluate(ex, ns, "cpu").score == 0
        assert _public(eid, sol09).score == ex.points


def test_the_distillation_reference_is_pytorchs_kl_div_times_t_squared():
    s, t, y = torch.randn(6, 5), torch.randn(6, 5), torch.randint(0, 5, (6,))
    kl = F.kl_div(F.log_softmax(s / 3, -1), F.softmax(t / 3, -1), reduction="batchmean")
    want = 0.6 * 9 * kl + 0.4 * F.cross_entropy(s, y)
    assert torch.allclose(CHECKS.ref_distillation(s, t, y, 3.0, 0.6).float(), want, atol=1e-6)


def test_the_gpulab_pruning_helpers_are_seeded_and_keep_masks():
    from gpulab.pruning import distill_task, fit, semi_structured_support, zeros_vs_sparse_ms
    from gpulab.spirals import MLP, make_spirals

    x, y = make_spirals(20, seed=0)                                   # (80, 2), (80,)
    teacher = MLP(hidden=8)
    a, b = (distill_task(teacher, x, y, x, y, seed=1, n_transfer=30, noise=0.5) for _ in range(2))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.teacher_logits.shape == (30, 4)
    model = MLP(hidden=8)
    keep = torch.rand(model.linears[1].weight.shape) > 0.5
    fit(model, x, lambda logits: F.cross_entropy(logits, y), 5, 0.1,
        after_step=lambda: model.linears[1].weight.mul_(keep))
    assert bool((model.linears[1].weight[~keep] == 0).all())
    rows = zeros_vs_sparse_ms([0.0, 0.9], out_features=16, in_features=16, batch=4, repeats=1)
    assert [r["sparsity"] for r in rows] == [0.0, 0.9] and all(r["dense_ms"] > 0 and r["csr_ms"] > 0 for r in rows)
    assert "CPU" in semi_structured_support("cpu")


# --- magnitude masks --------------------------------------------------------------------------------

def _masks(bug: str = ""):
    """The solution's magnitude_masks with one plausible bug."""
    def ranked_together(weights, sparsity):
        mags = torch.cat([(w if bug == "signed" else w.abs()).view(-1) if bug == "view" else
                          (w if bug == "signed" else w.abs()).flatten() for w in weights])
        if bug == "quantile":  # BUG: a threshold at the sparsity quantile, ties all pruned
            return _split(mags > torch.quantile(mags, sparsity), weights)
        if bug == "ties to the largest":  # BUG: exactly k, but the shortfall below the tie taken from the largest
            k = round(sparsity * mags.numel())
            keep = mags >= (mags.kthvalue(k).values if k else -1)
            keep[mags.argsort(descending=True)[:k - int((~keep).sum())]] = False
            return _split(keep, weights)
        k = {"int": int(sparsity * mags.numel()), "plus one": round(sparsity * mags.numel()) + 1}.get(
            bug, round(sparsity * mags.numel()))
        if bug in ("<=", "<") and k:
            kth = mags.kthvalue(k).values
            keep = mags > kth if bug == "<=" else mags >= kth   # BUG: a threshold, ties all on one side
        else:
            keep = torch.ones_like(mags, dtype=torch.bool)
            keep[mags.argsort()[:k]] = False
        return [p.view(w.shape) for p, w in zip(keep.split([w.numel() for w in weights]), weights)]

    def magnitude_masks(weights, sparsity, scope="global"):
        if bug == "in place":
            for w in weights:
                w.add_(1e-3)  # BUG: writes to the weights
        per_layer = {"layer for global": True, "global for layer": False}.get(bug, scope == "layer")
        if per_layer:
            masks = [ranked_together([w], sparsity)[0] for w in weights]
        else:
            masks = ranked_together(weights, sparsity)
        return [m.float() for m in masks] if bug == "float" else masks
    return magnitude_masks


def _split(keep, weights):
    """A flat mask (n,) split back into one per weight."""
    return [p.view(w.shape) for p, w in zip(keep.split([w.numel() for w in weights]), weights)]


# --- structured pruning ------------------------------------------------------------------------------

def _prune_units(bug: str = ""):
    """The solution's prune_hidden_units with one plausible bug."""
    def prune_hidden_units(fc1, fc2, keep):
        p = {"L1": 1, "max": float("inf")}.get(bug, 2)
        norms = (fc2.weight.norm(dim=0) if bug == "fc2 norms" else fc1.weight.norm(p=p, dim=1)).detach()
        idx = (-norms if bug == "smallest" else norms).topk(keep).indices   # topk's order: any order of units passes
        if bug == "reversed":  # not a bug: the units in another order, the same order for both layers
            idx = idx.flip(0)
        if bug == "zeroed":
            new1 = nn.Linear(fc1.in_features, fc1.out_features, device=fc1.weight.device)
            new2 = nn.Linear(fc2.in_features, fc2.out_features, device=fc1.weight.device)
            mask = torch.zeros(fc1.out_features, 1, device=fc1.weight.device)
            mask[idx] = 1
            with torch.no_grad():
                new1.weight.copy_(fc1.weight * mask)
                new2.weight.copy_(fc2.weight)
                if fc1.bias is not None:
                    new1.bias.copy_(fc1.bias * mask[:, 0])
                    new2.bias.copy_(fc2.bias)
            return new1, new2
        device = None if bug == "default device" else fc1.weight.device  # BUG: built on the default device
        new1 = nn.Linear(fc1.in_features, keep, bias=fc1.bias is not None, device=device)
        with torch.no_grad():
            new1.weight.copy_(fc1.weight[idx])
            if fc1.bias is not None and bug != "bias":
                new1.bias.copy_(fc1.bias[idx])
        if bug == "fc2 kept":
            return new1, fc2
        cols = {"first columns": torch.arange(keep), "columns sorted": idx.sort().values}.get(bug, idx)
        new2 = nn.Linear(keep, fc2.out_features, bias=fc2.bias is not None, device=device)
        with torch.no_grad():
            new2.weight.copy_(fc2.weight[:, cols])
            if fc2.bias is not None:
                new2.bias.copy_(fc2.bias)
        if bug == "float64":
            return new1.double(), new2.double()
        if bug == "in place":
            with torch.no_grad():
                fc1.weight.zero_()
        return new1, new2
    return prune_hidden_units


# --- N:M masks -----------------------------------------------------------------------------------------

def _nm(bug: str = ""):
    """The solution's nm_mask with one plausible bug."""
    def nm_mask(w, n=2, m=4):
        if w.shape[1] % m and bug != "no check":
            raise ValueError("in_features must be a multiple of m")
        if bug == "output dim":  # BUG: groups of m rows of a column
            return _nm("")(w.T.contiguous(), n, m).T
        if bug == "per row":     # BUG: the n * in / m largest of each row
            k = n * w.shape[1] // m
            return torch.zeros_like(w, dtype=torch.bool).scatter_(1, w.abs().topk(k, dim=1).indices, True)
        groups = w.abs().reshape(w.shape[0], -1, m)           # (out, in // m, m); raises when in % m != 0
        if bug == "ties":        # BUG: a threshold at the n-th largest keeps every tie
            return (groups >= groups.topk(n, dim=-1).values[..., -1:]).reshape(w.shape)
        top = (-groups if bug == "smallest" else groups).topk(n, dim=-1).indices
        return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, top, True).reshape(w.shape)
    return nm_mask


# --- masked optimizer steps ---------------------------------------------------------------------------

def _step(bug: str = ""):
    """The solution's masked_train_step with one plausible bug."""
    def masked_train_step(model, masks, optimizer, x, y):
        if bug != "no zero_grad":
            optimizer.zero_grad()
        if bug == "mask before step":
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name in masks:
                        p.mul_(masks[name])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if bug == "mask grads":
            for name, p in model.named_parameters():
                if name in masks:
                    p.grad.mul_(masks[name])
        optimizer.step()
        if bug in ("", "no zero_grad", "inverted", "loss after"):
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name in masks:
                        p.mul_(~masks[name] if bug == "inverted" else masks[name])
        if bug == "loss after":
            return float(F.cross_entropy(model(x), y))
        return float(loss)
    return masked_train_step


def test_masking_only_gradients_fails_with_momentum_and_weight_decay_too(sol09):
    r = _public("masked_step", with_answer(sol09, masked_train_step=_step("mask grads")))
    assert [c.status for c in r.cases] == ["failed"] * 3, r.message


# --- the distillation loss -----------------------------------------------------------------------------

def _distill(bug: str = ""):
    """The solution's distillation_loss with one plausible bug."""
    def distillation_loss(s, t, y, T=4.0, alpha=0.9):
        t_ = t if bug == "no detach" else t.detach()
        if bug == "log softmax":
            log_s, log_t = torch.log(torch.softmax(s / T, -1)), torch.log(torch.softmax(t_ / T, -1))
        else:
            log_s = F.log_softmax(s / (1.0 if bug == "teacher only" else T), -1)
            log_t = F.log_softmax(t_ / (1.0 if bug == "student only" else T), -1)
        if bug == "swapped":
            log_s, log_t = log_t, log_s
        reduction = {"mean": "mean", "sum": "sum"}.get(bug, "batchmean")
        if bug == "no log_target":   # BUG: log-probabilities read as probabilities
            soft = F.kl_div(log_s, log_t, reduction=reduction)
        elif bug == "probabilities in":
            soft = F.kl_div(log_s.exp(), log_t.exp(), reduction=reduction)
        elif bug == "cross-entropy":  # BUG: -sum p_t log p_s, the KL plus the teacher's entropy
            soft = -(log_t.exp() * log_s).sum(-1).mean()
        else:
            soft = F.kl_div(log_s, log_t, reduction=reduction, log_target=True)
        scale = {"no T2": 1.0, "T": T}.get(bug, T * T)
        hard = F.nll_loss(s, y) if bug == "nll" else F.cross_entropy(s / T if bug == "soft ce" else s, y)
        a, b = (1 - alpha, alpha) if bug == "alpha" else (alpha, 1 - alpha)
        loss = a * scale * soft + b * hard
        return loss.item() if bug == "item" else loss.double() if bug == "float64" else loss
    return distillation_loss


# --- every plausible mistake fails with a message that names it ----------------------------------------

ENTRY = {"magnitude_prune": "magnitude_masks", "structured_prune": "prune_hidden_units", "nm_sparsity": "nm_mask",
         "masked_step": "masked_train_step", "distillation_loss": "distillation_loss"}
WRONG = [  # (exercise, the solution with one bug, the bug, what the message must say)
    ("magnitude_prune", _masks, "layer for global", "you ranked each layer separately (per-layer"),
    ("magnitude_prune", _masks, "global for layer", "that is global pruning"),
    ("magnitude_prune", _masks, "<=", "you pruned all of them (|w| <= threshold)"),
    ("magnitude_prune", _masks, "<", "You kept every weight tied with the k-th smallest magnitude"),
    ("magnitude_prune", _masks, "int", ") truncates to "),
    ("magnitude_prune", _masks, "plus one", "Off by one"),
    ("magnitude_prune", _masks, "signed", "rank by w.abs(), not w"),
    ("magnitude_prune", _masks, "float", "return torch.bool masks"),
    ("magnitude_prune", _masks, "in place", "the weights were modified"),
    ("magnitude_prune", _masks, "quantile", "you pruned all of them (|w| <= threshold)"),
    ("magnitude_prune", _masks, "ties to the largest", "prune the smallest magnitudes |w|"),
    ("magnitude_prune", _masks, "view", "a weight need not be contiguous"),
    ("structured_prune", _prune_units, "default device", "new_fc1 was built on torch's default device (meta)"),
    ("structured_prune", _prune_units, "zeroed", "zeroing rows keeps the dense shape"),
    ("structured_prune", _prune_units, "fc2 kept", "the next layer loses the input columns of the removed units"),
    ("structured_prune", _prune_units, "first columns", "matches the right fc1 rows with fc2's first `keep` columns"),
    ("structured_prune", _prune_units, "smallest", "matches the units of the smallest fc1 row norms"),
    ("structured_prune", _prune_units, "fc2 norms", "matches units ranked by fc2's column norms"),
    ("structured_prune", _prune_units, "bias", "new_fc2(relu(new_fc1(x)))"),
    ("structured_prune", _prune_units, "in place", "fc1 or fc2 was modified"),
    ("structured_prune", _prune_units, "columns sorted", "fc1's rows and fc2's columns in different orders"),
    ("structured_prune", _prune_units, "L1", "units ranked by the L1 norm of fc1's rows"),
    ("structured_prune", _prune_units, "float64", "new_fc1 holds torch.float64 weights"),
    ("nm_sparsity", _nm, "output dim", "Your mask is 2:4 along the output dim"),
    ("nm_sparsity", _nm, "per row", "not 2 per group: rank inside each group"),
    ("nm_sparsity", _nm, "no check", "Check it first and raise a ValueError"),
    ("nm_sparsity", _nm, "smallest", "keep the 2 largest magnitudes of the group"),
    ("nm_sparsity", _nm, "ties", "keeps exactly 2"),
    ("masked_step", _step, "masked once", "are nonzero again"),
    ("masked_step", _step, "mask grads", "moves them even when their gradient is zero"),
    ("masked_step", _step, "mask before step", "re-apply the masks to the weights after optimizer.step()"),
    ("masked_step", _step, "inverted", "True in a mask means keep"),
    ("masked_step", _step, "no zero_grad", "Gradients accumulated across steps"),
    ("masked_step", _step, "loss after", "the cross-entropy before the step"),
    ("distillation_loss", _distill, "no T2", "matches the soft term without the T^2 factor"),
    ("distillation_loss", _distill, "swapped", "matches KL(student || teacher)"),
    ("distillation_loss", _distill, "student only", "matches the temperature on the student's logits only"),
    ("distillation_loss", _distill, "teacher only", "matches the temperature on the teacher's logits only"),
    ("distillation_loss", _distill, "mean", "reduction='mean'"),
    ("distillation_loss", _distill, "alpha", "matches alpha weighting the hard-label loss"),
    ("distillation_loss", _distill, "soft ce", "matches the cross-entropy on the softened logits"),
    ("distillation_loss", _distill, "no detach", "the teacher's logits received a gradient"),
    ("distillation_loss", _distill, "log softmax", "use F.log_softmax"),
    ("distillation_loss", _distill, "item", "return the loss as a scalar tensor"),
    ("distillation_loss", _distill, "sum", "matches the KL summed over the batch (reduction='sum')"),
    ("distillation_loss", _distill, "T", "matches the soft term times T, not T^2"),
    ("distillation_loss", _distill, "no log_target", "needs log_target=True"),
    ("distillation_loss", _distill, "probabilities in", "its input must be log-probabilities"),
    ("distillation_loss", _distill, "cross-entropy", "matches the soft cross-entropy -sum p_t log p_s"),
    ("distillation_loss", _distill, "nll", "matches F.nll_loss on raw logits"),
    ("distillation_loss", _distill, "float64", "the loss is torch.float64, the logits torch.float32"),
]


@pytest.mark.parametrize("eid, answer, bug, says", WRONG, ids=[f"{w[0]}-{w[2]}" for w in WRONG])
def test_a_wrong_answer_is_named(sol09, eid, answer, bug, says):
    r = _public(eid, with_answer(sol09, **{ENTRY[eid]: answer(bug)}))
    assert r.status == "failed" and any(says in c.message for c in r.cases), r.message


@pytest.mark.parametrize("eid, answer", [("magnitude_prune", _masks), ("structured_prune", _prune_units),
                                         ("nm_sparsity", _nm), ("masked_step", _step),
                                         ("distillation_loss", _distill)])
def test_the_test_answers_without_their_bug_pass(sol09, eid, answer):
    assert _public(eid, with_answer(sol09, **{ENTRY[eid]: answer()})).status == "passed"


def test_units_ranked_by_their_largest_weight_are_named_on_the_hidden_cases(sol09):
    r = grade(STEM, "structured_prune", with_answer(sol09, prune_hidden_units=_prune_units("max")))
    assert r.status == "failed" and "units ranked by the largest |w| of fc1's rows" in r.message, r.message


def test_kept_units_in_any_order_pass_when_both_layers_use_it(sol09):
    """A hidden layer's units are a set: permuting fc1's rows and fc2's columns alike computes the same function,
    so the check compares outputs, not the order of the kept indices (sorted, topk's order or reversed)."""
    assert _public("structured_prune", with_answer(sol09, prune_hidden_units=_prune_units("reversed"))).score == 3


# --- answers that compute nothing earn nothing; every rule in every hidden set -------------------------

@pytest.mark.parametrize("eid", list(EX))
def test_empty_answers_score_zero_and_every_seed_draws_the_same_rules(eid):
    kit.assert_do_nothing_scores_zero(EX[eid])
    kit.assert_same_rules_every_seed(EX[eid])


@pytest.mark.parametrize("eid, answer, bug, says", [
    ("magnitude_prune", _masks, "view", "a weight need not be contiguous"),
    ("structured_prune", _prune_units, "default device", "was built on torch's default device"),
])
def test_non_contiguous_weights_and_the_default_device_are_in_every_hidden_set(sol09, eid, answer, bug, says):
    """Every hidden case gives one weight stored transposed (tied layers' are) and runs the answer with another
    default device: a .view on a weight or a layer built without device= fails on every seed."""
    ex = EX[eid]
    for seed in (1, 2, 3):
        r = evaluate(ex, with_answer(sol09, **{ENTRY[eid]: answer(bug)}), "cpu", ex.cases(seed, public=False))
        assert r.score == 0 and all(says in c.message for c in r.cases), (seed, r.message)
