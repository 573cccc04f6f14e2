"""Running bytecode for real, one instruction at a time, with real values.

At a graph break the breaking instruction runs here, between two compiled segments; when
the rest of a frame cannot be compiled after segments of it ran, the frame finishes here
(its side effects happened, so it cannot restart eagerly).  A :class:`Frame` holds the
locals, the stack and the instruction pointer; opcodes outside ordinary function bodies
raise :class:`NotConcrete`.
"""

from __future__ import annotations

import dataclasses
import operator
import types
from typing import Any

from minicompile.capture import bytecode
from minicompile.capture.bytecode import LOAD_ATTR_HAS_METHOD_BIT, Inst


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
class Frame:
    fn: types.FunctionType
    locals: dict[str, Any]
    stack: list[Any]
    index: int  # position in ``insts``
    insts: list[Inst] = dataclasses.field(default_factory=list)
    index_of: dict[int, int] = dataclasses.field(default_factory=dict)
    kw_names: tuple[str, ...] = ()
    returned: bool = False
    result: Any = None
    # Calls go through this (the driver compiles the user's own functions on the way).
    call: Any = None
    steps: int = 0  # instructions executed, for stats()["concrete_instructions"]
    last: Inst | None = None  # the instruction executed last (where an exception came from)

    @staticmethod
    def at(fn: types.FunctionType, offset: int, local_values: dict, stack: list) -> Frame:
        insts = bytecode.decode(fn.__code__)
        index_of = bytecode.offset_to_index(insts)
        frame = Frame(fn, dict(local_values), list(stack), index_of[offset], insts, index_of)
        frame.kw_names = _pending_kw_names(fn.__code__, insts, index_of[offset])
        return frame

    @property
    def offset(self) -> int:
        return self.insts[self.index].offset


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
    """Execute the instruction at ``f.index`` and advance."""
    inst = f.last = f.insts[f.index]
    f.index += 1
    f.steps += 1
    handler = HANDLERS.get(inst.opname)
    if handler is None:
        raise NotConcrete(f"bytecode {inst.opname} cannot run outside a compiled segment")
    handler(f, inst)


def run_to_end(f: Frame) -> Any:
    while not f.returned:
        step(f)
    return f.result


# -- handlers ------------------------------------------------------------------------------

def _jump(f: Frame, inst: Inst) -> None:
    f.index = f.index_of[inst.argval]


def _global(f: Frame, name: str) -> Any:
    g = f.fn.__globals__
    if name in g:
        return g[name]
    b = bytecode.builtins_of(g)
    if name in b:
        return b[name]
    raise NameError(f"name {name!r} is not defined")


def _popn(f: Frame, n: int) -> list:
    items = f.stack[len(f.stack) - n:]
    del f.stack[len(f.stack) - n:]
    return items


def _call(f: Frame, n: int) -> None:
    args = _popn(f, n)
    second, first = f.stack.pop(), f.stack.pop()
    fn, args = (second, args) if first is NULL else (first, [second, *args])
    kw, f.kw_names = f.kw_names, ()
    split = len(args) - len(kw)
    args, kwargs = args[:split], dict(zip(kw, args[split:]))
    f.stack.append(f.call(fn, args, kwargs) if f.call else fn(*args, **kwargs))


def _load_attr(f: Frame, inst: Inst) -> None:
    value = getattr(f.stack.pop(), inst.argval)
    if LOAD_ATTR_HAS_METHOD_BIT and inst.arg is not None and inst.arg & 1:
        f.stack.extend([NULL, value])  # a bound method: the NULL form is equivalent
    else:
        f.stack.append(value)


def _load_global(f: Frame, inst: Inst) -> None:
    if inst.arg is not None and inst.arg & 1:
        f.stack.append(NULL)
    f.stack.append(_global(f, inst.argval))


def _load_deref(f: Frame, inst: Inst) -> None:
    name = inst.argval
    code = f.fn.__code__
    if name not in code.co_freevars:
        raise NotConcrete("a cell variable of the frame itself")
    f.stack.append(f.fn.__closure__[code.co_freevars.index(name)].cell_contents)


