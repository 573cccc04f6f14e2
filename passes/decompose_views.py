"""Views reached as library calls (``view``, ``reshape``, ``flatten``, ``split``, ``chunk``,
``unbind``, ``narrow``, ``select``, basic ``x[...]`` indexing) rewritten into the native
view ops (``reshape``, ``slice``, ``select``, ``unsqueeze``), which lowering turns into
index rewrites: no copy, and fusion sees through them.  The target shapes come from the
nodes' metadata (PyTorch's own rules); forms not handled stay library calls (None)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy
import torch

from minicompile.graph import Node

Builder = Any
SPLITS = ("torch.Tensor.split", "torch.split", "torch.Tensor.chunk", "torch.chunk")
UNBINDS = ("torch.Tensor.unbind", "torch.unbind")


def _reshape(b: Builder, x: Any, *args: Any, **kwargs: Any) -> Node | None:
    if not isinstance(x, Node) or isinstance(b.origin.meta, tuple):
        return None
    if b.origin.meta.dtype != x.meta.dtype:
        return None  # view(dtype) reinterprets bits
    return b("reshape", x, tuple(b.origin.meta.shape))


def _int(value: Any) -> Any:
    """A size argument: an int where it is a number, else the sympy expression."""
    value = sympy.sympify(value)
    return int(value) if value.is_Integer else value


def _dim_of(args: tuple, kwargs: dict, position: int, ndim: int, default: int = 0) -> int:
    dim = kwargs.get("dim", args[position] if len(args) > position else default)
    return dim % ndim


def _piece(b: Builder, source: Node, index: int) -> Node | None:
    """Element ``index`` of a split/chunk/unbind, as a slice or select of its input."""
    if source.target not in SPLITS + UNBINDS or not isinstance(index, int):
        return None
    x = source.args[0]
    metas = source.meta
    if source.target in UNBINDS:
        dim = _dim_of(source.args, source.kwargs, 1, x.meta.ndim)
        return b("select", x, dim, index % len(metas))
    dim = _dim_of(source.args, source.kwargs, 2, x.meta.ndim)
    index %= len(metas)
    start = sum((m.shape[dim] for m in metas[:index]), sympy.Integer(0))
    return b("slice", x, dim, _int(start), _int(start + metas[index].shape[dim]), 1)


def _getitem(b: Builder, source: Any, index: Any) -> Node | None:
    if isinstance(source, tuple):  # a decomposed tuple result: its element, as it is
        return source[index]
    return _piece(b, source, index) if isinstance(source, Node) else None


def _narrow(b: Builder, x: Node, dim: int, start: Any, length: int) -> Node | None:
    if not isinstance(start, int) or not isinstance(length, int):
        return None
    dim %= x.meta.ndim
    if not x.meta.shape[dim].is_Integer:
        return None
    start %= max(int(x.meta.shape[dim]), 1) if start < 0 else start + 1
    return b("slice", x, dim, start, start + length, 1)


def _select(b: Builder, x: Node, dim: int, index: int) -> Node | None:
    dim %= x.meta.ndim
    size = x.meta.shape[dim]
    if not size.is_Integer:  # capture checked the index against the size (a guard)
        return b("select", x, dim, _int(index + size if index < 0 else index))
    return b("select", x, dim, index % int(size))


def _static(*nodes: Node) -> list[tuple[int, ...]] | None:
    shapes = [n.meta.shape for n in nodes]
    if any(not s.is_Integer or s == 0 for shape in shapes for s in shape):
        return None
    return [tuple(int(s) for s in shape) for shape in shapes]


def _tensor_index(b: Builder, x: Node, key: tuple[Node, ...]) -> Node | None:
    """``x[i0, i1, ...]`` with integer tensors for its leading dims (static sizes): an
    index_select of the rows of ``i0``, broadcast to the indices' shape, then a gather per
    further index; negative indices wrapped as eager wraps them.  Lowering reads positions
    that come from an ``iota`` (transformers' ``padding_mask[batch_idx, kv_idx]``)
    directly."""
    shapes = _static(x, b.origin, *key)
    if shapes is None or not 0 < len(key) <= x.meta.ndim or any(
            k.meta.dtype not in (torch.int64, torch.int32) for k in key):
        return None
    (sizes, out, *indices), k = shapes, len(key)
    lead = out[:len(out) - (len(sizes) - k)]  # the indices' broadcast shape
    m = len(lead)

    def wrapped(j: int) -> Node:
        index = key[j]
        if index.meta.dtype != torch.int64:
            index = b("to_dtype", index, dtype=torch.int64)
        return b("where", b("lt", index, 0), b("add", index, sizes[j]), index)

    rows = b("index_select", x, 0, b("reshape", wrapped(0), (math.prod(indices[0]),)))
    rows = b("reshape", rows, (1,) * (m - len(indices[0])) + indices[0] + sizes[1:])
    y = b("expand", rows, lead + sizes[1:])
    for j in range(1, k):
        index, tail = wrapped(j), sizes[j + 1:]
        index = b("reshape", b("expand", index, lead), lead + (1,) * (1 + len(tail)))
        y = b("gather", y, m, b("expand", index, lead + (1,) + tail))
        y = b("reshape", y, lead + tail)
    return y


def _index(b: Builder, x: Node, key: Any) -> Node | None:
    """Basic indexing: ints, slices, None and one Ellipsis; or integer tensors alone."""
    key = key if isinstance(key, tuple) else (key,)
    if key and all(isinstance(k, Node) for k in key):
        return _tensor_index(b, x, key)
    if any(isinstance(k, (Node, torch.Tensor, list, bool)) for k in key):
        return None
    if sum(k is Ellipsis for k in key) > 1:
        return None
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (x.meta.ndim - used) + key[at + 1:]
    out, dim = x, 0
    for k in key:
        if k is None:
            out = b("unsqueeze", out, dim)
            dim += 1
        elif isinstance(k, int) and not out.meta.shape[dim].is_Integer:
            size = out.meta.shape[dim]  # capture checked k against the size (a guard)
            out = b("select", out, dim, _int(k + size if k < 0 else k))
        elif isinstance(k, slice) and not out.meta.shape[dim].is_Integer:
            if k != slice(None):
                return None  # a slice of a symbolic size: left to PyTorch
            dim += 1
        elif isinstance(k, int):
            size = int(out.meta.shape[dim])
            out = b("select", out, dim, k % size if size else k)
        elif isinstance(k, slice):
            if any(isinstance(v, sympy.Basic) and v.free_symbols for v in (k.start, k.stop,
                                                                            k.step)):
                return None  # symbolic bounds (buffer[:, :n]): left to PyTorch
            size = int(out.meta.shape[dim])
            start, stop, step = k.indices(size)
            if step <= 0:
                return None
            stop = max(stop, start)
            if (start, stop, step) != (0, size, 1):
                out = b("slice", out, dim, start, stop, step)
            dim += 1
        else:
            return None
    if out is x and x.meta.ndim and x.meta.shape[0].is_Integer:  # x[:, 0:]: all of x, a view
        out = b("slice", x, 0, 0, int(x.meta.shape[0]), 1)
    return out if out is not x else None


def _embedding(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    names = ("input", "weight", "padding_idx", "max_norm")
    a = dict(zip(names, args), **kwargs)
    if a.get("max_norm") is not None or a.get("sparse"):
        return None  # max_norm renormalises the weight in place
    if b.requires_grad and (a.get("padding_idx") is not None or a.get("scale_grad_by_freq")):
        return None  # their gradients differ: PyTorch's own backward gives them
    return b("embedding", a["weight"], a["input"])


def _index_select(b: Builder, x: Node, dim: int, index: Node) -> Node | None:
    if not isinstance(index, Node) or index.meta.ndim > 1:
        return None
    if x.meta.ndim == 0:  # as eager: a 0-dim input is a row of one element (index 0)
        picked = b("index_select", b("reshape", x, (1,)), 0, index)
        return b("reshape", picked, b.origin.meta.shape)
    return b("index_select", x, dim % x.meta.ndim, index)


def _gather(b: Builder, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> Node | None:
    if not isinstance(index, Node):
        return None
    if x.meta.ndim == 0:  # as eager: a 0-dim input (and index) is a row of one element
        row = b("reshape", index, (1,)) if index.meta.ndim == 0 else index
        picked = b("gather", b("reshape", x, (1,)), 0, row)
        return b("reshape", picked, b.origin.meta.shape)
    return b("gather", x, dim % x.meta.ndim, index)


VIEW_DECOMPOSITIONS: dict[str, Callable[..., Node | None]] = {
    **dict.fromkeys(("torch.Tensor.view", "torch.Tensor.reshape", "torch.reshape",
                     "torch.Tensor.flatten", "torch.flatten", "torch.Tensor.unflatten",
                     "torch.Tensor.view_as", "torch.Tensor.reshape_as"), _reshape),
    **{f"{prefix}.{name}": rule for prefix in ("torch", "torch.Tensor") for name, rule in (
        ("narrow", _narrow), ("select", _select), ("index_select", _index_select),
        ("gather", _gather))},
    "getitem": _getitem, "torch.Tensor.__getitem__": _index,
    "torch.nn.functional.embedding": _embedding,
}
