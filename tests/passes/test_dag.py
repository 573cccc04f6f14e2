"""passes/dag.py: reachability, contraction and topological orders, checked against
brute-force references on random DAGs (and a few small graphs by hand)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from minicompile.passes.dag import CycleError, Dag, bits


# Brute-force references over plain (nodes in order, set of edges).


def _reaches(edges: set[tuple[int, int]], u: int, v: int) -> bool:
    """A path of one edge or more from u to v (depth-first search)."""
    stack, seen = [w for x, w in edges if x == u], set()
    while stack:
        w = stack.pop()
        if w == v:
            return True
        if w not in seen:
            seen.add(w)
            stack.extend(y for x, y in edges if x == w)
    return False


def _makes_cycle(edges: set[tuple[int, int]], a: int, b: int) -> bool:
    """Whether merging a and b leaves a cycle: contract, then look for one."""
    merged = _contracted(edges, a, b)
    return any(_reaches(merged, n, n) for n in {x for e in merged for x in e})


def _contracted(edges: set[tuple[int, int]], a: int, b: int) -> set[tuple[int, int]]:
    renamed = {(a if u == b else u, a if v == b else v) for u, v in edges}
    return {(u, v) for u, v in renamed if u != v}


def _order(
    nodes: list[int], edges: set[tuple[int, int]], key: Callable[[int], object]
) -> list[int]:
    """Repeatedly the ready node of smallest (key, position in ``nodes``)."""
    done: list[int] = []
    while len(done) < len(nodes):
        ready = [n for n in nodes if n not in done
                 and all(u in done for u, v in edges if v == n)]
        done.append(min(ready, key=lambda n: (key(n), nodes.index(n))))
    return done


def _random_dag(rng: random.Random) -> tuple[Dag, list[int], set[tuple[int, int]]]:
    """A DAG over a random sample of ints (not 0..n-1, not added in sorted order), some
    added as nodes, the rest by their edges."""
    labels = rng.sample(range(90), rng.randint(1, 24))  # a hidden topological order
    p = rng.choice((0.05, 0.15, 0.4))
    edges = [(u, v) for i, u in enumerate(labels) for v in labels[i + 1 :] if rng.random() < p]
    rng.shuffle(edges)
    dag, nodes = Dag(), []
    alone = [n for n in labels if rng.random() < 0.5]
    rng.shuffle(alone)
    for n in alone:
        dag.add_node(n)
        nodes.append(n)
    for u, v in edges:
        dag.add_edge(u, v)
        nodes += [n for n in (u, v) if n not in nodes]
    for n in labels:  # a node with no edge that was not added above
        if n not in nodes:
            dag.add_node(n)
            nodes.append(n)
    return dag, nodes, set(edges)


def _check_same(dag: Dag, nodes: list[int], edges: set[tuple[int, int]]) -> None:
    assert list(dag) == nodes
    assert set(dag.edges()) == edges
    for u in nodes:
        assert dag.pred[u] == {x for x, y in edges if y == u}
        for v in nodes:
            assert dag.reaches(u, v) == _reaches(edges, u, v), (u, v)
            if u != v:
                through = any(s != v and _reaches(edges, s, v) for x, s in edges if x == u)
                assert dag.reaches_through_other(u, v) == through, (u, v)


@pytest.mark.parametrize("seed", range(40))
def test_reachability_and_orders_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    dag, nodes, edges = _random_dag(rng)
    _check_same(dag, nodes, edges)
    assert dag.topological_order() == _order(nodes, edges, key=lambda n: n)
    ties = {n: rng.randint(0, 3) for n in nodes}  # many ties: broken by insertion order
    assert dag.topological_order(key=ties.__getitem__) == _order(nodes, edges, ties.__getitem__)


@pytest.mark.parametrize("seed", range(40))
def test_contractions_keep_reachability_right(seed: int) -> None:
    rng = random.Random(1000 + seed)
    dag, nodes, edges = _random_dag(rng)
    dag.reaches(nodes[0], nodes[0])  # the masks exist before the first contraction
    merged = refused = 0
    for _ in range(3 * len(nodes)):
        if len(nodes) < 2:
            break
        a, b = rng.sample(nodes, 2)
        if _makes_cycle(edges, a, b):
            assert dag.contraction_makes_cycle(a, b)
            with pytest.raises(CycleError):
                dag.contract(a, b)
            refused += 1
        else:
            assert not dag.contraction_makes_cycle(a, b)
            dag.contract(a, b)
            edges = _contracted(edges, a, b)
            nodes.remove(b)
            merged += 1
        _check_same(dag, nodes, edges)
        assert dag.topological_order() == _order(nodes, edges, key=lambda n: n)
    assert merged > 0 or len(nodes) < 2


def test_contraction_refuses_a_path_through_a_third_node() -> None:
    # 0 -> 1 -> 2 and 0 -> 2: merging 0 and 2 would put 1 on a cycle; 0 and 1 are fine.
    dag = Dag()
    for u, v in [(0, 1), (1, 2), (0, 2)]:
        dag.add_edge(u, v)
    assert dag.contraction_makes_cycle(0, 2) and dag.contraction_makes_cycle(2, 0)
    assert not dag.contraction_makes_cycle(0, 1)
    dag.contract(0, 1)
    assert list(dag) == [0, 2] and list(dag.edges()) == [(0, 2)]
    assert dag.reaches(0, 2) and not dag.reaches(2, 0)
    assert not dag.contraction_makes_cycle(0, 2)


def test_contraction_updates_ancestors_and_descendants() -> None:
    # 5 -> 1, 2 -> 7: after merging 1 and 2, 5 reaches 7.
    dag = Dag()
    dag.add_edge(5, 1)
    dag.add_edge(2, 7)
    assert not dag.reaches(5, 7)
    dag.contract(1, 2)
    assert dag.reaches(5, 7) and dag.reaches(5, 1) and dag.reaches(1, 7)
    assert not dag.reaches(7, 5) and 2 not in dag


def test_cycles_are_reported() -> None:
    dag = Dag()
    with pytest.raises(CycleError):
        dag.add_edge(3, 3)
    for u, v in [(0, 1), (1, 2), (2, 0)]:
        dag.add_edge(u, v)
    with pytest.raises(CycleError):
        dag.topological_order()
    with pytest.raises(CycleError):
        dag.reaches(0, 1)


def test_ties_go_to_the_node_added_first() -> None:
    dag = Dag([5, 3, 9])
    assert dag.topological_order() == [3, 5, 9]
    assert dag.topological_order(key=lambda n: 0) == [5, 3, 9]
    dag.add_edge(9, 3)
    assert dag.topological_order(key=lambda n: 0) == [5, 9, 3]


def test_bits() -> None:
    assert list(bits(0)) == []
    assert list(bits(0b1011)) == [0, 1, 3]
    assert list(bits(1 << 200)) == [200]