def _pop_jump(test: Any) -> Any:
    def handler(f: Frame, inst: Inst) -> None:
        if test(f.stack.pop()):
            _jump(f, inst)

    return handler


def _jump_or_pop(when: bool) -> Any:
    def handler(f: Frame, inst: Inst) -> None:
        if bool(f.stack[-1]) is when:
            _jump(f, inst)
        else:
            f.stack.pop()

    return handler


def _binary_op(f: Frame, inst: Inst) -> None:
    rhs, lhs = f.stack.pop(), f.stack.pop()
    symbol, fn, inplace = bytecode.binary_op(inst)
    f.stack.append((INPLACE[symbol] if inplace else fn)(lhs, rhs))


def _compare(f: Frame, inst: Inst) -> None:
    rhs, lhs = f.stack.pop(), f.stack.pop()
    f.stack.append(bytecode.COMPARE_OPS[bytecode.compare_symbol(inst)](lhs, rhs))


def _build(kind: Any) -> Any:
    def handler(f: Frame, inst: Inst) -> None:
        f.stack.append(kind(_popn(f, inst.arg)))

    return handler


def _build_map(f: Frame, inst: Inst) -> None:
    items = _popn(f, 2 * inst.arg)
    f.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _const_key_map(f: Frame, inst: Inst) -> None:
    keys = f.stack.pop()
    f.stack.append(dict(zip(keys, _popn(f, len(keys)))))


def _unpack(f: Frame, inst: Inst) -> None:
    items = list(f.stack.pop())
    if len(items) != inst.arg:
        raise ValueError(f"expected {inst.arg} values to unpack, got {len(items)}")
    f.stack.extend(reversed(items))


def _call_function_ex(f: Frame, inst: Inst) -> None:
    """``fn(*args, **kwargs)``: the stack is [NULL, fn, args, kwargs?] on 3.11/3.12 and
    [fn, NULL, args, kwargs?] on 3.13.  Like CALL it goes through ``f.call``, so a user
    function the frame broke in is compiled as its own frame there too."""
    kwargs = f.stack.pop() if inst.arg and inst.arg & 1 else {}
    args = f.stack.pop()
    fn = f.stack.pop()
    if fn is NULL:  # 3.13: the NULL sits above the callable
        fn = f.stack.pop()
    elif f.stack and f.stack[-1] is NULL:
        f.stack.pop()
    args, kwargs = list(args), dict(kwargs)
    f.stack.append(f.call(fn, args, kwargs) if f.call else fn(*args, **kwargs))


def _for_iter(f: Frame, inst: Inst) -> None:
    try:
        f.stack.append(next(f.stack[-1]))
    except StopIteration:
        if bytecode.PY >= (3, 12):
            f.stack.append(None)  # END_FOR at the target pops two
        else:
            f.stack.pop()
        _jump(f, inst)


def _format(f: Frame, inst: Inst) -> None:
    flags = inst.arg or 0
    spec = f.stack.pop() if flags & 0x04 else ""
    value = f.stack.pop()
    conv = {1: str, 2: repr, 3: ascii}.get(flags & 0x03)
    f.stack.append(format(conv(value) if conv else value, spec))


def _intrinsic(f: Frame, inst: Inst) -> None:
    value = f.stack.pop()
    if inst.argval in ("INTRINSIC_LIST_TO_TUPLE", 6):
        f.stack.append(tuple(value))
    elif inst.argval in ("INTRINSIC_UNARY_POSITIVE", 5):
        f.stack.append(+value)
    else:
        raise NotConcrete(f"CALL_INTRINSIC_1 {inst.argval}")


def _ret(f: Frame, value: Any) -> None:
    f.returned, f.result = True, value


def _raise(f: Frame, inst: Inst) -> None:
    """``raise`` with no handler around it (segments.why_not_concrete checks that): the
    exception leaves the frame, as it would natively."""
    if inst.arg == 0:  # handler code is never reached here, so nothing is being handled
        raise RuntimeError("No active exception to reraise")
    cause = f.stack.pop() if inst.arg == 2 else None
    exc = f.stack.pop()
    if inst.arg == 2:
        raise exc from cause
    raise exc


