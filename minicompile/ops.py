"""The graph-level operators: the vocabulary of ``call`` nodes.

Each :class:`OpDef` names an op by what it computes, with the eager function that defines
it (run for eager graphs and, on meta tensors, for metadata).  Capture maps an op's many
spellings onto one entry; lowering and the backends read its family (tinygrad's
``GroupOp``): ``unary`` / ``binary`` / ``ternary`` (one row each in op_table.py),
``composite`` (rewritten by passes/decompose.py), ``cast``, ``copy``, ``view`` (index
rewrites), ``extern`` (any other PyTorch function, a library call; see :func:`extern_op`),
``tuple`` (``getitem`` of an extern's tuple), ``index`` (bounds-checked indirect loads),
``iota`` (the index along a dim as a value, Inductor's ``index_expr``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from minicompile import meta_cache, meta_rules
from minicompile.graph import Node, TensorMeta
from minicompile.eager_ops import (  # noqa: F401 (ops' vocabulary, read as ops.X)
    COMPOSITE, OPS, REDUCTION, VIEW, OpDef, resolve_path, run_eager)
from minicompile.shapes import ShapeContext
from minicompile.library_layouts import (ATTENTION, BATCH_NORMS, CONVOLUTIONS, DEVICE_RULES,
                                         conv_layout, cpu_layout, run_on_device)


def extern_op(fn: Callable[..., Any]) -> str:
    """Register ``fn`` as an extern op; return its name, the dotted path the generated
    wrapper calls it by (``torch.nn.functional.linear``).  ``fn`` must not mutate its
    arguments and must return tensors whose metadata the meta device computes."""
    name = extern_name(fn)
    if name not in OPS:
        OPS[name] = OpDef(name, "extern", fn)
    elif OPS[name].eager != fn:  # (==: a classmethod is bound anew on every read)
        raise ValueError(f"extern op {name} already names another function")
    return name


def extern_module(name: str) -> str | None:
    """The module a generated wrapper imports to call extern op ``name``: none for
    PyTorch's (``torch`` is imported) and ``operator``'s, the module of a runtime helper
    (``minicompile.runtime.autograd``) or of a custom autograd.Function's class."""
    if name.startswith("minicompile."):
        return name.rpartition(".")[0]
    owner = getattr(OPS[name].eager, "__self__", None) if name in OPS else None
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        return owner.__module__
    return None


def extern_name(fn: Callable[..., Any]) -> str:
    """The public dotted path that reaches ``fn``; ValueError when there is none."""
    if isinstance(fn, torch._ops.OpOverload):  # torch.ops.aten.add.Tensor
        return f"{extern_name(fn.overloadpacket)}.{fn._overloadname}"
    if isinstance(fn, torch._ops.OpOverloadPacket):  # torch.ops.transformers.grouped_mm_fallback
        return f"torch.ops.{fn._qualified_op_name.replace('::', '.')}"
    owner = getattr(fn, "__self__", None)  # MyFunction.apply, of a custom autograd.Function
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        path = f"{owner.__module__}.{owner.__qualname__}"
        if "<locals>" not in path and resolve_path(path) is owner:
            return f"{path}.apply"
        raise ValueError(f"{owner.__qualname__} cannot be found again by its module and name")
    name = getattr(fn, "__name__", "")
    for prefix, namespace in _NAMESPACES:
        if name and getattr(namespace, name, None) is fn:
            return f"{prefix}.{name}"
    path = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', name)}"
    if resolve_path(path) is fn:
        return path
    raise ValueError(f"{fn!r} has no public dotted path")


_NAMESPACES = (("torch.nn.functional", F), ("torch", torch), ("torch.Tensor", torch.Tensor),
               ("torch.special", torch.special), ("torch.linalg", torch.linalg),
               ("torch.fft", torch.fft), ("operator", operator))


# Extern ops that draw random numbers: never merged or dropped by the graph passes, run in
# program order so the generator sees eager's draws.  RANDOM_FUNCTIONS: library calls of
# capture (capture/externs.py); RANDOM_IN_PLACE: run through random_in_place_draws.
RANDOM_FUNCTIONS = frozenset(
    "rand rand_like randn randn_like randint randint_like randperm normal bernoulli "
    "multinomial poisson".split())
RANDOM_IN_PLACE = frozenset(
    "uniform_ normal_ random_ exponential_ geometric_ cauchy_ log_normal_ bernoulli_".split())
RANDOM_EXTERNS = frozenset(
    f"{prefix}.{name}"
    for prefix, names in (
        ("torch.nn.functional", "dropout dropout1d dropout2d dropout3d alpha_dropout "
                                "feature_alpha_dropout"),
        ("torch", "dropout alpha_dropout feature_dropout feature_alpha_dropout"),
        ("torch", " ".join(RANDOM_FUNCTIONS)),
        ("torch.Tensor", "bernoulli multinomial"),
    )
    for name in names.split()
) | {"minicompile.ops.dropout_in_place_draws", "minicompile.ops.random_in_place_draws"}


