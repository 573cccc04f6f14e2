"""Mix-order reductions: sums over a group's rows join the kernel that walks those rows.

A layer norm's backward reduces each row (its input gradient) and, over the same
[rows, columns] values, each column: the weight and bias gradients, and a linear layer's
bias gradient (the sum over rows of the input gradient the row kernel has just made).
Vertical fusion (passes/fusion.py) keeps them apart, their iteration spaces being each
other's transpose, so the column sums run as a kernel of their own that reads the rows
again, or a split reduction of two kernels on a GPU.  Here a column-sum group joins the
row group it reads alongside (Inductor's mix-order reductions): the row kernel walks its
rows in chunks, adds each row's values into per-chunk column partial sums, and the
partials are summed at the end (in the same C++ function; on a GPU by one small sum over
the partials, codegen/triton_reduction.py).  The column members are placed "column" in
the row group's space (minicompile/spaces.py).

Legality (:func:`can_mix`) and profitability (:func:`worth_mixing`) are separate; the
groups come back in dependency order.
"""

from __future__ import annotations

import torch

from minicompile.ir import ComputedBuffer, Reduce, walk
from minicompile.spaces import FusedGroup, place

from minicompile.passes.fusion import Memo, dependency_graph

MAX_COLUMNS = 4096  # the row kernel keeps a whole row in registers (a persistent kernel)
MAX_PARTS = 8  # column sums one row kernel accumulates


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


def can_mix(row: FusedGroup, col: FusedGroup, dag, memo: Memo) -> tuple[bool, str]:
    """Whether the column sums of ``col`` may run inside ``row``'s kernel; why not."""
    if row.extern is not None or col.extern is not None:
        return False, "a library call runs on its own"
    if row.device != col.device or not row.has_reduction:
        return False, "not a row reduction of the same device"
    space = row.space
    if not (_static(space.kept + space.reduced) and space.kept and space.reduced):
        return False, "symbolic sizes"
    if len(space.reduced) != 1 or int(space.reduced[0]) > MAX_COLUMNS:
        return False, "rows too long to keep in registers"
    if any(memo.is_empty(b) for b in row.buffers + col.buffers):
        return False, "an empty buffer"
    for b in col.buffers:
        if not (isinstance(b, ComputedBuffer) and isinstance(b.body, Reduce)
                and b.body.op == "sum" and b.body.dtype == torch.float32
                and not any(isinstance(e, Reduce) for e in walk(b.body.x))):
            return False, f"{b.name} is not a float32 sum"
        placed = place(b, space)
        if placed is None or placed.kind != "column":
            return False, f"{b.name} does not reduce the group's rows"
        if not _dense(b):
            return False, f"{b.name} is not contiguous"
    names = {b.name for b in col.buffers}
    if any(memo.reads_of(b) & names for b in row.buffers + col.buffers):
        return False, "a member reads a column sum (known only at the end)"
    places = memo.placements(row.buffers + col.buffers, space)
    if places is None:
        return False, "a buffer does not fit the iteration space"
    members = {b.name: b for b in row.buffers}
    for reader in col.buffers:
        for name in memo.reads_of(reader) & members.keys():
            if not memo.is_aligned(reader, members[name], space, places):
                return False, f"{reader.name} reads {name} at other points of the space"
    if dag.contraction_makes_cycle(row.key, col.key):
        return False, "mixing would create a cycle"
    return True, "column sums of the group's rows"


def worth_mixing(row: FusedGroup, col: FusedGroup) -> bool:
    """At least as many rows as columns: each chunk of rows then adds into few partials."""
    space = row.space
    rows = 1
    for s in space.kept:
        rows *= int(s)
    columns = [b for b in row.buffers + col.buffers
               if getattr(place(b, space), "kind", None) == "column"]  # type: ignore[arg-type]
    return rows >= int(space.reduced[0]) and len(columns) <= MAX_PARTS


def mix(groups: list[FusedGroup], log: list[str] | None = None) -> list[FusedGroup]:
    """Move every column-sum group into the first row group it may join (groups in
    dependency order in, and out)."""
    by_key = {g.key: g for g in groups}
    dag = dependency_graph(groups)
    memo = Memo()
    rows = [g for g in groups if g.extern is None and g.has_reduction]
    for col in [g for g in groups if g.extern is None and g.has_reduction]:
        if col.key not in by_key:
            continue
        for row in rows:
            if row is col or row.key not in by_key or col.key not in by_key:
                continue
            ok, reason = can_mix(row, col, dag, memo)
            if ok and not worth_mixing(row, col):
                ok, reason = False, "too few rows or too many column sums"
            if log is not None and (ok or "reduce the group's rows" not in reason):
                log.append(f"{'mix' if ok else 'keep apart'} {row.name} {col.name}: {reason}")
            if ok:
                row.buffers.extend(by_key.pop(col.key).buffers)
                dag.contract(row.key, col.key)
                break
    return [by_key[k] for k in dag.topological_order()]
