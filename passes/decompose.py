"""Rewrite composite pointwise ops (relu, gelu, silu, clamp, the hard activations) into
primitives.

Each decomposition computes as eager does: float16/bfloat16 inputs are upcast to float32
("opmath"), the formula runs in float32 and the result is cast back once, so the rounding
matches PyTorch's own kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat
from minicompile.graph import Graph, Node, TensorMeta, copy_graph, flatten_nodes
from minicompile.ir import LOW_PRECISION
from minicompile.ops import infer_meta

from minicompile.passes.decompose_attention import ATTENTION_DECOMPOSITIONS
from minicompile.passes.decompose_losses import LOSS_DECOMPOSITIONS
from minicompile.passes.decompose_reductions import REDUCTION_DECOMPOSITIONS
from minicompile.passes.decompose_views import VIEW_DECOMPOSITIONS


class _Builder:
    """Emits prim nodes carrying the source stack of the node being decomposed."""

    def __init__(self, graph: Graph, origin: Node) -> None:
        self.graph = graph
        self.origin = origin

    def __call__(self, op: str, *args: Any, **kwargs: Any) -> Node:
        meta = self.origin.meta
        device = (meta[0] if isinstance(meta, tuple) else meta).device  # type: ignore[union-attr]
        meta = infer_meta(op, args, kwargs, device, self.graph.shapes)
        if op != "detach" and self.requires_grad and not isinstance(meta, tuple) and (
            meta.dtype.is_floating_point
            and any(a.requires_grad for a in flatten_nodes((args, kwargs)))
        ):  # differentiable where the op it replaces is (passes/autograd.py reads this)
            meta = dataclasses.replace(meta, requires_grad=True)
        return self.graph.call(op, args, kwargs, meta, self.origin.stack)

    @property
    def requires_grad(self) -> bool:
        return self.origin.requires_grad

    def opmath(self, x: Node) -> Node:
        if x.meta.dtype in LOW_PRECISION:  # type: ignore[union-attr]
            return self("to_dtype", x, dtype=torch.float32)
        return x

    def restore(self, y: Node, dtype: torch.dtype | None = None) -> Node:
        """``y`` cast back to the decomposed node's dtype (or ``dtype``)."""
        dtype = dtype or self.origin.meta.dtype  # type: ignore[union-attr]
        return y if y.meta.dtype == dtype else self("to_dtype", y, dtype=dtype)  # type: ignore[union-attr]


def _relu(b: _Builder, x: Node) -> Node:
    # where(x < 0, 0, x) keeps NaN (and -0.0) as torch.relu does.
    out = b("where", b("lt", x, 0), 0, x)
    if b.requires_grad:  # eager's gradient is zero wherever x <= 0: at 0 too (after an
        # earlier relu, many inputs are exactly 0), not one as the where above would give
        out = b("where", b("le", x, 0), b("detach", out), x)
    return out


def _gelu(b: _Builder, x: Node, approximate: str = "none") -> Node:
    x = b.opmath(x)
    if approximate == "tanh":
        cube = b("mul", b("mul", x, x), x)
        inner = b("mul", b("add", x, b("mul", cube, 0.044715)), math.sqrt(2.0 / math.pi))
        cdf = b("mul", b("add", b("tanh", inner), 1.0), 0.5)
    else:
        cdf = b("mul", b("add", b("erf", b("mul", x, math.sqrt(0.5))), 1.0), 0.5)
    return b.restore(b("mul", x, cdf))


def _silu(b: _Builder, x: Node) -> Node:
    x = b.opmath(x)  # x / (1 + exp(-x)), the formula of PyTorch's own kernels
    return b.restore(b("truediv", x, b("add", b("exp", b("neg", x)), 1.0)))


def _clamp(b: _Builder, x: Node, min: Any = None, max: Any = None) -> Node:
    # Comparisons are false for NaN, so NaN passes through as torch.clamp lets it.
    out = x
    if min is not None:
        out = b("where", b("lt", out, min), min, out)
    if max is not None:
        out = b("where", b("gt", out, max), max, out)
    if b.requires_grad and x.meta.dtype.is_floating_point:
        stop = b("ne", x, x)  # eager: no gradient to a NaN
        if not compat.clamp_gradient_at_bounds():  # PyTorch 2.14: none at a bound either
            for bound in (v for v in (min, max) if v is not None):
                stop = b("logical_or", stop, b("eq", x, bound))
        out = b("where", stop, b("detach", out), out)
    return out


