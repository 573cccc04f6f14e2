"""Lowering: a prim graph becomes a loop program.

Every pointwise node's value is an expression tree over its own index symbols
(``i0, i1, ...``, one per dimension of its shape).  Consumers inline it, re-expressing the
indices for broadcasting and views, so a chain of pointwise ops becomes one body.  Graph
outputs are *realized*: a ComputedBuffer with exactly the layout eager would return (the
strides come from PyTorch's own rules through the node's meta).  Outputs that are inputs,
or views of inputs, are returned as aliases without a kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from minicompile import ops
from minicompile.errors import Unsupported
from minicompile.graph import Graph, Node, TensorMeta, map_nodes
from minicompile.library_layouts import ATTENTION
from minicompile.op_table import COMPARISONS, LOGICAL
from minicompile.shapes import is_symbolic
from minicompile.sym import index_symbol, product
from minicompile.ir import (AliasOutput, BufferRef, Cast, Cat, ComputedBuffer, Constant, Expr,
                            ExternKernel, IndexExpr, IndirectLoad, InputBuffer, Layout, Load,
                            LoopProgram, Op, Reduce, dim_symbols, make_cat, map_loads,
                            reduction_symbols, substitute_index, walk)
from minicompile.view_rules import view_layout, view_mapping

ONE = sympy.Integer(1)
ZERO = sympy.Integer(0)


@dataclasses.dataclass(frozen=True)
class Value:
    """A tensor during lowering: ``expr`` over ``dim_symbols(len(shape))``.  ``view`` is set
    when the value is an input's storage read through a layout (an input or a view of one)."""

    shape: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    expr: Expr
    view: tuple[str, Layout] | None = None
    origins: tuple[Node, ...] = ()
    # An extern's tuple result (only read through getitem): the buffer holding the tuple.
    tuple_buffer: str | None = None


def layout_of(meta: TensorMeta) -> Layout:
    return Layout(meta.shape, meta.stride, meta.dtype, meta.device, meta.storage_offset)


def _input_value(name: str, layout: Layout) -> Value:
    idx = dim_symbols(len(layout.shape))
    # Size-1 dims are always read at index 0, whatever their stride says.
    idx = tuple(ZERO if s == 1 else i for i, s in zip(idx, layout.shape))
    load: Expr = Load(name, layout.index(idx), layout.dtype)
    if any(size == 0 for size in layout.shape):
        # An empty tensor's storage may be empty too: no element of it is ever used (an
        # empty output, or a masked-off reduction row), and a load hoisted out of the
        # reduction loop must not read it.
        load = Constant(False if layout.dtype == torch.bool else 0, layout.dtype)
    return Value(layout.shape, layout.dtype, load, view=(name, layout))


def _computed_value(name: str, layout: Layout) -> Value:
    """A realized buffer read back.  Views of it are aliases of its storage where its sizes
    are numbers (a transposed matrix product argument is then no copy); symbolic ones are
    index rewrites, which add no guards on the sizes."""
    value = _input_value(name, layout)
    return dataclasses.replace(value, view=None) if is_symbolic(layout.shape) else value


def broadcast_to(v: Value, shape: tuple[sympy.Expr, ...]) -> Expr:
    """``v``'s expression re-indexed for a consumer of ``shape`` (PyTorch broadcasting)."""
    lead = len(shape) - len(v.shape)
    own = dim_symbols(len(v.shape))
    out = dim_symbols(len(shape))
    mapping = {own[k]: ZERO if size == 1 and shape[lead + k] != 1 else out[lead + k]
               for k, size in enumerate(v.shape)}
    return substitute_index(v.expr, {a: b for a, b in mapping.items() if a != b})


def _contiguous_dim(meta: TensorMeta) -> int | None:
    """The dim of unit stride (among dims longer than 1) of a static layout, else None."""
    dims = [d for d, (n, st) in enumerate(zip(meta.shape, meta.stride)) if n != 1 and st == 1]
    return dims[-1] if dims else None


def _cast(e: Expr, dtype: torch.dtype) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Constant):
        return Constant(_py_value(e.value, dtype), dtype)
    return Cast(e, dtype)


