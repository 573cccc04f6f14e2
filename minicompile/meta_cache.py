"""Remembered result metadata of ops on static arguments (minicompile.ops.infer_meta).

resnet50's batch norms make ~1,600 calls of ``infer_meta`` but ~290 distinct ones.  The
result is a function of what :func:`key` records (tensor layouts, dtypes, devices; other
arguments by type and ``repr``; the default dtype).  Symbolic sizes and errors are never
remembered.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from minicompile.graph import Node, TensorMeta

_LIMIT = 16384  # results kept (a few MB at most); the oldest go first
_results: dict[tuple, Any] = {}
# Argument types recorded by type and repr (their repr is their value).
_PLAIN = (int, float, bool, str, type(None), type(...), torch.dtype, torch.memory_format,
          torch.layout)


class _Uncacheable(Exception):
    pass


def _part(value: Any) -> Any:
    if isinstance(value, Node):
        value = value.meta
    if isinstance(value, TensorMeta):
        if value.is_symbolic:
            raise _Uncacheable
        return value  # frozen; its equality leaves out only the (absent) ShapeContext
    if type(value) in _PLAIN:
        return (type(value), repr(value))
    if isinstance(value, (tuple, list)):  # (torch.Size too)
        return (type(value), tuple(_part(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _part(v)) for k, v in value.items()))
    if isinstance(value, slice):
        return (slice, _part(value.start), _part(value.stop), _part(value.step))
    if isinstance(value, sympy.Integer):  # a static size
        return (sympy.Integer, int(value))
    raise _Uncacheable  # a device (a copy to it), a symbolic size or SymInt, anything else


def key(name: str, args: tuple, kwargs: dict[str, Any], device: torch.device) -> tuple | None:
    """What ``name``'s result metadata depends on, or None where it is not remembered."""
    try:
        return (name, _part(args), _part(kwargs), device, torch.get_default_dtype())
    except _Uncacheable:
        return None


def get(k: tuple) -> Any:
    return _results.get(k)


def put(k: tuple, result: Any) -> Any:
    if len(_results) >= _LIMIT:
        del _results[next(iter(_results))]
    _results[k] = result
    return result


def clear() -> None:
    _results.clear()
