"""In-place stores: an output that is only copied back into a mutated input (capture's
write-backs of in-place ops on inputs: ``p.mul_(0.9)``, a KV cache's ``index_copy_``) is
stored straight into that input's memory; rebuild's write-back then finds the input itself
and copies nothing.

Two kinds (:func:`why_not`):

- a pointwise kernel's buffer with the input's exact layout, when every read of the input
  is in that kernel at the element it stores (the emitters compute every value before any
  store); taken where ``pointwise`` (compiled optimizer steps);
- a library call with an in-place variant (:data:`IN_PLACE_LIBRARY`: ``index_copy`` ->
  ``index_copy_``) whose first argument is the input itself: the wrapper calls the variant
  on the input, so every other read of the input must come before it, and the input may
  be no other argument of the call.

Under CUDA graphs the write-backs left are copied at the end of ``call`` (:func:`copies_back`):
a copy the graph replays, not one that rebuild launches from the host at each call (a
static cache's ``cumulative_length += 1``, computed in a reduction kernel whose other
programs still read the old value: 12 launches a GPT-2 decode step).
"""

from __future__ import annotations

from minicompile.ir import (AliasOutput, Buffer, BufferRef, ComputedBuffer, ExternKernel, Load,
                            LoopProgram, walk)
from minicompile.spaces import FusedGroup, store_index

# Library calls (as lowering names them) whose in-place variant, the name with ``_``,
# called on the first argument with the same arguments, leaves in it what the call returns.
IN_PLACE_LIBRARY = frozenset(
    f"torch.Tensor.{name}"
    for name in ("index_copy", "index_put", "index_add", "index_fill", "scatter", "scatter_add",
                 "scatter_reduce", "masked_fill", "masked_scatter", "put")
)

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
            inp: str, pointwise: bool = True) -> str | None:
    """Why output buffer ``out`` cannot be stored into input buffer ``inp`` (None: it can).
    ``reads``: :func:`readers` of the groups; ``pointwise``: kernels may store in place."""
    names = [_returned(o) for o in program.outputs]
    if names.count(out) != 1:
        return "the value is also returned"
    if inp in names or any(not isinstance(o, str) and o.input == inp for o in program.outputs):
        return "the input is returned"
    group = next((g for g in groups if any(b.name == out for b in g.buffers)), None)
    if group is None or group.has_reduction:
        return "not made by a pointwise kernel or a library call"
    buf = program.buffer(out)
    if buf.layout != next(b for b in program.inputs if b.name == inp).layout:
        return "another layout than the input"
    if group.extern is not None:
        return _why_not_library(groups, reads, group, inp)
    if not pointwise:
        return "kernels store in place only in optimizer steps"
    places = group.placements()
    if places is None:
        return "the group has no common iteration space"
    want = store_index(buf, places[out])  # type: ignore[arg-type]
    for g, member, load in reads.get(inp, []):
        if load is None:
            return f"library call {member.name} reads the input"
        if g is not group:
            return f"{member.name} in another kernel reads the input"
        if places[member.name].apply(load.index) != want:
            return f"{member.name} reads other elements of the input"
    return None


def _returned(output: str | AliasOutput) -> str | None:
    """The buffer an output returns as it is (an alias without a layout of its own: a
    library call's result), None for a view."""
    if isinstance(output, str):
        return output
    return output.input if output.layout is None else None


def _why_not_library(groups: list[FusedGroup], reads: Reads, group: FusedGroup,
                     inp: str) -> str | None:
    ext = group.extern
    assert ext is not None
    if ext.op not in IN_PLACE_LIBRARY:
        return f"{ext.op} has no in-place variant here"
    if not ext.args or ext.args[0] != BufferRef(inp):
        return "the library call does not take the input itself first"
    if inp in ExternKernel(ext.name, ext.op, ext.args[1:], ext.kwargs, ext.layout).reads():
        return "the library call reads the input in another argument too"
    order = {id(g): k for k, g in enumerate(groups)}
    for g, member, _ in reads.get(inp, []):
        if g is not group and order[id(g)] > order[id(group)]:
            return f"{member.name} reads the input after the library call"
    return None


def stores_in_place(
    program: LoopProgram, groups: list[FusedGroup], writebacks: tuple[tuple[int, int], ...],
    log: list[str] | None = None, pointwise: bool = True,
) -> dict[str, str]:
    """Output buffer -> the input buffer it is stored into, for every legal write-back
    (``pointwise``: kernels' stores too, else library calls' alone)."""
    chosen: dict[str, str] = {}
    reads = readers(groups)
    for k, j in writebacks:
        out, inp = _returned(program.outputs[k]), program.inputs[j].name
        if out is None or inp in chosen.values():
            continue
        reason = why_not(program, groups, reads, out, inp, pointwise)
        if log is not None:
            log.append(f"store {out} into {inp}" if reason is None
                       else f"copy {out} back into {inp}: {reason}")
        if reason is None:
            chosen[out] = inp
    return chosen


def copies_back(program: LoopProgram, writebacks: tuple[tuple[int, int], ...],
                stored: dict[str, str], log: list[str] | None = None) -> dict[str, str]:
    """Output buffer -> the input that ``call`` copies it into after its last kernel (every
    read of the input's old value done), returning the input in its place, for the
    write-backs not ``stored`` in place whose output and input are returned nowhere else."""
    names = [_returned(o) for o in program.outputs]
    inputs = {b.name for b in program.inputs}
    chosen: dict[str, str] = {}
    for k, j in writebacks:
        out, inp = names[k], program.inputs[j].name
        if (out is None or out in stored or out in inputs or names.count(out) != 1
                or inp in names or inp in stored.values() or inp in chosen.values()
                or any(not isinstance(o, str) and o.input == inp for o in program.outputs)):
            continue
        chosen[out] = inp
        if log is not None:
            log.append(f"copy {out} into {inp} at the end of the call")
    return chosen
