"""C++ kernels for fused pointwise groups: OpenMP over the outer loop, a plain inner loop
the compiler vectorises.

Each kernel is an ``extern "C"`` function over raw pointers.  float16 and bfloat16 are
stored as ``uint16_t``, converted to float on load, rounded back after each op (as eager
does) and converted on store.  Emitters only return text: the runtime builds and loads.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import pairwise

import sympy
import torch

from minicompile.ir import (LOW_PRECISION, Cat, Expr, IndexExpr, IndirectLoad, Load, Op,
                            divides_by_values, map_loads, walk)
from minicompile.op_table import ROWS
from minicompile.sym import FloorDiv, ModularIndexing, simplify_bounded

from minicompile.codegen.common import CodeWriter, KernelPlan, Store, checks_values, text_sections
from minicompile.codegen.cpp_threads import Parallel, plan_parallel
from minicompile.codegen.emitter import DTYPES, Dialect, ExprEmitter
from minicompile.codegen.printers import cpp_index

# float16 and bfloat16 are stored as their bits; integers as <cstdint>'s types.
CPP_DTYPES: dict[torch.dtype, str] = {
    d: f"{str(d).removeprefix('torch.')}_t" for d in DTYPES if not d.is_floating_point
} | {torch.float64: "double", torch.float32: "float", torch.float16: "uint16_t",
     torch.bfloat16: "uint16_t", torch.bool: "bool"}

CPP_OPS: dict[str, str] = {row.name: row.cpp for row in ROWS}


# The names of float16's and bfloat16's helpers (mc_half_to_float, mc_round_bf16, ...).
_LOW = {torch.float16: "half", torch.bfloat16: "bf16"}


class CppDialect(Dialect):
    """C++'s spelling: every literal cast to its type; float16/bfloat16 rounded after each
    op, as eager rounds."""

    dtypes = CPP_DTYPES
    ops = CPP_OPS  # "{t}": the C type the op computes in; the mc_* helpers are in HELPERS
    rounds_each_op = True

    def special(self, value: float) -> str:
        if math.isnan(value):
            return "std::numeric_limits<double>::quiet_NaN()"
        return ("-" if value < 0 else "") + "std::numeric_limits<double>::infinity()"

    def float_literal(self, text: str, dtype: torch.dtype) -> str:
        return f"static_cast<{self.compute(dtype)}>({text})"

    def int_literal(self, value: int, dtype: torch.dtype) -> str:
        return f"static_cast<{CPP_DTYPES[dtype]}>({value}LL)"

    def cast(self, x: str, dtype: torch.dtype) -> str:
        text = f"static_cast<{self.compute(dtype)}>({x})"
        return self.round(text, dtype) if dtype in LOW_PRECISION else text

    def round(self, x: str, dtype: torch.dtype) -> str:
        return f"mc_round_{_LOW[dtype]}({x})"


CPP = CppDialect()


# More pieces than this (a cat of many thin slices) keep the branch: one loop per piece
# would grow the kernel's text and its build time for little.
MAX_SPANS = 8


def cat_spans(plan: KernelPlan, x: sympy.Symbol, size: sympy.Expr) -> list | None:
    """The innermost loop ``x`` (of ``size``) cut where the concatenations along it change
    pieces, as ``(lo, hi)`` spans; None where there are none, or a boundary is symbolic.
    Each span's loop then computes its pieces without the per-element branch, which keeps
    the compiler from vectorising (a chunk's gradient: the pieces' values added)."""
    cats = [(e, step) for st in plan.stores for e in walk(st.value)
            if isinstance(e, Cat) and (step := _cat_step(e.index, x))]
    if not cats or not size.is_Integer or any(not s.is_Integer for c, _ in cats for s in c.starts):
        return None
    cuts = sorted({int(s) * step for c, step in cats for s in c.starts
                   if 0 < int(s) * step < int(size)})
    edges = [0, *cuts, int(size)]
    return list(pairwise(edges)) if 0 < len(cuts) < MAX_SPANS else None


def _cat_step(index: sympy.Expr, x: sympy.Symbol) -> int | None:
    """How many steps of loop ``x`` one step of a cat's ``index`` is: 1 for ``x`` itself,
    ``k`` for ``x // k`` (a cat along a dim that a reshape merged into the loop's, as the
    stacked q, k and v gradients of a fused projection); None for any other index."""
    if index == x:
        return 1
    if isinstance(index, FloorDiv) and index.args[0] == x and index.args[1].is_Integer:
        return int(index.args[1])
    return None


def pieces_at(plan: KernelPlan, x: sympy.Symbol, span: tuple[int, int]) -> KernelPlan:
    """``plan`` with each cat along ``x`` replaced by its piece in ``span`` (ir.make_cat
    picks it for a constant position): the body of a :func:`cat_spans` span's loop.  The
    indices are worked out for ``x`` in the span: a q/k/v piece's ``(r0 % 64) + 64*((r0 //
    64) % 3)`` over [192, 384) is ``r0 - 192``, a contiguous load the compiler vectorises."""
    lo, hi = span

    def at(index: sympy.Expr) -> sympy.Expr:
        step = _cat_step(index, x)
        return sympy.Integer(lo // step) if step else index

    def within(e: Expr) -> Expr:
        if isinstance(e, IndirectLoad) or not e.index.has(FloorDiv, ModularIndexing):
            return e
        index = simplify_bounded(e.index.xreplace({x: x + lo}), {x: hi - lo})
        return e.with_index(sympy.expand(index.xreplace({x: x - lo})))

    return dataclasses.replace(plan, stores=tuple(  # (a reduction spans every piece)
        dataclasses.replace(st, value=map_loads(st.value, within, at, reductions=False))
        for st in plan.stores))


def signature(name: str, inputs: tuple, out_dtypes: list, rest: tuple | list = ()) -> str:
    """``extern "C" void name(...)``: the inputs' pointers, the outputs', then ``rest``."""
    params = [f"const {CPP_DTYPES[d]}* __restrict__ in_ptr{k}" for k, (_, d) in enumerate(inputs)]
    params += [f"{CPP_DTYPES[d]}* __restrict__ out_ptr{k}" for k, d in enumerate(out_dtypes)]
    return f'extern "C" void {name}({", ".join(params + list(rest))})'


class CppKernel(ExprEmitter):
    dialect = CPP

    def __init__(self, plan: KernelPlan) -> None:
        self.plan = plan
        self.w = CodeWriter()
        self.names: dict[Expr, str] = {}
        self.count = 0
        self.parallel = Parallel()  # which outer loops run on several threads

    def signature(self) -> str:
        p = self.plan
        rest = ["int32_t* __restrict__ err_ptr"] if checks_values(p) else []
        rest += [f"int64_t {s}" for s in p.size_args]
        return signature(p.name, p.inputs, [st.dtype for st in p.stores], rest)

    def emit(self) -> str:
        p, w = self.plan, self.w
        for row in p.header_comment():
            w.line(f"// {row}")
        with w.block(self.signature()):
            self.emit_loops()
        return w.text()

    def emit_loops(self) -> None:
        """The kernel's body: its loop nest (or one element, for a 0-dim result)."""
        p = self.plan
        ranges = [cpp_index(r) for r in p.ranges]
        if not ranges:  # a 0-dim result: one element
            self.emit_body()
        else:
            # the innermost loop is the simd loop: shared only when it is the only one
            self.parallel = plan_parallel(p, p.ranges[:-1] or p.ranges, p.loop_vars)
            self._loops(0, ranges)

    def _loops(self, depth: int, ranges: list[str]) -> None:
        x = self.plan.loop_vars[depth]
        innermost = depth == len(ranges) - 1
        spans = cat_spans(self.plan, x, self.plan.ranges[depth]) if innermost else None
        for lo, hi in spans or [(0, ranges[depth])]:
            if depth == 0 and self.parallel.depth:
                self.w.line(f"#pragma omp {self.parallel.pragma(simd=innermost)}")
            elif innermost:
                self.w.line("#pragma omp simd")
            with self.w.block(f"for (int64_t {x} = {lo}; {x} < {hi}; ++{x})"):
                if depth + 1 < len(ranges):
                    self._loops(depth + 1, ranges)
                    continue
                self.names.clear()  # values are per element: define them inside the loop
                self.count = 0
                whole = self.plan
                if spans:  # this span's piece of each cat along x, without a branch
                    self.plan = pieces_at(whole, x, (lo, hi))
                self.emit_body()
                self.plan = whole

    def emit_body(self) -> None:
        self.emit_stores(self.emit_body_store)

    def emit_body_store(self, store: Store) -> None:
        value = self.value(store.value)
        if store.dtype in LOW_PRECISION:
            value = f"mc_float_to_{_LOW[store.dtype]}({value})"
        elif store.value.dtype != store.dtype:
            value = f"static_cast<{CPP_DTYPES[store.dtype]}>({value})"
        index = cpp_index(store.index)
        self.w.line(f"{self.pointer(store.buffer)}[{index}] = {value};")

    def fresh(self, text: str, ctype: str) -> str:
        name = f"tmp{self.count}"
        self.count += 1
        self.w.line(f"{ctype} {name} = {text};")
        return name

    def define(self, text: str, dtype: torch.dtype, operands: list[str]) -> str:
        return self.fresh(text, CPP.compute(dtype))

    def emit_load(self, e: Load) -> str:
        index = e.index
        if isinstance(e, IndirectLoad):
            # Never read out of range: an index outside [0, size) sets the error flag
            # the wrapper raises on, and reads element 0 instead.
            at = self.names[e.at]
            safe = self.fresh(
                f"({at} >= 0 && {at} < {cpp_index(e.size)}) ? {at} : (*err_ptr = 1, 0)",
                "int64_t",
            )
            index = index.xreplace({e.symbol: sympy.Symbol(safe, integer=True)})
        text = f"{self.pointer(e.buffer)}[{cpp_index(index)}]"
        if e.dtype in LOW_PRECISION:
            text = f"mc_{_LOW[e.dtype]}_to_float({text})"
        return self.fresh(text, CPP.compute(e.dtype))

    def emit_index(self, e: IndexExpr) -> str:  # (loop variables are int64_t)
        return self.fresh(cpp_index(e.index), "int64_t")

    def operands(self, e: Op) -> list[str]:
        args = [self.names[a] for a in e.args]
        if divides_by_values(e):
            # Never divide by zero (the process would die of SIGFPE): a zero divisor sets
            # the error flag the wrapper raises on (eager raises), and divides by 1.
            args[1] = self.fresh(f"{args[1]} != 0 ? {args[1]} : (*err_ptr = 1, 1)",
                                 CPP.compute(e.dtype))
        return args

    def emit_cat(self, e: Cat) -> str:
        """An if / else-if chain on the position: only the taken piece is evaluated, so no
        piece reads outside its input."""
        position = cpp_index(e.index)
        out = f"tmp{self.count}"
        self.count += 1
        self.w.line(f"{CPP.compute(e.dtype)} {out};")
        for k, piece in enumerate(e.pieces):
            hi = e.bounds(k)[1]
            if hi is None:
                header = "else"
            else:
                header = f"{'else ' if k else ''}if ({position} < {cpp_index(hi)})"
            with self.w.block(header):
                self.w.line(f"// cat piece {k}: {position} in {e.span(k)}")
                saved = dict(self.names)  # values of the branch end with it
                self.w.line(f"{out} = {self.value(piece)};")
                self.names = saved
        return out


# Not pow: GCC 12 crashes (internal compiler error) vectorising powf with a constant
# exponent.
_VECTOR_MATH = [row.name for row in ROWS if row.simd]
_SIMD_DECLS = "\n".join(
    f"MC_SIMD float {f}f(float); MC_SIMD double {f}(double);" for f in _VECTOR_MATH
)

# The translation unit's preamble, with the vector math declared, and the helpers; a unit
# gets the helpers its kernels call (by name).
HELPERS: dict[str, str] = text_sections("cpp_helpers.h")
PREAMBLE = HELPERS.pop("preamble").replace("MC_SIMD_DECLARATIONS", _SIMD_DECLS)


def helpers_for(kernels: list[str]) -> list[str]:
    """The helper definitions the kernel texts call."""
    text = "\n".join(kernels)
    wanted = []
    if any(f"mc_{kind}" in text for kind in ("half", "bf16", "round", "float_to")):
        wanted.append(HELPERS["low_precision"])
    wanted += [src for name, src in HELPERS.items() if name != "low_precision" and f"{name}(" in text]
    return wanted
