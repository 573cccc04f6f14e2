"""NumPy functions under compile: ``np.*`` calls and ndarray methods as torch graph ops.

NumPy itself says at trace time what each result is (``ufunc.resolve_dtypes``, or a run on
small samples); integer ``//`` and ``%`` by zero give 0, as in NumPy.  Any other NumPy
callable is a graph break naming it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from minicompile.capture import externs, torch_ops
from minicompile.capture.kinds import Output, registrar
from minicompile.capture.numpy_arrays import (
    as_array, cast, copy, full, numpy_dtype, operand, result, torch_dtype,
)
from minicompile.capture.torch_ops import parse
from minicompile.capture.variables import (
    ArrayVar, ConstantVar, ObjectVar, TensorVar, Var, python_type_of, specialized,
)
from minicompile.errors import Unsupported


Handler = Callable[["Output", str, tuple, dict], Any]
FUNCTIONS: dict[str, Handler] = {}  # name in the numpy namespace -> handler
METHODS: dict[str, Handler] = {}  # ndarray method -> handler (the array first)

# NumPy's ufuncs by the torch function of the same name, then the renamed ones.
UNARY_UFUNCS: dict[str, Any] = {n: getattr(torch, n) for n in """sign exp exp2 expm1 log
    log2 log10 log1p sqrt square reciprocal sin cos tan sinh cosh tanh deg2rad rad2deg floor
    ceil trunc logical_not isnan isinf isfinite signbit""".split()} | {
    "negative": torch.neg, "positive": torch.clone, "absolute": torch.abs, "fabs": torch.abs,
    "arcsin": torch.asin, "arccos": torch.acos, "arctan": torch.atan, "arcsinh": torch.asinh,
    "arccosh": torch.acosh, "arctanh": torch.atanh, "radians": torch.deg2rad,
    "degrees": torch.rad2deg, "rint": torch.round, "invert": torch.bitwise_not}
BINARY_UFUNCS: dict[str, Any] = {n: getattr(torch, n) for n in """add remainder fmod maximum
    minimum fmax fmin hypot copysign logaddexp logaddexp2 logical_and logical_or logical_xor
    bitwise_and bitwise_or bitwise_xor floor_divide""".split()} | {
    "subtract": torch.sub, "multiply": torch.mul, "divide": torch.true_divide,
    "power": torch.pow, "float_power": torch.pow, "arctan2": torch.atan2, "equal": torch.eq,
    "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le, "greater": torch.gt,
    "greater_equal": torch.ge, "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift}
# torch ops that take a Python number on either side; the others get 0-d tensors.
_NUMBERS_OK = frozenset({
    torch.add, torch.sub, torch.mul, torch.true_divide, torch.floor_divide, torch.remainder,
    torch.pow, torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.logical_and,
    torch.logical_or, torch.logical_xor, torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor})
_INTEGER_DIVISIONS = frozenset({"floor_divide", "remainder", "fmod"})
# Functions of Python values that answer questions about dtypes: folded while tracing.
FOLDED = ("dtype", "issubdtype", "result_type", "promote_types", "can_cast", "finfo", "iinfo")


function = registrar(FUNCTIONS)  # @function(*names): the handler of np.<name>
method = registrar(METHODS)  # @method(*names): of ndarray.<name>, the array first


# -- dispatch --------------------------------------------------------------------------------


def public_name(fn: Any) -> str:
    """``numpy.linalg.svd``: where the NumPy callable ``fn`` is found."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    for prefix, ns in (("numpy", np), ("numpy.linalg", np.linalg), ("numpy.fft", np.fft),
                       ("numpy.random", np.random)):
        if getattr(ns, name, None) is fn:
            return f"{prefix}.{name}"
    module = getattr(fn, "__module__", None) or "numpy"
    return f"{module}.{getattr(fn, '__qualname__', name)}"


def fold(fn: Any, name: str, args: tuple, kwargs: dict) -> Var:
    values = [numpy_dtype(a) if isinstance(a, ArrayVar) else a for a in args]
    if any(isinstance(v, TensorVar) for v in (*values, *kwargs.values())):
        raise Unsupported(f"{name}() of a torch tensor is not supported")
    value = sample(name, fn, *specialized(values), **kwargs)
    return ConstantVar(value) if type(value) in (bool, int, float, str) else ObjectVar(value)


