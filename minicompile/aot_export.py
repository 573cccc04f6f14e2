"""Ahead-of-time export, like AOTInductor: a function or module -> a shared library that
runs without Python.

    exported = minicompile.export(model, (x,), "model.so", dynamic=[0])
    model_lib = minicompile.load("model.so")      # in Python: a callable on tensors
    # without Python: minicompile_runner model.so inputs.pt outputs.pt

The whole function is captured once (a graph break is an error naming its line), goes
through the usual passes, lowering and fusion, and the kernels get a C++ wrapper
(codegen/export_wrapper.py; library calls through ATen's C++ API): C++ kernels for CPU
tensors; for CUDA tensors Triton kernels, built to cubins now (runtime/cubins.py, written to
``model.cubins``) and launched through the CUDA driver API.  Tensors read that are not
arguments are baked into ``model.weights``.  runtime/aot.py builds and loads.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import shutil
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from minicompile import compat, config
from minicompile.errors import Unsupported

_ARGUMENT_SPEC = "None, a dim, a list of dims or a dict of dims to names"


@dataclasses.dataclass(frozen=True)
class Exported:
    """What ``export`` wrote: the library, its weights, the runner program and the
    generated sources (kept for reading); a CUDA library's cubins beside it."""

    library: Path
    weights: Path
    runner: Path
    sources: tuple[Path, ...]
    cubins: Path | None = None


def _function_and_frame(fn_or_module: Any, args: tuple) -> tuple[types.FunctionType, tuple,
                                                                  list[str]]:
    """The function to capture, its frame values and the tensor arguments' names."""
    from minicompile.api import CompiledFunction, OptimizedModule

    if isinstance(fn_or_module, OptimizedModule):  # minicompile.compile(model): the model
        fn_or_module = fn_or_module._orig_mod
    elif isinstance(fn_or_module, CompiledFunction):
        fn_or_module = fn_or_module.original
    if isinstance(fn_or_module, torch.nn.Module):
        mod = fn_or_module
        if mod._forward_hooks or mod._forward_pre_hooks:
            raise Unsupported("export: the module has forward hooks, which an exported library "
                              "would not run")
        # A forward patched onto the instance is what mod(x) calls.
        fn_or_module = mod.__dict__.get("forward") or types.MethodType(type(mod).forward, mod)
    if isinstance(fn_or_module, types.MethodType):
        fn, frame, skip = fn_or_module.__func__, (fn_or_module.__self__, *args), 1
    elif isinstance(fn_or_module, types.FunctionType):
        fn, frame, skip = fn_or_module, args, 0
    else:
        raise TypeError(f"minicompile.export expects a function or an nn.Module, got "
                        f"{type(fn_or_module).__name__}")
    code = fn.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        raise TypeError("minicompile.export: the function must take its tensors as plain "
                        "positional parameters")
    names = list(code.co_varnames[skip:code.co_argcount])
    from minicompile.capture import frame_args

    return fn, frame_args(fn, frame, {}), names[:len(args)]


