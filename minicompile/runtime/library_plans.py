"""Library plans ahead: a generated module's convolutions, prepared in parallel threads
while the module finishes loading.

cuDNN prepares a plan per convolution problem at its first call in a process (0.12-0.14 s of
resnet50's first call on an H100); running each problem once on scratch tensors in threads
pays that ahead (first warm call: 50-90 ms of convolutions instead of 120-130).  Nothing
here changes a result.  Skipped under ``cudnn.benchmark``, CUDA graph capture, and for
problems over :data:`MAX_BYTES`.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from minicompile import perf

MAX_BYTES = 64 << 20  # a problem's tensors, together, above which it is not prepared
MAX_THREADS = 8
THREAD_NAME = "minicompile-plans-"


class Like:
    """A tensor argument of a library call, as codegen knows it (a scratch tensor)."""

    def __init__(self, size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.size, self.stride, self.dtype, self.device = size, stride, dtype, device

    def nbytes(self) -> int:
        extent = 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride) if n > 0)
        return 0 if 0 in self.size else extent * self.dtype.itemsize

    def make(self) -> torch.Tensor:
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)


def _tensors(call: tuple[Any, tuple, dict]) -> list[Like]:
    _, args, kwargs = call
    return [v for v in (*args, *kwargs.values()) if isinstance(v, Like)]


def _real(value: Any) -> Any:
    return value.make() if isinstance(value, Like) else value


class LibraryPlans:
    """``LibraryPlans([(fn, args, kwargs), ...])``: each call made once, its :class:`Like`
    stand-ins made real, in threads from :meth:`start` (runtime/build.py, once the kernels
    are loaded) to :meth:`wait` (the module's ``call``, before its first convolution)."""

    def __init__(self, calls: Sequence[tuple[Any, tuple, dict]]) -> None:
        self.calls: list | None = list(calls)  # None once started, or too late to start
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        calls, self.calls = self.calls, None
        if not calls:
            return
        why = _skip_reason()
        if why is not None:
            perf.note(f"{len(calls)} convolution plan(s) not prepared ahead: {why}")
            return
        todo = [c for c in calls if sum(t.nbytes() for t in _tensors(c)) <= MAX_BYTES]
        count = min(len(todo), MAX_THREADS, max(1, (os.cpu_count() or 2) // 2))
        for k in range(count):
            thread = threading.Thread(target=_prepare, args=(todo[k::count],), daemon=True,
                                      name=f"{THREAD_NAME}{k}")
            thread.start()
            self.threads.append(thread)

    def wait(self) -> None:
        self.calls = None
        if self.threads:
            for thread in self.threads:
                thread.join()
            self.threads = []


@atexit.register
def _wait_all() -> None:
    """At exit: PyTorch must not be torn down under a thread still in cuDNN."""
    for thread in threading.enumerate():
        if thread.name.startswith(THREAD_NAME):
            thread.join()


def _skip_reason() -> str | None:
    if not torch.cuda.is_available() or not torch.backends.cudnn.is_available():
        return "cuDNN is not available"
    if not torch.backends.cudnn.enabled:
        return "cuDNN is disabled"
    if torch.backends.cudnn.benchmark:
        return "torch.backends.cudnn.benchmark chooses plans by timing them"
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"
    return None


def _prepare(calls: list[tuple[Any, tuple, dict]]) -> None:
    with torch.no_grad():  # (grad mode is a thread's own)
        for call in calls:
            fn, args, kwargs = call
            device = _tensors(call)[0].device
            try:  # (the current device is a thread's own too)
                with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
                    fn(*[_real(a) for a in args], **{k: _real(v) for k, v in kwargs.items()})
            except Exception:  # noqa: BLE001, S112 (the real call reports what is wrong)
                continue
