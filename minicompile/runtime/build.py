"""Turn generated code into callables: build C++ with the system compiler, import Python
modules from the cache directory.  A second process finds both on disk and builds nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import types
from pathlib import Path

from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed
from minicompile.runtime import toolchain
from minicompile.runtime.cache import cache_key, tool_versions, write_atomic

from minicompile.codegen.wrapper import GeneratedCode


@dataclasses.dataclass
class Loaded:
    call: types.FunctionType  # call(args) -> tuple of outputs
    module_path: Path
    from_cache: bool  # nothing was built: every artefact was already on disk


_loaded: dict[str, Loaded] = {}  # this process's modules, by key


@functools.lru_cache(maxsize=None)
def vector_math_flags() -> tuple[str, ...]:
    """Flags that let kernels call glibc's SIMD math (libmvec), where it is complete
    (x86-64 Linux, glibc >= 2.35); none elsewhere, and the loops stay scalar."""
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
    """The error for a failed build: when the compiler fails on a trivial program too, it
    is broken (one warning for the process, and no later build is attempted)."""
    problem = toolchain.cxx_problem(cfg.cxx, tuple(flags))
    if problem is None:
        return BackendCompilerFailed(failure)
    toolchain.warn_once(f"cxx {cfg.cxx}", (
        f"minicompile: the C++ compiler {cfg.cxx!r} does not work ({problem}); graphs on CPU "
        f"tensors run eagerly. Install g++ or set CXX to a working compiler."))
    return BackendCompilerFailed(f"the C++ compiler {cfg.cxx!r} does not work: {problem}",
                                 warned=True)


def build_cpp(source: str, cfg: Config) -> tuple[Path, bool]:
    """Compile ``source`` to a shared library; return its path and whether it was cached."""
    flags = [*cfg.cxx_flags, *vector_math_flags()]
    if toolchain.cxx_problem.cache_info().currsize:  # probed after an earlier failure
        problem = toolchain.cxx_problem(cfg.cxx, tuple(flags))
        if problem is not None:
            raise BackendCompilerFailed(f"the C++ compiler {cfg.cxx!r} does not work: "
                                        f"{problem}", warned=True)
    key = cache_key(source, " ".join(flags), tool_versions(cfg.cxx))
    folder = cfg.cache_dir / "cpp" / key[:2]
    lib = folder / f"{key}.so"
    if lib.exists():
        return lib, True
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{key}.cpp"
    write_atomic(src, source)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".so")
    os.close(fd)
    # Libraries come after the source for the linker.
    libs = [f for f in flags if f.startswith("-l")]
    cmd = [cfg.cxx, *[f for f in flags if not f.startswith("-l")], str(src), "-o", tmp, *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        Path(tmp).unlink(missing_ok=True)
        raise _compiler_failed(cfg, flags, f"could not run the C++ compiler {cfg.cxx!r}: {e}"
                               ) from e
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise _compiler_failed(
            cfg, flags, f"C++ compilation failed ({' '.join(cmd)}):\n{proc.stderr.strip()[-4000:]}"
        )
    os.replace(tmp, lib)
    return lib, False


def _interpret_triton(module: types.ModuleType) -> None:
    """Prepare this module's Triton kernels to run under Triton's interpreter (CPU
    tensors): its ``libdevice`` becomes the numpy stand-in."""
    from minicompile.runtime.triton_interp import libdevice

    module.libdevice = libdevice  # type: ignore[attr-defined]


def load(code: GeneratedCode, cfg: Config, interpret: bool) -> Loaded:
    """Build (or find) the artefacts of ``code`` and import its wrapper module."""
    if interpret and not cfg.triton_interpret:
        raise BackendCompilerFailed(
            "backend='triton' on CPU tensors runs under Triton's interpreter: set "
            "TRITON_INTERPRET=1 in the environment before Python starts"
        )
    key = cache_key(code.module, code.cpp_source or "", tool_versions(cfg.cxx), str(interpret))
    if key in _loaded:
        return dataclasses.replace(_loaded[key], from_cache=True)
    folder = cfg.cache_dir / "py" / key[:2]
    path = folder / f"mc_{key}.py"
    from_cache = path.exists()
    if not from_cache:
        write_atomic(path, code.module)
    namespace_lib = None
    if code.cpp_source is not None:
        lib_path, lib_cached = build_cpp(code.cpp_source, cfg)
        from_cache = from_cache and lib_cached
        namespace_lib = ctypes.CDLL(str(lib_path))
    name = f"minicompile_generated.mc_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
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
    if interpret:
        try:
            _interpret_triton(module)
        except ImportError as e:
            raise BackendCompilerFailed(
                f"the Triton backend on CPU tensors runs under Triton's interpreter, which "
                f"needs numpy ({e}): pip install numpy"
            ) from e
    loaded = Loaded(module.call, path, from_cache)  # type: ignore[attr-defined]
    _loaded[key] = loaded
    return loaded


def forget() -> None:
    """Drop this process's loaded modules (the disk cache stays)."""
    _loaded.clear()
