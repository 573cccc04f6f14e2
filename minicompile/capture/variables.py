"""Value trackers (``Var``): what the symbolic interpreter keeps on its stack and in its
locals, one per Python value of the user's frame.  Trackers never hold real tensors and are
immutable except interpreter-owned boxes (trace-built lists and dicts, cells).  A
:class:`Source` says where a frame value lives, as text, guard expression and identifier.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from minicompile.errors import Unsupported
from minicompile.graph import Node, TensorMeta


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a value of the frame lives.  ``trusted`` sources (attributes of ``torch``) are
    read without guards: we assume nobody monkeypatches PyTorch between calls.
    ``safe_expr`` evaluates without raising when the value has gone (a deleted global);
    the first guard on a source uses it, later ones may use ``expr``."""

    name: str
    expr: str
    ident: str
    trusted: bool = False
    safe_expr: str = ""

    @property
    def first_expr(self) -> str:
        return self.safe_expr or self.expr

    def attr(self, attr: str, trusted: bool = False) -> Source:
        return Source(
            f"{self.name}.{attr}", f"{self.expr}.{attr}", f"{self.ident}_{attr}",
            trusted=self.trusted or trusted, safe_expr=f"getattr({self.expr}, {attr!r}, None)")

    def item(self, key: Any, key_expr: str = "") -> Source:
        """``self[key]``; ``key_expr``: how the guards spell a key that is no literal (a
        class, by its reference)."""
        text = key_expr or repr(key)
        ident = key_expr or str(key)
        return Source(f"{self.name}[{text}]", f"{self.expr}[{text}]", f"{self.ident}_{ident}",
                      self.trusted)


@dataclasses.dataclass(eq=False)
class Var:
    """Base class of value trackers; ``source``, where a frame value lives, is given by
    keyword."""

    source: Source | None = dataclasses.field(default=None, kw_only=True)
    # What describe() says, where it is one phrase for the kind; ``{0}`` is the tracker.
    phrase = ""
    constant = False  # a Python constant (None, a number, a string): no identity to guard

    def describe(self) -> str:
        """A short phrase for error messages ("a tensor", "an int")."""
        return self.phrase.format(self) if self.phrase else type(self).__name__

    def identity(self) -> Any:
        """What ``is`` compares: the value a tracker stands for where it is known."""
        return self

    def pin_identity(self, guards: Any) -> None:
        """Guard the identity that an ``is`` against another object read (nothing: a
        tracker guarded by identity already, or made in the trace)."""


@dataclasses.dataclass(eq=False)
class TensorVar(Var):
    """A tensor.  Trackers of tensors are the one mutable kind: an in-place op rebinds
    ``node`` (functionalization), so every place holding this tracker sees the new value.
    A view of another tensor names its root ``base`` and the ``view`` steps from it
    (:mod:`minicompile.capture.mutation`); mutating either side updates the other."""

    node: Node
    python_type: type = torch.Tensor
    base: TensorVar | None = None
    view: tuple[Any, ...] = ()  # ViewSteps from ``base``
    phrase = "a tensor"

    @property
    def meta(self) -> TensorMeta:
        assert self.node.meta is not None
        return self.node.meta

    def identity(self) -> Any:
        return self.node


@dataclasses.dataclass(eq=False)
class ArrayVar(Var):
    """A NumPy array (or, with ``scalar``, a NumPy scalar) traced as ``tensor`` with
    NumPy's rules; ``tensor`` is shared with views and ``torch.from_numpy`` aliases, so an
    in-place op that rebinds its node is seen by all of them."""

    tensor: TensorVar
    scalar: bool = False

    def describe(self) -> str:
        return "a NumPy scalar" if self.scalar else "a NumPy array"


@dataclasses.dataclass(eq=False)
class ConstantVar(Var):
    value: Any

    constant = True

    def describe(self) -> str:
        return f"a {type(self.value).__name__} ({self.value!r})"

    def identity(self) -> Any:
        return self.value


@dataclasses.dataclass(eq=False)
class TupleVar(Var):
    items: tuple[Var, ...]
    phrase = "a tuple"


@dataclasses.dataclass(eq=False)
class StructSeqVar(TupleVar):
    """A named tuple of tensors (``torch.return_types.max``: ``.values``, ``.indices``)."""

    fields: tuple[str, ...] = ()
    cls: Any = None  # the torch.return_types class, to rebuild the value


@dataclasses.dataclass(eq=False)
class SizeVar(TupleVar):
    """``x.shape`` / ``x.size()``: a torch.Size whose items are int ConstantVars."""

    phrase = "a torch.Size"


@dataclasses.dataclass(eq=False)
class ListVar(Var):
    items: list[Var]
    # ``mutable``: built by the trace.  Lists read from the frame (``mutable=False``, with
    # a source) may be mutated too; the side-effect log replays their final contents.
    mutable: bool = True
    phrase = "a list"


