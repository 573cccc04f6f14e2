"""Objects created inside the trace: model outputs, records and plain user objects.

A :class:`RecordVar` models a dataclass instance (transformers' ``ModelOutput``); a
:class:`NewObjectVar` an instance of a plain class (``DynamicCache``), ``__init__`` inlined.
Writes are logged in order, and runtime/values.py builds the real object where it leaves
the compiled code, so it is the one eager builds.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any

from minicompile.capture import kinds
from minicompile.capture.variables import (
    ConstantVar, DictVar, ListVar, LazyVar, MethodVar, ModuleVar, NewObjectVar, ObjectSlotVar,
    ObjectVar, RecordVar, Source, StructSeqVar, TensorVar, TupleVar, UserFunctionVar,
    UserObjectVar, Var, is_constant_value,
)
from minicompile.errors import Unsupported


# object's attribute protocol, which a class's override reaches through super().
OBJECT_SLOTS = ("__getattribute__", "__setattr__", "__delattr__")
# The mapping methods of a ModelOutput that the record answers itself.
MAPPING_METHODS = frozenset({"keys", "values", "items", "to_tuple", "get"})


def is_model_output(cls: type) -> bool:
    """A subclass of transformers' ``ModelOutput`` (found by name: no import of it)."""
    return any(k.__name__ == "ModelOutput" and k.__module__.startswith("transformers.")
               for k in cls.__mro__)


def _renames_cache_kwargs(init: Any) -> bool:
    """Whether ``init`` is the wrapper transformers (5.2x) puts around a ModelOutput's
    dataclass ``__init__`` (``_BCCacheNameMeta``): it renames a ``past_key_values`` or
    ``cache_params`` keyword to ``cache`` and calls the dataclass ``__init__``."""
    code = getattr(init, "__code__", None)
    return (code is not None and hasattr(init, "__wrapped__")
            and code.co_filename.replace("\\", "/").endswith("transformers/utils/generic.py")
            and "_rename_kwargs_for_bc" in code.co_names)


def _dataclass_init(cls: type) -> Any:
    """The dataclass-generated ``__init__`` of ``cls`` (behind transformers' renaming
    wrapper, which :func:`construct` applies itself), or whatever ``__init__`` is."""
    init = getattr(cls, "__init__", None)
    if is_model_output(cls) and _renames_cache_kwargs(init):
        return init.__wrapped__
    return init


def _rename_cache_kwargs(cls: type, kwargs: dict) -> dict:
    """The keywords transformers' wrapper passes on (``past_key_values`` / ``cache_params``
    become ``cache``; both given: the ValueError eager raises, as a graph break)."""
    if not _renames_cache_kwargs(getattr(cls, "__init__", None)):
        return kwargs
    for old in ("past_key_values", "cache_params"):
        if old in kwargs:
            if "cache" in kwargs:
                raise Unsupported(f"{cls.__name__}(): both cache and {old} (eager raises "
                                  "ValueError)")
            kwargs = {("cache" if k == old else k): v for k, v in kwargs.items()}
            break
    return kwargs


def is_record_class(cls: type) -> bool:
    """A dataclass whose ``__init__`` is the generated one and whose ``__post_init__`` is
    none or ModelOutput's (both modelled here)."""
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        return False
    init = _dataclass_init(cls)
    code = getattr(init, "__code__", None)
    if code is None or code.co_filename != "<string>":  # dataclasses exec()s its __init__
        return False
    if hasattr(cls, "__post_init__") and not is_model_output(cls):
        return False
    return not getattr(cls, "__slots__", None)


