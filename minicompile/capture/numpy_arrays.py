"""NumPy arrays under compile (as in PyTorch 2.1): an ndarray traced as a tensor with
NumPy's semantics (NEP 50 dtype rules at trace time).

An input array is a placeholder fed by ``torch.from_numpy``, guarded on type, dtype,
writability, sizes and strides; results are rebuilt as arrays or NumPy scalars.  NumPy 1.x,
object or complex arrays, negative strides and arrays mixed with tensors are Unsupported.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch

from minicompile.capture import mutation
from minicompile.capture.kinds import Output, Translator
from minicompile.runtime.values import shares_no_memory, to_tensor
from minicompile.capture.variables import ArrayVar, ConstantVar, Source, TensorVar, Var, leaves
from minicompile.errors import Unsupported


_DTYPES: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool, np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64, np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
_NUMPY_DTYPES = {t: d for d, t in _DTYPES.items()}
_NUMPY_2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


# -- dtypes ----------------------------------------------------------------------------------


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a NumPy dtype (or anything ``np.dtype`` takes: ``np.float32``,
    ``float``, ``"int64"``)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise Unsupported(f"{dtype!r} is not a NumPy dtype (NumPy raises)", raises=True) from e
    if dt not in _DTYPES or not dt.isnative:
        raise Unsupported(f"NumPy arrays of dtype {dt} are not supported under compile")
    return _DTYPES[dt]


def numpy_dtype(value: ArrayVar | TensorVar | torch.dtype) -> np.dtype:
    if isinstance(value, ArrayVar):
        value = value.tensor
    dtype = value.meta.dtype if isinstance(value, TensorVar) else value
    if dtype not in _NUMPY_DTYPES:
        raise Unsupported(f"a {dtype} tensor has no NumPy dtype (eager raises)")
    return _NUMPY_DTYPES[dtype]


def require_numpy_2() -> None:
    if not _NUMPY_2:
        raise Unsupported(f"NumPy {np.__version__}: only NumPy 2's promotion rules are "
                          "modelled under compile")


# -- the frame's arrays in, the graph's arrays out -------------------------------------------


def array_device(out: Output) -> torch.device:
    """Where arrays are computed: the default device, which the entry is guarded on."""
    device = torch.get_default_device()
    out.guards.global_call(torch.get_default_device, (), {}, device)
    return device


def wrap_input(out: Output, value: Any, source: Source | None) -> ArrayVar:
    """The tracker of a NumPy array or scalar read from the frame at ``source``."""
    require_numpy_2()
    if source is None:
        raise Unsupported("a NumPy array reached without a source (e.g. a default value)")
    scalar = isinstance(value, np.generic)
    if not scalar and type(value) is not np.ndarray:
        raise Unsupported(f"NumPy array subclass {type(value).__name__} is not supported")
    torch_dtype(value.dtype)
    if not scalar and any(s < 0 or s % value.itemsize for s in value.strides):
        raise Unsupported("a NumPy array with negative or unaligned strides is not supported "
                          "(torch.from_numpy cannot read it)")
    t = to_tensor(value)
    meta, _ = out.input_meta(t, source)
    device = array_device(out)
    where = "" if device.type == "cpu" else f", {out.guards.ref(device, 'dev')}"
    if where:
        meta = dataclasses.replace(meta, device=device)
    expr = f"{out.guards.ref(to_tensor, 'to_tensor')}({source.expr}{where})"
    out.guards.array_match(source, value, meta, scalar)
    var = out.add_input(t, source, meta, expr)
    out.array_inputs[id(var)] = value
    return ArrayVar(var, scalar, source=source)


def check_mutated_inputs(out: Output) -> None:
    """Input arrays mutated in place: read-only ones make NumPy raise; ones that may share
    memory with another input array are refused now and guarded for later calls (the graph
    treats inputs as independent)."""
    arrays = [(v, out.array_inputs[id(v)]) for v in out.input_vars if id(v) in out.array_inputs
              and isinstance(out.array_inputs[id(v)], np.ndarray)]
    mutated = [(v, a) for v, a in arrays if id(v) in out.mutated_inputs]
    for v, a in mutated:
        if not a.flags.writeable:
            raise Unsupported(f"{v.source.name}: assignment destination is read-only "
                              "(NumPy raises)", raises=True)
    for v, a in mutated:
        others = [(w, b) for w, b in arrays if w is not v]
        if not others:
            continue
        if any(np.may_share_memory(a, b) for _, b in others):
            raise Unsupported(f"{v.source.name} is mutated in place and may share memory with "
                              "another input array")
        exprs = ", ".join(w.source.expr for w, _ in others)
        check = f"{out.guards.ref(shares_no_memory, 'shares_no_memory')}({v.source.expr}, " \
                f"({exprs},))"
        out.guards.add(v.source.name, "shares no memory", check, check, True)


# -- making values ---------------------------------------------------------------------------


def cast(out: Output, t: TensorVar, dtype: torch.dtype) -> TensorVar:
    return t if t.meta.dtype == dtype else out.op("to_dtype", (t,), {"dtype": dtype})


def copy(out: Output, t: TensorVar) -> TensorVar:
    """A new tensor with ``t``'s values (NumPy's copies are never views)."""
    return out.extern(torch.clone, (t,), {})


def result(out: Output, t: TensorVar, dtype: np.dtype, scalar: bool) -> ArrayVar:
    """``t`` as a NumPy value of ``dtype``; a NumPy scalar when ``scalar`` (and 0-d)."""
    return ArrayVar(cast(out, t, torch_dtype(dtype)), scalar and t.meta.ndim == 0)


def full(out: Output, value: Any, dtype: np.dtype) -> TensorVar:
    """A 0-d tensor holding the Python number ``value`` as ``dtype``."""
    device = array_device(out)
    return out.extern(torch.full, ((), value), {"dtype": torch_dtype(dtype), "device": device})


def constant(out: Output, fname: str, value: Any) -> ArrayVar:
    """``np.asarray(value)`` for a NumPy scalar or a (nested) list of Python numbers."""
    try:
        arr = np.asarray(value)
    except Exception as e:
        raise Unsupported(f"{fname}(): NumPy cannot make an array of {value!r}") from e
    if isinstance(value, np.generic):
        return ArrayVar(full(out, value.item(), arr.dtype), scalar=True)
    if arr.dtype == object or arr.size > 10_000:
        raise Unsupported(f"{fname}(): a list of {arr.dtype} values as an array is not supported")
    t = out.extern(torch.tensor, (arr.tolist(),),
                   {"dtype": torch_dtype(arr.dtype), "device": array_device(out)})
    return ArrayVar(t)


def operand(out: Output, fname: str, value: Any) -> Any:
    """An argument of a NumPy function: an ArrayVar, or a Python number (weak in NumPy 2's
    promotion); NumPy scalars and lists of numbers become arrays."""
    if isinstance(value, ArrayVar):
        return value
    if type(value) in (bool, int, float) or isinstance(value, (torch.SymInt, torch.SymFloat)):
        return value
    if isinstance(value, (np.generic, list, tuple)) and not any(
        isinstance(v, (ArrayVar, TensorVar)) for v in leaves(value)):
        return constant(out, fname, value)
    if isinstance(value, TensorVar) or any(isinstance(v, TensorVar) for v in leaves(value)):
        raise Unsupported(f"{fname}() on a torch tensor: mixing tensors and NumPy arrays is "
                          "not supported (graph break)")
    raise Unsupported(f"{fname}(): an argument of type {type(value).__name__} is not supported")


def as_array(out: Output, fname: str, value: Any) -> ArrayVar:
    """An argument NumPy converts with ``np.asarray`` (Python numbers included)."""
    value = operand(out, fname, value)
    if isinstance(value, ArrayVar):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        raise Unsupported(f"{fname}(): a symbolic size as an array is not supported")
    return constant(out, fname, value)


def assign(out: Output, target: ArrayVar, value: ArrayVar, what: str) -> ArrayVar:
    """``target`` takes ``value``'s contents in place (``a += b``), cast as NumPy's in-place
    ufuncs cast (the 'same_kind' rule)."""
    src, dst = numpy_dtype(value), numpy_dtype(target)
    if not np.can_cast(src, dst, "same_kind"):
        raise Unsupported(f"{what}: cannot cast {src} to {dst} with casting rule 'same_kind' "
                          "(NumPy raises)", raises=True)
    mutation.mutate(out, target.tensor, cast(out, value.tensor, target.tensor.meta.dtype), what)
    return target


# -- indexing --------------------------------------------------------------------------------


def _index(out: Output, arr: ArrayVar, key: Any) -> tuple[tuple, bool, int | None]:
    """The torch index for a NumPy ``key`` on ``arr``, whether NumPy's result is a scalar
    (an integer for every dimension), and where a 0-d integer array index (``a[i]`` with
    ``i = np.argmax(...)``, read as an int by NumPy) put the length-1 dimension it is given
    as here (torch would read it with ``.item()``): None when there is none."""
    keys = key if type(key) is tuple else (key,)
    converted: list[Any] = []
    integers = 0
    squeeze, arrays, position = None, 0, 0
    consumed = sum(k is not None and k is not Ellipsis for k in keys)
    for k in keys:
        position += (k is None or isinstance(k, slice)) + (
            arr.tensor.meta.ndim - consumed if k is Ellipsis else 0)
        arrays += isinstance(k, (ArrayVar, list))
        if type(k) is bool or isinstance(k, np.bool_):
            raise Unsupported("indexing a NumPy array with True/False is not supported")
        if isinstance(k, (int, torch.SymInt, np.integer)):
            integers += 1
            converted.append(int(k) if isinstance(k, np.integer) else k)
        elif k is None or k is Ellipsis:
            converted.append(k)
        elif isinstance(k, slice):
            if k.step is not None and k.step < 0:  # getitem flips first (_reversed)
                raise Unsupported("assigning to a slice with a negative step is not supported")
            converted.append(k)
        elif isinstance(k, ArrayVar):
            dtype = k.tensor.meta.dtype
            if dtype == torch.bool:
                raise Unsupported("indexing with a boolean mask has a data-dependent shape")
            if dtype.is_floating_point:
                raise Unsupported("arrays used as indices must be of integer type (NumPy "
                                  "raises)", raises=True)
            index = cast(out, k.tensor, torch.int64)
            if k.tensor.meta.ndim == 0:
                integers += 1
                squeeze = position
                index = out.extern(torch.reshape, (index, (1,)), {})
            converted.append(index)
        elif isinstance(k, list) and all(type(i) is int for i in leaves(k)):
            converted.append(k)
        else:
            raise Unsupported(f"indexing a NumPy array with {type(k).__name__} is not supported")
    if squeeze is not None and arrays > 1:
        raise Unsupported("a 0-d index array with other index arrays is not supported")
    return tuple(converted), integers == len(keys) == arr.tensor.meta.ndim, squeeze


def _reversed(arr: ArrayVar, key: Any) -> tuple[Any, tuple[int, ...]]:
    """``key`` with each slice of negative step (``a[::-1]``) turned into the slice of
    positive step that picks the same elements of that dimension flipped, and the dims to
    flip."""
    keys = key if type(key) is tuple else (key,)
    shape = arr.tensor.meta.shape
    consumed = sum(k is not None and k is not Ellipsis for k in keys)
    flips, out, dim = [], [], 0
    for k in keys:
        if isinstance(k, slice) and k.step is not None and k.step < 0:
            if dim >= len(shape) or not shape[dim].is_Integer:
                raise Unsupported("slicing a dynamic dimension with a negative step")
            n = int(shape[dim])
            start, stop, step = k.indices(n)
            count = len(range(start, stop, step))
            first = n - 1 - start
            k = slice(first, first - count * step, -step) if count else slice(0, 0, 1)
            flips.append(dim)
        out.append(k)
        dim += len(shape) - consumed if k is Ellipsis else k is not None
    return (tuple(out) if type(key) is tuple else out[0]), tuple(flips)


def getitem(tx: Translator, arr: ArrayVar, index: Var) -> ArrayVar:
    """``a[index]``: a view where NumPy's is one (a slice with a negative step is a flip
    the graph computes; it is replayed when the array changes, and writing through it is
    refused), a NumPy scalar for an integer per dimension."""
    out = tx.output
    key, flips = _reversed(arr, out.to_value(index))
    key, scalar, squeeze = _index(out, arr, key)
    if arr.scalar and key == ():
        return arr
    x = arr.tensor
    if flips:
        x = out.extern(torch.flip, (arr.tensor, flips), {})
        mutation.register_view(out, x, arr.tensor,
                               (mutation.ViewStep("opaque", (flips,), torch.flip),))
    res = out.extern(torch.Tensor.__getitem__, (x, key), {})
    if squeeze is not None:
        res = out.extern(torch.squeeze, (res, squeeze), {})
    if scalar:  # a NumPy scalar holds its value: not a view of the array
        res = copy(out, res)
    return ArrayVar(res, scalar)


def setitem(tx: Translator, arr: ArrayVar, index: Var, value: Var) -> None:
    """``a[index] = value``: the value cast to the array's dtype, as NumPy casts it."""
    out = tx.output
    if arr.scalar:
        raise Unsupported("NumPy scalars do not support item assignment (NumPy raises)",
                          raises=True)
    key, _, _ = _index(out, arr, out.to_value(index))
    v = operand(out, "item assignment", out.to_value(value))
    if isinstance(v, ArrayVar):
        v = v.tensor
    elif type(v) in (bool, int, float):  # converted now, the way NumPy converts it
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                v = np.array(v, dtype=numpy_dtype(arr)).item()
        except (OverflowError, ValueError) as e:
            raise Unsupported(f"item assignment: {e} (NumPy raises)", raises=True) from e
    mutation.setitem(out, arr.tensor, key if len(key) != 1 else key[0], v)


