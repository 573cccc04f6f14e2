"""passes/conv_gemm.py: small 1x1 convolutions on the CPU become products of pixel rows,
match eager, and every other convolution stays the call it was."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minicompile
from minicompile import config, ops
from minicompile.passes.conv_gemm import convs_as_products

from graph_builder import GraphBuilder

PRODUCT = "minicompile.runtime.conv_gemm.conv2d_1x1"


def _conv(image: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> str:
    """The graph text after the pass, of one convolution of a [1, 64, image, image] input."""
    b = GraphBuilder(torch.device("cpu"))
    x = b.input("L_x", (1, 64, image, image), torch.float32)
    w = b.input("L_w", (128, 64 // groups, kernel, kernel), torch.float32)
    conv = ops.extern_op(F.conv2d)
    b.output(b(conv, x, w, None, (stride, stride), (0, 0), (1, 1), groups))
    return str(convs_as_products(b.graph)[0])


def test_only_small_1x1_convolutions_become_products() -> None:
    assert PRODUCT in _conv(2)  # 4 output pixels
    assert PRODUCT in _conv(4, stride=2)  # 4 output pixels, every other input pixel
    assert PRODUCT not in _conv(4)  # 16 pixels: the convolution is as fast
    assert PRODUCT not in _conv(2, kernel=2)  # a 2x2 kernel
    assert PRODUCT not in _conv(2, groups=2)
    assert PRODUCT not in _conv(2, stride=2)  # 1 output pixel: the convolution is faster
    for stride in (1, 2):  # one input pixel: a linear between views, in any layout
        text = _conv(1, stride=stride)
        assert "torch.nn.functional.linear" in text and "conv2d" not in text
        assert PRODUCT not in text and "to_eager_layout" not in text


def net(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
        w3: torch.Tensor) -> torch.Tensor:
    y = F.relu(F.conv2d(x, w1, b1))  # 2x2 pixels: a product
    z = F.conv2d(x, w2, stride=2)  # 1x1 pixel: the convolution is the faster
    gate = F.conv2d(x.mean((2, 3), keepdim=True), w1, b1)  # one pixel in: a linear
    return F.conv2d(y, w3, padding=1).sum() + z.sum(), y * 2, z, gate


def strides(t: torch.Tensor) -> list[int]:
    """Strides of the dims of more than one element (others are never stepped over)."""
    return [s for s, n in zip(t.stride(), t.shape) if n > 1]


def test_products_match_eager(backend: str, device: torch.device) -> None:
    """On the CPU the small convolutions are products; on CUDA (Triton) they stay calls."""
    compiled = minicompile.compile(net, backend=backend)
    shapes = ((1, 96, 2, 2), (160, 96, 1, 1), (160,), (64, 96, 1, 1), (32, 160, 3, 3))
    with torch.no_grad():
        for _ in range(2):  # fresh values each call
            args = tuple(torch.randn(s, device=device) for s in shapes)
            for got, want in zip(compiled(*args), net(*args), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
                assert strides(got) == strides(want)


def block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
          w3: torch.Tensor, w4: torch.Tensor) -> torch.Tensor:
    """An inverted-residual tail on 2x2 pixels: 1x1 expand (bias), depthwise 3x3, a gate
    from the pixels' mean (one pixel, 1x1), 1x1 project; the 1x1s are products in training
    too, the 3x3 stays a convolution."""
    y = F.silu(F.conv2d(x, w1, b1))
    y = F.conv2d(y, w2, padding=1, groups=w2.shape[0])
    y = y * F.conv2d(y.mean((2, 3), keepdim=True), w4).sigmoid()
    return F.conv2d(y, w3) + x


def test_products_take_gradients_as_eager() -> None:
    """A train step: the 1x1 convolutions that take a gradient are pixel-row products
    forward and backward (no convolution backward for them), values and gradients as
    eager's on fresh values at each of two calls."""
    shapes = ((2, 24, 2, 2), (96, 24, 1, 1), (96,), (96, 1, 3, 3), (24, 96, 1, 1),
              (96, 96, 1, 1))
    _trains_as_eager(block, shapes)


