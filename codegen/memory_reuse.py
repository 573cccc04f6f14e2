"""Buffer reuse in a generated wrapper: a kernel's output takes over the tensor of a dead
buffer of the same layout (Inductor's wrapper does the same), so the host allocates less
and the memory is known to be free (kernels run in order on one stream).  Shared by the
Python wrapper (codegen/wrapper.py) and the exported library's (codegen/export_wrapper.py).
"""

from __future__ import annotations

from minicompile.ir import Layout, LoopProgram
from minicompile.spaces import FusedGroup


# Library calls whose result is a new tensor nothing else holds, and which keep no
# reference to their arguments: their arguments' and results' memory may be reused.
FRESH_RESULTS = frozenset({"torch.matmul", "torch.mm", "torch.bmm", "torch.addmm",
                           "torch.nn.functional.linear"})


def reuse_memory(
    program: LoopProgram, groups: list, plan_of: dict, keep: set[str], in_place: dict[str, str],
    own: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Kernel output -> a dead buffer of the same layout whose tensor it takes over, as
    Inductor's wrapper reuses buffers: no allocation on the host, and the memory is known
    to be free (kernels run in order on one stream).  Only buffers this wrapper allocated
    or matrix products made, and only kernels and matrix products read: another library
    call may return a view of its argument or keep it (for its backward, say).  ``own``:
    outputs that keep memory of their own (a backward's pooled gradients)."""
    last_use = last_reads(groups)
    seen_by_library = {n for g in groups if g.extern is not None
                       and g.extern.op not in FRESH_RESULTS for n in g.extern.reads()}
    free: dict[Layout, list[str]] = {}
    owned: set[str] = set()
    reuse: dict[str, str] = {}
    for k, group in enumerate(groups):
        if group.extern is not None and group.extern.op in FRESH_RESULTS:
            owned.add(group.extern.name)
        elif group.extern is None:
            plan = plan_of[group.key]
            sums = {s.buffer for s in getattr(plan, "column_sums", ())}  # made by a sum
            for name in plan.outputs:
                if name in in_place or name in sums or name in own:
                    continue
                pool = free.get(program.buffer(name).layout)
                if pool:
                    reuse[name] = pool.pop()
                owned.add(name)
        for name in sorted(n for n in owned if last_use.get(n, -1) <= k):
            owned.discard(name)
            if name not in keep and name not in seen_by_library:
                layout = program.buffer(name).layout
                free.setdefault(layout, []).append(name)  # type: ignore[arg-type]
    return reuse


def last_reads(groups: list[FusedGroup]) -> dict[str, int]:
    """For each buffer, the position of the last group that reads it."""
    return {name: k for k, group in enumerate(groups) for buf in group.buffers
            for name in buf.reads()}
