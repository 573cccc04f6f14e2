"""PyTorch functions beyond the pointwise and view tables: extern graph ops.

A public ``torch.*`` function, an unmapped ``Tensor`` method, or an operator whose schema
says it only computes tensors becomes one ``extern`` node with metadata from a meta run.
In-place ops and ``out=`` are functionalized.  Refused with a reason: unlisted random ops,
data-dependent output shapes, reads of tensor data into Python, side effects.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F

from minicompile import compat, ops
from minicompile.capture import mutation, torch_ops
from minicompile.capture.kinds import Output
from minicompile.capture.variables import TensorVar
from minicompile.errors import Unsupported


NAMESPACES: tuple[tuple[str, Any], ...] = (
    ("torch.nn.functional", F), ("torch", torch), ("torch.special", torch.special),
    ("torch.linalg", torch.linalg), ("torch.fft", torch.fft),
)

# Random functions refused; the others are library calls (ops.RANDOM_FUNCTIONS: drawn from
# PyTorch's generator in program order, as eager draws), in-place ones functionalized onto
# ops.random_in_place_draws (ops.RANDOM_IN_PLACE), dropout in training_ops.
RANDOM = frozenset(
    """dropout alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d
    feature_dropout rrelu gumbel_softmax fractional_max_pool2d fractional_max_pool3d
    native_dropout""".split())
DATA_DEPENDENT = frozenset(
    """nonzero nonzero_static argwhere masked_select unique unique_consecutive bincount
    repeat_interleave histogram histogramdd""".split())
READS_DATA = frozenset(
    """item tolist numpy __bool__ __int__ __float__ __index__ __complex__ data_ptr
    __array__ __len__ __iter__ __repr__ __str__ __format__ untyped_storage storage""".split())
# Names with effects outside the tensors passed in (or on autograd state).
# Private kernels that library modules call and that only compute (nn.MultiheadAttention's
# and nn.TransformerEncoderLayer's fused inference paths): library calls like the others.
FUNCTIONAL_PRIVATE = frozenset({"_native_multi_head_attention", "_transformer_encoder_layer_fwd"})
SIDE_EFFECTS = frozenset(
    """manual_seed seed initial_seed save load set_printoptions backward register_hook
    retain_grad record_stream share_memory_ pin_memory set_default_dtype
    set_default_device set_num_threads use_deterministic_algorithms compile
    set_default_tensor_type cuda cpu""".split())
# In-place ops that change metadata or autograd state, not values.
METADATA_INPLACE = frozenset(
    """t_ transpose_ squeeze_ unsqueeze_ resize_ resize_as_ as_strided_ set_ swapdims_
    swapaxes_ detach_ requires_grad_ share_memory_ rename_""".split())
# Functions whose result may share memory with an argument (checked on meta tensors).
MAYBE_VIEW = frozenset(
    """view view_as reshape reshape_as flatten unflatten ravel select narrow diagonal detach
    alias split split_with_sizes chunk unbind tensor_split hsplit vsplit dsplit unfold
    as_strided movedim moveaxis swapaxes swapdims transpose t adjoint permute squeeze
    unsqueeze expand expand_as broadcast_to broadcast_tensors real imag view_as_real
    view_as_complex __getitem__ atleast_1d atleast_2d atleast_3d meshgrid conj positive
    to type type_as contiguous""".split())
_RESHAPES = frozenset(
    "view view_as reshape reshape_as flatten unflatten ravel atleast_1d atleast_2d "
    "atleast_3d".split())


OPERATORS = (torch._ops.OpOverloadPacket, torch._ops.OpOverload)
# Namespaces of operators with effects their schemas do not show (collectives).
EFFECTFUL_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional",
                                  "_c10d_functional_autograd", "profiler"})


def _written_outs_only(overload: Any, kwargs: dict) -> bool:
    """Whether ``overload`` writes only to keyword-only arguments (``out=``) that a call
    with ``kwargs`` does not pass: such a call cannot go to it."""
    written = [a for a in overload._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write]
    return bool(written) and all(a.kwarg_only and a.name not in kwargs for a in written)


def operator_problem(op: Any, kwargs: dict) -> str | None:
    """Why a call of the operator ``op`` (``torch.ops.ns.name``: a packet or an overload,
    ATen's or a ``custom_op``) with ``kwargs`` is not a library call of the graph, from the
    schemas and tags of the overloads it may go to; None when it only computes tensors
    from its arguments and has a fake kernel."""
    overloads = ([op] if isinstance(op, torch._ops.OpOverload)
                 else [getattr(op, name) for name in op.overloads()])
    if len(overloads) > 1:  # (a packet's out= overloads take a call only with out=)
        overloads = [o for o in overloads if not _written_outs_only(o, kwargs)]
    for overload in overloads:
        schema, tags = overload._schema, set(overload.tags)
        if overload.namespace in EFFECTFUL_NAMESPACES:
            return "it has effects outside its results"
        if schema.is_mutable:
            return "it writes to its arguments"
        if any(r.alias_info is not None for r in schema.returns):
            return "it returns a view of an argument"
        if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
            return "it returns other values than tensors (or a list of them)"
        if not compat.custom_op_has_fake_kernel(overload):
            return ("it has no fake kernel to give its results' shapes "
                    "(torch.library.register_fake)")
        if torch.Tag.nondeterministic_seeded in tags:
            return "random ops are not compiled yet"
        if tags & {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output}:
            return "its output shape depends on the data"
    return None


def public_name(fn: Any) -> str | None:
    """``torch.nn.functional.linear`` for F.linear: the public path of a torch callable,
    found by identity in the namespaces above (never a user function wrapped by torch);
    ``torch.ops.ns.name`` for an operator."""
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, OPERATORS) or (
            isinstance(owner, type) and issubclass(owner, torch.autograd.Function)):
        try:  # (MyFunction.apply: by the class's module and name)
            return ops.extern_name(fn)
        except ValueError:
            return None
    name = getattr(fn, "__name__", None)
    if not name:
        return None
    for prefix, ns in NAMESPACES:
        if getattr(ns, name, None) is fn:
            return f"{prefix}.{name}"
        # torch.linalg.vector_norm is named linalg_vector_norm (torch.fft, torch.special too)
        short = name.removeprefix(prefix.rpartition(".")[2] + "_")
        if short != name and getattr(ns, short, None) is fn:
            return f"{prefix}.{short}"
    if getattr(torch.Tensor, name, None) is fn:
        return f"torch.Tensor.{name}"
    return None


def _static_repeats(short: str, args: tuple, kwargs: dict, method: bool) -> bool:
    """``repeat_interleave`` with a Python int of repeats: its output size is the input's
    times that int, not read from data (rotary embeddings of GPT-J and others)."""
    if short != "repeat_interleave":
        return False
    repeats = _arg(args, kwargs, 0 if method else 1, "repeats")
    return type(repeats) is int and (method or (args and isinstance(args[0], TensorVar)))


def check_callable(fname: str, short: str, static_shape: bool = False) -> None:
    if short in READS_DATA:
        raise Unsupported(f"{fname}() reads tensor data into Python; not supported (graph break)",
                          hint="keep the value a tensor")
    if short in RANDOM or short.rstrip("_") in RANDOM:
        raise Unsupported(f"{fname}: random ops are not compiled yet")
    if short in DATA_DEPENDENT and not static_shape:
        raise Unsupported(f"{fname}() has a data-dependent output shape; not supported")
    if short == "backward" or fname in ("torch.autograd.grad", "torch.autograd.backward"):
        raise Unsupported(f"{fname}() runs autograd outside the graph (a graph break: the "
                          "graph before it runs its compiled backward there)")
    if short in SIDE_EFFECTS or short.startswith(("set_", "_")) and not (
            short.startswith("__") or short in FUNCTIONAL_PRIVATE):
        raise Unsupported(f"{fname}() is not supported (effects outside the graph)")


def call_function(out: Output, fn: Any, args: tuple, kwargs: dict) -> Any:
    """A torch callable that :mod:`torch_ops` has no handler for."""
    if isinstance(fn, OPERATORS):
        problem = operator_problem(fn, kwargs)
        if problem is not None:
            raise Unsupported(f"{ops.extern_name(fn)}: {problem}; not supported")
        return out.extern(fn, args, kwargs)
    fname = public_name(fn)
    if fname is None:
        raise Unsupported(f"{_describe(fn)} is not supported")
    short = fname.rpartition(".")[2]
    check_callable(fname, short, _static_repeats(short, args, kwargs, method=False))
    if fname.startswith("torch.nested."):
        raise Unsupported(f"{fname}() makes a nested tensor, which is not supported")
    if short.endswith("_") and not short.endswith("__"):
        if not args or not isinstance(args[0], TensorVar):
            raise Unsupported(f"in-place {fname}() is not supported")
        return inplace_method(out, args[0], short, args[1:], kwargs)
    if fn is F.embedding and _arg(args, kwargs, 3, "max_norm") is not None:
        raise Unsupported("F.embedding(max_norm=...) renormalizes the weight in place")
    return out.extern(fn, args, kwargs)


def call_method(out: Output, x: TensorVar, name: str, args: tuple, kwargs: dict) -> Any:
    """``x.name(*args, **kwargs)`` for a method :mod:`torch_ops` has no handler for."""
    fname = f"Tensor.{name}"
    check_callable(fname, name, _static_repeats(name, args, kwargs, method=True))
    if name.endswith("_") and not name.endswith("__"):
        return inplace_method(out, x, name, args, kwargs)
    if name == "cpu" or name == "cuda":
        if x.meta.device.type == name:
            return x
        raise Unsupported(f"{fname}() moving a tensor between devices is not supported")
    fn = getattr(torch.Tensor, name, None)
    if fn is None or not callable(fn):
        raise Unsupported(f"{fname}() is not supported")
    return out.extern(fn, (x, *args), kwargs)


@functools.lru_cache(maxsize=None)
def _parameters(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def inplace_by_keyword(fn: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with an ``inplace`` flag passed by position as a keyword
    (``F.hardtanh(x, 0.0, 6.0, True)``: nn.ReLU6 calls it so), and the arguments after it."""
    names = _parameters(fn)
    at = names.index("inplace") if "inplace" in names else len(args)
    if len(args) <= at:
        return args, kwargs
    return args[:at], {**kwargs, **dict(zip(names[at:], args[at:]))}


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def inplace_method(out: Output, x: TensorVar, name: str, args: tuple, kwargs: dict) -> Any:
    """``x.name_(...)``: the out-of-place op, then ``x`` is rebound to its result."""
    fname = f"Tensor.{name}"
    if name in METADATA_INPLACE:
        raise Unsupported(f"in-place {fname}() changes tensor metadata; not supported")
    if name in ops.RANDOM_IN_PLACE:  # drawn into a copy of x (the same draws), then written
        if x.meta.requires_grad:
            raise Unsupported(f"{fname}() on a tensor that requires grad is not supported")
        draws = out.op(ops.extern_op(ops.random_in_place_draws), (x, name, *args), kwargs,
                       track=False)
        return mutation.mutate(out, x, draws, f"{fname}()")
    if name == "zero_":  # (random ops: check_callable refused them before)
        if args or kwargs:
            raise Unsupported(f"{fname}() takes no arguments")
        new = out.extern(torch.zeros_like, (x,), {}, track=False)
    elif name == "fill_":
        if len(args) != 1 or kwargs:
            raise Unsupported(f"{fname}() expects one value")
        value = args[0]
        if isinstance(value, TensorVar) and value.meta.ndim != 0:
            raise Unsupported(f"{fname}() with a non-0-d tensor (eager raises)")
        new = mutation.conform(out, x, value, fname)
    elif name == "copy_":
        if not args or set(kwargs) - {"non_blocking"}:
            raise Unsupported(f"{fname}() expects a source tensor")
        new = mutation.conform(out, x, args[0], fname)
    else:
        base = name[:-1]
        handler = torch_ops.METHODS.get(base)
        if handler is not None:
            new = handler(out, f"Tensor.{base}", (x, *args), kwargs)
        else:
            fn = getattr(torch.Tensor, base, None)
            if fn is None:
                raise Unsupported(f"in-place {fname}() has no out-of-place form")
            check_callable(f"Tensor.{base}", base)
            new = out.extern(fn, (x, *args), kwargs, track=False)
    if new is x:  # e.g. relu_ of... nothing changed structurally; still a mutation
        return x
    return mutation.mutate(out, x, new, fname)


def with_out(out: Output, result: Any, target: Any, fname: str) -> Any:
    """``f(..., out=target)``: write the functional ``result`` into ``target``."""
    if not isinstance(target, TensorVar) or not isinstance(result, TensorVar):
        raise Unsupported(f"{fname}(out=...) is only supported with one tensor result")
    if result.meta.concrete_shape() != target.meta.concrete_shape():
        raise Unsupported(f"{fname}(out=...) with a differently shaped out tensor (resizes it)")
    if result.meta.dtype != target.meta.dtype:
        raise Unsupported(f"{fname}(out=...) with an out tensor of another dtype")
    return mutation.mutate(out, target, result, f"{fname}(out=...)")


def view_steps(fn: Any, short: str, fake_x: torch.Tensor, res: torch.Tensor, args: tuple,
               kwargs: dict, index: int | None) -> tuple:
    """The view steps from the argument ``fake_x`` stood for (on meta tensors) to the
    extern's result ``res`` (element ``index`` of a tuple result)."""
    if res is fake_x:
        return (mutation.ViewStep("alias"),)
    shape = tuple(res.shape)
    if short in _RESHAPES:
        return (mutation.ViewStep("reshape", (shape,)),)
    if short == "select":
        dim = _arg(args, kwargs, 1, "dim")
        i = _arg(args, kwargs, 2, "index")
        ndim = fake_x.ndim
        if type(dim) is int and type(i) is int:
            dim %= ndim
            return (mutation.ViewStep("select", (dim, i % fake_x.shape[dim])),)
    if short == "narrow":
        dim, start, length = (_arg(args, kwargs, k, n) for k, n in ((1, "dim"), (2, "start"),
                                                                   (3, "length")))
        if type(dim) is int and type(start) is int and type(length) is int:
            dim %= fake_x.ndim
            start %= max(fake_x.shape[dim], 1)
            return (mutation.ViewStep("slice", (dim, start, start + length, 1)),)
    if short == "__getitem__":
        steps = mutation.index_steps(args[1], tuple(fake_x.shape))
        if steps is not None:
            return tuple(steps)
    if short == "diagonal":
        offset = _arg(args, kwargs, 1, "offset", 0)
        d1, d2 = _arg(args, kwargs, 2, "dim1", 0), _arg(args, kwargs, 3, "dim2", 1)
        return (mutation.ViewStep("diagonal", (offset, d1, d2)),)
    if short in ("detach", "alias", "positive"):
        return (mutation.ViewStep("alias"),)
    if short in ("split", "split_with_sizes", "chunk", "tensor_split", "hsplit", "vsplit",
                 "dsplit") and res.ndim == fake_x.ndim and res.stride() == fake_x.stride():
        dims = [d for d in range(res.ndim) if res.shape[d] != fake_x.shape[d]] or [0]
        d = dims[0]
        stride = fake_x.stride()[d] if fake_x.ndim else 1
        start = res.storage_offset() // stride if stride else 0
        return (mutation.ViewStep("slice", (d, start, start + res.shape[d], 1)),)
    if short == "unbind" and index is not None:
        dim = _arg(args, kwargs, 1, "dim", 0) % max(fake_x.ndim, 1)
        return (mutation.ViewStep("select", (dim, index)),)
    if index is not None:  # an element of a tuple of views we cannot describe
        return (mutation.ViewStep("opaque", fn=_Unreplayable(short)),)
    rest = tuple(args[1:])
    return (mutation.ViewStep("opaque", rest, fn, tuple(sorted(kwargs.items()))),)


class _Unreplayable:
    """Stands in for a view op whose result cannot be recomputed from the base alone."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(f"mutating the base of a view made by {self.name}() is not supported")

    def __repr__(self) -> str:
        return f"{self.name}()"


def _describe(fn: Any) -> str:
    if isinstance(fn, OPERATORS):
        return ops.extern_name(fn)
    name = getattr(fn, "__name__", None)
    if name is None:  # a callable object: its repr names it (module included, as a rule)
        return repr(fn)
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", name)
    return f"{qualname}()" if module in (None, "builtins") else f"{module}.{qualname}"
