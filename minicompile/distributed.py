"""Compiled modules and ``DistributedDataParallel``, either way round.

``DDP(minicompile.compile(model))`` needs nothing of its own: a compiled forward and its
backward are one ``torch.autograd.Function`` (minicompile/runtime/autograd.py) whose
backward hands each parameter's gradient to autograd's ``AccumulateGrad``, where DDP's
reducer hooks fire, fill their buckets and all-reduce as in eager.

``minicompile.compile(DDP(model))``: DDP's own ``forward`` is Python around the module it
wraps (``_pre_forward``: the reducer's bookkeeping for the coming backward and buffer
broadcasts; ``_post_forward``), made of process-group calls that are not tensor programs.
As Dynamo does with DDP, that forward runs as in eager, and the call of the wrapped module
inside it runs the wrapped module's compiled forward: for the length of the call the
module's ``forward`` attribute is the compiled one (Module.__call__ reads
``self.forward``, so the module's hooks still run around it).
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


def compiled_target(mod: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward ``minicompile.compile(mod)`` compiles: the wrapped module
    of a DDP, ``mod`` itself otherwise."""
    return mod.module if is_ddp(mod) else mod


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
