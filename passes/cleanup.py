"""Common-subexpression and dead-code elimination on the graph IR, and the cat pieces eager
skips dropped first (so that what made them can be dead code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.ops import CAT_OPS, OPS, RANDOM_EXTERNS, cat_arguments, run_on_ones


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument; distinguishes 1, 1.0 and True."""
    if isinstance(value, Node):
        return ("node", id(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, (torch.dtype, torch.device, str)):
        return (type(value).__name__, str(value))
    return (type(value).__name__, repr(value))


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Calls with the same op and the same arguments are computed once (every op is pure
    but the random ones: two dropouts of one tensor draw two masks)."""
    seen: dict[Any, Node] = {}

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node:
        args, kwargs = remap(node.args), remap(node.kwargs)
        if node.target in RANDOM_EXTERNS:
            return new.call(node.target, args, kwargs, node.meta, node.stack)
        # A value computed under no_grad is not the same value as one autograd sees.
        key = (node.target, _key(args), _key(kwargs), node.requires_grad)
        if key not in seen:
            seen[key] = new.call(node.target, args, kwargs, node.meta, node.stack)
        return seen[key]

    return copy_graph(graph, rewrite)


# Library calls that raise only on their arguments' metadata, and only where their meta
# kernels (run during capture) raise too, or where a run on one-element tensors of the same
# dtypes raises (a matmul of bool tensors).  Found by comparing eager, meta and that run
# over random shapes (0 included) and dtypes: an addmm, a linear with a bias and the
# convolutions fail in eager on sizes their meta kernels accept, so they are not here.
_RAISE_ON_METADATA = frozenset(
    f"{prefix}.{name}"
    for prefix in ("torch", "torch.Tensor")
    for name in "matmul mm bmm flip cumsum".split()
) | CAT_OPS
# Views reached as library calls: every error they raise is one of sizes and strides, which
# their meta kernels check (decompose rewrites the pieces of a split into slices, leaving
# the split itself unused: it must cost nothing).
_VIEWS = frozenset(
    f"{prefix}.{name}"
    for prefix in ("torch", "torch.Tensor")
    for name in "split chunk unbind narrow select view reshape flatten unflatten".split()
)


def may_raise(node: Node, derived: bool = False) -> bool:
    """Whether a call can raise at run time although capture checked its metadata, so that
    eager raises even when nothing reads the result: then it is never dead code.  Index ops
    may (an index out of range); library calls may (a Cholesky factorization of a matrix
    that is not positive definite, one_hot of a class out of range, max of an empty tensor)
    unless :func:`raises_on_metadata_only`.  In a graph the compiler made (``derived``: a
    backward) only index ops count, which check their indices cheaply: its unused library
    calls raise nothing the user's program raises, and must not cost a kernel."""
    op = OPS.get(node.target)
    if node.op != "call" or op is None:
        return False
    if op.family == "index":
        return True
    return op.family == "extern" and not derived and not raises_on_metadata_only(node)


def raises_on_metadata_only(node: Node) -> bool:
    """Whether a library call raises only where capture's checks raise, so that once
    captured it cannot raise: a view, or one of :data:`_RAISE_ON_METADATA` (F.linear
    without a bias too) whose run on one-element tensors of its dtypes passes, on its
    device (a CPU kernel may take a dtype a CUDA kernel refuses: a device not here keeps
    the call)."""
    name = node.target
    if name in _VIEWS:
        return True
    if name == "torch.nn.functional.linear":
        plain = len(node.args) == 2 and node.kwargs.get("bias") is None
    elif name == "torch.tensor":  # of constants alone: the run below is the call itself
        plain = next(node.inputs(), None) is None
    else:
        plain = name in _RAISE_ON_METADATA
    metas = [i.meta for i in node.inputs() if isinstance(i.meta, TensorMeta)]
    devices = {m.device.type for m in metas}
    if not plain or not devices <= {"cpu", "cuda"} or (
            "cuda" in devices and not torch.cuda.is_available()):
        return False
    try:
        run_on_ones(name, node.args, node.kwargs, "cuda" if "cuda" in devices else "cpu")
    except Exception:
        return False
    return True


def drop_skipped_cat_pieces(graph: Graph) -> Graph:
    """A cat of tensors of two or more dims skips the legacy empty 1-d pieces (a KV cache's
    ``torch.tensor([])`` before its first step): dropped, where each piece has the result's
    dtype (none then counts in the type promotion), so that nothing reads them."""
    found = {}
    for node in graph.calls():
        args = cat_arguments(node) if node.target in CAT_OPS - {"torch.stack"} else None
        if args is None or node.meta.ndim == 1:
            continue
        tensors, dim = args
        kept = [t for t in tensors if tuple(t.meta.shape) != (0,)]
        if kept and len(kept) < len(tensors) and all(
                t.meta.dtype == node.meta.dtype for t in tensors):
            found[node] = (kept, dim)
    if not found:
        return graph

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in found:
            return None
        return new.call("torch.cat", remap(found[node]), {}, node.meta, node.stack)

    return copy_graph(graph, rewrite)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop calls whose results nothing reads (placeholders stay: they are the signature;
    random calls stay: they advance the generator that later draws read; calls that may
    raise stay: eager raises)."""
    live: set[int] = set()
    for node in reversed(graph.nodes):
        if node.op in ("output", "placeholder") or id(node) in live or (
            node.target in RANDOM_EXTERNS
        ) or may_raise(node, graph.derived):
            live.update(id(i) for i in node.inputs())
            live.add(id(node))
    dead = {n for n in graph.calls() if id(n) not in live}
    return copy_graph(graph, lambda new, node, remap: None, drop=dead) if dead else graph
