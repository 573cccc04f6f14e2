"""From PyTorch's many spellings to the graph ops of :mod:`minicompile.ops`.

``torch.sin(x)``, ``x.sin()`` and ``torch.special.sin`` are one ``sin`` node.  Tables:
``FUNCTIONS`` (callable -> handler), ``METHODS`` (method name -> handler, the tensor first),
``ATTRIBUTES``.  Anything not modelled exactly as eager does, errors included, is Unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from minicompile.capture.variables import TensorVar
from minicompile.errors import Unsupported
from minicompile.op_table import ROWS


class Emitter(Protocol):
    grad_enabled: bool

    def op(self, name: str, args: tuple, kwargs: dict[str, Any] | None = None,
           track: bool = True) -> TensorVar: ...

    def extern(self, fn: Any, args: tuple, kwargs: dict, track: bool = True) -> Any: ...


Handler = Callable[[Emitter, str, tuple, dict], Any]

FUNCTIONS: dict[Any, tuple[str, Handler]] = {}
METHODS: dict[str, Handler] = {}
ATTRIBUTES: dict[str, Callable[[Emitter, TensorVar], Any]] = {}

_NAMESPACES: dict[str, Any] = {
    "torch": torch, "F": F, "Tensor": torch.Tensor, "torch.special": torch.special}
# Python numbers; SymInt/SymFloat: sizes of a dynamic capture used as numbers (x * (t // 4)).
_SCALAR_TYPES = (bool, int, float, torch.SymInt, torch.SymFloat)


def register(*spellings: str) -> Callable[[Handler], Handler]:
    """Register a handler under spellings like ``"torch.sin"``, ``"F.relu"`` and
    ``"Tensor.sin"`` (the last one also makes ``x.sin()`` a method).  Spellings missing
    from this PyTorch version are skipped."""

    def deco(handler: Handler) -> Handler:
        for spelling in spellings:
            ns_name, _, attr = spelling.rpartition(".")
            fn = getattr(_NAMESPACES[ns_name], attr, None)
            if fn is None:
                continue
            if ns_name == "Tensor":
                METHODS[attr] = handler
            full = {"F": "torch.nn.functional"}.get(ns_name, ns_name)
            FUNCTIONS[fn] = (f"{full}.{attr}", handler)
        return handler

    return deco


def parse(fname: str, args: tuple, kwargs: dict, names: tuple[str, ...], **defaults: Any) -> list:
    """Bind ``args``/``kwargs`` to ``names`` like a Python signature; anything unexpected
    (``out=``, unknown keywords) is Unsupported."""
    if len(args) > len(names):
        raise Unsupported(f"{fname}() got {len(args)} positional arguments; not supported")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key == "out":
            raise Unsupported(f"{fname}(out=...) is not supported")
        if key not in names or key in bound:
            raise Unsupported(f"{fname}() got an unsupported argument {key!r}")
        bound[key] = value
    for name in names:
        if name not in bound:
            if name not in defaults:
                raise Unsupported(f"{fname}() missing argument {name!r}")
            bound[name] = defaults[name]
    return [bound[n] for n in names]


def tensor_arg(fname: str, value: Any) -> TensorVar:
    if not isinstance(value, TensorVar):
        raise Unsupported(f"{fname}() expects a tensor, got {type(value).__name__}")
    return value


def scalar_or_tensor(fname: str, value: Any) -> Any:
    if isinstance(value, TensorVar) or type(value) in _SCALAR_TYPES:
        return value
    raise Unsupported(f"{fname}(): argument of type {type(value).__name__} is not supported")


def shape_of(x: TensorVar) -> tuple:
    """Sizes as Python sees them: ints, SymInts where the capture made a size symbolic."""
    return x.meta.sizes()


def normalize_dim(fname: str, dim: Any, ndim: int) -> int:
    """A dim in ``[-ndim, ndim)`` as a non-negative int (eager's IndexError otherwise)."""
    if type(dim) is not int:
        raise Unsupported(f"{fname}(): dim must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)  # a 0-d tensor accepts dims -1 and 0
    if not -n <= dim < n:
        raise Unsupported(f"{fname}(): dim {dim} out of range for a {ndim}-d tensor")
    return dim + n if dim < 0 else dim


def dims_arg(fname: str, args: tuple, kwargs: dict, name: str) -> tuple:
    """``f(1, 0)``, ``f((1, 0))`` or ``f(name=(1, 0))``: a dims/sizes list in each form."""
    if kwargs.keys() - {name}:
        raise Unsupported(f"{fname}() got an unsupported keyword")
    if name in kwargs:
        return tuple(kwargs[name])
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


# -- unary and composite ops ---------------------------------------------------------------

def _unary(op: str) -> Handler:
    def handler(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
        (x,) = parse(fname, args, kwargs, ("input",))
        return em.op(op, (tensor_arg(fname, x),))

    return handler


for _row in ROWS:  # the spellings of minicompile/op_table.py's rows
    if _row.family == "unary" and _row.spellings:
        register(*_row.spellings)(_unary(_row.name))


@register("torch.round", "Tensor.round", "torch.special.round")
def _round(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, decimals = parse(fname, args, kwargs, ("input", "decimals"), decimals=0)
    if decimals != 0:
        raise Unsupported(f"{fname}(decimals={decimals!r}) is not supported yet")
    return em.op("round", (tensor_arg(fname, x),))


def _activation(op: str) -> Handler:
    def handler(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
        if fname.startswith("torch.nn.functional"):  # F.relu(x, inplace=False)
            x, inplace = parse(fname, args, kwargs, ("input", "inplace"), inplace=False)
            if inplace:
                raise Unsupported(f"{fname}(inplace=True) is not supported (in-place op)")
        else:
            (x,) = parse(fname, args, kwargs, ("input",))
        return em.op(op, (tensor_arg(fname, x),))

    return handler


register("torch.relu", "Tensor.relu", "F.relu")(_activation("relu"))
register("F.silu")(_activation("silu"))


@register("F.gelu")
def _gelu(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, approximate = parse(fname, args, kwargs, ("input", "approximate"), approximate="none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"{fname}(approximate={approximate!r}): eager rejects it")
    kwargs = {"approximate": approximate} if approximate != "none" else {}
    return em.op("gelu", (tensor_arg(fname, x),), kwargs)


@register("torch.arange")
def _arange(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    """``torch.arange`` of Python ints, int64, on a named device: the positions as values
    (``iota``: an index expression in the kernels that read it, as Inductor folds it; an
    embedding of ``arange(T)`` then reads its rows directly).  Anything else (floats, sizes
    of a dynamic capture, another dtype, the default device) is PyTorch's own call."""
    rest = {k: v for k, v in kwargs.items() if k not in ("dtype", "device")}
    device = kwargs.get("device")
    if (1 <= len(args) <= 3 and all(type(a) is int for a in args) and not rest
            and kwargs.get("dtype") in (None, torch.int64)
            and isinstance(device, (str, torch.device))):
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        count = len(range(start, end, step)) if step != 0 else 0
        if count > 0:
            out = em.op("iota", ((count,), 0), {"device": torch.device(device)})
            if step != 1:
                out = em.op("mul", (out, step))
            return em.op("add", (out, start)) if start != 0 else out
    return em.extern(torch.arange, args, kwargs)


# -- binary ops ------------------------------------------------------------------------------


def binary(em: Emitter, op: str, a: Any, b: Any, fname: str) -> Any:
    """``op(a, b)`` with at least one tensor; Python bool/int/float scalars on either side."""
    a, b = scalar_or_tensor(fname, a), scalar_or_tensor(fname, b)
    if not isinstance(a, TensorVar) and not isinstance(b, TensorVar):
        raise Unsupported(f"{fname}() on two Python numbers: eager needs a tensor")
    if op in ("maximum", "minimum") and not (isinstance(a, TensorVar) and isinstance(b, TensorVar)):
        raise Unsupported(f"{fname}() needs two tensors (eager raises)")
    return em.op(op, (a, b))


def _scale(em: Emitter, fname: str, value: Any, alpha: Any, other: Any) -> Any:
    """``alpha * value`` for torch.add/sub's ``alpha=``; eager rejects a float alpha with
    integral operands, so that case runs eagerly."""
    if alpha == 1 and type(alpha) in (int, bool):
        return value
    if type(alpha) not in _SCALAR_TYPES:
        raise Unsupported(f"{fname}(alpha=...) must be a Python number here")
    floating = any((isinstance(v, TensorVar) and v.meta.dtype.is_floating_point)
                   or type(v) is float for v in (value, other))
    if isinstance(alpha, float) and not floating:
        raise Unsupported(f"{fname}(): float alpha with integral inputs (eager raises)")
    if isinstance(value, TensorVar):
        return em.op("mul", (value, alpha))
    return value * alpha


def _binary(op: str, second: str = "other") -> Handler:
    def handler(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
        a, b = parse(fname, args, kwargs, ("input", second))
        return binary(em, op, a, b, fname)

    return handler


for _row in ROWS:
    if _row.family == "binary" and _row.spellings:
        register(*_row.spellings)(_binary(_row.name))
register("torch.pow", "Tensor.pow")(_binary("pow", "exponent"))


@register("torch.add", "Tensor.add", "torch.sub", "torch.subtract", "Tensor.sub", "Tensor.subtract")
def _add_sub(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    a, b, alpha = parse(fname, args, kwargs, ("input", "other", "alpha"), alpha=1)
    op = "add" if fname.endswith(".add") else "sub"
    return binary(em, op, a, _scale(em, fname, b, alpha, a), fname)


@register("torch.rsub")
def _rsub(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    a, b, alpha = parse(fname, args, kwargs, ("input", "other", "alpha"), alpha=1)
    return binary(em, "sub", b, _scale(em, fname, a, alpha, b), fname)


@register("torch.div", "torch.divide", "Tensor.div", "Tensor.divide")
def _div(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    a, b, mode = parse(fname, args, kwargs, ("input", "other", "rounding_mode"), rounding_mode=None)
    if mode is None:
        return binary(em, "truediv", a, b, fname)
    if mode == "floor":
        return binary(em, "floordiv", a, b, fname)
    if mode == "trunc":
        # trunc(a / b) is eager's definition for float32/float64; integer and reduced
        # precision division round differently, so those run eagerly.
        tensors = [v for v in (a, b) if isinstance(v, TensorVar)]
        if tensors and all(t.meta.dtype in (torch.float32, torch.float64) for t in tensors):
            return em.op("trunc", (binary(em, "truediv", a, b, fname),))
        raise Unsupported(f"{fname}(rounding_mode='trunc') is only supported on float32/64")
    raise Unsupported(f"{fname}(rounding_mode={mode!r}): eager rejects it")


# Python operators (BINARY_OP, COMPARE_OP) onto graph ops.
OPERATORS: dict[str, str] = {row.symbol: row.name for row in ROWS if row.symbol}


def binary_operator(em: Emitter, symbol: str, a: Any, b: Any) -> Any:
    """``a <symbol> b`` where at least one side is a tensor (reflected forms included:
    ``2 - x`` is ``sub(2, x)``)."""
    if symbol == "@":
        if not isinstance(a, TensorVar) or not isinstance(b, TensorVar):
            raise Unsupported("matrix multiply (@) needs two tensors (eager raises)")
        return em.extern(torch.matmul, (a, b), {})
    if symbol not in OPERATORS:
        raise Unsupported(f"operator {symbol} on tensors is not supported yet")
    return binary(em, OPERATORS[symbol], a, b, f"operator {symbol}")


def unary_operator(em: Emitter, symbol: str, x: TensorVar) -> Any:
    """``-x``, ``~x`` (logical_not on bool tensors, as in eager) and ``+x``."""
    if symbol == "-":
        return em.op("neg", (x,))
    if symbol == "~":
        return em.op("logical_not" if x.meta.dtype == torch.bool else "bitwise_not", (x,))
    if symbol == "+":
        if x.meta.dtype == torch.bool:
            raise Unsupported("unary + on a bool tensor (eager raises)")
        return x  # torch.positive returns its input
    raise Unsupported(f"unary operator {symbol} on a tensor is not supported")


# -- where / clamp ---------------------------------------------------------------------------


@register("torch.where")
def _where(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    if len(args) + len(kwargs) == 1:
        raise Unsupported("torch.where(condition) has a data-dependent shape; not supported")
    cond, a, b = parse(fname, args, kwargs, ("condition", "input", "other"))
    cond = tensor_arg(fname, cond)
    return em.op("where", (cond, scalar_or_tensor(fname, a), scalar_or_tensor(fname, b)))


@register("Tensor.where")
def _where_method(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, cond, other = parse(fname, args, kwargs, ("input", "condition", "other"))
    return em.op("where", (tensor_arg(fname, cond), x, scalar_or_tensor(fname, other)))


def clamp(em: Emitter, fname: str, x: Any, lo: Any, hi: Any) -> Any:
    """Number bounds give one ``clamp`` node; tensor bounds give maximum/minimum nodes
    (``min(max(x, lo), hi)``, eager's values).  Where a gradient flows through tensor
    bounds, eager's convention at ties and NaN is neither maximum's nor minimum's and
    differs between releases (minicompile/compat.py): ``torch.clamp`` is a library call."""
    x = tensor_arg(fname, x)
    if lo is None and hi is None:
        raise Unsupported(f"{fname}(): at least one of min and max is needed (eager raises)")
    for bound in (lo, hi):
        if bound is not None:
            scalar_or_tensor(fname, bound)
    tensors = [v for v in (x, lo, hi) if isinstance(v, TensorVar)]
    if len(tensors) == 1:
        return em.op("clamp", (x,), {"min": lo, "max": hi})
    if em.grad_enabled and any(v.meta.requires_grad for v in tensors):
        return em.extern(torch.clamp, (x, lo, hi), {})
    out = x
    if lo is not None:
        out = em.op("maximum", (out, lo)) if isinstance(lo, TensorVar) else em.op(
            "clamp", (out,), {"min": lo, "max": None})
    if hi is not None:
        out = em.op("minimum", (out, hi)) if isinstance(hi, TensorVar) else em.op(
            "clamp", (out,), {"min": None, "max": hi})
    return out


@register("torch.clamp", "torch.clip", "Tensor.clamp", "Tensor.clip")
def _clamp(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, lo, hi = parse(fname, args, kwargs, ("input", "min", "max"), min=None, max=None)
    return clamp(em, fname, x, lo, hi)


@register("torch.clamp_min", "Tensor.clamp_min", "torch.clamp_max", "Tensor.clamp_max")
def _clamp_bound(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    side = fname.rpartition("_")[2]  # min or max
    x, bound = parse(fname, args, kwargs, ("input", side))
    return clamp(em, fname, x, *((bound, None) if side == "min" else (None, bound)))
