"""Labs and lessons 11 to 13 run their rank demonstrations over NCCL where there is a GPU per rank.

NCCL moves GPU memory only: a rank function that builds a CPU tensor works over gloo on this machine
and fails on Kaggle's two T4s. No GPU is here to show it, so this lint reads the notebooks instead:
every function a demonstration launches without forcing gloo (and every notebook function it calls,
the learner's exercises included) must place what it creates: a tensor factory gets ``device=`` or is
moved at once with ``.to(...)``. ``*_like`` factories and ``device=x.device`` follow an existing tensor.
"""
from __future__ import annotations

import ast
import json

import pytest

from gpulab.paths import ROOT

NOTEBOOKS = [f"{folder}/{stem}.ipynb" for folder in ("notebooks", "solutions")
             for stem in ("11_data_parallel", "12_tensor_parallel", "13_pipeline_parallel")]
# Factories that put a new tensor on the default device (the CPU) unless told otherwise.
FACTORIES = {"empty", "zeros", "ones", "full", "randn", "rand", "randint", "randperm", "tensor", "arange",
             "linspace", "eye"}


def notebook_tree(path) -> ast.Module:
    """All code cells of a notebook as one module (IPython magics and shell lines dropped)."""
    cells = json.loads(path.read_text())["cells"]
    lines = [ln for c in cells if c["cell_type"] == "code" for ln in "".join(c["source"]).splitlines()
             if not ln.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def is_forced_gloo(call: ast.Call) -> bool:
    return any(k.arg == "backend" and isinstance(k.value, ast.Constant) and k.value.value == "gloo"
               for k in call.keywords)


def launched(tree: ast.Module) -> set[str]:
    """Names of the functions passed to ``launch`` without ``backend="gloo"``."""
    return {node.args[0].id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "launch" and node.args
            and isinstance(node.args[0], ast.Name) and not is_forced_gloo(node)}


def definitions(tree: ast.Module) -> dict:
    """Every function and class defined in the notebook, by name (methods under their class)."""
    return {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def reachable(tree: ast.Module) -> dict:
    """The launched functions and every notebook function or class they reach by name."""
    defs, todo, seen = definitions(tree), sorted(launched(tree)), {}
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen[name] = defs[name]
        todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)]
        todo += [n.attr for n in ast.walk(defs[name]) if isinstance(n, ast.Attribute)]
    return seen


def unplaced_factories(node) -> list[str]:
    """``torch.<factory>(...)`` calls with no ``device=`` that are not moved by an enclosing ``.to(...)``."""
    moved = {id(inner.func.value) for inner in ast.walk(node)
             if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "to"}
    found = []
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and getattr(call.func.value, "id", None) == "torch" and call.func.attr in FACTORIES):
            continue
        if any(k.arg == "device" for k in call.keywords) or id(call) in moved:
            continue
        found.append(f"line {call.lineno}: {ast.unparse(call)[:80]}")
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_rank_demonstration_places_its_tensors_on_the_rank_device(notebook):
    tree = notebook_tree(ROOT / notebook)
    assert launched(tree), f"{notebook}: no demonstration launches ranks without forcing gloo"
    problems = {name: bad for name, node in reachable(tree).items() if (bad := unplaced_factories(node))}
    assert not problems, (f"{notebook}: these rank functions create tensors on the CPU, which NCCL refuses; give "
                          f"them device=rank_device() (or .to(...) / *_like): {problems}")


def test_the_lint_catches_a_cpu_tensor_and_passes_a_placed_one():
    bad = ast.parse("def f(rank, world):\n    t = torch.ones(4)\n    dist.all_reduce(t)\nlaunch(f, 2)")
    good = ast.parse("def f(rank, world):\n    dev = rank_device()\n    t = torch.ones(4, device=dev)\n"
                     "    u = torch.randn(3).to(dev)\n    v = torch.empty_like(t)\nlaunch(f, 2, device=DEVICE)")
    forced = ast.parse("def f(rank, world):\n    t = torch.ones(4)\nlaunch(f, 2, backend='gloo')")
    helper = ast.parse("def g():\n    return torch.zeros(2)\ndef f(rank, world):\n    return g()\nlaunch(f, 2)")
    assert unplaced_factories(reachable(bad)["f"]) == ["line 2: torch.ones(4)"]
    assert not unplaced_factories(reachable(good)["f"])
    assert reachable(forced) == {}
    assert unplaced_factories(reachable(helper)["g"])
