"""Horizontal fusion: independent pointwise groups of one graph become combo kernels (an
optimizer step over N parameters is one launch, not N), as Inductor's combo kernels.

Legality (:func:`can_join`) is per group: pointwise, static size, no checks of values.
Independence comes from levels (the longest path to a group in the dependency DAG): groups
of one level never reach each other, and a combo of one level keeps the DAG acyclic.
Fewer launches is always better; :data:`MAX_PARTS` and :data:`MAX_ARGS` cap a combo so
Triton's compile time and argument lists stay sane.
"""

from __future__ import annotations

from minicompile.ir import ComputedBuffer, IndexExpr, Load, raises_on_values, walk
from minicompile.sym import size_symbols
from minicompile.spaces import ComboGroup, FusedGroup

from minicompile.passes.dag import Dag
from minicompile.passes.fusion import dependency_graph

MAX_PARTS = 8  # sub-kernels per combo kernel
MAX_ARGS = 96  # pointers per combo kernel (inputs and outputs)


def can_join(group: FusedGroup) -> tuple[bool, str]:
    """Whether ``group`` may be a part of a combo kernel; the reason when not."""
    if group.extern is not None:
        return False, "a library call runs on its own"
    if group.has_reduction:
        return False, "a reduction keeps its own kernel"
    indices = [e.index for b in group.buffers for e in walk(b.body)  # type: ignore[union-attr]
               if isinstance(e, (Load, IndexExpr))]
    shapes = [s for b in group.buffers for s in b.layout.shape]  # type: ignore[union-attr]
    if size_symbols(shapes + indices):
        return False, "symbolic sizes (a combo kernel takes no size arguments)"
    if any(0 in tuple(b.layout.shape) for b in group.buffers):  # type: ignore[union-attr]
        return False, "an empty tensor launches nothing"
    for b in group.buffers:
        if isinstance(b, ComputedBuffer) and any(raises_on_values(e) for e in walk(b.body)):
            return False, "index checks and integer divisions set an error flag"
    return True, "independent pointwise group"


def pointers(group: FusedGroup) -> set[str]:
    """The buffers the group's kernel may take as arguments (an upper bound)."""
    return {b.name for b in group.buffers}.union(*(b.reads() for b in group.buffers))


def levels(groups: list[FusedGroup]) -> dict[int, int]:
    """Each group's level: the number of groups on the longest path to it."""
    dag = dependency_graph(groups)
    level: dict[int, int] = {}
    for key in dag.topological_order():  # any order after the predecessors would do
        level[key] = max((level[p] + 1 for p in dag.pred[key]), default=0)
    return level


def combine(
    groups: list[FusedGroup], log: list[str] | None = None
) -> list[FusedGroup | ComboGroup]:
    """Combine independent pointwise groups (in dependency order) into combo kernels of at
    most MAX_PARTS parts and MAX_ARGS pointers; the result is in dependency order."""
    level = levels(groups)
    buckets: dict[tuple, list[list[FusedGroup]]] = {}
    for g in groups:
        ok, reason = can_join(g)
        if not ok:
            if log is not None:
                log.append(f"keep {g.name} alone: {reason}")
            continue
        chunks = buckets.setdefault((level[g.key], str(g.device)), [[]])
        args = set().union(*(pointers(part) for part in chunks[-1]), pointers(g))
        if len(chunks[-1]) >= MAX_PARTS or len(args) > MAX_ARGS:
            chunks.append([])
        chunks[-1].append(g)
    unit_of = {g.key: g for g in groups}  # group key -> the unit (group or combo) it is in
    for chunks in buckets.values():
        for parts in chunks:
            if len(parts) < 2:
                continue
            combo = ComboGroup(min(p.key for p in parts), parts)
            if log is not None:
                log.append(f"combine {combo.name}: {len(parts)} independent pointwise groups")
            for p in parts:
                unit_of[p.key] = combo
    # The units in dependency order, earliest program position first among those ready.
    units = list({id(u): u for u in unit_of.values()}.values())
    index = {id(u): k for k, u in enumerate(units)}
    dag = Dag(range(len(units)))
    for a, b in dependency_graph(groups).edges():
        if unit_of[a] is not unit_of[b]:
            dag.add_edge(index[id(unit_of[a])], index[id(unit_of[b])])
    order = dag.topological_order(key=lambda k: units[k].key)
    return [units[k] for k in order]
