"""Time sin(sin(x)) compiled by minicompile beside eager PyTorch and torch.compile.

    python examples/bench_pointwise.py            # 2**28 float32 elements on the GPU
    python examples/bench_pointwise.py --log2 24  # another size (the CPU default is 2**24)

Prints the median time of each version and the memory bandwidth it reaches (one read and
one write of the tensor), plus a device-to-device copy as the ceiling.
"""

from __future__ import annotations

import argparse
import torch

import minicompile
from timing import median_seconds


def sin_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(torch.sin(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log2", type=int, default=None, help="log2 of the element count")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 1 << (args.log2 if args.log2 is not None else (28 if device == "cuda" else 24))
    x = torch.randn(n, device=device)
    bytes_moved = 2 * x.numel() * x.element_size()

    compiled = minicompile.compile(sin_sin)
    torch.testing.assert_close(compiled(x), sin_sin(x))
    kernel_call = compiled.entries[0].call  # the generated wrapper: allocate and launch
    rows = [("copy (ceiling)", lambda: x.clone()), ("eager", lambda: sin_sin(x)),
            ("minicompile", lambda: compiled(x)), ("  its call()", lambda: kernel_call([x]))]
    if not args.no_inductor:
        inductor = torch.compile(sin_sin)
        torch.testing.assert_close(inductor(x), sin_sin(x))
        rows.append(("torch.compile", lambda: inductor(x)))

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"sin(sin(x)), {n} float32 elements (2^{n.bit_length() - 1}) on {name}")
    print(f"{'version':<16}{'median ms':>12}{'GB/s':>10}")
    for label, fn in rows:
        seconds = median_seconds(fn, device == "cuda", args.reps)
        print(f"{label:<16}{seconds * 1e3:>12.3f}{bytes_moved / seconds / 1e9:>10.1f}")
    print(f"minicompile stats: {minicompile.stats()}")


if __name__ == "__main__":
    main()
