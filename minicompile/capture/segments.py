"""Graph breaks that resume: a frame as a chain of compiled segments (Dynamo's resume
functions, as data: no bytecode is generated).

A segment is traced from a :class:`ResumePoint` to a return or a break; minicompile/api.py
runs the breaking instruction for real and continues with the next segment.  No resuming
inside loops, ``try`` or ``with`` blocks, or in frames with cell variables.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
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
    | {name for name in concrete.OPCODES if "JUMP" in name and "IF" in name})


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    offset: int
    local_names: tuple[str, ...]  # bound locals, in co_varnames order
    stack_depth: int

    def layout(self) -> list[str]:
        """Names of the segment's frame values: the locals, then the stack slots."""
        return [f"L_{n}" for n in self.local_names] + [f"S_{k}" for k in range(self.stack_depth)]


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
    return [(inst.argval, inst.offset) for inst in bytecode.decode(code)
            if "JUMP" in inst.opname and bytecode.is_backward_jump(inst)] + [
        (entry.start, entry.end) for entry in dis.Bytecode(code).exception_entries]


# Instructions after which control does not fall through to the next one.
_NO_FALLTHROUGH = frozenset(
    {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
     "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"})


def catching_handlers(code: types.CodeType) -> list[tuple[int, int]]:
    """Offset ranges protected by a handler that may catch (``except``, ``finally``,
    ``with``: their handler starts with PUSH_EXC_INFO).  A 3.12 comprehension's hidden
    handler only restores a local and re-raises: skipping it changes nothing."""
    insts = bytecode.decode(code)
    index_of = bytecode.offset_to_index(insts)
    ranges = []
    for entry in dis.Bytecode(code).exception_entries:
        k = index_of[entry.target]
        while insts[k].opname not in ("PUSH_EXC_INFO", "RERAISE"):
            k += 1
        if insts[k].opname == "PUSH_EXC_INFO":
            ranges.append((entry.start, entry.end))
    return ranges


@functools.lru_cache(maxsize=1024)
def has_catching_handlers(code: types.CodeType) -> bool:
    return bool(catching_handlers(code))


def why_not_concrete(code: types.CodeType, offset: int) -> str | None:
    """None when the frame can be finished by the concrete executor from ``offset`` (as
    it must be when the rest fails to compile after a segment ran): every instruction
    control can reach has a handler, and none is protected by a handler that catches
    (the executor does not unwind through the exception table)."""
    insts = bytecode.decode(code)
    index_of = bytecode.offset_to_index(insts)
    protected = catching_handlers(code)
    todo, seen = [index_of[offset]], set()
    while todo:
        k = todo.pop()
        if k in seen or k >= len(insts):
            continue
        seen.add(k)
        inst = insts[k]
        if inst.opname not in concrete.OPCODES:
            return f"{inst.opname} after the break cannot run outside a compiled segment"
        if any(start <= inst.offset < end for start, end in protected):
            return "a try or with block after the break"
        if "JUMP" in inst.opname or inst.opname == "FOR_ITER":
            todo.append(index_of[inst.argval])
        if inst.opname not in _NO_FALLTHROUGH:
            todo.append(k + 1)
    return None


def why_not_resumable(code: types.CodeType, tx: Any) -> str | None:
    """None when the break at ``tx``'s instruction can be resumed, else the reason."""
    inst = tx.insts[tx.ip]
    if inst.opname not in RESUMABLE:
        return f"a break at {inst.opname} cannot be resumed"
    if any(start <= inst.offset <= end for start, end in loop_and_try_ranges(code)):
        return "a graph break inside a loop or a try block"
    tail = why_not_concrete(code, inst.offset)
    if tail is not None:
        return tail
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
        name: LazyVar(v, source=Source(f"L[{name!r}]", f"L_{name}", f"L_{name}"))
        for name, v in zip(point.local_names, values[:n])}
    stack: list[Var] = [
        NULL_VAR if v is concrete.NULL else LazyVar(v, source=Source(f"S[{k}]", f"S_{k}", f"S_{k}"))
        for k, v in enumerate(values[n:])]
    return local_vars, stack
