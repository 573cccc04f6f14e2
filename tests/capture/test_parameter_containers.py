"""nn.ParameterList / nn.ParameterDict in a compiled forward, on every backend against eager:
indexing (ints, negative, slices, keys), len, iteration, ``in`` and the mapping methods, in
eval and in training; the parameters are graph inputs read by reference (an in-place edit
between calls is seen, gradients reach them), and a changed length or key set recompiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from capture_helpers import capture

import minicompile
from minicompile.errors import Unsupported


class Mixed(nn.Module):
    def __init__(self, n: int = 3, d: int = 5) -> None:
        super().__init__()
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(d)) for _ in range(n)])
        self.pdict = nn.ParameterDict({k: nn.Parameter(torch.randn(d)) for k in "ab"})

    def forward(self, x):
        y = x * self.plist[0] + self.plist[-1]
        for i, p in enumerate(self.plist[1:][::-1]):  # a slice of a slice
            y = y * p + i
        for p in self.plist:
            y = torch.tanh(y + p)
        for k, v in self.pdict.items():
            y = y * v if k == "a" else y - v
        for k in self.pdict:
            y = y + self.pdict[k] * len(self.pdict)
        y = y + sum(self.pdict.values()) + self.pdict.get("b")
        if "c" in self.pdict or not self.plist:
            y = y * 0
        return y * len(self.plist), self.plist[:2]


def _check(model: nn.Module, compiled: nn.Module, device: torch.device, train: bool) -> None:
    x = torch.randn(4, 5, device=device, requires_grad=train)
    got, got_slice = compiled(x)
    want, want_slice = model(x)
    torch.testing.assert_close(got, want)
    # eager makes a new ParameterList of the same parameters
    assert type(got_slice) is nn.ParameterList
    assert [id(p) for p in got_slice] == [id(p) for p in want_slice]
    if train:
        params = list(model.parameters())
        got_grads = torch.autograd.grad(got.square().sum(), [x, *params])
        want_grads = torch.autograd.grad(want.square().sum(), [x, *params])
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_parameter_containers_match_eager(backend: str, device: torch.device,
                                          train: bool) -> None:
    torch.manual_seed(0)
    model = Mixed().to(device)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    with torch.set_grad_enabled(train):
        _check(model, compiled, device, train)
        with torch.no_grad():  # an optimizer step: read by reference, no recompile
            model.plist[0].mul_(-2.0)
            model.pdict["b"].add_(1.0)
        _check(model, compiled, device, train)
    assert minicompile.stats()["frames"] == 1
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_changed_length_or_keys_recompile(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = Mixed().to(device)
    compiled = minicompile.compile(model, backend=backend)
    with torch.no_grad():
        _check(model, compiled, device, False)
        model.plist.append(nn.Parameter(torch.randn(5, device=device)))
        _check(model, compiled, device, False)
        model.pdict["c"] = nn.Parameter(torch.randn(5, device=device))  # `in` now true
        _check(model, compiled, device, False)
        del model.pdict["a"]
        _check(model, compiled, device, False)
    assert minicompile.stats()["recompiles"] == 3


def test_out_of_range_and_missing_keys_are_refused() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.plist = nn.ParameterList([nn.Parameter(torch.randn(3))])
            self.pdict = nn.ParameterDict({"a": nn.Parameter(torch.randn(3))})

        def forward(self, x, i: int, key: str):
            return x + self.plist[i] + self.pdict[key]

    model, x = Bad(), torch.randn(3)
    with pytest.raises(Unsupported, match="ParameterList index 1 out of range"):
        capture(Bad.forward, model, x, 1, "a")
    with pytest.raises(Unsupported, match="ParameterDict has no key 'b'"):
        capture(Bad.forward, model, x, 0, "b")
    with pytest.raises(IndexError):  # as eager
        minicompile.compile(model)(x, 1, "a")
