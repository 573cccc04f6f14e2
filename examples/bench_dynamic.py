"""Softmax over [R, 1024] float32: the dynamic kernel (one compile for every R) beside a
static one (compiled for that R), eager, and torch.compile with and without dynamic=True.
"dynamic R" has only the rows symbolic (what automatic dynamic shapes give when the batch
varies); "dynamic=True" has the row length symbolic too (a looped reduction).

    python examples/bench_dynamic.py                  # R in 4096, 65536 on the GPU
    python examples/bench_dynamic.py --rows 512 2048  # (CPU default: 1024, 8192)

The dynamic kernel reads R from the input at run time (a size argument, masked blocks);
the static kernel has R baked in.  Both read the input once and write the output once, so
the copy of a tensor of the same size is the ceiling.
"""

from __future__ import annotations

import argparse

import torch

import minicompile
from timing import median_seconds


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=None)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    rows = args.rows or ([4096, 65536] if cuda else [1024, 8192])
    name = torch.cuda.get_device_name() if cuda else "CPU"
    dynamic = minicompile.compile(softmax)  # R marked dynamic below: the rows are symbolic
    every = minicompile.compile(softmax, dynamic=True)  # rows and row length symbolic
    versions = [("eager", softmax), ("minicompile dynamic R", dynamic),
                ("minicompile dynamic=True", every)]
    if not args.no_inductor:
        versions.append(("torch.compile dynamic", torch.compile(softmax, dynamic=True)))
    print(f"softmax over [R, {args.cols}] float32 on {name}")
    print(f"{'R':>7}  {'version':<24}{'ms':>9}{'GB/s':>9}{'of copy':>9}")
    for r in rows:
        x = torch.randn(r, args.cols, device=device)
        minicompile.mark_dynamic(x, 0)
        nbytes = 2 * x.numel() * x.element_size()
        copy_s = median_seconds(lambda: x.clone(), cuda)
        print(f"{r:>7}  {'copy':<24}{copy_s * 1e3:>9.3f}{nbytes / copy_s / 1e9:>9.0f}")
        static = minicompile.compile(softmax, dynamic=False)  # ignores the mark
        per_size = [("minicompile static", static)]
        if not args.no_inductor:
            per_size.append(("torch.compile static", torch.compile(softmax, dynamic=False)))
        expected = softmax(x)
        for label, version in versions + per_size:
            torch.testing.assert_close(version(x), expected, rtol=1e-4, atol=1e-4)
            seconds = median_seconds(lambda: version(x), cuda)
            print(f"{r:>7}  {label:<24}{seconds * 1e3:>9.3f}"
                  f"{nbytes / seconds / 1e9:>9.0f}{copy_s / seconds:>9.0%}")
    print(f"minicompile dynamic R: {len(dynamic.entries)} compile(s) for {len(rows)} sizes, "
          f"dynamic=True: {len(every.entries)}")


if __name__ == "__main__":
    main()
