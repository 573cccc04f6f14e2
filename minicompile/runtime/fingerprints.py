"""Fingerprints: what must not change about code and objects for a warm entry to be used.

The function's code object (its bytecode, constants, names and line table, as text), the
functions it inlined, the classes whose methods it inlined and the modules it read
(:func:`module_digest`).  Code of PyTorch, Triton and the standard library is stood for by
their versions, in the key.  What cannot be fingerprinted raises :class:`NotStorable`.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib.util
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


class NotStorable(Exception):
    """Why an entry cannot be written to disk (it still runs, compiled in memory)."""


class Miss(Exception):
    """A recipe that finds nothing, or something else, in this process."""


# -- keys ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def source_version() -> str:
    """A hash of minicompile's own source files (the package, passes/ and codegen/: Python,
    and the C++ text the emitters include, codegen/*.h and runtime/runner.cpp)."""
    folders = [Path(__file__).resolve().parents[1]]  # minicompile/ (no import of the top)
    for sub in ("minicompile.passes", "minicompile.codegen"):
        spec = importlib.util.find_spec(sub)
        folders += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".h", ".cpp")):
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def versioned_folders() -> tuple[str, ...]:
    """Folders whose code the tool versions stand for: PyTorch, Triton, the stdlib."""
    found = [str(Path(torch.__file__).parent)]
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        found.append(str(Path(spec.origin).parent))
    found.append(sysconfig.get_paths()["stdlib"])
    return tuple(f.rstrip("/") + "/" for f in found)


def versioned(filename: str) -> bool:
    if "site-packages" in filename and not filename.startswith(versioned_folders()[:2]):
        return False  # a library beside the stdlib's folder is not the stdlib
    return filename.startswith(versioned_folders())


# A code object's parts, but for its constants (digested apart).  Not marshal's bytes:
# marshal writes an object met twice as a reference only when something else holds it too
# (a trace keeps a function's names, so its digest changed after the first call, and the
# entry stored went under another key than the next process looked in), and a frozenset
# in the order of this process's string hashing.
_CODE_PARTS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_stacksize",
               "co_flags", "co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars",
               "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_linetable",
               "co_exceptiontable")


# Code objects are immutable: each is digested once a process (kept with its digest, so
# that its id is not another's).
_CODES: dict[int, tuple[types.CodeType, str]] = {}


def code_digest(code: types.CodeType) -> str:
    """Everything a code object is: bytecode, constants (nested code too), names, file
    name, first line and line table."""
    found = _CODES.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    text = [repr(getattr(code, part, None)) for part in _CODE_PARTS]
    text += [constant_text(c) or "?" for c in code.co_consts]
    digest = hashlib.sha256("\0".join(text).encode()).hexdigest()
    _CODES[id(code)] = (code, digest)
    return digest


def constant_text(value: Any) -> str | None:
    """A constant (what a code object or marshal holds: numbers, strings, bytes, None,
    code, and tuples, lists, sets and dicts of them) as text the same in every process;
    None for anything else."""
    if type(value) in _SIMPLE or value is Ellipsis:
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, types.CodeType):
        return f"code:{code_digest(value)}"
    if type(value) in (tuple, list, set, frozenset):
        items = [constant_text(v) for v in value]
        if None in items:
            return None
        if isinstance(value, (set, frozenset)):  # (in no order of this process's)
            items.sort()
        return f"{type(value).__name__}({','.join(items)})"
    if type(value) is dict:
        items = [constant_text(v) for kv in value.items() for v in kv]
        return None if None in items else f"dict({','.join(items)})"
    return None


def value_digest(value: Any) -> str:
    """A digest of a default value or class attribute: constants by value, functions and
    classes by what they are; anything else refuses."""
    text = constant_text(value)
    if text is not None:
        return "m" + hashlib.sha256(text.encode()).hexdigest()
    if isinstance(value, (types.FunctionType, type)):
        return "o" + object_digest(value)
    if isinstance(value, (torch.dtype, torch.device)):
        return f"t{value}"
    if type(value) is object:  # a sentinel (``_MISSING = object()``): it has no state
        return "sentinel"
    if isinstance(value, enum.Enum):  # a member: its class and name
        return f"e{object_digest(type(value))}.{value.name}"
    if type(value) is functools.partial:  # (``norm_layer=partial(nn.LayerNorm, eps=1e-6)``)
        parts = [value_digest(v) for v in (value.func, *value.args)]
        parts += [f"{k}={value_digest(v)}" for k, v in sorted(value.keywords.items())]
        return "p" + ",".join(parts)
    raise NotStorable(f"a default or class attribute {type(value).__name__} cannot be keyed")


def function_digest(fn: types.FunctionType, method: bool = False) -> str:
    """Code, defaults and closure of ``fn``.  A method's ``__class__`` cell is the class
    being digested; its other cells are digested where they can be (a cell the trace
    reads is guarded by a recipe of its own)."""
    parts = [code_digest(fn.__code__)]
    parts += [value_digest(v) for v in fn.__defaults__ or ()]
    parts += [f"{k}={value_digest(v)}" for k, v in sorted((fn.__kwdefaults__ or {}).items())]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if method and name == "__class__":
            continue
        try:
            parts.append(f"{name}={value_digest(cell.cell_contents)}")
        except ValueError:  # an empty cell
            parts.append(f"{name}=<empty>")
        except NotStorable:
            if not method:
                raise NotStorable(f"{fn.__qualname__} closes over {name}, which cannot be "
                                  f"keyed") from None
            parts.append(f"{name}=<{type(cell.cell_contents).__qualname__}>")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _functions(value: Any) -> list[types.FunctionType]:
    """The Python functions of a class attribute: a function, a static or class method's, a
    property's accessors."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    found = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
    return [f for f in found if isinstance(f, types.FunctionType)]


def _class_part(klass: type) -> str:
    """One class of an MRO: its name for a versioned one, else every attribute."""
    if klass.__module__ == "builtins" or versioned(
        getattr(sys.modules.get(klass.__module__), "__file__", None) or ""
    ):
        return f"{klass.__module__}.{klass.__qualname__}"
    parts = []
    for name, value in sorted(vars(klass).items()):  # (names are unique)
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            text = "".join(code_digest(f.__code__) if isinstance(f, types.FunctionType)
                           else "-" for f in (value.fget, value.fset, value.fdel))
        elif isinstance(value, types.FunctionType):
            text = function_digest(value, method=True)
        else:
            # (others are read by the trace only under guards of their own)
            text = constant_text(value) or type(value).__qualname__
        parts.append(f"{name}:{text}\0")
    return "".join(parts)


# The functions and classes whose digest is being computed: a method may close over its
# own class (the ``__init__`` a decorator writes for a config class keeps it in a cell), a
# function over itself; met again, one is stood for by its name (its contents are in the
# digest under way).  _CYCLES: the ids of those met again so far, while still open;
# _VISITED: the ids of those digested.
_DIGESTING: set[int] = set()
_CYCLES: list[int] = []
_VISITED: list[int] = []
# While an entry is written or read (:func:`remembering`), the digests of functions, classes
# and MRO parts made so far (nothing changes them meanwhile): a model's classes share
# their bases, and its recipes and module fingerprints meet the same classes again.  Each
# is kept with the ids of the objects it digested: it is what a digest made now would be
# when none of those is being digested around it (else that one would be a cycle).
_MEMO: dict[tuple[str, int], tuple[Any, str, frozenset[int]]] | None = None


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    global _MEMO
    outer = _MEMO
    _MEMO = {} if outer is None else outer
    try:
        yield
    finally:
        _MEMO = outer
        if outer is None:
            del _VISITED[:]


def _remembered(obj: Any, kind: str, digest: Callable[[Any], str]) -> str:
    """``digest(obj)``, remembered under :func:`remembering` unless it met an object still
    being digested around it (then it depends on where it was asked)."""
    memo, key = _MEMO, (kind, id(obj))
    found = None if memo is None else memo.get(key)
    if found is not None and found[0] is obj and _DIGESTING.isdisjoint(found[2]):
        _VISITED.extend(found[2])
        return found[1]
    cycles, visited = len(_CYCLES), len(_VISITED)
    text = digest(obj)
    if kind == "object":  # (closed here: it was being digested)
        _CYCLES[cycles:] = [c for c in _CYCLES[cycles:] if c != id(obj)]
    if memo is not None and len(_CYCLES) == cycles:
        memo[key] = (obj, text, frozenset(_VISITED[visited:]))
    if _MEMO is None:
        del _VISITED[:]
    return text


def object_digest(obj: Any) -> str:
    """What must not change about a function or class found again by its name."""
    if isinstance(obj, types.FunctionType) and versioned(obj.__code__.co_filename):
        return "versioned"
    if not isinstance(obj, (types.FunctionType, type)):
        return "builtin"  # C functions and objects of the versioned libraries
    if id(obj) in _DIGESTING:
        _CYCLES.append(id(obj))
        return f"cycle {obj.__module__}.{obj.__qualname__}"
    return _remembered(obj, "object", _object_digest)


def reached_digest(obj: Any) -> str:
    """A function or class found again by a path (a recipes.py path), not by its name: as
    :func:`object_digest`, but a function's closure cell that cannot be keyed stands as
    its type, as a method's does (what the trace read through a cell is guarded: the cell
    is an object of the guards, found again by a path of its own)."""
    if isinstance(obj, types.FunctionType) and not versioned(obj.__code__.co_filename):
        return _remembered(obj, "reached", functools.partial(function_digest, method=True))
    return object_digest(obj)


def _object_digest(obj: Any) -> str:
    _VISITED.append(id(obj))
    _DIGESTING.add(id(obj))
    try:
        if isinstance(obj, types.FunctionType):
            return function_digest(obj)
        parts = [_remembered(klass, "class", _class_part) for klass in obj.__mro__]
        return hashlib.sha256("".join(parts).encode()).hexdigest()
    finally:
        _DIGESTING.discard(id(obj))


def codes_of(obj: Any) -> list[types.CodeType]:
    """The code objects reachable from a function or class (nested code included)."""
    if isinstance(obj, types.FunctionType):
        roots = [obj.__code__]
    elif isinstance(obj, type):
        roots = [f.__code__ for klass in obj.__mro__ for value in vars(klass).values()
                 for f in _functions(value)]
    else:
        return []
    found = []
    while roots:
        code = roots.pop()
        found.append(code)
        roots += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def lookup(module: str, qualname: str) -> Any:
    """``module.qualname`` among the modules already imported (never imports)."""
    obj = sys.modules.get(module)
    if obj is None:
        raise Miss(f"module {module} is not imported")
    for part in qualname.split("."):
        if part == "<locals>":
            raise Miss(f"{qualname} is local to a function")
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Miss(f"{module}.{qualname} not found") from None
    return obj


# -- modules -------------------------------------------------------------------------------

_SIMPLE = (type(None), bool, int, float, complex, str, bytes)
# Attributes whose value differs in every process, which the fingerprint leaves out (a
# trace that reads one guards it by value): transformers' GenerationConfig keeps
# ``hash(self)`` from its construction, to tell later whether it was edited.
_PER_PROCESS = frozenset({"_original_object_hash"})
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)


class ModuleWalk:
    """A module's fingerprint (:attr:`digest`): its class, every attribute in its
    ``__dict__``, the metadata (not the values: inputs) of its tensors, and its submodules,
    recursively: all capture may read of a module it guards by identity.  ``objects``: the
    functions and classes met (their code is keyed)."""

    def __init__(self, module: torch.nn.Module, inner: bool = False) -> None:
        self.objects: list[Any] = []
        # ``inner``: digests holds id(module) -> fingerprint for the modules inside whose
        # fingerprint is a stretch of this one's (what their own walk would hash: nothing
        # in them was met before them).  A model's guards hold most of its modules by
        # identity: one walk fingerprints them all.
        self.digests: dict[int, str] = {}
        self._inner = inner
        self._classes: dict[type, str] = {}  # class -> its line of the fingerprint
        self._seen: dict[int, int] = {}  # id -> the part at which it was first met
        self._parts: list[str] = []  # the text hashed: each part followed by a NUL
        self._open: list[list] = []  # modules being walked: [first part, clean]
        self._value(module, "self")
        self.digest = self._hash(0)

    def _hash(self, start: int) -> str:
        return hashlib.sha256(("\0".join(self._parts[start:]) + "\0").encode()).hexdigest()

    def _class(self, cls: type) -> None:
        text = self._classes.get(cls)
        if text is None:
            text = self._classes[cls] = (
                f"class {cls.__module__}.{cls.__qualname__} {object_digest(cls)}")
            self.objects.append(cls)
        self._parts.append(text)

    def _value(self, value: Any, where: str) -> None:
        if type(value) in _SIMPLE:
            self._parts.append(f"{type(value).__name__}:{value!r}")
            return
        if isinstance(value, _TORCH_VALUES):
            self._parts.append(f"{type(value).__name__}:{value}")
            return
        first = self._seen.get(id(value))
        if first is not None:  # shared or cyclic: its place in the walk is enough
            for stretch in reversed(self._open):  # a module walked alone would not say so
                if stretch[0] <= first:
                    break
                stretch[1] = False
            self._parts.append("seen")
            return
        self._seen[id(value)] = len(self._parts)
        if self._inner and isinstance(value, torch.nn.Module):
            stretch = [len(self._parts), True]
            self._open.append(stretch)
            self._walk(value, where)
            self._open.pop()
            if stretch[1]:
                self.digests[id(value)] = self._hash(stretch[0])
            return
        self._walk(value, where)

    def _walk(self, value: Any, where: str) -> None:
        if isinstance(value, dict):  # (first: most of a model's values, hooks' dicts mostly)
            self._class(type(value))
            for k, v in value.items():  # in order: modules iterate their children so
                self._value(k, where)
                self._value(v, where)
        elif isinstance(value, torch.Tensor):
            self._class(type(value))
            self._parts.append(f"tensor {tuple(value.shape)} {value.stride()} "
                               f"{value.storage_offset()} {value.dtype} {value.device} "
                               f"{value.requires_grad}")
        elif isinstance(value, (tuple, list)):
            self._class(type(value))
            self._parts.append(str(len(value)))
            for v in value:
                self._value(v, where)
        elif isinstance(value, (set, frozenset)):
            self._class(type(value))
            for text in sorted(repr(v) for v in value):
                self._parts.append(text)
        elif isinstance(value, (types.FunctionType, type)):
            self.objects.append(value)
            self._parts.append(value_digest(value))
        elif isinstance(value, enum.Enum):  # (timm's Format, a str): a member by name
            self._class(type(value))
            self._parts.append(value.name)
        elif isinstance(value, functools.partial):
            self._value((value.func, value.args, value.keywords), where)
        elif isinstance(value, (types.BuiltinFunctionType, types.MethodWrapperType)):
            self._parts.append(f"builtin {getattr(value, '__module__', '')}.{value.__qualname__}")
        elif _python_object(value):
            self._class(type(value))  # modules, config objects, enums, plain objects
            for k, v in sorted(vars(value).items()):
                if k in _PER_PROCESS:
                    continue
                self._parts.append(k)
                self._value(v, f"{where}.{k}" if k != "_modules" else where)
        else:
            raise NotStorable(f"{where} is a {type(value).__qualname__}, which cannot be "
                              f"fingerprinted")


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
# Py_TPFLAGS_IMMUTABLETYPE: C types that are heap types too since Python 3.12 (io's file
# classes, say) are made immutable; a class statement never makes one.
_IMMUTABLETYPE = 1 << 8


def _python_object(value: Any) -> bool:
    """An instance of Python classes, its state its ``__dict__`` (not a C object's, a file's)."""
    return (hasattr(value, "__dict__") and not isinstance(value, types.ModuleType)
            and _python_class(type(value)))


@functools.lru_cache(maxsize=None)
def _python_class(cls: type) -> bool:
    return all(
        klass is object or (klass.__flags__ & _HEAPTYPE and not klass.__flags__ & _IMMUTABLETYPE
                            and "pybind11" not in klass.__module__)
        for klass in cls.__mro__
    )


def module_digest(module: torch.nn.Module) -> str:
    return ModuleWalk(module).digest
