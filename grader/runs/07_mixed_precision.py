"""The learner side of lab 07_mixed_precision: what runs beside the learner's code, in the grading sandbox
and in the notebook's inline check. It calls the learner's answer and returns plain observations;
it knows no answer (the references and verdicts are the judge's, in ``grader/checks/07_mixed_precision.py``).
"""
from __future__ import annotations

import collections
import contextlib
import dis
import functools
import inspect
import os
import sysconfig
import types

import torch

import gpulab
from gpulab.launches import record_allocations, record_torch_ops, watch_launches
from gpulab.precision import replay_scaler
from gpulab.toy import ToyMLP, toy_batch
from grader.exercise import borrowed, entry, to_cpu

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float8_e5m2": torch.float8_e5m2}


def _number(x):
    """A plain float for the judge (0-dim tensors and numpy scalars included), else None."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


LIMITS = ("max", "min_normal", "min_subnormal", "eps")


def _fields(got, keys) -> dict:
    """The run side of an answer that returns a dict of numbers: those numbers, or the type that came back."""
    if not isinstance(got, dict):
        return {"bad": type(got).__name__}
    return {k: _number(got.get(k)) for k in keys}


def _limits_run(ns, case, device):
    x = case.inputs
    return _fields(entry(ns, "format_limits")(x["e"], x["m"], x["finite_only"]), LIMITS)


REPORT = ("underflow", "subnormal", "overflow")


def _report_run(ns, case, device):
    x = case.inputs
    grads = x["x"].to(device).clone()  # the learner's own copy: an in-place scale must show
    got = _fields(entry(ns, "cast_report")(grads, _DTYPES[x["dtype"]], x["scale"]), REPORT)
    return {**got, "mutated": not torch.equal(grads.cpu(), x["x"])}


# GradScaler's own kernels: the unscale-and-check and the update rule the exercise writes
_GRADSCALER_OPS = {"aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_"}
# Names a scaler written from scratch has no use for: GradScaler, its kernels, and the switches that turn off
# the recorders watching it (a learner's code naming one of them is reported, whatever it does with it).
_FOREIGN_NAMES = {"GradScaler", "_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_",
                  "_disable_current_modes", "_DisableTorchDispatch", "_pop_mode", "_pop_mode_temporarily",
                  "_pop_torch_dispatch_stack", "_unset_dispatch_mode", "_set_dispatch_mode", "_ExcludeDispatchKeyGuard",
                  "DisableTorchFunction", "DisableTorchFunctionSubclass"}
_SCALER_METHODS = ("get_scale", "scale", "unscale_", "step", "update")
# The same functions where a learner's code finds them at run time (by any spelling): while the check replays a
# scaler each one reports its calls (references taken earlier are found by the walk below, by their names).
_TRIPWIRES = ((torch.utils._python_dispatch, ("_disable_current_modes", "_pop_mode_temporarily", "_pop_mode")),
              (torch._C, ("_pop_torch_dispatch_stack", "_DisableTorchDispatch", "_unset_dispatch_mode",
                          "_set_dispatch_mode")),
              (torch, ("_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_")))
# Where library code lives: torch, the course's helpers and Python's own library (by file, not by __module__)
_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, gpulab)) + tuple(
    sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "purelib", "platlib"))


@contextlib.contextmanager
def _tripwires():
    """Yield a list that receives the name of each :data:`_TRIPWIRES` function called inside the block."""
    tripped, saved = [], []

    def wire(original, name):
        def called(*args, **kwargs):
            tripped.append(name)
            return original(*args, **kwargs)
        return called

    for module, names in _TRIPWIRES:
        for name in names:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, wire(getattr(module, name), name))
    try:
        yield tripped
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _library_code(fn) -> bool:
    """Whether ``fn`` (unwrapped from its decorators) is library code, or no Python function at all."""
    try:
        code = getattr(inspect.unwrap(fn), "__code__", None)
    except Exception:  # a __wrapped__ cycle, or an attribute lookup that raises
        return True
    return not isinstance(code, types.CodeType) or code.co_filename.startswith(_LIBRARY_DIRS)


def _codes(code):
    """``code`` and the code of every function nested in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _code_names(code) -> set:
    """Every global and attribute name ``code`` and the functions nested in it use."""
    return {name for c in _codes(code) for name in c.co_names}


def _global_names(code) -> set:
    """The global names ``code`` and the functions nested in it read (not attribute names)."""
    return {i.argval for c in _codes(code) for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}


