"""Comparison of a compiled run with an eager run: return values, and the state of every
input, object, module and global after the call.

``assert_matches`` walks both values in parallel: tensors must agree in dtype, shape,
device and value (float tolerances per dtype, integers and bools exactly); containers in
type (``torch.Size`` stays ``torch.Size``), length and keys; plain objects in their
attributes; everything else by ``==``.  ``assert_aliasing`` checks that an output that is
(a view of) an input in eager is (the same view of) the same input in the compiled run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch
import torch.nn as nn

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


def tolerance(dtype: torch.dtype, override: dict[str, float]) -> dict[str, float]:
    if not (dtype.is_floating_point or dtype.is_complex):
        return dict(rtol=0, atol=0)
    return override or TOLERANCES.get(dtype, {})  # float32: assert_close's defaults


def _is_plain_object(value: Any) -> bool:
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (type, nn.Module))
        and not callable(value)
    ) or dataclasses.is_dataclass(value)


def assert_matches(actual: Any, expected: Any, where: str, tol: dict[str, float] = {}) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        assert actual.device == expected.device, f"{where}: device {actual.device}"
        assert actual.requires_grad == expected.requires_grad, f"{where}: requires_grad"
        torch.testing.assert_close(
            actual.detach(), expected.detach(), equal_nan=True,
            **tolerance(expected.dtype, tol), msg=lambda m: f"{where}: {m}",
        )
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_matches(a, e, f"{where}[{k}]", tol)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_matches(actual[k], expected[k], f"{where}[{k!r}]", tol)
    elif isinstance(expected, float) and not isinstance(actual, bool):
        assert type(actual) is float, f"{where}: {type(actual).__name__} != float"
        assert math.isclose(actual, expected, rel_tol=1e-5, abs_tol=1e-6) or (
            math.isnan(actual) and math.isnan(expected)
        ), f"{where}: {actual!r} != {expected!r}"
    elif type(expected) is functools.partial:
        assert type(actual) is functools.partial, f"{where}: {type(actual)} != partial"
        assert actual.func is expected.func, f"{where}: {actual.func} != {expected.func}"
        assert_matches(actual.args, expected.args, f"{where}.args", tol)
        assert_matches(actual.keywords, expected.keywords, f"{where}.keywords", tol)
    elif _is_plain_object(expected):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert_matches(vars(actual), vars(expected), f"{where}.__dict__", tol)
    else:
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors in a value, depth first (containers and plain objects opened)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensor_leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensor_leaves(v)]
    if _is_plain_object(value):
        return tensor_leaves(vars(value))
    return []


def assert_aliasing(actual: Any, expected: Any, args: Any, eager_args: Any, where: str) -> None:
    """An output that shares storage with input k in eager shares it with input k here, at
    the same offset; an output that aliases no input in eager aliases none here."""
    storages = [t.untyped_storage().data_ptr() for t in tensor_leaves(args)]
    eager_storages = [t.untyped_storage().data_ptr() for t in tensor_leaves(eager_args)]
    for k, (a, e) in enumerate(zip(tensor_leaves(actual), tensor_leaves(expected))):
        e_ptr, a_ptr = e.untyped_storage().data_ptr(), a.untyped_storage().data_ptr()
        if e_ptr in eager_storages:
            i = eager_storages.index(e_ptr)
            assert a_ptr == storages[i], f"{where}: output tensor {k} should alias input {i}"
            assert a.storage_offset() == e.storage_offset(), f"{where}: output {k} offset"
            assert a.stride() == e.stride(), f"{where}: output {k} strides"
        else:
            assert a_ptr not in storages, f"{where}: output tensor {k} aliases an input"


def module_attributes(model: nn.Module) -> dict[str, Any]:
    """Each submodule's plain Python attributes (counters, flags, lists, configs)."""
    simple = (int, float, bool, str, list, tuple, dict, type(None))
    out: dict[str, Any] = {}
    for name, sub in model.named_modules():
        for key, value in vars(sub).items():
            if not key.startswith("_") and (isinstance(value, simple) or _is_plain_object(value)):
                out[f"{name or 'self'}.{key}"] = value
    return out


def assert_modules_match(actual: nn.Module, expected: nn.Module, where: str, tol: dict) -> None:
    """Parameters, buffers and Python attributes agree after the call."""
    assert_matches(
        dict(actual.state_dict(keep_vars=True)), dict(expected.state_dict(keep_vars=True)),
        f"{where}: state_dict", tol,
    )
    assert_matches(module_attributes(actual), module_attributes(expected), f"{where}: attrs", tol)
