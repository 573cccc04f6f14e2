"""Gradient differential tests: every case of the differential suite, differentiated.

For each case whose inputs include floating-point tensors and whose outputs take a
gradient, the float inputs become leaves that require grad; the compiled function and the
eager one each produce outputs, a loss that weighs every output element with fresh random
weights is differentiated with ``torch.autograd.grad``, and the gradients must match
eager's.  As in the forward suite, each compiled function is called twice with fresh
values (the second call a guard hit), and the backward must have compiled: no eager
fallback, one graph.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

import minicompile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "backends"))

import op_cases  # noqa: E402  (the differential suite's cases)
import reduction_cases  # noqa: E402
import shape_cases  # noqa: E402
from devices import device_for  # noqa: E402
from test_ops import TOLERANCES  # noqa: E402

CALLS = 2


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _differentiable(case: Any) -> bool:
    """Whether the case has float inputs and an output that depends on them (decided on
    one CPU sample, before any test runs)."""
    torch.manual_seed(0)
    args = _leaves(case.sample(torch.device("cpu")))
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return False
    try:
        with torch.enable_grad():
            outs = [o for o in _tensors(case.fn(*args)) if o.requires_grad]
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if outs:  # eager's backward may itself refuse (floor_divide)
                torch.autograd.grad(sum(o.float().sum() for o in outs), leaves,
                                    allow_unused=True)
    except Exception:
        return False
    return bool(outs)


def _leaves(args: tuple) -> tuple:
    return tuple(
        a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a for a in args
    )


CASES = [c for c in (*op_cases.CASES, *reduction_cases.CASES, *shape_cases.CASES)
         if _differentiable(c)]


def grad_tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Gradients chain several rounded ops: float32 to 1e-4, low precision at twice the
    forward suite's tolerance."""
    if dtype in TOLERANCES:
        return {k: 2 * v for k, v in TOLERANCES[dtype].items()}
    return dict(rtol=1e-4, atol=1e-5)


def gradients(fn: Any, args: tuple, weights: list | None) -> tuple[list, list]:
    outs = [o for o in _tensors(fn(*args)) if o.requires_grad]
    if weights is None:
        weights = [torch.randn(o.shape, dtype=torch.float32, device=o.device) for o in outs]
    loss = sum(((o.float() * w).sum() for o, w in zip(outs, weights)),
               torch.zeros((), device=outs[0].device))
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return list(grads), weights


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_eager(case: Any, backend: str, request: pytest.FixtureRequest) -> None:
    device = device_for(backend)
    torch.manual_seed(zlib.crc32(case.name.encode()))
    compiled = minicompile.compile(case.fn, backend=backend)
    repro = f"repro: pytest '{request.node.nodeid}'"
    for call in range(CALLS):
        args = _leaves(case.sample(device))
        expected, weights = gradients(case.fn, args, None)
        actual, _ = gradients(compiled, args, weights)
        for k, (a, e) in enumerate(zip(actual, expected)):
            where = f"{case.name} on {backend}, call {call}, grad {k} ({repro})"
            if e is None:
                assert a is None or not a.any(), f"{where}: eager gives no gradient"
                continue
            assert a is not None, f"{where}: no gradient, eager gives one"
            assert a.dtype == e.dtype and a.shape == e.shape, f"{where}: {a.dtype}{a.shape}"
            torch.testing.assert_close(a, e, equal_nan=True, **grad_tolerance(e.dtype),
                                       msg=lambda m: f"{where}: {m}")
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0, f"ran eagerly: {stats} ({repro})"
    assert stats["graphs"] == 1 and stats["recompiles"] == 0, f"{stats} ({repro})"


# Values where a piecewise op's derivative is a convention: its kinks (0 for relu and abs,
# the bounds for clamp, hardtanh and the hard activations), signed zeros, NaN, and ties of maximum.
KINK_VALUES = [-1.0, -0.5, -0.0, 0.0, 0.5, 1.0, float("nan"), 0.0, 0.0, -0.5]
KINKS = {
    "relu": lambda x: torch.relu(x),
    "relu_after_relu": lambda x: torch.relu(torch.relu(x) - 0.5) + torch.relu(x),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "clamp_min": lambda x: x.clamp(min=0.0),
    # Tensor bounds: ties get 1 up to PyTorch 2.13, 0.5 from 2.14 (minicompile/compat.py).
    "clamp_tensor_bounds": lambda x: x.clamp(torch.full_like(x, -0.5), torch.full_like(x, 0.5)),
    "clamp_min_tensor": lambda x: torch.clamp(x, min=torch.zeros_like(x)),
    "abs": lambda x: torch.abs(x),
    "maximum_ties": lambda x: torch.maximum(x, x.roll(1, 0)),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x, -0.5, 0.5),
    "leaky_relu": lambda x: torch.nn.functional.leaky_relu(x, 0.1),
    "relu6": lambda x: torch.nn.functional.relu6(x * 6.0),  # (bounds at -1 and 1)
    "hardswish": lambda x: torch.nn.functional.hardswish(x * 3.0),
    "hardsigmoid": lambda x: torch.nn.functional.hardsigmoid(x * 3.0),
}


@pytest.mark.parametrize("name", KINKS)
def test_gradients_at_kinks_match_eager(name: str, backend: str) -> None:
    """Eager's convention at a kink, not the one a decomposition would give (relu's
    gradient at exactly 0 is 0: a ResNet block's zero-initialised last batch norm makes
    many exact zeros, and a gradient of 1 there gave other batch-norm gradients)."""
    fn = KINKS[name]
    compiled = minicompile.compile(fn, backend=backend)
    device = device_for(backend)
    for _ in range(CALLS):
        values = torch.tensor(KINK_VALUES)
        x = torch.cat([values, torch.randn(6)]).to(device).requires_grad_()
        (expected,), weights = gradients(fn, (x,), None)
        (actual,), _ = gradients(compiled, (x,), weights)
        torch.testing.assert_close(actual, expected, equal_nan=True, rtol=1e-6, atol=1e-7)
    assert minicompile.stats()["eager_fallbacks"] == 0
