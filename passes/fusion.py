"""Fusion: schedule the loop program's buffers into groups, one kernel per group.

The buffers form a DAG (an edge for every buffer one body loads from another), kept in
networkx.  Two groups fuse when it is legal (:func:`can_fuse`: same device, same iteration
space, and merging keeps the DAG acyclic) and worth it (:func:`score_fusion`: the bytes
they would share).  Pointwise producers were already inlined by lowering, so what is left
to fuse here are sibling outputs over the same iteration space.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from minicompile.ir import Buffer, ComputedBuffer, ExternKernel, Load, LoopProgram, walk


@dataclasses.dataclass
class FusedGroup:
    key: int  # its vertex in the dependency DAG
    buffers: list[Buffer]  # ComputedBuffers, or one ExternKernel

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
        return self.buffers[0].layout.device  # type: ignore[union-attr]


def dependency_graph(groups: list[FusedGroup]) -> nx.DiGraph:
    """Vertices are group keys; an edge for every buffer a group loads from another."""
    owner = {b.name: g.key for g in groups for b in g.buffers}
    dag = nx.DiGraph()
    for g in groups:
        dag.add_node(g.key)
        for buf in g.buffers:
            for read in buf.reads():
                if read in owner and owner[read] != g.key:
                    dag.add_edge(owner[read], g.key)
    return dag


def can_fuse(a: FusedGroup, b: FusedGroup, dag: nx.DiGraph) -> tuple[bool, str]:
    """Whether ``a`` and ``b`` may run as one kernel; the reason when not."""
    if a.extern is not None or b.extern is not None:
        return False, "a library call runs on its own"
    if a.device != b.device:
        return False, "different devices"
    if a.shape != b.shape:
        return False, "different iteration spaces"
    if dag.has_edge(a.key, b.key) or dag.has_edge(b.key, a.key):
        return False, "one reads the other's buffer (a realized producer)"
    if _reaches_through_other(dag, a.key, b.key) or _reaches_through_other(dag, b.key, a.key):
        return False, "fusing would create a cycle"
    return True, "same iteration space"


def _reaches_through_other(dag: nx.DiGraph, a: int, b: int) -> bool:
    """Whether a path a -> x -> ... -> b exists through some other vertex x (merging a and
    b would then put a cycle through x)."""
    return any(s != b and nx.has_path(dag, s, b) for s in dag.successors(a))


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
    """Group the program's buffers greedily, best-scoring legal pair first, until no pair
    fuses.  Groups come back in an order that respects dependencies."""
    groups = {k: FusedGroup(k, [b]) for k, b in enumerate(program.buffers)}
    dag = dependency_graph(list(groups.values()))
    while True:
        best: tuple[int, int, int] | None = None
        keys = sorted(groups)
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                ok, reason = can_fuse(groups[a], groups[b], dag)
                if log is not None:
                    verdict = "fuse" if ok else "keep apart"
                    log.append(f"{verdict} {groups[a].name} {groups[b].name}: {reason}")
                if ok:
                    score = score_fusion(groups[a], groups[b])
                    if best is None or score > best[0]:
                        best = (score, a, b)
        if best is None:
            break
        _, a, b = best
        groups[a].buffers.extend(groups.pop(b).buffers)
        dag = nx.contracted_nodes(dag, a, b, self_loops=False)
    # Library calls keep their program order (random number generators and the like see
    # them in eager's order); kernels go wherever their inputs allow.
    return [groups[k] for k in nx.lexicographical_topological_sort(dag)]
