"""Compiled modules and ``DistributedDataParallel``, either way round.

``DDP(minicompile.compile(model))`` needs nothing here: the compiled forward and backward
are one autograd.Function whose gradients reach ``AccumulateGrad``, where DDP's hooks
all-reduce as in eager.  ``minicompile.compile(DDP(model))``: DDP's forward (process-group
bookkeeping, no tensor program) runs as in eager, as Dynamo runs it, and the wrapped module's
``forward`` attribute is its compiled forward for the length of the call (its hooks still
run around it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from minicompile import trace

log = logging.getLogger("minicompile")


def is_ddp(mod: torch.nn.Module) -> bool:
    return isinstance(mod, torch.nn.parallel.DistributedDataParallel)


def ddp_forward(ddp: torch.nn.Module, compiled: Callable[..., Any], args: tuple,
                kwargs: dict[str, Any]) -> Any:
    """``ddp(*args, **kwargs)`` with its wrapped module's forward replaced by ``compiled``
    (the compiled forward of that module) while DDP's own forward runs."""
    inner = ddp.module
    if "forward" in inner.__dict__:  # the user's own patched forward: run as written
        trace.emit("graph_breaks", type(inner).__qualname__,
                   "the module wrapped by DDP has a patched forward: it runs eagerly")
        return ddp(*args, **kwargs)
    inner.__dict__["forward"] = compiled
    try:
        return ddp(*args, **kwargs)
    finally:
        del inner.__dict__["forward"]
