"""``minicompile.explain(fn)(*args)``: what capture makes of a function, without compiling."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from minicompile.errors import Unsupported

if TYPE_CHECKING:  # the graph module imports sympy
    from minicompile.graph import Graph


@dataclasses.dataclass(frozen=True)
class BreakReason:
    reason: str
    filename: str | None
    lineno: int | None
    hint: str = ""

    def __str__(self) -> str:
        where = f" at {self.filename}:{self.lineno}" if self.filename else ""
        hint = f"  hint: {self.hint}" if self.hint else ""
        return f"{self.reason}{where}{hint}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[Graph]
    break_reasons: list[BreakReason]
    eager_frames: int

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [[n.target for n in g.calls()] for g in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    def __str__(self) -> str:
        return "\n".join([
            f"Graph Count: {self.graph_count}   Graph Break Count: {self.graph_break_count}   "
            f"Op Count: {self.op_count}   Eager Frames: {self.eager_frames}",
            *(f"Break {k}  {r}" for k, r in enumerate(self.break_reasons, 1)),
            *(f"Graph {k}  ops: {', '.join(ops) or '(none)'}"
              for k, ops in enumerate(self.ops_per_graph))])


def explain(fn: Callable | torch.nn.Module) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args)`` runs ``fn`` once through a fresh compiled wrapper (its side
    effects happen, as with ``torch._dynamo.explain``) and reports the graphs and every
    graph break with the user's file and line; ``stats()`` is left as it was.  Of an
    ``nn.Module`` (or a compiled one), its ``forward`` is reported (hooks not run)."""
    from minicompile import api, config

    if isinstance(fn, api.OptimizedModule):
        fn = fn._orig_mod
    if isinstance(fn, torch.nn.Module):
        fn = fn.forward

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        saved = api.stats()
        # Traced afresh: an entry loaded from disk has no graph to report.
        wrapper = api.CompiledFunction(fn, dataclasses.replace(config.get(), warm_entries=False))
        try:
            wrapper(*args, **kwargs)
        finally:
            api._compiled.remove(wrapper)
            api._stats.update(saved)
        graphs = [
            e.capture.graph
            for point in sorted(wrapper.segments, key=lambda p: p.offset)
            for e in reversed(wrapper.segments[point])
        ]
        reasons = []
        for b in wrapper.breaks:
            e = b if isinstance(b, Unsupported) else b.reason
            where = e.stack[-1] if e.stack else None
            reasons.append(BreakReason(e.reason, where.filename if where else None,
                                       where.lineno if where else None, e.hint))
        return ExplainOutput(graphs, reasons, eager_frames=int(wrapper.eager_reason is not None))

    return run
