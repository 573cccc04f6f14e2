"""Kernel groups and their iteration spaces: what the fusion pass builds and codegen reads.

A :class:`FusedGroup` is one kernel (or library call).  A group with reductions iterates
over a *canonical space*: kept dims ``p0, p1, ...`` (the reduction's output dims, size-1
dims dropped) and reduced dims ``q0, q1, ...``; each member is *placed* in it
(:class:`Placement`, :func:`place`): a reduction; "x" (pointwise over the kept dims: a
``mean``); "xr" (over kept and reduced dims: softmax's output; a batch norm's, its dims
interleaved); "column" (a sum over the kept dims, passes/mix_order.py: its output dims on
the q's).  Loads between members must read what the writer makes at the same point of the
space (:func:`aligned`).
"""

from __future__ import annotations

import dataclasses

import sympy

from minicompile.ir import (Buffer, ComputedBuffer, ExternKernel, Load, dim_symbols,
                            reduction_symbols, walk)
from minicompile.sym import index_symbol, simplify_bounded

ZERO = sympy.Integer(0)


def kept_symbols(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(index_symbol(f"p{k}") for k in range(n))


def reduced_symbols(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(index_symbol(f"q{k}") for k in range(n))


@dataclasses.dataclass(frozen=True)
class Space:
    """A reduction group's canonical iteration space (sizes of the p's and the q's)."""

    kept: tuple[sympy.Expr, ...]
    reduced: tuple[sympy.Expr, ...]


@dataclasses.dataclass(frozen=True)
class Placement:
    kind: str  # "reduction" | "x" | "xr" | "column"
    mapping: dict  # own symbol -> canonical expression (p's, q's or 0)
    # Where a dim covers several of the space's (_merged): each canonical symbol's size, to
    # work out the floor divisions and moduli of the indices mapped.
    bounds: dict = dataclasses.field(default_factory=dict)

    def apply(self, index: sympy.Expr) -> sympy.Expr:
        """``index`` (over the member's own symbols) over the canonical symbols."""
        out = sympy.expand(index.xreplace(self.mapping))
        return simplify_bounded(out, self.bounds) if self.bounds else out


def space_of(buf: ComputedBuffer) -> Space:
    assert buf.is_reduction
    return Space(tuple(s for s in buf.layout.shape if s != 1),
                 tuple(s for s in buf.reduction_ranges if s != 1))


def _onto(sizes: tuple, symbols: tuple, targets: tuple) -> dict | None:
    """Map the non-1 ``sizes`` (with ``symbols``) onto ``targets`` in order; 1s map to 0."""
    rest = iter(targets)
    mapping = {sym: ZERO if size == 1 else next(rest, None) for size, sym in zip(sizes, symbols)}
    return None if next(rest, None) is not None or None in mapping.values() else mapping


def _merged(sizes: tuple, symbols: tuple, targets: tuple, target_sizes: tuple) -> dict | None:
    """As :func:`_onto`, where a size may also cover a run of consecutive targets whose
    static sizes multiply to it: a reshape that merged dims (GPT-2's ``x.view(-1, C)`` of a
    [2, 32, 64] value reads it as [64, 64]: its row index is ``32 * p0 + p1``)."""
    mapping: dict = {}
    k = 0
    for size, sym in zip(sizes, symbols):
        if size == 1:
            mapping[sym] = ZERO
            continue
        if k < len(targets) and size == target_sizes[k]:
            mapping[sym], k = targets[k], k + 1
            continue
        if not getattr(size, "is_Integer", False):
            return None
        expr, covered = ZERO, 1
        while k < len(targets) and covered < int(size):
            if not target_sizes[k].is_Integer:
                return None
            expr, covered, k = expr * target_sizes[k] + targets[k], covered * target_sizes[k], k + 1
        if covered != size:
            return None
        mapping[sym] = expr
    return mapping if k == len(targets) else None


def place(buf: ComputedBuffer, space: Space) -> Placement | None:
    """Where ``buf`` sits in ``space``, or None when it does not fit."""
    p = kept_symbols(len(space.kept))
    q = reduced_symbols(len(space.reduced))
    shape = buf.layout.shape
    own = dim_symbols(len(shape))
    if buf.is_reduction:
        rsyms = reduction_symbols(len(buf.reduction_ranges))
        if space_of(buf) != space:  # a column sum (dims merged as reshapes do), or no fit
            kept = _merged(shape, own, q, space.reduced)
            reduced = _merged(buf.reduction_ranges, rsyms, p, space.kept)
            return (Placement("column", {**kept, **reduced}, _bounds(space, p, q))
                    if kept is not None and reduced is not None and space.reduced else None)
        kept = _onto(shape, own, p)
        reduced = _onto(buf.reduction_ranges, rsyms, q)
        return Placement("reduction", {**kept, **reduced}) if kept is not None else None
    non_one = tuple(s for s in shape if s != 1)
    if non_one == space.kept + space.reduced and space.reduced:
        mapping = _onto(shape, own, p + q)
        return Placement("xr", mapping) if mapping is not None else None
    if space.reduced and len(non_one) == len(space.kept) + len(space.reduced):
        order = _interleaving(non_one, space, p, q)
        mapping = _onto(shape, own, order) if order is not None else None
        return Placement("xr", mapping) if mapping is not None else None
    if non_one == space.kept:
        mapping = _onto(shape, own, p)
        return Placement("x", mapping) if mapping is not None else None
    mapping = _merged(shape, own, p + q, space.kept + space.reduced) if space.reduced else None
    if mapping is not None:
        return Placement("xr", mapping, _bounds(space, p, q))
    mapping = _merged(shape, own, p, space.kept)
    return Placement("x", mapping, _bounds(space, p, q)) if mapping is not None else None


def _bounds(space: Space, p: tuple, q: tuple) -> dict:
    """The static sizes of the canonical symbols (for Placement.bounds)."""
    return {s: n for s, n in zip(p + q, space.kept + space.reduced) if n.is_Integer}


def _interleaving(sizes: tuple, space: Space, p: tuple, q: tuple) -> tuple | None:
    """The order of ``p`` and ``q`` symbols that a pointwise member's dims (``sizes``) take,
    each list kept in its order: a batch norm's output ``(N, C, H, W)`` over its channel
    statistics is ``(q0, p0, q1, q2)``.  None unless exactly one order fits the sizes."""
    found: list[tuple] = []

    def extend(i: int, j: int, order: tuple) -> None:
        if len(found) > 1:
            return
        if i == len(p) and j == len(q):
            found.append(order)
            return
        k = i + j
        if i < len(p) and sizes[k] == space.kept[i]:
            extend(i + 1, j, order + (p[i],))
        if j < len(q) and sizes[k] == space.reduced[j]:
            extend(i, j + 1, order + (q[j],))

    extend(0, 0, ())
    if len(found) != 1 or found[0] == q + p:
        return None  # ambiguous; or the reduced dims first: a column sum (passes/mix_order.py)
    return found[0]


def store_index(buf: ComputedBuffer, placement: Placement) -> sympy.Expr:
    """Where ``buf``'s element at a point of the space is stored, in canonical symbols."""
    return placement.apply(buf.layout.index(dim_symbols(len(buf.layout.shape))))


@dataclasses.dataclass
class FusedGroup:
    key: int  # its vertex in the dependency DAG
    buffers: list[Buffer]  # ComputedBuffers, or one ExternKernel
    # A pointwise group that took column sums (passes/mix_order.py): the rows and the
    # columns it walks, as a row reduction's space (its members placed "xr").
    rows: Space | None = None

    @property
    def extern(self) -> ExternKernel | None:
        first = self.buffers[0]
        return first if isinstance(first, ExternKernel) else None

    @property
    def name(self) -> str:
        return "+".join(b.name for b in self.buffers)

    @property
    def shape(self) -> tuple:
        return self.buffers[0].layout.shape  # type: ignore[union-attr]

    @property
    def device(self):
        layout = self.buffers[0].layout  # a library call of several results: the first's
        return (layout[0] if isinstance(layout, tuple) else layout).device  # type: ignore

    @property
    def has_reduction(self) -> bool:
        return any(isinstance(b, ComputedBuffer) and b.is_reduction for b in self.buffers)

    @property
    def space(self) -> Space:
        """The canonical space: a reduction's, or for pointwise groups the (non-1) dims of
        the shape, all kept; or the row space a pointwise group was given (``rows``)."""
        if self.rows is not None:
            return self.rows
        for b in self.buffers:
            if isinstance(b, ComputedBuffer) and b.is_reduction:
                return space_of(b)
        return Space(tuple(s for s in self.shape if s != 1), ())

    def placements(self, space: Space | None = None) -> dict[str, Placement] | None:
        """Each member's placement in ``space`` (default: the group's), or None."""
        space = space or self.space
        out = {b.name: place(b, space) for b in self.buffers}  # type: ignore[arg-type]
        return None if None in out.values() else out


def aligned(reader: ComputedBuffer, reader_place: Placement,
            writer: ComputedBuffer, writer_place: Placement) -> bool:
    """Whether every load of ``writer`` in ``reader`` reads the element the writer makes at
    the same point of the space (so the value can stay in registers)."""
    want = store_index(writer, writer_place)
    for e in walk(reader.body):
        if isinstance(e, Load) and e.buffer == writer.name:
            got = reader_place.apply(e.index)
            if got.free_symbols - want.free_symbols:
                return False  # reads across the reduced dims of a row-level value
            if sympy.expand(got - want) != 0:
                return False
    return True


@dataclasses.dataclass
class ComboGroup:
    """Independent pointwise groups run as one kernel, one launch (Inductor's combo
    kernels): each part keeps its own iteration space; the kernel runs them in turn (C++)
    or splits its programs among them (Triton).  Made by passes/horizontal.py."""

    key: int  # its vertex in the dependency DAG
    parts: list[FusedGroup]

    extern = None  # never a library call

    @property
    def buffers(self) -> list[Buffer]:
        return [b for part in self.parts for b in part.buffers]

    @property
    def name(self) -> str:
        return " | ".join(part.name for part in self.parts)

    @property
    def device(self):
        return self.parts[0].device

    @property
    def has_reduction(self) -> bool:
        return False
