"""Layout optimization: convolutions run channels-last where that is faster.

cuDNN's tensor-core convolutions read and write channels-last (NHWC) memory; given eager's
contiguous tensors it transposes each input and output itself.  Like Inductor's
``layout_optimization``, :func:`decide` chooses once per graph and :func:`optimize_layout`
rewrites it: each 2-d convolution reads a channels-last input and weight (a
``to_channels_last`` copy where needed), every later node takes the layout PyTorch's rules
give it from its inputs (its meta inferred again), and each graph output or random call's
argument whose layout changed is copied back to eager's strides (``to_eager_layout``,
fused into the kernel that computes it; dropout draws in memory order).  A library call
that reads strides (:data:`READS_STRIDES`) keeps the whole graph in eager's layout.

``cfg.layout_opt``: "off"; "channels_last" for any graph with a 2-d convolution (how the
CPU tests force it); "auto" for CUDA inference graphs, with Inductor's FLOP-weighted
heuristic, and for CPU graphs of packed oneDNN weights or of a mobile network's
convolutions (:func:`mobile`).  Runs on the prim graph before the backward is derived.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy

from minicompile import ops
from minicompile.config import LAYOUT_OPTS as MODES
from minicompile.errors import Unsupported
from minicompile.graph import Graph, Node, TensorMeta, flatten_nodes, map_nodes

CONV2D = frozenset({"torch.nn.functional.conv2d", "torch.conv2d"})
# Library calls whose values depend on their argument's strides, not only on its values:
# given a channels-last tensor where eager has a contiguous one, they would compute
# something else, so a graph that feeds one a moved value keeps eager's layout.
READS_STRIDES = frozenset({"torch.as_strided", "torch.Tensor.as_strided", "torch.Tensor.view",
                           "torch.Tensor.data_ptr", "torch.Tensor.stride"})
CHANNELS_LAST = (0, 2, 3, 1)
# Inductor's measured channels-last speedups (time ratio, < 1 faster) of convolution kinds
# in inference (by :func:`_kind`), weighted by each kind's share of the graph's FLOPs.
SPEEDUPS = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}


def convolutions(graph: Graph) -> list[Node]:
    """The 2-d convolutions of batched 4-d floating-point inputs (those the pass moves)."""
    return [n for n in graph.calls() if n.target in CONV2D and len(n.args) >= 2
            and all(isinstance(a, Node) and isinstance(a.meta, TensorMeta) and a.meta.ndim == 4
                    and a.meta.dtype.is_floating_point for a in n.args[:2])]


def decide(graph: Graph, mode: str, packed: bool = False) -> tuple[bool, str]:
    """Whether to run ``graph``'s convolutions channels-last, and why (for the logs).
    ``packed``: every convolution will run on a packed oneDNN weight (passes/onednn_conv.py)."""
    if mode not in MODES:
        raise ValueError(f"layout_opt must be one of {MODES}, not {mode!r}")
    if mode == "off":
        return False, ""
    convs = convolutions(graph)
    if not convs:
        return False, ""  # nothing to say
    if mode == "channels_last":
        return True, "layout_opt is 'channels_last'"
    hints = graph.shapes.hints if graph.shapes is not None else {}
    if any(c.meta.device.type != "cuda" for c in convs):
        if packed:
            return True, "oneDNN's convolutions on packed weights are fastest channels-last"
        if mobile(convs, hints):
            return True, "oneDNN's depthwise convolutions are faster channels-last"
        return False, "convolutions on CPU keep eager's layout (layout_opt 'auto')"
    if len(graph.nodes) >= 300 * len(convs):
        return False, "few convolutions for the size of the graph"
    kinds = {c: _kind(c, hints) for c in convs}
    if any(n.requires_grad for n in graph.outputs):
        # cuDNN's channels-last weight gradients differed from eager's NCHW ones by up to
        # 0.6% of the largest gradient (resnet18, float32, TF32 off; not investigated):
        # training keeps eager's layout unless asked ("channels_last").
        return False, "graphs with a backward keep eager's layout under 'auto'"
    flops = {c: _flops(c, hints) for c in convs}  # inference: weigh each kind by its FLOPs
    weighted = sum(flops[c] * SPEEDUPS[kinds[c]] for c in convs)
    if weighted > sum(flops.values()):
        return False, "grouped convolutions would be slower channels-last"
    return True, "convolutions on CUDA run faster channels-last"


def mobile(convs: list[Node], hints: dict) -> bool:
    """A mobile network's convolutions (MobileNet, EfficientNet): some depthwise (one filter
    a channel), the others depthwise, 1x1, or a stem (at most 4 input channels).  On the
    CPU oneDNN runs those faster channels-last, by more the more threads.  A train step
    with this rule over one without it (one process, interleaved): on 16 threads
    mobilenetv3_small 0.55, efficientnet_b0 0.84, mobilenet_v2 0.66; on one thread (CPU
    time) 0.98, 1.02, 0.97.  Forced channels-last, graphs with dense k x k convolutions
    lost: resnet18 1.6-1.9 of its time, resnext26ts 1.2-1.4, densenet121 1.2 (their
    weights are transposed each step, and oneDNN's channels-last 3x3 on few pixels is
    slower)."""
    def kind(conv: Node) -> str:
        x, w = conv.args[0].meta, conv.args[1].meta
        c_in, per_group = _number(x.shape[1], hints), _number(w.shape[1], hints)
        if per_group == 1 and c_in > 1 and _number(w.shape[0], hints) % c_in == 0:
            return "depthwise"
        if all(_number(k, hints) == 1 for k in w.shape[2:]) or c_in <= 4:
            return "pointwise or stem"
        return "dense"

    kinds = [kind(c) for c in convs]
    return "depthwise" in kinds and "dense" not in kinds


def _number(value: sympy.Expr, hints: dict) -> int:
    """A size or stride as a number: its traced value where it is symbolic."""
    value = sympy.sympify(sympy.sympify(value).xreplace(hints))
    return int(value) if value.is_Integer else 1


def _kind(conv: Node, hints: dict) -> str:
    """Inductor's classes of convolutions (graph.py, ``decide_layout_opt``)."""
    x, w = conv.args[0].meta, conv.args[1].meta
    c_out, c_in, kh = (_number(s, hints) for s in w.shape[:3])
    groups = max(1, _number(x.shape[1], hints) // max(c_in, 1))
    if groups > 1 and c_in > 1:
        return "grouped"
    if c_out <= 64 and c_in <= 64:
        return "small"
    if c_out * 2 <= c_in and kh > 1:
        return "in_out"
    return "default"


def _flops(conv: Node, hints: dict) -> int:
    w = conv.args[1].meta
    per_output = _number(sympy.Mul(*w.shape[1:]), hints)
    return 2 * per_output * _number(conv.meta.numel(), hints)


# -- the rewrite ----------------------------------------------------------------------------


def dense_strides(shape: tuple, order: tuple[int, ...]) -> tuple:
    """The strides of a dense tensor of ``shape`` whose dims lie in memory in ``order``
    (outermost first), as ``torch.empty_permuted`` makes them."""
    stride: list[Any] = [None] * len(shape)
    running: Any = sympy.Integer(1)
    for d in reversed(order):
        stride[d] = running
        running = running * shape[d]
    return tuple(stride)


def plain(stride: tuple) -> tuple:
    """Strides as a call's argument: ints, sympy expressions where symbolic."""
    return tuple(int(s) if sympy.sympify(s).is_Integer else s for s in stride)


def overlaps(meta: TensorMeta, hints: dict) -> bool:
    """Whether two elements of ``meta``'s layout share memory (an expanded view): no copy
    can be written in those strides."""
    dims = sorted((d for d, n in enumerate(meta.shape) if _number(n, hints) != 1),
                  key=lambda d: (_number(meta.stride[d], hints), _number(meta.shape[d], hints)))
    span = 1
    for d in dims:
        if _number(meta.stride[d], hints) < span:
            return True
        span = _number(meta.stride[d], hints) * _number(meta.shape[d], hints)
    return False


def same_layout(a: TensorMeta, b: TensorMeta) -> bool:
    """Equal strides along every dim longer than 1 (the others are never stepped along)."""
    return all(n == 1 or sympy.expand(x - y) == 0
               for n, x, y in zip(a.shape, a.stride, b.stride))


def contiguous(meta: TensorMeta) -> bool:
    """Row-major (along every dim longer than 1)."""
    row_major = dense_strides(meta.shape, tuple(range(meta.ndim)))
    return same_layout(meta, dataclasses.replace(meta, stride=row_major))


def channels_last(meta: TensorMeta) -> bool:
    """A 4-d tensor laid out NHWC (along every dim longer than 1)."""
    return meta.ndim == 4 and same_layout(
        meta, dataclasses.replace(meta, stride=dense_strides(meta.shape, CHANNELS_LAST)))


def _metas(meta: Any) -> tuple:
    return meta if isinstance(meta, tuple) else (meta,)


class _Rewrite:
    def __init__(self, graph: Graph, packed: bool = False) -> None:
        self.graph = graph
        self.packed = packed  # oneDNN packs the weights (passes/onednn_conv.py): keep them
        self.new = Graph(graph.name, graph.shapes, graph.derived)
        self.hints = graph.shapes.hints if graph.shapes is not None else {}
        self.moved: set[Node] = set()  # new nodes whose layout differs from the original's
        self.original: dict[Node, Node] = {}  # new node -> the node it stands for
        self.copies: dict[tuple, Node] = {}  # (op, args) -> its node (relayout)
        self.convs = set(convolutions(graph))

    def relayout(self, op: str, args: tuple, stack: tuple) -> Node:
        """``op`` (a layout copy, or a view) of ``args``, once per op and arguments."""
        key = (op, args)
        if key not in self.copies:
            x = args[0]
            meta = ops.infer_meta(op, args, {}, x.meta.device, self.graph.shapes)
            meta = dataclasses.replace(meta, requires_grad=x.meta.requires_grad)
            self.copies[key] = self.new.call(op, args, {}, meta, stack)
        return self.copies[key]

    def channels_last(self, x: Node, stack: tuple, weight: bool = False) -> Node:
        wanted = dense_strides(x.meta.shape, CHANNELS_LAST)
        if all(sympy.expand(a - b) == 0 for a, b in zip(x.meta.stride, wanted)):
            return x
        n, c, *spatial = x.meta.shape
        if all(s == 1 for s in spatial) and c != 1 and not (weight and self.packed):
            return self.pixel_rows(x, stack)
        if same_layout(x.meta, dataclasses.replace(x.meta, stride=wanted)):
            return x  # channels-last along every dim longer than 1
        return self.relayout("to_channels_last", (x,), stack)

    def pixel_rows(self, x: Node, stack: tuple) -> Node:
        """A tensor of one pixel (a 1x1 weight, a squeeze-excite's means) viewed with
        channels-last strides.  Its memory is the same either way, but PyTorch reads the
        layout a convolution runs in off the strides of every dim: given a contiguous 1x1
        weight, oneDNN ran a squeeze-excite's convolutions in its blocked NCHW format, with
        reorders, and their weight gradients took 4.6 ms of mobilenetv3_small's train step on
        16 threads against 0.3 ms channels-last (``torch.backends.mkldnn.verbose``)."""
        n, c = x.meta.shape[:2]
        rows = self.relayout("reshape", (x, (n, 1, 1, c)), stack)
        return self.relayout("permute", (rows, (0, 3, 1, 2)), stack)

    def call(self, node: Node, args: tuple, kwargs: dict) -> Node:
        convolution = node.target in CONV2D and node in self.convs
        if convolution:
            # cuDNN's tensor-core kernels want NHWC input and weight.
            args = (self.channels_last(args[0], node.stack),
                    self.channels_last(args[1], node.stack, weight=True), *args[2:])
        meta = node.meta
        moved = any(a in self.moved for a in flatten_nodes((args, kwargs)))
        if moved and node.target in READS_STRIDES:
            raise Unsupported(f"{node.target} reads the strides of a value that moved")
        if moved and node.target in ops.RANDOM_EXTERNS:
            # The generator fills a result in memory order: eager's layout, eager's draws.
            args, kwargs = map_nodes((args, kwargs), self.eager_layout)
            moved = False
        if convolution or moved:
            device = _metas(meta)[0].device
            inferred = ops.infer_meta(node.target, args, kwargs, device, self.graph.shapes)
            meta = tuple(dataclasses.replace(m, requires_grad=old.requires_grad)
                         for m, old in zip(_metas(inferred), _metas(node.meta)))
            meta = meta if isinstance(node.meta, tuple) else meta[0]
        new = self.new.call(node.target, args, kwargs, meta, node.stack)
        self.original[new] = node
        if any(tuple(m.stride) != tuple(old.stride)
               for m, old in zip(_metas(meta), _metas(node.meta))):
            self.moved.add(new)
        return new

    def run(self) -> Graph:
        env: dict[Node, Node] = {}
        for node in self.graph.nodes:
            if node.op == "placeholder":
                env[node] = self.new.placeholder(node.target, node.meta)
            elif node.op == "call":
                remap = lambda v: map_nodes(v, lambda n: env[n])  # noqa: E731
                env[node] = self.call(node, remap(node.args), remap(node.kwargs))
            else:
                self.new.output(tuple(self.eager_layout(env[out]) for out in node.args[0]))
        return self.new

    def eager_layout(self, new: Node) -> Node:
        """A value in the strides eager gives it (a graph output, a random call's
        argument): copied back where it moved (in the kernel that computes it)."""
        if new not in self.moved:
            return new
        old = self.original[new]
        if overlaps(old.meta, self.hints):
            raise Unsupported(f"output {old!r} is an expanded view (strides "
                              f"{tuple(old.meta.stride)}) of a value that moved")
        return self.relayout("to_eager_layout", (new, plain(old.meta.stride)), old.stack)


def optimize_layout(graph: Graph, mode: str, packed: bool = False) -> tuple[Graph, str]:
    """``graph`` with its convolutions run channels-last where :func:`decide` says so (else
    ``graph`` itself), and the reason, for the logs ("" where there is nothing to say:
    no convolution, or layout_opt 'off')."""
    use, reason = decide(graph, mode, packed)
    if not use:
        return graph, reason and f"eager layout: {reason}"
    try:
        return _Rewrite(graph, packed).run(), f"channels-last convolutions: {reason}"
    except (Unsupported, RuntimeError, ValueError, TypeError) as e:
        return graph, f"eager layout: could not lay the graph out channels-last ({e})"
