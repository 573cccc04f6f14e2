"""What every backend shares: the code writer and the kernel plan.

A :class:`KernelPlan` is a fused group made ready to print: its iteration space reordered so
the first output is written in memory order, adjacent dimensions merged wherever every
access allows it (a contiguous elementwise kernel becomes one flat loop), and every index
re-expressed over the merged loop variables ``x0, x1, ...`` (outermost first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import sympy
import torch

from minicompile.errors import SourceLine
from minicompile.ir import (
    Cat,
    ComputedBuffer,
    Expr,
    IndexExpr,
    IndirectLoad,
    Load,
    Reduce,
    map_loads,
    reindex_expr,
    divides_by_values,
    walk,
)
from minicompile.sym import index_symbol, product, size_symbols

from minicompile.spaces import FusedGroup, kept_symbols, reduced_symbols, store_index


class CodeWriter:
    """Lines of generated code with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0
        self.unit = "    "

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


def text_sections(filename: str) -> dict[str, str]:
    """The sections of a text file of this folder (C++, or Python for Triton), by name, in
    file order: each runs from its ``//! section NAME`` (``#! section NAME``) line to the next
    (the file's own comment comes before)."""
    text = (Path(__file__).parent / filename).read_text()
    parts = re.split(r"^(?://|#)! section (\w+)\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


@dataclasses.dataclass(frozen=True)
class Store:
    buffer: str
    index: sympy.Expr  # over the plan's loop variables
    value: Expr  # loads indexed over the plan's loop variables; may contain Reduce nodes
    dtype: torch.dtype
    level: str  # "x": one value per kept point (reductions, "x" members); "xr": per element;
    # "c": per element, summed over the kept points (a column sum: passes/mix_order.py)


def pointer_params(inputs: tuple, outputs: tuple) -> list[str]:
    """``in_ptr0..`` for the (buffer, dtype) ``inputs``, then ``out_ptr0..`` for ``outputs``."""
    return [f"in_ptr{k}" for k in range(len(inputs))] + [
        f"out_ptr{k}" for k in range(len(outputs))
    ]


def pointer_param(inputs: tuple, outputs: tuple, buffer: str) -> str:
    """The parameter of :func:`pointer_params` that points at ``buffer``."""
    names = [b for b, _ in inputs]
    if buffer in names:
        return f"in_ptr{names.index(buffer)}"
    return f"out_ptr{outputs.index(buffer)}"


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """A fused group ready to print.  Pointwise kernels have only x loops; reduction
    kernels also r loops (the reduced dims).  Values of members the rest of the program
    does not read are never stored: other members use them from registers."""

    name: str
    ranges: tuple[sympy.Expr, ...]  # merged kept (x) loop sizes, outermost first
    loop_vars: tuple[sympy.Symbol, ...]  # x0, x1, ... matching ranges
    inputs: tuple[tuple[str, torch.dtype], ...]  # buffers loaded, in parameter order
    stores: tuple[Store, ...]
    origins: tuple[str, ...]  # graph nodes ("%3 add")
    sources: tuple[SourceLine, ...]  # user source lines
    rranges: tuple[sympy.Expr, ...] = ()  # merged reduced (r) loop sizes
    rvars: tuple[sympy.Symbol, ...] = ()  # r0, r1, ...
    # Traced values of the size symbols, for choosing block sizes only.
    hints: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)
    # (input, output) pairs stored in place (passes/inplace.py): the input is read through
    # the output's pointer, so no two parameters alias.
    in_place: tuple[tuple[str, str], ...] = ()

    @property
    def is_reduction(self) -> bool:
        return bool(self.rvars) or any(
            isinstance(e, Reduce) for st in self.stores for e in walk(st.value)
        )

    @property
    def numel(self) -> sympy.Expr:
        return product(self.ranges)

    @property
    def rnumel(self) -> sympy.Expr:
        return product(self.rranges)

    @property
    def column_sums(self) -> tuple[Store, ...]:
        """The stores summed over the rows (mix-order reductions): stored once, at the end."""
        return tuple(s for s in self.stores if s.level == "c")

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(s.buffer for s in self.stores)

    @property
    def size_args(self) -> tuple[sympy.Symbol, ...]:
        """The size symbols the kernel's loops and indices use: scalar parameters."""
        exprs: list[sympy.Expr] = [*self.ranges, *self.rranges]
        for st in self.stores:
            exprs.append(st.index)
            for e in walk(st.value):
                if isinstance(e, Load):
                    exprs.append(e.index)
                if isinstance(e, IndirectLoad):
                    exprs.append(e.size)
                if isinstance(e, IndexExpr):
                    exprs.append(e.index)
        return size_symbols(exprs)

    def params(self) -> list[str]:
        """Kernel parameter names: in_ptr0.., out_ptr0.. (Inductor's spelling)."""
        return pointer_params(self.inputs, self.outputs)

    def pointer(self, buffer: str) -> str:
        buffer = dict(self.in_place).get(buffer, buffer)
        return pointer_param(self.inputs, self.outputs, buffer)

    def header_comment(self) -> list[str]:
        lines = [f"graph nodes: {', '.join(self.origins)}"]
        lines += [f"source: {s}" for s in self.sources]
        return lines


