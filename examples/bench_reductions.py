"""Reductions over outer dims and over everything: bias gradients, layer-norm weight
gradients, column sums, a layer norm's whole backward, a full sum.  Eager, torch.compile (on a GPU) and minicompile, with
the bandwidth minicompile reaches (the inputs read once).

    python examples/bench_reductions.py      # CUDA when available, else CPU at smaller sizes
"""

from __future__ import annotations

import torch

import minicompile
from timing import median_seconds


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def norm_weight_grad(g: torch.Tensor, xhat: torch.Tensor) -> torch.Tensor:
    return (g * xhat).sum((0, 1))


def norm_backward(g: torch.Tensor, xhat: torch.Tensor, w: torch.Tensor) -> tuple:
    """A layer norm's backward (rstd folded away): the input gradient, row by row, and the
    weight and bias gradients, sums over the rows (one kernel: passes/mix_order.py)."""
    gw = g * w
    dx = gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True)
    return dx, (g * xhat).sum(0), g.sum(0)


def total(x: torch.Tensor) -> torch.Tensor:
    return x.sum()


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    scale = 1 if cuda else 8  # CPU: every size / 8 along its first dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape[0] // scale, *shape[1:], device=device)

    cases = [
        ("x.sum(0), [32768, 8192]", column_sum, (randn(32768, 8192),)),
        ("x.sum(0), [4096, 512] (a bias gradient)", column_sum, (randn(4096, 512),)),
        ("x.sum(0), [4096, 2048]", column_sum, (randn(4096, 2048),)),
        ("(g * xhat).sum((0, 1)), [16, 256, 512]", norm_weight_grad,
         (randn(16, 256, 512), randn(16, 256, 512))),
        ("layer-norm backward, [4096, 512]", norm_backward,
         (randn(4096, 512), randn(4096, 512), torch.randn(512, device=device))),
        ("x.sum(), 2^26", total, (randn(1 << 26),)),
    ]
    print(f"{'':42} {'eager us':>9} {'t.compile':>9} {'minicompile':>11} {'GB/s':>6}")
    for name, fn, args in cases:
        compiled = minicompile.compile(fn)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-4, atol=1e-2)
        versions = [fn, torch.compile(fn)] if cuda else [fn]
        times = [median_seconds(lambda f=f: f(*args), cuda) * 1e6 for f in versions]
        mc = median_seconds(lambda: compiled(*args), cuda) * 1e6
        inductor = f"{times[1]:9.1f}" if cuda else f"{'':>9}"
        gbs = sum(a.numel() * a.element_size() for a in args) / (mc * 1e-6) / 1e9
        print(f"{name:42} {times[0]:9.1f} {inductor} {mc:11.1f} {gbs:6.0f}")
    s = minicompile.stats()
    print(f"minicompile: kernels {s['kernels']}, eager fallbacks {s['eager_fallbacks']}")


if __name__ == "__main__":
    main()
