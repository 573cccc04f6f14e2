"""Fusion: schedule the loop program's buffers into groups, one kernel per group.

The buffers form a DAG (an edge for every buffer one body loads from another; passes/dag.py
keeps what reaches what, so the cycle check is a few bit tests).  Two groups fuse when it is
legal (:func:`can_fuse`, which says why not: every member in one iteration space of
minicompile/spaces.py, no cycle) and worth it (:func:`score_fusion`: the loads they would
share).  Pointwise producers were already inlined by lowering, so what fuses here are
sibling outputs, and reductions with their prologues and epilogues (a softmax or a layer
norm is one group).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from minicompile.ir import Buffer, ComputedBuffer, ExternKernel, Load, LoopProgram, walk
from minicompile.ops import RANDOM_EXTERNS
from minicompile.passes.dag import Dag
from minicompile.spaces import FusedGroup, Placement, Space, aligned, place


def dependency_graph(groups: list[FusedGroup]) -> Dag:
    """Vertices are group keys; an edge for every buffer a group loads from another, and
    one from each random library call to the next (they draw in program order)."""
    owner = {b.name: g.key for g in groups for b in g.buffers}
    dag = Dag()
    random_calls = [g.key for g in groups
                    if isinstance(g.extern, ExternKernel) and g.extern.op in RANDOM_EXTERNS]
    for u, v in zip(random_calls, random_calls[1:]):
        dag.add_edge(u, v)
    for g in groups:
        dag.add_node(g.key)
        for buf in g.buffers:
            for read in buf.reads():
                if read in owner and owner[read] != g.key:
                    dag.add_edge(owner[read], g.key)
    return dag


@dataclass
class Memo:
    """What :func:`can_fuse` works out about buffers, kept for one :func:`fuse`: every pair
    of groups is asked about again after each merge, mostly about the same buffers in the
    same space (resnet50: 2,600 placements, 100 distinct).  Buffers go by name (unique in a
    program); a placement depends only on the buffer and the space, so whether a load is
    aligned depends only on the reader, the writer and the space."""

    reads: dict[str, set[str]] = field(default_factory=dict)
    empty: dict[str, bool] = field(default_factory=dict)
    places: dict[tuple[str, Space], Placement | None] = field(default_factory=dict)
    aligned: dict[tuple[str, str, Space], bool] = field(default_factory=dict)

    def reads_of(self, buf: Buffer) -> set[str]:
        if buf.name not in self.reads:
            self.reads[buf.name] = buf.reads()  # type: ignore[union-attr]
        return self.reads[buf.name]

    def is_empty(self, buf: Buffer) -> bool:
        if buf.name not in self.empty:
            self.empty[buf.name] = buf.layout.numel() == 0  # type: ignore[union-attr]
        return self.empty[buf.name]

    def placements(self, bufs: list[Buffer], space: Space) -> dict[str, Placement] | None:
        """As FusedGroup.placements: each buffer's placement, or None if one does not fit."""
        out = {}
        for b in bufs:
            if (b.name, space) not in self.places:
                self.places[b.name, space] = place(b, space)  # type: ignore[arg-type]
            out[b.name] = self.places[b.name, space]
            if out[b.name] is None:
                return None
        return out

    def is_aligned(self, reader: Buffer, writer: Buffer, space: Space,
                   places: dict[str, Placement]) -> bool:
        """Whether ``reader`` loads ``writer`` at the same points of ``space``."""
        key = (reader.name, writer.name, space)
        if key not in self.aligned:
            self.aligned[key] = aligned(reader, places[reader.name],  # type: ignore[arg-type]
                                        writer, places[writer.name])  # type: ignore[arg-type]
        return self.aligned[key]


def can_fuse(
    a: FusedGroup, b: FusedGroup, dag: Dag, memo: Memo | None = None
) -> tuple[bool, str]:
    """Whether ``a`` and ``b`` may run as one kernel; the reason when not.  ``memo``: what
    earlier calls on buffers of the same program worked out."""
    memo = memo if memo is not None else Memo()
    if a.extern is not None or b.extern is not None:
        return False, "a library call runs on its own"
    if a.device != b.device:
        return False, "different devices"
    if any(memo.is_empty(buf) for buf in a.buffers + b.buffers):
        return False, "an empty buffer (its kernel is never launched)"
    if a.has_reduction and b.has_reduction and a.space != b.space:
        return False, "different reduction spaces"
    space = a.space if a.has_reduction or not b.has_reduction else b.space
    if not a.has_reduction and not b.has_reduction and a.space != b.space:
        return False, "different iteration spaces"
    places = memo.placements(a.buffers + b.buffers, space)
    if places is None:
        return False, "a buffer does not fit the iteration space"
    members = {m.name: m for m in a.buffers + b.buffers}
    for reader in members.values():
        for name in memo.reads_of(reader):
            writer = members.get(name)
            if writer is not None and not memo.is_aligned(reader, writer, space, places):
                return False, f"{reader.name} reads {name} at other points of the space"
    if dag.contraction_makes_cycle(a.key, b.key):
        return False, "fusing would create a cycle"
    return True, "same iteration space" if not a.has_reduction and not b.has_reduction else (
        "reduction with its prologue/epilogue"
    )


