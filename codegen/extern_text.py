"""Library calls in the generated Python wrapper: each argument's text (a buffer, a view, a
size), the call with its comment (graph nodes, the user's source line), and the lines that
prepare cuDNN's plans while a GPU module loads.  Shared by codegen/wrapper.py and the
exported library's wrapper (codegen/export_wrapper.py, for views and comments).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy
import torch

from minicompile.ir import AliasOutput, BufferRef, ExternKernel, Layout, LoopProgram
from minicompile.library_layouts import CONVOLUTIONS
from minicompile.shapes import python_expr

from minicompile.codegen.common import CodeWriter


def tuple_text(items: list[str]) -> str:
    """A Python tuple of the texts ``items``."""
    return f"({', '.join(items)},)" if len(items) == 1 else f"({', '.join(items)})"


def shape_text(values: tuple) -> str:
    return tuple_text([python_expr(v) for v in values])


def device_literal(device: torch.device) -> str:
    return f'torch.device("{device.type}", {device.index})' if device.index is not None else (
        f'torch.device("{device.type}")'
    )


def alias_text(out: AliasOutput, shape: Callable[[tuple], str] = shape_text,
           expr: Callable[[sympy.Expr], str] = python_expr) -> str:
    """A view of a buffer as ``as_strided`` (the same text in Python and in C++, given the
    language's ``shape`` and ``expr`` printers)."""
    if out.layout is None:
        return out.input
    lay: Layout = out.layout
    view = f"{out.input}.as_strided({shape(lay.shape)}, {shape(lay.stride)}"
    if lay.offset == 0:  # (as_strided keeps the input's storage offset when given none)
        return view + ")"
    return f"{view}, {out.input}.storage_offset() + {expr(lay.offset)})"


def argument_view(out: AliasOutput) -> str:
    """A view that a library call reads, as an argument: on the CPU a plain tensor over the
    same memory (``compat.reinterpret``: half of ``as_strided``'s cost, and nothing autograd
    needs, since the generated code runs without recording); elsewhere ``alias_text``."""
    lay = out.layout
    if lay is None or lay.device.type != "cpu":
        return alias_text(out)
    return reinterpret_text(out.input, lay.shape, lay.stride, lay.offset)


def reinterpret_text(name: str, shape: tuple, stride: tuple, offset: sympy.Expr) -> str:
    """``compat.reinterpret`` of the tensor ``name``: ``offset`` elements past its own."""
    extra = "" if offset == 0 else f", {python_expr(offset)}"
    return f"reinterpret({name}, {shape_text(shape)}, {shape_text(stride)}{extra})"


# Kernels index an extern's result by the strides eager gives it; a library may choose
# others (another device's kernels, say): then the result is copied into that layout.
LAYOUT_HELPER = """\
def with_layout(t, size, stride):
    have = t.stride()
    if have == stride or all(st == want for st, want, n in zip(have, stride, size) if n > 1):
        return t
    return empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
"""


def library_plans(program: LoopProgram, externs: list[ExternKernel],
                  devices: list[str]) -> list[str]:
    """The lines that prepare cuDNN's plans of the module's convolutions while it loads
    (runtime/library_plans.py): each distinct problem of static sizes on a GPU, its tensor
    arguments described by their layouts.  No lines for a module without one."""
    layouts = {b.name: b.layout for b in (*program.inputs, *program.buffers)}

    def like(value: object) -> str | None:
        if isinstance(value, BufferRef):
            lay = layouts.get(value.name)
            if (isinstance(lay, Layout) and lay.device.type == "cuda" and lay.offset == 0
                    and str(lay.device) in devices
                    and all(n.is_Integer for n in (*lay.shape, *lay.stride))):
                return (f"Like({shape_text(lay.shape)}, {shape_text(lay.stride)}, {lay.dtype}, "
                        f"device{devices.index(str(lay.device))})")
            return None
        items = value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, (BufferRef, AliasOutput)) or isinstance(v, sympy.Basic)
               and not v.is_Integer for v in items):
            return None  # (a tensor in a list, a view of an input, a dynamic size)
        return extern_arg(value)

    problems: dict[str, str] = {}
    for ext in externs:
        if ext.op not in CONVOLUTIONS:
            continue
        args = [like(a) for a in ext.args]
        kwargs = {k: like(v) for k, v in ext.kwargs.items()}
        if not ext.args or not isinstance(ext.args[0], BufferRef) or None in args \
                or None in kwargs.values():
            continue  # (prepared by its first call)
        text = (f"({ext.op}, {tuple_text(args)}, "
                f"{{{', '.join(f'{k!r}: {v}' for k, v in kwargs.items())}}}),")
        problems.setdefault(text, ext.origins[0] if ext.origins else ext.op)
    if not problems:
        return []
    lines = ["# cuDNN prepares a plan at the first call of each convolution problem: these "
             "are", "# prepared in threads while the module loads (runtime/library_plans.py).",
             "library_plans = LibraryPlans(["]
    for text, origin in problems.items():
        lines += [f"    # {origin}", f"    {text}"]
    return [*lines, "])"]


def extern_arg(value: object, views: Callable[[AliasOutput], str] = alias_text) -> str:
    if isinstance(value, BufferRef):
        return value.name
    if isinstance(value, AliasOutput):
        return views(value)
    if isinstance(value, tuple):
        return tuple_text([extern_arg(v, views) for v in value])
    if isinstance(value, list):
        return "[" + ", ".join(extern_arg(v, views) for v in value) + "]"
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value) if isinstance(value, torch.dtype) else device_literal(value)
    if isinstance(value, sympy.Basic):
        return python_expr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'  # repr gives inf, -inf, nan: no such names in Python
    return repr(value)


def extern_comment(ext: ExternKernel) -> str:
    """The graph nodes a library call computes, and the user's first source line of them."""
    return ", ".join(ext.origins) + (f"  ({ext.sources[0]})" if ext.sources else "")


def emit_extern(w: CodeWriter, ext: ExternKernel, into: str | None = None,
                out: str | None = None) -> None:
    """``into``: the input the call stores into in place (passes/inplace.py): its in-place
    variant (the name with ``_``) is called on it.  ``out``: the tensor (an expression) a
    matrix product writes its result into (``out=``, in its layout)."""
    views = alias_text if into is not None else argument_view  # (in place: real views)
    args = [extern_arg(a, views) for a in ext.args]
    args += [f"{k}={extern_arg(v, views)}" for k, v in ext.kwargs.items()]
    args += [f"out={out}"] if out else []
    call = f"{ext.op}({', '.join(args)})"
    if ext.op == "operator.getitem":
        call = f"{args[0]}[{args[1]}]"
    w.line(f"# {extern_comment(ext)}")
    if into is not None:
        w.line(f"{ext.op}_({', '.join(args)})  # in place: rebuild's write-back copies nothing")
        w.line(f"{ext.name} = {into}")
        return
    if isinstance(ext.layout, tuple):
        w.line(f"{ext.name} = {call}")
    else:
        lay = ext.layout
        w.line(f"{ext.name} = with_layout({call}, {shape_text(lay.shape)}, {shape_text(lay.stride)})")
