"""Hand-built graphs for the pass and codegen tests, without going through capture.

    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    g = b.output(b("sin", b("sin", x)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from minicompile.errors import SourceLine
from minicompile.graph import Graph, Node, TensorMeta
from minicompile.ir import LoopProgram
from minicompile.ops import infer_meta


class GraphBuilder:
    def __init__(self, device: str | torch.device = "cpu", name: str = "graph") -> None:
        self.graph = Graph(name)
        self.device = torch.device(device)

    def input(
        self,
        name: str,
        shape: Sequence[int] | torch.Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> Node:
        """A placeholder with the layout of ``shape`` (contiguous) or of a sample tensor."""
        sample = shape if isinstance(shape, torch.Tensor) else torch.empty(
            tuple(shape), dtype=dtype, device="meta"
        )
        meta = dataclasses.replace(TensorMeta.of(sample), device=self.device)
        return self.graph.placeholder(name, meta)

    def __call__(
        self, op: str, *args: Any, stack: tuple[SourceLine, ...] = (), **kwargs: Any
    ) -> Node:
        meta = infer_meta(op, args, kwargs, self.device)
        return self.graph.call(op, args, kwargs, meta, stack)

    def output(self, *values: Node) -> Graph:
        self.graph.output(values)
        self.graph.verify()
        return self.graph


@dataclasses.dataclass
class Compiled:
    graph: Graph  # after the graph passes
    program: LoopProgram
    groups: list
    code: Any  # codegen.wrapper.GeneratedCode


def compile_graph_text(graph: Graph, backend: str) -> Compiled:
    """Run the pipeline from a graph to generated text (no build, no launch)."""
    from minicompile.codegen.wrapper import generate
    from minicompile.lowering import lower
    from minicompile.passes.fusion import fuse
    from minicompile.passes.pipeline import run_graph_passes

    g2, _ = run_graph_passes(graph, verify=True)
    program = lower(g2)
    groups = fuse(program)
    return Compiled(g2, program, groups, generate(program, groups, backend))
