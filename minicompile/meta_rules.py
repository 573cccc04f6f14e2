"""Result metadata of common ops without PyTorch's meta functions, which import
torch._dynamo on their first call (a second or more of a cold start): float pointwise ops by
PyTorch's own promotion, broadcasting and dimension-order rules called directly, and a few
library calls where their arguments are plain.  Anything else goes to ops.infer_meta's
general path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minicompile import compat
from minicompile.graph import Node, TensorMeta
from minicompile.library_layouts import (
    ATTENTION,
    ATTENTION_ARGS,
    conv_layout,
    cpu_layout,
)
from minicompile.op_table import COMPARISONS, LOGICAL, ROWS

# Pointwise ops whose result metadata follows from PyTorch's promotion, broadcasting and
# stride rules alone when every tensor is floating point (none of them refuses a float).
FLOAT_POINTWISE = frozenset(row.name for row in ROWS if row.float_meta) | {
    "relu", "silu", "gelu"}  # (composites, decomposed later)
# Pointwise ops whose result metadata follows from the same rules on integer and bool
# tensors too (their general path imports torch._dynamo: seconds of a cold start): the
# promotion kind, and whether bool tensors and float operands are accepted (where eager
# refuses, the general path raises its error).
INTEGRAL_POINTWISE: dict[str, tuple[str, bool, bool]] = {
    **{name: ("ALWAYS_BOOL", True, True) for name in COMPARISONS | LOGICAL},
    **{name: ("DEFAULT", True, True) for name in ("add", "mul", "maximum", "minimum", "where")},
    **{name: ("DEFAULT", False, True) for name in ("sub", "neg", "abs", "floordiv",
                                                   "remainder")},
    **{name: ("DEFAULT", True, False) for name in ("bitwise_and", "bitwise_or", "bitwise_xor",
                                                   "bitwise_not")},
    **{name: ("INT_TO_FLOAT", True, True) for name in (
        "truediv", "sin", "cos", "tan", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt",
        "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "atan")},
    "clamp": ("DEFAULT", False, True),  # (number bounds: min= and max=)
    "pow": ("DEFAULT", False, True),  # (an exponent that is a float or an int of at least 0)
}


def pointwise_meta(name: str, args: tuple, kwargs: dict[str, Any],
                    device: torch.device) -> TensorMeta | None:
    """The result metadata of a pointwise op on float, integer and bool tensors (static
    sizes) and Python numbers by ``torch._prims_common``'s rules, called directly (the
    meta functions import torch._dynamo on their first call), or None where this does not
    apply."""
    pc = compat.prims_common()
    integral = INTEGRAL_POINTWISE.get(name)
    if name == "clamp" and kwargs.keys() <= {"min", "max"}:  # the bounds promote as operands
        args = (*args, *(b for b in (kwargs.get("min"), kwargs.get("max")) if b is not None))
        kwargs = {} if len(args) > 1 else kwargs  # (no bound: eager raises)
    if kwargs or not (name in FLOAT_POINTWISE or integral):
        return None
    if name == "pow" and not (len(args) == 2 and (type(args[1]) is float or (
            type(args[1]) is int and args[1] >= 0))):
        return None  # (integers to negative powers: eager raises)
    values = []
    for k, v in enumerate(args):
        meta = v.meta if isinstance(v, Node) else v
        if isinstance(meta, TensorMeta):
            if meta.is_symbolic or not _accepts(name, integral, meta.dtype, k):
                return None
            values.append(meta.fake())
        elif type(v) in (int, float) and name not in _NO_NUMBER and not (
            name == "where" and k == 0
        ) and not (type(v) is float and integral and not integral[2]):
            values.append(v)  # (bitwise ops take no float)
        else:
            return None
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors or (name == "where" and not isinstance(values[0], torch.Tensor)):
        return None
    kinds = pc.ELEMENTWISE_TYPE_PROMOTION_KIND
    kind = getattr(kinds, integral[0]) if integral else kinds.DEFAULT
    promoted = values[1:] if name == "where" else values
    compute, dtype = pc.elementwise_dtypes(*promoted, type_promotion_kind=kind)
    converted = [t for t in promoted if isinstance(t, torch.Tensor) and t.dtype != compute]
    if any(t.dtype.is_floating_point for t in converted) or converted and any(
            t.shape != tensors[0].shape or not t.is_contiguous() for t in tensors):
        # Converted first (float16's float32 arithmetic): another stride rule, but for
        # integers made float in operands of one shape, all contiguous.
        return None
    shape = tensors[0].shape
    stride = torch.empty(shape, dtype=dtype, device="meta").stride()
    # Operands of one shape with its contiguous strides (even at sizes of 1) give that
    # result; others, PyTorch's general rule (whose size checks import its symbolic-shapes
    # module: 50 ms of a cold start).
    if any(t.shape != shape or t.stride() != stride for t in tensors):
        shape = broadcast(*(t.shape for t in tensors))
        if shape is None:
            return None  # eager's own error message, from the slow path
        perm = dimension_order([t.expand(shape) for t in tensors])
        stride = torch.empty_permuted(shape, perm, dtype=dtype, device="meta").stride()
    return TensorMeta(shape=tuple(sympy.Integer(s) for s in shape),
                      stride=tuple(sympy.Integer(s) for s in stride), dtype=dtype,
                      device=device)


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast of static sizes, as ``torch.broadcast_shapes`` gives it (whose
    implementation, torch._refs, imports PyTorch's symbolic-shapes module), or None where
    they do not broadcast."""
    out = [1] * max(map(len, shapes))
    for shape in shapes:
        for i, n in enumerate(shape, len(out) - len(shape)):
            if n != 1:
                if out[i] not in (1, n):
                    return None
                out[i] = n
    return tuple(out)


