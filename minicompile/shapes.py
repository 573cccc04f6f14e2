"""Symbolic sizes: the size symbols of one dynamic capture and what the trace learnt of them.

A dynamic dimension becomes a size symbol ``s0, s1, ...`` with its traced value as a *hint*.
A :class:`ShapeContext` wraps one PyTorch ``ShapeEnv`` and fake-tensor mode, so metadata on
symbolic shapes follows PyTorch's own rules, and every decision taken on a symbol records the
relation it relied on (``Eq(s0, s1)``, ``s0 > 4``) for the guards (:meth:`relations`).
PyTorch's symbols never leave this module: :meth:`to_sympy` and :meth:`to_symint` translate.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import sympy
import torch

from minicompile import compat
from minicompile.errors import ShapeError
from minicompile.sym import FloorDiv, ModularIndexing, size_symbol

MIN_DYNAMIC_SIZE = 2  # sizes 0 and 1 stay specialised (their own compiled entries)


@dataclasses.dataclass(frozen=True)
class SymbolSource:
    """Where a size symbol is read from in the frame: ``L['x']``'s dim 0."""

    name: str  # readable ("L['x'].shape[0]")
    expr: str  # Python over the guard function's parameters ("L_x.shape[0]")
    is_tensor_size: bool = True  # False: a Python int argument ("L['n']")


