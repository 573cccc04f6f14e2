"""Objects of a warm entry's guards that have no name of their own, found again by a path
from an *anchor*: an object a recipe finds (the compiled function, a function or class
found by its name, the class of a module of the frame).

Such are what decorators leave behind: closure cells of inlined functions and the functions
and code objects in them, and functions a class keeps in a table.  A path is a list of steps:
``["method", name]``, ``["attr", name]``, ``["item", key]``, ``["cell", name]``,
``["contents"]``, ``["code"]``.  runtime/entries.py checks what a path finds by fingerprint.
"""

from __future__ import annotations

import types
from typing import Any

from minicompile.runtime.fingerprints import Miss

MAX_DEPTH = 8  # cells followed from an anchor (transformers nests three or four)
MAX_TABLE = 2  # containers nested in a class's table of functions
_TABLES = (dict, list, tuple)


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


def start(anchors: list[tuple[Any, list]]) -> list[tuple[types.FunctionType, tuple, list]]:
    """Where :func:`find` starts from ``anchors`` (object, recipe): the functions, each with
    its anchor and the steps to it (made once for all the objects to find)."""
    level: list[tuple[types.FunctionType, tuple, list]] = []
    for root, recipe in anchors:
        if isinstance(root, type):
            level += [(f, (root, recipe), steps) for f, steps in _roots(root)]
        elif isinstance(root, types.FunctionType):
            level.append((root, (root, recipe), []))
    return level


def find(obj: Any, level: list[tuple[types.FunctionType, tuple, list]]
         ) -> tuple[Any, list, list] | None:
    """(the anchor, its recipe, the steps) of a shortest path to ``obj`` from the anchors
    :func:`start` began ``level`` from, or None."""
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
    """What ``steps`` (from :func:`find`) lead to from ``root`` in this process (raises
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
