"""Graph breaks that resume: a frame as a chain of compiled segments.

A *segment* starts at a :class:`ResumePoint` (an instruction offset, the names of the bound
locals, the depth of the value stack) and is traced from the values there until the frame
returns or until an instruction capture cannot model.  At such a *break* the segment's
graph ends; its ``rebuild`` returns the real values of the locals and the stack at that
point instead of a return value.  The driver (minicompile/api.py) then runs the breaking
instruction for real (minicompile/capture/concrete.py) and continues with the segment that
starts after it, found by its resume point and guards, or traced on a miss.  This is
Dynamo's resume functions, as data: no bytecode is generated.

Breaks are not resumed (the frame runs eagerly instead) inside a loop or a ``try`` block
(a segment per iteration), inside a ``with`` block, in frames with cell variables, or at an
instruction the concrete executor does not run.
"""

from __future__ import annotations

import dataclasses
import dis
import types
from typing import Any

from minicompile.capture import bytecode, concrete
from minicompile.capture.variables import NULL as NULL_VAR
from minicompile.capture.variables import LazyVar, Source, TupleVar, Var
from minicompile.errors import Unsupported

# The instructions a break may stop at and the driver can run for real.
RESUMABLE = frozenset(
    {"CALL", "CALL_FUNCTION_EX", "BINARY_SUBSCR", "BINARY_OP", "COMPARE_OP", "CONTAINS_OP",
     "UNARY_NOT", "FORMAT_VALUE", "GET_ITER"}
    | {name for name in concrete.HANDLERS if "JUMP" in name and "IF" in name}
)


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    offset: int
    local_names: tuple[str, ...]  # bound locals, in co_varnames order
    stack_depth: int

    def layout(self) -> list[str]:
        """Names of the segment's frame values: the locals, then the stack slots."""
        return [f"L_{n}" for n in self.local_names] + [
            f"S_{k}" for k in range(self.stack_depth)
        ]


@dataclasses.dataclass(frozen=True)
class Break:
    """Where a segment stopped: the instruction to run for real, and why."""

    offset: int
    local_names: tuple[str, ...]
    stack_depth: int
    reason: Unsupported


def root_point(code: types.CodeType) -> ResumePoint:
    return ResumePoint(0, tuple(bytecode.frame_layout(code)), 0)


def loop_and_try_ranges(code: types.CodeType) -> list[tuple[int, int]]:
    """Offset ranges of loop bodies (a backward jump's target up to the jump) and of the
    code an exception handler protects."""
    ranges = []
    for inst in bytecode.decode(code):
        if "JUMP" in inst.opname and bytecode.is_backward_jump(inst):
            ranges.append((inst.argval, inst.offset))
    for entry in dis.Bytecode(code).exception_entries:
        ranges.append((entry.start, entry.end))
    return ranges


def why_not_resumable(code: types.CodeType, tx: Any) -> str | None:
    """None when the break at ``tx``'s instruction can be resumed, else the reason."""
    inst = tx.insts[tx.ip]
    if inst.opname not in RESUMABLE:
        return f"a break at {inst.opname} cannot be resumed"
    if any(start <= inst.offset <= end for start, end in loop_and_try_ranges(code)):
        return "a graph break inside a loop or a try block"
    if code.co_cellvars:
        return "a graph break in a frame with closure cells"
    if any(type(v).__name__ in ("GradModeVar", "WithExitVar") for v in tx.stack):
        return "a graph break inside a `with` block"
    return None


def frame_state(tx: Any) -> tuple[TupleVar, tuple[str, ...]]:
    """The locals and the stack at a break, as one tracker to rebuild after the graph."""
    names = tuple(n for n in tx.code.co_varnames if n in tx.locals)
    state = TupleVar((TupleVar(tuple(tx.locals[n] for n in names)), TupleVar(tuple(tx.stack))))
    return state, names


def initial_values(point: ResumePoint, values: tuple) -> tuple[dict[str, Var], list[Var]]:
    """Trackers for a segment's starting locals and stack (inputs read on demand)."""
    n = len(point.local_names)
    local_vars: dict[str, Var] = {
        name: LazyVar(v, Source(f"L[{name!r}]", f"L_{name}", f"L_{name}"))
        for name, v in zip(point.local_names, values[:n])
    }
    stack: list[Var] = [
        NULL_VAR if v is concrete.NULL else LazyVar(v, Source(f"S[{k}]", f"S_{k}", f"S_{k}"))
        for k, v in enumerate(values[n:])
    ]
    return local_vars, stack
