"""Automatic dynamic shapes: which input dims (and int arguments) to trace as size symbols.

A dim whose size differs from an earlier entry's, or an int argument that changed, is
symbolic from then on (``dynamic=True`` / ``False`` decide alone).  A segment traced with
symbols has its kernels built at once; what fails with symbols is traced again with static
sizes, which are exact.  :class:`AutoDynamic` is this part of
:class:`minicompile.api.CompiledFunction` (dynamo_backend.py fills its tables ahead).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from minicompile import perf, trace
from minicompile.driver import Entry, compile_graph, describe_symbols
from minicompile.errors import BackendCompilerFailed, Unsupported
from minicompile.runtime.guards import marked_dims

if TYPE_CHECKING:
    from minicompile.capture import Break, Capture, ResumePoint
    from minicompile.capture.dynamic import DynamicPolicy

log = logging.getLogger("minicompile")


class AutoDynamic:
    """Dynamic shapes of a CompiledFunction (see the module docstring)."""

    def policy(self, point: ResumePoint, values: tuple, entries: list[Entry]) -> DynamicPolicy:
        """Which dims to trace as symbols (capture/dynamic.py).  Automatic: a dim whose size
        differs from what an earlier entry was traced with is dynamic from now on."""
        from minicompile.capture.dynamic import DynamicPolicy

        mode = self.cfg.dynamic
        if mode is not None:
            return DynamicPolicy(mode)
        seen, ints = self.note_changes(point, values, entries)
        lengths = frozenset(self.dynamic_lengths.get(point, ()))
        known = frozenset(s for e in entries for s in e.capture.input_sources)
        return DynamicPolicy(None, dict(seen), frozenset(ints), lengths, known)

    def note_changes(self, point: ResumePoint | None, values: tuple,
                     entries: list[Entry]) -> tuple[dict[str, frozenset[int]], set[str]]:
        """Automatic dynamic's tables for ``point`` (None: the frame's start, before capture
        has computed it), with the dims and int arguments of ``values`` that differ from
        what an entry was traced with added.  Looking at the same call again adds nothing."""
        seen = self.dynamic_dims.setdefault(point, {})
        ints = self.dynamic_ints.setdefault(point, set())
        lengths = self.dynamic_lengths.setdefault(point, set())
        for entry in entries:
            for source, (before, after) in entry.capture.guards.changed_ints(*values).items():
                if source not in ints:
                    ints.add(source)
                    trace.emit("dynamic", self.fn.__qualname__,
                               f"{source} is dynamic: traced with {before}, called with {after}")
            try:
                now = [tuple(t.shape) for t in entry.capture.get_inputs(*values)]
            except Exception:  # another structure of arguments: nothing to compare
                continue
            for source, before, after in zip(entry.capture.input_sources, entry.sizes, now):
                if len(before) != len(after):
                    continue
                changed = {d for d, (a, b) in enumerate(zip(before, after)) if a != b}
                lengths.update(before[d] for d in changed)
                new = changed - seen.get(source, frozenset())
                if new:
                    seen[source] = frozenset(seen.get(source, frozenset()) | new)
                    trace.emit("dynamic", self.fn.__qualname__, "\n".join(
                        f"{source} dim {d} is dynamic: traced with size {before[d]}, "
                        f"called with {after[d]}" for d in sorted(new)))
        return seen, ints

    def decision(self, values: tuple, capture: Any) -> dict | None:
        """What automatic dynamic decides for a whole-frame capture of the call ``values``,
        as JSON: the dims and int arguments seen to change (the tables, once
        :meth:`note_changes` has looked at this call) and the dims of the capture's inputs
        marked dynamic.  A warm entry on disk is used only for a call decided as its
        compile was (runtime/entries.py), so a full cache changes no decision.  None when
        ``dynamic`` is True or False, which decides alone."""
        if self.cfg.dynamic is not None:
            return None
        seen = self.dynamic_dims.get(self._root, {})
        ints = self.dynamic_ints.get(self._root, set())
        marks = {}
        sizes: set[int] = set()
        for source, t in zip(capture.input_sources, capture.get_inputs(*values)):
            dims = marked_dims(t) if isinstance(t, torch.Tensor) else ()
            if dims:
                marks[source] = sorted(dims)
            if isinstance(t, torch.Tensor):
                sizes.update(t.shape)
        # (only the moved lengths some input has: they alone can change what is symbolic)
        lengths = self.dynamic_lengths.get(self._root, set()) & sizes
        return {"dims": {s: sorted(d) for s, d in seen.items() if d}, "ints": sorted(ints),
                "marks": marks, "lengths": sorted(lengths)}

    def capture(self, point: ResumePoint, values: tuple, entries: list[Entry], name: str,
                allow_break: bool = True) -> tuple[Capture, Break | None]:
        """Trace a segment, with symbolic sizes where the policy asks for them; what
        cannot be traced (or compiled) with symbols is traced again with static sizes."""
        from minicompile.capture import capture_segment
        from minicompile.capture.dynamic import STATIC

        policy = self.policy(point, values, entries)
        if policy.mode is not False:  # dims may be symbolic (marked, or seen to change)
            try:
                with perf.phase("capture"):
                    capture, stop = capture_segment(self.fn, point, values, allow_break, policy)
                if capture.graph.shapes is None:
                    return capture, stop
                try:  # its kernels built now, so that a failure can fall back to static sizes
                    capture.compiled = compile_graph(capture, self.cfg, self.fn.__qualname__)
                except BackendCompilerFailed as e:
                    raise Unsupported(f"kernels with symbolic sizes failed to build: {e}") from e
                trace.emit("dynamic", name, describe_symbols(capture))
                return capture, stop
            except Unsupported as e:
                trace.emit("dynamic", name, f"compiled with static sizes: {e.describe()}")
            except Exception as e:  # a gap in symbolic support: static sizes are exact
                log.debug("minicompile: dynamic capture of %s failed", name, exc_info=True)
                trace.emit("dynamic", name, f"compiled with static sizes: internal error "
                           f"with symbolic sizes: {type(e).__name__}: {e}")
        with perf.phase("capture"):
            return capture_segment(self.fn, point, values, allow_break, STATIC)