class ShapeContext:
    """The size symbols of one capture, their hints and sources, and the relations the
    trace recorded on them."""

    def __init__(self) -> None:
        # No duck sizing: two dims that happen to be equal get two symbols, and a
        # relation only where the program relies on one (a broadcast, a matmul).
        self.env = compat.shape_env(duck_shape=False)
        self.mode = compat.fake_tensor_mode(shape_env=self.env, allow_non_fake_inputs=True)
        self.hints: dict[sympy.Symbol, int] = {}
        self.sources: dict[sympy.Symbol, SymbolSource] = {}
        self._ours: dict[sympy.Symbol, sympy.Symbol] = {}  # PyTorch's symbol -> ours
        self._theirs: dict[sympy.Symbol, sympy.Symbol] = {}  # ours -> PyTorch's
        self._symints: dict[sympy.Symbol, Any] = {}
        self._known: tuple[int, dict] = (-1, {})

    # -- symbols -------------------------------------------------------------------------

    def symbol(self, hint: int, source: SymbolSource) -> sympy.Symbol:
        """A new size symbol for a dimension of traced size ``hint`` (at least 2)."""
        assert hint >= MIN_DYNAMIC_SIZE, hint
        src = compat.source_class()(source.name)
        theirs = self.env.create_symbol(hint, src, dynamic_dim=compat.dynamic_dim())
        ours = size_symbol(len(self.hints))
        self._ours[theirs] = ours
        self._theirs[ours] = theirs
        self.hints[ours] = hint
        self.sources[ours] = source
        self._symints[ours] = self.env.create_symintnode(theirs, hint=hint, source=src)
        return ours

    def scalar_symbols(self) -> list[sympy.Symbol]:
        """Symbols read from Python ints of the frame (not a tensor's size), in order."""
        return [s for s, where in self.sources.items() if not where.is_tensor_size]

    def hint(self, expr: Any) -> int:
        """The traced value of a size expression."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        return int(expr.xreplace({s: sympy.Integer(v) for s, v in self.hints.items()}))

    # -- PyTorch's values <-> ours -------------------------------------------------------

    def to_sympy(self, value: Any) -> sympy.Expr:
        """An int or a SymInt as a sympy expression over our symbols."""
        if isinstance(value, torch.SymInt):
            return self._ours_of(value)
        return sympy.Integer(int(value))

    def _ours_of(self, value: Any) -> sympy.Expr:
        """A SymInt/SymBool/SymFloat's expression over our symbols, with PyTorch's
        replacements and the sizes its guards proved constant (a reshape's -1) applied."""
        expr = self.env.replace(value.node.expr).xreplace(self._known_values())
        if expr.is_Integer:
            return sympy.Integer(int(expr))
        return self._translate(expr, self._ours, _FROM_TORCH)

    def _known_values(self) -> dict[sympy.Expr, sympy.Integer]:
        """Expressions the recorded guards pin to a constant: ``Eq(64*FloorDiv(..), 128)``."""
        if self._known[0] != len(self.env.guards):
            known = {}
            for guard in self.env.guards:
                e = guard.expr
                if isinstance(e, sympy.Eq) and e.rhs.is_Integer:
                    lhs, value = e.lhs, int(e.rhs)
                    if isinstance(lhs, sympy.Mul) and lhs.args[0].is_Integer:
                        coeff = int(lhs.args[0])
                        if value % coeff:
                            continue
                        lhs, value = lhs / coeff, value // coeff
                    known[lhs] = sympy.Integer(value)
            self._known = (len(self.env.guards), known)
        return self._known[1]

    def to_symint(self, expr: Any) -> Any:
        """A size expression over our symbols as an int or a SymInt PyTorch computes with."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr in self._symints:
            return self._symints[expr]
        theirs = self._translate(expr, self._theirs, _to_torch_table())
        return self.env.create_symintnode(theirs, hint=self.hint(expr))

    def _translate(self, expr: sympy.Expr, symbols: dict, functions: dict) -> sympy.Expr:
        def rebuild(e: sympy.Basic) -> sympy.Basic:
            if not e.args:
                if isinstance(e, sympy.Symbol) and e not in symbols:
                    raise ShapeError(f"size expression {expr} uses an unknown symbol {e}")
                return symbols.get(e, e)
            args = [rebuild(a) for a in e.args]
            name = type(e).__name__
            if name in functions:
                return functions[name](*args)
            if isinstance(e, sympy.Function) and not isinstance(e, _SYMPY_FUNCTIONS):
                raise ShapeError(f"size expression {expr} uses {name}")
            return e.func(*args)

        return rebuild(sympy.sympify(expr))

    def python_source(self, value: Any) -> str:
        """A SymInt (or SymBool, SymFloat) as Python over the frame's tensors' shapes, for
        the generated functions that rebuild Python values of the frame."""
        names = {s: where.expr for s, where in self.sources.items()}
        text = python_expr(self._ours_of(value), names)
        return f"float({text})" if isinstance(value, torch.SymFloat) else text

    # -- fake tensors --------------------------------------------------------------------

    def fake(
        self, shape: tuple, stride: tuple, dtype: torch.dtype, offset: Any = 0,
        device: Any = "meta",
    ) -> Any:
        """A fake tensor with this symbolic layout, on the tensor's own device: library
        kernels pick their rules by device (attention's CPU rules specialise sizes)."""
        with self.mode:
            t = torch.empty_strided(tuple(self.to_symint(s) for s in shape),
                                    tuple(self.to_symint(s) for s in stride),
                                    dtype=dtype, device=device)
            if offset:
                t = t.as_strided(t.shape, t.stride(), self.to_symint(offset))
        return t

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` on fake tensors (PyTorch's error raised as is, its logger kept quiet),
        under the Python dispatcher as Dynamo traces: composite ops then run their Python
        decompositions, written for symbolic sizes (2.11's C++ matmul calls ``numel()``)."""
        quiet = logging.getLogger("torch._subclasses.fake_tensor")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            with self.mode, compat.python_dispatcher():
                return fn(*args, **kwargs)
        finally:
            quiet.setLevel(level)

    # -- what the trace relied on --------------------------------------------------------

    def relations(self) -> list[sympy.Expr]:
        """The relations recorded on the symbols (guards), over our symbols: PyTorch's
        shape guards, and the symbols it replaced by an expression (``Eq(s1, s0)``)."""
        out: list[sympy.Expr] = []
        for theirs, ours in self._ours.items():
            repl = self.env.replacements.get(theirs)
            if repl is not None and repl != theirs:
                out.append(sympy.Eq(ours, self._translate(repl, self._ours, _FROM_TORCH)))
        seen = {_unordered(e) for e in out}
        for guard in self.env.guards:
            expr = self._translate(guard.expr, self._ours, _FROM_TORCH)
            if expr is not sympy.true and _unordered(expr) not in seen:  # a == b is b == a
                seen.add(_unordered(expr))
                out.append(expr)
        return out


_SYMPY_FUNCTIONS = (sympy.Max, sympy.Min, sympy.Mod)


def _unordered(relation: sympy.Basic) -> Any:
    """A key under which ``Eq(a, b)`` and ``Eq(b, a)`` (or ``Ne``) are one relation."""
    if isinstance(relation, (sympy.Eq, sympy.Ne)):
        return (type(relation).__name__, frozenset(relation.args))
    return relation


_FROM_TORCH: dict[str, Callable[..., sympy.Expr]] = {
    "FloorDiv": FloorDiv, "CleanDiv": FloorDiv, "ModularIndexing": ModularIndexing,
    "Mod": sympy.Mod, "PythonMod": sympy.Mod, "PowByNatural": sympy.Pow, "Max": sympy.Max,
    "Min": sympy.Min,
}


@functools.cache
def _to_torch_table() -> dict[str, Callable[..., sympy.Expr]]:
    fns = compat.sympy_functions()
    return {"FloorDiv": fns.FloorDiv, "ModularIndexing": fns.ModularIndexing,
            "Max": fns.Max, "Min": fns.Min}


def is_symbolic(values: Any) -> bool:
    """Whether a size, or a tuple of sizes, has a free symbol."""
    if isinstance(values, (tuple, list)):
        return any(is_symbolic(v) for v in values)
    return isinstance(values, sympy.Basic) and bool(values.free_symbols)


def python_expr(expr: Any, names: dict[sympy.Symbol, str] | None = None) -> str:
    """A size expression, or a relation between sizes, as Python source; each symbol is
    printed as ``names[symbol]`` (an expression such as ``L_x.shape[0]``) or its own name."""
    names = names or {}

    def atom(e: sympy.Basic) -> str:
        text = show(e)
        return text if (not e.args or isinstance(e, sympy.Function)) else f"({text})"

    def show(e: sympy.Basic) -> str:
        if e is sympy.true or e is sympy.false:
            return str(bool(e))
        if isinstance(e, sympy.Integer):
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            return names.get(e, e.name)
        if isinstance(e, sympy.Add):
            return " + ".join(atom(a) for a in sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Mul):
            return "*".join(atom(a) for a in sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "*".join([atom(e.base)] * int(e.exp))
        if isinstance(e, FloorDiv):
            return f"({atom(e.args[0])} // {atom(e.args[1])})"
        if isinstance(e, ModularIndexing):
            return f"(({atom(e.args[0])} // {atom(e.args[1])}) % {atom(e.args[2])})"
        if isinstance(e, sympy.Mod):
            return f"({atom(e.args[0])} % {atom(e.args[1])})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = "max" if isinstance(e, sympy.Max) else "min"
            return f"{fn}({', '.join(show(a) for a in e.args)})"
        if isinstance(e, sympy.Not):
            return f"not {atom(e.args[0])}"
        if isinstance(e, (sympy.And, sympy.Or)):
            op = " and " if isinstance(e, sympy.And) else " or "
            return op.join(atom(a) for a in e.args)
        if isinstance(e, sympy.core.relational.Relational):
            return f"{atom(e.lhs)} {e.rel_op} {atom(e.rhs)}"
        raise ShapeError(f"cannot print size expression {e} as Python")

    return show(sympy.sympify(expr))
