"""The loop IR: each buffer described by how one of its elements is computed.

Bodies are expression trees of frozen dataclasses (data, never closures): they print, hash
and compare.  Indices are sympy over one symbol per dimension (``i0``, ``i1``, ...).  Dtypes
are eager's; float16/bfloat16 are computed in float32 and rounded back after each op.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

import sympy
import torch

from minicompile.errors import SourceLine
from minicompile.graph import DTYPE_ABBR
from minicompile.sym import index_symbol, product

LOW_PRECISION = (torch.float16, torch.bfloat16)


@functools.cache
def dim_symbols(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(index_symbol(f"i{k}") for k in range(n))


@functools.cache
def reduction_symbols(n: int) -> tuple[sympy.Symbol, ...]:
    """Index symbols of the dimensions a reduction runs over (``r0``, ``r1``, ...)."""
    return tuple(index_symbol(f"r{k}") for k in range(n))


class Expr:
    """Base of the body expression nodes.  Subclasses are frozen dataclasses whose hash is
    computed once, so bodies shared as DAGs hash in linear time."""

    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return ()

    def __post_init__(self) -> None:
        fields = tuple(getattr(self, name) for name in type(self)._field_names)  # type: ignore[attr-defined]
        object.__setattr__(self, "_hash", hash((type(self).__name__,) + fields))

    def __hash__(self) -> int:  # noqa: D105
        return self._hash  # type: ignore[attr-defined]


def _expr(cls: type) -> type:
    cls = dataclasses.dataclass(frozen=True, eq=True)(cls)
    cls.__hash__ = Expr.__hash__  # type: ignore[assignment]
    cls._field_names = tuple(f.name for f in dataclasses.fields(cls))  # (read per node made)
    return cls


@_expr
class Load(Expr):
    buffer: str
    index: sympy.Expr
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"load({self.buffer}, {self.index})"

    def with_index(self, index: sympy.Expr) -> Load:
        return Load(self.buffer, index, self.dtype)


@_expr
class IndirectLoad(Load):
    """A load whose index reads data: ``index`` uses ``symbol``, which stands for the value
    of ``at`` (an integer expression, e.g. a load of an embedding's indices).  Values of
    ``at`` outside ``[0, size)`` are an error, reported by the kernel, never read."""

    at: Expr
    symbol: sympy.Symbol
    size: sympy.Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.at,)

    def with_index(self, index: sympy.Expr) -> Load:
        return IndirectLoad(self.buffer, index, self.dtype, self.at, self.symbol, self.size)

    def __str__(self) -> str:
        return f"load({self.buffer}, {self.index} where {self.symbol} = {self.at})"


@_expr
class IndexExpr(Expr):
    """The integer value of an index expression: element ``i`` of an ``iota`` along dim d
    is ``i_d`` (Inductor's ``ops.index_expr``), e.g. the position argmax compares.  Like a
    Load it has an ``index`` that views and fusion re-express, but it reads no buffer."""

    index: sympy.Expr
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"index({self.index})"

    def with_index(self, index: sympy.Expr) -> IndexExpr:
        return IndexExpr(index, self.dtype)


@_expr
class Constant(Expr):
    value: bool | int | float
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{self.value!r}:{DTYPE_ABBR.get(self.dtype, self.dtype)}"


@_expr
class Op(Expr):
    """A pointwise primitive (a key of the backends' op tables) applied to ``args``.  All
    arguments have one dtype (lowering inserts the casts), except ``where``'s condition."""

    op: str
    args: tuple[Expr, ...]
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __str__(self) -> str:
        return f"{self.op}({', '.join(str(a) for a in self.args)})"


@_expr
class Cast(Expr):
    x: Expr
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def __str__(self) -> str:
        return f"to({self.x}, {DTYPE_ABBR.get(self.dtype, self.dtype)})"


@_expr
class Reduce(Expr):
    """``op`` ("sum", "prod", "amax", "amin", "any", "all") of ``x`` over the reduction
    symbols r0, r1, ... of its buffer (``x`` may also use the buffer's own i-symbols)."""

    op: str
    x: Expr
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def __str__(self) -> str:
        return f"{self.op}_r({self.x})"


@_expr
class Cat(Expr):
    """The concatenation of ``pieces`` along the dimension whose position is ``index``:
    piece k holds positions ``[starts[k-1], starts[k])`` (its loads already shifted), and
    the backends mask its loads by that condition.  Build it with :func:`make_cat`."""

    index: sympy.Expr
    starts: tuple[sympy.Expr, ...]  # len(pieces) - 1 boundaries, increasing
    pieces: tuple[Expr, ...]
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.pieces

    def bounds(self, k: int) -> tuple[sympy.Expr | None, sympy.Expr | None]:
        """Piece ``k``'s positions as ``(lo, hi)``; None where that side needs no test."""
        lo = self.starts[k - 1] if k > 0 else None
        hi = self.starts[k] if k < len(self.starts) else None
        return lo, hi

    def span(self, k: int) -> str:
        """Piece ``k``'s positions as text: ``[3, 8)``, ``[8, end)``."""
        lo, hi = self.bounds(k)
        return f"[{lo if lo is not None else 0}, {hi if hi is not None else 'end'})"

    def __str__(self) -> str:
        parts = [f"{self.span(k)}: {piece}" for k, piece in enumerate(self.pieces)]
        return f"cat({self.index}; {', '.join(parts)})"


def make_cat(index: sympy.Expr, starts: tuple[sympy.Expr, ...], pieces: tuple[Expr, ...],
             dtype: torch.dtype) -> Expr:
    """A :class:`Cat`, or the one piece a constant ``index`` selects."""
    if len(pieces) == 1:
        return pieces[0]
    if index.is_Integer:
        k = sum(1 for s in starts if int(index) >= int(s))
        return pieces[k]
    return Cat(index, starts, pieces, dtype)


REDUCTION_IDENTITY: dict[str, object] = {
    "sum": 0, "prod": 1, "amax": float("-inf"), "amin": float("inf"), "any": False, "all": True,
}


def walk(expr: Expr) -> Iterator[Expr]:
    """Every distinct subexpression, children before parents."""
    seen: set[int] = set()
    order: list[Expr] = []

    def visit(e: Expr) -> None:
        if id(e) in seen:
            return
        seen.add(id(e))
        for c in e.children():
            visit(c)
        order.append(e)

    visit(expr)
    return iter(order)


INTEGER_DIVISIONS = frozenset({"floordiv", "remainder"})


def divides_by_values(e: Expr) -> bool:
    """Whether ``e`` is an integer floor division or remainder by a value the kernel reads
    (not a constant): eager raises for a zero divisor, a C++ one kills the process."""
    return (isinstance(e, Op) and e.op in INTEGER_DIVISIONS and not e.dtype.is_floating_point
            and e.dtype != torch.bool and not isinstance(e.args[1], Constant))


def raises_on_values(e: Expr) -> bool:
    """Whether ``e`` can fail on the values it reads (its kernel sets an error flag): an
    indirect load, an integer division (:func:`divides_by_values`)."""
    return isinstance(e, IndirectLoad) or divides_by_values(e)


def map_loads(
    expr: Expr,
    fn: Callable[[Load | IndexExpr], Expr],
    index: Callable[[sympy.Expr], sympy.Expr] | None = None,
    reductions: bool = True,
) -> Expr:
    """Rebuild ``expr`` with every Load and IndexExpr (the leaves that carry an index)
    replaced by ``fn(leaf)``, shared subtrees once; ``index`` re-expresses a Cat's position
    (a caller that moves the loads' indices must pass the same re-indexing).  Without
    ``reductions``, a Reduce is kept whole (it spans every position of its loops)."""
    memo: dict[int, Expr] = {}

    def visit(e: Expr) -> Expr:
        key = id(e)
        if key not in memo:
            if isinstance(e, IndirectLoad):
                moved = IndirectLoad(e.buffer, e.index, e.dtype, visit(e.at), e.symbol, e.size)
                memo[key] = fn(moved)
            elif isinstance(e, (Load, IndexExpr)):
                memo[key] = fn(e)
            elif isinstance(e, Op):
                memo[key] = Op(e.op, tuple(visit(a) for a in e.args), e.dtype)
            elif isinstance(e, Cast):
                memo[key] = Cast(visit(e.x), e.dtype)
            elif isinstance(e, Reduce):
                memo[key] = Reduce(e.op, visit(e.x), e.dtype) if reductions else e
            elif isinstance(e, Cat):
                where = index(e.index) if index is not None else e.index
                memo[key] = make_cat(where, e.starts, tuple(visit(p) for p in e.pieces), e.dtype)
            else:
                memo[key] = e
        return memo[key]

    return visit(expr)


def substitute_index(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Re-express ``expr`` over other index variables (broadcasting, views, inlining)."""
    if not mapping:
        return expr
    return reindex_expr(expr, lambda index: sympy.expand(index.xreplace(mapping)))


def reindex_expr(expr: Expr, fn: Callable[[sympy.Expr], sympy.Expr]) -> Expr:
    """``expr`` with every index (loads', and Cat positions) rewritten by ``fn``."""
    return map_loads(expr, lambda ld: ld.with_index(fn(ld.index)), index=fn)


# -- buffers ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    shape: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: torch.device
    offset: sympy.Expr = sympy.Integer(0)

    def numel(self) -> sympy.Expr:
        return product(self.shape)

    def concrete_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.shape)

    def concrete_stride(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.stride)

    def index(self, idx: tuple[sympy.Expr, ...]) -> sympy.Expr:
        """The flat storage offset of the element at ``idx``."""
        return _flat_index(self.offset, tuple(idx), self.stride)

    def __str__(self) -> str:
        shape = ", ".join(str(s) for s in self.shape)
        stride = ", ".join(str(s) for s in self.stride)
        return f"{DTYPE_ABBR.get(self.dtype, self.dtype)}[{shape}] stride ({stride})"


@functools.lru_cache(maxsize=4096)
def _flat_index(offset: sympy.Expr, idx: tuple, stride: tuple) -> sympy.Expr:
    # (A network reads the same few layouts again and again: expanded once each.)
    return sympy.expand(offset + sum(i * s for i, s in zip(idx, stride)))


@functools.lru_cache(maxsize=8192)
def _loaded_buffers(body: Expr) -> frozenset[str]:
    return frozenset(e.buffer for e in walk(body) if isinstance(e, Load))


@dataclasses.dataclass(frozen=True)
class InputBuffer:
    name: str  # "arg0" ...: the graph input it holds
    layout: Layout


@dataclasses.dataclass(frozen=True)
class ComputedBuffer:
    """A buffer written by a kernel: element ``i`` (one symbol per dim of ``layout.shape``,
    see :func:`dim_symbols`) is ``body``, stored at ``layout.index(i)``."""

    name: str  # "buf0" ...
    layout: Layout
    body: Expr
    origins: tuple[str, ...] = ()  # graph nodes it came from, e.g. "%3 add"
    sources: tuple[SourceLine, ...] = ()  # the user's source lines of those nodes
    # For a reduction (body is a Reduce): the sizes of the reduced dims, indexed in the
    # body by reduction_symbols().
    reduction_ranges: tuple[sympy.Expr, ...] = ()

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduction_ranges)

    def reads(self) -> set[str]:
        return set(_loaded_buffers(self.body))

    def __str__(self) -> str:
        over = f" over r{list(self.reduction_ranges)}" if self.reduction_ranges else ""
        return f"{self.name}: {self.layout} = {self.body}{over}"


@dataclasses.dataclass(frozen=True)
class AliasOutput:
    """A graph output that is an input, or a view of one: returned without a copy, as eager
    returns it (``as_strided`` over the input's storage)."""

    input: str
    layout: Layout | None  # None: the input itself


@dataclasses.dataclass(frozen=True)
class BufferRef:
    """An extern kernel's tensor argument: a buffer (input, computed or extern) as it is."""

    name: str


@dataclasses.dataclass(frozen=True)
class ExternKernel:
    """A buffer computed by a library call (``op``: a dotted path), tensor arguments as
    BufferRefs or AliasOutputs.  ``layout``: eager's, or a tuple of them for a tuple result
    (picked by ``operator.getitem`` externs)."""

    name: str
    op: str
    args: tuple
    kwargs: dict
    layout: Layout | tuple[Layout, ...]
    origins: tuple[str, ...] = ()
    sources: tuple[SourceLine, ...] = ()

    def reads(self) -> set[str]:
        return set(_reads((self.args, self.kwargs)))

    def __str__(self) -> str:
        args = ", ".join(
            [_arg_text(a) for a in self.args] + [f"{k}={_arg_text(v)}" for k, v in self.kwargs.items()]
        )
        layout = self.layout if isinstance(self.layout, Layout) else "tuple"
        return f"{self.name}: {layout} = extern {self.op}({args})"


def _reads(v: object) -> Iterator[str]:
    if isinstance(v, (BufferRef, AliasOutput)):
        yield v.name if isinstance(v, BufferRef) else v.input
    elif isinstance(v, (tuple, list, dict)):
        for item in v.values() if isinstance(v, dict) else v:
            yield from _reads(item)


def _arg_text(v: object) -> str:
    if isinstance(v, BufferRef):
        return v.name
    if isinstance(v, AliasOutput):
        return f"view({v.input})" if v.layout is not None else v.input
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_arg_text(x) for x in v) + ")"
    return repr(v)


Buffer = ComputedBuffer | ExternKernel


@dataclasses.dataclass
class LoopProgram:
    """A lowered graph: inputs, the buffers computed (in a valid order), and the outputs
    (buffer names, or AliasOutputs)."""

    inputs: list[InputBuffer]
    buffers: list[Buffer]
    outputs: list[str | AliasOutput]
    # Size symbols that are Python ints of the frame, not sizes of an input tensor: the
    # wrapper receives them after the tensors (dynamic shapes).
    scalar_sizes: tuple[sympy.Symbol, ...] = ()
    # The traced value of each size symbol: block sizes are chosen for it (never the code's
    # correctness, which holds for every value).
    hints: dict = dataclasses.field(default_factory=dict)

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def __str__(self) -> str:
        lines = [f"input {b.name}: {b.layout}" for b in self.inputs]
        lines += [str(b) for b in self.buffers]
        outs = [o if isinstance(o, str) else _arg_text(o) for o in self.outputs]
        lines.append(f"return {', '.join(outs)}")
        return "\n".join(lines)
