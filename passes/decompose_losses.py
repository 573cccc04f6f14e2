"""Classification losses (``nll_loss``, ``cross_entropy``) rewritten into prims: a log_softmax,
a ``gather`` of each target's class (a bounds-checked indirect load) and reductions, which
fuse into one kernel.  The rules follow ATen (aten/src/ATen/native/LossNLL.cpp): ignored
targets count zero, "mean" divides by the summed weights of the targets not ignored (0/0 =
nan when all are), with ATen's label smoothing terms and probability-target formula.
Anything else (legacy ``size_average``/``reduce``, empty inputs, odd dtypes) stays a
library call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Node
from minicompile.passes.decompose_reductions import NOT_HANDLED, Builder, _softmax, bind

REDUCTIONS = ("none", "mean", "sum")


def _class_dim(x: Node) -> int:
    return 0 if x.meta.ndim == 1 else 1


def _total(b: Builder, x: Node) -> Node:
    """``x.sum()`` as ATen writes it: in x's dtype (bool sums to int64; float16/bfloat16
    accumulate in float32 and round once); a 0-dim tensor is its own sum."""
    return x if x.meta.ndim == 0 else b("sum", x, tuple(range(x.meta.ndim)), False)


def _sum_all(b: Builder, x: Node) -> Node:
    """The sum of every element, accumulated in float32 for float16/bfloat16."""
    return _total(b, b.opmath(x))


def _broadcast_weight(b: Builder, weight: Node, x: Node) -> Node:
    """A [C] weight viewed as [1, C, 1, ...] for an input ``x`` of [N, C, d1, ...]."""
    if x.meta.ndim == 1:
        return weight
    for _ in range(x.meta.ndim - 2):
        weight = b("unsqueeze", weight, weight.meta.ndim)
    return b("unsqueeze", weight, 0)


def _pick_class(b: Builder, v: Node, class_dim: int, index: Node) -> Node:
    """``v`` at class ``index[...]`` for every target position: a gather along the class
    dim, whose bounds check rejects targets outside [0, C) as eager does."""
    picked = b("gather", v, class_dim, b("unsqueeze", index, class_dim))
    return b("squeeze", picked, class_dim)


def _valid_inputs(x: Node, target: Node, weight: Any) -> bool:
    """The forms the rules compute exactly; eager's own errors are left to eager."""
    if not isinstance(x, Node) or not isinstance(target, Node):
        return False
    if not x.meta.dtype.is_floating_point or x.meta.ndim == 0:
        return False
    shape = tuple(int(s) for s in x.meta.shape)
    if math.prod(shape) == 0:
        return False  # empty batches and zero classes: left to eager
    if weight is not None:
        if not isinstance(weight, Node) or weight.meta.dtype != x.meta.dtype:
            return False
        if tuple(int(s) for s in weight.meta.shape) != (shape[_class_dim(x)],):
            return False
    return True


def _class_target_ok(x: Node, target: Node) -> bool:
    shape = tuple(int(s) for s in x.meta.shape)
    del_class = shape[:_class_dim(x)] + shape[_class_dim(x) + 1:]
    return target.meta.dtype == torch.int64 and tuple(int(s) for s in target.meta.shape) == del_class


def _nll(b: Builder, logp: Node, target: Node, weight: Node | None, ignore_index: int,
         reduction: str) -> Node:
    """ATen's nll_loss forward on log-probabilities ``logp`` (any float dtype; the per
    element loss is computed in that dtype, sums accumulate in float32 or wider)."""
    cdim = _class_dim(logp)
    ignored = b("eq", target, ignore_index)
    # Ignored targets read class 0 (always in range) and are masked below; any other
    # target out of [0, C) still reaches gather's bounds check and raises.
    safe = b("where", ignored, 0, target)
    loss = _pick_class(b, logp, cdim, safe)
    target_weight = None
    if weight is not None:
        full = b("expand", _broadcast_weight(b, weight, logp), tuple(logp.meta.shape))
        target_weight = _pick_class(b, full, cdim, safe)
        loss = b("mul", loss, target_weight)
    loss = b("where", ignored, 0.0, b("neg", loss))
    if reduction == "none":
        return loss
    total = _sum_all(b, loss)
    if reduction == "sum":
        return b.restore(total)
    if target_weight is None:
        counted = b("to_dtype", b("logical_not", ignored), dtype=total.meta.dtype)
    else:
        counted = b("where", ignored, 0.0, b.opmath(target_weight))
    return b.restore(b("truediv", total, _sum_all(b, counted)))


def _loss_args(args: tuple, kwargs: dict, names: tuple[str, ...],
               defaults: dict[str, Any]) -> dict | None:
    a = bind(args, kwargs, names, {"weight": None, "size_average": None, "ignore_index": -100,
                                   "reduce": None, "reduction": "mean", **defaults})
    if a["size_average"] is not None or a["reduce"] is not None:
        return None  # the legacy spelling of reduction: left to eager
    if a["reduction"] not in REDUCTIONS or not isinstance(a["ignore_index"], int):
        return None
    if not _valid_inputs(a["input"], a["target"], a["weight"]):
        return None
    return a


NLL_NAMES = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")


def _nll_loss(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = _loss_args(args, kwargs, NLL_NAMES, {})
    if a is None or not _class_target_ok(a["input"], a["target"]):
        return NOT_HANDLED
    return _nll(b, a["input"], a["target"], a["weight"], a["ignore_index"], a["reduction"])


def _log_softmax(b: Builder, x: Node) -> Node:
    return _softmax(True)(b, x, _class_dim(x))


def _smoothing_terms(b: Builder, logp: Node, target: Node, weight: Node | None,
                     ignore_index: int, reduction: str) -> Node:
    """ATen's ``cross_entropy_loss_label_smoothing`` "ret": minus the (weighted) sum of
    every class's log-probability per target position, zero where ignored, reduced."""
    cdim = _class_dim(logp)
    if weight is not None:
        logp = b("mul", logp, _broadcast_weight(b, weight, logp))
    smooth = b("neg", b("sum", logp, (cdim,), False))
    ignored = b("eq", target, ignore_index)
    smooth = b("where", ignored, 0.0, smooth)
    if reduction == "none":
        return smooth
    total = _total(b, smooth)
    if reduction == "sum":
        return total
    if weight is None:  # divided by the number of targets not ignored (an int64 count)
        return b("truediv", total, _total(b, b("logical_not", ignored)))
    safe = b("where", ignored, 0, target)
    full = b("expand", _broadcast_weight(b, weight, logp), tuple(logp.meta.shape))
    target_weight = b("where", ignored, 0.0, _pick_class(b, full, cdim, safe))
    return b("truediv", total, _total(b, target_weight))


def _prob_target_loss(b: Builder, logp: Node, target: Node, weight: Node | None,
                      reduction: str, smoothing: float) -> Node:
    """ATen's ``cross_entropy_loss_prob_target``: -(logp * target * weight) summed over
    classes (none), or over everything (sum), divided by N * d1 * ... (mean)."""
    cdim = _class_dim(logp)
    n_classes = int(logp.meta.shape[cdim])
    if smoothing > 0.0:
        target = b("add", b("mul", target, 1 - smoothing), smoothing / n_classes)
    prod = b("mul", logp, target)
    if weight is not None:
        prod = b("mul", prod, _broadcast_weight(b, weight, logp))
    if reduction == "none":
        return b("neg", b("sum", prod, (cdim,), False))
    total = b("neg", _total(b, prod))
    if reduction == "sum":
        return total
    return b("truediv", total, math.prod(int(s) for s in logp.meta.shape) // n_classes)


CE_NAMES = NLL_NAMES + ("label_smoothing",)


def _cross_entropy(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = _loss_args(args, kwargs, CE_NAMES, {"label_smoothing": 0.0})
    if a is None:
        return NOT_HANDLED
    x, target, weight = a["input"], a["target"], a["weight"]
    smoothing = float(a["label_smoothing"])
    if not 0.0 <= smoothing <= 1.0:
        return NOT_HANDLED  # eager raises
    if target.meta.shape == x.meta.shape:  # class probabilities
        if target.meta.dtype != x.meta.dtype or a["ignore_index"] >= 0:
            return NOT_HANDLED
        return _prob_target_loss(b, _log_softmax(b, x), target, weight, a["reduction"],
                                 smoothing)
    if not _class_target_ok(x, target):
        return NOT_HANDLED
    logp = _log_softmax(b, x)
    nll = _nll(b, logp, target, weight, a["ignore_index"], a["reduction"])
    if smoothing == 0.0:
        return nll
    ret = _smoothing_terms(b, logp, target, weight, a["ignore_index"], a["reduction"])
    n_classes = int(x.meta.shape[_class_dim(x)])
    return b("add", b("mul", nll, 1 - smoothing), b("mul", ret, smoothing / n_classes))


LOSS_DECOMPOSITIONS: dict[str, Callable[..., Node | None]] = {
    "torch.nn.functional.nll_loss": _nll_loss,
    "torch.nn.functional.cross_entropy": _cross_entropy,
}
