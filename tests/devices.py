"""Which device each backend's tests use (shared by conftest.py and the test modules)."""

from __future__ import annotations

import torch

BACKENDS = ("cpp", "triton")
CUDA = torch.cuda.is_available()


def device_for(backend: str) -> torch.device:
    """The C++ backend only compiles CPU tensors; Triton uses the GPU when there is one and
    its interpreter on CPU tensors otherwise."""
    if backend == "triton" and CUDA:
        return torch.device("cuda")
    return torch.device("cpu")


# PyTorch before 2.13 (the GPU machine has 2.11) compiles pooling over symbolic image sizes
# more than once under dynamic=True (not yet diagnosed; its values are still checked).
POOLING_RECOMPILES = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (
    2, 13)


def expect_one_compile(pools: bool, stats: dict) -> None:
    """One entry for every call: a frame compiled, or its entry loaded from a cache shared
    between runs (MINICOMPILE_TEST_SHARED_CACHE, tests/dynamic/test_warm_runs.py); or an
    expected failure where ``pools`` on a release that recompiles."""
    entries = stats["frames"] + stats["warm_entries"]
    if entries != 1 and pools and POOLING_RECOMPILES:
        import pytest

        pytest.xfail(f"PyTorch {torch.__version__} recompiles symbolic pooling: {stats}")
    assert entries == 1, stats
