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
