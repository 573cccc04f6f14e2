"""MINICOMPILE_CHECK=1: each compiled graph runs beside eager; a wrong value is reported
with the first graph node that differs and its source line, and eager's value is returned.

A wrong answer is made on purpose by breaking one entry of a backend's op table (``exp``
computes ``exp(x) + 1``); the report must name the ``exp`` node and its line, not the
nodes before it (right) or after it (wrong only because they read it)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.check import CheckFailed, difference
from minicompile.codegen import cpp, triton


def pipeline(x, y):
    a = x * 2 + y
    b = torch.exp(a)
    c = b.sum(-1)
    return c + 1, a


def _line(text: str) -> int:
    lines, start = inspect.getsourcelines(pipeline)
    return start + next(k for k, line in enumerate(lines) if text in line)


@pytest.fixture
def wrong_exp(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    table = cpp.CPP_OPS if backend == "cpp" else triton.TRITON_OPS
    one = "1.0f" if backend == "cpp" else "1.0"
    monkeypatch.setitem(table, "exp", f"({table['exp']} + {one})")


def test_check_names_the_first_wrong_node(backend: str, device: torch.device,
                                          wrong_exp: None) -> None:
    with config.patch(check=True):
        compiled = minicompile.compile(pipeline, backend=backend)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x, y = (torch.randn(3, 5, generator=g).to(device) for _ in range(2))
        with pytest.warns(CheckFailed) as caught:
            out = compiled(x, y)
        text = str(caught[0].message)
        assert "pipeline's output 0 differs from eager" in text
        assert "the first node that differs" in text and "= exp(" in text
        assert f":{_line('torch.exp(a)')} in pipeline" in text and "b = torch.exp(a)" in text
        for a, e in zip(out, pipeline(x, y)):  # eager's values are returned
            torch.testing.assert_close(a, e)


def test_check_is_quiet_when_compiled_code_is_right(backend: str, device: torch.device
                                                    ) -> None:
    with config.patch(check=True):
        compiled = minicompile.compile(pipeline, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckFailed)
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            x, y = (torch.randn(4, 7, generator=g).to(device) for _ in range(2))
            for a, e in zip(compiled(x, y), pipeline(x, y)):
                torch.testing.assert_close(a, e)


def test_check_is_off_by_default_and_read_from_the_environment(
        backend: str, device: torch.device, wrong_exp: None) -> None:
    assert config.from_env({"MINICOMPILE_CHECK": "1"}).check
    assert not config.from_env({}).check
    compiled = minicompile.compile(pipeline, backend=backend)
    for value in (0.0, 0.5):
        x = torch.full((2, 3), value, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CheckFailed)
            wrong = compiled(x, x)[0]  # unchecked: the broken table shows
        assert not torch.allclose(wrong, pipeline(x, x)[0])


def test_difference_uses_the_dtype_tolerance() -> None:
    x = torch.tensor([1.0, 2.0, float("nan"), float("inf")])
    assert difference(x + 1e-7, x) is None
    assert "1 of 4 values differ, first at (1,)" in difference(x + torch.tensor([0, 1e-3, 0, 0]),
                                                               x)
    assert difference(x.half() + 0.001, x.half()) is None
    assert difference(torch.tensor([1, 2]), torch.tensor([1, 3])) is not None
