"""Calls of Python builtins and ``math`` functions, list and dict methods, and the protocols
of user objects, for the interpreter (a mixin of InstructionTranslator).  Builtins that need
the trace are modelled by the mixin; pure ones on constants are folded (``max(a, 2)``,
``math.sqrt(d)``), on tensors answered from metadata (``len(x)``) or made graph ops
(``abs(x)``), by :func:`fold_builtin`.  Everything else, ``print`` first, is Unsupported.
Container methods mutate the trackers.
"""

from __future__ import annotations

import builtins
import collections.abc
import inspect
import operator
from typing import TYPE_CHECKING, Any

from minicompile.capture import kinds, records
from minicompile.capture.kinds import Output
from minicompile.capture.variables import (
    NULL, BoundMethodVar, ConstantVar, DictVar, IteratorVar, ListVar, MethodVar,
    NestedFunctionVar, NewObjectVar, NNModuleVar, ObjectVar, PartialVar, ReadMethodVar, RecordVar,
    Source, SuperVar, TensorVar, TupleVar, UserObjectVar, Var, contains_tensor,
    python_type_of, specialized,
)
from minicompile.errors import Unsupported, attempt

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator

_LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "clear", "reverse"})
_DICT_MUTATORS = frozenset({"update", "pop", "setdefault", "clear"})


