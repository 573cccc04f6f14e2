"""The C++ wrapper of an exported graph, the C++ twin of codegen/wrapper.py's ``call``: check
the inputs, allocate, call kernels and library calls (``at::``) in order, return the outputs.
Its entry points are C functions, for C++ programs and Python's ctypes alike::

    extern "C" int mc_run(void** inputs, int64_t n_in, void** outputs, int64_t n_out);
    extern "C" const char* mc_last_error();
    extern "C" int mc_init();  // reads the weights (else the first mc_run does)

``inputs`` and ``outputs`` hold ``at::Tensor*`` handles (AOTInductor's convention): ``mc_run``
deletes the inputs and gives the caller the outputs; it returns 0, or 1 with the reason in
``mc_last_error()`` (no exception crosses the C boundary).  Graph inputs that are not
arguments (parameters, buffers) are read once from the weights file beside the library
(``model.so`` -> ``model.weights``); arguments are checked against the dtypes, sizes and
strides the kernels were generated for, and the size relations the trace relied on.
"""

from __future__ import annotations

import dataclasses
import json
import re

import sympy

from minicompile.errors import Unsupported
from minicompile.ir import AliasOutput, BufferRef, ExternKernel, LoopProgram
from minicompile.shapes import MIN_DYNAMIC_SIZE
from minicompile.sym import FloorDiv, ModularIndexing

from minicompile.codegen import combo, export_cuda, extern_text, wrapper
from minicompile.codegen.common import CodeWriter, KernelPlan, checks_indices, text_sections
from minicompile.codegen.cpp import CPP_DTYPES
from minicompile.codegen.cpp_externs import ATEN_DTYPES, ExternCall, extern_call
from minicompile.codegen.printers import cpp_index
from minicompile.codegen.memory_reuse import last_reads, reuse_memory
from minicompile.codegen.wrapper import cpp_unit, plan_kernels
from minicompile.spaces import ComboGroup

# The C++ text around the generated code: export_wrapper.h.
SECTIONS = text_sections("export_wrapper.h")
_SIGNATURE = re.compile(r'^extern "C" void \w+\([^)]*\)', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ExportedCode:
    kernels: str  # the kernels' C++ translation unit, or (CUDA) their Triton source
    wrapper: str  # the wrapper's translation unit (ATen's C++ API)
    # CUDA: per kernel, what runtime/cubins.py builds ((name, parameters, arguments, options))
    builds: tuple = ()


def _shape(values: tuple) -> str:
    return "{" + ", ".join(cpp_index(v) for v in values) + "}"


def _relation(rel: sympy.Basic) -> str:
    """A relation between sizes (``Eq(s0, 2*s1)``) as a C++ condition."""
    ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">",
           sympy.Ge: ">="}
    # Sizes are positive: PyTorch's Mod and floor division are the index printer's.
    rel = rel.replace(sympy.Mod, lambda a, b: ModularIndexing(a, 1, b))
    rel = rel.replace(sympy.floor, lambda e: FloorDiv(*sympy.fraction(sympy.together(e))))
    for kind, text in ops.items():
        if isinstance(rel, kind):
            try:
                return f"{cpp_index(rel.lhs)} {text} {cpp_index(rel.rhs)}"
            except NotImplementedError as e:
                raise Unsupported(f"export: the size relation {rel} has no C++ form") from e
    raise Unsupported(f"export: the size relation {rel} has no C++ form")