def _hardtanh(b: _Builder, x: Node, min_val: float = -1.0, max_val: float = 1.0,
              inplace: bool = False) -> Node | None:
    """``F.hardtanh`` (nn.ReLU6's call): clamp, with the gradient of eager's kernel: one
    strictly between the bounds, zero at them (clamp's is one) and beyond; at NaN, the
    device's convention (zero in the CPU's vectorised kernel, one on CUDA)."""
    if not x.meta.dtype.is_floating_point:  # type: ignore[union-attr]
        return None
    lo, hi = float(min_val), float(max_val)
    out = b("where", b("lt", x, lo), lo, b("where", b("gt", x, hi), hi, x))
    if not b.requires_grad:
        return out
    at_lo, at_hi, at_nan = _corner_gradients(b, "hardtanh", (lo, hi), (lo, hi), (0.0, 0.0, 0.0))
    if at_lo not in (0.0, 1.0) or at_hi not in (0.0, 1.0) or at_nan not in (0.0, 1.0):
        return None
    passes = b("logical_and", b("ge" if at_lo else "gt", x, lo), b("le" if at_hi else "lt", x, hi))
    if at_nan:
        passes = b("logical_or", passes, b("ne", x, x))
    return b("where", passes, out, b("detach", out))


def _relu6(b: _Builder, x: Node, inplace: bool = False) -> Node | None:
    return _hardtanh(b, x, 0.0, 6.0)


def _hardswish(b: _Builder, x: Node, inplace: bool = False) -> Node | None:
    """``x * clamp(x + 3, 0, 6) / 6`` as eager computes it: zero below -3, ``x (x + 3) / 6``
    between, ``x`` above, each corner's and NaN's gradient the device's convention (the
    CPU's vectorised kernel and PyTorch 2.11's CUDA kernel: zero at -3, one at 3 and at NaN;
    PyTorch's main branch on CUDA: -1/2 at -3, 3/2 at 3)."""
    if not x.meta.dtype.is_floating_point:  # type: ignore[union-attr]
        return None
    at_lo, at_hi, at_nan = _corner_gradients(b, "hardswish", (-3.0, 3.0), (), (0.0, 1.0, 1.0))
    if at_lo not in (0.0, -0.5) or at_hi not in (1.0, 1.5) or at_nan not in (0.0, 1.0):
        return None
    x = b.opmath(x)
    low = b("le" if at_lo == 0 else "lt", x, -3.0)
    inside = b("logical_and", b("gt" if at_lo == 0 else "ge", x, -3.0),
               b("lt" if at_hi == 1 else "le", x, 3.0))  # (NaN is in no piece: the last)
    # the middle piece's gradient (0 where not taken) times an infinite x would be NaN
    xm = b("where", inside, x, 0.0) if b.requires_grad else x
    out = b("where", low, b("truediv", b("mul", x, 0.0), 6.0),  # (-inf gives NaN, as eager's)
            b("where", inside, b("truediv", b("mul", xm, b("add", xm, 3.0)), 6.0),
              b("truediv", b("mul", x, 6.0), 6.0)))
    if b.requires_grad and at_nan == 0:
        out = b("where", b("ne", x, x), b("detach", out), out)
    return b.restore(out)


def _hardsigmoid(b: _Builder, x: Node, inplace: bool = False) -> Node | None:
    """``clamp(x + 3, 0, 6) / 6``; its gradient is 1/6 strictly between -3 and 3 and zero
    beyond; at the corners and NaN, the device's convention (zero on the CPU and CUDA)."""
    if not x.meta.dtype.is_floating_point:  # type: ignore[union-attr]
        return None
    sixth = torch.tensor(1 / 6).item()  # (as float32 rounds it: the probe's value)
    at_lo, at_hi, at_nan = _corner_gradients(b, "hardsigmoid", (-3.0, 3.0), (), (0.0, 0.0, 0.0))
    if not {at_lo, at_hi, at_nan} <= {0.0, sixth}:
        return None
    x = b.opmath(x)
    out = b("where", b("le" if at_lo == 0 else "lt", x, -3.0), 0.0,
            b("where", b("ge" if at_hi == 0 else "gt", x, 3.0), 1.0,
              b("truediv", b("add", x, 3.0), 6.0)))
    if b.requires_grad and at_nan == 0:
        out = b("where", b("ne", x, x), b("detach", out), out)
    return b.restore(out)


