"""``MINICOMPILE_CHECK=1``: run every compiled graph beside eager and name the first graph
node whose value differs.

Each call also runs the graph eagerly and compares every output; on a difference the graph
cut after each node is compiled and compared, and the first that differs is reported with
its source line (a ``CheckFailed`` warning); the call returns eager's values.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph, Node, ancestors, map_nodes
from minicompile.ops import RANDOM_EXTERNS, run_graph
from minicompile.user_errors import raise_at_node

# Relative tolerance per floating dtype; the absolute tolerance scales with the values'
# magnitude (reductions sum in a different order than eager's kernels).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-9}

Build = Callable[[Graph], Callable[[list], tuple]]


class CheckFailed(UserWarning):
    """A compiled graph's value differs from eager's (MINICOMPILE_CHECK=1)."""


def checkable(graph: Graph) -> bool:
    """Whether the graph's values can be recomputed by eager for comparison."""
    return not any(n.target in RANDOM_EXTERNS for n in graph.calls())


def difference(actual: Any, expected: Any) -> str | None:
    """None when ``actual`` matches ``expected`` within its dtype's tolerance, else how
    they differ."""
    if not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"{actual!r} != {expected!r}"
    if not isinstance(actual, torch.Tensor):
        return f"a {type(actual).__name__} where eager gives a tensor"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (f"{actual.dtype}{list(actual.shape)} where eager gives "
                f"{expected.dtype}{list(expected.shape)}")
    if expected.numel() == 0:
        return None
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not e.dtype.is_floating_point:
        wrong = a != e
        tolerance = 0.0
    else:
        a, e = a.double(), e.double()
        rtol = RTOL.get(expected.dtype, 1e-5)
        finite = e[torch.isfinite(e)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        tolerance = rtol * (1.0 + scale)
        same_special = (a == e) | (torch.isnan(a) & torch.isnan(e))
        wrong = ~same_special & ~((a - e).abs() <= tolerance)
    if not bool(wrong.any()):
        return None
    where = tuple(int(i) for i in wrong.nonzero()[0])
    gap = (a.double() - e.double()).abs()
    gap = float(gap[wrong].max()) if e.dtype.is_floating_point else float("nan")
    return (f"{int(wrong.sum())} of {e.numel()} values differ, first at {where}: "
            f"{a[where].item()!r} where eager gives {e[where].item()!r} (max difference "
            f"{gap:.3g}, tolerance {tolerance:.3g})")


def prefix(graph: Graph, node: Node) -> Graph:
    """The part of ``graph`` that ``node`` depends on (every placeholder kept, in order),
    with ``node`` as its one output."""
    needed = ancestors([node])
    cut = Graph(f"{graph.name}_to_{node.index}", graph.shapes)
    env: dict[Node, Node] = {}
    for n in graph.nodes:
        if n.op == "placeholder":
            env[n] = cut.placeholder(n.target, n.meta)
        elif n.op == "call" and n in needed:
            env[n] = cut.call(n.target, map_nodes(n.args, env.__getitem__),
                              map_nodes(n.kwargs, env.__getitem__), n.meta, n.stack)
    cut.output((env[node],))
    return cut


def first_wrong_node(graph: Graph, outputs: list[Node], inputs: list, build: Build
                     ) -> tuple[Node, str] | None:
    """The first node (graph order) among those ``outputs`` depend on whose compiled value
    differs from eager's, and how; None if each agrees when it is the graph's output."""
    needed = ancestors(outputs)
    for node in graph.calls():
        if node not in needed or isinstance(node.meta, tuple):
            continue
        cut = prefix(graph, node)
        expected = run_graph(cut, list(inputs))[0]
        problem = difference(build(cut)(list(inputs))[0], expected)
        if problem is not None:
            return node, problem
    return None


def describe(node: Node) -> str:
    line = f"  %{node.index} = {node.target}(...) : {node.meta}"
    return f"{line}      {node.stack[-1].describe()}" if node.stack else line


def checked(call: Callable[[list], tuple], graph: Graph, name: str, build: Build
            ) -> Callable[[list], tuple]:
    """``call`` (the compiled graph: inputs -> outputs), checked against eager on each call.
    ``build`` compiles a graph as ``call`` was compiled (to search for the wrong node)."""

    def run(inputs: list) -> tuple:
        expected = run_graph(graph, list(inputs), on_error=raise_at_node)  # the user's error
        actual = call(inputs)
        for k, (a, e) in enumerate(zip(actual, expected)):
            problem = difference(a, e)
            if problem is None:
                continue
            text = f"minicompile: MINICOMPILE_CHECK: {name}'s output {k} differs from eager: "
            text += problem
            found = first_wrong_node(graph, [graph.outputs[k]], inputs, build)
            if found is None:
                text += "\n(each node matches eager when it is the output: the difference "
                text += "comes from how the whole graph is fused)"
            else:
                node, how = found
                text += f"\nthe first node that differs ({how}):\n{describe(node)}"
            warnings.warn(text, CheckFailed, stacklevel=2)
            return expected
        return actual

    return run
