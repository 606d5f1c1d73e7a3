"""Looking inside ``torch.compile`` (lesson 06): a backend that counts, a model with graph breaks, a timed
Inductor compile in a child process.

- :class:`CountingBackend` is a ``torch.compile`` backend that keeps every FX graph Dynamo hands it and runs
  it as is (no code generation, so compiling costs milliseconds, not Inductor's seconds). ``compiles`` counts
  compilations (a recompile is a second one), ``runs`` counts calls of the compiled graphs.
- :func:`graph_ops` lists the operators of an FX graph by name (``"linear"``, ``"relu"``, ``"mul"`` ...).
- :class:`BreakyNet` is a small MLP, input (B, d_in) float32 -> (B, d_out) float32, whose forward has the
  graph breaks real code has: a ``print`` of a tensor statistic, an ``.item()`` feeding a Python ``if``
  and a round trip through NumPy.
- :func:`start_inductor_demo` compiles one tiny function with Inductor in a child process (a cold Inductor
  compile on a CPU takes tens of seconds; the lesson overlaps it with its other sections) and
  :func:`inductor_demo` is what that process runs: generated source, compile time, steady-state times.
- :func:`default_settings` runs a block with every Dynamo and symbolic-shape setting at its default and
  names the settings the block changed; :func:`no_inductor` refuses Inductor inside a block (lab 06's
  checks: a count of graph breaks or compilations means what it says, and a check takes milliseconds).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn


class CountingBackend:
    """A ``torch.compile`` backend that records each FX graph and runs it unchanged (eager)."""

    def __init__(self):
        self.graphs: list = []   # one torch.fx.GraphModule per compilation
        self.runs = 0            # calls of any compiled graph
        self.unguarded = 0       # calls with a tensor of another shape than a static graph was compiled for

    @property
    def compiles(self) -> int:
        return len(self.graphs)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.graphs.append(gm)
        # the static shapes of the graph's inputs (None where a size is symbolic): Dynamo's guards never hand a
        # static graph another shape, so a call that does went around them
        fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        static = [tuple(t.shape) if isinstance(t, torch.Tensor) and all(isinstance(d, int) for d in t.shape)
                  else None for t in fakes]

        def run(*args):
            self.runs += 1
            if any(s is not None and isinstance(a, torch.Tensor) and tuple(a.shape) != s for a, s in zip(args, static)):
                self.unguarded += 1
            return gm.forward(*args)
        return run

    def ops(self) -> list[str]:
        """The operators of every recorded graph, in order."""
        return [op for gm in self.graphs for op in graph_ops(gm)]


def graph_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The names of the operators a graph calls: functions, methods and submodules (their class name)."""
    names = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            names.append(getattr(node.target, "__name__", str(node.target)))
        elif node.op == "call_method":
            names.append(str(node.target))
        elif node.op == "call_module":
            names.append(type(gm.get_submodule(node.target)).__name__.lower())
    return names


def op_module(target) -> str:
    """Where an FX node's function comes from (``"torch"``, ``"operator"``, a user module's name, or
    ``"torch.ops.<namespace>"`` for a custom operator: an opaque call the compiler cannot see into)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace = target._qualified_op_name.split("::")[0] if hasattr(target, "_qualified_op_name") \
            else target.namespace
        return "torch" if namespace in ("aten", "prims") else f"torch.ops.{namespace}"
    module = getattr(target, "__module__", None) or type(target).__module__ or ""
    return module.split(".")[0]


class BreakyNet(nn.Module):
    """Linear -> ReLU -> [print] -> [clip if the max is above `limit`] -> [NumPy std scale] -> Linear -> ReLU
    -> Linear. Input (B, d_in) float32, output (B, d_out) float32. Each bracketed step is switched on by its
    flag and costs at least one graph break under ``torch.compile``."""

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 8, limit: float = 1.0,
                 log: bool = True, clip: bool = True, numpy_scale: bool = True, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_hidden), nn.Linear(d_hidden,
                                                                                                            d_out)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        self.limit, self.log, self.clip, self.numpy_scale = limit, log, clip, numpy_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x).relu()                                    # (B, d_hidden)
        if self.log:
            print(f"hidden mean {h.mean():.4f}")                   # a host read: the value must reach Python
        if self.clip and h.abs().max().item() > self.limit:      # a Python branch on a tensor's value
            h = h.clamp(max=self.limit)
        if self.numpy_scale:
            h = h / float(np.std(h.detach().cpu().numpy()) + 1.0)  # leaves PyTorch for NumPy and back
        h = self.fc2(h).relu()                                    # (B, d_hidden)
        return self.fc3(h)                                        # (B, d_out)


def _settings_modules() -> list:
    """The config modules that decide what Dynamo captures and how it specialises sizes."""
    import torch._dynamo.config
    import torch.fx.experimental._config

    return [torch._dynamo.config, torch.fx.experimental._config]


def _live(module) -> list[str]:
    """The names of a config module's settings (deprecated and alias names left out)."""
    return [n for n, e in module._config.items() if not (e.deprecated or e.alias is not None or e.hide)]


