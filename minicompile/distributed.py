"""Calls of a module whose forward is compiled while the call itself runs as in eager: how
compiled code meets ``DistributedDataParallel``, FSDP2's ``fully_shard`` and forward hooks.

- ``DDP(minicompile.compile(model))`` needs nothing here: the compiled forward and backward
  are one autograd.Function whose gradients reach ``AccumulateGrad``, where DDP's hooks
  all-reduce as in eager.  ``minicompile.compile(DDP(model))``: DDP's forward (process-group
  bookkeeping, no tensor program) runs as in eager, as Dynamo runs it, and the wrapped
  module's ``forward`` attribute is its compiled forward for the length of the call.
- FSDP2: ``fully_shard(m)`` registers a forward pre-hook that all-gathers m's parameters
  (the module then holds plain, unsharded ones, the same objects every step) and a forward
  hook that reshards them and hooks the outputs, whose backward all-gathers again;
  gradients are reduce-scattered after ``AccumulateGrad``.  Capture traces no hooks (as
  Dynamo, whose ``skip_fsdp_hooks`` runs FSDP's eagerly): a hooked module's call runs as
  eager runs it, hooks included, with its forward compiled in between.  That is
  ``minicompile.compile(m)`` of a hooked m, and a call a compiled frame broke at because
  the callee has hooks (the blocks of a compiled model sharded per block): the callee's
  forward is compiled as a frame of its own (:func:`compiled_call`).  Sharded parameters
  (DTensors) never reach capture: between the hooks they are plain tensors, and capture
  refuses a tensor subclass with its name.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from minicompile import trace


def is_ddp(mod: torch.nn.Module) -> bool:
    return isinstance(mod, torch.nn.parallel.DistributedDataParallel)


def has_hooks(mod: torch.nn.Module) -> bool:
    """Whether ``mod(...)`` does more than ``mod.forward(...)``: hooks of its own (FSDP2's
    all-gather and reshard among them) that ``nn.Module.__call__`` runs around forward."""
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks
                or mod._backward_pre_hooks)


def call_with_forward(target: torch.nn.Module, compiled: Callable[..., Any],
                      call: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)`` (``target`` itself, a DDP around it, or a method of it) with
    ``target.forward`` replaced by ``compiled`` for the length of the call, so that whatever
    runs around forward (hooks, DDP's forward) runs as in eager."""
    if "forward" in target.__dict__:  # the user's own patched forward: run as written
        trace.emit("graph_breaks", type(target).__qualname__,
                   "the module has a forward set on the instance: it runs as written")
        return call(*args, **kwargs)
    target.__dict__["forward"] = compiled
    try:
        return call(*args, **kwargs)
    finally:
        del target.__dict__["forward"]


def compiled_call(mod: torch.nn.Module, wrappers: dict, make: Callable[[Callable], Callable],
                  args: list, kwargs: dict) -> Any:
    """``mod(*args, **kwargs)`` for a hooked module a compiled frame broke at: its hooks as in
    eager, its forward compiled by ``make`` (once per forward traced, kept in ``wrappers``).
    A forward that is not a Python function (a compiled module's own) runs as it is."""
    from minicompile.capture import training_ops  # (a break: capture is loaded already)

    forward = training_ops.module_forward(mod) or type(mod).forward
    if (not isinstance(forward, types.FunctionType) or "forward" in mod.__dict__
            or forward.__module__.split(".")[0] == "minicompile"):  # (OptimizedModule's)
        return mod(*args, **kwargs)
    if forward not in wrappers:
        trace.emit("graph_breaks", type(mod).__qualname__,
                   "a call of a module with hooks: hooks run as in eager, forward compiled")
        wrappers[forward] = make(types.MethodType(forward, mod))
    return call_with_forward(mod, wrappers[forward], mod, tuple(args), kwargs)
