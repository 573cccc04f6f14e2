"""How a C++ kernel's loops are shared among threads: the one place of that policy.

**How many threads: torch's, at each call.**  The kernels link libgomp by its soname, which
torch's own copy already answers to in the process: one OpenMP runtime, so a parallel region
has ``torch.get_num_threads()`` threads as read when it runs, as eager's kernels, and no
count is compiled in (tests/codegen/test_threads.py checks the runtime is shared).

**Which loops** (Inductor's ``decide_parallel_depth``, with a cost per element): a kernel
whose work is under ``MIN_PARALLEL_WORK``, or under ``MIN_THREAD_WORK`` a thread, runs on
the calling thread; otherwise the outer loops are collapsed into one parallel loop until it
has an iteration for each thread the machine runs, no deeper than leaves
``MIN_CHUNK_WORK`` an iteration (static schedule).
With symbolic sizes an ``if()`` clause decides at run time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import sympy
import torch

from minicompile.ir import Cast, Load, Op, walk

from minicompile.codegen.common import KernelPlan
from minicompile.codegen.printers import cpp_index

# A 32768-element copy (a load and a store an element): below it one thread is faster.
MIN_PARALLEL_WORK = 65536
# And each thread's share at least an 8192-element copy, as Inductor asks 4096 elements a
# thread (cpp.min_chunk_size): on 16 threads, GPT-2's 24x256 GELU kernels (6,144 elements,
# ~90k of work) ran in OpenMP regions of 16 and the zoo's kernels took 3x their one-thread
# time.  On 2 threads MIN_PARALLEL_WORK is the larger bar: nothing changes there.
MIN_THREAD_WORK = 16384
# Work of one iteration of the parallel loop, below which collapsing deeper stops.
MIN_CHUNK_WORK = 4096
# Math functions cost about ten arithmetic ops an element (vectorised, libmvec).
EXPENSIVE = frozenset("exp exp2 expm1 log log2 log1p sin cos tan tanh erf sigmoid pow".split())
EXPENSIVE_COST = 10
UNKNOWN_SIZE = 8192  # a symbolic size without a traced value (Inductor's fallback hint)
CACHE_LINE = 64  # bytes


@dataclasses.dataclass(frozen=True)
class Parallel:
    """The outer ``depth`` loops of a nest run as one parallel loop (0: no OpenMP region);
    ``condition``: the C++ test of its run-time ``if()`` clause, for symbolic sizes."""

    depth: int = 0
    condition: str | None = None
    chunk: int = 0  # iterations a thread takes at once (0: an equal share each)

    def pragma(self, simd: bool = False) -> str:
        """The ``#pragma omp`` words of the outermost loop (``simd``: it is also the
        vectorised loop)."""
        words = ["parallel for"] + (["simd"] if simd else [])
        if self.depth > 1:
            words.append(f"collapse({self.depth})")
        if self.chunk:
            words.append(f"schedule(static, {self.chunk})")
        if self.condition:
            words.append(f"if({self.condition})")
        return " ".join(words)


def element_cost(plan: KernelPlan) -> int:
    """The estimated cost of one element of ``plan``'s innermost loop: one a load, store,
    cast or arithmetic op, ``EXPENSIVE_COST`` a math function."""
    cost = len(plan.stores)
    seen: set[int] = set()
    for store in plan.stores:
        for e in walk(store.value):
            if id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, Op):
                cost += EXPENSIVE_COST if e.op in EXPENSIVE else 1
            elif isinstance(e, (Load, Cast)):
                cost += 1
    return cost


def planned_threads() -> int:
    """The most threads a kernel compiled now is expected to run on."""
    return max(torch.get_num_threads(), os.cpu_count() or 1)


def kernel_work(plan: KernelPlan) -> sympy.Expr:
    """The estimated work of ``plan``: its elements (kept and reduced) times
    :func:`element_cost`."""
    return plan.numel * sympy.Max(plan.rnumel, 1) * element_cost(plan)


def parallel_bar() -> int:
    """The least work an OpenMP region pays for on :func:`planned_threads` threads."""
    return max(MIN_PARALLEL_WORK, planned_threads() * MIN_THREAD_WORK)


def plan_parallel(plan: KernelPlan, loops: Sequence[sympy.Expr],
                  loop_vars: Sequence[sympy.Symbol] = ()) -> Parallel:
    """Which of the outer ``loops`` (their trip counts, outermost first: the loops that may
    be shared, never an inner ``simd`` loop) run in parallel, for :func:`planned_threads`
    threads.  The work is ``plan``'s elements (kept and reduced) times
    :func:`element_cost`.  ``loop_vars``: the variables of the first of ``loops`` where
    they are the plan's (the stores' indices tell how many iterations fill a cache line)."""
    threads = planned_threads()
    work = kernel_work(plan)
    hints = {s: sympy.Integer(v) for s, v in plan.hints.items()}

    def value(e: sympy.Expr) -> int:
        e = sympy.sympify(e).xreplace(hints)
        return int(e) if e.is_Integer else UNKNOWN_SIZE

    total = value(work)
    bar = parallel_bar()
    if work.is_Integer and total < bar:
        return Parallel()  # too little work (for so many threads): one thread
    depth, par = 0, 1
    for trips in loops:
        if par >= 2 * threads or par == threads:
            break  # an iteration for each thread
        if depth and total // (par * value(trips)) < MIN_CHUNK_WORK:
            break  # deeper, each iteration would be too small to share
        depth, par = depth + 1, par * value(trips)
    if par < 2:
        return Parallel()  # one iteration: nothing to share
    condition = None if work.is_Integer else f"{cpp_index(work)} >= {bar}"
    # Equal shares of fewer iterations than a cache line's stores span: whole lines each.
    line = line_iterations(plan, loop_vars[depth - 1]) if len(loop_vars) >= depth else 1
    return Parallel(depth, condition, line if 1 < line and par // threads < line else 0)


def line_iterations(plan: KernelPlan, x: sympy.Symbol) -> int:
    """Consecutive iterations of loop ``x`` whose stores fall in one cache line (1 where
    each store steps a line or more along ``x``).  Threads sharing ``x`` take that many at
    once, so none writes into another's lines: mlp_mixer's layer norms, over a residual
    stored transposed (one row a token, its elements 16 tokens apart), shared their 32 rows
    two a thread on 16 threads, and ran no faster than on one."""
    need = 1
    for store in plan.stores:
        step = sympy.expand(store.index).coeff(x) if store.level != "c" else sympy.Integer(0)
        if step.is_Integer and step != 0:
            size = abs(int(step)) * store.dtype.itemsize
            need = max(need, -(-CACHE_LINE // size))
    return need
