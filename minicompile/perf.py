"""``MINICOMPILE_LOGS=perf``: where compile time goes.

Each phase of a graph's compilation (PHASES; import: the compiler's modules, on the first
miss) is timed with :func:`phase`; :func:`graph` prints one line per graph, and at exit a
summary adds them up.  With the part off, a phase costs one config read.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import time
from collections.abc import Iterator

from minicompile import config

PHASES = ("import", "capture", "passes", "lowering", "fusion", "codegen", "build", "load")

_totals: dict[str, float] = {}
_counts = {"graphs": 0, "warm": 0}
_open: list[dict[str, float]] = []  # the records of the graphs being compiled, innermost last
_registered = False


def enabled() -> bool:
    return config.get().logging("perf")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time ``name`` (one of PHASES) for the graph being compiled, and in the totals."""
    if not enabled():
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        spent = time.perf_counter() - start
        _totals[name] = _totals.get(name, 0.0) + spent
        if _open:
            _open[-1][name] = _open[-1].get(name, 0.0) + spent


def note(message: str) -> None:
    """One line under MINICOMPILE_LOGS=perf (a kernel built or launched another way)."""
    if enabled():
        print(f"minicompile perf: {message}", file=sys.stderr)


def warm_entries(name: str, count: int, seconds: float) -> None:
    """``count`` warm entries of ``name`` were loaded from disk in ``seconds``."""
    if not enabled() or not count:
        return
    _register()
    _totals["load"] = _totals.get("load", 0.0) + seconds
    _counts["warm"] += count
    print(f"minicompile perf: {count} warm entry(ies) of {name} loaded in {_ms(seconds)}",
          file=sys.stderr)


@contextlib.contextmanager
def graph(name: str) -> Iterator[None]:
    """The record of one graph: its phases are printed on one line when it closes."""
    if not enabled():
        yield
        return
    _register()
    record: dict[str, float] = {}
    _open.append(record)
    start = time.perf_counter()
    try:
        yield
    finally:
        _open.pop()
        total = time.perf_counter() - start
        _counts["graphs"] += 1
        print(f"minicompile perf: graph {name}: {_format(record)}; total {_ms(total)}",
              file=sys.stderr)


def totals() -> dict[str, float]:
    """Seconds per phase since the start of the process (the warm entries' loads as
    ``load``)."""
    return dict(_totals)


def summary() -> str:
    """The totals since the start of the process, one line."""
    return (f"{_counts['graphs']} graph(s) compiled, {_counts['warm']} warm entry(ies) "
            f"loaded: {_format(_totals) or 'nothing timed'}")


def _format(record: dict[str, float]) -> str:
    names = [p for p in PHASES if p in record] + sorted(set(record) - set(PHASES))
    return ", ".join(f"{p} {_ms(record[p])}" for p in names)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _register() -> None:
    global _registered
    if not _registered:
        _registered = True
        atexit.register(lambda: print(f"minicompile perf: summary: {summary()}",
                                      file=sys.stderr))
