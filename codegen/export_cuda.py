"""The CUDA half of an exported library's C++ wrapper (codegen/export_wrapper.py): its Triton
kernels, what building each to a cubin takes (runtime/cubins.py builds them at export time),
and the C++ that loads the cubins from ``model.cubins`` and launches them with the CUDA
driver API on the caller's current stream.

The driver API is resolved at run time from ``libcuda.so.1`` and the stream comes from
c10's device guard (``Stream::native_handle``), so the wrapper includes no CUDA header and
builds against a CPU-only PyTorch too.  Launch arguments are as runtime/launch.py passes
them: the tensors' data pointers, then the sizes and extents, an integer equal to 1 left
out (a constant of the kernel), Triton's scratch pointers last (null: a kernel that needs
scratch memory is refused when it is built).  Grids are computed from the sizes at run time.
"""

from __future__ import annotations

import ast

from minicompile.errors import Unsupported
from minicompile.ir import LoopProgram

from minicompile.codegen import triton, wrapper
from minicompile.codegen.common import CodeWriter, KernelPlan, text_sections
from minicompile.codegen.printers import cpp_index


def kernel_builds(program: LoopProgram, plans: list[KernelPlan]) -> tuple[str, list[tuple]]:
    """The kernels' Triton source (the helpers they call first) and, per kernel that is
    launched, (name, parameters, arguments, options) for runtime/cubins.KernelBuild: each
    argument a torch.dtype (a pointer), an int (a static size) or None (a dynamic size)."""
    launched = [p for p in plans if p.numel != 0]
    texts = [wrapper.kernel_text(p, "triton") for p in launched]
    builds = []
    for plan, text in zip(launched, texts):
        if plan.column_sums:
            raise Unsupported(f"export: {plan.name} sums columns in chunks (mix-order "
                              f"reductions), which CUDA export does not launch")
        fn = next(n for n in ast.parse(text).body
                  if isinstance(n, ast.FunctionDef) and n.name == plan.name)
        params = tuple(a.arg for a in fn.args.args)
        ints = [int(n) if n.is_Integer else None for n in wrapper.launch_ints(plan)]
        builds.append((plan.name, params, (*wrapper.tensor_dtypes(program, plan), *ints),
                       _options(program, plan)))
    return "\n\n\n".join(triton.helpers_for(texts) + texts), builds


def _options(program: LoopProgram, plan: KernelPlan) -> dict:
    """The keyword options of the kernel's launch (constexprs and compile options)."""
    text = wrapper.triton_launch(program, plan, gpu=True)[2]
    call = ast.parse(f"f({text})", mode="eval").body
    assert isinstance(call, ast.Call)
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def emit_launch(w: CodeWriter, program: LoopProgram, plan: KernelPlan, index: int) -> None:
    """Launch kernel ``index`` of the cubins file (the outputs allocated already)."""
    grid = wrapper.launch_grid(plan.numel, _options(program, plan)["XBLOCK"], cpp_index, "/")
    tensors = [b for b, _ in plan.inputs] + list(plan.outputs)
    args = [f"mc_pointer({t})" for t in tensors]
    args += [f"int64_t{{{cpp_index(n)}}}" for n in wrapper.launch_ints(plan) if n != 1]
    w.line(f"mc_launch(mc_cuda, {index}, {grid}, {{{', '.join(args)}}});  // {plan.name}")


CUDA_PREAMBLE = text_sections("export_cuda.h")["preamble"]

CUDA_HEADERS = ("c10/core/DeviceGuard.h", "c10/core/Stream.h",
                "c10/core/impl/DeviceGuardImplInterface.h")
