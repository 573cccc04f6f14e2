"""Reductions and normalisations, reached as library calls (extern ops), rewritten into
the reduction prims (ops.REDUCTION) and pointwise ops, so that fusion sees them: a softmax
or a layer norm becomes one kernel instead of a library call.

Each rule computes as PyTorch's own kernels do: float16/bfloat16 inputs are upcast to
float32 ("opmath"), reductions accumulate there, and the result is cast back once.
Forms a rule does not handle (matrix norms, max/min of bool...) return None and
stay library calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minicompile.errors import ShapeError
from minicompile.graph import Node
from minicompile.shapes import MIN_DYNAMIC_SIZE
from minicompile.sym import product

Builder = Any  # passes.decompose._Builder (kept loose to avoid an import cycle)
NOT_HANDLED = None


def bind(args: tuple, kwargs: dict, names: Sequence[str], defaults: dict[str, Any]) -> dict:
    """Arguments by parameter name, as Python would bind them (positional, then keyword)."""
    return {**defaults, **dict(zip(names, args)), **kwargs}


def _dims(dim: Any, ndim: int) -> tuple[int, ...]:
    """Normalised reduction dims; None or () means all.  A 0-dim tensor has no dims to
    name: its ``dim=0`` / ``dim=-1`` (which eager accepts) normalise to ``()``, all of it."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0) or ndim == 0:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted({d % ndim for d in dim}))


def _numel(x: Node, dims: tuple[int, ...]) -> Any:
    """Elements per reduced row: an int, or a sympy expression when sizes are symbolic."""
    n = product(x.meta.shape[d] for d in dims)
    return int(n) if n.is_Integer else n


def _reduce(b: Builder, op: str, x: Node, dims: tuple[int, ...], keepdim: bool) -> Node:
    if x.meta.ndim == 0:
        # A 0-dim tensor is a row of one element, reduced like any other: the result is a
        # new tensor of the reduction's dtype (bool for any/all, int64 for an integer sum),
        # never the input itself.  keepdim keeps no dims of a 0-dim input.
        return b(op, b("reshape", x, (1,)), (0,), False)
    return b(op, x, dims, keepdim)


def _plain(op: str, refuse: Callable[[Builder, Node], bool] | None = None,
           takes_dtype: bool = False) -> Callable[..., Node | None]:
    """``op`` over ``dim`` (None or (): all), the input cast to ``dtype`` first where the
    call takes one; ``refuse(b, x)``: the forms left to the library call."""

    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
        a = bind(args, kwargs, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False,
                                                             "dtype": None})
        x = a["input"]
        if refuse is not None and refuse(b, x):
            return NOT_HANDLED
        if takes_dtype and a["dtype"] is not None:
            x = b("to_dtype", x, dtype=a["dtype"])
        return _reduce(b, op, x, _dims(a["dim"], x.meta.ndim), a["keepdim"])

    return rule


def _empty(b: Builder, x: Node) -> bool:
    return _numel(x, tuple(range(x.meta.ndim))) == 0


def _mean(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False,
                                                         "dtype": None})
    x = a["input"]
    if a["dtype"] is not None:
        x = b("to_dtype", x, dtype=a["dtype"])
    if not x.meta.dtype.is_floating_point:
        return NOT_HANDLED  # eager raises; let it
    dims = _dims(a["dim"], x.meta.ndim)
    xf = b.opmath(x)
    out = b("truediv", _reduce(b, "sum", xf, dims, a["keepdim"]), _numel(x, dims))
    return b.restore(out)


def _global_avg_pool(rank: int) -> Callable[..., Node | None]:
    """``F.adaptive_avg_pool{rank}d(x, 1)``, every CNN's global average pool: a mean over
    the last ``rank`` dims, kept (ATen computes it as that mean, too).  In training its
    backward is then a broadcast divide fused into its consumer, not a library call
    recorded for PyTorch's autograd.  Other output sizes stay library calls."""

    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
        a = bind(args, kwargs, ("input", "output_size"), {})
        x, size = a.get("input"), a.get("output_size")
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * rank
        if set(a) != {"input", "output_size"} or sizes != (1,) * rank:
            return NOT_HANDLED
        if x.meta.ndim not in (rank + 1, rank + 2) or not x.meta.dtype.is_floating_point:
            return NOT_HANDLED  # eager raises: let it
        if _empty(b, x):
            return NOT_HANDLED
        return _mean(b, x, tuple(range(x.meta.ndim - rank, x.meta.ndim)), True)

    return rule