def _policy(dynamic: Any, args: tuple, names: list[str]) -> tuple[Any, dict]:
    """The capture's DynamicPolicy and the names of dynamic dims ((argument, dim) -> name).
    ``dynamic``: False or None (static, but marked dims stay dynamic under None), True (every
    dim), or per argument (a list, or a dict by name) None, a dim, a list of dims or a dict
    of dims to names (``{0: "batch"}``: dims of one name are equal, as torch.export's Dim)."""
    from minicompile.capture.dynamic import STATIC, DynamicPolicy
    from minicompile.shapes import MIN_DYNAMIC_SIZE

    if dynamic is None or isinstance(dynamic, bool):
        return (STATIC if dynamic is False else DynamicPolicy(dynamic)), {}
    if isinstance(dynamic, dict):
        unknown = set(dynamic) - set(names)
        if unknown:
            raise ValueError(f"minicompile.export: dynamic names {sorted(unknown)}, which are "
                             f"not arguments ({', '.join(names)})")
        per_arg = [dynamic.get(n) for n in names]
    elif isinstance(dynamic, Sequence) and not isinstance(dynamic, str):
        if len(dynamic) != len(args):
            raise ValueError(f"minicompile.export: dynamic has {len(dynamic)} entries for "
                             f"{len(args)} arguments")
        per_arg = list(dynamic)
    else:
        raise ValueError("minicompile.export: dynamic must be None, True, False, a list with "
                         f"one entry per argument ({_ARGUMENT_SPEC}) or a dict of them by name")
    automatic: dict[str, frozenset[int]] = {}
    labels: dict[tuple[int, int], str] = {}
    for j, (name, t, spec) in enumerate(zip(names, args, per_arg)):
        if spec is None:
            continue
        dims = (spec,) if isinstance(spec, int) else tuple(spec)
        if isinstance(spec, dict):
            labels.update(((j, d % max(t.dim(), 1)), str(label)) for d, label in spec.items()
                          if isinstance(d, int))
        if not all(isinstance(d, int) and -t.dim() <= d < t.dim() for d in dims):
            raise ValueError(f"minicompile.export: dynamic dims {spec!r} of {name} (a "
                             f"{t.dim()}-d tensor): give {_ARGUMENT_SPEC}")
        dims = tuple(d % t.dim() for d in dims)
        small = [d for d in dims if t.shape[d] < MIN_DYNAMIC_SIZE]
        if small:
            raise ValueError(
                f"minicompile.export: {name} has size {t.shape[small[0]]} at dynamic dim "
                f"{small[0]}; sizes 0 and 1 are specialised: give an example of size >= "
                f"{MIN_DYNAMIC_SIZE}")
        automatic[f"L['{name}']"] = frozenset(dims)
    return DynamicPolicy(None, automatic), labels


def _same_names(program: Any, arg_of: list[int | None], labels: dict,
                names: list[str]) -> list[tuple[Any, Any, str]]:
    """(size, size, why) for dims given one name, which every call must keep equal."""
    size_of = {(a, d): size for b, a in zip(program.inputs, arg_of) if a is not None
               for d, size in enumerate(b.layout.shape)}
    first: dict[str, tuple[int, int]] = {}
    out = []
    for (j, d), label in sorted(labels.items()):
        if (j, d) not in size_of:
            continue  # an argument the function does not read
        if label not in first:
            first[label] = (j, d)
            continue
        i, e = first[label]
        if size_of[(i, e)] != size_of[(j, d)]:
            why = f"dims named {label!r} differ: {names[i]} dim {e} and {names[j]} dim {d}"
            out.append((size_of[(i, e)], size_of[(j, d)], why))
    return out


def _returns(capture: Any, frame: tuple, args: tuple) -> tuple[list[tuple[str, int]], str]:
    """What the function returns, from its output recipe: a tensor or a tuple/list of
    tensors, each a graph output or an argument as given."""
    lines = [ln.strip() for ln in capture.rebuild_source.strip().splitlines()[1:]]
    if (len(lines) < 2 or not lines[0].startswith("ret = ") or lines[-1] != "return ret"
            or not _writes_nothing_new(capture, frame, lines[1:-1])):
        raise Unsupported("export: the function mutates its inputs or has side effects "
                          "(attribute, global or container writes), which an exported library "
                          "does not replay")

    class Out:
        def __init__(self, k: int) -> None:
            self.k = k

    try:
        ret = capture.rebuild([Out(k) for k in range(len(capture.graph.outputs))], *frame)
    except (AttributeError, TypeError) as e:  # the recipe works on a computed tensor
        raise Unsupported(
            "export: the function returns a view made of a computed tensor after the graph "
            f"({lines[0][6:]}); an exported library returns computed tensors as they are: "
            "return a copy (.clone()) or the tensor before the view") from e
    items, structure = ([ret], "tensor") if not isinstance(ret, (tuple, list)) else (
        list(ret), "tuple" if isinstance(ret, tuple) else "list")
    returns: list[tuple[str, int]] = []
    for item in items:
        if isinstance(item, Out):
            returns.append(("output", item.k))
        elif any(item is a for a in args):
            returns.append(("input", next(j for j, a in enumerate(args) if item is a)))
        else:
            raise Unsupported(f"export: the function must return a tensor or a tuple or list "
                              f"of tensors; it returns {type(ret).__name__}"
                              + (f" holding {type(item).__name__}" if item is not ret else ""))
    if not returns:
        raise Unsupported("export: the function must return at least one tensor")
    return returns, structure


