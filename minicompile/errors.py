"""Exceptions that carry a reason a user can act on, and the user's source lines they
point at (:class:`SourceLine`, which graph nodes carry too)."""

from __future__ import annotations

import dataclasses
import os.path
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class SourceLine:
    """One frame of the user's source that produced a node (outermost first in a stack)."""

    filename: str
    lineno: int
    function: str
    text: str = ""

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.lineno}"
        return f"{where}  {self.text.strip()}" if self.text else where

    def describe(self) -> str:
        """``at file:line in function``, and the line's text below it."""
        where = f"at {self.filename}:{self.lineno} in {self.function}"
        return f"{where}\n    {self.text.strip()}" if self.text else where


class Unsupported(Exception):
    """Something the compiler cannot handle: the frame (or segment) runs eagerly.  ``reason``:
    one line in the user's terms; ``stack``: the user's source, outermost first; ``raises``:
    the construct raises in eager (the user's error, not a limit of the compiler)."""

    def __init__(self, reason: str, stack: tuple[SourceLine, ...] = (), hint: str = "",
                 raises: bool = False) -> None:
        self.reason = reason
        self.stack = tuple(stack)
        self.hint = hint
        self.raises = raises
        super().__init__(self.describe())

    def describe(self) -> str:
        text = self.reason
        if self.stack:
            text += f"\n  {self.stack[-1].describe()}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


def attempt(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on the trace's values: an error it raises (eager's too) is
    Unsupported, ``what`` naming the call."""
    try:
        return fn(*args, **kwargs)
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(f"{what} raised {type(e).__name__}: {e}") from e


class ShapeError(Unsupported):
    """Something a dynamic capture cannot keep symbolic; the caller compiles static sizes."""

    def __init__(self, reason: str, stack: tuple = (), hint: str = "", raises: bool = False
                 ) -> None:
        prefix = "dynamic shapes: "
        super().__init__(reason if reason.startswith(prefix) else prefix + reason, stack, hint,
                         raises)


class HookedModuleCall(Unsupported):
    """A call of a module with hooks (FSDP2's all-gather and reshard): capture traces no
    hooks, so the call runs outside the graph, its hooks as in eager and its forward
    compiled as a frame of its own (minicompile/distributed.py)."""


class BackendCompilerFailed(Exception):
    """A kernel did not build; the frame falls back to eager unless strict mode is on.
    ``warned``: the cause (a tool that does not work) was warned about once already, so
    this failure adds no warning of its own."""

    def __init__(self, message: str, warned: bool = False) -> None:
        super().__init__(message)
        self.warned = warned
