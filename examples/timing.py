"""Timing helpers shared by the examples and benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], cuda: bool, reps: int = 20) -> float:
    """Median time of ``fn`` after warm-up: CUDA events through Triton's do_bench on the
    GPU, the wall clock on the CPU."""
    for _ in range(3):
        fn()
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
