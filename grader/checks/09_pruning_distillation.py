"""Checks of lab 09, pruning and distillation: magnitude masks, shrinking hidden units, N:M masks, training with masks,
and the distillation loss. One weight of each magnitude case, and every N:M weight, is non-contiguous (stored
transposed, as a tied layer's is): a ``.view`` that flattens it is named.

Beyond plain output equality (curriculum, lab 09 "C:"): the exact number of pruned weights (``round(s * n)``, with
ties at the threshold, so ``<=`` and ``<`` against the k-th magnitude both miss it) in the right scope (global ranks
every layer together, per-layer each alone; layers of different scales tell them apart); structured pruning that
builds smaller ``nn.Linear`` layers where fc1 lives (not on torch's default device: the run side makes
another device the default first), shrinks the next layer's input to match and computes what the masked model
computes (the kept units in any order, as long as fc1's rows and fc2's columns share it: a layer's units are a set,
so the output, not the index order, is compared; rows and columns in different orders, L1 or max norms and float64
layers are named); N:M masks with exactly N kept in *every* group of M along the input dim; pruned weights that stay
zero after each optimizer step, starting from an optimizer whose momentum / Adam moments predate the pruning; and a
distillation loss with the T^2 factor, KL(teacher || student), the temperature on both sides and no gradient into
the teacher, in the logits' dtype (a float64 loss is rejected; reduction='sum', T for T^2, log-probabilities without
log_target=True, the soft cross-entropy and nll_loss on raw logits are named). Hidden cases: one per rule on every
seed, named ``"<rule>: details"``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gpulab.compare import compare
from grader.exercise import Case, Exercise
from grader.kit.cases import choice, randint, randn, uniform
from grader.kit.helpers import offering
from grader.kit.variants import diagnose, matching_variant, tensor_match
from grader.runs import run_side

LAB = "09_pruning_distillation"
RUN = run_side(LAB)  # the learner side: grader/runs/09_pruning_distillation.py
TITLE = "Pruning and distillation: sparsity and students"


# --- exercise 1: global and per-layer magnitude masks ----------------------------------------------

def n_pruned(sparsity: float, numel: int) -> int:
    """How many weights a sparsity prunes: ``round(sparsity * numel)`` (never a half here: cases avoid it)."""
    return round(sparsity * numel)


def _scaled_layers(gen, shapes, scales) -> list:
    return [randn(gen, *shape) * scale for shape, scale in zip(shapes, scales)]


def _tied_layers(gen, shapes) -> list:
    """Integer-valued weights in [-4, 4]: the k-th smallest magnitude is tied with many others."""
    return [torch.randint(-4, 5, shape, generator=gen).float() for shape in shapes]


def _magnitude_cases(gen, public):
    if public:
        layers = _scaled_layers(gen, [(16, 8), (32, 16), (4, 32)], [2.0, 0.2, 1.0])
        ties = _tied_layers(gen, [(10, 6), (7, 9)])
        odd = _scaled_layers(gen, [(5, 7), (3, 11)], [1.0, 3.0])  # 35 and 33 weights: s * n is not whole
        rows = [("global, layers of different scales", layers, 0.5, "global"),
                ("per-layer, the same layers", layers, 0.5, "layer"),
                ("global, ties at the threshold", ties, 0.4, "global"),
                ("per-layer, ties at the threshold", ties, 0.3, "layer"),
                ("global, s * n not whole (0.37 * 68 = 25.16)", odd, 0.37, "global"),
                ("per-layer, s * n not whole (0.37 * 35 = 12.95, 0.37 * 33 = 12.21)", odd, 0.37, "layer"),
                ("sparsity 0 keeps everything", layers, 0.0, "global"),
                ("sparsity 1 prunes everything", layers, 1.0, "layer")]
    else:
        def shapes(n):
            return [(randint(gen, 3, 20), randint(gen, 3, 20)) for _ in range(n)]

        def scales(n):
            return [10 ** uniform(gen, -1.5, 0.5) for _ in range(n)]

        n = randint(gen, 2, 4)
        layers = _scaled_layers(gen, shapes(n), [0.05, 3.0, *scales(n - 2)])
        s = round(uniform(gen, 0.3, 0.85), 2)
        tied, st = _tied_layers(gen, shapes(randint(gen, 2, 3))), round(uniform(gen, 0.2, 0.8), 2)
        odd = _scaled_layers(gen, shapes(randint(gen, 2, 3)), scales(3))
        so = next((v / 100 for v in range(randint(gen, 20, 70), 100)  # a sparsity whose s * n is far from whole
                   if all(0.15 < (v / 100 * w.numel()) % 1 < 0.85 for w in odd)), 0.5)
        rows = [("global, layers of different scales", layers, s, "global"),
                ("per-layer, layers of different scales", layers, s, "layer"),
                ("global, ties at the threshold", tied, st, "global"),
                ("per-layer, ties at the threshold", tied, st, "layer"),
                ("s * n not whole", odd, so, choice(gen, ["global", "layer"])),
                ("sparsity 0 or 1", layers, choice(gen, [0.0, 1.0]), choice(gen, ["global", "layer"]))]
    cases = []
    for rule, weights, sparsity, scope in rows:
        detail = "" if public else f": {len(weights)} layers, sparsity={sparsity}, scope={scope!r}"
        cases.append(Case(rule + detail, dict(weights=[w.clone() for w in weights], sparsity=sparsity, scope=scope)))
    return cases


def _ranked_badly(mags: list, masks: list) -> bool:
    """Whether some pruned magnitude exceeds some kept one, over these tensors together."""
    pruned = torch.cat([m[~k] for m, k in zip(mags, masks)])
    kept = torch.cat([m[k] for m, k in zip(mags, masks)])
    return bool(pruned.numel() and kept.numel() and pruned.max() > kept.min())


def _count_hint(got: int, k: int, mags: torch.Tensor, keep: torch.Tensor, sparsity: float, n: int) -> str:
    """Why ``got`` weights were pruned instead of ``k`` (the magnitudes and mask flattened over the scope)."""
    if k and 0 < k <= n:
        threshold = float(mags.sort().values[k - 1])
        tied = int((mags == threshold).sum())
        if got == int((mags <= threshold).sum()) and tied > 1:
            return (f" The k-th smallest magnitude ({threshold:g}) is tied with {tied - 1} others and you pruned all "
                    "of them (|w| <= threshold). Pick exactly k indices instead: argsort or topk on the magnitudes.")
        if got == int((mags < threshold).sum()) and tied > 1:
            return (f" You kept every weight tied with the k-th smallest magnitude ({threshold:g}): |w| < threshold "
                    "prunes too few when magnitudes tie. Pick exactly k indices (argsort or topk).")
    if got == int(sparsity * n) and got != k:
        return f" int({sparsity} * {n}) truncates to {got}: use round()."
    if abs(got - k) == 1:
        return " Off by one: check how you turn the sparsity into k, and whether the k-th weight is pruned."
    return ""


def view_verdict(obs: dict, name: str) -> str | None:
    """The message for an answer that called .view on the check's non-contiguous weight."""
    if "view_error" in obs:
        return (f"{name} raised {obs['view_error']!r}: a weight need not be contiguous (a tied or transposed "
                "layer's is not), and .view cannot flatten it. Use .reshape or .flatten, which copy when they must.")
    return None


