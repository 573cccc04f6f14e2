"""In-place stores: a kernel output that is only copied back into a mutated input (capture's
write-backs of in-place ops on inputs: ``p.mul_(0.9)``) is stored straight into that input's
memory; rebuild's ``copy_`` then copies a tensor onto itself, which PyTorch skips.

Legal (:func:`why_not`) when the output is a pointwise kernel's buffer with the input's
exact layout, returned for nothing but the write-back, and every read of the input is in
that kernel at the element it stores (the emitters compute every value before any store).
"""

from __future__ import annotations

from minicompile.ir import Buffer, ComputedBuffer, ExternKernel, Load, LoopProgram, walk
from minicompile.spaces import FusedGroup, canonical, store_index


Reads = dict[str, list[tuple[FusedGroup, Buffer, Load | None]]]


def readers(groups: list[FusedGroup]) -> Reads:
    """Buffer name -> every (group, member, load) that reads it (load None: a library
    call's argument)."""
    found: Reads = {}
    for g in groups:
        for member in g.buffers:
            if isinstance(member, ExternKernel):
                for name in member.reads():
                    found.setdefault(name, []).append((g, member, None))
                continue
            assert isinstance(member, ComputedBuffer)
            for e in walk(member.body):
                if isinstance(e, Load):
                    found.setdefault(e.buffer, []).append((g, member, e))
    return found


def why_not(program: LoopProgram, groups: list[FusedGroup], reads: Reads, out: str,
            inp: str) -> str | None:
    """Why output buffer ``out`` cannot be stored into input buffer ``inp`` (None: it can).
    ``reads``: :func:`readers` of the groups."""
    names = [o if isinstance(o, str) else None for o in program.outputs]
    if names.count(out) != 1:
        return "the value is also returned"
    if any(not isinstance(o, str) and o.input == inp for o in program.outputs) or inp in names:
        return "the input is returned"
    group = next((g for g in groups if any(b.name == out for b in g.buffers)), None)
    if group is None or group.extern is not None or group.has_reduction:
        return "not made by a pointwise kernel"
    buf = program.buffer(out)
    if buf.layout != next(b for b in program.inputs if b.name == inp).layout:
        return "another layout than the input"
    places = group.placements()
    if places is None:
        return "the group has no common iteration space"
    want = store_index(buf, places[out])  # type: ignore[arg-type]
    for g, member, load in reads.get(inp, []):
        if load is None:
            return f"library call {member.name} reads the input"
        if g is not group:
            return f"{member.name} in another kernel reads the input"
        if canonical(load.index, places[member.name]) != want:
            return f"{member.name} reads other elements of the input"
    return None


def stores_in_place(
    program: LoopProgram, groups: list[FusedGroup], writebacks: tuple[tuple[int, int], ...],
    log: list[str] | None = None,
) -> dict[str, str]:
    """Output buffer -> the input buffer it is stored into, for every legal write-back."""
    chosen: dict[str, str] = {}
    reads = readers(groups)
    for k, j in writebacks:
        out, inp = program.outputs[k], program.inputs[j].name
        if not isinstance(out, str) or inp in chosen.values():
            continue
        reason = why_not(program, groups, reads, out, inp)
        if log is not None:
            log.append(f"store {out} into {inp}" if reason is None
                       else f"copy {out} back into {inp}: {reason}")
        if reason is None:
            chosen[out] = inp
    return chosen
