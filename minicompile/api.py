"""The public API, and with minicompile/driver.py the one place that wires the pipeline
together:

    capture -> graph passes -> lowering -> fusion -> codegen -> runtime build/load

``compile(fn)`` returns a :class:`CompiledFunction`.  A call binds its arguments, runs the
guards of each cache entry (newest first) and, on a hit, that entry's compiled code.  On a
miss it captures the frame and compiles a new entry; whatever cannot be compiled runs
eagerly, with the reason logged, never with a different result.  Two parts of it live
beside it: graph breaks at run time (:mod:`minicompile.resume`) and automatic dynamic
shapes (:mod:`minicompile.auto_dynamic`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from minicompile import config, distributed, heap, optim, perf, trace
from minicompile.auto_dynamic import AutoDynamic
from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed, Unsupported
from minicompile.driver import compile_graph
from minicompile.driver import counters as _stats
from minicompile.resume import Resuming, _callee_wrappers, _compiled_steps
from minicompile.runtime import build, entries, profile

# Capture, the passes, lowering and codegen import sympy and PyTorch's fake tensors
# (most of a second): they are imported on the first miss, not at `import minicompile`, so a
# process whose calls all find warm entries on disk (runtime/entries.py) never loads them.
if TYPE_CHECKING:
    from minicompile.capture import Break, Capture, ResumePoint

log = logging.getLogger("minicompile")

BACKENDS = ("auto", "cpp", "triton")
MODES = (None, "default", "reduce-overhead", "max-autotune")

_compiled: list[CompiledFunction] = []  # every wrapper, so reset() can clear them


def stats() -> dict[str, int]:
    """Counters since the last :func:`reset`: frames captured, graphs compiled, graph
    breaks, recompiles, kernels in the compiled code (built or loaded from the cache),
    cache hits (graphs whose code was found on disk or in memory), eager fallbacks,
    bytecode instructions traced (``instructions``) and run by the concrete executor
    (``concrete_instructions``: breaking instructions, and frames finished for real)."""
    return dict(_stats)


def reset() -> None:
    """Forget all compiled code and zero the stats (the on-disk cache stays: the next call
    looks there, as a new process would)."""
    for fn in _compiled:
        fn.entries.clear()
        fn.looked_on_disk = False
        fn.segments = {} if fn._root is None else {fn._root: fn.entries}
        fn.concrete_points.clear()
        fn.dynamic_dims.clear()
        fn.dynamic_ints.clear()
        fn.breaks.clear()
        fn.eager_reason = None
    build.forget()
    profile.forget()
    _callee_wrappers.clear()
    _compiled_steps.clear()
    for key in _stats:
        _stats[key] = 0


@dataclasses.dataclass
class Entry:
    """One compiled version of a frame, valid where its guards pass."""

    capture: Capture
    run: Callable[[tuple], Any]
    eager_reason: str | None = None  # set when this entry runs its graph eagerly
    stop: Break | None = None  # where the segment breaks; None: it runs to the return
    # The generated wrapper's call(inputs) (allocate, launch, return), for inspection and
    # benchmarks; None for an eager entry.
    call: Callable[[list], tuple] | None = None
    sizes: list = dataclasses.field(default_factory=list)  # the traced inputs' sizes
    # What a warm entry on disk needs of a graph without a backward: the loaded wrapper,
    # whether it runs under Triton's interpreter, and under no_grad, its WithDerived or None.
    artefact: tuple[build.Loaded, bool, bool, Any] | None = None


class CompiledFunction(Resuming, AutoDynamic):
    def __init__(self, fn: Callable, cfg: Config) -> None:
        if isinstance(fn, types.MethodType):
            self.fn, self.bound_self = fn.__func__, fn.__self__
        else:
            self.fn, self.bound_self = fn, None
        if not isinstance(self.fn, types.FunctionType):
            raise TypeError(
                f"minicompile.compile expects a Python function or method, got {type(fn).__name__}"
            )
        self.original = fn
        self.cfg = cfg
        # The compiled versions of the frame's first segment, newest first.
        self.entries: list[Entry] = []
        # Compiled segments by where they start; the root's (self.entries) are the
        # whole-frame entries, filed under it once capture has computed it (self.root).
        self.segments: dict[ResumePoint, list[Entry]] = {}
        self._root: ResumePoint | None = None
        self.looked_on_disk = False  # for warm entries (runtime/entries.py), once
        self.concrete_points: set[ResumePoint] = set()  # the rest of the frame runs for real
        self.eager_reason: str | None = None
        self.breaks: list[Break | Unsupported] = []  # every break met, for explain()
        # Automatic dynamic: per segment start, the dims of each input source seen to change.
        self.dynamic_dims: dict[ResumePoint, dict[str, frozenset[int]]] = {}
        self.dynamic_ints: dict[ResumePoint, set[str]] = {}  # int arguments seen to change
        # The signature of the code that runs: not the one functools.wraps advertises
        # (a `wrapper(*args, **kwargs)` binds its arguments into `args` and `kwargs`).
        self.signature = inspect.signature(self.fn, follow_wrapped=False)
        code = self.fn.__code__
        self.n_params = code.co_argcount + code.co_kwonlyargcount
        self.simple = not (code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)) and (
            code.co_kwonlyargcount == 0
        )
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]
        _compiled.append(self)

    # -- the per-call path ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        if self.eager_reason is not None:
            return self.fn(*args, **kwargs)
        frame = args if (not kwargs and self.simple and len(args) == self.n_params) else (
            self.bind(args, kwargs)
        )
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
        as eager does.  An entry loaded from disk has no graph to tell whose error it is; a
        try / except / finally / with of the user's may catch a user's error (one eager
        raises running the graph), which the graph raised outside those blocks."""
        from minicompile import user_errors

        capture = entry.capture
        if capture.graph is None:
            return True
        return capture.handlers and user_errors.eager_error(
            capture.graph, capture.get_inputs(*frame)) is not None

    def rerun_eagerly(self, entry: Entry, e: Exception, args: tuple,
                      kwargs: dict[str, Any]) -> Any:
        """Run this call eagerly, ``entry``'s compiled code having raised ``e`` before it did
        anything (write-backs and side effects come after the graph): the user's exception
        is raised, or caught by the user's handlers, as in eager.  If eager returns where an
        entry loaded from disk raised, and no handler of the user's could have caught it,
        that entry was wrong: one warning, and it is dropped (the next call compiles
        afresh; strict mode raises)."""
        result = self.fn(*args, **kwargs)
        if entry.capture.graph is None and not entry.capture.handlers:
            if self.cfg.strict:
                raise e
            warnings.warn(f"minicompile: {self.fn.__qualname__}: an entry loaded from disk "
                          f"raised {type(e).__name__} where eager does not ({e}); it is "
                          f"compiled again", stacklevel=4)
            _stats["eager_fallbacks"] += 1
            self.entries.remove(entry)
        return result

    @property
    def root(self) -> ResumePoint:
        """Where the frame's first segment starts (computed on the first capture)."""
        if self._root is None:
            from minicompile.capture import root_point

            self._root = root_point(self.fn.__code__)
            self.segments[self._root] = self.entries
        return self._root

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """The frame's parameter values in co_varnames order (then *args, then **kwargs)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        code = self.fn.__code__
        names = code.co_varnames[: self.n_params]
        values = [bound.arguments[n] for n in names]
        flags = code.co_flags
        if flags & inspect.CO_VARARGS:
            values.append(tuple(bound.arguments.get(code.co_varnames[self.n_params], ())))
        if flags & inspect.CO_VARKEYWORDS:
            index = self.n_params + bool(flags & inspect.CO_VARARGS)
            values.append(dict(bound.arguments.get(code.co_varnames[index], {})))
        return tuple(values)

    # -- the miss path ----------------------------------------------------------------------

    def compile_and_run(self, frame: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        # Full collections during a compile (and the first run, which builds the kernels)
        # walk only the objects it makes, not the whole process (minicompile/heap.py).
        with heap.frozen():
            return self._compile_and_run(frame, args, kwargs)

    def _compile_and_run(self, frame: tuple, args: tuple, kwargs: dict[str, Any]) -> Any:
        cfg = self.cfg
        name = self.fn.__qualname__
        if cfg.warm_entries and not self.looked_on_disk:
            self.looked_on_disk = True
            entry = self.load_warm(frame)
            if entry is not None:
                return self.run_root(entry, frame, args, kwargs)
        if self.entries:
            reasons = [e.capture.guards.explain_failure(*frame) for e in self.entries]
            if len(self.entries) >= cfg.recompile_limit:
                warnings.warn(
                    f"minicompile: {name} hit the recompile limit ({cfg.recompile_limit}); "
                    f"it runs eagerly from now on. Last guard failure: {reasons[0]}",
                    stacklevel=3,
                )
                return self.give_up(f"recompile limit ({cfg.recompile_limit}) reached", args, kwargs)
            _stats["recompiles"] += 1
            trace.emit("recompiles", name, "\n".join(
                f"entry {k}: {r}" for k, r in enumerate(reasons)))
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
            return self.give_up(reason, args, kwargs)
        self.entries.insert(0, entry)
        result = self.run_root(entry, frame, args, kwargs)
        if cfg.warm_entries:  # after the first run: Triton builds a kernel at its launch
            self.store_warm(entry)
        return result

    # -- errors -----------------------------------------------------------------------------

    def why_not_captured(self, e: Exception, name: str) -> str:
        """The reason a capture failed, for the logs.  An exception other than Unsupported
        is minicompile's own bug: one warning, and the code runs eagerly (strict mode
        raises it)."""
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
        so the user sees that exception.  Later calls are compiled as usual, unless this one
        did not raise after all."""
        _stats["eager_fallbacks"] += 1
        result = self.fn(*args, **kwargs)
        self.eager_reason = reason
        return result

    def recover(self, entry: Entry, frame: tuple, e: Exception) -> Any:
        """A compiled segment raised ``e``.  If eager raises too, on the same inputs, the
        error is the user's: it is raised as eager raises it (type, message, the user's line
        in the traceback).  If eager does not, the compiled code is wrong (or failed to
        build at launch: Triton's JIT): one warning, and the segment's graph runs eagerly
        from now on (strict mode raises)."""
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
        """Load this function's entries from disk (runtime/entries.py), the modules they
        hold those of ``frame``; return the first whose guards pass on ``frame``, or None."""
        start = time.perf_counter()
        warm = entries.load_all(self.fn, self.cfg, frame)
        perf.warm_entries(self.fn.__qualname__, len(warm), time.perf_counter() - start)
        for w in warm:
            _stats["graphs"] += 1
            _stats["kernels"] += w.kernels
            _stats["cache_hits"] += 1
            self.entries.append(Entry(w.capture, w.run, call=w.call, sizes=w.sizes))  # type: ignore[arg-type]
        for entry in self.entries:
            if entry.capture.guards.check(*frame):
                return entry
        for w in warm:  # (loaded, for later calls: this one's guards refuse each)
            trace.emit("cache", self.fn.__qualname__, "entry loaded but not used for this "
                       f"call: {w.capture.guards.explain_failure(*frame)}")
        return None

    def store_warm(self, entry: Entry) -> None:
        """Write a whole-frame entry to disk for later processes, where it can be."""
        name = self.fn.__qualname__
        if entry.stop is not None or entry.eager_reason is not None:
            why = "it breaks the graph" if entry.stop is not None else "it runs eagerly"
            trace.emit("cache", name, f"not stored on disk: {why}")
            return
        if entry.artefact is None:
            trace.emit("cache", name, "not stored on disk: it has a backward graph")
            return
        if self.cfg.mode == "reduce-overhead":  # its call is recorded and replayed
            trace.emit("cache", name, "not stored on disk: mode='reduce-overhead'")
            return
        if self.cfg.check:  # its call runs beside eager (minicompile/check.py)
            trace.emit("cache", name, "not stored on disk: MINICOMPILE_CHECK")
            return
        if len(self.entries) > self.cfg.recompile_limit:
            return
        loaded, interpret, no_grad, derived = entry.artefact
        stored = entries.Stored(self.fn, entry.capture, loaded, interpret, no_grad,
                                loaded.kernels, entry.sizes, derived)
        entries.save(stored, self.cfg)

    # -- building entries, eager fallbacks --------------------------------------------------

    def give_up(self, reason: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        self.eager_reason = reason
        _stats["eager_fallbacks"] += 1
        return self.fn(*args, **kwargs)

    def run_graph_eagerly(self, entry: Entry, reason: str) -> None:
        """From now on ``entry`` evaluates its graph with PyTorch ops (its kernels could
        not be built); guards, write-backs and side effects stay as compiled."""
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
    """Import capture and the compiler (sympy, PyTorch's fake tensors): on the
    first miss, not at `import minicompile` (timed as its own phase under
    MINICOMPILE_LOGS=perf)."""
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


def compile(
    fn: Callable | None = None,
    *,
    backend: str = "auto",
    dynamic: bool | None = None,
    fullgraph: bool = False,
    mode: str | None = None,
) -> Any:
    """Compile ``fn`` (a function, a method, or an ``nn.Module``: then an
    :class:`OptimizedModule` sharing its parameters).  Usable bare (``@minicompile.compile``)
    or with options.

    backend: "auto" (Triton for CUDA tensors, C++ for CPU tensors), "triton", "cpp".
    dynamic: None (automatic), True, False.  fullgraph: raise instead of running eagerly.
    mode: None / "default" launch Triton kernels with the heuristics' configurations;
    "max-autotune" times a few at each kernel's first run per size class and keeps the
    fastest (minicompile/runtime/autotune.py); "reduce-overhead" also records each
    inference graph on CUDA tensors as a CUDA graph and replays it
    (minicompile/runtime/cudagraphs.py).
    """
    if backend not in BACKENDS:
        raise ValueError(f"minicompile.compile: unknown backend {backend!r}; use one of {BACKENDS}")
    if mode not in MODES:
        raise ValueError(f"minicompile.compile: unknown mode {mode!r}; use one of {MODES}")
    if dynamic not in (None, True, False):
        raise ValueError("minicompile.compile: dynamic must be None, True or False")
    base = config.get()
    cfg = dataclasses.replace(
        base,
        backend=backend if backend != "auto" else base.backend,
        dynamic=dynamic,
        fullgraph=fullgraph,
        mode=mode,
    )
    if fn is None:
        return lambda f: compile(f, backend=backend, dynamic=dynamic, fullgraph=fullgraph,
                                 mode=mode)
    if isinstance(fn, torch.nn.Module):
        return OptimizedModule(fn, cfg)
    opt = optim.recognise(fn)
    if opt is not None:  # an optimizer's step: its update, with combo kernels
        return compile_step(fn, opt, cfg)
    return CompiledFunction(fn, cfg)


def compile_step(fn: Callable, opt: Any, cfg: Config) -> optim.CompiledStep:
    """``opt.step`` (``fn``) compiled: its update traced with combo kernels and in-place
    stores.  Static sizes: another set of parameters is another structure, not a size."""
    update_cfg = dataclasses.replace(cfg, dynamic=False, horizontal_fusion=True,
                                     store_in_place=True)
    return optim.CompiledStep(fn, opt, lambda f: CompiledFunction(f, update_cfg), _stats,
                              cfg.fullgraph)


class OptimizedModule(torch.nn.Module):
    """``minicompile.compile(module)``: a module whose ``forward`` is the original module's
    forward, compiled.  It shares the original's parameters, buffers and submodules (it
    holds it as ``_orig_mod``); attribute reads, ``state_dict`` and ``load_state_dict`` go to
    the original, so checkpoints keep their keys.  Of a ``DistributedDataParallel``, the
    module it wraps is compiled and DDP's own forward runs around it (distributed.py)."""

    def __init__(self, mod: torch.nn.Module, cfg: Config) -> None:
        super().__init__()
        self._orig_mod = mod
        target = distributed.compiled_target(mod)
        forward = type(target).forward
        self.__dict__["_compiled"] = CompiledFunction(types.MethodType(forward, target), cfg)
        self.__dict__["_cfg"] = cfg

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if distributed.is_ddp(mod):
            return distributed.ddp_forward(mod, self.__dict__["_compiled"], args, kwargs)
        if mod._forward_hooks or mod._forward_pre_hooks or "forward" in mod.__dict__:
            return mod(*args, **kwargs)  # hooks and patched forwards run as in eager
        traced = None
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):  # capture's import is
            from minicompile.capture import training_ops  # costly: only where it can apply

            traced = training_ops.module_forward(mod)  # the one capture traces in its place
        if traced is not None:
            compiled = self.__dict__.setdefault("_compiled_as_traced", {})
            if traced not in compiled:
                compiled[traced] = CompiledFunction(types.MethodType(traced, mod),
                                                    self.__dict__["_cfg"])
            return compiled[traced](*args, **kwargs)
        return self.__dict__["_compiled"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"
