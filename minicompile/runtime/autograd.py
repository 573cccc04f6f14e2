"""The runtime of training: a compiled forward and backward as one autograd.Function.

``CompiledGraphFunction.apply(step, *inputs)`` runs a :class:`TrainingStep`'s forward
without recording, saves what its backward needs with ``ctx.save_for_backward`` and returns
the outputs with the Function as their ``grad_fn``: each compiled segment is one node of
the autograd graph.  Library calls are differentiated by PyTorch (:func:`record`, :func:`vjp`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat
from minicompile.ops import resolve_path
from minicompile.runtime.attention_grads import attention_grads
from minicompile.runtime.dict_guards import right_after_check
from minicompile.runtime.function_grads import function_grads
from minicompile.runtime.values import picker

# The (result, leaves) of every record() call of the forward running now: the Function
# saves the leaves beside the results and attaches them to what the backward unpacks
# (a saved tensor's Python attributes need not survive saving).
_recorded = threading.local()


@functools.cache
def _function(name: str) -> Callable:
    return resolve_path(name)


def flatten(value: Any, out: list) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            flatten(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            flatten(v, out)


def _replace(value: Any, table: dict[int, torch.Tensor], counter: list) -> Any:
    """``value`` with its k-th tensor (in flatten's order) replaced by ``table[k]``."""
    if isinstance(value, torch.Tensor):
        k = counter[0]
        counter[0] += 1
        return table.get(k, value)
    if isinstance(value, tuple):
        return tuple(_replace(v, table, counter) for v in value)
    if isinstance(value, list):
        return [_replace(v, table, counter) for v in value]
    if isinstance(value, dict):
        return {key: _replace(v, table, counter) for key, v in value.items()}
    return value


def record(name: str, diff: tuple[int, ...], stride: tuple, /, *args: Any, **kwargs: Any) -> Any:
    """``name(*args, **kwargs)`` with autograd recording it, the tensors at ``diff`` made
    leaves that require grad, its result in strides ``stride`` (a recorded copy where the
    library chose others); the running Function keeps its leaves for :func:`vjp`."""
    tensors: list = []
    flatten((args, kwargs), tensors)
    leaves = {k: tensors[k].detach().requires_grad_() for k in diff}
    args, kwargs = _replace((args, kwargs), leaves, [0])
    with torch.enable_grad():
        out = _function(name)(*args, **kwargs)
        if isinstance(out, torch.Tensor) and any(
            s != want for s, want, n in zip(out.stride(), stride, out.shape) if n > 1
        ):
            out = torch.empty_strided(out.shape, stride, dtype=out.dtype,
                                      device=out.device).copy_(out)
    leaves_in_order = tuple(leaves[k] for k in diff)
    for t in (out,) if isinstance(out, torch.Tensor) else out:  # a tuple: every item
        _recorded.calls.append((t, leaves_in_order))
    return out


def vjp(out: Any, grad: Any) -> tuple[torch.Tensor, ...]:
    """The gradients of :func:`record`'s leaves by PyTorch's backward of that call, in its
    strides.  ``out`` and ``grad`` may be tuples (of results that take gradients)."""
    outs, grads_in = (out, grad) if isinstance(out, tuple) else ((out,), (grad,))
    leaves = outs[0]._minicompile_leaves
    pairs = [(o, g) for o, g in zip(outs, grads_in) if o.grad_fn is not None]
    if not pairs:  # nothing of the output depends on its leaves
        return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) for t in leaves)
    grads = attention_grads(pairs, leaves)
    if grads is None:
        grads = function_grads(pairs, leaves)
    if grads is None:
        grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                    retain_graph=True, allow_unused=True)
    return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) if g is None
                 else g for g, t in zip(grads, leaves))


def conv_backward(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: bool,
                  stride: tuple, padding: tuple, dilation: tuple, groups: int,
                  mask: tuple[bool, bool, bool]) -> tuple[torch.Tensor, ...]:
    """The gradients of ``conv{n}d(x, w, bias?)`` that ``mask`` asks for (input, weight,
    bias; only those, in that order): one call of ATen's convolution backward, the
    kernels eager's backward runs, without recording the convolution in the forward."""
    grads = torch.ops.aten.convolution_backward(
        grad, x, w, [w.shape[0]] if bias else None, stride, padding, dilation, False,
        [0] * len(stride), groups, list(mask))
    return tuple(g for g, wanted in zip(grads, mask) if wanted)


def max_pool2d_backward(grad: torch.Tensor, x: torch.Tensor, *window: Any) -> torch.Tensor:
    """The gradient of ``F.max_pool2d(x, *window)`` by ATen's backward kernel (eager's), its
    indices found again from ``x`` (one pooling kernel): no forward recorded for autograd
    and no nested backward (on a GPU host, record + vjp cost more than the pooling)."""
    _, indices = torch.ops.aten.max_pool2d_with_indices(x, *window)
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, *window, indices)


def embedding_backward(grad: torch.Tensor, indices: torch.Tensor, rows: int, padding_idx: int,
                       scale_grad_by_freq: bool) -> torch.Tensor:
    """The weight's gradient of ``F.embedding(indices, weight)``: ATen's dense backward,
    the kernel eager's backward runs."""
    return torch.ops.aten.embedding_dense_backward(grad, indices, rows, padding_idx,
                                                   scale_grad_by_freq)


