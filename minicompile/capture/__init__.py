"""Frame capture: a Python function's frame -> a graph, guards and an output recipe.

The API calls :func:`capture_frame` (or :func:`capture_segment`) on a cache miss with the
frame values in layout order (:func:`frame_args`).  What capture does not model raises
:class:`~minicompile.errors.Unsupported` with a reason; tracing has no side effects, so
giving up changes nothing.  ``guards.check``, ``get_inputs`` and ``rebuild`` serve later calls.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from minicompile.binder import binder
from minicompile.capture import autocast, bytecode
# Providers: importing them fills torch_ops' tables and their kinds rules.  NumPy's modules
# load with the first NumPy value of a trace (numpy_kind, imported where one enters).
from minicompile.capture import torch_views, training_ops  # noqa: F401
from minicompile.capture.dynamic import STATIC, DynamicPolicy
from minicompile.capture.bytecode import builtins_of
from minicompile.capture.interpreter import InstructionTranslator
from minicompile.capture.output import Capture, OutputGraph
from minicompile.capture.segments import (
    Break, ResumePoint, frame_state, initial_values, root_point, why_not_resumable,
)
from minicompile.capture.variables import CellVar, LazyVar, Source, closure_cell
from minicompile.errors import ShapeError, SourceLine, Unsupported
from minicompile.runtime.guards import Guards

__all__ = [
    "Break", "Capture", "Guards", "ResumePoint", "capture_frame", "capture_segment",
    "frame_args", "root_point",
]


def frame_args(fn: types.FunctionType, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """Bind a call's arguments to the frame layout :func:`capture_frame` and the generated
    functions take (defaults applied).  Raises TypeError like the call would."""
    return binder(fn)(*args, **kwargs)


def _bases_first(output: OutputGraph, local_vars: dict[str, Any]) -> None:
    """Tensor locals that share storage (``f(a, a[0])``) are traced now, the one that
    starts at the storage's first element first: the others become views of it
    (OutputGraph._aliased_input, in frame_values.py), whichever the code touches first."""
    tensors = {n: v.value for n, v in local_vars.items()
               if isinstance(v, LazyVar) and isinstance(v.value, torch.Tensor)
               and v.value.layout == torch.strided}
    storages: dict[int, list[str]] = {}
    for name, t in tensors.items():
        storages.setdefault(t.untyped_storage()._cdata, []).append(name)
    for names in storages.values():
        if len(names) > 1:
            names.sort(key=lambda n: (tensors[n].storage_offset(), -tensors[n].numel()))
            for name in names:
                local_vars[name] = output.realize(local_vars[name])


def capture_frame(fn: types.FunctionType, args: tuple) -> Capture:
    """Trace one call of ``fn`` with the frame values ``args`` (layout order) into a graph
    of the whole frame; Unsupported for anything outside scope (no graph breaks)."""
    capture, stop = capture_segment(fn, root_point(fn.__code__), args, allow_break=False)
    assert stop is None
    return capture


def capture_segment(fn: types.FunctionType, point: ResumePoint, values: tuple,
                    allow_break: bool = True, dynamic: DynamicPolicy = STATIC,
                    stop_before: tuple[int, Unsupported] | None = None
                    ) -> tuple[Capture, Break | None]:
    """Trace ``fn`` from ``point`` with the frame values ``values`` (``point.layout()``) to
    where the frame returns (no Break; ``rebuild`` gives the return value) or, when
    ``allow_break``, to a resumable graph break (``rebuild`` gives ``(locals, stack)`` at
    the instruction the caller runs for real); Unsupported when neither applies.
    ``stop_before``: (offset, reason) of a break to take there."""
    code = fn.__code__
    if bytecode.is_generator_like(code):
        raise Unsupported(f"generator/async function {fn.__qualname__}() is not supported",
                          (SourceLine(code.co_filename, code.co_firstlineno, code.co_name),))
    names = point.layout()
    if len(values) != len(names):
        raise TypeError(f"capture_segment: expected {len(names)} frame values, got {len(values)}")
    output = OutputGraph(fn.__name__, names, dynamic)
    local_vars, stack = initial_values(point, values)
    output.guards.ref(fn.__globals__, "G")
    cells: dict[str, CellVar] = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        ref = output.guards.ref(cell, f"cell_{name}")
        source = Source(f"C[{name!r}]", f"{ref}.cell_contents", f"C_{name}")
        cells[name] = closure_cell(cell, source)
    tx = InstructionTranslator(output, code, fn.__globals__, builtins_of(fn.__globals__),
                               local_vars, cells)
    tx.stop_before = stop_before
    _bases_first(output, local_vars)
    if point.offset:
        tx.ip = tx.index_of[point.offset]
    # Stack values are consumed by the instructions that follow, which look at their kind
    # (a tensor operand) before any read would realize them: wrap them now.
    tx.stack = [output.realize(v) for v in stack]
    stop = None
    with autocast.suspended():  # the trace models autocast itself (capture/autocast.py)
        try:
            result = tx.run()
        except Unsupported as e:
            if isinstance(e, ShapeError):  # not a graph break: the caller traces static sizes
                raise
            if not allow_break or why_not_resumable(code, tx) is not None:
                raise
            if stop_before is None and getattr(e, "translator", tx) is not tx:
                # in a call inlined here: stop before the call (its writes, draws run once)
                return capture_segment(fn, point, values, allow_break, dynamic,
                                       (tx.insts[tx.ip].offset, e))
            result, local_names = frame_state(tx)
            stop = Break(tx.insts[tx.ip].offset, local_names, len(tx.stack), e)
        output.at_break = stop is not None
        return output.finish(result), stop
