"""Custom ``torch.autograd.Function`` calls (``MyFn.apply(x)``) where no gradient can flow
(grad mode off, or no input requiring grad): ``apply`` returns what ``forward`` returns, so
``forward`` is inlined with a context that records nothing (or none, with
``setup_context``).  Where a gradient can flow, ``apply`` is a library call of the graph.
"""

from __future__ import annotations

from typing import Any

import torch

from minicompile import ops
from minicompile.capture import records
from minicompile.capture.kinds import Translator
from minicompile.capture.variables import ConstantVar, TensorVar, UserFunctionVar, Var
from minicompile.errors import Unsupported


_NO_SETUP = torch.autograd.Function.setup_context


class InferenceContext:
    """The ``ctx`` of a ``forward`` run where no gradient flows: it keeps nothing."""

    def __init__(self, inputs: int) -> None:
        self.needs_input_grad = (False,) * inputs
        self.materialize_grads = True

    def _records_nothing(self, *tensors: Any) -> None:
        pass

    save_for_backward = save_for_forward = mark_dirty = mark_non_differentiable = _records_nothing

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def call(tx: Translator, cls: type, args: list, kwargs: dict) -> Var:
    """``cls.apply(*args, **kwargs)`` (see the module's doc)."""
    values = [tx.realize(v) for v in (*args, *kwargs.values())]
    if tx.output.grad_enabled and any(
            isinstance(v, TensorVar) and v.meta.requires_grad for v in values):
        return library_call(tx, cls, args, kwargs)
    forward = getattr(cls, "forward", None)
    if not isinstance(forward, type(call)):
        raise Unsupported(f"{cls.__qualname__}.forward is not a Python function")
    if getattr(cls, "setup_context", _NO_SETUP) is not _NO_SETUP:
        return tx.inline_call(UserFunctionVar(forward), list(args), kwargs)
    ctx = records.create(tx, InferenceContext, [ConstantVar(len(args))], {})
    return tx.inline_call(UserFunctionVar(forward), [ctx, *args], kwargs)


def library_call(tx: Translator, cls: type, args: list, kwargs: dict) -> Var:
    """``cls.apply(...)`` where a gradient can flow: a library call of the graph (metadata
    from ``apply`` on meta tensors), whose recorded ``backward`` autograd runs in the
    compiled backward.  A forward that modifies an input in place (``ctx.mark_dirty``)
    stays a break: a library call of the graph only computes its results."""
    what = f"{cls.__qualname__}.apply() on tensors that require grad"
    fns = (getattr(cls, "forward", None), getattr(cls, "setup_context", None))
    codes = [f.__code__ for f in fns if isinstance(f, type(call))]
    if any("mark_dirty" in code.co_names for code in codes):
        raise Unsupported(f"{what}: its forward modifies an input in place (mark_dirty)")
    try:
        ops.extern_name(cls.apply)  # the generated code calls it by the class's path
    except ValueError as e:
        raise Unsupported(f"{what}: {e}") from None
    pos, kw = tx.output.to_values(args, kwargs)
    try:
        return tx.output.from_value(tx.output.extern(cls.apply, tuple(pos), kw))
    except Unsupported as e:
        raise Unsupported(f"{what}: {e.reason}") from e
