"""Values computed from a module's parameters and buffers once, and reused while those stay.

passes/hoist_params.py moves an inference graph's work on parameters and buffers alone
(a folded batch norm, a weight copied channels-last) into a graph of its own, whose
results the compiled graph takes as extra last inputs.  :class:`WithDerived` recomputes
them before a call whenever a source is another tensor, at another ``_version`` or on
other memory (a write through ``p.data`` is the one change PyTorch does not count).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph
from minicompile.ops import OPS, extern_op, resolve_path, run_graph

_version = operator.attrgetter("_version")


class WithDerived:
    """``call(inputs + values)``, the values computed by ``graph`` from inputs at ``positions``."""

    def __init__(self, call: Callable[[list], tuple], graph: Graph,
                 positions: tuple[int, ...]) -> None:
        self.call = call
        self.graph = graph
        self.positions = positions
        self.metas = [n.meta for n in graph.outputs]
        for node in graph.calls():  # (a graph read from disk: its library calls by name)
            if node.target not in OPS:
                extern_op(resolve_path(node.target))
        self.sources: list[torch.Tensor] = []  # the tensors the values were computed from
        self.versions: list[int] = []
        self.pointers: list[int] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, inputs: list) -> tuple:
        sources = [inputs[k] for k in self.positions]
        versions = list(map(_version, sources))  # (map: faster than a loop)
        pointers = list(map(torch.Tensor.data_ptr, sources))
        if (versions != self.versions or pointers != self.pointers
                or not all(map(operator.is_, sources, self.sources))):
            self.values = []  # (the old values go before the new ones are made)
            self.values = self.compute(sources)
            self.sources, self.versions, self.pointers = sources, versions, pointers
        return self.call([*inputs, *self.values])

    def compute(self, sources: list[torch.Tensor]) -> list[torch.Tensor]:
        """The values, each in the layout the compiled graph was built for."""
        with torch.no_grad():
            values = run_graph(self.graph, sources)
        return [_laid_out(v, m) for v, m in zip(values, self.metas)]


def _laid_out(value: torch.Tensor, meta: Any) -> torch.Tensor:
    """``value`` where it has the strides the graph's metadata says, else a copy that has."""
    if value.layout != torch.strided:
        return value  # a weight packed for oneDNN (runtime/onednn.py): it has no strides
    shape, stride = meta.concrete_shape(), meta.concrete_stride()
    if (value.dtype == meta.dtype and tuple(value.shape) == shape
            and all(n == 1 or s == t for n, s, t in zip(shape, value.stride(), stride))):
        return value
    out = torch.empty_strided(shape, stride, dtype=meta.dtype, device=value.device)
    return out.copy_(value)
