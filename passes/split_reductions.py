"""Split reductions that give a GPU too few outputs to work on (``g.sum(0)`` of a [4096, 512]
gradient: 8 programs, each walking 4096 rows; or a few long rows):

    sum(x, dims)  ->  sum(sum(reshape(permute(x, dims + kept), (S, R / S, K)), 1), 0)

The permute and reshape are index rewrites (fused into the first kernel, which keeps every
prologue of the original).  Only on CUDA, for static sizes.  The partial sums change the
order of the additions, as Inductor's split reductions do.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minicompile.graph import Graph, Node, copy_graph

from minicompile.ir import LOW_PRECISION
from minicompile.passes.decompose import _Builder, _lay_out_as
from minicompile.passes.mix_order import MAX_COLUMNS

SPLITTABLE = frozenset({"sum", "prod", "amax", "amin", "any", "all"})
MIN_NUMEL = 1 << 18  # smaller reductions are cheap however they run
# Partial results to aim for: enough programs for every multiprocessor several times over
# (a column reduction's program covers 64 outputs, a row reduction's one).
COLUMN_PARTIALS = 1 << 15
ROW_PARTIALS = 1 << 10
MIN_CHUNK = {True: 64, False: 1024}  # rows (column reductions) or elements per chunk


def split_factor(reduced: int, kept: int, column: bool) -> int:
    """The number of chunks ``S`` (a power of two dividing ``reduced``), 1 for no split."""
    if reduced * kept < MIN_NUMEL:
        return 1
    want = (COLUMN_PARTIALS if column else ROW_PARTIALS) // kept
    split = 1
    while (split * 2 <= want and reduced % (split * 2) == 0
           and reduced // (split * 2) >= MIN_CHUNK[column]):
        split *= 2
    return split if split >= 4 else 1


def row_sums(graph: Graph) -> set[tuple[int, int]]:
    """(rows, columns) of the static float32 sums along the last dim of rows at most
    passes/mix_order.py's MAX_COLUMNS long: a sum over such rows' columns (a layer norm's
    weight gradient) is left whole, for its row kernel to compute (mix-order reductions)."""
    out = set()
    for node in graph.nodes:
        if node.op != "call" or node.target != "sum" or node.args[0].meta.dtype != torch.float32:
            continue
        shape = node.args[0].meta.shape
        if shape and all(getattr(s, "is_Integer", False) for s in shape) and tuple(
                d % len(shape) for d in node.args[1]) == (len(shape) - 1,) and (
                int(shape[-1]) <= MAX_COLUMNS):
            out.add((math.prod(int(s) for s in shape[:-1]), int(shape[-1])))
    return out


def split_reductions(graph: Graph, mix_order: bool = True) -> Graph:
    """Return ``graph`` with its reductions over too few outputs split in two (CUDA);
    ``mix_order``: leave whole the column sums passes/mix_order.py gives a row kernel."""
    rows = row_sums(graph) if mix_order else set()

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node.op != "call" or node.target not in SPLITTABLE:
            return None
        x, dims, keepdim = remap(node.args)
        shape = x.meta.shape
        if (x.meta.device.type != "cuda" or x.meta.dtype in LOW_PRECISION
                or not all(isinstance(s, int) or s.is_Integer for s in shape)):
            return None  # (float16/bfloat16 partials would be rounded: eager rounds once)
        shape = tuple(int(s) for s in shape)
        dims = tuple(sorted(d % len(shape) for d in dims))
        kept = tuple(d for d in range(len(shape)) if d not in dims)
        reduced = math.prod(shape[d] for d in dims)
        kept_numel = math.prod(shape[d] for d in kept)
        column = bool(kept) and kept[-1] == len(shape) - 1  # the outputs are side by side
        split = split_factor(reduced, kept_numel, column)
        if split == 1 or (column and node.target == "sum" and (reduced, kept_numel) in rows
                          and x.meta.dtype == torch.float32 and dims == tuple(range(len(dims)))):
            return None
        b = _Builder(new, node)
        start = len(new.nodes)
        order = dims + kept
        y = x if order == tuple(range(len(shape))) else b("permute", x, order)
        y = b("reshape", y, (split, reduced // split, kept_numel))
        partial = b(node.target, y, (1,), False)
        out = b("reshape", b(node.target, partial, (0,), False),
                tuple(int(s) for s in node.meta.shape))
        _lay_out_as(out, node.meta, start)
        return out

    return copy_graph(graph, rewrite)
