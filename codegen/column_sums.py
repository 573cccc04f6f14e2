"""The column sums of a graph's Triton kernels that walk rows (mix-order reductions,
passes/mix_order.py): such a kernel writes each column sum as one row of partials per
program (a kernel of one program writes the sums themselves: no slot).  Every column sum
gets a slot of one float32 workspace per (programs, columns) shape, allocated when the call
starts; the slots written so far are summed with one call just before a kernel reads one,
or before the graph returns (a transformer's backward sums all its layer-norm and bias
gradients with one call).
"""

from __future__ import annotations

from minicompile.ir import LoopProgram

from minicompile.codegen.common import CodeWriter, KernelPlan
from minicompile.codegen.triton_reduction import column_partials

ALIGN = 64  # floats between slots: each slot starts 256-byte aligned


class ColumnPartials:
    """The slots of the column sums of ``plans`` (a graph's kernel plans, in launch order;
    only Triton's use slots); ``devices``: the wrapper's devices (``device0``, ...)."""

    def __init__(self, program: LoopProgram, plans: list, backend: str,
                 devices: list[str]) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.spaces: dict[tuple[int, int, str], list[str]] = {}
        self.slot: dict[str, tuple[int, int]] = {}  # buffer -> (workspace, slot)
        for plan in plans if backend == "triton" else []:
            if not isinstance(plan, KernelPlan) or not plan.column_sums:
                continue
            device = program.buffer(plan.outputs[0]).layout.device
            if column_partials(plan, device.type == "cpu") == 1:
                continue
            key = (column_partials(plan, device.type == "cpu"), int(plan.rnumel),
                   f"device{devices.index(str(device))}")
            names = self.spaces.setdefault(key, [])
            for st in plan.column_sums:
                self.slot[st.buffer] = (list(self.spaces).index(key), len(names))
                self.shapes[st.buffer] = program.buffer(st.buffer).layout.concrete_shape()
                names.append(st.buffer)
        self.summed = [0] * len(self.spaces)  # slots summed so far, per workspace
        self.written = [0] * len(self.spaces)

    def allocate(self, w: CodeWriter) -> None:
        """The workspaces, allocated when the call starts."""
        for j, ((programs, columns, device), names) in enumerate(self.spaces.items()):
            span = -(-programs * columns // ALIGN) * ALIGN
            w.line(f"colpart{j} = empty_strided(({len(names)}, {programs}, {columns}), "
                   f"({span}, {columns}, 1), dtype=torch.float32, device={device})"
                   f"  # partial column sums: {', '.join(names)}")

    def argument(self, buffer: str) -> str:
        """What a launch passes for ``buffer``: its slot (the buffer itself if not a
        column sum)."""
        if buffer not in self.slot:
            return buffer
        j, k = self.slot[buffer]
        self.written[j] = max(self.written[j], k + 1)
        return f"colpart{j}[{k}]"

    def sum(self, w: CodeWriter, wanted: set[str] | None) -> list[str]:
        """Sum every written slot not summed yet of each workspace holding a buffer of
        ``wanted`` (None: all); return the buffers made."""
        made = []
        for j, names in enumerate(self.spaces.values()):
            lo, hi = self.summed[j], self.written[j]
            if lo == hi or (wanted is not None and not wanted & set(names[lo:hi])):
                continue
            total = f"colsum{j}_{lo}"
            w.line(f"{total} = colpart{j}[{lo}:{hi}].sum(1)")
            for k in range(lo, hi):
                w.line(f"{names[k]} = {total}[{k - lo}].view({self.shapes[names[k]]})")
                made.append(names[k])
            self.summed[j] = hi
        return made