class PythonCallsMixin:
    def has_python_method(self: InstructionTranslator, var: Var, name: str) -> bool:
        """``var`` is an object of a user class whose ``name`` (``__getitem__``,
        ``__len__``...) is Python code the trace can inline."""
        if not isinstance(var, (NewObjectVar, UserObjectVar)):
            return False
        cls = records.python_class(var) or type(var.value)
        return inspect.isfunction(getattr(cls, name, None))

    def user_contains(self: InstructionTranslator, container: Var, item: Var) -> bool:
        """``item in container`` for an object of a user class.  The mixin ``__contains__``
        of collections.abc (``try: self[k]`` ...) is answered from the keys the object
        iterates over; a class's own is inlined."""
        method = getattr(records.python_class(container) or type(container.value), "__contains__")
        if method.__module__ == "collections.abc":
            key = self.output.to_value(item)
            return any(self.output.to_value(k) == key for k in self.object_items(container))
        return self.truthy(self.call_function(self.load_attr(container, "__contains__"),
                                              [item], {}))

    @kinds.call.register(ReadMethodVar)
    def call_read_method(self: InstructionTranslator, fn: ReadMethodVar, args: list, kw: dict):
        """``dict.get(obj, key)`` and friends on a user subclass read from the frame: the
        value is read now and guarded through the same call in the guard function."""
        obj, method = fn.self_var, fn.descriptor
        values, kwargs = self.output.to_values(args, kw)
        mname = method.__name__
        if mname in ("keys", "values", "items") and isinstance(obj.value, dict) and (
            obj.source is not None and not values and not kwargs
        ):
            return self._dict_view(obj, mname)
        if obj.source is None or kwargs or not all(
            type(v) in (str, int, bool, type(None)) for v in values):
            raise Unsupported(f"{mname}() of {obj.describe()} with these arguments")
        text = "".join(f", {v!r}" for v in values)
        src = obj.source
        call = self.output.guards.ref(method, mname)
        source = Source(f"{src.name}.{mname}({text[2:]})", f"{call}({src.expr}{text})",
                        self.output._ident(f"{src.ident}_{mname}"), src.trusted)
        try:
            value = method(obj.value, *values)
        except Exception as e:
            raise Unsupported(f"{source.name} raised {type(e).__name__} (eager raises)") from e
        return self.output.wrap(value, source)

    def _dict_view(self: InstructionTranslator, obj: Var, name: str) -> Var:
        """``keys()``, ``values()`` or ``items()`` of a dict subclass read from the frame (a
        ModelOutput a break handed over): its keys guarded, its values read by key."""
        keys = list(dict.keys(obj.value))
        if not all(type(k) in (str, int) for k in keys):
            raise Unsupported(f"{name}() of {obj.describe()} with keys of other types")
        src, guards = obj.source, self.output.guards
        guards.keys_match(src, f"{guards.ref(dict.keys, 'dict_keys')}({src.expr})", keys)
        if name == "keys":
            return ConstantVar(dict.fromkeys(keys).keys())
        getitem = guards.ref(dict.__getitem__, "dict_getitem")
        values = [self.output.wrap(dict.__getitem__(obj.value, k), Source(
            f"{src.name}[{k!r}]", f"{getitem}({src.expr}, {k!r})",
            self.output._ident(f"{src.ident}_{k}"), src.trusted)) for k in keys]
        if name == "values":
            return ListVar(values)
        return ListVar([TupleVar((ConstantVar(k), v)) for k, v in zip(keys, values)])

    @kinds.call_method.register(ListVar)
    def list_method(self: InstructionTranslator, lst: ListVar, name: str, args: list, kw: dict):
        if name in _LIST_MUTATORS:
            self.output.side_effects.mutate_container(lst, f"list.{name}")
        items = lst.items
        const = self.output.to_value
        if kw:
            raise Unsupported(f"list.{name}() with keyword arguments is not supported")
        if name == "append" and len(args) == 1:
            items.append(args[0])
        elif name == "extend" and len(args) == 1:
            items.extend(self.iter_items(args[0]))
        elif name == "insert" and len(args) == 2:
            items.insert(const(args[0]), args[1])
        elif name == "pop" and len(args) <= 1:
            if not items:
                raise Unsupported("pop from an empty list (eager raises IndexError)")
            return self.realize(items.pop(const(args[0]) if args else -1))
        elif name == "clear" and not args:
            items.clear()
        elif name == "reverse" and not args:
            items.reverse()
        elif name == "copy" and not args:
            return ListVar(list(items))
        elif name in ("index", "count"):
            return self.fold(lambda v, *a: getattr(v, name)(*a), lst, *args, what=name)
        else:
            raise Unsupported(f"list.{name}() is not supported yet")
        return ConstantVar(None)

    @kinds.call_method.register(DictVar)
    def dict_method(self: InstructionTranslator, d: DictVar, name: str, args: list, kw: dict):
        if name in _DICT_MUTATORS:
            self.output.side_effects.mutate_container(d, f"dict.{name}")
        items = d.items
        const = self.output.to_value
        if name in ("get", "pop", "setdefault") and 1 <= len(args) <= 2:
            key = const(args[0])
            if key in items:
                return self.realize(items.pop(key) if name == "pop" else items[key])
            if name == "pop" and len(args) == 1:
                raise Unsupported(f"key {key!r} not found (eager raises KeyError)")
            default = args[1] if len(args) == 2 else ConstantVar(None)
            if name == "setdefault":
                items[key] = default
                return self.realize(default)
            return default
        if name == "keys" and not args:  # a view of plain keys: sets ops, `in`, iteration
            return ConstantVar(dict.fromkeys(items).keys())
        if name == "values" and not args:
            return ListVar([self.realize(v) for v in items.values()])
        if name == "items" and not args:
            return ListVar([TupleVar((ConstantVar(k), self.realize(v))) for k, v in items.items()])
        if name == "copy" and not args:
            return DictVar(dict(items))
        if name == "update" and len(args) <= 1:
            if args:
                other = self.realize(args[0])
                if not isinstance(other, DictVar):
                    raise Unsupported(f"dict.update({other.describe()}) is not supported")
                items.update(other.items)
            items.update(kw)
            return ConstantVar(None)
        if name == "clear" and not args:
            items.clear()
            return ConstantVar(None)
        raise Unsupported(f"dict.{name}() is not supported yet")

    def call_builtin(self: InstructionTranslator, fn: Any, args: list, kwargs: dict) -> Var:
        args = [self.realize(a) for a in args]
        if fn is super:
            return self.make_super(args)
        if fn in (getattr, hasattr) and 2 <= len(args) <= 3 - (fn is hasattr) and not kwargs:
            name = self.output.to_value(args[1])
            if fn is hasattr:
                return ConstantVar(self.has_attr(args[0], name))
            if len(args) == 3 and not self.has_attr(args[0], name):
                return args[2]
            return self.load_attr(args[0], name)
        if fn is callable and len(args) == 1 and isinstance(
            args[0], (NestedFunctionVar, BoundMethodVar, MethodVar, ReadMethodVar, PartialVar)):
            return ConstantVar(True)
        if fn is len and len(args) == 1 and not kwargs:
            n = kinds.length(self, args[0])
            if n is not None:
                return n
        if fn is delattr and len(args) == 2:
            kinds.delete_attr(self, args[0], self.output.to_value(args[1]))
            return ConstantVar(None)
        if fn is setattr and len(args) == 3:
            self.store_attr(args[0], self.output.to_value(args[1]), args[2])
            return ConstantVar(None)
        if fn is zip and not kwargs.keys() - {"strict"}:
            columns = [self.iter_items(a) for a in args]
            return IteratorVar([TupleVar(tuple(row)) for row in zip(*columns)])
        if fn is enumerate:
            start_var = args[1] if len(args) > 1 else kwargs.get("start", ConstantVar(0))
            start = self.output.to_value(start_var)
            return IteratorVar([TupleVar((ConstantVar(start + i), v))
                                for i, v in enumerate(self.iter_items(args[0]))])
        if fn is reversed and len(args) == 1:
            return IteratorVar(list(reversed(self.iter_items(args[0]))))
        if fn in (map, filter) and len(args) >= 2 and not kwargs:
            if fn is map:
                rows = zip(*[self.iter_items(a) for a in args[1:]])
                return IteratorVar([self.call_function(args[0], list(r), {}) for r in rows])
            if len(args) == 2 and not isinstance(args[0], ConstantVar):
                items = self.iter_items(args[1])
                keep = [self.truthy(self.call_function(args[0], [i], {})) for i in items]
                return IteratorVar([i for i, k in zip(items, keep) if k])
        if fn is iter and len(args) == 1:
            return IteratorVar(self.iter_items(args[0]))
        if fn is next and 1 <= len(args) <= 2 and isinstance(args[0], IteratorVar):
            item = self.next_item(args[0])
            if item is not NULL:
                return item
            if len(args) == 2:
                return args[1]
            raise Unsupported("next() on an exhausted iterator (eager raises StopIteration)")
        if fn in (list, tuple) and len(args) == 1 and not kwargs:
            items = self.iter_items(args[0])
            return ListVar(items) if fn is list else TupleVar(tuple(items))
        cls = records.python_class(args[0]) if args else None
        if cls is not None and not kwargs:  # objects the trace made
            if fn is isinstance and len(args) == 2:
                return ConstantVar(issubclass(cls, self.output.to_value(args[1])))
            if fn is type and len(args) == 1:
                return self.output.wrap(cls, None)
        if fn is sum and 1 <= len(args) <= 2 and not kwargs:
            items = self.iter_items(args[0])
            if contains_tensor(items):
                total = args[1] if len(args) == 2 else ConstantVar(0)
                for item in items:
                    total = self.binary("+", operator.add, total, item)
                return total
        # Iterators and iterable objects become lists for the folding builtins (sum, any,
        # max, sorted...).
        args = [ListVar(self.iter_items(a)) if isinstance(a, (IteratorVar, NewObjectVar)) or (
            isinstance(a, UserObjectVar) and hasattr(type(a.value), "__iter__")) else a
            for a in args]
        return fold_builtin(self.output, fn, args, kwargs)

    @kinds.length.register(ObjectVar)
    @kinds.length.register(NewObjectVar)
    def object_len(self: InstructionTranslator, obj: ObjectVar | NewObjectVar) -> Var | None:
        """A module's hook dict (nn.TransformerEncoderLayer counts them), or an object whose
        class defines ``__len__`` in Python."""
        value = getattr(obj, "value", None)
        if type(value) is collections.OrderedDict and obj.source is not None:
            src, n = obj.source, len(value)
            self.output.guards.add(src.name, "length", f"len({src.expr}) == {n}",
                                   f"len({src.expr})", n)
            return ConstantVar(n)
        if self.has_python_method(obj, "__len__"):
            return self.call_function(self.load_attr(obj, "__len__"), [], {})
        return None

    def make_super(self: InstructionTranslator, args: list) -> Var:
        if len(args) == 2:
            return SuperVar(self.output.to_value(args[0]), self.realize(args[1]))
        if args:
            raise Unsupported("one-argument super() is not supported")
        cell = self.cells.get("__class__")
        if cell is None or cell.contents is None or not self.code.co_argcount:
            raise Unsupported("super() outside a method (no __class__ cell)")
        cls = self.output.to_value(self.realize(cell.contents))
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if obj is None and first in self.cells:
            obj = self.cells[first].contents
        if obj is None:
            raise Unsupported("super(): the first argument is unbound")
        return SuperVar(cls, self.realize(obj))


