"""Building guards while tracing: the checks that decide whether a captured graph may be
reused (minicompile/runtime/guards.py runs them and says why one failed).

One :class:`GuardCheck` per fact the trace relied on, one method per kind of guard, rendered
into one generated Python function (runtime/guard_render.py) that returns False at the
first failing check.  Compared objects are held by reference, never by ``id()``.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
import types
from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat
from minicompile.capture.variables import Source
from minicompile.runtime.guards import GLOBAL_MODULE_HOOKS, GuardCheck, Guards
from minicompile.runtime.tensor_checks import PYTHON_CHECKS, TENSOR_CHECKS
from minicompile.shapes import MIN_DYNAMIC_SIZE, ShapeContext, python_expr

# Names the generated functions use themselves.
_RESERVED = frozenset({"check", "get_inputs", "rebuild", "outs", TENSOR_CHECKS, PYTHON_CHECKS,
                       *keyword.kwlist})


class GuardBuilder:
    """Collects checks while tracing.  ``ref(obj)`` puts an object in the namespace shared by
    the guard function and the other generated functions (inputs, rebuild) and returns the
    name it goes by."""

    def __init__(self, params: list[str]) -> None:
        self.params = params
        self.checks: list[GuardCheck] = []
        self.namespace: dict[str, Any] = {"torch": torch, "Tensor": torch.Tensor}
        self._refs: dict[Any, str] = {id(torch): "torch", id(torch.Tensor): "Tensor"}
        self._seen: set[Any] = set()  # exprs, and (source, singleton) of ``is`` checks
        self._types: dict[str, int] = {}  # source -> position of its type check

    def ref(self, obj: Any, hint: str = "obj") -> str:
        key: Any = ("device", str(obj)) if isinstance(obj, torch.device) else id(obj)
        if key in self._refs:
            return self._refs[key]
        base = re.sub(r"\W", "_", hint) or "obj"
        name, n = base, 0
        while (name in self.namespace or name in self.params or name in _RESERVED
               or (hasattr(builtins, name) and getattr(builtins, name) is not obj)):
            n += 1
            name = f"{base}_{n}"
        self.namespace[name] = obj
        self._refs[key] = name
        return name

    def add(self, source: str, kind: str, expr: str, actual: str, expected: Any,
            tensor: str = "") -> None:
        # One predicate once, however spelled: ``m.training is False`` (module_match) and
        # ``getattr(m, 'training', None) is False`` (the attribute read) are one check.
        same = (source, expected) if kind == "value" and (
            expected is None or isinstance(expected, bool)) else expr
        if expr in self._seen or same in self._seen:
            return
        self._seen.update((expr, same))
        if kind == "type":
            self._types[source] = len(self.checks)
        self.checks.append(GuardCheck(source, kind, expr, actual, expected, tensor))

    # -- one method per kind of guard ------------------------------------------------------

    def tensor_match(self, src: Source, t: torch.Tensor, meta: Any = None) -> None:
        """Type, dtype, device, requires_grad, sizes and strides (sizes give the rank).
        With symbolic sizes in ``meta`` (a TensorMeta), those dims are checked to be at
        least 2 and the strides to be the same expressions of the sizes."""
        x = src.expr
        self.type_match(src, t)
        symbolic = meta is not None and meta.is_symbolic
        # Checks of static metadata only (each starting with ``x``) may run in C++.
        tensor = "" if symbolic else x
        self.add(src.name, "dtype", f"{x}.dtype is {t.dtype}", f"{x}.dtype", t.dtype, tensor)
        index = "" if t.device.index is None else t.device.index
        dev = self.ref(t.device, f"dev_{t.device.type}{index}")
        self.add(src.name, "device", f"{x}.device == {dev}", f"{x}.device", t.device, tensor)
        grad = t.requires_grad
        self.add(src.name, "requires_grad", f"{x}.requires_grad is {grad}",
                 f"{x}.requires_grad", grad, tensor)
        if symbolic:
            self._symbolic_sizes(src, t, meta)
            return
        shape, stride = tuple(t.shape), tuple(t.stride())
        self.add(src.name, "sizes", f"{x}.shape == {shape!r}", f"{x}.shape", shape, tensor)
        self.add(src.name, "strides", f"{x}.stride() == {stride!r}", f"{x}.stride()", stride,
                 tensor)

    def array_match(self, src: Source, a: Any, meta: Any, scalar: bool = False) -> None:
        """A NumPy array read through ``torch.from_numpy`` (capture/numpy_arrays.py): type,
        dtype, writability, sizes and strides (NumPy's, in bytes).  A NumPy scalar: its
        type, which fixes its dtype."""
        self.type_match(src, a)
        if scalar:
            return
        x = src.expr
        # By its text ('<f8'), not by reference: a warm entry on disk can hold the check.
        self.add(src.name, "dtype", f"{x}.dtype.str == {a.dtype.str!r}", f"{x}.dtype.str",
                 a.dtype.str)
        writeable = bool(a.flags.writeable)
        self.add(src.name, "writeable", f"{x}.flags.writeable is {writeable}",
                 f"{x}.flags.writeable", writeable)
        if meta.is_symbolic:
            self._symbolic_sizes(src, a, meta, "ndim", "strides", a.itemsize)
            return
        shape, strides = tuple(a.shape), tuple(a.strides)
        self.add(src.name, "sizes", f"{x}.shape == {shape!r}", f"{x}.shape", shape)
        self.add(src.name, "strides", f"{x}.strides == {strides!r}", f"{x}.strides", strides)

    def _symbolic_sizes(self, src: Source, t: Any, meta: Any, ndim: str = "dim()",
                        strides: str = "stride()", unit: int = 1) -> None:
        """Sizes and strides of ``t`` against symbolic ``meta``; ``ndim`` and ``strides``
        read them off the value (``unit``: bytes per stride step, for NumPy arrays)."""
        x = src.expr
        self.add(src.name, "dims", f"{x}.{ndim} == {t.ndim}", f"{x}.{ndim}", t.ndim)
        names = {s: where.expr for s, where in meta.shapes.sources.items()}
        for d, size in enumerate(meta.shape):
            if size.is_Integer:
                self.add(src.name, f"size {d}", f"{x}.shape[{d}] == {int(size)}",
                         f"{x}.shape[{d}]", int(size))
            elif names.get(size) == f"{x}.shape[{d}]":  # where the symbol is defined
                self.add(src.name, f"size {d} (dynamic, {size})",
                         f"{x}.shape[{d}] >= {MIN_DYNAMIC_SIZE}", f"{x}.shape[{d}]",
                         f">= {MIN_DYNAMIC_SIZE}")
        checked = [d for d in range(t.ndim) if t.shape[d] != 1]
        if checked:
            scale = f"{unit} * " if unit != 1 else ""
            want = ", ".join(f"{scale}({python_expr(meta.stride[d], names)})" for d in checked)
            got = ", ".join(f"stride[{d}]" for d in checked)
            self.add(src.name, "strides", f"(lambda stride: ({got},) == ({want},))({x}.{strides})",
                     f"{x}.{strides}", tuple(str(s) for s in meta.stride))

    def symbolic_int(self, src: Source, value: int, symbol: str) -> None:
        """A Python int traced as a size symbol: any int of at least 2 reuses the trace."""
        self.type_match(src, value)
        self.add(src.name, f"value (dynamic, {symbol})", f"{src.expr} >= {MIN_DYNAMIC_SIZE}",
                 src.first_expr, f">= {MIN_DYNAMIC_SIZE}")

    def shape_relations(self, shapes: ShapeContext) -> None:
        """The relations between sizes the trace relied on (``Eq(s0, s1)`` for a broadcast,
        divisibility for a ``view``), as plain Python over the tensors' shapes."""
        names = {s: where.expr for s, where in shapes.sources.items()}
        readable = {s: where.name for s, where in shapes.sources.items()}
        for rel in shapes.relations():
            self.add("sizes", python_expr(rel, readable), python_expr(rel, names), "False", True)

    def constant_match(self, src: Source, value: Any) -> None:
        """Type and value of a Python constant the trace read (``is`` for singletons)."""
        x = src.first_expr
        if value is None or isinstance(value, bool):
            self.add(src.name, "value", f"{x} is {value!r}", x, value)
        elif isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
            self.add(src.name, "value", f"{x} is {self.ref(value, str(value))}", x, value)
        elif isinstance(value, torch.device):
            self.type_match(src, value)
            dev = self.ref(value, "dev")
            self.add(src.name, "value", f"{src.expr} == {dev}", src.expr, value)
        else:
            self.type_match(src, value)
            if isinstance(value, float) and value != value:  # NaN: equal to no number
                self.add(src.name, "value", f"{src.expr} != {src.expr}", src.expr, value)
                return
            literal = self._literal(value)
            self.add(src.name, "value", f"{src.expr} == {literal}", src.expr, value)

    def identity_match(self, src: Source, obj: Any) -> None:
        """The very object the trace saw (modules, functions, classes reached by name)."""
        name = self.ref(obj, getattr(obj, "__name__", type(obj).__name__))
        if isinstance(obj, types.UnionType):  # ``int | None`` is made anew where it is
            self.type_match(src, obj)  # written: an equal one, not the same object
            self.add(src.name, "value", f"{src.expr} == {name}", src.expr, obj)
            return
        expr = f"{src.first_expr} is {name}"
        k = self._types.pop(src.name, None)
        if k is not None and expr not in self._seen:  # the object implies its type: there
            self._seen.add(expr)
            self.checks[k] = GuardCheck(src.name, "identity", expr, src.first_expr, obj)
            return
        self.add(src.name, "identity", expr, src.first_expr, obj)

    def type_match(self, src: Source, obj: Any) -> None:
        """Instances of user classes: the class, not the object (attributes read are
        guarded one by one)."""
        typ, cls = f"type({src.first_expr})", type(obj)
        name = cls.__name__ if getattr(builtins, cls.__name__, None) is cls else self.ref(
            cls, cls.__name__)  # int, str by name (not code, function)
        self.add(src.name, "type", f"{typ} is {name}", typ, cls)

    def alias_match(self, src: Source, same_as: Source) -> None:
        """``src`` is the very object already traced as ``same_as`` (``f(x, x)``)."""
        expr = f"{src.first_expr} is {same_as.expr}"
        self.add(src.name, f"is {same_as.name}", expr, f"{src.first_expr} is {same_as.expr}", True)

    def distinct_storages(self, exprs: list[str]) -> None:
        """Tensor inputs do not share memory (needed when one is mutated in place)."""
        if len(exprs) < 2:
            return
        count = f"{self.ref(compat.storage_count, 'storage_count')}(({', '.join(exprs)},))"
        self.add("tensor inputs", "distinct storages", f"{count} == {len(exprs)}", count,
                 len(exprs))

    def alias_of(self, src: Source, base: Source, view: tuple) -> None:
        """``src`` is ``base.as_strided(*view)``: the same storage, from a base that is
        contiguous from offset 0."""
        x, b = src.expr, base.expr
        size, stride, offset = view
        expr = (f"{x}.untyped_storage()._cdata == {b}.untyped_storage()._cdata and "
                f"{x}.stride() == {tuple(stride)!r} and {x}.storage_offset() == {offset} and "
                f"{b}.storage_offset() == 0 and {b}.is_contiguous()")
        self.add(src.name, f"a view of {base.name}", expr, f"({expr})", True)

    def module_match(self, src: Source, mod: Any) -> None:
        """A module whose forward is inlined: no hooks, no forward set on the instance,
        the same ``training`` flag."""
        x = src.expr
        self.add(src.name, "hooks", f"not ({x}._forward_hooks or {x}._forward_pre_hooks)",
                 f"len({x}._forward_hooks) + len({x}._forward_pre_hooks)", 0)
        self.add(src.name, "forward", f"'forward' not in {x}.__dict__",
                 f"'forward' in {x}.__dict__", False)
        self.add(src.name + ".training", "value", f"{x}.training is {mod.training}",
                 f"{x}.training", mod.training)
        ref = self.ref(GLOBAL_MODULE_HOOKS, "global_module_hooks")
        self.add("global", "module hooks", f"not ({ref}[0] or {ref}[1])",
                 f"len({ref}[0]) + len({ref}[1])", 0)

    def keys_match(self, src: Source, expr: str, keys: list) -> None:
        """The keys of a mapping the trace iterated (``_modules`` of a ModuleList)."""
        self.add(src.name, "keys", f"list({expr}) == {keys!r}", f"list({expr})", keys)

    def sequence_match(self, src: Source, value: tuple | list) -> None:
        length = f"len({src.expr})"
        self.type_match(src, value)
        self.add(src.name, "length", f"{length} == {len(value)}", length, len(value))

    def dict_keys_match(self, src: Source, value: dict) -> None:
        keys = list(value.keys())
        self.type_match(src, value)
        text = "[" + ", ".join(self._literal(k) for k in keys) + "]"  # (classes: by reference)
        self.add(src.name, "keys", f"list({src.expr}) == {text}", f"list({src.expr})", keys)

    def global_call(self, fn: Callable, args: tuple, kwargs: dict, value: Any) -> None:
        """A query of global state (``torch.is_autocast_enabled("cuda")``) answers the same."""
        ref = self.ref(fn, fn.__name__)
        text = ", ".join([*map(self._literal, args),
                          *(f"{k}={self._literal(v)}" for k, v in kwargs.items())])
        call = f"{ref}({text})"
        self.add("global", call, f"{call} == {self._literal(value)}", call, value)

    def grad_mode(self) -> None:
        enabled = torch.is_grad_enabled()
        fn = self.ref(torch.is_grad_enabled, "is_grad_enabled")
        self.add("global", "grad mode", f"{fn}() is {enabled}", f"{fn}()", enabled)

    # -- helpers ---------------------------------------------------------------------------

    def _literal(self, value: Any) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return self.ref(value, "const")
        if isinstance(value, (int, float, str, bytes, complex)) or type(value) is torch.Size:
            return repr(tuple(value)) if type(value) is torch.Size else repr(value)
        return self.ref(value, "const")

    def build(self) -> Guards:
        return Guards(self.params, list(self.checks), self.namespace)
