"""What the interpreter asks of a NumPy array (an :class:`ArrayVar`): operators, attributes,
builtins, truth, iteration, and its rules in :mod:`kinds`.  Importing this module registers
them, and the ``np.*`` functions of :mod:`numpy_functions` and :mod:`numpy_shapes`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minicompile.capture import kinds, numpy_arrays, numpy_functions, numpy_shapes
from minicompile.capture.numpy_arrays import assign, getitem, numpy_dtype, rows, setitem
from minicompile.capture.variables import (
    ArrayVar, ConstantVar, MethodVar, ObjectVar, TensorVar, Var,
)
from minicompile.errors import Unsupported
from minicompile.runtime import values


# Python operators as the ufuncs NumPy's ndarray implements them with.
_BINARY = {
    "+": "add", "-": "subtract", "*": "multiply", "/": "divide", "//": "floor_divide",
    "%": "remainder", "**": "power", "&": "bitwise_and", "|": "bitwise_or",
    "^": "bitwise_xor", "<<": "left_shift", ">>": "right_shift", "==": "equal",
    "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}
_UNARY = {"-": "negative", "+": "positive", "~": "invert"}


def call(tx: kinds.Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """``fn(*args, **kwargs)`` for a callable of NumPy (``np.sum``, ``np.exp``, ``np.float32``)."""
    numpy_arrays.require_numpy_2()
    out = tx.output
    name = numpy_functions.public_name(fn)
    pos, kw = out.to_values(args, kwargs)
    short = name.removeprefix("numpy.")
    if isinstance(fn, np.ufunc):
        return numpy_functions.ufunc(out, fn, pos, kw)
    if isinstance(fn, type) and issubclass(fn, np.generic):
        return numpy_shapes.scalar_type(out, name, fn, pos, kw)
    if short in numpy_functions.FUNCTIONS and getattr(np, short, None) is fn:
        return out.from_value(numpy_functions.FUNCTIONS[short](out, name, pos, kw))
    if short in numpy_functions.FOLDED and getattr(np, short, None) is fn:
        return numpy_functions.fold(fn, name, pos, kw)
    raise Unsupported(f"{name} is not supported")


@kinds.call_method.register(ArrayVar)
def call_method(tx: kinds.Translator, arr: ArrayVar, name: str, args: list, kwargs: dict) -> Var:
    out = tx.output
    pos, kw = out.to_values(args, kwargs)
    method = numpy_functions.METHODS[name]
    return out.from_value(method(out, f"numpy.ndarray.{name}", (arr, *pos), kw))


@kinds.binary.register(ArrayVar)
def binary(tx: kinds.Translator, _: ArrayVar, symbol: str, a: Var, b: Var, inplace: bool) -> Var:
    """``a <symbol> b`` (``a <symbol>= b`` when ``inplace``) with a NumPy array on one side."""
    out = tx.output
    av, bv = out.to_value(a), out.to_value(b)
    if isinstance(av, TensorVar) or isinstance(bv, TensorVar):
        raise Unsupported(f"operator {symbol} between a NumPy array and a torch tensor is not "
                          "supported (graph break)")
    if symbol == "@":
        res = numpy_functions.matmul(out, "operator @", av, bv)
    elif symbol in _BINARY:
        res = numpy_functions.ufunc(out, getattr(np, _BINARY[symbol]), (av, bv))
    else:
        raise Unsupported(f"operator {symbol} on a NumPy array is not supported")
    if inplace and isinstance(av, ArrayVar) and not av.scalar:  # NumPy scalars are immutable
        return assign(out, av, res, f"operator {symbol}=")
    return res


@kinds.unary.register(ArrayVar)
def unary(tx: kinds.Translator, x: ArrayVar, symbol: str, fn: Any) -> ArrayVar:
    if symbol not in _UNARY:
        raise Unsupported(f"unary operator {symbol} on a NumPy array is not supported")
    return numpy_functions.ufunc(tx.output, getattr(np, _UNARY[symbol]), (x,))


@kinds.load_attr.register(ArrayVar)
def attribute(tx: kinds.Translator, arr: ArrayVar, name: str) -> Var:
    out, meta = tx.output, arr.tensor.meta
    if name in ("shape", "ndim", "size"):
        return out.from_value(numpy_shapes.metadata(out, f"numpy.ndarray.{name}", (arr,), {}))
    if name == "dtype":
        return ObjectVar(numpy_dtype(arr))
    if name == "itemsize":
        return ConstantVar(numpy_dtype(arr).itemsize)
    if name == "nbytes":
        return ConstantVar(math.prod(meta.sizes()) * numpy_dtype(arr).itemsize)
    if name == "T":
        return numpy_shapes.transpose(out, "numpy.ndarray.T", arr, None)
    if name in numpy_functions.METHODS:
        return MethodVar(arr, name)
    if name in ("item", "tolist", "tobytes", "__array__", "__float__", "__int__"):
        raise Unsupported(f"numpy.ndarray.{name}() reads the array's data into Python (graph "
                          "break)")
    raise Unsupported(f"numpy.ndarray.{name} is not supported")


def python_type(arr: ArrayVar) -> type:
    """What ``type(a)`` gives when the frame runs for real."""
    return numpy_dtype(arr).type if arr.scalar else np.ndarray


@kinds.builtin.register(ArrayVar)
def _builtin(out: kinds.Output, x: ArrayVar, fn: Any, values: list) -> Var:
    """A builtin called with a NumPy array first (``len(a)``, ``abs(a)``, ``isinstance``)."""
    if fn is len and len(values) == 1:
        if x.tensor.meta.ndim == 0:
            raise Unsupported("len() of a 0-d array (NumPy raises)", raises=True)
        return ConstantVar(x.tensor.meta.sizes()[0])
    if fn is abs and len(values) == 1:
        return numpy_functions.ufunc(out, np.absolute, (x,))
    if fn is isinstance and len(values) == 2:
        return ConstantVar(issubclass(python_type(x), values[1]))
    if fn is type and len(values) == 1:
        return ObjectVar(python_type(x))
    name = getattr(fn, "__name__", repr(fn))
    if fn in (bool, int, float, complex):
        raise Unsupported(f"{name}() of a NumPy array reads its data into Python (graph break)")
    raise Unsupported(f"builtin {name}() on a NumPy array is not supported")


@kinds.truthy.register(ArrayVar)
def _truthy(tx: kinds.Translator, arr: ArrayVar) -> bool:
    raise Unsupported("data-dependent branch: `if` on a NumPy array's value is not supported",
                      hint="use np.where")


kinds.iter_items.register(ArrayVar, rows)
kinds.subscript.register(ArrayVar, getitem)
kinds.store_item.register(ArrayVar, setitem)
kinds.to_value.register(ArrayVar, lambda out, arr: arr)
numpy_functions.check_tables()


@kinds.rebuild.register(ArrayVar)
def _rebuild(r: kinds.RebuildWriter, v: ArrayVar) -> str:
    """A NumPy array or scalar of the trace, made once (``a is b`` stays true), over the
    memory NumPy's would share (a view of an input array is a view of it)."""
    if v.source is not None:
        return v.source.expr
    if id(v) not in r.made:
        convert = values.to_scalar if v.scalar else values.to_numpy
        tensor = r.view_of_root(v.tensor, alias_ok=True)
        if tensor is None and v.tensor.base is not None and r.out.at_break:
            raise Unsupported("a view of a NumPy array that leaves the graph as a copy "
                              "(a[::-1], or on a GPU) is live at a graph break")
        tensor = tensor or r.output(v.tensor.node)
        r.made[id(v)] = r.temp(f"{r.g.ref(convert, convert.__name__)}({tensor})")
    return r.made[id(v)]
