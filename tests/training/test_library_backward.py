"""Library calls with derivative rules of their own (passes/derivatives.py): a convolution's
backward calls ATen's convolution backward once, for the gradients that are needed, and
``torch.addmm``'s gradients are matrix products, instead of recording the call with
PyTorch's autograd in the forward (the ``record`` / ``vjp`` road of other library calls).
Values: gradients equal eager's, two steps with fresh inputs; structure: the generated
forward has no ``record`` call for them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from minicompile import config

from devices import device_for

CASES = {
    "conv2d": lambda: nn.Conv2d(4, 6, 3, padding=1),
    "strided_no_bias": lambda: nn.Conv2d(4, 6, 3, stride=2, bias=False),
    "grouped_dilated": lambda: nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2),
    "depthwise": lambda: nn.Conv2d(4, 4, 5, padding=2, groups=4),
    "conv1d": lambda: nn.Conv1d(4, 6, 3, padding=1),
    "conv3d": lambda: nn.Conv3d(4, 2, 3, padding=(1, 0, 1)),
    "padding_same": lambda: nn.Conv2d(4, 6, 4, padding="same"),  # asymmetric: autograd's road
}


def _input(name: str, device: torch.device) -> torch.Tensor:
    dims = {"conv1d": (9,), "conv3d": (5, 6, 7)}.get(name, (9, 10))
    return torch.randn(2, 4, *dims, device=device)


class Net(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x)) * 2


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("input_grad", [False, True], ids=["params_only", "input_grad"])
def test_conv_gradients(backend: str, capsys: pytest.CaptureFixture, name: str,
                        input_grad: bool) -> None:
    device = device_for(backend)
    torch.manual_seed(0)
    model = Net(CASES[name]()).to(device)
    ref = copy.deepcopy(model)
    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(model, backend=backend)
        for _ in range(2):
            x = _input(name, device).requires_grad_(input_grad)
            x_ref = x.detach().clone().requires_grad_(input_grad)
            grad = torch.randn_like(ref(x_ref))
            compiled(x).backward(grad)
            ref(x_ref).backward(grad)
            for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=pname)
            if input_grad:
                torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
            else:
                assert x.grad is None
            model.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
    err = capsys.readouterr().err
    recorded = "minicompile.runtime.autograd.record(" in err
    assert recorded == (name == "padding_same"), err[-3000:]
    assert ("conv_backward(" in err) == (name != "padding_same")


def test_channels_last_input(backend: str) -> None:
    """A channels-last input: the gradient comes back in eager's layout and values."""
    device = device_for(backend)
    torch.manual_seed(0)
    model = Net(nn.Conv2d(4, 6, 3, padding=1)).to(device)
    ref = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    for _ in range(2):
        x = _input("conv2d", device).to(memory_format=torch.channels_last).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        compiled(x).sum().backward()
        ref(x_ref).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model.conv.weight.grad, ref.conv.weight.grad,
                                   rtol=1e-4, atol=1e-4)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)


def conv1d_addmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """transformers' GPT-2 Conv1D."""
    return torch.addmm(b, x.view(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1]).tanh()


@pytest.mark.parametrize("alpha", [1, 2])
def test_addmm_gradients(backend: str, capsys: pytest.CaptureFixture, alpha: int) -> None:
    device = device_for(backend)
    fn = conv1d_addmm if alpha == 1 else (
        lambda x, w, b: torch.addmm(b, x.view(-1, 6), w, alpha=2).tanh())
    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            leaves = [torch.randn(s, device=device, requires_grad=True)
                      for s in ((2, 3, 6), (6, 5), (5,))]
            refs = [t.detach().clone().requires_grad_() for t in leaves]
            compiled(*leaves).square().sum().backward()
            fn(*refs).square().sum().backward()
            for got, want in zip(leaves, refs):
                torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
    err = capsys.readouterr().err
    assert ("minicompile.runtime.autograd.record(" in err) == (alpha != 1)
