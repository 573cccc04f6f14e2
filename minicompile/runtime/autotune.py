"""Autotuning of Triton launch configurations under ``mode="max-autotune"``.

An :class:`Autotuner` holds a kernel's candidates (codegen/triton_tuning.py), the
heuristic's first.  At the first launch of each *size class* it reads the choice from memory
or ``<cache>/autotune``, or times every candidate on copies of the stored-into arguments and
keeps the fastest.  A failing candidate is skipped; while a CUDA graph records, the
heuristic's configuration runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from minicompile import config, trace
from minicompile.runtime import cache

FORMAT = "minicompile-autotune-1"
GPU_REPS = 5
GPU_REP_MS = 1.0  # launches back to back in one timed rep: about this long
GPU_MAX_LAUNCHES = 100
INTERPRET_REPS = 1

# Since the process started (tests read them): size classes timed, choices read from disk,
# choices another Autotuner of the same kernel made.
counters = {"tuned": 0, "from_disk": 0, "in_memory": 0}
_memory: dict[str, int] = {}  # key -> the chosen candidate's index, in this process

# timer(choice, run, reset) -> milliseconds: run() launches the candidate once on the
# tuning arguments, reset() restores the copies of what it stores into.
Timer = Callable[["Choice", Callable[[], None], Callable[[], None]], float]
_timer: Timer | None = None


@contextlib.contextmanager
def use_timer(timer: Timer) -> Iterator[None]:
    global _timer  # (tests time candidates with their own timer)
    saved, _timer = _timer, timer
    try:
        yield
    finally:
        _timer = saved


def forget() -> None:  # the disk keeps them: the next launch looks there
    _memory.clear()


# A candidate replaces the heuristic's configuration only when it is faster by more than
# this fraction: closer than that, the timings' noise could choose a slower one.
MARGIN = 0.02


class Choice:
    """One candidate: a kernel (the persistent or looped variant) and its launch options."""

    def __init__(self, kernel: Any, **options: Any) -> None:
        self.kernel = kernel
        self.options = options
        self.launcher: Any = None  # a GPU Launcher (runtime/launch.py); None: interpreted
        self.launches = 0  # the program's launches of it (not tuning runs)

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def describe(self, base: str) -> str:
        shown = {k: v for k, v in self.options.items() if k not in ("debug", "sanitize_overflow")}
        text = ", ".join(f"{k}={v}" for k, v in shown.items())
        return text + (f" ({self.name.removeprefix(base + '_')})" if self.name != base else "")

    def grid(self, xnumel: int) -> int:
        return -(-xnumel // self.options["XBLOCK"])

    def launch(self, xnumel: int, args: tuple) -> None:
        if self.launcher is not None:
            self.launcher(self.grid(xnumel), *args)
        else:
            self.kernel[(self.grid(xnumel),)](*args, **self.options)


class Autotuner:
    """``tuner(numels, *args)``: launch the kernel over ``numels`` (xnumel[, rnumel]) in
    the configuration chosen for their size class.  ``written``: the positions of the
    tensors the kernel stores into (``in_place``: it reads them too); ``launcher``: on a
    GPU, the Launcher's (pointers, sizes, example)."""

    def __init__(self, name: str, source_hash: str, choices: tuple[Choice, ...],
                 written: tuple[int, ...], in_place: bool = False,
                 launcher: tuple | None = None) -> None:
        self.name, self.source_hash, self.choices, self.written = (
            name, source_hash, choices, written)
        self.in_place = in_place
        if launcher is not None:
            from minicompile.runtime.launch import Launcher

            for c in choices:
                c.launcher = Launcher(c.kernel, *launcher, **c.options)
        self.chosen: dict[tuple[int, ...], Choice] = {}  # size class -> choice

    def __call__(self, numels: tuple[int, ...], *args: Any) -> None:
        size = size_class(numels)
        choice = self.chosen.get(size)
        if choice is None:
            choice = self._choose(size, numels, args)
        choice.launches += 1
        choice.launch(numels[0], args)

    # -- choosing ---------------------------------------------------------------------------

    def key(self, size: tuple[int, ...], device: torch.device) -> str:
        candidates = [(c.name.replace(self.name, "KERNEL"), sorted(c.options.items()))
                      for c in self.choices]
        return cache.cache_key(FORMAT, self.source_hash, repr(candidates), repr(size),
                               device_name(device), cache._triton_version())

    def _choose(self, size: tuple[int, ...], numels: tuple[int, ...], args: tuple) -> Choice:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        key = self.key(size, device)
        index = _memory.get(key)
        if index is not None:
            counters["in_memory"] += 1
        else:
            index = self._read(key, size)
        if index is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                trace.emit("autotune", f"{self.name} {describe_size(size)}",
                           "a CUDA graph is recording: the heuristic default, tuned later")
                return self.choices[0]
            index = self._tune(size, numels, args, device, key)
        _memory[key] = index
        self.chosen[size] = self.choices[index]
        return self.choices[index]

    def _read(self, key: str, size: tuple[int, ...]) -> int | None:  # a bad record: warned
        path = cache.find(config.get().cache_dir, ("autotune", key[:2]), f"{key}.json")
        if path is None:
            return None
        try:
            record = json.loads(path.read_text())
            index = record["choice"]
            valid = (record["format"] == FORMAT and isinstance(index, int)
                     and 0 <= index < len(self.choices)
                     and record["config"] == self.choices[index].describe(self.name))
        except (OSError, ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            cache.warn_once(f"autotuning record {path} is corrupted (truncated or modified): "
                            f"tuning {self.name} again")
            cache.discard(path)
            return None
        counters["from_disk"] += 1
        trace.emit("autotune", f"{self.name} {describe_size(size)}",
                   f"{record['config']} (chosen earlier, read from {path})")
        return index

    def _tune(self, size: tuple[int, ...], numels: tuple[int, ...], args: tuple,
              device: torch.device, key: str) -> int:
        work, reset = tuning_args(args, self.written)
        timer = _timer or (functools.partial(gpu_time, repeat=not self.in_place)
                           if device.type == "cuda" else wall_time)
        times: list[float] = []
        notes: list[str] = []
        for k, c in enumerate(self.choices):
            try:
                times.append(timer(c, lambda c=c: c.launch(numels[0], work), reset))
            except Exception as e:  # noqa: BLE001 (a candidate Triton cannot build)
                if k == 0:
                    raise  # the heuristic's: as the default mode would
                times.append(math.inf)
                notes.append(f"{c.describe(self.name)}: {type(e).__name__}: {e}")
        best = min(range(len(times)), key=lambda k: (times[k], k))
        if times[best] > times[0] * (1 - MARGIN):  # within the timings' noise: the default
            best = 0
        counters["tuned"] += 1
        lines = [f"{c.describe(self.name)}: {t:.4f} ms"
                 + (" (chosen)" if k == best else "") + (" (the heuristic)" if k == 0 else "")
                 for k, (c, t) in enumerate(zip(self.choices, times))]
        trace.emit("autotune", f"{self.name} {describe_size(size)} on {device_name(device)}",
                   "\n".join(lines + [f"failed: {n}" for n in notes]))
        record = {"format": FORMAT, "kernel": self.name, "size_class": list(size),
                  "device": device_name(device), "choice": best,
                  "config": self.choices[best].describe(self.name), "times_ms": times}
        try:
            cache.store(config.get().cache_dir, ("autotune", key[:2]), f"{key}.json",
                        json.dumps(record, indent=1))
        except OSError as e:  # tuned again by the next process: never a reason to fail
            cache.warn_once(f"could not store the autotuning of {self.name}: {e}")
        return best

    def ahead(self) -> list[Any]:
        """The GPU launchers a first call builds: the stored choice's, or every candidate."""
        launchers = [c.launcher for c in self.choices if c.launcher is not None]
        example = launchers[0].example if launchers else None
        count = 2 if "RBLOCK" in self.choices[0].options else 1
        if not example or any(not isinstance(v, int) for v in example[-count:]):
            return launchers
        size = size_class(tuple(example[-count:]))
        key = self.key(size, torch.device("cuda", torch.cuda.current_device()))
        index = _memory.get(key)
        if index is None:
            index = self._read(key, size)
            if index is not None:  # (kept: the first launch reads no file again)
                _memory[key] = index
        return [launchers[index]] if index is not None else launchers


def ahead(values: Iterable[Any]) -> list[Any]:  # of the Autotuners among ``values``
    return [launcher for v in values if isinstance(v, Autotuner) for launcher in v.ahead()]


def size_class(numels: tuple[int, ...]) -> tuple[int, ...]:  # rounded up to powers of two
    return tuple(1 << max(0, n - 1).bit_length() for n in numels)


def describe_size(size: tuple[int, ...]) -> str:
    return "numel " + " x ".join(f"2^{n.bit_length() - 1}" for n in size)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} (Triton's interpreter, {platform.machine()})"


# -- tuning on copies ---------------------------------------------------------------------------


def tuning_args(args: tuple, written: tuple[int, ...]) -> tuple[list, Callable[[], None]]:
    """``args`` with views of copies of the storages written at ``written``; the reset."""
    copies: dict[int, tuple[Any, Any]] = {}  # storage address -> (original, copy)
    for i in written:
        storage = args[i].untyped_storage()
        copies.setdefault(storage.data_ptr(), (storage, storage.clone()))
    work = list(args)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        pair = copies.get(a.untyped_storage().data_ptr())
        if pair is not None:
            work[i] = torch.empty((0,), dtype=a.dtype, device=a.device).set_(
                pair[1], a.storage_offset(), a.size(), a.stride())

    def reset() -> None:
        for original, copy in copies.values():
            copy.copy_(original)

    return work, reset


# -- timers --------------------------------------------------------------------------------------


def gpu_time(choice: Choice, run: Callable[[], None], reset: Callable[[], None],
             repeat: bool = True) -> float:
    """Milliseconds a launch takes on the GPU (one launch a rep unless ``repeat``: a kernel
    that reads what it stores runs from the originals each time)."""
    reset()
    run()  # builds the kernel
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    launches = max(1, min(GPU_MAX_LAUNCHES, int(GPU_REP_MS / once))) if repeat else 1
    times = []
    for _ in range(GPU_REPS):
        reset()
        start.record()
        for _ in range(launches):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)


def wall_time(choice: Choice, run: Callable[[], None], reset: Callable[[], None]) -> float:
    """Milliseconds of a run under Triton's interpreter (after one run, which prepares it)."""
    reset()
    run()
    times = []
    for _ in range(INTERPRET_REPS):
        reset()
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
