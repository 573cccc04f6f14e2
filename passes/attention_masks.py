"""Attention masks that depend on no input are evaluated while compiling: one that masks
nothing is dropped, and the causal one becomes ``is_causal=True``.

transformers builds an all-true padding mask (BERT) or the lower triangle (GPT-2) from the
sizes alone when it is compiled; scaled_dot_product_attention then converts it every call
and takes a masked kernel (twice eager's host time on an H100).  With static sizes such a
mask is a constant, evaluated once on its device: all true (bool) or all zero (float) is
dropped; the lower triangle with as many queries as keys (bool, or 0 below and ``-inf`` or
the dtype's lowest above) becomes ``is_causal=True``.  A mask computed from an input, a
parameter or a random draw, or under dynamic sizes, stays; the calls that computed a folded
mask, and nothing else, are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph, Node, ancestors, copy_graph, map_nodes
from minicompile.ops import RANDOM_EXTERNS, run_eager

SDPA = "torch.nn.functional.scaled_dot_product_attention"
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
           "enable_gqa")


def _argument(node: Node, name: str, default: Any = None) -> Any:
    k = _PARAMS.index(name)
    return node.args[k] if len(node.args) > k else node.kwargs.get(name, default)


def _constant(mask: Node, needed: dict[Node, None]) -> torch.Tensor | None:
    """The value of ``mask`` if it depends on no input and no random draw (else None);
    ``needed`` gets the calls it was computed from."""
    needed.update(dict.fromkeys(ancestors([mask])))
    if any(n.op != "call" or n.target in RANDOM_EXTERNS for n in needed):
        return None
    values: dict[Node, Any] = {}
    try:
        for n in sorted(needed, key=lambda n: n.index):
            values[n] = run_eager(n.target, map_nodes(n.args, values.__getitem__),
                                  map_nodes(n.kwargs, values.__getitem__))
    except Exception:  # noqa: BLE001 (not evaluable here: the mask stays)
        return None
    value = values[mask]
    return value if isinstance(value, torch.Tensor) else None


def _kind(node: Node, mask: torch.Tensor) -> str | None:
    """"none" when ``mask`` masks nothing, "causal" when it is the causal mask of the
    attention at ``node``, else None."""
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.dtype.is_floating_point:
        keep = mask == 0
        if not torch.all(keep | (mask <= torch.finfo(mask.dtype).min)):
            return None  # an additive bias, not a mask
    else:
        return None
    if bool(torch.all(keep)):
        return "none"
    queries, keys = node.args[0].meta.shape[-2], node.args[1].meta.shape[-2]
    if mask.dim() < 2 or queries != keys or tuple(mask.shape[-2:]) != (queries, keys):
        return None
    causal = torch.ones(int(queries), int(keys), dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool(torch.all(keep == causal)) else None


def fold_attention_masks(graph: Graph) -> Graph:
    """See the module's doc."""
    if graph.shapes is not None:  # sizes may change, and the mask with them
        return graph
    folded: dict[Node, str] = {}
    evaluated: set[Node] = set()
    for node in graph.calls():
        mask = _argument(node, "attn_mask") if node.target == SDPA else None
        if not isinstance(mask, Node) or _argument(node, "is_causal", False) is not False:
            continue
        needed: dict[Node, None] = {}
        value = _constant(mask, needed)
        kind = _kind(node, value) if value is not None else None
        if kind is not None:
            folded[node] = kind
            evaluated.update(needed)
    if not folded:
        return graph
    # The mask's calls that nothing else reads are dropped here: they ran once while
    # compiling, on the sizes the guards hold, so none of them can raise (which keeps
    # dead-code elimination from dropping a library call).
    dead: set[Node] = set()
    for node in sorted(evaluated, key=lambda n: -n.index):
        if all(u in dead or (u in folded and node is _argument(u, "attn_mask")
                             and node not in (u.args[:3]))
               for u in node.users):
            dead.add(node)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in folded:
            return None
        bound = dict(zip(_PARAMS, node.args)) | node.kwargs
        bound = remap(bound | {"attn_mask": None, "is_causal": folded[node] == "causal"})
        q, k, v = bound.pop("query"), bound.pop("key"), bound.pop("value")
        return new.call(node.target, (q, k, v), bound, node.meta, node.stack)

    return copy_graph(graph, rewrite, dead)
