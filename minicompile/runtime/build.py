"""Turn generated code into callables: build C++ with the system compiler, import Python
modules from the cache directory.  A second process finds both on disk and builds nothing."""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import platform
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minicompile import perf
from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed
from minicompile.runtime import cache, cpp_units, toolchain, triton_build
from minicompile.runtime.cache import cache_key, tool_versions

if TYPE_CHECKING:
    from minicompile.codegen.wrapper import GeneratedCode


@dataclasses.dataclass
class Loaded:
    call: types.FunctionType  # call(args) -> tuple of outputs
    module_path: Path
    from_cache: bool  # nothing was built: every artefact was already on disk
    lib_paths: tuple[Path, ...] = ()  # the C++ kernels' shared libraries
    symbols: dict = dataclasses.field(default_factory=dict)  # kernel -> (library, symbol)
    kernels: int = 0  # how many kernels the module launches


_loaded: dict[str, Loaded] = {}  # this process's modules, by key


@functools.lru_cache(maxsize=None)
def vector_math_flags() -> tuple[str, ...]:
    """Flags for glibc's SIMD math (libmvec: x86-64 Linux, glibc >= 2.35); else none."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return ()
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ()
    parts = version.split()
    if len(parts) != 2 or parts[0] != "glibc":
        return ()
    major, minor = (int(v) for v in parts[1].split(".")[:2])
    if (major, minor) < (2, 35) or ctypes.util.find_library("mvec") is None:
        return ()
    return ("-DMC_LIBMVEC", "-lmvec")


def _compiler_failed(cfg: Config, flags: list[str], failure: str) -> BackendCompilerFailed:
    """The error for a failed build (a broken compiler: one warning, no later builds)."""
    problem = toolchain.cxx_problem(cfg.cxx, tuple(flags))
    if problem is None:
        return BackendCompilerFailed(failure)
    toolchain.warn_once(f"cxx {cfg.cxx}", (
        f"minicompile: the C++ compiler {cfg.cxx!r} does not work ({problem}); graphs on CPU "
        f"tensors run eagerly. Install g++ or set CXX to a working compiler."))
    return BackendCompilerFailed(f"the C++ compiler {cfg.cxx!r} does not work: {problem}",
                                 warned=True)


def build_cpp(source: str, cfg: Config) -> tuple[tuple[Path, ...], dict, bool]:
    """Compile a graph's C++ unit, split into at most ``cfg.compile_threads`` units built
    at once (runtime/cpp_units.py): the libraries, each kernel's (library index, symbol),
    and whether every library was cached."""
    units = cpp_units.split(source, cfg.compile_threads)
    if len(units.sources) == 1:
        built = [build_unit(units.sources[0], cfg)]
    else:
        with concurrent.futures.ThreadPoolExecutor(len(units.sources)) as pool:
            built = list(pool.map(lambda s: build_unit(s, cfg), units.sources))
    return tuple(p for p, _ in built), units.symbols, all(c for _, c in built)


def build_unit(source: str, cfg: Config, folder: str = "cpp") -> tuple[Path, bool]:
    """Compile ``source`` to a shared library: its path, and whether it was cached
    (``folder``: where in the cache directory; a runtime helper's is not a kernel's)."""
    flags = [*cfg.cxx_flags, *vector_math_flags()]
    if toolchain.cxx_problem.cache_info().currsize:  # probed after an earlier failure
        problem = toolchain.cxx_problem(cfg.cxx, tuple(flags))
        if problem is not None:
            raise BackendCompilerFailed(f"the C++ compiler {cfg.cxx!r} does not work: "
                                        f"{problem}", warned=True)

    def compile_to(src: Path, out: Path) -> None:
        try:
            toolchain.run(toolchain.command(cfg.cxx, flags, src, out), "the C++ unit")
        except BackendCompilerFailed as e:
            raise _compiler_failed(cfg, flags, str(e)) from None

    return cached_build(source, " ".join(flags), cfg, folder, ".so", compile_to)


def cached_build(source: str, flags: str, cfg: Config, folder: str, suffix: str,
                 compile_to: Callable[[Path, Path], None]) -> tuple[Path, bool]:
    """``source`` built into the cache by ``compile_to(source file, output)``, keyed by the
    source, the ``flags`` and the compiler's version (or found there intact): its path, and
    whether it was found."""
    key = cache_key(source, flags, tool_versions(cfg.cxx))
    parts = (folder, key[:2])
    found = cache.find(cfg.cache_dir, parts, f"{key}{suffix}")
    if found is not None:
        if intact(found):
            return found, True
        cache.warn_corrupted(found)
    src = cache.store(cfg.cache_dir, parts, f"{key}.cpp", source)
    tmp = cache.scratch(cfg.cache_dir, parts, key, suffix)
    try:
        compile_to(src, tmp)
        return put_in_place(tmp, f"{key}{suffix}"), False
    except OSError as e:  # the directory went away or filled up under the compiler
        raise BackendCompilerFailed(
            f"could not store the built file {tmp.parent / f'{key}{suffix}'}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def intact(path: Path) -> bool:
    """Whether a built file matches the checksum written beside it (``.sum``)."""
    return cache.sha256_file(path) == _read_text(path.with_suffix(".sum"))


def put_in_place(tmp: Path, name: str) -> Path:
    """Move a built file into place as ``name``, its checksum written beside it first."""
    out = tmp.parent / name
    cache.write_atomic(out.with_suffix(".sum"), cache.sha256_file(tmp) or "")
    os.replace(tmp, out)
    return out


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def load(code: GeneratedCode, cfg: Config, interpret: bool) -> Loaded:
    """Build (or find) the artefacts of ``code`` and import its wrapper module."""
    if interpret and not cfg.triton_interpret:
        raise BackendCompilerFailed("backend='triton' on CPU tensors runs under Triton's "
                                    "interpreter: set TRITON_INTERPRET=1 in the environment "
                                    "before Python starts")
    if code.kernels and code.cpp_source is None and not interpret:  # GPU kernels
        triton_build.require()
    key = cache_key(code.module, code.cpp_source or "", tool_versions(cfg.cxx), str(interpret))
    if key in _loaded:
        return dataclasses.replace(_loaded[key], from_cache=True)
    name = f"mc_{key}.py"
    path = cache.find(cfg.cache_dir, ("py", key[:2]), name)
    from_cache = path is not None and _read_text(path) == code.module
    if path is not None and not from_cache:
        cache.warn_corrupted(path)
    if not from_cache:
        path = cache.store(cfg.cache_dir, ("py", key[:2]), name, code.module)
    assert path is not None
    lib_paths: tuple[Path, ...] = ()
    symbols: dict = {}
    if code.cpp_source is not None:
        with perf.phase("build"):
            lib_paths, symbols, lib_cached = build_cpp(code.cpp_source, cfg)
        from_cache = from_cache and lib_cached
    with perf.phase("load"):
        loaded = load_module(key, path, lib_paths, symbols, interpret)
    if not interpret:  # GPU kernels: built before the call
        ready_launches(loaded)
    return dataclasses.replace(loaded, from_cache=from_cache)


def ready_launches(loaded: Loaded, builds: dict[str, list] | None = None) -> None:
    """Before the first call: each GPU kernel's cubin loaded for a call like codegen's
    example, and the module's convolution plans started (runtime/library_plans.py).
    ``builds``: a warm entry's record (:func:`launch_builds`), loaded before the plans'
    threads start (cuDNN's work in the driver slows the loads fivefold); what the cache
    lost, and every launcher of a new module, goes through triton_build.precompile."""
    from minicompile.runtime.launch import Launcher
    from minicompile.runtime.library_plans import LibraryPlans

    values = loaded.call.__globals__
    launchers = {k: v for k, v in values.items() if isinstance(v, Launcher) and v.build is None}
    if launchers and builds and triton_build.available():
        device = torch.cuda.current_device()
        target = list(triton_build.target(device))
        with perf.phase("load"):
            for name, (built_for, key) in builds.items():
                launcher = launchers.get(name)
                built = triton_build.recorded(key) if launcher and built_for == target else None
                if built is not None:
                    launcher.adopt(built, device)
        launchers = {k: v for k, v in launchers.items() if v.build is None}
    plans = values.get("library_plans")
    if isinstance(plans, LibraryPlans):
        plans.start()
    if builds is None:  # a new module: every launcher
        rest = list(launchers.values())
    else:  # a warm entry's: those whose build the cache no longer holds (or for another GPU;
        # a launcher without a record had no build ahead when it was compiled either)
        rest = [launchers[name] for name in builds if name in launchers]
    # Imported by max-autotune's wrappers only: the default mode never loads it.
    tuning = sys.modules.get("minicompile.runtime.autotune")
    if tuning is not None:
        rest += [v for v in tuning.ahead(values.values()) if v.build is None]
    if rest:
        with perf.phase("build"):
            triton_build.precompile(rest)


def launch_builds(loaded: Loaded) -> dict[str, list]:
    """Each launcher's build as a warm entry records it: name -> [target, cache key]."""
    from minicompile.runtime.launch import Launcher

    return {name: [list(triton_build.target(v.built_on)), v.build.cubin.stem]
            for name, v in loaded.call.__globals__.items()
            if isinstance(v, Launcher) and v.build is not None}


def load_module(key: str, path: Path, lib_paths: tuple[Path, ...], symbols: dict,
                interpret: bool) -> Loaded:
    """Import the wrapper module at ``path`` (``lib``: ``lib_paths`` by ``symbols``), once."""
    if key in _loaded:
        return dataclasses.replace(_loaded[key], from_cache=True)
    namespace_lib = None
    if lib_paths:
        try:
            libs = [ctypes.CDLL(str(p)) for p in lib_paths]
        except OSError as e:
            raise BackendCompilerFailed(f"a built library failed to load: {e}") from e
        # One function object per kernel name (CDLL's [] makes a new one each time): the
        # wrapper sets argtypes on each, and two names may share a symbol.
        namespace_lib = types.SimpleNamespace(
            **{name: libs[i][symbol] for name, (i, symbol) in symbols.items()})
    name = f"minicompile_generated.mc_{key}"
    spec = importlib.util.spec_from_file_location(name, path,
                                                  loader=GeneratedLoader(name, str(path)))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if namespace_lib is not None:
        module.lib = namespace_lib  # type: ignore[attr-defined]
    sys.modules[name] = module  # Triton's JIT looks its kernels' module up
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise BackendCompilerFailed(f"generated module {path} failed to import: {e}") from e
    if interpret:  # Triton's interpreter: the module's ``libdevice`` is the numpy stand-in
        try:
            from minicompile.runtime.triton_interp import libdevice

            module.libdevice = libdevice  # type: ignore[attr-defined]
        except ImportError as e:
            raise BackendCompilerFailed(f"the Triton backend on CPU tensors runs under "
                                        f"Triton's interpreter, which needs numpy ({e}): "
                                        f"pip install numpy") from e
    loaded = _loaded[key] = Loaded(module.call, path, True,  # type: ignore[attr-defined]
                                   tuple(lib_paths), dict(symbols))
    return loaded


class GeneratedLoader(importlib.machinery.SourceFileLoader):
    """A generated module's code, kept beside its source as ``<module>.<python tag>.code``
    (magic number, sha256 of path, ``-O`` level and source, sha256 of the code, marshal
    data) even under PYTHONDONTWRITEBYTECODE (0.03-0.05 s a process for resnet50's
    wrapper).  A code file that does not match is rewritten (warned if damaged)."""

    def get_code(self, fullname: str) -> types.CodeType:
        source = self.get_data(self.path)
        where = Path(self.path).with_suffix(f".{sys.implementation.cache_tag}.code")
        head = importlib.util.MAGIC_NUMBER + hashlib.sha256(
            f"{self.path}\0{sys.flags.optimize}\0".encode() + source).digest()
        try:
            data = where.read_bytes()
        except OSError:
            data = b""
        payload = data[len(head) + 32:]
        if data[:len(head)] == head:
            if data[len(head):len(head) + 32] == hashlib.sha256(payload).digest():
                return marshal.loads(payload)
            cache.warn_corrupted(where)
        code = self.source_to_code(source, self.path)
        payload = marshal.dumps(code)
        try:
            cache.write_atomic(where, head + hashlib.sha256(payload).digest() + payload)
        except OSError:  # (a read-only cache: compiled again next time)
            pass
        return code


def forget() -> None:
    _loaded.clear()  # (and tuning choices; the disk cache stays)
    tuning = sys.modules.get("minicompile.runtime.autotune")  # (imported by max-autotune)
    if tuning is not None:
        tuning.forget()