def _magnitude_judge(case, obs):
    weights, sparsity, scope = case.inputs["weights"], case.inputs["sparsity"], case.inputs["scope"]
    if view_verdict(obs, "magnitude_masks"):
        return view_verdict(obs, "magnitude_masks")
    masks = obs["masks"]
    if not isinstance(masks, (list, tuple)) or len(masks) != len(weights):
        return f"return a list of {len(weights)} masks, one per weight tensor, in the same order."
    for i, (m, w) in enumerate(zip(masks, weights)):
        if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(w.shape):
            return f"mask {i} must be a tensor of the weight's shape {tuple(w.shape)}."
        if m.dtype != torch.bool:
            return f"mask {i} has dtype {m.dtype}: return torch.bool masks (True = keep, False = pruned)."
    if any(not torch.equal(a, w) for a, w in zip(obs["after"], weights)):
        return "the weights were modified: build masks, leave the weights alone (pruning applies the masks later)."
    mags = [w.abs() for w in weights]
    got = [int((~m).sum()) for m in masks]
    if scope == "global":
        n = sum(w.numel() for w in weights)
        k = n_pruned(sparsity, n)
        per_layer = [n_pruned(sparsity, w.numel()) for w in weights]
        if sum(got) != k:
            flat_m, flat_k = torch.cat([m.flatten() for m in mags]), torch.cat([m.flatten() for m in masks])
            msg = (f"{sum(got)} weights pruned over all layers, expected round({sparsity} * {n}) = {k}."
                   + _count_hint(sum(got), k, flat_m, flat_k, sparsity, n))
            return msg
        if _ranked_badly(mags, list(masks)):
            if got == per_layer and not any(_ranked_badly([a], [b]) for a, b in zip(mags, masks)):
                return ("a pruned weight is larger than a kept one in another layer: you ranked each layer "
                        f"separately (per-layer, {got} pruned). Global pruning ranks all layers' |w| together, "
                        "so layers of small weights lose more.")
            return _order_message(weights, masks)
        return None
    for i, (w, m) in enumerate(zip(weights, masks)):
        k = n_pruned(sparsity, w.numel())
        if got[i] != k:
            msg = (f"layer {i}: {got[i]} of {w.numel()} weights pruned, expected round({sparsity} * {w.numel()}) = {k}."
                   + _count_hint(got[i], k, mags[i].flatten(), m.flatten(), sparsity, w.numel()))
            n = sum(x.numel() for x in weights)
            if sum(got) == n_pruned(sparsity, n) and not _ranked_badly(mags, list(masks)):
                msg += (f" Your masks prune {sparsity:.0%} of all weights ranked together: that is global pruning; "
                        "per-layer prunes that share of each layer.")
            return msg
        if _ranked_badly([mags[i]], [m]):
            return f"layer {i}: " + _order_message([w], [m])
    return None


