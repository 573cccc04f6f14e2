"""A graph's C++ translation unit, split into units the compiler can build at once, with
identical kernels built once: :func:`split` names each distinct kernel body after its
digest (``mc_<digest>``) and deals them out to at most ``parts`` units; ``symbols`` maps
each kernel's own name to (unit, symbol).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

_KERNEL = re.compile(r'^extern "C" void (\w+)\(', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Units:
    sources: tuple[str, ...]  # the translation units to build, one library each
    symbols: dict[str, tuple[int, str]]  # kernel name -> (unit index, exported symbol)


def split(source: str, parts: int) -> Units:
    """``source`` as at most ``parts`` units of its distinct kernels (see the module)."""
    starts = [_comment_start(source, m.start()) for m in _KERNEL.finditer(source)]
    names = [m.group(1) for m in _KERNEL.finditer(source)]
    if not starts:
        return Units((source,), {})
    prefix = source[: starts[0]]
    bodies: dict[str, str] = {}  # digest -> kernel text under its symbol
    symbols: dict[str, str] = {}  # kernel name -> symbol
    for name, start, end in zip(names, starts, [*starts[1:], len(source)]):
        text = "\n".join(line for line in source[start:end].splitlines()
                         if not line.lstrip().startswith("//")).strip()
        digest = hashlib.sha256(re.sub(rf"\b{name}\b", "KERNEL", text).encode()).hexdigest()
        symbol = f"mc_{digest[:24]}"
        bodies.setdefault(symbol, re.sub(rf"\b{name}\b", symbol, text))
        symbols[name] = symbol
    distinct = sorted(bodies)
    count = max(1, min(parts, len(distinct)))
    unit_of = {symbol: k % count for k, symbol in enumerate(distinct)}
    sources = tuple(prefix + "\n\n".join(bodies[s] for s in distinct if unit_of[s] == k) + "\n"
                    for k in range(count))
    return Units(sources, {name: (unit_of[s], s) for name, s in symbols.items()})


def _comment_start(source: str, index: int) -> int:
    """Where the comment lines right above the line at ``index`` begin."""
    while index > 0:
        line_start = source.rfind("\n", 0, index - 1) + 1
        if not source[line_start:index].lstrip().startswith("//"):
            break
        index = line_start
    return index
