"""The torch.compile front door: ``torch.compile(model, backend="minicompile")``.

Dynamo hands a backend one ``torch.fx.GraphModule`` per frame; :func:`minicompile_backend`
compiles its generated ``forward`` as any function (registered under the
``torch_dynamo_backends`` entry point; ``import minicompile`` does not import it).  Sizes
Dynamo made symbolic are symbols of the first compile; floats passed as 0-d tensors are
constants of one graph per set of values (:class:`SpecializedScalars`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch

from minicompile import api, config, trace

log = logging.getLogger("minicompile")

# options={...} of torch.compile that this backend reads (others raise, as Inductor's do).
OPTIONS = {
    "backend": "auto",  # "auto" | "cpp" | "triton" (minicompile.compile's backend)
    "fullgraph": False,  # raise minicompile.Unsupported at a graph break inside Dynamo's graph
}
# torch.compile's modes, and the minicompile mode each compiles with.
MODES = {None: None, "default": None, "reduce-overhead": "reduce-overhead",
         "max-autotune": "max-autotune", "max-autotune-no-cudagraphs": "max-autotune"}


def minicompile_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *,
                        mode: str | None = None, options: dict[str, Any] | None = None
                        ) -> Callable[..., Any]:
    """Dynamo's backend: compile ``gm`` with minicompile, lazily (on its first call, with
    real inputs).  ``options``: ``{"backend": "cpp" | "triton" | "auto", "fullgraph":
    bool}``; ``mode``: torch.compile's mode."""
    del example_inputs  # the graph's placeholders carry their fake values (and SymInts)
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"minicompile backend: unknown option(s) {unknown}; known: "
                         f"{sorted(OPTIONS)}")
    if mode not in MODES:
        raise ValueError(f"minicompile backend: unknown mode {mode!r}; use one of "
                         f"{[m for m in MODES if m]}")
    opts = {**OPTIONS, **options}

    def compile_module(module: torch.fx.GraphModule) -> Callable[..., Any]:
        # Dynamo's graphs are lazy: their forward writes the real one on its first call.
        # Capture must read the generated code, so it is written now.
        real_recompile = getattr(module, "real_recompile", None)
        if real_recompile is not None:
            real_recompile()
        compiled = api.compile(module.forward, backend=opts["backend"],
                               fullgraph=opts["fullgraph"], mode=MODES[mode])
        dims, ints = symbolic_inputs(module)
        if dims or ints:
            # Automatic dynamic, told ahead what Dynamo already knows: these sources are
            # symbolic from the first compile (CompiledFunction.policy reads both tables).
            compiled.dynamic_dims[compiled.root] = dims
            compiled.dynamic_ints[compiled.root] = ints
        log.debug("minicompile: Dynamo graph %s: %d nodes; symbolic %s %s",
                  module._get_name(), len(module.graph.nodes), dims, sorted(ints))
        return compiled

    positions = scalar_inputs(gm)
    if positions:
        return SpecializedScalars(gm, positions, compile_module)
    return compile_module(gm)


class SpecializedScalars:
    """Dynamo's graph compiled once per set of values of its scalar inputs.

    Under ``dynamic=True`` Dynamo passes module floats (LayerNorm's ``eps``) as 0-d CPU
    tensors read with ``.item()``, which capture would make a graph break.  They are read on
    each call instead (no device sync), each set of values compiled with them as constants,
    as Dynamo does for floats it specializes; past the recompile limit, eagerly."""

    def __init__(self, gm: torch.fx.GraphModule, positions: tuple[int, ...],
                 compile_module: Callable[[torch.fx.GraphModule], Callable[..., Any]]) -> None:
        self.gm = gm
        self.positions = positions
        self.compile_module = compile_module
        self.variants: dict[tuple, Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        values = tuple(args[k].item() for k in self.positions)
        key = tuple(v.hex() if isinstance(v, float) else v for v in values)  # -0.0, nan
        fn = self.variants.get(key)
        if fn is None:
            if len(self.variants) >= config.get().recompile_limit:
                trace.emit("recompiles", self.gm._get_name(), (
                    f"scalar inputs {values}: past the recompile limit of "
                    f"{len(self.variants)} sets of values, the graph runs eagerly"))
                return self.gm(*args)
            trace.emit("recompiles", self.gm._get_name(),
                       f"scalar inputs {values}: compiled with these values as constants")
            fn = with_constants(self.gm, self.positions, values)
            fn = self.variants[key] = self.compile_module(fn)
        return fn(*args)


def scalar_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the inputs that are 0-d CPU tensors used only through ``.item()``."""
    positions = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if not (isinstance(value, torch.Tensor) and value.dim() == 0
                and value.device.type == "cpu" and not value.requires_grad):
            continue
        if node.users and all(u.op == "call_method" and u.target == "item" and
                              len(u.args) == 1 and not u.kwargs for u in node.users):
            positions.append(k)
    return tuple(positions)


def with_constants(gm: torch.fx.GraphModule, positions: tuple[int, ...],
                   values: tuple) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose ``.item()`` reads of the inputs at ``positions`` are the
    constants ``values`` (the inputs stay in the signature, unread)."""
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for k, value in zip(positions, values):
        for item in list(placeholders[k].users):
            for user in list(item.users):
                user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is item else n)
                user.kwargs = torch.fx.node.map_arg(user.kwargs,
                                                    lambda n: value if n is item else n)
            graph.erase_node(item)
    return torch.fx.GraphModule(gm, graph)


def symbolic_inputs(gm: torch.fx.GraphModule) -> tuple[dict[str, frozenset[int]], set[str]]:
    """The dims of each tensor input that Dynamo traced with symbolic sizes, and the int
    inputs that are SymInts, by the source names capture gives the arguments of
    ``gm.forward`` (``L['L_x_']``)."""
    dims: dict[str, frozenset[int]] = {}
    ints: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = f"L[{node.target!r}]"
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymInt) and _is_symbolic(value):
            ints.add(source)
        elif isinstance(value, torch.Tensor):
            symbolic = frozenset(d for d, s in enumerate(value.shape) if _is_symbolic(s))
            if symbolic:
                dims[source] = symbolic
    return dims, ints


def _is_symbolic(size: Any) -> bool:
    return isinstance(size, torch.SymInt) and bool(size.node.expr.free_symbols)
