"""Recipes: how a new process finds again an object a warm entry's code refers to.

A recipe is JSON (a module by name, a function or class by qualified name with the digest of
its code, a device by its string...).  :func:`recipe` writes one (NotStorable for objects
known only by identity); :func:`resolve` follows one (Miss when something changed).  Nothing
is unpickled or imported.
"""

from __future__ import annotations

import builtins
import enum
import sys
import types
from typing import Any

import torch

from minicompile.runtime import fingerprints, reach
from minicompile.runtime.fingerprints import Miss, NotStorable, lookup
from minicompile.runtime.guards import GLOBAL_MODULE_HOOKS


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
        root, steps = resolve(r[1], fn), r[2]
        if steps and steps[-1][0] == "cell":  # keyed by the code of the function it closes
            owner = reach.follow(root, steps[:-1])
            if fingerprints.code_digest(owner.__code__) != r[3]:
                raise Miss(f"the function at {steps[:-1]} changed since the entry was written")
            return reach.follow(owner, steps[-1:])
        found = reach.follow(root, steps)
        if isinstance(found, types.CodeType):
            if fingerprints.code_digest(found) != r[3]:
                raise Miss(f"code at {r[2]} changed since the entry was written")
            return found
        if fingerprints.reached_digest(found) != r[3]:
            raise Miss(f"{steps} changed since the entry was written")
        return found
    if kind == "member":
        cls = resolve(r[1], fn)
        if not (isinstance(cls, enum.EnumMeta) and r[2] in cls.__members__):
            raise Miss(f"{cls!r} has no member {r[2]}")
        return cls[r[2]]
    if kind == "object":
        return _same_object(lookup(r[1], r[2]), r[3], f"{r[1]}.{r[2]}")
    raise Miss(f"unknown recipe {kind!r}")


def _same_object(found: Any, digest: str, where: str) -> Any:
    """``found`` if its fingerprint is ``digest`` (raises Miss)."""
    try:
        if fingerprints.object_digest(found) == digest:
            return found
    except NotStorable as e:
        raise Miss(str(e)) from None
    raise Miss(f"{where} changed since the entry was written")
