"""``torch.autocast`` regions, traced as explicit casts in the graph (as Dynamo does).

The traced :class:`AutocastState` starts as the caller's (guarded when relied on) and
changes at ``with torch.autocast(...)`` blocks.  The policy is asked of PyTorch, not tabled:
:func:`call` records the casts a fake-tensor run reaches ATen with, and anything it cannot
reproduce exactly is Unsupported, never a silent dtype difference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch

from minicompile import compat
from minicompile.capture import library
from minicompile.capture.kinds import Output, Translator
from minicompile.capture.variables import (
    ConstantVar, ListVar, TensorVar, TupleVar, Var, leaves, map_leaves,
)
from minicompile.errors import Unsupported, attempt


DEVICE_TYPES = ("cpu", "cuda")
# torch.autocast (also torch.amp.autocast), then the deprecated per-device subclasses
# torch.cuda.amp.autocast and torch.cpu.amp.autocast where this PyTorch has them.
_BASE = torch.autocast
_AUTOCAST_CLASSES = tuple(dict.fromkeys(c for c in library.maybe(
    "autocast", "amp.autocast", "cuda.amp.autocast", "cpu.amp.autocast") if isinstance(c, type)))
_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)  # autocast leaves float64 alone


@dataclasses.dataclass(frozen=True)
class Mode:
    enabled: bool
    dtype: torch.dtype


class AutocastState:
    """The traced autocast state of one capture: the entry state per device type (read when
    the trace starts, guarded when first used) under a stack of traced regions."""

    def __init__(self) -> None:
        self.entry = {d: Mode(torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                      for d in DEVICE_TYPES}
        self.regions: list[tuple[str, Mode]] = []
        self._guarded: set[Any] = set()  # device types (and (type, "dtype")) guarded

    def mode(self, out: Output, device_type: str, with_dtype: bool = False) -> Mode:
        """The state for ``device_type`` now.  Relying on the entry state guards whether it
        is enabled, and its dtype where that matters (enabled, or ``with_dtype``)."""
        for dev, mode in reversed(self.regions):
            if dev == device_type:
                return mode
        if device_type not in self.entry:
            return Mode(False, torch.float32)  # no autocast for this kind of device here
        entry = self.entry[device_type]
        if device_type not in self._guarded:
            self._guarded.add(device_type)
            out.guards.global_call(torch.is_autocast_enabled, (device_type,), {}, entry.enabled)
        if (entry.enabled or with_dtype) and (device_type, "dtype") not in self._guarded:
            self._guarded.add((device_type, "dtype"))
            out.guards.global_call(torch.get_autocast_dtype, (device_type,), {}, entry.dtype)
        return entry

    def active(self, out: Output, device_type: str) -> Mode | None:
        mode = self.mode(out, device_type)
        return mode if mode.enabled else None


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """PyTorch's real autocast off (for every device type we trace) for the duration."""
    saved = {d: torch.is_autocast_enabled(d) for d in DEVICE_TYPES}
    try:
        for d in DEVICE_TYPES:
            torch.set_autocast_enabled(d, False)
        yield
    finally:
        for d, enabled in saved.items():
            torch.set_autocast_enabled(d, enabled)


# -- regions -------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class AutocastVar(Var):
    """A ``torch.autocast`` context: entering pushes its state, the normal exit pops it."""

    device_type: str = "cpu"
    mode: Mode = Mode(False, torch.float32)
    entered: bool = False
    phrase = "torch.autocast({0.device_type!r}, enabled={0.mode.enabled})"

    def enter(self, out: Output) -> None:
        if self.entered:
            raise Unsupported("re-entering a torch.autocast context is not supported")
        self.entered = True
        out.autocast.regions.append((self.device_type, self.mode))

    def exit(self, out: Output) -> None:
        regions = out.autocast.regions
        if not regions or regions[-1] != (self.device_type, self.mode):
            raise Unsupported("torch.autocast contexts exited out of order")
        regions.pop()
        self.entered = False


def is_autocast_object(value: Any) -> bool:
    return isinstance(value, _AUTOCAST_CLASSES)


