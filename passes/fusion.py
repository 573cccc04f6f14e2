"""Fusion: schedule the loop program's buffers into groups, one kernel per group.

The buffers form a DAG (an edge for every buffer one body loads from another; passes/dag.py
keeps what reaches what, so the cycle check is a few bit tests).  Two groups fuse when it is legal (:func:`can_fuse`: same device, every member
fits one iteration space (see minicompile/schedule.py), loads between members stay at the
same point of that space, and merging keeps the DAG acyclic) and worth it
(:func:`score_fusion`: the loads they would share).  Pointwise producers were already
inlined by lowering, so what fuses here are sibling outputs, and reductions with their
prologues and epilogues (a softmax or a layer norm is one group).
"""

from __future__ import annotations

import heapq

from minicompile.ir import ComputedBuffer, ExternKernel, Load, LoopProgram, walk
from minicompile.ops import RANDOM_EXTERNS
from minicompile.passes.dag import Dag
from minicompile.schedule import FusedGroup, aligned


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


def can_fuse(a: FusedGroup, b: FusedGroup, dag: Dag) -> tuple[bool, str]:
    """Whether ``a`` and ``b`` may run as one kernel; the reason when not."""
    if a.extern is not None or b.extern is not None:
        return False, "a library call runs on its own"
    if a.device != b.device:
        return False, "different devices"
    if any(buf.layout.numel() == 0 for buf in a.buffers + b.buffers):
        return False, "an empty buffer (its kernel is never launched)"
    if a.has_reduction and b.has_reduction and a.space != b.space:
        return False, "different reduction spaces"
    space = a.space if a.has_reduction or not b.has_reduction else b.space
    if not a.has_reduction and not b.has_reduction and a.space != b.space:
        return False, "different iteration spaces"
    places = FusedGroup(-1, a.buffers + b.buffers).placements(space)
    if places is None:
        return False, "a buffer does not fit the iteration space"
    members = {m.name: m for m in a.buffers + b.buffers}
    for reader in members.values():
        for name in reader.reads():  # type: ignore[union-attr]
            if name in members and not aligned(
                reader, places[reader.name], members[name], places[name]  # type: ignore[arg-type]
            ):
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

    def consider(a: int, b: int) -> None:
        ka, kb = kinds[a], kinds[b]
        if ka[3] != kb[3] and ka[:3] == kb[:3] == (ka[0], False, False):
            ok, reason = False, "different iteration spaces"  # what can_fuse would say
        else:
            ok, reason = can_fuse(groups[a], groups[b], dag)
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
        ok, reason = can_fuse(groups[a], groups[b], dag)
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