def _kind(g: FusedGroup) -> tuple:
    """(device, library call?, reduction?, space as text): cheap to compare."""
    if g.extern is not None:
        return (str(g.device), True, False, "")
    space = g.space
    return (str(g.device), False, g.has_reduction, f"{space.kept} {space.reduced}")


def score_fusion(a: FusedGroup, b: FusedGroup) -> int:
    """How much fusing saves: the distinct loads the two groups share."""

    def loads(g: FusedGroup) -> set[tuple[str, object]]:
        return {
            (e.buffer, e.index)
            for x in g.buffers
            if isinstance(x, ComputedBuffer)
            for e in walk(x.body)
            if isinstance(e, Load)
        }

    return len(loads(a) & loads(b))


def fuse(program: LoopProgram, log: list[str] | None = None) -> list[FusedGroup]:
    """Group the program's buffers greedily, best-scoring legal pair first (ties: the
    first pair in key order), until no pair fuses.  Groups come back in an order that
    respects dependencies.

    A pair's verdict is computed once per version of its two groups: what makes a pair
    legal depends only on them, except the cycle check, and merging only adds paths to
    the DAG, so a refused pair stays refused and a legal one is checked again when it is
    chosen.  (Checking every pair after every merge made a graph of hundreds of
    independent updates, an optimizer step, cubic.)"""
    groups = {k: FusedGroup(k, [b]) for k, b in enumerate(program.buffers)}
    dag = dependency_graph(list(groups.values()))
    version = dict.fromkeys(groups, 0)
    # Kind of each group, for the refusals that need no placement: (device, extern?,
    # reduction?, space).
    kinds = {k: _kind(g) for k, g in groups.items()}
    names = {k: g.name for k, g in groups.items()}
    heap: list[tuple[int, int, int, int, int]] = []  # (-score, a, b, version a, version b)
    memo = Memo()

    def consider(a: int, b: int) -> None:
        ka, kb = kinds[a], kinds[b]
        if ka[3] != kb[3] and ka[:3] == kb[:3] == (ka[0], False, False):
            ok, reason = False, "different iteration spaces"  # what can_fuse would say
        else:
            ok, reason = can_fuse(groups[a], groups[b], dag, memo)
        if log is not None:
            log.append(f"{'fuse' if ok else 'keep apart'} {names[a]} {names[b]}: {reason}")
        if ok:
            score = score_fusion(groups[a], groups[b])
            heapq.heappush(heap, (-score, a, b, version[a], version[b]))

    keys = sorted(groups)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            consider(a, b)
    while heap:
        _, a, b, va, vb = heapq.heappop(heap)
        if a not in groups or b not in groups or (version[a], version[b]) != (va, vb):
            continue  # a group of the pair has changed since
        ok, reason = can_fuse(groups[a], groups[b], dag, memo)
        if not ok:  # merges since made a cycle through them
            if log is not None:
                log.append(f"keep apart {names[a]} {names[b]}: {reason}")
            continue
        groups[a].buffers.extend(groups.pop(b).buffers)
        dag.contract(a, b)
        version[a] += 1
        kinds[a], names[a] = _kind(groups[a]), groups[a].name
        for c in sorted(groups):
            if c != a:
                consider(min(a, c), max(a, c))
    # Library calls keep their program order (random number generators and the like see
    # them in eager's order); kernels go wherever their inputs allow.
    position = {b.name: k for k, b in enumerate(program.buffers)}
    for g in groups.values():  # members in dependency order (program order among equals)
        members = g.buffers
        index = {b.name: k for k, b in enumerate(members)}
        inner = Dag(range(len(members)))
        for k, b in enumerate(members):
            for r in b.reads():
                if r in index:
                    inner.add_edge(index[r], k)
        order = inner.topological_order(key=lambda k: position[members[k].name])
        g.buffers = [members[k] for k in order]
    return [groups[k] for k in dag.topological_order()]
