"""MINICOMPILE_TRACE / MINICOMPILE_LOGS output: print to stderr, keep a copy on disk."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from minicompile import config

_counter = 0


def emit(part: str, title: str, text: str | Callable[[], str],
         filename: str | None = None) -> None:
    """Print ``text`` under ``title`` if ``part`` is being logged; with MINICOMPILE_TRACE=1
    also write it to the trace directory as ``filename``.  ``text`` may be a function
    making it, called only then (a large graph's text takes tens of milliseconds)."""
    cfg = config.get()
    if not cfg.logging(part):
        return
    if callable(text):
        text = text()
    global _counter
    bar = "=" * 8
    print(f"{bar} minicompile {part}: {title} {bar}\n{text.rstrip()}\n", file=sys.stderr)
    if cfg.trace and filename:
        _counter += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", filename)
        path = cfg.trace_dir / f"{_counter:03d}_{safe}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as e:  # tracing must never break compilation
            print(f"minicompile: could not write trace file {path}: {e}", file=sys.stderr)