# ``len(x)`` of the kinds that know it (None: the builtin decides, on the value).
kinds.length.register(Var, lambda tx, var: None)
for _kind in (TupleVar, ListVar, DictVar):  # (items may be objects of the trace)
    kinds.length.register(_kind, lambda tx, var: ConstantVar(len(var.items)))
kinds.length.register(RecordVar, lambda tx, var: ConstantVar(len(records.keys_of(var))))
kinds.length.register(NNModuleVar, lambda tx, var: ConstantVar(len(tx.module_items(var))))


# Builtins without side effects, folded when no argument is a tensor.
FOLDABLE: frozenset[Any] = frozenset({
    abs, all, any, bool, callable, complex, divmod, float, hash, int, isinstance, issubclass,
    len, max, min, pow, range, repr, round, slice, sorted, str, sum, tuple, type})
_TENSOR_TO_PYTHON = (bool, int, float, complex)


# Builtins that compute with symbolic sizes as they are (and record relations they decide).
_SYMBOLIC_SAFE = frozenset({abs, min, max, int, float, bool, round, divmod, pow, sum, len})


def fold_builtin(out: Output, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``fn(*args, **kwargs)`` for a builtin or math function ``fn``."""
    name = getattr(fn, "__name__", repr(fn))
    if fn is print:
        raise Unsupported("print() is not traceable (side effect)", hint="remove the print")
    if fn is builtins.getattr and len(args) in (2, 3):
        raise Unsupported("getattr() is not supported yet")
    if fn in (tuple, list) and len(args) == 1 and not kwargs:
        return _sequence(fn, args[0])
    pairs = args[0].items if args and isinstance(args[0], (TupleVar, ListVar)) else None
    if fn is dict and len(args) == 1 and not kwargs and pairs is not None and all(
            isinstance(p, TupleVar) and len(p.items) == 2 for p in pairs):  # dict(o.items())
        return DictVar({out.to_value(p.items[0]): p.items[1] for p in pairs})
    values = [out.to_value(a) for a in args]
    kw = {k: out.to_value(v) for k, v in kwargs.items()}
    if any(contains_tensor(v) for v in (*values, *kw.values())):
        return _with_tensors(out, fn, values)
    exception_class = isinstance(fn, type) and issubclass(fn, BaseException)
    if fn not in (isinstance, type, issubclass, callable):  # these need only the type
        out.require_pinned([*args, *kwargs.values()], f"{name}()")
    if fn in (isinstance, type, issubclass, callable):
        values = [python_type_of(v) for v in values]  # a symbolic size is an int
    elif fn not in _SYMBOLIC_SAFE:  # str(n), hash(n), format(n): the number, guarded
        values, kw = specialized(values), specialized(kw)
    if fn in FOLDABLE or exception_class or getattr(fn, "__module__", None) == "math":
        return out.from_value(attempt(f"{name}()", fn, *values, **kw))
    raise Unsupported(f"builtin {name}() is not supported")


def _sequence(fn: Any, arg: Var) -> Var:
    if isinstance(arg, (TupleVar, ListVar)):
        items = tuple(arg.items)
    elif isinstance(arg, ConstantVar) and isinstance(arg.value, (
            str, bytes, set, frozenset, collections.abc.KeysView)):
        items = tuple(ConstantVar(c) for c in arg.value)
    elif isinstance(arg, DictVar):
        items = tuple(ConstantVar(k) for k in arg.items)
    else:
        raise Unsupported(f"{fn.__name__}() of {arg.describe()} is not supported yet")
    return TupleVar(items) if fn is tuple else ListVar(list(items))


def _with_tensors(out: Output, fn: Any, values: list) -> Var:
    x = values[0] if values else None
    if isinstance(x, Var):  # a tensor or a NumPy array first: its kind's rule
        return kinds.builtin(out, x, fn, values)
    if fn is len and isinstance(x, (tuple, list, dict)):
        return ConstantVar(len(x))
    if fn is isinstance and len(values) == 2:
        return ConstantVar(isinstance(x, values[1]))
    raise _on_tensors(fn)


@kinds.builtin.register(TensorVar)
def _tensor_builtin(out: Output, x: TensorVar, fn: Any, values: list) -> Var:
    if len(values) != 1 + (fn is isinstance) or fn not in (abs, len, isinstance, type):
        raise _on_tensors(fn)
    if fn is abs:
        return out.op("abs", (x,))
    if fn is len and x.meta.ndim == 0:
        raise Unsupported("len() of a 0-d tensor (eager raises)")
    if fn is len:
        return ConstantVar(x.meta.sizes()[0])
    if fn is isinstance:
        return ConstantVar(issubclass(x.python_type, values[1]))
    return ObjectVar(x.python_type)


def _on_tensors(fn: Any) -> Unsupported:
    name = getattr(fn, "__name__", repr(fn))
    if fn in _TENSOR_TO_PYTHON:
        return Unsupported(f"{name}() of a tensor reads its data into Python; not supported",
                           hint="keep the value a tensor (graph break)")
    return Unsupported(f"builtin {name}() on tensors is not supported")
