"""The graph IR: an FX-like list of nodes in topological order.

``placeholder``, ``call`` (one op of :mod:`minicompile.ops`) and one ``output`` node; each
tensor-valued node carries a :class:`TensorMeta`, and nodes keep their ``users`` up to date.
``str(graph)`` is the canonical text (``%2 = sin(%0) : f32[8, 8]    # trig.py:9  ...``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import sympy
import torch

from minicompile.errors import ShapeError, SourceLine
from minicompile.shapes import ShapeContext

DTYPE_ABBR: dict[torch.dtype, str] = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8",
}


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What the compiler knows of a tensor without its data."""

    shape: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool = False
    storage_offset: sympy.Expr = sympy.Integer(0)
    # The ShapeContext of the capture when sizes are symbolic (minicompile/shapes.py):
    # what turns them into PyTorch's SymInts.  Not part of the value.
    shapes: ShapeContext | None = dataclasses.field(default=None, compare=False, repr=False)

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(tuple(sympy.Integer(s) for s in t.shape),
                          tuple(sympy.Integer(s) for s in t.stride()), t.dtype, t.device,
                          t.requires_grad, sympy.Integer(t.storage_offset()))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape) if self.shape else sympy.Integer(1)

    @property
    def is_symbolic(self) -> bool:
        return any(not s.is_Integer for s in (*self.shape, *self.stride))

    def concrete_shape(self) -> tuple[int, ...]:
        return tuple(_concrete(s, "size") for s in self.shape)

    def concrete_stride(self) -> tuple[int, ...]:
        return tuple(_concrete(s, "stride") for s in self.stride)

    def sizes(self) -> tuple:
        """The shape as Python sees it: ints, and PyTorch SymInts for symbolic sizes."""
        if not self.is_symbolic:
            return self.concrete_shape()
        return tuple(self.shapes.to_symint(s) for s in self.shape)

    def strides(self) -> tuple:
        if not self.is_symbolic:
            return self.concrete_stride()
        return tuple(self.shapes.to_symint(s) for s in self.stride)

    def fake(self) -> torch.Tensor:
        """A meta tensor of this layout (a fake one of the ShapeContext where symbolic)."""
        if self.shapes is not None and self.is_symbolic:
            return self.shapes.fake(self.shape, self.stride, self.dtype, device=self.device)
        return torch.empty_strided(self.concrete_shape(), self.concrete_stride(),
                                   dtype=self.dtype, device="meta")

    def __str__(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        return f"{DTYPE_ABBR.get(self.dtype, str(self.dtype))}[{dims}]"


def _concrete(value: sympy.Expr, what: str) -> int:
    if not value.is_Integer:
        raise ShapeError(f"a {what} is symbolic ({value}) where a number is needed")
    return int(value)


@dataclasses.dataclass(eq=False)  # identity hash: nodes are graph vertices
class Node:
    op: str  # "placeholder" | "call" | "output"
    target: str  # op name for "call", the input's source name for "placeholder"
    args: tuple
    kwargs: dict[str, Any]
    meta: TensorMeta | None
    stack: tuple[SourceLine, ...] = ()
    users: list[Node] = dataclasses.field(default_factory=list, repr=False)
    index: int = -1  # position in the graph; set by Graph

    @property
    def metas(self) -> tuple[TensorMeta, ...]:
        """The metadata of each result (several for a tuple result, none for the output)."""
        metas = self.meta if isinstance(self.meta, tuple) else (self.meta,)
        return tuple(m for m in metas if m is not None)

    @property
    def requires_grad(self) -> bool:
        """Whether the value (any result, for a tuple of them) takes a gradient."""
        return any(m.requires_grad for m in self.metas)

    def inputs(self) -> Iterator[Node]:
        """The nodes this node reads, in argument order."""
        out: list[Node] = []
        _collect(self.args, out)
        if self.kwargs:
            _collect(self.kwargs, out)
        return iter(out)

    def __repr__(self) -> str:
        return f"%{self.index}"


def flatten_nodes(value: Any) -> list[Node]:
    """The Nodes in ``value`` (nested tuples/lists/dicts), in order."""
    out: list[Node] = []
    _collect(value, out)
    return out


def _collect(value: Any, out: list[Node]) -> None:
    # (Runs for every node a pass builds: one call per container, not per item.)
    if isinstance(value, Node):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, Node):
                out.append(item)
            elif isinstance(item, (tuple, list, dict)):
                _collect(item, out)
    elif isinstance(value, dict):
        _collect(tuple(value.values()), out)


