"""Mix-order reductions: sums over a group's rows join the kernel that walks those rows.

A layer norm's backward reduces each row and, over the same values, each column (the
weight and bias gradients).  Vertical fusion keeps them apart (their iteration spaces are
each other's transpose); here a column-sum group joins the row group it reads alongside
(Inductor's mix-order reductions): the row kernel adds each chunk of rows into column
partial sums, summed at the end (codegen/triton_reduction.py, codegen/cpp_reduction.py).
A pointwise group over [rows, columns] is a row group too (a GELU's backward, whose
columns sum to a linear's bias gradient): it takes the column sum's rows and columns as
its space (``FusedGroup.rows``), its members placed "xr", so one kernel writes the values
and sums them.  The column members are placed "column" in the row group's space
(minicompile/spaces.py).
Legality (:func:`can_mix`) and profitability (:func:`worth_mixing`) are separate; the groups
come back in dependency order.
"""

from __future__ import annotations

import math

import sympy
import torch

from minicompile.ir import ComputedBuffer, Load, Reduce, walk
from minicompile.spaces import FusedGroup, Space, place, reduced_symbols, space_of, store_index

from minicompile.passes.fusion import Memo, dependency_graph

MAX_COLUMNS = 4096  # the row kernel keeps a whole row in registers (a persistent kernel)
MAX_PARTS = 8  # column sums one row kernel accumulates
MIN_ROWS = 16  # fewer rows: the column sums keep their own kernel (nothing to split)


def _static(sizes: tuple) -> bool:
    return all(getattr(s, "is_Integer", False) for s in sizes)


