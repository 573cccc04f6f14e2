"""The Python wrapper around a graph's kernels: allocate outputs, launch, return.

``generate(program, groups, backend)`` returns a :class:`GeneratedCode`: the text of one
Python module (kernels and a ``call(args)`` function for Triton; the ``call`` function and
the ctypes bindings for C++) and, for C++, the text of the kernels' translation unit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy
import torch

from minicompile.errors import Unsupported
from minicompile.ir import Buffer, ExternKernel, Layout, LoopProgram
from minicompile.library_layouts import CONVOLUTIONS
from minicompile.ops import extern_module
from minicompile.shapes import python_expr
from minicompile.sym import size_symbols

from minicompile.codegen import (combo, cpp, cpp_column_split, gemm_calls, triton,
                                 triton_reduction, triton_tuning)
from minicompile.codegen.column_sums import ColumnPartials
from minicompile.codegen.extern_text import (LAYOUT_HELPER, alias_text, device_literal,
                                             emit_extern, extern_comment, library_plans,
                                             shape_text as _shape, tuple_text as _tuple)
from minicompile.codegen.memory_reuse import (
    last_reads, needed_outside, pooled_outputs, reuse_memory,
)
from minicompile.codegen.common import (
    CodeWriter,
    KernelPlan,
    checks_indices,
    checks_values,
    divides_integers,
    kernel_name,
    plan_kernel,
    with_in_place,
)
from minicompile.spaces import ComboGroup, FusedGroup


@dataclasses.dataclass(frozen=True)
class GeneratedCode:
    backend: str  # "triton" | "cpp"
    module: str  # Python source: kernels (Triton) and call(args)
    cpp_source: str | None  # the C++ translation unit, for backend "cpp"
    kernels: tuple[str, ...]  # kernel names


def generate(
    program: LoopProgram, groups: list[FusedGroup], backend: str, graph_name: str = "graph",
    in_place: dict[str, str] | None = None, takes_inputs: bool = False, autotune: bool = False,
    copies_back: dict[str, str] | None = None,
) -> GeneratedCode:
    """``in_place``: output buffers stored into inputs; ``copies_back``: output buffers
    copied into inputs after the last kernel, the input returned (passes/inplace.py).
    ``takes_inputs``: ``call`` empties the list it is given and frees each input after its
    last use (a backward's saved tensors: the caller keeps no other reference); its
    outputs on the CPU take their memory from a pool kept across calls (pooled_outputs).
    ``autotune`` (mode="max-autotune"): Triton kernels launch with the configuration timed
    fastest at their first run (codegen/triton_tuning.py, runtime/autotune.py)."""
    in_place, copies_back = in_place or {}, copies_back or {}
    plans, plan_of = plan_kernels(program, groups, backend, in_place)
    tuned = {p.name: triton_tuning.tune_plan(p, _interpreted(program, p)) for p in plans
             if autotune and backend == "triton" and not isinstance(p, combo.ComboPlan)
             and p.numel != 0 and not p.column_sums}  # (combo kernels, column sums: as planned)
    externs = [g.extern for g in groups if g.extern is not None]
    devices = sorted({str(layout.device) for b in program.buffers for layout in layouts(b)})
    plans_ahead = library_plans(program, externs, devices) if backend == "triton" else []
    w = CodeWriter()
    w.line(f"# minicompile: generated code for {graph_name} ({backend} backend)")
    cpp_source = None
    if backend == "triton":
        _triton_kernels(w, program, plans, tuned, bool(plans_ahead), in_place)
    else:
        cpp_source = cpp_unit(plans)
        _cpp_bindings(w, plans)
    if any(e.op.startswith("operator.") and e.op != "operator.getitem" for e in externs):
        w.line("import operator")
    for module in sorted({m for e in externs if (m := extern_module(e.op)) is not None}):
        w.line(f"import {module}")  # runtime helpers (training's record), autograd.Functions
    w.line()
    for k, dev in enumerate(devices):
        w.line(f"device{k} = {device_literal(torch.device(dev))}")
    w.line("empty_strided = torch.empty_strided")
    if any(torch.device(d).type == "cpu" for d in devices):
        w.line("from minicompile.compat import empty_strided_cpu, reinterpret")
    pooled = pooled_outputs(program, groups, plans, {**in_place, **copies_back},
                            _shape, devices) if takes_inputs else {}
    if pooled:  # a backward's gradients: their memory is kept across calls
        w.line("from minicompile.runtime.output_pool import OutputPool")
        w.line(f"pool = OutputPool({len(program.outputs)})")
    blocks = [LAYOUT_HELPER] if externs else []
    if plans_ahead:
        blocks.append("\n".join(plans_ahead))
    for block in blocks:
        w.line()
        w.line()
        w.lines_from(block)
    w.line()
    w.line()
    w.line("def call(args):")
    with w.indent():
        _emit_call(w, program, groups, backend, plans, plan_of, devices, in_place, takes_inputs,
                   frozenset(tuned), bool(plans_ahead), pooled)
        for out, inp in copies_back.items():
            w.line(f"{inp}.copy_({out})  # rebuild's write-back, in the call (a CUDA graph "
                   f"replays it)")
        outs = [copies_back.get(o, o) if isinstance(o, str) else alias_text(o)
                for o in program.outputs]
        w.line(f"return {_tuple(outs)}")
    return GeneratedCode(backend, w.text(), cpp_source, tuple(p.name for p in plans))


def _triton_kernels(w: CodeWriter, program: LoopProgram, plans: list, tuned: dict,
                    plans_ahead: bool, in_place: dict[str, str]) -> None:
    """The imports, kernels and launchers of a Triton module.  An empty tensor's kernel is
    never launched: not written."""
    interpreted = {p.name: _interpreted(program, p) for p in plans}
    written = [p for p in plans if isinstance(p, combo.ComboPlan) or p.numel != 0]
    launched = [p for p in written if not interpreted[p.name]]
    untuned = [p for p in launched if p.name not in tuned]
    if launched and not any(interpreted.values()):
        # GPU kernels only: Triton is imported when a kernel must be built, not here.
        w.lines_from(triton.GPU_PREAMBLE)
    else:
        w.lines_from(triton.PREAMBLE)
    if untuned:  # GPU kernels launch through runtime/launch.py, not triton.jit's path
        w.line("from minicompile.runtime.launch import Launcher")
    if tuned:
        w.line("from minicompile.runtime.autotune import Autotuner, Choice")
    if plans_ahead:
        w.line("from minicompile.runtime.library_plans import LibraryPlans, Like")
    kernels = ["\n\n".join(tuned[p.name].texts.values()) if p.name in tuned
               else kernel_text(p, "triton", interpreted[p.name]) for p in written]
    for text in triton.helpers_for(kernels) + kernels:
        w.line()
        w.line()
        w.lines_from(text)
    if launched or tuned:
        w.line()
        w.line()
    if untuned:
        w.line("# Launcher(kernel, arguments whose alignment may vary, sizes that may vary, "
               "a call's dtypes and sizes, options)")
    for plan in untuned:
        pointers, sizes = _changing_args(program, plan, in_place)
        w.line(f"{plan.name}_launch = Launcher({plan.name}, {pointers}, {sizes}, "
               f"{_example(program, plan)}, {triton_launch(program, plan)[2]})")
    for plan in (p for p in plans if p.name in tuned):
        for line in autotuner_lines(program, plan, tuned[plan.name], in_place):
            w.line(line)


def _cpp_bindings(w: CodeWriter, plans: list) -> None:
    """The ctypes bindings of the C++ kernels."""
    w.line("import ctypes")
    w.line("from ctypes import addressof, c_int32")
    w.line()
    w.line("import torch")
    w.line()
    w.line("# `lib` is the compiled C++ kernels, put here by minicompile.runtime.")
    for plan in plans:
        single = not isinstance(plan, combo.ComboPlan)  # (a combo takes pointers only)
        sizes = len(plan.size_args) if single else 0
        ints = f" + [ctypes.c_int64] * {sizes}" if sizes else ""
        w.line(f"{plan.name} = lib.{plan.name}")
        w.line(f"{plan.name}.argtypes = [ctypes.c_void_p] * "
               f"{len(plan.params()) + (single and checks_values(plan))}{ints}")
        w.line(f"{plan.name}.restype = None")


def _emit_call(w: CodeWriter, program: LoopProgram, groups: list, backend: str, plans: list,
               plan_of: dict, devices: list[str], in_place: dict[str, str], takes_inputs: bool,
               tuned: frozenset[str], plans_pending: bool, pooled: dict[str, str]) -> None:
    """The body of ``call(args)``: kernels and library calls in order, each buffer freed
    after its last read; the ``pooled`` outputs taken from the pool."""
    names = [b.name for b in program.inputs] + [str(s) for s in program.scalar_sizes]
    if names:
        w.line(f"{', '.join(names)}, = args")
    if takes_inputs:
        w.line("args.clear()  # the inputs are ours: each is freed after its last use")
    emit_sizes(w, program)
    last_use = last_reads(groups)
    keep = {o if isinstance(o, str) else o.input for o in program.outputs}
    live: set[str] = {b.name for b in program.inputs} if takes_inputs else set()
    if not takes_inputs:
        keep |= {b.name for b in program.inputs}
    reuse = reuse_memory(program, groups, plan_of, keep, in_place, frozenset(pooled))
    layout_of = {b.name: b.layout for b in (*program.inputs, *program.buffers)}
    columns = ColumnPartials(program, plans, backend, devices)
    columns.allocate(w)
    for k, group in enumerate(groups):
        live.update(columns.sum(w, {n for b in group.buffers for n in b.reads()}))
        if group.extern is not None:
            if plans_pending and group.extern.op in CONVOLUTIONS:
                w.line("library_plans.wait()  # (the first convolution waits for them)")
                plans_pending = False
            out = group.extern.name if group.extern.name in pooled else None
            if out:  # (taken before the call's comment: the profile reads its arguments)
                w.line(f"{out} = {pooled[out]}")
            into = in_place.get(group.extern.name)
            blas = None if into else gemm_calls.product_call(group.extern, layout_of)
            if blas is not None:
                if not out:
                    w.line(f"{group.extern.name} = {allocation(group.extern.layout, devices)}")
                w.line(f"# {extern_comment(group.extern)}")
                w.line(blas)
            else:
                emit_extern(w, group.extern, into, out)
            made = [group.extern.name]
        else:
            plan = plan_of[group.key]
            emit_launch(w, program, plan, backend, devices, in_place, reuse, tuned, columns,
                        pooled)
            made = [name for name in plan.outputs if name not in columns.slot]
        live.update(made)
        dead = sorted(n for n in live if last_use.get(n, -1) <= k and n not in keep)
        live.difference_update(dead)
        dead = [n for n in dead if n not in reuse.values()]  # those stay for their reuse
        if dead:  # free memory as soon as no later kernel reads it (a long backward)
            w.line(f"del {', '.join(dead)}")
    columns.sum(w, None)


def plan_kernels(
    program: LoopProgram, groups: list, backend: str, in_place: dict[str, str],
) -> tuple[list, dict]:
    """The plan of each kernel group (in order), and the plans by group key; a combo
    kernel's parts are each planned as its own kernel."""
    prefix = "triton_poi" if backend == "triton" else "cpp_poi"
    needed = needed_outside(program, groups)

    def plan(group: FusedGroup, name: str) -> KernelPlan:
        return with_in_place(plan_kernel(group, name, needed(group), program.hints), in_place)

    def plan_combo(group: ComboGroup, k: int) -> combo.ComboPlan:
        name = kernel_name(prefix.replace("_poi", "_combo"), FusedGroup(-1, group.buffers), k)
        return combo.ComboPlan(name, tuple(plan(part, f"{name}_part{j}")
                                           for j, part in enumerate(group.parts)))

    kernel_groups = [g for g in groups if g.extern is None]
    plans = [plan(g, kernel_name(prefix, g, k)) if isinstance(g, FusedGroup)
             else plan_combo(g, k) for k, g in enumerate(kernel_groups)]
    return plans, {g.key: p for g, p in zip(kernel_groups, plans)}


def cpp_unit(plans: list) -> str:
    """The C++ translation unit of a graph's kernels: the preamble, the helpers they call,
    one ``extern "C"`` function per kernel."""
    unit = CodeWriter()
    unit.lines_from(cpp.PREAMBLE.strip())
    kernels = [kernel_text(plan, "cpp") for plan in plans]
    for text in cpp.helpers_for(kernels) + kernels:
        unit.line()
        unit.lines_from(text)
    return unit.text()


def kernel_text(plan: KernelPlan | combo.ComboPlan, backend: str, interpret: bool = False) -> str:
    """The source of one kernel (``interpret``: a Triton kernel run by the interpreter)."""
    if isinstance(plan, combo.ComboPlan):
        return combo.emit_triton(plan, interpret) if backend == "triton" else combo.emit_cpp(plan)
    if backend == "cpp":
        if plan.is_reduction:
            return cpp_column_split.emit(plan)
        return cpp.CppKernel(plan).emit()
    if plan.is_reduction:
        return triton_reduction.TritonReductionKernel(plan, interpret).emit()
    return triton.emit_kernel(plan, interpret)


def emit_sizes(w: CodeWriter, program: LoopProgram) -> None:
    """Read each size symbol off the first input that has it as a dimension."""
    found: dict = {}
    for buf in program.inputs:
        for d, size in enumerate(buf.layout.shape):
            if size.is_Symbol and size not in found:
                found[size] = f"{buf.name}.shape[{d}]"
    used = size_symbols(
        [s for b in program.buffers for lay in layouts(b) for s in (*lay.shape, *lay.stride)]
    )
    for s in sorted(found, key=lambda s: int(s.name[1:])):
        w.line(f"{s} = {found[s]}  # a dynamic size")
    missing = [s for s in used if s not in found and s not in program.scalar_sizes]
    if missing:
        raise Unsupported(f"dynamic shapes: sizes {missing} are not a dimension of any input")


def layouts(buf: Buffer) -> tuple[Layout, ...]:
    layout = buf.layout
    return layout if isinstance(layout, tuple) else (layout,)


def launch_grid(numel: sympy.Expr, block: int, expr: Callable[[sympy.Expr], str] = python_expr,
                div: str = "//") -> str:
    """Programs to launch: a number, or an expression of the sizes (printed by ``expr``,
    divided by ``div``: Python's by default, C++'s for an export's cubins)."""
    if numel.is_Integer:
        return str(-(-int(numel) // block))
    if block == 1:
        return expr(numel)
    return f"({expr(numel)} + {block - 1}) {div} {block}"


def launch_ints(plan: KernelPlan) -> list[sympy.Expr]:
    """The integer arguments of a launch: the size symbols, then the extents."""
    return [*plan.size_args, plan.numel] + ([plan.rnumel] if plan.is_reduction else [])


def tensor_dtypes(program: LoopProgram, plan: KernelPlan | combo.ComboPlan) -> list:
    """The dtypes of a kernel's pointer arguments: its inputs', then its outputs'."""
    return [d for _, d in plan.inputs] + [program.buffer(b).layout.dtype for b in plan.outputs]


def triton_launch(
    program: LoopProgram, plan: KernelPlan | combo.ComboPlan, gpu: bool = False,
) -> tuple[str, list[str], str]:
    """A Triton kernel's launch: its grid (an expression of the sizes), the extents it takes
    after its pointers and size symbols, and its keyword options (constexprs and such).
    ``gpu``: a launch on a GPU, whatever the program's device (an export's cubins)."""
    interpret = not gpu and _interpreted(program, plan)
    if isinstance(plan, combo.ComboPlan):
        block = combo.block_size(plan, interpret)
        return str(sum(combo.program_counts(plan, block))), [], f"XBLOCK={block}"
    numel, debug = plan.numel, _debug_options(plan, interpret)
    if plan.is_reduction:
        xblock, rblock, warps, _ = triton_reduction.plan_blocks(plan, interpret)
        grid, split = launch_grid(numel, xblock), ""
        if plan.column_sums:  # a program a chunk of rows
            grid = str(triton_reduction.column_partials(plan, interpret))
            split = f", RSPLIT={triton_reduction.chunk_rows(plan, interpret)}"
        return (grid, [python_expr(numel), python_expr(plan.rnumel)],
                f"XBLOCK={xblock}, RBLOCK={rblock}{split}, num_warps={warps}{debug}")
    block = triton.block_size(triton.planning_size(numel, plan.hints), interpret)
    warps = "" if interpret else f", num_warps={triton.POINTWISE_WARPS}"
    return launch_grid(numel, block), [python_expr(numel)], f"XBLOCK={block}{warps}{debug}"


def autotuner_lines(program: LoopProgram, plan: KernelPlan, tuned: triton_tuning.TunedKernel,
                    in_place: dict[str, str]) -> list[str]:
    """The definition of ``plan``'s Autotuner (mode="max-autotune")."""
    tensors = len(plan.inputs) + len(plan.outputs)
    written = tuple(range(len(plan.inputs), tensors))  # the outputs (and those in place)
    if _interpreted(program, plan):
        if checks_values(plan):
            written += (tensors,)  # the error flag
        return triton_tuning.autotuner_lines(tuned, written, None, "")
    pointers, sizes = _changing_args(program, plan, in_place)
    launcher = f"({pointers}, {sizes}, {_example(program, plan)})"
    return triton_tuning.autotuner_lines(tuned, written, launcher, _debug_options(plan, False))


def _changing_args(program: LoopProgram, plan: KernelPlan | combo.ComboPlan,
                   in_place: dict[str, str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions of a GPU launch's arguments that may change what Triton specializes
    the kernel on: tensors the wrapper did not allocate (inputs, library results: their
    alignment), and sizes that are not constants (dynamic shapes)."""
    tensors = [b for b, _ in plan.inputs] + list(plan.outputs)
    allocated = {b.name for b in program.buffers if not isinstance(b, ExternKernel)}
    pointers = tuple(k for k, name in enumerate(tensors)
                     if name not in allocated or name in in_place)
    if isinstance(plan, combo.ComboPlan):
        return pointers, ()
    return pointers, tuple(len(tensors) + k for k, n in enumerate(launch_ints(plan))
                           if not n.is_Integer)


def _example(program: LoopProgram, plan: KernelPlan | combo.ComboPlan) -> str:
    """What a call of ``plan``'s launcher passes, for building the kernel ahead of it: each
    tensor's dtype and each size's value (a dynamic size's traced hint; None if none)."""
    items = [str(d) for d in tensor_dtypes(program, plan)]
    if not isinstance(plan, combo.ComboPlan):
        for n in launch_ints(plan):
            value = n.xreplace({s: sympy.Integer(v) for s, v in plan.hints.items()})
            items.append(str(int(value)) if value.is_Integer else "None")
    return _tuple(items)


def _debug_options(plan: KernelPlan, interpret: bool) -> str:
    """The launch options of a Triton kernel that checks indices on a GPU: it stops on a
    device-side assert (Triton's debug option, without its overflow checks), so the host
    never waits to read a flag.  Elsewhere (C++, Triton's interpreter) the wrapper reads an
    error flag after the kernel."""
    if interpret or not checks_indices(plan):
        return ""
    return ", debug=True, sanitize_overflow=False"


def allocation(lay: Layout, devices: list[str]) -> str:
    """A new tensor of ``lay`` (on the CPU through ``compat.empty_strided_cpu``)."""
    if lay.device.type == "cpu":
        return f"empty_strided_cpu({_shape(lay.shape)}, {_shape(lay.stride)}, {lay.dtype})"
    return (f"empty_strided({_shape(lay.shape)}, {_shape(lay.stride)}, dtype={lay.dtype}, "
            f"device=device{devices.index(str(lay.device))})")


def _interpreted(program: LoopProgram, plan: KernelPlan) -> bool:
    """Triton kernels over CPU tensors run under Triton's interpreter."""
    return program.buffer(plan.outputs[0]).layout.device.type == "cpu"


def emit_launch(w: CodeWriter, program: LoopProgram, plan: KernelPlan | combo.ComboPlan,
                backend: str, devices: list[str], in_place: dict[str, str],
                reuse: dict[str, str], tuned: frozenset[str], columns: ColumnPartials,
                pooled: dict[str, str]) -> None:
    """``tuned``: the kernels launched through their Autotuner (mode="max-autotune").
    ``columns``: where a Triton kernel's column sums go (their slots of partials).
    ``pooled``: outputs taken from the pool (by the expressions that take them)."""
    for name in plan.outputs:
        if name in columns.slot:
            continue
        if name in pooled:
            w.line(f"{name} = {pooled[name]}")
        elif name in in_place:
            w.line(f"{name} = {in_place[name]}  # stored in place (rebuild writes it back)")
        elif name in reuse:
            w.line(f"{name} = {reuse[name]}  # the memory of {reuse[name]}, no longer read")
            w.line(f"del {reuse[name]}")
        else:
            lay = program.buffer(name).layout
            w.line(f"{name} = {allocation(lay, devices)}")
    args = [b for b, _ in plan.inputs] + [columns.argument(b) for b in plan.outputs]
    if isinstance(plan, combo.ComboPlan):
        w.line(f"# combo kernel of {len(plan.parts)} parts: "
               + " | ".join(", ".join(part.outputs) for part in plan.parts))
        if backend == "triton" and _interpreted(program, plan):
            grid, _, options = triton_launch(program, plan)
            w.line(f"{plan.name}[({grid},)]({', '.join(args)}, {options})")
        elif backend == "triton":
            grid, _, _ = triton_launch(program, plan)
            w.line(f"{plan.name}_launch({grid}, {', '.join(args)})")
        else:
            w.line(f"{plan.name}({', '.join(a + '.data_ptr()' for a in args)})")
        return
    numel = plan.numel
    on_cpu = backend == "cpp" or _interpreted(program, plan)
    errs = ["err"] if on_cpu and checks_values(plan) else []
    sizes = [str(s) for s in plan.size_args]
    if numel == 0:
        w.line(f"# {plan.name}: nothing to compute for an empty tensor")
        return
    where = ", ".join(dict.fromkeys(str(s).split("  ")[0] for s in plan.sources))  # file:line
    w.line(f"# {', '.join(plan.origins)}" + (f"  ({where})" if where else ""))
    if backend == "triton":
        grid, extents, options = triton_launch(program, plan)
        if plan.name in tuned:  # the grid follows the chosen XBLOCK
            launch = (f"{plan.name}_tuned({_tuple(extents)}, "
                      f"{', '.join(args + errs + sizes + extents)})")
        elif _interpreted(program, plan):
            launch = (f"{plan.name}[({grid},)]({', '.join(args + errs + sizes + extents)}, "
                      f"{options})")
        else:
            launch = f"{plan.name}_launch({grid}, {', '.join(args + sizes + extents)})"
    else:
        pointers = [a + ".data_ptr()" for a in args] + ["addressof(err)" for _ in errs]
        launch = f"{plan.name}({', '.join(pointers + sizes)})"
    if errs:
        dev = f"device{devices.index(str(program.buffer(plan.outputs[0]).layout.device))}"
        # (The driver then runs the graph eagerly, which raises the user's own error.)
        error, what = ("IndexError", "index out of range") if not divides_integers(plan) else (
            "RuntimeError", "integer division by zero") if not checks_indices(plan) else (
            "RuntimeError", "index out of range or integer division by zero")
        # A C++ kernel sets a C int (a tenth of a zeroed tensor's cost); Triton's, a tensor.
        flag, test = (("c_int32(0)", "err.value") if backend == "cpp" else
                      (f"torch.zeros((1,), dtype=torch.int32, device={dev})", "err[0]"))
        w.line(f"err = {flag}  # {what}?")
    w.line(launch)
    if errs:
        w.line(f"if {test}:")
        with w.indent():
            w.line(f'raise {error}("{what} in {plan.name} ({", ".join(plan.origins)})")')
