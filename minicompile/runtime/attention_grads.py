"""The gradients of a recorded attention call by its backward kernel, called directly.

A library call that PyTorch differentiates is recorded in the forward and its leaves'
gradients found by a nested ``torch.autograd.grad`` (runtime/autograd.vjp).  That costs a
graph task on the engine for each call: 0.35 ms on a CPU for a 2 x 3 x 17 x 64 attention,
more than its kernels, and more where a GPU's device thread takes the task.  For the fused
attention kernels behind ``F.scaled_dot_product_attention`` (flash, memory-efficient,
cuDNN, flash on the CPU) the node autograd recorded holds what their backward op reads;
this module calls that op with it (``compat.ATTENTION_BACKWARDS``), as the node would.
(Calling the node is no answer: inside a backward it computes only what the graph task asks for.)
"""

from __future__ import annotations

from minicompile import compat
from minicompile.runtime.function_grads import leaf_slots


def attention_grads(pairs: list, leaves: tuple) -> tuple | None:
    """The gradients of ``leaves`` (None for those the call does not read) where the one
    result in ``pairs`` (result, gradient) comes from a fused attention kernel whose query,
    key and value are leaves (and whose mask takes no gradient); else None."""
    if len(pairs) != 1:
        return None
    (out, g), = pairs
    node = out.grad_fn
    if type(node).__name__ == "CopyBackwards":  # record's copy into eager's strides (GQA):
        edges = node.next_functions  # its gradient passes through unchanged (same dtype)
        if len(edges) == 2 and edges[0][0] is None and edges[1][1] == 0 \
                and edges[1][0] is not None:
            node = edges[1][0]
    backward = compat.ATTENTION_BACKWARDS.get(type(node).__name__)
    edges = node.next_functions if backward is not None else ()
    if len(edges) < 3 or any(edge is not None for edge, _ in edges[3:]):
        return None
    slots = leaf_slots(edges[:3], leaves)
    if slots is None:
        return None
    try:
        grads = backward(node, g, [k is not None for k in slots])
    except AttributeError:  # a saved value under a name this version does not use
        return None
    found: list = [None] * len(leaves)
    for k, grad in zip(slots, grads):
        if k is not None:
            found[k] = grad
    return tuple(found)
