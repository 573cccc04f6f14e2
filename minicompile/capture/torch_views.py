"""Casts, views and metadata queries of tensors, registered into :mod:`torch_ops`' tables
(imported from there).  Casts become ``to_dtype`` (the input itself for the same dtype);
views become ``permute``, ``unsqueeze``, ``squeeze`` and ``expand``; ``contiguous()`` is
the input when it is contiguous (in a memory format: :func:`relaid`); metadata is answered
from the guarded traced metadata.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from minicompile.capture.torch_ops import (
    ATTRIBUTES, Emitter, dims_arg, normalize_dim, parse, register, shape_of, tensor_arg,
)
from minicompile.capture.variables import TensorVar
from minicompile.errors import Unsupported

# -- casts -----------------------------------------------------------------------------------


def cast(em: Emitter, x: TensorVar, dtype: torch.dtype | None) -> Any:
    if dtype is None or dtype == x.meta.dtype:
        return x
    return em.op("to_dtype", (x,), {"dtype": dtype})


def same_device(fname: str, x: TensorVar, device: Any) -> None:
    """Device changes are not modelled; naming the tensor's own device is fine."""
    if device is not None and _moves(x, torch.device(device)):
        raise Unsupported(f"{fname}() moving a tensor from {x.meta.device} to "
                          f"{torch.device(device)} is not supported")