def _order_message(weights, masks) -> str:
    pruned = torch.cat([w[~m] for w, m in zip(weights, masks)])
    kept = torch.cat([w[m] for w, m in zip(weights, masks)])
    msg = (f"a pruned weight (|w| = {float(pruned.abs().max()):.4g}) is larger than a kept one "
           f"(|w| = {float(kept.abs().min()):.4g}): prune the smallest magnitudes |w|.")
    if pruned.numel() and kept.numel() and pruned.max() <= kept.min():
        msg += " Yours pruned the smallest signed values: rank by w.abs(), not w."
    elif pruned.numel() and kept.numel() and pruned.abs().min() >= kept.abs().max():
        msg += " Yours pruned the largest ones: the order is reversed."
    return msg


MAGNITUDE = Exercise("magnitude_prune", 3, ("magnitude_masks",), _magnitude_cases, RUN._magnitude_run, _magnitude_judge,
                     title="Global and per-layer magnitude masks",
                     hint="k = round(sparsity * n); prune the k smallest |w| by index (argsort), never by comparing "
                          "with a threshold (ties).")


# --- exercise 2: structured pruning that shrinks the layers ------------------------------------------

def ref_keep_units(fc1_weight: torch.Tensor, keep: int) -> torch.Tensor:
    """The hidden units kept: the ``keep`` rows of fc1 with the largest L2 norm, in increasing index order."""
    return fc1_weight.norm(dim=1).topk(keep).indices.sort().values


def ref_pruned_output(state: dict, rows: torch.Tensor, x: torch.Tensor, cols: torch.Tensor | None = None):
    """fc2(relu(fc1(x))) with only the hidden units ``rows`` of fc1 and the input columns ``cols`` (default:
    the same units) of fc2, in float64: the masked model's output when ``cols`` is ``rows``."""
    cols = rows if cols is None else cols
    b1 = None if state["b1"] is None else state["b1"][rows].double()
    b2 = None if state["b2"] is None else state["b2"].double()
    h = F.relu(F.linear(x.double(), state["w1"][rows].double(), b1))     # (B, keep)
    return F.linear(h, state["w2"][:, cols].double(), b2)               # (B, out)


def _layer_pair(gen, d_in: int, hidden: int, d_out: int, bias: bool) -> dict:
    """fc1 (hidden, d_in) with row norms spread over two decades, and fc2 (d_out, hidden)."""
    rows = torch.logspace(-1, 1, hidden)[torch.randperm(hidden, generator=gen)]
    return dict(w1=randn(gen, hidden, d_in) / d_in ** 0.5 * rows[:, None],
                b1=randn(gen, hidden) if bias else None,
                w2=randn(gen, d_out, hidden) / hidden ** 0.5,   # fc2's columns: norms unrelated to fc1's rows
                b2=randn(gen, d_out) if bias else None)


def _structured_cases(gen, public):
    if public:
        rows = [("half the units", (12, 32, 5, True), 16), ("a quarter kept, no bias", (7, 24, 3, False), 6),
                ("a single unit kept", (5, 10, 4, True), 1)]
    else:
        d_in, hidden, d_out = randint(gen, 3, 20), randint(gen, 8, 40), randint(gen, 2, 9)
        rows = [("with bias", (d_in, hidden, d_out, True), randint(gen, 2, hidden - 2)),
                ("no bias", (randint(gen, 3, 20), hidden, d_out, False), randint(gen, 2, hidden - 2)),
                ("keep everything", (d_in, randint(gen, 4, 12), d_out, True), None)]
    cases = []
    for rule, (d_in, hidden, d_out, bias), keep in rows:
        keep = hidden if keep is None else keep
        state = _layer_pair(gen, d_in, hidden, d_out, bias)
        detail = "" if public else f": ({d_in} -> {hidden} -> {d_out}), keep={keep}"
        cases.append(Case(rule + detail, dict(**state, keep=keep, x=randn(gen, 9, d_in))))
    return cases


