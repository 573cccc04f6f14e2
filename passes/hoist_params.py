"""Work that reads only the module's parameters and buffers is taken out of an inference
graph, to be done once (Inductor's freezing, without freezing anything): a batch norm folded
into a weight, a weight copied channels-last or padded, a weight cast under autocast.

:func:`hoist_parameter_values` cuts the graph in two: the *derived* graph (placeholders: the
parameters and buffers it reads; outputs: the values the rest reads), the largest subgraph
whose every input is a parameter, a buffer or a constant; and the *main* graph, the
original with one placeholder appended per value of the cut.  The runtime computes the
derived graph again only when a parameter it read changed (minicompile/runtime/derived.py).
Stay in the main graph: views alone (free in kernels; a cached view would cost memory),
anything a graph output may share memory with (eager returns new tensors), random draws,
library calls of user code and anything with symbolic sizes.

``state``: the positions of the placeholders that are parameters or buffers the graph does
not write back into; a graph that takes gradients never comes here.
"""

from __future__ import annotations

import dataclasses

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, ancestors, map_nodes
from minicompile.library_layouts import CONVOLUTIONS

# Op families whose compiled result is always a new tensor, never memory of an input.
FRESH = frozenset({"unary", "binary", "ternary", "composite", "reduction", "cast", "index",
                   "iota"})
ALIASES = frozenset({"view", "tuple"})  # a view of an input, an element of a tuple result
# Pure library calls of minicompile's own.
OWN_HELPERS = ("minicompile.runtime.gemm.", "minicompile.runtime.onednn.")
# Library calls whose result is new memory, whatever their arguments (others, such as
# ``torch.Tensor.to``, may return their argument itself).
FRESH_EXTERNS = CONVOLUTIONS | frozenset(
    {"torch.nn.functional.linear", "torch.mm", "torch.addmm", "torch.bmm", "torch.matmul",
     "torch.nn.functional.scaled_dot_product_attention"})


@dataclasses.dataclass(frozen=True)
class Hoisted:
    """A graph cut in two: ``main`` takes the original inputs and then ``derived``'s
    outputs; ``derived`` takes the original inputs at ``positions``."""

    main: Graph
    derived: Graph
    positions: tuple[int, ...]


def _pure(node: Node) -> bool:
    """Whether ``node`` computes the same value from the same inputs every call, with no
    effect beyond its result, and static sizes."""
    if node.target in ops.RANDOM_EXTERNS or not isinstance(node.meta, (TensorMeta, tuple)):
        return False
    metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
    if any(not isinstance(m, TensorMeta) or m.is_symbolic for m in metas):
        return False
    if ops.has_symbols((node.args, node.kwargs)):
        return False
    if ops.OPS[node.target].family == "extern":
        return (node.target.startswith(OWN_HELPERS) or node.target.startswith("torch.")
                and not node.target.startswith("torch.ops.")
                and ops.extern_module(node.target) is None)
    return True


def _escaping(graph: Graph) -> set[Node]:
    """The values a graph output may share memory with: the outputs, and through every op
    that may return its input's memory (a view, a library call), what it reads."""
    escaping: set[Node] = set()
    todo = list(graph.outputs)
    while todo:
        node = todo.pop()
        if node in escaping:
            continue
        escaping.add(node)
        if (node.op == "call" and ops.OPS[node.target].family not in FRESH
                and node.target not in FRESH_EXTERNS and not node.target.startswith(OWN_HELPERS)):
            todo += list(node.inputs())
    return escaping


def _constants(graph: Graph, state: frozenset[int]) -> tuple[set[Node], set[Node], set[Node]]:
    """The nodes computed from the state and constants alone; of those, the ones that read
    the state; and of those, the ones that do work beyond views of the state."""
    placeholders = graph.placeholders
    const = {placeholders[k] for k in state}
    stateful = set(const)
    computes: set[Node] = set()
    for node in graph.calls():
        inputs = list(node.inputs())
        if all(i in const for i in inputs) and _pure(node):
            const.add(node)  # (a node of no inputs, torch.arange(12) say, is a constant)
            if any(i in stateful for i in inputs):
                stateful.add(node)
                if (ops.OPS[node.target].family not in ALIASES
                        or any(i in computes for i in inputs)):
                    computes.add(node)
    return const, stateful, computes


def parameter_values(graph: Graph, state: frozenset[int]) -> set[Node]:
    """The values computed from the parameters and buffers at ``state`` (and constants)
    alone: work on them that this pass would take out of the graph, to be done once."""
    return _constants(graph, state)[1]


def _cut(graph: Graph, state: frozenset[int]) -> tuple[set[Node], list[Node]]:
    """The nodes computed from the state alone, and of those the ones to hoist whose
    value the rest of the graph reads (the cut), in graph order."""
    const, _, computes = _constants(graph, state)
    escaping = _escaping(graph)
    hoisted = {n for n in computes if n not in escaping and isinstance(n.meta, TensorMeta)}
    cut = [n for n in graph.calls() if n in hoisted and any(u not in hoisted for u in n.users)]
    return const, cut


def _derived_graph(graph: Graph, needed: set[Node], cut: list[Node]
                   ) -> tuple[Graph, tuple[int, ...]]:
    """The graph of ``needed`` nodes computing ``cut``, and its inputs' positions."""
    derived = Graph(f"{graph.name}_parameters")
    env: dict[Node, Node] = {}
    positions = []
    for k, node in enumerate(graph.placeholders):
        if node in needed:
            env[node] = derived.placeholder(node.target, node.meta)
            positions.append(k)
    for node in graph.calls():
        if node in needed:
            remap = lambda v: map_nodes(v, env.__getitem__)  # noqa: E731
            env[node] = derived.call(node.target, remap(node.args), remap(node.kwargs),
                                     node.meta, node.stack)
    derived.output(tuple(env[n] for n in cut))
    return derived, tuple(positions)


def _main_graph(graph: Graph, cut: list[Node], computed: set[Node]) -> Graph:
    """``graph`` reading the cut's values from new placeholders after its own; the calls
    of ``computed`` (the derived graph's) that nothing else reads are dropped."""
    main = Graph(graph.name, graph.shapes, graph.derived)
    env = {node: main.placeholder(node.target, node.meta) for node in graph.placeholders}
    env.update((node, main.placeholder(f"derived_{k}", node.meta)) for k, node in enumerate(cut))
    kept: set[Node] = set(graph.outputs)
    for node in reversed(graph.nodes):  # what the main graph still reads
        if node.op == "call" and node not in env and (node not in computed or node in kept):
            kept.update(node.inputs())
    for node in graph.calls():
        if node in env or (node in computed and node not in kept):
            continue
        remap = lambda v: map_nodes(v, env.__getitem__)  # noqa: E731
        env[node] = main.call(node.target, remap(node.args), remap(node.kwargs), node.meta,
                              node.stack)
    main.output(map_nodes(graph.outputs, env.__getitem__))
    return main


def hoist_parameter_values(graph: Graph, state: frozenset[int]) -> tuple[Hoisted | None, str]:
    """The graph cut in two (None where nothing is worth hoisting), and what was hoisted,
    for the logs ("" where nothing)."""
    if not state:
        return None, ""
    const, cut = _cut(graph, state)
    if not cut:
        return None, ""
    needed = ancestors(cut)
    derived, positions = _derived_graph(graph, needed, cut)
    main = _main_graph(graph, cut, needed & const)
    text = (f"{len(cut)} values computed once from {len(positions)} parameters and buffers:\n"
            f"{derived}")
    return Hoisted(main, derived, positions), text
