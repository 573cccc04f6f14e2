"""Reading CPython bytecode: instruction decoding and the differences between versions, so
the opcode handlers are written once for 3.11 and 3.12 (and 3.13 where cheap).  As
CAPTURE.md says: trust ``dis``'s ``argval``, read the raw ``arg`` only for flag bits.
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import inspect
import operator
import sys
import types
from typing import Any

PY: tuple[int, int] = sys.version_info[:2]

# 3.11/3.12 push NULL *before* the callable ([NULL, fn, args...]); 3.13 pushes it after
# ([fn, NULL, args...]).  This flag is all the call opcodes need to know.
NULL_AFTER_CALLABLE: bool = PY >= (3, 13)

# 3.12 folded LOAD_METHOD into LOAD_ATTR: the low bit of ``arg`` selects the method form.
LOAD_ATTR_HAS_METHOD_BIT: bool = PY >= (3, 12)

_UNSUPPORTED_CODE_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                           | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE)


@dataclasses.dataclass(frozen=True)
class Inst:
    """One decoded instruction.  ``lineno`` is never None (carried forward from the last
    instruction that had one), because every graph node and error names a source line."""

    opname: str
    arg: int | None
    argval: Any
    offset: int
    lineno: int


def decode(code: types.CodeType) -> list[Inst]:
    """The instructions of ``code`` (no CACHE entries), with line numbers filled in."""
    out: list[Inst] = []
    lineno = code.co_firstlineno
    for ins in dis.get_instructions(code):
        if ins.opname == "CACHE":
            continue
        # 3.13 made ``starts_line`` a bool; ``positions`` is the same on every version.
        if ins.positions is not None and ins.positions.lineno is not None:
            lineno = ins.positions.lineno
        out.append(Inst(ins.opname, ins.arg, ins.argval, ins.offset, lineno))
    return out


def offset_to_index(insts: list[Inst]) -> dict[int, int]:
    """Jump targets are byte offsets; the interpreter walks a list."""
    return {inst.offset: i for i, inst in enumerate(insts)}


def kw_names(code: types.CodeType, inst: Inst) -> tuple[str, ...]:
    """The keyword names of the next CALL.  3.11 shows ``argval`` as ``<unknown>``, but on
    both 3.11 and 3.12 ``arg`` indexes ``co_consts``."""
    names = code.co_consts[inst.arg]
    assert isinstance(names, tuple)
    return names


def is_generator_like(code: types.CodeType) -> bool:
    return bool(code.co_flags & _UNSUPPORTED_CODE_FLAGS)


def frame_layout(code: types.CodeType) -> list[str]:
    """Parameter names in the order ``capture_frame`` receives their values: positional and
    keyword-only parameters, then the ``*args`` name, then the ``**kwargs`` name."""
    stars = bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount + stars])


# BINARY_OP's argument indexes this table on 3.11-3.13; 13 and above are the in-place forms
# (``+=``) of the same operators, in the same order.
BINARY_OPS: list[tuple[str, Any]] = [
    ("+", operator.add), ("&", operator.and_), ("//", operator.floordiv), ("<<", operator.lshift),
    ("@", operator.matmul), ("*", operator.mul), ("%", operator.mod), ("|", operator.or_),
    ("**", operator.pow), (">>", operator.rshift), ("-", operator.sub), ("/", operator.truediv),
    ("^", operator.xor)]


def binary_op(inst: Inst) -> tuple[str, Any, bool]:
    """(symbol, Python operator, in-place?) of a BINARY_OP instruction."""
    assert inst.arg is not None
    inplace = inst.arg >= len(BINARY_OPS)
    symbol, fn = BINARY_OPS[inst.arg - len(BINARY_OPS) if inplace else inst.arg]
    return symbol, fn, inplace


COMPARE_OPS: dict[str, Any] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
    ">=": operator.ge}


def compare_symbol(inst: Inst) -> str:
    """The operator of a COMPARE_OP; 3.13 shows a bool-coercing compare as ``bool(==)``."""
    text = str(inst.argval)
    if text.startswith("bool(") and text.endswith(")"):
        text = text[5:-1]
    return text


def is_backward_jump(inst: Inst) -> bool:
    return isinstance(inst.argval, int) and inst.argval <= inst.offset


def builtins_of(f_globals: dict[str, Any]) -> dict[str, Any]:
    """The builtins a function with these globals sees."""
    b = f_globals.get("__builtins__", builtins)
    return b if isinstance(b, dict) else vars(b)
