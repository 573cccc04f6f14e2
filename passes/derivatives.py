"""Derivative rules: one per prim op, the way micrograd and tinygrad keep theirs.

``rule(d, node, g)`` gets the node and ``g``, the gradient of the loss with respect to its
value, and returns one gradient per argument (None for none).  ``d`` is a
:class:`passes.autograd.Differentiator`: ``d(op, *args)`` emits a prim, ``d.fwd(x)`` is the
forward value ``x`` as the backward sees it (saved or recomputed).  PyTorch's conventions
hold: a broadcast argument's gradient is summed over its broadcast dims; float16/bfloat16
get gradients of their own dtype; floor, sign, round give none.  Library calls other
than :data:`LIBRARY_RULES`' (matrix products, convolutions) are recorded with PyTorch's
autograd, and its backward kernels run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat, ops
from minicompile.graph import Node, flatten_nodes, map_nodes
from minicompile.lowering import constant_pads
from minicompile.meta_rules import int_tuple
from minicompile.op_table import ROWS, ZERO

from minicompile.passes import depthwise_grad
from minicompile.passes.decompose_reductions import bind
from minicompile.passes.layout import overlaps, plain, same_layout
from minicompile.runtime import custom_op_grads
from minicompile.runtime.autograd import (
    conv_backward,
    embedding_backward,
    max_pool2d_backward,
)

Rule = Callable[..., tuple]


def sum_to(d: Any, g: Node, shape: tuple) -> Node:
    """``g`` summed over the dims that broadcasting added to a value of ``shape``."""
    gshape = tuple(g.meta.shape)
    if gshape == tuple(shape):
        return g
    lead = len(gshape) - len(shape)
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1
    )
    if dims:
        g = d("sum", g, dims, True)
    if tuple(g.meta.shape) != tuple(shape):
        g = d("reshape", g, tuple(shape))
    return g


def _unary(fn: Callable[[Any, Node, Node, Node], Node]) -> Rule:
    """A rule for y = op(x) from ``fn(d, x, y, g) -> gx`` (x and y forward values)."""

    def rule(d: Any, node: Node, g: Node) -> tuple:
        x = node.args[0]
        return (fn(d, lambda: d.fwd(x), lambda: d.fwd(node), g),)

    return rule


def _zero(d: Any, node: Node, g: Node) -> tuple:
    return (None,) * len(node.args)


# Unary ops' derivatives are their rows' (minicompile/op_table.py).
UNARY_RULES: dict[str, Rule] = {
    row.name: _zero if row.grad == ZERO else _unary(row.grad)
    for row in ROWS if row.family == "unary" and row.grad is not None
}


def _binary(fa: Callable | None, fb: Callable | None) -> Rule:
    """A rule for y = op(a, b); ``fa(d, a, b, y, g)`` / ``fb(...)`` give the gradients
    before un-broadcasting (a, b, y are thunks of forward values; numbers stay numbers)."""

    def rule(d: Any, node: Node, g: Node) -> tuple:
        a, b = node.args[0], node.args[1]
        va = (lambda: d.fwd(a)) if isinstance(a, Node) else (lambda: a)
        vb = (lambda: d.fwd(b)) if isinstance(b, Node) else (lambda: b)
        vy = lambda: d.fwd(node)  # noqa: E731
        return tuple(sum_to(d, f(d, va, vb, vy, g), arg.meta.shape)
                     if isinstance(arg, Node) and f is not None and d.needs(arg) else None
                     for arg, f in ((a, fa), (b, fb)))

    return rule


def _pow_base(d: Any, a: Callable, b: Callable, y: Callable, g: Node) -> Node:
    exponent = b()
    if isinstance(exponent, (int, float)):
        if exponent == 0:
            return d("mul", g, 0.0)
        return d("mul", g, d("mul", d("pow", a(), exponent - 1), exponent))
    # where(b == 0, 0, b * a^(b-1)), as PyTorch's pow_backward_self
    term = d("mul", exponent, d("pow", a(), d("sub", exponent, 1.0)))
    return d("mul", g, d("where", d("eq", exponent, 0.0), 0.0, term))


def _pow_exponent(d: Any, a: Callable, b: Callable, y: Callable, g: Node) -> Node:
    base = a()
    if isinstance(base, (int, float)):
        return d("mul", g, d("mul", y(), math.log(base) if base > 0 else float("nan")))
    # where(a == 0 and b >= 0, 0, y * log(a)), as PyTorch's pow_backward_exponent
    cond = d("logical_and", d("eq", base, 0.0), d("ge", b(), 0.0))
    return d("mul", g, d("where", cond, 0.0, d("mul", y(), d("log", base))))


def _extreme_pair(loses: str) -> tuple[Callable, Callable]:
    """maximum/minimum's (fa, fb): the gradient goes to the chosen argument, split evenly on
    ties; a NaN on either side passes it to both (PyTorch's max/min backward)."""

    def share(d: Any, x: Node, other: Any, g: Node) -> Node:
        split = d("where", d("eq", x, other), 0.5, d("where", d(loses, x, other), 0.0, 1.0))
        return d("mul", g, split)

    return (lambda d, a, b, y, g: share(d, a(), b(), g),
            lambda d, a, b, y, g: share(d, b(), a(), g))

BINARY_RULES: dict[str, Rule] = {
    "add": _binary(lambda d, a, b, y, g: g, lambda d, a, b, y, g: g),
    "sub": _binary(lambda d, a, b, y, g: g, lambda d, a, b, y, g: d("neg", g)),
    "mul": _binary(lambda d, a, b, y, g: d("mul", g, b()), lambda d, a, b, y, g: d("mul", g, a())),
    "truediv": _binary(
        lambda d, a, b, y, g: d("truediv", g, b()),
        lambda d, a, b, y, g: d("neg", d("truediv", d("mul", g, a()), d("mul", b(), b()))),
    ),
    "pow": _binary(_pow_base, _pow_exponent),
    "maximum": _binary(*_extreme_pair("lt")),
    "minimum": _binary(*_extreme_pair("gt")),
    "remainder": _binary(
        lambda d, a, b, y, g: g,
        lambda d, a, b, y, g: d("mul", d("neg", g), d("floor", d("truediv", a(), b()))),
    ),
    # div(rounding_mode="floor") has a zero derivative (``x // y`` raises in eager instead)
    "floordiv": _zero,
}


def _where(d: Any, node: Node, g: Node) -> tuple:
    cond, a, b = node.args
    c = d.fwd(cond)
    return (None, *(sum_to(d, d("where", c, *picks), x.meta.shape)
                    if isinstance(x, Node) and d.needs(x) else None
                    for x, picks in ((a, (g, 0.0)), (b, (0.0, g)))))


def _copy_back(d: Any, node: Node, g: Node) -> tuple:
    """The gradient goes back in its input's layout (a weight's, as eager gives it)."""
    x = node.args[0]
    hints = d.graph.shapes.hints if d.graph.shapes is not None else {}
    if overlaps(x.meta, hints) or same_layout(g.meta, x.meta):
        return (g, None)
    return (d("to_eager_layout", g, plain(x.meta.stride)), None)


# -- views ------------------------------------------------------------------------------------


def _permute(d: Any, node: Node, g: Node) -> tuple:
    dims = node.args[1]
    inverse = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
    return (d("permute", g, inverse), None)


def _reshape_back(d: Any, node: Node, g: Node) -> tuple:
    return (d("reshape", g, tuple(node.args[0].meta.shape)),) + (None,) * (len(node.args) - 1)


def _pad_along(d: Any, g: Node, dim: int, start: Any, size: Any) -> Node:
    """``g`` placed at ``start`` along ``dim`` of a zero tensor whose dim is ``size`` long: a
    cat of zero blocks and ``g`` (lowered as piecewise reads, fused with its readers)."""
    after = size - start - g.meta.shape[dim]
    if start == 0 and after == 0:
        return g
    # A zero of g's dtype made of prims (not a library call): constant in the fused cat.
    zero = d("reshape", d("to_dtype", d("iota", (1,), 0, g.meta.device), dtype=g.meta.dtype), ())

    def block(width: Any) -> Node:
        shape = tuple(width if k == dim else s for k, s in enumerate(g.meta.shape))
        return d("expand", zero, shape)

    pieces = ([block(start)] if start != 0 else []) + [g] + ([block(after)] if after != 0 else [])
    return d.extern(torch.cat, pieces, dim)


def _slice(d: Any, node: Node, g: Node) -> tuple:
    x, dim, start, end, step = node.args
    size = x.meta.shape[dim]
    if step != 1:
        base = d.extern(torch.Tensor.new_zeros, g, tuple(x.meta.shape))
        return (d.extern(torch.slice_scatter, base, g, dim, start, end, step),) + (None,) * 4
    return (_pad_along(d, g, dim, start, size),) + (None,) * 4


def _select(d: Any, node: Node, g: Node) -> tuple:
    x, dim, index = node.args
    size = x.meta.shape[dim]
    if not isinstance(index, int):
        base = d.extern(torch.Tensor.new_zeros, g, tuple(x.meta.shape))
        return (d.extern(torch.select_scatter, base, g, dim, index), None, None)
    index = index % int(size) if index < 0 else index
    return (_pad_along(d, d("unsqueeze", g, dim), dim, index, size), None, None)


# -- reductions ---------------------------------------------------------------------------


def _kept(d: Any, node: Node, g: Node) -> Node:
    """The reduction's gradient with the reduced dims kept (size 1)."""
    x, dims, keepdim = node.args
    if keepdim:
        return g
    shape = tuple(1 if k in dims else s for k, s in enumerate(x.meta.shape))
    return d("reshape", g, shape)


def _sum(d: Any, node: Node, g: Node) -> tuple:
    x = node.args[0]
    return (d("expand", _kept(d, node, g), tuple(x.meta.shape)), None, None)


def _extreme(d: Any, node: Node, g: Node) -> tuple:
    """amax/amin: the gradient split evenly among the elements equal to the extreme."""
    x, dims, _ = node.args
    y = _kept(d, node, d.fwd(node))
    maskf = d("to_dtype", d("eq", d.fwd(x), y), dtype=g.meta.dtype)
    count = d("sum", maskf, dims, True)
    # (g / count) * mask, as PyTorch's amax_backward: a NaN row gets NaN gradients
    return (d("mul", d("truediv", _kept(d, node, g), count), maskf), None, None)


# -- index ops ------------------------------------------------------------------------------


def _embedding(d: Any, node: Node, g: Node) -> tuple:
    weight, indices = node.args
    width = weight.meta.shape[1]
    flat = d("reshape", g, (-1, width)) if g.meta.ndim != 2 else g
    span = _arange_span(indices)
    rows = weight.meta.shape[0]
    if span is not None and getattr(rows, "is_Integer", False) and 0 <= span[0] \
            and sum(span) <= int(rows):  # rows start..start+count-1 read once each
        return (_pad_along(d, flat, 0, span[0], rows), None)
    idx = d("reshape", d.fwd(indices), (-1,))
    base = d.extern(torch.Tensor.new_zeros, g, tuple(weight.meta.shape))
    return (d.extern(torch.index_add, base, 0, idx, flat), None)


def _arange_span(x: Node) -> tuple[int, int] | None:
    """``(start, n)`` if ``x`` holds start, start + 1, ..., start + n - 1 in order
    (``torch.arange(n)``, maybe reshaped or plus integers: a position embedding's indices,
    BART's offset by 2), else None."""
    start = 0
    while x.op == "call" and (x.target in ("reshape", "unsqueeze", "squeeze") or (
            x.target == "add" and type(x.args[1]) is int)):
        start += x.args[1] if x.target == "add" else 0
        x = x.args[0]
    if x.op == "call" and x.target == "iota" and len(x.args[0]) == 1:
        n = x.args[0][0]
        return (start, int(n)) if isinstance(n, int) or getattr(n, "is_Integer", False) else None
    return None


def add_gradients(d: Any, a: Node, b: Node) -> Node:
    """``a + b``, two gradients of one value; where one is an index_add into zeros (an
    embedding's, a tied weight's), the other is the base it adds into (no zeros, no add)."""
    scatter = ops.extern_op(torch.index_add)
    zeros = ops.extern_op(torch.Tensor.new_zeros)
    for x, y in ((a, b), (b, a)):
        if (x.op == "call" and x.target == scatter and isinstance(x.args[0], Node)
                and x.args[0].target == zeros
                and x.meta.dtype == y.meta.dtype and len(x.users) == 0):
            return d.extern(torch.index_add, y, *x.args[1:])
    return d("add", a, b)


def _index_select(d: Any, node: Node, g: Node) -> tuple:
    x, dim, index = node.args
    base = d.extern(torch.Tensor.new_zeros, g, tuple(x.meta.shape))
    return (d.extern(torch.index_add, base, dim, d.fwd(index), g), None, None)


def _gather(d: Any, node: Node, g: Node) -> tuple:
    x, dim, index = node.args[:3]
    shape = tuple(x.meta.shape)
    picks_one = all(s.is_Integer for s in shape) and len(node.args) == 3 and not node.kwargs
    picks_one = picks_one and index.meta.shape[dim] == 1 and all(
        s == t for k, (s, t) in enumerate(zip(index.meta.shape, shape)) if k != dim)
    if picks_one:  # one element per row (a loss's target class): a fused one-hot
        position = d("iota", tuple(int(s) for s in shape), dim, x.meta.device)
        hit = d("eq", position, d("expand", d.fwd(index), shape))
        return (d("where", hit, d("expand", g, shape), 0.0), None, None)
    return (scattered(d, g, x, dim, d.fwd(index)),) + (None,) * (len(node.args) - 1)


def scattered(d: Any, g: Node, x: Node, dim: int, index: Node) -> Node:
    """The gradient of ``x`` gathered at ``index`` along ``dim``: ``g`` added into zeros of
    ``x``'s shape there (gather; topk and sort's values)."""
    base = d.extern(torch.Tensor.new_zeros, g, tuple(x.meta.shape))
    return d.extern(torch.scatter_add, base, dim, index, g)


RULES: dict[str, Rule] = {
    **UNARY_RULES, **BINARY_RULES, "where": _where, "permute": _permute, "slice": _slice,
    "to_dtype": lambda d, node, g: (d("to_dtype", g, dtype=node.args[0].meta.dtype),),
    "contiguous": lambda d, node, g: (g,),
    "expand": lambda d, node, g: (sum_to(d, g, node.args[0].meta.shape), None),
    **dict.fromkeys(("to_channels_last", "to_eager_layout"), _copy_back),
    **dict.fromkeys(("unsqueeze", "squeeze", "reshape"), _reshape_back),
    "select": _select, "sum": _sum, "amax": _extreme, "amin": _extreme,
    "embedding": _embedding, "index_select": _index_select, "gather": _gather,
}


# -- matrix products: their gradients are matrix products (library calls of the backward)


def _swap_last(d: Any, x: Node) -> Node:
    n = x.meta.ndim
    return d("permute", x, tuple(range(n - 2)) + (n - 1, n - 2))


def _matmul_grads(d: Any, a: Node, b: Node, g: Node) -> tuple[Node | None, Node | None]:
    """a @ b for a, b of 2+ dims (batch dims broadcast): dA = g @ b^T, dB = a^T @ g, each
    summed back over the batch dims that broadcasting added."""
    ga = gb = None
    if d.needs(a):
        ga = sum_to(d, d.extern(torch.matmul, g, _swap_last(d, d.fwd(b))), a.meta.shape)
    if d.needs(b):
        av = d.fwd(a)
        if b.meta.ndim == 2 and a.meta.ndim > 2:  # fold a's batch dims into the product
            k = a.meta.shape[-1]
            av = d("reshape", av, (-1, k))
            g = d("reshape", g, (-1, g.meta.shape[-1]))
        gb = sum_to(d, d.extern(torch.matmul, _swap_last(d, av), g), b.meta.shape)
    return ga, gb


def matmul_rule(d: Any, node: Node, g: Node) -> list | None:
    """torch.matmul / mm / bmm / @ of tensors with 2+ dims; None for other forms."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if not (isinstance(a, Node) and isinstance(b, Node)) or a.meta.ndim < 2 or b.meta.ndim < 2:
        return None
    ga, gb = _matmul_grads(d, a, b, g)
    return [(a, ga), (b, gb)]


def linear_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.linear(x, w, b): dx = g @ w, dw = g^T @ x (batch dims folded), db = g summed."""
    names = ("input", "weight", "bias")
    bound = dict(zip(names, node.args), **node.kwargs)
    x, w, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    if not (isinstance(x, Node) and isinstance(w, Node)) or w.meta.ndim != 2 or x.meta.ndim < 1:
        return None
    if x.meta.ndim == 1 or (bias is not None and not isinstance(bias, Node)):
        return None
    out: list = []
    if d.needs(x):
        out.append((x, d.extern(torch.matmul, g, d.fwd(w))))
    if d.needs(w):
        g2 = d("reshape", g, (-1, g.meta.shape[-1])) if g.meta.ndim != 2 else g
        xv = d.fwd(x)
        x2 = d("reshape", xv, (-1, x.meta.shape[-1])) if x.meta.ndim != 2 else xv
        out.append((w, d.extern(torch.matmul, d("permute", g2, (1, 0)), x2)))
    if isinstance(bias, Node) and d.needs(bias):
        out.append((bias, sum_to(d, g, bias.meta.shape)))
    return out


def pad_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.pad(x, pad) with the constant mode and pads of at least zero: x's gradient is
    ``g`` without the padding (slices); None for other modes and crops."""
    args = constant_pads(node)
    if args is None:
        return None
    x, pad, _ = args
    if not d.needs(x):
        return []
    grad = g
    for k in range(len(pad) // 2):
        dim, before = x.meta.ndim - 1 - k, pad[2 * k]
        if before or pad[2 * k + 1]:
            grad = d("slice", grad, dim, before, before + x.meta.shape[dim], 1)
    return [(x, grad)]


def addmm_rule(d: Any, node: Node, g: Node) -> list | None:
    """torch.addmm(c, a, b) = c + a @ b (transformers' GPT-2 Conv1D): dc = g summed to c's
    shape, da = g @ b^T, db = a^T @ g; None for other beta or alpha."""
    names = ("input", "mat1", "mat2")
    bound = dict(zip(names, node.args), **node.kwargs)
    c, a, b = (bound.get(k) for k in names)
    if len(node.args) > 3 or set(bound) - {*names, "beta", "alpha"} or \
            bound.get("beta", 1) != 1 or bound.get("alpha", 1) != 1:
        return None
    if not (isinstance(a, Node) and isinstance(b, Node)) or a.meta.ndim != 2 or b.meta.ndim != 2:
        return None
    ga, gb = _matmul_grads(d, a, b, g)
    out: list = [(a, ga), (b, gb)]
    if isinstance(c, Node) and d.needs(c):
        out.append((c, sum_to(d, g, c.meta.shape)))
    return out


def conv_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.conv{1,2,3}d(x, w, b, stride, padding, dilation, groups) with numeric padding and a
    batch dim: one call of ATen's convolution backward for the gradients that are needed
    (runtime/autograd.conv_backward); None (PyTorch's autograd) for other forms."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = bind(node.args, node.kwargs, names,
                 {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    x, w, bias = bound.get("input"), bound.get("weight"), bound["bias"]
    if not (isinstance(x, Node) and isinstance(w, Node)) or x.meta.ndim != w.meta.ndim:
        return None
    if not (bias is None or isinstance(bias, Node)):
        return None
    spatial = [int_tuple(bound[k], w.meta.ndim - 2) for k in ("stride", "padding", "dilation")]
    if None in spatial:  # (a string padding too)
        return None
    # (a depthwise weight's and bias's gradients: passes/depthwise_grad.py's where it applies)
    ours = d.needs(w) and depthwise_grad.applies(g, x, w, bound["groups"], spatial)
    grads = depthwise_grad.gradients(d, g, x, w, bias, spatial) if ours else []
    wanted = [(x, d.needs(x)), (w, d.needs(w) and not ours),
              (bias, bias is not None and d.needs(bias) and not ours)]
    mask = tuple(need for _, need in wanted)
    if not any(mask):
        return grads
    call = d.extern(conv_backward, g, d.fwd(x), d.fwd(w), bias is not None, *spatial,
                    bound["groups"], mask)
    needed = [arg for arg, need in wanted if need]
    return grads + [(arg, d.item(call, j)) for j, arg in enumerate(needed)]


def max_pool2d_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode) without indices: ATen's
    backward kernel, its indices found again from x (runtime/autograd.max_pool2d_backward)."""
    names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
             "return_indices")
    bound = bind(node.args, node.kwargs, names,
                 {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False})
    x, kernel = bound.get("input"), bound.get("kernel_size")
    window = [int_tuple(v, 2) for v in (kernel, bound["stride"] or kernel, bound["padding"],
                                         bound["dilation"])]
    if (not isinstance(x, Node) or bound.get("return_indices") or None in window
            or not isinstance(bound["ceil_mode"], bool)):
        return None
    return [(x, d.extern(max_pool2d_backward, g, d.fwd(x), *window, bound["ceil_mode"]))]


def avg_pool2d_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
    divisor_override): ATen's backward kernel on the gradient (DenseNet's transitions),
    not a recorded call with a nested engine call."""
    names = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
             "divisor_override")
    bound = bind(node.args, node.kwargs, names, {
        "stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
        "divisor_override": None})
    x, kernel = bound.get("input"), bound.get("kernel_size")
    window = [int_tuple(v, 2) for v in (kernel, bound["stride"] or kernel, bound["padding"])]
    flags = (bound["ceil_mode"], bound["count_include_pad"])
    divisor = bound["divisor_override"]
    if (not isinstance(x, Node) or None in window or not all(type(f) is bool for f in flags)
            or not (divisor is None or type(divisor) is int)):
        return None
    return [(x, d.extern(torch.ops.aten.avg_pool2d_backward, g, d.fwd(x), *window, *flags,
                         divisor))]


def embedding_rule(d: Any, node: Node, g: Node) -> list | None:
    """F.embedding(indices, weight, padding_idx, ...): ATen's dense backward for the weight
    (runtime/autograd.embedding_backward); None (PyTorch's autograd) for max_norm (it
    renormalises the weight in place), sparse gradients or a symbolic row count."""
    names = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
             "sparse")
    bound = bind(node.args, node.kwargs, names, {"padding_idx": None, "max_norm": None,
                                                 "scale_grad_by_freq": False, "sparse": False})
    indices, w, pad = bound.get("input"), bound.get("weight"), bound["padding_idx"]
    if not (isinstance(indices, Node) and isinstance(w, Node)) or w.meta.ndim != 2:
        return None
    rows = w.meta.shape[0]
    if (bound["max_norm"] is not None or bound["sparse"] is not False or not rows.is_Integer
            or not (pad is None or type(pad) is int)
            or not isinstance(bound["scale_grad_by_freq"], bool)):
        return None
    rows = int(rows)
    pad = -1 if pad is None else pad + rows if pad < 0 else pad  # (as F.embedding passes it)
    if not d.needs(w):
        return []
    return [(w, d.extern(embedding_backward, g, d.fwd(indices), rows, pad,
                         bound["scale_grad_by_freq"]))]


def selection_rule(d: Any, node: Node, items: dict[int, Node]) -> list | None:
    """torch.topk / torch.sort: the values are the input gathered at the indices along
    ``dim``, so their gradient is scattered back there (as gather's; no recorded call).
    None (PyTorch's autograd) where the indices are not a value of the graph, or for a
    symbolic or 0-dim input."""
    topk = node.target.endswith("topk")
    names = ("input", "k", "dim") if topk else ("input", "dim")
    bound = bind(node.args, node.kwargs, names, {"dim": -1})
    x, dim, g = bound.get("input"), bound["dim"], items.get(0)
    indices = next((u for u in node.users if u.target == "getitem" and u.args[1] == 1), None)
    if not isinstance(x, Node) or g is None or indices is None or type(dim) is not int \
            or x.meta.ndim == 0 or not all(s.is_Integer for s in x.meta.shape):
        return None
    return [(x, scattered(d, g, x, dim % x.meta.ndim, d.fwd(indices)))]


FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def flash_attention_rule(d: Any, node: Node, items: dict[int, Node]) -> list | None:
    """The CPU flash attention kernel's call (passes/cpu_attention.py put it there): its
    backward op on the saved query, key, value, output and log-sum-exp, as eager's autograd
    calls it.  None (PyTorch's autograd) where the log-sum-exp is not a value of the graph."""
    got = {u.args[1]: u for u in node.users if u.target == "getitem"}
    g = items.get(0)
    if g is None or 0 not in got or 1 not in got or 1 in items:
        return None
    q, k, v, dropout, causal = node.args
    mask = node.kwargs.get("attn_mask")
    call = d.extern(FLASH_CPU_BACKWARD, g, *(d.fwd(t) for t in (q, k, v, got[0], got[1])),
                    dropout, causal, attn_mask=d.fwd(mask) if isinstance(mask, Node) else None,
                    scale=node.kwargs.get("scale"))
    return [(t, d.item(call, j)) for j, t in enumerate((q, k, v)) if d.needs(t)]


# Calls with a tuple of results: ``rule(d, node, items)``, ``items`` the gradients of the
# results that take one, by position.
TUPLE_RULES = {
    **{f"{prefix}.{op}": selection_rule
       for prefix in ("torch", "torch.Tensor") for op in ("topk", "sort")},
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": flash_attention_rule,
}


def custom_op_rule(d: Any, node: Node, g: Node) -> list | None:
    """A ``torch.library.custom_op`` with a registered backward and one tensor result: its
    ``setup_context`` and ``backward`` run in the backward graph on the saved arguments
    and result (runtime/custom_op_grads.py); None (recorded for PyTorch's autograd) for
    other operators, keyword-only arguments, symbolic shapes, or a ``setup_context`` that
    fails on meta tensors (it asks the context for more than ours has)."""
    found = compat.custom_op_autograd(ops.OPS[node.target].eager)
    if found is None or isinstance(node.meta, tuple) or node.meta.is_symbolic:
        return None
    op = found[0]
    tensors = flatten_nodes((node.args, node.kwargs))
    if any(a.kwarg_only for a in op._schema.arguments) or any(
            not isinstance(t, Node) or t.meta.is_symbolic for t in tensors):
        return None
    diff = tuple(k for k, t in enumerate(tensors) if t.requires_grad)
    probe = map_nodes((node.args, node.kwargs), lambda n: n.meta.fake())
    try:
        custom_op_grads.op_context(node.target, node.meta.fake(), *probe, diff)
    except Exception:  # noqa: BLE001  (whatever it asks of ours: PyTorch's road then)
        return None
    grads = d.custom_op_grads(node, diff, g)
    return [(tensors[k], d.item(grads, j)) for j, k in enumerate(diff)]


LIBRARY_RULES: dict[str, Callable[..., list | None]] = {
    **{f"{prefix}.{op}": matmul_rule for prefix in ("torch", "torch.Tensor")
       for op in ("matmul", "mm", "bmm")}, "operator.matmul": matmul_rule,
    "torch.nn.functional.linear": linear_rule,
    "torch.addmm": addmm_rule, "torch.Tensor.addmm": addmm_rule,
    **{f"{prefix}.conv{n}d": conv_rule
       for prefix in ("torch.nn.functional", "torch") for n in (1, 2, 3)},
    "torch.nn.functional.max_pool2d": max_pool2d_rule, "torch.max_pool2d": max_pool2d_rule,
    "torch.nn.functional.avg_pool2d": avg_pool2d_rule,
    "torch.nn.functional.embedding": embedding_rule,
    "torch.nn.functional.pad": pad_rule,
}


def cat_rule(d: Any, node: Node, g: Node, tensors: list, dim: int, stack: bool) -> list:
    """torch.cat / torch.stack: each input's gradient is its piece of ``g`` (a view)."""
    grads = []
    offset = 0
    for t in tensors:
        if stack:
            grads.append(d("select", g, dim, len(grads)))
            continue
        if t.meta.ndim != g.meta.ndim:  # a legacy empty piece: torch.cat skipped it
            grads.append(None)
            continue
        size = t.meta.shape[dim]
        grads.append(d("slice", g, dim, offset, offset + size, 1))
        offset += size
    return grads
