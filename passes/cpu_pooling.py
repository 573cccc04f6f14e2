"""2-d max pooling of NCHW inputs on the CPU through ATen's channels-last kernel:
``F.max_pool2d(x, ...)`` becomes minicompile/runtime/pooling.py's ``max_pool2d(x, ...)``
(same arguments, same NCHW result, indices and gradient; that module says what it
measured).  Calls asking for the indices, of other layouts (a channels-last input is
already on the fast kernel) or dtypes, and on other devices are left alone, and so are
those taking a gradient of fewer than ``MIN_TRAIN_NUMEL`` input elements (or unknown
sizes): with one thread, 2x256x7x7 took 92 us a forward and backward in ATen's NCHW
kernel, 127 us on the channels-last one (its autograd.Function's Python, mostly), where
2x128x15x15 took 430 against 215 (the forward alone: 62 against 49, 322 against 99)."""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.passes.decompose_reductions import bind
from minicompile.passes.layout import contiguous
from minicompile.runtime import pooling

MAX_POOL2D = frozenset({"torch.nn.functional.max_pool2d", "torch.max_pool2d"})
MIN_TRAIN_NUMEL = 32768
NAMES = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
         "return_indices")


def _pooled_nchw(node: Node) -> bool:
    """Whether ``node`` is a CPU float max pool of an NCHW input, without indices."""
    if node.target not in MAX_POOL2D or len(node.args) > len(NAMES):
        return False
    a = bind(node.args, node.kwargs, NAMES, {"return_indices": False})
    x = a.get("input")
    if a["return_indices"] is not False or set(a) - set(NAMES) or not isinstance(x, Node):
        return False  # (the indices: another result)
    meta = x.meta
    if not (isinstance(meta, TensorMeta) and meta.device.type == "cpu" and meta.ndim == 4
            and meta.dtype in (torch.float32, torch.float64) and contiguous(meta)):
        return False
    numel = sympy.Mul(*meta.shape)
    return not x.requires_grad or bool(numel.is_Integer and numel >= MIN_TRAIN_NUMEL)


def pool_channels_last(graph: Graph) -> tuple[Graph, str]:
    """``graph`` with its CPU NCHW max pools on the channels-last kernel (or ``graph``
    itself), and what was done, for the logs ("" where nothing)."""
    found = {n for n in graph.calls() if _pooled_nchw(n)}
    if not found:
        return graph, ""
    target = ops.extern_op(pooling.max_pool2d)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in found:
            return None
        return new.call(target, remap(node.args), remap(node.kwargs), node.meta, node.stack)

    return copy_graph(graph, rewrite), f"{len(found)} max pools on the channels-last kernel"
