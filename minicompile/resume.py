"""Graph breaks at run time: a frame stopped at a break runs the breaking instruction for
real, then the compiled segment after it (captured on a miss), until it returns; what
cannot be compiled finishes for real.  :class:`Resuming` is this part of
:class:`minicompile.api.CompiledFunction`.
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from minicompile import distributed, optim, trace
from minicompile.driver import Entry
from minicompile.driver import counters as _stats

if TYPE_CHECKING:
    from minicompile.capture import Break, Capture, ResumePoint, concrete

# User functions a frame broke at, compiled as frames of their own: fn -> {cfg: wrapper};
# modules with hooks a frame broke at: module -> {cfg: {forward: wrapper}}.
_callee_wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Optimizer steps called inside compiled frames: optimizer -> {(step, cfg): CompiledStep}.
_compiled_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _is_user_function(fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType):
        return False
    if fn.__code__.co_name in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"):
        return False  # a 3.11 comprehension made at a break: its `.0` binds no signature
    module = getattr(fn, "__module__", "") or ""
    return not module.split(".")[0] in ("torch", "minicompile", "triton", "numpy", "builtins")


class Resuming:
    """Graph breaks of a CompiledFunction (see the module docstring)."""

    def resume(self, entry: Entry, state: tuple) -> Any:
        """Continue a frame after a segment that stopped at a graph break: run the breaking
        instruction for real, then the segment after it (compiled on a miss), until the
        frame returns."""
        from minicompile.capture import ResumePoint, concrete

        while True:
            stop = entry.stop
            assert stop is not None
            local_values, stack = state
            f = concrete.Frame.at(
                self.fn, stop.offset, dict(zip(stop.local_names, local_values)), list(stack)
            )
            f.call = self.call_at_break
            try:
                concrete.step(f)  # the breaking instruction
            except Exception as e:  # the user's: raised where eager raises it
                if stop.reason.raises:  # the break was this error: trace again next time
                    self.forget(entry)
                from minicompile import user_errors

                raise user_errors.raise_at(e, [user_errors.line_of(self.fn, f.last)])
            finally:
                _stats["concrete_instructions"] += f.steps
            if f.returned:
                return f.result
            code = self.fn.__code__
            names = tuple(n for n in code.co_varnames if n in f.locals)
            point = ResumePoint(f.offset, names, len(f.stack))
            values = tuple(f.locals[n] for n in names) + tuple(f.stack)
            found = self.segment(point, values)
            if found is None:
                return self.finish_concretely(f, point)
            entry = found
            rerun = False
            try:
                state = entry.run(values)
            except Exception as e:
                rerun = self.met_for_real(entry, values)
                if not rerun:
                    state = self.recover(entry, values, e)
            if rerun:  # the rest of this call runs for real, where the handlers see it
                return self.run_concretely(f)
            if entry.stop is None:
                return state

    def forget(self, entry: Entry) -> None:
        """Drop a compiled segment (it broke at the user's error, not at a limit of ours)."""
        for segment in self.segments.values():
            if entry in segment:
                segment.remove(entry)

    def finish_concretely(self, f: concrete.Frame, point: ResumePoint) -> Any:
        """The rest of the frame from ``point`` cannot be compiled: this call finishes for
        real from where it is (its effects so far happened); later calls run the original
        function, which costs no more than eager (no guards, no interpreted bytecode)."""
        reason = f"the rest of the frame from offset {point.offset} cannot be compiled"
        self.eager_reason = self.eager_reason or reason
        return self.run_concretely(f)

    def run_concretely(self, f: concrete.Frame) -> Any:
        """Run the rest of the frame ``f`` for real (this call only)."""
        from minicompile.capture import concrete

        f.steps = 0
        try:
            return concrete.run_to_end(f)
        except Exception as e:  # the user's: raised where eager raises it
            from minicompile import user_errors

            raise user_errors.raise_at(e, [user_errors.line_of(self.fn, f.last)])
        finally:
            _stats["concrete_instructions"] += f.steps

    def call_at_break(self, fn: Any, args: list, kwargs: dict) -> Any:
        """A call the frame broke at.  When it is a function of the user's (the break was
        inside it), it runs compiled as a frame of its own, as PEP 523 would give it; an
        optimizer's ``step`` runs as ``minicompile.compile(opt.step)`` runs it; a module with
        hooks (capture traces none) runs them as eager does around its compiled forward."""
        opt = optim.recognise(fn)
        if opt is not None:
            steps = _compiled_steps.setdefault(opt, {})
            key = (getattr(fn, "__func__", fn), self.cfg)
            if key not in steps:
                steps[key] = optim.CompiledStep(fn, opt, self.cfg, type(self), _stats)
            return steps[key](*args, **kwargs)
        if _is_user_function(fn):
            wrappers = _callee_wrappers.setdefault(fn, {})
            wrapper = wrappers.get(self.cfg)
            if wrapper is None:
                wrapper = wrappers[self.cfg] = type(self)(fn, self.cfg)
            return wrapper(*args, **kwargs)
        if isinstance(fn, torch.nn.Module) and distributed.has_hooks(fn):
            wrappers = _callee_wrappers.setdefault(fn, {}).setdefault(self.cfg, {})
            return distributed.compiled_call(fn, wrappers, lambda f: type(self)(f, self.cfg),
                                             args, kwargs)
        return fn(*args, **kwargs)

    def segment(self, point: ResumePoint, values: tuple) -> Entry | None:
        """The compiled segment starting at ``point`` for these values (traced on a miss),
        or None when that part of the frame runs for real."""
        if point in self.concrete_points:
            return None
        entries = self.segments.setdefault(point, [])
        for entry in entries:
            if entry.capture.guards.check(*values):
                return entry
        name = f"{self.fn.__qualname__} (from offset {point.offset})"
        if len(entries) >= self.cfg.recompile_limit:
            self.concrete_points.add(point)
            return None
        if entries:
            _stats["recompiles"] += 1
        _stats["frames"] += 1
        try:
            capture, stop = self.capture(point, values, entries, name)
        except Exception as e:
            reason = self.why_not_captured(e, name)
            trace.emit("graph_breaks", name, f"running the rest eagerly: {reason}")
            self.concrete_points.add(point)
            _stats["eager_fallbacks"] += 1
            return None
        entry = self.new_entry(capture, stop, name, values)
        entries.insert(0, entry)
        return entry

    def new_entry(
        self, capture: Capture, stop: Break | None, name: str, values: tuple
    ) -> Entry:
        _stats["instructions"] += capture.instructions
        if stop is not None:
            _stats["graph_breaks"] += 1
            self.breaks.append(stop)
            trace.emit("graph_breaks", name, f"graph break: {stop.reason.describe()}")
        trace.emit("graph", name, lambda: str(capture.graph), f"{self.fn.__name__}.graph.txt")
        trace.emit("guards", name, lambda: str(capture.guards))
        entry = self.build_entry(capture, values)
        entry.stop = stop
        return entry