def _dict_merge(f: Frame, inst: Inst) -> None:
    """``f(**a, **b)``: a repeated keyword is a TypeError, as in CPython."""
    other = f.stack.pop()
    target = f.stack[-inst.arg]
    for key in other.keys():
        if key in target:
            raise TypeError(f"got multiple values for keyword argument {key!r}")
        target[key] = other[key]


def _unpack_ex(f: Frame, inst: Inst) -> None:
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = list(f.stack.pop())
    if len(items) < before + after:
        raise ValueError(f"not enough values to unpack (expected at least {before + after}, "
                         f"got {len(items)})")
    rest = items[before : len(items) - after]
    f.stack.extend(reversed([*items[:before], rest, *items[len(items) - after :]]))


def _make_function(f: Frame, inst: Inst) -> None:
    """A nested function or a 3.11 comprehension (cells of the frame itself never get
    here: frames with cell variables do not resume)."""
    code = f.stack.pop()
    flags = inst.arg or 0
    closure = f.stack.pop() if flags & 0x08 else None
    annotations = f.stack.pop() if flags & 0x04 else None
    kwdefaults = f.stack.pop() if flags & 0x02 else None
    defaults = f.stack.pop() if flags & 0x01 else None
    fn = types.FunctionType(code, f.fn.__globals__, code.co_name, defaults, closure)
    fn.__qualname__ = code.co_qualname
    fn.__kwdefaults__ = kwdefaults
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) if isinstance(
            annotations, tuple) else annotations
    f.stack.append(fn)


def _store_subscr(f: Frame, inst: Inst) -> None:
    key, obj, value = f.stack.pop(), f.stack.pop(), f.stack.pop()
    obj[key] = value


def _store_attr(f: Frame, inst: Inst) -> None:
    obj, value = f.stack.pop(), f.stack.pop()
    setattr(obj, inst.argval, value)


def _swap(f: Frame, inst: Inst) -> None:
    f.stack[-1], f.stack[-inst.arg] = f.stack[-inst.arg], f.stack[-1]


def _noop(f: Frame, inst: Inst) -> None:
    pass


def _load_fast_and_clear(f: Frame, inst: Inst) -> None:
    f.stack.append(f.locals.pop(inst.argval, NULL))


def _store_fast(f: Frame, inst: Inst) -> None:
    value = f.stack.pop()
    if value is NULL:  # 3.12 comprehensions restore an unbound local this way
        f.locals.pop(inst.argval, None)
    else:
        f.locals[inst.argval] = value


def _binary_slice(f: Frame, inst: Inst) -> None:
    end, start, obj = f.stack.pop(), f.stack.pop(), f.stack.pop()
    f.stack.append(obj[start:end])


def _build_slice(f: Frame, inst: Inst) -> None:
    f.stack.append(slice(*_popn(f, inst.arg)))


