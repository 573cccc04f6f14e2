"""The symbolic bytecode interpreter: one method per opcode, named after it.

An :class:`InstructionTranslator` walks one code object with a stack and locals of value
trackers; shared opcodes are :class:`opcodes.StackMachine`'s, the value hooks are here and
in the mixins.  It never runs user code or mutates user objects, so raising
:class:`Unsupported` is always safe.  Call layout per Python version: see :mod:`bytecode`."""

from __future__ import annotations

import inspect
import linecache
import types
from collections.abc import Callable
from typing import Any

from minicompile.capture import bytecode, kinds
from minicompile.capture.bytecode import PY, Inst
from minicompile.capture.calls import CallsMixin
from minicompile.capture.python_calls import PythonCallsMixin
from minicompile.capture.control import ControlMixin
from minicompile.capture.opcodes import StackMachine
from minicompile.capture.operators import OperatorsMixin
from minicompile.capture.output import MAX_INSTRUCTIONS, OutputGraph
from minicompile.capture.variables import (
    NULL, CellVar, ConstantVar, DictVar, ListVar, MethodVar, NestedFunctionVar, NewObjectVar,
    ObjectVar, PartialVar, Source, TensorVar, TupleVar, UserFunctionVar, Var, contains_tensor,
    specialized,
)
from minicompile.errors import SourceLine, Unsupported, attempt

