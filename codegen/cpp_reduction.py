"""C++ kernels for groups with reductions: OpenMP over the kept points (rows), a pass over
the reduced elements per batch of independent reductions, then a pass for the outputs that
are per element.  A float sum accumulates in float over blocks of :data:`SUM_BLOCK`
elements of the innermost reduced loop (the full SIMD width, no conversions) and adds each
block's sum into a double, as eager's CPU batch norm adds each plane's float sum into a
double: as accurate as a double accumulator and, with GCC 12, 2-20x faster (20x for a
batch-norm backward's four sums at once).

A reduction whose inputs are contiguous along the innermost kept dim instead (``x.sum(0)``
of a row-major matrix, a bias gradient) reduces blocks of columns: the reduced loops
outside, an ``omp simd`` loop over the block's columns inside, one accumulator per column
(:class:`CppColumnReductionKernel`).  Either way the innermost loop is unit-stride and the
compiler vectorises it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import sympy
import torch

from minicompile.ir import LOW_PRECISION, Expr, Load, Op, Reduce, walk

from minicompile.codegen.common import KernelPlan, Store, reduction_batches
from minicompile.codegen.cpp import CPP, CppKernel, cat_spans, pieces_at
from minicompile.codegen.cpp_threads import EXPENSIVE, line_iterations, plan_parallel
from minicompile.codegen.emitter import reduction_identity
from minicompile.codegen.printers import cpp_index

COMBINE = {
    "sum": "{acc} + {v}",
    "prod": "{acc} * {v}",
    # NaN is tracked apart (see reduce_batch), so plain max/min vectorise here.
    "amax": "std::max({acc}, static_cast<{t}>({v}))",
    "amin": "std::min({acc}, static_cast<{t}>({v}))",
    "any": "{acc} | {v}",
    "all": "{acc} & {v}",
}
# A column reduction has no OpenMP reduction clause: max/min propagate NaN themselves.
COLUMN_COMBINE = {
    **COMBINE,
    "amax": "({v} > {acc} || {v} != {v}) ? static_cast<{t}>({v}) : {acc}",
    "amin": "({v} < {acc} || {v} != {v}) ? static_cast<{t}>({v}) : {acc}",
}
OMP_REDUCTION = {"sum": "+", "prod": "*", "any": "|", "all": "&", "amax": "max", "amin": "min"}
# Columns one thread reduces at once in a column reduction: 64 double sums are 512 bytes of
# accumulators, in L1 beside the rows' cache lines.
COLUMN_BLOCK = 64
# Elements of the innermost reduced loop a float sum adds in float (one partial sum a SIMD
# lane: 64-128 adds each) before adding them to its double total.
SUM_BLOCK = 1024
# Rows a column sum adds into each lane's float partial before adding it to the double.
COLUMN_SUM_BLOCK = 256
# Chunks of rows a kernel with column sums (mix-order reductions) splits its rows into, at
# most; each of MIX_ROWS rows at least, so that adding up the partials costs little.
MIX_CHUNKS = 64
MIX_ROWS = 8


def accumulator_type(red: Reduce) -> str:
    if red.op in ("sum", "prod") and (red.dtype.is_floating_point):
        return "double"
    if red.op in ("any", "all"):
        return "int"  # GCC 12 leaves a loop reducing a bool scalar (10x slower)
    return CPP.compute(red.dtype)


def _sums_in_blocks(red: Reduce, ctype: str) -> bool:
    """Whether ``red`` adds float partial sums per block into its double accumulator."""
    return red.op == "sum" and ctype == "double" and red.dtype != torch.float64


def _identity(red: Reduce, ctype: str) -> str:
    """The reduction's starting value, as a literal of the accumulator type."""
    return CPP.literal(reduction_identity(red), torch.float64 if ctype == "double" else red.dtype)


