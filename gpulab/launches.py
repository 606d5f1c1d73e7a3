"""Watching Triton kernel launches, so a check can tell the learner's kernel from anything else (lesson 02).

This module owns every hook the checks put into Triton and PyTorch internals (the patch of
``KernelInterface.__getitem__``, the interpreter's memory access and store builder, and the
``TorchDispatchMode`` recorders); the checks import these context managers and patch nothing themselves.

Every Triton kernel object (compiled ``JITFunction``, the CPU ``InterpretedFunction``, the
``Autotuner`` and ``Heuristics`` wrappers) is launched through ``KernelInterface.__getitem__``
(``kernel[grid](...)``), so patching it sees every launch in both modes.

- :func:`record_launches` lists the names of the kernels launched (lesson 02 prints them).
- :func:`watch_launches` is what the checks use. Per launch it records the name and whether the
  kernel is the learner's *own*: defined outside ``gpulab/``, ``grader/``, Triton, PyTorch and every
  other installed package (see :func:`is_own_kernel`). In Triton's CPU interpreter it also checks
  every load and store against the tensors passed to the kernel: an access outside all of them is
  recorded (an :class:`OutOfBounds`), and one outside all of their *storages* is not performed, so a
  missing mask never reads unmapped memory or corrupts the heap, whatever the block size. (Pointers
  carry no provenance in the interpreter, so the part of an overflow that runs on into *another*
  argument is performed and not counted; its first elements, in the padding or guard region that
  follows every buffer a check makes, are always reported.)
  With ``ablate=True`` the learner's kernels do not run at all, and every tensor PyTorch allocates
  uninitialised (``torch.empty`` and friends) is filled with poison, so a scratch buffer never
  holds an earlier run's values by chance: a check can see whether the output was really
  computed by those kernels.
- Next to a watch: :func:`record_torch_ops` (PyTorch arithmetic outside the kernels),
  :func:`record_allocations` (floating-point tensors created) and :func:`record_stores` (the
  order in which programs store into an output, in the interpreter).
- :func:`record_saved`: the tensors autograd saves for backward, and :func:`count_matmul_flops`: the
  FLOPs of the matrix products run (lesson 05: a backward that recomputes P).
- :func:`count_flops`: a ``FlopCounterMode`` that counts totals only (lesson 10's checkpoints).

How the interpreter touches memory (Triton 3.9, ``triton/runtime/interpreter.py``): a tensor
argument becomes its raw address (``data_ptr()``; CPU storages are used in place, not copied),
``tl.load``/``tl.store`` become ``_interpreter.load(ptrs, mask, other, dtype)`` and
``_interpreter.store(ptrs, value, mask)`` in C++, which dereference every address whose mask is
true with no bounds check. An unmasked store past the end therefore writes into whatever the
allocator put there (a crash later, or nothing visible), and a load past the end of a mapping
segfaults. The watch replaces that module (``_interpreter``) with a checking stand-in while a
watched kernel runs.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import site
import sysconfig
from dataclasses import dataclass, field

import numpy as np


def _python_function(kernel):
    """The Python function behind a kernel object (Autotuner -> Heuristics -> JITFunction -> fn)."""
    inner = kernel
    for _ in range(6):
        nxt = getattr(inner, "fn", None)
        if nxt is None:
            break
        inner = nxt
    return inner


def _kernel_name(kernel) -> str:
    return getattr(_python_function(kernel), "__name__", type(kernel).__name__)


def _not_own_dirs() -> tuple[str, ...]:
    """Folders whose kernels are never the learner's: the helper and grader packages, and the
    Python installation (standard library, site-packages: Triton, PyTorch, anything installed)."""
    dirs = {os.path.dirname(os.path.abspath(__file__))}
    spec = importlib.util.find_spec("grader")  # located, not imported: gpulab never imports grader
    if spec is not None and spec.origin:
        dirs.add(os.path.dirname(os.path.abspath(spec.origin)))
    paths = [sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        paths.append(site.getusersitepackages())  # pip install --user
    except AttributeError:  # some embedded interpreters have no user site
        pass
    dirs.update(os.path.abspath(path) for path in paths if path)
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs))


_NOT_OWN = _not_own_dirs()
# Files that hold code the learner did not write although they live outside those folders: the
# lab's locked cells in the grader, and kernels that torch.compile generates into its cache.
_NOT_OWN_FILES = ("<lab setup>",)
_NOT_OWN_PARTS = ("torchinductor",)


def is_own_kernel(kernel) -> bool:
    """True when ``kernel`` was defined by the learner: in an answer cell (the grader executes them
    as ``<answer cell ID>``), a notebook cell, or a file of their own; False for kernels defined in
    gpulab, the grader, Triton, PyTorch or any installed package."""
    code = getattr(_python_function(kernel), "__code__", None)
    if code is None:
        return False
    filename = code.co_filename
    if filename in _NOT_OWN_FILES or any(part in filename for part in _NOT_OWN_PARTS):
        return False
    if filename.startswith("<"):
        return True
    return not os.path.abspath(filename).startswith(_NOT_OWN)


@dataclass
class Launch:
    name: str
    own: bool
    kind: str = ""                                    # launcher type: JITFunction, InterpretedFunction ...
    tensors: list = field(default_factory=list)       # (dtype name, numel, data_ptr) of each tensor argument


@dataclass
class OutOfBounds:
    """Accesses of one kind (load, store, atomic) by one kernel outside every tensor it was given,
    described relative to the nearest tensor argument ``arg`` (the kernel's parameter name)."""

    kernel: str
    access: str          # "load" | "store" | "atomic"
    arg: str
    arg_numel: int       # elements of that tensor's extent
    first: int           # first bad element, as an index into that tensor (< 0: before its start)
    count: int = 0       # bad element accesses, summed over the kernel's programs
    storage: int = 0     # data_ptr of that tensor's storage, to name it after the check's buffers

    @property
    def writes(self) -> bool:
        return self.access != "load"

    def message(self, tensor: str | None = None) -> str:
        """The report; ``tensor``: the check's own name for that tensor ("out", "lse" ...), if any."""
        verb = "read" if self.access == "load" else "wrote"
        arg = f"`{self.arg}`" + (f" (the `{tensor}` tensor)" if tensor and tensor != self.arg else "")
        if self.first >= 0:
            size = f"{self.arg_numel} element{'s' if self.arg_numel != 1 else ''}"
            where = f"past the end of {arg}, which has {size} (the first at index {self.first})"
        else:
            where = f"before the start of {arg} (the first at index {self.first})"
        what = "A load is missing its mask `offs < n` (give it mask= and other=)." if self.access == "load" \
            else "A store is missing its mask `offs < n`."
        return f"kernel `{self.kernel}` {verb} {self.count} element(s) {where}. {what}"


@dataclass
class LaunchWatch:
    """What :func:`watch_launches` saw. ``names`` grows as kernels launch."""

    names: list = field(default_factory=list)
    launches: list = field(default_factory=list)          # Launch per launch, in order
    out_of_bounds: list = field(default_factory=list)     # OutOfBounds, first occurrence order
    depth: int = 0                                        # > 0 while a kernel runs (its own tensor ops)

    @property
    def own(self) -> list[str]:
        return [launch.name for launch in self.launches if launch.own]

    def first_out_of_bounds(self, writes: bool, names: dict | None = None) -> str | None:
        """The first report of writes (or reads); ``names``: ``{storage data_ptr: name}`` of known tensors."""
        bad = [o for o in self.out_of_bounds if o.writes == writes]
        return bad[0].message((names or {}).get(bad[0].storage)) if bad else None


@contextlib.contextmanager
def record_launches():
    """Context manager yielding a list that collects the name of every Triton kernel launched."""
    with watch_launches(check_bounds=False) as watch:
        yield watch.names


# --- tensors a launch was given ------------------------------------------------------------------

def _tensor_args(pyfn, args, kwargs):
    """``(parameter name, tensor)`` for every tensor argument of a launch (tuples and tensor
    descriptors included)."""
    import torch

    try:
        names = list(inspect.signature(pyfn).parameters)
    except (TypeError, ValueError):
        names = []
    pairs = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    found = []

    def visit(name, value):
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                visit(f"{name}[{i}]", v)
        elif isinstance(getattr(value, "base", None), torch.Tensor):  # TensorDescriptor, TensorWrapper
            found.append((name, value.base))

    for name, value in pairs:
        visit(name, value)
    return found


def _extent(t) -> int:
    """Elements from the first to the last element of ``t`` (its strides included)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


# --- the interpreter's memory, checked --------------------------------------------------------------

class _Bounds:
    """The tensors of one launch: their extents (what the kernel may touch) and storages (what
    memory exists)."""

    def __init__(self, kernel: str, tensors, watch: LaunchWatch):
        self.kernel, self.watch = kernel, watch
        self.spans = []     # (name, lo, hi, itemsize, extent, storage data_ptr)
        self.storages = []  # (lo, hi)
        for name, t in tensors:
            n = _extent(t)
            if n:
                self.spans.append((name, t.data_ptr(), t.data_ptr() + n * t.element_size(), t.element_size(), n,
                                   t.untyped_storage().data_ptr()))
            st = t.untyped_storage()
            self.storages.append((st.data_ptr(), st.data_ptr() + st.nbytes()))

    def check(self, access: str, ptrs, mask, itemsize: int):
        """The mask with every lane outside all storages turned off; records lanes outside all extents."""
        addrs = np.asarray(ptrs, dtype=np.uint64)
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), addrs.shape)
        end = addrs + np.uint64(itemsize)
        in_span = np.zeros(addrs.shape, dtype=bool)
        for _, lo, hi, *_ in self.spans:
            in_span |= (addrs >= np.uint64(lo)) & (end <= np.uint64(hi))
        bad = mask & ~in_span
        if not bad.any():
            return np.ascontiguousarray(mask)
        self._record(access, addrs[bad], itemsize)
        in_storage = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in self.storages:
            in_storage |= (addrs >= np.uint64(lo)) & (end <= np.uint64(hi))
        return np.ascontiguousarray(mask & in_storage)

    def _record(self, access: str, bad_addrs, itemsize: int) -> None:
        first = int(bad_addrs.min())
        if not self.spans:
            name, index, numel, storage = "?", 0, 0, 0
        else:
            def distance(span):
                lo, hi = span[1], span[2]
                return first - hi if first >= hi else lo - first
            name, lo, _, size, numel, storage = min(self.spans, key=distance)
            index = (first - lo) // size if first >= lo else -((lo - first + size - 1) // size)
        for o in self.watch.out_of_bounds:
            if (o.kernel, o.access, o.arg) == (self.kernel, access, name):
                o.count += int(bad_addrs.size)
                return
        self.watch.out_of_bounds.append(
            OutOfBounds(self.kernel, access, name, numel, index, int(bad_addrs.size), storage))


class _CheckedMemory:
    """Stands in for the interpreter's C++ memory module (``_interpreter``) during a watched launch."""

    class OutOfBoundsError(RuntimeError):
        pass

    def __init__(self, real, bounds: _Bounds):
        self._real, self._bounds = real, bounds

    def __getattr__(self, name):
        return getattr(self._real, name)

    def load(self, ptrs, mask, other, dtype):
        return self._real.load(ptrs, self._bounds.check("load", ptrs, mask, np.dtype(dtype).itemsize), other, dtype)

    def store(self, ptrs, value, mask):
        return self._real.store(ptrs, value, self._bounds.check("store", ptrs, mask, np.asarray(value).itemsize))

    def atomic_rmw(self, op, ptrs, val, mask, sem):
        return self._real.atomic_rmw(op, ptrs, val, self._bounds.check("atomic", ptrs, mask, np.asarray(val).itemsize),
                                     sem)

    def atomic_cas(self, ptrs, cmp, val, sem):
        ones = np.ones(np.shape(ptrs), dtype=bool)
        if not self._bounds.check("atomic", ptrs, ones, np.asarray(val).itemsize).all():
            raise self.OutOfBoundsError("atomic_cas outside the tensors passed to the kernel (it has no mask)")
        return self._real.atomic_cas(ptrs, cmp, val, sem)


def can_check_bounds() -> bool:
    """True when this Triton's interpreter can be bounds-checked (its memory module is where
    :func:`watch_launches` expects it)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    real = getattr(interpreter, "_interpreter", None)
    return all(hasattr(real, name) for name in ("load", "store", "atomic_rmw", "atomic_cas"))


@contextlib.contextmanager
def _checked_memory(bounds: _Bounds):
    try:
        from triton.runtime import interpreter
        real = interpreter._interpreter
    except (ImportError, AttributeError):  # not this Triton's interpreter: the guard regions remain
        yield
        return
    interpreter._interpreter = _CheckedMemory(real, bounds)
    try:
        yield
    finally:
        interpreter._interpreter = real


# --- ablation ----------------------------------------------------------------------------------------

_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


@contextlib.contextmanager
def _poisoned_allocations():
    """Every tensor PyTorch allocates uninitialised inside is filled with poison (NaN, or the
    integer minimum): an allocator that hands back the memory of an earlier run's scratch tensor
    must not make a do-nothing kernel look like it computed something."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Poison(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in _UNINITIALISED and isinstance(out, torch.Tensor) and out.numel():
                if out.dtype.is_floating_point:
                    out.fill_(float("nan"))
                elif out.dtype != torch.bool and not out.dtype.is_complex:
                    out.fill_(torch.iinfo(out.dtype).min)
            return out

    with Poison():
        yield


# --- the watch ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def watch_launches(*, check_bounds: bool = True, ablate: bool = False):
    """Context manager yielding a :class:`LaunchWatch` of every Triton launch inside it.

    ``check_bounds``: in the CPU interpreter, record accesses outside the launch's tensors and skip
    those outside their storages. ``ablate``: the learner's own kernels do not run (their launches
    return at once), and uninitialised PyTorch allocations are filled with poison.
    """
    from triton.runtime.jit import KernelInterface

    watch = LaunchWatch()
    original = KernelInterface.__getitem__

    def watching_getitem(self, grid):
        pyfn = _python_function(self)
        launch = Launch(_kernel_name(self), is_own_kernel(self), type(self).__name__)
        watch.names.append(launch.name)
        watch.launches.append(launch)
        if ablate and launch.own:
            return lambda *args, **kwargs: None
        launcher = original(self, grid)

        def run(*args, **kwargs):
            import torch

            launch.tensors = [(str(a.dtype), a.numel(), a.data_ptr()) for a in (*args, *kwargs.values())
                              if isinstance(a, torch.Tensor)]
            tensors = _tensor_args(pyfn, args, kwargs) if check_bounds else []
            watch.depth += 1  # the interpreter's own tensor copies are not the caller's PyTorch ops
            try:
                if not tensors or any(t.device.type != "cpu" for _, t in tensors):
                    return launcher(*args, **kwargs)  # compiled on a GPU: the guard regions remain
                with _checked_memory(_Bounds(launch.name, tensors, watch)):
                    return launcher(*args, **kwargs)
            finally:
                watch.depth -= 1
        return run

    KernelInterface.__getitem__ = watching_getitem
    try:
        with (_poisoned_allocations() if ablate else contextlib.nullcontext()):
            yield watch
    finally:
        KernelInterface.__getitem__ = original


# --- PyTorch operations and stores next to the kernels ------------------------------------------------

@contextlib.contextmanager
def record_torch_ops(watch: LaunchWatch, allowed: frozenset | set = frozenset()):
    """Inside a :func:`watch_launches` block: yield a list collecting ``"aten.<op>"`` for every PyTorch
    operation run outside the kernels (lesson 04: a matmul done by PyTorch next to a token kernel),
    except the names in ``allowed`` (views, copies, allocation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if watch.depth == 0 and name not in allowed:
                ops.append(f"aten.{name}")
            return func(*args, **(kwargs or {}))

    with _Ops():
        yield ops


@dataclass
class Allocations:
    """What :func:`record_allocations` saw: elements of floating-point tensors created, the biggest,
    the distinct shapes created (lesson 05: no ``(seq_q, seq_k)`` score matrix in a tiled loop) and
    their dtypes (lesson 07: no float32 accumulator next to float16 data)."""

    float_elements: int = 0
    biggest: tuple = (0, "", ())    # (numel, op, shape)
    shapes: set = field(default_factory=set)
    dtypes: set = field(default_factory=set)  # "torch.float32" ...


@contextlib.contextmanager
def record_allocations():
    """Yield an :class:`Allocations` adding up every floating-point tensor an ATen op *creates*
    (views, in-place and ``out=`` ops create nothing): lesson 08's weight-only kernel must not
    materialise the dequantized weights."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = Allocations()

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            if not schema.is_mutable and all(r.alias_info is None for r in schema.returns):
                for o in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.numel():
                        seen.float_elements += o.numel()
                        seen.biggest = max(seen.biggest, (o.numel(), str(func), tuple(o.shape)))
                        seen.shapes.add(tuple(o.shape))
                        seen.dtypes.add(str(o.dtype))
            return out

    with _Mode():
        yield seen


@contextlib.contextmanager
def record_stores(out):
    """In the interpreter, yield a list of ``(program id, first element written)`` for each store into
    the tensor ``out``, in execution order (lesson 04: the grouped tile order). Yields ``None`` where
    it cannot observe (compiled kernels, a Triton without the interpreter's builder)."""
    from gpulab.device import interpreted

    if not interpreted():
        yield None
        return
    try:
        from triton.runtime import interpreter as interp
        builder = interp.interpreter_builder
        original = builder.create_masked_store
    except (ImportError, AttributeError):
        yield None
        return
    base, end = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    events: list = []

    def create_masked_store(ptrs, value, mask, *args, **kwargs):
        addrs = ptrs.data[mask.data] if mask is not None else ptrs.data.ravel()
        if addrs.size:
            first = int(addrs.min())
            if base <= first < end:
                events.append((int(builder.grid_idx[0]), (first - base) // out.element_size()))
        return original(ptrs, value, mask, *args, **kwargs)

    builder.create_masked_store = create_masked_store
    try:
        yield events
    finally:
        try:
            del builder.create_masked_store
        except AttributeError:
            pass


@dataclass
class Saved:
    """One tensor autograd saved for backward, seen by :func:`record_saved`."""

    shape: tuple
    dtype: str
    nbytes: int


@contextlib.contextmanager
def record_saved():
    """Yield a list of :class:`Saved`, one per tensor autograd saves for backward inside the block
    (``torch.autograd.graph.saved_tensors_hooks``; ``ctx.save_for_backward`` of a custom Function
    included). Lesson 05: a FlashAttention forward saves q, k, v, out and the log-sum-exp, never P."""
    import torch

    saved: list = []

    def pack(t):
        saved.append(Saved(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


@dataclass
class MatmulFlops:
    """What :func:`count_matmul_flops` counted: FLOPs of the matrix products, 2 per multiply-add."""

    total: int = 0


@contextlib.contextmanager
def count_matmul_flops():
    """Yield a :class:`MatmulFlops` adding up the matrix products run inside the block (``mm``,
    ``bmm``, ``addmm``, ``baddbmm``: what ``@`` on 2-D to 4-D tensors becomes), 2·m·n·k each.
    Lesson 05: a FlashAttention backward that recomputes P runs five tile products, not four.
    Lighter than :func:`count_flops`, whose first use costs seconds of imports."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    inner_dim = {aten.mm: 0, aten.bmm: 0, aten.addmm: 1, aten.baddbmm: 1}  # the argument whose last dim is k
    seen = MatmulFlops()

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            arg = inner_dim.get(func.overloadpacket)
            if arg is not None:
                seen.total += 2 * out.numel() * args[arg].shape[-1]
            return out

    with _Mode():
        yield seen


# --- FLOPs (lesson 10) -----------------------------------------------------------------------------

class _NoModuleTracking:
    """Stands in for ``FlopCounterMode``'s module tracker, whose per-module breakdown puts gradient
    hooks on module inputs: those make ``torch.autograd.grad`` inside a backward (a correct way to
    write a checkpoint) raise. The checks only need the total."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def count_flops():
    """A ``torch.utils.flop_counter.FlopCounterMode`` (display off, used as a context manager) that
    counts totals only: ``get_total_flops()`` after the block."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _NoModuleTracking()
    return counter
