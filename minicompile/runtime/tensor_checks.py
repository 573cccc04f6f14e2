"""The metadata checks of a model's tensors in one C++ call.

:func:`split` takes the checks of every tensor but bare parameters (a third to half of a
guard function's time) out of the guard function, which calls a :class:`TensorChecks` at
its end: PyTorch's ``TensorGuards``, and where that fails the same checks in Python, after
which the fast path is rebuilt.  So the answer is always the Python checks'.
"""

from __future__ import annotations

from typing import Any

from minicompile import compat
from minicompile.runtime.guard_render import render

TENSOR_CHECKS = "tensor_checks"  # the TensorChecks, in the guard function's namespace
PYTHON_CHECKS = "check_tensors"  # its checks in Python, a function beside the guard function


def split(checks: list[Any]) -> tuple[list[Any], TensorChecks | None]:
    """The checks the guard function runs itself, and the TensorChecks of the others (or None)."""
    kept = [c for c in checks if not c.tensor or c.tensor.isidentifier()]
    if len(kept) == len(checks):
        return checks, None
    return kept, TensorChecks([c for c in checks if c.tensor and not c.tensor.isidentifier()])


class TensorChecks:
    """``tensor_checks(*tensors)``: True when each tensor (in the order of ``paths``) passes
    its checks.  ``call``: the guard function's check that calls it; ``source``: its checks
    in Python, compiled with the guard function, which hands them over (:meth:`adopt`)."""

    def __init__(self, checks: list[Any]) -> None:
        self.paths = list(dict.fromkeys(c.tensor for c in checks))
        self.call = f"{TENSOR_CHECKS}({', '.join(self.paths)})"
        self.params = [f"t{i}" for i in range(len(self.paths))]
        self.given = checks
        self.slow: Any = None
        self.fast: Any = None

    @property
    def source(self) -> str:
        """The checks in Python, over parameters t0, t1, ... (written when asked: a warm
        entry has them compiled already, and densenet121's 3,000 take 10 ms to rewrite)."""
        index = dict(zip(self.paths, self.params))  # (each check's text starts with its path)
        checks = [c._replace(expr=index[c.tensor] + c.expr[len(c.tensor):])
                  for c in self.given]
        return render(self.params, checks, name=PYTHON_CHECKS)

    def adopt(self, namespace: dict) -> None:
        """Take the Python checks from the namespace the guard code ran in; go in it."""
        self.slow = namespace[PYTHON_CHECKS]
        namespace[TENSOR_CHECKS] = self

    def __call__(self, *tensors: Any) -> bool:
        fast = self.fast
        if fast is not None and fast.check(*tensors):
            return True
        if not self.slow(*tensors):
            return False
        self.fast = compat.tensor_guards(tensors)
        return True
