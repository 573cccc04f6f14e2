"""Timing helpers shared by the examples and benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], cuda: bool, reps: int = 20,
                   clock: Callable[[], float] = time.perf_counter, rep_ms: int = 200) -> float:
    """Median time of ``fn`` after warm-up: CUDA events through Triton's do_bench on the
    GPU, ``clock`` on the CPU (the wall clock; ``time.thread_time`` counts only this
    thread's CPU time: on one thread, a shared machine's waits left out)."""
    for _ in range(3):
        fn()
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") / 1e3
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def interleaved_ms(fns: dict[str, Callable[[], object]], cuda: bool, rounds: int = 7,
                   clock: Callable[[], float] = time.perf_counter,
                   round_ms: float = 50.0) -> dict[str, float]:
    """Median milliseconds of each of ``fns``, timed in turns: ``rounds`` rounds, each
    timing every function once (:func:`median_seconds`), and the median of each one's
    round medians.  A shared host's load and clocks drift over seconds; timed in turns,
    the drift falls on every function alike instead of on whichever ran during it.  On
    the CPU each round times a function's calls for about ``round_ms`` (at least 5 calls):
    a 2 ms train step gets 25 calls a round, not 5."""
    reps = {name: 4 for name in fns}
    if not cuda:
        for name, fn in fns.items():
            fn()
            start = clock()
            fn()
            took = max(clock() - start, 1e-6)
            reps[name] = max(5, min(200, round(round_ms / 1e3 / took)))
    per: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(median_seconds(fn, cuda, reps=reps[name], clock=clock, rep_ms=60))
    return {name: statistics.median(times) * 1e3 for name, times in per.items()}


def host_and_device_ms(fn: Callable[[], object], reps: int = 20) -> tuple[float, float]:
    """(host, device) milliseconds of one call on the GPU.  Host: the median wall time until
    ``fn`` returns, started on an idle GPU (the Python, guards and launches; the GPU's work
    is asynchronous).  Device: the GPU's busy time per call, the kernels and copies that
    PyTorch's profiler sees.  A model whose host time exceeds its device time is bound by
    the host: its GPU waits for launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        host.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    busy_us = sum(e.time_range.elapsed_us() for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA)
    return statistics.median(host) * 1e3, busy_us / reps / 1e3