def generate(program: LoopProgram, groups: list, graph_name: str, arg_of: list[int | None],
             arg_names: list[str], returns: list[tuple[str, int]], signature: dict,
             relations: tuple = (), equal: list | tuple = (), cuda: bool = False) -> ExportedCode:
    """``arg_of[k]``: the position among the caller's arguments of ``program.inputs[k]``,
    or None for a weight (read from the weights file); ``arg_names``: the caller's names
    of the arguments, for error messages; ``returns``: what the call returns, in order,
    each ("output", k) (the graph's output k) or ("input", j) (argument j, as given);
    ``signature``: a JSON-able description ``mc_signature()`` returns; ``relations``: the
    size relations the trace relied on; ``equal``: (size, size, why) pairs of sizes the
    caller declared equal (dims of one name); ``cuda``: the kernels are Triton's, launched
    from cubins (codegen/export_cuda.py), and the library runs on CUDA tensors."""
    if any(isinstance(g, ComboGroup) for g in groups):
        raise Unsupported("export: combo kernels (optimizer steps) are not exported")
    if program.scalar_sizes:
        raise Unsupported("export: Python int arguments are not exported (pass tensors)")
    plans, plan_of = plan_kernels(program, groups, "triton" if cuda else "cpp", {})
    builds: list = []
    if cuda:
        kernels, builds = export_cuda.kernel_builds(program, plans)
    else:
        kernels = cpp_unit(plans)
    w = CodeWriter()
    w.line(f"// minicompile: exported wrapper for {graph_name} "
           f"({'Triton kernels as cubins' if cuda else 'C++ kernels'}, ATen library calls)")
    w.line("#define TORCH_ASSERT_ONLY_METHOD_OPERATORS")
    headers = {"ATen/core/Tensor.h", "ATen/ops/empty_strided.h", "c10/core/GradMode.h",
               *(export_cuda.CUDA_HEADERS if cuda else ())}
    calls = {g.extern.name: extern_call(g.extern, _tensor_arg) for g in groups
             if g.extern is not None and g.extern.op != "operator.getitem"}
    headers |= {call.header for call in calls.values()}
    tuples = {name for name, call in calls.items() if call.returns_tuple}
    for h in sorted(headers):
        w.line(f"#include <{h}>")
    w.lines_from(SECTIONS["preamble"])
    w.line()
    if cuda:
        names = ", ".join(f'"{b[0]}"' for b in builds)
        w.line(f"constexpr int64_t kNumKernels = {len(builds)};")
        w.line(f"const char* const kKernelNames[] = {{{names}{'' if builds else 'nullptr'}}};")
        w.lines_from(export_cuda.CUDA_PREAMBLE)
    else:
        for proto in _SIGNATURE.findall(kernels):
            w.line(f"{proto};")
        w.line("namespace { void mc_prepare() {} }")
    w.line()
    launch_index = {b[0]: k for k, b in enumerate(builds)}
    with w.block("namespace"):
        _emit_run(w, program, groups, plan_of, arg_of, arg_names, relations, equal, calls,
                  tuples, launch_index if cuda else None)
    w.line()
    w.line(f"constexpr int64_t kNumInputs = {len(arg_names)};")
    w.line(f"constexpr int64_t kNumOutputs = {len(returns)};")
    w.line(f'constexpr const char* kDeviceType = "{"cuda" if cuda else "cpu"}";')
    table = ", ".join(f"{{{int(kind == 'input')}, {k}}}" for kind, k in returns)
    w.line(f"constexpr int64_t kReturns[][2] = {{{table}}};  // {{0: output / 1: argument, "
           f"index}}")
    text = json.dumps(json.dumps(signature))  # JSON, as a C string literal
    w.line(f'extern "C" const char* mc_signature() {{ return {text}; }}')
    w.lines_from(SECTIONS["entry_points"])
    return ExportedCode(kernels, w.text(), tuple(builds))


def _tensor_arg(v: object) -> str:
    """A buffer, or a view of one (AliasOutput), as a C++ tensor."""
    if isinstance(v, BufferRef):
        return v.name
    assert isinstance(v, AliasOutput)
    return extern_text.alias_text(v, _shape, cpp_index)


