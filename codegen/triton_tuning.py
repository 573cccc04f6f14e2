"""Launch configurations to try for a Triton kernel under ``mode="max-autotune"``.

:func:`tune_plan` lists a few candidates around the heuristic's, which comes first (blocks,
warps and stages doubled and halved; the other kind of reduction kernel; under the
interpreter only blocks).  Each kind's kernel text is emitted once with the masks every
candidate of that kind needs, so all compute the same values; :func:`_valid` leaves out
the invalid and pointless ones.  The runtime times them (minicompile/runtime/autotune.py).
"""

from __future__ import annotations

import dataclasses
import hashlib

from minicompile.codegen import triton, triton_reduction
from minicompile.codegen.common import KernelPlan

TRITON_MAX_NUMEL = 1 << 20  # elements of a block, at most (Triton's TRITON_MAX_TENSOR_NUMEL)
# A candidate's block, at most (the heuristic's may be larger): on a GPU a wider block only
# spills registers; the interpreter runs one program at a time, so there wider is faster.
GPU_BLOCK_LIMIT = 1 << 14
INTERPRET_BLOCK_LIMIT = 1 << 17
MAX_WARPS = 16


@dataclasses.dataclass(frozen=True)
class Candidate:
    kind: str  # "pointwise" | "persistent" | "looped"
    xblock: int
    rblock: int | None = None
    warps: int | None = None  # None: Triton's default (4), as the default mode launches
    stages: int | None = None  # None: Triton's default (3)

    def options(self) -> dict[str, int]:
        options = {"XBLOCK": self.xblock, "RBLOCK": self.rblock, "num_warps": self.warps,
                   "num_stages": self.stages}
        return {key: value for key, value in options.items() if value is not None}


@dataclasses.dataclass(frozen=True)
class TunedKernel:
    """A kernel's texts (one per kind its candidates use, the heuristic's kind under the
    plan's own name) and candidates (the heuristic's first)."""

    plan: KernelPlan
    candidates: tuple[Candidate, ...]
    texts: dict[str, str]  # kind -> kernel text
    names: dict[str, str]  # kind -> kernel name

    def source_hash(self) -> str:
        """The kernel's identity for the tuning cache: its texts and the helpers they call,
        the names left out (identical kernels under other names share their tuning)."""
        texts = [t.replace(self.plan.name, "KERNEL") for t in self.texts.values()]
        text = "\0".join(triton.helpers_for(texts) + texts)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _static(n) -> int | None:
    return int(n) if n.is_Integer else None


def _valid(c: Candidate, xnumel: int | None, rnumel: int | None, interpret: bool) -> bool:
    limit = INTERPRET_BLOCK_LIMIT if interpret else GPU_BLOCK_LIMIT
    rblock = c.rblock or 1
    if c.xblock < 1 or c.xblock & (c.xblock - 1) or rblock & (rblock - 1):
        return False  # tl.arange takes powers of two
    if c.rblock is not None and c.rblock < 2:
        return False
    if c.xblock * rblock > min(limit, TRITON_MAX_NUMEL):
        return False
    if c.warps is not None and not 1 <= c.warps <= MAX_WARPS:
        return False
    if c.stages is not None and (c.kind != "looped" or not 1 <= c.stages <= 4):
        return False  # stages pipeline a loop's loads: only looped kernels have one
    if c.kind == "pointwise" and c.xblock < 16:
        return False
    if xnumel is not None and c.xblock > max(1, triton.pow2(xnumel)):
        return False  # a block wider than every row: the same as a narrower one
    if rnumel is not None and c.kind == "looped" and c.rblock > triton.pow2(rnumel):
        return False
    return True


