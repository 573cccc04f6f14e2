"""Bias adds moved into the pointwise kernels after a linear layer (passes/bias_epilogue.py):
where the pass applies, what it leaves alone, and values against eager on both backends
(the pass is for CUDA; here it is let apply to CPU tensors too)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.library_layouts import CONVOLUTIONS
from minicompile.passes import bias_epilogue, pipeline


@pytest.fixture
def on_every_device(monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setattr(bias_epilogue, "DEVICES", frozenset({"cuda", "cpu"}))
    seen: list = []

    def spy(graph):  # noqa: ANN001, ANN202
        out = bias_epilogue.split_bias_epilogues(graph)
        # The products left without their bias (a linear without one, an mm).
        seen.append(sum(n.target == "torch.mm" or (n.target == bias_epilogue.LINEAR
                                                   and n.args[2:] == (None,))
                        or (n.target in CONVOLUTIONS
                            and (n.args[2:3] or (n.kwargs.get("bias"),)) == (None,))
                        for n in out.calls()))
        return out

    passes = tuple(spy if p is bias_epilogue.split_bias_epilogues else p
                   for p in pipeline.GRAPH_PASSES)
    monkeypatch.setattr(pipeline, "GRAPH_PASSES", passes)
    return seen


def mlp(x, w1, b1, w2, b2):  # noqa: ANN001, ANN201 (gelu reads the first: split)
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)  # (the second is the output: kept)


def conv1d(x, w, b, r):  # noqa: ANN001, ANN201 (GPT-2's Conv1D: addmm, a view, a residual)
    y = torch.addmm(b, x.view(-1, x.shape[-1]), w)
    return y.view(*x.shape[:-1], -1) + r


def into_softmax(x, w, b):  # noqa: ANN001, ANN201 (a reduction reads it: kept)
    return torch.softmax(F.linear(x, w, b), -1)


def _check_splits(cases: list, backend: str, seen: list, **tol: float) -> None:
    """Each case's compiled function against eager twice with fresh inputs, and the
    number of products the pass left without their bias."""
    for fn, make, splits in cases:
        seen.clear()
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            args = make()
            torch.testing.assert_close(compiled(*args), fn(*args), **tol)
        assert seen == [splits], fn.__name__


def test_bias_adds_join_pointwise_readers(backend: str, device, on_every_device) -> None:
    f32 = dict(device=device)
    cases = [
        (mlp, lambda: (torch.randn(2, 5, 8, **f32), torch.randn(16, 8, **f32),
                       torch.randn(16, **f32), torch.randn(4, 16, **f32), torch.randn(4, **f32)),
         1),
        (conv1d, lambda: (torch.randn(2, 5, 8, **f32), torch.randn(8, 6, **f32),
                          torch.randn(6, **f32), torch.randn(2, 5, 6, **f32)), 1),
        (into_softmax, lambda: (torch.randn(3, 8, **f32), torch.randn(5, 8, **f32),
                                torch.randn(5, **f32)), 0),
    ]
    _check_splits(cases, backend, on_every_device)


def test_layers_that_take_a_gradient_keep_their_bias(backend: str, device,
                                                     on_every_device) -> None:
    w = torch.randn(16, 8, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)

    def fn(x):  # noqa: ANN001, ANN202
        return F.gelu(F.linear(x, w, b))

    compiled = minicompile.compile(fn, backend=backend)
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(x), fn(x))
    assert on_every_device and set(on_every_device) == {0}  # (forward and backward graphs)


def conv_relu(x, w, b):  # noqa: ANN001, ANN201 (a pointwise reader: split)
    return torch.relu(F.conv2d(x, w, b, padding=1))


def conv_channel_norm(x, w, b):  # noqa: ANN001, ANN201 (a reduction reads it: split)
    y = F.conv1d(x, w, bias=b, groups=2)
    return y - y.mean(1, keepdim=True)


def conv_out(x, w, b):  # noqa: ANN001, ANN201 (the graph's output: kept)
    return F.conv2d(x, w, b, stride=2)


def test_convolution_biases_join_their_readers(backend: str, device, on_every_device) -> None:
    f32 = dict(device=device)
    cases = [
        (conv_relu, lambda: (torch.randn(2, 3, 6, 5, **f32), torch.randn(4, 3, 3, 3, **f32),
                             torch.randn(4, **f32)), 1),
        (conv_channel_norm, lambda: (torch.randn(2, 4, 9, **f32), torch.randn(6, 2, 3, **f32),
                                     torch.randn(6, **f32)), 1),
        (conv_out, lambda: (torch.randn(1, 3, 6, 6, **f32), torch.randn(2, 3, 1, 1, **f32),
                            torch.randn(2, **f32)), 0),
    ]
    _check_splits(cases, backend, on_every_device, rtol=1e-4, atol=1e-4)


def test_folded_batch_norm_bias_joins_the_activation(backend: str, device,
                                                     on_every_device) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU()).to(device).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        compiled = minicompile.compile(model, backend=backend)
        for _ in range(2):
            x = torch.randn(2, 3, 7, 7, device=device)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert on_every_device == [1]
