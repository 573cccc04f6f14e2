"""The public API; with minicompile/driver.py the one place that wires the pipeline.

``compile(fn)`` returns a :class:`CompiledFunction`.  A call runs the guards of each entry
(newest first) and, on a hit, its compiled code; a miss captures the frame and compiles a
new entry.  Whatever cannot be compiled runs eagerly, with the reason logged, never with a
different result.  Graph breaks at run time live in resume.py, automatic dynamic shapes in
auto_dynamic.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
import types
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from minicompile import config, distributed, heap, optim, perf, trace
from minicompile.auto_dynamic import AutoDynamic
from minicompile.binder import binder
from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed, HookedModuleCall, Unsupported
from minicompile.driver import Entry, compile_graph
from minicompile.driver import counters as _stats
from minicompile.resume import Resuming, _callee_wrappers, _compiled_steps
from minicompile.runtime import build, cache, entries, profile

# Capture, the passes, lowering and codegen import sympy and PyTorch's fake tensors
# (most of a second): they are imported on the first miss, not at `import minicompile`, so a
# process whose calls all find warm entries on disk (runtime/entries.py) never loads them.
if TYPE_CHECKING:
    from minicompile.capture import Break, Capture, ResumePoint

log = logging.getLogger("minicompile")

BACKENDS = ("auto", "cpp", "triton")
MODES = (None, "default", "reduce-overhead", "max-autotune")

# Every wrapper still in use, so reset() can clear them (weak: a compiled function the program
# dropped, its model and its kernels' kept memory go with it, as eager's would).
_compiled: weakref.WeakSet[CompiledFunction] = weakref.WeakSet()


def stats() -> dict[str, int]:
    """Counters since the last :func:`reset`: frames captured, graphs compiled, warm
    entries loaded from disk, graph breaks, recompiles, kernels, cache hits, eager
    fallbacks, bytecode instructions traced (``instructions``) and run for real
    (``concrete_instructions``).  A cache on disk changes how the work is done, never what is
    decided: ``graphs + warm_entries``, ``recompiles``, ``graph_breaks``, ``kernels`` and
    ``eager_fallbacks`` are the same with an empty one."""
    return dict(_stats)


def reset() -> None:
    """Forget all compiled code and zero the stats, with or without a cache on disk: the
    next call looks there, as a new process would (what it loads counts as
    ``warm_entries``)."""
    for fn in _compiled:
        for table in (fn.entries, fn.concrete_points, fn.dynamic_dims, fn.dynamic_ints,
                      fn.dynamic_lengths, fn.breaks):
            table.clear()
        fn.segments = {} if fn._root is None else {fn._root: fn.entries}
        fn.eager_reason = None
        fn.calls_compiled = False
    build.forget()
    profile.forget()
    _callee_wrappers.clear()
    _compiled_steps.clear()
    _stats.update(dict.fromkeys(_stats, 0))


class CompiledFunction(Resuming, AutoDynamic):
    def __init__(self, fn: Callable, cfg: Config) -> None:
        if isinstance(fn, types.MethodType):
            self.fn, self.bound_self = fn.__func__, fn.__self__
        else:
            self.fn, self.bound_self = fn, None
        if not isinstance(self.fn, types.FunctionType):
            raise TypeError("minicompile.compile expects a Python function or method, got "
                            f"{type(fn).__name__}")
        self.original = fn
        self.cfg = cfg
        # The compiled versions of the frame's first segment, newest first.
        self.entries: list[Entry] = []
        # Compiled segments by where they start; the root's (self.entries) are the
        # whole-frame entries, filed under it once capture has computed it (self.root).
        self.segments: dict[ResumePoint, list[Entry]] = {}
        self._root: ResumePoint | None = None
        self.concrete_points: set[ResumePoint] = set()  # the rest of the frame runs for real
        self.eager_reason: str | None = None
        self.calls_compiled = False  # running for real, calls of hooked modules compiled
        self.breaks: list[Break | Unsupported] = []  # every break met, for explain()
        # Automatic dynamic: per segment start, the dims of each input source seen to change.
        self.dynamic_dims: dict[ResumePoint, dict[str, frozenset[int]]] = {}
        self.dynamic_ints: dict[ResumePoint, set[str]] = {}  # int arguments seen to change
        self.dynamic_lengths: dict[ResumePoint, set[int]] = {}  # sizes dims changed from
        # The frame's parameters from the call's arguments, as the code that runs binds them
        # (not as functools.wraps advertises: a `wrapper(*args, **kwargs)` binds its
        # arguments into `args` and `kwargs`).
        self.bind = binder(self.fn)
        code = self.fn.__code__
        self.n_params = code.co_argcount + code.co_kwonlyargcount
        varargs = code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        self.simple = not varargs and code.co_kwonlyargcount == 0
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]
        _compiled.add(self)

    # -- the per-call path ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        if self.eager_reason is not None:
            return self.run_eagerly(args, kwargs)
        simple = not kwargs and self.simple and len(args) == self.n_params
        frame = args if simple else self.bind(*args, **kwargs)
        for entry in self.entries:
            if entry.capture.guards.check(*frame):
                return self.run_root(entry, frame, args, kwargs)
        return self.compile_and_run(frame, args, kwargs)

    def run_root(self, entry: Entry, frame: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run a whole-frame (or first-segment) entry whose guards passed, then the rest of
        the frame."""
        failed: Exception | None = None
        try:
            state = entry.run(frame)
        except Exception as e:
            if self.met_for_real(entry, frame):
                failed = e
            else:
                state = self.recover(entry, frame, e)
        if failed is not None:  # (out of the except block: eager's exception has no context)
            return self.rerun_eagerly(entry, failed, args, kwargs)
        return state if entry.stop is None else self.resume(entry, state)

    def met_for_real(self, entry: Entry, frame: tuple) -> bool:
        """A compiled segment raised: whether its code must run for real to meet the error
        as eager does (an entry from disk has no graph to tell whose error it is; a handler
        of the user's may catch an error the graph raised outside it)."""
        from minicompile import user_errors

        capture = entry.capture
        if capture.graph is None:
            return True
        return capture.handlers and user_errors.eager_error(
            capture.graph, capture.get_inputs(*frame)) is not None

    def rerun_eagerly(self, entry: Entry, e: Exception, args: tuple,
                      kwargs: dict[str, Any]) -> Any:
        """Run this call eagerly, ``entry``'s code having raised ``e`` before any effect: the
        user's exception is raised or caught as in eager.  Where eager returns but an entry
        from disk raised (no handler could catch it), that entry was wrong: one warning, and
        it is dropped (strict mode raises)."""
        result = self.fn(*args, **kwargs)
        if entry.capture.graph is None and not entry.capture.handlers:
            if self.cfg.strict:
                raise e
            warnings.warn(f"minicompile: {self.fn.__qualname__}: an entry loaded from disk "
                          f"raised {type(e).__name__} where eager does not ({e}); it is "
                          f"compiled again", stacklevel=4)
            _stats["eager_fallbacks"] += 1
            self.entries.remove(entry)
            if entry.file is not None:
                cache.discard(entry.file)
        return result

    @property
    def root(self) -> ResumePoint:
        """Where the frame's first segment starts (computed on the first capture)."""
        if self._root is None:
            from minicompile.capture import root_point

            self._root = root_point(self.fn.__code__)
            self.segments[self._root] = self.entries
            # (tables filled before: a warm entry was looked for, which computes no root)
            for table in (self.dynamic_dims, self.dynamic_ints, self.dynamic_lengths):
                if None in table:
                    table[self._root] = table.pop(None)
        return self._root

    # -- the miss path ----------------------------------------------------------------------

    def compile_and_run(self, frame: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        # Full collections during a compile (and the first run, which builds the kernels)
        # walk only the objects it makes, not the whole process (minicompile/heap.py).
        with heap.frozen():
            return self._compile_and_run(frame, args, kwargs)

    def _compile_and_run(self, frame: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        cfg = self.cfg
        name = self.fn.__qualname__
        reasons = [e.capture.guards.explain_failure(*frame) for e in self.entries]
        if cfg.warm_entries:
            entry = self.load_warm(frame)
            if entry is not None:
                self.count_recompile(reasons, "an entry on disk matched")
                return self.run_root(entry, frame, args, kwargs)
        # Entries loaded from disk cost no compile: only compiled ones use up the limit.
        if sum(not e.warm for e in self.entries) >= cfg.recompile_limit:
            warnings.warn(f"minicompile: {name} hit the recompile limit ({cfg.recompile_limit}); "
                          f"it runs eagerly from now on. Last guard failure: {reasons[0]}",
                          stacklevel=3)
            return self.give_up(f"recompile limit ({cfg.recompile_limit}) reached", args, kwargs)
        self.count_recompile(reasons, "compiling")
        _stats["frames"] += 1
        failed: Exception | None = None
        with perf.graph(name):
            with perf.phase("import"):
                _import_compiler()
            heap.refreeze()  # the compiler's modules are old objects too
            try:
                capture, stop = self.capture(self.root, frame, self.entries, name,
                                             not cfg.fullgraph)
            except Exception as e:
                if cfg.fullgraph and isinstance(e, Unsupported):
                    raise
                failed = e
            if failed is None:
                entry = self.new_entry(capture, stop, name, frame)
        if failed is not None:  # (out of the except block: the user's exceptions from the
            reason = self.why_not_captured(failed, name)  # eager run get no context of ours)
            if isinstance(failed, Unsupported):
                self.breaks.append(failed)
            trace.emit("graph_breaks", name, f"running {name} eagerly: {reason}")
            log.info("minicompile: running %s eagerly: %s", name, reason)
            if isinstance(failed, Unsupported) and failed.raises:
                return self.run_eagerly_once(reason, args, kwargs)
            return self.give_up(reason, args, kwargs, isinstance(failed, HookedModuleCall))
        self.entries.insert(0, entry)
        result = self.run_root(entry, frame, args, kwargs)
        if cfg.warm_entries:  # after the first run: Triton builds a kernel at its launch
            self.store_warm(entry, frame)
        return result

    def count_recompile(self, reasons: list[str | None], then: str) -> None:
        """A call no entry matched, of a function with entries (``reasons``: why each
        failed): one recompile, whether a compile or an entry on disk answers it."""
        if reasons:
            _stats["recompiles"] += 1
            trace.emit("recompiles", self.fn.__qualname__, "\n".join(
                [*(f"entry {k}: {r}" for k, r in enumerate(reasons)), then]))

    # -- errors -----------------------------------------------------------------------------

    def why_not_captured(self, e: Exception, name: str) -> str:
        """The reason a capture failed, for the logs.  Anything but Unsupported is our own
        bug: one warning, and the code runs eagerly (strict mode raises it)."""
        if isinstance(e, Unsupported):
            return e.describe()
        if self.cfg.strict:
            raise e
        reason = f"internal error while capturing: {type(e).__name__}: {e}"
        log.debug("minicompile: capturing %s failed", name, exc_info=True)
        warnings.warn(f"minicompile: {name} runs eagerly: {reason}", stacklevel=5)
        return reason

    def run_eagerly_once(self, reason: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The frame raises in eager (the user's error, found while tracing): run it eagerly
        so the user sees it; later calls compile as usual, unless this one did not raise."""
        _stats["eager_fallbacks"] += 1
        result = self.fn(*args, **kwargs)
        self.eager_reason = reason
        return result

    def recover(self, entry: Entry, frame: tuple, e: Exception) -> Any:
        """A compiled segment raised ``e``.  If eager raises too, the error is the user's,
        raised as eager raises it.  Else the compiled code is wrong (or failed to build at
        launch): one warning, and the graph runs eagerly from now on (strict mode raises)."""
        name = self.fn.__qualname__
        capture = entry.capture
        if entry.eager_reason is not None or (self.cfg.strict and _is_build_failure(e)):
            raise e  # an eager graph raises at the user's line already
        from minicompile import user_errors

        user_errors.raise_eager_error(capture.graph, capture.get_inputs(*frame))
        if self.cfg.strict:
            raise e
        what = "kernel failed to build" if _is_build_failure(e) else (
            f"compiled code raised {type(e).__name__} where eager does not")
        warnings.warn(f"minicompile: {name} runs eagerly: {what}: {e}", stacklevel=4)
        self.run_graph_eagerly(entry, f"{what}: {e}")
        return entry.run(frame)

    # -- warm entries on disk ---------------------------------------------------------------

    def load_warm(self, frame: tuple) -> Entry | None:
        """On a miss: the newest entry of this function on disk that ``frame`` can use and
        this call would compile (runtime/entries.py: find), loaded as the newest entry in
        memory, or None."""
        start = time.perf_counter()
        if self.cfg.dynamic is None:  # what automatic dynamic decides for this call
            self.note_changes(self._root, frame, self.entries)
        skip = {e.file for e in self.entries if e.file is not None}
        warm = entries.find(self.fn, self.cfg, frame, skip,
                            lambda capture: self.decision(frame, capture))
        perf.warm_entries(self.fn.__qualname__, int(warm is not None),
                          time.perf_counter() - start)
        if warm is None:
            return None
        _stats["warm_entries"] += 1
        _stats["kernels"] += warm.kernels
        _stats["cache_hits"] += 1
        entry = Entry(warm.capture, warm.run, call=warm.call, sizes=warm.sizes,  # type: ignore[arg-type]
                      file=warm.path, warm=True)
        self.entries.insert(0, entry)
        return entry

    def store_warm(self, entry: Entry, frame: tuple) -> None:
        """Write a whole-frame entry to disk for later processes, where it can be."""
        why = ("it breaks the graph" if entry.stop is not None
               else "it runs eagerly" if entry.eager_reason is not None
               else "it has a backward graph" if entry.artefact is None
               # (a CUDA graph's call is recorded and replayed; a checked one runs beside eager)
               else "mode='reduce-overhead'" if self.cfg.mode == "reduce-overhead"
               else "MINICOMPILE_CHECK" if self.cfg.check else None)
        try:
            decided = None if why else self.decision(frame, entry.capture)
        except Exception as e:  # the call changed its arguments' structure
            why = f"its inputs cannot be read again ({type(e).__name__}: {e})"
        if why:
            trace.emit("cache", self.fn.__qualname__, f"not stored on disk: {why}")
            return
        loaded, interpret, no_grad, derived = entry.artefact
        stored = entries.Stored(self.fn, entry.capture, loaded, interpret, no_grad,
                                loaded.kernels, entry.sizes, derived, decided)
        entry.file = entries.save(stored, self.cfg)

    # -- building entries, eager fallbacks --------------------------------------------------

    def give_up(self, reason: str, args: tuple, kwargs: dict[str, Any],
                hooked_call: bool = False) -> Any:
        """From now on the frame runs for real (:meth:`run_eagerly`); ``hooked_call``: it
        could not be captured for a call of a module with hooks."""
        from minicompile.capture.segments import why_not_concrete

        self.eager_reason = reason
        self.calls_compiled = hooked_call and why_not_concrete(self.fn.__code__, 0) is None
        _stats["eager_fallbacks"] += 1
        return self.run_eagerly(args, kwargs)

    def run_eagerly(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The frame, for real: the function itself, or, where it calls modules with hooks
        (a model sharded per block with FSDP2 whose blocks are called in a loop), its
        bytecode run by the concrete executor with those calls compiled as frames of their
        own, as Dynamo compiles the frames a skipped frame calls."""
        if not self.calls_compiled:
            return self.fn(*args, **kwargs)
        from minicompile.capture import concrete

        frame = self.bind(*args, **kwargs)
        f = concrete.Frame.at(self.fn, 0, dict(zip(self.root.local_names, frame)), [])
        f.call = self.call_at_break
        return self.run_concretely(f)

    def run_graph_eagerly(self, entry: Entry, reason: str) -> None:
        """From now on ``entry`` evaluates its graph with PyTorch ops; guards, write-backs
        and side effects stay as compiled."""
        from minicompile import user_errors
        from minicompile.ops import run_graph

        _stats["eager_fallbacks"] += 1
        entry.eager_reason = reason
        capture = entry.capture
        graph, get_inputs, rebuild = capture.graph, capture.get_inputs, capture.rebuild

        def run(frame: tuple) -> Any:
            inputs = get_inputs(*frame)
            return rebuild(run_graph(graph, inputs, user_errors.raise_at_node), *frame)

        entry.run = run

    def build_entry(self, capture: Capture, values: tuple) -> Entry:
        entry = self._build_entry(capture)
        entry.sizes = [tuple(t.shape) for t in capture.get_inputs(*values)
                       if isinstance(t, torch.Tensor)]
        return entry

    def _build_entry(self, capture: Capture) -> Entry:
        cfg = self.cfg
        name = self.fn.__qualname__
        try:
            if capture.compiled is not None:  # built while choosing symbolic sizes
                run, call, artefact = capture.compiled
            else:
                run, call, artefact = compile_graph(capture, cfg, name)
        except Exception as e:  # Unsupported, a build failure, or minicompile's own bug
            if cfg.strict:
                raise
            if isinstance(e, Unsupported):
                reason = e.describe()
            elif isinstance(e, BackendCompilerFailed):
                reason = str(e)
            else:
                reason = f"internal error while compiling: {type(e).__name__}: {e}"
                log.debug("minicompile: compiling %s failed", name, exc_info=True)
            if not (isinstance(e, Unsupported) or getattr(e, "warned", False)):
                warnings.warn(f"minicompile: {name} runs eagerly: {reason}", stacklevel=4)
            trace.emit("graph_breaks", name, f"running {name}'s graph eagerly: {reason}")
            entry = Entry(capture, lambda frame: None)
            self.run_graph_eagerly(entry, reason)
            return entry
        _stats["graphs"] += 1
        return Entry(capture, run, call=call, artefact=artefact)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Decorating a method: bind like a function does."""
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def __repr__(self) -> str:
        return f"<minicompile.CompiledFunction {self.fn.__qualname__}>"


def _import_compiler() -> None:
    """Import capture and the compiler (sympy, fake tensors): on the first miss."""
    from minicompile.runtime import toolchain

    # Before anything imports torch._dynamo (PyTorch's meta functions may; it imports
    # Triton): a Triton whose import raises raises ImportError, as if not installed.
    toolchain.guard_triton_import()
    if torch.cuda.is_initialized():
        from minicompile.runtime import triton_build

        if triton_build.available():  # GPU kernels to come: their build workers start now
            triton_build.start_workers()
    import minicompile.capture  # noqa: F401
    import minicompile.codegen.wrapper  # noqa: F401
    import minicompile.lowering  # noqa: F401
    import minicompile.passes.fusion  # noqa: F401
    import minicompile.passes.pipeline  # noqa: F401


def _is_build_failure(e: Exception) -> bool:
    module = type(e).__module__ or ""
    return module.startswith("triton") or isinstance(e, BackendCompilerFailed)


def compile(fn: Callable | None = None, *, backend: str = "auto", dynamic: bool | None = None,
            fullgraph: bool = False, mode: str | None = None) -> Any:
    """Compile ``fn`` (a function, a method, an optimizer's ``step``, or an ``nn.Module``:
    then an :class:`OptimizedModule` sharing its parameters); bare or with options.

    backend: "auto" (Triton for CUDA tensors, C++ for CPU), "triton", "cpp".  dynamic: None
    (automatic), True, False.  fullgraph: raise instead of running eagerly.  mode: None /
    "default"; "max-autotune" times a few Triton configurations per kernel and size class
    (runtime/autotune.py); "reduce-overhead" replays inference graphs on CUDA tensors as
    CUDA graphs (runtime/cudagraphs.py).
    """
    if backend not in BACKENDS:
        raise ValueError(f"minicompile.compile: unknown backend {backend!r}; use one of {BACKENDS}")
    if mode not in MODES:
        raise ValueError(f"minicompile.compile: unknown mode {mode!r}; use one of {MODES}")
    if dynamic not in (None, True, False):
        raise ValueError("minicompile.compile: dynamic must be None, True or False")
    base = config.get()
    cfg = dataclasses.replace(base, backend=backend if backend != "auto" else base.backend,
                              dynamic=dynamic, fullgraph=fullgraph, mode=mode)
    if fn is None:
        return lambda f: compile(f, backend=backend, dynamic=dynamic, fullgraph=fullgraph,
                                 mode=mode)
    if isinstance(fn, torch.nn.Module):
        return OptimizedModule(fn, cfg)
    opt = optim.recognise(fn)
    if opt is not None:  # an optimizer's step: its update, with combo kernels
        return optim.CompiledStep(fn, opt, cfg, CompiledFunction, _stats)
    return CompiledFunction(fn, cfg)


class OptimizedModule(torch.nn.Module):
    """``minicompile.compile(module)``: the module's forward, compiled, sharing its state (held
    as ``_orig_mod``; attributes and state dicts go to it, so checkpoints keep their keys).
    Of a DDP, the wrapped module is compiled and DDP's forward runs around it."""

    def __init__(self, mod: torch.nn.Module, cfg: Config) -> None:
        super().__init__()
        self._orig_mod = mod
        target = mod.module if distributed.is_ddp(mod) else mod  # of a DDP, the wrapped one
        forward = type(target).forward
        self.__dict__["_compiled"] = CompiledFunction(types.MethodType(forward, target), cfg)
        self.__dict__["_cfg"] = cfg

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._modules["_orig_mod"]  # (not through nn.Module.__getattr__: 1-5 us a call)
        if distributed.is_ddp(mod):  # DDP's forward as in eager, the wrapped one's compiled
            return distributed.call_with_forward(mod.module, self.__dict__["_compiled"], mod,
                                                 args, kwargs)
        if "forward" in mod.__dict__:
            return mod(*args, **kwargs)  # a patched forward runs as written
        if distributed.has_hooks(mod):  # hooks (FSDP2's) as in eager, around the compiled forward
            return distributed.call_with_forward(mod, self._forward_now(mod), mod, args, kwargs)
        return self._forward_now(mod)(*args, **kwargs)

    def _forward_now(self, mod: torch.nn.Module) -> Callable[..., Any]:
        """The compiled forward for this call: of the class's forward, or of the one capture
        traces in its place (a training BatchNorm without momentum)."""
        traced = None
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):  # capture's import is
            from minicompile.capture import training_ops  # costly: only where it can apply

            traced = training_ops.module_forward(mod)  # the one capture traces in its place
        if traced is not None:
            compiled = self.__dict__.setdefault("_compiled_as_traced", {})
            if traced not in compiled:
                compiled[traced] = CompiledFunction(types.MethodType(traced, mod),
                                                    self.__dict__["_cfg"])
            return compiled[traced]
        return self.__dict__["_compiled"]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = getattr(self._modules["_orig_mod"], name)
        if (isinstance(value, types.MethodType) and value.__self__ is self._orig_mod
                and name != "forward" and not hasattr(torch.nn.Module, name)):
            return self._through_compiled_forward(value)
        return value

    def _through_compiled_forward(self, method: types.MethodType) -> Callable:
        """A method of the module's own class (``generate``) whose calls of the module run
        the compiled forward, as the user of ``compiled.generate(...)`` means: the compiled
        function is the module's forward for the length of the call."""

        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            mod = self._orig_mod
            if distributed.is_ddp(mod):
                return method(*args, **kwargs)
            return distributed.call_with_forward(mod, self.__dict__["_compiled"], method, args,
                                                 kwargs)

        return run

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"
