"""Calls to Python builtins and ``math`` functions during tracing.

Pure builtins on constants are folded (``max(a, 2)``, ``math.sqrt(d)``, ``len(t)``).  The
ones that see tensors answer from metadata (``len(x)``, ``isinstance(x, torch.Tensor)``) or
become graph ops (``abs(x)``).  Everything else, ``print`` first of all, is Unsupported.
"""

from __future__ import annotations

import builtins
import collections.abc
from typing import Any

from minicompile.capture.kinds import Output
from minicompile.capture.variables import (
    ArrayVar, python_type_of, specialized, ConstantVar, DictVar, ListVar, ObjectVar, TensorVar,
    TupleVar, Var, leaves,
)
from minicompile.errors import Unsupported


# Builtins without side effects, folded when no argument is a tensor.
FOLDABLE: frozenset[Any] = frozenset({
    abs, all, any, bool, callable, complex, divmod, float, hash, int, isinstance, issubclass,
    len, max, min, pow, range, repr, round, slice, sorted, str, sum, tuple, type})
_TENSOR_TO_PYTHON = (bool, int, float, complex)


def contains_tensor(value: Any) -> bool:
    """A tensor (or a NumPy array: traced as one) in a value or its items."""
    return any(isinstance(v, (TensorVar, ArrayVar)) for v in leaves(value))


# Builtins that compute with symbolic sizes as they are (and record relations they decide).
_SYMBOLIC_SAFE = frozenset({abs, min, max, int, float, bool, round, divmod, pow, sum, len})


def call_builtin(out: Output, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``fn(*args, **kwargs)`` for a builtin or math function ``fn``."""
    name = getattr(fn, "__name__", repr(fn))
    if fn is print:
        raise Unsupported("print() is not traceable (side effect)", hint="remove the print")
    if fn is builtins.getattr and len(args) in (2, 3):
        raise Unsupported("getattr() is not supported yet")
    if fn in (tuple, list) and len(args) == 1 and not kwargs:
        return _sequence(fn, args[0])
    pairs = args[0].items if args and isinstance(args[0], (TupleVar, ListVar)) else None
    if fn is dict and len(args) == 1 and not kwargs and pairs is not None and all(
            isinstance(p, TupleVar) and len(p.items) == 2 for p in pairs):  # dict(o.items())
        return DictVar({out.to_value(p.items[0]): p.items[1] for p in pairs})
    values = [out.to_value(a) for a in args]
    kw = {k: out.to_value(v) for k, v in kwargs.items()}
    if any(contains_tensor(v) for v in (*values, *kw.values())):
        return _with_tensors(out, fn, name, values, kw)
    exception_class = isinstance(fn, type) and issubclass(fn, BaseException)
    if fn not in (isinstance, type, issubclass, callable):  # these need only the type
        out.require_pinned([*args, *kwargs.values()], f"{name}()")
    if fn in (isinstance, type, issubclass, callable):
        values = [python_type_of(v) for v in values]  # a symbolic size is an int
    elif fn not in _SYMBOLIC_SAFE:  # str(n), hash(n), format(n): the number, guarded
        values, kw = specialized(values), specialized(kw)
    if fn in FOLDABLE or exception_class or getattr(fn, "__module__", None) == "math":
        try:
            return out.from_value(fn(*values, **kw))
        except Exception as e:
            raise Unsupported(f"{name}() raised {type(e).__name__}: {e}") from e
    raise Unsupported(f"builtin {name}() is not supported")


def _sequence(fn: Any, arg: Var) -> Var:
    if isinstance(arg, (TupleVar, ListVar)):
        items = tuple(arg.items)
    elif isinstance(arg, ConstantVar) and isinstance(arg.value, (
            str, bytes, set, frozenset, collections.abc.KeysView)):
        items = tuple(ConstantVar(c) for c in arg.value)
    elif isinstance(arg, DictVar):
        items = tuple(ConstantVar(k) for k in arg.items)
    else:
        raise Unsupported(f"{fn.__name__}() of {arg.describe()} is not supported yet")
    return TupleVar(items) if fn is tuple else ListVar(list(items))


def _with_tensors(out: Output, fn: Any, name: str, values: list, kw: dict) -> Var:
    x = values[0] if values else None
    if isinstance(x, ArrayVar):
        from minicompile.capture import numpy_kind

        return numpy_kind.builtin(out, fn, values)
    if isinstance(x, TensorVar) and len(values) == 1 + (fn is isinstance) and (
            fn in (abs, len, isinstance, type)):
        if fn is abs:
            return out.op("abs", (x,))
        if fn is len and x.meta.ndim == 0:
            raise Unsupported("len() of a 0-d tensor (eager raises)")
        if fn is len:
            return ConstantVar(x.meta.sizes()[0])
        if fn is isinstance:
            return ConstantVar(issubclass(x.python_type, values[1]))
        return ObjectVar(x.python_type)
    if fn is len and isinstance(x, (tuple, list, dict)):
        return ConstantVar(len(x))
    if fn is isinstance and len(values) == 2:
        return ConstantVar(isinstance(x, values[1]))
    if fn in _TENSOR_TO_PYTHON:
        raise Unsupported(f"{name}() of a tensor reads its data into Python; not supported",
                          hint="keep the value a tensor (graph break)")
    raise Unsupported(f"builtin {name}() on tensors is not supported")
