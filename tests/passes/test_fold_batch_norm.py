"""passes/fold_batch_norm.py: eval-mode batch norms folded into the convolution before
them (plain, depthwise, grouped, without bias, 1-d and 3-d, bfloat16), the folded weights
computed once (passes/hoist_params.py) and again when a parameter changes; train-mode batch
norm and graphs that take gradients untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import minicompile
from minicompile import config

from devices import device_for


def _randomize(model: nn.Module) -> nn.Module:
    """Batch-norm statistics and affine parameters that are not the identity."""
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    return model


class Kinds(nn.Module):
    """One convolution of each kind, each followed by its batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.depthwise = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8, bias=False),
                                       nn.BatchNorm2d(8))
        self.grouped = nn.Sequential(nn.Conv2d(8, 12, 1, groups=4),
                                     nn.BatchNorm2d(12, affine=False))
        self.one_d = nn.Sequential(nn.Conv1d(3, 6, 3, bias=False), nn.BatchNorm1d(6))
        self.three_d = nn.Sequential(nn.Conv3d(2, 4, 2), nn.BatchNorm3d(4))

    def forward(self, x: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> tuple:
        return self.grouped(self.depthwise(self.plain(x))), self.one_d(s), self.three_d(v)


def _inputs(device: torch.device, dtype: torch.dtype = torch.float32) -> tuple:
    return (torch.randn(2, 4, 8, 8, device=device, dtype=dtype),
            torch.randn(2, 3, 10, device=device, dtype=dtype),
            torch.randn(1, 2, 4, 4, 4, device=device, dtype=dtype))


@pytest.fixture
def logged() -> object:
    """The graph logs on (read with capsys)."""
    with config.patch(logs=frozenset({"graph"})):
        yield


def _after_passes(err: str) -> str:
    return err.split("after passes ========")[1].split("========")[0]


@torch.no_grad()
def test_every_kind_of_convolution_folds_and_matches_eager(
        backend: str, capsys: pytest.CaptureFixture, logged: None) -> None:
    model = _randomize(Kinds()).eval().to(device_for(backend))
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    for _ in range(2):  # fresh values each call
        inputs = _inputs(device_for(backend))
        for got, want in zip(compiled(*inputs), model(*inputs), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert got.stride() == want.stride()
    err = capsys.readouterr().err
    assert "5 batch norms folded into their convolutions" in err
    main = _after_passes(err)  # the folding arithmetic runs once, outside the graph
    assert "batch_norm" not in main and "rsqrt" not in main, main
    assert main.count("placeholder derived_") == 10, main  # a weight and a bias each


@torch.no_grad()
def test_bfloat16_folds_in_float32_and_rounds_once() -> None:
    """The folded network is as close to a float64 one as eager's bfloat16 network is."""
    model = _randomize(Kinds()).eval()
    low = copy.deepcopy(model).to(torch.bfloat16)
    compiled = minicompile.compile(low, backend="cpp", fullgraph=True)
    for _ in range(2):
        inputs = _inputs(torch.device("cpu"))
        exact = model.double()(*(x.double() for x in inputs))
        low_inputs = [x.to(torch.bfloat16) for x in inputs]
        for got, want, ref in zip(compiled(*low_inputs), low(*low_inputs), exact, strict=True):
            assert got.dtype == torch.bfloat16
            eager_error = (want.double() - ref).abs().max().item()
            assert (got.double() - ref).abs().max().item() <= 2 * eager_error + 1e-2
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_mutated_parameters_and_buffers_are_folded_again(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing stale: an in-place change, load_state_dict, a new Parameter and new data
    each give eager's new answer; calls with nothing changed reuse the folded weights."""
    from minicompile.runtime import derived

    computed = []
    real = derived.WithDerived.compute
    monkeypatch.setattr(derived.WithDerived, "compute",
                        lambda self, sources: computed.append(1) or real(self, sources))
    device = device_for(backend)
    model = _randomize(nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6))).eval().to(device)
    other = _randomize(copy.deepcopy(model))
    with torch.no_grad():
        other[1].running_var.add_(1.0)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    changes = [
        lambda: None,
        lambda: None,
        lambda: model[1].running_mean.mul_(-2.0),
        lambda: model[0].weight.add_(0.5),
        lambda: model.load_state_dict(other.state_dict()),
        lambda: setattr(model[1], "weight", nn.Parameter(torch.randn(6, device=device))),
        lambda: setattr(model[0].bias, "data", torch.randn(6, device=device)),
    ]
    for change in changes:
        with torch.no_grad():
            change()
            x = torch.randn(2, 3, 6, 6, device=device)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(computed) == 6  # once, then once per change: none for the second call
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_train_mode_and_gradients_are_left_alone(
        backend: str, capsys: pytest.CaptureFixture, logged: None) -> None:
    device = device_for(backend)
    model = _randomize(nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6))).to(device)
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
    with torch.no_grad():  # training statistics, updated in place
        x = torch.randn(2, 3, 6, 6, device=device)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(twin[1].running_mean, model[1].running_mean)
    model.eval()
    twin.eval()
    x = torch.randn(2, 3, 6, 6, device=device)  # eval, but taking gradients
    compiled(x).sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(twin[0].weight.grad, model[0].weight.grad, rtol=1e-4, atol=1e-4)
    assert "folded" not in capsys.readouterr().err


@torch.no_grad()
def test_switched_off_by_the_config(capsys: pytest.CaptureFixture) -> None:
    model = _randomize(nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6))).eval()
    with config.patch(fold_batch_norm=False, logs=frozenset({"graph"})):
        compiled = minicompile.compile(model, backend="cpp")
        x = torch.randn(2, 3, 6, 6)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err  # the batch norm's per-element math stays
    assert "folded" not in err and "sub(" in _after_passes(err)
    assert config.from_env({"MINICOMPILE_FOLD_BN": "0"}).fold_batch_norm is False
    assert config.from_env({}).fold_batch_norm is True
