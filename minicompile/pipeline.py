"""The compiler's stages, in the order they run: listed once, here (:data:`STAGES`).

:func:`walk` takes a :class:`Work` (one graph) through them, each timed under its
``MINICOMPILE_LOGS=perf`` phase, its logs going to ``trace.emit``.  The list lives here, not
in passes/, because its last stages lower, generate code and build, which passes/ may not
import (tests/test_imports.py).  Each stage imports its pass when it runs: a process whose
calls find warm entries on disk never loads the compiler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from minicompile import perf, trace
from minicompile.config import Config

if TYPE_CHECKING:  # the graph module imports sympy: not at `import minicompile`
    from minicompile.graph import Graph

# (part, title, text or a function making it, file name under MINICOMPILE_TRACE or None)
Log = tuple[str, str, Any, "str | None"]


@dataclasses.dataclass(frozen=True)
class Work:
    """One graph on its way through the stages, and what each stage has made of it.

    ``role``: "graph" (a capture's; layouts, padding and autograd apply to these alone),
    "backward", "cut" (a prefix compiled by MINICOMPILE_CHECK) or "export".  ``writebacks``:
    (output, input) pairs that may be stored in place; ``takes_inputs``: the generated call
    frees each input after its last use (a backward's saved tensors)."""

    name: str
    graph: Graph  # after the graph stages: what the logs show as "after passes"
    cfg: Config
    backend: str
    interpret: bool
    role: str = "graph"
    writebacks: tuple = ()
    takes_inputs: bool = False
    # The placeholders (by position) that are the module's parameters and buffers, read
    # and not written: what fold_batch_norm and hoist_params may compute once.
    state: frozenset[int] = frozenset()
    hoisted: Any = None  # passes.hoist_params.Hoisted: the graph's parameter-derived values
    joint: Any = None  # the forward of a training graph: passes.autograd.Joint
    split: Graph | None = None  # the graph that lowering takes (reductions split)
    program: Any = None  # ir.LoopProgram
    groups: list | None = None  # passes.fusion.FusedGroup (and combo groups)
    in_place: dict[str, str] = dataclasses.field(default_factory=dict)
    copies_back: dict[str, str] = dataclasses.field(default_factory=dict)  # passes/inplace.py
    fusion_log: tuple[str, ...] = ()
    code: Any = None  # codegen.wrapper.GeneratedCode
    loaded: Any = None  # runtime.build.Loaded


@dataclasses.dataclass(frozen=True)
class Stage:
    """``run(work, logs)`` returns the work done (a tuple where a graph splits: each part
    walks the rest in turn) and appends its logs.  ``phase``: its perf phase (None: it times
    its own); ``applies``: whether it runs for this work."""

    name: str
    phase: str | None
    run: Callable[[Work, list[Log]], Work | tuple[Work, ...]]
    applies: Callable[[Work], bool] = lambda work: True


def _rewritten(work: Work, logs: list[Log], title: str, graph: Graph, text: str) -> Work:
    if text:
        logs.append(("graph", f"{work.name} {title}", text, None))
    return dataclasses.replace(work, graph=graph)


def fold_batch_norm(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.fold_batch_norm import fold_batch_norms

    return _rewritten(work, logs, "batch norms", *fold_batch_norms(work.graph, work.state))


def graph_passes(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.pipeline import run_graph_passes

    return dataclasses.replace(work, graph=run_graph_passes(work.graph)[0])


def layout(work: Work, logs: list[Log]) -> Work:
    """Before the backward is derived: it then sees the layouts the forward chose."""
    from minicompile.passes.layout import optimize_layout
    from minicompile.passes.onednn_conv import wants_channels_last

    packed = onednn(work) and wants_channels_last(work.graph, work.state)
    return _rewritten(work, logs, "layout",
                      *optimize_layout(work.graph, work.cfg.layout_opt, packed))


def gemm_padding(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.gemm_padding import pad_gemm_results

    return _rewritten(work, logs, "layout", *pad_gemm_results(work.graph, work.cfg.gemm_padding))


def conv_gemm(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.conv_gemm import convs_as_products

    return _rewritten(work, logs, "library calls", *convs_as_products(work.graph))


def onednn_convolutions(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.onednn_conv import pack_convolutions

    return _rewritten(work, logs, "library calls", *pack_convolutions(work.graph, work.state))


def cpu_pooling(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.cpu_pooling import pool_channels_last

    return _rewritten(work, logs, "library calls", *pool_channels_last(work.graph))


def cpu_attention(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.cpu_attention import flash_attention_calls

    return _rewritten(work, logs, "library calls", *flash_attention_calls(work.graph))


def hoist_params(work: Work, logs: list[Log]) -> Work:
    """After the layouts and the padding: their weight copies are computed once too."""
    from minicompile.passes.hoist_params import hoist_parameter_values

    hoisted, text = hoist_parameter_values(work.graph, work.state)
    if hoisted is None:
        return work
    logs.append(("graph", f"{work.name} parameter values", text, None))
    return dataclasses.replace(work, graph=hoisted.main, hoisted=hoisted)


def inference(work: Work) -> bool:
    """A capture's graph that takes no gradient, with parameters or buffers to read."""
    return work.role == "graph" and bool(work.state) and not trains(work)


def onednn(work: Work) -> bool:
    """An inference graph whose CPU convolutions may run on packed oneDNN weights."""
    return work.cfg.onednn and inference(work)


def stores_into_inputs(work: Work) -> bool:
    """Outputs written back into inputs may be stored there: a kernel's in an optimizer
    step, a library call's (a KV cache's ``index_copy_``) in a capture's graph, unless
    MINICOMPILE_CHECK runs eager on the same inputs after it."""
    return bool(work.writebacks) and (
        work.cfg.store_in_place or work.role == "graph" and not work.cfg.check)


def trains(work: Work) -> bool:
    from minicompile.passes.autograd import requires_grad

    return work.role == "graph" and requires_grad(work.graph)


def autograd(work: Work, logs: list[Log]) -> tuple[Work, Work]:
    """The forward and the backward; the backward, a new graph, takes the graph passes here
    (never the layouts: it reads the forward's)."""
    from minicompile.passes.autograd import differentiate

    joint = differentiate(work.graph)
    backward = graph_passes(dataclasses.replace(
        work, name=f"{work.name}_backward", graph=joint.backward, role="backward",
        writebacks=(), takes_inputs=True), logs)
    logs.append(("graph", f"{work.name} saved for backward", describe_saved(joint), None))
    if work.cfg.mode == "reduce-overhead":
        logs.append(("cudagraphs", work.name, "a training graph (forward and backward) runs "
                     "without CUDA graphs", None))
    # The backward may have saved an input: nothing is stored in place in training.
    return dataclasses.replace(work, graph=joint.forward, joint=joint, writebacks=()), backward


def describe_saved(joint: Any) -> str:
    """What the forward keeps for the backward, for the logs."""
    saved = [k for kind, k in joint.backward_inputs if kind == "saved"]
    inputs = [k for kind, k in joint.backward_inputs if kind == "input"]
    return (f"{len(saved)} values ({joint.saved_bytes / 2**20:.2f} MiB) and {len(inputs)} "
            f"inputs ({joint.saved_input_bytes / 2**20:.2f} MiB) saved for the backward")


def mixes_order(work: Work) -> bool:
    """Whether mix-order reductions run: as configured; unset, on the C++ backend only."""
    return work.cfg.mix_order if work.cfg.mix_order is not None else work.backend == "cpp"


def split_reductions(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.split_reductions import split_reductions as split

    return dataclasses.replace(work, split=split(work.graph, mix_order=mixes_order(work)))


def lowering(work: Work, logs: list[Log]) -> Work:
    from minicompile.lowering import lower

    return dataclasses.replace(work, program=lower(work.split))


def fusion(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.fusion import fuse

    fusion_log: list[str] = []
    return dataclasses.replace(work, groups=fuse(work.program, fusion_log),
                               fusion_log=tuple(fusion_log))


def mix_order_reductions(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.mix_order import mix

    fusion_log = list(work.fusion_log)
    return dataclasses.replace(work, groups=mix(work.groups, fusion_log),
                               fusion_log=tuple(fusion_log))


def stores_in_place(work: Work, logs: list[Log]) -> Work:
    """Write-backs stored in place; under mode="reduce-overhead" (CUDA graphs; on the CPU
    too, where it costs what rebuild's copy costs) the others copied at the end of the call."""
    from minicompile.passes.inplace import copies_back, stores_in_place as in_place

    fusion_log = list(work.fusion_log)
    chosen = in_place(work.program, work.groups, work.writebacks, fusion_log,
                      pointwise=work.cfg.store_in_place)
    copies = {}
    if work.cfg.mode == "reduce-overhead" and not work.takes_inputs:
        copies = copies_back(work.program, work.writebacks, chosen, fusion_log)
    return dataclasses.replace(work, in_place=chosen, copies_back=copies,
                               fusion_log=tuple(fusion_log))


def horizontal_fusion(work: Work, logs: list[Log]) -> Work:
    from minicompile.passes.horizontal import combine

    fusion_log = list(work.fusion_log)
    return dataclasses.replace(work, groups=combine(work.groups, fusion_log),
                               fusion_log=tuple(fusion_log))


def code_generation(work: Work, logs: list[Log]) -> Work:
    """The generated module; the logs show what went into it: the graph after the graph
    stages, the loop program and its groups, then the code."""
    from minicompile.codegen.wrapper import generate

    name, program, groups = work.name, work.program, work.groups
    code = generate(program, groups, work.backend, graph_name=name, in_place=work.in_place,
                    copies_back=work.copies_back, takes_inputs=work.takes_inputs,
                    autotune=work.cfg.mode == "max-autotune")
    graph = work.graph
    logs.append(("graph", f"{name} after passes", lambda: str(graph), None))
    logs.append(("fusion", name, lambda: "\n".join(
        [str(program), "", *work.fusion_log] + [f"group {g.name}" for g in groups]), None))
    logs.append(("output_code", f"{name} ({work.backend})", code.module,
                 f"{name}.{work.backend}.py"))
    if code.cpp_source is not None:
        logs.append(("output_code", f"{name} kernels (C++)", code.cpp_source, f"{name}.cpp"))
    return dataclasses.replace(work, code=code)


def build_and_load(work: Work, logs: list[Log]) -> Work:
    """Built or found in the on-disk cache, and loaded (build.py times its phases)."""
    from minicompile.runtime import build

    loaded = build.load(work.code, work.cfg, work.interpret)
    loaded.kernels = len(work.code.kernels)
    return dataclasses.replace(work, loaded=loaded)


STAGES: tuple[Stage, ...] = (
    Stage("fold batch norm", "passes", fold_batch_norm,
          lambda w: w.cfg.fold_batch_norm and inference(w)),
    Stage("graph passes", "passes", graph_passes),
    Stage("layout", "passes", layout, lambda w: w.role == "graph"),
    Stage("gemm padding", "passes", gemm_padding, lambda w: w.role == "graph"),
    Stage("convolutions as products", "passes", conv_gemm, lambda w: w.role == "graph"),
    Stage("oneDNN convolutions", "passes", onednn_convolutions, onednn),
    Stage("channels-last max pools", "passes", cpu_pooling, lambda w: w.role == "graph"),
    Stage("hoist parameter values", "passes", hoist_params, inference),
    Stage("CPU flash attention", "passes", cpu_attention, trains),
    Stage("autograd", "passes", autograd, trains),
    Stage("split reductions", "lowering", split_reductions),
    Stage("lowering", "lowering", lowering),
    Stage("fusion", "fusion", fusion),
    Stage("mix-order reductions", "fusion", mix_order_reductions, mixes_order),
    Stage("stores in place", "fusion", stores_in_place, stores_into_inputs),
    Stage("horizontal fusion", "fusion", horizontal_fusion, lambda w: w.cfg.horizontal_fusion),
    Stage("code generation", "codegen", code_generation),
    Stage("build and load", None, build_and_load),
)


def span(first: str, last: str) -> tuple[Stage, ...]:
    """The stages from ``first`` to ``last`` (by name), in order (export's part of them)."""
    names = [stage.name for stage in STAGES]
    return STAGES[names.index(first):names.index(last) + 1]


def walk(work: Work, stages: tuple[Stage, ...] = STAGES) -> Iterator[Work]:
    """Take ``work`` through ``stages`` in order; yield each finished work (a training
    graph: its forward, once built, then its backward)."""
    for k, stage in enumerate(stages):
        if not stage.applies(work):
            continue
        logs: list[Log] = []
        if stage.phase is None:
            done = stage.run(work, logs)
        else:
            with perf.phase(stage.phase):
                done = stage.run(work, logs)
        for part, title, text, filename in logs:
            trace.emit(part, title, text, filename)
        if isinstance(done, tuple):
            for part_work in done:
                yield from walk(part_work, stages[k + 1:])
            return
        work = done
    yield work