def _trains_as_eager(fn: Any, shapes: Any, *constants: Any) -> None:
    """``fn`` compiled, at two calls with fresh values of ``shapes`` (then ``constants``):
    its result, the result's strides and every gradient as eager's."""
    compiled = minicompile.compile(fn, backend="cpp")
    for _ in range(2):
        # (weights at 1/sqrt(fan-in), as nn.Conv2d's: the float32 sums stay near 1)
        args = [(torch.randn(s) / math.prod(s[1:]) ** 0.5).requires_grad_() for s in shapes]
        got, want = compiled(*args, *constants), fn(*args, *constants)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.stride() == want.stride()
        g = torch.randn_like(want)  # a gradient that differs at each element
        for a, e in zip(torch.autograd.grad(got, args, g), torch.autograd.grad(want, args, g),
                        strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    assert minicompile.stats()["eager_fallbacks"] == 0


def _trained_conv(image: int, stride: int = 1) -> str:
    """The graph text after the pass, of one 1x1 convolution that takes a gradient."""
    b = GraphBuilder(torch.device("cpu"))
    x = b.input("L_x", (2, 64, image, image), torch.float32)
    w = b.input("L_w", (128, 64, 1, 1), torch.float32)
    conv = ops.extern_op(F.conv2d)
    meta = dataclasses.replace(ops.infer_meta(conv, (x, w, None, (stride, stride)), {},
                                              b.device), requires_grad=True)
    b.output(b.graph.call(conv, (x, w, None, (stride, stride)), {}, meta))
    return str(convs_as_products(b.graph)[0])


def test_trained_products_are_graph_ops() -> None:
    """Taking a gradient, the product is graph ops (rows, F.linear, eager's layout again),
    which autograd derives as matrix products; a strided one reads every other pixel
    first (slices), up to 128 output pixels."""
    text = _trained_conv(2)
    assert "torch.nn.functional.linear" in text and PRODUCT not in text
    assert "to_eager_layout" in text and "conv2d" not in text
    text = _trained_conv(16, stride=2)  # 2 x 8 x 8 output pixels
    assert "slice(" in text and "torch.nn.functional.linear" in text and "conv2d" not in text
    assert "conv2d" in _trained_conv(18, stride=2)  # 162 output pixels


def test_strided_products_take_gradients_as_eager() -> None:
    """A ResNet's strided 1x1 shortcut in a train step (ATen's backward of 1024 -> 2048
    channels on 2x2 output pixels took 19 ms on one thread, the product's 3): values and
    gradients as eager's at two calls with fresh values, odd sizes and strides as well."""
    for x_shape, out, stride in [((2, 64, 4, 4), 96, 2), ((2, 8, 5, 7), 6, (2, 3)),
                                 ((1, 16, 1, 3), 4, 2)]:
        def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
               stride: Any = stride) -> torch.Tensor:
            return F.conv2d(x, w, b, stride=stride).relu() * 2

        _trains_as_eager(fn, (x_shape, (out, x_shape[1], 1, 1), (out,)))


def _trained_window_conv(image: int, requires_grad: bool = True, stride: int = 1) -> str:
    """The graph text after the pass, of one 3x3 convolution (padding 1) over 2 images."""
    b = GraphBuilder(torch.device("cpu"))
    x = b.input("L_x", (2, 64, image, image), torch.float32)
    w = b.input("L_w", (32, 64, 3, 3), torch.float32)
    conv = ops.extern_op(F.conv2d)
    args = (x, w, None, (stride, stride), (1, 1))
    meta = dataclasses.replace(ops.infer_meta(conv, args, {}, b.device),
                               requires_grad=requires_grad)
    b.output(b.graph.call(conv, args, {}, meta))
    return str(convs_as_products(b.graph)[0])


def test_small_trained_convolutions_are_window_products() -> None:
    """A k x k convolution that takes a gradient over at most 32 output pixels is the product
    of its windows' rows (9 taps stacked, one F.linear), strided too; over more pixels, or
    in inference, it stays the convolution."""
    text = _trained_window_conv(4)  # 2 x 4 x 4 output pixels
    assert "torch.stack" in text and "torch.nn.functional.linear" in text
    assert "torch.nn.functional.pad" in text and "conv2d" not in text
    assert "conv2d" in _trained_window_conv(8)  # 128 output pixels
    assert "conv2d" in _trained_window_conv(4, requires_grad=False)
    text = _trained_window_conv(8, stride=2)  # the taps: phases of the padded input
    assert "select(" in text and "torch.nn.functional.linear" in text and "conv2d" not in text


