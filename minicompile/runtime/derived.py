"""Values computed from a module's parameters and buffers once, and reused while those stay.

passes/hoist_params.py moves an inference graph's work on parameters alone into a graph of
its own, whose results the compiled graph takes as extra last inputs.  :class:`WithDerived`
recomputes them whenever a source is another tensor, at another ``_version`` or on other
memory (a write through ``p.data`` is the one change PyTorch does not count).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from minicompile.eager_ops import run_eager

_version = operator.attrgetter("_version")


class WithDerived:
    """``call(inputs + values)``, the values computed by ``graph`` from inputs at ``positions``."""

    def __init__(self, call: Callable[[list], tuple], run: Callable[[list], tuple],
                 metas: list[tuple], positions: tuple[int, ...], graph: Any = None) -> None:
        self.call = call
        self.run = run  # the values from the sources
        self.metas = metas  # each value's shape, strides and dtype
        self.positions = positions
        self.graph = graph  # (the Graph of a compile, which its warm entry stores as JSON)
        self.sources: list[torch.Tensor] = []  # the tensors the values were computed from
        self.versions: list[int] = []
        self.pointers: list[int] = []
        self.values: list[torch.Tensor] = []

    @classmethod
    def from_graph(cls, call: Callable[[list], tuple], graph: Any,
                   positions: tuple[int, ...]) -> WithDerived:
        """The values of a compile: ``graph`` (passes/hoist_params.py) run by ops.run_graph."""
        from minicompile.ops import run_graph

        metas = [(n.meta.concrete_shape(), n.meta.concrete_stride(), n.meta.dtype)
                 for n in graph.outputs]
        return cls(call, functools.partial(run_graph, graph), metas, positions, graph)

    @classmethod
    def from_json(cls, call: Callable[[list], tuple], data: dict,
                  positions: tuple[int, ...]) -> WithDerived:
        """The values of a warm entry: its graph as ``graph_to_json`` wrote it, run op by op
        (eager_ops.py) without importing the graph module, the ops' metadata or sympy
        (nanoGPT's warm first call: 0.3 s less of CPU time)."""
        nodes = data["nodes"]
        metas = []
        for out in nodes[-1][2]["tuple"][0]["tuple"]:  # (the output node's tuple of nodes)
            shape, stride, dtype = nodes[out["node"]][4]["meta"][:3]
            metas.append((tuple(shape), tuple(stride), _decoded(dtype, [])))
        last = {}  # each value's last reader: it is freed after that (ops.run_graph's reason)
        for i, (_, _, args, kwargs, _) in enumerate(nodes):
            last.update((k, i) for k in _reads([args, kwargs]))
        frees: dict[int, list[int]] = {}
        for k, i in last.items():
            frees.setdefault(i, []).append(k)
        return cls(call, functools.partial(_run_json, nodes, frees), metas, positions)

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
            values = self.run(sources)
        return [_laid_out(v, *m) for v, m in zip(values, self.metas)]


def _laid_out(value: torch.Tensor, shape: tuple, stride: tuple,
              dtype: torch.dtype) -> torch.Tensor:
    """``value`` where it has the strides the graph's metadata says, else a copy that has."""
    if value.layout != torch.strided:
        return value  # a weight packed for oneDNN (runtime/onednn.py): it has no strides
    if (value.dtype == dtype and tuple(value.shape) == shape
            and all(n == 1 or s == t for n, s, t in zip(shape, value.stride(), stride))):
        return value
    out = torch.empty_strided(shape, stride, dtype=dtype, device=value.device)
    return out.copy_(value)


def _run_json(nodes: list, frees: dict[int, list[int]], inputs: list) -> tuple:
    """ops.run_graph over a graph's JSON form (graph.graph_to_json): placeholders take
    ``inputs`` in order, calls run their eager function (``frees``: the values each is the
    last to read, dropped after it), the output is returned."""
    env: list = []
    values = iter(inputs)
    for i, (op, target, args, kwargs, _meta) in enumerate(nodes):
        if op == "placeholder":
            env.append(next(values))
        elif op == "call":
            env.append(run_eager(target, _decoded(args, env), _decoded(kwargs, env)))
            for k in frees.get(i, ()):
                env[k] = None
        else:
            return _decoded(args, env)[0]
    return ()


def _reads(value: Any) -> list[int]:
    """The nodes a value of graph_to_json's form refers to (a loop, not nested generators:
    a warm entry of densenet121 has 2,700 nodes' arguments to look through)."""
    found, stack = [], [value]
    while stack:
        value = stack.pop()
        if type(value) is list:
            stack += reversed(value)
        elif type(value) is dict:
            ((kind, item),) = value.items()
            if kind == "node":
                found.append(item)
            elif kind == "tuple":
                stack += reversed(item)
            elif kind == "dict":
                stack += reversed(item.values())
    return found


def _decoded(value: Any, env: list) -> Any:
    """A value of graph_to_json's form, graph nodes standing for their values in ``env``
    (a call's arguments hold no metadata)."""
    if isinstance(value, list):
        return [_decoded(v, env) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, item),) = value.items()
    if kind == "node":
        return env[item]
    if kind == "tuple":
        return tuple(_decoded(v, env) for v in item)
    if kind == "dict":
        return {k: _decoded(v, env) for k, v in item.items()}
    if kind == "float":
        return float(item)
    if kind == "device":
        return torch.device(item)
    found = getattr(torch, item, None) if kind == "torch" else None
    if not isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
        raise TypeError(f"{kind} {item} has no value here")
    return found