def _py_value(value: Any, dtype: torch.dtype) -> Any:
    """A Python scalar converted to ``dtype`` as PyTorch converts it (integers wrap)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return torch.tensor(int(value), dtype=torch.int64).to(dtype).item()


class Lowering:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.values: dict[Node, Value] = {}
        self.inputs: list[InputBuffer] = []
        self.buffers: list[ComputedBuffer] = []
        self.realized: dict[Node, str] = {}
        self.layouts: dict[str, Layout] = {}  # of buffers that exist as tensors in the wrapper
        self.indirect = 0  # index symbols made so far (ind0, ind1, ...)

    def run(self) -> LoopProgram:
        for node in self.graph.nodes:
            if node.op == "placeholder":
                # Kernels get the input's data pointer, which already includes its storage
                # offset: index from 0.
                layout = dataclasses.replace(layout_of(node.meta), offset=ZERO)
                buf = InputBuffer(f"arg{len(self.inputs)}", layout)
                self.inputs.append(buf)
                self.layouts[buf.name] = layout
                self.values[node] = _input_value(buf.name, buf.layout)
            elif node.op == "call":
                self.values[node] = self.lower_call(node)
                if should_realize(node, self.values[node]) or (
                    not node.users and ops.OPS[node.target].family == "index"
                ):  # an index op nothing reads still checks its indices, as eager does
                    self.realize(node)
        outputs = [self.realize(n) for n in self.graph.outputs]
        shapes = self.graph.shapes
        scalars = tuple(shapes.scalar_symbols()) if shapes is not None else ()
        hints = dict(shapes.hints) if shapes is not None else {}
        return LoopProgram(self.inputs, self.buffers, outputs, scalars, hints)

    # -- outputs ----------------------------------------------------------------------------

    def realize(self, node: Node, layout: Layout | None = None) -> str | AliasOutput:
        """A tensor that exists in the wrapper for ``node``: an existing buffer, a view of
        one, or a new ComputedBuffer the kernels write (in ``layout``, by default the one
        eager gives ``node``)."""
        if node in self.realized:  # realized already (returned twice, say): one buffer
            return self.realized[node]
        value = self.values[node]
        if value.view is not None:
            name, layout = value.view
            return AliasOutput(name, None if layout == self.layouts[name] else layout)
        return self.new_buffer(node, layout or layout_of(node.meta), value.expr, value.origins)

    def new_buffer(self, node: Node, layout: Layout, body: Expr, origins: tuple[Node, ...],
                   reduction_ranges: tuple[sympy.Expr, ...] = ()) -> str:
        """A ComputedBuffer for ``node``, which later consumers load instead of computing
        the value again."""
        origins = tuple(dict.fromkeys(origins + (node,)))
        sources = tuple(dict.fromkeys(n.stack[-1] for n in origins if n.stack))
        buf = ComputedBuffer(f"buf{len(self.buffers)}", layout, body,
                             tuple(_origin(n) for n in origins), sources, reduction_ranges)
        self.buffers.append(buf)
        self.realized[node] = buf.name
        self.layouts[buf.name] = layout
        self.values[node] = _computed_value(buf.name, layout)
        return buf.name

    # -- calls ------------------------------------------------------------------------------

    def lower_call(self, node: Node) -> Value:
        family = ops.OPS[node.target].family
        if family == "extern" and node.target in ops.CAT_OPS:
            value = self.lower_cat(node)
            if value is not None:
                return value
        if family == "extern" and node.target == PAD:
            value = self.lower_pad(node)
            if value is not None:
                return value
        lower = _LOWER_BY_FAMILY.get(family)
        if lower is not None:
            return lower(self, node)
        if family == "composite":
            raise AssertionError(f"{node.target} reached lowering undecomposed")
        if family not in ("unary", "binary", "ternary", "cast", "copy"):
            raise Unsupported(f"no lowering for {node.target}", node.stack)
        shape, out_dtype = node.meta.shape, node.meta.dtype
        tensor_args = [a for a in node.args if isinstance(a, Node)]
        origins = tuple(dict.fromkeys(o for a in tensor_args for o in self.values[a].origins))
        origins += (node,)
        if family in ("copy", "cast"):  # copy: the same values, realized in the node's layout
            # (contiguous(): row-major; the layout copies of passes/layout.py: theirs)
            expr = broadcast_to(self.values[node.args[0]], shape)
            if family == "cast":
                expr = _cast(expr, node.kwargs["dtype"])
            return Value(shape, out_dtype, expr, origins=origins)

        compute = self.compute_dtype(node)

        def operand(arg: Any, dtype: torch.dtype) -> Expr:
            if isinstance(arg, Node):
                return _cast(broadcast_to(self.values[arg], shape), dtype)
            if isinstance(arg, (bool, int, float)):
                return Constant(_py_value(arg, dtype), dtype)
            if isinstance(arg, sympy.Expr) and arg.is_integer:  # a symbolic size
                if arg.is_Integer:
                    return Constant(_py_value(int(arg), dtype), dtype)
                return _cast(IndexExpr(arg, torch.int64), dtype)
            raise Unsupported(f"{node.target}: argument {arg!r} is not a tensor or number",
                              node.stack)

        if node.target == "where":
            cond, a, b = node.args
            args = (operand(cond, torch.bool), operand(a, out_dtype), operand(b, out_dtype))
        else:
            args = tuple(operand(a, compute) for a in node.args)
        return Value(shape, out_dtype, Op(node.target, args, out_dtype), origins=origins)

    def lower_extern(self, node: Node) -> Value:
        """A library call: its tensor arguments are realized (or passed as views), and its
        result is a buffer later kernels load through the layout eager gives it."""
        if node.target == "getitem":  # one element of an extern's tuple result
            source, index = node.args
            args: tuple = (BufferRef(self.values[source].tuple_buffer), index)  # type: ignore[arg-type]
            op = "operator.getitem"
            kwargs: dict = {}
        else:
            op = node.target
            if op in ATTENTION:
                self.realize_attention_mask(node)
            args = map_nodes(node.args, self.tensor_arg)
            kwargs = map_nodes(node.kwargs, self.tensor_arg)
        name = f"buf{len(self.buffers)}"
        meta = node.meta
        layout = tuple(map(layout_of, meta)) if isinstance(meta, tuple) else layout_of(meta)
        self.buffers.append(ExternKernel(
            name, op, args, kwargs, layout, (_origin(node),),
            (node.stack[-1],) if node.stack else (),
        ))
        if isinstance(layout, tuple):
            return Value((), torch.float32, Constant(0, torch.float32), tuple_buffer=name)
        self.layouts[name] = layout
        return _input_value(name, layout)  # no origins: kernels only read the result

    def realize_attention_mask(self, node: Node) -> None:
        """An attention mask computed in the graph is written with its rows dense (last dim
        stride 1; broadcast batch and head dims stay stride 0).  Its eager layout, an
        ``expand`` of a few values (a mask made while compiling, where eager passes none),
        can have stride 0 along the keys, and the fused attention kernels refuse that mask:
        scaled_dot_product_attention would take its math path, many times slower."""
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        if not isinstance(mask, Node) or mask in self.realized or len(mask.meta.shape) < 2:
            return
        if self.values[mask].view is not None:
            return
        layout = layout_of(mask.meta)
        if layout.stride[-1] == 1:
            return
        stride, step = [], sympy.Integer(1)
        for n, st in reversed(list(zip(layout.shape, layout.stride))):
            keep_broadcast = st == 0 and len(stride) >= 2
            stride.append(sympy.Integer(0) if keep_broadcast else step)
            step = step if keep_broadcast else step * n
        self.realize(mask, dataclasses.replace(layout, stride=tuple(reversed(stride)),
                                               offset=sympy.Integer(0)))

    def lower_reduction(self, node: Node) -> Value:
        """A reduction is always realized: a buffer over the kept dims whose body reduces
        over the reduced ones (r0, r1, ... in ``dims`` order)."""
        x_node, dims, keepdim = node.args
        x = self.values[x_node]
        dims = tuple(sorted(dims))
        own = dim_symbols(len(x.shape))
        out = dim_symbols(node.meta.ndim)
        rsyms = reduction_symbols(len(dims))
        mapping: dict[sympy.Symbol, sympy.Expr] = {}
        position = 0
        for k in range(len(x.shape)):
            if k in dims:
                mapping[own[k]] = ZERO if x.shape[k] == 1 else rsyms[dims.index(k)]
                position += 1 if keepdim else 0
            else:
                mapping[own[k]] = out[position]
                position += 1
        operand = substitute_index(x.expr, {a: b for a, b in mapping.items() if a != b})
        out_dtype = node.meta.dtype
        operand = _cast(operand, torch.bool if node.target in ("any", "all") else out_dtype)
        if all(x.shape[d] == 1 for d in dims):  # reducing size-1 dims: each value is its own
            return Value(node.meta.shape, out_dtype, _cast(operand, out_dtype), origins=(node,))
        self.new_buffer(node, layout_of(node.meta), Reduce(node.target, operand, out_dtype),
                        x.origins, tuple(x.shape[d] for d in dims))
        return self.values[node]

    def lower_index(self, node: Node) -> Value:
        """embedding / index_select / gather: the source's index along one dim becomes a
        symbol standing for the index tensor's value (an IndirectLoad)."""
        out = dim_symbols(node.meta.ndim)
        symbol = index_symbol(f"ind{self.indirect}")
        self.indirect += 1
        source = node.args[0]  # embedding's weight; index_select's, gather's input
        direct = None if node.target == "embedding" else self.direct_index(node)
        read = walk(self.values[source].expr)
        if direct is None and any(isinstance(e, (Cat, IndirectLoad)) for e in read):
            # A Cat's position may not stand for data, and a load binds one index value
            # (x.index_select(0, i).index_select(1, j) would need two): read the source
            # from memory.
            self.realize(source)
        if node.target == "embedding":
            source, dim, index = node.args[0], 0, node.args[1]
            src = self.values[source]
            idx = self.values[index]
            at_map = dict(zip(dim_symbols(len(idx.shape)), out[:-1]))
            src_map = {dim_symbols(2)[0]: symbol, dim_symbols(2)[1]: out[-1]}
        else:
            source, dim, index = node.args
            src, idx = self.values[source], self.values[index]
            own = dim_symbols(len(src.shape))
            src_map = {own[k]: (symbol if k == dim else out[k]) for k in range(len(own))}
            if node.target == "index_select":
                at_map = {dim_symbols(1)[0]: out[dim]} if idx.shape else {}
            else:  # gather: the index tensor has the output's shape
                at_map = dict(zip(dim_symbols(len(idx.shape)), out))
        at = _cast(substitute_index(idx.expr, at_map), torch.int64)
        size = src.shape[dim]
        expr = substitute_index(src.expr, src_map)
        origins = tuple(dict.fromkeys(src.origins + idx.origins + (node,)))
        if direct is not None:  # positions known in range (x[arange(n)]): a plain load
            return Value(node.meta.shape, node.meta.dtype,
                         substitute_index(expr, {symbol: direct}), origins=origins)

        def bind(ld: Load | IndexExpr) -> Expr:
            if isinstance(ld, IndexExpr):
                if symbol in ld.index.free_symbols:  # not made by any decomposition
                    raise Unsupported(f"{node.target} of an index expression", node.stack)
                return ld
            # Along a size-1 dim every load reads index 0 (the symbol is gone from their
            # indices), but the index values must still be checked: each load checks them.
            if symbol in ld.index.free_symbols or size == 1:
                return IndirectLoad(ld.buffer, ld.index, ld.dtype, at, symbol, size)
            return ld

        return Value(node.meta.shape, node.meta.dtype, map_loads(expr, bind), origins=origins)

    def direct_index(self, node: Node) -> sympy.Expr | None:
        """index_select's or gather's index values as an expression of the output's
        position, where they are one (positions from an ``iota``: transformers' masks,
        ``x[torch.arange(n)]``) and provably in range: None where they read data."""
        source, dim, index = node.args
        shape = node.meta.shape
        if not all(s.is_Integer for s in shape) or not source.meta.shape[dim].is_Integer:
            return None
        idx = self.values[index]
        out = dim_symbols(len(shape))
        if node.target == "index_select":
            at_map = {dim_symbols(1)[0]: out[dim]} if idx.shape else {}
        else:
            at_map = dict(zip(dim_symbols(len(idx.shape)), out))
        ranges = {s: (0, int(n) - 1) for s, n in zip(out, shape)}
        known = affine_index(substitute_index(idx.expr, at_map), ranges)
        if known is None or not 0 <= known[1] <= known[2] < int(source.meta.shape[dim]):
            return None
        return known[0]

    def lower_iota(self, node: Node) -> Value:
        """Each element's index along ``dim``, as an int64 value computed in the kernel
        (nothing is loaded).  A size-1 dim is always index 0, as for loads."""
        shape, dim = node.meta.shape, node.args[1]
        index = ZERO if shape[dim] == 1 else dim_symbols(len(shape))[dim]
        return Value(shape, torch.int64, IndexExpr(index, torch.int64), origins=(node,))

    def lower_cat(self, node: Node) -> Value | None:
        """cat / stack as a piecewise expression over the output's index: each input's
        expression shifted to its place along the dim (a Cat), so consumers read the inputs
        directly.  None (the library call) for anything unusual: eager then decides."""
        args = ops.cat_arguments(node)
        if args is None:
            return None
        tensors, dim = args
        meta = node.meta
        shape = meta.shape
        stack = node.target == "torch.stack"
        if any(not s.is_Integer for s in shape) or product(shape) == 0:
            return None  # symbolic sizes or an empty result: nothing to gain
        out = dim_symbols(len(shape))
        pieces: list[Expr] = []
        starts: list[sympy.Expr] = []
        position = ZERO
        for t in tensors:
            x = self.values[t]
            if not stack and x.shape == (ZERO,) and len(shape) != 1:
                continue  # the legacy empty 1-d tensor, which eager's cat skips
            if not _fits(x.shape, shape, dim, stack):
                return None  # eager's cat would raise (cat never broadcasts): let it
            width = ONE if stack else x.shape[dim]
            if width == 0:
                continue
            mapping = _piece_mapping(len(x.shape), out, dim, position, stack)
            pieces.append(_cast(substitute_index(x.expr, mapping), meta.dtype))
            starts.append(position)
            position = position + width
        if not pieces or len(pieces) > MAX_CAT_PIECES or position != shape[dim]:
            return None
        expr = make_cat(out[dim], tuple(starts[1:]), tuple(pieces), meta.dtype)
        origins = tuple(dict.fromkeys(o for t in tensors for o in self.values[t].origins))
        return Value(shape, meta.dtype, expr, origins=origins + (node,))

    def lower_pad(self, node: Node) -> Value | None:
        """``F.pad(x, pad, "constant", value)`` with non-negative pads as a Cat along each
        padded dim (the value outside, ``x`` shifted into place inside), as Inductor lowers
        ``constant_pad_nd``: consumers read ``x`` directly.  None (the library call) for
        other modes, negative pads (crops), symbolic sizes, bool or complex values."""
        meta = node.meta
        args = constant_pads(node)
        if args is None:
            return None
        x, pad, value = args
        if (len(pad) // 2 > len(meta.shape) or type(value) not in (int, float)
                or meta.dtype == torch.bool or meta.dtype.is_complex
                or any(not s.is_Integer for s in meta.shape) or product(x.meta.shape) == 0):
            return None
        out = dim_symbols(len(meta.shape))
        # pad = (last dim's before, after, the one before it's before, after, ...)
        sides = {len(meta.shape) - 1 - k: (pad[2 * k], pad[2 * k + 1])
                 for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]}
        if meta.device.type == "cpu" and _contiguous_dim(x.meta) not in sides:
            # Its readers loop over the padded dims outside their vectorised loop, and the
            # cat is a branch inside it that GCC does not hoist: a channels-last depthwise
            # weight gradient's taps (passes/depthwise_grad.py) took 1.04-1.10x the step
            # time of the library call writing the padded tensor once (one thread).  (A
            # Triton kernel's cat is a select over masked loads, with no branch.)
            return None
        x_value = self.values[x]
        shifted = {out[d]: out[d] - before for d, (before, _) in sides.items()}
        expr = _cast(substitute_index(x_value.expr, shifted), meta.dtype)
        fill = Constant(value if meta.dtype.is_floating_point else int(value), meta.dtype)
        for d, (before, after) in sorted(sides.items(), reverse=True):
            inside = x_value.shape[d]
            pieces, starts = [expr], []
            if before:
                pieces.insert(0, fill)
                starts.append(sympy.Integer(before))
            if after:
                pieces.append(fill)
                starts.append(before + inside)
            expr = make_cat(out[d], tuple(starts), tuple(pieces), meta.dtype)
        return Value(meta.shape, meta.dtype, expr, origins=x_value.origins + (node,))

    def tensor_arg(self, node: Node) -> BufferRef | AliasOutput:
        ref = self.realize(node)
        if isinstance(ref, str):
            return BufferRef(ref)
        return BufferRef(ref.input) if ref.layout is None else ref

    @staticmethod
    def compute_dtype(node: Node) -> torch.dtype:
        """The dtype the op's operands are converted to before it applies."""
        if node.target in LOGICAL:
            return torch.bool
        if node.target in COMPARISONS:
            a, b = (x.meta.fake() if isinstance(x, Node) else x for x in node.args)
            return torch.result_type(a, b)
        return node.meta.dtype

    def lower_view(self, node: Node) -> Value:
        """A view is an index rewrite.  Over a buffer (an input, a library call's result,
        a realized value) it is a new layout of the same storage, computed by PyTorch's
        own view rules; over a computed value, a substitution of its index symbols."""
        x = self.values[node.args[0]]
        origins = x.origins + (node,)
        if x.view is not None:
            name, base = x.view
            layout = view_layout(base, node, self.graph.shapes)
            if layout is not None:
                value = _input_value(name, layout)
                return dataclasses.replace(value, origins=origins)
        mapping = view_mapping(node, x.shape)
        expr = substitute_index(x.expr, {a: b for a, b in mapping.items() if a != b})
        return Value(node.meta.shape, node.meta.dtype, expr, origins=origins)


