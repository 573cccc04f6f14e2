"""Triton kernels for fused pointwise groups, shaped like the Triton tutorials.

One program handles ``XBLOCK`` consecutive elements of the flattened iteration space;
``xindex`` is split into the plan's loop variables with ``//`` and ``%``.  float16 and
bfloat16 values are computed in float32 and rounded where the program rounds: at explicit
casts (a decomposition's cast back to the input dtype, the user's ``.to``) and at stores,
not after every op (as Inductor computes; eager rounds after each op, and the difference
stays within PyTorch's tolerances for these dtypes).
Emitters only return text: the runtime builds and launches.
"""

from __future__ import annotations

import re

import sympy
import torch

from minicompile.ir import (LOW_PRECISION, Cat, Expr, IndexExpr, IndirectLoad, Load, Op,
                            divides_by_values)
from minicompile.op_table import ROWS
from minicompile.sym import FloorDiv, ModularIndexing

from minicompile.codegen.common import (CodeWriter, KernelPlan, Store, checks_values,
                                        text_sections)
from minicompile.codegen.emitter import DTYPES, Dialect, ExprEmitter, compute_dtype
from minicompile.codegen.printers import triton_index

TRITON_DTYPES: dict[torch.dtype, str] = {
    d: "tl.int1" if d == torch.bool else f"tl.{str(d).removeprefix('torch.')}" for d in DTYPES
}
TRITON_OPS: dict[str, str] = {row.name: row.triton for row in ROWS}


class TritonDialect(Dialect):
    """Triton's spelling.  Literals are Python numbers where Triton types them as the
    kernel needs (float32, int32), and typed blocks where not."""

    dtypes = TRITON_DTYPES
    ops = TRITON_OPS  # "{t}": the result's compute dtype; mc_* helpers: triton_helpers.txt
    true, false = "1", "0"

    def __init__(self, interpret: bool) -> None:
        self.interpret = interpret

    def special(self, value: float) -> str:
        return f'float("{value}")'

    def float_literal(self, text: str, dtype: torch.dtype) -> str:
        return f"tl.full([], {text}, tl.float64)" if dtype == torch.float64 else text

    def int_literal(self, value: int, dtype: torch.dtype) -> str:
        if dtype == torch.int64 and not -(2**31) <= value < 2**31:
            return f"tl.full([], {value}, tl.int64)"
        return str(value)

    def cast(self, x: str, dtype: torch.dtype) -> str:
        if dtype in LOW_PRECISION:  # round, then keep computing in float32
            return self.round(x, dtype)
        return f"{x}.to({TRITON_DTYPES[dtype]})"

    def round(self, x: str, dtype: torch.dtype) -> str:
        """Rounded to nearest, ties to even.  On a GPU a conversion there and back rounds
        so; the interpreter's bfloat16 conversion does not, so there bfloat16 rounds
        through integer ops (mc_round_bf16)."""
        if dtype == torch.bfloat16 and self.interpret:
            return f"mc_round_bf16({x}.to(tl.float32))"
        return f"{x}.to({TRITON_DTYPES[dtype]}).to(tl.float32)"


TRITON = TritonDialect(interpret=False)
TRITON_INTERPRETED = TritonDialect(interpret=True)


