"""The compiler driver: a captured graph -> the code that runs it.

``compile_graph`` picks the backend, walks the capture through pipeline.STAGES (a graph that
trains comes out as a forward and a backward) and wraps what comes out: a training step
(runtime/autograd.py), CUDA graphs under ``mode="reduce-overhead"``, MINICOMPILE_CHECK's
comparison (check.py).  The compiler's modules are imported inside the functions: a
process whose calls find warm entries on disk never loads them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minicompile import pipeline, trace
from minicompile.config import Config
from minicompile.errors import Unsupported
from minicompile.runtime import build, cudagraphs, entries, toolchain

if TYPE_CHECKING:
    from minicompile.capture import Break, Capture

log = logging.getLogger("minicompile")

STAT_KEYS = (
    "frames", "graphs", "warm_entries", "graph_breaks", "recompiles", "kernels", "cache_hits",
    "eager_fallbacks", "instructions", "concrete_instructions",
)
counters: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)  # minicompile.stats()


@dataclasses.dataclass
class Entry:
    """One compiled version of a frame, valid where its guards pass."""

    capture: Capture
    run: Callable[[tuple], Any]
    eager_reason: str | None = None  # set when this entry runs its graph eagerly
    stop: Break | None = None  # where the segment breaks; None: it runs to the return
    # The generated wrapper's call(inputs) (allocate, launch, return), for inspection and
    # benchmarks; None for an eager entry.
    call: Callable[[list], tuple] | None = None
    sizes: list = dataclasses.field(default_factory=list)  # the traced inputs' sizes
    # What a warm entry on disk needs of a graph without a backward: the loaded wrapper,
    # whether it runs under Triton's interpreter, and under no_grad, its WithDerived or None.
    artefact: tuple[build.Loaded, bool, bool, Any] | None = None
    file: Path | None = None  # the entry's file on disk (loaded from, or stored as)
    warm: bool = False  # loaded from disk (runtime/entries.py), not compiled


def pick_backend(cfg: Config, capture: Capture) -> tuple[str, bool]:
    """The backend for this graph, and whether Triton must run under its interpreter."""
    devices = capture.graph.device_types()
    if not devices:  # no tensor at all (a segment of Python before a break): no kernel
        return ("cpp" if cfg.backend == "auto" else cfg.backend), False
    if devices - {"cpu", "cuda"}:  # meta tensors have no data for a kernel to read
        raise Unsupported(f"tensors on {sorted(devices - {'cpu', 'cuda'})} are not compiled")
    device = "cuda" if "cuda" in devices else "cpu"
    backend = cfg.backend
    if backend == "auto":
        backend = "triton" if device == "cuda" else "cpp"
    # On GPU tensors, whether Triton imports is asked at the build (build.load), of the
    # build workers, which are importing it while this graph is compiled.
    if backend == "triton" and device == "cpu":
        problem = toolchain.triton_problem()
        if problem is not None:
            toolchain.warn_triton_missing(problem)
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
    """Compile a captured graph: the runner of its entry (frame -> return value), the
    generated call(inputs), and for a graph without a backward what a warm entry stores
    (Entry.artefact).  A graph that trains runs as an autograd.Function."""
    from minicompile.runtime import profile

    start = time.perf_counter()
    backend, interpret = pick_backend(cfg, capture)
    static = cudagraphs.static_positions(capture.input_sources)
    written = {placeholder for _, placeholder in capture.writebacks}
    work = pipeline.Work(name, capture.graph, cfg, backend, interpret,
                         writebacks=capture.writebacks, state=static - written)
    done = [count(w) for w in pipeline.walk(work)]
    get_inputs, rebuild = capture.get_inputs, capture.rebuild
    if done[0].joint is not None:  # a forward and its backward
        from minicompile.runtime.autograd import TrainingStep, make_runner
        from minicompile.runtime.output_pool import release_with

        (forward, backward), joint = done, done[0].joint
        call = forward.loaded.call
        backward_call = backward.loaded.call
        step = TrainingStep(profile.profiled(call, call, name, cfg),
                            profile.profiled(backward_call, backward_call, name, cfg,
                                             "_backward"), joint.num_outputs,
                            joint.backward_inputs, joint.input_grads, joint.differentiable,
                            tuple(k for k, _ in capture.writebacks if not joint.differentiable[k]))
        release_with(step, backward_call)  # the gradients' memory kept while the step lives
        run = make_runner(step, get_inputs, rebuild)
        log.debug("minicompile: compiled %s (forward and backward) in %.3fs", name,
                  time.perf_counter() - start)
        return run, call, None
    (graph,) = done
    hoisted = graph.hoisted
    if hoisted is not None:  # the values computed once are static inputs too
        static |= set(range(len(capture.graph.placeholders), len(graph.graph.placeholders)))
    loaded = graphed(graph, frozenset(static))
    call = profile.profiled(loaded.call, graph.loaded.call, name, cfg)
    derived = None
    if hoisted is not None:
        from minicompile.runtime.derived import WithDerived

        call = derived = WithDerived.from_graph(call, hoisted.derived, hoisted.positions)
    call = checked(call, capture, cfg, name, backend, interpret)
    # Nothing here takes a gradient (grad mode is off): run without recording.
    no_grad = any(p.meta.requires_grad for p in capture.graph.placeholders)
    run = entries.inference_runner(call, get_inputs, rebuild, no_grad)
    log.debug("minicompile: compiled %s in %.3fs", name, time.perf_counter() - start)
    return run, call, (loaded, interpret, no_grad, derived)


def count(work: pipeline.Work) -> pipeline.Work:
    """A graph built and loaded: its kernels (and a module found in the cache) counted for
    minicompile.stats()."""
    counters["kernels"] += work.loaded.kernels
    if work.loaded.from_cache:
        counters["cache_hits"] += 1
    return work


def graphed(work: pipeline.Work, static: frozenset[int]) -> build.Loaded:
    """The loaded wrapper, recorded as a CUDA graph and replayed under
    mode="reduce-overhead" (Triton on a GPU).  ``static``: the inputs whose memory stays
    put (parameters, buffers)."""
    loaded, cfg = work.loaded, work.cfg
    if cfg.mode != "reduce-overhead" or work.backend != "triton" or work.interpret:
        return loaded
    if cfg.store_in_place:  # an optimizer step: its gradients are new tensors every step
        trace.emit("cudagraphs", work.name, "optimizer steps run without CUDA graphs")
        return loaded
    written = {*work.in_place.values(), *work.copies_back.values()}
    mutated = frozenset(k for k, b in enumerate(work.program.inputs) if b.name in written)
    return dataclasses.replace(loaded, call=cudagraphs.GraphedCall(loaded.call, work.name,
                                                                   static, mutated))


def checked(call: Callable[[list], tuple], capture: Capture, cfg: Config, name: str,
            backend: str, interpret: bool) -> Callable[[list], tuple]:
    """Under MINICOMPILE_CHECK, ``call`` compared with eager on every call (each cut of the
    graph compiled through the same stages where they differ); else ``call`` itself."""
    from minicompile import check

    if not cfg.check or cfg.store_in_place or not check.checkable(capture.graph):
        return call

    def build_cut(cut: Any) -> Callable[[list], tuple]:
        work = pipeline.Work(f"{name}_check", cut, cfg, backend, interpret, role="cut")
        (done,) = [count(w) for w in pipeline.walk(work)]
        return done.loaded.call

    return check.checked(call, capture.graph, name, build_cut)
