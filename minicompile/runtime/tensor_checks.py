"""The metadata checks of a model's tensors in one C++ call.

A module's parameters and buffers each carry five checks (dtype, device, requires_grad,
sizes, strides: capture/guard_builder.py's ``tensor_match``), one Python comparison each: on
a small model most of the guard function.  :func:`batch` takes those of every tensor that
is not a bare parameter of the frame (those are the inputs that change between calls, and
keep their checks where they are, failing early) out of the guard function and puts one
check in their place, at its end: ``tensor_checks(p4, p3['bias'], ...)``, a
:class:`TensorChecks`.  Its fast path is PyTorch's ``TensorGuards`` (minicompile/compat.py),
built from tensors that passed the checks: a tensor it passes has the dtype, device,
requires_grad, sizes and strides of one that passed, so passes them too.  Where it fails
(the first call; a tensor that changed; one it is stricter on: a tensor passed twice, other
dispatch keys, as in inference mode), the checks run in Python, and if they pass, the fast
path is built again from these tensors.  So the answer is always that of the Python checks;
:meth:`Guards.explain_failure` still runs the checks one by one and names the one that
failed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from minicompile import compat
from minicompile.runtime.guard_render import render

TENSOR_CHECKS = "tensor_checks"  # its name in the guard function's namespace


def batch(checks: list[Any], namespace: dict) -> tuple[list[Any], str | None]:
    """The checks (GuardCheck) the guard function runs itself, and the expression of the one
    check calling the :class:`TensorChecks` of the others (None if there are none), which
    is put in ``namespace``."""
    kept = [c for c in checks if not c.tensor or c.tensor.isidentifier()]
    if len(kept) == len(checks):
        return checks, None
    tensors = TensorChecks([c for c in checks if c.tensor and not c.tensor.isidentifier()],
                           namespace)
    namespace[TENSOR_CHECKS] = tensors
    return kept, f"{TENSOR_CHECKS}({', '.join(tensors.paths)})"


class TensorChecks:
    """``tensor_checks(*tensors)``: True when each tensor (in the order of ``paths``, each
    past its type check) passes its checks."""

    def __init__(self, checks: list[Any], namespace: dict) -> None:
        self.paths = list(dict.fromkeys(c.tensor for c in checks))
        index = {path: f"t{i}" for i, path in enumerate(self.paths)}
        # The checks over parameters t0, t1, ... (each check's text starts with its path).
        self.checks = [dataclasses.replace(c, expr=index[c.tensor] + c.expr[len(c.tensor):])
                       for c in checks]
        self.source = render(list(index.values()), self.checks, name="check_tensors")
        scope = dict(namespace)
        exec(compile(self.source, "<minicompile tensor checks>", "exec"), scope)
        self.slow = scope["check_tensors"]
        self.fast: Any = None

    def __call__(self, *tensors: Any) -> bool:
        fast = self.fast
        if fast is not None and fast.check(*tensors):
            return True
        if not self.slow(*tensors):
            return False
        self.fast = compat.tensor_guards(tensors)
        return True
