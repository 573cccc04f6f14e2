"""Index expressions to text, one printer per backend.  Only these turn sympy into code."""

from __future__ import annotations

import sympy

from minicompile.sym import FloorDiv, ModularIndexing


class IndexPrinter:
    """Prints integer index arithmetic: sums, products, floor division and modulo.
    ``div``: the operator of floor division (sizes are positive); ``extreme``: the call
    of ``max`` / ``min`` of sizes (PyTorch writes strides as ``Max(1, size)``)."""

    def __init__(self, div: str, extreme: str) -> None:
        self.div, self.extreme_call = div, extreme

    def floordiv(self, a: str, b: str) -> str:
        return f"({a} {self.div} {b})"

    def extreme(self, fn: str, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"{self.extreme_call.format(fn)}({out}, {a})"
        return out

    def __call__(self, expr: sympy.Expr) -> str:
        return self.print(sympy.sympify(expr))

    def print(self, e: sympy.Expr) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return e.name
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=lambda t: (t.is_Number, sympy.default_sort_key(t)))
            text = self.print(terms[0])
            for t in terms[1:]:
                if t.could_extract_minus_sign():
                    text += f" - {self.atom(-t)}"
                else:
                    text += f" + {self.print(t)}"
            return text
        if isinstance(e, sympy.Mul):
            factors = sorted(e.args, key=lambda f: (not f.is_Number, sympy.default_sort_key(f)))
            if factors[0] == -1:
                return f"-{self.atom(sympy.Mul(*factors[1:]))}"
            return "*".join(self.atom(f) for f in factors)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "*".join([self.atom(e.base)] * int(e.exp))
        if isinstance(e, FloorDiv):
            return self.floordiv(self.atom(e.args[0]), self.operand(e.args[1]))
        if isinstance(e, ModularIndexing):
            base, div, mod = e.args
            inner = self.atom(base) if div == 1 else self.floordiv(self.atom(base), self.operand(div))
            return f"({inner} % {self.operand(mod)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            args = [self.print(a) for a in sorted(e.args, key=sympy.default_sort_key)]
            return self.extreme("max" if isinstance(e, sympy.Max) else "min", args)
        raise NotImplementedError(f"cannot print index expression {e} ({type(e).__name__})")

    def operand(self, e: sympy.Expr) -> str:
        """The right operand of ``//`` or ``%``: a product needs parentheses there too
        (``x // (32*s1)``, ``x // (s1*s1)``; a symbolic size makes such divisors)."""
        text = self.print(e)
        return f"({text})" if isinstance(e, (sympy.Add, sympy.Mul, sympy.Pow)) else text

    def atom(self, e: sympy.Expr) -> str:
        text = self.print(e)
        if isinstance(e, sympy.Add):
            return f"({text})"
        return text


triton_index = IndexPrinter("//", "tl.{}imum")
cpp_index = IndexPrinter("/", "std::{}<int64_t>")
