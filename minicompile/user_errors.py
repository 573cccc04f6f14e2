"""The user's exceptions stay the user's: raised where eager raises them, with eager's type,
message and a traceback that ends at the user's line.

An exception leaving compiled code gets a traceback of the user's lines (one per inlined
call), minicompile's frames dropped; a user line's frame is made as Jinja2 makes template
frames, a ``raise`` compiled with the user's file name, line number and function name.
"""

from __future__ import annotations

import linecache
import os
import types
from collections.abc import Sequence
from typing import Any

import torch

from minicompile.errors import SourceLine
from minicompile.graph import Graph, Node
from minicompile.ops import run_graph

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# Source folders of minicompile.passes and minicompile.codegen (setup.cfg's package_dir).
_OWN = tuple(os.path.join(os.path.dirname(_PACKAGE), d) + os.sep
             for d in ("minicompile", "passes", "codegen"))


def _is_own(filename: str) -> bool:
    """Code of minicompile's: the package, and what it generates (modules named mc_<hash>
    in the cache, sources compiled as ``<minicompile ...>``)."""
    return (filename.startswith(_OWN) or filename.startswith("<minicompile")
            or os.path.basename(filename).startswith("mc_"))


def _frame_at(where: SourceLine) -> types.TracebackType:
    """A traceback entry at ``where``: the user's file, line and function."""
    code = compile("\n" * (where.lineno - 1) + "raise __exc__", where.filename, "exec")
    code = code.replace(co_name=where.function, co_qualname=where.function)
    try:
        exec(code, {"__exc__": _Marker(), "__name__": "minicompile_user_frame"})
    except _Marker as e:
        tb = e.__traceback__
        assert tb is not None and tb.tb_next is not None
        return tb.tb_next  # the entry of `code` (the first is this function's)
    raise AssertionError("unreachable")


class _Marker(Exception):
    pass


def raise_at(exc: BaseException, stack: Sequence[SourceLine]) -> BaseException:
    """``exc`` with a traceback that goes through ``stack`` (the user's lines, outermost
    first), then through the frames of its own traceback that are not minicompile's.  The
    caller raises the result (``raise raise_at(e, stack)``)."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not _is_own(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    chain: types.TracebackType | None = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    for where in reversed(list(stack)):
        if where.lineno <= 0:
            continue
        made = _frame_at(where)
        chain = types.TracebackType(chain, made.tb_frame, made.tb_lasti, made.tb_lineno)
    return exc.with_traceback(chain)


def raise_at_node(node: Node, e: Exception) -> None:
    """An op of a graph run eagerly raised ``e``: raise it at the user's line of the op.
    Its context (the compiled attempt that failed first, when there was one) is not
    shown: eager has none."""
    e.__suppress_context__ = True
    raise raise_at(e, node.stack)


def raise_eager_error(graph: Graph, inputs: list) -> None:
    """Run ``graph`` eagerly on ``inputs`` (a compiled run of it raised): if eager raises
    too, that exception is the user's, raised at the line of the op that raised it."""
    with torch.no_grad():
        run_graph(graph, inputs, on_error=raise_at_node)


def eager_error(graph: Graph, inputs: list) -> Exception | None:
    """The exception eager raises running ``graph`` on ``inputs``, or None."""
    try:
        with torch.no_grad():
            run_graph(graph, inputs)
    except Exception as e:
        return e
    return None


def line_of(fn: Any, inst: Any) -> SourceLine:
    """The user's line of an instruction (capture/bytecode.Inst) of ``fn``."""
    code = fn.__code__
    lineno = inst.lineno if inst is not None else code.co_firstlineno
    return SourceLine(code.co_filename, lineno, code.co_name,
                      linecache.getline(code.co_filename, lineno))
