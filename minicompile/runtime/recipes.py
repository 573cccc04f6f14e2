"""Recipes: how a new process finds again an object a warm entry's code refers to.

A recipe is JSON (a module by name, a function or class by qualified name with the digest of
its code, a device by its string...).  :func:`recipe` writes one (NotStorable for objects
known only by identity); :func:`resolve` follows one (Miss when something changed).  Nothing
is unpickled or imported.

Objects of no name of their own (what decorators leave behind: closure cells of inlined
functions, the functions and code in them, functions a class keeps in a table) are found by
a *path* (:func:`reached`) from an *anchor*, an object a recipe finds: the compiled
function, a function or class found by its name, the class of a module of the frame.  A path
is a list of steps: ``["method", name]``, ``["attr", name]``, ``["item", key]``,
``["cell", name]``, ``["contents"]``, ``["code"]``; what it finds is checked by fingerprint.
"""

from __future__ import annotations

import builtins
import enum
import functools
import operator
import sys
import types
from typing import Any

import torch

from minicompile.runtime import fingerprints
from minicompile.runtime.fingerprints import Miss, NotStorable, lookup
from minicompile.runtime.guards import GLOBAL_MODULE_HOOKS

MAX_DEPTH = 8  # cells followed from an anchor (transformers nests three or four)
MAX_TABLE = 2  # containers nested in a class's table of functions
_TABLES = (dict, list, tuple)


def recipe(obj: Any, fn: types.FunctionType) -> list:
    """How a new process finds ``obj`` again (raises NotStorable when it cannot)."""
    if obj is fn.__globals__:
        return ["fn_globals"]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if obj is cell:
            return ["cell", name]
    if obj is GLOBAL_MODULE_HOOKS:
        return ["global_hooks"]
    if isinstance(obj, torch.device):
        return ["device", str(obj)]
    if isinstance(obj, float):
        return ["float", repr(obj)]
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is obj:
            return ["module", obj.__name__]
        raise NotStorable(f"module {obj.__name__} is not the one imported under its name")
    if isinstance(obj, dict):
        for name, module in list(sys.modules.items()):
            if getattr(module, "__dict__", None) is obj:
                return ["module_dict", name]
        raise NotStorable("a dict known by identity (not a module's globals)")
    if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
        return ["torch", str(obj).removeprefix("torch.")]
    if isinstance(obj, types.UnionType):  # ``int | None``: rebuilt from its members
        return ["union", [recipe(a, fn) for a in obj.__args__]]
    if isinstance(obj, enum.Enum):  # a member (``mode is Action.NONE``): its class's, by name
        return ["member", recipe(type(obj), fn), obj.name]
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module is None and hasattr(obj, "__objclass__"):  # a C method: ``dict.get``
        module = obj.__objclass__.__module__
    if module == "builtins" and isinstance(obj, type) and (
            getattr(builtins, obj.__qualname__, None) is not obj):
        # (``type(f.__code__) is code``: the types module names classes builtins doesn't)
        module, qualname = "types", next((k for k, v in vars(types).items() if v is obj), None)
    if isinstance(module, str) and isinstance(qualname, str):
        try:
            found = lookup(module, qualname)
        except Miss as e:
            raise NotStorable(f"{type(obj).__name__} {qualname}: {e}") from None
        if found is obj:
            return ["object", module, qualname, fingerprints.object_digest(obj)]
    raise NotStorable(f"a {type(obj).__name__} known only by identity ({_short(obj)})")


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve(r: list, fn: types.FunctionType) -> Any:
    """The object recipe ``r`` names in this process (raises Miss)."""
    kind = r[0]
    if kind == "fn_globals":
        return fn.__globals__
    if kind == "cell":
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        if r[1] not in cells:
            raise Miss(f"no closure cell {r[1]}")
        return cells[r[1]]
    if kind == "global_hooks":
        return GLOBAL_MODULE_HOOKS
    if kind == "device":
        return torch.device(r[1])
    if kind == "float":
        return float(r[1])
    if kind in ("module", "module_dict"):
        if r[1] not in sys.modules:
            raise Miss(f"module {r[1]} is not imported")
        return sys.modules[r[1]] if kind == "module" else vars(sys.modules[r[1]])
    if kind == "torch":
        found = getattr(torch, r[1], None)
        if not isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            raise Miss(f"torch.{r[1]} is not a dtype, layout or memory format")
        return found
    if kind == "fn":
        return fn
    if kind == "reach":  # a cell, function or code object on a path from an anchor
        steps = r[2]
        digest, found = _path_digest(resolve(r[1], fn), steps)
        if digest != r[3]:
            raise Miss(f"what {steps} lead to changed since the entry was written")
        return follow(found, steps[-1:]) if steps and steps[-1][0] == "cell" else found
    if kind == "union":
        return functools.reduce(operator.or_, [resolve(a, fn) for a in r[1]])
    if kind == "member":
        cls = resolve(r[1], fn)
        if not (isinstance(cls, enum.EnumMeta) and r[2] in cls.__members__):
            raise Miss(f"{cls!r} has no member {r[2]}")
        return cls[r[2]]
    if kind != "object":
        raise Miss(f"unknown recipe {kind!r}")
    found = lookup(r[1], r[2])
    try:
        same = fingerprints.object_digest(found) == r[3]
    except NotStorable as e:
        raise Miss(str(e)) from None
    if not same:
        raise Miss(f"{r[1]}.{r[2]} changed since the entry was written")
    return found


# -- paths -----------------------------------------------------------------------------------


