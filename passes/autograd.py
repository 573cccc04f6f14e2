"""Training: derive the backward graph of a prim graph, and partition the work.

``differentiate(graph)`` walks the forward graph from its outputs back, one derivative
rule per op (``passes/derivatives.py``), and returns a :class:`Joint`: the forward graph
with the values the backward needs appended to its outputs, and the backward graph (inputs:
those saved values and the outputs' gradients; outputs: the inputs' gradients).  Both take
the ordinary road; ``minicompile/runtime/autograd.py`` runs them as an autograd.Function.

The partition (AOTAutograd's min-cut idea): graph inputs are saved by reference;
reductions, index ops and library calls are saved; cheap pointwise and view values are
recomputed in the backward kernels when that reads at most ``MAX_RECOMPUTE_READS`` large
tensors, except, on the CPU, a library call's inputs (written out by the forward anyway).
Library calls are differentiated by PyTorch: the forward calls them through
``record`` and the backward calls ``vjp`` on the saved result; concatenation is the
exception (its gradient is slices of the incoming one, fused like any view).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from minicompile import compat, ops
from minicompile.errors import Unsupported
from minicompile.graph import Graph, Node, TensorMeta, copy_graph, flatten_nodes, map_nodes

from minicompile.passes.derivatives import (
    LIBRARY_RULES,
    RULES,
    TUPLE_RULES,
    add_gradients,
    cat_rule,
    custom_op_rule,
)
from minicompile.passes.layout import channels_last, overlaps

RECORD = "minicompile.runtime.autograd.record"
VJP = "minicompile.runtime.autograd.vjp"
CUSTOM_OP = "minicompile.runtime.custom_op_grads.custom_op_grads"
RECOMPUTABLE = frozenset({"unary", "binary", "ternary", "cast", "copy", "view", "iota"})
MAX_RECOMPUTE_READS = 2


@dataclasses.dataclass
class Joint:
    """A forward graph and its backward.

    The forward's outputs are the user's ``num_outputs`` values, then the saved values.
    The backward's inputs are, in order, what ``backward_inputs`` names: ``("input", k)``
    (forward placeholder k), ``("saved", j)`` (saved value j) or ``("grad", i)`` (the
    gradient of forward output i).  ``input_grads[k]`` says what forward placeholder k gets:
    an index into the backward's outputs, ``"zero"`` (it is reached, but every path to it
    has a zero derivative) or None (no gradient: it does not require one, or no output
    depends on it)."""

    forward: Graph
    backward: Graph
    num_outputs: int
    backward_inputs: tuple[tuple[str, int], ...]
    input_grads: tuple[int | str | None, ...]
    differentiable: tuple[bool, ...]  # per user output: does it take a gradient?
    saved_bytes: int  # of the saved values (inputs excluded), at the traced sizes
    saved_input_bytes: int


def requires_grad(graph: Graph) -> bool:
    """Whether any output of ``graph`` takes a gradient (then it trains)."""
    return any(n.requires_grad for n in graph.outputs)


def differentiate(graph: Graph) -> Joint:
    d = Differentiator(graph)
    grads: dict[Node, Node] = {}
    reached: set[Node] = set()

    def accumulate(node: Node, g: Node | None) -> None:
        reached.add(node)
        if g is None:
            return
        if g.meta.dtype != node.meta.dtype and node.meta.dtype.is_floating_point:
            g = d("to_dtype", g, dtype=node.meta.dtype)
        grads[node] = add_gradients(d, grads[node], g) if node in grads else g

    for i, out in enumerate(graph.outputs):
        if out.requires_grad:
            accumulate(out, d.grad_output(i, out))
    for node in reversed(graph.nodes):
        if node.op != "call" or node not in grads and node not in d.item_grads:
            continue
        d.origin = node
        if node.target == "getitem":  # one result of a library call with several
            source, i = node.args
            d.item_grads.setdefault(source, {})[i] = grads.pop(node)
            continue
        g = grads.pop(node, None)
        for arg, ga in d.rule(node, g):
            if isinstance(arg, Node) and arg.requires_grad:
                accumulate(arg, ga)
    placeholders = graph.placeholders
    results: list[Node] = []
    input_grads: list[int | str | None] = []
    for ph in placeholders:
        if ph in grads:
            g = grads[ph]
            if tuple(g.meta.shape) != tuple(ph.meta.shape):
                raise Unsupported(f"internal: gradient of {ph.target} has shape "
                                  f"{tuple(g.meta.shape)}, not {tuple(ph.meta.shape)}")
            if _gapped(g.meta):  # a slice of a larger gradient (F.pad's): eager's is a new
                # tensor, in its input's memory format (row-major, or channels-last)
                g = d("to_eager_layout", g, tuple(ph.meta.stride) if channels_last(ph.meta)
                      else _row_major(ph.meta.shape))
            input_grads.append(len(results))
            results.append(g)
        else:
            input_grads.append("zero" if ph in reached and ph.meta.requires_grad else None)
    d.b.output(results)
    forward = d.forward_graph()
    saved_inputs = [placeholders[k] for kind, k in d.sources if kind == "input"]
    return Joint(
        forward=forward,
        backward=d.b,
        num_outputs=len(graph.outputs),
        backward_inputs=tuple(d.sources),
        input_grads=tuple(input_grads),
        differentiable=tuple(out.requires_grad for out in graph.outputs),
        saved_bytes=sum(_bytes(n.meta, graph) for n in d.saved),
        saved_input_bytes=sum(_bytes(n.meta, graph) for n in saved_inputs),
    )


class Differentiator:
    """Builds the backward graph; what derivative rules call (see passes/derivatives.py)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.b = Graph(f"{graph.name}_backward", graph.shapes, derived=True)
        self.origin: Node | None = None
        self.env: dict[Node, Node] = {}  # forward node -> its value in the backward
        self.sources: list[tuple[str, int]] = []
        self.saved: list[Node] = []
        self.recorded: dict[Node, tuple[int, ...]] = {}  # library calls -> differentiable args
        self.item_grads: dict[Node, dict[int, Node]] = {}  # tuple results' items' gradients
        self.recompute = plan_recompute(graph)
        self.index = {id(n): k for k, n in enumerate(graph.placeholders)}
        self.record, self.vjp, self.custom_op = (
            ops.extern_op(ops.resolve_path(f)) for f in (RECORD, VJP, CUSTOM_OP))

    # -- what rules call ----------------------------------------------------------------

    def __call__(self, op: str, *args: Any, **kwargs: Any) -> Node:
        assert self.origin is not None
        meta = ops.infer_meta(op, args, kwargs, _device(self.origin), self.b.shapes)
        return self.b.call(op, args, kwargs, _no_grad(meta), self.origin.stack)

    def extern(self, fn: Any, *args: Any, **kwargs: Any) -> Node:
        return self(ops.extern_op(fn), *args, **kwargs)

    def item(self, call: Node, j: int) -> Node:
        """Result ``j`` of ``call``, a library call with a tuple of results."""
        assert self.origin is not None
        return self.b.call("getitem", (call, j), {}, call.meta[j], self.origin.stack)

    def needs(self, x: Any) -> bool:
        return isinstance(x, Node) and x.requires_grad

    def fwd(self, x: Node) -> Node:
        """The forward value ``x`` in the backward graph: an input, a saved value, or
        recomputed there from those."""
        if x in self.env:
            return self.env[x]
        if x.op == "placeholder":
            value = self.b.placeholder(f"saved_{x.target}", _no_grad(x.meta))
            self.sources.append(("input", self.index[id(x)]))
        elif self.recompute.get(x, False):
            args = map_nodes(x.args, self.fwd)
            kwargs = map_nodes(x.kwargs, self.fwd)
            value = self.b.call(x.target, args, kwargs, _no_grad(x.meta), x.stack)
        else:
            value = self.b.placeholder(f"saved_{len(self.saved)}", _no_grad(x.meta))
            self.sources.append(("saved", len(self.saved)))
            self.saved.append(x)
        self.env[x] = value
        return value

    def grad_output(self, i: int, out: Node) -> Node:
        """The incoming gradient of forward output ``i``, laid out row-major (the runtime
        makes it so)."""
        meta = out.meta
        stride = _row_major(meta.shape)
        g = self.b.placeholder(f"grad_{i}", dataclasses.replace(
            meta, stride=stride, storage_offset=sympy.Integer(0), requires_grad=False))
        self.sources.append(("grad", i))
        return g

    # -- one node -------------------------------------------------------------------------

    def rule(self, node: Node, g: Node) -> list[tuple[Any, Node | None]]:
        """(argument, gradient) pairs for ``node``'s tensor arguments."""
        family = ops.OPS[node.target].family
        if node.target in RULES:
            return list(zip(node.args, RULES[node.target](self, node, g)))
        cat = ops.cat_arguments(node) if node.target in ops.CAT_OPS else None
        stack = node.target == "torch.stack"
        if cat is not None and all(t.meta.ndim == node.meta.ndim - stack or not stack
                                   and tuple(t.meta.shape) == (0,) and not t.requires_grad
                                   for t in cat[0]):
            # (a legacy empty 1-d piece, which torch.cat skips, is ours if it takes no
            # gradient: a KV cache's first step; else PyTorch's)
            return list(zip(cat[0], cat_rule(self, node, g, cat[0], cat[1], stack)))
        if node.target in LIBRARY_RULES and not isinstance(node.meta, tuple):
            pairs = LIBRARY_RULES[node.target](self, node, g)
            if pairs is not None:
                return pairs
        if node.target in TUPLE_RULES and isinstance(node.meta, tuple):
            pairs = TUPLE_RULES[node.target](self, node, self.item_grads.get(node, {}))
            if pairs is not None:
                del self.item_grads[node]
                return pairs
        if family == "extern":
            return custom_op_rule(self, node, g) or self.library_call(node, g)
        raise Unsupported(f"no derivative rule for {node.target}", node.stack)

    def library_call(self, node: Node, g: Node) -> list[tuple[Any, Node | None]]:
        """PyTorch differentiates the call: ``vjp`` of its recorded result (for a tuple
        of results, of the items that take gradients, with theirs)."""
        if isinstance(node.meta, tuple):
            items = self.item_grads.pop(node, {})
            getters = {u.args[1]: u for u in node.users if u.target == "getitem"}
            keys = sorted(k for k in items if k in getters)
            result: Any = tuple(self.fwd(getters[k]) for k in keys)
            g = tuple(items[k] for k in keys)  # type: ignore[assignment]
        else:
            result = self.fwd(node)
        tensors = flatten_nodes((node.args, node.kwargs))
        diff = tuple(k for k, t in enumerate(tensors) if t.requires_grad)
        self.recorded[node] = diff
        assert self.origin is not None
        call = self.b.call(self.vjp, (result, g), {}, _grad_metas(tensors, diff),
                           self.origin.stack)
        return [(tensors[k], self.item(call, j)) for j, k in enumerate(diff)]

    def custom_op_grads(self, node: Node, diff: tuple[int, ...], g: Node) -> Node:
        """The gradients of a custom op's call for its tensors at ``diff``, by the op's
        own backward (runtime/custom_op_grads.py) on the saved arguments and result."""
        assert self.origin is not None
        args = (node.target, diff, g, self.fwd(node), *map_nodes(node.args, self.fwd))
        metas = _grad_metas(flatten_nodes((node.args, node.kwargs)), diff)
        return self.b.call(self.custom_op, args, map_nodes(node.kwargs, self.fwd), metas,
                           self.origin.stack)

    # -- the forward ----------------------------------------------------------------------

    def forward_graph(self) -> Graph:
        """The forward graph: library calls that need PyTorch's backward go through
        ``record``; the saved values are appended to the outputs."""
        def rewrite(new: Graph, node: Node, remap: Any) -> Node | None:
            if node not in self.recorded:
                return None
            meta = node.meta
            stride = () if isinstance(meta, tuple) else tuple(meta.stride)
            args = (node.target, self.recorded[node], stride, *remap(node.args))
            return new.call(self.record, args, remap(node.kwargs), meta, node.stack)

        forward = copy_graph(self.graph, rewrite)
        env = dict(zip(self.graph.nodes, forward.nodes))
        out = forward.nodes.pop()  # the output node, rebuilt with the saved values
        for inp in out.inputs():
            inp.users.remove(out)
        forward.output(tuple(out.args[0]) + tuple(env[n] for n in self.saved))
        return forward


