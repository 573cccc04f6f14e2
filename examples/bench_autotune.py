"""The default mode against mode="max-autotune" on the GPU: per-call time of a few kernels
(pointwise, row and column reductions, a long looped row), and the first call's time
(capture, build and, under max-autotune, the tuning).

    python examples/bench_autotune.py
    MINICOMPILE_LOGS=autotune python examples/bench_autotune.py   # every candidate's time

Each compiled result is checked against eager before it is timed.  Medians from
``triton.testing.do_bench``.  A second run of the script reads the choices from the cache
(``<cache>/autotune``): its max-autotune first calls then time nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import minicompile
from minicompile.runtime import autotune
from timing import median_seconds


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rows() -> list[tuple[str, Callable, tuple]]:
    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, device="cuda", dtype=dtype)

    n, w, b = randn(65536, 1024), randn(1024), randn(1024)
    return [
        ("sin(x) * 2 + 1, 2^24 f32", lambda t: torch.sin(t) * 2 + 1, (randn(1 << 24),)),
        ("gelu, 1000x1000 f32 (ragged)", lambda t: F.gelu(t), (randn(1000, 1000),)),
        ("softmax [8192, 1024] f32", lambda t: torch.softmax(t, -1), (randn(8192, 1024),)),
        ("layer_norm [65536, 1024] f32", lambda t, a, c: F.layer_norm(t, (1024,), a, c),
         (n, w, b)),
        ("column sum [8192, 4096] f32", lambda t: t.sum(0), (randn(8192, 4096),)),
        ("row sum [256, 65536] f32 (looped)", lambda t: t.sum(1), (randn(256, 65536),)),
        ("rms_norm [16384, 4096] bf16", rms_norm,
         (randn(16384, 4096, dtype=torch.bfloat16), randn(4096, dtype=torch.bfloat16))),
    ]


def first_call(fn: Callable, args: tuple) -> tuple[object, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> None:
    print(f"{torch.cuda.get_device_name()}; times per call (us), first call (s)")
    print(f"{'kernel':38} {'eager':>8} {'default':>8} {'autotune':>9} {'speed-up':>8} "
          f"{'1st default':>11} {'1st autotune':>12}")
    for name, fn, args in rows():
        eager = median_seconds(lambda: fn(*args), cuda=True)
        times, firsts = [], []
        for mode in (None, "max-autotune"):
            compiled = minicompile.compile(fn, mode=mode)
            out, first = first_call(compiled, args)
            torch.testing.assert_close(out, fn(*args), atol=2e-2, rtol=2e-2)
            times.append(median_seconds(lambda: compiled(*args), cuda=True))
            firsts.append(first)
        print(f"{name:38} {eager * 1e6:8.1f} {times[0] * 1e6:8.1f} {times[1] * 1e6:9.1f} "
              f"{times[0] / times[1]:7.2f}x {firsts[0]:11.2f} {firsts[1]:12.2f}")
    print(f"size classes tuned: {autotune.counters['tuned']}, "
          f"read from the cache: {autotune.counters['from_disk']}")


if __name__ == "__main__":
    main()