def _max_or_min(op: str) -> Callable[..., Node | tuple[Node, Node] | None]:
    """torch.max / torch.min: over everything (a 0-dim value), or along a dim as
    (values, indices), the tuple whose getitem users decompose.py rewires."""

    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | tuple[Node, Node] | None:
        if len(args) == 1 and not kwargs:
            x = args[0]
            if _empty(b, x) or b.requires_grad:
                return NOT_HANDLED  # (its gradient treats NaN apart: PyTorch's backward)
            return _reduce(b, op, x, tuple(range(x.meta.ndim)), False)
        a = bind(args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
        if not isinstance(a.get("dim"), int) or set(a) != {"input", "dim", "keepdim"}:
            return NOT_HANDLED  # max(x, y) is maximum; out= is not ours
        if not all(u.target == "getitem" for u in b.origin.users):
            return NOT_HANDLED  # the tuple itself is used: keep the library call
        if b.requires_grad:
            return NOT_HANDLED  # its gradient picks the index on ties: PyTorch's backward
        return _extreme_with_index(b, a["input"], op, a["dim"], a["keepdim"])

    return rule


def _extreme_with_index(b: Builder, x: Node, op: str, dim: int | None,
                        keepdim: bool) -> tuple[Node, Node] | None:
    """(values, indices) of the maximum (op "amax") or minimum ("amin") along ``dim`` (None:
    of the flattened input), as eager computes them: NaN counts as the extreme, and a tie
    gives the first index.  The index is amin(where(x == extreme, position, n)) over the
    row, with positions from an ``iota``: a second pass over the row of the same kernel."""
    dtype = x.meta.dtype
    if dtype == torch.bool or dtype.is_complex:
        return NOT_HANDLED
    if x.meta.ndim == 0:  # a row of one element; keepdim keeps no dims of a 0-dim input
        x, dim, keepdim = b("reshape", x, (1,)), 0, False
    elif dim is None:
        x = b("reshape", x, (_numel(x, tuple(range(x.meta.ndim))),))
        dim = 0
    dim %= x.meta.ndim
    n = int(x.meta.shape[dim])
    if n == 0:
        return NOT_HANDLED  # eager raises: no extreme of an empty row
    extreme = b(op, x, (dim,), True)
    match = b("eq", x, extreme)
    if dtype.is_floating_point:  # NaN != NaN: a NaN row extreme matches the NaNs
        both_nan = b("logical_and", b("ne", x, x), b("ne", extreme, extreme))
        match = b("logical_or", match, both_nan)
    position = b("iota", tuple(int(s) for s in x.meta.shape), dim, x.meta.device)
    index = b("amin", b("where", match, position, n), (dim,), keepdim)
    values = extreme if keepdim else b("squeeze", extreme, dim)
    return values, index


def _arg_extreme(op: str) -> Callable[..., Node | None]:
    """torch.argmax / torch.argmin, ``dim=None`` meaning the flattened input."""

    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
        a = bind(args, kwargs, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False})
        if set(a) != {"input", "dim", "keepdim"} or not (a["dim"] is None or
                                                          isinstance(a["dim"], int)):
            return NOT_HANDLED
        pair = _extreme_with_index(b, a["input"], op, a["dim"], a["keepdim"])
        if pair is None:
            return NOT_HANDLED
        index = pair[1]
        shape = tuple(int(s) for s in b.origin.meta.shape)
        if tuple(int(s) for s in index.meta.shape) != shape:  # keepdim of a flattened input
            index = b("reshape", index, shape)
        return index

    return rule


def _uint8(b: Builder, x: Node) -> bool:
    return x.meta.dtype == torch.uint8  # any/all on uint8 return uint8


def _centred(b: Builder, xf: Node, dims: tuple[int, ...], n: Any,
             keepdim: bool = True) -> tuple[Node, Node]:
    """``xf`` minus its mean over ``dims`` (``n`` elements), and the sum of its squares: two
    passes, numerically careful."""
    centred = b("sub", xf, b("truediv", b("sum", xf, dims, True), n))
    return centred, b("sum", b("mul", centred, centred), dims, keepdim)


def _normalized(b: Builder, xf: Node, dims: tuple[int, ...], n: Any, eps: float) -> Node:
    centred, squares = _centred(b, xf, dims, n)
    return b("mul", centred, b("rsqrt", b("add", b("truediv", squares, n), float(eps))))