def reached(unnamed: dict[str, Any], fn: types.FunctionType, named: list[tuple[Any, list]],
            modules: Any, owners: list) -> dict[str, list]:
    """``reach`` recipes for objects of no name of their own: paths from the compiled
    function, the functions and classes ``named`` (object, recipe), and the classes of the
    modules.  The functions whose cells they are go into ``owners`` (their code is keyed)."""
    if not unnamed:
        return {}
    anchors = [(fn, ["fn"]), *((o, r) for o, r in named
                               if isinstance(o, (types.FunctionType, type)))]
    for cls in {type(m): None for m in modules}:
        try:
            anchors.append((cls, recipe(cls, fn)))
        except NotStorable:
            continue
    out, level = {}, _start(anchors)
    for name, obj in unnamed.items():
        found = _find(obj, level)
        if found is None:
            recipe(obj, fn)  # raises NotStorable, with its reason
        root, root_recipe, steps = found
        digest, owner = _path_digest(root, steps)
        if steps and steps[-1][0] == "cell":
            owners.append(owner)
        out[name] = ["reach", root_recipe, steps, digest]
    return out


def _path_digest(root: Any, steps: list) -> tuple[str, Any]:
    """The digest a ``reach`` recipe checks, and what it is of: for a cell, the function it
    closes (its code); for code, the code; else the function or class found."""
    if steps and steps[-1][0] == "cell":
        owner = follow(root, steps[:-1])
        return fingerprints.code_digest(owner.__code__), owner
    found = follow(root, steps)
    if isinstance(found, types.CodeType):
        return fingerprints.code_digest(found), found
    return fingerprints.reached_digest(found), found


def _methods(cls: type) -> list[tuple[str, types.FunctionType]]:
    """The functions attribute lookup finds on ``cls`` (the first definition along the
    MRO), static and class methods unwrapped."""
    found, names = [], set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if name in names:
                continue
            names.add(name)
            value = getattr(value, "__func__", value)
            if isinstance(value, types.FunctionType):
                found.append((name, value))
    return found


def _class_attrs(cls: type) -> dict[str, Any]:
    """A class's attributes as attribute lookup finds them (the first along the MRO)."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass))
    return found


def _tabled(table: Any, steps: list, depth: int = 0) -> list[tuple[types.FunctionType, list]]:
    """The functions in a class's table (a dict, list or tuple, nested ``MAX_TABLE`` deep),
    with the steps to each; dict keys only strings and ints (they are JSON)."""
    if type(table) is dict:
        items = [(k, v) for k, v in table.items() if type(k) in (str, int)]
    else:
        items = list(enumerate(table))
    found = []
    for key, value in items:
        here = [*steps, ["item", key]]
        if isinstance(value, types.FunctionType):
            found.append((value, here))
        elif type(value) in _TABLES and depth + 1 < MAX_TABLE:
            found += _tabled(value, here, depth + 1)
    return found


def _roots(cls: type) -> list[tuple[types.FunctionType, list]]:
    """The functions reached from a class: its methods, then those of its tables."""
    found = [(f, [["method", name]]) for name, f in _methods(cls)]
    for name, value in _class_attrs(cls).items():
        if type(value) in _TABLES:
            found += _tabled(value, [["attr", name]])
    return found


def _start(anchors: list[tuple[Any, list]]) -> list[tuple[types.FunctionType, tuple, list]]:
    """Where :func:`_find` starts from ``anchors`` (object, recipe): the functions, each with
    its anchor and the steps to it (made once for all the objects to find)."""
    level: list[tuple[types.FunctionType, tuple, list]] = []
    for root, recipe in anchors:
        if isinstance(root, type):
            level += [(f, (root, recipe), steps) for f, steps in _roots(root)]
        elif isinstance(root, types.FunctionType):
            level.append((root, (root, recipe), []))
    return level


def _find(obj: Any, level: list[tuple[types.FunctionType, tuple, list]]
         ) -> tuple[Any, list, list] | None:
    """(the anchor, its recipe, the steps) of a shortest path to ``obj`` from the anchors
    :func:`_start` began ``level`` from, or None."""
    seen = {id(f) for f, _, _ in level}
    for _ in range(MAX_DEPTH):
        deeper = []
        for fn, anchor, steps in level:
            if obj is fn:
                return *anchor, steps
            if obj is fn.__code__:
                return *anchor, [*steps, ["code"]]
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                here = [*steps, ["cell", name]]
                if obj is cell:
                    return *anchor, here
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if obj is contents:
                    return *anchor, [*here, ["contents"]]
                if isinstance(contents, types.FunctionType) and id(contents) not in seen:
                    seen.add(id(contents))
                    deeper.append((contents, anchor, [*here, ["contents"]]))
        level = deeper
    return None


def follow(root: Any, steps: list) -> Any:
    """What ``steps`` (from :func:`_find`) lead to from ``root`` in this process (raises
    Miss)."""
    value = root
    for step in steps:
        kind = step[0]
        try:
            if kind == "method" and isinstance(value, type):
                value = dict(_methods(value))[step[1]]
            elif kind == "cell" and isinstance(value, types.FunctionType):
                value = dict(zip(value.__code__.co_freevars, value.__closure__ or ()))[step[1]]
            elif kind == "attr" and isinstance(value, type):
                value = _class_attrs(value)[step[1]]
            elif kind == "item" and type(value) in _TABLES:
                value = value[step[1]]
            elif kind == "contents" and isinstance(value, types.CellType):
                value = value.cell_contents
            elif kind == "code" and isinstance(value, types.FunctionType):
                value = value.__code__
            else:
                raise Miss(f"step {step} from a {type(value).__name__}")
        except (KeyError, IndexError, TypeError, ValueError):
            raise Miss(f"step {step} leads nowhere") from None
    return value