def dimension_order(tensors: list[torch.Tensor]) -> list[int]:
    """The order of dimensions (outermost first) of a pointwise result over ``tensors``
    (static, of one shape), as PyTorch's
    ``prims_common.compute_elementwise_output_logical_to_physical_perm`` finds it (whose
    first line imports PyTorch's symbolic-shapes module): contiguous, channels-last, or
    the operands' stride order, earlier operands first."""
    ndim, shape = tensors[0].ndim, tensors[0].shape
    contiguous = all(t.is_contiguous() for t in tensors)
    channels_last = all(t.is_contiguous(memory_format=torch.channels_last) for t in tensors
                        ) if ndim == 4 else False
    if ndim <= 1 or (contiguous and not channels_last):
        return list(range(ndim))
    if channels_last and not contiguous:
        return [0, *range(2, ndim), 1]

    def should_swap(a: int, b: int) -> int:  # (sizes and strides are at least 0)
        for t in tensors:
            stride_a, stride_b = t.stride()[a], t.stride()[b]
            if stride_a == 0 or stride_b == 0:
                continue
            if stride_a == stride_b:
                if shape[a] == 0 or (shape[b] != 0 and shape[b] >= shape[a]):
                    continue
                return 1
            return -1 if stride_b >= stride_a else 1
        return 0

    perm = list(reversed(range(ndim)))  # sorted back to front, by insertion
    for i in range(1, ndim):
        right = i
        for left in reversed(range(i)):
            order = should_swap(perm[left], perm[right])
            if order > 0:
                perm[left], perm[right] = perm[right], perm[left]
                right = left
            elif order < 0:
                break
    return perm[::-1]


_NO_NUMBER = frozenset({"maximum", "minimum", *LOGICAL})  # (eager takes tensors only)


def _accepts(name: str, integral: tuple[str, bool, bool] | None, dtype: torch.dtype,
             position: int) -> bool:
    """A tensor operand of ``dtype`` at ``position`` is one these rules model."""
    if name == "where" and position == 0:
        return dtype == torch.bool
    if dtype.is_floating_point:
        return name in FLOAT_POINTWISE or (integral is not None and integral[2])
    if dtype.is_complex or integral is None:
        return False
    return dtype != torch.bool or integral[1]


def _plain(v: Any, dtype: torch.dtype | None = None) -> TensorMeta | None:
    """``v``'s metadata if it is a static float tensor (of ``dtype``, if given)."""
    meta = v.meta if isinstance(v, Node) else v
    if (isinstance(meta, TensorMeta) and not meta.is_symbolic and meta.dtype.is_floating_point
            and (dtype is None or meta.dtype == dtype)):
        return meta
    return None


def _fits(v: Any, x: TensorMeta, shape: tuple) -> bool:
    """Whether the optional ``v`` (a weight, a bias) is None, or plain with ``x``'s dtype
    and device and the sizes ``shape``."""
    if v is None:
        return True
    meta = _plain(v, x.dtype)
    return meta is not None and meta.device == x.device and meta.concrete_shape() == shape


def _contiguous(meta: TensorMeta, shape: tuple, device: torch.device) -> TensorMeta:
    stride = torch.empty(tuple(int(n) for n in shape), device="meta").stride()
    return TensorMeta(shape=tuple(sympy.Integer(int(n)) for n in shape),
                      stride=tuple(sympy.Integer(s) for s in stride), dtype=meta.dtype,
                      device=device)