class CppReductionKernel(CppKernel):
    def __init__(self, plan: KernelPlan) -> None:
        super().__init__(plan)
        self.accs = 0
        self.kept: dict[Expr, Store] = {}  # reduced operand -> the output it is stored in

    def emit_loops(self) -> None:
        p = self.plan
        ranges = [cpp_index(r) for r in p.ranges]
        self.parallel = plan_parallel(p, self.shared_loops(), self.shared_vars())
        if p.column_sums:
            self.chunked_rows()
        elif ranges:
            self.row_loops(0, ranges)
        else:
            self.row_body()

    def chunked_rows(self) -> None:
        """Rows in :data:`MIX_CHUNKS` chunks, each adding its rows' column values into
        partial sums of its own (double), then the partials summed in chunk order: the
        same result for any number of threads (passes/mix_order.py)."""
        p, w = self.plan, self.w
        rows, columns = int(p.numel), int(p.rnumel)
        chunks = max(1, min(rows // MIX_ROWS, MIX_CHUNKS))
        size = -(-rows // chunks)
        line = line_iterations(p, p.loop_vars[-1])  # (no two chunks write into one line)
        size = -(-size // line) * line
        chunks = -(-rows // size)
        sums = p.column_sums
        w.line(f"double* part = new double[{len(sums) * chunks * columns}]();")
        shared = plan_parallel(p, [sympy.Integer(chunks)])
        if shared.depth:
            w.line(f"#pragma omp {shared.pragma()}")
        with w.block(f"for (int64_t chunk = 0; chunk < {chunks}; ++chunk)"):
            for k in range(len(sums)):
                w.line(f"double* col{k} = part + ({k * chunks} + chunk) * {columns};")
            stop = f"std::min<int64_t>({rows}, chunk * {size} + {size})"
            with w.block(f"for (int64_t xflat = chunk * {size}; xflat < {stop}; ++xflat)"):
                inner = 1
                for x, n in reversed(list(zip(p.loop_vars, p.ranges))):
                    w.line(f"const int64_t {x} = (xflat / {inner}) % {cpp_index(n)};")
                    inner *= int(n)
                self.row_body()
        r = p.rvars[0]
        with w.block(f"for (int64_t {r} = 0; {r} < {columns}; ++{r})"):
            for k, st in enumerate(sums):
                w.line(f"double sum{k} = 0;")
                with w.block(f"for (int64_t chunk = 0; chunk < {chunks}; ++chunk)"):
                    w.line(f"sum{k} += part[({k * chunks} + chunk) * {columns} + {r}];")
                w.line(f"{self.pointer(st.buffer)}[{cpp_index(st.index)}] = "
                       f"static_cast<float>(sum{k});")
        w.line("delete[] part;")

    def shared_loops(self) -> list[sympy.Expr]:
        """The trip counts of the loops that may run in parallel: the kept (row) loops."""
        return list(self.plan.ranges)

    def shared_vars(self) -> tuple[sympy.Symbol, ...]:
        """The loop variables of the first of :meth:`shared_loops`, as far as they are
        the plan's."""
        return self.plan.loop_vars

    def row_loops(self, depth: int, ranges: list[str]) -> None:
        x = self.plan.loop_vars[depth]
        if depth == 0 and self.parallel.depth:
            self.w.line(f"#pragma omp {self.parallel.pragma()}")
        with self.w.block(f"for (int64_t {x} = 0; {x} < {ranges[depth]}; ++{x})"):
            if depth + 1 < len(ranges):
                self.row_loops(depth + 1, ranges)
            else:
                self.row_body()

    def row_body(self) -> None:
        p = self.plan
        self.names = {}
        elem = [s for s in p.stores if s.level == "xr"]
        self.kept = self.kept_operands(elem)
        self.written: dict[Expr, Store] = {}  # kept operands an earlier pass stored
        for batch in reduction_batches(self.plan):
            self.reduce_batch(batch)
            self.written.update((r.x, self.kept[r.x]) for r in batch if r.x in self.kept)
        # An output that is a kept operand itself was written by its reduction's pass.
        elem = [s for s in elem if s.value not in self.kept or self.kept[s.value] is not s]
        sums = p.column_sums
        self.hoist([s.value for s in elem + list(sums)])
        position = {id(s): k for k, s in enumerate(p.stores)}
        elem_at, sums_at = ([position[id(s)] for s in group] for group in (elem, sums))

        def body() -> None:
            stores = self.plan.stores  # (in a cat span's loop, its pieces: element_loops)
            self.reread([stores[k].value for k in elem_at + sums_at])
            for k in elem_at:
                self.emit_body_store(stores[k])
            for j, k in enumerate(sums_at):  # (dense: its index is the column's)
                s = stores[k]
                self.w.line(f"col{j}[{cpp_index(s.index)}] += {self.value(s.value)};")

        if elem or sums:
            self.element_loops(0, body, None, simd=True, pieces=True)
        self.row_stores([s for s in p.stores if s.level == "x"])

    def kept_operands(self, elem: list[Store]) -> dict[Expr, Store]:
        """Reduced operands that a per-element output of the same type contains, where
        reading them back is cheaper than computing them again: with a math function
        (softmax's ``exp(x - max)``), or a load strided along the innermost reduced loop
        into an output that is not (a layer norm of ``x + y.transpose(1, 2)``, mlp_mixer's
        residual after its token mixing: each later pass gathered ``y`` again, one element
        a cache line).  The reduction's pass stores each in that output, and the later
        passes read it back.  Not an output stored in place of an input: the passes read
        the input there."""
        kept: dict[Expr, Store] = {}
        in_place = {out for _, out in self.plan.in_place}
        inner = self.plan.rvars[-1]
        for red in (r for batch in reduction_batches(self.plan) for r in batch):
            x = red.x
            expensive = any(isinstance(e, Op) and e.op in EXPENSIVE for e in walk(x))
            gathers = any(isinstance(e, Load) and _step(e.index, inner) not in (0, 1)
                          for e in walk(x))
            if x in kept or not (expensive or gathers):
                continue  # (cheaper to compute again than to store and load)
            fits = [s for s in elem if s.dtype == x.dtype and s.buffer not in in_place
                    and (expensive or _step(s.index, inner) == 1)
                    and x.dtype in (torch.float32, torch.float64)
                    and all(s is not k for k in kept.values())  # one operand an output
                    and _uses(s.value, x)]
            if fits:  # an output of the operand itself first: it needs no last pass
                kept[x] = next((s for s in fits if s.value == x), fits[0])
        return kept

    def stored(self, store: Store) -> str:
        return f"{self.pointer(store.buffer)}[{cpp_index(store.index)}]"

    def reread(self, exprs: list[Expr]) -> None:
        """The kept operands that an earlier pass stored and ``exprs`` use, read back."""
        for x, store in self.written.items():
            if any(_uses(v, x) for v in exprs):
                self.names[x] = self.fresh(self.stored(store), CPP.compute(x.dtype))

    def row_stores(self, stores: list) -> None:
        """The stores of one value per kept point, after the row's loops."""
        for store in stores:
            self.emit_body_store(store)

    def reduce_batch(self, batch: list[Reduce]) -> None:
        """One pass over the row accumulating every reduction of ``batch``.  Each has an
        OpenMP reduction clause, so the loop vectorises; max/min also track whether a NaN
        was seen (OpenMP's max drops NaN, torch's propagates it)."""
        accs = []
        clauses = []
        blocked = []  # float sums: a float partial per block (see the module)
        for red in batch:
            acc, ctype = self.accumulator(red)
            self.w.line(f"{ctype} {acc} = {_identity(red, ctype)};")
            if _sums_in_blocks(red, ctype):
                blocked.append(acc)
                acc, ctype = f"{acc}_part", "float"
            nan = None
            if red.op in ("amax", "amin") and red.dtype.is_floating_point:
                nan = f"{acc}_nan"  # an int: GCC 12 leaves a loop reducing a bool scalar
                self.w.line(f"int {nan} = 0;")
                clauses.append(f"reduction(|:{nan})")
            clauses.append(f"reduction({OMP_REDUCTION[red.op]}:{acc})")
            accs.append((red, acc, ctype, nan))
        self.hoist([red.x for red in batch])

        def body() -> None:
            self.reread([red.x for red in batch])
            for red, acc, ctype, nan in accs:
                v = self.value(red.x)
                self.w.line(f"{acc} = {COMBINE[red.op].format(acc=acc, v=v, t=ctype)};")
                if red.x in self.kept:
                    self.w.line(f"{self.stored(self.kept[red.x])} = {v};")
                if nan is not None:
                    self.w.line(f"{nan} |= ({v} != {v});")

        self.element_loops(0, body, " ".join(clauses), simd=True, blocked=blocked)
        for red, acc, _, nan in accs:
            acc = acc.removesuffix("_part")
            self.names[red] = self.fresh(_final_text(red, acc, nan), CPP.compute(red.dtype))

    def accumulator(self, red: Reduce) -> tuple[str, str]:
        """A new accumulator's name and C type for ``red``."""
        self.accs += 1
        return f"acc{self.accs - 1}", accumulator_type(red)

    def element_loops(self, depth: int, body, clause: str | None, simd: bool,
                      blocked: list[str] = (), pieces: bool = False) -> None:
        """The reduced loops around ``body``, the innermost ``omp simd`` with ``clause``;
        each float sum of ``blocked`` adds a float ``{acc}_part`` per :data:`SUM_BLOCK`
        elements of the innermost loop into its double ``acc``.  ``pieces``: ``body``
        reads its stores off ``self.plan``, so a cat along the innermost loop becomes one
        loop per piece (``cpp.cat_spans``), without the per-element branch."""
        p = self.plan
        if depth == len(p.rvars):
            saved = dict(self.names)
            body()
            self.names = saved  # per-element values end with the loop
            return
        r, size = p.rvars[depth], p.rranges[depth]
        innermost = depth == len(p.rvars) - 1
        if depth < len(p.rvars) - 1 or not blocked:
            spans = cat_spans(p, r, size) if innermost and pieces else None
            for lo, hi in spans or [(0, cpp_index(size))]:
                if innermost and simd:
                    self.w.line("#pragma omp simd" + (f" {clause}" if clause else ""))
                with self.w.block(f"for (int64_t {r} = {lo}; {r} < {hi}; ++{r})"):
                    self.plan = pieces_at(p, r, (lo, hi)) if spans else p
                    self.element_loops(depth + 1, body, clause, simd, blocked, pieces)
                    self.plan = p
            return

        def inner(start: str, stop: str) -> None:
            self.w.line("#pragma omp simd" + (f" {clause}" if clause else ""))
            with self.w.block(f"for (int64_t {r} = {start}; {r} < {stop}; ++{r})"):
                self.element_loops(depth + 1, body, clause, simd)

        self.sum_blocks(r, size, SUM_BLOCK, blocked, inner)

    def sum_blocks(self, r: str, size: sympy.Expr, block: int, blocked: list[str],
                   inner: Callable[[str, str], None]) -> None:
        """The loop over ``r`` (``inner(start, stop)`` emits it) in blocks of ``block``
        iterations (one block when ``size`` is at most that), each block's float partial
        sums of ``blocked`` started before it and added to their double totals after."""
        start, stop = "0", cpp_index(size)
        blocks = contextlib.nullcontext()
        if not (size.is_Integer and int(size) <= block):
            blocks = self.w.block(f"for (int64_t {r}_block = 0; {r}_block < {stop}; "
                                  f"{r}_block += {block})")
            start, stop = f"{r}_block", f"std::min<int64_t>({stop}, {r}_block + {block})"
        with blocks:
            self.start_partials(blocked)
            inner(start, stop)
            self.add_partials(blocked)

    def start_partials(self, blocked: list[str]) -> None:
        for acc in blocked:
            self.w.line(f"float {acc}_part = 0.0f;")

    def add_partials(self, blocked: list[str]) -> None:
        for acc in blocked:
            self.w.line(f"{acc} += {acc}_part;")


def _uses(value: Expr, x: Expr) -> bool:
    """Whether ``value`` computes ``x`` per element (not only inside a reduction's operand,
    which its own pass computed)."""
    stack, seen = [value], set()
    while stack:
        e = stack.pop()
        if e == x:
            return True
        if id(e) not in seen and not isinstance(e, Reduce):
            seen.add(id(e))
            stack.extend(e.children())
    return False


def _step(index: sympy.Expr, r: sympy.Symbol) -> int:
    """How far ``index`` moves per step of loop ``r`` (-1 where not a constant)."""
    step = sympy.expand(index).coeff(r)
    return int(step) if step.is_Integer else -1


def _final_text(red: Reduce, acc: str, nan: str | None) -> str:
    """The reduction's value from its accumulator (and NaN flag), in its dtype's precision."""
    ctype = CPP.compute(red.dtype)
    text = f"static_cast<{ctype}>({acc})"
    if nan is not None:
        text = f"{nan} ? std::numeric_limits<{ctype}>::quiet_NaN() : {text}"
    if red.dtype in LOW_PRECISION:
        text = CPP.round(text, red.dtype)
    return text


def reads_columns(plan: KernelPlan) -> bool:
    """Whether the reductions read along the innermost kept dim: some load they reduce is
    unit-stride in the innermost kept loop variable and none in the innermost reduced one
    (``x.sum(0)`` of a row-major matrix), over at least 16 columns."""
    if not plan.rvars or not plan.ranges:
        return False
    columns = plan.ranges[-1]
    if columns.is_Integer and int(columns) < 16:
        return False
    x, r = plan.loop_vars[-1], plan.rvars[-1]
    loads = [e for st in plan.stores for red in walk(st.value) if isinstance(red, Reduce)
             for e in walk(red.x) if isinstance(e, Load)]
    strides = [(sympy.expand(ld.index).coeff(x), sympy.expand(ld.index).coeff(r))
               for ld in loads]
    return any(sx == 1 for sx, _ in strides) and not any(sr == 1 for _, sr in strides)


class CppColumnReductionKernel(CppReductionKernel):
    """Reductions along outer dims (see the module): the innermost kept loop runs over
    blocks of :data:`COLUMN_BLOCK` columns; in each, the reduced loops run outside and an
    ``omp simd`` loop over the block's columns (``lane``) inside.  A reduction's
    accumulators and its values are arrays over the lanes."""

    def shared_loops(self) -> list[sympy.Expr]:
        *outer, columns = self.plan.ranges
        return [*outer, sympy.ceiling(columns / COLUMN_BLOCK)]

    def shared_vars(self) -> tuple[sympy.Symbol, ...]:
        return self.plan.loop_vars[:-1]  # (the last loop is over blocks of columns)

    def row_loops(self, depth: int, ranges: list[str]) -> None:
        if depth < len(ranges) - 1:
            super().row_loops(depth, ranges)
            return
        x = self.plan.loop_vars[depth]
        self.w.line(f"// blocks of {COLUMN_BLOCK} columns {x}: reduced loops outside, columns "
                    f"inside (contiguous)")
        if depth == 0 and self.parallel.depth:
            self.w.line(f"#pragma omp {self.parallel.pragma()}")
        size = ranges[depth]
        with self.w.block(f"for (int64_t {x}_base = 0; {x}_base < {size}; "
                          f"{x}_base += {COLUMN_BLOCK})"):
            self.w.line(f"const int64_t {x}_width = std::min<int64_t>({COLUMN_BLOCK}, "
                        f"{size} - {x}_base);")
            self.row_body()

    def row_stores(self, stores: list) -> None:
        if stores:  # (a column kernel has no column sums: emit_reduction_kernel)
            self.lanes(lambda: [self.emit_body_store(s) for s in stores])

    def lanes(self, body, indexed: bool = True) -> None:
        """The simd loop over the block's columns, ``body`` inside it (``indexed``: with
        the column's loop variable)."""
        x = self.plan.loop_vars[-1]
        self.w.line("#pragma omp simd")
        with self.w.block(f"for (int64_t lane = 0; lane < {x}_width; ++lane)"):
            if indexed:
                self.w.line(f"const int64_t {x} = {x}_base + lane;")
            saved = dict(self.names)
            body()
            self.names = saved  # per-column values end with the loop

    def element_loops(self, depth: int, body, clause: str | None, simd: bool,
                      blocked: list[str] = (), pieces: bool = False) -> None:
        """The reduced loops, the block's lanes inside; float sums of ``blocked`` add
        per-lane float partials over :data:`COLUMN_SUM_BLOCK` iterations of the innermost
        reduced loop into their double accumulators.  (``pieces`` is the row kernel's: here
        a cat along a reduced loop branches outside the lanes, once per iteration.)"""
        p = self.plan
        if depth == len(p.rvars):
            self.lanes(body)
            return
        r, size = p.rvars[depth], p.rranges[depth]

        def inner(start: str, stop: str) -> None:
            with self.w.block(f"for (int64_t {r} = {start}; {r} < {stop}; ++{r})"):
                self.element_loops(depth + 1, body, clause, simd,
                                   () if depth == len(p.rvars) - 1 else blocked)

        if depth == len(p.rvars) - 1 and blocked:
            self.sum_blocks(r, size, COLUMN_SUM_BLOCK, blocked, inner)
        else:
            inner("0", cpp_index(size))

    def start_partials(self, blocked: list[str]) -> None:
        self.lanes(lambda: [self.w.line(f"{acc}_part[lane] = 0.0f;") for acc in blocked],
                   indexed=False)

    def add_partials(self, blocked: list[str]) -> None:
        self.lanes(lambda: [self.w.line(f"{acc}[lane] += {acc}_part[lane];")
                            for acc in blocked], indexed=False)

    def hoist(self, exprs: list) -> None:
        """Nothing is computed once a block: values vary along its columns."""

    def kept_operands(self, elem: list[Store]) -> dict[Expr, Store]:
        """None: values are arrays over the block's lanes here."""
        return {}

    def reduce_batch(self, batch: list[Reduce]) -> None:
        """One pass over the reduced dims accumulating every reduction of ``batch`` into
        its array of per-column accumulators."""
        accs = []
        blocked = []  # float sums: float partials per block of rows (see element_loops)
        for red in batch:
            acc, ctype = self.accumulator(red)
            self.w.line(f"{ctype} {acc}[{COLUMN_BLOCK}];")
            accs.append((red, acc, ctype))
            if _sums_in_blocks(red, ctype):
                blocked.append(acc)
                self.w.line(f"float {acc}_part[{COLUMN_BLOCK}];")

        def start() -> None:
            for red, acc, ctype in accs:
                self.w.line(f"{acc}[lane] = {_identity(red, ctype)};")

        def finish() -> None:
            for (red, acc, _), out in zip(accs, outs):
                self.w.line(f"{out}[lane] = {_final_text(red, f'{acc}[lane]', None)};")

        self.lanes(start, indexed=False)
        self.element_loops(0, lambda: self.lane_updates(accs, blocked), None, simd=True,
                           blocked=blocked)
        outs = []
        for red, *_ in accs:
            outs.append(f"tmp{self.count}")
            self.count += 1
            self.w.line(f"{CPP.compute(red.dtype)} {outs[-1]}[{COLUMN_BLOCK}];")
        self.lanes(finish, indexed=False)
        for (red, *_), out in zip(accs, outs):
            self.names[red] = f"{out}[lane]"


    def lane_updates(self, accs: list[tuple[Reduce, str, str]], blocked: list[str]) -> None:
        """Each accumulator's lane combined with its value at this point (a float sum of
        ``blocked`` into its float partial)."""
        for red, acc, ctype in accs:
            v = self.value(red.x)
            if acc in blocked:
                acc, ctype = f"{acc}_part", "float"
            combined = COLUMN_COMBINE[red.op].format(acc=f"{acc}[lane]", v=v, t=ctype)
            self.w.line(f"{acc}[lane] = {combined};")


def emit_reduction_kernel(plan: KernelPlan) -> str:
    if reads_columns(plan) and not plan.column_sums:
        return CppColumnReductionKernel(plan).emit()
    return CppReductionKernel(plan).emit()