def _children(obj, path: str) -> list:
    """(object, path) pairs one step from ``obj``: attributes, class attributes, container items, closures,
    defaults and the globals a function's code names; nothing inside library code, modules or tensors."""
    if isinstance(obj, (types.ModuleType, torch.Tensor, str, bytes, int, float, complex, type(None))):
        return []
    if isinstance(obj, dict):
        return [(v, f"{path}[{k!r}]") for k, v in obj.items()] + [(k, f"{path} (a key)") for k in obj]
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return [(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, functools.partial):
        return [(obj.func, f"{path}.func"), *((a, f"{path}.args[{i}]") for i, a in enumerate(obj.args)),
                *((v, f"{path}.keywords[{k!r}]") for k, v in obj.keywords.items())]
    if isinstance(obj, types.MethodType):
        return [(obj.__func__, path), (obj.__self__, f"{path}.__self__")]
    if isinstance(obj, (staticmethod, classmethod)):
        return [(obj.__func__, path)]
    if isinstance(obj, property):
        return [(f, path) for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
    if isinstance(obj, types.FunctionType):
        if _library_code(obj):
            return []
        cells = [(c.cell_contents, f"{path} (closure)") for c in obj.__closure__ or () if _filled(c)]
        defaults = [(v, f"{path} (default)") for v in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values())]
        named = [(obj.__globals__[n], f"{path}: global {n}") for n in sorted(_global_names(obj.__code__))
                 if n in obj.__globals__]
        return cells + defaults + named + [(getattr(obj, "__wrapped__", None), f"{path}.__wrapped__")]
    if isinstance(obj, type):
        return [(v, f"{c.__name__}.{k}") for c in obj.__mro__ if _heap_type(c) for k, v in vars(c).items()]
    kids = [(v, f"{path}.{k}") for k, v in (getattr(obj, "__dict__", None) or {}).items()]
    kids += [(getattr(obj, k), f"{path}.{k}") for c in type(obj).__mro__ for k in vars(c).get("__slots__", ())
             if isinstance(k, str) and hasattr(obj, k)]
    return kids + ([(type(obj), f"type of {path}")] if _heap_type(type(obj)) else [])


def _heap_type(cls) -> bool:
    """A class made by a class statement or type() (the learner's, or a library's Python class), not a builtin."""
    return bool(cls.__flags__ & (1 << 9))  # Py_TPFLAGS_HEAPTYPE


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _walk(roots: list, limit: int = 20000) -> tuple[list, list]:
    """What is reachable from ``roots`` ((object, path) pairs): the paths to GradScaler instances, classes and
    functions (held directly, in a list or a dict, in a closure, in a global the code names), and the foreign
    names (:data:`_FOREIGN_NAMES`) the learner's functions use."""
    seen, todo, found, names = set(), list(roots), [], set()
    while todo and len(seen) < limit:
        obj, path = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            qualname = getattr(obj, "__qualname__", "") if callable(obj) else ""
            kids = _children(obj, path)
        except Exception:  # a learner's __getattr__ that raises: nothing more to see there
            qualname, kids = "", []
        if isinstance(obj, torch.amp.GradScaler) or isinstance(obj, type) and issubclass(obj, torch.amp.GradScaler):
            found.append(f"{path}: {obj.__name__ if isinstance(obj, type) else type(obj).__name__}")
            continue
        if isinstance(qualname, str) and qualname.startswith("GradScaler.") and _library_code(obj):
            found.append(f"{path}: {qualname}")
            continue
        if isinstance(obj, types.FunctionType) and not _library_code(obj):
            names |= _code_names(obj.__code__) & _FOREIGN_NAMES
        elif getattr(obj, "__name__", None) in _FOREIGN_NAMES and callable(obj) and (
                not _heap_type(obj) if isinstance(obj, type) else _library_code(obj)):
            found.append(f"{path}: {obj.__name__}")  # a reference to one, however it was looked up
            continue
        todo.extend(kids)
    return found, sorted(names)


def _scaler_evidence(made, scaler, ops: list, unrecorded: list, tripped: list) -> dict:
    """Facts about a learner's scaler for the judge: what of GradScaler (or of a course helper) it is, holds,
    names or runs, which of its methods are not its own code, and whether the op recorder was switched off."""
    cls = type(scaler)
    library = []
    for name in _SCALER_METHODS:
        m = inspect.getattr_static(cls, name, None)
        fn = m.__func__ if isinstance(m, (staticmethod, classmethod)) else m
        if not isinstance(fn, types.FunctionType) or _library_code(fn):
            library.append(name)
    holds, names = _walk([(scaler, "self"), (made, getattr(made, "__name__", "LossScaler"))])
    return {"is": cls.__name__ if isinstance(scaler, torch.amp.GradScaler) else None, "holds": holds,
            "kernels": sorted(_GRADSCALER_OPS.intersection(ops) | {f"torch.{n}" for n in tripped if "_amp_" in n}),
            "names": sorted(set(names) | {n for n in tripped if "_amp_" not in n}), "library_methods": library,
            "unrecorded_steps": len(unrecorded), "gpulab": borrowed(scaler, forbidden=(torch.amp.GradScaler,))}


def _scaler_run(ns, case, device):
    x = case.inputs
    made = entry(ns, "LossScaler")
    scaler = made(init_scale=x["init_scale"], growth_factor=x["growth"], backoff_factor=x["backoff"],
                  growth_interval=x["interval"])
    unrecorded = []
    with watch_launches(check_bounds=False) as watch, record_torch_ops(watch) as ops:
        def watched(real_step):
            """The optimizer's step as the scaler calls it: SGD's own ops must reach the recorder."""
            def step(*args, **kwargs):
                before = len(ops)
                out = real_step(*args, **kwargs)
                if len(ops) == before:
                    unrecorded.append(before)
                return out
            return step

        with _tripwires() as tripped:  # undone before the recorder's own exit, which pops its mode
            out = replay_scaler(scaler, list(x["grads"]), device=device, unscale_first=x["unscale_first"],
                                groups=x["groups"], wrap_step=watched)
    return {**out, "evidence": _scaler_evidence(made, scaler, ops, unrecorded, tripped)}


D_IN, HIDDEN, D_OUT, BATCH = 16, (32, 32), 4, 32


def _train_setup(case, device):
    """The model, optimizer, scaler and batches of a case: the same in the learner's process and the judge's."""
    x = case.inputs
    model = ToyMLP(D_IN, HIDDEN, D_OUT, seed=x["seed"]).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9) if x["opt"] == "sgd"
           else torch.optim.AdamW(params, lr=1e-2))
    dtype = _DTYPES[x["dtype"]]
    scaler = torch.amp.GradScaler(device, init_scale=x["init_scale"], enabled=dtype == torch.float16)
    batches = [tuple(t.to(device) for t in toy_batch(x["seed"] + s, BATCH, D_IN, D_OUT)) for s in range(x["steps"])]
    return model, opt, scaler, batches, dtype