def _changed(modules) -> list[str]:
    """``module.name`` of every live setting whose value is not its default."""
    return [f"{m.__name__}.{n}" for m in modules for n in _live(m) if getattr(m, n) != m._config[n].default]


@contextlib.contextmanager
def default_settings():
    """Run the block with every Dynamo (``torch._dynamo.config``) and symbolic-shape
    (``torch.fx.experimental._config``) setting at its default, and restore them all after it; yield a
    list that, at the end of the block, names the settings not at their default (changed by code inside
    the block, or forced by the environment). A flag such as ``capture_scalar_outputs`` or
    ``reorderable_logging_functions`` removes graph breaks from the count without removing their cause."""
    modules = _settings_modules()
    changed: list = []
    with contextlib.ExitStack() as stack:
        for m in modules:  # every setting patched, so every one is restored on the way out
            stack.enter_context(m.patch({n: copy.deepcopy(m._config[n].default) for n in _live(m)}))
        yield changed
        changed.extend(_changed(modules))


class InductorRefused(RuntimeError):
    """Raised by :func:`no_inductor` where code asks ``torch.compile`` for Inductor."""


INDUCTOR_REFUSED = ("Inductor is off in this check (a CPU compile with it takes ~20 s): pass a backend to "
                    "torch.compile: the one you were given, a counting backend of your own, or backend=\"eager\".")


@contextlib.contextmanager
def no_inductor():
    """Inside the block, ``torch.compile(fn)`` (Inductor, the default backend) and ``backend="inductor"``
    raise :class:`InductorRefused` instead of compiling: no check pays for Inductor."""
    from torch._dynamo.backends import registry

    def refuse(*args, **kwargs):
        raise InductorRefused(INDUCTOR_REFUSED)

    registry.lookup_backend("inductor")  # registered lazily: register it now, then swap it
    saved = torch._TorchCompileInductorWrapper, registry._COMPILER_FNS["inductor"]
    torch._TorchCompileInductorWrapper, registry._COMPILER_FNS["inductor"] = refuse, refuse
    try:
        yield
    finally:
        torch._TorchCompileInductorWrapper, registry._COMPILER_FNS["inductor"] = saved


def inductor_demo(out_path: str) -> dict:
    """Compile a bias + GELU + matmul function with Inductor, record its generated source and timings, write
    them to ``out_path`` as JSON. Run in a child process by :func:`start_inductor_demo`."""
    from torch._inductor.utils import run_and_get_code

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # steadier timings on a shared machine; eager and compiled alike

    def mlp(x, w, b):  # x (N, K), w (K, M), b (M,): a library matmul, then a fusable epilogue
        return torch.nn.functional.gelu(x @ w + b) * 2.0

    n = 256 if device == "cpu" else 4096
    x, w, b = (torch.randn(n, n, device=device), torch.randn(n, n, device=device), torch.randn(n, device=device))

    def timed(fn, repeats=10):
        for _ in range(3):
            fn(x, w, b)                 # warm-up: the compile and caches are not timed
        if device == "cuda":
            torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(x, w, b)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1e3)
        return float(min(samples))  # the run least disturbed by other processes

    from torch._dynamo.utils import counters

    compiled = torch.compile(mlp)
    start = time.perf_counter()
    _, codes = run_and_get_code(compiled, x, w, b)   # the first call compiles
    compile_s = time.perf_counter() - start
    cache_hit = counters["inductor"]["fxgraph_cache_hit"] > 0   # Inductor's on-disk cache had this graph
    eager_ms, compiled_ms = timed(mlp), timed(compiled)
    matmul_ms = timed(lambda x, w, b: x @ w)
    result = {"device": device, "n": n, "compile_s": compile_s, "cache_hit": cache_hit, "code": codes[0],
              "eager_ms": eager_ms, "compiled_ms": compiled_ms, "matmul_ms": matmul_ms,
              "same": bool(torch.allclose(compiled(x, w, b), mlp(x, w, b), rtol=1e-3, atol=1e-3))}
    Path(out_path).write_text(json.dumps(result))
    return result


class InductorDemo:
    """A running :func:`inductor_demo` child process; :meth:`result` waits for it and returns its dict."""

    def __init__(self, device: str):
        self.path = Path(tempfile.mkdtemp(prefix="gpulab-inductor-")) / "demo.json"
        cmd = [sys.executable, "-c", f"import gpulab.compiler as c; c.inductor_demo({str(self.path)!r})"]
        # one compile thread: no worker pool to start for a single kernel; a CPU lesson's child sees no GPU
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", **({} if device == "cuda" else
                                                                       {"CUDA_VISIBLE_DEVICES": ""}))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def result(self, timeout: float = 600) -> dict:
        _, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the Inductor demo failed:\n{err[-3000:]}")
        data = json.loads(self.path.read_text())
        data["waited_s"] = time.perf_counter() - self.started
        return data


def start_inductor_demo(device: str) -> InductorDemo:
    """Start compiling the demo function with Inductor in a child process; collect with ``.result()``."""
    return InductorDemo(device)
