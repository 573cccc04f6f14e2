"""Frame values to trackers, for :class:`OutputGraph` (a mixin of it).

:meth:`wrap` turns a value read at a source into a tracker and installs the guards the
trace relies on: tensors become placeholders, constants are guarded by value, containers by
structure (items wrapped lazily), other objects by type or identity.  Each source and each
object is wrapped once.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from typing import Any

import sympy
import torch

from minicompile.capture import library, mutation, parameter_containers, torch_ops
from minicompile.capture.kinds import Output
from minicompile.capture.dynamic import symbolic_strides
from minicompile.capture.variables import (
    BuiltinVar, ConstantVar, DictVar, LazyVar, ListVar, ModuleVar, NNModuleVar, ObjectVar,
    PartialVar, OpaqueVar, SizeVar, Source, TensorVar, TorchFunctionVar, TupleVar, UserFunctionVar,
    UserObjectVar, Var, is_constant_value,
)
from minicompile.errors import Unsupported
from minicompile.graph import DTYPE_ABBR, TensorMeta
from minicompile.shapes import ShapeContext, SymbolSource


# Python modules whose attributes are read without guards (nobody patches them per call).
_TRUSTED_MODULES = ("torch", "math", "operator", "builtins", "numpy")


def _is_class(key: Any) -> bool:
    """A dict key the guards name by reference: a class, or a typing form (``Union``), as
    in huggingface_hub's table of type validators."""
    return isinstance(key, type) or type(key).__module__ == "typing"


def is_user_object(value: Any) -> bool:
    """An instance of a user class whose attributes the trace may read (dataclasses,
    config objects), as opposed to modules, functions, classes and library objects."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.MethodType,
                          types.BuiltinFunctionType)):
        return False
    module = type(value).__module__ or ""
    return module.split(".")[0] not in ("builtins", "torch", "math", "functools", "typing")


def is_trusted_namespace(obj: Any) -> bool:
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, type):
        name = obj.__module__
    else:
        return False
    return name.split(".")[0] in _TRUSTED_MODULES


def is_numpy_value(value: Any) -> bool:
    """A NumPy array or scalar (without importing NumPy: if it is not imported, no value is
    one)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, (np.ndarray, np.generic))


def python_size(value: Any) -> Any:
    """An item of a ``torch.Size`` as a tracker holds it: a SymInt stays one, others are ints."""
    return value if isinstance(value, torch.SymInt) else int(value)


