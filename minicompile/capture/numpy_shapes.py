"""NumPy functions that make arrays or change their shape, as torch graph ops:
``reshape``, ``transpose``, ``concatenate``, ``stack``... (views where NumPy's are views),
and ``zeros``, ``arange``, ``linspace``, ``array``, ``astype``... (float64 unless a dtype
says otherwise, placed on the default device).  Registered in :mod:`numpy_functions`'
tables; the dtype of a result is NumPy's own answer (``np.result_type``, a sample run).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from minicompile.capture.kinds import Output
from minicompile.capture.numpy_arrays import (
    array_device, as_array, cast, copy, full, numpy_dtype, result, torch_dtype,
)
from minicompile.capture.numpy_functions import _result_dtype, _torch, function, method, sample
from minicompile.capture.torch_ops import parse
from minicompile.capture.variables import ArrayVar, ConstantVar, TupleVar, python_type_of
from minicompile.errors import Unsupported


# -- shapes ----------------------------------------------------------------------------------


def _sizes(fname: str, shape: Any) -> tuple:
    if isinstance(shape, (int, torch.SymInt)) and type(shape) is not bool:
        return (shape,)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, (int, torch.SymInt))
                                                and type(s) is not bool for s in shape):
        return tuple(shape)
    raise Unsupported(f"{fname}(): a shape must be ints here, got {shape!r}")


def reshape(out: Output, fname: str, a: Any, shape: Any, order: Any = "C") -> ArrayVar:
    if order != "C":
        raise Unsupported(f"{fname}(order={order!r}) is not supported")
    a = as_array(out, fname, a)
    return ArrayVar(_torch(out, torch.reshape, a.tensor, _sizes(fname, shape)))


@function("reshape")
def _reshape(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    kwargs = {"shape" if k == "newshape" else k: v for k, v in kwargs.items()}
    a, shape, order = parse(fname, args, kwargs, ("a", "shape", "order"), order="C")
    return reshape(out, fname, a, shape, order)


@method("reshape")
def _reshape_method(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    order = kwargs.pop("order", "C")
    shape = args[1:] if len(args) != 2 else args[1]
    if "shape" in kwargs and len(args) == 1:
        shape = kwargs.pop("shape")
    parse(fname, (), kwargs, ())
    return reshape(out, fname, args[0], shape, order)


@function("ravel")
@method("ravel", "flatten")
def _ravel(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, order = parse(fname, args, kwargs, ("a", "order"), order="C")
    flat = reshape(out, fname, a, (-1,), order)
    return ArrayVar(copy(out, flat.tensor)) if fname.endswith("flatten") else flat


def transpose(out: Output, fname: str, a: Any, axes: Any) -> ArrayVar:
    a = as_array(out, fname, a)
    ndim = a.tensor.meta.ndim
    axes = tuple(reversed(range(ndim))) if axes is None else _sizes(fname, axes)
    return ArrayVar(_torch(out, torch.permute, a.tensor, axes))


@function("transpose", "permute_dims")
def _transpose(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, axes = parse(fname, args, kwargs, ("a", "axes"), axes=None)
    return transpose(out, fname, a, axes)


@method("transpose")
def _transpose_method(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    parse(fname, (), kwargs, ())
    axes = args[1:] if len(args) != 2 else args[1]
    return transpose(out, fname, args[0], axes if axes != () else None)


@function("swapaxes")
@method("swapaxes")
def _swapaxes(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, d1, d2 = parse(fname, args, kwargs, ("a", "axis1", "axis2"))
    return ArrayVar(_torch(out, torch.transpose, as_array(out, fname, a).tensor, d1, d2))


@function("moveaxis")
def _moveaxis(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, src, dst = parse(fname, args, kwargs, ("a", "source", "destination"))
    return ArrayVar(_torch(out, torch.movedim, as_array(out, fname, a).tensor, src, dst))


@function("expand_dims")
def _expand_dims(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, axis = parse(fname, args, kwargs, ("a", "axis"))
    a = as_array(out, fname, a)
    axes = _sizes(fname, axis)
    n = a.tensor.meta.ndim + len(axes)
    if any(not -n <= d < n for d in axes) or len({d % n for d in axes}) != len(axes):
        raise Unsupported(f"{fname}: axis {axis} out of range or repeated (NumPy raises)",
                          raises=True)
    x = a.tensor
    for d in sorted(d % n for d in axes):
        x = _torch(out, torch.unsqueeze, x, d)
    return ArrayVar(x)


@function("squeeze")
@method("squeeze")
def _squeeze(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, axis = parse(fname, args, kwargs, ("a", "axis"), axis=None)
    a = as_array(out, fname, a)
    shape = a.tensor.meta.shape
    n = len(shape)
    if axis is None:
        dims = [d for d, s in enumerate(shape) if s == 1]
    else:
        dims = [d % max(n, 1) for d in _sizes(fname, axis)]
        if any(d >= n or shape[d] != 1 for d in dims):
            raise Unsupported(f"{fname}: cannot select an axis to squeeze out which has size "
                              "not equal to one (NumPy raises)", raises=True)
    x = a.tensor
    for d in sorted(set(dims), reverse=True):
        x = _torch(out, torch.squeeze, x, d)
    return ArrayVar(x if x is not a.tensor else _torch(out, torch.reshape, x, tuple(
        a.tensor.meta.sizes())))


@function("broadcast_to")
def _broadcast_to(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, shape = parse(fname, args, kwargs, ("array", "shape"))
    a = as_array(out, fname, a)
    return ArrayVar(_torch(out, torch.broadcast_to, a.tensor, _sizes(fname, shape)))


def _joined(out: Output, fname: str, args: tuple, kwargs: dict) -> tuple[list, Any]:
    """The tensors ``np.concatenate`` / ``np.stack`` join (cast to the result's dtype), and
    the axis."""
    seq, axis, dtype = parse(fname, args, kwargs, ("arrays", "axis", "dtype"), axis=0, dtype=None)
    if not isinstance(seq, (tuple, list)) or not seq:
        raise Unsupported(f"{fname}() needs a non-empty sequence of arrays here")
    arrays = [as_array(out, fname, a) for a in seq]
    td = torch_dtype(np.dtype(dtype) if dtype is not None else _result_dtype(arrays))
    return [cast(out, a.tensor, td) for a in arrays], axis


@function("concatenate", "concat")
def _concatenate(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    tensors, axis = _joined(out, fname, args, kwargs)
    if axis is None:
        tensors, axis = [_torch(out, torch.reshape, t, (-1,)) for t in tensors], 0
    elif any(t.meta.ndim == 0 for t in tensors):
        raise Unsupported(f"{fname}: zero-dimensional arrays cannot be concatenated (NumPy "
                          "raises)", raises=True)
    return ArrayVar(_torch(out, torch.cat, tensors, axis))


@function("stack")
def _stack(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    tensors, axis = _joined(out, fname, args, kwargs)
    return ArrayVar(_torch(out, torch.stack, tensors, axis))


@function("shape", "ndim", "size")
def metadata(out: Output, fname: str, args: tuple, kwargs: dict) -> Any:
    (a,) = parse(fname, args, kwargs, ("a",))
    sizes = as_array(out, fname, a).tensor.meta.sizes()
    name = fname.rpartition(".")[2]
    if name == "shape":
        return TupleVar(tuple(ConstantVar(s) for s in sizes))
    return len(sizes) if name == "ndim" else math.prod(sizes)


# -- making arrays ---------------------------------------------------------------------------


def _filled(out: Output, sizes: tuple, value: Any, dtype: np.dtype) -> ArrayVar:
    return ArrayVar(_torch(out, torch.full, sizes, value, dtype=torch_dtype(dtype),
                           device=array_device(out)))


def _fill_value(fname: str, value: Any, dtype: np.dtype) -> Any:
    """A fill value converted to ``dtype`` the way NumPy converts it."""
    if isinstance(value, torch.SymInt) and dtype.kind in "iuf":
        return value
    if type(value) not in (bool, int, float):
        raise Unsupported(f"{fname}(): a fill value of type {type(value).__name__} is not "
                          "supported")
    return sample(fname, lambda: np.array(value, dtype=dtype).item())


@function("zeros", "ones", "empty", "full")
def _full(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    full = fname.endswith("full")
    names = ("shape", "fill_value", "dtype", "order") if full else ("shape", "dtype", "order")
    shape, *value, dtype, _ = parse(fname, args, kwargs, names, dtype=None, order="C")
    value = value[0] if full else int(fname.endswith("ones"))  # (np.empty's: unspecified)
    dt = (np.dtype(dtype) if dtype is not None else _result_dtype([value]) if full
          else np.dtype(float))
    return _filled(out, _sizes(fname, shape), _fill_value(fname, value, dt), dt)


@function("zeros_like", "ones_like", "empty_like", "full_like")
def _like(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    name = fname.rpartition(".")[2]
    names = ("a", "fill_value", "dtype", "order", "subok", "shape") if name == "full_like" \
        else ("a", "dtype", "order", "subok", "shape")
    bound = dict(zip(names, parse(fname, args, kwargs, names, dtype=None, order="K",
                                  subok=True, shape=None)))
    a = as_array(out, fname, bound["a"])
    dt = np.dtype(bound["dtype"]) if bound["dtype"] is not None else numpy_dtype(a)
    value = bound.get("fill_value", 1 if name == "ones_like" else 0)
    sizes = a.tensor.meta.sizes() if bound["shape"] is None else _sizes(fname, bound["shape"])
    return _filled(out, tuple(sizes), _fill_value(fname, value, dt), dt)


@function("arange")
def _arange(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    start, stop, step, dtype = parse(fname, args, kwargs, ("start", "stop", "step", "dtype"),
                                     stop=None, step=None, dtype=None)
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    values = (start, stop, step)
    if any(type(python_type_of(v)) not in (int, float) for v in values):
        raise Unsupported(f"{fname}() takes Python numbers here")
    floating = any(type(python_type_of(v)) is float for v in values)
    dt = np.dtype(dtype) if dtype is not None else np.dtype(float if floating else np.int64)
    if dt.kind not in "iuf" or (floating and dt.kind != "f"):
        raise Unsupported(f"{fname}() with dtype {dt} and these bounds is not supported")
    if step == 0:
        raise Unsupported(f"{fname}(): step 0 (NumPy raises)", raises=True)
    return ArrayVar(_torch(out, torch.arange, start, stop, step, dtype=torch_dtype(dt),
                           device=array_device(out)))


@function("linspace")
def _linspace(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    """``start + i * step``, the last one ``stop``: NumPy's own formula."""
    start, stop, num, endpoint, retstep, dtype, axis = parse(
        fname, args, kwargs, ("start", "stop", "num", "endpoint", "retstep", "dtype", "axis"),
        num=50, endpoint=True, retstep=False, dtype=None, axis=0)
    if any(type(v) not in (int, float) for v in (start, stop)) or type(num) is not int:
        raise Unsupported(f"{fname}() takes Python numbers here")
    if retstep or axis != 0 or num < 0:
        raise Unsupported(f"{fname}(retstep/axis/negative num) is not supported")
    dt = np.dtype(float if dtype is None else dtype)
    if dt.kind != "f":
        raise Unsupported(f"{fname}(dtype={dt}) is not supported")
    div = num - 1 if endpoint else num
    delta = float(stop) - float(start)
    step = delta / div if div > 0 else delta
    index = _torch(out, torch.arange, num, dtype=torch.float64, device=array_device(out))
    y = _torch(out, torch.add, _torch(out, torch.mul, index, step), float(start))
    if endpoint and num > 1:
        y = _torch(out, torch.where, _torch(out, torch.eq, index, num - 1), float(stop), y)
    return result(out, y, dt, scalar=False)


@function("eye", "identity")
def _eye(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    if fname.endswith("identity"):
        n, dtype = parse(fname, args, kwargs, ("n", "dtype"), dtype=None)
        m, k = n, 0
    else:
        n, m, k, dtype = parse(fname, args, kwargs, ("N", "M", "k", "dtype"), M=None, k=0,
                               dtype=None)
    if k != 0:
        raise Unsupported(f"{fname}(k={k}) is not supported")
    dt = np.dtype(float if dtype is None else dtype)
    return ArrayVar(_torch(out, torch.eye, n, n if m is None else m, dtype=torch_dtype(dt),
                           device=array_device(out)))


@function("array", "asarray", "asanyarray", "copy")
def _array(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    kwargs = {"object" if k == "a" else k: v for k, v in kwargs.items()}
    obj, dtype, copy_arg = parse(fname, args, kwargs, ("object", "dtype", "copy"), dtype=None,
                                 copy=None)
    name = fname.rpartition(".")[2]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(a, ArrayVar) for a in obj):
        return _stack(out, fname, (obj,), {"dtype": dtype})
    if not isinstance(obj, ArrayVar):
        arr = as_array(out, fname, obj)
        return arr if dtype is None else astype(out, fname, arr, dtype, copy_arg=False)
    may_share = name in ("asarray", "asanyarray") and copy_arg is not True or copy_arg is False
    if may_share and not obj.scalar and (dtype is None or np.dtype(dtype) == numpy_dtype(obj)):
        return obj
    arr = astype(out, fname, obj, numpy_dtype(obj) if dtype is None else dtype, copy_arg=True)
    return ArrayVar(arr.tensor)  # an array, also of a NumPy scalar


def astype(out: Output, fname: str, a: ArrayVar, dtype: Any, copy_arg: Any = True) -> ArrayVar:
    t = cast(out, a.tensor, torch_dtype(dtype))
    if t is a.tensor:
        if copy_arg is False:
            return a
        t = copy(out, t)
    return ArrayVar(t, a.scalar)


@function("astype")
@method("astype")
def _astype(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, dtype, order, casting, subok, copy_arg = parse(
        fname, args, kwargs, ("a", "dtype", "order", "casting", "subok", "copy"), order="K",
        casting="unsafe", subok=True, copy=True)
    a = as_array(out, fname, a)
    if casting != "unsafe" and not np.can_cast(numpy_dtype(a), np.dtype(dtype), casting):
        raise Unsupported(f"{fname}: cannot cast with casting={casting!r} (NumPy raises)",
                          raises=True)
    return astype(out, fname, a, dtype, copy_arg)


@method("copy")
def _copy_method(out: Output, fname: str, args: tuple, kwargs: dict) -> ArrayVar:
    a, order = parse(fname, args, kwargs, ("a", "order"), order="C")
    return ArrayVar(copy(out, a.tensor), a.scalar)


def scalar_type(out: Output, fname: str, cls: type, args: tuple, kwargs: dict) -> ArrayVar:
    """``np.float32(x)``: a NumPy scalar of a number, or an array (a scalar if 0-d) cast."""
    dt = np.dtype(cls)
    torch_dtype(dt)
    if kwargs or len(args) > 1:
        raise Unsupported(f"{fname}() with these arguments is not supported")
    value = args[0] if args else 0
    if isinstance(value, ArrayVar):
        cast_ = astype(out, fname, value, dt)
        return ArrayVar(cast_.tensor, scalar=value.tensor.meta.ndim == 0)
    if type(value) not in (bool, int, float):
        raise Unsupported(f"{fname}() of {type(value).__name__} is not supported")
    return ArrayVar(full(out, sample(fname, lambda: cls(value).item()), dt), scalar=True)
