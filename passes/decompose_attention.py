"""``F.scaled_dot_product_attention`` on the CPU with a mask that takes a gradient (T5's and
BART's learned position bias), rewritten into the ops eager's math path runs
(``_scaled_dot_product_attention_math`` in aten/src/ATen/native/transformers/attention.cpp).

No fused CPU kernel differentiates a mask, so eager takes that path.  As a library call, the
training graph recorded it and its backward went through PyTorch's engine (a nested
``autograd.grad`` over six composite ops each step); as graph ops, both matrix products
stay library calls and the softmax with its gradient fuses into kernels, as Inductor does.

The ops and their order are eager's: query and key each scaled by the square root of the
scale, ``q @ k^T``, the mask added, a "safe" softmax (a row that is all ``-inf`` gives
zeros, not NaN, and zero gradients), ``@ v``.  Left as the library call: other devices (CUDA's memory-efficient
kernel differentiates the mask itself), dropout, causal, grouped-query heads, a mask without
a gradient (the fused kernels run it), low-precision dtypes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from minicompile import ops
from minicompile.graph import Node
from minicompile.passes.decompose_reductions import NOT_HANDLED, Builder, bind

PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
            "enable_gqa": False}


def _handled(q: Any, k: Any, v: Any, mask: Any, a: dict) -> bool:
    tensors = (q, k, v, mask)
    if not all(isinstance(t, Node) for t in tensors) or not mask.requires_grad:
        return False
    if a["dropout_p"] != 0.0 or a["is_causal"] is not False or a["enable_gqa"] is not False:
        return False
    if not all(t.meta.device.type == "cpu" and t.meta.dtype in (torch.float32, torch.float64)
               and t.meta.dtype == q.meta.dtype and t.meta.ndim >= 2 for t in tensors):
        return False
    if a["scale"] is not None and not isinstance(a["scale"], (int, float)):
        return False
    try:
        int(q.meta.shape[-1])  # (the default scale of a dynamic head size: left alone)
    except TypeError:
        return False
    return q.meta.ndim == k.meta.ndim == v.meta.ndim


def _attention(b: Builder, *args: Any, **kwargs: Any) -> Node | None:
    a = bind(args, kwargs, PARAMS, DEFAULTS)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if set(a) != set(PARAMS) or not _handled(q, k, v, mask, a):
        return NOT_HANDLED
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(int(q.meta.shape[-1]))
    root = math.sqrt(abs(scale))  # (eager: a negative scale negates the query alone)
    query = b("mul", q, root if scale >= 0 else -root)
    order = (*range(k.meta.ndim - 2), k.meta.ndim - 1, k.meta.ndim - 2)
    key_t = b("mul", b("permute", k, order), root)
    matmul = ops.extern_op(torch.matmul)
    scores = b("add", b(matmul, query, key_t), mask)
    # The softmax over keys (its shift by the row maximum is not differentiated), as eager's
    # _safe_softmax: a row with no key to attend to (all -inf) is zeros, and so are its
    # gradients (shifted by 0 and divided by 1, no NaN to multiply by zero).
    last = (scores.meta.ndim - 1,)
    row_max = b("amax", b("detach", scores), last, True)
    empty = b("eq", row_max, -math.inf)
    e = b("exp", b("sub", scores, b("where", empty, 0.0, row_max)))
    probs = b("truediv", e, b("where", empty, 1.0, b("sum", e, last, True)))
    return b(matmul, probs, v)


ATTENTION_DECOMPOSITIONS = {"torch.nn.functional.scaled_dot_product_attention": _attention}
