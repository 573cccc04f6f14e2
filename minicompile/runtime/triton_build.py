"""Triton kernels built ahead of their first launch, in parallel, into cubins in
minicompile's cache, and loaded for launches that bypass Triton.

A build is keyed (:func:`digest`) by source, argument specialization, options, Triton
version and GPU.  :func:`precompile` builds in worker processes (runtime/triton_worker.py),
:func:`find_or_build` at launch; what this path cannot do answers None (then ``triton.jit``).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import inspect
import json
import linecache
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from minicompile import compat, config, perf
from minicompile.errors import BackendCompilerFailed
from minicompile.runtime import cache, toolchain

WORKER = Path(__file__).with_name("triton_worker.py")

HEADER = """\
# minicompile: a Triton kernel, built ahead of its first launch (runtime/triton_build.py)
import triton
import triton.language as tl
from triton.language.extra import libdevice
"""


@dataclasses.dataclass(frozen=True)
class Built:
    """A compiled kernel in the cache, and what launching it takes."""

    cubin: Path
    name: str
    num_warps: int
    shared: int
    arg_codes: str


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether launches can bypass Triton: PyTorch's static CUDA launcher, Triton installed."""
    # (Triton 3.6, the oldest supported, specializes as this module does.)
    return (compat.STATIC_CUDA_LAUNCHER is not None and torch.cuda.is_available()
            and importlib.util.find_spec("triton") is not None)


@functools.lru_cache(maxsize=None)
def target(device: int) -> tuple[str, int, int]:
    """Triton's GPUTarget of ``device``: backend, architecture, warp size."""
    major, minor = torch.cuda.get_device_capability(device)
    return ("cuda", major * 10 + minor, 32)


def source(fn: Any) -> str:
    """The source of function ``fn``, decorators included, read from its file's lines by
    the code object's positions (``inspect.getsource`` tokenizes the whole file: a
    millisecond or two per kernel at a warm process's first launches)."""
    code = fn.__code__
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return inspect.getsource(fn)
    last = max((end for _, end, _, _ in code.co_positions() if end is not None),
               default=code.co_firstlineno)
    return "".join(lines[code.co_firstlineno - 1:last])


_files: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel function -> file


def kernel_file(kernel: Any) -> str:
    """A file of ``kernel`` and the helpers it calls, with real Triton imports (cached)."""
    text = _files.get(kernel.fn)
    if text is None:
        jitted = {k: v for k, v in kernel.fn.__globals__.items()
                  if hasattr(v, "fn") and hasattr(v, "arg_names") and callable(v.fn)}
        order: list[str] = []
        todo = [kernel.fn.__name__]
        while todo:
            name = todo.pop()
            if name not in order:
                order.append(name)
                todo += [n for n in jitted[name].fn.__code__.co_names if n in jitted]
        # the helpers first
        parts = [HEADER, *[source(jitted[name].fn) for name in reversed(order)]]
        text = _files[kernel.fn] = "\n\n".join(parts)
    return text


def int_class(v: int) -> tuple[bool, bool, bool]:
    """What Triton specializes an integer argument on: 1, a multiple of 16, 32 bits."""
    return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)


def describe(args: Sequence[Any]) -> tuple:
    """What Triton specializes a kernel on, for each argument."""
    return tuple(int_class(a) if isinstance(a, int) else (str(a.dtype), a.data_ptr() % 16 == 0)
                 for a in args)


def digest(text: str, name: str, described: tuple, options: dict, device: int) -> str:
    """The cache key of a build (identical kernels under other names share it)."""
    normalized = text.replace(f"def {name}(", "def KERNEL(")
    return cache.cache_key(normalized, repr(described), repr(sorted(options.items())),
                           cache._triton_version(), repr(target(device)))


# PyTorch's dtypes as Triton names them in a pointer's type ("*fp16").
TRITON_TYPES = {
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
    "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "u1",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8",
    "float8_e5m2fnuz": "fp8e5b16",
}