def region_of(obj: Any) -> AutocastVar:
    """The traced context for a real autocast object (a decorator's ``autocast_instance``)."""
    device = getattr(obj, "device", None)
    if type(device) is not str or not isinstance(getattr(obj, "fast_dtype", None), torch.dtype):
        raise Unsupported("a torch.autocast object without a device and dtype")
    return AutocastVar(device_type=device, mode=Mode(bool(obj._enabled), obj.fast_dtype))


@library.register(*_AUTOCAST_CLASSES)
def _make_region(tx: Translator, cls: Any, args: list, kwargs: dict) -> Var:
    """``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`` (or a
    device-specific subclass): PyTorch's own constructor checks the arguments (and disables
    autocast where eager does, with its warning); an unspecified dtype is the traced one."""
    pos, kw = tx.output.to_values(args, kwargs)
    values = list(pos)
    if any(isinstance(v, TensorVar) for v in (*values, *kw.values())):
        raise Unsupported("torch.autocast() with a tensor argument")
    if cls is _BASE:  # torch.autocast(device_type, dtype=None, ...)
        device = values[0] if values else kw.get("device_type")
        if type(device) is str and (values[1] if len(values) > 1 else kw.get("dtype")) is None:
            dtype = tx.output.autocast.mode(tx.output, device, with_dtype=True).dtype
            if len(values) > 1:
                values[1] = dtype
            else:
                kw["dtype"] = dtype
    try:
        obj = cls(*values, **kw)
    except Exception as e:
        raise Unsupported(f"torch.autocast(...) raised {type(e).__name__} (eager raises)") from e
    return region_of(obj)


@library.register(torch.is_autocast_enabled, *library.maybe("is_autocast_cpu_enabled",
                                                           "get_autocast_dtype"))