class TritonKernel(ExprEmitter):
    """Emits one ``@triton.jit`` function for a pointwise plan; the reduction emitter
    (codegen/triton_reduction.py) extends it.  Every variable has a *level*, the block axes
    it spans: {"x"} for XBLOCK values, {"x", "r"} for [XBLOCK, RBLOCK] blocks, {} for
    scalars."""

    def __init__(self, plan: KernelPlan, wide_index: bool, masked: bool, interpret: bool) -> None:
        self.plan = plan
        # An index out of range sets the error flag the wrapper reads (the interpreter), or
        # stops the kernel on a device-side assert, as eager's CUDA kernels do: reading a
        # flag would wait for the GPU after every such kernel.
        self.flag_errors = interpret
        self.interpret = interpret
        self.dialect = TRITON_INTERPRETED if interpret else TRITON
        self.wide_index = wide_index  # int64 index arithmetic
        self.xmasked = masked  # the last block runs past xnumel
        self.rmasked = False
        self.w = CodeWriter()
        self.names: dict[Expr, str] = {}
        self.levels: dict[str, frozenset[str]] = {}
        self.count = 0
        # The conditions of the Cat pieces being emitted (variable names): every load and
        # index check inside a piece is masked by them.
        self.conditions: list[str] = []

    # -- the kernel -------------------------------------------------------------------------

    def emit(self) -> str:
        p, w = self.plan, self.w
        w.line("@triton.jit")
        w.line(f"def {p.name}({', '.join(kernel_params(p, self.flag_errors))}, {self.extents}):")
        with w.indent():
            for row in p.header_comment():
                w.line(f"# {row}")
            self.emit_body()
        return w.text()

    extents = "xnumel, XBLOCK: tl.constexpr"  # the parameters after the sizes

    def emit_body(self) -> None:
        self.emit_xindex("")
        self.emit_stores(lambda st: self.emit_store(st, frozenset({"x"})))

    def emit_xindex(self, shape: str, block: str = "XBLOCK", start: str = "") -> None:
        """``shape``: "" for a 1-D block, "[:, None]" for the rows of a 2-D one.  Program k
        starts at row ``k * block`` (plus ``start``: a block of a chunk of rows)."""
        w = self.w
        pid = "tl.program_id(0).to(tl.int64)" if self.wide_index else "tl.program_id(0)"
        w.line(f"xoffset = {pid} * {block}{start}")
        w.line(f"xindex = xoffset + tl.arange(0, XBLOCK){shape}")
        if self.xmasked:
            w.line("xmask = xindex < xnumel")
        else:
            w.line("# xnumel is a multiple of XBLOCK: no mask")
        self.emit_vars("xindex", self.plan.loop_vars, self.plan.ranges)

    def emit_vars(self, flat: str, names: tuple, ranges: tuple) -> None:
        """Split a flat block index into the loop variables (outermost first)."""
        if not names:
            return
        if len(names) == 1:
            self.w.line(f"{names[0]} = {flat}")
            return
        base = sympy.Symbol(flat, integer=True, nonnegative=True)
        inner, lines = sympy.Integer(1), []
        for k in reversed(range(len(names))):  # the innermost first
            index = FloorDiv(base, inner) if k == 0 else ModularIndexing(base, inner, ranges[k])
            lines.append(f"{names[k]} = {triton_index(index)}")
            inner = inner * ranges[k]
        for line in reversed(lines):
            self.w.line(line)

    def axes_of(self, index: sympy.Expr) -> frozenset[str]:
        names = {s.name for s in index.free_symbols}
        return frozenset(axis for axis, loop in (("x", self.plan.loop_vars), ("r", self.plan.rvars))
                         if names & {str(v) for v in loop})

    def mask(self, axes: frozenset[str]) -> str | None:
        parts = []
        if "x" in axes and self.xmasked:
            parts.append("xmask")
        if "r" in axes and self.rmasked:
            parts.append("rmask")
        parts += self.conditions
        return " & ".join(parts) or None

    def block_shape(self, axes: frozenset[str]) -> str:
        return "[XBLOCK]" if not self.plan.rvars and not self.plan.is_reduction else (
            "[XBLOCK, RBLOCK]" if "r" in axes else "[XBLOCK, 1]"
        )

    def emit_store(self, store: Store, axes: frozenset[str]) -> None:
        value = self.value(store.value)
        if self.levels.get(value, frozenset()) != axes:
            value = self.broadcast(value, store.value.dtype, self.block_shape(axes))
        if store.dtype == torch.bfloat16 and self.interpret:  # exact once rounded
            value = f"{TRITON_INTERPRETED.round(value, store.dtype)}.to(tl.bfloat16)"
        elif compute_dtype(store.value.dtype) != store.dtype:
            value = f"{value}.to({TRITON_DTYPES[store.dtype]})"
        index = triton_index(store.index)
        if not store.index.free_symbols:  # one element per row (a 0-dim result), or a
            # broadcast buffer (stride 0) stored from a block with an r axis: the same
            # address in every lane, in the block's shape
            index = f"xindex * 0 + rindex * 0 + {index}" if "r" in axes else (
                f"xindex * 0 + {index}")
        mask = self.mask(axes)
        suffix = f", {mask}" if mask else ""
        self.w.line(f"tl.store({self.pointer(store.buffer)} + ({index}), {value}{suffix})")

    # -- values -----------------------------------------------------------------------------

    def broadcast(self, x: str, dtype: torch.dtype, shape: str) -> str:
        """``x`` as a block of ``shape``.  A literal (a constant expression: a sum of an
        empty input, say) is a Python number, which tl.broadcast_to cannot take."""
        if x in self.levels:
            return f"tl.broadcast_to({x}, {shape})"
        return f"tl.full({shape}, {x}, {self.dialect.compute(dtype)})"

    def fresh(self, text: str, axes: frozenset[str]) -> str:
        name = f"tmp{self.count}"
        self.count += 1
        self.w.line(f"{name} = {text}")
        self.levels[name] = axes
        return name

    def level(self, name: str) -> frozenset[str]:
        return self.levels.get(name, frozenset())

    def define(self, text: str, dtype: torch.dtype, operands: list[str]) -> str:
        return self.fresh(text, frozenset().union(*(self.level(a) for a in operands)))

    def emit_index(self, e: IndexExpr) -> str:
        return self.fresh(f"({triton_index(e.index)}).to(tl.int64)", self.axes_of(e.index))

    def operands(self, e: Op) -> list[str]:
        args = [self.names[a] for a in e.args]
        if args and not any(a in self.levels or a.startswith("tl.full(") for a in args):
            # Only literals (a constant expression: what an empty input reads): one of them
            # becomes a tensor, as libdevice calls and `0.0 / 0.0` need.
            dtype = self.dialect.compute(e.args[0].dtype)
            args[0] = self.fresh(f"tl.full([], {args[0]}, {dtype})", frozenset())
        if self.flag_errors and divides_by_values(e):
            axes = frozenset().union(*(self.level(a) for a in args))
            args[1] = self.checked_divisor(args[0], args[1], axes)
        return args

    def emit_load(self, e: Load) -> str:
        index, axes, mask = e.index, self.axes_of(e.index), None
        if isinstance(e, IndirectLoad):
            # Never read out of range: check the index, and mask the load by the check.
            at = self.names[e.at]
            if not self.level(at) and axes:
                # One index for the whole block (a 0-dim index tensor): widened to the
                # load's block, since a scalar check cannot mask a block's store.
                at = self.fresh(at + "".join(f" + 0 * {a}index" for a in sorted(axes)), axes)
            axes = axes | self.level(at)
            ok = self.fresh(f"(0 <= {at}) & ({at} < {triton_index(e.size)})", self.level(at))
            bad = " & ".join(m for m in (f"~{ok}", self.mask(axes)) if m)
            spread = self.spread(axes | self.level(at))
            if self.flag_errors:
                self.w.line(f"tl.store(err_ptr + 0 * {at}{spread}, 1, {bad})  # index out of range")
            else:
                live = self.mask(axes)
                holds = f"{ok} | ~({live})" if live else ok
                size = triton_index(e.size).replace('"', "'")
                self.w.line(f'tl.device_assert({holds}, "index out of range in '
                            f'{self.plan.name}: 0 <= index < {size}")')
            index = index.xreplace({e.symbol: sympy.Symbol(at, integer=True)})
            mask = ok
        ptr = f"{self.pointer(e.buffer)} + ({triton_index(index)}){self.spread(axes)}"
        if isinstance(e, IndirectLoad) and e.symbol not in e.index.free_symbols:
            ptr += f" + 0 * {at}"  # a size-1 dim: as wide as the check that masks it
        axes = axes.union(*(self.level(c) for c in self.conditions))
        mask = " & ".join(m for m in (self.mask(axes), mask) if m) or None
        other = ", other=0" if self.conditions else ""
        text = f"tl.load({ptr}, {mask}{other})" if mask else f"tl.load({ptr})"
        if e.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        if self.interpret and not axes:
            # Triton's interpreter computes a scalar's comparisons as numpy scalars, which
            # `|` / `&` with a block reject: a value read once is a block there too.
            axes = frozenset({"x"})
            text = f"tl.broadcast_to({text}, {self.block_shape(axes)})"
        return self.fresh(text, axes)

    def checked_divisor(self, a: str, b: str, axes: frozenset[str]) -> str:
        """The divisor ``b`` of an integer division on CPU tensors: a zero sets the error
        flag the wrapper raises on (eager raises), and is replaced by 1."""
        wide = self.fresh(f"{b} + 0 * {a}", axes)  # as wide as the mask
        bad = " & ".join(m for m in (f"({wide} == 0)", self.mask(axes)) if m)
        self.w.line(f"tl.store(err_ptr + 0 * {wide}{self.spread(axes)}, 1, {bad})"
                    "  # integer division by zero")
        return self.fresh(f"tl.where({wide} == 0, 1, {wide})", axes)

    def spread(self, axes: frozenset[str]) -> str:
        """Terms that widen a pointer of ``axes`` to the blocks of the Cat conditions that
        mask it (a mask may not be wider than its pointer): `` + 0 * tmp3``."""
        return "".join(f" + 0 * {c}" for c in self.conditions if not self.level(c) <= axes)

    def emit_cat(self, e: Cat) -> str:
        """Each piece computed under its condition (its loads masked by it, reading 0
        elsewhere, so no address outside the piece's input is read), then chosen by
        position with nested ``tl.where``."""
        position = triton_index(e.index)
        axes = self.axes_of(e.index)
        chosen: list[tuple[str, str]] = []
        for k, piece in enumerate(e.pieces):
            lo, hi = e.bounds(k)
            self.w.line(f"# cat piece {k}: {position} in {e.span(k)}")
            tests = []
            if lo is not None:
                tests.append(f"({position} >= {triton_index(lo)})")
            if hi is not None:
                tests.append(f"({position} < {triton_index(hi)})")
            cond = self.fresh(" & ".join(tests), axes)
            saved = dict(self.names)  # values computed under the condition stay inside
            self.conditions.append(cond)
            chosen.append((cond, self.value(piece)))
            self.conditions.pop()
            self.names = saved
        out = chosen[-1][1]
        for cond, value in reversed(chosen[:-1]):
            level = axes | self.level(value) | self.level(out)
            out = self.fresh(f"tl.where({cond}, {value}, {out})", level)
        return out


