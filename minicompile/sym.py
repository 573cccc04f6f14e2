"""Index arithmetic: size symbols (``s0``..., positive integers), index symbols
(non-negative integers) and the floor division and modulo functions index expressions use,
which simplify with what sympy knows of their arguments; only the per-backend printers
(codegen/printers.py) turn them into text.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import sympy


# Symbols are made once per name: sympy's own constructor checks the assumptions on every
# call, and codegen asks for the index symbols tens of thousands of times per graph.
@functools.cache
def size_symbol(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"s{i}", integer=True, positive=True)


def is_size_symbol(s: sympy.Basic) -> bool:
    return isinstance(s, sympy.Symbol) and s.is_positive and s.name[:1] == "s" and (
        s.name[1:].isdigit()
    )


def size_symbols(exprs: Iterable[sympy.Expr]) -> tuple[sympy.Symbol, ...]:
    """The size symbols in ``exprs``, in number order (s0, s1, s10...)."""
    found = {s for e in exprs for s in sympy.sympify(e).free_symbols if is_size_symbol(s)}
    return tuple(sorted(found, key=lambda s: int(s.name[1:])))


@functools.cache
def index_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


class FloorDiv(sympy.Function):
    """``base // divisor`` for a non-negative base and a positive divisor."""

    nargs = (2,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1:
            return base
        if divisor == 0:  # splits an index over an empty range: no element reaches it
            return sympy.Integer(0)
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        quotient = sympy.cancel(base / divisor)
        if quotient.is_polynomial() and _is_poly_int(quotient):
            return quotient
        return None


class ModularIndexing(sympy.Function):
    """``(base // divisor) % modulus``: the coordinate of a flat index along one dimension."""

    nargs = (3,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr, modulus: sympy.Expr) -> sympy.Expr | None:
        if modulus == 1 or base == 0 or divisor == 0 or modulus == 0:  # (0: an empty range)
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        return None


def simplify_bounded(expr: sympy.Expr, bounds: dict) -> sympy.Expr:
    """``expr`` with each FloorDiv and ModularIndexing worked out where the symbols'
    ``bounds`` (symbol -> its static size: values 0 .. size - 1) allow: ``(12*p0 + p1) // 12``
    is ``p0`` and ``(12*p0 + p1) % 12`` is ``p1`` when ``p1 < 12`` (an index that a reshape
    split, read over dims that a reshape merged)."""

    def divide(base: sympy.Expr, divisor: sympy.Expr) -> tuple | None:
        """(quotient, remainder) of ``base`` by ``divisor`` when the bounds fix them."""
        if not divisor.is_Integer or int(divisor) <= 0:
            return None
        d, low, high = int(divisor), 0, 0
        quotient, remainder = [], []
        for term in sympy.Add.make_args(sympy.expand(base)):
            coeff, rest = term.as_coeff_Mul()
            if not coeff.is_Integer or not (rest == 1 or rest in bounds):
                return None
            if int(coeff) % d == 0:
                quotient.append(term / d)
                continue
            remainder.append(term)
            span = int(coeff) * (int(bounds[rest]) - 1 if rest != 1 else 1)
            low, high = low + min(span, 0), high + max(span, 0)
        if low < 0 or high >= d:
            return None
        return sympy.Add(*quotient), sympy.Add(*remainder)

    def floor_div(base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr:
        split = divide(base, divisor)
        return split[0] if split is not None else FloorDiv(base, divisor)

    def modular(base: sympy.Expr, divisor: sympy.Expr, modulus: sympy.Expr) -> sympy.Expr:
        split = divide(floor_div(base, divisor), modulus)
        return split[1] if split is not None else ModularIndexing(base, divisor, modulus)

    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    expr = merge_digits(sympy.expand(expr))
    return sympy.expand(expr.replace(FloorDiv, floor_div).replace(ModularIndexing, modular))


def merge_digits(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with neighbouring digits of one index merged: ``c*((b // d) % m) +
    c*m*((b // (d*m)) % n)`` is ``c*((b // d) % (m*n))``, and ``c*m*(b // (d*m))`` in the
    second term's place makes ``c*(b // d)`` (a dim a reshape split, read back merged:
    ``(r % 64) + 64*((r // 64) % 3)`` is ``r % 192``)."""
    terms = list(sympy.Add.make_args(expr))
    merged = True
    while merged:
        merged = False
        for i, j in ((i, j) for i in range(len(terms)) for j in range(len(terms)) if i != j):
            both = _digit(terms[i]), _digit(terms[j])
            if None in both:
                continue
            (c1, b1, d1, m1), (c2, b2, d2, m2) = both
            if b1 != b2 or m1 is None or d2 != d1 * m1 or c2 != c1 * m1:
                continue
            whole = FloorDiv(b1, d1) if m2 is None else ModularIndexing(b1, d1, m1 * m2)
            terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [c1 * whole]
            merged = True
            break
    return sympy.Add(*terms)


def _digit(term: sympy.Expr) -> tuple | None:
    """``term`` as (coefficient, base, divisor, modulus) of ``c*((b // d) % m)``, modulus
    None for ``c*(b // d)``; None for a term of another form."""
    coeff, rest = term.as_coeff_Mul()
    if not coeff.is_Integer:
        return None
    if isinstance(rest, ModularIndexing) and rest.args[1].is_Integer and rest.args[2].is_Integer:
        return int(coeff), rest.args[0], int(rest.args[1]), int(rest.args[2])
    if isinstance(rest, FloorDiv) and rest.args[1].is_Integer:
        return int(coeff), rest.args[0], int(rest.args[1]), None
    return None


def _is_poly_int(expr: sympy.Expr) -> bool:
    """Whether every coefficient of ``expr`` is an integer (so it is exact to divide)."""
    return all(c.is_Integer for c in sympy.Poly(expr).coeffs()) if expr.free_symbols else True


def product(values: Iterable[sympy.Expr]) -> sympy.Expr:
    out: sympy.Expr = sympy.Integer(1)
    for v in values:
        out = out * v
    return out
