"""Reshapes, convolutions, pooling and item assignment over symbolic sizes (issue #33):
``dynamic=True`` compiles each once for every size, values equal to eager on both backends.
A reshape between sizes of no known order indexes through the flat index.
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F

import minicompile
from minicompile.sym import size_symbol
from minicompile.view_rules import reshape_mapping

from devices import expect_one_compile

TOL = dict(rtol=1e-4, atol=1e-4)


class Heads(torch.nn.Module):
    """GPT-2's attention reshapes: [B, T, C] -> [B*T, C] -> [B, T, H, C/H] and back."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, t, c = x.shape
        y = self.proj(x.view(b * t, c)).view(b, t, 4, c // 4).transpose(1, 2)
        return y.softmax(-1).transpose(1, 2).reshape(b, t, c).sin()


def conv_pool(x, w):
    y = F.max_pool2d(F.conv2d(x, w, stride=2, padding=1).relu(), 3, stride=2, padding=1)
    return F.avg_pool2d(y, 2, ceil_mode=True) + F.adaptive_avg_pool2d(y, 1)


def assign(x, v):
    x = x.clone()
    x[:, 1:3] = v  # broadcasts [1, 2] over the rows
    x[-1] = 0
    x[..., 0] += 1
    return x * 2


def transposed_reshape(x):
    return x.sin().reshape(x.shape[1], x.shape[0]).cos()  # s0*s1 as (s1, s0): no dim lines up


CASES = {
    "heads": (Heads(), lambda n, m: (torch.randn(n, m, 16),)),
    "conv_pool": (conv_pool, lambda n, m: (torch.randn(n, 3, m + 9, 2 * m + 5),
                                           torch.randn(4, 3, 3, 3))),
    "assign": (assign, lambda n, m: (torch.randn(n, m + 3), torch.randn(1, 2))),
    "transposed_reshape": (transposed_reshape, lambda n, m: (torch.randn(n, m),)),
}


@pytest.mark.parametrize("name", CASES)
def test_compiles_once_for_every_size(name: str, backend: str, device: torch.device) -> None:
    fn, make = CASES[name]
    fn = fn.to(device) if isinstance(fn, torch.nn.Module) else fn
    compiled = minicompile.compile(fn, backend=backend, dynamic=True)
    for n, m in ((2, 3), (5, 7), (3, 12)):
        args = tuple(a.to(device) for a in make(n, m))
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), fn(*args), **TOL)
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0, stats
    expect_one_compile(name == "conv_pool", stats)


def test_reshape_orders_products_of_symbols() -> None:
    s0, s1 = size_symbol(0), size_symbol(1)
    # s0 < s0*s1 because every size symbol is at least 2: [s0, s1, 64] -> [s0*s1, 4, 16]
    mapping = reshape_mapping((s0, s1, sympy.Integer(64)), (s0 * s1, 4, 16))
    assert str(mapping) == "{i0: FloorDiv(i0, s1), i1: ModularIndexing(i0, 1, s1), i2: 16*i1 + i2}"
    # s0 and s1 have no order: one group, through the flat index
    mapping = reshape_mapping((s0, s1), (s1, s0))
    assert str(mapping) == "{i0: FloorDiv(i0*s0 + i1, s1), i1: ModularIndexing(i0*s0 + i1, 1, s1)}"


def test_index_printers_parenthesise_a_square_divisor() -> None:
    from minicompile.codegen.printers import cpp_index, triton_index
    from minicompile.sym import FloorDiv, ModularIndexing, index_symbol

    x, s1 = index_symbol("x"), size_symbol(1)  # T5's [1, H, T, T] position bias
    assert triton_index(FloorDiv(x, s1**2)) == "(x // (s1*s1))"
    assert cpp_index(ModularIndexing(x, s1**2, 4)) == "((x / (s1*s1)) % 4)"
