"""Which tensor dimensions a capture makes symbolic, and how the guards read them.

As PyTorch 2's automatic dynamic shapes: ``dynamic=False`` keeps sizes constant, ``True``
makes every input dim a symbol (not parameters and buffers), ``None`` makes a dim symbolic
after it caused a recompile; sizes 0 and 1 never are.  A dim of size n in a new input, after
a dim changed from n, is a symbol too (a decode step's growing KV cache: two compiles).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import sympy
import torch

from minicompile.runtime.guards import MARK_ATTR, marked_dims
from minicompile.shapes import MIN_DYNAMIC_SIZE

_ARGUMENT = re.compile(r"^L\['\w+'\]$")


def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Compile ``t``'s dimension(s) ``dim`` with a symbolic size from the first call."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    for d in dims:
        if not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"mark_dynamic: dim {d} out of range for a {t.dim()}-d tensor")
    marked = set(getattr(t, MARK_ATTR, ()))
    marked.update(d % t.dim() for d in dims)
    setattr(t, MARK_ATTR, frozenset(marked))


@dataclasses.dataclass(frozen=True)
class DynamicPolicy:
    mode: bool | None = None  # the `dynamic` option
    automatic: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)
    ints: frozenset[str] = frozenset()  # automatic: Python int arguments seen to change
    lengths: frozenset[int] = frozenset()  # automatic: the sizes dims changed from
    known: frozenset[str] = frozenset()  # automatic: the input sources earlier entries had

    def wants_int(self, source_name: str, value: int) -> bool:
        """Whether a Python int read at ``source_name`` is traced as a size symbol: an
        argument of the frame (``L['n']``), under dynamic=True or once seen to change."""
        if self.mode is False or value < MIN_DYNAMIC_SIZE or not _ARGUMENT.match(source_name):
            return False
        return self.mode is True or source_name in self.ints

    def dims(self, source_name: str, t: torch.Tensor) -> tuple[int, ...]:
        """The dims of ``t`` (read at ``source_name``) to trace as symbols."""
        if self.mode is False:
            return ()
        if self.mode is True and not _is_module_state(source_name, t):
            wanted = set(range(t.dim()))
        else:
            wanted = set(self.automatic.get(source_name, ())) | marked_dims(t)
            if self.lengths and source_name not in self.known and not _is_module_state(
                    source_name, t):  # a length that moved (see the module docstring)
                wanted.update(d for d in range(t.dim()) if t.shape[d] in self.lengths)
        return tuple(sorted(d for d in wanted if d < t.dim() and t.shape[d] >= MIN_DYNAMIC_SIZE))


STATIC = DynamicPolicy(False)


def _is_module_state(source_name: str, t: torch.Tensor) -> bool:
    return isinstance(t, torch.nn.Parameter) or "_buffers[" in source_name


def symbolic_strides(t: torch.Tensor, shape: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    """The strides of ``t`` as expressions of its (partly symbolic) ``shape``: a stride that
    equals the product of the sizes of the dims inside it (a dense layout, in any order)
    becomes that product; any other stride stays the number it is."""
    out: list[sympy.Expr] = [sympy.Integer(s) for s in t.stride()]
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]))
    dense, dense_sym = 1, sympy.Integer(1)
    for d in order:
        if t.shape[d] == 1:  # any stride goes for a dim of size 1 (never read, not guarded)
            out[d] = dense_sym
            continue
        if t.stride(d) == dense:
            out[d] = dense_sym
        dense = t.stride(d) * t.shape[d]
        dense_sym = out[d] * shape[d]
    return tuple(out)