def _affine(b: Builder, out: Node, weight: Any, bias: Any,
            view: Callable[[Node], Node] | None = None) -> Node:
    """``out * weight + bias`` (either None: left out), each seen through ``view``."""
    if weight is not None:
        out = b("mul", out, view(weight) if view else weight)
    if bias is not None:
        out = b("add", out, view(bias) if view else bias)
    return out


def _variance(b: Builder, x: Node, dims: tuple[int, ...], correction: float,
              keepdim: bool) -> Node:
    n = _numel(x, dims)
    centred, squares = _centred(b, b.opmath(x), dims, n, keepdim)
    if isinstance(n, int):
        denominator = max(n - correction, 0)
    elif correction <= MIN_DYNAMIC_SIZE:  # n >= 2 (its guard): n - correction >= 0
        denominator = n - correction
    else:
        raise ShapeError(f"var(correction={correction}) over a dynamic dim")
    return b("truediv", squares, denominator)


def _var_args(args: tuple, kwargs: dict) -> tuple[Node, Any, float, bool] | None:
    a = bind(args, kwargs, ("input", "dim"), {"dim": None, "keepdim": False,
                                               "correction": None, "unbiased": None})
    if len(args) >= 2 and isinstance(args[1], bool):  # var(x, unbiased)
        a["unbiased"], a["dim"] = args[1], None
    elif len(args) > 2:  # var(x, dim, unbiased, keepdim)
        a["unbiased"] = args[2]
        if len(args) > 3:
            a["keepdim"] = args[3]
    correction = a["correction"]
    if correction is None:
        correction = 0 if a["unbiased"] is False else 1
    x = a["input"]
    if not x.meta.dtype.is_floating_point or x.meta.ndim == 0:
        return None
    return x, a["dim"], correction, a["keepdim"]


def _var_or_std(root: bool) -> Callable[..., Node | None]:
    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
        parsed = _var_args(args, kwargs)
        if parsed is None:
            return NOT_HANDLED
        x, dim, correction, keepdim = parsed
        var = _variance(b, x, _dims(dim, x.meta.ndim), correction, keepdim)
        return b.restore(b("sqrt", var) if root else var)

    return rule


def _squeeze_dims(b: Builder, x: Node, dims: tuple[int, ...]) -> Node:
    for d in sorted(dims, reverse=True):
        x = b("squeeze", x, d)
    return x


