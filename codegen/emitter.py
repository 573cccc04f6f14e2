"""The expression walk both backends share, with the dtype decisions made once.

A kernel emitter subclasses :class:`ExprEmitter` and holds a :class:`Dialect`: how its
language spells a dtype, a literal, a cast, a rounding and each op (a column of
minicompile/op_table.py).  Decided here, for both: the walk over a body (loads, Cat pieces
and reductions are the backend's); the spelling an op takes for its operand dtype
(:func:`legal_op`: integer and bool variants, float32's IEEE division, float64's
reciprocal, ``x ** 2`` and ``x ** 3`` as products); float16/bfloat16 computed in float32
(:func:`compute_dtype`), rounded at casts and, where the dialect says so, after every op.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minicompile.ir import (LOW_PRECISION, REDUCTION_IDENTITY, Cast, Cat, Constant, Expr,
                            IndexExpr, Load, Op, Reduce, walk)
from minicompile.op_table import BY_NAME, IDENTITY

from minicompile.codegen.common import KernelPlan, Store, pending, row_invariant


# The dtypes kernels compute on, each backend's dialect names them.
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of ``dtype`` is computed in: float32 for float16/bfloat16."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def reduction_identity(red: Reduce) -> bool | int | float:
    """The value ``red`` starts from (and masked lanes enter it as): an infinity of an
    integer dtype is its extreme value."""
    value = REDUCTION_IDENTITY[red.op]
    if isinstance(value, float) and math.isinf(value) and not red.dtype.is_floating_point:
        if red.dtype == torch.bool:
            return value > 0
        info = torch.iinfo(red.dtype)
        return info.min if value < 0 else info.max
    return value


_PRODUCTS = {2: "square", 3: "cube"}  # x ** n as PyTorch's pow kernels compute it


def legal_op(e: Op) -> str:
    """The op ``e`` is spelled as (a row of minicompile/op_table.py), for its operands'
    dtype; IDENTITY where the result is the first operand itself."""
    row, dtype = BY_NAME[e.op], e.args[-1].dtype
    if dtype == torch.bool and "bool" in row.variants:
        return row.variants["bool"]
    if not dtype.is_floating_point:
        return row.variants.get("int", e.op)
    exponent = e.args[-1]
    if e.op == "pow" and isinstance(exponent, Constant) and not isinstance(exponent.value, bool) \
            and exponent.value in _PRODUCTS:
        return _PRODUCTS[exponent.value]
    return row.variants.get("f32" if compute_dtype(dtype) == torch.float32 else "f64", e.op)


class Dialect:
    """How one language spells values.  ``dtypes`` names each dtype's type; ``ops`` holds
    a template for each row of minicompile/op_table.py; ``rounds_each_op``: float16/bfloat16
    results are rounded after every op (else only at casts and stores).  A dialect also
    spells ``special(value)`` (a NaN or an infinity), ``float_literal(text, dtype)``,
    ``int_literal(value, dtype)``, ``cast(x, dtype)`` (to any dtype but bool, rounded to
    float16/bfloat16 there) and ``round(x, dtype)`` (a float32 value rounded to
    float16/bfloat16, kept in float32)."""

    dtypes: dict[torch.dtype, str]
    ops: dict[str, str]
    true, false = "true", "false"
    rounds_each_op = False

    def compute(self, dtype: torch.dtype) -> str:
        """The type a value of ``dtype`` is computed in."""
        return self.dtypes[compute_dtype(dtype)]

    def literal(self, value: bool | int | float, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return self.true if value else self.false
        if dtype.is_floating_point:
            v = float(value)
            return self.float_literal(repr(v) if math.isfinite(v) else self.special(v), dtype)
        return self.int_literal(int(value), dtype)


class ExprEmitter:
    """The expression walk.  A backend supplies ``dialect``, ``names`` (each emitted
    expression's variable), ``define(text, dtype, operands)`` (a new variable holding
    ``text``, a value of ``dtype`` computed from the ``operands`` variables),
    ``operands(op)`` (the variables of an Op's arguments, an integer divisor checked:
    ir.divides_by_values) and what only it emits: ``emit_load``, ``emit_index`` (a
    non-constant index value), ``emit_cat`` and, with reductions, ``emit_reduce``."""

    dialect: Dialect
    plan: KernelPlan
    names: dict[Expr, str]

    def pointer(self, buffer: str) -> str:
        """The parameter that points at ``buffer`` (a combo kernel renames them)."""
        return self.plan.pointer(buffer)

    def value(self, expr: Expr) -> str:
        """The variable holding ``expr``, emitting what is not computed yet (children
        first; a reduction emits its own operand)."""
        for e in pending(expr, self.names):
            self.names[e] = self.emit_expr(e)
        return self.names[expr]

    def emit_expr(self, e: Expr) -> str:
        if isinstance(e, Load):
            return self.emit_load(e)
        if isinstance(e, Constant):
            return self.dialect.literal(e.value, e.dtype)
        if isinstance(e, IndexExpr):  # the index itself, as an int64 value
            if not e.index.free_symbols:
                return self.dialect.literal(int(e.index), torch.int64)
            return self.emit_index(e)
        if isinstance(e, Reduce):
            return self.emit_reduce(e)
        if isinstance(e, Cat):
            for red in (x for x in walk(e) if isinstance(x, Reduce)):
                self.value(red)  # a whole row's value: computed outside every piece's condition
            return self.emit_cat(e)
        if isinstance(e, Cast):
            return self.emit_cast(e)
        assert isinstance(e, Op)
        return self.emit_op(e)

    def emit_cast(self, e: Cast) -> str:
        if isinstance(e.x, IndexExpr) and not e.x.index.free_symbols:  # a constant
            return self.dialect.literal(torch.tensor(int(e.x.index)).to(e.dtype).item(), e.dtype)
        x = self.names[e.x]
        text = f"{x} != 0" if e.dtype == torch.bool else self.dialect.cast(x, e.dtype)
        return self.define(text, e.dtype, [x])

    def emit_op(self, e: Op) -> str:
        args = self.operands(e)
        op = legal_op(e)
        if op == IDENTITY:
            return args[0]
        text = self.dialect.ops[op].format(*args, t=self.dialect.compute(e.dtype))
        if self.dialect.rounds_each_op and e.dtype in LOW_PRECISION:
            text = self.dialect.round(text, e.dtype)
        return self.define(text, e.dtype, args)

    def emit_stores(self, store: Callable[[Store], None]) -> None:
        """Every value before any store (an input may be stored into in place), then
        ``store`` of each."""
        for st in self.plan.stores:
            self.value(st.value)
        for st in self.plan.stores:
            store(st)

    def hoist(self, exprs: list[Expr]) -> None:
        """Compute the row-invariant parts of ``exprs`` once, before the loop over a row."""
        for e in row_invariant(exprs, self.names, self.plan.rvars):
            self.names[e] = self.emit_expr(e)

    def emit_reduce(self, e: Reduce) -> str:
        raise AssertionError("a pointwise kernel has no reductions")