def _emit_run(w: CodeWriter, program: LoopProgram, groups: list, plan_of: dict,
              arg_of: list[int | None], arg_names: list[str], relations: tuple,
              equal: list | tuple, calls: dict[str, ExternCall], tuples: set[str],
              cuda: dict[str, int] | None) -> None:
    """``cuda``: the index of each Triton kernel in the cubins file (None: C++ kernels)."""
    with w.block("std::vector<at::Tensor> weight_layouts()"):
        w.line("std::vector<at::Tensor> out;")
        for buf, arg in zip(program.inputs, arg_of):
            if arg is None:
                lay = buf.layout
                if lay.shape and any(not e.is_Integer for e in (*lay.shape, *lay.stride)):
                    raise Unsupported(f"export: weight {buf.name} has symbolic sizes")
                w.line(f"out.push_back(at::empty_strided({_shape(lay.shape)}, "
                       f"{_shape(lay.stride)}, at::TensorOptions().dtype("
                       f"{ATEN_DTYPES[lay.dtype]})));  // {buf.name}")
        w.line("return out;")
    w.line()
    weights = "cpu_weights" if cuda is not None else "weights"
    with w.block("std::vector<at::Tensor> run(std::vector<at::Tensor>& inputs, "
                 f"const std::vector<at::Tensor>& {weights})"):
        if cuda is not None:
            first = arg_names[0] if arg_names else ""
            w.line(f'const c10::Device mc_device = mc_cuda_device(inputs, "{first}");')
            w.line("c10::DeviceGuard mc_guard(mc_device);")
            w.line("const McCudaRun mc_cuda = mc_cuda_begin(mc_device);")
            w.line("const std::vector<at::Tensor>& weights = mc_weights_on(mc_device, "
                   "cpu_weights);")
        else:
            w.line("const c10::Device mc_device(at::kCPU);")
        n_weight = 0
        for buf, arg in zip(program.inputs, arg_of):
            if buf.layout.offset != 0:
                raise Unsupported(f"export: input {buf.name} starts inside its storage")
            if arg is not None:
                w.line(f"at::Tensor {buf.name} = std::move(inputs[{arg}]);")
            else:
                w.line(f"const at::Tensor& {buf.name} = weights[{n_weight}];")
                n_weight += 1
        w.line("inputs.clear();  // ours now: each is released after its last use")
        _emit_checks(w, program, arg_of, arg_names, relations)
        if cuda is not None:
            for buf, arg in zip(program.inputs, arg_of):
                if arg is not None:
                    w.line(f"{buf.name} = mc_aligned(std::move({buf.name}));  // the cubins' "
                           f"alignment")
        for a, b, why in equal:
            w.line(f"MC_CHECK({cpp_index(a)} == {cpp_index(b)}, {json.dumps(why)});")
        last_use = last_reads(groups)
        keep = {o if isinstance(o, str) else o.input for o in program.outputs}
        keep |= {b.name for b, arg in zip(program.inputs, arg_of) if arg is None}
        reuse = reuse_memory(program, groups, plan_of, keep, {})
        live = {b.name for b, arg in zip(program.inputs, arg_of) if arg is not None}
        for k, group in enumerate(groups):
            if group.extern is not None:
                _emit_extern(w, group.extern, calls, tuples)
                made = [group.extern.name]
            else:
                plan = plan_of[group.key]
                _emit_kernel(w, program, plan, reuse, cuda)
                made = list(plan.outputs)
            live.update(made)
            dead = sorted(n for n in live if last_use.get(n, -1) <= k and n not in keep)
            live.difference_update(dead)
            for name in dead:
                if name not in reuse.values() and name not in tuples:
                    w.line(f"{name}.reset();  // no longer read")
        outs = [o if isinstance(o, str) else _tensor_arg(o) for o in program.outputs]
        w.line(f"return {{{', '.join(outs)}}};")


