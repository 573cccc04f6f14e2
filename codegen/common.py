"""What every backend shares: the code writer and the kernel plan.

A :class:`KernelPlan` is a fused group made ready to print: its iteration space reordered so
the first output is written in memory order, adjacent dimensions merged wherever every
access allows it (a contiguous elementwise kernel becomes one flat loop), and every index
re-expressed over the merged loop variables ``x0, x1, ...`` (outermost first).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import sympy
import torch

from minicompile.graph import SourceLine
from minicompile.ir import ComputedBuffer, Expr, Load, dim_symbols, map_loads, walk
from minicompile.sym import index_symbol

from minicompile.passes.fusion import FusedGroup


class CodeWriter:
    """Lines of generated code with indentation."""

    def __init__(self, indent: str = "    ") -> None:
        self.lines: list[str] = []
        self.level = 0
        self.unit = indent

    def line(self, text: str = "") -> None:
        self.lines.append(f"{self.unit * self.level}{text}" if text else "")

    def lines_from(self, text: str) -> None:
        for row in text.splitlines():
            self.line(row)

    @contextlib.contextmanager
    def indent(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    @contextlib.contextmanager
    def block(self, header: str) -> Iterator[None]:
        """A C++ brace block: ``header {`` ... ``}``."""
        self.line(f"{header} {{")
        with self.indent():
            yield
        self.line("}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Store:
    buffer: str
    index: sympy.Expr  # over the plan's loop variables
    value: Expr  # loads indexed over the plan's loop variables
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    name: str
    ranges: tuple[sympy.Expr, ...]  # merged loop sizes, outermost first
    loop_vars: tuple[sympy.Symbol, ...]  # x0, x1, ... matching ranges
    inputs: tuple[tuple[str, torch.dtype], ...]  # buffers loaded, in parameter order
    stores: tuple[Store, ...]
    origins: tuple[str, ...]  # graph nodes ("%3 add")
    sources: tuple[SourceLine, ...]  # user source lines

    @property
    def numel(self) -> sympy.Expr:
        out: sympy.Expr = sympy.Integer(1)
        for r in self.ranges:
            out = out * r
        return out

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(s.buffer for s in self.stores)

    def params(self) -> list[str]:
        """Kernel parameter names: in_ptr0.., out_ptr0.. (Inductor's spelling)."""
        return [f"in_ptr{k}" for k in range(len(self.inputs))] + [
            f"out_ptr{k}" for k in range(len(self.stores))
        ]

    def pointer(self, buffer: str) -> str:
        names = [b for b, _ in self.inputs]
        if buffer in names:
            return f"in_ptr{names.index(buffer)}"
        return f"out_ptr{self.outputs.index(buffer)}"

    def header_comment(self) -> list[str]:
        lines = [f"graph nodes: {', '.join(self.origins)}"]
        lines += [f"source: {s}" for s in self.sources]
        return lines


def _coefficients(index: sympy.Expr, dims: tuple[sympy.Symbol, ...]) -> tuple | None:
    """``index`` as (constant, coefficient per dim) when it is affine in ``dims``."""
    poly = sympy.expand(index)
    coeffs = tuple(poly.coeff(d) for d in dims)
    rest = sympy.expand(poly - sum(c * d for c, d in zip(coeffs, dims)))
    if any(c.has(*dims) for c in coeffs) or rest.has(*dims):
        return None
    return rest, coeffs


def plan_kernel(group: FusedGroup, name: str) -> KernelPlan:
    buffers: list[ComputedBuffer] = group.buffers
    shape = buffers[0].layout.shape
    ndim = len(shape)
    dims = dim_symbols(ndim)

    # Iterate in the memory order of the first output (outermost = largest stride), dropping
    # size-1 dims.
    first = buffers[0].layout
    live = [k for k in range(ndim) if shape[k] != 1]
    order = sorted(live, key=lambda k: -_sort_key(first.stride[k]))

    accesses: list[sympy.Expr] = [b.layout.index(dims) for b in buffers]
    for b in buffers:
        accesses += [e.index for e in walk(b.body) if isinstance(e, Load)]
    table = [_coefficients(a, dims) for a in accesses]

    # Merge adjacent dims (in iteration order) when every access sees them as one.
    groups: list[list[int]] = []
    for k in order:
        if groups and all(
            t is not None and sympy.expand(t[1][groups[-1][-1]] - t[1][k] * shape[k]) == 0
            for t in table
        ):
            groups[-1].append(k)
        else:
            groups.append([k])

    loop_vars = tuple(index_symbol(f"x{j}") for j in range(len(groups)))
    ranges = tuple(sympy.Mul(*[shape[k] for k in g]) for g in groups)

    def reindex(index: sympy.Expr) -> sympy.Expr:
        t = _coefficients(index, dims)
        if t is None:
            raise NotImplementedError(f"non-affine index {index}")
        const, coeffs = t
        return sympy.expand(const + sum(coeffs[g[-1]] * x for g, x in zip(groups, loop_vars)))

    def relabel(e: Expr) -> Expr:
        return map_loads(e, lambda ld: Load(ld.buffer, reindex(ld.index), ld.dtype))

    stores = tuple(
        Store(b.name, reindex(b.layout.index(dims)), relabel(b.body), b.layout.dtype)
        for b in buffers
    )
    inputs: dict[str, torch.dtype] = {}
    for st in stores:
        for e in walk(st.value):
            if isinstance(e, Load):
                inputs.setdefault(e.buffer, e.dtype)
    origins = tuple(dict.fromkeys(o for b in buffers for o in b.origins))
    sources = tuple(dict.fromkeys(s for b in buffers for s in b.sources))
    return KernelPlan(name, ranges, loop_vars, tuple(inputs.items()), stores, origins, sources)


def _sort_key(stride: sympy.Expr) -> float:
    try:
        return float(stride)
    except TypeError:  # symbolic: treat as large, keeping symbolic dims outermost
        return float("inf")


def kernel_name(prefix: str, group: FusedGroup, index: int) -> str:
    """``triton_poi_sin_add_0``: the kind, the first few ops, a counter (as Inductor)."""
    ops: list[str] = []
    for b in group.buffers:
        for origin in b.origins:
            op = origin.split(" ", 1)[1].split(".")[-1]
            if op not in ops and op not in ("to_dtype", "permute", "expand", "getitem"):
                ops.append(op)
    return f"{prefix}_{'_'.join(ops[:4]) or 'copy'}_{index}"
