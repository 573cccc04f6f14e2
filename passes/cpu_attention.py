"""Attention in a CPU training graph: ``F.scaled_dot_product_attention`` where PyTorch runs
its CPU flash kernel becomes that kernel's own call,
``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``, whose second result (each
query row's log-sum-exp) the backward reads.  The gradient is then the kernel's backward op
on the saved query, key, value, output and log-sum-exp (passes/derivatives.py's
``flash_attention_rule``): the two kernels eager's autograd runs, with nothing around them.

As a library call that PyTorch differentiates, the attention was recorded in the forward
(a detached leaf per input, an autograd node holding its saved values) and its backward op
called on that node's values (runtime/autograd.record, vjp, attention_grads).  On one
thread that cost 26 us a forward and backward more than the two kernels alone (38 us) at
hf_bart's size, 2 x 4 heads x 7 tokens x 16: six attentions, 3% of its train step.

Only where the fused-kernel choice (``torch._fused_sdp_choice``, on uninitialised tensors of
the operands' layouts) is the CPU flash kernel, which eager then runs too (grouped-query
heads included: the kernel takes them as they are); static sizes; no dropout (its random
numbers are the kernel's); a mask that takes no gradient (one that does is
passes/decompose_attention.py's).  Every other attention, and
every attention in inference (no log-sum-exp to keep), stays the call it was.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.library_layouts import ATTENTION, ATTENTION_ARGS, run_on_device, uninitialised
from minicompile.passes.decompose import _Builder
from minicompile.passes.decompose_attention import DEFAULTS
from minicompile.passes.decompose_reductions import bind

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _operands(node: Node) -> dict | None:
    """``node``'s arguments by name where it is an attention this pass takes, else None."""
    if node.target not in ATTENTION or not node.requires_grad:
        return None
    a = bind(node.args, node.kwargs, ATTENTION_ARGS, DEFAULTS)
    q, k, v, mask = (a.get(n) for n in ATTENTION_ARGS[:4])
    tensors = [t for t in (q, k, v, mask) if t is not None]
    if set(a) - set(ATTENTION_ARGS) or not all(isinstance(t, Node) for t in tensors):
        return None
    if not all(isinstance(t.meta, TensorMeta) and t.meta.device.type == "cpu"
               and not t.meta.is_symbolic for t in (*tensors, node)):
        return None
    if (q.meta.ndim != 4 or mask is not None and mask.requires_grad
            or a["dropout_p"] != 0.0 or type(a["enable_gqa"]) is not bool
            or type(a["is_causal"]) is not bool
            or not (a["scale"] is None or type(a["scale"]) is float)):
        return None
    choice = torch._fused_sdp_choice(*uninitialised((q, k, v, mask)), 0.0, a["is_causal"],
                                     scale=a["scale"], enable_gqa=a["enable_gqa"])
    return a if choice == int(SDPBackend.FLASH_ATTENTION) else None


def _flash_metas(a: dict) -> tuple[TensorMeta, TensorMeta] | None:
    """The metadata of the flash kernel's output and log-sum-exp, from a run on
    uninitialised tensors (the kernel takes grouped-query heads as they are, as eager's
    call passes them); None where the kernel refuses the call."""
    q, mask = a["query"], a["attn_mask"]
    if mask is not None and mask.meta.dtype not in (torch.bool, q.meta.dtype):
        return None
    if mask is not None and mask.meta.dtype == torch.bool:  # (as the kernel gets it)
        mask = torch.empty(mask.meta.concrete_shape(), dtype=q.meta.dtype)
    try:
        out, lse = run_on_device(FLASH, (q, a["key"], a["value"], 0.0, a["is_causal"]),
                                 {"attn_mask": mask, "scale": a["scale"]})
    except RuntimeError:
        return None
    out_meta = dataclasses.replace(TensorMeta.of(out.detach()), requires_grad=True)
    return out_meta, TensorMeta.of(lse.detach())


def flash_attention_calls(graph: Graph) -> tuple[Graph, str]:
    """``graph`` with the attentions that take a gradient on the CPU flash kernel as that
    kernel's call (or ``graph`` itself), and what was done, for the logs."""
    found = {}
    for node in graph.calls():
        a = _operands(node)
        metas = _flash_metas(a) if a is not None else None
        if metas is not None:
            found[node] = (a, metas)
    if not found:
        return graph, ""
    target = ops.extern_op(FLASH)

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in found:
            return None
        a, metas = found[node]
        args = remap((a["query"], a["key"], a["value"], 0.0, a["is_causal"]))
        mask = remap(a["attn_mask"])
        if mask is not None and mask.meta.dtype == torch.bool:
            # eager's conversion: 0 where the mask is true, -inf where false, in the
            # query's dtype
            b = _Builder(new, node)
            mask = b("to_dtype", b("where", mask, 0.0, -math.inf), dtype=metas[0].dtype)
        kwargs = {"attn_mask": mask, "scale": a["scale"]}
        call = new.call(target, args, kwargs, metas, node.stack)
        new.call("getitem", (call, 1), {}, metas[1], node.stack)  # (the backward's)
        out = new.call("getitem", (call, 0), {}, metas[0], node.stack)
        if out.meta.stride == node.meta.stride:
            return out
        # (the layout the graph after it was built for: grouped-query heads' differs)
        return _Builder(new, node)("to_eager_layout", out, tuple(int(s) for s in node.meta.stride))

    return copy_graph(graph, rewrite), (
        f"{len(found)} attentions on the CPU flash kernel, its log-sum-exp kept")
