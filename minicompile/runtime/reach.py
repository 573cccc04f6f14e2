"""Objects of a warm entry's guards that have no name of their own, found again by a path
from an *anchor*: an object a recipe finds (the compiled function, a function or class
found by its name, the class of a module of the frame).

What decorators leave behind is like that: the closure cells of the functions the trace
inlined (a wrapper's ``func``), the functions in those cells (transformers' ``forward``
under three decorators, whose ``__qualname__`` names the outermost wrapper) and their
code objects (``func.__code__ == ...``).  A path is a list of steps, each a list:
``["method", name]`` (a class's attribute, as attribute lookup finds it along the MRO),
``["cell", name]`` (a function's closure cell), ``["contents"]`` (a cell's contents),
``["code"]`` (a function's code).  runtime/entries.py checks what a path finds: a
function or class by its fingerprint, a code object by its digest; a cell is only a place
the guards read through.
"""

from __future__ import annotations

import types
from typing import Any

from minicompile.runtime.fingerprints import Miss

MAX_DEPTH = 8  # cells followed from an anchor (transformers nests three or four)


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


def find(obj: Any, anchors: list[tuple[Any, list]]) -> tuple[list, list] | None:
    """(the anchor's recipe, the steps) of a shortest path from one of ``anchors`` (object,
    recipe) to ``obj``, or None."""
    level: list[tuple[types.FunctionType, list, list]] = []
    for root, recipe in anchors:
        if isinstance(root, type):
            level += [(f, recipe, [["method", name]]) for name, f in _methods(root)]
        elif isinstance(root, types.FunctionType):
            level.append((root, recipe, []))
    seen = {id(f) for f, _, _ in level}
    for _ in range(MAX_DEPTH):
        deeper = []
        for fn, recipe, steps in level:
            if obj is fn:
                return recipe, steps
            if obj is fn.__code__:
                return recipe, [*steps, ["code"]]
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                here = [*steps, ["cell", name]]
                if obj is cell:
                    return recipe, here
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if obj is contents:
                    return recipe, [*here, ["contents"]]
                if isinstance(contents, types.FunctionType) and id(contents) not in seen:
                    seen.add(id(contents))
                    deeper.append((contents, recipe, [*here, ["contents"]]))
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
            elif kind == "contents" and isinstance(value, types.CellType):
                value = value.cell_contents
            elif kind == "code" and isinstance(value, types.FunctionType):
                value = value.__code__
            else:
                raise Miss(f"step {step} from a {type(value).__name__}")
        except (KeyError, ValueError):
            raise Miss(f"step {step} leads nowhere") from None
    return value
