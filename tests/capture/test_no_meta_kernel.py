"""Library calls whose PyTorch has no meta kernel (minicompile/meta_rules.py's
WITHOUT_META_KERNEL): nn.TransformerEncoderLayer's fused eval path on PyTorch 2.11, where
``torch._transformer_encoder_layer_fwd`` raises NotImplementedError on meta tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minicompile
from minicompile import ops


@pytest.fixture
def no_meta_kernel(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """PyTorch without the fused encoder layer's meta kernel, as 2.11 is; the names asked."""
    asked: list[str] = []
    run_eager = ops.run_eager

    def without(name: str, args: tuple, kwargs: dict) -> object:
        if name == "torch._transformer_encoder_layer_fwd":
            asked.append(name)
            raise NotImplementedError(f"{name}: no fake impl or Meta kernel registered")
        return run_eager(name, args, kwargs)

    monkeypatch.setattr(ops, "run_eager", without)
    return asked


@pytest.mark.parametrize("norm_first", [False, True])
def test_fused_encoder_layer_compiles_whole_without_a_meta_kernel(
    no_meta_kernel: list[str], norm_first: bool
) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, activation="gelu").eval()
    compiled = minicompile.compile(layer, backend="cpp", fullgraph=True)
    with torch.no_grad():
        for n in (5, 7):
            x = torch.randn(2, n, 16)
            got, want = compiled(x), layer(x)
            assert got.shape == want.shape and got.stride() == want.stride()
            torch.testing.assert_close(got, want)
    assert no_meta_kernel  # (the rule was needed: the fused path was taken)
    assert minicompile.stats()["graph_breaks"] == 0


def test_an_op_without_a_rule_still_breaks_with_pytorchs_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_eager = ops.run_eager

    def without(name: str, args: tuple, kwargs: dict) -> object:
        if name == "torch.nn.functional.linear":
            raise NotImplementedError("aten::linear: no Meta kernel registered")
        return run_eager(name, args, kwargs)

    monkeypatch.setattr(ops, "run_eager", without)
    monkeypatch.setattr("minicompile.meta_rules.LIBRARY", {})

    def f(x, w):
        return torch.nn.functional.linear(x, w).relu()

    with pytest.raises(minicompile.Unsupported, match="NotImplementedError: aten::linear"):
        minicompile.compile(f, backend="cpp", fullgraph=True)(torch.randn(3, 4), torch.randn(5, 4))
