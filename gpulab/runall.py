"""Run All through an unfinished lab: a cell that needs an exercise you have not written yet says which
one to finish, and the run carries on to the next cell (set up by :func:`gpulab.setup`, lesson 00).

A lab's stubs raise ``NotImplementedError("exercise `x`, function `f`: replace this line with your
code.")`` (written by ``python -m grader release``). Without help, Run All stops at the first demo cell
that calls one, and no later exercise shows its TODO. :func:`install` adds an IPython AST transformer
that runs each cell's body under ``try``: a stub's ``NotImplementedError`` prints a TODO line instead
of a traceback; so does a later error while that stub is still in place (a ``NameError`` for a name
the cut-short cell never assigned, a ``KeyError`` in results it left half-filled). Every other
exception is raised as before, and the inline checks still report "not attempted" (they catch
the stub themselves). The cell's last expression is still displayed, as IPython does.
"""
from __future__ import annotations

import ast
import re

STUB_MARK = "replace this line with your code"  # in every stub release writes

_held = None  # the value of a cell's last expression, between the guarded body and its display
_missing: dict[str, str] = {}  # a name a cut-short cell did not assign -> the exercise it waited for
_hit: dict = {}  # the code object of each stub met this session -> its exercise


# "exercise `x`" or "exercise `x`, function `f`" (or method `C.f`, class `C`), before the stub's mark.
_STUB = re.compile(r"(exercise `[^`]+`(?:, (?:function|method|class) `([^`]+)`)?): " + STUB_MARK)


def is_stub(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a released lab's stub, raised here or in a rank process whose error
    carries the stub's message (not a learner's own ``NotImplementedError``)."""
    return _STUB.search(str(exc)) is not None


def _exercise(exc: BaseException) -> str:
    """``"exercise `x`, function `f`"`` from a stub's message."""
    return _STUB.search(str(exc)).group(1)


def hold(value):
    global _held
    _held = value


def take():
    """The held value of the last expression (``None`` when the cell was cut short), then forget it."""
    global _held
    value, _held = _held, None
    return value


def unfinished(exc: BaseException, assigned: tuple[str, ...], namespace: dict, headers: tuple = ()) -> bool:
    """Report a cell cut short by an unfinished exercise; ``False`` means "not ours: raise it".

    Ours: a stub's ``NotImplementedError``; a ``NameError`` for a name a cut-short cell never assigned;
    and, while a stub this session met is still defined, any other error (a later demo cell that works on
    the unfinished results), which is then named in one line (``%tb`` shows its traceback). An error in
    the header of a ``def`` or ``class`` (``headers``: their line ranges; a decorator, a default value)
    is the learner's own and always shows."""
    if is_stub(exc):
        what = _exercise(exc)
        _hit.setdefault(_stub_code(exc, namespace), what)
        print(f"TODO: this cell needs {what}, which still raises NotImplementedError. Finish it where the lab "
              f"asks for it, then run this cell again. (Carrying on with the next cell.)")
    elif isinstance(exc, NameError) and getattr(exc, "name", None) in _missing:
        what = _missing[exc.name]
        print(f"TODO: this cell needs `{exc.name}`, which an earlier cell could not compute because "
              f"{what} is unfinished. (Carrying on with the next cell.)")
    elif isinstance(exc, Exception) and not _in_header(exc, headers) and (what := _live_stub(namespace)):
        import sys

        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__  # for %tb
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        print(f"TODO: this cell stopped at `{error}`, most likely because {what} is unfinished (an earlier "
              f"cell stopped at it). Finish it, then run this cell again; `%tb` shows the traceback. "
              f"(Carrying on with the next cell.)")
    else:
        return False
    for name in assigned:
        if name not in namespace:
            _missing[name] = what
    return True


def _in_header(exc: BaseException, headers: tuple) -> bool:
    """Whether the cell's own line that raised ``exc`` (its traceback's first entry) is in a def/class header."""
    line = exc.__traceback__.tb_lineno if exc.__traceback__ else 0
    return any(start <= line <= end for start, end in headers)


def _headers(body: list[ast.stmt]) -> list[tuple[int, int]]:
    """The lines of each top-level ``def``/``class`` header: decorators down to the line before its body."""
    return [(min([d.lineno for d in node.decorator_list] + [node.lineno]), max(node.lineno, node.body[0].lineno - 1))
            for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _stub_code(exc: BaseException, namespace: dict):
    """The code object of the function whose stub raised ``exc``: the one its message names, else the
    traceback's innermost frame."""
    name = _STUB.search(str(exc)).group(2)
    if name:
        value = namespace
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        if hasattr(value, "__code__"):
            return value.__code__
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code


def _live_stub(namespace: dict) -> str | None:
    """The first stub met this session that is still defined in ``namespace`` (a function, or a method of a
    class there), i.e. an exercise still unfinished; ``None`` when every one has been written since."""
    codes = set()
    for value in list(namespace.values()):
        members = vars(value).values() if isinstance(value, type) else (value,)
        codes.update(m.__code__ for m in members if hasattr(m, "__code__"))
    return next((what for code, what in _hit.items() if code in codes), None)


def _assigned(body: list[ast.stmt]) -> tuple[str, ...]:
    """The names a cell's top-level statements bind (assignments, definitions, imports, loop targets)."""
    names = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        else:
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    names.append(target.id)
    return tuple(dict.fromkeys(names))


def _call(func: str, *args: ast.expr) -> ast.Call:
    """``__import__("gpulab.runall").runall.<func>(*args)``: reachable whatever the cell's own names are."""
    package = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant("gpulab.runall")], [])
    module = ast.Attribute(package, "runall", ast.Load())
    return ast.Call(ast.Attribute(module, func, ast.Load()), list(args), [])


class GuardUnfinished(ast.NodeTransformer):
    """The AST transformer: ``body`` becomes ``try: body / except Exception as e: if not unfinished(e, ...):
    raise``, with a last expression held and displayed after the ``try``."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = node.body
        if not body or any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in body):
            return node  # a __future__ import must stay first
        last = body[-1] if isinstance(body[-1], ast.Expr) else None
        guarded = body[:-1] + [ast.Expr(_call("hold", last.value))] if last else list(body)
        exc = "_gpulab_unfinished"  # bound by `except ... as`, deleted by Python at the end of the handler
        names = ast.Tuple([ast.Constant(n) for n in _assigned(body)], ast.Load())
        namespace = ast.Call(ast.Name("globals", ast.Load()), [], [])
        headers = ast.Constant(tuple(_headers(body)))
        ours = _call("unfinished", ast.Name(exc, ast.Load()), names, namespace, headers)
        handler = ast.ExceptHandler(ast.Name("Exception", ast.Load()), exc,
                                    [ast.If(ast.UnaryOp(ast.Not(), ours), [ast.Raise()], [])])
        new = [ast.Try(guarded, [handler], [], [])]
        if last:
            new.append(ast.copy_location(ast.Expr(_call("take")), last))
        node.body = new
        return ast.fix_missing_locations(node)


def install(shell=None) -> bool:
    """Add the transformer to the running IPython shell (once); ``False`` outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    if not any(isinstance(t, GuardUnfinished) for t in shell.ast_transformers):
        shell.ast_transformers.append(GuardUnfinished())
    return True
