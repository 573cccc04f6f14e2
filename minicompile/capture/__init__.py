"""Frame capture: a Python function's frame -> a graph, guards and an output recipe.

The API calls :func:`capture_frame` (or :func:`capture_segment`) on a cache miss with the
frame values in layout order (:func:`frame_args`).  What capture does not model raises
:class:`~minicompile.errors.Unsupported` with a reason; tracing has no side effects, so
giving up changes nothing.  ``guards.check``, ``get_inputs`` and ``rebuild`` serve later calls.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
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
from minicompile.capture.output import OutputGraph
from minicompile.capture.segments import (
    Break, ResumePoint, frame_state, has_catching_handlers, initial_values, root_point,
    why_not_resumable,
)
from minicompile.capture.variables import CellVar, LazyVar, Source, closure_cell
from minicompile.errors import ShapeError, SourceLine, Unsupported
from minicompile.graph import Graph
from minicompile.runtime.guards import Guards

__all__ = [
    "Break", "Capture", "Guards", "ResumePoint", "capture_frame", "capture_segment",
    "frame_args", "root_point",
]


@dataclasses.dataclass
class Capture:
    graph: Graph  # placeholders in input order, named after their sources ("L_x", "G_w")
    input_sources: list[str]  # readable source per placeholder: "L['x']", "G['w']"
    get_inputs: Callable[..., list[torch.Tensor]]  # get_inputs(*layout) -> placeholder tensors
    guards: Guards
    rebuild: Callable[..., Any]  # rebuild(graph outputs, *layout) -> return value
    ops: int  # number of call nodes
    get_inputs_source: str = ""
    rebuild_source: str = ""
    instructions: int = 0  # bytecode instructions interpreted to make it
    compiled: Any = None  # (run, call) when the API built it already (dynamic shapes)
    # (graph output, placeholder) index pairs that rebuild copies back (mutated inputs).
    writebacks: tuple[tuple[int, int], ...] = ()
    # Every code object the trace interpreted (the frame's and the functions it inlined):
    # what a warm entry on disk is keyed by (minicompile/runtime/entries.py).
    codes: frozenset[types.CodeType] = frozenset()
    # Whether a try / except / finally / with in those codes may catch an exception the
    # graph raises (which it raises outside those blocks: the API then runs the code for
    # real, where they see it).
    handlers: bool = False

    def __str__(self) -> str:
        return "\n".join(
            [str(self.graph), "", str(self.guards), self.get_inputs_source, self.rebuild_source])


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
        done = output.finish(result)
    capture = Capture(
        graph=done.graph, input_sources=done.input_sources, get_inputs=done.get_inputs,
        guards=done.guards, rebuild=done.rebuild, ops=sum(1 for _ in done.graph.calls()),
        get_inputs_source=done.get_inputs_source, rebuild_source=done.rebuild_source,
        instructions=output.instructions, writebacks=done.writebacks, codes=frozenset(output.codes),
        handlers=any(has_catching_handlers(c) for c in output.codes))
    return capture, stop
