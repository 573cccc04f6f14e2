"""layer_norm and softmax over [rows, 1024] float32: minicompile beside eager PyTorch and
torch.compile, with the fraction of the measured copy bandwidth each reaches.

    python examples/layernorm.py              # [65536, 1024] on the GPU, [8192, 1024] on CPU
    python examples/layernorm.py --rows 4096
    MINICOMPILE_TRACE=1 python examples/layernorm.py --rows 64 --no-inductor  # one kernel each

Each function reads the input once and writes the output once (layer_norm also reads its
weight and bias, 8 KB), so the copy of a tensor of the same size is the ceiling.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import minicompile
from timing import median_seconds


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    rows = args.rows or (65536 if cuda else 8192)
    x = torch.randn(rows, args.cols, device=device)
    w = torch.randn(args.cols, device=device)
    b = torch.randn(args.cols, device=device)
    nbytes = 2 * x.numel() * x.element_size()
    copy_s = median_seconds(lambda: x.clone(), cuda)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"[{rows}, {args.cols}] float32 on {name}; copy: {copy_s * 1e3:.3f} ms "
          f"({nbytes / copy_s / 1e9:.0f} GB/s)")
    print(f"{'function':<12}{'version':<16}{'ms':>9}{'GB/s':>9}{'of copy':>9}")
    for fn, inputs in ((layer_norm, (x, w, b)), (softmax, (x,))):
        expected = fn(*inputs)
        versions = [("eager", fn), ("minicompile", minicompile.compile(fn))]
        if not args.no_inductor:
            versions.append(("torch.compile", torch.compile(fn)))
        for label, version in versions:
            torch.testing.assert_close(version(*inputs), expected, rtol=1e-4, atol=1e-4)
            seconds = median_seconds(lambda: version(*inputs), cuda)
            print(f"{fn.__name__:<12}{label:<16}{seconds * 1e3:>9.3f}"
                  f"{nbytes / seconds / 1e9:>9.0f}{copy_s / seconds:>9.0%}")
    print(f"minicompile stats: {minicompile.stats()}")


if __name__ == "__main__":
    main()