def random_in_place_draws(x: torch.Tensor, method: str, *args: Any, **kwargs: Any
                          ) -> torch.Tensor:
    """``x.<method>(*args, **kwargs)`` (``uniform_``, ``bernoulli_``...) run on a copy of
    ``x`` of its layout: the in-place draws, in the order eager makes them, without
    mutating a graph value (capture writes the result back into ``x``)."""
    return getattr(x.clone(), method)(*args, **kwargs)


def dropout_in_place_draws(x: torch.Tensor, p: float, fname: str) -> torch.Tensor:
    """``F.<fname>(x, p, True, inplace=True)`` on a copy of ``x``: on CUDA the in-place
    dropout draws other masks than the out-of-place one (bernoulli, not the fused kernel)."""
    return getattr(F, fname)(x.clone(), p, True, True)

# Concatenation: a library call lowering reads piecewise and autograd slices back.
CAT_OPS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack"})


def cat_arguments(node: Node) -> tuple[list[Node], int] | None:
    """The tensors and the non-negative dim of a cat / stack node, or None when its
    arguments are not a plain list of graph tensors and an int dim (``out=``, say)."""
    args, kwargs = list(node.args), dict(node.kwargs)
    tensors = args.pop(0) if args else kwargs.pop("tensors", None)
    dim_key = "axis" if node.target == "torch.concatenate" else "dim"
    dim = args.pop(0) if args else kwargs.pop(dim_key, 0)
    if args or kwargs or not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    if not all(isinstance(t, Node) for t in tensors) or type(dim) is not int:
        return None
    ndim = node.meta.ndim if isinstance(node.meta, TensorMeta) else -1
    if not -ndim <= dim < ndim:
        return None
    return list(tensors), dim % ndim


def infer_meta(
    name: str, args: tuple, kwargs: dict[str, Any], device: torch.device,
    shapes: ShapeContext | None = None
) -> TensorMeta | tuple[TensorMeta, ...]:
    """Result metadata of ``name`` on ``args`` by PyTorch's own rules (the eager op on meta
    tensors; fake tensors of ``shapes`` where sizes are symbolic), raising what PyTorch
    raises for bad arguments.  Results for static arguments are remembered (meta_cache)."""
    key = None if name in DEVICE_RULES else meta_cache.key(name, args, kwargs, device)
    if key is None:
        return _infer_meta(name, args, kwargs, device, shapes)
    found = meta_cache.get(key)
    if found is None:
        found = meta_cache.put(key, _infer_meta(name, args, kwargs, device, shapes))
    return found


def _infer_meta(
    name: str, args: tuple, kwargs: dict[str, Any], device: torch.device,
    shapes: ShapeContext | None = None
) -> TensorMeta | tuple[TensorMeta, ...]:
    # The context of a symbolic tensor argument; else ``shapes``, if a size argument is
    # symbolic; else none (plain meta tensors, the fast path).
    shapes = symbolic_context((args, kwargs)) or (shapes if has_symbols((args, kwargs)) else None)
    if shapes is None and not any(isinstance(v, torch.device) for v in args):
        fast = meta_rules.result_meta(name, args, kwargs, device)
        if fast is not None:
            return fast

    def fake(v: Any) -> Any:
        if isinstance(v, Node):
            assert v.meta is not None
            return fake(v.meta)
        if isinstance(v, TensorMeta):
            if shapes is not None:  # every tensor a fake tensor of the same context
                return shapes.fake(v.shape, v.stride, v.dtype, device=v.device)
            return v.fake()
        if isinstance(v, (tuple, list)):  # also an extern's tuple of metas
            return type(v)(fake(x) for x in v)
        if isinstance(v, sympy.Expr) and shapes is not None:  # a symbolic size argument
            return shapes.to_symint(v)
        if isinstance(v, slice):
            return slice(fake(v.start), fake(v.stop), fake(v.step))
        return v

    by_device = name in DEVICE_RULES and device.type == "cuda"
    moved = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.device)]
    if moved:  # a copy to another device: computed on the meta device, placed after
        device = moved[0]
        args = tuple(torch.device("meta") if isinstance(v, torch.device) else v for v in args)
    if shapes is None:
        _check_devices(name, (*args, *kwargs.values()))
        if by_device:
            out = run_on_device(OPS[name].eager, args, kwargs)
        else:
            fake_args, fake_kwargs = fake(args), {k: fake(v) for k, v in kwargs.items()}
            try:
                out = run_eager(name, fake_args, fake_kwargs)
            except NotImplementedError:  # no meta kernel in this PyTorch: ours, if known
                rule = meta_rules.WITHOUT_META_KERNEL.get(name)
                found = rule(args, kwargs, device) if rule is not None else None
                if found is None:
                    raise
                return found
        if name in CONVOLUTIONS:
            out = conv_layout(out, fake_args, fake_kwargs)
        elif device.type == "cpu" and (name in BATCH_NORMS or name in ATTENTION):
            out = cpu_layout(name, out, args, kwargs, fake_args, fake_kwargs)
        if OPS[name].family in _CHECKED_ON_VALUES:
            _check_on_values(name, args, kwargs)
    else:
        fake_args, fake_kwargs = fake(args), {k: fake(v) for k, v in kwargs.items()}
        out = shapes.run(run_eager, name, fake_args, fake_kwargs)
        if device.type == "cpu" and name in BATCH_NORMS:
            out = shapes.run(cpu_layout, name, out, args, kwargs, fake_args, fake_kwargs)

    def meta_of(t: Any) -> TensorMeta:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} produced a {type(t).__name__}, not a tensor")
        if shapes is not None:
            return TensorMeta(tuple(map(shapes.to_sympy, t.shape)),
                              tuple(map(shapes.to_sympy, t.stride())), t.dtype, device,
                              t.requires_grad, shapes=shapes)
        return dataclasses.replace(TensorMeta.of(t), device=device, storage_offset=sympy.Integer(0))

    if isinstance(out, (tuple, list)):
        return tuple(meta_of(t) for t in out)
    return meta_of(out)


