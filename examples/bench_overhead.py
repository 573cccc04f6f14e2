"""Per-call overhead of a compiled one-kernel function: guards plus dispatch plus launch.

    python examples/bench_overhead.py

Times ``torch.sin(x) + 1`` on a 16-element tensor, where the work is nothing and the cost is
all overhead: eager PyTorch, minicompile (whole call, and the generated ``call()`` alone,
which is what is left without guards), and torch.compile, on the GPU when there is one.
"""

from __future__ import annotations

import statistics
import time

import torch

import minicompile


def fn(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + 1


def per_call_us(f, x: torch.Tensor, calls: int = 2000, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean wall time per call (synchronised at the end)."""
    for _ in range(200):
        f(x)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            f(x)
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(16, device=device)
    compiled = minicompile.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    entry = compiled.entries[0]
    call = entry.call
    check = entry.capture.guards.check
    rows = [
        ("eager", fn),
        ("minicompile", compiled),
        ("  guards only", check),
        ("  generated call()", lambda t: call([t])),
    ]
    try:
        inductor = torch.compile(fn)
        torch.testing.assert_close(inductor(x), fn(x))
        rows.append(("torch.compile", inductor))
    except Exception as e:  # noqa: BLE001 - report, don't fail the benchmark
        print(f"torch.compile unavailable: {type(e).__name__}: {e}")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"per-call time of sin(x) + 1 on 16 float32 elements, {name}")
    print(f"{'version':<22}{'us/call':>10}")
    for label, f in rows:
        print(f"{label:<22}{per_call_us(f, x):>10.2f}")


if __name__ == "__main__":
    main()
