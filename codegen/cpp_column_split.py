"""Column reductions whose columns leave threads idle, split along the reduced points.

A column kernel (codegen/cpp_reduction.py) shares its kept loops among threads: its blocks
of :data:`COLUMN_BLOCK` columns, and the kept loops outside them.  A batch norm's statistics
in channels-last reduce over (batch, rows, columns) with the channels innermost: 16-64
channels are one block, so the whole kernel ran on one thread however many the machine has
(as a ``x.sum(0)`` of a narrow matrix did).  Here the reduced points, flattened, are cut into
at most :data:`CHUNKS` chunks shared among threads; each chunk accumulates its own partials
of each column, and the partials are combined in chunk order after: the same result for
any number of threads.  The outputs per element after it loop over the reduced points in
parallel too.  Inductor's C++ backend splits such outer reductions alike (per-thread
accumulators combined after the parallel loop).
Each block runs its own parallel loops (one a reduction batch, one for the outputs per
element), so a block must have work to pay for them (:func:`cpp_threads.parallel_bar`), and
the chunks must outnumber the blocks, which the column kernel already shares in one loop:
mobilenet_v2's batch norms over 96-576 channels of 32-512 pixels had made 713 OpenMP
regions a train step on 16 threads, 216 now (its step 0.76 -> 0.71 of eager's time there).
"""

from __future__ import annotations

import math

import sympy

from minicompile.ir import Reduce

from minicompile.codegen import cpp_threads
from minicompile.codegen.common import KernelPlan
from minicompile.codegen.cpp_reduction import (COLUMN_BLOCK, COLUMN_COMBINE, COLUMN_SUM_BLOCK,
                                               CppColumnReductionKernel, _final_text, _identity,
                                               _sums_in_blocks, emit_reduction_kernel,
                                               reads_columns)
from minicompile.codegen.cpp_threads import Parallel, plan_parallel

CHUNKS = 64  # chunks of the reduced points, at most (fixed: results do not depend on threads)
CHUNK_POINTS = 16  # reduced points a chunk has at least, so that combining costs little


