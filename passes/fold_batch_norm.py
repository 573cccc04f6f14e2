"""An eval-mode batch norm after a convolution is folded into the convolution's weight and
bias (Inductor's freezing does the same): ``conv(x, w * s[:, None, ...]) + (b - mean) * s +
beta`` with ``s = gamma / sqrt(var + eps)``, one library call and no per-element work after
it.  The folding reads only parameters and buffers, so passes/hoist_params.py makes it run
once.

Folded where the convolution (any dims, any groups) is read by the batch norm alone, with
parameters for weight and bias; the batch norm uses its running statistics, all its
tensors parameters or buffers; and the graph takes no gradient.  The arithmetic runs in
float32 (float64 for float64) and the result is cast once to the convolution's dtype, as
Inductor's freezing does; the result keeps the layout eager gives the batch norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.library_layouts import BATCH_NORMS, CONVOLUTIONS
from minicompile.ops import infer_meta

from minicompile.passes.decompose_reductions import bind
from minicompile.passes.layout import same_layout

CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
# F.batch_norm's order; torch.batch_norm puts weight and bias before the statistics.
BN_ARGS = {"torch.nn.functional.batch_norm": ("input", "running_mean", "running_var", "weight",
                                              "bias", "training", "momentum", "eps"),
           "torch.batch_norm": ("input", "weight", "bias", "running_mean", "running_var",
                                "training", "momentum", "eps", "cudnn_enabled")}
BN_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def _foldable(bn: Node, state: set[Node]) -> dict[str, Any] | None:
    """The batch norm's and its convolution's arguments by name, where they fold."""
    if bn.target not in BATCH_NORMS:
        return None
    a = bind(bn.args, bn.kwargs, BN_ARGS[bn.target], BN_DEFAULTS)
    conv = a["input"]
    if (a["training"] is not False or not isinstance(conv, Node) or conv.op != "call"
            or conv.target not in CONVOLUTIONS or conv.users != [bn]):
        return None  # (a convolution also read elsewhere must be computed anyway)
    c = bind(conv.args, conv.kwargs, CONV_ARGS, {"bias": None})
    meta = conv.meta
    if not (isinstance(meta, TensorMeta) and meta.dtype.is_floating_point
            and isinstance(c["weight"], Node) and c["weight"].meta.ndim == meta.ndim):
        return None
    params = (c["weight"], c["bias"], a["running_mean"], a["running_var"], a["weight"],
              a["bias"])
    required = (c["weight"], a["running_mean"], a["running_var"])
    if any(p is None for p in required) or any(p is not None and p not in state
                                               for p in params):
        return None  # not parameters: folding would add work to every call
    channels = meta.shape[1]
    if any(p is not None and tuple(p.meta.shape) != (channels,) for p in params[1:]):
        return None
    return {"conv": conv, "conv_args": c, "eps": float(a["eps"]), "weight": a["weight"],
            "bias": a["bias"], "mean": a["running_mean"], "var": a["running_var"]}


def _fold(new: Graph, bn: Node, f: dict[str, Any], remap: Callable) -> Node:
    """The convolution with folded weight and bias, standing for ``bn``."""
    conv, c = f["conv"], f["conv_args"]
    device = conv.meta.device

    def emit(op: str, *args: Any, **kwargs: Any) -> Node:
        meta = infer_meta(op, args, kwargs, device, new.shapes)
        return new.call(op, args, kwargs, meta, bn.stack)

    dtypes = {p.meta.dtype for p in (c["weight"], f["mean"], f["var"])}
    opmath = torch.float64 if torch.float64 in dtypes else torch.float32

    def up(p: Node) -> Node:
        p = remap(p)
        return p if p.meta.dtype == opmath else emit("to_dtype", p, dtype=opmath)

    def down(t: Node, dtype: torch.dtype) -> Node:
        return t if dtype == opmath else emit("to_dtype", t, dtype=dtype)

    scale = emit("rsqrt", emit("add", up(f["var"]), f["eps"]))
    if f["weight"] is not None:
        scale = emit("mul", scale, up(f["weight"]))
    shift = emit("neg", up(f["mean"]))
    if c["bias"] is not None:
        shift = emit("sub", up(c["bias"]), up(f["mean"]))
    shift = emit("mul", shift, scale)
    if f["bias"] is not None:
        shift = emit("add", shift, up(f["bias"]))
    weight = c["weight"]
    per_channel = emit("reshape", scale, (weight.meta.shape[0],) + (1,) * (weight.meta.ndim - 1))
    folded = down(emit("mul", up(weight), per_channel), weight.meta.dtype)
    shift = down(shift, conv.meta.dtype)
    args, kwargs = list(remap(conv.args)), dict(remap(conv.kwargs))
    for k, name, value in ((1, "weight", folded), (2, "bias", shift)):
        if len(args) > k:
            args[k] = value
        else:
            kwargs[name] = value
    meta = infer_meta(conv.target, tuple(args), kwargs, device, new.shapes)
    out = new.call(conv.target, tuple(args), kwargs, meta, conv.stack)
    if not same_layout(out.meta, bn.meta):
        out = emit("to_eager_layout", out, tuple(int(s) for s in bn.meta.stride))
    return out


def fold_batch_norms(graph: Graph, state: frozenset[int]) -> tuple[Graph, str]:
    """``graph`` with its foldable batch norms folded (or ``graph`` itself), and what was
    folded, for the logs ("" where nothing)."""
    placeholders = graph.placeholders
    params = {placeholders[k] for k in state}
    folds = {n: f for n in graph.calls() if (f := _foldable(n, params)) is not None}
    if not folds:
        return graph, ""

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        return _fold(new, node, folds[node], remap) if node in folds else None

    convs = {f["conv"] for f in folds.values()}
    folded = copy_graph(graph, rewrite, drop=convs)
    return folded, f"{len(folds)} batch norms folded into their convolutions"
