"""The one table of known failures: test id -> reason.

Each entry is applied as ``pytest.mark.xfail(strict=True, reason=...)``, so a test listed
here that starts passing fails the suite until its line is removed.  Ids are pytest node
ids relative to ``tests/`` (``backends/test_ops.py::test_matches_eager[sin-cpp]``).
Nothing is ever skipped silently: a genuine limitation goes here, with its reason.
"""

from __future__ import annotations

import pytest
import torch

_PARTIAL = "functools.partial objects cannot be created inside the trace yet (capture)"

_EXTERN_META_STRIDES = (
    "output strides come from PyTorch's meta kernels, which for scaled_dot_product_attention "
    "of a transposed q, and for batch_norm of a channels-last-like input, differ from the CPU "
    "kernels' (minicompile/ops.py infer_meta); values are right, strides differ"
)

KNOWN_FAILURES: dict[str, str] = {
    "programs/test_programs.py::test_program_matches_eager[cpp-functools_partial]": _PARTIAL,
    "programs/test_programs.py::test_program_matches_eager[triton-functools_partial]": _PARTIAL,
    # The meta kernels agree with the CPU kernels here and with the CUDA kernels there:
    # which cases differ depends on the device the backend runs on.
    **{
        f"backends/test_reductions.py::{test}[{backend}-{case}]": _EXTERN_META_STRIDES
        for backend in (("cpp",) if torch.cuda.is_available() else ("cpp", "triton"))
        for test, case in (
            ("test_reduction_matches_eager", "batch_norm_eval_transposed"),
            ("test_shape_op_matches_eager", "sdpa_transposed_q"),
        )
    },
    **{
        f"dynamic/test_symbolic_op_cases.py::test_matches_eager_with_symbolic_sizes"
        f"[{backend}-batch_norm_eval_transposed]": _EXTERN_META_STRIDES
        for backend in (("cpp",) if torch.cuda.is_available() else ("cpp", "triton"))
    },
}


def apply_known_failures(items: list[pytest.Item]) -> None:
    for item in items:
        nodeid = item.nodeid.removeprefix("tests/")
        reason = KNOWN_FAILURES.get(nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
