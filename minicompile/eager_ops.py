"""The eager function of each graph-level op (``ops.OPS``), apart from ops.py's metadata
and sympy: what a warm process needs to compute the values a warm entry derives from
parameters (runtime/derived.py) without importing the compiler.  ops.py registers extern
ops here too (:func:`~minicompile.ops.extern_op`).  Like the IR modules it imports only the
standard library, torch and op_table.py.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from minicompile.op_table import ROWS


@dataclasses.dataclass(frozen=True)
class OpDef:
    name: str
    family: str
    eager: Callable[..., Any]


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


COMPOSITE: dict[str, Callable] = {"relu": torch.relu, "gelu": _gelu, "silu": F.silu,
                                   "clamp": torch.clamp}

# Views, in normalised form: non-negative dims, slice bounds clamped to the size.
VIEW: dict[str, Callable] = {
    "permute": lambda x, dims: x.permute(dims),
    "expand": lambda x, sizes: x.expand(sizes),
    "unsqueeze": torch.unsqueeze,
    "squeeze": lambda x, dim: torch.squeeze(x, dim),
    "reshape": lambda x, shape: x.reshape(shape),
    "slice": lambda x, dim, start, end, step: x[(slice(None),) * dim + (slice(start, end, step),)],
    "select": lambda x, dim, index: x.select(dim, index),
}

# Reductions over ``dims`` (a tuple of non-negative ints, never empty), as
# ``name(x, dims, keepdim)``.  sum and prod accumulate in the result dtype (int64 for
# integer inputs, as torch.sum gives); float16/bfloat16 accumulate in float32.
REDUCTION: dict[str, Callable] = {
    "sum": lambda x, dims, keepdim: torch.sum(x, dims, keepdim),
    "prod": lambda x, dims, keepdim: _prod(x, dims, keepdim),
    "amax": lambda x, dims, keepdim: torch.amax(x, dims, keepdim),
    "amin": lambda x, dims, keepdim: torch.amin(x, dims, keepdim),
    "any": lambda x, dims, keepdim: torch.any(x, dims, keepdim),
    "all": lambda x, dims, keepdim: torch.all(x, dims, keepdim),
}


def _prod(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


# The pointwise ops the backends implement directly: one row each in op_table.py.
OPS: dict[str, OpDef] = {
    row.name: OpDef(row.name, row.family, row.eager) for row in ROWS if row.eager is not None
}
for _family, _table in (("composite", COMPOSITE), ("reduction", REDUCTION)):
    for _name, _fn in _table.items():
        OPS[_name] = OpDef(_name, _family, _fn)
# x.contiguous(): x itself when it already is, else a copy in row-major order.
OPS["contiguous"] = OpDef("contiguous", "copy", lambda x: x.contiguous())
OPS["to_dtype"] = OpDef("to_dtype", "cast", torch.Tensor.to)
# detach(x): x's values, through which no gradient flows (the max that softmax subtracts).
OPS["detach"] = OpDef("detach", "copy", torch.detach)


def _to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_permuted(x.shape, (0, 2, 3, 1), dtype=x.dtype,
                                device=x.device).copy_(x)


def _to_strides(x: torch.Tensor, stride: tuple) -> torch.Tensor:
    return torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device).copy_(x)


# Copies into another layout (passes/layout.py; capture, for CUDA's batch norm in
# training): to_channels_last(x), the NHWC order convolutions run fastest in;
# to_eager_layout(x, stride), the strides eager gives an output, a gradient or a batch norm.
OPS["to_channels_last"] = OpDef("to_channels_last", "copy", _to_channels_last)
OPS["to_eager_layout"] = OpDef("to_eager_layout", "copy", _to_strides)
for _name, _fn in VIEW.items():
    OPS[_name] = OpDef(_name, "view", _fn)


def _iota(shape: tuple[int, ...], dim: int, device: torch.device) -> torch.Tensor:
    """An int64 tensor of ``shape`` whose elements are their own index along ``dim``."""
    sizes = [1] * len(shape)
    sizes[dim] = shape[dim]
    return torch.arange(shape[dim], device=device).view(sizes).expand(shape).contiguous()


# iota(shape, dim, device): positions along a dim as values (what argmax compares); lowered
# to an index expression, never stored.  The device is an argument so that infer_meta
# computes it on the meta device and run_graph makes it where the graph runs.
OPS["iota"] = OpDef("iota", "iota", _iota)
OPS["getitem"] = OpDef("getitem", "tuple", operator.getitem)
# Index ops: loads whose position comes from another tensor's values (bounds-checked).
OPS["embedding"] = OpDef("embedding", "index", lambda weight, indices: F.embedding(indices, weight))
OPS["index_select"] = OpDef("index_select", "index", torch.index_select)
OPS["gather"] = OpDef("gather", "index", torch.gather)
OPS["torch.Tensor.to"] = OpDef("torch.Tensor.to", "extern", torch.Tensor.to)  # device moves


def run_eager(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Op ``name`` on eager values; a library call not registered in this process (a
    graph read from disk: a packed convolution weight) is found by its dotted path."""
    op = OPS.get(name)
    fn = op.eager if op is not None else resolve_path(name)
    if fn is None:
        raise KeyError(f"no op or function named {name}")
    return fn(*args, **kwargs)


def resolve_path(path: str) -> Any:
    """The object a dotted path names (``torch.nn.functional.linear``), or None."""
    import importlib

    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None