def _structured_judge(case, obs):
    i, keep = case.inputs, case.inputs["keep"]
    hidden, d_in = i["w1"].shape
    d_out = i["w2"].shape[0]
    if "returned" in obs:
        return f"return the pair (new_fc1, new_fc2), got {obs['returned']}."
    f1, f2 = obs["fc1"], obs["fc2"]
    for name, f in (("new_fc1", f1), ("new_fc2", f2)):
        if f["type"] != "Linear":
            return f"{name} must be an nn.Linear, got {f['type']}."
        if f["devices"] != [obs["device"]]:
            return (f"{name} was built on torch's default device ({', '.join(f['devices'])}), not where fc1 lives "
                    f"({obs['device']}): on a GPU your layers would stay on the CPU. Build them there: "
                    "nn.Linear(..., device=fc1.weight.device), or .to(fc1.weight.device).")
        if not f["param"]:
            return f"{name}.weight must be an nn.Parameter (a layer you can fine-tune), not a plain tensor."
    if tuple(f1["weight"].shape) == (hidden, d_in) and keep < hidden:
        return (f"new_fc1 still has {hidden} output units: zeroing rows keeps the dense shape, and the dense "
                f"matmul costs as much as before. Build nn.Linear({d_in}, {keep}) holding the kept rows.")
    if (f1["in"], f1["out"]) != (d_in, keep) or tuple(f1["weight"].shape) != (keep, d_in):
        return (f"new_fc1 is nn.Linear({f1['in']}, {f1['out']}) with weight {tuple(f1['weight'].shape)}; "
                f"expected nn.Linear({d_in}, {keep}), weight ({keep}, {d_in}).")
    if (f2["in"], f2["out"]) != (keep, d_out) or tuple(f2["weight"].shape) != (d_out, keep):
        return (f"new_fc2 is nn.Linear({f2['in']}, {f2['out']}) with weight {tuple(f2['weight'].shape)}; expected "
                f"nn.Linear({keep}, {d_out}), weight ({d_out}, {keep}): the next layer loses the input columns of "
                "the removed units.")
    if (i["b1"] is None) != (f1["bias"] is None) or (i["b2"] is None) != (f2["bias"] is None):
        return ("keep each bias as it was: a layer with a bias keeps one (fc1's sliced to the kept units), "
                "none stays none.")
    if not torch.equal(obs["orig"][0], i["w1"]) or not torch.equal(obs["orig"][1], i["w2"]):
        return "fc1 or fc2 was modified: build new layers and leave the originals unchanged."
    wrong = next(((name, f["weight"].dtype) for name, f in (("new_fc1", f1), ("new_fc2", f2))
                  if f["weight"].dtype != i["w1"].dtype), None)
    if wrong:
        return f"{wrong[0]} holds {wrong[1]} weights: keep the originals' dtype ({i['w1'].dtype})."
    if "y_error" in obs:
        return f"new_fc2(relu(new_fc1(x))) raised: {obs['y_error']}"
    want_idx = ref_keep_units(i["w1"], keep)
    want = ref_pruned_output(i, want_idx, i["x"])
    report = compare(obs["y"], want, dtype=torch.float32, name="new_fc2(relu(new_fc1(x)))")
    first = torch.arange(keep)
    variants = [
        ("the units of the smallest fc1 row norms (keep the largest)",
         lambda: ref_pruned_output(i, (-i["w1"].norm(dim=1)).topk(keep).indices, i["x"])),
        ("units ranked by fc2's column norms (rank by fc1's rows, the unit's incoming weights)",
         lambda: ref_pruned_output(i, i["w2"].norm(dim=0).topk(keep).indices, i["x"])),
        ("the first `keep` units (rank them by fc1's row norms)", lambda: ref_pruned_output(i, first, i["x"])),
        ("the right fc1 rows with fc2's first `keep` columns (slice fc2's columns with the same indices)",
         lambda: ref_pruned_output(i, want_idx, i["x"], first)),
        ("the right fc1 rows with fc2's first `keep` columns (slice fc2's columns with the same indices)",
         lambda: ref_pruned_output(i, i["w1"].norm(dim=1).topk(keep).indices, i["x"], first)),  # topk's order
        ("fc1's rows and fc2's columns in different orders (index both with the same idx: unit j of new_fc1 must "
         "feed column j of new_fc2)", lambda: ref_pruned_output(i, i["w1"].norm(dim=1).topk(keep).indices, i["x"],
                                                               want_idx)),
        ("units ranked by the L1 norm of fc1's rows (sum |w|): rank by the L2 norm, .norm(dim=1)",
         lambda: ref_pruned_output(i, ref_keep_units(i["w1"].abs().sum(-1, keepdim=True), keep), i["x"])),
        ("units ranked by the largest |w| of fc1's rows: rank by the L2 norm, .norm(dim=1)",
         lambda: ref_pruned_output(i, ref_keep_units(i["w1"].abs().amax(-1, keepdim=True), keep), i["x"])),
    ]
    return diagnose(report, obs["y"], variants, tensor_match(torch.float32))