# Pointwise ops whose meta kernels skip checks eager makes (``float - bool`` raises in
# eager; its meta kernel returns a float).
_CHECKED_ON_VALUES = frozenset({"unary", "binary", "ternary", "composite"})


def _check_devices(name: str, values: tuple) -> None:
    """Tensors on different devices raise, as in eager (meta tensors, which infer_meta runs
    on, carry no device); a 0-dim CPU tensor goes with any device, as a scalar does."""
    metas = [v.meta if isinstance(v, Node) else v for v in values]
    metas = [m for m in metas if isinstance(m, TensorMeta)]
    devices = {m.device for m in metas if not (m.ndim == 0 and m.device.type == "cpu")}
    if len(devices) > 1:
        found = ", ".join(sorted(str(d) for d in devices))
        raise RuntimeError(f"{name}: expected all tensors to be on the same device, but "
                           f"found at least two devices, {found}!")


def run_on_ones(name: str, args: tuple, kwargs: dict[str, Any], device: str = "cpu") -> None:
    """Run the eager op on ones of the arguments' dtypes and ranks, so that it raises what
    eager raises for those dtypes (``float - bool``: checks the meta kernels skip)."""

    def small(v: Any) -> Any:
        if isinstance(v, Node):
            v = v.meta
        if isinstance(v, TensorMeta):
            return torch.ones((1,) * v.ndim, dtype=v.dtype, device=device)
        if isinstance(v, (tuple, list)):
            return type(v)(small(x) for x in v)
        return v

    run_eager(name, small(args), {k: small(v) for k, v in kwargs.items()})


def _check_on_values(name: str, args: tuple, kwargs: dict[str, Any]) -> None:
    """:func:`run_on_ones` on CPU whatever the graph's device (which may be absent); what the
    CPU kernels lack, a half-precision op, is not an error."""
    try:
        run_on_ones(name, args, kwargs)
    except (NotImplementedError, RuntimeError) as e:
        devices = {v.meta.device.type for v in (*args, *kwargs.values()) if isinstance(v, Node)}
        if devices == {"cpu"} or "not implemented for" not in str(e):
            raise


def symbolic_context(values: Any) -> Any:
    """The ShapeContext of the first symbolic tensor or size among ``values``, or None."""
    if isinstance(values, Node):
        values = values.meta
    if isinstance(values, TensorMeta):
        return values.shapes if values.is_symbolic else None
    if isinstance(values, (tuple, list)):
        return next((found for v in values if (found := symbolic_context(v)) is not None), None)
    if isinstance(values, dict):
        return symbolic_context(tuple(values.values()))
    return None


def has_symbols(values: Any) -> bool:
    if isinstance(values, sympy.Basic):
        return bool(values.free_symbols)
    if isinstance(values, (tuple, list)):
        return any(has_symbols(v) for v in values)
    if isinstance(values, slice):
        return has_symbols((values.start, values.stop, values.step))
    if isinstance(values, dict):
        return has_symbols(tuple(values.values()))
    return False


def run_graph(graph: Any, inputs: list, on_error: Callable[[Node, Exception], None] | None = None
              ) -> tuple:
    """Evaluate ``graph`` eagerly on ``inputs``; an op that raises is handed with its
    exception to ``on_error`` (which raises), if given."""
    from minicompile.graph import map_nodes

    env: dict[Node, Any] = {}
    values = iter(inputs)
    last = {n: node for node in graph.nodes for n in node.inputs()}  # (each value's last reader)
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = next(values)
        elif node.op == "call":
            args = map_nodes(node.args, lambda n: env[n])
            kwargs = map_nodes(node.kwargs, lambda n: env[n])
            try:
                env[node] = run_eager(node.target, args, kwargs)
            except Exception as e:
                if on_error is None:
                    raise
                on_error(node, e)
                raise
            del args, kwargs
            for n in set(node.inputs()):  # values read for the last time: freed now, so
                if last[n] is node:  # that the next op's memory is theirs, not new pages
                    del env[n]  # (resnet50's folded weights: 0.13 -> 0.08 s)
        else:
            return tuple(env[n] for n in node.args[0])
    return ()