def with_in_place(plan: KernelPlan, in_place: dict[str, str]) -> KernelPlan:
    """``plan`` storing the outputs of ``in_place`` (output -> input) into their inputs:
    those inputs are no parameters of their own."""
    pairs = tuple((inp, out) for out, inp in in_place.items() if out in plan.outputs)
    if not pairs:
        return plan
    dropped = {inp for inp, _ in pairs}
    inputs = tuple(i for i in plan.inputs if i[0] not in dropped)
    return dataclasses.replace(plan, inputs=inputs, in_place=pairs)


def checks_indices(plan: KernelPlan) -> bool:
    """Whether the kernel reads through indices: it then takes ``err_ptr``, a flag it sets
    for an index out of range (the wrapper raises IndexError), or on a GPU checks them with
    device-side asserts."""
    return any(isinstance(e, IndirectLoad) for st in plan.stores for e in walk(st.value))


def divides_integers(plan: KernelPlan) -> bool:
    """Whether the kernel divides integers by values it reads (ir.divides_by_values): on
    CPU it then takes ``err_ptr`` and sets it for a divisor of zero.  (On a GPU an integer
    division by zero is no error, as in eager's CUDA kernels.)"""
    return any(divides_by_values(e) for st in plan.stores for e in walk(st.value))


def checks_values(plan: KernelPlan) -> bool:
    """Whether a kernel on CPU takes ``err_ptr``."""
    return checks_indices(plan) or divides_integers(plan)


def pending(expr: Expr, done: dict) -> list[Expr]:
    """The subexpressions of ``expr`` not in ``done``, children before parents, without
    entering a Reduce's operand (the reduction emits it in its own loop) or a Cat's pieces
    (each is emitted under its own condition)."""
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if e in done or id(e) in seen:
            continue
        if expanded or isinstance(e, (Reduce, Cat)) or not e.children():
            seen.add(id(e))
            order.append(e)
            continue
        stack.append((e, True))
        stack.extend((c, False) for c in reversed(e.children()))
    return order


def reduction_batches(plan: KernelPlan) -> list[list[Reduce]]:
    """The plan's reductions in dependency order, batched so that no reduction reads one of
    its own batch: each batch is one pass over the row."""
    order = [e for st in plan.stores for e in walk(st.value) if isinstance(e, Reduce)]
    batches: list[list[Reduce]] = []
    for red in dict.fromkeys(order):
        inner = {e for e in walk(red.x) if isinstance(e, Reduce)}
        if batches and not inner & set(batches[-1]):
            batches[-1].append(red)
        else:
            batches.append([red])
    return batches


def row_invariant(exprs: list[Expr], done: dict, rvars: tuple) -> list[Expr]:
    """The not-yet-computed subexpressions of ``exprs`` that do not vary along the reduced
    dims (no load indexed by an r variable under them): computed once per row, before the
    loops over the row."""
    rnames = {str(r) for r in rvars}
    varies: dict[int, bool] = {}
    out: list[Expr] = []
    for expr in exprs:
        for e in pending(expr, done):
            if isinstance(e, (Load, IndexExpr)):
                v = any(s.name in rnames for s in e.index.free_symbols) or any(
                    varies.get(id(c), False) for c in e.children()  # an IndirectLoad's index
                )
            elif isinstance(e, Reduce):
                v = True  # computed by its own loop
            elif isinstance(e, Cat):  # its pieces are not visited: look inside
                v = any(
                    s.name in rnames
                    for x in (e.index, *(ld.index for ld in walk(e) if isinstance(ld, Load)))
                    for s in x.free_symbols
                ) or any(isinstance(x, Reduce) for x in walk(e))
            else:
                v = any(varies.get(id(c), False) for c in e.children())
            varies[id(e)] = v
            if not v and e not in out:
                out.append(e)
    return out


@functools.lru_cache(maxsize=8192)
def _coefficients(index: sympy.Expr, dims: tuple[sympy.Symbol, ...]) -> tuple | None:
    """``index`` as (constant, coefficient per dim) when it is affine in ``dims``.  (Each
    access is asked about once for its merge and again per load: remembered.)"""
    poly = sympy.expand(index)
    coeffs = tuple(poly.coeff(d) for d in dims)
    rest = sympy.expand(poly - sum(c * d for c, d in zip(coeffs, dims)))
    if any(c.has(*dims) for c in coeffs) or rest.has(*dims):
        return None
    return rest, coeffs