@dataclasses.dataclass
class TrainingStep:
    """One graph's compiled forward and backward (fields: see passes.autograd.Joint), and
    what each call reads of those fields, worked out once (``__post_init__``).

    ``written``: the user outputs that rebuild only writes back into inputs (a batch
    norm's running statistics) and that take no gradient.  They are no outputs of the
    Function (each output costs autograd its bookkeeping: 147 of efficientnet_b0's 148):
    the runner hands them to rebuild beside the Function's outputs."""

    forward: Callable[[list], tuple]
    backward: Callable[[list], tuple]
    num_outputs: int
    backward_inputs: tuple[tuple[str, int], ...]
    input_grads: tuple[int | str | None, ...]
    differentiable: tuple[bool, ...]
    written: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n, m = self.num_outputs, len(self.input_grads)
        written = frozenset(self.written)
        assert not any(self.differentiable[k] for k in written), "a written output takes grads"
        # The user outputs the Function returns; output k is the Function's place[k].
        self.returned = tuple(k for k in range(n) if k not in written)
        place = {k: i for i, k in enumerate(self.returned)}
        # What the forward saves, picked from inputs + forward results in one call.
        self.pick_saved = picker([k if kind == "input" else m + n + k
                                   for kind, k in self.backward_inputs if kind != "grad"])
        # (place in the backward's inputs, the Function's output) of each gradient it reads
        self.grad_slots = tuple((at, place[k]) for at, (kind, k)
                                in enumerate(self.backward_inputs) if kind == "grad")
        self.zero_inputs = tuple(k for k, where in enumerate(self.input_grads) if where == "zero")
        # The backward's return, picked from (None, *the compiled backward's results): one
        # item for the step, the holder and each input (None: the input takes no gradient).
        self.pick_grads = picker([0, 0] + [where + 1 if isinstance(where, int) else 0
                                            for where in self.input_grads])
        self.non_differentiable = tuple(place[k] for k in self.returned
                                        if not self.differentiable[k])


class CompiledGraphFunction(torch.autograd.Function):
    """``apply(step, holder, *inputs)``: ``holder`` (a list, or None where the step writes
    nothing back) receives the forward's results for the runner's rebuild."""

    @staticmethod
    def forward(ctx: Any, step: TrainingStep, holder: list | None,  # type: ignore[override]
                *inputs: Any) -> tuple:
        _recorded.calls = []
        try:
            outs = step.forward(list(inputs))
        finally:
            calls, _recorded.calls = _recorded.calls, None
        if holder is not None:
            holder.append(outs)
        saved = step.pick_saved(inputs + tuple(outs))
        ctx.leaves = ()
        if calls:
            saved = list(saved)
            ids = {id(t): k for k, t in enumerate(saved)}
            ctx.leaves = []
            for out, leaves in calls:
                if id(out) in ids:
                    ctx.leaves.append((ids[id(out)], len(leaves)))
                    saved.extend(leaves)
        ctx.save_for_backward(*saved)
        ctx.step = step
        # No zeros made for the outputs no gradient reached: the backward makes those it
        # reads itself.
        ctx.set_materialize_grads(False)
        # Values the forward made with autograd on (library results) leave detached: this
        # Function is their only history.
        results = tuple(o.detach() if isinstance(o, torch.Tensor) and o.requires_grad else o
                        for o in (outs[k] for k in step.returned))
        ctx.outputs = {k: (results[k].shape, results[k].dtype, results[k].device)
                       for _, k in step.grad_slots}
        if step.zero_inputs:
            ctx.zeros = {k: (inputs[k].shape, inputs[k].dtype, inputs[k].device)
                         for k in step.zero_inputs}
        if step.non_differentiable:
            ctx.mark_non_differentiable(*[results[k] for k in step.non_differentiable
                                          if isinstance(results[k], torch.Tensor)])
        return results

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: Any) -> tuple:  # type: ignore[override]
        step: TrainingStep = ctx.step
        tensors = ctx.saved_tensors
        end = len(tensors) - sum(count for _, count in ctx.leaves)
        start = end
        for k, count in ctx.leaves:
            tensors[k]._minicompile_leaves = tensors[start:start + count]
            start += count
        values = list(tensors[:end] if ctx.leaves else tensors)
        del tensors
        for at, k in step.grad_slots:  # (in order: each lands at its place in the list)
            g = grads[k]
            if g is None:
                shape, dtype, device = ctx.outputs[k]
                g = torch.zeros(shape, dtype=dtype, device=device)
            values.insert(at, g if g.is_contiguous() else g.contiguous())
        del grads
        # Without retain_graph the saved tensors are ours now: the compiled backward frees
        # each after its last use (it empties ``values``), not all at its end.
        clear = getattr(ctx, "maybe_clear_saved_tensors", None)
        if clear is not None:
            clear()
        results = step.backward(values) if values or step.input_grads else ()
        out = step.pick_grads((None, *results))
        if not step.zero_inputs:
            return out
        out = list(out)
        for k in step.zero_inputs:  # eager's gradient through floor, sign, round: zeros
            shape, dtype, device = ctx.zeros[k]
            out[k + 2] = torch.zeros(shape, dtype=dtype, device=device)
        return tuple(out)


def make_runner(step: TrainingStep, get_inputs: Callable, rebuild: Callable) -> Callable:
    """The entry's runner: frame values -> the user's return value.  As an inference
    entry's, its inputs read what a dict-version gate holds on the check's own pass
    (dict_guards.right_after_check: the API runs an entry right after its check)."""
    get_inputs = right_after_check(get_inputs)
    apply = compat.function_apply(CompiledGraphFunction)
    if not step.written:
        def run(frame: tuple) -> Any:
            return rebuild(apply(step, None, *get_inputs(*frame)), *frame)

        return run
    returned = step.returned

    def run_writing_back(frame: tuple) -> Any:
        holder: list = []
        results = apply(step, holder, *get_inputs(*frame))
        outs = list(holder[0])  # rebuild writes the written outputs back
        for k, value in zip(returned, results):
            outs[k] = value
        return rebuild(outs, *frame)

    return run_writing_back