def rows(tx: Translator, arr: ArrayVar) -> list[ArrayVar]:
    """What ``for row in a`` sees."""
    shape = arr.tensor.meta.shape
    if not shape:
        raise Unsupported("iteration over a 0-d array (NumPy raises)", raises=True)
    if not shape[0].is_Integer:
        raise Unsupported("iterating over a NumPy array of dynamic length is not supported")
    return [getitem(tx, arr, ConstantVar(i)) for i in range(int(shape[0]))]


# -- NumPy and torch together ----------------------------------------------------------------


def torch_call(out: Output, fn: Any, args: tuple, kwargs: dict) -> TensorVar:
    """A torch function given a NumPy array: ``torch.from_numpy(a)`` / ``torch.as_tensor(a)``
    share the array's memory (a view of it in the graph); anything else breaks."""
    name = getattr(fn, "__name__", repr(fn))
    if fn in (torch.from_numpy, torch.as_tensor) and len(args) == 1 and not kwargs:
        arr = args[0]
        if arr.scalar and fn is torch.from_numpy:
            raise Unsupported("torch.from_numpy() of a NumPy scalar (eager raises)", raises=True)
        if arr.tensor.meta.device.type != "cpu":
            raise Unsupported(f"torch.{name}() under a non-CPU default device is not supported")
        if arr.scalar:
            return copy(out, arr.tensor)
        view = TensorVar(arr.tensor.node)
        mutation.register_view(out, view, arr.tensor, (mutation.ViewStep("alias"),))
        return view
    raise Unsupported(f"torch.{name}() on a NumPy array is not supported (graph break)")


def from_tensor(out: Output, t: TensorVar) -> ArrayVar:
    """``t.numpy()``: an array sharing the tensor's memory."""
    if t.meta.requires_grad:
        raise Unsupported("Tensor.numpy() on a tensor that requires grad (eager raises)",
                          raises=True)
    if t.meta.device.type != "cpu":
        raise Unsupported("Tensor.numpy() on a non-CPU tensor (eager raises)", raises=True)
    require_numpy_2()
    numpy_dtype(t)
    view = TensorVar(t.node)
    mutation.register_view(out, view, t, (mutation.ViewStep("alias"),))
    return ArrayVar(view)
