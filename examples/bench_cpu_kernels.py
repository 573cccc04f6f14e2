"""The C++ backend's three kernel shapes on the CPU: a pointwise chain, row reductions and an
outer-dimension reduction, over [4096, 1024] float32 (16 MB an input), beside eager (and
torch.compile with ``--inductor``: its first compile takes ~20 s a case on a small CPU).

    python examples/bench_cpu_kernels.py                 # torch.get_num_threads() threads
    python examples/bench_cpu_kernels.py --threads 1 --dtype bfloat16
    python examples/bench_cpu_kernels.py --threads 1 --cpu-time --shape 64,1024  # in cache

Prints the median milliseconds of each version over ``--reps`` calls, each checked against
eager first.
"""

from __future__ import annotations

import argparse
import time

import torch

import minicompile
from timing import median_seconds


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * torch.tanh(y) + x.exp()


def softmax(x: torch.Tensor) -> torch.Tensor:
    return x.softmax(-1)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


CASES = (("sigmoid(x)*tanh(y)+exp(x)", chain, 2), ("x.softmax(-1)", softmax, 1),
         ("x.sum(-1)", row_sum, 1), ("x.sum(0)", column_sum, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--inductor", action="store_true", help="time torch.compile too")
    parser.add_argument("--shape", default="4096,1024", help="rows,columns")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time (a shared machine; --threads 1)")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    clock = time.thread_time if args.cpu_time else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{list(shape)} {args.dtype}, {torch.get_num_threads()} threads, median ms of "
          f"{args.reps}")
    heads = ["eager", "minicompile"] + (["torch.compile"] if args.inductor else [])
    print(f"{'case':<28}" + "".join(f"{h:>15}" for h in heads))
    for label, fn, arity in CASES:
        inputs = [torch.randn(*shape, dtype=dtype) for _ in range(arity)]
        versions = [fn, minicompile.compile(fn, backend="cpp")]
        if args.inductor:
            versions.append(torch.compile(fn))
        # Sums accumulate in another order (minicompile's in double) than eager's.
        tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2,
                                                                           "atol": 2e-2}
        row = f"{label:<28}"
        for version in versions:
            torch.testing.assert_close(version(*inputs), fn(*inputs), **tol)
            seconds = median_seconds(lambda: version(*inputs), False, args.reps,  # noqa: B023
                                     clock=clock)
            row += f"{seconds * 1e3:>15.3f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
