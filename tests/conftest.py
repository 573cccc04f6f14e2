"""Fixtures shared by every test folder.

Order matters at the top of this file: minicompile reads its configuration from the
environment once, when ``minicompile.config`` is imported, and Triton reads
``TRITON_INTERPRET`` when it is imported.  Both variables are set here, before anything
imports either package, so the suite never touches the user's ``~/.cache/minicompile``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch  # noqa: E402  (importing torch does not import triton)

# Kernels of the Triton backend run under Triton's interpreter on machines without a GPU.
# With a GPU the variable is left alone: set, it would make every @triton.jit kernel an
# interpreted one, and the CUDA run of the suite would never test real Triton code.
# (CPU tensors run under the interpreter either way; minicompile.runtime sees to that.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A private on-disk cache for the whole session (read once, at minicompile's import), or
# MINICOMPILE_TEST_SHARED_CACHE, with warm entries on: a directory shared between runs
# (tests/dynamic/test_warm_runs.py runs the dynamic-shape tests twice against one).
_SHARED_CACHE = os.environ.get("MINICOMPILE_TEST_SHARED_CACHE")
_CACHE_DIR = _SHARED_CACHE or tempfile.mkdtemp(prefix="minicompile-test-cache-")
os.environ["MINICOMPILE_CACHE_DIR"] = _CACHE_DIR
# Tracing and log output would only slow the suite down; tests that want them run a
# subprocess with their own environment.
for _name in ("MINICOMPILE_TRACE", "MINICOMPILE_LOGS", "MINICOMPILE_BACKEND"):
    os.environ.pop(_name, None)
# Tests count the frames each call captures: a function compiled by an earlier test would
# otherwise come back as a warm entry from the session's cache.  The warm-entry tests
# (tests/backends/test_warm_entries.py) turn them on, in fresh processes.
os.environ["MINICOMPILE_WARM_ENTRIES"] = "1" if _SHARED_CACHE else "0"

import pytest  # noqa: E402

# The library-model zoo (examples/model_zoo.py) serves the model tests and the benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import minicompile  # noqa: E402

from devices import BACKENDS, CUDA, device_for  # noqa: E402
from known_failures import apply_known_failures  # noqa: E402


# Compiled and eager code are compared in full float32: with TF32 (cuDNN's default) a
# convolution's result depends on which cuDNN algorithm runs, and a channels-last one
# (passes/layout.py) runs another than eager's.
if CUDA:
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """``cuda`` when available else ``cpu``; in a test that also takes ``backend``, the
    device that backend applies to (always ``cpu`` for ``cpp``)."""
    if "backend" in request.fixturenames:
        return device_for(request.getfixturevalue("backend"))
    return torch.device("cuda" if CUDA else "cpu")


@pytest.fixture(autouse=True)
def _fresh_minicompile() -> None:
    """Every test starts with no compiled code and zeroed stats."""
    minicompile.reset()


@pytest.fixture(scope="session")
def cache_dir() -> str:
    """The session's MINICOMPILE_CACHE_DIR."""
    return _CACHE_DIR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    apply_known_failures(items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _SHARED_CACHE:  # (a shared one is its owner's)
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
