"""Global average pools (``adaptive_avg_pool{1,2,3}d(x, 1)``, every CNN's head) as a mean
over the pooled dims (passes/decompose_reductions.py): values, strides and input gradients
match eager's on both backends, twice with fresh inputs, on odd sizes, NCHW and
channels-last inputs, unbatched inputs and 1-d and 3-d pools; and the pool is no library
call after the passes.  Other output sizes stay ATen's call."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import config

CL = torch.channels_last
CASES: dict[str, tuple[Callable[..., torch.Tensor], Callable[[], torch.Tensor], object]] = {
    # name: (the pool, an input, output_size)
    "nchw": (F.adaptive_avg_pool2d, lambda: torch.randn(3, 5, 7, 9), 1),
    "channels_last": (F.adaptive_avg_pool2d,
                      lambda: torch.randn(2, 6, 5, 3).contiguous(memory_format=CL), (1, 1)),
    "unbatched": (F.adaptive_avg_pool2d, lambda: torch.randn(5, 7, 3), 1),
    "pool1d": (F.adaptive_avg_pool1d, lambda: torch.randn(3, 4, 11), 1),
    "pool3d": (F.adaptive_avg_pool3d, lambda: torch.randn(2, 3, 3, 5, 4), (1, 1, 1)),
    "not_global": (F.adaptive_avg_pool2d, lambda: torch.randn(2, 3, 6, 5), 2),
}


@pytest.mark.parametrize("grad", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", CASES)
def test_global_avg_pool_matches_eager(name: str, grad: bool, backend: str,
                                       capsys: pytest.CaptureFixture) -> None:
    pool, make, size = CASES[name]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return pool(torch.relu(x * 2), size) + 1  # (a producer and a consumer to fuse)

    with config.patch(logs=frozenset({"graph"})):
        compiled = minicompile.compile(fn, backend=backend)
        for seed in (0, 1):
            torch.manual_seed(seed)
            x = make().requires_grad_(grad)
            x2 = x.detach().clone().requires_grad_(grad)
            expected, got = fn(x), compiled(x2)
            torch.testing.assert_close(got, expected)
            assert got.stride() == expected.stride()
            if grad:
                g = torch.randn_like(expected)
                expected.backward(g)
                got.backward(g)
                torch.testing.assert_close(x2.grad, x.grad)
                assert x2.grad.stride() == x.grad.stride()
    passed = capsys.readouterr().err.split("after passes")[1]
    assert ("adaptive_avg_pool" in passed) == (name == "not_global")