def kernel_params(plan: KernelPlan, flag_errors: bool) -> list[str]:
    """Pointers, the error flag of index checks (``flag_errors``), then the size symbols."""
    sizes = [str(s) for s in plan.size_args]
    return plan.params() + (["err_ptr"] if flag_errors and checks_values(plan) else []) + sizes


# A symbolic size is planned for as if it were this large: blocks sized for big tensors
# (what dynamic shapes are for), with masks, since no size is known to divide.
SYMBOLIC_HINT = 1 << 20


def planning_size(n: sympy.Expr, hints: dict | None = None) -> int:
    """The size blocks are chosen for: the number, the traced value of a symbolic size,
    or SYMBOLIC_HINT where there is none."""
    if n.is_Integer:
        return int(n)
    if hints:
        value = n.xreplace({s: sympy.Integer(v) for s, v in hints.items()})
        if value.is_Integer:
            return int(value)
    return SYMBOLIC_HINT


def pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n`` <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def block_size(numel: int, interpret: bool) -> int:
    """Elements per program.  The interpreter runs programs one after another, so there
    larger blocks are faster."""
    return max(16, min(1 << 16 if interpret else 1024, pow2(numel)))


# Warps of a pointwise program of XBLOCK (at most 1024) elements: Triton's default of four,
# as Inductor launches them.
# Measured on an H200 for ``sin(sin(x))`` over 2**28 float32 (copy: 0.506 ms): XBLOCK 1024
# with 4 warps 0.541 ms (94% of copy bandwidth), with 8 warps (four elements a thread, the
# earlier choice) 0.599 ms (85%);
# 512 with 2 warps 0.540, 2048 with 4 or 8 warps 0.543.  Eight elements a thread unroll
# each op's code eight times, so a kernel of libdevice calls builds more slowly than at
# four: a cost paid once, at the first call.
POINTWISE_WARPS = 4


def emit_kernel(plan: KernelPlan, interpret: bool, blocks: tuple[int, ...] = ()) -> str:
    """``blocks``: the XBLOCKs the kernel may be launched with (max-autotune's candidates,
    codegen/triton_tuning.py); the heuristic's alone when empty."""
    numel = plan.numel
    wide = not numel.is_Integer or int(numel) >= 2**31 - 2**20
    blocks = blocks or (block_size(planning_size(numel, plan.hints), interpret),)
    masked = not numel.is_Integer or any(int(numel) % b != 0 for b in blocks)
    return TritonKernel(plan, wide_index=wide, masked=masked, interpret=interpret).emit()


# Preambles (a module of GPU kernels only: stand-ins until a kernel must be built,
# runtime/lazy_triton.py) and helpers, in triton_helpers.txt.
HELPERS: dict[str, str] = text_sections("triton_helpers.txt")
PREAMBLE, GPU_PREAMBLE = HELPERS.pop("preamble"), HELPERS.pop("gpu_preamble")


def helpers_for(kernels: list[str]) -> list[str]:
    """The helper definitions the kernel texts call."""
    text = "\n".join(kernels)
    return [src for name, src in HELPERS.items() if re.search(rf"\b{name}\b", text)]
