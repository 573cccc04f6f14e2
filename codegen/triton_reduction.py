"""Triton kernels for groups with reductions: a block of XBLOCK rows (kept points) by
RBLOCK reduced elements.

A *persistent* kernel holds a whole row in registers (rnumel <= RBLOCK): it loads the row
once and computes every reduction, prologue and epilogue of the group from it.  A *looped*
kernel walks the row RBLOCK elements at a time, once per batch of reductions that do not
depend on each other, then once more for the outputs that are per element (softmax's
output).  Masked lanes enter each reduction as its identity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sympy
import torch

from minicompile.ir import Expr, IndirectLoad, Load, Reduce, walk

from minicompile.codegen.common import KernelPlan, reduction_batches
from minicompile.codegen.emitter import compute_dtype, reduction_identity
from minicompile.codegen.printers import triton_index
from minicompile.codegen.triton import TRITON, TritonKernel, planning_size, pow2

# Combining two partial results elementwise (loop accumulators), and reducing a block
# along its rows; the mc_* helpers are in codegen/triton_helpers.txt.
COMBINE = {
    "sum": "{0} + {1}",
    "prod": "{0} * {1}",
    "amax": "mc_maximum({0}, {1})",
    "amin": "mc_minimum({0}, {1})",
    "any": "({0} | {1}) != 0",  # stays int1: the loop-carried type must not change
    "all": "({0} & {1}) != 0",
}
REDUCE_ROWS = {
    "sum": "tl.sum({0}, 1)[:, None]",
    "prod": "tl.reduce({0}, 1, mc_multiply)[:, None]",
    "amax": "tl.reduce({0}, 1, mc_maximum)[:, None]",
    "amin": "tl.reduce({0}, 1, mc_minimum)[:, None]",
    "any": "tl.max({0}.to(tl.int8), 1)[:, None] != 0",
    "all": "tl.min({0}.to(tl.int8), 1)[:, None] != 0",
}
MIN_PROGRAMS = 512  # a persistent reduction's programs, at least (about four per SM of an H100)
PERSISTENT_LIMIT = 4096  # widest row kept in registers (interpreter: INTERPRET_PERSISTENT)
INTERPRET_PERSISTENT = 1 << 16
ONE_PROGRAM = 128  # rows a kernel with column sums walks in one program, at most


def _pow2_floor(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def reduction_blocks(
    xnumel: int, rnumel: int, interpret: bool, symbolic_rows: bool = False,
    column: bool = False,
) -> tuple[int, int, int, bool]:
    """(XBLOCK, RBLOCK, num_warps, persistent) for a reduction over rows of ``rnumel``.
    ``symbolic_rows``: the row length is a size symbol (``rnumel`` its traced value), so the
    kernel loops over the row whatever its length, in blocks sized for the traced one.
    ``column``: neighbouring outputs read neighbouring elements (``x.sum(0)``), not the
    elements of one row (:func:`reads_columns`)."""
    limit = INTERPRET_PERSISTENT if interpret else PERSISTENT_LIMIT
    if column and not interpret and not symbolic_rows:
        # Rows of the reduction are far apart in memory, its outputs side by side: a tile
        # of 64 outputs by up to 64 rows, so that each load of a row is coalesced.
        xblock = max(1, min(pow2(max(xnumel, 1)), 64))
        rblock = max(2, min(pow2(rnumel), 4096 // xblock))
        return xblock, rblock, 8 if xblock * rblock >= 2048 else 4, rblock >= rnumel
    if symbolic_rows:
        rblock = max(16, min(pow2(rnumel), 4096 if interpret else 2048))
        budget = (1 << 16) if interpret else 4096
        xblock = max(1, min(pow2(max(xnumel, 1)), budget // rblock, 64))
        warps = 8 if xblock * rblock >= 2048 else 4
        return xblock, rblock, warps, False
    if rnumel <= limit:
        rblock = max(2, pow2(rnumel))
        # Elements of a block.  On a GPU a row of 1024 or more is a program of its own: on an
        # H200, softmax over [65536, 1024] float32 took 0.131 ms a row a program (4 warps,
        # as Inductor; copy 0.131) against 0.135 four rows a program (8 warps).
        budget = (1 << 16) if interpret else 4096 if rblock < 1024 else rblock
        xblock = max(1, min(pow2(max(xnumel, 1)), budget // rblock, 64 if not interpret else 1 << 16))
        if not interpret:  # few rows: blocks of fewer rows, so that every SM gets some
            xblock = max(1, min(xblock, _pow2_floor(xnumel // MIN_PROGRAMS)))
        persistent = True
    else:
        rblock = 4096 if interpret else 2048
        xblock = 1
        persistent = False
    elements = xblock * rblock
    # A small persistent block of several short rows: a warp per 512 elements (16 per
    # thread), fewer threads waiting on the rows' reductions (an H100: 1.8 against 2.4 us
    # for 1024 rows of 256).
    small = persistent and xblock > 1 and elements < 2048
    warps = max(1, elements // 512) if small else (8 if elements >= 2048 else 4)
    if persistent and not interpret and xblock == 1:
        warps = max(4, min(8, rblock // 256))  # eight elements a thread (1024: four warps)
    return xblock, rblock, warps, persistent


class TritonReductionKernel(TritonKernel):
    def __init__(self, plan: KernelPlan, interpret: bool, persistent: bool | None = None,
                 blocks: tuple[tuple[int, int], ...] = ()) -> None:
        """``persistent`` and ``blocks``, the (XBLOCK, RBLOCK) pairs the kernel may be
        launched with: max-autotune's candidates (codegen/triton_tuning.py); without them,
        the heuristic's."""
        symbolic = not (plan.numel.is_Integer and plan.rnumel.is_Integer)
        xnumel, rnumel = planning_size(plan.numel, plan.hints), planning_size(plan.rnumel, plan.hints)
        wide = symbolic or xnumel * max(rnumel, 1) >= 2**31 - 2**20
        xblock, rblock, _, heuristic = plan_blocks(plan, interpret)
        self.persistent = heuristic if persistent is None else persistent
        blocks = blocks or ((xblock, rblock),)
        xmasked = not plan.numel.is_Integer or any(xnumel % x != 0 for x, _ in blocks)
        if plan.column_sums:  # a chunk of rows a program (static sizes: passes/mix_order.py)
            xmasked = xnumel % chunk_rows(plan, interpret) != 0
        super().__init__(plan, wide_index=wide, masked=xmasked, interpret=interpret)
        if not plan.rnumel.is_Integer:
            self.rmasked = True
        elif self.persistent:
            self.rmasked = any(rnumel != r for _, r in blocks)
        else:
            self.rmasked = any(rnumel % r != 0 for _, r in blocks)
        self.accumulators: dict[Reduce, str] = {}

    @property
    def extents(self) -> str:  # type: ignore[override]
        split = ", RSPLIT: tl.constexpr" if self.plan.column_sums else ""
        return f"xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr{split}"

    def emit_body(self) -> None:
        p, w = self.plan, self.w
        if p.column_sums:
            self.emit_chunk()
            return
        self.emit_xindex("[:, None]")
        elem_stores = [s for s in p.stores if s.level == "xr"]
        if self.persistent:
            self.emit_rindex("tl.arange(0, RBLOCK)[None, :]")
            for store in elem_stores:
                self.emit_store(store, frozenset({"x", "r"}))
        else:
            w.line("rbase = tl.arange(0, RBLOCK)[None, :]")
            for batch in reduction_batches(self.plan):
                self.emit_loop(batch)
            if elem_stores:
                with self.row_loop([st.value for st in elem_stores]):
                    for store in elem_stores:
                        self.emit_store(store, frozenset({"x", "r"}))
        for store in (s for s in p.stores if s.level == "x"):
            self.emit_store(store, frozenset({"x"}))

    def emit_chunk(self) -> None:
        """A program per chunk of RSPLIT rows (mix-order reductions, passes/mix_order.py):
        XBLOCK rows at a time, each block's row work as a persistent kernel's, its column
        values added into [XBLOCK, RBLOCK] accumulators; at the end each column sum's
        partial for the chunk goes to row ``program_id`` of its [programs, rnumel] output
        (the wrapper sums those)."""
        p, w = self.plan, self.w
        self.emit_rindex("tl.arange(0, RBLOCK)[None, :]")
        accs = []
        for k, _ in enumerate(p.column_sums):
            accs.append(f"colacc{k}")
            w.line(f"{accs[-1]} = tl.zeros([XBLOCK, RBLOCK], tl.float32)")
        w.line("for xstart in range(0, RSPLIT, XBLOCK):")
        with w.indent():
            self.emit_xindex("[:, None]", "RSPLIT", " + xstart")
            for store in p.stores:
                if store.level != "c":
                    self.emit_store(store, frozenset({"x", "r"} if store.level == "xr"
                                                     else {"x"}))
            for acc, store in zip(accs, p.column_sums):
                operand = self.masked_operand(Reduce("sum", store.value, torch.float32))
                w.line(f"{acc} = {acc} + {operand}")
        self.names = {}  # values inside the loop are per block: not visible after it
        pid = "tl.program_id(0).to(tl.int64)" if self.wide_index else "tl.program_id(0)"
        mask = ", rmask" if self.rmasked else ""
        for acc, store in zip(accs, p.column_sums):
            index = triton_index(store.index)
            w.line(f"tl.store({self.pointer(store.buffer)} + {pid} * rnumel + {index}, "
                   f"tl.sum({acc}, 0)[None, :]{mask})")

    def emit_rindex(self, start: str) -> None:
        self.w.line(f"rindex = {start}")
        if self.rmasked:
            self.w.line("rmask = rindex < rnumel")
        self.emit_vars("rindex", self.plan.rvars, self.plan.rranges)

    @contextlib.contextmanager
    def row_loop(self, hoisted: list[Expr]) -> Iterator[None]:
        """The loop over a row RBLOCK elements at a time, the row-invariant parts of
        ``hoisted`` computed before it; values computed inside are per element: not
        visible after it."""
        self.hoist(hoisted)
        self.w.line("for roffset in range(0, rnumel, RBLOCK):")
        saved = dict(self.names)
        with self.w.indent():
            self.emit_rindex("roffset + rbase")
            yield
        self.names = saved

    # -- looped reductions ------------------------------------------------------------------

    def emit_loop(self, batch: list[Reduce]) -> None:
        w = self.w
        for red in batch:
            acc = f"acc{len(self.accumulators)}"
            self.accumulators[red] = acc
            dtype = self.dialect.compute(red.dtype)
            identity = _identity(red)
            w.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {dtype})")
        with self.row_loop([red.x for red in batch]):
            for red in batch:
                operand = self.masked_operand(red)
                acc = self.accumulators[red]
                w.line(f"{acc} = {COMBINE[red.op].format(acc, operand)}")
        for red in batch:
            self.names[red] = self.finish(red, self.accumulators[red])

    # -- both -------------------------------------------------------------------------------

    def masked_operand(self, red: Reduce) -> str:
        """The operand as an [XBLOCK, RBLOCK] block with masked lanes set to the identity."""
        x = self.value(red.x)
        if self.level(x) != frozenset({"x", "r"}):
            x = self.fresh(self.broadcast(x, red.x.dtype, "[XBLOCK, RBLOCK]"),
                           frozenset({"x", "r"}))
        mask = self.mask(frozenset({"x", "r"}))
        if mask is None:
            return x
        return self.fresh(f"tl.where({mask}, {x}, {_identity(red)})", frozenset({"x", "r"}))

    def finish(self, red: Reduce, block: str) -> str:
        text = REDUCE_ROWS[red.op].format(block)
        if red.dtype in (torch.float16, torch.bfloat16):
            # A reduction's result rounds to its dtype, as eager's does: once per row, so it
            # costs nothing (a float32 gradient summed from float16 ones is that sum rounded).
            text = self.dialect.round(f"({text})", red.dtype)
        return self.fresh(text, frozenset({"x"}))

    def emit_reduce(self, e: Reduce) -> str:
        assert self.persistent, "looped reductions are computed by emit_loop"
        return self.finish(e, self.masked_operand(e))


