"""The PyTorch 2.0 tutorial's first example, compiled with minicompile.

    python examples/trig.py                      # compile, run, check against eager
    MINICOMPILE_TRACE=1 python examples/trig.py  # also print graphs and generated kernels

Runs on the GPU (Triton kernels) when there is one, on the CPU (C++ kernels) otherwise.
"""

import torch

import minicompile


@minicompile.compile
def fn(x, y):
    a = torch.sin(x)
    b = torch.sin(y)
    return a + b


@minicompile.compile
def sin_sin(x):
    return torch.sin(torch.sin(x))


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for _ in range(3):  # fresh inputs each time: the first call compiles, later ones reuse
        x = torch.randn(10000, device=device)
        y = torch.randn(10000, device=device)
        torch.testing.assert_close(fn(x, y), torch.sin(x) + torch.sin(y))
        torch.testing.assert_close(sin_sin(x), torch.sin(torch.sin(x)))
    s = minicompile.stats()
    print(f"device: {device}")
    print(f"fn(x, y) and sin(sin(x)) match eager on 3 fresh inputs each")
    print(f"graphs compiled: {s['graphs']}, kernels: {s['kernels']}, "
          f"cache hits: {s['cache_hits']}, eager fallbacks: {s['eager_fallbacks']}")
    if s["eager_fallbacks"]:
        raise SystemExit("a function ran eagerly: run with MINICOMPILE_LOGS=graph_breaks to see why")


if __name__ == "__main__":
    main()
