"""Running bytecode for real, one instruction at a time, with real values.

At a graph break the breaking instruction runs here, between two compiled segments; a frame
whose rest cannot be compiled after segments of it ran finishes here.  Opcodes outside
ordinary function bodies raise :class:`NotConcrete`.
"""

from __future__ import annotations

import dataclasses
import operator
import types
from collections.abc import Callable
from typing import Any

from minicompile.capture import bytecode
from minicompile.capture.bytecode import Inst
from minicompile.capture.opcodes import StackMachine


class _Null:
    """CPython's NULL stack slot (next to callables), as a value."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()

# The in-place operator of each of BINARY_OP's (operator.add -> operator.iadd).
INPLACE = {s: getattr(operator, f"i{fn.__name__.rstrip('_')}") for s, fn in bytecode.BINARY_OPS}


class NotConcrete(Exception):
    """An instruction this executor does not implement."""


@dataclasses.dataclass
class Frame(StackMachine):
    """The opcodes of :class:`StackMachine` on real values, and those that differ."""

    fn: types.FunctionType
    locals: dict[str, Any]
    stack: list[Any]
    ip: int  # position in ``insts``
    insts: list[Inst] = dataclasses.field(default_factory=list)
    index_of: dict[int, int] = dataclasses.field(default_factory=dict)
    kw_names: tuple[str, ...] = ()
    returned: bool = False
    result: Any = None
    # Calls go through this (the driver compiles the user's own functions on the way).
    call: Any = None
    steps: int = 0  # instructions executed, for stats()["concrete_instructions"]
    last: Inst | None = None  # the instruction executed last (where an exception came from)

    null = NULL
    Refused = NotConcrete

    @staticmethod
    def at(fn: types.FunctionType, offset: int, local_values: dict, stack: list) -> Frame:
        insts = bytecode.decode(fn.__code__)
        index_of = bytecode.offset_to_index(insts)
        frame = Frame(fn, dict(local_values), list(stack), index_of[offset], insts, index_of)
        frame.kw_names = _pending_kw_names(fn.__code__, insts, index_of[offset])
        return frame

    @property
    def offset(self) -> int:
        return self.insts[self.ip].offset

    @property
    def code(self) -> types.CodeType:
        return self.fn.__code__

    # -- what values do: Python's answers ----------------------------------------------------

    def realize(self, value: Any) -> Any:
        return value

    value = const = identity = realize

    def truthy(self, value: Any) -> bool:
        return bool(value)

    def fold(self, fn: Callable, *args: Any, what: str = "", text: bool = False) -> Any:
        return fn(*args)

    def unary(self, value: Any, symbol: str, fn: Callable) -> Any:
        return fn(value)

    def binary(self, symbol: str, fn: Callable, a: Any, b: Any, inplace: bool = False) -> Any:
        return (INPLACE[symbol] if inplace else fn)(a, b)

    def contains(self, container: Any, item: Any) -> bool:
        return item in container

    def iter_items(self, value: Any) -> list:
        return list(value)

    def keywords(self, kwargs: Any) -> dict:
        return {} if kwargs is None else dict(kwargs)

    def make_tuple(self, items: list) -> tuple:
        return tuple(items)

    def make_list(self, items: list) -> list:
        return list(items)

    def make_dict(self, items: dict) -> dict:
        return items

    def contents(self, container: Any, what: str) -> Any:
        return container

    def subscript(self, container: Any, index: Any) -> Any:
        return container[index]

    def iterate(self, value: Any) -> Any:
        return iter(value)

    def next_item(self, it: Any) -> Any:
        return next(it, NULL)

    def load_attr(self, obj: Any, name: str) -> Any:
        return getattr(obj, name)

    def load_global(self, name: str) -> Any:
        g = self.fn.__globals__
        if name in g:
            return g[name]
        b = bytecode.builtins_of(g)
        if name in b:
            return b[name]
        raise NameError(f"name {name!r} is not defined")

    def call_function(self, fn: Any, args: list, kwargs: dict) -> Any:
        return self.call(fn, args, kwargs) if self.call else fn(*args, **kwargs)

    def store_attr(self, obj: Any, name: str, value: Any) -> None:
        setattr(obj, name, value)

    def store_item(self, container: Any, key: Any, value: Any) -> None:
        container[key] = value

    def eager_error(self, error: Exception) -> Exception:
        return error  # raised where Python raises it

    # -- the opcodes that differ from the symbolic interpreter's ---------------------------

    def LOAD_DEREF(self, inst: Inst) -> None:
        name = inst.argval
        if name not in self.code.co_freevars:
            raise NotConcrete("a cell variable of the frame itself")
        self.push(self.fn.__closure__[self.code.co_freevars.index(name)].cell_contents)

    def LOAD_ASSERTION_ERROR(self, inst: Inst) -> None:
        self.push(AssertionError)

    def RAISE_VARARGS(self, inst: Inst) -> None:
        """``raise`` with no handler around it (segments.why_not_concrete checks that): the
        exception leaves the frame, as it would natively."""
        if inst.arg == 0:  # handler code is never reached here, so nothing is being handled
            raise RuntimeError("No active exception to reraise")
        cause = self.pop() if inst.arg == 2 else None
        exc = self.pop()
        if inst.arg == 2:
            raise exc from cause
        raise exc

    def BUILD_SET(self, inst: Inst) -> None:
        self.push(set(self.popn(inst.arg)))

    def SET_ADD(self, inst: Inst) -> None:
        item = self.pop()
        self.stack[-inst.arg].add(item)

    def SET_UPDATE(self, inst: Inst) -> None:
        items = self.pop()
        self.stack[-inst.arg].update(items)

    DICT_UPDATE = SET_UPDATE

    def DICT_MERGE(self, inst: Inst) -> None:
        """``f(**a, **b)``: a repeated keyword is a TypeError, as in CPython."""
        other = self.pop()
        target = self.stack[-inst.arg]
        for key in other.keys():
            if key in target:
                raise TypeError(f"got multiple values for keyword argument {key!r}")
            target[key] = other[key]

    def DELETE_SUBSCR(self, inst: Inst) -> None:
        key, container = self.pop(), self.pop()
        del container[key]

    def MAKE_FUNCTION(self, inst: Inst) -> None:
        """A nested function or a 3.11 comprehension (cells of the frame itself never get
        here: frames with cell variables do not resume)."""
        code = self.pop()
        flags = inst.arg or 0
        closure = self.pop() if flags & 0x08 else None
        annotations = self.pop() if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        fn = types.FunctionType(code, self.fn.__globals__, code.co_name, defaults, closure)
        fn.__qualname__ = code.co_qualname
        fn.__kwdefaults__ = kwdefaults
        if annotations is not None:
            fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) if isinstance(
                annotations, tuple) else annotations
        self.push(fn)


# The opcodes the executor runs (segments.why_not_concrete asks).
OPCODES = frozenset(name for name in dir(Frame) if name.isupper())


def _pending_kw_names(code: types.CodeType, insts: list[Inst], index: int) -> tuple[str, ...]:
    """The keyword names a CALL at ``index`` takes from the KW_NAMES just before it (3.11:
    KW_NAMES, PRECALL, CALL; 3.12: KW_NAMES, CALL), which the trace ran, not this frame."""
    if insts[index].opname not in ("CALL", "PRECALL"):
        return ()
    k = index - 1
    while k >= 0 and insts[k].opname in ("PRECALL", "CACHE"):
        k -= 1
    if k >= 0 and insts[k].opname == "KW_NAMES":
        return bytecode.kw_names(code, insts[k])
    return ()


def step(f: Frame) -> None:
    """Execute the instruction at ``f.ip`` and advance."""
    inst = f.last = f.insts[f.ip]
    f.ip += 1
    f.steps += 1
    if inst.opname not in OPCODES:
        raise NotConcrete(f"bytecode {inst.opname} cannot run outside a compiled segment")
    getattr(f, inst.opname)(inst)


def run_to_end(f: Frame) -> Any:
    while not f.returned:
        step(f)
    return f.result