_LOWER_BY_FAMILY = {"view": Lowering.lower_view, "extern": Lowering.lower_extern,
                    "tuple": Lowering.lower_extern, "reduction": Lowering.lower_reduction,
                    "index": Lowering.lower_index, "iota": Lowering.lower_iota}

# cat and stack, by every name capture records them under; they lower to a Cat expression
# of at most this many pieces (more: the library call, which copies each input once).
MAX_CAT_PIECES = 8
PAD = ops.extern_op(torch.nn.functional.pad)  # lowered as cats of the fill value (lower_pad)


def constant_pads(node: Node) -> tuple[Node, tuple[int, ...], Any] | None:
    """``F.pad(x, pad, "constant", value)``'s ``(x, pad, value)`` where every pad is at
    least 0 (no crop), else None (other modes, arguments not known here)."""
    bound = dict(zip(("input", "pad", "mode", "value"), node.args), **node.kwargs)
    x, pad, value = bound.get("input"), bound.get("pad"), bound.get("value")
    if (set(bound) - {"input", "pad", "mode", "value"} or bound.get("mode", "constant")
            != "constant" or not isinstance(x, Node) or not isinstance(pad, (list, tuple))
            or len(pad) % 2 or not all(type(p) is int and p >= 0 for p in pad)):
        return None
    return x, tuple(pad), 0 if value is None else value


