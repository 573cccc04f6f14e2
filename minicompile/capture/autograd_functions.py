"""Custom ``torch.autograd.Function`` calls (``MyFn.apply(x)``) where no gradient can flow:
grad mode off, or no tensor argument requiring grad (inference, as BLOOM's ``GeLUFunction``
runs in ``generate``).  There ``apply`` returns what ``forward`` returns, so the trace
inlines ``forward``: with a context that records nothing (``save_for_backward`` and the
``mark_*`` calls do nothing, attributes may be set), or without one when the class defines
``setup_context`` (the newer style, whose ``forward`` takes no context).  Where a gradient
could flow, the call stays a graph break, with that reason: the class's ``backward`` is
the user's own code, which the compiled graph does not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minicompile.capture import records
from minicompile.capture.variables import ConstantVar, TensorVar, UserFunctionVar, Var
from minicompile.errors import Unsupported

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator

_APPLY = torch.autograd.Function.apply.__func__
_NO_SETUP = torch.autograd.Function.setup_context


class InferenceContext:
    """The ``ctx`` of a ``forward`` run where no gradient flows: it keeps nothing."""

    def __init__(self, inputs: int) -> None:
        self.needs_input_grad = (False,) * inputs
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def function_class(value: Any) -> type | None:
    """The ``autograd.Function`` subclass whose ``apply`` ``value`` is, else None."""
    owner = getattr(value, "__self__", None)
    if (isinstance(owner, type) and issubclass(owner, torch.autograd.Function)
            and getattr(value, "__func__", None) is _APPLY):
        return owner
    return None


def call(tx: InstructionTranslator, cls: type, args: list, kwargs: dict) -> Var:
    """``cls.apply(*args, **kwargs)`` (see the module's doc)."""
    values = [tx.realize(v) for v in (*args, *kwargs.values())]
    if tx.output.grad_enabled and any(
            isinstance(v, TensorVar) and v.meta.requires_grad for v in values):
        raise Unsupported(f"{cls.__qualname__}.apply() on tensors that require grad: a custom "
                          "autograd.Function's backward is not traced (it runs at a graph break)")
    forward = getattr(cls, "forward", None)
    if not isinstance(forward, type(call)):
        raise Unsupported(f"{cls.__qualname__}.forward is not a Python function")
    if getattr(cls, "setup_context", _NO_SETUP) is not _NO_SETUP:
        return tx.inline_call(UserFunctionVar(forward), list(args), kwargs)
    ctx = records.create(tx, InferenceContext, [ConstantVar(len(args))], {})
    return tx.inline_call(UserFunctionVar(forward), [ctx, *args], kwargs)