def plan_recompute(graph: Graph) -> dict[Node, bool]:
    """Which pointwise and view values the backward computes again instead of saving."""
    large: dict[Node, frozenset] = {}  # the large saved tensors recomputing a node reads
    plan: dict[Node, bool] = {}
    for node in graph.nodes:
        if node.op != "call" or isinstance(node.meta, tuple):
            continue
        if ops.OPS[node.target].family not in RECOMPUTABLE or _library_input(node):
            plan[node] = False
            continue
        size = _elements(node.meta, graph)
        reads: set = set()
        for arg in node.inputs():
            reads |= large[arg] if plan.get(arg, False) else {arg}
        reads = {r for r in reads  # what is small beside this value costs little to read
                 if not isinstance(r.meta, tuple) and _elements(r.meta, graph) * 4 >= size}
        plan[node] = len(reads) <= MAX_RECOMPUTE_READS
        large[node] = frozenset(reads)
    return plan


def _library_input(node: Node) -> bool:
    """Whether ``node`` is a CPU value that a library call of the forward reads: the forward
    writes it out anyway, so saving it costs memory only, while recomputing it cost the
    backward a kernel that reads its sources and writes it again (on the GPU, where memory
    binds first, it is recomputed as before)."""
    meta = node.meta
    return meta.device.type == "cpu" and meta.ndim > 0 and any(
        u.op == "call" and ops.OPS[u.target].family == "extern" for u in node.users)


