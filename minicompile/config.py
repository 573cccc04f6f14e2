"""The one configuration object: the frozen :class:`Config`, read from ``MINICOMPILE_*``
variables once, at import; per-call options override it (:func:`dataclasses.replace`),
tests use :func:`patch`.  ``os.environ`` is read nowhere else in the package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

LOG_PARTS = (
    "graph", "guards", "recompiles", "dynamic", "graph_breaks", "fusion", "output_code",
    "cudagraphs", "perf", "cache", "autotune", "profile",
)

LAYOUT_OPTS = ("auto", "channels_last", "off")
GEMM_PADDINGS = ("auto", "on", "off")


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _on_unless_off(value: str | None) -> bool:
    return (value or "1").strip().lower() not in ("0", "false", "no", "off")


def _size(variable: str, value: str) -> int:
    """A count or a size in bytes: ``16``, ``512M``, ``2G``."""
    text = value.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        number = int(text[:-1] if scale > 1 else text)
    except ValueError:
        raise ValueError(f"{variable}: {value!r} is not a whole number (K, M, G allowed)") from None
    if number < 1:
        raise ValueError(f"{variable}: {value!r} must be at least 1")
    return number * scale


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str = "auto"  # "auto" | "cpp" | "triton"
    dynamic: bool | None = None
    fullgraph: bool = False
    mode: str | None = None
    # Where generated code and built libraries live between processes.
    cache_dir: Path = Path.home() / ".cache" / "minicompile"
    # MINICOMPILE_TRACE=1: print graphs, fused groups and kernels to stderr and write them
    # under trace_dir.
    trace: bool = False
    trace_dir: Path = Path("minicompile_trace")
    # MINICOMPILE_LOGS=graph,guards,...: the parts of the trace to print.
    logs: frozenset[str] = frozenset()
    # Compiled entries kept per code object before the code runs eagerly.
    recompile_limit: int = 8
    # Raise instead of falling back to eager when a kernel fails to build.
    strict: bool = False
    cxx: str = "g++"
    # -fno-math-errno: sqrt and friends need not set errno, so loops calling them vectorise
    # (the values are the same; an optimizer step's kernel runs 4x faster).
    cxx_flags: tuple[str, ...] = (
        "-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC",
    )
    # Triton's interpreter runs kernels on CPU tensors (how the Triton backend is tested
    # without a GPU).  Read from TRITON_INTERPRET, Triton's own switch.
    triton_interpret: bool = False
    # Combine independent kernels of a graph into combo kernels (passes/horizontal.py), and
    # store outputs written back into inputs in place (passes/inplace.py): both on for
    # compiled optimizer steps (minicompile/optim.py).
    horizontal_fusion: bool = False
    store_in_place: bool = False
    # MINICOMPILE_CHECK=1: run each compiled graph beside eager and name the first node
    # whose value differs (minicompile/check.py).
    check: bool = False
    # Whole compiled entries on disk (runtime/entries.py): a new process that calls a
    # function compiled before loads its guards, wrapper and kernels without capture.
    # MINICOMPILE_WARM_ENTRIES=0 turns them off (kernels are still cached).
    warm_entries: bool = True
    # Bounds on the on-disk cache (runtime/cache_limits.py): warm entries kept per function
    # (the least recently used evicted; MINICOMPILE_CACHE_MAX_ENTRIES), and bytes over the
    # whole cache directory (MINICOMPILE_CACHE_MAX_BYTES, a number with an optional K, M or
    # G suffix).
    cache_max_entries: int = 16
    cache_max_bytes: int = 2 << 30
    # Processes that build kernels at once (C++ libraries of a graph, Triton kernels
    # warmed before their first launch); MINICOMPILE_COMPILE_THREADS, default the CPUs.
    compile_threads: int = max(1, os.cpu_count() or 1)
    # Run 2-d convolutions and the pointwise work around them channels-last
    # (passes/layout.py): "auto" on CUDA where Inductor's heuristics expect it to be faster,
    # "channels_last" always, "off" never.  MINICOMPILE_LAYOUT_OPT.
    layout_opt: str = "auto"
    # Matrix products whose result rows are not a multiple of 16 bytes write them padded,
    # where cuBLAS is faster on them (passes/gemm_padding.py): "auto" (16-bit floats on
    # CUDA), "on" (any float, any device: how CPU tests see it), "off".
    # MINICOMPILE_GEMM_PADDING.
    gemm_padding: str = "auto"
    # In inference graphs, fold an eval-mode batch norm into the convolution before it
    # (passes/fold_batch_norm.py; the folded weight is computed once, passes/hoist_params.py).
    # MINICOMPILE_FOLD_BN=0 turns it off.
    fold_batch_norm: bool = True
    # In inference graphs on the CPU, 2-d float32 convolutions of parameters run through
    # oneDNN on weights packed once, channels-last (passes/onednn_conv.py), where PyTorch
    # was built with it.  MINICOMPILE_ONEDNN=0 turns it off.
    onednn: bool = True
    # A backward's column sums over the rows a row kernel reads (layer-norm weight and bias,
    # a linear's bias) computed in that kernel (passes/mix_order.py); off, split_reductions
    # splits those sums as any other.  Unset (None), on for the C++ backend and off for
    # Triton: on an H200 the nanoGPT train step (examples/train_nanogpt.py --bench) took
    # 20.9 ms with it, 15.8 without (torch.compile 15.2).  MINICOMPILE_MIX_ORDER=1 turns it
    # on for both, =0 off for both.
    mix_order: bool | None = None
    # Compare a dict-version gate's version tags in one C call (runtime/dict_versions.py)
    # where this Python allows (3.11, 3.12, with Python.h); MINICOMPILE_DICT_VERSIONS_C=0
    # keeps the Python loop (what a Python without the C loop runs).
    dict_versions_c: bool = True

    def __post_init__(self) -> None:
        for name in ("cache_dir", "trace_dir"):  # a str given for a folder (patch, replace)
            value = getattr(self, name)
            if not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    def logging(self, part: str) -> bool:
        """Whether ``part`` (one of LOG_PARTS) should be printed."""
        return self.trace or part in self.logs


def from_env(env: dict[str, str] | os._Environ = os.environ) -> Config:
    logs = frozenset(p.strip() for p in env.get("MINICOMPILE_LOGS", "").split(",") if p.strip())
    unknown = logs - set(LOG_PARTS) - {"all"}
    if unknown:
        raise ValueError(
            f"MINICOMPILE_LOGS: unknown part(s) {sorted(unknown)}; known: {', '.join(LOG_PARTS)}"
        )
    if "all" in logs:
        logs = frozenset(LOG_PARTS)
    cfg = Config(
        trace=_flag(env.get("MINICOMPILE_TRACE")),
        logs=logs,
        strict=_flag(env.get("MINICOMPILE_STRICT")),
        triton_interpret=_flag(env.get("TRITON_INTERPRET")),
        check=_flag(env.get("MINICOMPILE_CHECK")),
        warm_entries=_on_unless_off(env.get("MINICOMPILE_WARM_ENTRIES")),
        fold_batch_norm=_on_unless_off(env.get("MINICOMPILE_FOLD_BN")),
        onednn=_on_unless_off(env.get("MINICOMPILE_ONEDNN")),
        dict_versions_c=_on_unless_off(env.get("MINICOMPILE_DICT_VERSIONS_C")),
        mix_order=(None if env.get("MINICOMPILE_MIX_ORDER") is None
                   else _flag(env.get("MINICOMPILE_MIX_ORDER"))),
    )
    if env.get("MINICOMPILE_COMPILE_THREADS", "").strip():
        threads = int(env["MINICOMPILE_COMPILE_THREADS"])
        cfg = dataclasses.replace(cfg, compile_threads=max(1, threads))
    for field, choices in (("layout_opt", LAYOUT_OPTS), ("gemm_padding", GEMM_PADDINGS)):
        variable = f"MINICOMPILE_{field.upper()}"
        if env.get(variable, "").strip():
            value = env[variable].strip().lower()
            if value not in choices:
                raise ValueError(f"{variable}: {value!r} is not one of {', '.join(choices)}")
            cfg = dataclasses.replace(cfg, **{field: value})
    for field in ("cache_max_entries", "cache_max_bytes"):
        variable = f"MINICOMPILE_{field.upper()}"
        if env.get(variable, "").strip():
            cfg = dataclasses.replace(cfg, **{field: _size(variable, env[variable])})
    for field, variable in (("cache_dir", "MINICOMPILE_CACHE_DIR"), ("cxx", "CXX"),
                            ("trace_dir", "MINICOMPILE_TRACE_DIR"),
                            ("backend", "MINICOMPILE_BACKEND")):
        if variable in env:  # (a str given for a folder becomes a Path: __post_init__)
            cfg = dataclasses.replace(cfg, **{field: env[variable]})
    return cfg


_config = from_env()


def worker_environment(path: list[str]) -> dict[str, str]:
    """The environment of a Triton build worker (runtime/triton_build.py): this process's,
    finding modules on ``path``, and compiling for the GPU whatever this process runs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def get() -> Config:
    return _config


@contextlib.contextmanager
def patch(**changes: object) -> Iterator[Config]:
    """Temporarily replace fields of the global config (for tests)."""
    global _config
    saved = _config
    _config = dataclasses.replace(_config, **changes)
    try:
        yield _config
    finally:
        _config = saved
