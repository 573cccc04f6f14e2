"""Library plans ahead: a generated module's convolutions, prepared in parallel threads
while the module finishes loading.

cuDNN prepares a plan for each convolution problem (sizes, strides, dtype, parameters) at
its first call in a process: heuristics, then building the engine, a few milliseconds
each, one problem after another.  On an H100 that is 0.12-0.14 s of resnet50's first call
(23 distinct convolutions, bf16, channels-last), more than everything else a warm process
does to load the model's compiled code.  Running each problem once on scratch tensors of
the same layouts, in eight threads while the process loads the rest of the entry (its
guards) or builds the module's kernels, takes the part of that cost cuDNN keeps for the
process (its engines' kernels, loaded at their first use, and each thread's first call):
see :class:`LibraryPlans`.  The plans themselves PyTorch keeps per thread (its cache of
cuDNN plans is thread-local), so the real call still builds its own, 2-3 ms a problem
(resnet50's first warm call on an H100: 50-90 ms of convolutions, against 120-130 ms
without the threads).  Preparing them in the calling thread while another thread loads
the entry was measured and gained nothing: the calling thread's plans cost the same
there, and the entry loads in half that time.

Nothing here changes a result: the scratch calls' outputs are dropped, a failure is
ignored (the real call reports whatever is wrong), and the first call of the module waits
for the threads, so that none runs on past it.  It is skipped where it could change
what the real call does or costs:

- ``torch.backends.cudnn.benchmark``: plans are then chosen by timing the candidates, which
  threads running at once would skew (and the first call times them anyway);
- a stream capturing a CUDA graph: work from other threads would break the capture;
- problems whose tensors exceed :data:`MAX_BYTES`: their first call is long anyway, and
  scratch copies of them would take memory the program may need.
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
    """A tensor argument of a library call, as codegen knows it: a scratch tensor of this
    size, stride, dtype and device stands for it."""

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
    """``LibraryPlans([(fn, args, kwargs), ...])``: call each ``fn(*args, **kwargs)`` once,
    with its :class:`Like` stand-ins made real, in up to :data:`MAX_THREADS` threads.  The
    module's loader calls :meth:`start` once its kernels are loaded (runtime/build.py);
    :meth:`wait` returns when the threads are done (the module's ``call`` waits before its
    first convolution).  Plans not started by then are left to the real calls."""

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
    """At exit, before the interpreter and PyTorch are torn down under a thread still in
    cuDNN (a process that exits right after loading a module)."""
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
