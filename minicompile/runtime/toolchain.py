"""Whether the build tools work here: Triton (it imports) and the C++ compiler (it builds a
trivial shared library with our flags); one warning per process for one that does not.
Triton is not imported to probe it (:func:`guard_triton_import` makes a broken import raise
ImportError instead); the C++ compiler is probed only after a build fails.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minicompile.errors import BackendCompilerFailed

_PROBE = 'extern "C" int mc_probe(int x) { return x + 1; }\n'
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """``warnings.warn(message)`` the first time ``key`` is met in this process."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=2)


def warn_triton_missing(problem: str) -> None:
    warn_once("triton", (
        f"minicompile: Triton is not available ({problem}); graphs on CPU tensors compile "
        f"with the C++ backend instead, graphs on GPU tensors run eagerly."))


_triton_failure: str | None = None  # why Triton's import failed, once it has


def triton_broken(reason: str) -> None:
    """Mark Triton as failing to import: a later ``import triton`` raises ImportError at
    once.  Its half-imported modules are dropped."""
    global _triton_failure
    _triton_failure = reason
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]


class _GuardedLoader:
    """Triton's own loader, with a failure of its import turned into ImportError."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            self.loader.exec_module(module)
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure means Triton cannot be used
            triton_broken(f"{type(e).__name__}: {e}")
            raise ImportError(f"Triton failed to import ({_triton_failure})") from e
        module.__loader__ = module.__spec__.loader = self.loader  # imported: as if unguarded


class _FailedLoader:
    """Triton's loader once its import has failed."""

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        raise ImportError(f"Triton failed to import ({_triton_failure})")


class _TritonImportGuard(importlib.abc.MetaPathFinder):
    """Finds ``triton`` as the other finders do, with its loader guarded."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "triton":
            return None
        if _triton_failure is not None:
            return importlib.util.spec_from_loader(name, _FailedLoader())
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _GuardedLoader(spec.loader)
                return spec
        return None


def guard_triton_import() -> None:
    """From now on, a failing ``import triton`` raises ImportError (see the module's doc)."""
    if not any(isinstance(f, _TritonImportGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, _TritonImportGuard())


@functools.lru_cache(maxsize=None)
def triton_problem() -> str | None:
    """None when Triton imports (it is imported); else why it does not."""
    guard_triton_import()
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure means Triton cannot be used
        if _triton_failure is None:  # (not installed: ModuleNotFoundError)
            return f"{type(e).__name__}: {e}"
        return _triton_failure
    return None


def command(cxx: str, flags: Sequence[str], src: Path, out: Path) -> list[str]:
    """The compiler's command line: libraries after the source, for the linker."""
    libs = [f for f in flags if f.startswith("-l")]
    return [cxx, *[f for f in flags if not f.startswith("-l")], str(src), "-o", str(out), *libs]


def run(cmd: list[str], what: str) -> None:
    """Run the C++ compiler's command ``cmd`` building ``what`` (BackendCompilerFailed)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendCompilerFailed(f"could not run the C++ compiler for {what}: {e}") from e
    if proc.returncode != 0:
        raise BackendCompilerFailed(
            f"building {what} failed ({' '.join(cmd)}):\n{proc.stderr.strip()[-4000:]}")


@functools.lru_cache(maxsize=None)
def cxx_problem(cxx: str, flags: tuple[str, ...]) -> str | None:
    """None when ``cxx`` builds a trivial shared library with ``flags``; else why not."""
    with tempfile.TemporaryDirectory(prefix="minicompile-probe-") as folder:
        src = Path(folder) / "probe.cpp"
        src.write_text(_PROBE)
        cmd = command(cxx, flags, src, Path(folder) / "probe.so")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return f"it cannot run: {e}"
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            return (f"it fails on a trivial program (exit status {proc.returncode})"
                    + (f": {detail[-1]}" if detail else ""))
    return None