def _grad_stride(meta: Any) -> tuple:
    """The strides a library call's gradient is read with: its input's, which PyTorch's
    backward kernels usually give it (attention's q, k, v gradients are slices of one
    buffer, as q, k, v are), or row-major where those overlap (an expanded input).  The
    wrapper copies a gradient that comes in other strides (``with_layout``)."""
    if meta.is_symbolic or overlaps(meta, {}):  # symbolic, or an expanded input
        return _row_major(meta.shape)
    return tuple(meta.stride)


def _gapped(meta: TensorMeta) -> bool:
    """Whether a tensor of static sizes has gaps between its elements (a slice of a larger
    one): neither dense nor overlapping."""
    return not (meta.is_symbolic or overlaps(meta, {})
                or compat.prims_common().is_non_overlapping_and_dense_or_false(meta.fake()))


def _row_major(shape: tuple) -> tuple:
    stride: list = []
    running: Any = sympy.Integer(1)
    for size in reversed(shape):
        stride.append(running)
        running = running * (max(int(size), 1) if size.is_Integer else size)
    return tuple(reversed(stride))


def _grad_metas(tensors: list[Node], diff: tuple[int, ...]) -> tuple:
    """The metas of a library call's gradients for its tensors at ``diff``."""
    return tuple(_no_grad(dataclasses.replace(
        tensors[k].meta, stride=_grad_stride(tensors[k].meta),
        storage_offset=sympy.Integer(0))) for k in diff)


def _no_grad(meta: Any) -> Any:
    if isinstance(meta, tuple):
        return tuple(_no_grad(m) for m in meta)
    return dataclasses.replace(meta, requires_grad=False) if meta.requires_grad else meta


def _device(node: Node) -> torch.device:
    meta = node.meta
    return (meta[0] if isinstance(meta, tuple) else meta).device


def _elements(meta: TensorMeta, graph: Graph) -> int:
    n = meta.numel()
    if not n.is_Integer and graph.shapes is not None:
        n = n.xreplace(graph.shapes.hints)
    return int(n) if n.is_Integer else 1


def _bytes(meta: TensorMeta, graph: Graph) -> int:
    return _elements(meta, graph) * meta.dtype.itemsize
