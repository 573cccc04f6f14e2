"""The compiler driver: a captured graph -> the code that runs it.

``compile_graph`` takes a capture through the graph passes (and, for a graph whose outputs
take gradients, the backward pass), then ``build_graph`` takes each graph through lowering,
fusion, codegen and the runtime's build and load, and wraps it for CUDA graphs under
``mode="reduce-overhead"``.  With minicompile/api.py (guards, entries, graph breaks) it is
the one place that wires the pipeline together.  The compiler's modules are imported inside
the functions: a process whose calls find warm entries on disk never loads them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minicompile import perf, trace
from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed, Unsupported
from minicompile.runtime import build, cudagraphs, entries, toolchain, triton_build

if TYPE_CHECKING:
    from minicompile.capture import Capture

log = logging.getLogger("minicompile")

STAT_KEYS = (
    "frames", "graphs", "graph_breaks", "recompiles", "kernels", "cache_hits", "eager_fallbacks",
    "instructions", "concrete_instructions",
)
counters: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)  # minicompile.stats()


def pick_backend(cfg: Config, capture: Capture) -> tuple[str, bool]:
    """The backend for this graph, and whether Triton must run under its interpreter."""
    devices = {
        m.device.type for n in capture.graph.nodes
        for m in (n.meta if isinstance(n.meta, tuple) else (n.meta,)) if m is not None
    }  # placeholders and tensors made in the graph (torch.ones(3))
    if not devices:  # no tensor at all (a segment of Python before a break): no kernel
        return ("cpp" if cfg.backend == "auto" else cfg.backend), False
    if devices - {"cpu", "cuda"}:  # meta tensors have no data for a kernel to read
        raise Unsupported(f"tensors on {sorted(devices - {'cpu', 'cuda'})} are not compiled")
    device = "cuda" if "cuda" in devices else "cpu"
    backend = cfg.backend
    if backend == "auto":
        backend = "triton" if device == "cuda" else "cpp"
    problem = None
    if backend == "triton":  # (the build workers know whether it imports: they did)
        problem = (triton_build.import_problem() if device == "cuda"
                   else toolchain.triton_problem())
    if problem is not None:
        toolchain.warn_once("triton", (
            f"minicompile: Triton is not available ({problem}); graphs on CPU tensors compile "
            f"with the C++ backend instead, graphs on GPU tensors run eagerly."))
        if device != "cpu":
            raise BackendCompilerFailed(f"Triton is not available: {problem}", warned=True)
        backend = "cpp"
    if backend == "cpp" and device != "cpu":
        raise Unsupported(f"backend='cpp' compiles CPU tensors; these are on {device}")
    return backend, backend == "triton" and device == "cpu"


def describe_symbols(capture: Capture) -> str:
    """The size symbols of a capture and the relations its guards keep, for the logs."""
    shapes = capture.graph.shapes
    lines = [f"{s} = {where.name} (traced with {shapes.hints[s]})"
             for s, where in shapes.sources.items()]
    relations = [g.kind for g in capture.guards.checks if g.source == "sizes"]
    lines += [f"guard: {r}" for r in relations] or ["no relations between sizes"]
    return "\n".join(lines)


def compile_graph(
    capture: Capture, cfg: Config, name: str
) -> tuple[Callable[[tuple], Any], Callable[[list], tuple], tuple | None]:
    """Compile a captured graph; return the runner for its entry (frame -> return value),
    the generated call(inputs), and for a graph without a backward what a warm entry
    stores (the loaded wrapper, whether it is interpreted, whether it runs under no_grad).
    A graph whose outputs take gradients (grad mode on, inputs requiring grad) compiles its
    backward too and runs as an autograd.Function."""
    from minicompile.passes.autograd import differentiate, requires_grad
    from minicompile.passes.gemm_padding import pad_gemm_results
    from minicompile.passes.layout import optimize_layout
    from minicompile.passes.pipeline import run_graph_passes
    from minicompile.runtime.autograd import TrainingStep, make_runner

    start = time.perf_counter()
    with perf.phase("passes"):
        graph, _timings = run_graph_passes(capture.graph)
        # Before the backward is derived: it then sees the layouts the forward chose.
        graph, layout = optimize_layout(graph, cfg.layout_opt)
        graph, padding = pad_gemm_results(graph, cfg.gemm_padding)
    for text in (layout, padding):
        if text:
            trace.emit("graph", f"{name} layout", text)
    backend, interpret = pick_backend(cfg, capture)
    get_inputs = capture.get_inputs
    rebuild = capture.rebuild
    if requires_grad(graph):
        with perf.phase("passes"):
            joint = differentiate(graph)
            backward, _ = run_graph_passes(joint.backward)
        call = build_graph(joint.forward, cfg, name, backend, interpret).call
        backward_call = build_graph(backward, cfg, f"{name}_backward", backend, interpret,
                                    takes_inputs=True).call
        trace.emit("graph", f"{name} saved for backward", describe_saved(joint))
        if cfg.mode == "reduce-overhead":
            trace.emit("cudagraphs", name, "a training graph (forward and backward) runs "
                       "without CUDA graphs")
        step = TrainingStep(call, backward_call, joint.num_outputs, joint.backward_inputs,
                            joint.input_grads, joint.differentiable)
        run = make_runner(step, get_inputs, rebuild)
        log.debug("minicompile: compiled %s (forward and backward) in %.3fs", name,
                  time.perf_counter() - start)
        return run, call, None
    loaded = build_graph(graph, cfg, name, backend, interpret, capture.writebacks,
                         static=cudagraphs.static_positions(capture.input_sources))
    call = loaded.call
    from minicompile import check

    if cfg.check and not cfg.store_in_place and check.checkable(capture.graph):
        def build_cut(cut: Any) -> Callable[[list], tuple]:
            return build_graph(run_graph_passes(cut)[0], cfg, f"{name}_check", backend,
                               interpret).call

        call = check.checked(call, capture.graph, name, build_cut)
    # Nothing here takes a gradient (grad mode is off): run without recording.
    no_grad = any(p.meta.requires_grad for p in capture.graph.placeholders)
    run = entries.inference_runner(call, get_inputs, rebuild, no_grad)
    log.debug("minicompile: compiled %s in %.3fs", name, time.perf_counter() - start)
    return run, call, (loaded, interpret, no_grad)


def build_graph(graph: Any, cfg: Config, name: str, backend: str, interpret: bool,
                writebacks: tuple = (), takes_inputs: bool = False,
                static: frozenset[int] | None = None) -> build.Loaded:
    """A graph after the graph passes -> its generated, built and loaded wrapper (``.call``
    is call(inputs)).  ``writebacks`` (output, input) pairs may be stored in place (never in
    training: the backward may have saved the input).  ``takes_inputs``: call(inputs)
    empties the list and frees each input after its last use (a backward's saved
    tensors).  ``static``: the inputs whose memory stays put (parameters, buffers), for a
    graph recorded as a CUDA graph under mode="reduce-overhead" (None: never recorded)."""
    from minicompile.codegen.wrapper import generate
    from minicompile.lowering import lower
    from minicompile.passes.fusion import fuse
    from minicompile.passes.horizontal import combine
    from minicompile.passes.inplace import stores_in_place
    from minicompile.passes.split_reductions import split_reductions

    with perf.phase("lowering"):
        program = lower(split_reductions(graph))
    fusion_log: list[str] = []
    with perf.phase("fusion"):
        groups = fuse(program, fusion_log)
        in_place = {}
        if cfg.store_in_place and writebacks:
            in_place = stores_in_place(program, groups, writebacks, fusion_log)
        if cfg.horizontal_fusion:
            groups = combine(groups, fusion_log)
    with perf.phase("codegen"):
        code = generate(program, groups, backend, graph_name=name, in_place=in_place,
                        takes_inputs=takes_inputs, autotune=cfg.mode == "max-autotune")
    trace.emit("graph", f"{name} after passes", lambda: str(graph))
    trace.emit("fusion", name, lambda: "\n".join(
        [str(program), ""] + fusion_log + [f"group {g.name}" for g in groups]))
    trace.emit("output_code", f"{name} ({backend})", code.module, f"{name}.{backend}.py")
    if code.cpp_source is not None:
        trace.emit("output_code", f"{name} kernels (C++)", code.cpp_source, f"{name}.cpp")
    loaded = build.load(code, cfg, interpret)
    loaded.kernels = len(code.kernels)
    counters["kernels"] += len(code.kernels)
    if loaded.from_cache:
        counters["cache_hits"] += 1
    if static is None or cfg.mode != "reduce-overhead" or backend != "triton" or interpret:
        return loaded
    if cfg.store_in_place:  # an optimizer step: its gradients are new tensors every step
        trace.emit("cudagraphs", name, "optimizer steps run without CUDA graphs")
        return loaded
    mutated = frozenset(k for k, b in enumerate(program.inputs) if b.name in in_place.values())
    return dataclasses.replace(loaded, call=cudagraphs.GraphedCall(loaded.call, name, static,
                                                                   mutated))


def describe_saved(joint: Any) -> str:
    """What the forward keeps for the backward, for the logs."""
    saved = [k for kind, k in joint.backward_inputs if kind == "saved"]
    inputs = [k for kind, k in joint.backward_inputs if kind == "input"]
    return (f"{len(saved)} values ({joint.saved_bytes / 2**20:.2f} MiB) and {len(inputs)} "
            f"inputs ({joint.saved_input_bytes / 2**20:.2f} MiB) saved for the backward")