STRUCTURED = Exercise("structured_prune", 3, ("prune_hidden_units",), _structured_cases, RUN._structured_run,
                      _structured_judge, title="Structured pruning: smaller dense layers",
                      hint="idx = fc1.weight.norm(dim=1).topk(keep).indices; new fc1 rows = fc1.weight[idx], "
                           "new fc2 columns = fc2.weight[:, idx].")


# --- exercise 3: N:M masks ------------------------------------------------------------------------

def _groups(mask_or_w: torch.Tensor, m: int) -> torch.Tensor:
    return mask_or_w.reshape(mask_or_w.shape[0], -1, m)  # (out, in) -> (out, in // m, m)


def _valid_nm(mask: torch.Tensor, w: torch.Tensor, n: int, m: int) -> tuple[int, int, int] | None:
    """The first group (row, group, kind) that breaks the N:M rule along the last dim, None if none:
    kind 0 = wrong count, 1 = a pruned magnitude above a kept one."""
    g, a = _groups(mask, m), _groups(w.abs(), m)
    counts = g.sum(-1)
    bad = (counts != n).nonzero()
    if len(bad):
        return int(bad[0, 0]), int(bad[0, 1]), 0
    pruned_max = torch.where(~g, a, torch.tensor(-1.0)).amax(-1)
    kept_min = torch.where(g, a, torch.tensor(float("inf"))).amin(-1)
    bad = (pruned_max > kept_min).nonzero()
    if len(bad):
        return int(bad[0, 0]), int(bad[0, 1]), 1
    return None


def _nm_cases(gen, public):
    if public:
        rows = [("2:4 on an (8, 16) weight", randn(gen, 8, 16), 2, 4),
                ("2:4 with ties (integer weights)", torch.randint(-2, 3, (8, 12), generator=gen).float(), 2, 4),
                ("1:4 on a (4, 24) weight", randn(gen, 4, 24), 1, 4),
                ("in_features not a multiple of m: raise ValueError", randn(gen, 4, 10), 2, 4)]
    else:
        out = 4 * randint(gen, 1, 6)
        rows = [("2 of 4", randn(gen, out, 4 * randint(gen, 2, 10)), 2, 4),
                ("2 of 4 with ties", torch.randint(-2, 3, (out, 4 * randint(gen, 2, 6)), generator=gen).float(), 2, 4),
                ("other N of M", randn(gen, out, 8 * randint(gen, 1, 4)), *choice(gen, [(1, 4), (2, 8), (4, 8)])),
                ("in_features not a multiple of m", randn(gen, out, 4 * randint(gen, 1, 5) + randint(gen, 1, 3)), 2, 4)]
    return [Case(f"{rule}" + ("" if public else f": shape {tuple(w.shape)}, {n}:{m}"), dict(w=w, n=n, m=m))
            for rule, w, n, m in rows]