def test_window_products_take_gradients_as_eager() -> None:
    """ResNet's last stage (ATen's 3x3 convolution of 512 channels on 2x2 pixels and its
    backward: 13 ms on one thread; the product's 3), and odd kernels, paddings and sizes:
    values, strides and gradients as eager's at two calls with fresh values; F.pad's
    gradient (a slice of the result's) is derived in the graph, and checked here too."""
    cases = [((2, 512, 2, 2), 512, 3, 1, 1, True), ((2, 8, 5, 7), 24, 5, (2, 0), 1, False),
             ((1, 16, 3, 4), 8, 3, 0, 1, True), ((2, 4, 1, 1), 6, 3, 1, 1, True),
             # strided: ResNet's transitions, odd sizes, and rows no window reads (7 -> 6)
             ((2, 256, 4, 4), 512, 3, 1, 2, True), ((2, 8, 5, 7), 6, 3, 1, 2, False),
             ((1, 4, 7, 6), 5, 3, (1, 0), (2, 3), True), ((2, 4, 7, 7), 5, 2, 0, 3, True)]
    for x_shape, out, k, padding, stride, bias in cases:
        def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
               padding: Any = padding, stride: Any = stride) -> torch.Tensor:
            return F.conv2d(x, w, b, stride, padding).relu() * 2

        _trains_as_eager(fn, [x_shape, (out, x_shape[1], k, k)] + [(out,)] * bias,
                         *[None] * (not bias))


def padded(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x.sin(), (1, 2, 0, 3)) * torch.arange(7.0)


def test_the_gradient_of_a_constant_pad(capsys: pytest.CaptureFixture) -> None:
    """Derived in the graph (a slice of the result's gradient), not recorded for
    PyTorch's autograd."""
    with config.patch(logs=frozenset({"graph"})):
        compiled = minicompile.compile(padded, backend="cpp")
        compiled(torch.randn(3, 5, 4, requires_grad=True))
    assert "autograd.vjp" not in capsys.readouterr().err
    for _ in range(2):
        x = torch.randn(3, 5, 4, requires_grad=True)
        got, want = compiled(x), padded(x)
        torch.testing.assert_close(got, want)
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(got, x, g)[0],
                                   torch.autograd.grad(want, x, g)[0])


def pad_input(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (1, 2, 0, 3)) * 2


