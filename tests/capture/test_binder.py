"""A call's arguments bound to the frame's parameters (minicompile/binder.py): the same
values, defaults, ``*args`` and ``**kwargs`` as eager, and eager's TypeError for a call
that does not fit, through minicompile.compile on each backend."""

from __future__ import annotations

import re

import pytest
import torch

import minicompile
from minicompile.binder import binder

from devices import device_for


def forward(x, w=None, /, b=None, *rest, scale=2.0, shift, **extra):
    out = x * scale + shift
    if w is not None:
        out = out @ w
    if b is not None:
        out = out + b
    for r in rest:
        out = out - r
    for key in sorted(extra):
        out = out + extra[key]
    return out


def test_binder_returns_the_frame_parameters_in_code_order() -> None:
    bind = binder(forward)
    assert bind(1, shift=3) == (1, None, None, 2.0, 3, (), {})
    assert bind(1, 2, 3, 4, 5, shift=6, z=7, scale=8) == (1, 2, 3, 8, 6, (4, 5), {"z": 7})
    for args, kwargs in [((1,), {}), ((), dict(x=1, shift=2)), ((1, 2, 3), dict(b=4, shift=1))]:
        with pytest.raises(TypeError) as eager:
            forward(*args, **kwargs)
        with pytest.raises(TypeError, match=f"^{re.escape(str(eager.value))}$"):
            bind(*args, **kwargs)


def test_compiled_calls_bind_as_eager(backend: str) -> None:
    compiled = minicompile.compile(forward, backend=backend)
    device = device_for(backend)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device)

    for _ in range(2):  # fresh values each time: the second call runs the cached code
        x, w, b, r, s, z = t(4, 8), t(8, 8), t(8), t(4, 8), t(4, 8), t(4, 8)
        calls = [((x,), dict(shift=s)), ((x, w, b, r), dict(shift=s, scale=0.5, z=z)),
                 ((x, w), dict(b=b, shift=1.5))]
        for args, kwargs in calls:
            torch.testing.assert_close(compiled(*args, **kwargs), forward(*args, **kwargs))
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'shift'"):
        compiled(x)


def test_index_error_flag_of_a_cpp_kernel() -> None:
    """A C++ kernel's index check sets a C int: out of range, eager's IndexError."""

    def f(weight, ids):
        return torch.nn.functional.embedding(ids, weight).sum(-1).sin()

    compiled = minicompile.compile(f, backend="cpp")
    for _ in range(2):
        weight, ids = torch.randn(10, 4), torch.randint(0, 10, (6,))
        torch.testing.assert_close(compiled(weight, ids), f(weight, ids))
    with pytest.raises(IndexError):
        compiled(torch.randn(10, 4), torch.tensor([3, 12, 1, 0, 2, 5]))
    weight, ids = torch.randn(10, 4), torch.randint(0, 10, (6,))
    torch.testing.assert_close(compiled(weight, ids), f(weight, ids))