def map_nodes(value: Any, fn: Callable[[Node], Any]) -> Any:
    """Rebuild ``value`` (nested tuples/lists/dicts) with every Node replaced by fn(node)."""
    if isinstance(value, Node):
        return fn(value)
    if isinstance(value, tuple):
        if type(value) is tuple and not any(isinstance(v, (Node, tuple, list, dict))
                                            for v in value):
            return value  # nothing to replace (immutable: the same tuple will do)
        return tuple(map_nodes(v, fn) for v in value)
    if isinstance(value, list):
        return [map_nodes(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_nodes(v, fn) for k, v in value.items()}
    return value


def format_arg(value: Any) -> str:
    if isinstance(value, Node):
        return repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(format_arg(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_arg(v) for v in value) + "]"
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


class Graph:
    def __init__(self, name: str = "graph", shapes: ShapeContext | None = None,
                 derived: bool = False) -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.shapes = shapes  # the ShapeContext when sizes are symbolic (shapes.py), else None
        # Made by the compiler (a backward graph), not captured from the user's program: an
        # error eager would raise in one of its unused calls is no error the user's program
        # raises, so passes may drop any call nothing reads (passes/cleanup.py).
        self.derived = derived

    # -- building ---------------------------------------------------------------------------

    def _append(self, node: Node) -> Node:
        node.index = len(self.nodes)
        self.nodes.append(node)
        for inp in node.inputs():
            inp.users.append(node)
        return node

    def placeholder(self, name: str, meta: TensorMeta) -> Node:
        return self._append(Node("placeholder", name, (), {}, meta))

    def call(self, target: str, args: tuple, kwargs: dict[str, Any] | None = None,
             meta: TensorMeta | None = None, stack: tuple[SourceLine, ...] = ()) -> Node:
        return self._append(Node("call", target, tuple(args), dict(kwargs or {}), meta, stack))

    def output(self, values: Sequence[Node]) -> Node:
        return self._append(Node("output", "output", (tuple(values),), {}, None))

    # -- reading ----------------------------------------------------------------------------

    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node:
        assert self.nodes and self.nodes[-1].op == "output", "graph has no output node"
        return self.nodes[-1]

    @property
    def outputs(self) -> tuple[Node, ...]:
        return self.output_node.args[0]

    def calls(self) -> Iterable[Node]:
        return (n for n in self.nodes if n.op == "call")

    def device_types(self) -> set[str]:
        """The device types of the graph's tensors (inputs, and tensors made in it)."""
        return {m.device.type for n in self.nodes for m in n.metas}

    def verify(self) -> None:
        """Check the invariants every pass must keep; raise AssertionError on the first break."""
        seen: set[int] = set()
        for i, node in enumerate(self.nodes):
            assert node.index == i, f"node {node!r} has index {node.index}, position {i}"
            for inp in node.inputs():
                assert id(inp) in seen, f"{node!r} reads {inp!r} before it is defined"
                assert node in inp.users, f"{inp!r} does not list its user {node!r}"
            if node.op in ("placeholder", "call"):
                assert node.meta is not None, f"{node!r} ({node.target}) has no meta"
            if node.op == "output":
                assert i == len(self.nodes) - 1, "output is not the last node"
            seen.add(id(node))
        for node in self.nodes:
            for user in node.users:
                assert id(user) in seen and node in list(user.inputs()), (
                    f"{node!r} lists stale user {user!r}")
        assert self.nodes and self.nodes[-1].op == "output", "graph has no output node"

    def __str__(self) -> str:
        params = ", ".join(f"{n.target}: {n.meta}" for n in self.placeholders)
        lines = [f"{self.name}({params}):"]
        if self.shapes is not None:  # the size symbols, where they come from
            lines += [f"    # {s} = {where.name}  (dynamic; traced with {self.shapes.hints[s]})"
                      for s, where in self.shapes.sources.items()]
        for n in self.nodes:
            if n.op == "placeholder":
                lines.append(f"    %{n.index} = placeholder {n.target} : {n.meta}")
            elif n.op == "call":
                parts = [format_arg(a) for a in n.args]
                parts += [f"{k}={format_arg(v)}" for k, v in n.kwargs.items()]
                meta = (f"({', '.join(str(m) for m in n.meta)})" if isinstance(n.meta, tuple)
                        else str(n.meta))
                text = f"    %{n.index} = {n.target}({', '.join(parts)}) : {meta}"
                if n.stack:
                    text = f"{text:<48}  # {n.stack[-1]}"
                lines.append(text)
            else:
                lines.append(f"    return {format_arg(n.args[0])}")
        return "\n".join(lines)


def ancestors(nodes: Iterable[Node]) -> set[Node]:
    """``nodes`` and every node they depend on."""
    found: set[Node] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if node not in found:
            found.add(node)
            todo.extend(node.inputs())
    return found


def copy_graph(graph: Graph, rewrite: Callable[[Graph, Node, Callable], Node | None],
               drop: Collection[Node] = ()) -> Graph:
    """Copy ``graph``; ``rewrite(new_graph, node, remap)`` may emit nodes and return the one
    standing for ``node`` (None: copied as is; ``remap`` maps old values to the new graph).
    Calls in ``drop`` are not copied (nothing copied may read them)."""
    new = Graph(graph.name, graph.shapes, graph.derived)
    env: dict[Node, Node] = {}

    def remap(value: Any) -> Any:
        return map_nodes(value, env.__getitem__)

    for node in graph.nodes:
        if node in drop:
            continue
        if node.op == "placeholder":
            env[node] = new.placeholder(node.target, node.meta)
        elif node.op == "output":
            new.output(remap(node.args[0]))
        else:
            replaced = rewrite(new, node, remap)
            if replaced is None:
                replaced = new.call(node.target, remap(node.args), remap(node.kwargs),
                                    node.meta, node.stack)
            env[node] = replaced
    return new


# -- JSON: a graph stored in a warm entry (runtime/entries.py) --------------------------------


def graph_to_json(graph: Graph) -> dict:
    """``graph`` as JSON data (source lines left out); ValueError for what it cannot encode
    (a symbolic size, an argument of another type)."""
    nodes = [[n.op, n.target, *map(_encode, (n.args, n.kwargs, n.meta))] for n in graph.nodes]
    return {"name": graph.name, "derived": graph.derived, "nodes": nodes}


def _encode(value: Any) -> Any:
    if isinstance(value, Node):
        return {"node": value.index}
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, sympy.Integer):
        return int(value)
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}  # (JSON has no inf)
    if type(value) in (tuple, list):
        items = [_encode(v) for v in value]
        return {"tuple": items} if type(value) is tuple else items
    if type(value) is dict and all(type(k) is str for k in value):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, TensorMeta) and not value.is_symbolic and value.storage_offset.is_Integer:
        return {"meta": [list(value.concrete_shape()), list(value.concrete_stride()),
                         _encode(value.dtype), str(value.device), value.requires_grad,
                         int(value.storage_offset)]}
    raise ValueError(f"a {type(value).__name__} ({value}) has no JSON form")