def test_an_input_gets_its_padding_gradient_dense() -> None:
    """The gradient of a padded input is a slice of the result's: returned for the input,
    it is copied out dense in eager's strides (its input's memory format: row-major, or
    channels-last), not a view into the larger gradient (as passes/autograd.py gave it)."""
    compiled = minicompile.compile(pad_input, backend="cpp")
    layouts = (lambda: torch.randn(3, 5, 4), lambda: torch.randn(3, 4, 5).transpose(1, 2),
               lambda: torch.randn(2, 3, 5, 4).contiguous(memory_format=torch.channels_last))
    for x in (make().requires_grad_() for make in layouts for _ in range(2)):  # fresh values
        g = torch.randn_like(pad_input(x))
        got, want = torch.autograd.grad(compiled(x), x, g)[0], torch.autograd.grad(
            pad_input(x), x, g)[0]
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def embed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A vision transformer's patch embedding: 4x4 patches, each a row of ``w``'s outputs."""
    return F.conv2d(x, w, b, stride=4).flatten(2).transpose(1, 2).relu()


def _patch_conv(image: int, kernel: int, stride: int, batch: int = 2) -> str:
    b = GraphBuilder(torch.device("cpu"))
    x = b.input("L_x", (batch, 3, image, image), torch.float32)
    w = b.input("L_w", (32, 3, kernel, kernel), torch.float32)
    b.output(b(ops.extern_op(F.conv2d), x, w, None, (stride, stride)))
    return str(convs_as_products(b.graph)[0])


def test_patch_embeddings_become_products() -> None:
    """A convolution whose stride is its kernel over a whole number of patches is one
    product of the patches' rows; overlapping windows, a remainder, or more patches than
    MAX_PATCH_ROWS stay convolutions."""
    text = _patch_conv(16, 4, 4)
    assert "torch.nn.functional.linear" in text and "conv2d" not in text
    assert "conv2d" in _patch_conv(16, 4, 2)  # windows overlap
    assert "conv2d" in _patch_conv(18, 4, 4)  # 2 columns left over
    assert "conv2d" in _patch_conv(64, 2, 2, batch=1)  # 1024 patches


def test_patch_products_match_eager() -> None:
    """Inference and a train step (the weight's and bias's gradients, and the image's),
    two calls with fresh values each."""
    compiled = minicompile.compile(embed, backend="cpp")
    shapes = ((2, 3, 16, 16), (24, 3, 4, 4), (24,))
    for _ in range(2):
        args = [(torch.randn(s) / math.prod(s[1:]) ** 0.5).requires_grad_() for s in shapes]
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), embed(*args), rtol=1e-4, atol=1e-5)
        got, want = compiled(*args), embed(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        g = torch.randn_like(want)
        for a, e in zip(torch.autograd.grad(got, args, g), torch.autograd.grad(want, args, g),
                        strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert minicompile.stats()["eager_fallbacks"] == 0


class Stage(nn.Module):
    """A MobileNet stage at 8x8 pixels, channels-last in inference (oneDNN's layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU6())
        self.expand = nn.Sequential(nn.Conv2d(32, 96, 1, bias=False), nn.BatchNorm2d(96),
                                    nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(96, 96, 3, padding=1, groups=96, bias=False),
                                       nn.BatchNorm2d(96), nn.ReLU6())
        self.project = nn.Conv2d(96, 8, 1)
        self.shallow = nn.Conv2d(8, 512, 1)  # 8 input channels: too shallow for a product
        self.wide = nn.Conv2d(512, 512, 1)  # 2 x 8 x 8 x 512 x 512 multiply-adds: too many

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.project(self.depthwise(self.expand(self.stem(x))))
        return y, self.wide(self.shallow(y))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: no channels-last")
def test_channels_last_inference_products(capsys: pytest.CaptureFixture) -> None:
    """In a channels-last inference graph, the small 1x1 convolutions of more than 16 input
    channels (a batch norm folded into one) are products of the pixel rows (a view of the
    input, the result channels-last: no copy); the others stay oneDNN's; and all match
    eager, in eager's strides, before and after the parameters change."""
    torch.manual_seed(0)
    model = Stage().eval()
    with config.patch(logs=frozenset({"graph"})), torch.no_grad():
        compiled = minicompile.compile(model, backend="cpp", fullgraph=True)
        for step in range(3):
            for _ in range(2):  # fresh values each call
                x = torch.randn(2, 3, 8, 8)
                for got, want in zip(compiled(x), model(x), strict=True):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                    assert got.stride() == want.stride()
            if step == 0:  # the folded weight and its batch norm
                model.expand[0].weight.mul_(-1.5)
                model.expand[1].running_var.add_(1.0)
            else:
                model.project.bias.sub_(1.0)
    main = capsys.readouterr().err.split("after passes ========")[1]
    assert main.count(PRODUCT) == 2, main  # expand and project
    assert main.count("minicompile.runtime.onednn.conv2d") == 4, main


def channels_last_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A 1x1 convolution of a channels-last input: a MobileNet's in a train step (laid out
    so by passes/layout.py), or a ConvNeXt's after its permuted layer norm."""
    return F.conv2d(x.contiguous(memory_format=torch.channels_last), w, b)


def test_channels_last_products_take_gradients_as_eager(capsys: pytest.CaptureFixture) -> None:
    """Taking a gradient, a small channels-last 1x1 convolution is its pixel rows' product
    in graph ops: the rows a view of the input, the result channels-last as eager's (no
    copy), the backward derived as matrix products; values, strides and gradients as
    eager's.  Too shallow an input (8 channels) stays the convolution."""
    with config.patch(logs=frozenset({"graph"})):
        _trains_as_eager(channels_last_conv, ((2, 96, 4, 4), (160, 96, 1, 1), (160,)))
        _trains_as_eager(channels_last_conv, ((2, 8, 4, 5), (160, 8, 1, 1), (160,)))
    graphs = capsys.readouterr().err.split("======== minicompile graph: ")
    product, shallow = (g for g in graphs if g.startswith("channels_last_conv after passes"))
    conv = "torch.nn.functional.conv2d(%"  # (the source line in comments says conv2d)
    assert "torch.nn.functional.linear" in product and conv not in product, product
    assert product.count("to_eager_layout(%") == 1, product  # (the input's, in the source)
    assert conv in shallow and "linear(%" not in shallow, shallow


def test_the_library_product_lays_out_its_result_as_told() -> None:
    """runtime/conv_gemm.conv2d_1x1 writes channels-last only when the compiler says so: a
    one-channel input is channels-last and contiguous at once, and its result is eager's
    (contiguous) all the same."""
    from minicompile.runtime.conv_gemm import conv2d_1x1

    for _ in range(2):  # fresh values each call
        x, w, b = torch.randn(2, 1, 2, 2), torch.randn(4, 1, 1, 1), torch.randn(4)
        got, want = conv2d_1x1(x, w, b, (1, 1)), F.conv2d(x, w, b)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
        x = torch.randn(2, 24, 3, 3).contiguous(memory_format=torch.channels_last)
        w = torch.randn(8, 24, 1, 1)
        bias = b[:1].expand(8)
        got, want = conv2d_1x1(x, w, bias, (1, 1), True), F.conv2d(x, w, bias)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.stride() == want.stride()  # (eager's of a channels-last input)