class InstructionTranslator(
    CallsMixin, PythonCallsMixin, ControlMixin, OperatorsMixin, StackMachine
):
    """Interprets one frame (``parent``: the caller's translator when inlined, and
    ``parent_stack`` the user stack of the call site).  An instruction that raises
    :class:`Unsupported` leaves the translator as it was before it (``ip`` at it, the stack
    restored), and the exception carries the innermost one as ``e.translator``.
    ``stop_before`` (offset, reason): an instruction to break at before running it."""

    stop_before: tuple[int, Unsupported] | None = None
    null = NULL
    Refused = Unsupported

    def __init__(
        self, output: OutputGraph, code: types.CodeType, f_globals: dict[str, Any],
        f_builtins: dict[str, Any], local_vars: dict[str, Var], cells: dict[str, CellVar],
        parent_stack: tuple[SourceLine, ...] = (), depth: int = 0, globals_name: str = "G",
        parent: InstructionTranslator | None = None,
    ) -> None:
        # Generator functions called inside the trace (generator expressions) run to
        # exhaustion; their items are collected by YIELD_VALUE (see inline_call).
        self.generated: list[Var] | None = None
        if bytecode.is_generator_like(code):
            if not (code.co_flags & inspect.CO_GENERATOR) or not depth:
                raise Unsupported(f"generator/async function {code.co_name}() is not supported")
            self.generated = []
        self.output = output
        output.codes.add(code)  # every code object traced: the keys of warm entries
        self.code = code
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.locals = local_vars
        self.cells = cells
        self.parent_stack = parent_stack
        self.depth = depth
        self.globals_name = globals_name
        self.parent = parent
        self.insts = bytecode.decode(code)
        self.index_of = bytecode.offset_to_index(self.insts)
        self.stack: list[Var] = []
        self.ip = 0
        self.inst: Inst = self.insts[0]

    # -- driver ----------------------------------------------------------------------------

    def run(self) -> Var:
        """Interpret until this frame returns; the returned tracker."""
        out = self.output
        saved, out.tx = out.tx, self
        try:
            while not self.returned:
                self.inst = self.insts[self.ip]
                self.ip += 1
                snapshot = self.stack[:]
                try:
                    out.instructions += 1
                    if out.instructions > MAX_INSTRUCTIONS:
                        raise Unsupported(
                            f"trace longer than {MAX_INSTRUCTIONS} instructions (a long loop?)")
                    if self.stop_before is not None and self.inst.offset == self.stop_before[0]:
                        raise self.stop_before[1]
                    handler = getattr(self, self.inst.opname, None)
                    if handler is None:
                        raise Unsupported(f"bytecode {self.inst.opname} is not supported yet")
                    handler(self.inst)
                except Unsupported as e:
                    self.stack, self.ip = snapshot, self.ip - 1
                    if not e.stack:
                        # (a ShapeError stays one)
                        e = type(e)(e.reason, self.user_stack(), e.hint, e.raises)
                    if getattr(e, "translator", None) is None:
                        e.translator = self  # type: ignore[attr-defined]
                    raise e
            return self.result
        finally:
            self.output.tx = saved

    def user_stack(self) -> tuple[SourceLine, ...]:
        lineno = self.inst.lineno
        text = linecache.getline(self.code.co_filename, lineno).strip()
        here = SourceLine(self.code.co_filename, lineno, self.code.co_name, text)
        return (*self.parent_stack, here)

    # -- values: the hooks of StackMachine (the rest are in the mixins) --------------------

    def realize(self, var: Var) -> Var:
        return self.output.realize(var)

    def value(self, var: Var) -> Any:
        return self.output.to_value(var)

    def const(self, value: Any) -> Var:
        return self.output.from_value(value)

    def identity(self, var: Var) -> Any:
        return var.identity()  # (None only for a constant None)

    def same_object(self, a: Var, b: Var) -> bool:
        """``a is b``.  Between two objects the answer is their identities: a user object
        (guarded by its type, as its attributes are read) is then guarded by identity
        (``mode is Action.NONE``); against a constant its type decides."""
        if not a.constant and not b.constant:
            a.pin_identity(self.output.guards)
            b.pin_identity(self.output.guards)
        return self.identity(a) is self.identity(b)

    def make_tuple(self, items: list[Var]) -> Var:
        return TupleVar(tuple(items))

    def make_list(self, items: list[Var]) -> Var:
        return ListVar(list(items))

    def make_dict(self, items: dict[Any, Var]) -> Var:
        return DictVar(items)

    def eager_error(self, error: Exception) -> Exception:
        return Unsupported(f"{error} (eager raises {type(error).__name__})")

    def truthy(self, var: Var) -> bool:
        """``bool(var)`` for a branch: Python values decide now (they are guarded, or derived
        from guarded tensor metadata); tensors would need their data."""
        return kinds.truthy(self, var)

    @kinds.truthy.register(TensorVar)
    def tensor_truthy(self, var: TensorVar) -> bool:
        decided = _decided_by_range(var.node)
        if decided is not None:
            return decided
        raise Unsupported("data-dependent branch: `if` on a tensor value is not supported",
                          hint="use torch.where")

    @kinds.truthy.register(ConstantVar)
    @kinds.truthy.register(ObjectVar)
    def value_truthy(self, var: ConstantVar | ObjectVar) -> bool:
        try:
            return bool(var.value)
        except Exception as e:
            raise Unsupported(f"bool() of {var.describe()} raised {e}") from e

    @kinds.truthy.register(NewObjectVar)
    def object_truthy(self, var: NewObjectVar) -> bool:
        """Its class's ``__bool__`` or ``__len__``, inlined (a DynamicCache made in forward)."""
        for name in ("__bool__", "__len__"):
            method = getattr(var.cls, name, None)
            if method is None:
                continue
            if not isinstance(method, types.FunctionType):
                break
            result = self.realize(self.inline_call(UserFunctionVar(method), [var], {}))
            if not isinstance(result, ConstantVar) or type(result.value) not in (bool, int):
                raise Unsupported(f"{var.cls.__name__}.{name}() gave {result.describe()}")
            return bool(result.value)
        else:
            return True  # (neither: every object is true)
        raise Unsupported(f"truth value of {var.describe()} is not supported")

    def fold(self, fn: Callable, *args: Var, what: str = "", text: bool = False) -> Var:
        """Apply a Python operator to constant trackers now.  ``text``: the result shows
        its operands as text (f-strings), so symbolic sizes give their numbers."""
        self.output.require_pinned(args, what or fn.__name__)
        values = [self.output.to_value(a) for a in args]
        if text or any(isinstance(v, str) for v in values):  # "%s" % n, "n=" + str(n)
            values = [specialized(v) for v in values]
        if any(contains_tensor(v) for v in values):
            raise Unsupported(f"{what or fn.__name__} on a tuple/list holding tensors")
        return self.output.from_value(attempt(what or fn.__name__, fn, *values))

    # -- locals, constants, globals, cells -------------------------------------------------

    def load_global(self, name: str) -> Var:
        g = self.globals_name
        pending = self.output.side_effects.load_global(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            trusted = str(self.f_globals.get("__name__", "")).split(".")[0] == "torch"
            source = Source(f"{g}[{name!r}]", f"{g}[{name!r}]", f"{g}_{name}", trusted=trusted,
                            safe_expr=f"{g}.get({name!r})")
            return self.output.wrap(self.f_globals[name], source)
        if name in self.f_builtins:
            b = self.output.guards.ref(self.f_builtins, "B")
            expr = f"{g}.get({name!r}, {b}.get({name!r}))"
            source = Source(f"B[{name!r}]", expr, f"B_{name}", safe_expr=expr)
            return self.output.wrap(self.f_builtins[name], source)
        raise Unsupported(f"name {name!r} is not defined (eager raises NameError)")

    def MAKE_CELL(self, inst: Inst) -> None:
        self.cells[inst.argval] = CellVar(self.locals.pop(inst.argval, None), local=True)

    def LOAD_DEREF(self, inst: Inst) -> None:
        cell = self.cells[inst.argval]
        if cell.contents is None:
            raise Unsupported(f"free variable {inst.argval!r} referenced before assignment")
        cell.contents = self.realize(cell.contents)
        self.push(cell.contents)

    def LOAD_CLOSURE(self, inst: Inst) -> None:
        self.push(self.cells[inst.argval])

    def _refuse(reason: str) -> Callable:  # noqa: N805 (a handler factory)
        def handler(self: InstructionTranslator, inst: Inst) -> None:
            raise Unsupported(reason)

        return handler

    LOAD_ASSERTION_ERROR = _refuse("failed assert: eager raises AssertionError")
    RAISE_VARARGS = _refuse("raise statement: eager raises")
    DELETE_GLOBAL = DELETE_DEREF = _refuse("del of a global/cell")
    BEFORE_ASYNC_WITH = _refuse("async with is not supported")

    def RETURN_GENERATOR(self, inst: Inst) -> None:  # the generator object, popped next
        self.push(ConstantVar(None))

    def YIELD_VALUE(self, inst: Inst) -> None:
        if self.generated is None:
            raise Unsupported("yield outside a generator")
        self.generated.append(self.pop())
        self.push(ConstantVar(None))  # what the consumer sends back: next() sends None

    # -- functions -------------------------------------------------------------------------

    def MAKE_FUNCTION(self, inst: Inst) -> None:
        code = self.output.to_value(self.pop())
        fn = NestedFunctionVar(code, self.f_globals)
        flags = inst.arg or 0  # 3.13: always 0, attributes come by SET_FUNCTION_ATTRIBUTE
        for flag in (0x08, 0x04, 0x02, 0x01):
            if flags & flag:
                fn = self._set_function_attribute(fn, flag, self.pop())
        self.push(fn)

    def SET_FUNCTION_ATTRIBUTE(self, inst: Inst) -> None:  # 3.13
        fn = self.pop()
        self.push(self._set_function_attribute(fn, inst.arg, self.pop()))

    def _set_function_attribute(self, fn: NestedFunctionVar, flag: int, value: Var) -> Var:
        if flag == 0x08:
            fn.closure = tuple(value.items)
        elif flag == 0x02:
            fn.kwdefaults = dict(value.items)
        elif flag == 0x01:
            fn.defaults = tuple(self.iter_items(value))
        return fn  # 0x04 annotations: ignored


if PY < (3, 11):  # pragma: no cover
    raise ImportError("minicompile.capture needs CPython 3.11 or newer")


for _kind in (TupleVar, ListVar, DictVar):
    kinds.truthy.register(_kind, lambda tx, var: len(var.items) > 0)
for _kind in (NestedFunctionVar, MethodVar, PartialVar):
    kinds.truthy.register(_kind, lambda tx, var: True)


# Ops whose every value lies in a known closed range (torch.rand's [0, 1), closed for
# the low-precision roundings that reach 1).
_RANGES = {"torch.rand": (0.0, 1.0), "torch.rand_like": (0.0, 1.0)}
# comparison: (true for every value in [lo, hi] against c, false for every one)
_COMPARE = {"lt": (lambda lo, hi, c: hi < c, lambda lo, hi, c: lo >= c),
            "le": (lambda lo, hi, c: hi <= c, lambda lo, hi, c: lo > c),
            "gt": (lambda lo, hi, c: lo > c, lambda lo, hi, c: hi <= c),
            "ge": (lambda lo, hi, c: lo >= c, lambda lo, hi, c: hi < c)}


def _decided_by_range(node: Any) -> bool | None:
    """The truth of a one-element comparison of a random draw with a Python number that its
    range decides for every draw, else None: transformers' LayerDrop, ``if torch.rand([]) <
    self.layerdrop`` with ``layerdrop == 0.0``, never skips a layer (Dynamo breaks there).
    The draw stays in the graph, so the random stream is eager's."""
    if node.target not in _COMPARE or len(node.args) != 2 or node.kwargs:
        return None
    draw, bound = node.args
    if (getattr(draw, "target", None) not in _RANGES or isinstance(bound, bool)
            or not isinstance(bound, (int, float)) or any(s != 1 for s in node.meta.shape)):
        return None
    always, never = _COMPARE[node.target]
    lo, hi = _RANGES[draw.target]
    return True if always(lo, hi, bound) else False if never(lo, hi, bound) else None

