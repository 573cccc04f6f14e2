"""What an opcode does to a frame, written once for both interpreters.

:class:`StackMachine` holds the opcodes whose meaning does not depend on what the values
are.  The symbolic :class:`InstructionTranslator` and the concrete :class:`concrete.Frame`
inherit them and answer the value hooks (``realize``, ``truthy``, ``binary``, ...).
``null`` is the NULL stack slot next to callables, ``Refused`` what the machine does not model.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from minicompile.capture import bytecode
from minicompile.capture.bytecode import NULL_AFTER_CALLABLE, PY, Inst


class StackMachine:
    """The state the opcodes read: ``stack``, ``locals``, ``ip`` (an index of ``insts``),
    ``index_of`` (offset -> index), ``code``, the pending ``kw_names`` and, once the frame
    returned, ``result``."""

    null: Any
    Refused: type[Exception]
    stack: list
    locals: dict[str, Any]
    ip: int
    index_of: dict[int, int]
    code: types.CodeType
    kw_names: tuple[str, ...] = ()
    returned: bool = False
    result: Any = None

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def pop(self) -> Any:
        return self.stack.pop()

    def popn(self, n: int) -> list:
        items = self.stack[len(self.stack) - n:]  # (-n would take all of it for n == 0)
        del self.stack[len(self.stack) - n:]
        return items

    def jump(self, inst: Inst) -> None:
        self.ip = self.index_of[inst.argval]

    def return_(self, value: Any) -> None:
        self.returned, self.result = True, value

    def push_method(self, method: Any) -> None:
        self.stack.extend([method, self.null] if NULL_AFTER_CALLABLE else [self.null, method])

    # -- locals, constants, globals, attributes --------------------------------------------

    def LOAD_FAST(self, inst: Inst) -> None:
        name = inst.argval
        if name not in self.locals:
            raise self.eager_error(UnboundLocalError(f"local variable {name!r} is unbound"))
        value = self.locals[name] = self.realize(self.locals[name])
        self.push(value)

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_LOAD_FAST(self, inst: Inst) -> None:  # 3.13
        for name in inst.argval:
            self.LOAD_FAST(Inst("LOAD_FAST", None, name, inst.offset, inst.lineno))

    def STORE_FAST_LOAD_FAST(self, inst: Inst) -> None:  # 3.13
        store, load = inst.argval
        self.locals[store] = self.pop()
        self.LOAD_FAST(Inst("LOAD_FAST", None, load, inst.offset, inst.lineno))

    def STORE_FAST_STORE_FAST(self, inst: Inst) -> None:  # 3.13: the first name takes TOS
        for name in inst.argval:
            self.locals[name] = self.pop()

    def DELETE_FAST(self, inst: Inst) -> None:
        if inst.argval not in self.locals:
            raise self.eager_error(UnboundLocalError(f"local variable {inst.argval!r} is unbound"))
        del self.locals[inst.argval]

    def LOAD_FAST_AND_CLEAR(self, inst: Inst) -> None:
        self.push(self.realize(self.locals.pop(inst.argval, self.null)))

    def STORE_FAST(self, inst: Inst) -> None:
        value = self.pop()
        if value is self.null:  # 3.12 comprehensions restore an unbound local this way
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = value

    def LOAD_CONST(self, inst: Inst) -> None:
        self.push(self.const(inst.argval))

    def LOAD_GLOBAL(self, inst: Inst) -> None:
        if inst.arg & 1 and not NULL_AFTER_CALLABLE:
            self.push(self.null)
        self.push(self.load_global(inst.argval))
        if inst.arg & 1 and NULL_AFTER_CALLABLE:
            self.push(self.null)

    def LOAD_ATTR(self, inst: Inst) -> None:
        value = self.load_attr(self.pop(), inst.argval)
        if bytecode.LOAD_ATTR_HAS_METHOD_BIT and inst.arg & 1:
            self.push_method(value)  # a bound method: the NULL form is equivalent
        else:
            self.push(value)

    def LOAD_METHOD(self, inst: Inst) -> None:  # 3.11
        self.push_method(self.load_attr(self.pop(), inst.argval))

    def STORE_ATTR(self, inst: Inst) -> None:
        obj = self.pop()
        self.store_attr(obj, inst.argval, self.pop())

    def STORE_SUBSCR(self, inst: Inst) -> None:
        key, container, value = self.pop(), self.pop(), self.pop()
        self.store_item(container, key, value)

    # -- calls -----------------------------------------------------------------------------

    def PUSH_NULL(self, inst: Inst) -> None:
        self.push(self.null)

    def KW_NAMES(self, inst: Inst) -> None:  # 3.11, 3.12
        self.kw_names = bytecode.kw_names(self.code, inst)

    def CALL(self, inst: Inst) -> None:
        args = self.popn(inst.arg)
        names, self.kw_names = self.kw_names, ()
        a, b = self.popn(2)
        if a is self.null and not NULL_AFTER_CALLABLE:
            a, b = b, a
        self._call(a, b, args, names)

    def CALL_KW(self, inst: Inst) -> None:  # 3.13: the names tuple is on the stack
        names = self.value(self.pop())
        args = self.popn(inst.arg)
        fn, self_arg = self.popn(2)
        self._call(fn, self_arg, args, names)

    def _call(self, fn: Any, self_arg: Any, args: list, names: tuple) -> None:
        if self_arg is not self.null:
            args = [self_arg, *args]
        split = len(args) - len(names)
        kwargs = dict(zip(names, args[split:]))
        self.push(self.call_function(fn, args[:split], kwargs))

    def CALL_FUNCTION_EX(self, inst: Inst) -> None:
        """``fn(*args, **kwargs)``: the stack is [NULL, fn, args, kwargs?] on 3.11/3.12 and
        [fn, NULL, args, kwargs?] on 3.13."""
        kwargs = self.pop() if inst.arg & 1 else None
        args = self.pop()
        fn = self.popn(2)[0 if NULL_AFTER_CALLABLE else 1]
        kw = self.keywords(kwargs)
        self.push(self.call_function(fn, self.iter_items(args), kw))

    # -- stack shuffles, jumps, returns ----------------------------------------------------

    def POP_TOP(self, inst: Inst) -> None:
        self.pop()

    def COPY(self, inst: Inst) -> None:
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst: Inst) -> None:
        self.stack[-1], self.stack[-inst.arg] = self.stack[-inst.arg], self.stack[-1]

    def _noop(self, inst: Inst) -> None:
        pass

    # (COPY_FREE_VARS: the closure is read where LOAD_DEREF needs it)
    NOP = RESUME = PRECALL = EXTENDED_ARG = COPY_FREE_VARS = CACHE = _noop

    def _pop_jump(test: Callable[[Any, Any], bool]) -> Callable:  # noqa: N805
        def handler(self: StackMachine, inst: Inst) -> None:
            if test(self, self.pop()):
                self.jump(inst)

        return handler

    POP_JUMP_IF_TRUE = _pop_jump(lambda self, v: self.truthy(v))
    POP_JUMP_IF_FALSE = _pop_jump(lambda self, v: not self.truthy(v))
    POP_JUMP_IF_NONE = _pop_jump(lambda self, v: self.identity(v) is None)
    POP_JUMP_IF_NOT_NONE = _pop_jump(lambda self, v: self.identity(v) is not None)
    # 3.11 spells the direction out (the symbolic interpreter refuses backward jumps)
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def _jump_or_pop(when: bool) -> Callable:  # noqa: N805 (3.11)
        def handler(self: StackMachine, inst: Inst) -> None:
            if self.truthy(self.stack[-1]) is when:
                self.jump(inst)
            else:
                self.pop()

        return handler

    JUMP_IF_TRUE_OR_POP = _jump_or_pop(True)
    JUMP_IF_FALSE_OR_POP = _jump_or_pop(False)

    def JUMP_FORWARD(self, inst: Inst) -> None:
        self.jump(inst)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP_FORWARD

    def GET_ITER(self, inst: Inst) -> None:
        self.push(self.iterate(self.pop()))

    def FOR_ITER(self, inst: Inst) -> None:
        item = self.next_item(self.stack[-1])
        if item is not self.null:
            self.push(item)
            return
        if PY >= (3, 12):
            self.push(self.null)  # END_FOR at the target pops it (and the iterator on 3.12)
        else:
            self.pop()
        self.jump(inst)

    def END_FOR(self, inst: Inst) -> None:
        self.popn(2 if PY == (3, 12) else 1)

    def RETURN_VALUE(self, inst: Inst) -> None:
        self.return_(self.pop())

    def RETURN_CONST(self, inst: Inst) -> None:  # 3.12
        self.return_(self.const(inst.argval))

    # -- operators -------------------------------------------------------------------------

    def BINARY_OP(self, inst: Inst) -> None:
        b, a = self.pop(), self.pop()
        symbol, fn, inplace = bytecode.binary_op(inst)
        self.push(self.binary(symbol, fn, a, b, inplace))

    def COMPARE_OP(self, inst: Inst) -> None:
        b, a = self.pop(), self.pop()
        symbol = bytecode.compare_symbol(inst)
        self.push(self.binary(symbol, bytecode.COMPARE_OPS[symbol], a, b))

    def IS_OP(self, inst: Inst) -> None:
        b, a = self.pop(), self.pop()
        self.push(self.const(self.same_object(a, b) != bool(inst.arg)))

    def CONTAINS_OP(self, inst: Inst) -> None:
        container, item = self.pop(), self.pop()
        self.push(self.const(self.contains(container, item) != bool(inst.arg)))

    def _unary(symbol: str, fn: Callable) -> Callable:  # noqa: N805 (a handler factory)
        def handler(self: StackMachine, inst: Inst) -> None:
            self.push(self.unary(self.pop(), symbol, fn))

        return handler

    UNARY_NEGATIVE = _unary("-", lambda v: -v)
    UNARY_INVERT = _unary("~", lambda v: ~v)
    UNARY_POSITIVE = _unary("+", lambda v: +v)  # 3.11; 3.12 uses CALL_INTRINSIC_1

    def UNARY_NOT(self, inst: Inst) -> None:
        self.push(self.const(not self.truthy(self.pop())))

    def TO_BOOL(self, inst: Inst) -> None:  # 3.13
        self.push(self.const(self.truthy(self.pop())))

    def CALL_INTRINSIC_1(self, inst: Inst) -> None:  # 3.12
        if inst.argval == "INTRINSIC_UNARY_POSITIVE" or inst.arg == 5:
            self.UNARY_POSITIVE(inst)
        elif inst.argval == "INTRINSIC_LIST_TO_TUPLE" or inst.arg == 6:
            self.LIST_TO_TUPLE(inst)
        else:
            raise self.Refused(f"CALL_INTRINSIC_1 {inst.argval} is not supported")

    # -- containers ------------------------------------------------------------------------

    def BUILD_TUPLE(self, inst: Inst) -> None:
        self.push(self.make_tuple(self.popn(inst.arg)))

    def BUILD_LIST(self, inst: Inst) -> None:
        self.push(self.make_list(self.popn(inst.arg)))

    def BUILD_MAP(self, inst: Inst) -> None:
        flat = self.popn(2 * inst.arg)
        keys = [self.value(k) for k in flat[0::2]]
        self.push(self.make_dict(dict(zip(keys, flat[1::2]))))

    def BUILD_CONST_KEY_MAP(self, inst: Inst) -> None:
        keys = self.value(self.pop())
        self.push(self.make_dict(dict(zip(keys, self.popn(inst.arg)))))

    def LIST_TO_TUPLE(self, inst: Inst) -> None:  # 3.11
        self.push(self.make_tuple(self.iter_items(self.pop())))

    def LIST_APPEND(self, inst: Inst) -> None:
        item = self.pop()
        self.contents(self.stack[-inst.arg], "append").append(item)

    def LIST_EXTEND(self, inst: Inst) -> None:
        items = self.iter_items(self.pop())
        self.contents(self.stack[-inst.arg], "extend").extend(items)

    def MAP_ADD(self, inst: Inst) -> None:
        value, key = self.pop(), self.pop()
        self.contents(self.stack[-inst.arg], "dict comprehension")[self.value(key)] = value

    def UNPACK_SEQUENCE(self, inst: Inst) -> None:
        items = self.iter_items(self.pop())
        if len(items) != inst.arg:
            raise self.eager_error(ValueError(
                f"expected {inst.arg} values to unpack, got {len(items)}"))
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, inst: Inst) -> None:  # a, *b, c = items
        before, after = inst.arg & 0xFF, inst.arg >> 8
        items = self.iter_items(self.pop())
        if len(items) < before + after:
            raise self.eager_error(ValueError("not enough values to unpack (expected at least "
                                              f"{before + after}, got {len(items)})"))
        rest = self.make_list(items[before : len(items) - after])
        self.stack.extend(reversed([*items[:before], rest, *items[len(items) - after :]]))

    def BUILD_SLICE(self, inst: Inst) -> None:
        self.push(self.fold(slice, *self.popn(inst.arg), what="slice"))

    def BINARY_SUBSCR(self, inst: Inst) -> None:
        index, container = self.pop(), self.pop()
        self.push(self.subscript(container, index))

    def BINARY_SLICE(self, inst: Inst) -> None:  # 3.12
        end, start, container = self.pop(), self.pop(), self.pop()
        self.push(self.subscript(container, self.fold(slice, start, end, what="slice")))

    def STORE_SLICE(self, inst: Inst) -> None:  # 3.12
        end, start = self.pop(), self.pop()
        container, value = self.pop(), self.pop()
        self.store_item(container, self.fold(slice, start, end, what="slice"), value)

    # -- f-strings -------------------------------------------------------------------------

    def FORMAT_VALUE(self, inst: Inst) -> None:  # 3.11, 3.12
        spec = self.value(self.pop()) if inst.arg & 0x04 else ""
        convert = {0: None, 1: str, 2: repr, 3: ascii}[inst.arg & 0x03]
        value = self.pop()
        self.push(self.fold(lambda v: format(convert(v) if convert else v, spec), value, text=True))

    def CONVERT_VALUE(self, inst: Inst) -> None:  # 3.13
        convert = {1: str, 2: repr, 3: ascii}[inst.arg]
        self.push(self.fold(convert, self.pop(), text=True))

    def FORMAT_SIMPLE(self, inst: Inst) -> None:  # 3.13
        self.push(self.fold(format, self.pop(), text=True))

    def FORMAT_WITH_SPEC(self, inst: Inst) -> None:  # 3.13
        spec = self.pop()
        self.push(self.fold(format, self.pop(), spec, text=True))

    def BUILD_STRING(self, inst: Inst) -> None:
        parts = self.popn(inst.arg)
        self.push(self.fold(lambda *p: "".join(p), *parts, what="f-string", text=True))