def specialization(arg: Any) -> tuple[str, Any] | None:
    """Triton's specialization of a launch argument, as ``triton.jit`` computes it (here,
    so that the launching process never imports Triton; a test checks the two agree): a
    pointer's type and 16-byte alignment ("D"), an integer's type (or the constant 1) and
    whether it is a multiple of 16.  None for an unknown dtype: then ask Triton's own."""
    if type(arg) is int:
        if arg == 1:
            return ("constexpr", 1)
        ty = ("i32" if -(2**31) <= arg < 2**31 else "u64" if 2**63 <= arg < 2**64 else "i64")
        return (ty, "D" if arg % 16 == 0 else "")
    name = TRITON_TYPES.get(str(getattr(arg, "dtype", "")).removeprefix("torch."))
    if name is None:
        return None
    return ("*" + name, "D" if arg.data_ptr() % 16 == 0 else "")


def _tritons_specialization(args: Sequence[Any], device: int) -> list[tuple[str, Any]]:
    """Triton's own specialization of ``args`` (imports Triton)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import MockTensor, native_specialize_impl

    backend = type(make_backend(GPUTarget(*target(device))))
    # A launcher's example stands for a tensor with its dtype (aligned): Triton's own.
    args = [a if isinstance(a, (int, torch.Tensor)) else MockTensor(a.dtype) for a in args]
    return [native_specialize_impl(backend, a, False, True, True) for a in args]


def cached(out: Path) -> Built | None:
    """The build at ``out`` (a path without suffix), if complete and intact."""
    try:
        launch = json.loads(out.with_suffix(".json").read_text())
        cubin = out.with_suffix(".cubin")
        cache.read_verified(cubin, launch["cubin_sha256"])
    except cache.CacheCorrupted as e:
        cache.warn_corrupted(e.path)
        cache.discard(out.with_suffix(".json"))
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Built(cubin, launch["name"], launch["num_warps"], launch["shared"],
                 launch["arg_codes"])


class Prepared:
    """A launch's build, located: its key, where its files go, and the job to build it."""

    def __init__(self, kernel: Any, args: Sequence[Any], options: dict, device: int) -> None:
        self.kernel, self.args, self.options, self.device = kernel, args, options, device
        self.text = kernel_file(kernel)
        self.key = digest(self.text, kernel.fn.__name__, describe(args), options, device)
        cfg = config.get()
        self.cache_dir = cfg.cache_dir
        self.parts = ("triton", self.key[:2])
        found = cache.find(cfg.cache_dir, self.parts, f"{self.key}.json")
        self.out = (found.parent if found else cache.folder(cfg.cache_dir, *self.parts)) / self.key

    def built(self) -> Built | None:
        return cached(self.out)

    def job(self) -> dict:
        """The worker's job (its kernel file stored): Triton's specialization of the
        arguments (tensors or stand-ins, and ints) and the options (constexprs and compile
        options)."""
        path = cache.store(self.cache_dir, self.parts, f"{self.key}.py", self.text)
        self.out = path.parent / self.key  # where the store went (the private fallback)
        specs = [specialization(a) for a in self.args]
        if None in specs:
            specs = _tritons_specialization(self.args, self.device)
        return worker_job(path, self.kernel.fn.__name__, self.kernel.arg_names, specs,
                          self.options, target(self.device), self.out)


def worker_job(kernel_file: Path, name: str, params: Sequence[str], specs: list,
               options: dict, target: tuple, out: Path) -> dict:
    """A worker's job (triton_worker.build): kernel ``name`` of ``kernel_file`` with
    arguments specialized as ``specs`` (Triton's (type, attribute) of each) and keyword
    ``options`` (constexprs, given past the arguments, and compile options)."""
    signature: dict[str, str] = {}
    constexprs: list = []
    attrs: list = []
    for i, param in enumerate(params):
        ty, spec = specs[i] if i < len(specs) else ("constexpr", options[param])
        signature[param] = ty
        (constexprs if ty == "constexpr" else attrs).append([[i], spec])
    compile_options = {k: v for k, v in options.items() if k not in params}
    compile_options.setdefault("debug", False)
    return {"kernel_file": str(kernel_file), "name": name, "signature": signature,
            "constexprs": constexprs, "attrs": attrs, "options": compile_options,
            "target": list(target), "out": str(out)}


def build_in_process(prepared: Prepared) -> str | None:
    """Build one kernel here; None, or why it could not be built for a static launch."""
    from minicompile.runtime.triton_worker import build

    try:
        result = build(prepared.job())
    except Exception as e:  # noqa: BLE001 (Triton's launch path then says it again)
        return f"{type(e).__name__}: {e}"
    return None if result["ok"] else result["reason"]