def _identity(red: Reduce) -> str:
    dtype = compute_dtype(red.dtype)
    if dtype == torch.float64:  # a Python float, not a float64 block
        dtype = torch.float32
    return TRITON.literal(reduction_identity(red), dtype)


def chunk_rows(plan: KernelPlan, interpret: bool) -> int:
    """RSPLIT, the rows a program of a kernel with column sums walks (a multiple of its
    XBLOCK): on a GPU 16 to 128, about eight programs a multiprocessor, as Inductor's
    mix-order reductions, or all of at most ONE_PROGRAM rows (one program stores the sums
    itself: no partials to add up); the interpreter, one block."""
    xblock = plan_blocks(plan, interpret)[0]
    if interpret:
        return xblock
    if int(plan.numel) <= ONE_PROGRAM:
        return max(xblock, pow2(int(plan.numel)))
    return max(xblock, min(128, max(16, _pow2_floor(max(int(plan.numel) // 1024, 1)))))


def column_partials(plan: KernelPlan, interpret: bool) -> int:
    """The programs of a kernel with column sums: partial sums each column sum has."""
    return -(-int(plan.numel) // chunk_rows(plan, interpret))


def plan_blocks(plan: KernelPlan, interpret: bool) -> tuple[int, int, int, bool]:
    """reduction_blocks for ``plan``: symbolic sizes planned for their traced values."""
    return reduction_blocks(
        planning_size(plan.numel, plan.hints), planning_size(plan.rnumel, plan.hints),
        interpret, symbolic_rows=not plan.rnumel.is_Integer,
        column=reads_columns(plan) and not plan.column_sums,
    )


def reads_columns(plan: KernelPlan) -> bool:
    """Whether the kernel's loads run along its outputs (stride 1 in the innermost kept
    index) and across its rows (another stride in the innermost reduced index), as in a
    sum over a tensor's outer dims, and none reads along a row."""
    if not plan.loop_vars or not plan.rvars:
        return False
    x, r = plan.loop_vars[-1], plan.rvars[-1]
    along_outputs = along_rows = False
    for st in plan.stores:
        for e in walk(st.value):
            if not isinstance(e, Load):
                continue
            dx, dr = (sympy.diff(e.index, v) for v in (x, r))
            if isinstance(e, IndirectLoad):  # a gathered row (an embedding's) is read along
                along_rows |= dr == 1
                continue
            # (A load that does not move along the reduction, as an embedding's index, is
            # one element per output: it does not decide the tiling.)
            along_outputs |= dx == 1 and dr not in (0, 1)
            along_rows |= dr == 1 and dx != 0
    return along_outputs and not along_rows

