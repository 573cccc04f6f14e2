"""hardtanh, relu6, hardswish and hardsigmoid (passes/decompose.py; mobilenet_v2's
nn.ReLU6, mobilenetv3's nn.Hardswish and its squeeze-excite gate): pointwise ops fused into
one kernel with their neighbours, with a gradient too, and eager's gradients at the corners
and NaN (each device's kernels have their own there; zero at hardtanh's bounds, where
clamp's is one).  Values against eager on both backends, corners, NaN and infinities
included, twice with fresh inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from devices import device_for

CORNERS = torch.tensor([-6.0, -3.0, -1.0, 0.0, 1.0, 3.0, 6.0, float("nan"), float("inf")])

_RELU6, _HARDSWISH = torch.nn.ReLU6(inplace=True), torch.nn.Hardswish(inplace=True)
ACTIVATIONS = {
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 2.0),
    "relu6": F.relu6,
    "ReLU6_inplace": lambda x: _RELU6(x * 1.0),
    "hardswish": F.hardswish,
    "Hardswish_inplace": lambda x: _HARDSWISH(x + 0.0),
    "hardsigmoid": F.hardsigmoid,
}


def _inputs(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(5, 9, device=device) * 4
    x[0] = CORNERS.to(device)
    return x.to(dtype)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_without_gradient(name: str, dtype: torch.dtype, backend: str) -> None:
    act = ACTIVATIONS[name]

    def fn(x, y):  # noqa: ANN001, ANN202 (with neighbours to fuse into one kernel)
        return act(x * 2 + y) - 1

    device = device_for(backend)
    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):
        x, y = _inputs(device, dtype), _inputs(device, dtype)
        # (bfloat16: the fused kernel rounds once, eager after each op)
        tol = dict(rtol=3e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
        torch.testing.assert_close(compiled(x, y), fn(x, y), equal_nan=True, **tol)
    assert minicompile.stats()["kernels"] == 1


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_gradient_is_eagers_at_the_corners(name: str, backend: str) -> None:
    act = ACTIVATIONS[name]
    device = device_for(backend)

    def fn(x):  # noqa: ANN001, ANN202
        return act(x * 3.0) * 2

    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):
        x = (_inputs(device, torch.float32)[:, :7] / 3.0).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        out, ref = compiled(x), fn(x_ref)
        torch.testing.assert_close(out, ref)
        g = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, x, g)[0],
                                   torch.autograd.grad(ref, x_ref, g)[0])
    # fused with a gradient too, on every device (no library call recorded for autograd):
    # one forward kernel, one backward kernel
    assert minicompile.stats()["kernels"] == 2, minicompile.stats()


def test_hardtanh_bounds_eager_refuses_are_refused_at_the_call(backend: str) -> None:
    def fn(x):  # noqa: ANN001, ANN202
        return F.hardtanh(x, 2.0, 1.0)

    compiled = minicompile.compile(fn, backend=backend)
    with pytest.raises(ValueError):
        fn(torch.ones(2))
    with pytest.raises(ValueError):
        compiled(torch.ones(2))