def _corner_gradients(b: _Builder, name: str, corners: tuple[float, float], args: tuple,
                      cpu: tuple[float, ...]) -> tuple[float, ...]:
    """Eager's gradient of ``F.<name>(x, *args)`` at its two ``corners`` and at NaN, on the
    decomposed node's device.  These are each kernel's own conventions: the CPU's vectorised
    kernels, CUDA's and each release's differ.  On the CPU they are ``cpu`` (a probe of
    three values would run the scalar tail loop instead)."""
    device = b.origin.meta.device  # type: ignore[union-attr]
    if not b.requires_grad or device.type == "cpu":
        return cpu
    return _probe(name, str(device), corners, args)


@functools.cache
def _probe(name: str, device: str, corners: tuple[float, float], args: tuple
           ) -> tuple[float, ...]:
    x = torch.tensor([*corners, math.nan], device=device, requires_grad=True)
    with torch.enable_grad():
        getattr(torch.nn.functional, name)(x, *args).sum().backward()
    return tuple(x.grad.tolist())  # type: ignore[union-attr]


def _filled(value: bool) -> Callable[..., Node | None]:
    """``x.new_ones(size)`` / ``x.new_zeros(size)`` of static sizes (transformers' mask
    helpers start from ``q_idx.new_ones((), dtype=torch.bool)``): values made in the kernels
    that read them, from an ``iota`` compared with 0, instead of a library call."""

    def rule(b: _Builder, x: Node, *size: Any, **kwargs: Any) -> Node | None:
        meta = b.origin.meta
        if set(kwargs) - {"dtype", "device"} or any(not s.is_Integer or s == 0
                                                    for s in meta.shape):
            return None
        shape = tuple(int(s) for s in meta.shape) or (1,)
        position = b("iota", shape, 0, meta.device)
        filled = b("ge" if value else "lt", position, 0)
        if not meta.shape:
            filled = b("reshape", filled, ())
        return b.restore(filled)

    return rule


# The composite ops of minicompile/ops.py.
DECOMPOSITIONS: dict[str, Callable[..., Node]] = {"relu": _relu, "gelu": _gelu, "silu": _silu,
                                                  "clamp": _clamp}
FILLED = {"torch.Tensor.new_ones": _filled(True), "torch.Tensor.new_zeros": _filled(False)}
# Library calls the capture keeps (their torch.nn.functional names) that are pointwise:
# fused, where the library call would be a kernel of its own and, in training, recorded
# for autograd with a backward call of its own.
ACTIVATION_DECOMPOSITIONS: dict[str, Callable[..., Node | None]] = {
    f"torch.nn.functional.{name}": rule for name, rule in (
        ("hardtanh", _hardtanh), ("relu6", _relu6), ("hardswish", _hardswish),
        ("hardsigmoid", _hardsigmoid))}


def _lay_out_as(out: Node, meta: TensorMeta, start: int) -> None:
    """A result is laid out as eager lays out the op it replaces (a softmax of a transposed
    tensor is contiguous), not as its last primitive would be.  Only nodes the rule made
    (index >= ``start``) are changed."""
    if out.index >= start and out.meta.shape == meta.shape and out.meta.dtype == meta.dtype:
        out.meta = dataclasses.replace(out.meta, stride=meta.stride)


_RULES = {**DECOMPOSITIONS, **ACTIVATION_DECOMPOSITIONS, **REDUCTION_DECOMPOSITIONS,
          **LOSS_DECOMPOSITIONS, **VIEW_DECOMPOSITIONS, **FILLED, **ATTENTION_DECOMPOSITIONS}


def decompose(graph: Graph) -> Graph:
    """Return a copy of ``graph`` with every composite op replaced by primitives."""

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        rule = _RULES.get(node.target)
        if rule is None:
            return None
        # A rule returns None for forms it leaves to the library call.
        start = len(new.nodes)
        out = rule(_Builder(new, node), *remap(node.args), **remap(node.kwargs))
        if isinstance(out, tuple):
            # A tuple result (max(x, dim): values, indices) stands for the op in ``env``;
            # its getitem users pick their element (_getitem in decompose_views.py).
            for item, meta in zip(out, node.meta):
                _lay_out_as(item, meta, start)
        elif out is not None and isinstance(node.meta, TensorMeta):
            _lay_out_as(out, node.meta, start)
        return out

    return copy_graph(graph, rewrite)