def _merge(order: list[int], sizes: tuple, table: list) -> list[list[int]]:
    """Runs of adjacent dims (in ``order``) that every access sees as one."""
    runs: list[list[int]] = []
    for k in order:
        if runs and all(
            t is not None and sympy.expand(t[1][runs[-1][-1]] - t[1][k] * sizes[k]) == 0
            for t in table
        ):
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def plan_kernel(group: FusedGroup, name: str, needed: set[str], hints: dict) -> KernelPlan:
    """Plan the kernel of ``group``.  ``needed``: the members the rest of the program reads
    (stored); ``hints``: traced values of size symbols."""
    space = group.space
    places = group.placements()
    assert places is not None, f"group {group.name} does not fit one iteration space"
    p = kept_symbols(len(space.kept))
    q = reduced_symbols(len(space.reduced))
    members: list[ComputedBuffer] = group.buffers  # type: ignore[assignment]

    def to_space(e: Expr, buf: ComputedBuffer) -> Expr:
        return reindex_expr(e, places[buf.name].apply)

    bodies = {b.name: to_space(b.body, b) for b in members}
    store_at = {b.name: store_index(b, places[b.name]) for b in members}

    # Loop order: kept dims in the memory order of the first member's output (pointwise
    # groups write in memory order), reduced dims as they come; then merge.
    first = members[0]
    strides = [sympy.expand(store_at[first.name]).coeff(v) for v in p]
    x_order = sorted(range(len(p)), key=lambda k: -_sort_key(strides[k])) if not q else list(
        range(len(p))
    )
    # Every index the kernel computes (loads', index expressions', a Cat's position):
    # a dim one of them reads alone, or tests, is never merged away.
    accesses = list(store_at.values()) + [
        e.index for body in bodies.values() for e in walk(body)
        if isinstance(e, (Load, IndexExpr, Cat))
    ]
    x_runs = _merge(x_order, space.kept, [_coefficients(a, p) for a in accesses])
    r_runs = _merge(list(range(len(q))), space.reduced, [_coefficients(a, q) for a in accesses])
    loop_vars = tuple(index_symbol(f"x{j}") for j in range(len(x_runs)))
    rvars = tuple(index_symbol(f"r{j}") for j in range(len(r_runs)))

    reindex = _reindexer(((p, x_runs, loop_vars), (q, r_runs, rvars)))

    # Members read by other members come from registers: substitute their values.
    values: dict[str, Expr] = {}
    for b in members:
        def resolve(ld: Load) -> Expr:
            if isinstance(ld, Load) and ld.buffer in values:
                return values[ld.buffer]
            return ld.with_index(reindex(ld.index))

        values[b.name] = map_loads(bodies[b.name], resolve, index=reindex)

    def store(b: ComputedBuffer) -> Store:
        kind = places[b.name].kind
        if kind == "column":  # its operand, added up over the rows (passes/mix_order.py)
            return Store(b.name, reindex(store_at[b.name]), values[b.name].x,  # type: ignore[attr-defined]
                         b.layout.dtype, "c")
        return Store(b.name, reindex(store_at[b.name]), values[b.name], b.layout.dtype,
                     "xr" if kind == "xr" else "x")

    stores = tuple(store(b) for b in members if b.name in needed)
    inputs: dict[str, torch.dtype] = {}
    for st in stores:
        for e in walk(st.value):
            if isinstance(e, Load):
                inputs.setdefault(e.buffer, e.dtype)
    origins = tuple(dict.fromkeys(o for b in members for o in b.origins))
    sources = tuple(dict.fromkeys(s for b in members for s in b.sources))
    ranges = tuple(product([space.kept[k] for k in run]) for run in x_runs)
    rranges = tuple(product([space.reduced[k] for k in run]) for run in r_runs)
    return KernelPlan(name, ranges, loop_vars, tuple(inputs.items()), stores, origins, sources,
                      rranges, rvars, hints)


def _reindexer(sets: tuple) -> Callable[[sympy.Expr], sympy.Expr]:
    """An index over the canonical symbols as one over the loop variables: ``sets`` holds
    (canonical dims, their merged runs, the runs' variables) for the kept dims, then the
    reduced ones."""
    singles = {dims[run[0]]: v for dims, runs, names in sets
               for run, v in zip(runs, names) if len(run) == 1}

    @functools.lru_cache(maxsize=None)
    def reindex(index: sympy.Expr) -> sympy.Expr:
        # Each set affine in ``index`` becomes its runs' variables; one that is not (a
        # reshape of a computed value, or of the reduced dims: Swin's patch merging reads a
        # layer_norm's row through one) had no dims merged, so each of its canonical
        # symbols is one loop variable.
        for dims, runs, names in sets:
            t = _coefficients(index, dims)
            if t is None:
                index = index.xreplace({d: singles[d] for d in dims})
            else:
                index = t[0] + sum(t[1][run[-1]] * v for run, v in zip(runs, names))
        return sympy.expand(index)

    return reindex


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
    kind = "red_" if group.has_reduction else "poi_"
    return f"{prefix}_{'_'.join(ops[:4]) or 'copy'}_{index}".replace("poi_", kind, 1)