def _query(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """``torch.is_autocast_enabled(device)`` / ``torch.get_autocast_dtype(device)`` and the
    older per-device spellings: the traced state (the entry state is guarded)."""
    values, kw = tx.output.to_values(args, kwargs)
    device = values[0] if values else kw.get("device_type", "cuda")
    if fn is getattr(torch, "is_autocast_cpu_enabled", None):
        device = "cpu"
    if type(device) is not str:
        raise Unsupported(f"torch.{fn.__name__}() of a {type(device).__name__}")
    if device not in DEVICE_TYPES:
        value = attempt(f"torch.{fn.__name__}", fn, *values, **kw)
        tx.output.guards.global_call(fn, tuple(values), kw, value)
        return ConstantVar(value)
    wants_dtype = fn is getattr(torch, "get_autocast_dtype", None)
    mode = tx.output.autocast.mode(tx.output, device, with_dtype=wants_dtype)
    return ConstantVar(mode.dtype if wants_dtype else mode.enabled)


@library.register(*library.maybe("amp.autocast_mode._enter_autocast"))
def _enter_region(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """``_enter_autocast(device_type, dtype, enabled, cache_enabled)``: how the code of
    Dynamo's FX graphs (``torch.compile(backend="minicompile")``) enters a region."""
    region = _make_region(tx, _BASE, args, kwargs)
    region.enter(tx.output)
    return region


@library.register(*library.maybe("amp.autocast_mode._exit_autocast"))
def _exit_region(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """``_exit_autocast(region)``: the end of a region ``_enter_autocast`` entered."""
    region = tx.realize(args[0]) if len(args) == 1 and not kwargs else None
    if not isinstance(region, AutocastVar):
        raise Unsupported("_exit_autocast() of something other than a traced region")
    region.exit(tx.output)
    return ConstantVar(None)


library.register(torch.is_autocast_cache_enabled)(library.constant_query)


# -- the casting policy --------------------------------------------------------------------


def call(out: Output, fn: Any, args: tuple, kwargs: dict,
         run: Callable[[tuple, dict], Any], inplace: bool = False) -> Any:
    """``run(args, kwargs)`` (which emits the graph for ``fn(*args, **kwargs)``) with the
    inputs cast as autocast would cast them, when the traced state is on for the device of
    the tensors; the result's dtypes are checked against autocast's."""
    tensors = [v for v in _leaves((args, kwargs)) if isinstance(v, TensorVar)]
    if not tensors:
        return run(args, kwargs)
    device_type = tensors[0].meta.device.type
    mode = out.autocast.active(out, device_type)
    if mode is None:
        return run(args, kwargs)
    key = _key(fn, device_type, mode.dtype, (args, kwargs))
    if key not in _POLICIES:
        try:
            policy = _ask(out, fn, device_type, mode.dtype, args, kwargs)
        except _EagerRaises:
            run(args, kwargs)  # the handler's own refusal, when it has one, says it better
            raise
        if len(_POLICIES) >= _MAX_POLICIES:
            _POLICIES.clear()
        _POLICIES[key] = policy
    casts, result_dtypes = _POLICIES[key]
    what = _name(fn)
    if any(casts):
        if inplace and casts[0] is not None:
            raise Unsupported(f"{what} in place under torch.autocast casts its target")
        it = iter(casts)

        def cast(v: Any) -> Any:
            if not isinstance(v, TensorVar):
                return v
            dtype = next(it)
            if dtype is None or dtype == v.meta.dtype:
                return v
            return out.op("to_dtype", (v,), {"dtype": dtype})

        args, kwargs = map_leaves((args, kwargs), cast)
    result = run(args, kwargs)
    got = tuple(v.meta.dtype for v in _leaves(result) if isinstance(v, TensorVar))
    if got != result_dtypes:
        raise Unsupported(f"{what} under torch.autocast: the graph gives {got}, eager "
                          f"{result_dtypes}")
    return result


# Policies asked so far, by call signature (function, device, dtype, argument metadata).
_POLICIES: dict[Any, tuple[tuple, tuple]] = {}
_MAX_POLICIES = 4096


class _EagerRaises(Unsupported):
    """The call raises under autocast in eager too (or reads data the fakes do not have)."""


def _ask(out: Output, fn: Any, device_type: str, dtype: torch.dtype, args: tuple,
         kwargs: dict) -> tuple[tuple, tuple]:
    """(the dtype each tensor input is cast to, or None; the result dtypes) of ``fn`` under
    autocast on ``device_type`` to ``dtype``, found on fake tensors (see the module doc)."""
    what = _name(fn)
    fake_mode = compat.fake_tensor_mode()
    with fake_mode:
        fakes = map_leaves((args, kwargs), lambda v: _fake(v) if isinstance(v, TensorVar)
                            else _hint(out, v))
    inputs = [v for v in _leaves(fakes) if isinstance(v, torch.Tensor)]
    try:
        on_log, on_result = _run(fake_mode, fn, fakes, device_type, dtype, True)
    except Exception as e:
        raise _EagerRaises(f"{what} under torch.autocast: eager raises {type(e).__name__}") from e
    result_dtypes = tuple(t.dtype for t in _leaves(on_result) if isinstance(t, torch.Tensor))
    ids = {id(t): k for k, t in enumerate(inputs)}
    seen = [None] * len(inputs)
    ops = []
    for func, first, plain, outs in on_log:
        if (func == "aten._to_copy.default" and isinstance(first, torch.Tensor)
                and id(first) in ids):
            seen[ids[id(first)]] = outs[0]
        else:
            ops.append((func, plain, outs))
    plans = [tuple(seen)]
    if result_dtypes and result_dtypes[0].is_floating_point:
        target = result_dtypes[0]
        plans.append(tuple(target if t.dtype in _CASTABLE else None for t in inputs))
    for strict, plan in zip((True, False), plans):
        if _reproduces(fake_mode, fn, fakes, inputs, plan, device_type, dtype, ops, strict):
            return plan, result_dtypes
    raise Unsupported(f"{what}: torch.autocast's policy for it on {device_type} is not a "
                      "cast of its inputs; not compiled", hint="move it out of the autocast "
                      "region, or call it on inputs of the dtype you want")


def _reproduces(fake_mode: Any, fn: Any, fakes: Any, inputs: list, plan: tuple,
                device_type: str, dtype: torch.dtype, ops: list, strict: bool) -> bool:
    """Whether ``fn`` on inputs cast by ``plan``, with autocast off, reaches ATen as it did
    with autocast on (``strict``: ops, argument and result dtypes; else ops and results)."""
    casts = {id(t): d for t, d in zip(inputs, plan)}
    with fake_mode:
        cast_fakes = map_leaves(fakes, lambda v: v.to(casts[id(v)]) if isinstance(
            v, torch.Tensor) and casts.get(id(v)) is not None else v)
    try:
        log, _ = _run(fake_mode, fn, cast_fakes, device_type, dtype, False)
    except Exception:
        return False
    got = [(f, plain, o) for f, _, plain, o in log]
    if strict:
        return got == ops
    return [(f, o) for f, _, o in got] == [(f, o) for f, _, o in ops]


class _Recorder(compat.TorchDispatchMode):
    """Records each ATen call below autocast: (name, its first argument, its arguments with
    tensors as their dtypes, its result dtypes)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any, Any, tuple]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = str(func)
        if not name.startswith("prim."):
            outs = tuple(t.dtype for t in _leaves(result) if isinstance(t, torch.Tensor))
            first = args[0] if args else None
            self.calls.append((name, first, _plain((args, sorted(kwargs.items()))), outs))
        return result


def _run(fake_mode: Any, fn: Any, fakes: tuple, device_type: str, dtype: torch.dtype,
         enabled: bool) -> tuple[list, Any]:
    args, kwargs = fakes
    prev = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    prev_cache = torch.is_autocast_cache_enabled()
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_cache_enabled(False)
    try:
        with fake_mode, _Recorder() as recorder:
            result = fn(*args, **kwargs)
    finally:
        torch.set_autocast_enabled(device_type, prev[0])
        torch.set_autocast_dtype(device_type, prev[1])
        torch.set_autocast_cache_enabled(prev_cache)
    return recorder.calls, result


def _plain(value: Any) -> Any:
    """A comparable picture of ATen arguments: tensors as their dtypes."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.dtype
    return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) \
        else type(value).__name__


def _fake(v: TensorVar) -> torch.Tensor:
    """A fake tensor (of the active FakeTensorMode) like ``v``, on its device."""
    meta = v.meta
    hint = meta.shapes.hint if meta.is_symbolic else int  # (the traced sizes)
    return torch.empty_strided([hint(s) for s in meta.shape], [hint(s) for s in meta.stride],
                               dtype=meta.dtype, device=meta.device)


def _hint(out: Output, v: Any) -> Any:
    if isinstance(v, torch.SymInt) and out.graph.shapes is not None:
        return int(out.graph.shapes.hint(out.graph.shapes.to_sympy(v)))
    return v


def _key(fn: Any, device_type: str, dtype: torch.dtype, values: Any) -> Any:
    def key(v: Any) -> Any:
        if isinstance(v, TensorVar):
            meta = v.meta
            return ("T", meta.dtype, str(meta.shape), str(meta.stride))
        if isinstance(v, (tuple, list)):
            return (type(v).__name__, tuple(key(x) for x in v))
        if isinstance(v, dict):
            return ("dict", tuple((k, key(x)) for k, x in v.items()))
        return (type(v).__name__, repr(v))

    return (fn, device_type, dtype, key(values))


def _leaves(value: Any) -> list:
    """:func:`leaves`, also of the items of tuple trackers (an extern's tuple result)."""
    return [x for v in leaves(value)
            for x in (_leaves(v.items) if isinstance(v, (TupleVar, ListVar)) else [v])]


def _name(fn: Any) -> str:
    for op, name in _OPERATOR_NAMES.items():
        if fn is op:
            return f"operator {name}"
    return f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__qualname__', fn)}".lstrip(".")


_OPERATOR_NAMES = {getattr(operator, n): n for n in ("add", "sub", "mul", "truediv", "matmul",
                                                     "pow", "neg")}
