"""A small directed acyclic graph for the scheduling passes (fusion, horizontal fusion).

Nodes are small non-negative ints (group keys), edges point from producer to consumer.
Reachability is kept as bitmasks (bit ``m`` of ``below[n]``: a path leads from ``n`` to
``m``; ``above``, backwards), computed on first use, so fusion's many "would merging make a
cycle?" questions are bit tests and :meth:`Dag.contract` updates only the ancestors and
descendants.  :meth:`Dag.topological_order`: smallest ``key`` first among the ready nodes
(ties: the node added first), as networkx's ``lexicographical_topological_sort``.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable, Iterator
from operator import or_
from typing import Any


class CycleError(ValueError):
    """The graph has a cycle, or an operation would make one."""


def bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Dag:
    """A directed acyclic graph over small non-negative ints; nodes iterate in the order
    they were added."""

    def __init__(self, nodes: Iterable[int] = ()) -> None:
        self.succ: dict[int, set[int]] = {}
        self.pred: dict[int, set[int]] = {}
        # Reachability masks (see the module docstring); None until first asked for, and
        # again after an edge is added.
        self._below: dict[int, int] | None = None
        self._above: dict[int, int] | None = None
        for n in nodes:
            self.add_node(n)

    def __contains__(self, n: object) -> bool:
        return n in self.succ

    def __iter__(self) -> Iterator[int]:
        return iter(self.succ)

    def __len__(self) -> int:
        return len(self.succ)

    def add_node(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"nodes are non-negative ints, not {n}")
        if n not in self.succ:
            self.succ[n], self.pred[n] = set(), set()
            self._below = self._above = None

    def add_edge(self, u: int, v: int) -> None:
        """An edge ``u -> v`` (adding the nodes first if new, ``u`` before ``v``)."""
        if u == v:
            raise CycleError(f"a self-loop on {u}")
        self.add_node(u)
        self.add_node(v)
        if v not in self.succ[u]:
            self.succ[u].add(v)
            self.pred[v].add(u)
            self._below = self._above = None

    def has_edge(self, u: int, v: int) -> bool:
        return u in self.succ and v in self.succ[u]

    def edges(self) -> Iterator[tuple[int, int]]:
        return ((u, v) for u, vs in self.succ.items() for v in vs)

    def reaches(self, u: int, v: int) -> bool:
        """Whether a path of one edge or more leads from ``u`` to ``v``."""
        below, _ = self._reachability()
        return bool(below[u] >> v & 1)

    def reaches_through_other(self, a: int, b: int) -> bool:
        """Whether a path ``a -> x -> ... -> b`` exists through some vertex ``x`` other than
        ``a`` and ``b`` (merging ``a`` and ``b`` would then put ``x`` on a cycle)."""
        below, _ = self._reachability()  # (b never reaches b itself: no cycles)
        return any(below[s] >> b & 1 for s in self.succ[a])

    def contraction_makes_cycle(self, a: int, b: int) -> bool:
        """Whether merging ``a`` and ``b`` into one node would make a cycle: a path from one
        to the other other than the edge between them."""
        return self.reaches_through_other(a, b) or self.reaches_through_other(b, a)

    def contract(self, a: int, b: int) -> None:
        """Merge ``b`` into ``a``: ``a`` takes ``b``'s edges (an edge between them goes),
        ``b`` leaves the graph.  Raises :class:`CycleError` if that would make a cycle."""
        if a == b or self.contraction_makes_cycle(a, b):
            raise CycleError(f"contracting {a} and {b} would make a cycle")
        below, above = self._reachability()
        for s in self.succ.pop(b):
            self.pred[s].discard(b)
            if s != a:
                self.succ[a].add(s)
                self.pred[s].add(a)
        for p in self.pred.pop(b):
            self.succ[p].discard(b)
            if p != a:
                self.pred[a].add(p)
                self.succ[p].add(a)
        # What the merged node reaches is what either reached (but not themselves: no
        # cycle).  Whatever reached either now reaches all that, and the merged node;
        # whatever either reached is now reached from all their ancestors.
        both = 1 << a | 1 << b
        new_below = (below.pop(b) | below[a]) & ~both
        new_above = (above.pop(b) | above[a]) & ~both
        below[a], above[a] = new_below, new_above
        for x in bits(new_above):
            below[x] = below[x] & ~both | 1 << a | new_below
        for y in bits(new_below):
            above[y] = above[y] & ~both | 1 << a | new_above

    def topological_order(self, key: Callable[[int], Any] | None = None) -> list[int]:
        """Every node after its predecessors; among the nodes ready, the smallest
        ``key(node)`` first (default: the node itself), ties going to the node added
        first.  Raises :class:`CycleError` on a cycle."""
        position = {n: k for k, n in enumerate(self.succ)}
        sort_key = key if key is not None else (lambda n: n)
        waiting = {n: len(ps) for n, ps in self.pred.items()}
        ready = [(sort_key(n), position[n], n) for n, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            *_, n = heapq.heappop(ready)
            order.append(n)
            for s in self.succ[n]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    heapq.heappush(ready, (sort_key(s), position[s], s))
        if len(order) != len(self.succ):
            raise CycleError("the graph has a cycle")
        return order

    def _reachability(self) -> tuple[dict[int, int], dict[int, int]]:
        """The masks (below, above), computed in one sweep each way when missing."""
        if self._below is None or self._above is None:
            order = self.topological_order()
            below: dict[int, int] = {}
            above: dict[int, int] = {}
            for n in reversed(order):
                below[n] = functools.reduce(or_, (below[s] | 1 << s for s in self.succ[n]), 0)
            for n in order:
                above[n] = functools.reduce(or_, (above[p] | 1 << p for p in self.pred[n]), 0)
            self._below, self._above = below, above
        return self._below, self._above
