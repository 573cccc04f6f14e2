"""Matrix products on the CPU called as BLAS's own op, on 2-d views, into their buffer.

``torch.matmul(x, w)`` of a batched ``x`` and ``F.linear(x, w, b)`` go through PyTorch's
composite code on every call: reshapes, a transpose, ``_unsafe_view``, and the dispatcher for
each (a llama train step makes 45 matmuls: some 3 us each of host time on a 2-core CPU, a
tenth of the step).  Where the operands' layouts allow it (the batch dims fold into rows), the
wrapper calls ``torch.mm`` / ``torch.addmm`` once, on ``compat.reinterpret`` views, writing
into the result's buffer (``out=``), as Inductor's wrapper does.  The same BLAS product runs:
``linear`` of a folded input is ``addmm`` in eager too.  Anything else stays the library call.
"""

from __future__ import annotations

from itertools import pairwise

import sympy
import torch

from minicompile.ir import AliasOutput, BufferRef, ExternKernel, Layout
from minicompile.sym import product

from minicompile.codegen.extern_text import reinterpret_text

PRODUCTS = frozenset({"torch.matmul", "torch.nn.functional.linear"})
FLOATS = (torch.float32, torch.float64)


def _rows(lay: Layout) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr] | None:
    """``lay`` as a matrix of its leading dims folded into rows: (rows, columns, row stride,
    column stride), or None where they do not fold (a transposed batch, say)."""
    if len(lay.shape) < 2:
        return None
    lead = [(n, st) for n, st in zip(lay.shape[:-1], lay.stride[:-1]) if n != 1]
    for (n, st), (n2, st2) in pairwise(lead):
        if st != st2 * n2:
            return None
    cols, col_stride = lay.shape[-1], lay.stride[-1]
    row_stride = lead[-1][1] if lead else cols * col_stride
    if row_stride == 0 or col_stride == 0:
        return None  # (a broadcast operand: BLAS reads no stride 0)
    return product(lay.shape[:-1]), cols, row_stride, col_stride


class Operand:
    """A tensor argument as a name, its layout, and the view's offset from that tensor's own
    (an AliasOutput's ``as_strided`` offset; a buffer or input: its tensor as it is)."""

    def __init__(self, name: str, layout: Layout, offset: sympy.Expr, own: bool) -> None:
        self.name, self.layout, self.offset = name, layout, offset
        self.own = own  # ``layout`` is the named tensor's own (not a view's)

    @staticmethod
    def of(arg: object, layouts: dict[str, Layout]) -> Operand | None:
        if isinstance(arg, AliasOutput) and arg.layout is not None:
            return Operand(arg.input, arg.layout, arg.layout.offset, False)
        name = arg.input if isinstance(arg, AliasOutput) else (
            arg.name if isinstance(arg, BufferRef) else None)
        lay = layouts.get(name) if name is not None else None
        return Operand(name, lay, sympy.Integer(0), True) if isinstance(lay, Layout) else None

    def view(self, shape: tuple, stride: tuple) -> str:
        if self.own and (tuple(shape), tuple(stride)) == (self.layout.shape, self.layout.stride):
            return self.name
        return reinterpret_text(self.name, shape, stride, self.offset)


def product_call(ext: ExternKernel, layouts: dict[str, Layout]) -> str | None:
    """The statement computing ``ext`` into its (already allocated) buffer ``ext.name`` with
    one BLAS call, or None where it stays the library call."""
    out = ext.layout
    if ext.op not in PRODUCTS or not isinstance(out, Layout) or out.device.type != "cpu" \
            or out.dtype not in FLOATS or out.offset != 0:
        return None
    names = ("input", "other") if ext.op == "torch.matmul" else ("input", "weight", "bias")
    if len(ext.args) > len(names) or set(ext.kwargs) - set(names):
        return None
    bound = {**dict(zip(names, ext.args)), **ext.kwargs}
    x, w = Operand.of(bound.get("input"), layouts), Operand.of(bound.get(names[1]), layouts)
    bias = bound.get("bias")
    if x is None or w is None or len(w.layout.shape) != 2 or x.layout.dtype != out.dtype \
            or w.layout.dtype != out.dtype:
        return None
    folded, result = _rows(x.layout), _rows(out)
    if folded is None or result is None:
        return None
    rows, k, rs, ks = folded
    if ext.op == "torch.matmul":  # x @ w, w [k, n]
        w_shape, w_stride = w.layout.shape, w.layout.stride
    else:  # x @ w.T, w [n, k]
        w_shape, w_stride = w.layout.shape[::-1], w.layout.stride[::-1]
    if 0 in w_stride or w_shape[0] != k or result[:2] != (rows, w_shape[1]):
        return None
    a = x.view((rows, k), (rs, ks))
    b = w.view(w_shape, w_stride)
    target = Operand(ext.name, out, sympy.Integer(0), True)
    into = f"out={target.view((rows, w_shape[1]), result[2:])}"
    if bias is None:
        return f"torch.mm({a}, {b}, {into})"
    bias_op = Operand.of(bias, layouts)
    if bias_op is None or tuple(bias_op.layout.shape) != (w_shape[1],) \
            or bias_op.layout.dtype != out.dtype:
        return None
    return f"torch.addmm({bias_op.view(bias_op.layout.shape, bias_op.layout.stride)}, " \
           f"{a}, {b}, {into})"
