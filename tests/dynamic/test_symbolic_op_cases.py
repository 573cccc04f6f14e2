"""Every case of the differential suite again, compiled with ``dynamic=True``: each size of
at least 2 is a symbol, so the kernels index with size arguments, the wrapper computes
shapes and grids from them, and returned views are rebuilt from the call's shapes.  The
values, dtypes, shapes and strides must equal eager's as in the static suite.
"""

from __future__ import annotations

import os
import sys
import zlib

import pytest
import torch

import minicompile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backends"))

from devices import device_for  # noqa: E402
from op_cases import CASES as OP_CASES  # noqa: E402
from reduction_cases import CASES as REDUCTION_CASES  # noqa: E402
from shape_cases import CASES as SHAPE_CASES  # noqa: E402
from test_ops import assert_same  # noqa: E402


def _unique(cases: list) -> list:
    seen: set[str] = set()
    return [c for c in cases if not (c.name in seen or seen.add(c.name))]


CASES = _unique(OP_CASES + REDUCTION_CASES + SHAPE_CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_eager_with_symbolic_sizes(case, backend: str) -> None:  # noqa: ANN001
    device = device_for(backend)
    torch.manual_seed(zlib.crc32(case.name.encode()))
    compiled = minicompile.compile(case.fn, backend=backend, dynamic=True)
    for call in range(2):
        args = case.sample(device)
        expected = case.fn(*args)
        actual = compiled(*args)
        where = f"{case.name} on {backend} with dynamic=True, call {call}"
        assert_same(actual, expected, args, where, case.exact, case.tol)
    assert minicompile.stats()["eager_fallbacks"] == 0
