"""On CUDA, a linear layer whose result only pointwise ops read (through views, if any) is
computed without its bias, and the bias add joins the fused kernel of those ops, as
Inductor's ``unfuse_bias_add_to_pointwise`` does.  The add then costs nothing (the fused
kernel reads the product anyway), and cuBLAS picks faster kernels for a plain product than
for one with a bias epilogue (a nanoGPT forward under CUDA graphs on an H100: 0.44 ms with
``addmm``, 0.42 split).  A layer read by anything else (a library call, a reduction, the
graph's output) keeps its bias: there the add would be a pass over memory of its own.

Convolutions on CUDA too, where pointwise ops or reductions read the result (Inductor's
convolution lowering does the same): ATen's cuDNN path adds the bias in a kernel of its
own after the convolution, so the split add, fused into the next kernel, saves a pass
over the result (timm convnext_atto: 40 elementwise kernels a call).

Only for inference: a layer whose result takes a gradient keeps the one library call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.library_layouts import CONVOLUTIONS
from minicompile.ops import infer_meta

from minicompile.passes.decompose_reductions import bind
from minicompile.passes.fold_batch_norm import CONV_ARGS

LINEAR = "torch.nn.functional.linear"
ADDMM = "torch.addmm"
_POINTWISE = frozenset({"unary", "binary", "ternary", "cast"})
DEVICES = frozenset({"cuda"})  # where cuBLAS's plain products are the faster ones


def _only_pointwise_reads(node: Node, fused: frozenset[str] = _POINTWISE) -> bool:
    """Every reader of ``node`` is a pointwise op (a family of ``fused``), or a view only
    such ops read."""
    for user in node.users:
        family = ops.OPS[user.target].family if user.op == "call" else "output"
        if family == "view":
            if not _only_pointwise_reads(user, fused):
                return False
        elif family not in fused:
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
    elif node.target in CONVOLUTIONS:
        bias = bind(node.args, node.kwargs, CONV_ARGS, {"bias": None})["bias"]
        return (isinstance(bias, Node) and bias.meta.ndim == 1 and bias.meta.dtype == meta.dtype
                and _only_pointwise_reads(node, _POINTWISE | {"reduction"}))
    else:
        return False
    return (plain and isinstance(bias, Node) and bias.meta.ndim == 1
            and bias.meta.dtype == meta.dtype and _only_pointwise_reads(node))


def split_bias_epilogues(graph: Graph) -> Graph:
    """See the module's doc."""
    split = {n for n in graph.calls() if _splits(n)}
    if not split:
        return graph
    mm = ops.extern_op(torch.mm)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in split:
            return None
        if node.target in CONVOLUTIONS:
            return _split_conv(new, node, remap)
        if node.target == LINEAR:
            x, w = remap(node.args[:2])
            bias = remap(node.args[2] if len(node.args) > 2 else node.kwargs["bias"])
            product = new.call(LINEAR, (x, w, None), {}, node.meta, node.stack)
        else:
            bias, x, w = remap(node.args)
            product = new.call(mm, (x, w), {}, node.meta, node.stack)
        return new.call("add", (product, bias), {}, node.meta, node.stack)

    return copy_graph(graph, rewrite)


def _split_conv(new: Graph, node: Node, remap: Callable) -> Node:
    """``conv(x, w, None, ...) + b.reshape(C, 1, ...)`` standing for ``node``."""
    args, kwargs = list(remap(node.args)), dict(remap(node.kwargs))
    if len(args) > 2:
        bias, args[2] = args[2], None
    else:
        bias = kwargs.pop("bias")
    product = new.call(node.target, tuple(args), kwargs, node.meta, node.stack)
    shape = (bias.meta.shape[0],) + (1,) * (node.meta.ndim - 2)
    column = new.call("reshape", (bias, shape), {},
                      infer_meta("reshape", (bias, shape), {}, bias.meta.device, new.shapes),
                      node.stack)
    return new.call("add", (product, column), {}, node.meta, node.stack)