def _fits(in_shape: tuple, out_shape: tuple, dim: int, stack: bool) -> bool:
    """Whether an input has the output's sizes in every dim but the cat dim (stack: the
    output's shape without ``dim``): cat never broadcasts."""
    if stack:
        return tuple(in_shape) == tuple(out_shape[:dim] + out_shape[dim + 1:])
    return len(in_shape) == len(out_shape) and all(
        a == b for k, (a, b) in enumerate(zip(in_shape, out_shape)) if k != dim
    )


def _piece_mapping(ndim: int, out: tuple, dim: int, start: sympy.Expr, stack: bool) -> dict:
    """An input's index symbols in terms of the output's, for the piece starting at
    ``start`` along ``dim`` (stack: the input has no ``dim``; its dims skip it)."""
    own = dim_symbols(ndim)
    if stack:
        return {own[k]: out[k if k < dim else k + 1] for k in range(ndim)}
    mapping = {own[k]: out[k] for k in range(ndim)}
    mapping[own[dim]] = out[dim] - start
    return mapping


# A computed value read by several consumers is stored once its expression reads this many
# elements (Inductor's realize_reads_threshold): each consumer then loads one value instead
# of recomputing the expression, and chains such as a residual stream stay short.
REALIZE_READS = 3


def affine_index(e: Expr, ranges: dict) -> tuple[sympy.Expr, int, int] | None:
    """``e`` (an integer value) as an affine expression of the index symbols with its least
    and greatest value over ``ranges`` (symbol -> (lo, hi)), where it is one: index
    expressions, integer constants, ``+ - *`` and the wrap of negative indices
    (``where(a < 0, a + n, a)`` with ``a`` never negative); else None."""
    if isinstance(e, IndexExpr) or (isinstance(e, Constant) and not isinstance(e.value, float)):
        value = sympy.expand(e.index) if isinstance(e, IndexExpr) else sympy.Integer(e.value)
        if not all(s in ranges for s in value.free_symbols) or not (
                value.is_polynomial() and sympy.Poly(value, *ranges).total_degree() <= 1):
            return None
        lo = hi = value.subs({s: 0 for s in ranges})
        for s in value.free_symbols:
            c = value.coeff(s)
            lo, hi = lo + min(0, c * ranges[s][1]), hi + max(0, c * ranges[s][1])
        return value, int(lo), int(hi)
    if isinstance(e, Cast) and e.dtype == torch.int64 and not e.x.dtype.is_floating_point:
        return affine_index(e.x, ranges)
    if not isinstance(e, Op) or e.dtype.is_floating_point:
        return None
    if e.op == "where" and isinstance(e.args[0], Op) and e.args[0].op == "lt":
        a, zero = e.args[0].args
        known = affine_index(a, ranges)
        if known is not None and known[1] >= 0 and zero == Constant(0, a.dtype):
            return affine_index(e.args[2], ranges)  # the wrap never applies
        return None
    if e.op not in ("add", "sub", "mul"):
        return None
    parts = [affine_index(a, ranges) for a in e.args]
    if None in parts:
        return None
    (x, xlo, xhi), (y, ylo, yhi) = parts
    if e.op == "mul":
        if x.free_symbols and y.free_symbols:
            return None
        ends = [p * q for p in (xlo, xhi) for q in (ylo, yhi)]
        return sympy.expand(x * y), min(ends), max(ends)
    if e.op == "add":
        return x + y, xlo + ylo, xhi + yhi
    return x - y, xlo - yhi, xhi - ylo


def should_realize(node: Node, value: Value) -> bool:
    if value.view is not None or value.tuple_buffer is not None or len(node.users) < 2:
        return False
    if isinstance(value.expr, Load):
        return False
    loads = {(e.buffer, e.index) for e in walk(value.expr) if isinstance(e, Load)}
    if len(loads) < REALIZE_READS:
        return False
    # A value made only of broadcast reads (a one-hot from class indices and a scalar, a
    # mask from positions) is recomputed where it is read: storing it writes and reads a
    # full-size tensor (a cross entropy's backward stored its [tokens, vocabulary] one-hot).
    varying = {s for s, n in zip(dim_symbols(len(node.meta.shape)), node.meta.shape) if n != 1}
    return any(varying <= index.free_symbols for _, index in loads)


def _origin(node: Node) -> str:
    return f"%{node.index} {node.target}"


def lower(graph: Graph) -> LoopProgram:
    """Lower a graph of prims and views (see passes/decompose.py) to a loop program."""
    return Lowering(graph).run()
