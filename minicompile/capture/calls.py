"""Attribute reads and calls for the interpreter (a mixin of InstructionTranslator).

Attributes follow each kind's own lookup order (``nn.Module``: ``_modules`` ->
``_parameters`` -> ``_buffers`` -> ``__dict__`` -> the class).  User functions, methods and
module ``forward`` are inlined by a child translator; torch callables go to :mod:`torch_ops`
or become extern ops (:mod:`externs`); builtins are folded or modelled.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import logging
import re
import types
from typing import TYPE_CHECKING, Any

import torch

from minicompile import compat
from minicompile.capture import (
    autocast, autograd_functions, externs, kinds, library, mutation, python_calls, records,
    torch_ops, training_ops,
)
from minicompile.capture.bytecode import builtins_of
from minicompile.capture.frame_values import is_trusted_namespace
from minicompile.capture.variables import (
    ArrayVar, BoundMethodVar, BuiltinVar, ConstantVar, DictVar, GradModeVar, IteratorVar,
    ListVar, MethodVar, NestedFunctionVar, NewObjectVar, NNModuleVar, ObjectSlotVar, ObjectVar,
    PartialVar, OpaqueVar, ReadMethodVar, Source, StructSeqVar, SuperVar, TensorVar,
    TorchFunctionVar, TupleVar, UserFunctionVar, UserObjectVar, Var, WithExitVar, closure_cell,
    contains_tensor,
)
from minicompile.errors import HookedModuleCall, Unsupported, attempt

# nn.Module's generators of its submodules (modelled: submodules).
_SUBMODULES = (torch.nn.Module.children, torch.nn.Module.named_children, torch.nn.Module.modules,
               torch.nn.Module.named_modules)
_OPTIM = re.compile(r"torch\.optim(\.|$)")  # optimizers and LR schedulers

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator

MAX_INLINE_DEPTH = 20
_IMMUTABLE_METHOD_OWNERS = (
    int, float, bool, complex, str, bytes, tuple, range, torch.Size, torch.dtype, torch.device,
    types.CodeType, torch.finfo, torch.iinfo, inspect.Signature, inspect.Parameter,
)
# Attributes of a Python function that library decorators read (functools.wraps,
# inspect.signature, transformers' `func.__code__.co_varnames`); all but the first few are
# looked up in the function's __dict__ as well.
_FUNCTION_ATTRIBUTES = frozenset({
    "__code__", "__name__", "__qualname__", "__doc__", "__module__", "__defaults__",
    "__kwdefaults__", "__wrapped__", "__annotations__", "__dict__"})
# Mapping methods that only read and never raise, called on a user mapping read from the
# frame (``super().get(key)`` in a dict subclass, the environment's ``get(name)``): the
# result is read from the object now, with a guard that makes the same call.
_READ_METHODS = frozenset({"get", "__contains__", "__len__", "keys", "values", "items"})
_CONTAINER_MODULES = (torch.nn.ModuleList, torch.nn.Sequential)
_GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


def is_numpy_callable(value: Any) -> bool:
    """A function, ufunc or scalar type of NumPy (``np.sum``, ``np.exp``, ``np.float32``)."""
    module = getattr(value, "__module__", None)
    return callable(value) and isinstance(module, str) and module.split(".")[0] == "numpy"


class CallsMixin:
    # -- attributes ------------------------------------------------------------------------

    def load_attr(self: InstructionTranslator, obj: Var, name: str) -> Var:
        obj = self.realize(obj)
        if name == "__class__" and isinstance(obj, ObjectVar):  # its type is guarded
            return self.output.wrap(type(obj.value), None)
        return kinds.load_attr(self, obj, name)

    @kinds.load_attr.register(TensorVar)
    def tensor_attr(self: InstructionTranslator, obj: TensorVar, name: str) -> Var:
        if name in torch_ops.ATTRIBUTES:
            return self.output.from_value(torch_ops.ATTRIBUTES[name](self.output, obj))
        if callable(getattr(torch.Tensor, name, None)):
            return MethodVar(obj, name)
        raise Unsupported(f"Tensor.{name} is not supported yet")

    @kinds.load_attr.register(SuperVar)
    def super_attr(self: InstructionTranslator, obj: SuperVar, name: str) -> Var:
        cls = records.python_class(obj.obj) or type(obj.obj.value)
        return self.class_attr(obj.obj, cls, name, after=obj.cls)

    def container_attr(self: InstructionTranslator, obj: Var, name: str, cls: type) -> Var:
        if callable(getattr(cls, name, None)):
            return MethodVar(obj, name)
        raise Unsupported(f"attribute {name!r} of {obj.describe()} is not supported yet")

    @kinds.load_attr.register(ObjectVar)
    def value_attr(self: InstructionTranslator, obj: ObjectVar, name: str) -> Var:
        """``obj.name`` read from the object (a Python module, a class, a torch callable)."""
        return self.read_attr(obj, name, "", trusted=is_trusted_namespace(obj.value))

    def read_attr(self: InstructionTranslator, obj: ObjectVar, name: str, note: str,
                  trusted: bool = False) -> Var:
        """``getattr(obj.value, name)``, wrapped with its source; ``note`` ends the reason
        of the AttributeError's graph break."""
        try:
            value = getattr(obj.value, name)
        except AttributeError as e:
            raise Unsupported(f"attribute error: {e}{note}") from e
        return self.output.wrap(value, obj.source.attr(name, trusted) if obj.source else None)

    @kinds.load_attr.register(StructSeqVar)
    def struct_seq_attr(self: InstructionTranslator, obj: StructSeqVar, name: str) -> Var:
        if name in obj.fields:
            return self.realize(obj.items[obj.fields.index(name)])
        return self.immutable_attr(obj, name)

    @kinds.load_attr.register(ConstantVar)
    @kinds.load_attr.register(TupleVar)
    def immutable_attr(self: InstructionTranslator, obj: ConstantVar | TupleVar, name: str) -> Var:
        value = self.output.to_value(obj)
        if isinstance(value, _IMMUTABLE_METHOD_OWNERS) or value is None:
            attr = getattr(type(value), name, None)
            if callable(attr):
                return MethodVar(obj, name)
            return self.fold(lambda v: getattr(v, name), obj, what=f".{name}")
        raise Unsupported(f"attribute {name!r} of {obj.describe()} is not supported yet")

    @kinds.load_attr.register(OpaqueVar)
    def opaque_attr(self: InstructionTranslator, obj: OpaqueVar, name: str) -> Var:
        if _OPTIM.match(type(obj.value).__module__) and (
            obj.source is not None and callable(getattr(obj.value, name, None))
        ):  # opt.step(), sched.step(): called at a graph break (api.call_at_break)
            return OpaqueVar(getattr(obj.value, name), source=obj.source.attr(name))
        raise Unsupported(f"attribute {name!r} of {obj.describe()} is not supported yet")

    @kinds.load_attr.register(UserFunctionVar)
    def function_attr(self: InstructionTranslator, obj: UserFunctionVar, name: str) -> Var:
        """``func.name`` for a Python function: its code, names, defaults and whatever a
        decorator stored in its ``__dict__`` (``__wrapped__``), read as guarded values."""
        fn = obj.value
        if name not in _FUNCTION_ATTRIBUTES and name not in fn.__dict__:
            raise Unsupported(f"attribute {name!r} of function {fn.__qualname__} is not supported")
        return self.read_attr(obj, name, " (eager raises)")

    def has_attr(self: InstructionTranslator, obj: Var, name: str) -> bool:
        return kinds.has_attr(self, self.realize(obj), name)

    @kinds.has_attr.register(Var)
    def value_has_attr(self: InstructionTranslator, obj: Var, name: str) -> bool:
        if isinstance(obj, ObjectVar) and self.output.side_effects.load_attr(obj, name):
            return True
        try:
            return hasattr(self.output.to_value(obj), name)
        except Unsupported:
            raise Unsupported(f"hasattr() on {obj.describe()} is not supported") from None

    @kinds.load_attr.register(NNModuleVar)
    def module_attr(self: InstructionTranslator, obj: NNModuleVar, name: str) -> Var:
        """``m.name`` in nn.Module's own lookup order."""
        pending = self.output.side_effects.load_attr(obj, name)
        if pending is not None:
            return pending
        m, src = obj.value, obj.source
        d = m.__dict__
        for table in ("_modules", "_parameters", "_buffers"):
            if name in d.get(table, ()):
                if src is None:
                    raise Unsupported(f"module attribute {name!r} reached without a source")
                source = Source(f"{src.name}.{table}[{name!r}]", f"{src.expr}.{table}[{name!r}]",
                                f"{src.ident}_{name}", src.trusted,
                                safe_expr=f"{src.expr}.{table}.get({name!r})")
                return self.output.wrap(d[table][name], source)
        if name in d:
            return self.output.wrap(d[name], src.attr(name) if src else None)
        return self.class_attr(obj, type(m), name)

    @kinds.load_attr.register(UserObjectVar)
    def object_attr(self: InstructionTranslator, obj: UserObjectVar, name: str) -> Var:
        pending = self.output.side_effects.load_attr(obj, name)
        if pending is not None:
            return pending
        cls = type(obj.value)
        in_class = any(name in k.__dict__ for k in cls.__mro__)
        d = getattr(obj.value, "__dict__", None)
        if obj.source is not None and not in_class and (
            cls.__getattribute__ is not object.__getattribute__
            or (hasattr(cls, "__getattr__") and (d is None or name not in d))
        ):  # computed by the class (transformers' config attribute_map): the guard reads
            return self.read_attr(obj, name, " (eager raises)")  # it through that lookup too
        if d is not None and name in d:
            return self.output.wrap(d[name], obj.source.attr(name) if obj.source else None)
        if isinstance(obj.value, logging.Logger) and callable(getattr(obj.value, name, None)):
            return ObjectVar(getattr(obj.value, name))  # logger.info, logger.warning_once
        if isinstance(obj.value, collections.abc.Mapping) and name in _READ_METHODS and (
            getattr(getattr(cls, name), "__module__", "") == "collections.abc"
        ):  # Mapping's own get (the environment's get), not a subclass's
            return ReadMethodVar(getattr(cls, name), obj)
        return self.class_attr(obj, cls, name)

    def class_attr(self: InstructionTranslator, obj: ObjectVar, cls: type, name: str,
                   after: type | None = None) -> Var:
        """``name`` found on the class of ``obj`` (after ``after`` in the MRO for super())."""
        mro = cls.__mro__
        if after is not None:
            mro = mro[mro.index(after) + 1 :]
        for klass in mro:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                break
        else:
            raise Unsupported(
                f"{cls.__name__!r} object has no attribute {name!r} (eager raises AttributeError)")
        if isinstance(obj, NewObjectVar) and name in records.OBJECT_SLOTS and (
            attr is getattr(object, name)
        ):  # super().__setattr__(k, v) in a class that overrides it
            return ObjectSlotVar(name, obj)
        if isinstance(attr, staticmethod):
            return self.output.wrap(attr.__func__, None)
        if isinstance(attr, classmethod):
            return BoundMethodVar(attr.__func__, ObjectVar(cls))
        if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
            return self.inline_call(UserFunctionVar(attr.fget), [obj], {})
        if isinstance(attr, types.FunctionType):
            return BoundMethodVar(attr, obj)
        if isinstance(attr, types.MethodDescriptorType) and attr.__objclass__ in (
            dict, collections.OrderedDict
        ) and name in _READ_METHODS:  # dict.get of a dict subclass, a ModelOutput's keys()
            return ReadMethodVar(attr, obj)
        if isinstance(attr, types.MemberDescriptorType) and isinstance(obj, ObjectVar):
            src = obj.source.attr(name) if obj.source else None
            return self.output.wrap(getattr(obj.value, name), src)
        if hasattr(type(attr), "__get__"):
            raise Unsupported(f"attribute {cls.__name__}.{name} ({type(attr).__name__})")
        src = obj.source.attr(name) if obj.source is not None and after is None else None
        return self.output.wrap(attr, src)

    def module_items(self: InstructionTranslator, obj: NNModuleVar) -> list[Var]:
        """Iterating a ModuleList / Sequential (submodules) or a ModuleDict (keys)."""
        m, src = obj.value, obj.source
        if src is None:
            raise Unsupported("iterating a module container reached without a source")
        keys = list(m._modules)
        self.output.guards.keys_match(src, f"{src.expr}._modules", keys)
        if isinstance(m, _CONTAINER_MODULES):
            return [self.module_attr(obj, k) for k in keys]
        if isinstance(m, torch.nn.ModuleDict):
            return [ConstantVar(k) for k in keys]
        raise Unsupported(f"iterating {type(m).__name__} modules is not supported")

    @kinds.call.register(BoundMethodVar)
    def call_bound(self: InstructionTranslator, fn: BoundMethodVar, args: list, kwargs: dict):
        if (fn.func in _SUBMODULES and isinstance(fn.self_var, NNModuleVar) and not args
                and not kwargs):
            return self.submodules(fn.self_var, fn.func)
        return self.inline_call(UserFunctionVar(fn.func), [fn.self_var, *args], kwargs)

    def submodules(self: InstructionTranslator, obj: NNModuleVar, method: Any) -> Var:
        """``m.children()``, ``named_children()``, ``modules()``, ``named_modules()`` as
        ``nn.Module`` yields them: ``_modules`` in order (depth first, ``m`` first for the
        last two), None skipped, each module once by identity (as torch's ``set``)."""
        named = method in (torch.nn.Module.named_children, torch.nn.Module.named_modules)
        deep = method in (torch.nn.Module.modules, torch.nn.Module.named_modules)
        items: list[Var] = []
        seen: set[int] = set()

        def visit(var: NNModuleVar, prefix: str) -> None:
            m, src = var.value, var.source
            if src is None:
                raise Unsupported("the submodules of a module reached without a source")
            keys = list(m._modules)
            self.output.guards.keys_match(src, f"{src.expr}._modules", keys)
            for k in keys:
                child = self.module_attr(var, k)  # (a None entry is guarded as None too)
                if m._modules[k] is None or id(m._modules[k]) in seen:
                    continue
                seen.add(id(m._modules[k]))
                name = f"{prefix}.{k}" if prefix else k
                items.append(TupleVar((ConstantVar(name), child)) if named else child)
                if deep:
                    visit(child, name)

        if deep:
            seen.add(id(obj.value))
            items.append(TupleVar((ConstantVar(""), obj)) if named else obj)
        visit(obj, "")
        return IteratorVar(items)

    def module_subscript(self: InstructionTranslator, obj: NNModuleVar, index: Any) -> Var:
        m = obj.value
        if isinstance(m, torch.nn.ModuleDict) and isinstance(index, str):
            if index not in m._modules:
                raise Unsupported(f"ModuleDict has no key {index!r} (eager raises KeyError)")
            return self.module_attr(obj, index)
        if isinstance(m, torch.nn.ModuleList) and isinstance(index, slice):
            return ListVar(self.module_items(obj)[index])
        if isinstance(m, _CONTAINER_MODULES) and type(index) is int:
            items = self.module_items(obj)
            if not -len(items) <= index < len(items):
                raise Unsupported(f"index {index} out of range (eager raises IndexError)")
            return items[index]
        raise Unsupported(f"{type(m).__name__}[{index!r}] is not supported")

    # -- calls -----------------------------------------------------------------------------

    def call_function(self: InstructionTranslator, fn: Var, args: list, kwargs: dict) -> Var:
        fn = self.realize(fn)
        if isinstance(fn, ObjectVar):
            special = self.library_call(fn, args, kwargs)
            if special is not None:
                return special
        return kinds.call(self, fn, args, kwargs)

    def library_call(self: InstructionTranslator, fn: ObjectVar, args: list, kwargs: dict):
        """A call that any object may be: a NumPy function, a library's modelled function,
        a logging call, a context factory, ``Function.apply``; None when it is none."""
        if is_numpy_callable(fn.value):
            from minicompile.capture import numpy_kind  # NumPy's rules load with its first value

            return numpy_kind.call(self, fn.value, args, kwargs)
        handler = library.handler_for(fn.value)
        if handler is not None:
            return handler(self, fn.value, args, kwargs)
        if library.is_log_call(fn.value):
            return library.log_call(self, fn.value, args, kwargs)
        factory = library.context_factory(fn.value)
        if factory is not None:
            return self.call_torch(factory, args, kwargs)
        if cls := compat.autograd_function_of(fn.value):
            return autograd_functions.call(self, cls, args, kwargs)
        if op := compat.custom_op_of(fn.value):  # a @torch.library.custom_op function
            return self.call_torch(op, args, kwargs)
        if fn.value in _GRAD_MODE_CLASSES:
            return self.call_torch(fn.value, args, kwargs)
        return None

    @kinds.call.register(UserObjectVar)
    def call_object(self: InstructionTranslator, fn: UserObjectVar, args: list, kwargs: dict):
        call = getattr(type(fn.value), "__call__", None)
        if isinstance(call, types.FunctionType):
            return self.inline_call(UserFunctionVar(call), [fn, *args], kwargs)
        return self.call_value(fn, args, kwargs)

    @kinds.call.register(ObjectVar)
    def call_value(self: InstructionTranslator, fn: ObjectVar, args: list, kwargs: dict) -> Var:
        """A call of a class (a record, a plain user class, an exception) or of another
        object known by identity."""
        if isinstance(fn.value, type) and records.is_record_class(fn.value):
            return records.construct(self, fn.value, args, kwargs)
        if isinstance(fn.value, type) and records.can_create(fn.value):
            return records.create(self, fn.value, args, kwargs)
        if fn.value is functools.partial and args and not (
                isinstance(args[0], ConstantVar) and not callable(args[0].value)):
            return PartialVar(args[0], tuple(args[1:]), dict(kwargs))
        if isinstance(fn.value, type) and not issubclass(fn.value, BaseException):
            raise Unsupported(f"creating {fn.value.__qualname__} objects is not supported")
        if isinstance(fn.value, type):
            return python_calls.fold_builtin(self.output, fn.value, args, kwargs)
        owner = getattr(fn.value, "__self__", None)
        if _OPTIM.match(type(owner).__module__):
            raise Unsupported(f"{type(owner).__name__}.{fn.value.__name__}() runs at a graph break "
                              "(a supported optimizer's step runs its compiled update there)")
        raise Unsupported(f"call to {externs._describe(fn.value)} is not supported")

    def call_torch(self: InstructionTranslator, fn: Any, args: list, kwargs: dict) -> Var:
        out = self.output
        if fn is torch.no_grad or fn is torch.enable_grad:
            if args or kwargs:
                raise Unsupported(f"{fn.__name__}(...) with arguments is not supported")
            return GradModeVar(fn is torch.enable_grad)
        if fn is torch.set_grad_enabled:
            pos, kw = self.output.to_values(args, kwargs)
            mode = pos[0] if pos else kw.get("mode")
            if type(mode) is not bool:
                raise Unsupported("torch.set_grad_enabled() needs a Python bool")
            ctx = GradModeVar(mode, prev=out.grad_enabled)
            out.grad_enabled = mode  # the constructor sets the mode, as in eager
            return ctx
        if fn is torch.inference_mode:
            raise Unsupported(f"torch.{fn.__name__} is not supported yet")
        pos, kw = self.output.to_values(args, kwargs)
        if any(isinstance(v, ArrayVar) for v in (*pos, *kw.values())):
            from minicompile.capture import numpy_arrays

            return numpy_arrays.torch_call(out, fn, pos, kw)
        fname = externs.public_name(fn) or externs._describe(fn)
        target = kw.pop("out") if "out" in kw else None
        if fname.startswith("torch.nn.functional"):
            pos, kw = externs.inplace_by_keyword(fn, tuple(pos), kw)
        inplace = kw.get("inplace") is True and fname.startswith("torch.nn.functional") and (
            fn not in training_ops.OWN_IN_PLACE)
        if inplace:
            kw["inplace"] = False
        if fn in torch_ops.FUNCTIONS:
            fname, handler = torch_ops.FUNCTIONS[fn]
            run = lambda p, k: handler(out, fname, p, k)  # noqa: E731
        else:
            run = lambda p, k: externs.call_function(out, fn, p, k)  # noqa: E731
        result = autocast.call(out, fn, pos, kw, run)
        if target is not None:
            result = externs.with_out(out, result, target, fname)
        if inplace:
            x = pos[0] if pos else None
            if not isinstance(x, TensorVar):
                raise Unsupported(f"{fname}(inplace=True) needs a tensor input")
            result = mutation.mutate(out, x, result, f"{fname}(inplace=True)")
        return out.from_value(result)

    def call_method(self: InstructionTranslator, obj: Var, name: str, args: list, kwargs: dict):
        return kinds.call_method(self, obj, name, args, kwargs)

    @kinds.call_method.register(TensorVar)
    def tensor_method(self: InstructionTranslator, obj: TensorVar, name: str, args: list,
                      kwargs: dict) -> Var:
        out = self.output
        if name == "numpy" and not args and not kwargs:
            from minicompile.capture import numpy_kind  # NumPy's rules load with its first value

            return numpy_kind.numpy_arrays.from_tensor(out, obj)
        pos, kw = self.output.to_values(args, kwargs)
        handler = torch_ops.METHODS.get(name)
        if handler is not None and not name.endswith("_"):
            method = lambda p, k: handler(out, f"Tensor.{name}", p, k)  # noqa: E731
        else:
            method = lambda p, k: externs.call_method(out, p[0], name, p[1:], k)  # noqa: E731
        fn = getattr(torch.Tensor, name, None)
        if fn is None:
            return out.from_value(method((obj, *pos), kw))
        inplace = name.endswith("_") and not name.endswith("__")
        return out.from_value(autocast.call(out, fn, (obj, *pos), kw, method, inplace))

    @kinds.call_method.register(Var)
    def value_method(self: InstructionTranslator, obj: Var, name: str, args: list, kwargs: dict):
        """Methods of immutable Python values (str.format, tuple.index, dtype.to_complex...)."""
        out = self.output
        method = getattr(out.to_value(obj), name)
        out.require_pinned([*args, *kwargs.values()], f"{name}()")  # "{}".format(array)
        values, kw = self.output.to_values(args, kwargs)
        if any(contains_tensor(v) for v in (*values, *kw.values())):
            raise Unsupported(f"method {name}() with tensor arguments is not supported")
        return out.from_value(attempt(f"{name}()", method, *values, **kw))

    @kinds.call.register(NNModuleVar)
    def call_module(self: InstructionTranslator, mod: NNModuleVar, args: list, kwargs: dict):
        """``m(*args)``: inline ``type(m).forward``; hooks and ``training`` are guarded."""
        m = mod.value
        if mod.source is None:
            raise Unsupported(f"calling module {type(m).__name__} reached without a source")
        hooks = torch.nn.modules.module
        if (m._forward_hooks or m._forward_pre_hooks or hooks._global_forward_hooks
                or hooks._global_forward_pre_hooks):
            raise HookedModuleCall(f"a call of {type(m).__name__}, a module with hooks: its "
                                   "hooks run as in eager, its forward as a frame of its own")
        if "forward" in m.__dict__:
            raise Unsupported(f"{type(m).__name__} instance with its own forward attribute")
        self.output.guards.module_match(mod.source, m)
        forward = training_ops.module_forward(m) or type(m).forward
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(m).__name__}.forward is not a Python function")
        return self.inline_call(UserFunctionVar(forward), [mod, *args], kwargs)

    @kinds.call.register(UserFunctionVar)
    @kinds.call.register(NestedFunctionVar)
    def inline_call(self: InstructionTranslator, fn: Var, args: list, kwargs: dict) -> Var:
        """Run a user function's bytecode in a child translator sharing this output."""
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls (recursion?)")
        if isinstance(fn, NestedFunctionVar):
            code, f_globals = fn.code, fn.f_globals
            signature_of = types.FunctionType(
                code, f_globals, code.co_name, tuple(fn.defaults) or None,
                tuple(types.CellType() for _ in code.co_freevars) or None)
            signature_of.__kwdefaults__ = dict(fn.kwdefaults) or None
            cells = dict(zip(code.co_freevars, fn.closure))
            globals_name = self.globals_name if f_globals is self.f_globals else None
        else:
            func = fn.value
            code, f_globals, signature_of = func.__code__, func.__globals__, func
            cells = {name: closure_cell(cell, self._cell_source(func, name, cell))
                     for name, cell in zip(code.co_freevars, func.__closure__ or ())}
            globals_name = None
        local_vars: dict[str, Var] = {}
        if code.co_argcount and code.co_varnames[0].startswith("."):
            # A 3.11 comprehension: one positional argument `.0`, the iterator.
            if len(args) != 1 or kwargs:
                raise Unsupported(f"unexpected call of {code.co_name}")
            local_vars[code.co_varnames[0]] = args[0]
        else:
            try:
                bound = inspect.signature(signature_of, follow_wrapped=False).bind(*args, **kwargs)
            except TypeError as e:
                raise Unsupported(f"bad call to {code.co_name}(): {e} (eager raises)") from e
            bound.apply_defaults()
            for pname, value in bound.arguments.items():
                kind = bound.signature.parameters[pname].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    local_vars[pname] = TupleVar(tuple(value))
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    local_vars[pname] = DictVar(dict(value))
                else:
                    local_vars[pname] = self.output.from_value(value)  # defaults: plain values
        if globals_name is None:
            globals_name = self.output.guards.ref(f_globals, f"G_{f_globals.get('__name__')}")
        child = type(self)(
            self.output, code, f_globals, builtins_of(f_globals), local_vars, cells,
            parent_stack=self.user_stack(), depth=self.depth + 1, globals_name=globals_name,
            parent=self)
        result = child.run()
        return IteratorVar(child.generated) if child.generated is not None else result

    def _cell_source(self: InstructionTranslator, func: Any, name: str, cell: Any) -> Source:
        # Named after the guard's reference to the cell: two decorated functions share a
        # qualname (every `wrapper` of one decorator), never a cell.
        ref = self.output.guards.ref(cell, f"cell_{func.__name__}_{name}")
        return Source(f"{ref}.cell_contents", f"{ref}.cell_contents", ref)


kinds.call.register(PartialVar, lambda tx, fn, args, kwargs: tx.call_function(
    fn.func, [*fn.args, *args], {**fn.kwargs, **kwargs}))
kinds.call.register(TorchFunctionVar, lambda tx, fn, *a: tx.call_torch(fn.value, *a))
kinds.call.register(BuiltinVar, lambda tx, fn, *a: tx.call_builtin(fn.value, *a))
kinds.call.register(MethodVar, lambda tx, fn, *a: tx.call_method(fn.obj, fn.name, *a))
# (__exit__ restores the grad mode or autocast state and returns None)
kinds.call.register(WithExitVar, lambda tx, fn, *a: ConstantVar(fn.ctx.exit(tx.output)))
kinds.has_attr.register(TensorVar, lambda tx, t, name: (
    name in torch_ops.ATTRIBUTES or hasattr(torch.Tensor, name)))
kinds.load_attr.register(ListVar, lambda tx, obj, name: tx.container_attr(obj, name, list))
kinds.load_attr.register(DictVar, lambda tx, obj, name: tx.container_attr(obj, name, dict))