HANDLERS: dict[str, Any] = {
    "NOP": _noop, "RESUME": _noop, "PRECALL": _noop, "CACHE": _noop, "EXTENDED_ARG": _noop,
    "LOAD_FAST": lambda f, i: f.stack.append(f.locals[i.argval]),
    "LOAD_FAST_AND_CLEAR": _load_fast_and_clear,
    "STORE_FAST": _store_fast,
    "DELETE_FAST": lambda f, i: f.locals.pop(i.argval),
    "LOAD_CONST": lambda f, i: f.stack.append(i.argval),
    "RETURN_CONST": lambda f, i: _ret(f, i.argval),
    "RETURN_VALUE": lambda f, i: _ret(f, f.stack.pop()),
    "RAISE_VARARGS": _raise,
    "LOAD_ASSERTION_ERROR": lambda f, i: f.stack.append(AssertionError),
    "LOAD_GLOBAL": _load_global,
    "LOAD_ATTR": _load_attr,
    "LOAD_METHOD": lambda f, i: f.stack.extend([NULL, getattr(f.stack.pop(), i.argval)]),
    "STORE_ATTR": _store_attr,
    "LOAD_DEREF": _load_deref,
    "PUSH_NULL": lambda f, i: f.stack.append(NULL),
    "KW_NAMES": lambda f, i: setattr(f, "kw_names", bytecode.kw_names(f.fn.__code__, i)),
    "CALL": lambda f, i: _call(f, i.arg),
    "CALL_FUNCTION_EX": _call_function_ex,
    "POP_TOP": lambda f, i: f.stack.pop(),
    "COPY": lambda f, i: f.stack.append(f.stack[-i.arg]),
    "SWAP": _swap,
    "BINARY_OP": _binary_op,
    "BINARY_SUBSCR": lambda f, i: f.stack.append(operator.getitem(*reversed(
        [f.stack.pop(), f.stack.pop()]))),
    "BINARY_SLICE": _binary_slice,
    "BUILD_SLICE": _build_slice,
    "STORE_SUBSCR": _store_subscr,
    "COMPARE_OP": _compare,
    "IS_OP": lambda f, i: f.stack.append((f.stack.pop() is f.stack.pop()) != bool(i.arg)),
    "CONTAINS_OP": lambda f, i: f.stack.append((f.stack.pop(-2) in f.stack.pop()) != bool(i.arg)),
    "UNARY_NEGATIVE": lambda f, i: f.stack.append(-f.stack.pop()),
    "UNARY_POSITIVE": lambda f, i: f.stack.append(+f.stack.pop()),
    "UNARY_NOT": lambda f, i: f.stack.append(not f.stack.pop()),
    "UNARY_INVERT": lambda f, i: f.stack.append(~f.stack.pop()),
    "BUILD_TUPLE": _build(tuple), "BUILD_LIST": _build(list), "BUILD_SET": _build(set),
    "BUILD_STRING": _build("".join),
    "BUILD_MAP": _build_map,
    "BUILD_CONST_KEY_MAP": _const_key_map,
    "LIST_APPEND": lambda f, i: f.stack[-i.arg - 1].append(f.stack.pop()),
    "LIST_EXTEND": lambda f, i: f.stack[-i.arg - 1].extend(f.stack.pop()),
    "LIST_TO_TUPLE": lambda f, i: f.stack.append(tuple(f.stack.pop())),
    "DICT_MERGE": _dict_merge,
    "DICT_UPDATE": lambda f, i: f.stack[-i.arg - 1].update(f.stack.pop()),
    "MAP_ADD": lambda f, i: f.stack[-i.arg - 2].__setitem__(*reversed(
        [f.stack.pop(), f.stack.pop()])),
    "SET_ADD": lambda f, i: f.stack[-i.arg - 1].add(f.stack.pop()),
    "SET_UPDATE": lambda f, i: f.stack[-i.arg - 1].update(f.stack.pop()),
    "UNPACK_EX": _unpack_ex,
    "MAKE_FUNCTION": _make_function,
    "DELETE_SUBSCR": lambda f, i: operator.delitem(*reversed([f.stack.pop(), f.stack.pop()])),
    "COPY_FREE_VARS": _noop,  # LOAD_DEREF reads the closure of the function itself
    "CALL_INTRINSIC_1": _intrinsic,
    "UNPACK_SEQUENCE": _unpack,
    "FORMAT_VALUE": _format,
    "GET_ITER": lambda f, i: f.stack.append(iter(f.stack.pop())),
    "FOR_ITER": _for_iter,
    "END_FOR": lambda f, i: (f.stack.pop(), f.stack.pop()),
    "JUMP_FORWARD": _jump, "JUMP_BACKWARD": _jump, "JUMP_BACKWARD_NO_INTERRUPT": _jump,
    "JUMP_IF_FALSE_OR_POP": _jump_or_pop(False),
    "JUMP_IF_TRUE_OR_POP": _jump_or_pop(True)}
_JUMP_TESTS = {"FALSE": operator.not_, "TRUE": bool, "NONE": lambda v: v is None,
               "NOT_NONE": lambda v: v is not None}
for _direction in ("", "FORWARD_", "BACKWARD_"):  # 3.11 spells the direction out
    for _when, _test in _JUMP_TESTS.items():
        HANDLERS[f"POP_JUMP_{_direction}IF_{_when}"] = _pop_jump(_test)
HANDLERS["LOAD_FAST_CHECK"] = HANDLERS["LOAD_FAST"]
