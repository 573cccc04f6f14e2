"""Loops, ``with`` blocks, ``super``, stores and imports, for the interpreter (a mixin).

Loops are unrolled over iterables of known length (the traced instructions are capped);
grad-mode and autocast ``with`` blocks set the traced state.  Stores to objects that
existed before the call are logged (:mod:`side_effects`); stores into tensors are
functionalized (:mod:`mutation`).
"""

from __future__ import annotations

import collections.abc
import importlib.util
import inspect
import sys
from typing import TYPE_CHECKING, Any


from minicompile.capture import autocast, kinds, mutation, records
from minicompile.capture.bytecode import Inst
from minicompile.capture.variables import (
    NULL, ConstantVar, DictVar, GradModeVar, IteratorVar, ModuleVar, ListVar, NNModuleVar,
    NewObjectVar, ObjectVar, RecordVar, SuperVar, TensorVar, TupleVar, UserObjectVar, Var,
    WithExitVar,
)
from minicompile.errors import Unsupported

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator


class ControlMixin:
    # -- iteration -------------------------------------------------------------------------

    def iter_items(self: InstructionTranslator, var: Var) -> list[Var]:
        """The items a ``for`` loop over ``var`` sees (a live list for trace lists)."""
        return kinds.iter_items(self, self.realize(var))

    @kinds.iter_items.register(IteratorVar)
    def iterator_items(self: InstructionTranslator, var: IteratorVar) -> list[Var]:
        rest = var.items[var.pos :]
        var.pos = len(var.items)
        return [self.realize(v) for v in rest]

    @kinds.iter_items.register(TensorVar)
    def tensor_items(self: InstructionTranslator, var: TensorVar) -> list[Var]:
        if var.meta.ndim == 0:
            raise Unsupported("iteration over a 0-d tensor (eager raises)")
        n = var.meta.concrete_shape()[0]
        return [self.subscript(var, ConstantVar(i)) for i in range(n)]

    @kinds.iter_items.register(Var)
    def value_items(self: InstructionTranslator, var: Var) -> list[Var]:
        out = self.output
        value = out.to_value(var)
        if isinstance(value, (range, str, bytes, tuple, list, dict, set, frozenset,
                              collections.abc.KeysView)):
            return [out.from_value(v) for v in value]
        raise Unsupported(f"iterating over {var.describe()} is not supported")

    @kinds.iter_items.register(NewObjectVar)
    @kinds.iter_items.register(UserObjectVar)
    def object_items(self: InstructionTranslator, var: Var) -> list[Var]:
        """Iterating an instance of a user class: its ``__iter__`` (a generator is run to
        its end), or, for a ``collections.abc.Sequence`` that keeps the default one, items
        ``0 .. len - 1``."""
        cls = records.python_class(var) or type(var.value)
        method = getattr(cls, "__iter__", None)
        if method is collections.abc.Sequence.__iter__:
            n = self.output.to_value(self.call_function(self.load_attr(var, "__len__"), [], {}))
            getitem = self.load_attr(var, "__getitem__")
            return [self.call_function(getitem, [ConstantVar(i)], {}) for i in range(n)]
        if inspect.isfunction(method):
            return self.iter_items(self.call_function(self.load_attr(var, "__iter__"), [], {}))
        raise Unsupported(f"iterating over {var.describe()} is not supported")

    def iterate(self: InstructionTranslator, var: Var) -> Var:
        return kinds.iterate(self, self.realize(var))

    def next_item(self: InstructionTranslator, it: Var) -> Var:
        """The iterator's next item, NULL when it is exhausted."""
        if not isinstance(it, IteratorVar):
            raise Unsupported(f"FOR_ITER over {it.describe()}")
        if it.pos == len(it.items):
            return NULL
        it.pos += 1
        return self.realize(it.items[it.pos - 1])

    # -- with ------------------------------------------------------------------------------

    def BEFORE_WITH(self: InstructionTranslator, inst: Inst) -> None:
        ctx = self.realize(self.pop())
        if self.has_python_method(ctx, "__enter__") and self.has_python_method(ctx, "__exit__"):
            # A context manager written in Python (contextlib.nullcontext, a library's own):
            # __exit__(None, None, None) is called by the code after the block.
            self.push(self.load_attr(ctx, "__exit__"))
            self.push(self.call_function(self.load_attr(ctx, "__enter__"), [], {}))
            return
        if isinstance(ctx, ObjectVar) and autocast.is_autocast_object(ctx.value):
            ctx = autocast.region_of(ctx.value)  # @torch.autocast(...) decorator
        if not isinstance(ctx, (autocast.AutocastVar, GradModeVar)):
            raise Unsupported(f"`with` on {ctx.describe()} is not supported yet")
        ctx.enter(self.output)
        self.push(WithExitVar(ctx))
        self.push(ConstantVar(None))

    # -- super (3.12) ----------------------------------------------------------------------

    def LOAD_SUPER_ATTR(self: InstructionTranslator, inst: Inst) -> None:
        obj, cls, _super = self.pop(), self.pop(), self.pop()
        sup = SuperVar(self.output.to_value(self.realize(cls)), self.realize(obj))
        attr = self.load_attr(sup, inst.argval)
        if inst.arg & 1:
            self.push_method(attr)
        else:
            self.push(attr)

    # -- stores ----------------------------------------------------------------------------

    def store_attr(self: InstructionTranslator, obj: Var, name: str, value: Var) -> None:
        kinds.store_attr(self, self.realize(obj), name, value)

    @kinds.store_attr.register(NNModuleVar)
    def module_store(self: InstructionTranslator, obj: NNModuleVar, name: str, value: Var):
        m = obj.value
        if name in m._parameters or name in m._modules:
            raise Unsupported(f"assigning parameter/submodule {name!r} is not supported")
        if isinstance(value, TensorVar) and name not in m._buffers:
            raise Unsupported(f"assigning a tensor to module attribute {name!r}")
        self.object_store(obj, name, value, own_setattr_ok=True)

    @kinds.store_attr.register(UserObjectVar)
    def object_store(self: InstructionTranslator, obj: ObjectVar, name: str, value: Var,
                     own_setattr_ok: bool = False) -> None:
        if type(obj.value).__setattr__ is not object.__setattr__ and not own_setattr_ok:
            raise Unsupported(f"{type(obj.value).__name__} has a custom __setattr__")
        if (getattr(type(obj.value), "__dataclass_params__", None) is not None
                and type(obj.value).__dataclass_params__.frozen):
            raise Unsupported("assignment to a frozen dataclass (eager raises)")
        self.output.side_effects.store_attr(obj, name, value)

    def DELETE_ATTR(self: InstructionTranslator, inst: Inst) -> None:
        kinds.delete_attr(self, self.realize(self.pop()), inst.argval)

    def STORE_GLOBAL(self: InstructionTranslator, inst: Inst) -> None:
        value = self.pop()
        if self.globals_name is None:
            raise Unsupported("global write from a function without globals")
        self.output.side_effects.store_global(self.f_globals, self.globals_name, inst.argval, value)

    def store_item(self: InstructionTranslator, container: Var, key: Var, value: Var) -> None:
        kinds.store_item(self, self.realize(container), key, value)

    @kinds.store_item.register(TensorVar)
    def tensor_store(self: InstructionTranslator, container: TensorVar, key: Var, value: Var):
        mutation.setitem(self.output, container, self.output.to_value(key),
                         self.output.to_value(value))

    @kinds.store_item.register(ListVar)
    def list_store(self: InstructionTranslator, container: ListVar, key: Var, value: Var):
        index = self.output.to_value(key)
        self.output.side_effects.mutate_container(container, "item assignment")
        try:
            if isinstance(index, slice):
                container.items[index] = self.iter_items(value)
            else:
                container.items[index] = value
        except (IndexError, TypeError, ValueError) as e:
            raise Unsupported(f"list assignment raised {type(e).__name__}: {e}") from e

    @kinds.store_item.register(DictVar)
    def dict_store(self: InstructionTranslator, container: DictVar, key: Var, value: Var):
        self.output.side_effects.mutate_container(container, "item assignment")
        container.items[_hashable(self.output.to_value(key))] = value

    def DELETE_SUBSCR(self: InstructionTranslator, inst: Inst) -> None:
        key, container = self.pop(), self.realize(self.pop())
        if not isinstance(container, (ListVar, DictVar)):
            raise Unsupported(f"del on {container.describe()} is not supported")
        index = self.output.to_value(key)
        self.output.side_effects.mutate_container(container, "del")
        try:
            del container.items[index]
        except (IndexError, KeyError, TypeError) as e:
            raise Unsupported(f"del raised {type(e).__name__}: {e}") from e

    def STORE_DEREF(self: InstructionTranslator, inst: Inst) -> None:
        self.output.side_effects.store_cell(self.cells[inst.argval], self.pop())

    # -- imports of modules already loaded -------------------------------------------------

    def IMPORT_NAME(self: InstructionTranslator, inst: Inst) -> None:
        """``import a.b`` / ``from .x import y`` of a module the process already imported
        (then the import has no effect but the binding); anything else would run code."""
        fromlist = self.output.to_value(self.pop())
        level = self.output.to_value(self.pop())
        package = self.f_globals.get("__package__") or self.f_globals.get("__name__", "")
        try:
            name = importlib.util.resolve_name("." * level + inst.argval, package)
        except (ImportError, ValueError) as e:
            raise Unsupported(f"import of {inst.argval!r}: {e}") from e
        if name not in sys.modules:
            raise Unsupported(f"import of {name!r}, not yet imported, inside traced code")
        top = name if fromlist or level else name.partition(".")[0]
        self.push(self.output.wrap(sys.modules[top], None))

    def IMPORT_FROM(self: InstructionTranslator, inst: Inst) -> None:
        module = self.stack[-1]
        if not isinstance(module, ModuleVar):
            raise Unsupported(f"from-import of {inst.argval!r} is not supported here")
        value = getattr(module.value, inst.argval, None)
        if value is None:  # a submodule imported but not yet an attribute
            value = sys.modules.get(f"{module.value.__name__}.{inst.argval}")
        if value is None:
            raise Unsupported(f"from-import of {inst.argval!r}, not yet imported")
        self.push(self.output.wrap(value, None))


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError as e:
        raise Unsupported(f"unhashable dict key of type {type(key).__name__}") from e
    if isinstance(key, (TensorVar, ObjectVar)):
        raise Unsupported("dict keys must be Python constants here")
    return key


for _kind in (TupleVar, ListVar):
    kinds.iter_items.register(_kind, lambda tx, var: [tx.realize(v) for v in var.items])
kinds.iter_items.register(DictVar, lambda tx, var: [ConstantVar(k) for k in var.items])
kinds.iter_items.register(RecordVar, lambda tx, var: [ConstantVar(k) for k in records.keys_of(var)])
kinds.iter_items.register(NNModuleVar, lambda tx, var: tx.module_items(var))
kinds.iterate.register(Var, lambda tx, var: IteratorVar(tx.iter_items(var)))
kinds.iterate.register(IteratorVar, lambda tx, it: it)
# (live: appends during the loop are seen)
kinds.iterate.register(ListVar, lambda tx, var: IteratorVar(var.items))
