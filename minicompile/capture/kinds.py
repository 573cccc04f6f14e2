"""What each kind of traced value does: one rule per question the interpreter asks of a value
(attributes, calls, truth, plain value, iteration, rebuild...), answered by the handler
registered for the nearest class in the tracker's MRO.  A kind registers its handlers
where it is modelled, so a new kind is one module and nothing else tests for it by
``isinstance``; NumPy's (numpy_kind.py) load with the first NumPy value a trace meets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from minicompile.capture.variables import Var
from minicompile.errors import Unsupported


# The contexts a rule runs in, as the modules that register rules see them: named here so
# that those modules need not import the interpreter, the output graph or the rebuild writer
# (which import them).  Only the interpreter's own mixins annotate with the classes.
class Output(Protocol):
    """capture/output.py's OutputGraph: the graph, guards and side-effect log of a trace."""

    graph: Any
    guards: Any
    side_effects: Any

    def to_value(self, var: Var) -> Any: ...

    def to_values(self, args: Any, kwargs: dict) -> tuple[tuple, dict]: ...

    def from_value(self, value: Any) -> Var: ...


class Translator(Protocol):
    """capture/interpreter.py's InstructionTranslator, running one frame."""

    output: Output

    def realize(self, var: Var) -> Var: ...

    def call_function(self, fn: Var, args: list, kwargs: dict) -> Var: ...

    def module_attr(self, module: Var, name: str) -> Var: ...


class RebuildWriter(Protocol):
    """capture/side_effects.py's Rebuild: writes the code that rebuilds the results."""

    out: Output
    made: dict[int, str]
    g: Any  # the generated code's names (ref)

    def temp(self, expr: str) -> str: ...

    def items(self, values: Any) -> str: ...


def registrar(table: dict) -> Callable[..., Callable[[Callable], Callable]]:
    """``register = registrar(table)``: ``@register(*keys)`` files a handler under each key
    of ``table`` (None, a callable this release lacks, skipped)."""

    def register(*keys: Any) -> Callable[[Callable], Callable]:
        def deco(handler: Callable) -> Callable:
            table.update((k, handler) for k in keys if k is not None)
            return handler

        return deco

    return register


class Rule:
    """A table from tracker class to handler; ``rule(ctx, var, *args)`` calls
    ``handler(ctx, var, *args)`` (``ctx``: the translator, the output graph or the rebuild
    writer).  Classes that register nothing raise Unsupported with ``why(var, *args)``."""

    def __init__(self, why: Callable[..., str]) -> None:
        def unsupported(ctx: Any, var: Var, *args: Any) -> Any:
            raise Unsupported(why(var.describe(), *args))

        self._table = functools.singledispatch(unsupported)

    def register(self, cls: type, fn: Callable[..., Any] | None = None) -> Any:
        """``register(cls, fn)``, or ``@register(cls)`` on a function (returned unchanged)."""
        return self._table.register(cls, fn)

    def __call__(self, ctx: Any, var: Var, *args: Any) -> Any:
        return self._table.dispatch(type(var))(ctx, var, *args)


# The questions, with what each handler takes after (ctx, var) and gives back.
load_attr = Rule(lambda v, name: f"attribute {name!r} of {v} is not supported yet")  # (name)
call = Rule(lambda v, *_: f"calling {v} is not supported")  # (args, kwargs) -> Var
call_method = Rule(lambda v, *_: f"calling {v} is not supported")  # (name, args, kwargs) -> Var
truthy = Rule(lambda v: f"truth value of {v} is not supported")  # () -> bool, for a branch
to_value = Rule(lambda v: f"{v} cannot be used as a value here")  # (): what folding works on
subscript = Rule(lambda v, _: f"indexing {v} is not supported")  # (index) -> Var
store_item = Rule(lambda v, *_: f"item assignment on {v} is not supported")  # (key, value)
binary = Rule(lambda v, s, *_: f"operator {s} on {v} is not supported")  # (s, a, b, inplace)
unary = Rule(lambda v, symbol, _: f"unary {symbol} on {v} is not supported")  # (symbol, fn)
contains = Rule(lambda v, _: f"`in` on {v} is not supported")  # (item) -> bool (Var: fold)
delete_attr = Rule(lambda v, _: f"del of an attribute of {v} is not supported")  # (name)
store_attr = Rule(lambda v, *_: f"attribute write on {v} is not supported")  # (name, value)
has_attr = Rule(lambda v, _: f"hasattr() on {v} is not supported")  # (name) -> bool
require_pinned = Rule(lambda v, _: f"{v} is not pinned")  # (what): see OutputGraph's
# (fn, values) -> Var: a builtin whose first argument (var, a tensor or an array) decides it
builtin = Rule(lambda v, fn, _: f"builtin {getattr(fn, '__name__', fn)}() on {v} is not supported")
length = Rule(lambda v: f"len() of {v} is not supported")  # () -> Var | None (the builtin)
copy = Rule(lambda v: f"copy.copy() of {v} is not supported")  # () -> Var
deepcopy = Rule(lambda v, _: f"copy.deepcopy() of {v} is not supported")  # (memo) -> Var
iterate = Rule(lambda v: f"iter() of {v} is not supported")  # () -> IteratorVar (GET_ITER)
iter_items = Rule(lambda v: f"iterating over {v} is not supported")  # () -> list[Var]
# (r) -> str: the tracker as source in the generated ``rebuild`` (side_effects.Rebuild)
rebuild = Rule(lambda v: f"{v} cannot leave the compiled region (returned/stored)")
