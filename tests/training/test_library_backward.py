"""Library calls whose backward is one ATen call, called directly in the compiled backward
(passes/derivatives.LIBRARY_RULES; runtime/autograd.py): ``F.embedding``'s dense backward
and ``F.max_pool2d``'s, its indices found again (an embedding without padding or scaling
is decomposed into indexing).  Not recorded for PyTorch's autograd with
a nested backward per call (a GPU host paid more for those than for the kernels).
Gradients against eager's, on the backend's device, twice with fresh inputs (repeated
indices, the padding row; a ReLU's ties for the pooling)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import config

from devices import device_for


def _no_nested_backward(capsys: pytest.CaptureFixture) -> None:
    code = capsys.readouterr().err
    assert "_backward" in code  # (the backward's code was logged)
    assert "autograd.vjp(" not in code and "autograd.record(" not in code


@pytest.mark.parametrize("padding_idx", [None, 3, -2])
@pytest.mark.parametrize("scale", [False, True], ids=["plain", "scale_grad_by_freq"])
def test_embedding_gradient(padding_idx: int | None, scale: bool, backend: str,
                            capsys: pytest.CaptureFixture) -> None:
    device = device_for(backend)

    def fn(idx: torch.Tensor, table: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(idx, table, padding_idx=padding_idx, scale_grad_by_freq=scale)
        return (rows * w).sum(-1)

    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            idx = torch.randint(0, 9, (4, 5), device=device)
            idx[0, :3] = 3  # a repeated row, the padding row where padding_idx is 3
            w = torch.randn(4, 5, 6, device=device)
            table = torch.randn(9, 6, device=device, requires_grad=True)
            ref = table.detach().clone().requires_grad_()
            g = torch.randn(4, 5, device=device)
            got = torch.autograd.grad(compiled(idx, table, w), table, g)[0]
            want = torch.autograd.grad(fn(idx, ref, w), ref, g)[0]
            torch.testing.assert_close(got, want)
    _no_nested_backward(capsys)


@pytest.mark.parametrize("window", [(3, 2, 1, 1, False), (3, 2, 0, 1, True), (2, None, 0, 1, False)])
def test_max_pool_gradient(window: tuple, backend: str, capsys: pytest.CaptureFixture) -> None:
    device = device_for(backend)
    k, s, p, d, ceil = window

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x), k, s, p, d, ceil_mode=ceil) * 2

    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            x = torch.randn(2, 3, 9, 9, device=device).round().requires_grad_()  # (ties)
            ref = x.detach().clone().requires_grad_()
            out, want = compiled(x), fn(ref)
            g = torch.randn_like(want)
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(torch.autograd.grad(out, x, g)[0],
                                       torch.autograd.grad(want, ref, g)[0])
    _no_nested_backward(capsys)
