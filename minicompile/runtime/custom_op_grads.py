"""The gradients of a ``torch.library.custom_op`` with a registered backward
(transformers' MoE ``grouped_mm_fallback``), by that backward, called directly.

Such a call is not recorded for PyTorch's autograd: the forward calls the op as a plain
library call (autograd's Function around it costs 30 us a call, its nested backward
more), and the backward graph calls :func:`custom_op_grads` with the saved arguments and
result.  That builds the context with the op's ``setup_context`` and calls the op's
``backward`` with it, as AOTAutograd traces through them (passes/derivatives.custom_op_rule
decides where: tensors and constants as arguments, one tensor as the result).
"""

from __future__ import annotations

from typing import Any

import torch

from minicompile import compat
from minicompile.runtime.autograd import _function, flatten


class OpContext:
    """What a custom op's ``setup_context`` and ``backward`` use of autograd's context:
    ``save_for_backward`` / ``saved_tensors``, ``needs_input_grad`` and attributes."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass  # (no gradient is asked for a result the op marks so: none reaches it)

    def set_materialize_grads(self, value: bool) -> None:
        pass  # (the one result's gradient is always a tensor here)


def bind_schema(schema: Any, args: tuple, kwargs: dict) -> tuple:
    """The op's arguments in its schema's order, defaults filled in."""
    return tuple(args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
                 for i, a in enumerate(schema.arguments))


def op_context(op: Any, setup: Any, output: Any, args: tuple, kwargs: dict,
               diff: tuple[int, ...]) -> tuple[OpContext, tuple, list]:
    """The context ``setup`` (the op's ``setup_context``) fills from the call's
    arguments; per argument in schema order, its place in ``diff`` (the positions, among
    the call's tensors in flatten's order, of those that take gradients) or None; and the
    call's tensors."""
    tensors: list = []
    flatten((args, kwargs), tensors)
    place = {id(tensors[k]): j for j, k in enumerate(diff)}
    inputs = bind_schema(op._schema, args, kwargs)
    slots = tuple(place.get(id(x)) for x in inputs)
    ctx = OpContext(tuple(j is not None for j in slots))
    setup(ctx=ctx, inputs=inputs, output=output)
    return ctx, tuple(zip(slots, inputs)), tensors


def custom_op_grads(name: str, diff: tuple[int, ...], grad: torch.Tensor, output: Any, /,
                    *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The gradients of the call ``name(*args, **kwargs)`` (a custom op with a registered
    backward; its result ``output``) for its tensors at ``diff`` (flatten's order), from
    the gradient ``grad`` of its result: the op's ``setup_context`` and ``backward``."""
    op, backward, setup = compat.custom_op_autograd(_function(name))
    ctx, inputs, tensors = op_context(op, setup, output, args, kwargs, diff)
    grads = backward(ctx, grad)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) != len(inputs):
        raise RuntimeError(f"the backward of {op.name()} returned {len(grads)} gradients "
                           f"for its {len(inputs)} inputs")
    found: list = [None] * len(diff)
    for (j, x), gx in zip(inputs, grads):
        if j is None or gx is None:
            continue
        gx = gx.to(x.dtype) if gx.shape == x.shape else gx.sum_to_size(x.shape).to(x.dtype)
        found[j] = gx if found[j] is None else found[j] + gx  # (one tensor passed twice)
    return tuple(torch.zeros_like(tensors[k]) if g is None else g
                 for g, k in zip(found, diff))