def construct(tx: kinds.Translator, cls: type, args: list, kwargs: dict) -> RecordVar:
    """``cls(*args, **kwargs)`` for a record class."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = _rename_cache_kwargs(cls, kwargs)
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    try:
        bound = inspect.Signature(params).bind_partial(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"{cls.__name__}(): {e} (eager raises TypeError)") from e
    fields: dict[str, Var] = {}
    for f in dataclasses.fields(cls):
        if f.name in bound.arguments:
            fields[f.name] = bound.arguments[f.name]
        elif f.default is not dataclasses.MISSING:
            fields[f.name] = tx.output.from_value(f.default)
        elif f.default_factory in (list, dict, tuple):  # type: ignore[comparison-overlap]
            empty = {list: ListVar([]), dict: DictVar({}), tuple: TupleVar(())}
            fields[f.name] = empty[f.default_factory]  # type: ignore[index]
        else:
            raise Unsupported(f"{cls.__name__}(): field {f.name!r} has no value (eager raises)")
    record = RecordVar(cls, dict(fields), init=dict(bound.arguments))
    if is_model_output(cls):
        record.keys = _model_output_keys(cls, fields)
    return record


def _model_output_keys(cls: type, fields: dict[str, Var]) -> list[str]:
    """The dict ModelOutput.__post_init__ builds: the non-None fields, in field order (its
    other branch, a dict or iterator of pairs as the only field, is not modelled)."""
    names = list(fields)
    first = fields[names[0]]
    others_none = all(_is_none(fields[n]) for n in names[1:])
    if others_none and not isinstance(first, TensorVar) and not _is_none(first):
        raise Unsupported(f"{cls.__name__}() built from a dict or an iterator of pairs")
    return [n for n in names if not _is_none(fields[n])]


def plain_model_output(record: RecordVar) -> bool:
    """Whether ``record`` is a ModelOutput that runtime/values.py's ``model_output`` builds
    as its constructor does: ModelOutput's own ``__setattr__``, ``__setitem__`` and
    ``__post_init__``, every field an argument of ``__init__`` and none renamed by them
    (``past_key_values``), nothing written after construction."""
    cls = record.cls
    return (record.keys is not None and not record.writes
            and all(getattr(getattr(cls, m, None), "__qualname__", "") == f"ModelOutput.{m}"
                    for m in ("__setattr__", "__setitem__", "__post_init__"))
            and all(f.init for f in dataclasses.fields(cls))
            and not {"past_key_values", "cache_params"} & record.fields.keys())


def _is_none(var: Var) -> bool:
    return var.identity() is None  # (only a constant stands for None)


@kinds.load_attr.register(RecordVar)
def attr(tx: kinds.Translator, record: RecordVar, name: str) -> Var:
    """``record.name``: a field or a written attribute, a mapping method, or whatever the
    class defines (methods and properties are inlined with the record as ``self``)."""
    if name in record.fields:
        return tx.realize(record.fields[name])
    if record.keys is not None and name in MAPPING_METHODS:
        return MethodVar(record, name)
    if name == "__class__":
        return tx.output.wrap(record.cls, None)
    return tx.class_attr(record, record.cls, name)


@kinds.has_attr.register(RecordVar)
@kinds.has_attr.register(NewObjectVar)
def has_attr(tx: kinds.Translator, obj: RecordVar | NewObjectVar, name: str) -> bool:
    """``hasattr`` of an object the trace made: its own attributes, then its class."""
    own = obj.fields if isinstance(obj, RecordVar) else obj.attrs
    return name in own or hasattr(obj.cls, name)


@kinds.store_attr.register(RecordVar)
def set_attr(tx: kinds.Translator, record: RecordVar, name: str, value: Var) -> None:
    params = getattr(record.cls, "__dataclass_params__", None)
    if params is not None and params.frozen:
        raise Unsupported("assignment to a frozen dataclass (eager raises)")
    if record.keys is not None and name in _field_names(record) and not _is_none(value):
        _add_key(record, name)  # ModelOutput.__setattr__ keeps the mapping in step
    record.fields[name] = value
    record.writes.append(("attr", name, value))


@kinds.store_item.register(RecordVar)
def set_item(tx: kinds.Translator, record: RecordVar, key: Var, value: Var) -> None:
    k = tx.output.to_value(key)
    if record.keys is None or not isinstance(k, str):
        raise Unsupported(f"item assignment on {record.describe()} is not supported")
    _add_key(record, k)
    record.fields[k] = value
    record.writes.append(("item", k, value))


@kinds.subscript.register(RecordVar)
def get_item(tx: kinds.Translator, record: RecordVar, key: Var) -> Var:
    if record.keys is None:
        raise Unsupported(f"{record.describe()} is not subscriptable (eager raises)")
    k = tx.output.to_value(key)
    if isinstance(k, str):
        if k not in record.keys:
            raise Unsupported(f"{record.cls.__name__} has no key {k!r} (eager raises KeyError)")
        return tx.realize(record.fields[k])
    return kinds.subscript(tx, to_tuple(tx, record), key)  # an int or a slice: to_tuple's


def to_tuple(tx: kinds.Translator, record: RecordVar) -> TupleVar:
    assert record.keys is not None
    return TupleVar(tuple(tx.realize(record.fields[k]) for k in record.keys))


@kinds.call_method.register(RecordVar)
def call_method(tx: kinds.Translator, record: RecordVar, name: str, args: list,
                kwargs: dict) -> Var:
    """The mapping methods of a ModelOutput: ``to_tuple``, and dict's on its items."""
    assert record.keys is not None
    if kwargs or len(args) not in ((1, 2) if name == "get" else (0,)):
        raise Unsupported(f"{record.cls.__name__}.{name}() with these arguments")
    if name == "to_tuple":
        return to_tuple(tx, record)
    items = DictVar({k: record.fields[k] for k in record.keys})
    return kinds.call_method(tx, items, name, args, kwargs)