def _record_steps(step_fn, case, device) -> dict:
    """Run ``step_fn`` over the case's batches; observe returns, weights, dtypes and the optimizer's steps."""
    model, opt, scaler, batches, dtype = _train_setup(case, device)
    seen, calls = {}, [0]
    model.layers[0].register_forward_hook(lambda mod, inp, out: seen.setdefault("forward", str(out.dtype)) and None)
    real_step = opt.step

    def counted(*args, **kwargs):
        calls[0] += 1
        return real_step(*args, **kwargs)

    opt.step = counted
    out = {"returned": [], "params": [], "dtypes": [], "stepped": [], "scale": [],
           "init": {n: to_cpu(p).float().clone() for n, p in model.named_parameters()}}
    for xb, yb in batches:
        before = calls[0]
        try:
            ret = step_fn(model, opt, scaler, xb, yb, dtype, case.inputs["max_norm"])
        except ValueError as exc:  # GradScaler's own refusal: gradients of fp16 weights
            if "unscale FP16 gradients" not in str(exc):
                raise
            return {"fp16_grads": True}
        except RuntimeError as exc:  # GradScaler's: the previous step's state was never cleared by update()
            if "unscale_() is being called after step()" not in str(exc):
                raise
            return {"no_update": True}
        if not isinstance(ret, (tuple, list)) or len(ret) != 2:
            return {"bad": type(ret).__name__}
        out["returned"].append([_number(v) for v in ret])
        out["params"].append({n: to_cpu(p).float().clone() for n, p in model.named_parameters()})  # not a view
        out["dtypes"].append({n: str(p.dtype) for n, p in model.named_parameters()})
        out["stepped"].append(calls[0] > before)
        out["scale"].append(float(scaler.get_scale()))
    out["forward"], out["device"] = seen.get("forward"), str(device)
    return out


def _train_run(ns, case, device):
    return _record_steps(entry(ns, "amp_train_step"), case, device)


# Reductions and casts would leave the low precision: the exercise is compensation in float16/bfloat16 itself.
_FORBIDDEN = {"aten.sum": "torch.sum", "aten.cumsum": "torch.cumsum", "aten.nansum": "torch.nansum",
              "aten.mean": "torch.mean", "aten._to_copy": "a cast (.float(), .double(), .to(...))",
              "aten._local_scalar_dense": "Python floats (.item(), float()): float64 arithmetic",
              "aten.lift_fresh": "a tensor built from Python numbers (torch.tensor(...)): float64 arithmetic"}


def _kahan_run(ns, case, device):
    x = case.inputs["x"].to(device).clone()  # the learner's own copy: a write into it must show
    fn = entry(ns, "kahan_sum")
    with watch_launches(check_bounds=False) as watch, record_torch_ops(watch) as ops, record_allocations() as made:
        got = fn(x)
    forbidden = sorted({op for op in ops if op in _FORBIDDEN})
    return {"out": to_cpu(got) if isinstance(got, torch.Tensor) else repr(got)[:80], "forbidden": forbidden,
            "dtypes": sorted(made.dtypes - {str(x.dtype)}), "mutated": not torch.equal(x.cpu(), case.inputs["x"])}