class _Worker:
    """A worker process (triton_worker.py), started ahead of its first job."""

    # It answers a first line (whether Triton imported), a second (ready: its warm-up
    # build done), then a line per job.

    def __init__(self, device: int | None) -> None:
        # With the GPU known, the worker builds one kernel for it ahead of the real ones.
        ahead = [json.dumps(list(target(device)))] if device is not None else []
        self.proc = subprocess.Popen([sys.executable, str(WORKER), *ahead],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=config.worker_environment(sys.path))
        self.seconds: list[float] = []  # how long each build took in the worker
        self.lock = threading.Lock()  # held by the thread that talks to the worker
        self.imported: bool | None = None  # whether Triton imported there (None: not known)
        self.problem: str | None = None  # why it did not
        self.ready = False

    def _line(self) -> dict:
        assert self.proc.stdout is not None
        try:
            return json.loads(self.proc.stdout.readline() or "{}")
        except (OSError, ValueError):
            return {}

    def wait_imported(self) -> bool:  # (False too when the worker died first)
        if self.imported is None:
            first = self._line()
            self.imported = bool(first.get("imported"))
            self.problem = first.get("problem")
        return self.imported

    def wait_ready(self) -> bool:
        if not self.ready and self.wait_imported():
            self.ready = bool(self._line().get("ready"))
        return self.ready

    def run(self, job: dict) -> str | None:
        """Build ``job`` (the worker ready); None, or why not."""
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError as e:
            return f"the worker process is gone ({e})"
        if not line:
            return "the worker process died"
        r = json.loads(line)
        self.seconds.append(r.get("seconds", 0.0))
        return None if r["ok"] else r["reason"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


_workers: list[_Worker] = []
_workers_lock = threading.Lock()
_registered = False  # stop_workers runs at exit
_workers_pid = os.getpid()  # the process the workers answer


def start_workers(count: int | None = None) -> None:
    """Start up to ``count`` workers (None: ``compile_threads``, at most 8, warming up)."""
    global _workers_pid
    ahead = count is None
    count = count if count is not None else min(config.get().compile_threads, 8)
    with _workers_lock:
        if _workers_pid != os.getpid():  # a forked child: its parent's workers are not its own
            _workers.clear()
            _workers_pid = os.getpid()
        _workers[:] = [w for w in _workers if w.alive()]
        device = torch.cuda.current_device() if ahead and torch.cuda.is_initialized() else None
        try:
            while len(_workers) < count:  # (ready in about 0.3 s, warm-up included)
                _workers.append(_Worker(device))
        except OSError as e:
            perf.note(f"no Triton build worker could start: {e}")
        global _registered
        if _workers and not _registered:
            _registered = True
            atexit.register(stop_workers)


def import_problem() -> str | None:
    """Why Triton does not import (None: it does), as a worker found, else here."""
    with _workers_lock:
        first = _workers[0] if _workers and _workers_pid == os.getpid() else None
    if first is not None:
        if first.imported is None:
            with first.lock:
                first.wait_imported()
        if first.imported:
            return None
        if first.problem is not None:
            toolchain.triton_broken(first.problem)
            return first.problem
    return toolchain.triton_problem()


def require() -> None:
    """Raise BackendCompilerFailed (warned once) where Triton does not import: asked before
    a GPU module's first build, not when its backend is chosen, so that compiling the graph
    does not wait for the first worker's import of Triton."""
    problem = import_problem()
    if problem is not None:
        toolchain.warn_triton_missing(problem)
        raise BackendCompilerFailed(f"Triton is not available: {problem}", warned=True)


def stop_workers() -> None:
    with _workers_lock:
        if _workers_pid == os.getpid():
            for w in _workers:
                w.close()
        _workers.clear()


def build_all(prepared: list, threads: int, here: bool = True) -> list[str | None]:
    """Build each (a :class:`Prepared`, or anything with its ``job()``) in up to ``threads``
    workers, or here: for each, None or why not built.  ``here=False``: in workers only
    (this process may run Triton's interpreter, whose ``triton.jit`` compiles nothing)."""
    with _workers_lock:
        started = _workers_pid == os.getpid() and any(w.alive() for w in _workers)
    if here and ((len(prepared) == 1 and not started) or threads <= 1):
        return [build_in_process(p) for p in prepared]  # (no worker to start for one)
    jobs: queue.Queue = queue.Queue()
    for i, p in enumerate(prepared):
        jobs.put((i, p.job()))
    start_workers(min(max(threads, 1), len(prepared)))
    with _workers_lock:
        workers = [w for w in _workers if w.alive()]
    if not workers:
        if not here:
            return ["no Triton build worker could start"] * len(prepared)
        return [build_in_process(p) for p in prepared]
    results: list[str | None] = ["not built"] * len(prepared)
    start = time.perf_counter()
    for w in workers:
        w.seconds.clear()
    finished = threading.Semaphore(0)

    def work(worker: _Worker) -> None:
        # Each worker takes jobs once it is ready, so the first jobs go to the workers
        # ready first; one still warming up when the jobs are gone takes none.
        with worker.lock:
            if not worker.wait_ready():
                return
            while worker.alive():
                try:
                    i, job = jobs.get_nowait()
                except queue.Empty:
                    return
                results[i] = worker.run(job)
                finished.release()

    threads_ = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
    for t in threads_:
        t.start()
    done = 0
    while done < len(prepared):  # (a thread may still wait for its worker's warm-up)
        if finished.acquire(timeout=0.05):
            done += 1
        elif not any(t.is_alive() for t in threads_):  # every worker died: the rest is not built
            break
    took = [t for w in workers for t in w.seconds]
    if took:
        used = sum(1 for w in workers if w.seconds)
        perf.note(f"built {len(took)} Triton kernel(s) in {time.perf_counter() - start:.2f} s "
                  f"in {used} worker(s): {sum(took):.2f} s of builds, "
                  f"the longest {max(took):.2f} s")
    return results


def find_or_build(kernel: Any, args: Sequence[Any], options: dict, device: int) -> Built | None:
    """The build of a launch, from the cache or built here (None: Triton's launcher)."""
    try:
        prepared = Prepared(kernel, args, options, device)
    except (OSError, TypeError) as e:  # the kernel's source is not readable
        perf.note(f"{kernel.__name__} launches through Triton: {e}")
        return None
    built = prepared.built()
    if built is None:
        why = build_in_process(prepared)
        built = prepared.built() if why is None else None
        if built is None:
            perf.note(f"{kernel.__name__} launches through Triton ({why or 'no build found'})")
    return built


def recorded(key: str) -> Built | None:
    """The build of key ``key`` (a warm entry's record), if the cache holds it intact."""
    found = cache.find(config.get().cache_dir, ("triton", key[:2]), f"{key}.json")
    return cached(found.with_suffix("")) if found is not None else None


@functools.lru_cache(maxsize=None)
def load(cubin: Path, name: str, shared: int, device: int) -> int:
    """The CUDA function of a cubin, loaded once per process and device."""
    return compat.load_cubin_function(cubin, name, shared, device)


def precompile(launchers: list[Any]) -> None:
    """Build what the first calls of ``launchers`` launch and hand it over (``adopt``)."""
    if not launchers or not available():
        return
    device = torch.cuda.current_device()
    mine: list[tuple[Any, Prepared, Built | None]] = []
    todo: dict[str, Prepared] = {}
    for launcher in launchers:
        args = launcher.example_args()
        if args is None:
            continue
        try:
            prepared = Prepared(launcher.fn, args, launcher.options, device)
        except (OSError, TypeError) as e:  # the kernel's source is not readable
            perf.note(f"{launcher.fn.__name__} not built ahead: {e}")
            continue
        built = prepared.built()
        if built is None:
            todo.setdefault(prepared.key, prepared)
        mine.append((launcher, prepared, built))
    if todo:
        reasons = build_all(list(todo.values()), config.get().compile_threads)
        for p, why in zip(todo.values(), reasons):
            if why is not None:
                perf.note(f"{p.kernel.fn.__name__} not built ahead ({why}); Triton builds it "
                          f"at its launch")
    for launcher, prepared, built in mine:
        built = built or prepared.built()  # (built just now)
        if built is not None:
            launcher.adopt(built, device)
