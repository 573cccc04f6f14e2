"""Mixed devices give PyTorch's own error; inputs that share storage (``f(a, a[0])``) with a
mutation compile (no eager fallback) and match eager, the caller's tensors included."""

from __future__ import annotations

import pytest
import torch

import minicompile


def _add_sin(x, y):
    return x.sin() + y


@pytest.mark.parametrize("meta_first", [False, True])
def test_inputs_on_different_devices_raise_pytorchs_error(meta_first: bool) -> None:
    compiled = minicompile.compile(_add_sin)
    for k in range(2):
        cpu, meta = torch.randn(3) + k, torch.empty(3, device="meta")
        args = (meta, cpu) if meta_first else (cpu, meta)
        with pytest.raises(RuntimeError) as eager:
            _add_sin(*args)
        with pytest.raises(RuntimeError) as got:
            compiled(*args)
        assert str(got.value) == str(eager.value)
    x, y = torch.randn(3), torch.randn(3)  # and same-device calls still compile
    torch.testing.assert_close(compiled(x, y), _add_sin(x, y))
    assert minicompile.stats()["graphs"] == 1


def test_meta_tensors_run_eagerly_not_compiled() -> None:
    compiled = minicompile.compile(_add_sin)
    for n in (3, 4):
        out = compiled(torch.empty(n, device="meta"), torch.empty(n, device="meta"))
        assert out.device.type == "meta" and out.shape == (n,)


def scale_row(a, row):
    row.mul_(10)
    return a + 1


def add_then_read(a, part):
    b = part * 2
    a.add_(1)
    return b + part, part


@pytest.mark.parametrize("fn", [scale_row, add_then_read])
def test_an_input_and_a_view_of_it_compile(backend: str, device: torch.device, fn) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    for seed, view in ((0, lambda x: x[0]), (1, lambda x: x[0]), (2, lambda x: x[1:3, ::2])):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 8, generator=g).to(device)
        x_eager = x.clone()
        out, expected = compiled(x, view(x)), fn(x_eager, view(x_eager))
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x, x_eager)  # the caller's tensor, mutated as in eager
    assert minicompile.stats()["eager_fallbacks"] == 0
    if fn is add_then_read:  # a returned view is the caller's view, as in eager
        x = torch.randn(4, 8, device=device)
        assert compiled(x, x[1:3, ::2])[1].data_ptr() == x[1:3, ::2].data_ptr()
