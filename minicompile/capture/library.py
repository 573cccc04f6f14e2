"""The Python that library model code calls around its tensors, answered by capture.

Each call has a known meaning, answered as Dynamo does instead of breaking the graph:
checks on Python values are decided now (a failing one is Unsupported, so eager raises),
``is_compiling()`` is True, constant warnings are emitted once, and process-wide questions
fold to guarded constants.  :func:`handler_for` maps a callable to its handler, or None.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from minicompile.capture import kinds, records
from minicompile.capture.kinds import Translator
from minicompile.capture.variables import (
    BoundMethodVar, ConstantVar, ObjectVar, TensorVar, Var, contains_tensor, specialized,
)
from minicompile.errors import Unsupported, attempt


Handler = Callable[["Translator", Any, list, dict], Var]
_HANDLERS: dict[Any, Handler] = {}


register = kinds.registrar(_HANDLERS)


def maybe(*paths: str) -> tuple:
    """``torch.a.b`` for each path ``"a.b"``, None where this PyTorch lacks it (also when
    reading it fails: ``torch._dynamo`` imports Triton, and a broken install raises there)."""
    return tuple(_lookup(path) for path in paths)


def _lookup(path: str) -> Any:
    owner: Any = torch
    for name in path.split("."):
        try:
            owner = getattr(owner, name, None)
        except Exception:  # noqa: BLE001 - any failure to import means "not available"
            return None
        if owner is None:
            return None
    return owner


def _constant(value: Any) -> Handler:
    def handler(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
        return ConstantVar(value)

    return handler


# nn.TransformerEncoder asks is_compiling() where eager, given a padding mask, goes on to
# its nested-tensor path, which zeroes the padded positions of the result: the compiled
# path would leave them computed.  There the encoder runs eagerly (a graph break).
_ENCODER_CODE = getattr(getattr(torch.nn, "TransformerEncoder", None), "forward", None)


@register(*maybe("compiler.is_compiling", "compiler.is_dynamo_compiling", "_utils.is_compiling"))
def _is_compiling(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    if _ENCODER_CODE is not None and tx.code is _ENCODER_CODE.__code__:
        raise Unsupported("nn.TransformerEncoder with a padding mask: eager takes its "
                          "nested-tensor path there (padded positions zeroed), so it runs "
                          "eagerly")
    return ConstantVar(True)
# torch._dynamo.is_compiling is its own function, but reading ``torch._dynamo`` imports the
# Dynamo stack (half a second): it is recognised by name in handler_for instead.
_DYNAMO_IS_COMPILING = ("torch._dynamo.external_utils", "is_compiling")
register(*maybe("jit.is_scripting", "jit.is_tracing", "compiler.is_exporting",
                  "_jit_internal.is_scripting"))(_constant(False))
register(*maybe("_C._get_tracing_state"))(_constant(None))
# nn.MultiheadAttention's question whether make_fx traces it: not under minicompile.
register(*maybe("nn.modules.activation._is_make_fx_tracing"))(_constant(False))


# Questions answered now and guarded by asking again: facts of the process, and switches
# library code reads (``nn.MultiheadAttention`` asks whether its fused fast path is on).
_PROCESS_QUERIES = maybe("cuda.is_available", "cuda.device_count", "cuda.get_device_capability",
                         "cuda.get_device_name", "backends.mha.get_fastpath_enabled")
_PLAIN = (bool, int, float, str, type(None))


def _marked_constant(fn: Any) -> bool:
    """A function its library marks to be called while tracing, its result taken as a
    constant (``torch._dynamo.assume_constant_result``: transformers' install and version
    probes carry its ``_dynamo_marked_constant``), under ``functools.lru_cache`` or not."""
    target = fn.__wrapped__ if isinstance(fn, functools._lru_cache_wrapper) else fn
    return getattr(target, "_dynamo_marked_constant", False) is True


@register(*_PROCESS_QUERIES)
def constant_query(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """A question whose answer the guards can ask again (``torch.cuda.get_device_capability
    (device)``, a marked library probe such as transformers' ``is_torch_less_or_equal``),
    asked of constants: answered now, and guarded by asking again."""
    values = [tx.realize(v) for v in (*args, *kwargs.values())]
    if not all(isinstance(v, ConstantVar) for v in values):
        raise Unsupported(f"{fn.__qualname__}() of values not known while tracing")
    pos = tuple(v.value for v in values[:len(args)])
    kw = {k: v.value for k, v in zip(kwargs, values[len(args):])}
    try:
        value = fn(*pos, **kw)
    except Exception as e:  # the user's error: eager raises it, and runs to say so
        raise Unsupported(f"{fn.__qualname__}() raises {type(e).__name__}: {e}", raises=True) from e
    if not (isinstance(value, _PLAIN) or (
            isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value))):
        raise Unsupported(f"{fn.__qualname__}() returns a {type(value).__name__}")
    tx.output.guards.global_call(fn, pos, kw, value)
    return ConstantVar(value)


# False: the tensors a trace holds are plain tensors (a subclass is never traced).
register(*maybe("overrides.has_torch_function", "overrides.has_torch_function_unary",
                  "overrides.has_torch_function_variadic"))(_constant(False))


# PyTorch's own Python helpers that library modules call on the way to their kernels
# (nn.MultiheadAttention's mask checks and its Python path, the causal mask users make for
# nn.TransformerEncoderLayer), inlined as user code: torch ops and metadata checks.
# (Every other torch callable is a library call or unsupported.)
INLINED_HELPERS = frozenset(f for f in maybe(
    "nn.functional._none_or_dtype", "nn.functional._canonical_mask",
    "nn.modules.activation._check_arg_device", "nn.modules.activation._arg_requires_grad",
    "nn.functional.multi_head_attention_forward", "nn.functional._mha_shape_check",
    "nn.functional._in_projection_packed", "nn.functional._in_projection",
    "nn.functional._check_key_padding_mask", "nn.Transformer.generate_square_subsequent_mask",
    "nn.modules.transformer._generate_square_subsequent_mask",
    "nn.modules.transformer._detect_is_causal_mask", "nn.modules.transformer._get_seq_len",
) if isinstance(f, types.FunctionType))


@register(
    torch._assert, *maybe("_check", "_check_value", "_check_type", "_check_index", "_check_with",
                           "_check_is_size"))
def _check(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """A check on Python values, decided now; the frame runs eagerly if it fails."""
    position = 1 if fn is getattr(torch, "_check_with", None) else 0  # (error_type, cond)
    var = args[position] if len(args) > position else kwargs.get("cond", ConstantVar(True))
    cond = tx.output.to_value(tx.realize(var))  # the message (a lambda, often) stays unread
    if isinstance(cond, Var):  # (a plain value's only trackers: a tensor, a NumPy array)
        raise Unsupported("a check on a tensor's value (torch._assert / torch._check)")
    if isinstance(cond, (int, bool, torch.SymInt, torch.SymBool)):
        if isinstance(cond, torch.SymInt):  # _check_is_size(n): n >= 0
            cond = cond >= 0
        ok = tx.truthy(ConstantVar(cond))
    else:
        ok = bool(cond)
    if not ok:
        raise Unsupported("a torch._assert / torch._check failed (eager raises)")
    return ConstantVar(None)


@register(torch._C._set_grad_enabled)
def _set_grad_enabled(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """How the code of Dynamo's FX graphs spells ``with torch.no_grad():`` (a call before
    the block, one after it).  Grad mode must be back as it was when the trace ends."""
    values = [tx.output.to_value(tx.realize(a)) for a in args]
    if kwargs or len(values) != 1 or type(values[0]) is not bool:
        raise Unsupported("torch._C._set_grad_enabled() needs one Python bool")
    tx.output.grad_enabled = values[0]
    return ConstantVar(None)


@register(torch.finfo, torch.iinfo, torch.device)
def _type_info(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """Immutable descriptions made from constants (``torch.finfo(x.dtype)``, and
    ``torch.device("cpu")``, which FX's generated code spells ``device(type='cpu')``)."""
    values, kw = tx.output.to_values(args, kwargs)
    if any(isinstance(v, TensorVar) for v in (*values, *kw.values())):
        raise Unsupported(f"{fn.__name__}() of a tensor is not supported")
    return ConstantVar(attempt(f"torch.{fn.__name__}", fn, *values, **kw))


@register(inspect.signature)
def _signature(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    """``inspect.signature(f)`` of a function the trace knows: its code decides it."""
    if len(args) != 1:
        raise Unsupported("inspect.signature() with these arguments is not supported")
    target = tx.realize(args[0])
    if isinstance(target, BoundMethodVar) and isinstance(target.self_var, ObjectVar):
        real: Any = types.MethodType(target.func, target.self_var.value)
    elif isinstance(target, ObjectVar) and callable(target.value):
        real = target.value
    else:
        raise Unsupported(f"inspect.signature() of {target.describe()} is not supported")
    kw = {k: tx.output.to_value(v) for k, v in kwargs.items()}
    return ConstantVar(inspect.signature(real, **kw))


@register(copy.copy, copy.deepcopy)
def _copy(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    if len(args) != 1 or kwargs:
        raise Unsupported(f"copy.{fn.__name__}() with a memo is not supported")
    return records.copy_value(tx, args[0], deep=fn is copy.deepcopy)


@register(warnings.warn)
def _warn(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    values, kw = _message_args(tx, args, kwargs, "warnings.warn")
    kw["stacklevel"] = 1
    warnings.warn(*values[:2], **kw)  # Python's own filter decides whether it shows
    return ConstantVar(None)


def is_log_call(fn: Any) -> bool:
    """A method of a ``logging.Logger`` (``logger.info``, transformers' ``warning_once``)."""
    return isinstance(getattr(fn, "__self__", None), logging.Logger)


# PyTorch's usage log (nn.Module.__init__ calls it; Dynamo keeps it in the graphs it hands
# to torch.compile backends): a logging call like the others.
@register(*maybe("_C._log_api_usage_once"))
def log_call(tx: Translator, fn: Any, args: list, kwargs: dict) -> Var:
    values, kw = _message_args(tx, args, kwargs, "a logging call")
    fn(*values, **kw)
    return ConstantVar(None)


def _message_args(tx: Translator, args: list, kwargs: dict, what: str):
    values, kw = tx.output.to_values(args, kwargs)
    if any(contains_tensor(v) for v in (*values, *kw.values())):
        raise Unsupported(f"{what} with a tensor argument reads its data")
    return specialized(values), specialized(kw)


def context_factory(fn: Any) -> Any:
    """The grad-mode class whose fresh instance ``fn()`` makes, for the bound ``clone``
    that functions decorated with ``@torch.no_grad()`` enter on each call; else None."""
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "clone" and type(owner) in (torch.no_grad, torch.enable_grad):
        return type(owner)
    return None


def handler_for(fn: Any) -> Handler | None:
    try:
        found = _HANDLERS.get(fn)
    except TypeError:  # unhashable
        return None
    if (found is None and isinstance(fn, types.FunctionType)
            and (fn.__module__, fn.__qualname__) == _DYNAMO_IS_COMPILING):
        return _is_compiling
    if found is None and _marked_constant(fn):
        return constant_query
    return found
