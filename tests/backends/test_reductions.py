"""The differential suite over issue #4's operators: the cases of reduction_cases.py
(reductions, normalisations, losses) and shape_cases.py (views, index ops, extern kernels),
on every backend, with the one check of test_ops.py; plus out-of-range indices, which must
raise in the compiled function as they do in eager."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

import minicompile

import minicompile.codegen.triton_reduction as triton_reduction
from devices import device_for
from op_cases import OpCase
from reduction_cases import CASES as REDUCTION_CASES
from reduction_cases import LOOPED
from shape_cases import CASES as SHAPE_CASES
from shape_cases import OUT_OF_RANGE
from test_ops import check_case


def _unique(cases: list[OpCase]) -> list[OpCase]:
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"duplicate case names: {sorted(duplicates)}"
    return cases


@pytest.mark.parametrize("case", _unique(REDUCTION_CASES), ids=lambda c: c.name)
def test_reduction_matches_eager(
    case: OpCase, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.name in LOOPED and backend == "triton" and device_for(backend).type == "cpu":
        # The interpreter keeps rows up to 65536 wide in one block; a GPU loops over rows
        # wider than PERSISTENT_LIMIT.  Test the GPU's looped kernel here too.
        monkeypatch.setattr(
            triton_reduction, "INTERPRET_PERSISTENT", triton_reduction.PERSISTENT_LIMIT
        )
    check_case(case, backend, request)


@pytest.mark.parametrize("case", _unique(SHAPE_CASES), ids=lambda c: c.name)
def test_shape_op_matches_eager(
    case: OpCase, backend: str, request: pytest.FixtureRequest
) -> None:
    check_case(case, backend, request)


@pytest.mark.parametrize("name, fn, make", OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_index_raises(name: str, fn, make, backend: str) -> None:  # noqa: ANN001
    """Compiled on good indices (so the second call runs the compiled code, a guard hit),
    then called with one out of range: it raises, as eager does, and never returns."""
    device = device_for(backend)
    torch.manual_seed(zlib.crc32(name.encode()))
    compiled = minicompile.compile(fn, backend=backend)
    good = make(device, False)
    torch.testing.assert_close(compiled(*good), fn(*good))
    assert minicompile.stats()["eager_fallbacks"] == 0, minicompile.stats()
    if device.type == "cuda":
        _device_assert_stops(name)
        return
    bad = make(device, True)
    # (On CUDA eager's own kernels stop on a device-side assert, which leaves the CUDA
    # context unusable for the rest of the process: that case returned above.)  The
    # compiled call raises eager's exception: its type and its message.
    with pytest.raises((IndexError, RuntimeError)) as eager_error:
        fn(*bad)
    with pytest.raises(type(eager_error.value)) as compiled_error:
        result = compiled(*bad)
        pytest.fail(f"returned {result!r} for an out-of-range index")
    assert str(compiled_error.value) == str(eager_error.value)


def _device_assert_stops(name: str) -> None:
    """On CUDA a compiled kernel stops on a device-side assert, as eager's kernels do (the
    host never waits to read an error flag).  That leaves the CUDA context unusable, so
    the bad call runs in a process of its own."""
    script = f"""
import sys, torch, minicompile
sys.path.insert(0, {str(Path(__file__).parent)!r})
from shape_cases import OUT_OF_RANGE
fn, make = next((f, m) for n, f, m in OUT_OF_RANGE if n == {name!r})
compiled = minicompile.compile(fn, backend="triton")
compiled(*make(torch.device("cuda"), False))
compiled(*make(torch.device("cuda"), True))
torch.cuda.synchronize()
print("returned")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "returned" not in proc.stdout, proc.stdout
    assert "device-side assert" in proc.stderr, proc.stderr[-2000:]
    assert "index out of range in" in proc.stderr, proc.stderr[-2000:]