@dataclasses.dataclass(eq=False)
class DictVar(Var):
    items: dict[Any, Var]
    mutable: bool = True
    phrase = "a dict"


@dataclasses.dataclass(eq=False)
class ObjectVar(Var):
    """A Python object known by identity (a class, or anything the kinds below don't
    cover).  Attribute reads give wrapped attributes; calling one is not supported."""

    value: Any

    def describe(self) -> str:
        return f"{type(self.value).__name__} {getattr(self.value, '__name__', '')}".strip()

    def identity(self) -> Any:
        return self.value


class ModuleVar(ObjectVar):
    """A Python module (``torch``, ``torch.nn.functional``, ``math``, a user module)."""


class NNModuleVar(ObjectVar):
    """An ``nn.Module`` instance: submodules, parameters and buffers are read through
    ``_modules`` / ``_parameters`` / ``_buffers``; calls inline ``type(m).forward``."""


class UserObjectVar(ObjectVar):
    """An instance of a user class (a dataclass, a config object): attributes are read as
    guarded values, methods and properties are inlined, attribute writes are logged."""

    def pin_identity(self, guards: Any) -> None:
        if self.source is not None:  # guarded by its type, as its attributes are read
            guards.identity_match(self.source, self.value)


class UserFunctionVar(ObjectVar):
    """A Python function of the user's: calls are inlined by a child translator."""


class TorchFunctionVar(ObjectVar):
    """A callable of PyTorch (``torch.sin``, ``F.gelu``, ``torch.Tensor.add``): calls go
    through :mod:`minicompile.capture.torch_ops`."""


class BuiltinVar(ObjectVar):
    """A builtin (``len``, ``abs``, ``isinstance``...) or a ``math`` function."""


class OpaqueVar(ObjectVar):
    """An object the trace can hold and pass on but not look inside or call."""


@dataclasses.dataclass(eq=False)
class NestedFunctionVar(Var):
    """A function made by MAKE_FUNCTION during the trace; its defaults and closure cells
    are trackers."""

    code: types.CodeType
    f_globals: dict[str, Any]
    defaults: tuple[Var, ...] = ()
    kwdefaults: dict[str, Var] = dataclasses.field(default_factory=dict)
    closure: tuple[CellVar, ...] = ()
    phrase = "nested function {0.code.co_name}"


@dataclasses.dataclass(eq=False)
class PartialVar(Var):
    """``functools.partial(func, *args, **kwargs)``, made during the trace or read from the
    frame (then its parts are read through their sources, and guarded): calls call ``func``
    with ``args`` first and ``kwargs`` under the call's own keywords."""

    func: Var
    args: tuple[Var, ...] = ()
    kwargs: dict[str, Var] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        return f"functools.partial of {self.func.describe()}"


@dataclasses.dataclass(eq=False)
class MethodVar(Var):
    """``obj.name`` loaded for a call (tensor methods, methods of constants)."""

    obj: Var
    name: str
    phrase = "method {0.name}"


@dataclasses.dataclass(eq=False)
class BoundMethodVar(Var):
    """A Python function bound to a tracker (``self.helper``, ``super().forward``):
    calls inline ``func`` with ``self_var`` first."""

    func: types.FunctionType
    self_var: Var
    phrase = "method {0.func.__qualname__}"


@dataclasses.dataclass(eq=False)
class RecordVar(Var):
    """An instance of a dataclass made by the trace (a transformers ``ModelOutput``, a
    plain record); see :mod:`minicompile.capture.records`.  ``keys`` is the mapping of a
    ModelOutput (its non-None items, in order), None for plain dataclasses; ``writes``
    are the attribute and item writes after construction, in order."""

    cls: type
    fields: dict[str, Var]
    init: dict[str, Var]
    keys: list[str] | None = None
    writes: list[tuple[str, str, Var]] = dataclasses.field(default_factory=list)
    phrase = "a {0.cls.__name__}"


@dataclasses.dataclass(eq=False)
class NewObjectVar(Var):
    """An instance of a plain user class created by the trace (transformers'
    ``DynamicCache``): its ``__init__`` was inlined and its attributes live in ``attrs``;
    methods and properties are inlined with it as ``self``."""

    cls: type
    attrs: dict[str, Var] = dataclasses.field(default_factory=dict)
    phrase = "a new {0.cls.__name__}"


@dataclasses.dataclass(eq=False)
class ObjectSlotVar(Var):
    """``object.__getattribute__`` / ``__setattr__`` / ``__delattr__`` bound to an object
    of the trace (what ``super().__setattr__(k, v)`` reaches in a class that overrides
    it): the plain attribute operation, without the class's override."""

    name: str
    obj: Var
    phrase = "object.{0.name}"


