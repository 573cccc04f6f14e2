"""passes/onednn_conv.py: CPU inference convolutions of parameters run through oneDNN on
weights packed once, channels-last; they match eager (values and strides) before and after
a parameter changes, and convolutions the pass must not touch stay ``F.conv2d``."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minicompile
from minicompile import compat, config, ops
from minicompile.graph import Graph, TensorMeta, graph_to_json

from devices import device_for

CONV = "minicompile.runtime.onednn.conv2d"
PACK = "minicompile.runtime.onednn.pack_conv2d_weight"
ONEDNN = compat.onednn_convolution() is not None


class Block(nn.Module):
    """A ResNeXt bottleneck: 1x1, grouped 3x3 with a stride, depthwise dilated 3x3, 1x1 and a
    strided 1x1 projection, batch norms and a residual add; then convolutions followed by
    SiLU, hardswish and ReLU6."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
                                    nn.ReLU())
        self.grouped = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1, groups=4, bias=False),
                                     nn.BatchNorm2d(16), nn.ReLU())
        self.depthwise = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=16)
        self.expand = nn.Sequential(nn.Conv2d(16, 12, 1, bias=False), nn.BatchNorm2d(12))
        self.project = nn.Conv2d(8, 12, 1, stride=2)
        self.activations = nn.Sequential(  # (MobileNet's and EfficientNet's)
            nn.Conv2d(12, 12, 3, padding=1), nn.SiLU(), nn.Conv2d(12, 12, 1), nn.Hardswish(),
            nn.Conv2d(12, 12, 3, groups=12), nn.ReLU6())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.depthwise(self.grouped(self.reduce(x)))
        return self.activations(torch.relu(self.expand(y) + self.project(x)) - 0.5), y


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = Block().eval().to(device)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


def _check(compiled: object, model: nn.Module, device: torch.device) -> None:
    for _ in range(2):  # fresh values each call
        x = torch.randn(2, 8, 9, 9, device=device)
        for got, want in zip(compiled(x), model(x), strict=True):  # type: ignore[operator]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert got.stride() == want.stride()


@torch.no_grad()
def test_block_matches_eager_before_and_after_parameter_changes(
        backend: str, capsys: pytest.CaptureFixture) -> None:
    device = device_for(backend)
    model = _model(device)
    with config.patch(logs=frozenset({"graph"})):
        compiled = minicompile.compile(model, backend=backend, fullgraph=True)
        _check(compiled, model, device)
        model.grouped[0].weight.mul_(-1.5)  # a packed weight, folded with its batch norm
        model.grouped[1].running_var.add_(1.0)
        _check(compiled, model, device)
        model.depthwise.weight.add_(0.25)  # a packed weight of its own
        model.project.bias.sub_(1.0)
        _check(compiled, model, device)
    err = capsys.readouterr().err
    main = err.split("after passes ========")[1]
    if device.type == "cpu" and ONEDNN:
        # (hardtanh and hardswish are pointwise ops by then: passes/decompose.py)
        assert ("8 convolutions on packed oneDNN weights, 1 applying the activation after "
                "them (swish)") in err  # (not ReLU: see the NaN test)
        assert "oneDNN's convolutions on packed weights are fastest channels-last" in err
        assert main.count(CONV) == 8, main
        assert "functional.hardtanh" not in main and "functional.conv2d" not in main, main
        assert PACK not in main  # packed once, outside the graph (passes/hoist_params.py)
        # The three weights folded with a batch norm are multiplied as they are packed
        # (by their scale, the argument after the input's size).
        values = err.split("parameter values ========")[1].split("========")[0]
        packs = [line for line in values.splitlines() if PACK in line]
        assert len(packs) == 8 and sum(bool(re.search(r"\), %\d+\) : ", line))
                                       for line in packs) == 3, values
    else:
        assert CONV not in err
    assert minicompile.stats()["recompiles"] == 0
    assert minicompile.stats()["eager_fallbacks"] == 0


