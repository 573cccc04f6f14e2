"""The graph-level operators: the vocabulary of ``call`` nodes.

Each :class:`OpDef` names an operator by what it computes, in PyTorch's terms, with the
eager function that defines its meaning (used to run graphs eagerly and, on meta tensors,
to infer result metadata).  Capture maps the many spellings of an op (``x + y``,
``torch.add(x, y)``, ``x.add(y)``) onto one entry here; lowering and the backends read the
``family``.

Families (in the style of tinygrad's ``GroupOp``):
- ``unary`` / ``binary`` / ``ternary``: pointwise ops the backends implement directly;
- ``composite``: pointwise ops that ``passes/decompose.py`` rewrites into the above;
- ``cast``: dtype conversion;
- ``view``: layout-only ops, lowered to index rewrites.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from minicompile.graph import Node, TensorMeta


@dataclasses.dataclass(frozen=True)
class OpDef:
    name: str
    family: str
    eager: Callable[..., Any]


def _div_floor(a: Any, b: Any) -> Any:
    return operator.floordiv(a, b)


def _clamp(x: torch.Tensor, min: Any = None, max: Any = None) -> torch.Tensor:
    return torch.clamp(x, min, max)


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


def _to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


UNARY: dict[str, Callable] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "log": torch.log,
    "log2": torch.log2,
    "log1p": torch.log1p,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "round": torch.round,
    "sign": torch.sign,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
}

BINARY: dict[str, Callable] = {
    # Python operators give PyTorch's rules for a scalar on either side.
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": _div_floor,
    "remainder": operator.mod,
    "pow": operator.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "bitwise_and": operator.and_,
    "bitwise_or": operator.or_,
    "bitwise_xor": operator.xor,
}

COMPOSITE: dict[str, Callable] = {
    "relu": torch.relu,
    "gelu": _gelu,
    "silu": F.silu,
    "clamp": _clamp,
}

VIEW: dict[str, Callable] = {
    "permute": lambda x, dims: x.permute(dims),
    "expand": lambda x, sizes: x.expand(sizes),
    "unsqueeze": torch.unsqueeze,
    "squeeze": lambda x, dim: torch.squeeze(x, dim),
}

OPS: dict[str, OpDef] = {}
for _family, _table in (("unary", UNARY), ("binary", BINARY), ("composite", COMPOSITE)):
    for _name, _fn in _table.items():
        OPS[_name] = OpDef(_name, _family, _fn)
OPS["where"] = OpDef("where", "ternary", torch.where)
OPS["to_dtype"] = OpDef("to_dtype", "cast", _to_dtype)
for _name, _fn in VIEW.items():
    OPS[_name] = OpDef(_name, "view", _fn)

COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})


def is_pointwise(name: str) -> bool:
    return OPS[name].family in ("unary", "binary", "ternary", "composite", "cast")


def run_eager(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    return OPS[name].eager(*args, **kwargs)


def infer_meta(name: str, args: tuple, kwargs: dict[str, Any], device: torch.device) -> TensorMeta:
    """Result metadata of ``name`` applied to ``args``: PyTorch's own broadcasting, type
    promotion and stride rules, found by running the eager op on meta tensors.

    Raises whatever PyTorch raises for bad arguments (shape mismatch, bad dtype), so the
    user sees PyTorch's message.
    """

    def fake(v: Any) -> Any:
        if isinstance(v, Node):
            assert v.meta is not None
            return v.meta.fake()
        if isinstance(v, TensorMeta):
            return v.fake()
        if isinstance(v, (tuple, list)):
            return type(v)(fake(x) for x in v)
        return v

    out = run_eager(name, fake(args), {k: fake(v) for k, v in kwargs.items()})
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} did not produce a tensor")
    meta = TensorMeta.of(out)
    return dataclasses.replace(meta, device=device, storage_offset=sympy.Integer(0))