def pointwise_candidates(plan: KernelPlan, interpret: bool) -> list[Candidate]:
    b = triton.block_size(triton.planning_size(plan.numel, plan.hints), interpret)
    if interpret:  # (the interpreter ignores warps)
        return [Candidate("pointwise", b), Candidate("pointwise", b // 2),
                Candidate("pointwise", b * 2)]
    w = triton.POINTWISE_WARPS
    return [Candidate("pointwise", b, warps=w), Candidate("pointwise", b // 2, warps=w),
            Candidate("pointwise", b * 2, warps=w), Candidate("pointwise", b, warps=w * 2),
            Candidate("pointwise", b, warps=w // 2), Candidate("pointwise", b * 2, warps=w * 2)]


def reduction_candidates(plan: KernelPlan, interpret: bool) -> list[Candidate]:
    x, r, w, persistent = triton_reduction.plan_blocks(plan, interpret)
    rnumel = _static(plan.rnumel)
    if persistent:
        kind = "persistent"
        found = [Candidate(kind, x, r, w), Candidate(kind, x // 2, r, w),
                 Candidate(kind, x * 2, r, w)]
        if not interpret:
            found += [Candidate(kind, x, r, w // 2), Candidate(kind, x, r, w * 2)]
        if r >= 64:  # the row in two and in four loads
            found += [Candidate("looped", x, r // 2, w), Candidate("looped", x, r // 4, w)]
        return found
    kind = "looped"
    found = [Candidate(kind, x, r, w), Candidate(kind, x, r // 2, w),
             Candidate(kind, x, r * 2, w)]
    if not interpret:
        found += [Candidate(kind, x, r, w // 2), Candidate(kind, x, r, w * 2),
                  Candidate(kind, x, r, w, 1), Candidate(kind, x, r, w, 4)]
    if rnumel is not None:  # a whole row in one block, where it fits
        whole = max(2, triton.pow2(rnumel))
        warps = w if interpret else 16 if x * whole >= 8192 else 8
        found.append(Candidate("persistent", x, whole, warps))
    return found


def tune_plan(plan: KernelPlan, interpret: bool) -> TunedKernel:
    """The candidates of ``plan`` and its kernel texts."""
    xnumel, rnumel = _static(plan.numel), _static(plan.rnumel)
    listed = (reduction_candidates if plan.is_reduction else pointwise_candidates)(
        plan, interpret)
    found: list[Candidate] = [listed[0]]  # the heuristic's, whatever the limits say
    for c in listed[1:]:
        if c not in found and _valid(c, xnumel, rnumel, interpret):
            found.append(c)
    texts: dict[str, str] = {}
    names: dict[str, str] = {}
    for kind in dict.fromkeys(c.kind for c in found):
        name = plan.name if kind == found[0].kind else f"{plan.name}_{kind}"
        variant = dataclasses.replace(plan, name=name)
        if kind == "pointwise":
            blocks = tuple(c.xblock for c in found)
            texts[kind] = triton.emit_kernel(variant, interpret, blocks)
        else:
            pairs = tuple((c.xblock, c.rblock) for c in found if c.kind == kind)
            texts[kind] = triton_reduction.TritonReductionKernel(
                variant, interpret, persistent=kind == "persistent", blocks=pairs).emit()
        names[kind] = name
    return TunedKernel(plan, tuple(found), texts, names)


def autotuner_lines(tuned: TunedKernel, written: tuple[int, ...],
                    launcher: str | None, extra: str) -> list[str]:
    """The wrapper's definition of the kernel's Autotuner (runtime/autotune.py):
    ``written``, the positions of the launch's arguments the kernel stores into (tuned on
    copies); ``launcher``, the GPU Launcher's arguments after the kernel (None under the
    interpreter); ``extra``, options every candidate takes (``, debug=True``...)."""
    name = tuned.plan.name
    lines = [
        "# max-autotune: the launch configuration is tuned at the first run of each size class",
        "# (runtime/autotune.py), among these candidates; the first is the heuristic's",
        f'{name}_tuned = Autotuner("{name}", "{tuned.source_hash()}", (',
    ]
    for k, c in enumerate(tuned.candidates):
        options = ", ".join(f"{key}={value}" for key, value in c.options().items())
        note = "  # the heuristic default" if k == 0 else ""
        lines.append(f"    Choice({tuned.names[c.kind]}, {options}{extra}),{note}")
    tail = ", in_place=True" if tuned.plan.in_place else ""
    tail += f", launcher={launcher}" if launcher is not None else ""
    lines.append(f"), written={written}{tail})")
    return lines