@torch.no_grad()
def test_nan_and_infinity_pass_the_activations_as_in_eager(backend: str) -> None:
    """A NaN or an infinite input pixel makes NaN and infinite convolution results; ReLU,
    ReLU6, SiLU and hardswish after them keep each as eager does (oneDNN's ReLU and clip
    would write 0 for a NaN: those stay kernels of their own)."""
    device = device_for(backend)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.ReLU6(), nn.Conv2d(8, 8, 1), nn.SiLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.Hardswish()).eval().to(device)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    for corner in (0, 5):  # fresh values, and the bad pixels elsewhere, each call
        x = torch.randn(2, 3, 9, 9, device=device)
        x[0, 0, corner, corner] = float("nan")
        x[1, 2, corner + 2, corner + 1] = float("inf")
        got, want = compiled(x), model(x)
        assert want.isnan().any() and want.isnan().sum() < want.numel() / 2
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch has no oneDNN (the pass keeps F.conv2d)")
def test_what_is_not_packed(capsys: pytest.CaptureFixture) -> None:
    """A weight passed in (it would be packed each call), float64, a training graph and
    MINICOMPILE_ONEDNN=0 keep F.conv2d."""
    conv = nn.Conv2d(3, 4, 3).eval()

    def counted(fn: object, *args: torch.Tensor, **options: object) -> int:
        capsys.readouterr()
        with config.patch(logs=frozenset({"graph"}), **options), torch.no_grad():
            compiled = minicompile.compile(fn, backend="cpp")
            for _ in range(2):
                torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-4, atol=1e-4)
                args = tuple(torch.randn_like(a) for a in args)
        minicompile.reset()
        return capsys.readouterr().err.split("after passes ========")[1].count(CONV)

    x = torch.randn(2, 3, 8, 8)
    assert counted(conv, x) == 1
    assert counted(nn.Conv2d(3, 4, 8).eval(), x) == 0  # one pixel an image: F.conv2d's
    assert counted(lambda x, w: F.conv2d(x, w), x, torch.randn(4, 3, 3, 3)) == 0
    assert counted(conv.double(), x.double()) == 0
    assert counted(conv.float(), x, onednn=False) == 0
    with config.patch(logs=frozenset({"graph"})):  # gradients: the training path
        compiled = minicompile.compile(conv, backend="cpp")
        compiled(x.requires_grad_()).sum().backward()
    assert CONV not in capsys.readouterr().err


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch has no oneDNN")
def test_a_graph_read_from_disk_packs_weights() -> None:
    """A warm entry's graph of parameter values (runtime/derived.py), read from disk by a
    process that has not registered the packing helper, packs the weight (and the weight
    times a scale, a folded batch norm's): an opaque oneDNN tensor, handed on as it is."""
    from minicompile.runtime import onednn
    from minicompile.runtime.derived import WithDerived

    weight, scale = torch.randn(4, 3, 3, 3), torch.rand(4, 1, 1, 1) + 0.5
    meta = TensorMeta.of(weight)
    graph = Graph("forward_parameters")
    w, s = graph.placeholder("w", meta), graph.placeholder("s", TensorMeta.of(scale))
    packed = graph.call(PACK, (w, (1, 1), (1, 1), (1, 1), 1, (2, 3, 8, 8)), {}, meta, ())
    scaled = graph.call(PACK, (w, (1, 1), (1, 1), (1, 1), 1, (2, 3, 8, 8), s), {}, meta, ())
    graph.output((packed, scaled))
    ops.OPS.pop(PACK, None)
    derived = WithDerived.from_json(lambda inputs: inputs, graph_to_json(graph), (0, 1))
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
        _, _, packed_weight, scaled_weight = derived([weight, scale])
        for got_weight, want_weight in ((packed_weight, weight), (scaled_weight, weight * scale)):
            assert got_weight.layout == torch._mkldnn
            got = onednn.conv2d(x, got_weight, None, (1, 1), (1, 1), (1, 1), 1)
            torch.testing.assert_close(got, F.conv2d(x, want_weight, padding=1), rtol=1e-4,
                                       atol=1e-4)
            assert got.is_contiguous(memory_format=torch.channels_last)
        weight.mul_(-0.5)  # (WithDerived packs again: a new version)


def test_the_switch_and_the_build() -> None:
    assert config.from_env({}).onednn is True
    assert config.from_env({"MINICOMPILE_ONEDNN": "0"}).onednn is False
    assert ONEDNN == torch.backends.mkldnn.is_available()
