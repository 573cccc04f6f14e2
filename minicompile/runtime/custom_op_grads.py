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

import functools
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


@functools.cache
def _plan(name: str, n_args: int, kw_names: tuple[str, ...]) -> tuple:
    """The op ``name`` (overload, backward, setup_context) and, per argument of its schema,
    where a call with ``n_args`` positional arguments and the keywords ``kw_names`` has it:
    ``(0, i)`` args[i], ``(1, key)`` kwargs[key], ``(2, value)`` the schema's default.
    (Looked up once: reading ``_schema`` builds Python objects, ~30 us a call.)"""
    op, backward, setup = compat.custom_op_autograd(_function(name))
    where = tuple((0, i) if i < n_args else (1, a.name) if a.name in kw_names
                  else (2, a.default_value) for i, a in enumerate(op._schema.arguments))
    return op, backward, setup, where


def op_context(name: str, output: Any, args: tuple, kwargs: dict,
               diff: tuple[int, ...]) -> tuple[OpContext, tuple, list, Any]:
    """The context the op ``name``'s ``setup_context`` fills from the call's arguments; per
    argument in schema order, its place in ``diff`` (the positions, among the call's
    tensors in flatten's order, of those that take gradients) or None, and the argument;
    the call's tensors; and the op's backward."""
    _, backward, setup, where = _plan(name, len(args), tuple(kwargs))
    tensors: list = []
    flatten((args, kwargs), tensors)
    place = {id(tensors[k]): j for j, k in enumerate(diff)}
    inputs = tuple(args[v] if k == 0 else kwargs[v] if k == 1 else v for k, v in where)
    slots = tuple(place.get(id(x)) for x in inputs)
    ctx = OpContext(tuple(j is not None for j in slots))
    setup(ctx=ctx, inputs=inputs, output=output)
    return ctx, tuple(zip(slots, inputs)), tensors, backward


def custom_op_grads(name: str, diff: tuple[int, ...], grad: torch.Tensor, output: Any, /,
                    *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The gradients of the call ``name(*args, **kwargs)`` (a custom op with a registered
    backward; its result ``output``) for its tensors at ``diff`` (flatten's order), from
    the gradient ``grad`` of its result: the op's ``setup_context`` and ``backward``."""
    ctx, inputs, tensors, backward = op_context(name, output, args, kwargs, diff)
    grads = backward(ctx, grad)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) != len(inputs):
        raise RuntimeError(f"the backward of {name} returned {len(grads)} gradients "
                           f"for its {len(inputs)} inputs")
    found: list = [None] * len(diff)
    for (j, x), gx in zip(inputs, grads):
        if j is None or gx is None:
            continue
        if gx.shape != x.shape:
            gx = gx.sum_to_size(x.shape)
        if gx.dtype != x.dtype:
            gx = gx.to(x.dtype)
        found[j] = gx if found[j] is None else found[j] + gx  # (one tensor passed twice)
    return tuple(torch.zeros_like(tensors[k]) if g is None else g
                 for g, k in zip(found, diff))
