"""Exceptions that carry a reason a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the graph module imports sympy: not at `import minicompile`
    from minicompile.graph import SourceLine


class Unsupported(Exception):
    """Something the compiler cannot handle: the frame (or, later, the segment) runs eagerly.

    ``reason`` is one line in the user's terms ("print() is not traceable"); ``stack`` is the
    user's source, outermost frame first, where the construct was met.  ``raises``: the
    construct raises in eager (an op given tensors it rejects): the user's error, not a
    limit of the compiler.
    """

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
            where = self.stack[-1]
            text += f"\n  at {where.filename}:{where.lineno} in {where.function}"
            if where.text:
                text += f"\n    {where.text.strip()}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class BackendCompilerFailed(Exception):
    """A kernel did not build; the frame falls back to eager unless strict mode is on.
    ``warned``: the cause (a tool that does not work) was warned about once already, so
    this failure adds no warning of its own."""

    def __init__(self, message: str, warned: bool = False) -> None:
        super().__init__(message)
        self.warned = warned