_CONSTANT = re.compile(r"^(_v\d+) = (None|True|False|-?\d+)$")
_ATTRIBUTE_WRITE = re.compile(r"^(.+)\.(\w+) = (_v\d+)$")


def _writes_nothing_new(capture: Any, frame: tuple, lines: list[str]) -> bool:
    """Whether the output recipe's side effects (``lines``) only write, to attributes,
    constants they hold already: a context's state reset at the end of the call
    (transformers' output capturing does), which a library need not replay."""
    constants = [_CONSTANT.match(ln) for ln in lines]
    writes = [_ATTRIBUTE_WRITE.match(ln) for ln, c in zip(lines, constants) if c is None]
    if any(w is None for w in writes):
        return False
    values = {c.group(1): ast.literal_eval(c.group(2)) for c in constants if c is not None}
    params = capture.rebuild_source.split("(", 1)[1].split(")", 1)[0].split(", ")[1:]
    scope = dict(capture.rebuild.__globals__) | dict(zip(params, frame))
    for w in writes:
        assert w is not None
        try:
            held = getattr(eval(w.group(1), scope), w.group(2))  # noqa: S307 (our recipe)
        except Exception:  # noqa: BLE001 (what cannot be read is a side effect)
            return False
        value = values.get(w.group(3), held)
        if w.group(3) not in values or type(held) is not type(value) or held != value:
            return False
    return True


def export(fn_or_module: Callable | torch.nn.Module, example_args: tuple | torch.Tensor,
           path: str | os.PathLike, dynamic: Any = None,
           cuda_target: tuple[str, int, int] | None = None) -> Exported:
    """Compile ``fn_or_module`` for ``example_args`` into the shared library ``path``, its
    weights beside it (``.weights``; CUDA: its kernels in ``.cubins``) and the
    ``minicompile_runner`` program.  ``dynamic``: the sizes that stay symbolic
    (:func:`_policy`).  The library runs on the examples' device: the CPU or CUDA.
    ``cuda_target`` (Triton's GPUTarget fields, ``("cuda", 90, 32)``): the GPU the cubins
    are built for (default: the examples'); with CPU examples, a CUDA library built without
    a GPU, from the graph traced on the CPU (for checking the build where there is none).
    Raises :class:`Unsupported` for what cannot be exported (a graph break, naming its
    line), before anything is built."""
    from minicompile import api, trace
    from minicompile.codegen import export_wrapper
    from minicompile.runtime import cubins

    _check_torch_version()
    args = (example_args,) if isinstance(example_args, torch.Tensor) else tuple(example_args)
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("minicompile.export: example_args must be tensors")
    devices = {a.device for a in args}
    cuda = cuda_target is not None or any(d.type == "cuda" for d in devices)
    if len(devices) > 1 or not all(d.type in ("cpu", "cuda") for d in devices):
        raise Unsupported(f"export: the arguments are on {sorted(map(str, devices))}; a library "
                          f"runs on CPU tensors or on the tensors of one CUDA device")
    fn, frame, names = _function_and_frame(fn_or_module, args)
    policy, labels = _policy(dynamic, args, names)
    cfg = config.get()
    api._import_compiler()
    from minicompile import pipeline
    from minicompile.capture import capture_segment, root_point

    with torch.no_grad():
        try:
            capture, _ = capture_segment(fn, root_point(fn.__code__), frame, False, policy)
        except Unsupported as e:
            raise Unsupported(f"export: {e.reason}", e.stack, e.hint) from e
    if capture.writebacks:
        raise Unsupported("export: the function mutates its inputs or buffers in place, which "
                          "an exported library does not do", hint="a module in training mode "
                          "updates its batch norm statistics: export model.eval()")
    returns, structure = _returns(capture, frame, args)
    backend = "triton" if cuda else "cpp"
    work = pipeline.Work(fn.__qualname__, capture.graph, cfg, backend, False, role="export")
    (work,) = pipeline.walk(work, pipeline.span("graph passes", "autograd"))
    if len(work.graph.device_types()) > 1:
        raise Unsupported(f"export: the function computes on {sorted(work.graph.device_types())}"
                          f"; a library runs on one kind of device")
    # Lowering and fusion; no stores in place or combo kernels (those serve optimizer
    # steps), and this module's own code generation and build.
    (work,) = pipeline.walk(work, pipeline.span("split reductions", "fusion"))
    program, groups = work.program, work.groups
    values = capture.get_inputs(*frame)
    arg_of: list[int | None] = []
    weights: list[torch.Tensor] = []
    for source, value in zip(capture.input_sources, values):
        arg = next((j for j, a in enumerate(args) if value is a and source == f"L['{names[j]}']"),
                   None)
        arg_of.append(arg)
        if arg is None:
            weights.append(value)
    shapes = capture.graph.shapes
    relations = tuple(shapes.relations()) if shapes is not None else ()
    dims = {names[a]: {d: labels.get((a, d), str(s)) for d, s in enumerate(b.layout.shape)
                       if not s.is_Integer}
            for b, a in zip(program.inputs, arg_of) if a is not None}
    signature = {"inputs": names, "returns": structure,
                 "dynamic": {n: d for n, d in dims.items() if d}}
    code = export_wrapper.generate(program, groups, fn.__qualname__, arg_of, names, returns,
                                signature, relations,
                                _same_names(program, arg_of, labels, names), cuda)
    trace.emit("output_code", f"{fn.__qualname__} exported wrapper (C++)", code.wrapper,
               f"{fn.__name__}.export.cpp")
    target = (cuda_target or cubins.device_target(next(iter(devices)))) if cuda else None
    return _write(code, Path(path).resolve(), weights, cfg, target)


