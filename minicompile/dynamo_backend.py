"""The torch.compile front door: ``torch.compile(model, backend="minicompile")``.

Dynamo hands a backend one ``torch.fx.GraphModule`` per frame it traced (parameters lifted
to inputs, sizes that are symbolic under ``dynamic=True`` passed as ``SymInt`` inputs) and
the example inputs; the backend returns a callable that takes the graph's inputs and returns
its outputs (a tuple).  :func:`minicompile_backend` is that backend; the package registers
it under the ``torch_dynamo_backends`` entry point (setup.cfg), which is where
``torch._dynamo.list_backends()`` finds it after ``pip install``.

How: the GraphModule's ``forward`` is generated Python, one statement per FX node
(``torch.sin(x)``, ``x.view(s0, -1)``, ``add = a + b``, ``self._tensor_constant0``), the
same calls user code makes.  minicompile compiles that ``forward`` as it compiles any
function: capture's tables translate each node into the graph IR (``call_function`` and
``call_method`` through capture/torch_ops.py, operators on tensors and on SymInts through
the interpreter, ``get_attr`` as guarded module attributes), torch callables it has no
rule for become library-call (extern) nodes, and anything else is a graph break that runs
for real, as it would in the GraphModule.  The passes, codegen and runtime are the ones of
``minicompile.compile`` (minicompile/driver.py); a graph whose outputs take gradients gets
its compiled backward (``loss.backward()`` runs it).  Nothing here raises where the
GraphModule would not: what cannot be compiled runs eagerly with the reason logged.

Sizes Dynamo made symbolic (FakeTensor sizes that are SymInts, SymInt inputs) are symbols
of minicompile's first compile, so Dynamo's dynamic graph compiles once here too.

Importing this module is not needed by ``import minicompile`` (Dynamo imports it through
the entry point, when ``backend="minicompile"`` is first looked up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from minicompile import api

log = logging.getLogger("minicompile")

# options={...} of torch.compile that this backend reads (others raise, as Inductor's do).
OPTIONS = {
    "backend": "auto",  # "auto" | "cpp" | "triton" (minicompile.compile's backend)
    "fullgraph": False,  # raise minicompile.Unsupported at a graph break inside Dynamo's graph
}
# torch.compile's modes, and the minicompile mode each compiles with.
MODES = {
    None: None,
    "default": None,
    "reduce-overhead": "reduce-overhead",
    "max-autotune": "max-autotune",
    "max-autotune-no-cudagraphs": "max-autotune",
}


def minicompile_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
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
    # Dynamo's graphs are lazy: their forward writes the real one on its first call.
    # Capture must read the generated code, so it is written now.
    real_recompile = getattr(gm, "real_recompile", None)
    if real_recompile is not None:
        real_recompile()
    compiled = api.compile(gm.forward, backend=opts["backend"], fullgraph=opts["fullgraph"],
                           mode=MODES[mode])
    dims, ints = symbolic_inputs(gm)
    if dims or ints:
        # Automatic dynamic, told ahead what Dynamo already knows: these sources are
        # symbolic from the first compile (CompiledFunction.policy reads both tables).
        compiled.dynamic_dims[compiled.root] = dims
        compiled.dynamic_ints[compiled.root] = ints
    log.debug("minicompile: Dynamo graph %s: %d nodes; symbolic %s %s", gm._get_name(),
              len(gm.graph.nodes), dims, sorted(ints))
    return compiled


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