def _dense(buf: ComputedBuffer) -> bool:
    """Row-major without gaps (size-1 dims aside): its columns are its elements in order."""
    expected = 1
    for size, stride in reversed(list(zip(buf.layout.shape, buf.layout.stride))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return buf.layout.offset == 0


def reads_along_rows(row: FusedGroup) -> bool:
    """Whether some reduction of the group reads its rows' elements side by side (unit
    stride along the reduced dim), or some output of a pointwise row group is written so:
    a row kernel, not a sum over columns."""
    q = reduced_symbols(1)[0]
    for b in row.buffers:
        placed = place(b, row.space)  # type: ignore[arg-type]
        if placed is not None and placed.kind == "reduction":
            indices = [placed.apply(e.index) for e in walk(b.body)  # type: ignore[union-attr]
                       if isinstance(e, Load)]
        elif placed is not None and placed.kind == "xr" and row.rows is not None:
            indices = [store_index(b, placed)]  # type: ignore[arg-type]
        else:
            continue
        if any(sympy.expand(index).coeff(q) == 1 for index in indices):
            return True
    return False


def as_rows(group: FusedGroup, col: ComputedBuffer) -> FusedGroup | None:
    """``group`` as a row group whose columns ``col`` sums, or None: a group with
    reductions as it is; a pointwise group over [rows, columns] given them as its space
    (sharing its member list)."""
    if not group.buffers or group.extern is not None or not col.is_reduction:
        return None
    if group.has_reduction:
        placed = place(col, group.space)  # type: ignore[arg-type]
        return group if placed is not None and placed.kind == "column" else None
    columns = space_of(col)
    if group.space.kept != columns.reduced + columns.kept:
        return None
    return FusedGroup(group.key, group.buffers, rows=Space(columns.reduced, columns.kept))


def can_mix(row: FusedGroup, col: FusedGroup, dag, memo: Memo) -> tuple[bool, str]:
    """Whether the column sums of ``col`` may run inside ``row``'s kernel; why not."""
    if row.extern is not None or col.extern is not None:
        return False, "a library call runs on its own"
    if row.device != col.device or not (row.has_reduction or row.rows is not None):
        return False, "not a row group of the same device"
    space = row.space
    if not (_static(space.kept + space.reduced) and space.kept and space.reduced):
        return False, "symbolic sizes"
    if len(space.reduced) != 1 or int(space.reduced[0]) > MAX_COLUMNS:
        return False, "rows too long to keep in registers"
    if any(memo.is_empty(b) for b in row.buffers + col.buffers):
        return False, "an empty buffer"
    if not reads_along_rows(row):
        return False, "the group does not read along its rows"
    for b in col.buffers:
        problem = _column_problem(b, space)  # type: ignore[arg-type]
        if problem is not None:
            return False, problem
    names = {b.name for b in col.buffers}
    sums = {b.name for b in col.buffers if b.is_reduction}  # type: ignore[union-attr]
    if any(memo.reads_of(b) & names for b in row.buffers) or any(
            memo.reads_of(b) & sums for b in col.buffers):
        return False, "a member reads a column sum (known only at the end)"
    places = memo.placements(row.buffers + col.buffers, space)
    if places is None:
        return False, "a buffer does not fit the iteration space"
    members = {b.name: b for b in row.buffers + col.buffers}
    for reader in col.buffers:
        for name in memo.reads_of(reader) & members.keys():
            if not memo.is_aligned(reader, members[name], space, places):
                return False, f"{reader.name} reads {name} at other points of the space"
    if dag.contraction_makes_cycle(row.key, col.key):
        return False, "mixing would create a cycle"
    return True, "column sums of the group's rows"


def _column_problem(b: ComputedBuffer, space: Space) -> str | None:
    """Why ``b`` may not join a row kernel of ``space`` with a column sum (None: it may):
    a column sum must be a contiguous float32 sum over the rows, and a member it reads
    (its group's pointwise work) pointwise over the rows and columns."""
    placed = place(b, space)
    if not b.is_reduction:
        return None if placed is not None and placed.kind == "xr" else (
            f"{b.name} is not pointwise over the group's rows and columns")
    if not (isinstance(b.body, Reduce) and b.body.op == "sum" and b.body.dtype == torch.float32
            and not any(isinstance(e, Reduce) for e in walk(b.body.x))):
        return f"{b.name} is not a float32 sum"
    if placed is None or placed.kind != "column":
        return f"{b.name} does not reduce the group's rows"
    return None if _dense(b) else f"{b.name} is not contiguous"


def worth_mixing(row: FusedGroup, col: FusedGroup) -> int:
    """What mixing saves: the buffers ``col`` reads that ``row`` reads or makes (read
    once, or kept in registers), or 0 (do not mix) when the rows are fewer than
    MIN_ROWS or the row kernel would accumulate more than MAX_PARTS sums."""
    space = row.space
    if len(space.reduced) != 1 or not _static(space.kept + space.reduced):
        return 0
    rows = math.prod(int(s) for s in space.kept)
    columns = [b for b in row.buffers + col.buffers
               if getattr(place(b, space), "kind", None) == "column"]  # type: ignore[arg-type]
    if rows < MIN_ROWS or len(columns) > MAX_PARTS:
        return 0
    reads = {name for b in row.buffers for name in b.reads()} | {b.name for b in row.buffers}
    return sum(len(b.reads() & reads) for b in col.buffers)


def _with_prologue(buf: ComputedBuffer, members: list[ComputedBuffer]) -> list[ComputedBuffer]:
    """``buf`` and the pointwise members of its group it reads, directly or not (the end
    of a layer norm's input gradient that fusion put beside the bias gradient summing
    it), in the group's order (dependency order)."""
    by_name = {b.name: b for b in members}
    unit, todo = {buf.name}, [buf]
    while todo:
        for name in todo.pop().reads():
            m = by_name.get(name)
            if m is not None and name not in unit and not m.is_reduction:
                unit.add(name)
                todo.append(m)
    return [b for b in members if b.name in unit]


def mix(groups: list[FusedGroup], log: list[str] | None = None) -> list[FusedGroup]:
    """Move each column sum (with the pointwise members of its group it reads) into the
    row group it saves most with, if any may take it (groups in dependency order in, and
    out).  Column sums come one at a time: fusion
    may have put the sums of several layers into one group (one iteration space), and
    each belongs with its own layer's row kernel.  Taking a member out of a group makes
    no cycle when it neither reads nor feeds another member: a cycle through outside
    groups would have been one through the whole group."""
    memo = Memo()
    next_key = max((g.key for g in groups), default=-1) + 1
    for col in [g for g in groups if g.extern is None and g.has_reduction]:
        for buf in [b for b in col.buffers if b.is_reduction]:  # type: ignore[union-attr]
            unit = _with_prologue(buf, col.buffers)  # type: ignore[arg-type]
            single = FusedGroup(next_key, unit)
            rows = [r for g in groups if g is not col
                    for r in [as_rows(g, buf)] if r is not None]  # type: ignore[arg-type]
            scored = sorted(((worth_mixing(r, single), -k, r) for k, r in enumerate(rows)),
                            key=lambda t: t[:2], reverse=True)
            scored = [(score, r) for score, _, r in scored if score > 0]
            if not scored:
                continue
            rest = [b for b in col.buffers if b not in unit]
            names, taken = {b.name for b in rest}, {b.name for b in unit}
            if any(memo.reads_of(b) & names for b in unit) or any(
                    memo.reads_of(b) & taken for b in rest):
                continue  # (taken out, it would read or feed its group: a cycle, maybe)
            split = [g if g is not col else FusedGroup(col.key, rest) for g in groups]
            dag = dependency_graph([g for g in split if g.buffers] + [single])
            for _, row in scored:
                ok, reason = can_mix(row, single, dag, memo)
                if log is not None:
                    log.append(f"{'mix' if ok else 'keep apart'} {row.name} {buf.name}: {reason}")
                if ok:
                    owner = next(g for g in groups if g.key == row.key)
                    owner.rows = row.rows  # (a pointwise group's new space; else None)
                    row.buffers.extend(unit)  # (the owner's list)
                    col.buffers[:] = rest
                    break
    groups = [g for g in groups if g.buffers]
    dag = dependency_graph(groups)
    by_key = {g.key: g for g in groups}
    return [by_key[k] for k in dag.topological_order()]