def _write(code: Any, library: Path, weights: list[torch.Tensor], cfg: config.Config,
           target: tuple | None) -> Exported:
    """Build the library (``target``: its cubins' GPU, None for C++ kernels) and write it,
    its sources, weights (and cubins) and the runner."""
    from minicompile import perf
    from minicompile.runtime import aot, cubins

    library.parent.mkdir(parents=True, exist_ok=True)
    stem = library.name[:-3] if library.name.endswith(".so") else library.name
    sources = (library.with_name(f"{stem}.wrapper.cpp"),
               library.with_name(f"{stem}.kernels.{'py' if target else 'cpp'}"))
    sources[0].write_text(code.wrapper)
    sources[1].write_text(code.kernels)
    cubins_file = None
    with perf.phase("build"):
        if target is not None:
            cubins_file = aot.beside(library, ".cubins")
            built = cubins.build(code.kernels, [cubins.KernelBuild(*b) for b in code.builds],
                                 target)
            cubins.write(cubins_file, built)
        aot.build_library(None if target else code.kernels, code.wrapper, library, cfg)
        weights_file = aot.beside(library, ".weights")
        aot.write_weights(weights_file, weights)
        runner = library.with_name("minicompile_runner")
        shutil.copyfile(aot.runner(cfg), runner)
        runner.chmod(0o755)
        runner.with_name("minicompile_runner.cpp").write_text(aot.RUNNER_SOURCE)
    return Exported(library, weights_file, runner, sources, cubins_file)


# The oldest PyTorch export runs on (tests/export passes on 2.11 to 2.14): the library
# reaches libtorch's C++ API and its tensor handles (torch._C._aoti) directly.
OLDEST_TORCH = (2, 11)


def torch_supported() -> bool:
    """Whether this PyTorch is one export runs on (OLDEST_TORCH or newer)."""
    return compat.TORCH_VERSION >= OLDEST_TORCH


def _check_torch_version() -> None:
    if not torch_supported():
        raise Unsupported(
            f"export: needs PyTorch {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]} or newer (this is "
            f"{torch.__version__}): the library calls libtorch's C++ API, untested with "
            f"older releases; minicompile.compile works with this one")


def load(path: str | os.PathLike | Exported) -> Any:
    """A library written by :func:`export` (its path, or what export returned), loaded: a
    callable on the exported function's tensor arguments."""
    from minicompile.runtime import aot

    _check_torch_version()
    return aot.load(path.library if isinstance(path, Exported) else path)
