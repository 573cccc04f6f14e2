"""What the generated get_inputs and rebuild of a capture call on every call: write-backs
of mutated inputs, NumPy arrays in and out (capture/numpy_arrays.py writes those calls).
Here so that a warm entry (runtime/entries.py) finds them in a process that never
captured.  NumPy is not imported here: the arrays passed in come from it.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch


def write_back(dst: Any, src: torch.Tensor) -> None:
    """An input mutated in the graph (a tensor, or a NumPy array) gets its new value, unless
    the kernels stored it there (passes/inplace.py: ``src is dst``; then its version counter
    moves on, as an in-place op's would: autograd and runtime/derived.py read it)."""
    if not isinstance(dst, torch.Tensor):
        dst = torch.from_numpy(dst)
    if src is not dst:
        dst.copy_(src)
    else:
        torch.autograd.graph.increment_version(dst)


def write_backs(dsts: tuple, srcs: tuple) -> None:
    """:func:`write_back` of each pair, the tensors' copies in one ``_foreach_copy_`` per
    dtype (one kernel on a GPU, not one a tensor: a network's batch-norm statistics).
    Mutated inputs share no memory (capture guards it), so the copies' order is free.
    Where no output was stored in place, the pairs of each dtype are picked as planned
    for those dtypes (:func:`_by_dtype`): 20 us, not 120, for efficientnet_b0's 147."""
    if any(map(operator.is_, dsts, srcs)):
        _write_backs_some_stored(dsts, srcs)
        return
    for pick, tensors in _by_dtype(tuple(map(_DTYPE, dsts))):
        to, of = pick(dsts), pick(srcs)
        if tensors:
            torch._foreach_copy_(to, of)
        else:
            for dst, src in zip(to, of):
                write_back(dst, src)


_DTYPE = operator.attrgetter("dtype")


@functools.lru_cache(maxsize=256)
def _by_dtype(dtypes: tuple) -> tuple[tuple[Callable[[tuple], tuple], bool], ...]:
    """(a picker of the pairs of one dtype, whether they are tensors) for each dtype of the
    destinations (NumPy arrays' dtypes: not tensors)."""
    groups: dict[Any, list[int]] = {}
    for k, dtype in enumerate(dtypes):
        groups.setdefault(dtype, []).append(k)
    return tuple((picker(ks), isinstance(dtype, torch.dtype)) for dtype, ks in groups.items())


def picker(indices: list[int]) -> Callable[[tuple], tuple]:
    """``lambda values: tuple(values[k] for k in indices)``, in one C call."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        (k,) = indices
        return lambda values: (values[k],)
    return lambda values: ()


def _write_backs_some_stored(dsts: tuple, srcs: tuple) -> None:
    copies: dict[torch.dtype, tuple[list, list]] = {}
    stored = []  # their version counters moved on in one call (a static KV cache's 24)
    for dst, src in zip(dsts, srcs):
        if src is dst:
            stored.append(dst)
        elif not isinstance(dst, torch.Tensor):
            write_back(dst, src)
        else:
            to, of = copies.setdefault(dst.dtype, ([], []))
            to.append(dst)
            of.append(src)
    for to, of in copies.values():
        torch._foreach_copy_(to, of)
    if stored:
        torch.autograd.graph.increment_version(stored)


def to_tensor(a: Any, device: torch.device | None = None) -> torch.Tensor:
    """An input array (or NumPy scalar) as a tensor: its memory on the CPU, a copy on ``device``."""
    import numpy as np

    if type(a) is not np.ndarray:
        a = np.asarray(a)
    if a.flags.writeable:
        t = torch.from_numpy(a)
    else:  # torch warns that writes would be undefined; the guards see to it there are none
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = torch.from_numpy(a)
    return t if device is None else t.to(device)


def to_numpy(t: torch.Tensor) -> Any:
    """A graph output as the array NumPy returns (copied from a GPU)."""
    return t.numpy(force=True)


def to_scalar(t: torch.Tensor) -> Any:
    """A 0-d graph output as the NumPy scalar NumPy returns (``np.sum(a)``)."""
    return t.numpy(force=True)[()]


def shares_no_memory(a: Any, others: tuple) -> bool:
    """Whether the array ``a`` shares no memory with any of ``others`` (a guard)."""
    import numpy as np

    return not any(np.may_share_memory(a, b) for b in others)


def build_record(cls: type, init: dict[str, Any], writes: tuple) -> Any:
    """The real object, as eager made it: the constructor, then the writes in order."""
    obj = cls(**init)
    for kind, name, value in writes:
        if kind == "item":
            obj[name] = value
        else:
            setattr(obj, name, value)
    return obj


# ModelOutput class -> whether model_output's build matched its constructor's, on the first.
_model_outputs: dict[type, bool] = {}


def model_output(cls: type, fields: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """``cls(**fields)`` for a transformers ModelOutput (capture/records.py: plain_model_output)
    whose non-None fields are ``keys``: built as that constructor leaves it, the fields as
    attributes and ``keys`` as items, in field order, without the calls of
    ``dataclasses.fields`` its ``__setattr__`` and ``__post_init__`` make (7 for a
    CausalLMOutput: 25 us of 30).  A class's first is built by its constructor (which
    registers it with torch's pytree) and compared with this build: a difference keeps the
    constructor for that class."""
    plain = _model_outputs.get(cls)
    if plain:
        return _built_plainly(cls, fields, keys)
    obj = cls(**fields)
    if plain is None:
        _model_outputs[cls] = _state(obj) == _state(_built_plainly(cls, fields, keys))
    return obj


def _built_plainly(cls: type, fields: dict[str, Any], keys: tuple[str, ...]) -> Any:
    obj = cls.__new__(cls)
    for key in keys:
        OrderedDict.__setitem__(obj, key, fields[key])
    obj.__dict__.update(fields)
    return obj


def _state(obj: Any) -> tuple:
    return ([(k, id(v)) for k, v in OrderedDict.items(obj)],
            [(k, id(v)) for k, v in obj.__dict__.items()])


def new_object(cls: type, attrs: dict[str, Any]) -> Any:
    """The real object of a NewObjectVar (its __init__ already ran in the trace)."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj
