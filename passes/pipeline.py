"""The graph passes, in the order they run: the first stage of the compiler's stages
(minicompile/pipeline.py, which lists every stage in order), listed here."""

from __future__ import annotations

import time
from collections.abc import Callable

from minicompile.graph import Graph

from minicompile.passes.attention_masks import fold_attention_masks
from minicompile.passes.bias_epilogue import split_bias_epilogues
from minicompile.passes.cleanup import (
    drop_skipped_cat_pieces,
    eliminate_common_subexpressions,
    eliminate_dead_code,
)
from minicompile.passes.decompose import decompose

GRAPH_PASSES: tuple[Callable[[Graph], Graph], ...] = (
    fold_attention_masks,
    decompose,
    eliminate_common_subexpressions,
    drop_skipped_cat_pieces,
    eliminate_dead_code,
    split_bias_epilogues,
)


def run_graph_passes(graph: Graph, verify: bool = False) -> tuple[Graph, dict[str, float]]:
    """Run every graph pass; return the result and each pass's time in seconds."""
    timings: dict[str, float] = {}
    for graph_pass in GRAPH_PASSES:
        start = time.perf_counter()
        graph = graph_pass(graph)
        timings[graph_pass.__name__] = time.perf_counter() - start
        if verify:
            graph.verify()
    return graph, timings