def chunks(plan: KernelPlan) -> int:
    """Into how many chunks a column reduction's reduced points are split (0: not split):
    static sizes, fewer kept iterations to share than threads, and enough work for them."""
    if not reads_columns(plan) or plan.column_sums:
        return 0
    sizes = [*plan.ranges, *plan.rranges]
    if not all(sympy.sympify(s).is_Integer for s in sizes):
        return 0
    *outer, columns = (int(s) for s in plan.ranges)
    blocks = math.prod(outer) * -(-columns // COLUMN_BLOCK)
    if blocks >= cpp_threads.planned_threads():
        return 0  # the kept loops have an iteration for every thread
    if int(cpp_threads.kernel_work(plan)) // blocks < cpp_threads.parallel_bar():
        return 0  # each block's parallel loops would cost more than their work
    count = min(CHUNKS, math.prod(int(s) for s in plan.rranges) // CHUNK_POINTS)
    # (no more chunks than blocks: the column kernel shares those in one loop already)
    return count if count > blocks else 0


class CppSplitColumnKernel(CppColumnReductionKernel):
    """A column kernel (its blocks of columns on the calling thread) whose reduced points
    are flattened into ``rflat`` and shared: each reduction batch accumulates per chunk in
    parallel, then combines the chunks' partials; outputs per element loop in parallel."""

    def __init__(self, plan: KernelPlan, count: int) -> None:
        super().__init__(plan)
        self.chunks = count
        self.points = math.prod(int(s) for s in plan.rranges)
        self.size = -(-self.points // count)  # reduced points a chunk
        self.shared = plan_parallel(plan, [sympy.Integer(count)])
        self.in_chunk = False  # emitting a chunk's accumulation (else a loop over all points)

    def emit_loops(self) -> None:
        self.parallel = Parallel()  # the kept loops run on the calling thread
        self.w.line(f"// the reduced points in {self.chunks} chunks of {self.size}, shared "
                    f"among threads; each chunk's partials combined in chunk order")
        self.row_loops(0, [str(int(r)) for r in self.plan.ranges])

    def reduce_batch(self, batch: list[Reduce]) -> None:
        """Each chunk (in parallel) accumulates the batch's reductions over its points
        into its row of ``acc{k}_chunks``; then each column combines its chunks' partials
        in chunk order (a chunk past the last point keeps the identity)."""
        w, chunks = self.w, self.chunks
        accs = []
        for red in batch:
            acc, ctype = self.accumulator(red)
            w.line(f"{ctype}* {acc}_chunks = new {ctype}[{chunks * COLUMN_BLOCK}];")
            accs.append((red, acc, ctype))
        blocked = [acc for red, acc, ctype in accs if _sums_in_blocks(red, ctype)]
        if self.shared.depth:
            w.line(f"#pragma omp {self.shared.pragma()}")
        with w.block(f"for (int64_t chunk = 0; chunk < {chunks}; ++chunk)"):
            for red, acc, ctype in accs:
                w.line(f"{ctype} {acc}[{COLUMN_BLOCK}];")
                if acc in blocked:
                    w.line(f"float {acc}_part[{COLUMN_BLOCK}];")
            self.lanes(lambda: [w.line(f"{acc}[lane] = {_identity(red, ctype)};")
                                for red, acc, ctype in accs], indexed=False)
            self.in_chunk = True
            self.element_loops(0, lambda: self.lane_updates(accs, blocked), None, simd=True,
                               blocked=blocked)
            self.in_chunk = False
            self.lanes(lambda: [w.line(f"{acc}_chunks[chunk * {COLUMN_BLOCK} + lane] = "
                                       f"{acc}[lane];") for _, acc, _ in accs], indexed=False)
        outs = []
        for _ in accs:
            outs.append(f"tmp{self.count}")
            self.count += 1

        def combine() -> None:
            for (red, acc, ctype), out in zip(accs, outs):
                w.line(f"{ctype} {acc} = {_identity(red, ctype)};")
                with w.block(f"for (int64_t chunk = 0; chunk < {chunks}; ++chunk)"):
                    part = f"{acc}_chunks[chunk * {COLUMN_BLOCK} + lane]"
                    w.line(f"{acc} = {COLUMN_COMBINE[red.op].format(acc=acc, v=part, t=ctype)};")
                w.line(f"{out}[lane] = {_final_text(red, acc, None)};")

        for red, out in zip(batch, outs):
            w.line(f"{self.dialect.compute(red.dtype)} {out}[{COLUMN_BLOCK}];")
        self.lanes(combine, indexed=False)
        for (red, acc, _), out in zip(accs, outs):
            w.line(f"delete[] {acc}_chunks;")
            self.names[red] = f"{out}[lane]"

    def element_loops(self, depth: int, body, clause: str | None, simd: bool,
                      blocked: list[str] = (), pieces: bool = False) -> None:
        """The flattened reduced points: a chunk's (in blocks of :data:`COLUMN_SUM_BLOCK`
        points for float sums), or all of them shared among threads; the reduced loop
        variables from ``rflat``, the block's lanes inside (``pieces``: as the column
        kernel's)."""
        w = self.w
        if self.in_chunk:
            start = f"chunk * {self.size}"
            stop = f"std::min<int64_t>({self.points}, {start} + {self.size})"
            if self.size <= COLUMN_SUM_BLOCK:
                self.start_partials(blocked)
                self.points_loop(start, stop, body)
                self.add_partials(blocked)
                return
            w.line(f"const int64_t stop = {stop};")
            with w.block(f"for (int64_t rblock = {start}; rblock < stop; "
                         f"rblock += {COLUMN_SUM_BLOCK})"):
                self.start_partials(blocked)
                end = f"std::min<int64_t>(stop, rblock + {COLUMN_SUM_BLOCK})"
                self.points_loop("rblock", end, body)
                self.add_partials(blocked)
            return
        if self.shared.depth:
            w.line(f"#pragma omp {self.shared.pragma()}")
        self.points_loop("0", str(self.points), body)

    def points_loop(self, start: str, stop: str, body) -> None:
        p = self.plan
        with self.w.block(f"for (int64_t rflat = {start}; rflat < {stop}; ++rflat)"):
            inner = 1
            for r, n in reversed(list(zip(p.rvars, p.rranges))):
                flat = f"rflat / {inner}" if inner > 1 else "rflat"
                self.w.line(f"const int64_t {r} = {flat}" + (
                    f" % {int(n)};" if r != p.rvars[0] else ";"))
                inner *= int(n)
            self.lanes(body)


def emit(plan: KernelPlan) -> str:
    """A C++ reduction kernel: split along its reduced points where :func:`chunks` says,
    else codegen/cpp_reduction.py's row or column kernel."""
    count = chunks(plan)
    if count:
        return CppSplitColumnKernel(plan, count).emit()
    return emit_reduction_kernel(plan)