def _bind(names: tuple[str, ...], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments by name; {} (nothing bound) where they do not fit ``names``."""
    if len(args) > len(names) or any(k not in names[len(args):] for k in kwargs):
        return {}
    return dict(zip(names, args)) | kwargs


def _linear_meta(args: tuple, kwargs: dict[str, Any], device: torch.device) -> TensorMeta | None:
    """``F.linear``'s result metadata where it is plain (a contiguous float input of two or
    more dims, a weight and bias of its dtype and device, matching sizes): contiguous."""
    bound = _bind(("input", "weight", "bias"), args, kwargs)
    x = _plain(bound.get("input"))
    w = _plain(bound.get("weight"), x.dtype) if x is not None else None
    if x is None or w is None or len(x.shape) < 2 or len(w.shape) != 2 or w.device != x.device:
        return None
    if x.stride != _contiguous(x, x.shape, device).stride or x.shape[-1] != w.shape[1]:
        return None
    if not _fits(bound.get("bias"), x, (int(w.shape[0]),)):
        return None
    return _contiguous(x, (*x.shape[:-1], w.shape[0]), device)


def _layer_norm_meta(args: tuple, kwargs: dict[str, Any],
                     device: torch.device) -> TensorMeta | None:
    """``F.layer_norm``'s result metadata where it is plain (static float input, weight and
    bias of its dtype and the normalized shape): contiguous, as ATen allocates it."""
    bound = _bind(("input", "normalized_shape", "weight", "bias", "eps"), args, kwargs)
    x = _plain(bound.get("input"))
    normalized = bound.get("normalized_shape")
    if not (x is not None and isinstance(normalized, (tuple, list, torch.Size))
            and all(type(n) is int for n in normalized)
            and 0 < len(normalized) <= len(x.shape)
            and tuple(int(n) for n in x.shape[len(x.shape) - len(normalized):]) == tuple(normalized)
            and type(bound.get("eps", 1e-5)) in (int, float)):
        return None
    if not all(_fits(bound.get(key), x, tuple(normalized)) for key in ("weight", "bias")):
        return None
    return _contiguous(x, x.shape, device)


def _gelu_meta(args: tuple, kwargs: dict[str, Any], device: torch.device) -> TensorMeta | None:
    """``gelu``'s result metadata for a static, contiguous float input: the same layout."""
    bound = _bind(("input", "approximate"), args, kwargs)
    x = _plain(bound.get("input"))
    if x is None or bound.get("approximate", "none") not in ("none", "tanh"):
        return None
    out = _contiguous(x, x.shape, device)
    return out if x.stride == out.stride else None


def int_tuple(value: Any, n: int, low: int | None = None) -> tuple[int, ...] | None:
    """A window argument (a convolution's or pooling's stride, padding, ...) as ``n`` ints,
    each at least ``low``: one int for every dim, or ``n`` of them; None for anything else
    (a string padding, a symbolic size)."""
    items = (value,) * n if type(value) is int else value
    if not (isinstance(items, (tuple, list)) and len(items) == n
            and all(type(v) is int and (low is None or v >= low) for v in items)):
        return None
    return tuple(items)


def _conv2d_meta(args: tuple, kwargs: dict[str, Any],
                 device: torch.device) -> TensorMeta | None:
    """A 2-d convolution's result metadata where it is plain (a batched 4-d float input, a
    weight and bias of its dtype and device whose sizes fit, numeric stride, padding and
    dilation, no empty tensor): the formula's sizes, laid out by conv_layout.  (The meta
    path costs a millisecond or more per call on a GPU host.)"""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = _bind(names, args, kwargs)
    x = _plain(bound.get("input"))
    w = _plain(bound.get("weight"), x.dtype) if x is not None else None
    groups = bound.get("groups", 1)
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4 or (
            w.device != x.device or type(groups) is not int or groups < 1):
        return None
    (n, c_in, h, wd), (c_out, c_per_group, kh, kw) = x.concrete_shape(), w.concrete_shape()
    if min(n, c_in, c_out, kh, kw) < 1 or c_in != c_per_group * groups or c_out % groups:
        return None
    if not _fits(bound.get("bias"), x, (c_out,)):
        return None
    stride, dilation = (int_tuple(bound.get(k, 1), 2, 1) for k in ("stride", "dilation"))
    padding = int_tuple(bound.get("padding", 0), 2, 0)
    if stride is None or padding is None or dilation is None:
        return None  # ("same" / "valid" padding, or a bad value: PyTorch's path decides)
    out_hw = [(size + 2 * p - d * (k - 1) - 1) // s + 1
              for size, p, d, k, s in zip((h, wd), padding, dilation, (kh, kw), stride)]
    if min(out_hw) < 1:
        return None  # eager raises: the input is smaller than the kernel
    out = torch.empty((n, c_out, *out_hw), dtype=x.dtype, device="meta")
    out = conv_layout(out, (x.fake(), w.fake()), {})
    return TensorMeta(shape=tuple(sympy.Integer(s) for s in out.shape),
                      stride=tuple(sympy.Integer(s) for s in out.stride()), dtype=x.dtype,
                      device=device)


