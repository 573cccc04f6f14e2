"""The guard checks of a warm entry, compact: each access path written once.

A check's source, expression, current-value expression and tensor all spell out the same
access path (``L_self._modules['features']._modules['denseblock3']...``), and densenet121's
9,479 checks repeat such paths about 38,000 times: 4.2 MB of its 6 MB entry.  Here every
string is cut into literal text and references to a table of paths, and each path is an
earlier one (its prefix, up to its last accessor) plus that accessor, so a path and all
its prefixes are stored once.

Decoding is concatenation only, and each piece is cut from the string it rebuilds (a
path's row is its prefix's row plus the rest of it), so a string reads back as it was
written whatever the cutting found (tests/runtime/test_check_table.py).
"""

from __future__ import annotations

import re
from typing import Any

# An access chain: a root name, then ``.attr``, ``['key']`` or ``[0]`` accessors.
_CHAIN = re.compile(r"L(?:_\w+|\['\w+'\])(?:\.[A-Za-z_]\w*|\['[^'\]]*'\]|\[\d+\])*")
_STEP = re.compile(r"\.[A-Za-z_]\w*|\['[^'\]]*'\]|\[\d+\]")


class _Table:
    def __init__(self) -> None:
        self.rows: list[Any] = []  # a root (str) or [parent index, accessor]
        self.index: dict[str, int] = {}

    def path(self, text: str) -> int:
        """The row of ``text`` (a match of _CHAIN), added with its prefixes where new."""
        found = self.index.get(text)
        if found is not None:
            return found
        steps = list(_STEP.finditer(text))
        cut = steps[-1].start() if steps and steps[-1].end() == len(text) else 0
        row: Any = [self.path(text[:cut]), text[cut:]] if cut else text
        self.rows.append(row)
        self.index[text] = len(self.rows) - 1
        return len(self.rows) - 1

    def string(self, text: str) -> Any:
        """``text`` as it is stored: itself where it has no path, else [literal, path
        row, literal, ..., literal]."""
        parts: list[Any] = []
        at = 0
        for m in _CHAIN.finditer(text):
            parts += [text[at:m.start()], self.path(m.group())]
            at = m.end()
        return text if not parts else [*parts, text[at:]]


def encode(rows: list[list[Any]], columns: tuple[int, ...]) -> dict[str, Any]:
    """``rows`` (one list per check) with the strings of ``columns`` cut into paths."""
    table = _Table()
    out = [[table.string(v) if i in columns else v for i, v in enumerate(r)] for r in rows]
    return {"paths": table.rows, "columns": list(columns), "checks": out}


def decode(encoded: dict[str, Any]) -> list[list[Any]]:
    """The rows :func:`encode` was given."""
    paths: list[str] = []
    for row in encoded["paths"]:
        paths.append(row if type(row) is str else paths[row[0]] + row[1])
    columns = set(encoded["columns"])

    def string(v: Any) -> str:
        if type(v) is str:
            return v
        return "".join([paths[p] if i & 1 else p for i, p in enumerate(v)])

    return [[string(v) if i in columns else v for i, v in enumerate(r)]
            for r in encoded["checks"]]
