"""Matrix products whose result rows have an odd length write them padded to 16 bytes.

cuBLAS picks its fast kernels only where every leading dimension is a multiple of 16
bytes; GPT-2's LM head writes rows of 50257 bf16 logits (an ``align1`` kernel: 6.7 ms on an
H200 against 0.88 ms into aligned rows).  Such a product becomes the same library call
written into padded rows (``minicompile/runtime/gemm.py``), as Inductor's ``pad_mm``: fused
readers read the padded rows at no cost; a graph output is copied back to eager's strides
(``to_eager_layout``) only where the product has :data:`MIN_K` multiply-adds per element and
:data:`MIN_COPIED` elements; any other reader keeps the product as it is.

Only for inference and static sizes.  ``cfg.gemm_padding``: "auto" pads 16-bit float
products on CUDA; "on" any float product on any device (for the CPU tests); "off" never.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy
import torch

from minicompile import ops
from minicompile.config import GEMM_PADDINGS as MODES
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.passes.layout import contiguous
from minicompile.runtime import gemm

LINEAR, ADDMM, MM, MATMUL = ("torch.nn.functional.linear", "torch.addmm", "torch.mm",
                              "torch.matmul")
PADDED = frozenset({LINEAR, ADDMM, MM, MATMUL})
AUTO_DTYPES = frozenset({torch.float16, torch.bfloat16})
# Readers that read the product inside a fused kernel, by whatever strides it has.
FUSED_READERS = frozenset({"unary", "binary", "ternary", "cast", "reduction", "copy"})
MIN_K = 128  # multiply-adds per result element, where the result must be copied back
MIN_COPIED = 1 << 20  # result elements, where it must be copied back


def _plain_call(node: Node) -> tuple[Node, ...] | None:
    """The product's tensor arguments (input, weight[, bias]; [bias,] mat1, mat2; input,
    other) where the call is plain: no alpha/beta, a contiguous static input of two or more
    dims (and for matmul a matrix ``other``: one product of the input's rows)."""
    args = node.args + tuple(node.kwargs.values())
    if node.target == LINEAR:
        if set(node.kwargs) - {"bias"} or len(args) > 3:
            return None
        tensors = tuple(a for a in args if a is not None)
    elif node.target in (ADDMM, MM, MATMUL):
        if node.kwargs:
            return None
        tensors = args
        if node.target == MATMUL and (len(args) != 2 or not isinstance(args[1], Node)
                                      or args[1].meta.ndim != 2):
            return None  # (a batched product: bmm)
    else:
        return None
    if not all(isinstance(a, Node) and isinstance(a.meta, TensorMeta) and not a.meta.is_symbolic
               for a in tensors):
        return None
    x = tensors[1] if node.target == ADDMM else tensors[0]
    if x.meta.ndim < 2 or not contiguous(x.meta):
        return None
    return tensors


def _pads(node: Node, mode: str) -> bool:
    """Whether ``node``'s result is written into padded rows (see the module's doc)."""
    meta = node.meta
    if (not isinstance(meta, TensorMeta) or node.requires_grad or meta.ndim < 2
            or not meta.dtype.is_floating_point or meta.is_symbolic):
        return False
    if mode == "auto" and (meta.device.type != "cuda" or meta.dtype not in AUTO_DTYPES):
        return False  # (CPU BLAS and cuBLAS's float32 kernels: not measured)
    tensors = _plain_call(node)
    if tensors is None or not contiguous(meta):
        return False
    n, itemsize = int(meta.shape[-1]), meta.dtype.itemsize
    if gemm.padded_row(n, itemsize) == n or int(meta.numel()) == 0:
        return False  # rows already aligned
    readers = [u.op if u.op == "output" else ops.OPS[u.target].family for u in node.users]
    if not readers or any(r != "output" and r not in FUSED_READERS for r in readers):
        return False  # a view or a library call reads eager's strides
    if "output" in readers:
        k = int(tensors[1].meta.shape[1] if node.target == LINEAR
                else tensors[-2].meta.shape[-1])
        return k >= MIN_K and int(meta.numel()) >= MIN_COPIED
    return True


def pad_gemm_results(graph: Graph, mode: str) -> tuple[Graph, str]:
    """``graph`` with its products of odd rows written padded (or ``graph`` itself), and
    what was done, for the logs ("" where nothing)."""
    if mode not in MODES:
        raise ValueError(f"gemm_padding must be one of {MODES}, not {mode!r}")
    if mode == "off":
        return graph, ""
    padded = {n for n in graph.calls() if n.target in PADDED and _pads(n, mode)}
    if not padded:
        return graph, ""
    outputs = set(graph.outputs)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in padded:
            return None
        meta = node.meta
        n = int(meta.shape[-1])

        def pad(fn: Callable, t: Node) -> Node:  # a node of its own: hoisted for a weight
            op = ops.extern_op(fn)
            return new.call(op, (t,), {}, ops.infer_meta(op, (t,), {}, meta.device),
                            node.stack)

        tensors = remap(_plain_call(node))
        if node.target == LINEAR:
            (x, w, *bias), product = tensors, gemm.linear
            other = pad(gemm.pad_rows, w)
        else:
            *bias, x, other = tensors
            other, product = pad(gemm.pad_columns, other), gemm.matmul
        bias = bias[0] if bias else None
        if bias is not None and bias.meta.ndim and int(bias.meta.shape[-1]) == n:
            bias = pad(gemm.pad_columns, bias)  # (else it broadcasts over the columns)
        stride = gemm.padded_strides(tuple(int(d) for d in meta.shape), meta.dtype.itemsize)
        result = new.call(ops.extern_op(product), (x, other, bias, n), {},
                          dataclasses.replace(meta, stride=tuple(map(sympy.Integer, stride))),
                          node.stack)
        if node not in outputs:
            return result
        eager = tuple(int(s) for s in meta.stride)
        return new.call("to_eager_layout", (result, eager), {}, meta, node.stack)

    names = ", ".join(f"{n.target} {tuple(int(s) for s in n.meta.shape)}" for n in padded)
    return copy_graph(graph, rewrite), f"rows padded to 16 bytes: {names}"
