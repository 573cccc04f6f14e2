"""Combo kernels: several independent pointwise kernels in one function, one launch.

A :class:`ComboPlan` holds each part's :class:`KernelPlan` and gives them one parameter
list (shared inputs passed once); the parts' bodies are the ordinary emitters', with the
combo's pointers.  Triton: part ``k`` owns programs ``[start_k, start_k + cdiv(numel_k,
XBLOCK))`` and runs on ``pid - start_k`` (Inductor's combo kernels).  C++: the parts' loop
nests run one after another, each in its own scope and parallelised as its own kernel.
Sizes are static (passes/horizontal.py combines only those), so the grid is a number.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from minicompile.codegen import triton
from minicompile.codegen.common import CodeWriter, KernelPlan, pointer_param, pointer_params
from minicompile.codegen.cpp import CppKernel, signature


@dataclasses.dataclass(frozen=True)
class ComboPlan:
    name: str
    parts: tuple[KernelPlan, ...]

    @property
    def inputs(self) -> tuple[tuple[str, torch.dtype], ...]:
        found: dict[str, torch.dtype] = {}
        for part in self.parts:
            for name, dtype in part.inputs:
                found.setdefault(name, dtype)
        return tuple(found.items())

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(name for part in self.parts for name in part.outputs)

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(o for part in self.parts for o in part.origins)

    def params(self) -> list[str]:
        return pointer_params(self.inputs, self.outputs)

    def pointer(self, buffer: str) -> str:
        for part in self.parts:
            buffer = dict(part.in_place).get(buffer, buffer)
        return pointer_param(self.inputs, self.outputs, buffer)


def part_comment(k: int, part: KernelPlan) -> list[str]:
    lines = [f"part {k}: {int(part.numel)} elements ({', '.join(part.outputs)})"]
    return lines + part.header_comment()


# -- Triton ---------------------------------------------------------------------------------


class TritonPart(triton.TritonKernel):
    """A part's body inside a combo kernel: the combo's pointers and writer."""

    def __init__(self, combo: ComboPlan, part: KernelPlan, w: CodeWriter, wide: bool,
                 masked: bool, count: int, interpret: bool) -> None:
        super().__init__(part, wide_index=wide, masked=masked, interpret=interpret)
        self.flag_errors = False  # no index checks
        self.combo, self.w, self.count = combo, w, count

    def pointer(self, buffer: str) -> str:
        return self.combo.pointer(buffer)


def block_size(plan: ComboPlan, interpret: bool) -> int:
    """One XBLOCK for every part: sized for the largest."""
    return triton.block_size(max(int(p.numel) for p in plan.parts), interpret)


def program_counts(plan: ComboPlan, block: int) -> list[int]:
    return [-(-int(p.numel) // block) for p in plan.parts]


def emit_triton(plan: ComboPlan, interpret: bool) -> str:
    block = block_size(plan, interpret)
    wide = any(int(p.numel) >= 2**31 - 2**20 for p in plan.parts)
    w = CodeWriter()
    w.line("@triton.jit")
    w.line(f"def {plan.name}({', '.join(plan.params())}, XBLOCK: tl.constexpr):")
    count = 0
    with w.indent():
        w.line(f"# combo kernel: {len(plan.parts)} independent parts; the programs are split "
               "among them")
        w.line(f"pid = tl.program_id(0){'.to(tl.int64)' if wide else ''}")
        start = 0
        for k, (part, n) in enumerate(zip(plan.parts, program_counts(plan, block))):
            test = f"if pid < {start + n}:" if k == 0 else f"elif pid < {start + n}:"
            w.line(test)
            with w.indent():
                for row in part_comment(k, part):
                    w.line(f"# {row}")
                numel = int(part.numel)
                masked = numel % block != 0
                w.line(f"xoffset = (pid - {start}) * XBLOCK" if start else "xoffset = pid * XBLOCK")
                w.line("xindex = xoffset + tl.arange(0, XBLOCK)")
                if masked:
                    w.line(f"xmask = xindex < {numel}")
                body = TritonPart(plan, part, w, wide, masked, count, interpret)
                body.emit_vars("xindex", part.loop_vars, part.ranges)
                body.emit_stores(functools.partial(body.emit_store, axes=frozenset({"x"})))
                count = body.count  # tmp names stay unique across the parts
            start += n
    return w.text()


# -- C++ ------------------------------------------------------------------------------------


class CppPart(CppKernel):
    """A part's loop nest inside a combo function: the combo's pointers and writer."""

    def __init__(self, combo: ComboPlan, part: KernelPlan, w: CodeWriter) -> None:
        super().__init__(part)
        self.combo, self.w = combo, w

    def pointer(self, buffer: str) -> str:
        return self.combo.pointer(buffer)


def emit_cpp(plan: ComboPlan) -> str:
    w = CodeWriter()
    w.line(f"// combo kernel: {len(plan.parts)} independent parts, run one after another")
    dtypes = {st.buffer: st.dtype for part in plan.parts for st in part.stores}
    with w.block(signature(plan.name, plan.inputs, [dtypes[n] for n in plan.outputs])):
        for k, part in enumerate(plan.parts):
            w.line("{")
            with w.indent():
                for row in part_comment(k, part):
                    w.line(f"// {row}")
                CppPart(plan, part, w).emit_loops()
            w.line("}")
    return w.text()