def _logsumexp(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x = a["input"]
    if not x.meta.dtype.is_floating_point or x.meta.ndim == 0:
        return NOT_HANDLED
    dims = _dims(a["dim"], x.meta.ndim)
    xf = b.opmath(x)
    if _numel(x, dims) == 0:  # empty rows have no maximum: log(0) = -inf, as eager gives
        shift = 0.0
    else:
        m = b("amax", b("detach", xf), dims, True)  # the shift cancels in the gradient
        # An infinite maximum would give inf - inf: shift by 0 there, as torch does.
        shift = b("where", b("eq", b("abs", m), float("inf")), 0.0, m)
    total = b("sum", b("exp", b("sub", xf, shift)), dims, True)
    out = b("add", b("log", total), shift)
    if not a["keepdim"]:
        out = _squeeze_dims(b, out, dims)
    return b.restore(out)


def _norm(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, ("input", "p", "dim", "keepdim"), {"p": "fro", "dim": None,
                                                              "keepdim": False, "dtype": None})
    x, p = a["input"], a["p"]
    if not (p == "fro" or isinstance(p, (int, float)) and not isinstance(p, bool)):
        return NOT_HANDLED  # "nuc" and matrix norms stay library calls
    if a["dtype"] is not None or not x.meta.dtype.is_floating_point or x.meta.ndim == 0:
        return NOT_HANDLED
    dims = _dims(a["dim"], x.meta.ndim)
    if p == "fro" or p == 2:
        xf = b.opmath(x)
        return b.restore(b("sqrt", b("sum", b("mul", xf, xf), dims, a["keepdim"])))
    ax = b("abs", b.opmath(x))
    if math.isinf(p):  # the largest (smallest) magnitude; eager raises on an empty row
        if _numel(x, dims) == 0 or b.requires_grad:
            return NOT_HANDLED  # (its gradient treats NaN apart: PyTorch's backward)
        return b.restore(b("amax" if p > 0 else "amin", ax, dims, a["keepdim"]))
    if p == 0:  # the count of non-zero elements
        if b.requires_grad:
            return NOT_HANDLED  # eager's result requires grad (a zero one): PyTorch's call
        return b.restore(b("sum", b("to_dtype", b("ne", ax, 0), dtype=ax.meta.dtype), dims,
                           a["keepdim"]))
    if p == 1:
        return b.restore(b("sum", ax, dims, a["keepdim"]))
    total = b("sum", b("pow", ax, float(p)), dims, a["keepdim"])
    return b.restore(b("pow", total, 1.0 / p))


def _softmax(log: bool) -> Callable[..., Node | None]:
    def rule(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
        a = bind(args, kwargs, ("input", "dim", "_stacklevel", "dtype"),
                 {"dim": None, "dtype": None})
        x, dim, dtype = a["input"], a["dim"], a["dtype"]
        if dim is None or x.meta.ndim == 0:
            return NOT_HANDLED
        if dtype is not None:
            x = b("to_dtype", x, dtype=dtype)
        if not x.meta.dtype.is_floating_point:
            return NOT_HANDLED
        dims = (dim % x.meta.ndim,)
        xf = b.opmath(x)
        # The shift by the row maximum cancels in the gradient: it is not differentiated.
        # Empty rows have no maximum (and nothing to compute).
        shifted = xf if _numel(x, dims) == 0 else b("sub", xf, b("amax", b("detach", xf), dims,
                                                                True))
        if log:
            out = b("sub", shifted, b("log", b("sum", b("exp", shifted), dims, True)))
        else:
            e = b("exp", shifted)
            out = b("truediv", e, b("sum", e, dims, True))
        return b.restore(out, x.meta.dtype)

    return rule


def _layer_norm(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, ("input", "normalized_shape", "weight", "bias", "eps"),
             {"weight": None, "bias": None, "eps": 1e-5})
    x = a["input"]
    if not x.meta.dtype.is_floating_point:
        return NOT_HANDLED
    k = len(a["normalized_shape"])
    dims = tuple(range(x.meta.ndim - k, x.meta.ndim))
    out = _normalized(b, b.opmath(x), dims, _numel(x, dims), a["eps"])
    return b.restore(_affine(b, out, a["weight"], a["bias"]))


def _rms_norm(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, ("input", "normalized_shape", "weight", "eps"),
             {"weight": None, "eps": None})
    x = a["input"]
    if not x.meta.dtype.is_floating_point:
        return NOT_HANDLED
    eps = a["eps"] if a["eps"] is not None else torch.finfo(x.meta.dtype).eps
    k = len(a["normalized_shape"])
    dims = tuple(range(x.meta.ndim - k, x.meta.ndim))
    xf = b.opmath(x)
    ms = b("truediv", b("sum", b("mul", xf, xf), dims, True), _numel(x, dims))
    out = b("mul", xf, b("rsqrt", b("add", ms, float(eps))))
    return b.restore(_affine(b, out, a["weight"], None))


def _batch_norm(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    """Inference-mode batch norm: a per-channel affine map (no reduction)."""
    a = bind(args, kwargs, ("input", "running_mean", "running_var", "weight", "bias",
                            "training", "momentum", "eps"),
             {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5})
    x = a["input"]
    if a["training"] or a["running_mean"] is None or a["running_var"] is None:
        return NOT_HANDLED
    if x.meta.ndim < 2 or not x.meta.dtype.is_floating_point:
        return NOT_HANDLED

    def per_channel(t: Node) -> Node:
        return _per_channel(b, t, x.meta.ndim)

    xf = b.opmath(x)
    inv = b("rsqrt", b("add", per_channel(a["running_var"]), float(a["eps"])))
    out = b("mul", b("sub", xf, per_channel(a["running_mean"])), inv)
    return b.restore(_affine(b, out, a["weight"], a["bias"], per_channel))


def _per_channel(b: Builder, t: Node, ndim: int) -> Node:
    """A [C] tensor as [C, 1, 1, ...], to broadcast over dim 1 of an ``ndim``-d input."""
    for _ in range(ndim - 2):
        t = b("unsqueeze", t, t.meta.ndim)
    return t


def _group_norm(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    """Normalise each group of C // G channels (and all spatial positions) of an [N, C, *]
    input: reshape to [N, G, -1], two-pass mean/variance over the last dim, reshape back,
    then the per-channel affine map, as ATen's group_norm kernels compute it."""
    a = bind(args, kwargs, ("input", "num_groups", "weight", "bias", "eps"),
             {"weight": None, "bias": None, "eps": 1e-5})
    x, groups = a["input"], a["num_groups"]
    if x.meta.ndim < 2 or not x.meta.dtype.is_floating_point or not isinstance(groups, int):
        return NOT_HANDLED
    if x.meta.ndim == 2 and b.requires_grad:
        return NOT_HANDLED  # the backward of an [N, C] input goes to PyTorch
    shape = tuple(int(s) for s in x.meta.shape)
    if groups <= 0 or shape[1] % groups or math.prod(shape) == 0:
        return NOT_HANDLED  # eager raises (or returns an empty tensor): let it
    grouped = b("reshape", b.opmath(x), (shape[0], groups, math.prod(shape) // (shape[0] * groups)))
    n = int(math.prod(grouped.meta.shape[2:]))
    out = b("reshape", _normalized(b, grouped, (2,), n, a["eps"]), shape)
    return b.restore(_affine(b, out, a["weight"], a["bias"],
                             lambda t: _per_channel(b, t, len(shape))))


MAX_SCAN = 1024  # the longest row a cumsum sums as masked rows (work: its square)


def _cumsum(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    """An integer ``cumsum`` of a short row (RoBERTa's positions, an MoE's expert offsets)
    as sums of the row masked to ``k <= j``: one reduction, fused with its neighbours,
    exact in integers (floats stay the library call: another summation order)."""
    a = bind(args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
    x, out = a["input"], b.origin.meta
    if set(a) != {"input", "dim", "dtype"} or not isinstance(a["dim"], int) or x.meta.ndim == 0:
        return NOT_HANDLED
    if out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool:
        return NOT_HANDLED
    if any(not s.is_Integer or s == 0 for s in x.meta.shape):
        return NOT_HANDLED
    dim, shape = a["dim"] % x.meta.ndim, tuple(int(s) for s in x.meta.shape)
    if shape[dim] > MAX_SCAN:
        return NOT_HANDLED
    rows = shape[:dim] + (shape[dim],) + shape[dim:]  # (..., j, k, ...)
    spread = b("expand", b("unsqueeze", b.restore(x, out.dtype), dim), rows)
    keep = b("le", b("iota", rows, dim + 1, out.device), b("iota", rows, dim, out.device))
    return b.restore(b("sum", b("where", keep, spread, 0), (dim + 1,), False))


REDUCTION_DECOMPOSITIONS: dict[str, Callable[..., Node | None]] = {name: rule for names, rule in (
    (("torch.sum", "torch.Tensor.sum"), _plain("sum", takes_dtype=True)),
    (("torch.mean", "torch.Tensor.mean"), _mean),
    (("torch.amax", "torch.Tensor.amax"), _plain("amax", _empty)),  # (eager raises there)
    (("torch.amin", "torch.Tensor.amin"), _plain("amin", _empty)),
    (("torch.max", "torch.Tensor.max"), _max_or_min("amax")),
    (("torch.min", "torch.Tensor.min"), _max_or_min("amin")),
    (("torch.argmax", "torch.Tensor.argmax"), _arg_extreme("amax")),
    (("torch.argmin", "torch.Tensor.argmin"), _arg_extreme("amin")),
    # (prod's gradient with zeros in a row: PyTorch's backward)
    (("torch.prod", "torch.Tensor.prod"), _plain("prod", lambda b, x: b.requires_grad, True)),
    (("torch.any", "torch.Tensor.any"), _plain("any", _uint8)),
    (("torch.all", "torch.Tensor.all"), _plain("all", _uint8)),
    (("torch.var", "torch.Tensor.var"), _var_or_std(False)),
    (("torch.std", "torch.Tensor.std"), _var_or_std(True)),
    (("torch.logsumexp", "torch.Tensor.logsumexp"), _logsumexp),
    (("torch.norm", "torch.Tensor.norm"), _norm),
    (("torch.nn.functional.softmax", "torch.softmax", "torch.Tensor.softmax"), _softmax(False)),
    (("torch.nn.functional.log_softmax", "torch.log_softmax", "torch.Tensor.log_softmax"),
     _softmax(True)),
    (("torch.nn.functional.layer_norm", "torch.layer_norm"), _layer_norm),
    (("torch.nn.functional.rms_norm",), _rms_norm),
    (("torch.nn.functional.batch_norm",), _batch_norm),  # torch.batch_norm orders args apart
    (("torch.nn.functional.group_norm", "torch.group_norm"), _group_norm),
    (("torch.cumsum", "torch.Tensor.cumsum"), _cumsum),
    (("torch.nn.functional.adaptive_avg_pool1d", "torch.adaptive_avg_pool1d"),
     _global_avg_pool(1)),
    (("torch.nn.functional.adaptive_avg_pool2d",), _global_avg_pool(2)),
    (("torch.nn.functional.adaptive_avg_pool3d",), _global_avg_pool(3)),
) for name in names}