def keys_of(record: RecordVar) -> list[str]:
    """What iterating, ``len()`` and ``in`` see."""
    if record.keys is None:
        raise Unsupported(f"{record.describe()} is not iterable (eager raises TypeError)")
    return list(record.keys)


def _field_names(record: RecordVar) -> set[str]:
    return {f.name for f in dataclasses.fields(record.cls)}


def _add_key(record: RecordVar, key: str) -> None:
    assert record.keys is not None
    if key not in record.keys:
        record.keys.append(key)


# -- plain user objects --------------------------------------------------------------------


def can_create(cls: type) -> bool:
    """A class whose instances the trace can create by inlining ``__init__``."""
    if type(cls) not in (type, abc.ABCMeta) or getattr(cls, "__abstractmethods__", None):
        return False
    if cls.__new__ is not object.__new__ or any(vars(k).get("__slots__") for k in cls.__mro__):
        return False
    for hook in ("__getattribute__", "__setattr__", "__delattr__"):
        method = getattr(cls, hook)
        if method is not getattr(object, hook) and not inspect.isfunction(method):
            return False
    for klass in cls.__mro__[:-1]:
        if klass.__module__ in ("builtins", "torch") or klass.__module__.startswith("torch."):
            return False  # builtin bases (dict, Exception), tensors, modules
    init = cls.__init__
    return init is object.__init__ or inspect.isfunction(init)


def create(tx: kinds.Translator, cls: type, args: list, kwargs: dict) -> NewObjectVar:
    obj = NewObjectVar(cls)
    if cls.__init__ is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__name__}() takes no arguments (eager raises TypeError)")
        return obj
    result = tx.inline_call(UserFunctionVar(cls.__init__), [obj, *args], kwargs)
    if not _is_none(result):
        raise Unsupported(f"{cls.__name__}.__init__() returned a value (eager raises TypeError)")
    return obj


@kinds.load_attr.register(NewObjectVar)
def object_attr(tx: kinds.Translator, obj: NewObjectVar, name: str) -> Var:
    """``obj.name``, through the class's own ``__getattribute__`` when it has one."""
    if obj.cls.__getattribute__ is not object.__getattribute__:
        return tx.call_function(UserFunctionVar(obj.cls.__getattribute__),
                                [obj, ConstantVar(name)], {})
    return plain_attr(tx, obj, name)


def plain_attr(tx: kinds.Translator, obj: NewObjectVar, name: str) -> Var:
    """``object.__getattribute__(obj, name)``: the instance dict, then the class."""
    if name in obj.attrs:
        value = obj.attrs[name] = tx.realize(obj.attrs[name])
        return value
    if name == "__class__":
        return tx.output.wrap(obj.cls, None)
    if name == "__dict__":
        return DictVar(obj.attrs)  # the same dict: writes through it are the object's
    if name in OBJECT_SLOTS and getattr(obj.cls, name) is getattr(object, name):
        return ObjectSlotVar(name, obj)
    return tx.class_attr(obj, obj.cls, name)


@kinds.store_attr.register(NewObjectVar)
def set_object_attr(tx: kinds.Translator, obj: NewObjectVar, name: str, value: Var) -> None:
    if obj.cls.__setattr__ is not object.__setattr__:
        tx.call_function(UserFunctionVar(obj.cls.__setattr__), [obj, ConstantVar(name), value], {})
    else:
        obj.attrs[name] = value  # a new object: nothing outside sees it yet


@kinds.delete_attr.register(NewObjectVar)
def del_object_attr(tx: kinds.Translator, obj: NewObjectVar, name: str) -> None:
    if obj.cls.__delattr__ is not object.__delattr__:
        tx.call_function(UserFunctionVar(obj.cls.__delattr__), [obj, ConstantVar(name)], {})
    elif obj.attrs.pop(name, None) is None:
        raise Unsupported(f"{obj.cls.__name__!r} object has no attribute {name!r} (eager raises)")


