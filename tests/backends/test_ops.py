"""THE differential suite: every case of op_cases.py on every backend, against eager.

For each (case, backend) the function is compiled once and called on fresh random inputs
twice: the first call captures and compiles, the second must reuse the compiled code (a
guard hit) and still match eager on its new data.  Each output must equal eager's in value
(per-dtype tolerances), dtype, shape, strides, and aliasing (an output that eager returns
as a view of an input is a view of the same input here, and only then).
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

import minicompile

from devices import device_for
from op_cases import CASES, OpCase, by_name

F16_EPS = torch.finfo(torch.float16).eps
# float16: 1e-3 plus two ulps of slack (one rounding of a libm result may land one ulp
# away from eager's, and that ulp is 9.8e-4 at 1.0); bfloat16: PyTorch's own defaults.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float16: dict(rtol=1e-3 + 2 * F16_EPS, atol=1e-3 + 2 * F16_EPS),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}
CALLS = 2

by_name()  # fails collection on duplicate names


def tolerance(
    dtype: torch.dtype, overrides: dict[torch.dtype, dict[str, float]] | None = None
) -> dict[str, float]:
    if overrides and dtype in overrides:
        return overrides[dtype]
    if dtype.is_floating_point:
        return TOLERANCES.get(dtype, {})  # float32/64: assert_close's defaults
    return dict(rtol=0, atol=0)  # integers and bools: exact


def _storages(args: tuple) -> list[int]:
    return [a.untyped_storage().data_ptr() if isinstance(a, torch.Tensor) else -1 for a in args]


def assert_same(
    actual: Any,
    expected: Any,
    args: tuple,
    where: str,
    exact: bool = False,
    tol: dict[torch.dtype, dict[str, float]] | None = None,
) -> None:
    """``actual`` matches eager's ``expected``: structure, values (bitwise when ``exact``,
    else within ``tol`` or the per-dtype defaults), dtype, shape, strides, and which input
    (if any) each output aliases."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        assert actual.device == expected.device, f"{where}: device {actual.device}"
        if expected.numel() > 0:
            assert actual.stride() == expected.stride(), (
                f"{where}: stride {actual.stride()} != eager's {expected.stride()}"
            )
        torch.testing.assert_close(
            actual, expected, equal_nan=True,
            **(dict(rtol=0, atol=0) if exact else tolerance(expected.dtype, tol)),
            msg=lambda m: f"{where}: {m}",
        )
        storages = _storages(args)
        exp_storage = expected.untyped_storage().data_ptr()
        act_storage = actual.untyped_storage().data_ptr()
        if exp_storage in storages:
            k = storages.index(exp_storage)
            assert act_storage == storages[k], f"{where}: eager returns a view of input {k}"
            assert actual.storage_offset() == expected.storage_offset(), f"{where}: offset"
        else:
            assert act_storage not in storages, f"{where}: aliases an input; eager does not"
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        n, m = len(actual), len(expected)
        assert n == m, f"{where}: {n} outputs, eager returns {m}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, args, f"{where}[{k}]", exact, tol)
        if isinstance(expected, tuple):  # the same tensor returned twice stays one tensor
            for i in range(len(expected)):
                for j in range(i + 1, len(expected)):
                    if expected[i] is expected[j]:
                        assert actual[i] is actual[j], f"{where}: outputs {i}, {j} differ"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_eager(case: OpCase, backend: str, request: pytest.FixtureRequest) -> None:
    check_case(case, backend, request)


def check_case(case: OpCase, backend: str, request: pytest.FixtureRequest) -> None:
    """Compile ``case.fn`` once, call it on fresh inputs ``CALLS`` times, compare each
    result with eager's, and check that it compiled (no fallback, one graph, guard hits)."""
    device = device_for(backend)
    torch.manual_seed(zlib.crc32(case.name.encode()))
    compiled = minicompile.compile(case.fn, backend=backend)
    repro = f"repro: pytest '{request.node.nodeid}'"
    for call in range(CALLS):
        args = case.sample(device)
        expected = case.fn(*args)
        actual = compiled(*args)
        where = f"{case.name} on {backend}, call {call} ({repro})"
        assert_same(actual, expected, args, where, case.exact, case.tol)
    stats = minicompile.stats()
    # The case really compiled (an eager fallback would pass the value checks vacuously)
    # and the second call was a guard hit.
    assert stats["eager_fallbacks"] == 0, f"ran eagerly: {stats} ({repro})"
    assert stats["graphs"] == 1 and stats["frames"] == 1, f"{stats} ({repro})"
    assert stats["recompiles"] == 0, f"{stats} ({repro})"