class FrameValuesMixin:
    def wrap(self: Output, value: Any, source: Source | None) -> Var:
        """The tracker for a value read from the frame at ``source`` (None for values derived
        from guarded ones), guarding what the trace will rely on.  Each source is wrapped
        once, so a global read twice is one placeholder and one set of guards."""
        if source is None:
            return self._wrap(value, None)
        if source.name in self._wrapped:
            return self._wrapped[source.name]
        tracked = isinstance(value, (torch.Tensor, list, dict, torch.nn.Module)) or (
            is_user_object(value)
        )
        prev = self._by_id.get(id(value)) if tracked else None
        if prev is not None and prev.source is not None:
            self.guards.alias_match(source, prev.source)
            var = prev
        else:
            var = self._wrap(value, source)
            if tracked:
                self._by_id[id(value)] = var
                self._values.append(value)
        self._wrapped[source.name] = var
        return var

    def _wrap(self: Output, value: Any, source: Source | None) -> Var:
        guard = source is not None and not source.trusted
        g = self.guards
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        if is_numpy_value(value):
            from minicompile.capture import numpy_kind  # NumPy's rules load with its first value

            return numpy_kind.numpy_arrays.wrap_input(self, value, source)
        if type(value) is int and source is not None and self.dynamic.wants_int(source.name, value):
            return self._symbolic_int(value, source)
        if is_constant_value(value):
            if guard:
                g.constant_match(source, value)
            return ConstantVar(value, source=source)
        if type(value) is torch.Size:
            if guard:
                g.constant_match(source, value)
            return SizeVar(tuple(ConstantVar(python_size(s)) for s in value), source=source)
        if type(value) in (tuple, list):
            if guard:
                g.sequence_match(source, value)
            items = [self._item(v, source, i) for i, v in enumerate(value)]
            if type(value) is tuple:
                return TupleVar(tuple(items), source=source)
            return ListVar(items, mutable=False, source=source)
        if type(value) is dict and all(type(k) in (str, int) or _is_class(k) for k in value):
            if guard:
                g.dict_keys_match(source, value)
            items = {k: self._item(v, source, k) for k, v in value.items()}
            return DictVar(items, mutable=False, source=source)
        if type(value) is functools.partial:
            return self._partial(value, source, guard)
        if guard and (isinstance(value, types.MethodType) or (
                isinstance(value, types.BuiltinMethodType) and isinstance(value.__self__, type))):
            # A method bound on each read, a new object every time (``SomeClass.a_classmethod``;
            # a C method of a class, ``dict.fromkeys``, and from PyTorch 2.14 a custom
            # ``autograd.Function``'s ``apply``: minicompile/compat.py): what it is bound to
            # and its function (a C method: its name), not the bound method.
            g.identity_match(source.attr("__self__"), value.__self__)
            if isinstance(value, types.MethodType):
                g.identity_match(source.attr("__func__"), value.__func__)
            else:
                g.constant_match(source.attr("__name__"), value.__name__)
            return self.object_var(value, source)
        if guard:
            # (a union, ``int | None``, is a value: guarded equal, not by type alone)
            if is_user_object(value) and not isinstance(value, (torch.nn.Module,
                                                                types.UnionType)):
                g.type_match(source, value)
            else:
                g.identity_match(source, value)
        return self.object_var(value, source)

    def _partial(self: Output, p: functools.partial, source: Source | None,
                 guard: bool) -> PartialVar:
        """A ``functools.partial`` as its function, arguments and keywords, each read
        through its source and guarded as the trace uses it (the keywords are a mutable
        dict); never by its identity, which changes on every call for one made again after
        a graph break."""
        if guard:
            self.guards.type_match(source, p)
        func, args, keywords = (
            self.realize(self.wrap(v, source.attr(name) if source is not None else None))
            for name, v in (("func", p.func), ("args", p.args), ("keywords", p.keywords)))
        assert isinstance(args, TupleVar) and isinstance(keywords, DictVar)
        return PartialVar(func, args.items, dict(keywords.items), source=source)

    def _item(self: Output, value: Any, source: Source | None, key: int | str) -> Var:
        """Items of containers read from the frame are wrapped when first used."""
        if source is None:
            return self._wrap(value, None)
        key_expr = "" if type(key) in (str, int) else self.guards.ref(key, "key")
        return LazyVar(value, source=source.item(key, key_expr))

    def realize(self: Output, var: Var) -> Var:
        if isinstance(var, LazyVar):
            return self.wrap(var.value, var.source)
        return var

    def _wrap_tensor(self: Output, t: torch.Tensor, source: Source | None) -> TensorVar:
        if source is None:
            raise Unsupported("a tensor reached without a source (e.g. a default value)")
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(t).__name__} is not supported")
        if t.is_nested:  # (a traced tensor is dense: Tensor.is_nested is False in the trace)
            raise Unsupported("nested tensors are not supported")
        if t.layout != torch.strided or t.dtype not in DTYPE_ABBR:
            raise Unsupported(f"{t.layout} tensors of dtype {t.dtype} are not supported")
        meta, dims = self.input_meta(t, source)
        alias = None if dims else self._aliased_input(t)
        if alias is not None:  # f(a, a[0]): a view of the input it shares storage with
            base, base_var = alias
            self.guards.tensor_match(source, t, meta)
            step = mutation.ViewStep("as_strided", (tuple(t.shape), t.stride(), t.storage_offset()))
            self.guards.alias_of(source, base_var.source, step.args)
            var = step.apply(self, base_var)
            mutation.register_view(self, var, base_var, (step,))
            return var
        self.guards.tensor_match(source, t, meta)
        return self.add_input(t, source, meta, source.expr)

    def input_meta(self: Output, t: torch.Tensor,
                   source: Source) -> tuple[TensorMeta, tuple[int, ...]]:
        """The metadata of an input's placeholder (with a size symbol for each dim the
        dynamic policy picks) and those dims."""
        # Placeholders describe the tensor from its data pointer: storage offsets are not
        # guarded, so they are not part of the metadata either.
        meta = dataclasses.replace(TensorMeta.of(t), storage_offset=sympy.Integer(0))
        dims = self.dynamic.dims(source.name, t)
        if dims:
            meta = self._symbolic_meta(t, source, dims, meta)
        return meta, dims

    def add_input(self: Output, t: torch.Tensor, source: Source, meta: TensorMeta,
                  expr: str) -> TensorVar:
        """A placeholder for the input ``t`` read at ``source``; ``expr`` gives it in the
        generated get_inputs (guards are the caller's)."""
        node = self.graph.placeholder(self._ident(source.ident), meta)
        self.input_sources.append(source.name)
        self.input_exprs.append(expr)
        var = TensorVar(node, type(t), source=source)
        self.input_values.append(t)
        self.input_vars.append(var)
        self.input_nodes[id(var)] = node
        return var

    def _aliased_input(self: Output, t: torch.Tensor) -> tuple[torch.Tensor, TensorVar] | None:
        """An input traced already whose storage ``t`` shares, when ``t`` can be traced as
        a view of it: that input is contiguous from offset 0 with static sizes, and ``t``
        lies within it (so ``as_strided`` of it, and ``as_strided_scatter`` into it, are
        ``t``)."""
        storage = t.untyped_storage()._cdata
        for base, var in zip(self.input_values, self.input_vars):
            if base.untyped_storage()._cdata != storage:
                continue
            if (var.node.meta.is_symbolic or base.storage_offset() != 0
                    or not base.is_contiguous()):
                return None
            last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
            inside = t.numel() == 0 or (min(t.stride(), default=0) >= 0 and last < base.numel())
            return (base, var) if inside and t.numel() > 0 else None
        return None

    def _shape_context(self: Output) -> ShapeContext:
        """The capture's size symbols, made with its first one."""
        if self.graph.shapes is None:
            self.graph.shapes = ShapeContext()
        return self.graph.shapes

    def _symbolic_meta(self: Output, t: torch.Tensor, source: Source, dims: tuple[int, ...],
                       meta: TensorMeta) -> TensorMeta:
        """``t``'s metadata with a size symbol for each of ``dims``."""
        shapes = self._shape_context()
        shape = list(meta.shape)
        for d in dims:
            where = SymbolSource(f"{source.name}.shape[{d}]", f"{source.expr}.shape[{d}]")
            shape[d] = shapes.symbol(int(t.shape[d]), where)
        stride = symbolic_strides(t, tuple(shape))
        return dataclasses.replace(meta, shape=tuple(shape), stride=stride, shapes=shapes)

    def _symbolic_int(self: Output, value: int, source: Source) -> ConstantVar:
        """A Python int argument the policy makes a size symbol (it changed between calls,
        or dynamic=True): a SymInt, guarded to stay an int of at least 2."""
        shapes = self._shape_context()
        where = SymbolSource(source.name, source.expr, is_tensor_size=False)
        symbol = shapes.symbol(value, where)
        self.guards.symbolic_int(source, value, str(symbol))
        return ConstantVar(shapes.to_symint(symbol), source=source)

    def sizes_to_sympy(self: Output, value: Any) -> Any:
        """Node arguments hold sizes as sympy expressions over our symbols, not SymInts."""
        if isinstance(value, torch.SymInt):
            return self.graph.shapes.to_sympy(value)
        if isinstance(value, (torch.SymBool, torch.SymFloat)):
            raise Unsupported(f"a symbolic {type(value).__name__} as an operator argument")
        if type(value) in (tuple, list):
            return type(value)(self.sizes_to_sympy(v) for v in value)
        if type(value) is torch.Size:
            return tuple(self.sizes_to_sympy(v) for v in value)
        if type(value) is slice:  # x[:, :n] with a symbolic n
            return slice(*(self.sizes_to_sympy(v) for v in (value.start, value.stop, value.step)))
        if isinstance(value, dict):
            return {k: self.sizes_to_sympy(v) for k, v in value.items()}
        return value

    def _ident(self: Output, base: str) -> str:
        name, n = base, 0
        while name in self._idents:
            n += 1
            name = f"{base}_{n}"
        self._idents.add(name)
        return name

    def object_var(self: Output, value: Any, source: Source | None) -> ObjectVar:
        """The kind of tracker for a non-constant object (no guards: callers guard)."""
        if isinstance(value, types.ModuleType):
            return ModuleVar(value, source=source)
        if isinstance(value, torch.nn.Module):
            kind = parameter_containers.MODULE_KINDS.get(type(value), NNModuleVar)
            return kind(value, source=source)
        try:
            in_torch_table = value in torch_ops.FUNCTIONS
        except TypeError:  # unhashable
            in_torch_table = False
        if in_torch_table:
            return TorchFunctionVar(value, source=source)
        module = getattr(value, "__module__", None) or ""
        if isinstance(value, types.FunctionType) and value in library.INLINED_HELPERS:
            return UserFunctionVar(value, source=source)
        if callable(value) and not isinstance(value, type) and module.split(".")[0] == "torch":
            return TorchFunctionVar(value, source=source)  # unsupported torch callables
        if isinstance(value, types.FunctionType):
            return UserFunctionVar(value, source=source)
        if isinstance(value, (types.BuiltinFunctionType, type)) and module in ("builtins", "math"):
            return BuiltinVar(value, source=source)
        if is_user_object(value):
            return UserObjectVar(value, source=source)
        if isinstance(value, type) or callable(value):
            return ObjectVar(value, source=source)
        return OpaqueVar(value, source=source)