def _reduction_meta(args: tuple, kwargs: dict[str, Any],
                    device: torch.device) -> TensorMeta | None:
    """A float sum, amax or amin (ops.REDUCTION's ``name(x, dims, keepdim)``) of a static,
    non-empty input: contiguous, the reduced sizes, the input's dtype.  (PyTorch's rule,
    torch._refs, imports its symbolic-shapes module at its first size check: tens of ms of
    a cold start.)"""
    x = _plain(args[0]) if len(args) == 3 and not kwargs else None
    dims, keepdim = args[1:] if x is not None else ((), None)
    shape = x.concrete_shape() if x is not None else (0,)
    if (type(keepdim) is not bool or type(dims) is not tuple or not dims or 0 in shape
            or len(set(dims)) != len(dims)
            or not all(type(d) is int and 0 <= d < len(shape) for d in dims)):
        return None
    return _contiguous(x, tuple(1 if i in dims else n for i, n in enumerate(shape)
                                if keepdim or i not in dims), device)


def _attention_meta(args: tuple, kwargs: dict[str, Any],
                    device: torch.device) -> TensorMeta | None:
    """``F.scaled_dot_product_attention``'s result metadata on CPU tensors where it is plain
    (static, non-empty 4-d float query, key and value of one dtype whose sizes fit, no mask,
    no dropout, no grouped heads): the math path's contiguous result, in the CPU flash
    kernel's layout where that kernel runs (cpu_layout).  The math path's meta functions
    import torch._dynamo (two seconds of a cold start).  On CUDA the call itself decides
    (library_layouts.DEVICE_RULES)."""
    bound = _bind(ATTENTION_ARGS, args, kwargs)
    q, k, v = (_plain(bound.get(name)) for name in ATTENTION_ARGS[:3])
    if device.type != "cpu" or q is None or k is None or v is None:
        return None
    (*batch, length, e), (*k_batch, s, k_e), (*v_batch, v_s, _) = (
        m.concrete_shape() for m in (q, k, v))
    scale = bound.get("scale")
    if not (len(batch) == 2 and batch == k_batch == v_batch and e == k_e and s == v_s
            and min(q.concrete_shape() + k.concrete_shape() + v.concrete_shape()) > 0
            and q.dtype == k.dtype == v.dtype and q.device == k.device == v.device == device
            and bound.get("attn_mask") is None and bound.get("dropout_p", 0.0) == 0.0
            and type(bound.get("is_causal", False)) is bool
            and (scale is None or type(scale) is float)
            and bound.get("enable_gqa", False) is False):
        return None
    out = _contiguous(q, (*batch, length, v.concrete_shape()[-1]), device)
    rest = {key: value for key, value in bound.items() if key not in ATTENTION_ARGS[:3]}
    laid = cpu_layout("torch.nn.functional.scaled_dot_product_attention", out.fake(), args,
                      kwargs, (q.fake(), k.fake(), v.fake()), rest)
    return TensorMeta(shape=out.shape, stride=tuple(sympy.Integer(n) for n in laid.stride()),
                      dtype=q.dtype, device=device)


# Library calls (and reductions) whose result metadata is computed here where the
# arguments are plain.
LIBRARY = {"torch.nn.functional.layer_norm": _layer_norm_meta,
           "torch.nn.functional.linear": _linear_meta, "gelu": _gelu_meta,
           "torch.nn.functional.conv2d": _conv2d_meta, "torch.conv2d": _conv2d_meta,
           "sum": _reduction_meta, "amax": _reduction_meta, "amin": _reduction_meta,
           **{name: _attention_meta for name in ATTENTION}}


def _encoder_layer_meta(args: tuple, kwargs: dict[str, Any],
                        device: torch.device) -> TensorMeta | None:
    """``torch._transformer_encoder_layer_fwd`` (TransformerEncoderLayer's fused path in
    eval): contiguous, ``src``'s shape and dtype.  PyTorch 2.11 has no meta kernel for it."""
    src = args[0].meta if args and isinstance(args[0], Node) else None
    if not isinstance(src, TensorMeta) or src.is_symbolic:
        return None
    return _contiguous(src, src.shape, device)


# Library calls whose PyTorch has no meta kernel (NotImplementedError on meta tensors):
# their result metadata by these rules (static sizes).
WITHOUT_META_KERNEL = {"torch._transformer_encoder_layer_fwd": _encoder_layer_meta}


def result_meta(name: str, args: tuple, kwargs: dict[str, Any],
                device: torch.device) -> TensorMeta | None:
    """``name``'s result metadata by these rules (static sizes), or None where they do not
    apply (then PyTorch's meta functions decide)."""
    rule = LIBRARY.get(name)
    return rule(args, kwargs, device) if rule is not None else pointwise_meta(
        name, args, kwargs, device)