@kinds.call.register(ObjectSlotVar)
def call_slot(tx: kinds.Translator, slot: ObjectSlotVar, args: list, kwargs: dict) -> Var:
    """``object.__getattribute__(obj, name)`` and friends on an object of the trace."""
    obj, values = slot.obj, [tx.output.to_value(a) for a in args[:1]]
    if kwargs or not values or type(values[0]) is not str or not isinstance(obj, NewObjectVar):
        raise Unsupported(f"object.{slot.name}() with these arguments is not supported")
    name = values[0]
    if slot.name == "__getattribute__" and len(args) == 1:
        return plain_attr(tx, obj, name)
    if slot.name == "__setattr__" and len(args) == 2:
        obj.attrs[name] = args[1]
        return ConstantVar(None)
    if slot.name == "__delattr__" and len(args) == 1 and obj.attrs.pop(name, None) is not None:
        return ConstantVar(None)
    raise Unsupported(f"object.{slot.name}() with these arguments is not supported")


def copy_value(tx: kinds.Translator, var: Var, deep: bool) -> Var:
    """``copy.deepcopy(var)`` (``deep``) or ``copy.copy(var)``."""
    var = tx.realize(var)
    return _deep(tx, var, {}) if deep else kinds.copy(tx, var)


def _deep(tx: kinds.Translator, var: Var, memo: dict[int, Var]) -> Var:
    if isinstance(var, LazyVar):
        if is_constant_value(var.value):
            return var  # immutable: shared, read (and guarded) when used
        var = tx.realize(var)
    if id(var) not in memo:
        memo[id(var)] = kinds.deepcopy(tx, var, memo)
    return memo[id(var)]


@kinds.deepcopy.register(ObjectVar)
def _deep_object(tx: kinds.Translator, var: ObjectVar, memo: dict[int, Var]) -> Var:
    if type(var) in (ObjectVar, ModuleVar, UserFunctionVar):
        return var  # deepcopy keeps classes, functions and modules
    raise Unsupported(f"copy.deepcopy() of {var.describe()} is not supported")


def _copy_object(tx: kinds.Translator, var: UserObjectVar, copy: Any) -> NewObjectVar:
    """A copy of an object read from the frame, as copy's default reduction makes it
    (``cls.__new__(cls)`` and a copy of its ``__dict__``)."""
    cls = type(var.value)
    default = all(getattr(cls, n, None) is getattr(object, n, None) for n in (
        "__reduce_ex__", "__reduce__", "__getstate__", "__copy__", "__deepcopy__",
        "__setstate__"))
    if not default or not can_create(cls) or var.source is None:
        raise Unsupported(f"copying {var.describe()} (a class with its own copy protocol)")
    src = var.source
    state = tx.output.wrap(var.value.__dict__, Source(
        f"{src.name}.__dict__", f"{src.expr}.__dict__", f"{src.ident}___dict__", src.trusted))
    assert isinstance(state, DictVar)
    return NewObjectVar(cls, {k: copy(v) for k, v in state.items.items()})


def python_class(var: Var) -> type | None:
    """The class of an object the trace made or of a torch.return_types tuple, else None."""
    return var.cls if isinstance(var, (NewObjectVar, RecordVar, StructSeqVar)) else None


kinds.copy.register(ListVar, lambda tx, var: ListVar(list(var.items)))
kinds.copy.register(DictVar, lambda tx, var: DictVar(dict(var.items)))
# (an object's attributes themselves are shared)
kinds.copy.register(UserObjectVar, lambda tx, var: _copy_object(tx, var, lambda v: v))
kinds.copy.register(ConstantVar, lambda tx, var: var)
kinds.copy.register(TupleVar, lambda tx, var: var)
kinds.deepcopy.register(ConstantVar, lambda tx, var, memo: var)  # (numbers: kept)
kinds.deepcopy.register(ListVar, lambda tx, var, memo: ListVar(
    [_deep(tx, i, memo) for i in var.items]))
kinds.deepcopy.register(TupleVar, lambda tx, var, memo: type(var)(
    tuple(_deep(tx, i, memo) for i in var.items)))
kinds.deepcopy.register(DictVar, lambda tx, var, memo: DictVar(
    {k: _deep(tx, v, memo) for k, v in var.items.items()}))
kinds.deepcopy.register(NewObjectVar, lambda tx, var, memo: NewObjectVar(
    var.cls, {k: _deep(tx, v, memo) for k, v in var.attrs.items()}))
kinds.deepcopy.register(UserObjectVar, lambda tx, var, memo: _copy_object(
    tx, var, lambda v: _deep(tx, v, memo)))