def sample(fname: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run by NumPy now (on samples); what NumPy raises is
    Unsupported, so the frame runs eagerly and NumPy raises it."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Exception as e:
        raise Unsupported(f"{fname}: NumPy raises {type(e).__name__}: {e}", raises=True) from e


def _sample_of(v: Any) -> Any:
    """An argument's stand-in for :func:`sample`: arrays as ones of their dtype and rank."""
    if isinstance(v, ArrayVar):
        return np.ones((1,) * v.tensor.meta.ndim, numpy_dtype(v))
    return python_type_of(v)


def _torch(out: Output, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as torch graph ops (as capture does for torch code, without
    autocast: NumPy's dtypes are not autocast's)."""
    if fn in torch_ops.FUNCTIONS:
        fname, handler = torch_ops.FUNCTIONS[fn]
        return handler(out, fname, args, kwargs)
    return externs.call_function(out, fn, args, kwargs)


def _result_dtype(values: list) -> np.dtype:
    """``np.result_type`` of arrays and Python numbers (weak, as in NumPy 2)."""
    return np.result_type(*(numpy_dtype(v) if isinstance(v, ArrayVar) else python_type_of(v)
                            for v in values))


# -- ufuncs ----------------------------------------------------------------------------------


def ufunc(out: Output, uf: Any, args: tuple, kwargs: dict | None = None) -> ArrayVar:
    """``uf(*args)`` with NumPy's loop dtypes (see the module doc)."""
    name = uf.__name__
    fname = f"numpy.{name}"
    if name == "matmul" and not kwargs and len(args) == 2:
        return matmul(out, fname, *args)
    fn = UNARY_UFUNCS.get(name) or BINARY_UFUNCS.get(name)
    if fn is None:
        raise Unsupported(f"{fname} is not supported")
    if kwargs:
        raise Unsupported(f"{fname}() with keyword arguments ({', '.join(kwargs)}) is not "
                          "supported")
    if len(args) != uf.nin:
        raise Unsupported(f"{fname}() with {len(args)} arguments (out arguments) is not "
                          "supported")
    ops = [operand(out, fname, a) for a in args]
    if not any(isinstance(v, ArrayVar) for v in ops):  # np.exp(1.0): a NumPy scalar
        ops[0] = ArrayVar(full(out, ops[0], _result_dtype([ops[0]])), scalar=True)
    types = tuple(numpy_dtype(v) if isinstance(v, ArrayVar) else
                  (np.dtype(bool) if type(v) is bool else type(python_type_of(v))) for v in ops)
    sample(fname, uf, *(np.ones((), t) if isinstance(v, ArrayVar) else python_type_of(v)
                        for v, t in zip(ops, types)))  # NumPy's own checks (value ranges)
    loop = sample(fname, uf.resolve_dtypes, types + (None,) * uf.nout)
    ins, res_dtype = loop[: uf.nin], loop[uf.nin]
    if (any(isinstance(v, torch.SymInt) for v in ops) and res_dtype.kind in "iu"
            and res_dtype.itemsize < 8):
        raise Unsupported(f"{fname}(): a dynamic size with a {res_dtype} array")
    if ins[0].kind in "biu" and (name == "reciprocal" or (
        name == "power" and isinstance(ops[1], ArrayVar)
    )):
        raise Unsupported(f"{fname}() of integers with an array exponent or reciprocal: NumPy "
                          "raises for negative values")
    targs = [cast(out, v.tensor, torch_dtype(t)) if isinstance(v, ArrayVar)
             else v if fn in _NUMBERS_OK else full(out, v, t) for v, t in zip(ops, ins)]
    if name in _INTEGER_DIVISIONS and ins[1].kind in "biu":
        res = _integer_division(out, fn, *targs)
    elif name == "sign" and ins[0].kind == "f":  # NaN keeps its sign (torch: 0)
        res = _torch(out, torch.where, _torch(out, torch.isnan, targs[0]), targs[0],
                     _torch(out, torch.sign, targs[0]))
    else:
        res = _torch(out, fn, *targs)
    return result(out, res, res_dtype, scalar=True)


def _integer_division(out: Output, fn: Any, a: Any, b: Any) -> TensorVar:
    """Integer ``//``, ``%``, fmod: 0 where the divisor is 0, as NumPy gives (with a
    warning), never the hardware's trap."""
    if not isinstance(b, TensorVar):
        if b == 0:
            return _torch(out, torch.zeros_like, a)
        return _torch(out, fn, a, b)
    zero = _torch(out, torch.eq, b, 0)
    safe = _torch(out, torch.where, zero, 1, b)
    return _torch(out, torch.where, zero, 0, _torch(out, fn, a, safe))


def matmul(out: Output, fname: str, a: Any, b: Any) -> ArrayVar:
    a, b = operand(out, fname, a), operand(out, fname, b)
    if (not isinstance(a, ArrayVar) or not isinstance(b, ArrayVar)
            or a.tensor.meta.ndim == 0 or b.tensor.meta.ndim == 0):
        raise Unsupported(f"{fname}: an operand has no dimensions (NumPy raises)", raises=True)
    dtype = _result_dtype([a, b])
    if dtype.kind == "b" or (dtype.kind in "iu" and a.tensor.meta.device.type != "cpu"):
        raise Unsupported(f"{fname} of {dtype} arrays is not supported here (no such "
                          "library kernel)")
    td = torch_dtype(dtype)
    res = _torch(out, torch.matmul, cast(out, a.tensor, td), cast(out, b.tensor, td))
    return result(out, res, dtype, scalar=True)


@function("dot")
@method("dot")
def _dot(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, b = parse(fname, args, kwargs, ("a", "b"))
    a, b = as_array(out, fname, a), as_array(out, fname, b)
    if a.tensor.meta.ndim == 0 or b.tensor.meta.ndim == 0:
        return ufunc(out, np.multiply, (a, b))
    if a.tensor.meta.ndim > 2 or b.tensor.meta.ndim > 2:
        raise Unsupported(f"{fname} of arrays with more than 2 dimensions is not supported")
    return matmul(out, fname, a, b)


@function("matmul")
def _matmul(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, b = parse(fname, args, kwargs, ("x1", "x2"))
    return matmul(out, fname, a, b)


@function("where")
def _where(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    if len(args) + len(kwargs) == 1:
        raise Unsupported(f"{fname}(condition) has a data-dependent shape; not supported")
    cond, x, y = parse(fname, args, kwargs, ("condition", "x", "y"))
    cond = as_array(out, fname, cond)
    x, y = operand(out, fname, x), operand(out, fname, y)
    dtype = _result_dtype([x, y])
    td = torch_dtype(dtype)
    branches = [cast(out, v.tensor, td) if isinstance(v, ArrayVar) else v for v in (x, y)]
    if not any(isinstance(v, TensorVar) for v in branches):
        branches[0] = full(out, branches[0], dtype)
    res = _torch(out, torch.where, cast(out, cond.tensor, torch.bool), *branches)
    return result(out, res, dtype, scalar=False)  # np.where always returns an ndarray


@function("clip")
@method("clip")
def _clip(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    kwargs = {{"min": "a_min", "max": "a_max"}.get(k, k): v for k, v in kwargs.items()}
    a, lo, hi = parse(fname, args, kwargs, ("a", "a_min", "a_max"), a_min=None, a_max=None)
    a = as_array(out, fname, a)
    lo, hi = (None if v is None else operand(out, fname, v) for v in (lo, hi))
    s = sample(fname, np.clip, *(_sample_of(v) if v is not None else None for v in (a, lo, hi)))
    td = torch_dtype(s.dtype)
    lo, hi = (cast(out, v.tensor, td) if isinstance(v, ArrayVar) else v for v in (lo, hi))
    res = torch_ops.clamp(out, fname, cast(out, a.tensor, td), lo, hi)
    return result(out, res, s.dtype, scalar=not isinstance(s, np.ndarray))


@function("round", "around")
@method("round")
def _round(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, decimals = parse(fname, args, kwargs, ("a", "decimals"), decimals=0)
    a = as_array(out, fname, a)
    if type(decimals) is not int:
        raise Unsupported(f"{fname}(decimals=...) must be a Python int here")
    s = sample(fname, np.round, _sample_of(a), decimals)
    if numpy_dtype(a).kind != "f":
        if decimals < 0:
            raise Unsupported(f"{fname}() of integers with negative decimals is not supported")
        res = copy(out, a.tensor)
    elif decimals:
        res = out.extern(torch.round, (a.tensor,), {"decimals": decimals})
    else:
        res = _torch(out, torch.round, a.tensor)
    return result(out, res, s.dtype, scalar=not isinstance(s, np.ndarray))


# -- reductions ------------------------------------------------------------------------------


_EXTREMES = {"max": torch.amax, "amax": torch.amax, "min": torch.amin, "amin": torch.amin}
# The reductions by name: their parameters after ``a`` and ``axis``.
_REDUCTIONS = {**dict.fromkeys(("sum", "prod", "mean"), ("dtype", "keepdims")),
               **dict.fromkeys(("std", "var"), ("dtype", "ddof", "keepdims")),
               **dict.fromkeys(("cumsum", "cumprod"), ("dtype",)),
               **dict.fromkeys(("max", "min", "amax", "amin", "argmax", "argmin", "any",
                                "all"), ("keepdims",))}


@function(*_REDUCTIONS)
@method(*(name for name in _REDUCTIONS if name not in ("amax", "amin")))
def reduce(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    """``np.<name>(a, axis, ...)`` for the reductions of :data:`_REDUCTIONS`."""
    name = fname.rpartition(".")[2]
    names = ("a", "axis", *_REDUCTIONS[name])
    options = dict(zip(names, parse(fname, args, kwargs, names, axis=None, dtype=None, ddof=0,
                                    keepdims=False)))
    axis, keepdims = options.pop("axis"), options.pop("keepdims", False)
    if type(options.get("ddof", 0)) not in (int, float):
        raise Unsupported(f"{fname}(ddof=...) must be a Python number here")
    if name.startswith("cum") and axis is not None and type(axis) is not int:
        raise Unsupported(f"{fname}(axis=...) must be an int")
    a = as_array(out, fname, options.pop("a"))
    x, ndim = a.tensor, a.tensor.meta.ndim
    if type(keepdims) is not bool:
        raise Unsupported(f"{fname}(keepdims=...) must be a Python bool here")
    given = {k: v for k, v in options.items() if v is not None}
    if not name.startswith("cum"):
        given["keepdims"] = keepdims
    s = sample(fname, getattr(np, name), _sample_of(a), axis=axis, **given)
    dtype, scalar = np.asarray(s).dtype, not isinstance(s, np.ndarray)
    td = torch_dtype(dtype)
    if axis == () and ndim:
        raise Unsupported(f"{fname}(axis=()) is not supported")
    dims = tuple(range(ndim)) if axis is None else (
        (axis,) if isinstance(axis, int) else tuple(axis))
    shape = x.meta.shape
    if name in ("max", "min", "amax", "amin", "argmax", "argmin") and any(
        shape[d].is_Integer and int(shape[d]) == 0 for d in dims):
        raise Unsupported(f"{fname}: zero-size array to a reduction without identity (NumPy "
                          "raises)", raises=True)
    if name in ("sum", "prod", "cumsum", "cumprod"):
        x = cast(out, x, td)
    if name == "sum":
        res = _torch(out, torch.sum, x, dims, keepdims, dtype=td)
    elif name == "prod":
        res = x
        for d in sorted((d % max(ndim, 1) for d in dims), reverse=True) if ndim else (None,):
            res = (_torch(out, torch.prod, res, d, keepdims, dtype=td) if d is not None
                   else _torch(out, torch.prod, res, dtype=td))
    elif name == "mean":
        res = _torch(out, torch.mean, cast(out, x, td), dims, keepdims)
    elif name in ("std", "var"):
        res = _torch(out, getattr(torch, name), cast(out, x, td), dims,
                     correction=options["ddof"] or 0, keepdim=keepdims)
    elif name in _EXTREMES:
        res = _torch(out, _EXTREMES[name], x, dims, keepdims)
    elif name in ("argmax", "argmin"):
        fn = getattr(torch, name)
        if axis is None:
            res = _torch(out, fn, x)
            if keepdims:
                res = _torch(out, torch.reshape, res, (1,) * ndim)
        else:
            res = _torch(out, fn, x, axis, keepdims)
    elif name in ("any", "all"):
        res = _torch(out, getattr(torch, name), cast(out, x, torch.bool), dims, keepdims)
    else:  # cumsum, cumprod
        if axis is None:
            x, axis = _torch(out, torch.reshape, x, (-1,)), 0
        res = _torch(out, getattr(torch, name), x, axis, dtype=td)
    return result(out, res, dtype, scalar)


def check_tables() -> None:
    """Every registered name exists in this NumPy (a typo would be a silent gap); run once
    every provider has registered (numpy_kind.py)."""
    for name in FUNCTIONS:
        if not hasattr(np, name):
            raise AssertionError(f"numpy.{name} is not in NumPy {np.__version__}")