@register("Tensor.to")
def _to(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    """``x.to(dtype)``, ``x.to(other)``, ``x.to(device[, dtype])`` and keyword forms."""
    x, *rest = args
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    fmt = kwargs.pop("memory_format", torch.preserve_format)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise Unsupported(f"{fname}() argument(s) {sorted(kwargs)} not supported")
    if rest and isinstance(rest[0], TensorVar):
        other = rest.pop(0)
        dtype, device = other.meta.dtype, other.meta.device
    elif rest and isinstance(rest[0], (str, torch.device)):
        device = rest.pop(0)
        if rest and isinstance(rest[0], torch.dtype):
            dtype = rest.pop(0)
    elif rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    # What is left is (non_blocking, copy), positionally.
    if len(rest) > 2 or not all(type(flag) is bool for flag in rest):
        raise Unsupported(f"{fname}() with arguments {rest!r} is not supported")
    if len(rest) == 2:
        copy = rest[1]
    if copy:
        raise Unsupported(f"{fname}(copy=True) is not supported")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise Unsupported(f"{fname}(dtype={dtype!r}) is not a torch.dtype")
    x = tensor_arg(fname, x)
    if device is not None and torch.device(device).type == "meta":
        same_device(fname, x, device)  # raises: meta tensors have no data to compile
    if device is not None and _moves(x, torch.device(device)):
        # A copy to another device: a library call (the wrapper runs x.to(device)).
        x = em.op("torch.Tensor.to", (x, _full_device(torch.device(device))))
    if fmt is not torch.preserve_format:
        x = relaid(em, fname, x, fmt)
    return cast(em, x, dtype)


def _moves(x: TensorVar, want: torch.device) -> bool:
    have = x.meta.device
    return want.type != have.type or (want.index is not None and want.index != have.index)


def _full_device(device: torch.device) -> torch.device:
    """``cuda`` names the current CUDA device; the graph records which one."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _of_tensor(answer: Any):
    """The handler of ``f(x)``, a function of the one tensor ``x``: ``answer(em, x)``."""

    def handler(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
        (x,) = parse(fname, args, kwargs, ("input",))
        return answer(em, tensor_arg(fname, x))

    return handler


for _name, _dtype in {
    "float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
    "double": torch.float64, "int": torch.int32, "long": torch.int64, "short": torch.int16,
    "char": torch.int8, "byte": torch.uint8, "bool": torch.bool}.items():
    register(f"Tensor.{_name}")(_of_tensor(functools.partial(cast, dtype=_dtype)))


@register("Tensor.type")
def _type(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, dtype = parse(fname, args, kwargs, ("input", "dtype"), dtype=None)
    if not isinstance(dtype, torch.dtype):
        raise Unsupported(f"{fname}() is only supported with a torch.dtype argument")
    return cast(em, x, dtype)


@register("Tensor.type_as")
def _type_as(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, other = parse(fname, args, kwargs, ("input", "other"))
    other = tensor_arg(fname, other)
    same_device(fname, x, other.meta.device)
    return cast(em, x, other.meta.dtype)


# -- views -----------------------------------------------------------------------------------


def permute(em: Emitter, fname: str, x: TensorVar, dims: tuple) -> TensorVar:
    ndim = x.meta.ndim
    norm = tuple(normalize_dim(fname, d, ndim) for d in dims)
    if sorted(norm) != list(range(ndim)):
        raise Unsupported(f"{fname}(): {dims!r} is not a permutation of {ndim} dims")
    return em.op("permute", (x, norm))


def swap_dims(em: Emitter, fname: str, x: TensorVar, a: Any, b: Any) -> TensorVar:
    ndim = x.meta.ndim
    dims = list(range(ndim))
    a, b = normalize_dim(fname, a, ndim), normalize_dim(fname, b, ndim)
    if ndim == 0:
        return em.op("permute", (x, ()))
    dims[a], dims[b] = dims[b], dims[a]
    return em.op("permute", (x, tuple(dims)))


@register("Tensor.permute")
def _permute_method(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    dims = dims_arg(fname, args[1:], kwargs, "dims")
    return permute(em, fname, tensor_arg(fname, args[0]), dims)


@register("torch.permute")
def _permute(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, dims = parse(fname, args, kwargs, ("input", "dims"))
    return permute(em, fname, tensor_arg(fname, x), tuple(dims))


@register(
    "torch.transpose", "torch.swapaxes", "torch.swapdims", "Tensor.transpose", "Tensor.swapaxes",
    "Tensor.swapdims")
def _transpose(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, a, b = parse(fname, args, kwargs, ("input", "dim0", "dim1"))
    return swap_dims(em, fname, tensor_arg(fname, x), a, b)


@register("torch.t", "Tensor.t")
def _t(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    (x,) = parse(fname, args, kwargs, ("input",))
    x = tensor_arg(fname, x)
    if x.meta.ndim > 2:
        raise Unsupported(f"{fname}() expects a tensor of at most 2 dims (eager raises)")
    return em.op("permute", (x, tuple(reversed(range(x.meta.ndim)))))


@register("torch.unsqueeze", "Tensor.unsqueeze")
def _unsqueeze(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, dim = parse(fname, args, kwargs, ("input", "dim"))
    x = tensor_arg(fname, x)
    return em.op("unsqueeze", (x, normalize_dim(fname, dim, x.meta.ndim + 1)))


@register("torch.squeeze", "Tensor.squeeze")
def _squeeze(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, dim = parse(fname, args, kwargs, ("input", "dim"), dim=None)
    x = tensor_arg(fname, x)
    ndim = x.meta.ndim
    if dim is None:
        dims = [i for i, s in enumerate(shape_of(x)) if s == 1]
    elif isinstance(dim, (tuple, list)):
        dims = sorted({normalize_dim(fname, d, ndim) for d in dim})
    else:
        return em.op("squeeze", (x, normalize_dim(fname, dim, ndim)))
    # One node per squeezed dim, highest dim first so the lower indices stay valid.
    out = x
    for d in reversed(dims):
        out = em.op("squeeze", (out, d))
    return out


def expand(em: Emitter, fname: str, x: TensorVar, sizes: tuple) -> TensorVar:
    shape = shape_of(x)
    lead = len(sizes) - len(shape)
    if lead < 0 or not all(type(s) in (int, torch.SymInt) for s in sizes):
        raise Unsupported(f"{fname}(): sizes {sizes!r} do not fit a {len(shape)}-d tensor")
    resolved = []
    for i, s in enumerate(sizes):
        if s == -1:
            if i < lead:
                raise Unsupported(f"{fname}(): -1 is not allowed in a new leading dim")
            s = shape[i - lead]
        resolved.append(s)
    return em.op("expand", (x, tuple(resolved)))


@register("Tensor.expand")
def _expand(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    sizes = dims_arg(fname, args[1:], kwargs, "size")
    return expand(em, fname, tensor_arg(fname, args[0]), sizes)


@register("torch.broadcast_to")
def _broadcast_to(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, size = parse(fname, args, kwargs, ("input", "size"))
    return expand(em, fname, tensor_arg(fname, x), tuple(size))


@register("Tensor.expand_as")
def _expand_as(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, other = parse(fname, args, kwargs, ("input", "other"))
    return expand(em, fname, tensor_arg(fname, x), shape_of(tensor_arg(fname, other)))


@register("Tensor.contiguous")
def _contiguous(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, fmt = parse(
        fname, args, kwargs, ("input", "memory_format"), memory_format=torch.contiguous_format)
    x = tensor_arg(fname, x)
    if fmt is not torch.contiguous_format:
        return relaid(em, fname, x, fmt)
    if x.meta.fake().is_contiguous():
        return x  # eager returns the tensor itself
    return em.op("contiguous", (x,))  # a row-major copy, as eager makes


def relaid(em: Emitter, fname: str, x: TensorVar, fmt: Any) -> Any:
    """``x`` laid out as ``fname(memory_format=fmt)`` lays it (``x.contiguous`` or
    ``x.to``, channels-last ones): ``x`` itself where eager returns it, else a copy in the
    strides eager gives (``to_eager_layout``), both read off the same call on ``x``'s meta
    tensor.  A format eager refuses (channels-last of a 3-d tensor) is eager's to raise."""
    if not isinstance(fmt, torch.memory_format) or fmt is torch.preserve_format:
        raise Unsupported(f"{fname}(memory_format={fmt!r}) is not supported")
    if x.meta.is_symbolic:
        raise Unsupported(f"{fname}(memory_format={fmt}) of dynamic sizes is not supported")
    fake = x.meta.fake()
    try:
        laid = getattr(fake, fname.rsplit(".", 1)[-1])(memory_format=fmt)
    except RuntimeError as e:
        raise Unsupported(f"{fname}(memory_format={fmt}): {e}") from None
    if laid is fake:
        return x
    return em.op("to_eager_layout", (x, tuple(laid.stride())))


# -- metadata --------------------------------------------------------------------------------


@register("Tensor.size", "Tensor.stride")
def _size_or_stride(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, dim = parse(fname, args, kwargs, ("input", "dim"), dim=None)
    size = fname.endswith("size")
    values = shape_of(x) if size else x.meta.strides()
    if dim is None:
        return torch.Size(values) if size else values
    return values[normalize_dim(fname, dim, len(values))]


def _numel(em: Emitter, x: TensorVar) -> Any:
    n = x.meta.numel()
    return x.meta.shapes.to_symint(n) if x.meta.is_symbolic else int(n)


register("Tensor.numel", "Tensor.nelement", "torch.numel")(_of_tensor(_numel))
register("Tensor.is_floating_point", "torch.is_floating_point")(_of_tensor(
    lambda em, x: x.meta.dtype.is_floating_point))
register("Tensor.is_complex", "torch.is_complex")(_of_tensor(
    lambda em, x: x.meta.dtype.is_complex))
register("Tensor.element_size")(_of_tensor(lambda em, x: x.meta.dtype.itemsize))
register("Tensor.is_contiguous")(_of_tensor(lambda em, x: x.meta.fake().is_contiguous()))


@register("torch.is_tensor")
def _is_tensor(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    (x,) = parse(fname, args, kwargs, ("obj",))
    return isinstance(x, TensorVar)


@register("torch.is_grad_enabled")
def _is_grad_enabled(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    parse(fname, args, kwargs, ())
    return em.grad_enabled  # the traced mode; the mode at entry is always guarded


def _mT(em: Emitter, x: TensorVar) -> Any:
    ndim = x.meta.ndim
    if ndim < 2:
        raise Unsupported("Tensor.mT needs a tensor of at least 2 dims (eager raises)")
    return swap_dims(em, "Tensor.mT", x, ndim - 2, ndim - 1)


ATTRIBUTES.update({
    "shape": lambda em, x: torch.Size(shape_of(x)),
    "dtype": lambda em, x: x.meta.dtype,
    "device": lambda em, x: x.meta.device,
    "ndim": lambda em, x: x.meta.ndim,
    "is_cuda": lambda em, x: x.meta.device.type == "cuda",
    "is_cpu": lambda em, x: x.meta.device.type == "cpu",
    "is_meta": lambda em, x: x.meta.device.type == "meta",
    "requires_grad": lambda em, x: x.meta.requires_grad,
    "layout": lambda em, x: torch.strided,
    # (a traced tensor is a dense one: nested, sparse and quantized ones are not traced)
    **dict.fromkeys(("is_nested", "is_sparse", "is_quantized"), lambda em, x: False),
    "T": lambda em, x: em.op("permute", (x, tuple(reversed(range(x.meta.ndim))))),
    "mT": _mT})
register("Tensor.dim", "Tensor.ndimension")(_of_tensor(ATTRIBUTES["ndim"]))
