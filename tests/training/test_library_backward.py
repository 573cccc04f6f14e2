"""Library calls with derivative rules of their own (passes/derivatives.py): a convolution's
backward calls ATen's convolution backward once, for the gradients that are needed,
``torch.addmm``'s gradients are matrix products, and ``F.embedding``'s and ``F.max_pool2d``'s
backward is one ATen call (the dense embedding backward; the pooling backward, its indices
found again), instead of recording the call with PyTorch's autograd in the forward and a
nested backward per call (the ``record`` / ``vjp`` road of other library calls; a GPU host
paid more for those than for the kernels).  Values: gradients equal eager's, two steps with
fresh inputs (repeated indices, the padding row, a ReLU's ties for the pooling); structure:
the generated code has no ``record`` call for them (an embedding without padding or scaling
is decomposed into indexing)."""

from __future__ import annotations

import copy
from collections.abc import Callable

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
    # few output pixels: on the CPU the weight's gradient is passes/depthwise_grad.py's
    "depthwise_few_pixels": lambda: nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4),
    "depthwise_dilated": lambda: nn.Conv2d(4, 4, 5, padding=4, dilation=2, groups=4, bias=False),
    # ConvNeXt's 7x7 filter: on the CPU its weight's gradient is the 49 taps' sums (up to
    # 512 output pixels: here 180)
    "depthwise_7x7": lambda: nn.Conv2d(4, 4, 7, padding=3, groups=4),
    "conv1d": lambda: nn.Conv1d(4, 6, 3, padding=1),
    "conv3d": lambda: nn.Conv3d(4, 2, 3, padding=(1, 0, 1)),
    "padding_same": lambda: nn.Conv2d(4, 6, 4, padding="same"),  # asymmetric: autograd's road
}


def _input(name: str, device: torch.device) -> torch.Tensor:
    # (strided_no_bias: 2 x 8 x 8 output pixels, more than passes/conv_gemm.py's products
    # take, so that it stays ATen's convolution)
    dims = {"conv1d": (9,), "conv3d": (5, 6, 7), "depthwise_few_pixels": (5, 6),
            "depthwise_dilated": (4, 5), "strided_no_bias": (17, 18)}.get(name, (9, 10))
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
    ours = name.startswith("depthwise_") and device.type == "cpu"
    assert ("torch.stack" in err) == ours  # the taps' sums stacked into the weight's shape
    aten = name != "padding_same" and (not ours or input_grad)
    assert ("conv_backward(" in err) == aten  # (then for the input's gradient alone)


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


@pytest.mark.parametrize("offset", [0, 2, 5])
def test_position_embedding_gradient(offset: int, backend: str,
                                     capsys: pytest.CaptureFixture) -> None:
    """Positions ``arange(T) + offset`` (BART's learned positions start at 2) read rows
    offset..offset+T-1 once each: their gradient is the incoming one placed there among
    zero rows (a fused cat), no index_add and no zeros of the table."""
    device = device_for(backend)

    def fn(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0) + offset
        return x + F.embedding(positions, table)

    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            x, g = torch.randn(2, 5, 6, device=device), torch.randn(2, 5, 6, device=device)
            table = torch.randn(12, 6, device=device, requires_grad=True)
            ref = table.detach().clone().requires_grad_()
            got = torch.autograd.grad(compiled(x, table), table, g)[0]
            want = torch.autograd.grad(fn(x, ref), ref, g)[0]
            torch.testing.assert_close(got, want)
    code = capsys.readouterr().err
    assert "index_add" not in code and "new_zeros" not in code
    assert minicompile.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("window", [(3, 2, 1, 1, False), (3, 2, 0, 1, True), (2, None, 0, 1, False)])
def test_max_pool_gradient(window: tuple, backend: str, capsys: pytest.CaptureFixture) -> None:
    k, s, p, d, ceil = window

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x), k, s, p, d, ceil_mode=ceil) * 2

    pool_matches_eager(fn, backend, lambda: torch.randn(2, 3, 9, 9).round())  # (ties)
    _no_nested_backward(capsys)


def pool_matches_eager(fn: Callable, backend: str, make: Callable) -> None:
    """The pool's values and input gradient against eager's, twice with fresh inputs
    (``make()``), its code logged for :func:`_no_nested_backward`."""
    device = device_for(backend)
    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            x = make().to(device).requires_grad_()
            ref = x.detach().clone().requires_grad_()
            out, want = compiled(x), fn(ref)
            g = torch.randn_like(want)
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(torch.autograd.grad(out, x, g)[0],
                                       torch.autograd.grad(want, ref, g)[0])


@pytest.mark.parametrize("how", ["topk", "sort", "topk_method_kwargs"])
def test_selection_gradient(how: str, backend: str, capsys: pytest.CaptureFixture) -> None:
    """A mixture-of-experts router's ``torch.topk`` (and ``torch.sort``): the values'
    gradient is scattered back to the input (as gather's, passes/derivatives.scattered); the
    indices are used as well, as a router uses them."""
    device = device_for(backend)

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = (x @ w).softmax(-1)
        if how == "topk":
            values, indices = torch.topk(probs, 2, -1)
        elif how == "sort":
            values, indices = torch.sort(probs, dim=0, descending=True)
        else:
            values, indices = probs.topk(k=3, dim=1, largest=False)
        return values / values.sum(-1, keepdim=True), indices

    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            x, w = torch.randn(7, 5, device=device), torch.randn(5, 6, device=device)
            leaves = [[t.clone().requires_grad_() for t in (x, w)] for _ in range(2)]
            (got, got_i), (want, want_i) = compiled(*leaves[0]), fn(*leaves[1])
            torch.testing.assert_close(got, want)
            assert torch.equal(got_i, want_i)
            g = torch.randn_like(want)
            for a, b in zip(torch.autograd.grad(got, leaves[0], g),
                            torch.autograd.grad(want, leaves[1], g)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    _no_nested_backward(capsys)


@pytest.mark.parametrize("window", [(2, None, 0, False, True, None), (3, 2, 1, True, False, None),
                                    ((3, 2), (2, 1), (1, 0), False, True, 5)])
def test_avg_pool_gradient(window: tuple, backend: str, capsys: pytest.CaptureFixture) -> None:
    """DenseNet's transition pool (and padded, ceil-mode and divisor forms): ATen's
    ``avg_pool2d_backward`` in the backward graph."""
    k, s, p, ceil, count_pad, divisor = window

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(torch.relu(x), k, s, p, ceil, count_pad, divisor) * 2

    pool_matches_eager(fn, backend, lambda: torch.randn(2, 3, 9, 8))
    _no_nested_backward(capsys)
