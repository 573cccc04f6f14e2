"""The gradients of a recorded call whose result a Python ``autograd.Function`` made, by
that Function's ``backward``, called directly.

A library's own ``autograd.Function`` (or a custom op that the compiler records:
runtime/custom_op_grads.py takes most of those) is recorded in the forward like any
library call (runtime/autograd.record).  Its gradient by a nested ``torch.autograd.grad``
costs a graph task on the engine per call, more than many of the calls themselves.  The
node autograd recorded is the Function's context: its ``apply`` is what the engine calls
(the user's ``backward`` with the context), and the engine then sends the i-th returned
gradient to the i-th forward input.  This module does the same where that mapping is
plain: every forward input is a tensor (a custom op's Function also takes its dispatch
metadata last), the result is the Function's only output, and each input that takes a
gradient is one of the call's leaves.  Anything else goes to the engine.
"""

from __future__ import annotations

from typing import Any

import torch

from minicompile import compat

# torch.library's Function for a custom op (torch/_library/autograd.py) takes the op's
# arguments and, last, a non-tensor with the dispatch keys, whose gradient is None.
_CUSTOM_OP_FUNCTION = "GeneratedBackwardFor_"


def _plain_inputs(node: Any) -> bool:
    """Whether the node's edges stand for the Function's forward inputs one each, in
    order: no non-tensor input sits among them."""
    inputs, edges = len(node.needs_input_grad), len(node.next_functions)
    return inputs == edges or inputs == edges + 1 and type(node).__name__.startswith(
        _CUSTOM_OP_FUNCTION)


def leaf_slots(edges: tuple, leaves: tuple) -> list | None:
    """Per edge of a node (``next_functions``), the place in ``leaves`` of the leaf it
    accumulates into, or None for an input that takes no gradient; None where an input
    was made inside the call's history or one leaf is reached twice."""
    places = {id(t): k for k, t in enumerate(leaves)}
    slots = [None if edge is None else places.get(id(getattr(edge, "variable", None)), -1)
             for edge, _ in edges]
    taken = [k for k in slots if k is not None]
    return None if -1 in slots or len(set(taken)) < len(taken) else slots


def function_grads(pairs: list, leaves: tuple) -> tuple | None:
    """The gradients of ``leaves`` (None for those the call does not read) where the one
    result in ``pairs`` (result, gradient) is the only output of a Python autograd Function
    whose inputs are leaves or take no gradient; else None."""
    if len(pairs) != 1:
        return None
    (out, g), = pairs
    node = out.grad_fn
    if not compat.is_function_node(node) or compat.node_outputs(node) != 1 \
            or not _plain_inputs(node):
        return None
    slots = leaf_slots(node.next_functions, leaves)
    if slots is None:
        return None
    with torch.no_grad():  # as the engine runs a backward without create_graph
        grads = node.apply(g)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) != len(node.needs_input_grad):
        return None  # the engine's error message says what is wrong: let it run
    found: list = [None] * len(leaves)
    for k, grad in zip(slots, grads):
        if k is None or grad is None:
            continue
        if grad.shape != leaves[k].shape:
            return None  # the engine would sum it to the input's shape: leave that to it
        found[k] = grad.to(leaves[k].dtype)
    return tuple(found)

