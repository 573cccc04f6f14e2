"""Views as lowering sees them: the layout a view op gives a buffer (PyTorch's own view
rules, run on a meta or fake tensor), and the index mapping that rewrites a computed
value's index symbols through a view (reshape included) when there is no buffer to view.
"""

from __future__ import annotations

import sympy
import torch

from minicompile import ops
from minicompile.errors import Unsupported
from minicompile.graph import Node
from minicompile.ir import Layout, dim_symbols
from minicompile.shapes import MIN_DYNAMIC_SIZE, ShapeContext, is_symbolic
from minicompile.sym import FloorDiv, ModularIndexing, product, size_symbols

ZERO = sympy.Integer(0)


def view_layout(base: Layout, node: Node, shapes: ShapeContext | None = None
                ) -> Layout | None:
    """The layout ``node`` (a view op) gives a tensor of layout ``base``, or None when the
    view cannot be a layout of the same storage (a reshape that must copy).  PyTorch's own
    view rules decide, on a meta tensor (a fake one of ``shapes`` when sizes are symbolic)."""
    args = node.args[1:]
    if shapes is not None and (is_symbolic(base.shape + base.stride) or is_symbolic(args)):
        fake = shapes.fake(base.shape, base.stride, base.dtype, base.offset, base.device)
        args = tuple(tuple(map(shapes.to_symint, a)) if isinstance(a, tuple) else (
            shapes.to_symint(a) if isinstance(a, sympy.Basic) else a) for a in args)
        run, number = shapes.run, shapes.to_sympy
    else:
        shape, stride = base.concrete_shape(), base.concrete_stride()
        offset = int(base.offset)
        span = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride)) if all(shape) else 1
        fake = torch.empty(offset + span, dtype=base.dtype, device="meta")
        fake = fake.as_strided(shape, stride, offset)
        run, number = (lambda fn, *a: fn(*a)), sympy.Integer
    try:
        if node.target == "reshape":
            out = run(fake.view, args[0])
        else:
            out = run(ops.run_eager, node.target, (fake, *args), node.kwargs)
    except (RuntimeError, ValueError):  # no view of the same storage (symbolic: ValueError)
        return None
    return Layout(tuple(map(number, out.shape)), tuple(map(number, out.stride())), base.dtype,
                  base.device, number(out.storage_offset()))


def view_mapping(node: Node, in_shape: tuple) -> dict:
    """Each input index symbol as an expression of the view's index symbols."""
    out = dim_symbols(node.meta.ndim)
    own = dim_symbols(len(in_shape))
    n_in = len(in_shape)
    target, args = node.target, node.args[1:]
    if target == "permute":
        return {own[d]: out[k] for k, d in enumerate(args[0])}
    if target == "unsqueeze":
        d = args[0]
        return {own[k]: out[k if k < d else k + 1] for k in range(n_in)}
    if target == "squeeze":
        d = args[0]
        if in_shape[d] != 1:  # squeezing a dim that is not 1 changes nothing
            return {}
        mapping = {own[k]: out[k - (k > d)] for k in range(n_in) if k != d}
        mapping[own[d]] = ZERO
        return mapping
    if target == "expand":
        lead = node.meta.ndim - n_in
        return {own[k]: (ZERO if in_shape[k] == 1 and node.meta.shape[lead + k] != 1
                         else out[lead + k]) for k in range(n_in)}
    if target == "slice":
        d, start, _end, step = args
        mapping = {own[k]: out[k] for k in range(n_in)}
        mapping[own[d]] = start + step * out[d]
        return mapping
    if target == "select":
        d, index = args
        mapping = {own[k]: out[k - (k > d)] for k in range(n_in) if k != d}
        mapping[own[d]] = sympy.sympify(index)
        return mapping
    if target == "reshape":
        return reshape_mapping(in_shape, node.meta.shape)
    raise Unsupported(f"no lowering for view {target}", node.stack)


def _less(a: sympy.Expr, b: sympy.Expr) -> bool | None:
    """a < b for sizes, decided for every value the symbols may take (each size symbol is at
    least MIN_DYNAMIC_SIZE, its guard): ``s0 < s0*s1`` holds; ``s0 < s1`` is None, unknown."""
    if a.is_Integer and b.is_Integer:
        return int(a) < int(b)
    if _positive(b - a):
        return True
    if _positive(a - b):
        return False
    return None


def _positive(expr: sympy.Expr) -> bool:
    """Whether ``expr``, a polynomial in size symbols, is positive for every value they may
    take: written over ``t = s - MIN_DYNAMIC_SIZE >= 0``, no coefficient is negative and
    the constant term is positive."""
    shifted = sympy.expand(expr.xreplace({s: s + MIN_DYNAMIC_SIZE for s in size_symbols([expr])}))
    if not shifted.is_polynomial(*shifted.free_symbols):
        return False
    terms = shifted.as_coefficients_dict()
    return all(c.is_Number and c >= 0 for c in terms.values()) and terms.get(sympy.S.One, 0) > 0


def reshape_mapping(in_shape: tuple, out_shape: tuple) -> dict:
    """Input indices of a reshape, dims grouped where their sizes multiply to the same
    number (so [B, T, C] -> [B*T, C] touches only the first two dims).  Any grouping is
    exact (the reshape keeps the number of elements); finer ones make simpler indices."""
    own = dim_symbols(len(in_shape))
    out = dim_symbols(len(out_shape))
    if any(size == 0 for size in in_shape):  # nothing is read (and sizes would divide by 0)
        return {d: ZERO for d in own}
    mapping: dict = {own[k]: ZERO for k in range(len(in_shape)) if in_shape[k] == 1}
    ins = [k for k in range(len(in_shape)) if in_shape[k] != 1]
    outs = [k for k in range(len(out_shape)) if out_shape[k] != 1]
    i = j = 0
    while i < len(ins) or j < len(outs):
        group_in, group_out = [ins[i]] if i < len(ins) else [], [outs[j]] if j < len(outs) else []
        i, j = i + bool(group_in), j + bool(group_out)
        p_in = product(in_shape[k] for k in group_in)
        p_out = product(out_shape[k] for k in group_out)
        while p_in != p_out and (i < len(ins) or j < len(outs)):
            less = _less(p_in, p_out)
            if less is None:  # sizes not ordered for every value: the rest is one group,
                group_in, group_out = group_in + ins[i:], group_out + outs[j:]  # exact
                i, j = len(ins), len(outs)  # (a flat index), only less simple
            elif (less and i < len(ins)) or j >= len(outs):
                group_in.append(ins[i])
                p_in *= in_shape[ins[i]]
                i += 1
            else:
                group_out.append(outs[j])
                p_out *= out_shape[outs[j]]
                j += 1
        flat: sympy.Expr = ZERO
        for k in group_out:
            flat = flat * out_shape[k] + out[k]
        inner = product(in_shape[k] for k in group_in)
        for pos, k in enumerate(group_in):
            inner = inner / in_shape[k]
            if pos == 0:
                mapping[own[k]] = FloorDiv(flat, inner)
            else:
                mapping[own[k]] = ModularIndexing(flat, inner, in_shape[k])
    return mapping