def _nm_judge(case, obs):
    w, n, m = case.inputs["w"], case.inputs["n"], case.inputs["m"]
    if view_verdict(obs, "nm_mask"):
        return view_verdict(obs, "nm_mask")
    if w.shape[1] % m:
        if "raised" in obs:
            return None
        got = f" (yours raised {obs['raised_other']})" if "raised_other" in obs else ""
        return (f"in_features = {w.shape[1]} is not a multiple of m = {m}{got}: the last group would be short, and "
                "sparse tensor cores need whole groups. Check it first and raise a ValueError.")
    if "raised" in obs:
        return f"raised ValueError({obs['raised']!r}) on a valid ({tuple(w.shape)}) weight with {n}:{m}."
    mask = obs["mask"]
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(w.shape) or mask.dtype != torch.bool:
        return f"return a torch.bool mask of the weight's shape {tuple(w.shape)} (True = keep)."
    if not torch.equal(obs["after"], w):
        return "the weight was modified: return the mask only."
    bad = _valid_nm(mask, w, n, m)
    if bad is None:
        return None
    row, group, kind = bad
    cols = f"columns {group * m}..{group * m + m - 1}"
    got = _groups(mask, m)[row, group].int().tolist()
    mags = [round(v, 3) for v in _groups(w.abs(), m)[row, group].tolist()]
    msg = (f"row {row}, {cols}: mask {got} for |w| = {mags}; " +
           (f"every group of {m} consecutive weights along the input dim keeps exactly {n}." if kind == 0 else
            f"keep the {n} largest magnitudes of the group."))
    if w.shape[0] % m == 0 and _valid_nm(mask.T.contiguous(), w.T.contiguous(), n, m) is None:
        msg += (f"\n  Your mask is {n}:{m} along the output dim (groups of {m} rows in a column). Group along the "
                "input dim, the reduction dim of the matmul: the weight's last dim.")
    elif bool((mask.sum(1) == n * w.shape[1] // m).all()):
        msg += f" Yours keeps {n * w.shape[1] // m} per row, not {n} per group: rank inside each group."
    return msg


# No `requires`: the masks are computed and compared as plain tensors; the 2:4 sparse tensor cores (sm_80+) only
# time the lab's demo cell (gpulab.pruning.semi_structured_support), which no check runs.
NM_MASK = Exercise("nm_sparsity", 2, ("nm_mask",), _nm_cases, RUN._nm_run, _nm_judge,
                   title="N:M (2:4) semi-structured masks",
                   hint="w.abs().reshape(out, in // m, m), topk(n, dim=-1) per group, scatter True, reshape back.")


# --- exercise 4: pruned weights stay zero through optimizer steps --------------------------------


def ref_masked_steps(case, accumulate: bool = False) -> list:
    """[(loss, {name: parameter})] after each of the reference's masked steps (float64, CPU)."""
    model, opt, masks, x, y = RUN._prepared(case, "cpu")
    out = []
    for t in range(RUN.STEPS):
        if not accumulate:
            opt.zero_grad()
        loss = F.cross_entropy(model(x[t + 1]), y[t + 1])
        loss.backward()
        opt.step()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in masks:
                    p.mul_(masks[name])
        out.append((float(loss.detach()), {n: p.detach().clone() for n, p in model.named_parameters()}))
    return out


def _masked_cases(gen, public):
    kinds = ["adam", "sgd-momentum", "adamw"]
    rows = ([(f"{k} with state from before pruning", k) for k in kinds] if public else
            [(f"{k}: state from before pruning", k) for k in kinds])
    cases = []
    for rule, kind in rows:
        d_in, hidden, classes = (6, 8, 3) if public else (randint(gen, 3, 10), randint(gen, 4, 12), randint(gen, 2, 5))
        state = {"0.weight": randn(gen, hidden, d_in).double(), "0.bias": randn(gen, hidden).double() * 0.1,
                 "2.weight": randn(gen, classes, hidden).double(), "2.bias": randn(gen, classes).double() * 0.1}
        masks = {name: torch.rand(state[name].shape, generator=gen) > uniform(gen, 0.4, 0.7)
                 for name in ("0.weight", "2.weight")}
        x = randn(gen, RUN.STEPS + 1, 16, d_in).double()
        y = torch.randint(0, classes, (RUN.STEPS + 1, 16), generator=gen)
        detail = "" if public else f" ({d_in} -> {hidden} -> {classes})"
        cases.append(Case(rule + detail, dict(state=state, masks=masks, optimizer=kind, x=x, y=y)))
    return cases


def _masked_judge(case, obs):
    masks, want = case.inputs["masks"], ref_masked_steps(case)
    kind = case.inputs["optimizer"]
    for t, ((loss, params), (want_loss, want_params)) in enumerate(zip(obs["history"], want), start=1):
        for name, keep in masks.items():
            p = params[name]
            alive = p[~keep] != 0
            if bool(alive.any()):
                if not bool((p[keep] != 0).any()):
                    return f"after step {t}, `{name}` is zero where the mask is True: True in a mask means keep."
                return (f"after step {t}, {int(alive.sum())} of {int((~keep).sum())} pruned weights of `{name}` are "
                        f"nonzero again (largest {float(p[~keep].abs().max()):.2e}). With {kind}, the optimizer's "
                        "state from before pruning (momentum, Adam's moments" + (", weight decay" if kind == "adamw"
                                                                                else "") +
                        ") moves them even when their gradient is zero: re-apply the masks to the weights after "
                        "optimizer.step(), under torch.no_grad().")
        for name, p in params.items():
            report = compare(p, want_params[name], dtype=torch.float64, atol=1e-9, rtol=1e-7,
                             name=f"`{name}` after step {t}")
            if report:
                if matching_variant(params, [("accumulated", lambda: ref_masked_steps(case, True)[t - 1][1])],
                                    lambda a, b: all(torch.allclose(a[k], b[k], atol=1e-9) for k in b)):
                    report += "\n  Gradients accumulated across steps: call optimizer.zero_grad() before backward."
                return report + "\n  One step: zero_grad, cross-entropy of model(x) with y, backward, step, re-mask."
        if not isinstance(loss, float) or abs(loss - want_loss) > 1e-8 * max(1.0, abs(want_loss)):
            return f"step {t} returned loss {loss!r}, expected {want_loss:.6f} (the cross-entropy before the step)."
    return None


MASKED_STEP = Exercise("masked_step", 3, ("masked_train_step",), _masked_cases, RUN._masked_run, _masked_judge,
                       title="Pruned weights stay zero through an optimizer step",
                       hint="zero_grad, loss, backward, step; then with torch.no_grad(): p.mul_(mask) for every "
                            "masked parameter.")


# --- exercise 5: the distillation loss --------------------------------------------------------------

def ref_distillation(s, t, y, T: float, alpha: float, *, t_power: int = 2, swap: bool = False,
                     on_student: bool = True, on_teacher: bool = True, reduction: str = "batchmean",
                     alpha_swapped: bool = False, soft_ce: bool = False, probs_input: bool = False,
                     cross_entropy: bool = False, nll_raw: bool = False) -> torch.Tensor:
    """alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) (per sample, averaged over the batch)
    + (1 - alpha) * cross_entropy(s, y), in float64; the keyword flags build the usual mistakes."""
    s, t = s.double(), t.double()
    log_p_s = F.log_softmax(s / (T if on_student else 1.0), dim=-1)
    log_p_t = F.log_softmax(t / (T if on_teacher else 1.0), dim=-1)
    a, b = (log_p_s, log_p_t) if swap else (log_p_t, log_p_s)   # KL(exp(a) || exp(b))
    if probs_input:          # F.kl_div(softmax(s / T), ...): it treats its input as log-probabilities
        b = b.exp()
    kl = (a.exp() * ((0.0 if cross_entropy else a) - b)).sum(-1)  # (B,); cross_entropy: -sum p_t log p_s
    soft = {"batchmean": kl.mean(), "sum": kl.sum()}.get(reduction, kl.sum() / s.numel())
    hard = F.nll_loss(s, y) if nll_raw else F.cross_entropy(s / T if soft_ce else s, y)
    w_soft, w_hard = (1 - alpha, alpha) if alpha_swapped else (alpha, 1 - alpha)
    return w_soft * T ** t_power * soft + w_hard * hard


_DISTILL_VARIANTS = [
    ("the soft term without the T^2 factor (its gradients shrink as 1/T^2)", dict(t_power=0)),
    ("the soft term times T, not T^2", dict(t_power=1)),
    ("the KL summed over the batch (reduction='sum'); use 'batchmean', the sum over classes averaged over the batch",
     dict(reduction="sum")),
    ("F.kl_div given the student's probabilities: its input must be log-probabilities (F.log_softmax)",
     dict(probs_input=True)),
    ("the soft cross-entropy -sum p_t log p_s: the KL subtracts the teacher's entropy, so it is 0 when the student "
     "matches the teacher", dict(cross_entropy=True)),
    ("F.nll_loss on raw logits: it expects log-probabilities; use F.cross_entropy(student_logits, labels)",
     dict(nll_raw=True)),
    ("KL(student || teacher): the KL's arguments are swapped", dict(swap=True)),
    ("the temperature on the student's logits only", dict(on_teacher=False)),
    ("the temperature on the teacher's logits only", dict(on_student=False)),
    ("the KL averaged over every element (reduction='mean'); use 'batchmean'", dict(reduction="mean")),
    ("alpha weighting the hard-label loss (alpha belongs to the soft term)", dict(alpha_swapped=True)),
    ("the cross-entropy on the softened logits s / T (use the raw student logits)", dict(soft_ce=True)),
]


def _distill_cases(gen, public):
    def logits(b, c, scale=2.0):
        return randn(gen, b, c) * scale

    if public:
        rows = [("T=4, alpha=0.7", 8, 5, 4.0, 0.7, 2.0, False), ("T=2, alpha=0.5", 6, 10, 2.0, 0.5, 2.0, False),
                ("T=1, alpha=0.9", 5, 4, 1.0, 0.9, 2.0, False),
                ("alpha=0: hard labels only", 4, 6, 3.0, 0.0, 2.0, False),
                ("alpha=1: soft labels only", 7, 3, 5.0, 1.0, 2.0, False),
                ("teacher logits that require grad (detach them)", 5, 5, 2.0, 0.6, 2.0, True),
                ("large logits (use log_softmax)", 4, 8, 1.0, 0.5, 60.0, False)]
    else:
        def b():
            return randint(gen, 2, 16)

        def c():
            return randint(gen, 3, 12)

        rows = [("T > 1", b(), c(), uniform(gen, 1.5, 8.0), uniform(gen, 0.2, 0.8), 2.0, False),
                ("alpha=0", b(), c(), uniform(gen, 1.5, 5.0), 0.0, 2.0, False),
                ("alpha=1", b(), c(), uniform(gen, 1.5, 5.0), 1.0, 2.0, False),
                ("teacher requires grad", b(), c(), uniform(gen, 1.5, 5.0), uniform(gen, 0.2, 0.8), 2.0, True),
                ("large logits", b(), c(), 1.0, uniform(gen, 0.2, 0.8), uniform(gen, 40.0, 80.0), False)]
    cases = []
    for rule, bsz, classes, T, alpha, scale, teacher_grad in rows:
        T, alpha = round(T, 2), round(alpha, 2)
        detail = "" if public else f": batch {bsz}, {classes} classes, T={T}, alpha={alpha}"
        cases.append(Case(rule + detail, dict(s=logits(bsz, classes, scale), t=logits(bsz, classes, scale),
                                              y=torch.randint(0, classes, (bsz,), generator=gen), T=T, alpha=alpha,
                                              teacher_grad=teacher_grad)))
    return cases


def _distill_judge(case, obs):
    i = case.inputs
    if obs.get("not_scalar"):
        return "return the loss as a scalar tensor that autograd can differentiate (a 0-d tensor with grad_fn)."
    s = i["s"].double().requires_grad_(True)
    want = ref_distillation(s, i["t"], i["y"], i["T"], i["alpha"])
    want.backward()
    loss = obs["loss"].reshape(())
    variants = [(label, ref_distillation(i["s"], i["t"], i["y"], i["T"], i["alpha"], **kw).float())
                for label, kw in _DISTILL_VARIANTS]
    report = compare(loss.float(), want.detach().float(), atol=1e-5, rtol=1e-4, name="loss")
    if report:
        if bool(torch.isnan(loss)) or bool(torch.isinf(loss)):
            log_probs = torch.cat([torch.softmax(v.float() / i["T"], -1).log() for v in (i["s"], i["t"])])
            if bool(torch.isfinite(log_probs).all()):   # no overflow here: log-probabilities read as probabilities
                return report + ("\n  F.kl_div(input, target) reads its target as probabilities: a target of "
                                 "log-probabilities needs log_target=True (or pass softmax(teacher / T)).")
            return report + "\n  log(softmax(x)) overflows for large logits: use F.log_softmax."
        return diagnose(report, loss.float(), variants, tensor_match(torch.float32, atol=1e-5, rtol=1e-4),
                        template="\n  Your loss matches {} instead.")
    if loss.dtype != i["s"].dtype:
        return (f"the loss is {loss.dtype}, the logits {i['s'].dtype}: compute it in the logits' dtype (a float64 "
                "loss in a float32 model runs at float64 speed, and a GPU has far fewer float64 units).")
    g = obs["grad_t"]
    if g is not None and bool((g != 0).any()):
        return ("the teacher's logits received a gradient: the teacher is frozen, so detach teacher_logits "
                "(the student learns from the teacher, not the other way round).")
    report = compare(obs["grad_s"].float(), s.grad.float(), atol=1e-6, rtol=1e-4, name="d loss / d student_logits")
    return report and report + "\n  The value is right but the gradient is not: is part of the loss detached?"


DISTILL = Exercise("distillation_loss", 3, ("distillation_loss",), _distill_cases, RUN._distill_run, _distill_judge,
                   title="The distillation loss",
                   hint="soft = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t.detach() / T, -1), "
                        "reduction='batchmean', log_target=True) * T**2; mix with alpha.")


# The course helpers this lab's answers may call (its locked cells import them; every lab also offers
# gpulab.device and gpulab.compare): an answer that is, derives from or calls another earns nothing.
OFFERED = ("gpulab.bench.benchmark", "gpulab.pruning.distill_task", "gpulab.pruning.semi_structured_ms",
           "gpulab.pruning.semi_structured_support", "gpulab.pruning.student_accuracy",
           "gpulab.pruning.zeros_vs_sparse_ms", "gpulab.spirals.MLP", "gpulab.spirals.accuracy",
           "gpulab.spirals.make_spirals", "gpulab.spirals.train")
EXERCISES = [offering(ex, OFFERED) for ex in (MAGNITUDE, STRUCTURED, NM_MASK, MASKED_STEP, DISTILL)]
BENCHMARKS: list = []
