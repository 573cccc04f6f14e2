"""Common-subexpression and dead-code elimination on the graph IR."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph, Node, copy_graph
from minicompile.ops import OPS, RANDOM_EXTERNS


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument; distinguishes 1, 1.0 and True."""
    if isinstance(value, Node):
        return ("node", id(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, (torch.dtype, torch.device, str)):
        return (type(value).__name__, str(value))
    return (type(value).__name__, repr(value))


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Calls with the same op and the same arguments are computed once (every op is pure
    but the random ones: two dropouts of one tensor draw two masks)."""
    seen: dict[Any, Node] = {}

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node:
        args, kwargs = remap(node.args), remap(node.kwargs)
        if node.target in RANDOM_EXTERNS:
            return new.call(node.target, args, kwargs, node.meta, node.stack)
        # A value computed under no_grad is not the same value as one autograd sees.
        key = (node.target, _key(args), _key(kwargs), node.requires_grad)
        if key not in seen:
            seen[key] = new.call(node.target, args, kwargs, node.meta, node.stack)
        return seen[key]

    return copy_graph(graph, rewrite)


def may_raise(node: Node) -> bool:
    """Whether a call can raise on its values, not only on its metadata: index ops (an index
    out of range).  Eager raises even when nothing reads the result, so such a call is
    never dead code.  (Library calls that may raise, such as a Cholesky factorization, are
    still dropped when unused: backward graphs hold unused ones that must not cost.)"""
    op = OPS.get(node.target)
    return node.op == "call" and op is not None and op.family == "index"


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop calls whose results nothing reads (placeholders stay: they are the signature;
    random calls stay: they advance the generator that later draws read; calls that may
    raise stay: eager raises)."""
    live: set[int] = set()
    for node in reversed(graph.nodes):
        if node.op in ("output", "placeholder") or id(node) in live or (
            node.target in RANDOM_EXTERNS
        ) or may_raise(node):
            live.update(id(i) for i in node.inputs())
            live.add(id(node))
    dead = [n for n in graph.calls() if id(n) not in live]
    if not dead:
        return graph
    new = Graph(graph.name, graph.shapes)
    env: dict[Node, Node] = {}
    remap = lambda v: _remap(v, env)  # noqa: E731
    for node in graph.nodes:
        if id(node) not in live:
            continue
        if node.op == "placeholder":
            env[node] = new.placeholder(node.target, node.meta)
        elif node.op == "output":
            new.output(remap(node.args[0]))
        else:
            env[node] = new.call(node.target, remap(node.args), remap(node.kwargs), node.meta,
                                 node.stack)
    return new


def _remap(value: Any, env: dict[Node, Node]) -> Any:
    from minicompile.graph import map_nodes

    return map_nodes(value, lambda n: env[n])