def _emit_checks(w: CodeWriter, program: LoopProgram, arg_of: list[int | None],
                 arg_names: list[str], relations: tuple) -> None:
    """Read the size symbols off the inputs, then check every input's dtype, rank, sizes
    and strides against the layouts the kernels index by, and the relations the trace
    relied on: a call the code was not generated for is an error, never a wrong value."""
    user = [(b, arg_names[arg]) for b, arg in zip(program.inputs, arg_of) if arg is not None]
    found: set = set()
    for buf, name in user:
        lay = buf.layout
        w.line(f'mc_check_tensor({buf.name}, "{name}", mc_device, {ATEN_DTYPES[lay.dtype]}, '
               f"{len(lay.shape)});")
        for d, size in enumerate(lay.shape):
            if size.is_Symbol and size not in found:
                found.add(size)
                w.line(f"const int64_t {size} = {buf.name}.size({d});  // a dynamic size")
                w.line(f'mc_check_dynamic({size}, "{name}", {d}, {MIN_DYNAMIC_SIZE});')
    layouts = [b.layout for b in program.inputs]
    layouts += [lay for b in program.buffers for lay in wrapper.layouts(b)]
    used = {s for lay in layouts for e in (*lay.shape, *lay.stride) for s in e.free_symbols}
    used |= {s for rel in relations for s in rel.free_symbols}
    missing = used - found
    if missing:
        raise Unsupported(f"export: sizes {sorted(map(str, missing))} are not a dimension of "
                          f"any input")
    for buf, name in user:
        lay = buf.layout
        w.line(f'mc_check_layout({buf.name}, "{name}", {_shape(lay.shape)}, '
               f"{_shape(lay.stride)});")
    for rel in relations:
        w.line(f'MC_CHECK({_relation(rel)}, "the inputs\' sizes break {rel}, which the '
               f'exported code relies on");')


def _emit_extern(w: CodeWriter, ext: ExternKernel, calls: dict[str, ExternCall],
                 tuples: set[str]) -> None:
    w.line(f"// {extern_text.extern_comment(ext)}")
    if ext.op == "operator.getitem":
        source, index = ext.args
        if not isinstance(source, BufferRef) or source.name not in tuples:
            raise Unsupported(f"export: {ext.op} of {source} has no C++ form")
        call = f"std::get<{int(index)}>({source.name})"
    else:
        call = calls[ext.name].expr
    if isinstance(ext.layout, tuple):
        w.line(f"auto {ext.name} = {call};")
        return
    lay = ext.layout
    w.line(f"at::Tensor {ext.name} = mc_with_layout({call}, {_shape(lay.shape)}, "
           f"{_shape(lay.stride)});")


def _emit_kernel(w: CodeWriter, program: LoopProgram, plan: KernelPlan,
                 reuse: dict[str, str], cuda: dict[str, int] | None) -> None:
    assert not isinstance(plan, combo.ComboPlan)
    for name in plan.outputs:
        if name in reuse:
            w.line(f"at::Tensor {name} = std::move({reuse[name]});  // its memory is no "
                   f"longer read")
            continue
        lay = program.buffer(name).layout
        w.line(f"at::Tensor {name} = at::empty_strided({_shape(lay.shape)}, "
               f"{_shape(lay.stride)}, at::TensorOptions().dtype({ATEN_DTYPES[lay.dtype]})"
               f".device(mc_device));")
    if plan.numel == 0:
        w.line(f"// {plan.name}: nothing to compute for an empty tensor")
        return
    w.line(f"// {', '.join(plan.origins)}")
    if cuda is not None:
        export_cuda.emit_launch(w, program, plan, cuda[plan.name])
        return
    args = [f"static_cast<const {CPP_DTYPES[dtype]}*>({name}.data_ptr())"
            for name, dtype in plan.inputs]
    args += [f"static_cast<{CPP_DTYPES[st.dtype]}*>({st.buffer}.data_ptr())"
             for st in plan.stores]
    errs = checks_indices(plan)
    if errs:
        w.line(f"int32_t {plan.name}_err = 0;  // index out of range?")
        args.append(f"&{plan.name}_err")
    args += [str(s) for s in plan.size_args]
    w.line(f"{plan.name}({', '.join(args)});")
    if errs:
        w.line(f'MC_CHECK({plan.name}_err == 0, "index out of range in {plan.name} '
               f'({", ".join(plan.origins)})");')
