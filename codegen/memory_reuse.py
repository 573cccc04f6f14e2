"""Buffers' memory in a generated wrapper: which buffers outlive their kernel, a kernel
output that takes over the tensor of a dead buffer of the same layout (Inductor's wrapper
does the same), so the host allocates less and the memory is known to be free (kernels run
in order on one stream), and a backward's outputs kept across calls.  Shared by the Python
wrapper (codegen/wrapper.py) and the exported library's (codegen/export_wrapper.py).
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from minicompile.ir import Layout, LoopProgram
from minicompile.spaces import ComboGroup, FusedGroup

# Library calls whose result is a new tensor nothing else holds, and which keep no
# reference to their arguments: their arguments' and results' memory may be reused.
FRESH_RESULTS = frozenset({"torch.matmul", "torch.mm", "torch.bmm", "torch.addmm",
                           "torch.nn.functional.linear"})
# Those that write into a given tensor (``out=``): a pooled output's memory.
OUT_PRODUCTS = FRESH_RESULTS - {"torch.nn.functional.linear"}
# Outputs smaller than this take no memory from the pool: glibc serves them from its heap,
# whose freed blocks the next step takes again without faulting a page in (its default
# mmap threshold, 128 KiB, is where it starts mapping fresh pages), and a take costs three
# allocations' time (5 us against 1.6, a detach among it, one thread): a two-layer BERT or
# BART takes 70 small gradients a step.
MIN_POOLED_BYTES = 128 * 1024


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


def pooled_outputs(program: LoopProgram, groups: list, plans: list, elsewhere: dict[str, str],
                   shape: Callable[[tuple], str], devices: list[str]) -> dict[str, str]:
    """A backward's outputs (its gradients) whose memory its pool keeps across calls
    (runtime/output_pool.py), each by the expression that takes it, at its first place in
    the outputs: the CPU tensors its kernels or a matrix product make (returned, or a view
    of them), not stored ``elsewhere`` (into an input, say), of at least
    :data:`MIN_POOLED_BYTES` (or of unknown size).  A caching allocator does this for GPU
    tensors; convolutions' gradients are ATen's own."""
    sums = {s.buffer for p in plans for s in getattr(p, "column_sums", ())}
    made = {n for p in plans for n in p.outputs if n not in sums}
    made |= {g.extern.name for g in groups if g.extern is not None
             and g.extern.op in OUT_PRODUCTS}
    pooled: dict[str, str] = {}
    for k, out in enumerate(program.outputs):
        out = out if isinstance(out, str) else out.input  # (a view of the buffer: its base)
        lay = program.buffer(out).layout if out in made and out not in elsewhere else None
        if isinstance(lay, Layout) and lay.device.type == "cpu" and lay.offset == 0 \
                and out not in pooled and not _small(lay):
            pooled[out] = (f"pool.take({k}, {shape(lay.shape)}, {shape(lay.stride)}, "
                           f"{lay.dtype}, device{devices.index(str(lay.device))})")
    return pooled


def _small(lay: Layout) -> bool:
    """Whether a buffer of layout ``lay`` is known to be under :data:`MIN_POOLED_BYTES`."""
    numel = sympy.Mul(*lay.shape)
    return bool(numel.is_Integer) and int(numel) * lay.dtype.itemsize < MIN_POOLED_BYTES


def needed_outside(program: LoopProgram, groups: list) -> Callable[[FusedGroup], set[str]]:
    """``needed(group)``: the members of ``group`` that outlive its kernel: returned, read by
    another group (each part of a combo kernel counts as a group of its own), or read by
    none (lowering realizes those only to check their indices)."""
    returned = {o if isinstance(o, str) else o.input for o in program.outputs}
    read_by: dict[str, set[int]] = {}
    for g in groups:
        for part in g.parts if isinstance(g, ComboGroup) else [g]:
            for buf in part.buffers:
                for name in buf.reads():
                    read_by.setdefault(name, set()).add(id(part))

    def needed(group: FusedGroup) -> set[str]:
        # A buffer nothing reads is there for its index checks (an unused embedding).
        return {b.name for b in group.buffers if b.name in returned or b.name not in read_by
                or read_by[b.name] - {id(group)}}

    return needed
