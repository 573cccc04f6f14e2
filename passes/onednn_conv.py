"""Inference 2-d convolutions of parameters on the CPU run through oneDNN on a weight packed
once (Inductor's freezing does the same; minicompile/runtime/onednn.py says what it
measured): ``F.conv2d(x, w, b, ...)`` becomes ``conv2d(x, pack_conv2d_weight(w, ...), b,
...)``, and passes/hoist_params.py takes the packing out of the graph, to run again only
when a parameter changes.

A convolution is packable (:func:`packable`) where PyTorch has oneDNN, the convolution runs
on the CPU in float32 with static sizes and no gradient, its weight is computed from
parameters and buffers alone (a folded batch norm's, say), and its padding, stride and
dilation are numbers.  oneDNN is fastest on channels-last activations: passes/layout.py
lays a graph out channels-last on the CPU where :func:`wants_channels_last`, and this pass
packs only convolutions whose input and result are channels-last, and not those of one
pixel an image (a squeeze-excite block's), where ``F.conv2d`` was the faster (0.010-0.016 ms
against 0.032-0.037, 576 <-> 144 channels, one thread), nor the small 1x1 ones that
passes/conv_gemm.py made products of pixel rows before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat, ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.meta_rules import int_tuple
from minicompile.passes.conv_gemm import DEFAULTS, PARAMS
from minicompile.passes.decompose_reductions import bind
from minicompile.passes.hoist_params import parameter_values
from minicompile.passes.layout import CONV2D, channels_last, convolutions, dense_strides
from minicompile.runtime import onednn


def packable(node: Node, params: set[Node]) -> dict[str, Any] | None:
    """The convolution's arguments by name (padding, stride, dilation as pairs) where it
    may run on a packed weight (see the module's docstring), else None."""
    if (node.target not in CONV2D or node.requires_grad or len(node.args) > len(PARAMS)
            or compat.onednn_convolution() is None):
        return None
    a = bind(node.args, node.kwargs, PARAMS, DEFAULTS)
    if set(a) != set(PARAMS):
        return None  # an argument this pass does not know
    x, w, bias, meta = a["input"], a["weight"], a["bias"], node.meta
    tensors = [x, w] + ([bias] if bias is not None else [])
    if not all(isinstance(t, Node) and isinstance(t.meta, TensorMeta) and not t.meta.is_symbolic
               and t.meta.dtype == torch.float32 for t in tensors):
        return None
    if (not isinstance(meta, TensorMeta) or meta.device.type != "cpu" or x.meta.ndim != 4
            or w.meta.ndim != 4 or w not in params or not isinstance(a["groups"], int)):
        return None  # (a weight computed each call would be packed each call)
    sizes = {k: int_tuple(a[k], 2) for k in ("padding", "stride", "dilation")}
    if None in sizes.values():
        return None  # a string padding ("same")
    return {**a, **sizes}


def wants_channels_last(graph: Graph, state: frozenset[int]) -> bool:
    """Whether ``graph`` has 2-d convolutions and oneDNN may run each on a packed weight."""
    convs = convolutions(graph)
    params = parameter_values(graph, state)
    return bool(convs) and all(packable(c, params) is not None for c in convs)


def _scaled(weight: Node) -> tuple[Node, Node, list[Node]] | None:
    """``weight`` as (w, scale, its nodes) where it is ``w * scale`` of float32, one scale
    per output channel (a folded batch norm's), maybe copied channels-last, read by the
    convolution alone: pack_conv2d_weight multiplies straight into its layout."""
    nodes = [weight]
    if weight.target == "to_channels_last" and len(weight.users) == 1:
        weight = weight.args[0]
        nodes.append(weight)
    if (weight.target != "mul" or len(weight.users) != 1 or weight.kwargs
            or not all(isinstance(a, Node) for a in weight.args)):
        return None
    w, scale = weight.args
    shape = tuple(weight.meta.shape)
    if (any(t.meta.dtype != torch.float32 for t in (w, scale, weight))
            or tuple(w.meta.shape) != shape or tuple(scale.meta.shape) != (shape[0], 1, 1, 1)):
        return None
    return w, scale, nodes


def _activation(conv: Node) -> tuple[Node, str, list, list[Node]] | None:
    """The activation that alone reads ``conv``, for oneDNN to apply as the convolution
    writes: (the node it stands for, oneDNN's name for it, its scalars, the nodes of it
    that go), else None.  Only SiLU, decomposed by then (passes/decompose.py):
    ``truediv(conv, add(exp(neg(conv)), 1.0))``.  oneDNN's ReLU and clip (hardtanh,
    ReLU6) write 0 for a NaN, where eager keeps it, so those stay kernels of their own;
    hardswish, decomposed too, is a ``where`` chain oneDNN is not given."""
    users = conv.users
    if len(users) != 2 or len(set(users)) != 2 or any(u.kwargs for u in users):
        return None
    by_op = {u.target: u for u in users}
    if set(by_op) == {"neg", "truediv"} and len(by_op["neg"].users) == 1:
        neg, div = by_op["neg"], by_op["truediv"]
        (exp,) = neg.users
        add = exp.users[0] if exp.target == "exp" and len(exp.users) == 1 else None
        if (add is not None and add.target == "add" and add.args == (exp, 1.0)
                and add.users == [div] and div.args == (conv, add) and not add.kwargs):
            return div, "swish", [], [neg, exp, add]
    return None


def pack_convolutions(graph: Graph, state: frozenset[int]) -> tuple[Graph, str]:
    """``graph`` with its packable channels-last convolutions on packed weights, the
    activation after one applied by it (or ``graph`` itself), and what was done, for the
    logs ("" where nothing)."""
    params = parameter_values(graph, state)
    found = {n: a for n in graph.calls() if (a := packable(n, params)) is not None
             and channels_last(a["input"].meta) and channels_last(n.meta)
             and n.meta.shape[2] * n.meta.shape[3] > 1}
    if not found:
        return graph, ""
    acts = {conv: act for conv in found if (act := _activation(conv)) is not None}
    scaled = {a["weight"]: s for a in found.values() if (s := _scaled(a["weight"])) is not None}
    applied = {act[0]: conv for conv, act in acts.items()}
    pack, conv = ops.extern_op(onednn.pack_conv2d_weight), ops.extern_op(onednn.conv2d)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node in applied:
            return remap(applied[node])  # (the convolution applies it)
        if node not in found:
            return None
        a = found[node]
        w = a["weight"].meta
        contiguous = dense_strides(w.shape, tuple(range(4)))  # (the packed weight has none)
        sizes = (a["padding"], a["stride"], a["dilation"], a["groups"])
        input_size = tuple(int(s) for s in a["input"].meta.shape)
        weight = (a["weight"],) if a["weight"] not in scaled else scaled[a["weight"]][:2]
        packed = new.call(pack, (remap(weight[0]), *sizes, input_size, *map(remap, weight[1:])),
                          {}, TensorMeta(w.shape, contiguous, w.dtype, w.device), node.stack)
        _, attr, scalars, _ = acts.get(node, (None, "none", [], []))
        args = (remap(a["input"]), packed, remap(a["bias"]), *sizes, attr, tuple(scalars))
        return new.call(conv, args, {}, node.meta, node.stack)

    gone = [n for act in acts.values() for n in act[3]] + [n for s in scaled.values()
                                                            for n in s[2]]
    names = ", ".join(sorted({act[1] for act in acts.values()}))
    return (copy_graph(graph, rewrite, drop=gone),
            f"{len(found)} convolutions on packed oneDNN weights, {len(acts)} applying the "
            f"activation after them{f' ({names})' if names else ''}")
