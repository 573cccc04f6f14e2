"""The column sums of a graph's Triton kernels that walk rows (mix-order reductions,
passes/mix_order.py): where their partials live and when the wrapper sums them.

Such a kernel writes each column sum as one row of partials per program (its chunk of
rows), not the sum itself.  The wrapper gives every column sum of the graph a slot of one
float32 workspace per (programs, columns) shape, allocated when the call starts, and sums
the slots written so far with one call just before a kernel reads one of them, or before
the graph returns: a transformer's backward, whose layers share one shape, sums all its
layer-norm and bias gradients with one call instead of one per layer.
"""

from __future__ import annotations

from collections.abc import Callable

from minicompile.codegen.common import KernelPlan
from minicompile.codegen.triton_reduction import column_partials

ALIGN = 64  # floats between slots: each slot starts 256-byte aligned


class ColumnPartials:
    """``plans``: the graph's kernel plans in launch order; ``interpreted(plan)``: whether
    it runs under Triton's interpreter; ``device(plan)``: the wrapper's name for its
    device; ``shape(buffer)``: a column sum's shape as text."""

    def __init__(self, plans: list, interpreted: Callable[[KernelPlan], bool],
                 device: Callable[[KernelPlan], str], shape: Callable[[str], str]) -> None:
        self.shape = shape
        self.spaces: dict[tuple[int, int, str], list[str]] = {}
        self.slot: dict[str, tuple[int, int]] = {}  # buffer -> (workspace, slot)
        for plan in plans:
            if not isinstance(plan, KernelPlan) or not plan.column_sums:
                continue
            key = (column_partials(plan, interpreted(plan)), int(plan.rnumel), device(plan))
            names = self.spaces.setdefault(key, [])
            for st in plan.column_sums:
                self.slot[st.buffer] = (list(self.spaces).index(key), len(names))
                names.append(st.buffer)
        self.summed = [0] * len(self.spaces)  # slots summed so far, per workspace
        self.written = [0] * len(self.spaces)

    def allocations(self) -> list[str]:
        """The workspaces, allocated when the call starts."""
        lines = []
        for j, ((programs, columns, device), names) in enumerate(self.spaces.items()):
            span = -(-programs * columns // ALIGN) * ALIGN
            lines.append(f"colpart{j} = empty_strided(({len(names)}, {programs}, {columns}), "
                         f"({span}, {columns}, 1), dtype=torch.float32, device={device})"
                         f"  # partial column sums: {', '.join(names)}")
        return lines

    def argument(self, buffer: str) -> str:
        """What a launch passes for ``buffer``: its slot (the buffer itself if not a
        column sum)."""
        if buffer not in self.slot:
            return buffer
        j, k = self.slot[buffer]
        self.written[j] = max(self.written[j], k + 1)
        return f"colpart{j}[{k}]"

    def sums(self, wanted: set[str] | None) -> tuple[list[str], list[str]]:
        """The lines that sum every written slot not summed yet of each workspace holding a
        buffer of ``wanted`` (None: all), and the buffers they make."""
        lines, made = [], []
        for j, names in enumerate(self.spaces.values()):
            lo, hi = self.summed[j], self.written[j]
            if lo == hi or (wanted is not None and not wanted & set(names[lo:hi])):
                continue
            total = f"colsum{j}_{lo}"
            lines.append(f"{total} = colpart{j}[{lo}:{hi}].sum(1)")
            for k in range(lo, hi):
                lines.append(f"{names[k]} = {total}[{k - lo}].view({self.shape(names[k])})")
                made.append(names[k])
            self.summed[j] = hi
        return lines, made
