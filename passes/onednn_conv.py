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
against 0.032-0.037, 576 <-> 144 channels, one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat, ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.passes.conv_gemm import DEFAULTS, PARAMS, pair
from minicompile.passes.decompose_reductions import bind
from minicompile.passes.hoist_params import parameter_values
from minicompile.passes.layout import (CHANNELS_LAST, CONV2D, convolutions, dense_strides,
                                       same_layout, static)
from minicompile.runtime import onednn


def _channels_last(meta: TensorMeta) -> bool:
    wanted = dense_strides(meta.shape, CHANNELS_LAST)
    return same_layout(meta, TensorMeta(meta.shape, wanted, meta.dtype, meta.device))


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
    if not all(isinstance(t, Node) and isinstance(t.meta, TensorMeta) and static(t.meta)
               and t.meta.dtype == torch.float32 for t in tensors):
        return None
    if (not isinstance(meta, TensorMeta) or meta.device.type != "cpu" or x.meta.ndim != 4
            or w.meta.ndim != 4 or w not in params or not isinstance(a["groups"], int)):
        return None  # (a weight computed each call would be packed each call)
    sizes = {k: pair(a[k]) for k in ("padding", "stride", "dilation")}
    if None in sizes.values():
        return None  # a string padding ("same")
    return {**a, **sizes}


def wants_channels_last(graph: Graph, state: frozenset[int]) -> bool:
    """Whether ``graph`` has 2-d convolutions and oneDNN may run each on a packed weight."""
    convs = convolutions(graph)
    params = parameter_values(graph, state)
    return bool(convs) and all(packable(c, params) is not None for c in convs)


def _relu_of(conv: Node) -> Node | None:
    """The ``where(lt(conv, 0), 0, conv)`` a ReLU of ``conv`` decomposes to, where nothing
    else reads ``conv`` (oneDNN then applies it as the convolution writes), else None."""
    users = set(conv.users)
    where = next((u for u in users if u.target == "where"), None)
    if len(users) != 2 or len(conv.users) != 2 or where is None:
        return None
    (lt,) = users - {where}
    if (lt.target != "lt" or lt.args != (conv, 0) or lt.users != [where] or lt.kwargs
            or where.args != (lt, 0, conv) or where.kwargs):
        return None
    return where


def pack_convolutions(graph: Graph, state: frozenset[int]) -> tuple[Graph, str]:
    """``graph`` with its packable channels-last convolutions on packed weights, a ReLU
    after one applied by it (or ``graph`` itself), and what was done, for the logs (""
    where nothing)."""
    params = parameter_values(graph, state)
    found = {n: a for n in graph.calls() if (a := packable(n, params)) is not None
             and _channels_last(a["input"].meta) and _channels_last(n.meta)
             and n.meta.shape[2] * n.meta.shape[3] > 1}
    if not found:
        return graph, ""
    relus = {where: conv for conv in found if (where := _relu_of(conv)) is not None}
    pack, conv = ops.extern_op(onednn.pack_conv2d_weight), ops.extern_op(onednn.conv2d)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node in relus:
            return remap(relus[node])  # (the convolution applies it)
        if node not in found:
            return None
        a = found[node]
        w = a["weight"].meta
        contiguous = dense_strides(w.shape, tuple(range(4)))  # (the packed weight has none)
        sizes = (a["padding"], a["stride"], a["dilation"], a["groups"])
        input_size = tuple(int(s) for s in a["input"].meta.shape)
        packed = new.call(pack, (remap(a["weight"]), *sizes, input_size), {},
                          TensorMeta(w.shape, contiguous, w.dtype, w.device), node.stack)
        attr = "relu" if node in relus.values() else "none"
        return new.call(conv, (remap(a["input"]), packed, remap(a["bias"]), *sizes, attr), {},
                        node.meta, node.stack)

    lts = [where.args[0] for where in relus]
    return (copy_graph(graph, rewrite, drop=lts),
            f"{len(found)} convolutions on packed oneDNN weights, {len(relus)} with their ReLU")
