"""On CUDA, a linear layer whose result only pointwise ops read (through views, if any) is
computed without its bias, and the bias add joins the fused kernel of those ops, as
Inductor's ``unfuse_bias_add_to_pointwise`` does.  The add then costs nothing (the fused
kernel reads the product anyway), and cuBLAS picks faster kernels for a plain product than
for one with a bias epilogue (a nanoGPT forward under CUDA graphs on an H100: 0.44 ms with
``addmm``, 0.42 split).  A layer read by anything else (a library call, a reduction, the
graph's output) keeps its bias: there the add would be a pass over memory of its own.

Only for inference: a layer whose result takes a gradient keeps the one library call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph

LINEAR = "torch.nn.functional.linear"
ADDMM = "torch.addmm"
_POINTWISE = frozenset({"unary", "binary", "ternary", "cast"})
DEVICES = frozenset({"cuda"})  # where cuBLAS's plain products are the faster ones


def _only_pointwise_reads(node: Node) -> bool:
    """Every reader of ``node`` is a pointwise op, or a view only pointwise ops read."""
    for user in node.users:
        family = ops.OPS[user.target].family if user.op == "call" else "output"
        if family == "view":
            if not _only_pointwise_reads(user):
                return False
        elif family not in _POINTWISE:
            return False
    return bool(node.users)


def _splits(node: Node) -> bool:
    meta = node.meta
    if (not isinstance(meta, TensorMeta) or meta.device.type not in DEVICES
            or node.requires_grad or not meta.dtype.is_floating_point):
        return False
    if node.target == LINEAR:
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        plain = len(node.args) + len(node.kwargs) == 3 and set(node.kwargs) <= {"bias"}
    elif node.target == ADDMM:
        bias = node.args[0]
        plain = len(node.args) == 3 and not node.kwargs  # beta = alpha = 1
    else:
        return False
    return (plain and isinstance(bias, Node) and bias.meta.ndim == 1
            and bias.meta.dtype == meta.dtype and _only_pointwise_reads(node))


def split_bias_epilogues(graph: Graph) -> Graph:
    """See the module's doc."""
    split = {n for n in graph.calls() if n.target in (LINEAR, ADDMM) and _splits(n)}
    if not split:
        return graph
    mm = ops.extern_op(torch.mm)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in split:
            return None
        if node.target == LINEAR:
            x, w = remap(node.args[:2])
            bias = remap(node.args[2] if len(node.args) > 2 else node.kwargs["bias"])
            product = new.call(LINEAR, (x, w, None), {}, node.meta, node.stack)
        else:
            bias, x, w = remap(node.args)
            product = new.call(mm, (x, w), {}, node.meta, node.stack)
        return new.call("add", (product, bias), {}, node.meta, node.stack)

    return copy_graph(graph, rewrite)