@dataclasses.dataclass(eq=False)
class ReadMethodVar(Var):
    """A mapping method that only reads (``dict.get`` of a dict subclass, ``get`` of
    the process environment), bound to an object read from the frame: called on constant
    arguments, the result is read from the object (``descriptor(obj, *args)``)."""

    descriptor: Any
    self_var: Var
    phrase = "method {0.descriptor.__name__}"


@dataclasses.dataclass(eq=False)
class SuperVar(Var):
    """``super()`` (or ``super(cls, obj)``): attribute lookups start after ``cls``."""

    cls: type
    obj: Var
    phrase = "super({0.cls.__name__})"


@dataclasses.dataclass(eq=False)
class IteratorVar(Var):
    """An iterator over known items (``range``, lists, ``zip``, ``enumerate``, module
    containers), consumed by FOR_ITER; loops are unrolled while tracing."""

    items: list[Var]
    pos: int = 0
    phrase = "an iterator"


@dataclasses.dataclass(eq=False)
class GradModeVar(Var):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``: a
    context manager setting the traced grad mode.  ``prev`` is the mode to restore."""

    enabled: bool
    prev: bool | None = None
    entered: bool = False
    phrase = "grad mode context ({0.enabled})"

    def enter(self, out: Any) -> None:
        if self.entered:
            raise Unsupported("re-entering a grad mode context is not supported")
        self.entered = True
        if self.prev is None:
            self.prev = out.grad_enabled
            out.grad_enabled = self.enabled

    def exit(self, out: Any) -> None:
        out.grad_enabled = bool(self.prev)


@dataclasses.dataclass(eq=False)
class WithExitVar(Var):
    """The ``__exit__`` that BEFORE_WITH pushes; calling it restores the grad mode (or, for
    an ``autocast.AutocastVar``, the traced autocast state)."""

    ctx: Var
    phrase = "__exit__"


class NullVar(Var):
    """The NULL that CPython pushes next to callables; never a user value."""

    phrase = "NULL"


NULL = NullVar()


@dataclasses.dataclass(eq=False)
class CellVar(Var):
    """A closure cell.  ``local`` cells are made by this trace (MAKE_CELL) and may be written;
    the others wrap the real cells of a function's ``__closure__`` and are read-only."""

    contents: Var | None
    local: bool = True


def closure_cell(cell: Any, source: Source) -> CellVar:
    """The read-only tracker of a real closure cell (its contents read when used)."""
    try:
        return CellVar(LazyVar(cell.cell_contents, source=source), local=False, source=source)
    except ValueError:  # empty cell
        return CellVar(None, local=False, source=source)


@dataclasses.dataclass(eq=False)
class LazyVar(Var):
    """A frame value not yet looked at: it is wrapped (and guarded) when first read, so
    the guards only cover what the trace used."""

    value: Any


CONSTANT_TYPES: tuple[type, ...] = (
    bool, int, float, complex, str, bytes, type(None), type(Ellipsis), slice, torch.dtype,
    torch.device, torch.memory_format, torch.layout, types.CodeType, range,
    # sizes of a dynamic capture: Python arithmetic on them records relations
    torch.SymInt, torch.SymBool, torch.SymFloat,
    # immutable descriptions of a dtype (torch.finfo(x.dtype).min), and of a signature
    torch.finfo, torch.iinfo, inspect.Signature, inspect.Parameter,
)


SYMBOLIC_TYPES = (torch.SymInt, torch.SymBool, torch.SymFloat)


def specialized(value: Any) -> Any:
    """``value`` with every SymInt/SymBool/SymFloat replaced by its number.  Reading the
    number records a guard that the size equals it (the entry is static in that size):
    for what text or identity would show (``str(n)``, f-strings, ``hash``), never ``s0``."""
    if type(value) in _STAND_INS:
        return type(_STAND_INS[type(value)])(value)
    if type(value) in (tuple, list):
        return type(value)(specialized(v) for v in value)
    if type(value) is dict:
        return {k: specialized(v) for k, v in value.items()}
    return value


_STAND_INS = {torch.SymInt: 2, torch.SymFloat: 2.0, torch.SymBool: True}


def python_type_of(value: Any) -> Any:
    """A stand-in of the Python type a symbolic value has when the frame runs for real
    (``isinstance(n, int)`` is True for a symbolic size n), with no guard."""
    return _STAND_INS.get(type(value), value)


def is_constant_value(value: Any) -> bool:
    return type(value) in CONSTANT_TYPES


def leaves(value: Any) -> list:
    """The items of nested tuples, lists and dict values, in order."""
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in leaves(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    return [value]


def contains_tensor(value: Any) -> bool:
    """A tensor (or a NumPy array: traced as one) in a value or its items."""
    return any(isinstance(v, (TensorVar, ArrayVar)) for v in leaves(value))


def map_leaves(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to each item of its nested tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return type(value)(map_leaves(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_leaves(v, fn) for k, v in value.items()}
    return fn(value)
